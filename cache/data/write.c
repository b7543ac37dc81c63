/* cache: the write path (through the cache, in segments around their device I/O) and fsync. */
#define _GNU_SOURCE
#include "data_int.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>
#include <xxhash.h>

/* ---------------------------------------------------------------- write */

/*
 * The old content of one page that a write covers only partly.  clean: the
 * page was valid and clean before this write marked it dirty (its intent), so
 * the backing file holds it too.
 */
int page_prefill(struct cache *c, struct cfile *f, struct cslot *s,
		 uint32_t p, char *dst, uint64_t at, int clean)
{
	if (pb_test(slot_valid(c, s), p)) {
		struct dev_io io = { .dev = slot_dev(c, slot_idx(c, s)),
				     .op = DEV_READ,
				     .buf = dst,
				     .len = NVC_PAGE,
				     .off = slot_off(c, slot_idx(c, s)) +
					    p * NVC_PAGE };

		if (!dev_io_run(&io, 1))
			return 0;
		note_dev_error(c, &io, 1);
		if (!clean && pb_test(slot_dirty(c, s), p))
			return twin_read(c, s, dst, p, p + 1) ? -EIO : 0;
	}
	if (at >= f->bsize) {
		memset(dst, 0, NVC_PAGE);
		return 0;
	}
	return backing_read(c, f, dst, NVC_PAGE, at);
}

/* page_prefill() would read page p (at byte at) from the backing file. */
static int prefill_reads_backing(struct cache *c, struct cfile *f,
				 struct cslot *s, uint32_t p, uint64_t at)
{
	return !pb_test(slot_valid(c, s), p) && at < f->bsize;
}

/*
 * Copy the pages in mask from slot s to its twin t (FUA), so that the twin
 * holds them before its entry says so.  A device error is charged to the
 * device that failed.
 */
int twin_copy(struct cache *c, struct cslot *s, struct cslot *t,
	      const uint64_t *mask)
{
	struct dev_io io = { .len = NVC_PAGE };
	uint32_t p;
	int ret = 0;

	if (!bm_any(mask))
		return 0;
	io.buf = dev_alloc_buf(NVC_PAGE);
	if (!io.buf)
		return -ENOMEM;
	for (p = 0; p < c->ppb && !ret; p++) {
		if (!bm_test(mask, p))
			continue;
		io.dev = slot_dev(c, slot_idx(c, s));
		io.op = DEV_READ;
		io.off = slot_off(c, slot_idx(c, s)) + p * NVC_PAGE;
		io.fua = 0;
		ret = dev_io_run(&io, 1);
		if (!ret) {
			io.dev = slot_dev(c, slot_idx(c, t));
			io.op = DEV_WRITE;
			io.off = slot_off(c, slot_idx(c, t)) + p * NVC_PAGE;
			io.fua = 1;
			ret = dev_io_run(&io, 1);
		}
		if (ret)
			note_dev_error(c, &io, 1);
	}
	free(io.buf);
	return ret;
}

/* A new twin gets the slot's dirty pages that this write does not cover. */
static int twin_seed(struct cache *c, struct cslot *s, struct cslot *t,
		     uint32_t p0, uint32_t p1)
{
	uint64_t mask[META_MAX_WORDS];
	uint32_t p;

	if (pb_any(c, slot_valid(c, t)))
		return 0;
	pb_get(c, slot_dirty(c, s), mask);
	for (p = p0; p < p1; p++)
		bm_clear(mask, p);
	return twin_copy(c, s, t, mask);
}

/*
 * A cache device failed while taking a write: the backing file takes it
 * instead, as whole pages (buf holds them from s0 on, partial ones merged
 * with their old bytes), and the cache forgets every page the write touched.
 * The slots' locks are held.
 */
