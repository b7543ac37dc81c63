/* cache: a replaced cache device's blocks rebuilt onto its successor while the mount serves. */
#define _GNU_SOURCE
#include "mngt.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>

/*
 * Rebuild.  A slot lives on one member at a fixed offset (meta.h: the
 * layout), so the new
 * device (NEW) can take member k's slots as they are: every slot of k that
 * holds something is copied to the same offset of NEW, and once NEW takes
 * k's place every map entry is true of it without a change.
 *
 *   1. NEW shadows the old device (dev_set_shadow): from now on every write
 *      and flush that completes on the old device is done on NEW too, with
 *      the same FUA flag, before it counts as done.
 *   2. One pass over k's slots in use, FRESH ones too ("Fresh slots"
 *      below), each copied under the locks that shut out whoever could
 *      write it: its file's rw for reading (a truncate zeroes an edge page
 *      under the file's rw alone) and its slot's rw for writing (writes to
 *      the slot and to its twin, and page fills, hold the slot's rw; a twin
 *      on k is locked through its slot).  A write that had the lock before
 *      the copy is in the copy; a write after it reaches NEW through the
 *      shadow.  A slot taken by another block during the pass was written
 *      after step 1: the shadow has it.
 *      The copy comes from the old device; if it has failed (or fails on
 *      the read) from the other copy: a twin on k from its slot, a slot on
 *      k from its twin, which holds every dirty page of the slot; the
 *      slot's other valid pages (clean: the backing file has them) are
 *      forgotten and the entry persisted before NEW can be member k.  A
 *      clean block without a twin on a failed device is forgotten whole.
 *      A dirty block with no copy left is lost already: the replace stops.
 *   3. NEW is flushed (the copies are plain writes), gets member k's
 *      superblock with a new UUID, and both headers record that UUID.
 *   4. NEW is swapped in (replace.c); a sweep takes every slot's rw once,
 *      so that no I/O begun on the old device (under some slot's rw) is
 *      still under way when it is closed;
 *   5. if the old device had failed, dirty blocks written meanwhile with
 *      one copy (no second working device had room) get their twins, as a
 *      write makes them (write.c: data first, the twin's entry persisted
 *      before anything relies on it); one that finds no room is left to
 *      destage.
 * A crash before 3 leaves the old device member k (NEW holds scratch);
 * after 3, NEW, which holds all that k's entries claim: the copies,
 * flushed before 3, and every later write, durable on NEW no later than
 * on the old device.
 */

/*
 * Fresh slots and the rebuild.  A slot is FRESH from its allocation until
 * its first pages are committed valid, yet its block may be on the device
 * already: whoever fills it (a write, or a read miss's fill) holds the
 * slot's rw for writing from before its device write until after the
 * commit (seg_commit_locked, fill_from_backing), as every commit does.  So FRESH seen without
 * that lock says nothing of what the old device holds: a write that
 * completed there before the shadow was set, and commits after the scan
 * went past, would be on no copy NEW gets (issue 25, finding 3: the block
 * read back another content after the swap, and destage wrote that).  The
 * rule kept here:
 *
 *   every slot of k that is mapped (file != 0) when the scan reaches it is
 *   locked like any other, FRESH or not, and found empty only under its
 *   lock.
 *
 * A thread that had the lock before the scan's turn has committed when the
 * copy is read, so the copy holds its pages; one that takes it after began
 * its device I/O after step 1, so the shadow holds them.  While the scan
 * waits for the lock, its own pin keeps the slot the same block's.  And a
 * FRESH slot (a twin's state says nothing: it is locked through its slot)
 * is never left mapped with nobody to fill it: whoever takes one pins it
 * in the same hold of c->lock, and its last unpin frees it (asserted in
 * slot_settle and in rb_lock; a write that finds no room for the block's
 * second copy gives back at once the slot it had just taken, map.c
 * slot_unclaim_locked).
 *
 * Debug builds check the rule at every commit (rebuild_check_commit): the
 * slot's rw is held for writing, and a thread that took it before the
 * current rebuild began (the c->rebuild_seq it sampled then is older) and
 * commits into a slot of the member being rebuilt, or into one whose twin
 * is there, finds the scan not past that slot (c->rebuild_pos).
 */

/* A slot of member k being copied: its block's file, its slot (primary),
 * and v, the slot on k (the primary or its twin). */
struct rb_slot {
	struct cfile *f;
	struct cslot *p, *v;
};

static void rb_unlock(struct cache *c, struct rb_slot *r);

/* Pin the slot that owns slots[s] and lock it (file rw for reading, slot rw
 * for writing), waiting for the locks only if wait (a batch's first slot:
 * its thread holds no other).  0: locked; 1: nothing to copy (free, or
 * still FRESH once locked: the essay above, or taken by another block
 * since step 1: the shadow has it); 2: busy (not waited for). */
