/* cache: backing-file I/O and the read path (hits, misses, fills). */
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

/* ------------------------------------------------------------ I/O bufs */

/* Each thread's I/O buffer: made on first use, freed when the thread ends. */
static __thread void *tl_buf;
static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;

static void buf_key_init(void)
{
	pthread_key_create(&buf_key, free);
}

void *io_buf(void)
{
	if (!tl_buf) {
		pthread_once(&buf_once, buf_key_init);
		tl_buf = dev_alloc_buf(IO_BUF_BYTES);
		if (tl_buf)
			pthread_setspecific(buf_key, tl_buf);
	}
	return tl_buf;
}

/* Read [off, off+len) of the backing file, zeros past its end. */
int backing_read(struct cache *c, struct cfile *f, void *buf, size_t len,
			uint64_t off)
{
	uint64_t t0 = stat_clock(&c->stats);
	size_t done = 0;

	cache_blocking(c, "read");
	while (done < len) {
		ssize_t n = pread(f->fd, (char *)buf + done, len - done,
				  off + done);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0) {
			memset((char *)buf + done, 0, len - done);
			break;
		}
		done += n;
	}
	CNT_ADD(c, backing_read_bytes, done);
	stat_lat_since(&c->stats, STAT_L_backing_read, t0);
	return 0;
}

int backing_write(struct cache *c, struct cfile *f, const void *buf, size_t len,
		  uint64_t off)
{
	return backing_write_fd(c, f, f->fd, buf, len, off);
}

int backing_write_fd(struct cache *c, struct cfile *f, int fd, const void *buf,
		     size_t len, uint64_t off)
{
	uint64_t t0 = stat_clock(&c->stats);
	size_t done = 0;

	cache_blocking(c, "write");
	while (done < len) {
		ssize_t n = pwrite(fd, (const char *)buf + done, len - done,
				   off + done);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		BK_HOOK(c, write, f->ino, (const char *)buf + done, n,
			off + done);
		done += n;
	}
	/*
	 * The file reaches off + len now, whenever its look is noted: a note
	 * waits while another change is under way (coherence.c), and a
	 * partial page past f->bsize is taken for a hole (page_prefill).  The
	 * caller holds f->rw, so no truncate cuts it meanwhile, and a note
	 * takes a look only while no change is under way (coh_bk_begin;
	 * writearound shuts the others out by f->rw): a size seen that high
	 * stays so, and a write inside the file takes no lock.
	 */
	if (off + len > __atomic_load_n(&f->bsize, __ATOMIC_RELAXED)) {
		pthread_mutex_lock(&c->lock);
		file_bsize_grow_locked(c, f, off + len);
		cache_unlock(c);
	}
	bks_changed(f); /* after the change: bkstream.c */
	CNT_ADD(c, backing_write_bytes, len);
	stat_lat_since(&c->stats, STAT_L_backing_write, t0);
	return 0;
}

/* fsync (data_only: fdatasync) a backing file; 0 or -1 with errno set. */
int backing_sync(struct cache *c, struct cfile *f, int data_only)
{
	uint64_t t0;
	int ret;

	cache_blocking(c, "sync");
	t0 = stat_clock(&c->stats);
	ret = data_only ? fdatasync(f->fd) : fsync(f->fd);

	if (!ret)
		stat_lat_since(&c->stats, STAT_L_backing_fsync, t0);
	return ret;
}

void file_bk_changed(struct cfile *f)
{
	bks_changed(f);
	__atomic_add_fetch(&f->bk_wgen, 1, __ATOMIC_RELEASE);
}

void cache_file_written_outside(struct cfile *f)
{
	file_bk_changed(f);
}

void file_bk_synced(struct cfile *f, uint64_t gen)
{
	uint64_t cur = __atomic_load_n(&f->bk_synced, __ATOMIC_ACQUIRE);

	while (cur < gen && !__atomic_compare_exchange_n(&f->bk_synced, &cur,
							 gen, 0,
							 __ATOMIC_ACQ_REL,
							 __ATOMIC_ACQUIRE))
		;
}

int file_bk_sync(struct cache *c, struct cfile *f)
{
	uint64_t start = __atomic_load_n(&f->bk_wgen, __ATOMIC_ACQUIRE);

	if (__atomic_load_n(&f->bk_synced, __ATOMIC_ACQUIRE) >= start)
		return 0;
	if (backing_sync(c, f, 0))
		return -errno;
	BK_HOOK(c, sync, f->ino);
	file_bk_synced(f, start);
	return 0;
}