static int write_fallback(struct cache *c, struct cfile *f, struct span *sp,
			  int nsp, const char *buf, uint64_t s0, uint64_t s1,
			  uint64_t hi)
{
	uint64_t end;
	int i, ret;
	uint32_t p;

	pthread_mutex_lock(&c->lock);
	end = f->size > hi ? f->size : hi;
	cache_unlock(c);
	if (end > s1)
		end = s1; /* the last page, but not past the file's end */
	coh_bk_begin(c, f);
	ret = backing_write(c, f, buf, end - s0, s0);
	coh_bk_done(c, f); /* file_note_backing notes the look */
	if (ret)
		return ret;
	pthread_mutex_lock(&c->lock);
	for (i = 0; i < nsp; i++) {
		struct cslot *s = sp[i].s;
		int was_dirty = pb_any(c, slot_dirty(c, s));

		for (p = sp[i].p0; p < sp[i].p1; p++)
			page_forget_locked(c, s, p);
		if (was_dirty && !pb_any(c, slot_dirty(c, s)))
			file_mark_clean(c, f, s);
		slot_settle(c, s);
	}
	if (hi > f->size)
		f->size = hi;
	file_bsize_grow_locked(c, f, end);
	file_bk_changed(f); /* the next fsync must reach the backing file */
	cache_unlock(c);
	for (i = 0; i < nsp && !ret; i++)
		if (sp[i].s->persisted || pb_any(c, slot_valid(c, sp[i].s)))
			ret = slot_persist(c, sp[i].s);
	if (!ret)
		ret = file_note_backing(c, f);
	CNT_ADD(c, bypass_ops, 1);
	return ret;
}

/*
 * With two copies, a slot's dirty pages are always in its twin, intent pages
 * too: their old (clean) bytes are copied to the twin, with the block's other
 * dirty pages if the twin is new, and the twin's entry persisted, before the
 * slot's entry calls them dirty.  Losing either device at a crash then leaves
 * a copy of every page the slot calls dirty.  If the copy fails (a failing
 * device), the write goes on: it will go around the failed device.
 */
static void twin_take_intent(struct cache *c, struct span *x)
{
	struct cslot *s = x->s, *t = &c->slots[s->twin - 1];
	uint64_t mask[META_MAX_WORDS], sdirty[META_MAX_WORDS];
	int w;

	pb_get(c, slot_dirty(c, s), sdirty);
	for (w = 0; w < META_MAX_WORDS; w++)
		mask[w] = pb_any(c, slot_valid(c, t)) ? x->valid[w] : sdirty[w];
	if (!twin_copy(c, s, t, mask))
		twin_persist(c, s);
}

/*
 * A clean page is overwritten in place only after its entry says dirty on the
 * media: were the daemon killed between the device write and the entry
 * update, a page still marked clean would hold data that the backing file
 * does not, and the file would change when it is evicted.  Marks the intent
 * (sp[i].valid: pages that were clean before this write) and persists it.
 *
 * A writethrough write into a block with no second copy, when two copies
 * are kept, forgets such pages instead (persisted the same way): the
 * backing file takes the write before the devices do, so the cache owes it
 * nothing, and an intent mark on one copy would leave, after a crash that
 * also lost that device, dirty pages with no copy anywhere (EIO on a read,
 * though the backing file holds them; the crash harness in writethrough
 * found it).  The commit makes them valid again, clean; meanwhile a
 * partial one is prefilled from the backing file, which holds it (f->bsize
 * counts every completed write of ours: backing_write_fd).  The price: the
 * entry no longer claims them, so they are written FUA ("Power loss" in
 * engine.h), where an intent mark let them be overwritten plainly.
 */
