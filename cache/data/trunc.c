/* cache: truncate and fallocate through the cache: the blocks past the new size dropped, the edge page zeroed in every copy. */
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

/*
 * Zero the bytes past size in the edge block's tail page, in the slot and in
 * its twin, so that a later extension reads zeros there whichever copy serves
 * it.  The page comes from the slot, or from the twin if the slot's device
 * fails.  The writes are FUA: fsync does not know of them.  edge->rw held.
 */
static int edge_zero_tail(struct cache *c, struct cslot *edge, uint32_t p,
			  uint64_t size)
{
	struct cslot *t = edge->twin ? &c->slots[edge->twin - 1] : NULL;
	struct dev_io io = { .op = DEV_READ, .len = NVC_PAGE };
	int ret;

	io.buf = dev_alloc_buf(NVC_PAGE);
	if (!io.buf)
		return -ENOMEM;
	io.dev = slot_dev(c, slot_idx(c, edge));
	io.off = slot_off(c, slot_idx(c, edge)) + p * NVC_PAGE;
	ret = dev_io_run(&io, 1);
	if (ret) {
		note_dev_error(c, &io, 1);
		ret = pb_test(slot_dirty(c, edge), p)
			      ? twin_read(c, edge, io.buf, p, p + 1)
			      : ret;
	}
	if (ret)
		goto out_free;
	memset((char *)io.buf + size % NVC_PAGE, 0, NVC_PAGE - size % NVC_PAGE);
	io.op = DEV_WRITE;
	io.fua = 1;
	if (!slot_failed(c, edge)) {
		ret = dev_io_run(&io, 1);
		if (ret)
			note_dev_error(c, &io, 1);
	}
	if (t && pb_test(slot_valid(c, t), p) && !slot_failed(c, t)) {
		io.dev = slot_dev(c, slot_idx(c, t));
		io.off = slot_off(c, slot_idx(c, t)) + p * NVC_PAGE;
		if (dev_io_run(&io, 1)) {
			note_dev_error(c, &io, 1);
			ret = -EIO;
		}
	}
out_free:
	free(io.buf);
	return ret;
}

/*
 * Forget everything cached past size: blocks wholly past it are dropped, the
 * edge block loses its pages past it, and the bytes past size in the edge page
 * are zeroed on the device, so that a later extension reads zeros there.  The
 * caller holds f->rw for writing and has persisted the new size already.
 */
int file_trim(struct cache *c, struct cfile *f, uint64_t size)
{
	struct list *l;
	uint64_t keep_blk = (size + c->bs - 1) / c->bs;
	uint32_t tail_page = (size % c->bs) / NVC_PAGE;
	struct cslot *edge = NULL;
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	/* blocks wholly past the end go; the edge block is trimmed */
	for (l = f->slots.next; l != &f->slots;) {
		struct cslot *s = list_entry(l, struct cslot, flink);

		l = l->next;
		if (s->blk >= keep_blk && !s->pins) {
			slot_drop_locked(c, s);
		} else if (s->blk >= keep_blk ||
			   (size % c->bs && s->blk == keep_blk - 1)) {
			edge = s->blk == keep_blk - 1 ? s : edge;
			slot_pin_locked(c, f, s);
			if (s->blk >= keep_blk) {
				/* pinned by a fill: clear it in place */
				pages_valid(c, s,
					    -(int64_t)(pb_count(
						    c, slot_valid(c, s))));
				pages_dirty(c, s,
					    -(int64_t)(pb_count(
						    c, slot_dirty(c, s))));
				if (pb_any(c, slot_dirty(c, s)))
					file_mark_clean(c, f, s);
				twin_free_locked(c, s);
				pb_zero(c, slot_valid(c, s));
				pb_zero(c, slot_dirty(c, s));
				slot_settle(c, s);
				slot_unpin_locked(c, f, s);
			}
		}
	}
	file_wgen_bump_locked(c, f);
	frw_owe_wgen(f);
	cache_unlock(c);

	if (edge) {
		uint32_t p, first_gone = tail_page + (size % NVC_PAGE ? 1 : 0);
		int was_dirty;

		srw_wrlock(&edge->rw);
		if (size % NVC_PAGE &&
		    pb_test(slot_valid(c, edge), tail_page) &&
		    !pb_test(slot_dirty(c, edge), tail_page)) {
			/* clean: forget it rather than make it differ from
			 * backing */
			pthread_mutex_lock(&c->lock);
			page_forget_locked(c, edge, tail_page);
			cache_unlock(c);
		} else if (size % NVC_PAGE &&
			   pb_test(slot_valid(c, edge), tail_page)) {
			ret = edge_zero_tail(c, edge, tail_page, size);
			if (ret) {
				/* the page cannot be trimmed: forget it */
				pthread_mutex_lock(&c->lock);
				if (pb_test(slot_dirty(c, edge), tail_page)) {
					ret = -EIO;
				} else {
					pb_clear(slot_valid(c, edge),
						 tail_page);
					pages_valid(c, edge, -1);
					ret = 0;
				}
				cache_unlock(c);
			}
		}
		pthread_mutex_lock(&c->lock);
		was_dirty = pb_any(c, slot_dirty(c, edge));
		for (p = first_gone; p < c->ppb; p++)
			page_forget_locked(c, edge, p);
		if (was_dirty && !pb_any(c, slot_dirty(c, edge)))
			file_mark_clean(c, f, edge);
		slot_settle(c, edge);
		if (edge->twin && !pb_any(c, slot_dirty(c, edge)))
			twin_free_locked(c, edge);
		cache_unlock(c);
		/* the twin first: it keeps every page its slot calls dirty */
		if (edge->twin && twin_persist(c, edge))
			ret = -EIO;
		if (edge->persisted || pb_any(c, slot_valid(c, edge)))
			slot_persist(c, edge);
		srw_unlock(&edge->rw);
		pthread_mutex_lock(&c->lock);
		slot_unpin_locked(c, f, edge);
		cache_unlock(c);
	}
	return ret;
}