static int rb_lock(struct cache *c, uint64_t s, struct rb_slot *r, int wait)
{
	struct cslot *v = &c->slots[s], *p;
	uint32_t rec;
	uint64_t blk;
	int empty;

	pthread_mutex_lock(&c->lock);
	if (!v->file) {
		cache_unlock(c);
		return 1;
	}
	/* FRESH only while whoever fills it pins it (the essay above) */
	assert(v->is_twin || v->state != SLOT_FRESH || v->pins);
	rec = v->file;
	blk = v->blk;
	r->f = c->recs[rec - 1];
	r->f->refs++;
	cache_unlock(c);
	if (wait)
		frw_rdlock(r->f);
	else if (frw_tryrdlock(r->f))
		goto err_put;
	pthread_mutex_lock(&c->lock);
	p = v->file == rec && v->blk == blk
		    ? (v->is_twin ? slot_find(c, rec, blk) : v)
		    : NULL;
	if (p && v->is_twin && p->twin != s + 1)
		p = NULL;
	if (p)
		slot_pin_locked(c, r->f, p);
	cache_unlock(c);
	if (!p) {
		frw_unlock(r->f);
		pthread_mutex_lock(&c->lock);
		file_put_locked(c, r->f);
		cache_unlock(c);
		return 1;
	}
	if (wait)
		srw_wrlock(&p->rw);
	else if (!srw_trywrlock(&p->rw))
		goto err_unpin;
	r->p = p;
	r->v = v;
	/* nothing committed into it, and any write from now on is shadowed */
	pthread_mutex_lock(&c->lock);
	empty = v == p && p->state == SLOT_FRESH;
	cache_unlock(c);
	if (empty) {
		rb_unlock(c, r);
		return 1;
	}
	return 0;
err_unpin:
	frw_unlock(r->f);
	pthread_mutex_lock(&c->lock);
	slot_unpin_locked(c, r->f, p);
	file_put_locked(c, r->f);
	cache_unlock(c);
	return 2;
err_put:
	pthread_mutex_lock(&c->lock);
	file_put_locked(c, r->f);
	cache_unlock(c);
	return 2;
}

static void rb_unlock(struct cache *c, struct rb_slot *r)
{
	srw_unlock(&r->p->rw);
	frw_unlock(r->f);
	pthread_mutex_lock(&c->lock);
	slot_unpin_locked(c, r->f, r->p);
	file_put_locked(c, r->f);
	cache_unlock(c);
}

/* Read slot x's block from its device into buf. */
static int rb_read(struct cache *c, struct cslot *x, void *buf)
{
	struct dev_io io = { .dev = slot_dev(c, slot_idx(c, x)),
			     .op = DEV_READ,
			     .buf = buf,
			     .off = slot_off(c, slot_idx(c, x)),
			     .len = c->bs };
	int ret = dev_io_run(&io, 1);

	if (ret)
		note_dev_error(c, &io, 1);
	return ret;
}

/*
 * The primary's pages that the copy from its twin does not hold are
 * forgotten: they are clean (its dirty pages are all in the twin), and an
 * entry must not claim them on NEW.  No twin: all of them (a clean block).
 * The entry is persisted if it changed.  Slot rw held for writing.
 */
static int rb_forget_rest(struct cache *c, struct cslot *p, struct cslot *t)
{
	uint32_t n = 0, pg;

	pthread_mutex_lock(&c->lock);
	for (pg = 0; pg < c->ppb; pg++)
		if (pb_test(slot_valid(c, p), pg) &&
		    (!t || !pb_test(slot_valid(c, t), pg))) {
			assert(!pb_test(slot_dirty(c, p), pg));
			page_forget_locked(c, p, pg);
			n++;
		}
	if (n)
		slot_settle(c, p);
	cache_unlock(c);
	return n && p->persisted ? slot_persist(c, p) : 0;
}

/*
 * Fill buf with what NEW must hold for r->v, from the other copy: the old
 * device has failed.  1: nothing to hold (a clean block, forgotten);
 * -EIO: a dirty block whose last copy is gone.
 */
static int rb_from_other(struct cache *c, struct rb_slot *r, void *buf)
{
	struct cslot *p = r->p, *t = p->twin ? &c->slots[p->twin - 1] : NULL;
	int ret;

	if (r->v != p) /* a twin on k: its slot holds the pages */
		return slot_failed(c, p) ? -EIO : rb_read(c, p, buf);
	if (t && !slot_failed(c, t) && !rb_read(c, t, buf)) {
		ret = rb_forget_rest(c, p, t);
		return ret ? ret : 0;
	}
	if (pb_any(c, slot_dirty(c, p)))
		return -EIO;
	ret = rb_forget_rest(c, p, NULL);
	return ret ? ret : 1;
}

