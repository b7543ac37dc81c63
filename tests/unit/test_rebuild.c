/* tests: a rebuild (nvcachectl replace) racing the commit of a write or of a
 * read miss's fill into a fresh slot (issue 25, finding 3), and a write that
 * finds no room for a second copy (finding 17). */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "env.h"
#include "../../cache/mngt/mngt.h" /* test_committing, the slots and their locks */

#define BS (64 * KiB)
#define SLOTS 16

/*
 * The race.  An operation (a write, or a read that misses) has written a
 * fresh slot's block to its device, and is stopped by test_committing
 * before it commits the pages (they are not valid yet: the slot is still
 * FRESH).  The slot's device is replaced meanwhile: its rebuild sets the
 * shadow (too late for this write) and scans the member.  The operation
 * goes on once the rebuild is stopped on the slot's lock: at the copy of
 * that slot, or (a rebuild that skipped it) at the sweep after the swap.
 * Then the block must read back what the operation put there, from the new
 * device, and destage must write that to the backing file.
 */
static struct race {
	pthread_mutex_t m;
	pthread_cond_t cv;
	int armed; /* the next fresh slot's commit is held */
	struct cslot *held;
	int go;
	struct env *e;
	struct cfile *f;
	int read; /* the operation: a read (else a write) */
	char *buf;
	int ret;
} race = { .m = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static void hold_commit(struct cache *c, struct cslot *s)
{
	(void)c;
	pthread_mutex_lock(&race.m);
	if (race.armed && s->state == SLOT_FRESH && !s->is_twin) {
		race.armed = 0;
		race.held = s;
		pthread_cond_broadcast(&race.cv);
		while (!race.go)
			pthread_cond_wait(&race.cv, &race.m);
	}
	pthread_mutex_unlock(&race.m);
}

static void *race_op(void *arg)
{
	char *data;
	size_t n;

	(void)arg;
	if (race.read)
		race.ret = cache_read(race.e->c, race.f, race.buf, BS, 0, &data,
				      &n);
	else
		race.ret = cache_write(race.e->c, race.f, race.buf, BS, 0);
	return NULL;
}

static struct {
	struct cache *c;
	char old[64];
	struct dev *nd;
	char err[256];
	int ret;
} rep;

static void *replace_main(void *arg)
{
	(void)arg;
	rep.ret = cache_replace_dev_with(rep.c, rep.old, rep.nd, rep.err,
					 sizeof(rep.err));
	return NULL;
}

/* Wait (at most 10 s) until cond holds; 0 if it never did. */
#define WAIT_FOR(cond)                                    \
	({                                                \
		int _i;                                   \
		for (_i = 0; _i < 10000 && !(cond); _i++) \
			usleep(1000);                     \
		(cond) ? 1 : 0;                           \
	})

static int held(void)
{
	int h;

	pthread_mutex_lock(&race.m);
	h = race.held != NULL;
	pthread_mutex_unlock(&race.m);
	return h;
}

/* Someone sleeps on the held slot's lock: the rebuild. */
static int rebuild_waits(void)
{
	return (__atomic_load_n(&race.held->rw.v, __ATOMIC_ACQUIRE) &
		SRW_SLEEPERS) != 0;
}

static void rebuild_races_commit(int read)
{
	struct rec_log *l;
	struct env e;
	char *ref = malloc(BS);
	struct dev *nd;
	pthread_t op, rb;
	struct cfile *f;
	int fd, k;

	CHECK_EQ(rec_log_new(&l), 0);
	env_init_rec(&e, SLOTS, BS, l); /* devices rec0 and rec1 */
	CHECK_EQ(dev_rec_create(l, 2, SB_DATA_OFF + SLOTS * BS, &nd), 0);
	fill(ref, BS, read ? 31 : 32);
	if (read) { /* in the backing file only: the read misses */
		fd = openat(e.backing_fd, "f", O_RDWR | O_CREAT, 0644);
		CHECK_EQ(pwrite(fd, ref, BS, 0), (ssize_t)BS);
		close(fd);
	}
	f = file_open(&e, "f", &fd);
	memset(&race, 0, sizeof(race));
	pthread_mutex_init(&race.m, NULL);
	pthread_cond_init(&race.cv, NULL);
	race.e = &e;
	race.f = f;
	race.read = read;
	race.buf = dev_alloc_buf(BS);
	if (!read)
		memcpy(race.buf, ref, BS);
	race.armed = 1;
	e.c->test_committing = hold_commit;
	CHECK_EQ(pthread_create(&op, NULL, race_op, NULL), 0);
	CHECK(WAIT_FOR(held()));
	if (!held()) {
		fprintf(stderr, "the operation never reached its commit\n");
		exit(1);
	}
	/* the held slot's device is replaced while the commit waits */
	k = slot_member(e.c, slot_idx(e.c, race.held));
	rep.c = e.c;
	/* a copy: the name goes with the old device */
	snprintf(rep.old, sizeof(rep.old), "%s", dev_path(e.devs[k]));
	rep.nd = nd;
	CHECK_EQ(pthread_create(&rb, NULL, replace_main, NULL), 0);
	CHECK(WAIT_FOR(rebuild_waits()));
	pthread_mutex_lock(&race.m);
	race.go = 1;
	pthread_cond_broadcast(&race.cv);
	pthread_mutex_unlock(&race.m);
	pthread_join(op, NULL);
	pthread_join(rb, NULL);
	e.c->test_committing = NULL;
	CHECK_EQ(race.ret, 0);
	if (rep.ret)
		fprintf(stderr, "replace: %s\n", rep.err);
	CHECK_EQ(rep.ret, 0);
	if (!rep.ret)
		e.devs[k] = nd; /* the replace closed the old one */
	else
		dev_close(nd);
	/* the block as the operation left it, from the new device */
	CHECK(same(&e, f, ref, BS, 0));
	if (!read) {
		CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
		CHECK(backing_same(fd, ref, BS));
	}
	cache_file_put(e.c, f);
	close(fd);
	free(race.buf);
	free(ref);
	env_fini(&e);
	rec_log_free(l);
}

static void test_rebuild_waits_for_a_fresh_write(void)
{
	rebuild_races_commit(0);
}

static void test_rebuild_waits_for_a_fresh_fill(void)
{
	rebuild_races_commit(1);
}

/* Slots mapped to a block, FRESH and pinned by nobody (c->lock held). */
static int unpinned_fresh(struct cache *c)
{
	uint64_t i;
	int n = 0;

	for (i = 0; i < c->nslots; i++)
		n += c->slots[i].file && !c->slots[i].is_twin &&
		     c->slots[i].state == SLOT_FRESH && !c->slots[i].pins;
	return n;
}

/*
 * Finding 17: a write of two blocks with two copies, where the second block
 * gets a slot but no room for its twin: device 1 has one free slot (the
 * others are held aside, as a device full of dirty data nobody can evict
 * holds them), so the first block takes it.  The write stops there, writes
 * the first block, and that segment fails (no metadata mirror takes its
 * entries).  The second block's slot, taken for nothing, must not stay
 * FRESH, mapped and pinned by nobody: on no list, neither free nor
 * evictable, it would be lost to the cache (and keep its file's record)
 * until that block is read or written again.
 */
static void test_write_without_twin_room_leaves_no_fresh_slot(void)
{
	struct cslot *aside[SLOTS];
	struct cslot *s, *next;
	struct env e;
	char *buf = malloc(2 * BS);
	struct cfile *f;
	int fd, i, naside = 0, kept = 0;
	uint64_t nfree;

	dirty_copies = 2;
	env_init(&e, SLOTS, BS);
	dirty_copies = 1;
	f = file_open(&e, "g", &fd);
	fill(buf, 2 * BS, 33);
	/* the file's record, then no slot of it */
	CHECK_EQ(cache_write(e.c, f, buf, 4096, 10 * BS), 0);
	CHECK_EQ(cache_truncate(e.c, f, 0), 0);
	pthread_mutex_lock(&e.c->lock);
	for (s = slot_list_next(e.c, SL_FREE, NULL); s; s = next) {
		next = slot_list_next(e.c, SL_FREE, s);
		if (slot_member(e.c, slot_idx(e.c, s)) != 1 || !kept++)
			continue; /* device 0's, and one of device 1's */
		slot_list_del(e.c, s);
		e.c->nfree--;
		aside[naside++] = s;
	}
	nfree = e.c->nfree;
	CHECK_EQ(unpinned_fresh(e.c), 0);
	pthread_mutex_unlock(&e.c->lock);
	CHECK(naside > 2);
	e.mirrors[0].faults->fail_write = -EIO;
	e.mirrors[1].faults->fail_write = -EIO;
	CHECK(cache_write(e.c, f, buf, 2 * BS, 0) != 0);
	pthread_mutex_lock(&e.c->lock);
	CHECK_EQ(unpinned_fresh(e.c), 0);
	/* the second block has no slot; the first holds one and its twin */
	CHECK(!slot_find(e.c, f->rec, 1));
	CHECK_EQ(e.c->nfree, nfree - 2);
	for (i = 0; i < naside; i++) {
		slot_list_add_tail(e.c, SL_FREE, aside[i]);
		e.c->nfree++;
	}
	pthread_mutex_unlock(&e.c->lock);
	cache_file_put(e.c, f);
	close(fd);
	cache_abandon(e.c); /* no mirror takes anything now */
	e.c = NULL;
	env_fini(&e);
	free(buf);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_rebuild_waits_for_a_fresh_write);
	RUN(test_rebuild_waits_for_a_fresh_fill);
	RUN(test_write_without_twin_room_leaves_no_fresh_slot);
	free(rbuf);
	return CHECK_DONE();
}
