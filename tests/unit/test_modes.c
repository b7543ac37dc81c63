/* tests: cache modes and writes beside failed devices — the mode is read once
 * per request, a partial write into a clean page on a failed device reads the
 * backing file, the cache's own backing writes are not mistaken for changes
 * behind its back (issue 9: defect 13, review questions), and a writethrough
 * write's end of the backing file counts before its look is noted. */
#define _GNU_SOURCE
#include <pthread.h>

#include "env.h"

static struct env e;
static int stop;

/* Write-around onto a block with dirty data (left from writeback) goes
 * through the cache in writethrough: over and over. */
static void *dirty_writer(void *arg)
{
	struct cfile *f = arg;
	char buf[4096];

	fill(buf, sizeof(buf), 1);
	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED))
		CHECK_EQ(cache_write(e.c, f, buf, sizeof(buf), 0), 0);
	return NULL;
}

/* Meanwhile every write-around of another file must bypass the cache. */
static void test_writearound_mode_is_per_request(void)
{
	struct stat_snap *st = &snap;
	struct cfile *a, *b;
	char buf[4096];
	pthread_t t;
	int fa, fb, i, n = 20000;
	uint64_t before;

	env_init(&e, 64, 64 * KiB);
	a = file_open(&e, "a", &fa);
	b = file_open(&e, "b", &fb);
	fill(buf, sizeof(buf), 2);
	CHECK_EQ(cache_write(e.c, a, buf, sizeof(buf), 0), 0); /* dirty */
	cache_config(e.c)->mode = MODE_WRITEAROUND;
	cache_snapshot(e.c, st);
	before = STAT_CTR(st, bypass_ops);
	pthread_create(&t, NULL, dirty_writer, a);
	for (i = 0; i < n; i++)
		CHECK_EQ(cache_write(e.c, b, buf, sizeof(buf),
				     (i % 64) * 4096),
			 0);
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	pthread_join(t, NULL);
	cache_snapshot(e.c, st);
	CHECK_EQ(STAT_CTR(st, bypass_ops) - before, n);
	CHECK_EQ(cache_config(e.c)->mode, MODE_WRITEAROUND);
	cache_file_put(e.c, a);
	cache_file_put(e.c, b);
	close(fa);
	close(fb);
	env_fini(&e);
}

/* A clean cached page on a device that then fails: a write of part of it
 * takes the rest of the page from the backing file, not EIO. */
static void test_partial_write_into_clean_page_on_failed_device(void)
{
	char *ref = malloc(256 * KiB), *data;
	struct cfile *f;
	size_t n;
	int fd, d;

	for (d = 0; d < 2; d++) {
		env_init(&e, 64, 64 * KiB);
		fd = openat(e.backing_fd, "f", O_RDWR | O_CREAT, 0644);
		fill(ref, 256 * KiB, 3);
		CHECK_EQ(pwrite(fd, ref, 256 * KiB, 0), 256 * KiB);
		close(fd);
		f = file_open(&e, "f", &fd);
		CHECK_EQ(cache_read(e.c, f, rbuf, 256 * KiB, 0, &data, &n), 0);
		dev_faults(e.devs[d])->fail_reads = -EIO;
		dev_faults(e.devs[d])->fail_writes = -EIO;
		/* a partial page in each of the four blocks */
		for (n = 0; n < 4; n++) {
			CHECK_EQ(cache_write(e.c, f, "abc", 3,
					     n * 64 * KiB + 4096 + 10),
				 0);
			memcpy(ref + n * 64 * KiB + 4096 + 10, "abc", 3);
		}
		CHECK(same(&e, f, ref, 256 * KiB, 0));
		CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
		CHECK(backing_same(fd, ref, 256 * KiB));
		dev_faults(e.devs[d])->fail_reads = 0;
		dev_faults(e.devs[d])->fail_writes = 0;
		cache_file_put(e.c, f);
		close(fd);
		env_fini(&e);
	}
	free(ref);
}

/* A cache of 64 slots of 64 KiB in writethrough, opened on e. */
static void open_writethrough(void)
{
	env_init(&e, 64, 64 * KiB);
	cache_close(e.c, 0);
	e.cfg.mode = MODE_WRITETHROUGH;
	env_open(&e);
}

/* Writes in writethrough change the backing file's mtime; after a crash the
 * cache must still know the file as it left it, and keep its clean data. */