/* ----------------------------------------------------------------- read */


void cache_touch(struct cache *c)
{
	__atomic_store_n(&c->last_io, now_ms(), __ATOMIC_RELAXED);
}

static __thread int tl_keep; /* io_read_keep: every miss is kept */

/* What fill_take_slot found. */
enum fill_take {
	FILL_GOT, /* *out: the block's slot, pinned */
	FILL_SKIP, /* its slot's device failed: keep nothing of this block */
	FILL_STOP, /* keep nothing more of this read */
};

/* The slot a miss's block blk is kept in: found, or allocated without
 * waiting for space (a cache full of dirty data keeps no clean data).  A
 * write since the read began (f->wgen), a write around the cache of the
 * block, or the cache stopping keeps nothing more. */
static enum fill_take fill_take_slot(struct cache *c, struct cfile *f,
				     uint64_t blk, uint64_t wgen0,
				     struct cslot **out)
{
	struct cslot *s;

	for (;;) {
		pthread_mutex_lock(&c->lock);
		if (f->wgen != wgen0 || c->stopping ||
		    write_around_busy_locked(f, blk)) {
			/* a write around the cache is changing what was
			 * read: keep none of it (wround.c) */
			cache_unlock(c);
			return FILL_STOP;
		}
		s = slot_find(c, f->rec, blk);
		if (s && slot_failed(c, s)) {
			cache_unlock(c);
			return FILL_SKIP;
		}
		if (!s)
			s = slot_alloc_locked(c, f, blk);
		if (!s && freeq_wait_locked(c)) {
			/* freed slots were on their way to the free list */
			cache_unlock(c);
			continue;
		}
		if (!s) {
			cache_unlock(c);
			return FILL_STOP; /* cache full of dirty data */
		}
		slot_pin_locked(c, f, s);
		cache_unlock(c);
		*out = s;
		return FILL_GOT;
	}
}

/* The pages of span x that s does not hold and no write reached since the
 * read began written to s's device and made valid (s pinned; s->rw taken
 * here for writing), then s unpinned. */
static void fill_keep(struct cache *c, struct cfile *f, struct span *x,
		      struct cslot *s, char *buf, uint64_t pstart,
		      uint64_t wgen0)
{
	uint64_t want[META_MAX_WORDS] = { 0 }, rbseq;
	struct dev_io io = { .op = DEV_WRITE }; /* plain: clean data */
	uint32_t p, run0;
	int ret = 0, pinned = 0;

	srw_wrlock(&s->rw);
	rbseq = rebuild_seq(c);
	pthread_mutex_lock(&c->lock);
	if (f->wgen == wgen0)
		for (p = x->p0; p < x->p1; p++)
			if (!bm_test(x->valid, p) &&
			    !pb_test(slot_valid(c, s), p))
				bm_set(want, p);
	cache_unlock(c);
	for (p = x->p0; p < x->p1 && !ret;) {
		if (!bm_test(want, p)) {
			p++;
			continue;
		}
		for (run0 = p; p < x->p1 && bm_test(want, p); p++)
			;
		io.dev = slot_dev(c, slot_idx(c, s));
		io.op = DEV_WRITE;
		io.off = slot_off(c, slot_idx(c, s)) + run0 * NVC_PAGE;
		io.len = (p - run0) * NVC_PAGE;
		io.buf = buf + (x->blk * c->bs + run0 * NVC_PAGE - pstart);
		ret = dev_io_run(&io, 1);
		if (ret) {
			note_dev_error(c, &io, 1);
			for (uint32_t q = run0; q < p; q++)
				bm_clear(want, q);
		} else {
			cache_dev_written(c, slot_member(c, slot_idx(c, s)));
			CNT_ADD(c, fill_bytes, io.len);
		}
	}
	if (bm_any(want) && c->test_committing)
		c->test_committing(c, s);
	if (bm_any(want))
		rebuild_check_commit(c, s, rbseq);
	/* clean data is not persisted: a crash just forgets it */
	pthread_mutex_lock(&c->lock);
	if (bm_any(want)) {
		for (p = x->p0; p < x->p1; p++)
			if (bm_test(want, p)) {
				/* s->rw held since want was taken: no write
				 * reached these pages */
				assert(!pb_test(slot_valid(c, s), p) &&
				       !pb_test(slot_dirty(c, s), p));
				pb_set(slot_valid(c, s), p);
				pb_set(slot_unsynced(c, s), p);
				pages_valid(c, s, 1);
			}
		slot_settle(c, s);
		pinned = file_pinned(f);
	}
	cache_unlock(c);
	/* except a pinned file's, which survives a remount (filectl.c): its
	 * entry claims the pages once the device holds them (slot_persist
	 * flushes first), s->rw held; a warm persists what it kept at its
	 * end, behind one flush */
	if (pinned && !tl_keep && slot_persist(c, s))
		log_msg(LOG_ERR, "cannot persist a pinned file's block");
	srw_unlock(&s->rw);
	pthread_mutex_lock(&c->lock);
	slot_unpin_locked(c, f, s);
	cache_unlock(c);
}