static int seg_mark_intent(struct cache *c, struct cfile *f, struct span *sp,
			   int nsp, int mode)
{
	int i, ret = 0;
	uint32_t p;

	pthread_mutex_lock(&c->lock);
	for (i = 0; i < nsp; i++) {
		struct cslot *s = sp[i].s;
		int was_dirty = pb_any(c, slot_dirty(c, s));
		int forget = mode != MODE_WRITEBACK &&
			     c->cfg->dirty_copies > 1 && !s->twin;

		s->gen++;
		sp[i].miss = 0;
		memset(sp[i].valid, 0, sizeof(sp[i].valid));
		for (p = sp[i].p0; p < sp[i].p1; p++) {
			if (!pb_test(slot_valid(c, s), p) ||
			    pb_test(slot_dirty(c, s), p))
				continue;
			sp[i].miss = 1;
			if (forget) {
				page_forget_locked(c, s, p);
				continue;
			}
			bm_set(sp[i].valid, p);
			pb_set(slot_dirty(c, s), p);
			pages_dirty(c, s, 1);
		}
		/* no intent on a slot whose one copy a crash could lose */
		assert(!forget || !bm_any(sp[i].valid));
		if (forget && sp[i].miss)
			slot_settle(c, s); /* it may hold no page now */
		if (!was_dirty && pb_any(c, slot_dirty(c, s))) {
			file_mark_dirty(c, f, s);
			slot_settle(c, s);
		}
	}
	file_wgen_bump_locked(c, f);
	cache_unlock(c);
	for (i = 0; i < nsp && !ret; i++) {
		if (!sp[i].miss)
			continue;
		if (sp[i].s->twin)
			twin_take_intent(c, &sp[i]);
		ret = slot_persist(c, sp[i].s);
	}
	return ret;
}

/*
 * The device writes of a segment: each block's pages, and the same pages at
 * the same place in its twin (seeded first with the block's other dirty
 * pages).  A write of pages the persisted entry does not claim yet is FUA.
 */
static int seg_prepare_ios(struct cache *c, struct span *sp, int nsp,
			   const char *buf, uint64_t s0, struct dev_io *ios,
			   unsigned *nio)
{
	int i, ret = 0;
	uint32_t p;

	for (i = 0; i < nsp; i++) {
		struct cslot *s = sp[i].s;

		memset(&ios[i], 0, sizeof(ios[i]));
		ios[i].dev = slot_dev(c, slot_idx(c, s));
		ios[i].op = DEV_WRITE;
		ios[i].off = slot_off(c, slot_idx(c, s)) + sp[i].p0 * NVC_PAGE;
		ios[i].len = (sp[i].p1 - sp[i].p0) * NVC_PAGE;
		/* a device write only reads its buffer */
		ios[i].buf = (char *)buf +
			     (sp[i].blk * c->bs + sp[i].p0 * NVC_PAGE - s0);
		for (p = sp[i].p0; p < sp[i].p1; p++)
			ios[i].fua |= !pb_test(slot_pvalid(c, s), p);
	}
	*nio = nsp;
	for (i = 0; i < nsp && !ret; i++) {
		struct cslot *t;

		if (!sp[i].s->twin)
			continue;
		t = &c->slots[sp[i].s->twin - 1];
		ret = twin_seed(c, sp[i].s, t, sp[i].p0, sp[i].p1);
		ios[*nio] = ios[i];
		ios[*nio].dev = slot_dev(c, slot_idx(c, t));
		ios[*nio].off =
			slot_off(c, slot_idx(c, t)) + sp[i].p0 * NVC_PAGE;
		ios[*nio].fua = 1;
		(*nio)++;
	}
	return ret;
}

/* The segment's pages are on the devices: valid, and dirty in writeback;
 * in writethrough the pages clean before are clean again.  c->lock held. */