int cache_truncate(struct cache *c, struct cfile *f, uint64_t size)
{
	int ret = 0, shrink;

	if (f->ro)
		return -EBADF;
	if (size > c->max_file_size)
		return -EFBIG;
	file_rw_wrlock(f);
	/*
	 * The new size is persisted first: a crash after it can only lose the
	 * cut bytes (recovery trims what is past the recorded size and cuts
	 * the backing file to it), never bring back older bytes from the
	 * backing file in place of dirty ones that were dropped.
	 */
	pthread_mutex_lock(&c->lock);
	shrink = size < f->size;
	f->size = size;
	file_wgen_bump_locked(c, f);
	clock_gettime(CLOCK_REALTIME, &f->mtime);
	f->mtime_set = 0;
	coh_ctime_now_locked(f, &f->mtime);
	cache_unlock(c);
	if (f->rec) {
		pthread_mutex_lock(&f->rec_lock);
		f->bk_busy = 1; /* with the new size, in one persist */
		ret = file_persist_record(c, f);
		pthread_mutex_unlock(&f->rec_lock);
	}
	if (!ret && shrink)
		ret = file_trim(c, f, size);
	cache_may_block(c);
	if (!ret && ftruncate(f->fd, size))
		ret = -errno;
	if (!ret) {
		BK_HOOK(c, truncate, f->ino, size);
		file_bk_changed(f); /* the next fsync makes the cut durable */
		ret = file_bk_sync(c, f);
	}
	/* the cut is durable and its look noted: no longer busy */
	if (!ret)
		ret = file_note_backing_stat(c, f);
	if (!ret)
		ret = file_bk_busy(c, f, 0);
	frw_unlock(f);
	return ret;
}

int cache_fallocate(struct cache *c, struct cfile *f, int mode, uint64_t off,
		    uint64_t len)
{
	int ret;

	if (f->ro)
		return -EBADF;
	if (mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE))
		return -EOPNOTSUPP;
	if (mode & FALLOC_FL_PUNCH_HOLE) {
		/* write zeros through the cache: correct whatever is dirty */
		char *z = calloc(1, 1024 * 1024);
		uint64_t cur = off, end = off + len;

		if (!z)
			return -ENOMEM;
		pthread_mutex_lock(&c->lock);
		if (end > f->size)
			end = f->size;
		cache_unlock(c);
		for (ret = 0; cur < end && !ret; cur += 1024 * 1024) {
			uint64_t n = end - cur < 1024 * 1024 ? end - cur
							     : 1024 * 1024;

			ret = cache_write(c, f, z, n, cur);
		}
		free(z);
		return ret;
	}
	file_rw_wrlock(f);
	cache_may_block(c);
	ret = fallocate(f->fd, mode, off, len) ? -errno : 0;
	if (!ret) {
		struct timespec now;

		clock_gettime(CLOCK_REALTIME, &now);
		pthread_mutex_lock(&c->lock);
		if (!(mode & FALLOC_FL_KEEP_SIZE) && off + len > f->size)
			f->size = off + len;
		coh_ctime_now_locked(f, &now);
		cache_unlock(c);
	}
	if (!ret) {
		file_bk_changed(f);
		ret = file_note_backing(c, f);
	}
	frw_unlock(f);
	return ret;
}
