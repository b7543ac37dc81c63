/* An asynchronous O_DIRECT rewrite (libaio) while buffered readers fill the page cache, then a buffered read
 * that must see it: the check of xfstests generic/451 (aio-dio-cycle-write). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <libaio.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SIZE (640 * 1024)
static const char *path;
static volatile int stop;

static void *reader(void *arg)
{
	char *buf = malloc(SIZE);
	(void)arg;
	while (!stop) {
		int fd = open(path, O_RDONLY);
		if (fd >= 0) {
			(void)!pread(fd, buf, SIZE, 0);
			close(fd);
		}
	}
	free(buf);
	return NULL;
}

int main(int argc, char **argv)
{
	io_context_t ctx = 0;
	struct iocb cb, *cbs[1] = { &cb };
	struct io_event ev;
	pthread_t th[2];
	char *buf[2], *cmp = malloc(SIZE);
	double secs = argc > 2 ? atof(argv[2]) : 3;
	struct timespec t0, t;
	int fd, i, n = 0, bad = 0;

	path = argv[1];
	for (i = 0; i < 2; i++) {
		if (posix_memalign((void **)&buf[i], 4096, SIZE))
			return 2;
		memset(buf[i], i ? 0xaa : 0x55, SIZE);
	}
	fd = open(path, O_CREAT | O_RDWR | O_DIRECT, 0600);
	if (fd < 0 || pwrite(fd, buf[0], SIZE, 0) != SIZE)
		return perror("init"), 2;
	close(fd);
	if (io_setup(1, &ctx))
		return perror("io_setup"), 2;
	for (i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, reader, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 > secs)
			break;
		i = ++n % 2;
		fd = open(path, O_RDWR | O_DIRECT);
		io_prep_pwrite(&cb, fd, buf[i], SIZE, 0);
		if (io_submit(ctx, 1, cbs) != 1 || io_getevents(ctx, 1, 1, &ev, NULL) != 1 ||
		    ev.res != SIZE)
			return fprintf(stderr, "aio write failed\n"), 2;
		close(fd);
		fd = open(path, O_RDONLY);
		if (pread(fd, cmp, SIZE, 0) != SIZE)
			return perror("pread"), 2;
		close(fd);
		if (memcmp(cmp, buf[i], SIZE)) {
			bad++;
			break;
		}
	}
	stop = 1;
	for (i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	printf("%d cycles, %d stale\n", n, bad);
	return bad ? 1 : 0;
}