static void seg_commit_locked(struct cache *c, struct cfile *f,
			      struct span *sp, int nsp, struct dev_io *ios,
			      int mode)
{
	int i;
	uint32_t p;

	assert_held(&c->lock);
	for (i = 0; i < nsp; i++) {
		struct cslot *s = sp[i].s;
		int was_dirty = pb_any(c, slot_dirty(c, s));

		/* a fua write that succeeded is durable however devices/
		 * did it (a short one finished with RWF_DSYNC, dev.h) */
		if (!ios[i].fua)
			cache_dev_written(c, slot_member(c, slot_idx(c, s)));
		for (p = sp[i].p0; p < sp[i].p1; p++) {
			if (ios[i].fua)
				pb_clear(slot_unsynced(c, s), p);
			if (!pb_test(slot_valid(c, s), p)) {
				pb_set(slot_valid(c, s), p);
				pages_valid(c, s, 1);
			}
			if (mode == MODE_WRITEBACK &&
			    !pb_test(slot_dirty(c, s), p)) {
				pb_set(slot_dirty(c, s), p);
				pages_dirty(c, s, 1);
			}
		}
		if (mode != MODE_WRITEBACK && sp[i].miss) {
			for (p = sp[i].p0; p < sp[i].p1; p++) {
				if (!bm_test(sp[i].valid, p) ||
				    !pb_test(slot_dirty(c, s), p))
					continue;
				pb_clear(slot_dirty(c, s), p);
				pages_dirty(c, s, -1);
			}
			if (was_dirty && !pb_any(c, slot_dirty(c, s)))
				file_mark_clean(c, f, s);
		}
		if (!was_dirty && pb_any(c, slot_dirty(c, s)))
			file_mark_dirty(c, f, s);
		slot_settle(c, s);
	}
	/* crossing the high watermark wakes the destager at once */
	if (!c->draining && dirty_at_least(c, c->cfg->high_wm))
		pthread_cond_signal(&c->destage_cond);
}

/*
 * The device writes may take the segment's bytes straight from the caller's
 * src (no copy into w->buf): the segment is whole pages (no partial page to
 * merge with old bytes), src is aligned for direct I/O, and the caller keeps
 * src unchanged until wseg_end() (the synchronous path does; a server thread
 * that goes on with other requests reuses its buffer, so nowait copies).
 */
static int seg_in_place(const struct wseg *w, const char *src, int nowait)
{
	const char *at = src + (w->lo - w->off);

	return !nowait && w->lo == w->s0 && w->hi == w->s1 &&
	       !((uintptr_t)at % DEV_ALIGN);
}

/*
 * The twins a writeback write counts on (engine.h, "Two copies"): with two
 * copies and two working devices, write_cached gave every slot of the segment
 * one before it pinned it, and nobody frees a twin of a slot pinned by
 * another.  Devices only ever fail while mounted, so two working ones now
 * were two then.
 */
static void wseg_assert_twins(struct cache *c, const struct wseg *w)
{
	int i;

	if (w->mode != MODE_WRITEBACK || c->cfg->dirty_copies < 2 ||
	    working_devices(c) < 2)
		return;
	for (i = 0; i < w->nsp; i++)
		assert(w->sp[i].s->twin);
}

/*
 * Write one segment: blocks [b0, b1) of the request, their slots pinned.
 * Data goes to the devices first; only then are the map entries that find it
 * persisted (on both mirrors, a twin before its slot) and the write
 * acknowledged.  The segment is taken in two halves around its device I/O,
 * so that the asynchronous pipeline (aio.c) can run the I/O without a
 * thread waiting for it: wseg_begin() locks the slots, marks the intent and
 * prepares the I/O; wseg_end() commits and persists what the I/O did and
 * unlocks.  Both run on the same thread (the slots' locks are the thread's).
 *
 * nowait: the caller must not wait for a lock or the backing store, so the
 * slots' locks are only tried, and a segment that would need a backing read
 * first (a partial page that is not cached, inside the backing file) or a
 * backing write (writethrough) is refused; -EAGAIN then means "take the
 * synchronous path", with nothing done (-EBUSY: the same, a lock is
 * taken).  A partial page that is cached is not read at all when the
 * write's edge in it is a multiple of the device's sector (wseg_trim): only
 * the sectors written reach the device.  Otherwise it is read from its
 * device here (microseconds, no lock waited for).
 */