static void test_writethrough_backing_look_survives_crash(void)
{
	struct stat_snap *st = &snap;
	char *buf = malloc(256 * KiB), *data;
	struct cfile *f;
	size_t n;
	int fd;

	open_writethrough();
	f = file_open(&e, "f", &fd);
	fill(buf, 256 * KiB, 4);
	CHECK_EQ(cache_write(e.c, f, buf, 256 * KiB, 0), 0);
	usleep(20000); /* a later write has a later mtime */
	CHECK_EQ(cache_write(e.c, f, buf + 64 * KiB, 64 * KiB, 64 * KiB), 0);
	cache_abandon(e.c); /* the daemon dies with the file open */
	e.c = NULL;
	close(fd);
	env_open(&e);
	f = file_open(&e, "f", &fd);
	cache_snapshot(e.c, st);
	CHECK(STAT_GAUGE(st, used_bytes) == 256 * KiB); /* still cached */
	CHECK_EQ(cache_read(e.c, f, rbuf, 256 * KiB, 0, &data, &n), 0);
	CHECK(n == 256 * KiB && !memcmp(data, buf, n));
	cache_snapshot(e.c, st);
	CHECK_EQ(STAT_CTR(st, read_hit_ops), 1);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(buf);
}

/*
 * A writethrough write's own end of the backing file counts at once, though
 * the look is noted only when no other change is under way: a write that
 * extended the file while another thread's writethrough was between its
 * backing write and its note, its clean pages then evicted, and a partial
 * write into one of them.  The partial page's other bytes come from the
 * backing file, not zeros taken for a hole past a size not noted yet.
 */
static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cond = PTHREAD_COND_INITIALIZER;
static int hold_armed, hold_in, hold_go;
static uint64_t hold_off;

/* The backing write at hold_off waits there (its change under way). */
static void hold_write(void *arg, ino_t ino, const void *buf, size_t len,
		       uint64_t off)
{
	(void)arg, (void)ino, (void)buf, (void)len;
	pthread_mutex_lock(&hold_lock);
	if (hold_armed && off == hold_off) {
		hold_in = 1;
		pthread_cond_broadcast(&hold_cond);
		while (!hold_go)
			pthread_cond_wait(&hold_cond, &hold_lock);
	}
	pthread_mutex_unlock(&hold_lock);
}

static void *held_writer(void *arg)
{
	struct cfile *f = arg;
	char buf[4096];

	fill(buf, sizeof(buf), 6);
	CHECK_EQ(cache_write(e.c, f, buf, sizeof(buf), hold_off), 0);
	return NULL;
}

static void test_writethrough_end_counts_before_its_note(void)
{
	struct cache_bk_hooks hooks = { .write = hold_write };
	char *ref = calloc(1, 8192);
	struct cfile *f;
	uint64_t dropped;
	pthread_t t;
	int fd;

	open_writethrough();
	f = file_open(&e, "f", &fd); /* empty */
	cache_set_bk_hooks(e.c, &hooks);
	hold_off = 5 * 64 * KiB;
	hold_armed = 1;
	pthread_create(&t, NULL, held_writer, f);
	pthread_mutex_lock(&hold_lock);
	while (!hold_in)
		pthread_cond_wait(&hold_cond, &hold_lock);
	pthread_mutex_unlock(&hold_lock);
	/* meanwhile: two pages written, their clean copies dropped */
	fill(ref, 8192, 7);
	CHECK_EQ(cache_write(e.c, f, ref, 8192, 0), 0);
	CHECK_EQ(cache_file_evict(e.c, f, &dropped), 0);
	CHECK_EQ(dropped, 8192);
	/* a few bytes into the second page: the rest is the first write's */
	CHECK_EQ(cache_write(e.c, f, "xyz", 3, 4096 + 10), 0);
	memcpy(ref + 4096 + 10, "xyz", 3);
	CHECK(same(&e, f, ref, 8192, 0));
	pthread_mutex_lock(&hold_lock);
	hold_go = 1;
	pthread_cond_broadcast(&hold_cond);
	pthread_mutex_unlock(&hold_lock);
	pthread_join(t, NULL);
	CHECK(same(&e, f, ref, 8192, 0));
	/* the backing file is longer: its first two pages */
	CHECK_EQ(pread(fd, rbuf, 8192, 0), 8192);
	CHECK(!memcmp(rbuf, ref, 8192));
	cache_set_bk_hooks(e.c, NULL);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_writearound_mode_is_per_request);
	RUN(test_partial_write_into_clean_page_on_failed_device);
	RUN(test_writethrough_backing_look_survives_crash);
	RUN(test_writethrough_end_counts_before_its_note);
	free(rbuf);
	return CHECK_DONE();
}
