/* An asynchronous O_DIRECT rewrite (io_uring) while buffered readers fill the page cache, then buffered
 * reads that must see it, through a new descriptor (the check of xfstests generic/451, aio-dio-cycle-write,
 * which uses libaio) and through one open all along (but with a third argument "closed": then no
 * buffered descriptor stays open between the readers' opens).  Exit 1: stale data. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <liburing.h>
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
	struct io_uring ring;
	struct io_uring_sqe *sqe;
	struct io_uring_cqe *cqe;
	pthread_t th[4];
	char *buf[2], *cmp = malloc(SIZE);
	double secs = argc > 2 ? atof(argv[2]) : 3;
	struct timespec t0, t;
	int fd, kept, i, n = 0, bad = 0;

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
	kept = argc > 3 && !strcmp(argv[3], "closed") ? -1
						      : open(path, O_RDONLY);
	if (io_uring_queue_init(4, &ring, 0))
		return perror("io_uring_queue_init"), 2;
	for (i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, reader, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 >
		    secs)
			break;
		i = ++n % 2;
		fd = open(path, O_RDWR | O_DIRECT);
		sqe = io_uring_get_sqe(&ring);
		io_uring_prep_write(sqe, fd, buf[i], SIZE, 0);
		if (io_uring_submit(&ring) != 1 ||
		    io_uring_wait_cqe(&ring, &cqe) || cqe->res != SIZE)
			return fprintf(stderr, "async write failed\n"), 2;
		io_uring_cqe_seen(&ring, cqe);
		close(fd);
		/* first: a new open may drop the page cache */
		if (kept >= 0 && pread(kept, cmp, SIZE, 0) != SIZE)
			return perror("pread"), 2;
		if (kept >= 0 && memcmp(cmp, buf[i], SIZE)) {
			fprintf(stderr, "stale through the descriptor open all "
					"along\n");
			bad++;
			break;
		}
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
	for (i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	printf("%d cycles, %d stale\n", n, bad);
	return bad ? 1 : 0;
}
