/* cache: reads and writes whose device I/O runs without a thread waiting for it. */
#define _GNU_SOURCE
#include "data_int.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/*
 * The asynchronous pipeline.  A server thread that must not block (fs/aloop.c)
 * takes a read or a write in three steps: cache_aio_begin() takes the locks
 * and prepares the device I/O, the thread hands the I/O to its ring and goes
 * on with other requests, and when the last I/O has completed,
 * cache_aio_end() finishes the request as the synchronous path would and
 * drops the locks.
 *
 * Only the common case is taken this way, and it is decided before anything
 * changes: a read whose pages are all valid in the cache (a hit), or a
 * writeback write into blocks the file already has in the cache, one copy,
 * on working devices, whose partial first and last pages (if any) are cached
 * or past the backing file's end.  Anything else (a miss, a new block, a
 * partial page to read from the backing file, a second copy, a lock someone
 * holds) is refused with nothing done, and the caller takes the synchronous
 * path (cache_read/cache_write).  A lock someone holds is told apart
 * (-EBUSY, else -EAGAIN): the same request may be taken this way once the
 * holder has finished.  The ordering rules are those of the synchronous
 * path, because the same code runs: a write's data reaches the device before
 * the map entry that finds it (wseg_end persists after the I/O completed),
 * and a clean page is overwritten only after its entry says dirty
 * (wseg_begin marks the intent before the I/O is prepared).
 *
 * Locks.  Between begin and end the request holds what the synchronous path
 * holds across its I/O: f->rw for reading, its slots pinned, and each slot's
 * rw (for reading, or writing).  pthread locks belong to a thread, so begin
 * and end run on the same thread (asserted).  That thread must never wait
 * for a lock while it holds one for a request in flight: it would wait for
 * itself.  So begin only tries the locks (-EBUSY when one is taken), and the
 * thread does nothing that may wait for a file's or slot's lock while it has
 * requests in flight (cache_aio_held tells it).
 */

struct cache_aio {
	struct cache *c;
	struct cfile *f;
	int write; /* a write, else a read */
	int begun; /* locks held, between begin and end */
	pthread_t owner;
	uint64_t off, len, pstart;
	char *buf; /* IO_BUF_BYTES, aligned */
	struct span sp[SEG_MAX_BLOCKS + 2];
	int nsp;
	struct dev_io rios[SEG_MAX_BLOCKS + 2]; /* a read's I/O */
	unsigned nrio;
	struct wseg w;
};

static __thread unsigned aio_held; /* requests this thread has begun */

unsigned cache_aio_held(void)
{
	return aio_held;
}

int cache_aio_new(struct cache_aio **out)
{
	struct cache_aio *a = calloc(1, sizeof(*a));

	if (!a)
		return -ENOMEM;
	a->buf = dev_alloc_buf(IO_BUF_BYTES);
	if (!a->buf) {
		free(a);
		return -ENOMEM;
	}
	*out = a;
	return 0;
}

void cache_aio_free(struct cache_aio *a)
{
	if (!a)
		return;
	assert(!a->begun);
	free(a->buf);
	free(a);
}

/*
 * Pin the slots of pages [pstart, pend) (page-aligned): every block must
 * have one (else -EAGAIN, nothing pinned).  c->lock held.
 */
static int aio_pin_locked(struct cache_aio *a, uint64_t pstart, uint64_t pend)
{
	struct cache *c = a->c;
	uint64_t blk;
	int i;

	assert(!(pstart % NVC_PAGE) && !(pend % NVC_PAGE) && pend > pstart);
	a->nsp = 0;
	for (blk = pstart / c->bs; blk * c->bs < pend; blk++) {
		struct span *x = &a->sp[a->nsp];
		uint64_t b0 = blk * c->bs;

		if (a->nsp == SEG_MAX_BLOCKS)
			goto undo;
		memset(x, 0, sizeof(*x));
		x->blk = blk;
		x->p0 = pstart > b0 ? (pstart - b0) / NVC_PAGE : 0;
		x->p1 = pend < b0 + c->bs ? (pend - b0) / NVC_PAGE : c->ppb;
		x->s = slot_find(c, a->f->rec, blk);
		if (a->write && write_around_busy_locked(a->f, blk))
			goto undo; /* after the write around it (wround.c) */
		if (!x->s || x->s->twin || slot_failed(c, x->s) ||
		    (a->write && slot_draining(c, x->s)))
			goto undo; /* a draining device's blocks: write_cached */
		slot_pin_locked(c, a->f, x->s);
		a->nsp++;
	}
	return 0;
undo:
	for (i = 0; i < a->nsp; i++)
		slot_unpin_locked(c, a->f, a->sp[i].s);
	a->nsp = 0;
	return -EAGAIN;
}

