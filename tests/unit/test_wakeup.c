/* tests: whatever frees cache space wakes the writers waiting for it, not
 * only the destager, and nobody waits for a file record (issue 9, defect 4). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>

#include "env.h"

static struct env e;

struct waiter {
	struct cfile *f;
	int write; /* else read */
	uint64_t off;
	size_t len;
	int ret;
};

static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	char *buf = malloc(w->len), *rb = dev_alloc_buf(w->len + 8192), *data;
	size_t n;

	fill(buf, w->len, 7);
	if (w->write)
		w->ret = cache_write(e.c, w->f, buf, w->len, w->off);
	else
		w->ret = cache_read(e.c, w->f, rb, w->len, w->off, &data, &n);
	free(buf);
	free(rb);
	return NULL;
}

/* The waiter must finish within 5 s; a test left with a blocked waiter ends
 * its process (each test runs in its own). */
static void finished(pthread_t t)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 5;
	if (pthread_timedjoin_np(t, NULL, &ts)) {
		fflush(stdout);
		fprintf(stderr, "%s:%d: the waiter is still blocked after 5 s\n",
			__FILE__, __LINE__);
		_exit(1);
	}
}

/* Start a waiter and let it block (it must not be done after 100 ms). */
static pthread_t start_waiter(struct waiter *w)
{
	pthread_t t;
	struct timespec ts;

	pthread_create(&t, NULL, waiter_main, w);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += 100000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	CHECK(pthread_timedjoin_np(t, NULL, &ts) != 0); /* it waits */
	return t;
}

/* No destager: a cache full of dirty data, freed by truncate or unlink. */
static void wait_for_space(int how)
{
	char *buf = malloc(MiB);
	struct waiter w = { .write = 1, .off = 0, .len = 64 * KiB };
	struct cfile *a, *b;
	pthread_t t;
	int fa, fb;

	env_init(&e, 8, 64 * KiB);
	cache_close(e.c, 0);
	e.cfg.threads = 0; /* nobody destages */
	e.cfg.write_around = 0; /* b's write waits at full, not around it */
	env_open(&e);
	a = file_open(&e, "a", &fa);
	b = file_open(&e, "b", &fb);
	fill(buf, MiB, 1);
	CHECK_EQ(cache_write(e.c, a, buf, MiB, 0), 0); /* 16 slots: all */
	w.f = b;
	t = start_waiter(&w);
	if (how == 0) {
		CHECK_EQ(cache_truncate(e.c, a, 0), 0);
	} else {
		struct stat st;

		fstat(fa, &st);
		CHECK_EQ(unlinkat(e.backing_fd, "a", 0), 0);
		cache_file_unlinked(e.c, st.st_dev, st.st_ino, st.st_nlink);
		cache_file_put(e.c, a); /* the last close drops its data */
		a = NULL;
	}
	finished(t);
	CHECK_EQ(w.ret, 0);
	if (a)
		cache_file_put(e.c, a);
	close(fa);
	close(fb);
	env_fini(&e);
	free(buf);
}

static void test_truncate_wakes_writers(void)
{
	wait_for_space(0);
}

static void test_unlink_wakes_writers(void)
{
	wait_for_space(1);
}

/*
 * The same cache full of dirty data, nobody destaging, write-around on (its
 * default): a write of another file, whose blocks the cache holds nothing
 * of, goes to the backing file at once instead of waiting for space; a
 * write onto the dirty data goes into the cache (it never waits: its block
 * is there), and both read back.
 */
static void test_full_cache_writes_around(void)
{
	char *buf = malloc(MiB), *ref = malloc(MiB);
	struct waiter w = { .write = 1, .off = 0, .len = 64 * KiB };
	struct cfile *a, *b;
	pthread_t t;
	int fa, fb;

	env_init(&e, 8, 64 * KiB);
	cache_close(e.c, 0);
	e.cfg.threads = 0; /* nobody destages */
	env_open(&e);
	a = file_open(&e, "a", &fa);
	b = file_open(&e, "b", &fb);
	fill(buf, MiB, 1);
	CHECK_EQ(cache_write(e.c, a, buf, MiB, 0), 0); /* 16 slots: all */
	w.f = b;
	pthread_create(&t, NULL, waiter_main, &w);
	finished(t);
	CHECK_EQ(w.ret, 0);
	cache_snapshot(e.c, &snap);
	CHECK_EQ(STAT_CTR(&snap, write_around_bytes), 64 * KiB);
	CHECK_EQ(STAT_GAUGE(&snap, writing_around), 1);
	fill(ref, 64 * KiB, 7); /* the waiter's bytes */
	CHECK(backing_same(fb, ref, 64 * KiB));
	CHECK(same(&e, b, ref, 64 * KiB, 0));
	/* onto a's dirty block: into the cache, not around it */
	fill(ref, 4096, 9);
	CHECK_EQ(cache_write(e.c, a, ref, 4096, 8192), 0);
	memcpy(buf + 8192, ref, 4096);
	cache_snapshot(e.c, &snap);
	CHECK_EQ(STAT_CTR(&snap, write_around_bytes), 64 * KiB);
	CHECK(same(&e, a, buf, MiB, 0));
	cache_file_put(e.c, a);
	cache_file_put(e.c, b);
	close(fa);
	close(fb);
	env_fini(&e);
	free(buf);
	free(ref);
}