int wseg_begin(struct cache *c, struct cfile *f, struct wseg *w,
	       const char *src, int nowait)
{
	struct span *sp = w->sp, *last = &w->sp[w->nsp - 1];
	int i, ret, head, nsp = w->nsp;
	char *buf = w->buf;

	w->s0 = (sp[0].blk * c->bs) + sp[0].p0 * NVC_PAGE;
	w->lo = w->off > w->s0 ? w->off : w->s0;
	w->s1 = last->blk * c->bs + last->p1 * NVC_PAGE;
	w->hi = w->end < w->s1 ? w->end : w->s1;
	head = w->lo % NVC_PAGE != 0;
	assert(w->hi > w->lo); /* the spans cover the bytes */
	if (nowait && w->mode != MODE_WRITEBACK)
		return -EAGAIN;
	for (i = 0; i < nsp; i++) {
		if (!nowait) {
			srw_wrlock(&sp[i].s->rw);
			continue;
		}
		if (!srw_trywrlock(&sp[i].s->rw)) {
			while (i-- > 0)
				srw_unlock(&sp[i].s->rw);
			return -EBUSY;
		}
	}
	w->locked = 1;
	w->rbseq = rebuild_seq(c);
	wseg_assert_twins(c, w);
	if (nowait && ((head && prefill_reads_backing(c, f, sp[0].s, sp[0].p0,
						      w->s0)) ||
		       (w->hi % NVC_PAGE &&
			prefill_reads_backing(c, f, last->s, last->p1 - 1,
					      w->s1 - NVC_PAGE)))) {
		wseg_unlock(w);
		return -EAGAIN;
	}
	ret = seg_mark_intent(c, f, sp, nsp, w->mode);
	if (ret)
		return ret;

	/* partial first and last pages keep their old bytes */
	wseg_trim(c, w);
	if (head && !(w->trim & WSEG_TRIM_HEAD))
		ret = page_prefill(c, f, sp[0].s, sp[0].p0, buf, w->s0,
				   bm_test(sp[0].valid, sp[0].p0));
	if (!ret && w->hi % NVC_PAGE && !(w->trim & WSEG_TRIM_TAIL) &&
	    !(head && w->s1 - NVC_PAGE == w->s0))
		ret = page_prefill(c, f, last->s, last->p1 - 1,
				   buf + (w->s1 - NVC_PAGE - w->s0),
				   w->s1 - NVC_PAGE,
				   bm_test(last->valid, last->p1 - 1));
	if (ret)
		return ret;
	if (seg_in_place(w, src, nowait)) {
		w->data = src + (w->lo - w->off);
	} else {
		memcpy(buf + (w->lo - w->s0), src + (w->lo - w->off),
		       w->hi - w->lo);
		w->data = buf;
	}

	if (w->mode != MODE_WRITEBACK) {
		coh_bk_begin(c, f);
		ret = backing_write(c, f, src + (w->lo - w->off), w->hi - w->lo,
				    w->lo);
		coh_bk_done(c, f);
		if (!ret)
			ret = file_note_backing_stat(c, f);
		if (ret)
			return ret;
	}
	/* a second copy that cannot be seeded sends the write around */
	w->prep_err =
		seg_prepare_ios(c, sp, nsp, w->data, w->s0, w->ios, &w->nio);
	if (!w->prep_err)
		wseg_trim_ios(w);
	return 0;
}

/* wseg_begin() failed: only the slots' locks are undone. */
void wseg_unlock(struct wseg *w)
{
	int i;

	if (!w->locked)
		return;
	for (i = w->nsp - 1; i >= 0; i--)
		srw_unlock(&w->sp[i].s->rw);
	w->locked = 0;
}

/*
 * err: why the device I/O did not happen or failed (0: it succeeded; the
 * caller has charged a device error to its device).  Unlocks.
 */