static void aio_unpin_locked(struct cache_aio *a)
{
	int i;

	for (i = 0; i < a->nsp; i++)
		slot_unpin_locked(a->c, a->f, a->sp[i].s);
	a->nsp = 0;
}

static void aio_unpin(struct cache_aio *a)
{
	pthread_mutex_lock(&a->c->lock);
	aio_unpin_locked(a);
	cache_unlock(a->c);
}

/* Some slot the request pinned holds a dirty page.  c->lock held. */
static int aio_any_dirty_locked(const struct cache_aio *a)
{
	int i;

	for (i = 0; i < a->nsp; i++)
		if (pb_any(a->c, slot_dirty(a->c, a->sp[i].s)))
			return 1;
	return 0;
}

/* Lock the slots for reading, then check every page is valid (a hit). */
static int aread_lock(struct cache_aio *a)
{
	struct cache *c = a->c;
	int i, hit = 1;
	uint32_t p;

	for (i = 0; i < a->nsp; i++) {
		if (!srw_tryrdlock(&a->sp[i].s->rw)) {
			while (i-- > 0)
				srw_unlock(&a->sp[i].s->rw);
			return -EBUSY;
		}
	}
	pthread_mutex_lock(&c->lock);
	for (i = 0; i < a->nsp && hit; i++) {
		struct span *x = &a->sp[i];

		for (p = x->p0; p < x->p1 && hit; p++)
			hit = pb_test(slot_valid(c, x->s), p);
	}
	for (i = 0; i < a->nsp && hit; i++) {
		struct cslot *s = a->sp[i].s;

		slot_touch_locked(c, s);
	}
	cache_unlock(c);
	if (hit)
		return 0;
	for (i = a->nsp - 1; i >= 0; i--)
		srw_unlock(&a->sp[i].s->rw);
	return -EAGAIN;
}

static int aread_begin(struct cache_aio *a)
{
	struct cache *c = a->c;
	uint64_t size, pend;
	int i, ret;

	a->pstart = a->off & ~(uint64_t)(NVC_PAGE - 1);
	pthread_mutex_lock(&c->lock);
	size = a->f->size;
	if (a->off >= size || !a->len) {
		cache_unlock(c);
		a->len = 0;
		return 0;
	}
	if (a->len > size - a->off)
		a->len = size - a->off;
	pend = (a->off + a->len + NVC_PAGE - 1) & ~(uint64_t)(NVC_PAGE - 1);
	ret = pend - a->pstart > IO_BUF_BYTES ? -EAGAIN
					      : aio_pin_locked(a, a->pstart, pend);
	cache_unlock(c);
	if (ret)
		return ret;
	ret = aread_lock(a);
	if (ret) {
		aio_unpin(a);
		return ret;
	}
	for (i = 0; i < a->nsp; i++) {
		struct span *x = &a->sp[i];
		struct dev_io *io = &a->rios[i];
		uint64_t s = slot_idx(c, x->s);

		memset(io, 0, sizeof(*io));
		io->dev = slot_dev(c, s);
		io->op = DEV_READ;
		io->off = slot_off(c, s) + x->p0 * NVC_PAGE;
		io->len = (x->p1 - x->p0) * NVC_PAGE;
		io->buf = a->buf + (x->blk * c->bs + x->p0 * NVC_PAGE -
				    a->pstart);
	}
	a->nrio = a->nsp;
	return 0;
}

static int awrite_begin(struct cache_aio *a, const char *src)
{
	struct cache *c = a->c;
	struct cfile *f = a->f;
	uint64_t end = a->off + a->len;
	int ret;

	if (f->ro || !a->len || end < a->off || end > c->max_file_size ||
	    !f->rec || c->cfg->dirty_copies > 1 ||
	    file_mode(c, f) != MODE_WRITEBACK ||
	    a->len > IO_BUF_BYTES - 2 * NVC_PAGE - c->bs)
		return -EAGAIN;
	/* the spans cover whole pages; wseg_begin keeps a partial page's
	 * other bytes */
	pthread_mutex_lock(&c->lock);
	ret = aio_pin_locked(a, a->off & ~(uint64_t)(NVC_PAGE - 1),
			     (end + NVC_PAGE - 1) & ~(uint64_t)(NVC_PAGE - 1));
	if (!ret && !f->pinned && write_around_now_locked(c) &&
	    !aio_any_dirty_locked(a)) {
		/* clean copies only, under pressure: it goes around the
		 * cache (wround.c), on the synchronous path */
		aio_unpin_locked(a);
		ret = -EAGAIN;
	}
	cache_unlock(c);
	if (ret)
		return ret;
	memset(&a->w, 0, sizeof(a->w));
	a->w.sp = a->sp;
	a->w.nsp = a->nsp;
	a->w.off = a->off;
	a->w.end = end;
	a->w.mode = MODE_WRITEBACK;
	a->w.buf = a->buf;
	ret = wseg_begin(c, f, &a->w, src, 1);
	if (ret) {
		wseg_unlock(&a->w);
		aio_unpin(a);
	}
	return ret;
}