/* Keep what a read miss fetched: only pages nobody wrote meanwhile. */
static void fill_from_backing(struct cache *c, struct cfile *f, struct span *sp,
			      int nsp, char *buf, uint64_t pstart,
			      uint64_t wgen0)
{
	int i;

	/* f->rw held: a bypass file keeps nothing (fpolicy.c), and a bump
	 * of f->wgen since the read began is seen (files/look.c) */
	assert(frw_held(f, 0));
	if (file_mode(c, f) == MODE_BYPASS || file_ensure_record(c, f))
		return;
	for (i = 0; i < nsp; i++) {
		struct cslot *s;
		enum fill_take t;

		if (!sp[i].miss)
			continue;
		t = fill_take_slot(c, f, sp[i].blk, wgen0, &s);
		if (t == FILL_STOP)
			return;
		if (t == FILL_GOT)
			fill_keep(c, f, &sp[i], s, buf, pstart, wgen0);
	}
}

/*
 * Fills after the reply.  A read served through cache_read_defer records what
 * its misses fetched (the spans as the read saw them, the page-aligned buffer,
 * the write generation it started in) instead of writing it to the devices;
 * cache_read_finish, called by the same thread once the reply is sent, keeps
 * it, under the same rule as a fill in the read path: only pages that no write
 * reached since the read began (f->wgen unchanged, checked under s->rw), so a
 * fill never overwrites a write, and as clean, unsynced data (not persisted:
 * the power-loss rule in engine.h).  The buffer is the caller's and must stay
 * untouched until then; the file is referenced, since its last release may
 * come as soon as the reply is out.  A request with more chunks than fit is
 * filled at once for the rest.
 */
#define DEFER_CHUNKS 8

struct deferred {
	struct cfile *f; /* referenced while nchunks > 0 */
	uint64_t wgen0;
	int nchunks;
	struct {
		char *buf;
		uint64_t pstart;
		int nsp;
		struct span sp[SEG_MAX_BLOCKS + 2];
	} ch[DEFER_CHUNKS];
};

static __thread struct deferred *tl_def;
static __thread void *tl_pin; /* a segment a reply is sent from (bkstream.c) */
static __thread int tl_defer; /* cache_read_defer is under way */
static pthread_key_t def_key;
static pthread_once_t def_once = PTHREAD_ONCE_INIT;

static void def_key_init(void)
{
	pthread_key_create(&def_key, free);
}

/* The thread's I/O buffer and deferred fills back (made again on use). */
void cache_thread_idle(void)
{
	if (tl_buf) {
		pthread_setspecific(buf_key, NULL);
		free(tl_buf);
		tl_buf = NULL;
	}
	if (tl_def && !tl_def->nchunks && !tl_defer) {
		pthread_setspecific(def_key, NULL);
		free(tl_def);
		tl_def = NULL;
	}
}

/* Record a chunk's fill for cache_read_finish: 1, or 0 if it cannot be. */
static int fill_defer(struct cache *c, struct cfile *f, struct span *sp,
		      int nsp, char *buf, uint64_t pstart, uint64_t wgen0)
{
	struct deferred *d = tl_def;
	int k;

	if (!tl_defer)
		return 0;
	/*
	 * The record is had before the reply, as before fills were deferred:
	 * a rename through the mount between ident_note and the record's
	 * publication in c->recs is missed by ident_renamed (file.c
	 * file_ensure_record), and an application renames a file it has just
	 * read far more often than one being read.
	 */
	if (file_ensure_record(c, f))
		return 0;
	if (!d) {
		pthread_once(&def_once, def_key_init);
		d = tl_def = calloc(1, sizeof(*d));
		if (!d)
			return 0;
		pthread_setspecific(def_key, d);
	}
	if (d->nchunks == DEFER_CHUNKS || (d->nchunks && d->f != f))
		return 0;
	if (!d->nchunks) {
		pthread_mutex_lock(&c->lock);
		f->refs++;
		cache_unlock(c);
		d->f = f;
		d->wgen0 = wgen0;
	}
	assert(d->wgen0 == wgen0);
	k = d->nchunks++;
	d->ch[k].buf = buf;
	d->ch[k].pstart = pstart;
	d->ch[k].nsp = nsp;
	memcpy(d->ch[k].sp, sp, nsp * sizeof(*sp));
	return 1;
}

