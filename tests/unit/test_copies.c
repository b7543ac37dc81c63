/* tests: two copies of dirty data (cache.dirty_copies = 2) — the watermark,
 * second copies kept in step by every path that changes a dirty page, and
 * device errors charged to the device that failed (issue 9: defects 6, 11 and
 * the stale-twin questions), a twin kept for a writer that pinned its slot
 * while destage cleaned it (issue 13). */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "env.h"
#include "../../cache/mngt/mngt.h" /* test_cleaned, the slot's twin */

/* Fill a large stretch of the stack below the caller with ones, so that a
 * field the code under test forgets to set reads as an error code. */
static void __attribute__((noinline)) poison_stack(void)
{
	volatile char junk[128 * 1024];

	memset((char *)junk, 0xff, sizeof(junk));
}

static uint64_t destaged(struct env *e)
{
	return cache_counter(e->c, STAT_C_destaged_bytes);
}

/* Twins take slots: 12 dirty blocks and their twins are 24 of 32 slots, over
 * the high watermark of 60%: destage must start by itself (defect 11). */
static void test_twins_count_toward_watermark(void)
{
	struct env e;
	char *buf = malloc(12 * 64 * KiB);
	struct cfile *f;
	int fd, i;

	dirty_copies = 2;
	env_init(&e, 16, 64 * KiB);
	dirty_copies = 1;
	cache_close(e.c, 0);
	e.cfg.high_wm = 60;
	e.cfg.low_wm = 20;
	env_open(&e);
	f = file_open(&e, "f", &fd);
	fill(buf, 12 * 64 * KiB, 5);
	CHECK_EQ(cache_write(e.c, f, buf, 12 * 64 * KiB, 0), 0);
	for (i = 0; i < 50 && !destaged(&e); i++)
		usleep(100000);
	CHECK(destaged(&e) > 0);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(buf);
}

/* Dirty blocks written with one copy get a twin on their next write; when the
 * twin's device fails while it is seeded, the healthy device stays healthy
 * (defect 6: the batch's results were read before any I/O ran). */
static void test_twin_seed_failure_blames_the_failed_device(void)
{
	struct env e;
	struct stat_snap *st = &snap;
	char *buf = malloc(MiB), *ref = malloc(MiB);
	struct cfile *f;
	int fd, i;

	env_init(&e, 64, 64 * KiB);
	f = file_open(&e, "f", &fd);
	fill(ref, MiB, 6);
	CHECK_EQ(cache_write(e.c, f, ref, MiB, 0), 0); /* one copy */
	cache_file_put(e.c, f);
	close(fd);
	cache_close(e.c, 0);
	e.cfg.dirty_copies = 2; /* remount with two */
	env_open(&e);
	f = file_open(&e, "f", &fd);
	for (i = 0; i < 2; i++)
		dev_faults(e.devs[i])->fail_writes = i ? -EIO : 0;
	/* small writes into every block: each needs a twin, seeded from the
	 * block's other dirty pages; the twins on device 1 fail */
	for (i = 0; i < 16; i++) {
		fill(buf, 100, 60 + i);
		memcpy(ref + i * 64 * KiB + 8192, buf, 100);
		poison_stack();
		CHECK_EQ(cache_write(e.c, f, buf, 100, i * 64 * KiB + 8192), 0);
	}
	dev_faults(e.devs[1])->fail_writes = 0;
	cache_snapshot(e.c, st);
	CHECK(!STAT_DEV_GAUGE(st, 0, failed));
	CHECK(STAT_DEV_GAUGE(st, 1, failed));
	/* device 0's blocks read back; device 1's dirty blocks are EIO or
	 * right, never wrong */
	for (i = 0; i < 16; i++) {
		char *data;
		size_t n;
		int r = cache_read(e.c, f, rbuf, 64 * KiB, i * 64 * KiB, &data,
				   &n);

		if (!r)
			CHECK(!memcmp(data, ref + i * 64 * KiB, 64 * KiB));
		else
			CHECK_EQ(r, -EIO);
	}
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(buf);
	free(ref);
}

/* Which device holds the block's first copy, and which its twin: fail each in
 * turn.  Every read must give the newest bytes, and a flush must leave them in
 * the backing file (a stale twin would destage older bytes). */