/*
 * A batch: slots of member k locked together, so that their reads and their
 * writes each go as one request batch (dev_io_run) instead of one 64 KiB
 * read and write at a time.  Only its first slot's locks are waited for; a
 * later slot whose locks are busy ends the batch (it comes first in the
 * next one): a thread that waits holds nothing, so no lock order is needed
 * among slots of different files.
 */
#define RB_BATCH 32
#define RB_BATCH_BYTES (2u << 20)

struct rb_batch {
	struct rb_slot r[RB_BATCH];
	struct dev_io io[RB_BATCH];
	int skip[RB_BATCH]; /* nothing to write for it */
	int n;
};

/* Lock a batch of member k's slots from its *j-th on; *j moves past what
 * it holds and what it skipped.  *seen counts the slots in use it passed. */
static void rb_collect(struct cache *c, int k, uint64_t *j, int max,
		       struct rb_batch *b, uint64_t *seen)
{
	uint64_t s;
	int ret;

	for (b->n = 0; *j < member_slots(c, k) && b->n < max; *j += 1) {
		/* slots below it are passed (rebuild_check_commit) */
		__atomic_store_n(&c->rebuild_pos, *j, __ATOMIC_SEQ_CST);
		s = layout_slot(&c->meta.layout, k, *j);
		if (!c->slots[s].file)
			continue;
		ret = rb_lock(c, s, &b->r[b->n], !b->n);
		if (ret == 2)
			break; /* busy: the next batch's first */
		*seen += 1;
		if (!ret)
			b->io[b->n++].off = slot_off(c, s);
	}
}

/* Fill each slot's buffer: from the old device (one batch of reads), or for
 * those it cannot give, from the other copy.  0, or -errno with err set. */
static int rb_fill(struct cache *c, int k, struct rb_batch *b, char *bufs,
		   char *err, size_t errlen)
{
	int i, ret, healthy = !__atomic_load_n(&c->dev_failed[k],
					       __ATOMIC_ACQUIRE);

	for (i = 0; i < b->n; i++) {
		b->io[i] = (struct dev_io){ .dev = c->devs[k],
					    .op = DEV_READ,
					    .buf = bufs + (size_t)i * c->bs,
					    .off = b->io[i].off,
					    .len = c->bs,
					    .res = -EIO };
		b->skip[i] = 0;
	}
	if (healthy && dev_io_run(b->io, b->n))
		note_dev_error(c, b->io, b->n);
	for (i = 0; i < b->n; i++) {
		if (healthy && !b->io[i].res)
			continue;
		ret = rb_from_other(c, &b->r[i], b->io[i].buf);
		if (ret == -EIO) {
			snprintf(err, errlen,
				 "block %llu of a file has dirty data with no "
				 "copy left on a working device",
				 (unsigned long long)b->r[i].p->blk);
			return ret;
		}
		if (ret < 0) {
			snprintf(err, errlen,
				 "cannot forget a block's clean pages: %s",
				 strerror(-ret));
			return ret;
		}
		b->skip[i] = ret;
	}
	return 0;
}

/* Copy a locked batch onto nd, then unlock it.  0, or -errno with err set. */
static int rb_copy(struct cache *c, int k, struct dev *nd, struct rb_batch *b,
		   char *bufs, char *err, size_t errlen)
{
	int i, n = 0, ret = rb_fill(c, k, b, bufs, err, errlen);

	for (i = 0; i < b->n && !ret; i++)
		if (!b->skip[i]) {
			b->io[n] = b->io[i];
			b->io[n].dev = nd;
			b->io[n++].op = DEV_WRITE;
		}
	if (!ret && n) {
		ret = dev_io_run(b->io, n);
		if (ret)
			snprintf(err, errlen, "%s: write error: %s",
				 dev_path(nd), strerror(-ret));
	}
	for (i = 0; i < b->n; i++)
		rb_unlock(c, &b->r[i]);
	return ret;
}

/* Keep to cache.rebuild_max_rate: done bytes since t0 (ns). */
static void rb_pace(struct cache *c, uint64_t done, uint64_t t0)
{
	uint64_t rate = __atomic_load_n(&c->cfg->rebuild_max_rate,
					__ATOMIC_RELAXED);
	uint64_t due, now = now_ns();

	if (!rate)
		return;
	due = t0 + done * 1000000000.0 / rate;
	if (due > now) {
		struct timespec ts = { (due - now) / 1000000000ull,
				       (due - now) % 1000000000ull };

		nanosleep(&ts, NULL);
	}
}

/* Slots of member k that hold something now. */
static uint64_t rb_used(struct cache *c, int k)
{
	uint64_t j, n = 0;

	pthread_mutex_lock(&c->lock);
	for (j = 0; j < member_slots(c, k); j++)
		n += c->slots[layout_slot(&c->meta.layout, k, j)].file != 0;
	cache_unlock(c);
	return n;
}