/*
 * Every file record is taken by an open file.  A read or a write of a third
 * file must not wait for one (only a close could free it, and a close needs a
 * FUSE thread that may be waiting too): it goes around the cache, at once
 * and correctly, and is cached again once a record is free.
 */
static void test_no_record_never_waits(void)
{
	char *buf = malloc(256 * KiB), *w = malloc(64 * KiB), *data;
	struct cfile *f[3];
	int fd[3], i;
	size_t n;

	max_files = 2;
	env_init(&e, 64, 64 * KiB);
	max_files = 65536;
	fill(buf, 256 * KiB, 2);
	for (i = 0; i < 3; i++) {
		char name[8];

		snprintf(name, sizeof(name), "f%d", i);
		fd[i] = openat(e.backing_fd, name, O_RDWR | O_CREAT, 0644);
		CHECK_EQ(pwrite(fd[i], buf, 256 * KiB, 0), 256 * KiB);
		close(fd[i]);
		f[i] = file_open(&e, name, &fd[i]);
		if (i < 2) /* a miss: clean data, and a record */
			CHECK_EQ(cache_read(e.c, f[i], rbuf, 256 * KiB, 0,
					    &data, &n),
				 0);
	}
	/* these would wait for ever if they waited: the test would hang */
	CHECK_EQ(cache_read(e.c, f[2], rbuf, 256 * KiB, 0, &data, &n), 0);
	CHECK(n == 256 * KiB && !memcmp(data, buf, n));
	fill(w, 64 * KiB, 3);
	memcpy(buf + 4096, w, 64 * KiB);
	CHECK_EQ(cache_write(e.c, f[2], w, 64 * KiB, 4096), 0);
	CHECK_EQ(cache_fsync(e.c, f[2]), 0);
	CHECK(backing_same(fd[2], buf, 256 * KiB));
	CHECK(same(&e, f[2], buf, 256 * KiB, 0));
	/* a close frees a record: the third file is cached again */
	cache_file_put(e.c, f[0]);
	f[0] = NULL;
	CHECK_EQ(cache_read(e.c, f[2], rbuf, 256 * KiB, 0, &data, &n), 0);
	CHECK_EQ(cache_read(e.c, f[2], rbuf, 256 * KiB, 0, &data, &n), 0);
	cache_snapshot(e.c, &snap);
	CHECK(STAT_CTR(&snap, read_hit_ops) >= 1);
	for (i = 1; i < 3; i++)
		cache_file_put(e.c, f[i]);
	for (i = 0; i < 3; i++)
		close(fd[i]);
	env_fini(&e);
	free(buf);
	free(w);
}

/* Each test in a child process, so that one left blocked fails alone. */
#define RUN_APART(fn)                                                       \
	do {                                                                \
		int _st = 1;                                                \
		pid_t _p = (fflush(stdout), fork());                        \
		if (!_p) {                                                  \
			RUN(fn);                                            \
			fflush(stdout);                                     \
			_exit(CHECK_DONE());                                \
		}                                                           \
		waitpid(_p, &_st, 0);                                       \
		if (!WIFEXITED(_st) || WEXITSTATUS(_st)) {                  \
			printf("FAIL %s (child)\n", #fn);                   \
			check_failures++;                                   \
		}                                                           \
	} while (0)

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN_APART(test_truncate_wakes_writers);
	RUN_APART(test_unlink_wakes_writers);
	RUN_APART(test_no_record_never_waits);
	RUN_APART(test_full_cache_writes_around);
	free(rbuf);
	return CHECK_DONE();
}