void cache_read_finish(struct cache *c)
{
	struct deferred *d = tl_def;
	struct cfile *f;
	int k;

	if (tl_pin) {
		bks_unpin(c, tl_pin);
		tl_pin = NULL;
	}
	if (!d || !d->nchunks)
		return;
	f = d->f;
	frw_rdlock(f);
	for (k = 0; k < d->nchunks && !f->unlinked; k++)
		fill_from_backing(c, f, d->ch[k].sp, d->ch[k].nsp, d->ch[k].buf,
				  d->ch[k].pstart, d->wgen0);
	frw_unlock(f);
	d->nchunks = 0;
	d->f = NULL;
	cache_file_put(c, f);
}

/* Read a miss run [off, off+len) from the backing file: directly, with
 * readahead, for a stream that bypasses the cache (bkstream.c). */
static int miss_read(struct cache *c, struct cfile *f, char *buf, size_t len,
		     uint64_t off, const struct admit_verdict *v)
{
	if (v->bypass) {
		int ret = bks_read(c, f, buf, len, off,
				   __atomic_load_n(&c->cfg->backing_direct_ra,
						   __ATOMIC_RELAXED),
				   v);

		if (ret != -EAGAIN)
			return ret;
	}
	return backing_read(c, f, buf, len, off);
}

/* One chunk of a read: its blocks (spans, their slots pinned) and the
 * device reads of their valid pages. */
struct rchunk {
	struct span sp[SEG_MAX_BLOCKS + 2];
	int nsp;
	struct dev_io ios[SEG_MAX_BLOCKS * 4];
	uint32_t io_p0[SEG_MAX_BLOCKS * 4], io_p1[SEG_MAX_BLOCKS * 4];
	int io_span[SEG_MAX_BLOCKS * 4];
	unsigned nio;
	char *buf; /* holds the page at pstart */
	uint64_t pstart, pend, hit, miss;
};

/* The chunk's blocks, each slot found pinned (f->rw held: the pin rule). */
static void chunk_pin(struct cache *c, struct cfile *f, struct rchunk *r)
{
	uint64_t blk;

	pthread_mutex_lock(&c->lock);
	for (blk = r->pstart / c->bs; blk * c->bs < r->pend; blk++) {
		struct span *x = &r->sp[r->nsp++];
		uint64_t b0 = blk * c->bs;

		memset(x, 0, sizeof(*x));
		x->blk = blk;
		x->p0 = r->pstart > b0 ? (r->pstart - b0) / NVC_PAGE : 0;
		x->p1 = r->pend < b0 + c->bs ? (r->pend - b0) / NVC_PAGE
					     : c->ppb;
		x->s = slot_find(c, f->rec, blk);
		if (x->s)
			slot_pin_locked(c, f, x->s);
	}
	cache_unlock(c);
}

/* Each slot locked for reading, its valid pages noted, and a device read
 * queued per run of them. */
static void chunk_queue_hits(struct cache *c, struct rchunk *r)
{
	uint32_t p, run0;
	int i;

	for (i = 0; i < r->nsp; i++) {
		struct span *x = &r->sp[i];

		if (!x->s)
			continue;
		srw_rdlock(&x->s->rw);
		pthread_mutex_lock(&c->lock);
		pb_get(c, slot_valid(c, x->s), x->valid);
		slot_touch_locked(c, x->s);
		cache_unlock(c);
		for (p = x->p0; p < x->p1;) {
			struct dev_io *io = &r->ios[r->nio];

			if (!bm_test(x->valid, p)) {
				p++;
				continue;
			}
			for (run0 = p; p < x->p1 && bm_test(x->valid, p); p++)
				;
			io->dev = slot_dev(c, slot_idx(c, x->s));
			io->op = DEV_READ;
			io->off = slot_off(c, slot_idx(c, x->s)) +
				  run0 * NVC_PAGE;
			io->len = (p - run0) * NVC_PAGE;
			io->buf = r->buf +
				  (x->blk * c->bs + run0 * NVC_PAGE - r->pstart);
			r->io_span[r->nio] = i;
			r->io_p0[r->nio] = run0;
			r->io_p1[r->nio] = p;
			r->hit += (p - run0) * NVC_PAGE;
			r->nio++;
		}
	}
}