int rebuild_onto(struct cache *c, int k, struct dev *nd, cache_progress_fn fn,
		 void *arg, char *err, size_t errlen)
{
	struct dev *old = c->devs[k];
	uint64_t j = 0, total, seen = 0, done, t0 = now_ns();
	int max = RB_BATCH_BYTES / c->bs, ret = 0;
	struct rb_batch *b = calloc(1, sizeof(*b));
	char *bufs;

	max = max < 1 ? 1 : max > RB_BATCH ? RB_BATCH : max;
	bufs = dev_alloc_buf((size_t)max * c->bs);
	if (!b || !bufs) {
		free(b);
		free(bufs);
		return -ENOMEM;
	}
	total = rb_used(c, k) * c->bs;
	__atomic_store_n(&c->rebuild_total, total, __ATOMIC_RELEASE);
	__atomic_store_n(&c->rebuild_done, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&c->rebuild_member, k + 1, __ATOMIC_RELEASE);
	__atomic_store_n(&c->rebuild_pos, 0, __ATOMIC_SEQ_CST);
	dev_set_shadow(old, nd); /* step 1 */
	/* after the shadow: a lock taken once this is seen is shadowed */
	__atomic_add_fetch(&c->rebuild_seq, 1, __ATOMIC_SEQ_CST);
	while (j < member_slots(c, k) && !ret) {
		if (devlife_stopping(c)) {
			snprintf(err, errlen,
				 "stopped by the unmount; it resumes at the "
				 "next mount");
			ret = -ESHUTDOWN;
			break;
		}
		rb_collect(c, k, &j, max, b, &seen);
		ret = rb_copy(c, k, nd, b, bufs, err, errlen);
		__atomic_store_n(&c->rebuild_pos, j, __ATOMIC_SEQ_CST);
		done = seen * c->bs;
		__atomic_store_n(&c->rebuild_done, done < total ? done : total,
				 __ATOMIC_RELEASE);
		if (fn)
			fn(arg, total > done ? total - done : 0, done);
		rb_pace(c, done, t0);
	}
	if (!ret && dev_shadow_errors(old)) {
		snprintf(err, errlen, "%s: write errors while rebuilding",
			 dev_path(nd));
		ret = -EIO;
	}
	if (!ret) { /* step 3's first half: the copies durable */
		ret = dev_flush(nd);
		if (ret)
			snprintf(err, errlen, "%s: flush failed: %s",
				 dev_path(nd), strerror(-ret));
	}
	if (ret)
		rebuild_end(c, old);
	else if (fn)
		fn(arg, 0, total);
	free(bufs);
	free(b);
	return ret;
}

void rebuild_end(struct cache *c, struct dev *old)
{
	dev_set_shadow(old, NULL);
	__atomic_store_n(&c->rebuild_member, 0, __ATOMIC_RELEASE);
}

void rebuild_settle(struct cache *c)
{
	uint64_t s;

	/* I/O runs under some slot's rw: whoever took one before the swap
	 * is done once it is had here (step 4) */
	for (s = 0; s < c->nslots; s++) {
		srw_wrlock(&c->slots[s].rw);
		srw_unlock(&c->slots[s].rw);
	}
}

/* Step 5 for slots[s]: 1 if it stays without a twin. */
static int rb_twin(struct cache *c, uint64_t s)
{
	uint64_t mask[META_MAX_WORDS];
	struct rb_slot r;
	struct cslot *t = NULL;
	int ret = 0;

	if (rb_lock(c, s, &r, 1))
		return 0;
	pthread_mutex_lock(&c->lock);
	while (r.v == r.p && r.p->state == SLOT_DIRTY && !r.p->twin &&
	       !slot_failed(c, r.p)) {
		t = twin_alloc_locked(c, r.p);
		ret = !t;
		/* freed slots on their way to the free list: look again */
		if (t || !freeq_wait_locked(c))
			break;
	}
	cache_unlock(c);
	if (t) {
		pb_get(c, slot_dirty(c, r.p), mask);
		ret = twin_copy(c, r.p, t, mask) || twin_persist(c, r.p);
	}
	rb_unlock(c, &r); /* a twin left empty: the next write seeds it */
	return ret;
}

uint64_t rebuild_twins(struct cache *c)
{
	uint64_t s, left = 0;

	if (c->cfg->dirty_copies < 2 || working_devices(c) < 2)
		return 0;
	for (s = 0; s < c->nslots; s++) {
		struct cslot *v = &c->slots[s];

		if (__atomic_load_n(&v->state, __ATOMIC_RELAXED) ==
			    SLOT_DIRTY &&
		    !__atomic_load_n(&v->twin, __ATOMIC_RELAXED))
			left += rb_twin(c, s);
	}
	return left;
}