int wseg_end(struct cache *c, struct cfile *f, struct wseg *w, int err)
{
	struct span *sp = w->sp;
	struct cslot *v[SEG_MAX_BLOCKS];
	int i, ret = err, nsp = w->nsp, size_changed = 0;

	assert(w->locked);
	if (ret) {
		ret = wseg_untrim(c, f, w);
		if (!ret)
			ret = write_fallback(c, f, sp, nsp, w->data, w->s0,
					     w->s1, w->hi);
		goto out_unlock;
	}

	for (i = 0; i < nsp; i++) {
		if (c->test_committing)
			c->test_committing(c, sp[i].s);
		rebuild_check_commit(c, sp[i].s, w->rbseq);
	}
	pthread_mutex_lock(&c->lock);
	seg_commit_locked(c, f, sp, nsp, w->ios, w->mode);
	if (w->hi > f->size) {
		f->size = w->hi;
		size_changed = 1;
	}
	if (w->mode != MODE_WRITEBACK)
		size_changed = 1; /* the backing file's look, for recovery */
	clock_gettime(CLOCK_REALTIME, &f->mtime);
	f->mtime_set = w->mode == MODE_WRITEBACK;
	coh_ctime_now_locked(f, &f->mtime);
	cache_unlock(c);

	for (i = 0; i < nsp && !sp[i].s->twin; i++)
		v[i] = sp[i].s;
	if (i == nsp) {
		/* one persist per mirror for the segment's adjacent entries */
		ret = slots_persist(c, v, nsp);
	} else {
		/* the twin first: a slot's dirty pages are always in its twin */
		for (i = 0; i < nsp && !ret; i++) {
			if (sp[i].s->twin)
				ret = twin_persist(c, sp[i].s);
			if (!ret)
				ret = slot_persist(c, sp[i].s);
		}
	}
	if (!ret && size_changed) {
		pthread_mutex_lock(&f->rec_lock);
		ret = f->rec ? file_persist_record(c, f) : 0;
		pthread_mutex_unlock(&f->rec_lock);
	}
	if (!ret)
		ret = file_persist_size(c, f, w->hi);
out_unlock:
	wseg_unlock(w);
	return ret;
}

static int write_segment(struct cache *c, struct cfile *f, struct span *sp,
			 int nsp, const char *src, uint64_t off, uint64_t end,
			 int mode)
{
	struct wseg w = { .sp = sp, .nsp = nsp, .off = off, .end = end,
			  .mode = mode, .buf = io_buf() };
	int ret;

	if (!w.buf)
		return -ENOMEM;
	ret = wseg_begin(c, f, &w, src, 0);
	if (ret) {
		wseg_unlock(&w);
		return ret;
	}
	ret = w.prep_err;
	if (!ret) {
		ret = dev_io_run(w.ios, w.nio);
		if (ret)
			note_dev_error(c, w.ios, w.nio);
	}
	return wseg_end(c, f, &w, ret);
}

/* write_around(), or this write through the cache in mode if the range has
 * dirty data. */
static int write_around_or(struct cache *c, struct cfile *f, const char *src,
			   size_t len, uint64_t off, int mode)
{
	int ret = write_around(c, f, src, len, off);

	return ret == 1 ? write_cached(c, f, src, len, off, mode) : ret;
}

/* What seg_take_slot_locked did. */
enum seg_take {
	TAKE_GOT, /* *out: the block's slot, not yet pinned by this write */
	TAKE_AGAIN, /* waited with c->lock dropped: look at the block again */
	TAKE_HELD_FIRST, /* the segment's blocks are to be written first */
	TAKE_EIO, /* no space will ever come (stopping, no mirror left) */
};

/*
 * A slot for block blk of f that a write may fill: found, or allocated,
 * with its twin where two copies are kept.  Where there is none yet it
 * waits (c->lock dropped meanwhile) for a write of the block around the
 * cache to end, for freed slots to reach the free list, or for space, but
 * never while the segment holds blocks (nsp), whose pins it would keep.
 * c->lock held.
 */