static void check_after_losing(struct env *e, struct cfile *f, int fd,
			       const char *ref, size_t len, int d)
{
	dev_faults(e->devs[d])->fail_reads = -EIO;
	dev_faults(e->devs[d])->fail_writes = -EIO;
	CHECK(same(e, f, ref, len, 0));
	CHECK_EQ(cache_flush(e->c, NULL, NULL), 0);
	CHECK(backing_same(fd, ref, len));
	dev_faults(e->devs[d])->fail_reads = 0;
	dev_faults(e->devs[d])->fail_writes = 0;
}

/*
 * A block written dirty (with its twin), then changed by change(), which
 * keeps ref in step; then each device is lost in turn (check_after_losing).
 */
#define CHG_LEN (64 * 1024)

static void change_then_lose_each(void (*change)(struct env *e,
						  struct cfile *f, char *ref))
{
	struct env e;
	char ref[CHG_LEN];
	struct cfile *f;
	int fd, d;

	for (d = 0; d < 2; d++) {
		dirty_copies = 2;
		env_init(&e, 16, 64 * KiB);
		dirty_copies = 1;
		f = file_open(&e, "f", &fd);
		fill(ref, sizeof(ref), 7);
		CHECK_EQ(cache_write(e.c, f, ref, sizeof(ref), 0), 0);
		change(&e, f, ref);
		check_after_losing(&e, f, fd, ref, sizeof(ref), d);
		cache_file_put(e.c, f);
		close(fd);
		env_fini(&e);
	}
}

/* Writethrough (or write-around over dirty blocks) onto a dirty page keeps it
 * dirty: its twin must get the new bytes too. */
static void writethrough_over_dirty(struct env *e, struct cfile *f, char *ref)
{
	char buf[8192];

	cache_config(e->c)->mode = MODE_WRITETHROUGH;
	fill(buf, sizeof(buf), 8);
	memcpy(ref + 4096, buf, sizeof(buf));
	CHECK_EQ(cache_write(e->c, f, buf, sizeof(buf), 4096), 0);
}

static void test_writethrough_over_dirty_updates_twin(void)
{
	change_then_lose_each(writethrough_over_dirty);
}

/* A truncate into a dirty page zeroes the rest of the page: in the twin too,
 * or growing the file again shows the old bytes from the twin. */
static void truncate_into_dirty_page(struct env *e, struct cfile *f,
				     char *ref)
{
	CHECK_EQ(cache_truncate(e->c, f, 1000), 0);
	CHECK_EQ(cache_truncate(e->c, f, CHG_LEN), 0);
	memset(ref + 1000, 0, CHG_LEN - 1000);
}

static void test_truncate_zeroes_twin_tail(void)
{
	change_then_lose_each(truncate_into_dirty_page);
}

/* A partial write to a dirty page of a block that has no twin yet, on a
 * device that failed: the write goes around to the backing file, and a later
 * read gives the new bytes or EIO, never bytes of the fresh twin's slot. */
static void test_fallback_never_reads_unseeded_twin(void)
{
	struct env e;
	char *ref = malloc(MiB), *other = malloc(MiB), buf[100], *data;
	struct cfile *f, *g;
	int fd, gd, i, r;
	size_t n;

	env_init(&e, 64, 64 * KiB);
	/* another file's data in every slot first, then freed */
	g = file_open(&e, "g", &gd);
	memset(other, 0x5a, MiB);
	CHECK_EQ(cache_write(e.c, g, other, MiB, 0), 0);
	CHECK_EQ(cache_write(e.c, g, other, MiB, MiB), 0);
	CHECK_EQ(cache_truncate(e.c, g, 0), 0);
	f = file_open(&e, "f", &fd);
	fill(ref, MiB, 10);
	CHECK_EQ(cache_write(e.c, f, ref, MiB, 0), 0); /* one copy */
	cache_file_put(e.c, f);
	cache_file_put(e.c, g);
	close(fd);
	close(gd);
	cache_close(e.c, 0);
	e.cfg.dirty_copies = 2;
	env_open(&e);
	f = file_open(&e, "f", &fd);
	dev_faults(e.devs[0])->fail_reads = -EIO;
	dev_faults(e.devs[0])->fail_writes = -EIO;
	for (i = 0; i < 16; i++) {
		fill(buf, sizeof(buf), 70 + i);
		r = cache_write(e.c, f, buf, sizeof(buf), i * 64 * KiB + 100);
		if (!r)
			memcpy(ref + i * 64 * KiB + 100, buf, sizeof(buf));
		else
			CHECK_EQ(r, -EIO);
	}
	for (i = 0; i < 16; i++) {
		r = cache_read(e.c, f, rbuf, 4096, i * 64 * KiB, &data, &n);
		if (!r)
			CHECK(!memcmp(data, ref + i * 64 * KiB, 4096));
		else
			CHECK_EQ(r, -EIO);
	}
	dev_faults(e.devs[0])->fail_reads = 0;
	dev_faults(e.devs[0])->fail_writes = 0;
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
	free(other);
}