/*
 * A device failed under the chunk's reads.  Clean pages are in the backing
 * file: forget them here and read them from there (they become misses).
 * Dirty pages exist nowhere else but in the second copy, read after c->lock
 * is dropped (core.h, "Two copies"): the slot's pin keeps its twin (a twin
 * goes only with pins == its freer's own) and s->rw, held for reading,
 * keeps writers off both; without a twin holding the page the read fails.
 */
static int chunk_failed(struct cache *c, struct cfile *f, struct rchunk *r)
{
	/* pages of each span only the second copy has */
	uint64_t tw[SEG_MAX_BLOCKS + 2][META_MAX_WORDS];
	unsigned k;
	uint32_t p;
	int ret = 0;

	note_dev_error(c, r->ios, r->nio);
	memset(tw, 0, sizeof(tw));
	pthread_mutex_lock(&c->lock);
	for (k = 0; k < r->nio; k++) {
		struct span *x = &r->sp[r->io_span[k]];

		if (!r->ios[k].res)
			continue;
		for (p = r->io_p0[k]; p < r->io_p1[k]; p++) {
			if (pb_test(slot_dirty(c, x->s), p)) {
				bm_set(tw[r->io_span[k]], p);
				continue;
			}
			bm_clear(x->valid, p);
			page_forget_locked(c, x->s, p);
			r->hit -= NVC_PAGE;
		}
	}
	cache_unlock(c);
	for (k = 0; k < r->nio; k++) {
		struct span *x = &r->sp[r->io_span[k]];
		char *at = r->ios[k].buf;

		if (!r->ios[k].res)
			continue;
		for (p = r->io_p0[k]; p < r->io_p1[k]; p++, at += NVC_PAGE) {
			if (!bm_test(tw[r->io_span[k]], p) ||
			    !twin_read(c, x->s, at, p, p + 1))
				continue;
			log_msg(LOG_ERR,
				"inode %llu block %llu page %u: dirty on a "
				"failed device (slot %llu) and no second copy "
				"holds it (twin %u)",
				(unsigned long long)f->ino,
				(unsigned long long)x->blk, p,
				(unsigned long long)slot_idx(c, x->s),
				x->s->twin);
			ret = -EIO;
		}
	}
	return ret;
}

/* Misses: contiguous runs of pages not valid, from the backing file. */
static int chunk_misses(struct cache *c, struct cfile *f, struct rchunk *r,
			const struct admit_verdict *v)
{
	uint64_t m0 = 0, m1 = 0;
	uint32_t p;
	int i, ret = 0;

	for (i = 0; i <= r->nsp && !ret; i++) {
		struct span *x = i < r->nsp ? &r->sp[i] : NULL;

		for (p = x ? x->p0 : 0; x && p < x->p1; p++) {
			uint64_t at = x->blk * c->bs + p * NVC_PAGE;

			if (bm_test(x->valid, p))
				continue;
			x->miss = 1;
			if (m1 == at) {
				m1 += NVC_PAGE;
				continue;
			}
			if (m1 > m0)
				ret = miss_read(c, f, r->buf + (m0 - r->pstart),
						m1 - m0, m0, v);
			r->miss += m1 - m0;
			m0 = at;
			m1 = at + NVC_PAGE;
		}
		if (!x && m1 > m0) {
			ret = miss_read(c, f, r->buf + (m0 - r->pstart),
					m1 - m0, m0, v);
			r->miss += m1 - m0;
		}
	}
	return ret;
}

/* Read [off, off+len) into buf, where buf holds the page at pbase: the
 * valid pages from the devices (all at once), the rest from the backing
 * file, which the cache then keeps (fill_from_backing, or after the reply:
 * fill_defer) unless f->wgen moved since wgen0. */