static enum seg_take seg_take_slot_locked(struct cache *c, struct cfile *f,
					  uint64_t blk, int copies, int nsp,
					  struct cslot **out)
{
	struct cslot *s;

	assert_held(&c->lock);
	if (write_around_busy_locked(f, blk)) {
		/* the store is taking a write of this block around the
		 * cache: this one comes after */
		if (nsp)
			return TAKE_HELD_FIRST;
		if (!freeq_before_wait_locked(c))
			pthread_cond_wait(&c->around_cond, &c->lock);
		return TAKE_AGAIN;
	}
	s = slot_find(c, f->rec, blk);
	if (s && slot_draining(c, s) && !s->pins && s->state == SLOT_CLEAN) {
		/* off a device being emptied (remove, replace.c) */
		slot_drop_locked(c, s);
		s = NULL;
	}
	if (s)
		CNT_ADD(c, write_hit_ops, nsp == 0);
	if (!s)
		s = slot_alloc_locked(c, f, blk);
	if (s && copies > 1 && !s->twin && working_devices(c) > 1 &&
	    !twin_alloc_locked(c, s)) {
		/* no room for the second copy yet; a slot just taken for it
		 * goes back (it would be FRESH and pinned by nobody: map.c) */
		if (s->state == SLOT_FRESH && !s->pins)
			slot_unclaim_locked(c, f, s);
		s = NULL;
	}
	if (s) {
		*out = s;
		return TAKE_GOT;
	}
	/* freed slots on their way to the free list (the ones held stay
	 * pinned meanwhile) */
	if (freeq_wait_locked(c))
		return TAKE_AGAIN;
	if (nsp)
		return TAKE_HELD_FIRST;
	/* no mirror left: no space will ever come */
	if (c->stopping || !meta_writable(&c->meta))
		return TAKE_EIO;
	if (freeq_before_wait_locked(c))
		return TAKE_AGAIN;
	c->waiting_writers++;
	CNT_ADD(c, space_wait_ops, 1);
	pthread_cond_broadcast(&c->destage_cond);
	pthread_cond_wait(&c->space_cond, &c->lock);
	c->waiting_writers--;
	return TAKE_AGAIN;
}