/*
 * Begin a read (src NULL) or a write of len bytes at off.  0: the I/O to run
 * is in cache_aio_ios() (none: done already, e.g. a read at the end of the
 * file), then call cache_aio_end(); -EAGAIN: take the synchronous path,
 * nothing was done; -EBUSY: the same, but only because a lock is taken (by
 * a request in flight: trying again once it has ended may succeed); another
 * -errno: the request fails.
 */
int cache_aio_begin(struct cache *c, struct cfile *f, struct cache_aio *a,
		    const void *src, size_t len, uint64_t off)
{
	int ret;

	assert(!a->begun);
	a->c = c;
	a->f = f;
	a->write = src != NULL;
	a->off = off;
	a->len = len;
	a->nrio = 0;
	a->w.nio = 0;
	a->w.prep_err = 0;
	if (file_rw_tryrdlock_req(f))
		return -EBUSY;
	ret = a->write ? awrite_begin(a, src) : aread_begin(a);
	if (ret) {
		frw_unlock(f);
		return ret;
	}
	a->begun = 1;
	a->owner = pthread_self();
	aio_held++;
	return 0;
}

_Static_assert(CACHE_AIO_MAX_IOS >= 2 * SEG_MAX_BLOCKS + 2,
	       "a request's device I/Os fit");

unsigned cache_aio_ios(struct cache_aio *a, struct dev_io **ios)
{
	if (a->write) {
		*ios = a->w.ios;
		return a->w.prep_err ? 0 : a->w.nio;
	}
	*ios = a->rios;
	return a->nrio;
}

/*
 * A device failed under a read: the synchronous path reads the request again
 * and handles it (clean pages from the backing file, dirty ones from their
 * second copy).
 */
static int aread_end(struct cache_aio *a, char **data, size_t *n)
{
	struct cache *c = a->c;
	unsigned k;
	int i, err = 0;

	for (k = 0; k < a->nrio && !err; k++)
		err = a->rios[k].res;
	if (err)
		note_dev_error(c, a->rios, a->nrio);
	for (k = 0; k < a->nrio && !err; k++)
		stat_dev_add(&c->stats, slot_member(c, slot_idx(c, a->sp[k].s)),
			     STAT_DC_hit_bytes, a->rios[k].len);
	for (i = a->nsp - 1; i >= 0; i--)
		srw_unlock(&a->sp[i].s->rw);
	if (a->nsp)
		aio_unpin(a);
	if (err)
		return -EAGAIN;
	CNT_ADD(c, read_ops, 1);
	if (a->len) {
		CNT_ADD(c, read_bytes, a->len);
		CNT_ADD(c, read_hit_bytes, a->len);
		CNT_ADD(c, read_hit_ops, 1);
	}
	*data = a->buf + (a->off - a->pstart);
	*n = a->len;
	return 0;
}

static int awrite_end(struct cache_aio *a)
{
	struct cache *c = a->c;
	int err = a->w.prep_err;
	unsigned k;

	for (k = 0; k < a->w.nio && !err; k++)
		err = a->w.ios[k].res;
	if (err && !a->w.prep_err)
		note_dev_error(c, a->w.ios, a->w.nio);
	err = wseg_end(c, a->f, &a->w, err);
	aio_unpin(a);
	CNT_ADD(c, write_ops, 1);
	CNT_ADD(c, write_hit_ops, 1);
	if (!err)
		CNT_ADD(c, write_bytes, a->len);
	return err;
}

/*
 * Finish what cache_aio_begin() began, once its I/O has completed (each
 * dev_io's res set).  A read gives its bytes in *data, *n (valid until the
 * next begin on a); -EAGAIN: read again on the synchronous path.
 */
int cache_aio_end(struct cache_aio *a, char **data, size_t *n)
{
	int ret;

	assert(a->begun && pthread_equal(a->owner, pthread_self()));
	if (a->write) {
		ret = awrite_end(a);
		*n = a->len;
	} else {
		ret = aread_end(a, data, n);
	}
	frw_unlock(a->f);
	cache_touch(a->c);
	a->begun = 0;
	assert(aio_held > 0);
	aio_held--;
	return ret;
}