static int read_chunk(struct cache *c, struct cfile *f, char *buf,
		      uint64_t pbase, size_t len, uint64_t off, uint64_t wgen0,
		      const struct admit_verdict *v, int *nmiss)
{
	struct rchunk r;
	unsigned k;
	int i, ret = 0;

	r.nsp = 0;
	r.nio = 0;
	r.hit = r.miss = 0;
	r.pstart = off & ~(uint64_t)(NVC_PAGE - 1);
	r.pend = (off + len + NVC_PAGE - 1) & ~(uint64_t)(NVC_PAGE - 1);
	r.buf = buf + (r.pstart - pbase);
	chunk_pin(c, f, &r);
	chunk_queue_hits(c, &r);
	if (r.nio && dev_io_run(r.ios, r.nio))
		ret = chunk_failed(c, f, &r);
	for (k = 0; k < r.nio; k++)
		if (!r.ios[k].res)
			stat_dev_add(&c->stats,
				     slot_member(c,
						 slot_idx(c, r.sp[r.io_span[k]].s)),
				     STAT_DC_hit_bytes, r.ios[k].len);
	for (i = 0; i < r.nsp; i++)
		if (r.sp[i].s)
			srw_unlock(&r.sp[i].s->rw);
	if (!ret)
		ret = chunk_misses(c, f, &r, v);
	if (ret)
		goto out_unpin;
	if (r.hit > len)
		r.hit = len;
	CNT_ADD(c, read_hit_bytes, r.hit);
	CNT_ADD(c, read_miss_bytes, len - r.hit);
	*nmiss |= (r.hit ? 1 : 0) | (r.miss ? 2 : 0);
	if (r.miss && v->bypass)
		CNT_ADD(c, read_bypass_bytes, r.miss);
	else if (r.miss && !f->unlinked &&
		 !fill_defer(c, f, r.sp, r.nsp, r.buf, r.pstart, wgen0))
		fill_from_backing(c, f, r.sp, r.nsp, r.buf, r.pstart, wgen0);
out_unpin:
	pthread_mutex_lock(&c->lock);
	for (i = 0; i < r.nsp; i++)
		if (r.sp[i].s)
			slot_unpin_locked(c, f, r.sp[i].s);
	cache_unlock(c);
	return ret;
}

/* No page of [off, off+len) is valid in the cache. */
static int range_uncached(struct cache *c, struct cfile *f, uint64_t off,
			  size_t len)
{
	uint64_t pstart = off & ~(uint64_t)(NVC_PAGE - 1),
		 pend = (off + len + NVC_PAGE - 1) & ~(uint64_t)(NVC_PAGE - 1),
		 blk;
	int ok = 1;

	pthread_mutex_lock(&c->lock);
	for (blk = pstart / c->bs; ok && blk * c->bs < pend; blk++) {
		struct cslot *s = slot_find(c, f->rec, blk);
		uint64_t b0 = blk * c->bs;
		uint32_t p = pstart > b0 ? (pstart - b0) / NVC_PAGE : 0,
			 p1 = pend < b0 + c->bs ? (pend - b0) / NVC_PAGE
						: c->ppb;

		for (; s && p < p1 && ok; p++)
			ok = !pb_test(slot_valid(c, s), p);
	}
	cache_unlock(c);
	return ok;
}

/*
 * What the file's last read says of it for its next open (admit.h,
 * adm.streamed): a miss past the cutoff names its stream; an admitted read,
 * hit or miss, clears it; a bypassed read that only hit (a warmed file read
 * as a stream) leaves it, as do the reads that hit asynchronously (aio.c),
 * which note no stream.  Stored only when it changes: every read of the
 * file on this path comes here.
 */
static void note_streamed(struct cfile *f, const struct admit_verdict *v,
			  int missed)
{
	uint64_t want = v->bypass ? v->sid : 0;

	if (v->bypass && !missed)
		return;
	if (__atomic_load_n(&f->adm.streamed, __ATOMIC_RELAXED) != want)
		__atomic_store_n(&f->adm.streamed, want, __ATOMIC_RELAXED);
}

/*
 * A read of a stream that bypasses, all of it misses, answered from a
 * segment read ahead without a copy (bkstream.c): 1, with *data pointing
 * into it until cache_read_finish; 0: read it the usual way.  f->rw held.
 */