int write_cached(struct cache *c, struct cfile *f, const void *vsrc,
		 size_t len, uint64_t off, int mode)
{
	struct span sp[SEG_MAX_BLOCKS];
	const char *src = vsrc;
	uint64_t end = off + len, cur = off, seg_bytes, newd = 0;
	int nsp, i, ret = 0;
	int copies = mode == MODE_WRITEBACK ? (int)c->cfg->dirty_copies : 1;

	if (f->ro)
		return -EBADF;
	if (!len)
		return 0;
	if (end < off || end > c->max_file_size)
		return -EFBIG;
	if (mode == MODE_WRITEAROUND || mode == MODE_BYPASS)
		return write_around_or(c, f, src, len, off, MODE_WRITETHROUGH);
	ret = file_ensure_record(c, f);
	if (ret == -ENOSPC) /* no record to be had: around the cache */
		return write_around_or(c, f, src, len, off, MODE_WRITETHROUGH);
	if (ret)
		return ret;
	file_rw_rdlock_req(f);
	if (file_mode(c, f) == MODE_BYPASS) {
		/* it became bypass since the mode was read (fpolicy.c) */
		frw_unlock(f);
		return write_around_or(c, f, src, len, off, MODE_WRITETHROUGH);
	}
	while (cur < end && !ret) {
		nsp = 0;
		seg_bytes = 0;
		pthread_mutex_lock(&c->lock);
		while (cur < end && nsp < SEG_MAX_BLOCKS &&
		       seg_bytes < IO_BUF_BYTES - 2 * NVC_PAGE - c->bs) {
			uint64_t blk = cur / c->bs, b0 = blk * c->bs;
			uint64_t e = end < b0 + c->bs ? end : b0 + c->bs;
			struct span *x = &sp[nsp];
			struct cslot *s;
			enum seg_take t;

			t = seg_take_slot_locked(c, f, blk, copies, nsp, &s);
			if (t == TAKE_AGAIN)
				continue;
			if (t == TAKE_HELD_FIRST)
				break; /* write what we hold first */
			if (t == TAKE_EIO) {
				ret = -EIO;
				break;
			}
			if (mode == MODE_WRITEBACK && s->state != SLOT_DIRTY)
				newd++; /* turns dirty: paced below */
			slot_pin_locked(c, f, s);
			x->s = s;
			x->blk = blk;
			x->p0 = (cur - b0) / NVC_PAGE;
			x->p1 = (e - b0 + NVC_PAGE - 1) / NVC_PAGE;
			seg_bytes += (x->p1 - x->p0) * NVC_PAGE;
			nsp++;
			cur = e;
		}
		cache_unlock(c);
		if (nsp) {
			uint64_t segoff =
				sp[0].blk * c->bs + sp[0].p0 * NVC_PAGE;

			if (segoff < off)
				segoff = off;
			ret = write_segment(c, f, sp, nsp, src + (segoff - off),
					    segoff, cur, mode);
			pthread_mutex_lock(&c->lock);
			for (i = 0; i < nsp; i++)
				slot_unpin_locked(c, f, sp[i].s);
			cache_unlock(c);
		}
	}
	frw_unlock(f);
	cache_touch(c);
	if (newd && !ret)
		write_pace(c, newd);
	return ret;
}

int cache_write(struct cache *c, struct cfile *f, const void *vsrc, size_t len,
		uint64_t off)
{
	int ret;

	/* waits for locks: never with asynchronous requests held (aio.c) */
	assert(!cache_aio_held());

	CNT_ADD(c, write_ops, 1);
	ret = write_pressed(c, f, vsrc, len, off, file_mode(c, f));
	if (!ret)
		CNT_ADD(c, write_bytes, len);
	return ret;
}

/* ---------------------------------------------------------------- fsync */

/* Some cache device has failed while mounted. */
static int any_dev_failed(struct cache *c)
{
	int d;

	for (d = 0; d < c->ndevs; d++)
		if (__atomic_load_n(&c->dev_failed[d], __ATOMIC_ACQUIRE))
			return 1;
	return 0;
}

int cache_fsync(struct cache *c, struct cfile *f)
{
	int d, ret = 0;

	/*
	 * Dirty data on a failed device cannot be made durable.  Only then
	 * are the file's slots looked at: a walk of every slot of a large
	 * file under c->lock would cost more than the fsync (issue 11).
	 */
	if (f && any_dev_failed(c)) {
		struct list *l;

		pthread_mutex_lock(&c->lock);
		for (l = f->slots.next; l != &f->slots; l = l->next) {
			struct cslot *s = list_entry(l, struct cslot, flink);

			if (s->state == SLOT_DIRTY && slot_failed(c, s) &&
			    (!s->twin ||
			     slot_failed(c, &c->slots[s->twin - 1])))
				ret = -EIO;
		}
		cache_unlock(c);
		if (ret)
			return ret;
	}
	for (d = 0; d < c->ndevs; d++)
		if (!c->dev_failed[d] && cache_dev_sync(c, d))
			ret = -EIO;
	/* the backing file's own existence must survive power loss too */
	if (!ret && f)
		ret = file_bk_sync(c, f);
	if (!ret && f && file_mode(c, f) != MODE_WRITEBACK) {
		if (backing_sync(c, f, 1))
			ret = -errno;
		else
			BK_HOOK(c, sync, f->ino);
	}
	return ret;
}

