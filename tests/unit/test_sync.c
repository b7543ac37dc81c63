/* tests: fsync waits for a device flush that started after its writes, even
 * when another thread's flush is already under way (issue 9, defect 1). */
#define _GNU_SOURCE
#include <pthread.h>

#include "env.h"

static struct env e;
static struct cfile *fa, *fb;

static void *fsync_a(void *arg)
{
	CHECK_EQ(cache_fsync(e.c, fa), 0);
	return NULL;
}

/* Flushes of device d recorded after event 'after'. */
static int flushes_after(struct rec_log *l, size_t after, int d)
{
	size_t i, n = rec_log_count(l);
	int k = 0;

	for (i = after; i < n; i++) {
		const struct rec_event *ev = rec_log_get(l, i);

		k += ev->kind == REC_DEV_FLUSH && ev->target == d;
	}
	return k;
}

/*
 * B's write completes; A's fsync starts a slow flush; B's fsync must not
 * return before a flush that started after B's write has completed: A's
 * flush counts (it started after), but only once it has ended.
 */
static void test_fsync_waits_for_flush_under_way(void)
{
	struct rec_log *l;
	char *buf = malloc(256 * KiB);
	pthread_t t;
	size_t mark;
	int fda, fdb, d, round;

	rec_log_new(&l);
	env_init_rec(&e, 64, 64 * KiB, l);
	fa = file_open(&e, "a", &fda);
	fb = file_open(&e, "b", &fdb);
	fill(buf, 256 * KiB, 1);
	/* the pages are claimed after the first write and fsync, so the
	 * overwrites below are plain writes that only a flush makes durable */
	CHECK_EQ(cache_write(e.c, fa, buf, 256 * KiB, 0), 0);
	CHECK_EQ(cache_write(e.c, fb, buf, 256 * KiB, 0), 0);
	CHECK_EQ(cache_fsync(e.c, fa), 0);
	CHECK_EQ(cache_fsync(e.c, fb), 0);
	for (round = 0; round < 3; round++) {
		fill(buf, 256 * KiB, 10 + round);
		CHECK_EQ(cache_write(e.c, fa, buf, 256 * KiB, 0), 0);
		CHECK_EQ(cache_write(e.c, fb, buf, 256 * KiB, 0), 0);
		mark = rec_log_count(l);
		/* the last device A flushes is slow: A has taken both */
		dev_faults(e.devs[1])->flush_delay_us = 200000;
		pthread_create(&t, NULL, fsync_a, NULL);
		while (!__atomic_load_n(&dev_faults(e.devs[1])->flushing,
					__ATOMIC_SEQ_CST))
			usleep(100);
		CHECK_EQ(cache_fsync(e.c, fb), 0);
		for (d = 0; d < 2; d++)
			CHECK(flushes_after(l, mark, d) >= 1);
		pthread_join(t, NULL);
		dev_faults(e.devs[1])->flush_delay_us = 0;
	}
	cache_file_put(e.c, fa);
	cache_file_put(e.c, fb);
	close(fda);
	close(fdb);
	env_fini(&e);
	rec_log_free(l);
	free(buf);
}

/* the backing file's fsyncs: how many, and one can be made slow */
static int bk_syncs, bk_sync_slow, bk_sync_in_hook;

static void bk_sync(void *arg, ino_t ino)
{
	__atomic_add_fetch(&bk_syncs, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&bk_sync_slow, __ATOMIC_SEQ_CST)) {
		__atomic_store_n(&bk_sync_in_hook, 1, __ATOMIC_SEQ_CST);
		usleep(200000);
	}
}

static const struct cache_bk_hooks hooks = { .sync = bk_sync };

/*
 * A's fsync syncs the backing file (its creation); meanwhile B's write fails
 * on the devices and goes to the backing file instead.  B's fsync must then
 * sync the backing file again: A's fsync started before B's write.
 */
static void test_fsync_after_write_around_failed_devices(void)
{
	char buf[8192];
	pthread_t t;
	int fda, d, before;

	env_init(&e, 64, 64 * KiB);
	cache_set_bk_hooks(e.c, &hooks);
	fa = file_open(&e, "a", &fda);
	fill(buf, sizeof(buf), 3);
	bk_sync_slow = 1;
	pthread_create(&t, NULL, fsync_a, NULL);
	while (!__atomic_load_n(&bk_sync_in_hook, __ATOMIC_SEQ_CST))
		usleep(100);
	/* A's backing fsync has completed; its flag is not set yet */
	for (d = 0; d < 2; d++)
		dev_faults(e.devs[d])->fail_writes = -EIO;
	CHECK_EQ(cache_write(e.c, fa, buf, sizeof(buf), 65536), 0);
	before = __atomic_load_n(&bk_syncs, __ATOMIC_SEQ_CST);
	pthread_join(t, NULL);
	bk_sync_slow = 0;
	CHECK_EQ(cache_fsync(e.c, fa), 0);
	CHECK(__atomic_load_n(&bk_syncs, __ATOMIC_SEQ_CST) > before);
	for (d = 0; d < 2; d++)
		dev_faults(e.devs[d])->fail_writes = 0;
	cache_file_put(e.c, fa);
	close(fda);
	env_fini(&e);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_fsync_waits_for_flush_under_way);
	RUN(test_fsync_after_write_around_failed_devices);
	free(rbuf);
	return CHECK_DONE();
}