static int read_pinned(struct cache *c, struct cfile *f, size_t len,
		       uint64_t off, const struct admit_verdict *v,
		       char **data)
{
	const char *p;

	if (!v->bypass || tl_pin || !range_uncached(c, f, off, len) ||
	    bks_read_pinned(c, f, len, off,
			    __atomic_load_n(&c->cfg->backing_direct_ra,
					    __ATOMIC_RELAXED),
			    v, &p, &tl_pin))
		return 0;
	*data = (char *)p;
	note_streamed(f, v, 1);
	CNT_ADD(c, read_miss_bytes, len);
	CNT_ADD(c, read_bypass_bytes, len);
	CNT_ADD(c, bypass_ops, 1);
	CNT_ADD(c, read_miss_ops, 1);
	CNT_ADD(c, read_bytes, len);
	admit_readahead(c, f, v);
	return 1;
}

int cache_read(struct cache *c, struct cfile *f, void *vbuf, size_t len,
	       uint64_t off, char **data, size_t *n)
{
	int ret = cache_read_defer(c, f, vbuf, len, off, data, n, 0);

	assert(!tl_def || !tl_def->nchunks);
	return ret;
}

int cache_read_defer(struct cache *c, struct cfile *f, void *vbuf, size_t len,
		     uint64_t off, char **data, size_t *n, int defer)
{
	uint64_t size, wgen0, pstart, cur,
		chunk = (uint64_t)SEG_MAX_BLOCKS * c->bs;
	struct admit_verdict v;
	int ret = 0, nmiss = 0;

	/* waits for locks: never with asynchronous requests held (aio.c) */
	assert(!cache_aio_held());

	CNT_ADD(c, read_ops, 1);
	*n = 0;
	*data = vbuf;
	if (chunk > IO_BUF_BYTES - 2 * NVC_PAGE)
		chunk = IO_BUF_BYTES - 2 * NVC_PAGE;
	if (len > IO_BUF_BYTES - 2 * NVC_PAGE)
		return -EINVAL;
	file_rw_rdlock_req(f);
	pthread_mutex_lock(&c->lock);
	size = f->size;
	wgen0 = f->wgen;
	cache_unlock(c);
	if (off >= size || !len)
		goto out_unlock;
	if (len > size - off)
		len = size - off;
	if (tl_keep)
		memset(&v, 0, sizeof(v)); /* warm: no cutoff, no readahead */
	else
		admit_read(c, f, off, len, &v);
	if (file_mode(c, f) == MODE_BYPASS)
		v.bypass = 1; /* under f->rw: it has no slot (fpolicy.c) */
	assert(!tl_def || !tl_def->nchunks); /* the last one was finished */
	if (defer && read_pinned(c, f, len, off, &v, data)) {
		*n = len;
		goto out_unlock;
	}
	tl_defer = defer &&
		   __atomic_load_n(&c->cfg->async_fill, __ATOMIC_RELAXED);
	pstart = off & ~(uint64_t)(NVC_PAGE - 1);
	/* chunks end on block boundaries, so the page layout of buf holds */
	for (cur = off; cur < off + len && !ret;) {
		uint64_t e = (cur / chunk + 1) * chunk;

		if (e > off + len)
			e = off + len;
		ret = read_chunk(c, f, vbuf, pstart, e - cur, cur, wgen0, &v,
				 &nmiss);
		cur = e;
	}
	tl_defer = 0;
	if (ret)
		goto out_unlock;
	if (nmiss & 2) {
		admit_readahead(c, f, &v);
		if (v.bypass)
			CNT_ADD(c, bypass_ops, 1);
	}
	if (!tl_keep)
		note_streamed(f, &v, nmiss & 2);
	CNT_ADD(c, read_bytes, len);
	if (nmiss == 1)
		CNT_ADD(c, read_hit_ops, 1);
	else if (nmiss == 2)
		CNT_ADD(c, read_miss_ops, 1);
	else
		CNT_ADD(c, read_partial_ops, 1);
	*data = (char *)vbuf + (off - pstart);
	*n = len;
out_unlock:
	frw_unlock(f);
	cache_touch(c);
	return ret;
}


/*
 * A read that keeps every miss in the cache, whatever the sequential cutoff
 * says, and starts no backing readahead (nvcachectl warm, filectl.c): the
 * file's read streams are not touched either.
 */
int io_read_keep(struct cache *c, struct cfile *f, void *buf, size_t len,
		 uint64_t off, size_t *n)
{
	char *data;
	int ret;

	tl_keep = 1;
	ret = cache_read_defer(c, f, buf, len, off, &data, n, 0);
	tl_keep = 0;
	return ret;
}