/* First copies spread over both devices, like blocks with one copy: once
 * clean (twins freed), each device holds about half of the file. */
static void test_first_copies_spread_over_devices(void)
{
	struct env e;
	struct stat_snap *st = &snap;
	char *buf = malloc(MiB);
	struct cfile *f;
	int fd, d;

	dirty_copies = 2;
	env_init(&e, 64, 64 * KiB);
	dirty_copies = 1;
	f = file_open(&e, "f", &fd);
	fill(buf, MiB, 11);
	CHECK_EQ(cache_write(e.c, f, buf, MiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	cache_snapshot(e.c, st);
	for (d = 0; d < 2; d++)
		CHECK(STAT_DEV_GAUGE(st, d, used_bytes) >= MiB / 4);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(buf);
}

/*
 * A writer pins a block while destage cleans it: destage has persisted the
 * slot clean and still holds its lock; the writer found the slot's twin,
 * pinned the slot and waits for the lock (the hook below puts it there).
 * The twin must stay, since the writer will dirty the slot again counting on
 * it: freed, the write goes to one device only, and losing that device loses
 * the write (issue 13: the crash harness's 4-thread two-copy runs, 1 in 10).
 */
static struct {
	struct env *e;
	struct cfile *f;
	struct cslot *s; /* the slot destage cleaned */
	char page[4096];
	pthread_t writer;
	int started, ret;
} race;

static void *race_write(void *arg)
{
	(void)arg;
	race.ret = cache_write(race.e->c, race.f, race.page, sizeof(race.page),
			       4096);
	return NULL;
}

/* On the destager, s cleaned and persisted, s->rw held: a writer pins s. */
static void pin_while_cleaned(struct cache *c, struct cslot *s)
{
	int i;

	c->test_cleaned = NULL;
	race.s = s;
	CHECK_EQ(pthread_create(&race.writer, NULL, race_write, NULL), 0);
	race.started = 1;
	/* it pins s under c->lock, then waits for s->rw, which we hold */
	for (i = 0;
	     i < 10000 && __atomic_load_n(&s->pins, __ATOMIC_ACQUIRE) < 2; i++)
		usleep(1000);
	CHECK(__atomic_load_n(&s->pins, __ATOMIC_ACQUIRE) >= 2);
}

static void test_write_pinning_a_block_destage_cleans_keeps_twin(void)
{
	struct env e;
	char ref[CHG_LEN];
	struct cfile *f;
	int fd;

	dirty_copies = 2;
	env_init(&e, 16, 64 * KiB);
	dirty_copies = 1;
	f = file_open(&e, "f", &fd);
	fill(ref, sizeof(ref), 12);
	CHECK_EQ(cache_write(e.c, f, ref, sizeof(ref), 0), 0);
	memset(&race, 0, sizeof(race));
	race.e = &e;
	race.f = f;
	fill(race.page, sizeof(race.page), 13);
	memcpy(ref + 4096, race.page, sizeof(race.page));
	e.c->test_cleaned = pin_while_cleaned;
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(race.started);
	if (race.started)
		pthread_join(race.writer, NULL);
	CHECK_EQ(race.ret, 0);
	/* the page written is dirty again, and in both copies */
	CHECK(race.s && race.s->state == SLOT_DIRTY && race.s->twin);
	if (race.s)
		check_after_losing(&e, f, fd, ref, sizeof(ref),
				   slot_idx(e.c, race.s) % 2);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_twins_count_toward_watermark);
	RUN(test_twin_seed_failure_blames_the_failed_device);
	RUN(test_writethrough_over_dirty_updates_twin);
	RUN(test_truncate_zeroes_twin_tail);
	RUN(test_fallback_never_reads_unseeded_twin);
	RUN(test_first_copies_spread_over_devices);
	RUN(test_write_pinning_a_block_destage_cleans_keeps_twin);
	free(rbuf);
	return CHECK_DONE();
}
