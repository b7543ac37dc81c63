/* cache: the destager — watermarks, age, idle time, flush; large sequential
 * writes; clean only after fsync. */
#define _GNU_SOURCE
#include "destage_io.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

/*
 * Write ordering of destage, per file:
 *   1. under slot->rw (read), note the slot's gen and dirty pages, and read
 *      those pages from the cache device;
 *   2. write them to the backing file, contiguous pages as one large write
 *      (behind the reads of the next pages: destage_io.c, with its rules);
 *   3. extend the backing file to the cached size and fdatasync it;
 *   4. under slot->rw (write), clear the noted dirty pages only if gen did not
 *      move (a write since step 1 keeps the whole slot dirty), and persist the
 *      entry.
 * So a block is clean on the media only once the backing store holds it
 * durably, and destage never takes the backing file back in time: a later
 * write to the same block always leaves it dirty for the next round.
 */

#define DESTAGE_BATCH (64ull * 1024 * 1024)

/*
 * How deep a pass writes.  Under pressure (a flush or writers waiting, the
 * high watermark, unmount) a pass keeps destage.queue_depth writes in
 * flight; a pass for age or idle time only, where nobody waits for it, keeps
 * DESTAGE_QUIET_DEPTH, as destage always did, so that it takes no more of
 * the store and the CPUs from the foreground than before.  Set by the
 * destager for its next pass (0: the configured depth).
 */
#define DESTAGE_QUIET_DEPTH 2
static __thread unsigned tl_depth;

/*
 * A pass of the destager holds f->rw for reading from its first read to its
 * fdatasync.  A write that goes around the cache (wround.c) needs f->rw for
 * writing, and while it waits every other request of the file waits behind
 * it (file_rw_rdlock_req): a 64 MiB pass of scattered pages made them all
 * wait for tens of milliseconds.  So a pass of the destager that has queued
 * DESTAGE_YIELD_AFTER slots and finds a writer waiting for f->rw queues no
 * more: it writes back, syncs and cleans what it has, and the rest of the
 * file stays dirty for its next pass.  Flushes never yield (tl_yield 0):
 * they must end clean.  A drain (the watermarks, and nothing stronger:
 * destage_pick) yields before its first slot already: nobody waits for it,
 * and a writer that moves the end of a file being drained while writes go
 * around would otherwise wait for 64 slots and an fdatasync, again and
 * again.  A pass that copied nothing syncs nothing.
 */
#define DESTAGE_YIELD_AFTER 64
static __thread int tl_yield; /* 0: never; else yield from slot tl_yield - 1 */

static int cmp_blk(const void *a, const void *b)
{
	const struct cslot *x = *(struct cslot *const *)a;
	const struct cslot *y = *(struct cslot *const *)b;

	return x->blk < y->blk ? -1 : x->blk > y->blk;
}

/*
 * The reads of one buffer (up to DESTAGE_BUF of the file, several slots) are
 * issued together, so that the devices work on them in parallel; each slot
 * stays read-locked until its reads are done, and is unlocked before the
 * backing writes.  Slots are locked in ascending block order, like writers.
 * A buffer holds one run of contiguous pages or, for scattered dirty pages,
 * many short ones packed one after the other: each goes to the store as a
 * write of its own, and the pipeline keeps destage.queue_depth of them in
 * flight (destage_io.c), so that a cache full of scattered pages destages
 * at the store's deep-queue random-write rate, not at its QD1 one.
 */
#define BATCH_IOS (DESTAGE_BUF / NVC_PAGE)

struct batch {
	struct dev_io io[BATCH_IOS];
	uint64_t foff[BATCH_IOS]; /* file offset of each read */
	struct dpipe_run runs[BATCH_IOS]; /* in ascending file order */
	unsigned nrun;
	uint32_t fill; /* bytes of the buffer taken by the runs */
	uint64_t owner[BATCH_IOS]; /* index into v[] of the slot read */
	/* slots read-locked for this batch: one per read, and the slot being
	 * queued, which stays held across a flush of the batch */
	uint64_t held[BATCH_IOS + 1];
	unsigned nio, nheld;
};

/*
 * Read what the batch queued, fall back to the twin for a failed read, then
 * write the run to the backing file.  A slot whose pages could be read from
 * no copy is marked skip (it stays dirty) and the run is written around it.
 * Every held slot but keep (the one being queued, or -1) is unlocked.
 */
static int batch_flush(struct cache *c, struct dpipe *pipe, struct batch *b,
		       struct cslot **v, char *skip, int *partial, int64_t keep)
{
	unsigned k, held = 0;
	int bad = 0, ret = 0;

	if (b->nio && dev_io_run(b->io, b->nio)) {
		for (k = 0; k < b->nio; k++) {
			struct dev_io *io = &b->io[k];
			struct cslot *s = v[b->owner[k]];
			uint64_t p0 = (io->off - slot_off(c, slot_idx(c, s))) /
				      NVC_PAGE;

			if (!io->res)
				continue;
			note_dev_error(c, io, 1);
			if (!twin_read(c, s, io->buf, p0,
				       p0 + io->len / NVC_PAGE)) {
				io->res = 0;
				continue;
			}
			/* these dirty pages exist only on a failed device */
			skip[b->owner[k]] = 1;
			*partial = -EIO;
			bad = 1;
		}
	}
	for (k = 0; k < b->nheld; k++) {
		if ((int64_t)b->held[k] == keep)
			b->held[held++] = b->held[k];
		else
			srw_unlock(&v[b->held[k]]->rw);
	}
	b->nheld = held;
	if (!bad) {
		/* 1. of destage_io.c: every read is done, every slot unlocked */
		ret = dpipe_put_runs(pipe, b->runs, b->nrun, keep >= 0);
	} else {
		/* write each stretch of good reads on its own */
		for (k = 0; k < b->nio && !ret; k++)
			if (!b->io[k].res)
				ret = dpipe_write_now(pipe, b->io[k].buf,
						      b->foff[k], b->io[k].len);
	}
	b->nrun = 0;
	b->fill = 0;
	b->nio = 0;
	return ret;
}

/*
 * f's backing file cannot be found (ident.c): deleted, renamed or replaced
 * behind the cache's back.  Its dirty data goes to lost+found; f is never
 * found again.  On failure it stays dirty and destage retries.
 */
static int destage_lost(struct cache *c, struct cfile *f, uint64_t useq)
{
	int ret = 0;

	/* an unlink through the mount may be what made it vanish: it drops
	 * the data itself; try again later */
	if (__atomic_load_n(&c->unlinking, __ATOMIC_ACQUIRE) ||
	    __atomic_load_n(&c->unlinked_seq, __ATOMIC_ACQUIRE) != useq)
		return -EAGAIN;
	frw_wrlock(f);
	if (f->fd < 0 && !f->unlinked)
		ret = salvage_lost(c, f);
	if (!ret) {
		pthread_mutex_lock(&c->lock);
		f->unlinked = 1;
		f->lost = 0;
		pthread_cond_broadcast(&c->flush_cond);
		cache_unlock(c);
	} else {
		CNT_ADD(c, destage_errors, 1);
	}
	frw_unlock(f);
	return ret;
}

/*
 * One pass of destage over a file, in the order that keeps its promise:
 * the dirty slots pinned under f->rw (pass_collect), their dirty pages read
 * and written to the backing file (pass_copy), the backing file given the
 * cached size and mtime and made durable (pass_sync), and only then the
 * pages the pass copied marked clean, slot by slot, where no write changed
 * the slot since its pages were read (pass_clean: s->gen).  A failure
 * before pass_sync returned leaves everything dirty.
 */
struct dpass {
	struct cslot **v; /* the pass's slots, pinned, in block order */
	uint64_t *gens; /* s->gen when its pages were read */
	uint64_t *eps; /* the flush epoch then */
	uint64_t (*snap)[META_MAX_WORDS]; /* its dirty pages then */
	char *skip; /* not copied (unread, or only on a failed device) */
	uint64_t n, cleaned;
	int partial; /* -EIO: some pages exist only on a failed device */
	struct dpipe pipe;
	struct batch *b;
};

/* The file's backing descriptor, and no change made elsewhere (f->rw not
 * held); *lost: it cannot be found, and the result is destage_lost's. */
static int pass_open(struct cache *c, struct cfile *f, int *lost)
{
	int ret;

	if (f->fd < 0) {
		uint64_t useq =
			__atomic_load_n(&c->unlinked_seq, __ATOMIC_ACQUIRE);

		ret = file_reopen_ident(c, f);
		if (ret == -ESTALE) {
			*lost = 1;
			return destage_lost(c, f, useq);
		}
		if (ret) {
			CNT_ADD(c, destage_errors, 1);
			log_msg(LOG_ERR,
				"destage of inode %llu: cannot open its backing "
				"file: %s; the data stays dirty and destage "
				"retries",
				(unsigned long long)f->ino, strerror(-ret));
			return ret;
		}
	}
	if (__atomic_load_n(&f->bk_missing, __ATOMIC_ACQUIRE))
		file_late_check(c, f);
	if (f->fd < 0 || f->ro)
		return -EBADF;
	return coh_destage_check(c, f); /* changed elsewhere: a conflict */
}

/* Pin f's dirty slots, up to max_bytes of them (f->rw held: the pin rule). */
static int pass_collect(struct cache *c, struct cfile *f, struct dpass *p,
			uint64_t max_bytes)
{
	uint64_t n = 0, bytes = 0;
	struct list *l;

	assert(frw_held(f, 0));
	pthread_mutex_lock(&c->lock);
	for (l = f->slots.next; l != &f->slots; l = l->next)
		n += list_entry(l, struct cslot, flink)->state == SLOT_DIRTY;
	p->v = calloc(n ? n : 1, sizeof(*p->v));
	p->gens = calloc(n ? n : 1, sizeof(*p->gens));
	p->eps = calloc(n ? n : 1, sizeof(*p->eps));
	p->snap = calloc(n ? n : 1, sizeof(*p->snap));
	p->skip = calloc(n ? n : 1, 1);
	if (!p->v || !p->gens || !p->eps || !p->snap || !p->skip) {
		cache_unlock(c);
		return -ENOMEM;
	}
	for (l = f->slots.next; l != &f->slots && bytes < max_bytes;
	     l = l->next) {
		struct cslot *s = list_entry(l, struct cslot, flink);

		if (s->state != SLOT_DIRTY)
			continue;
		slot_pin_locked(c, f, s);
		p->v[p->n++] = s;
		bytes += c->bs;
	}
	cache_unlock(c);
	qsort(p->v, p->n, sizeof(*p->v), cmp_blk);
	return 0;
}

/* Slot i's dirty pages (snapshot taken, s->rw held for reading) queued as
 * device reads into the batch, in runs of the file; a full batch flushed. */
static int pass_queue_slot(struct cache *c, struct dpass *p, uint64_t i)
{
	struct cslot *s = p->v[i];
	struct batch *b = p->b;
	uint32_t pg = 0, run0;
	int ret = 0;

	while (pg < c->ppb && !ret) {
		uint64_t at;
		uint32_t len;

		if (!bm_test(p->snap[i], pg)) {
			pg++;
			continue;
		}
		for (run0 = pg; pg < c->ppb && bm_test(p->snap[i], pg); pg++)
			;
		at = s->blk * c->bs + run0 * NVC_PAGE;
		len = (pg - run0) * NVC_PAGE;
		while (len && !ret) {
			struct dpipe_run *r =
				b->nrun ? &b->runs[b->nrun - 1] : NULL;
			struct dev_io *io;
			uint32_t part;

			if (b->fill == DESTAGE_BUF)
				ret = batch_flush(c, &p->pipe, b, p->v, p->skip,
						  &p->partial, i);
			if (ret)
				break;
			if (!b->nrun || r->off + r->len != at) {
				/* a new run, packed after the last */
				r = &b->runs[b->nrun++];
				*r = (struct dpipe_run){ at, 0, b->fill };
			}
			part = DESTAGE_BUF - b->fill;
			if (part > len)
				part = len;
			io = &b->io[b->nio];
			assert(b->nio < BATCH_IOS);
			b->foff[b->nio] = at;
			b->owner[b->nio++] = i;
			io->dev = slot_dev(c, slot_idx(c, s));
			io->op = DEV_READ;
			io->buf = p->pipe.cur + b->fill;
			io->len = part;
			io->off = slot_off(c, slot_idx(c, s)) + (at - s->blk * c->bs);
			io->fua = 0;
			r->len += part;
			b->fill += part;
			at += part;
			len -= part;
		}
	}
	return ret;
}

/* Every pinned slot's dirty pages, as they are now, read from the devices
 * and written to the backing file; every write done when it returns (3. of
 * destage_io.c).  A writer waiting for f->rw makes it stop early (the rest
 * stays dirty). */
static int pass_copy(struct cache *c, struct cfile *f, struct dpass *p)
{
	struct batch *b = p->b;
	uint64_t i;
	int ret = 0, err;

	for (i = 0; i < p->n && !ret; i++) {
		struct cslot *s = p->v[i];

		if (tl_yield && i >= (uint64_t)tl_yield - 1 &&
		    __atomic_load_n(&f->rw_writers, __ATOMIC_RELAXED)) {
			uint64_t j;

			for (j = i; j < p->n; j++)
				p->skip[j] = 1; /* not read: they stay dirty */
			break;
		}
		srw_rdlock(&s->rw);
		assert(b->nheld < BATCH_IOS + 1);
		b->held[b->nheld++] = i;
		pthread_mutex_lock(&c->lock);
		p->gens[i] = s->gen;
		p->eps[i] = c->epoch;
		pb_get(c, slot_dirty(c, s), p->snap[i]);
		cache_unlock(c);
		ret = pass_queue_slot(c, p, i);
		/* a slot with no read pending needs no lock any more */
		if (b->nheld && b->held[b->nheld - 1] == i &&
		    (!b->nio || b->owner[b->nio - 1] != i)) {
			srw_unlock(&s->rw);
			b->nheld--;
		}
	}
	if (!ret)
		ret = batch_flush(c, &p->pipe, b, p->v, p->skip, &p->partial,
				  -1);
	while (b->nheld) /* after an error */
		srw_unlock(&p->v[b->held[--b->nheld]]->rw);
	err = dpipe_finish(&p->pipe);
	return ret ? ret : err;
}

/* The backing file gets the cached size and mtime, then goes durable: no
 * page is marked clean before this returned 0. */
static int pass_sync(struct cache *c, struct cfile *f)
{
	struct stat st;
	uint64_t size, bk_gen;

	pthread_mutex_lock(&c->lock);
	size = f->size;
	cache_unlock(c);
	cache_may_block(c);
	if (fstat(f->fd, &st))
		return -errno;
	if ((uint64_t)st.st_size < size) {
		cache_may_block(c);
		if (ftruncate(f->fd, size))
			return -errno;
		BK_HOOK(c, truncate, f->ino, size);
	}
	if (f->mtime_set) {
		struct timespec ts[2] = { { 0, UTIME_OMIT }, f->mtime };

		futimens(f->fd, ts);
	}
	bk_gen = __atomic_load_n(&f->bk_wgen, __ATOMIC_ACQUIRE);
	if (backing_sync(c, f, 1))
		return -errno;
	BK_HOOK(c, sync, f->ino);
	file_bk_synced(f, bk_gen);
	return 0;
}

/* After pass_sync: slot i's pages that the pass copied are clean, unless a
 * write changed the slot since they were read (s->gen). */
static void pass_clean_slot(struct cache *c, struct cfile *f,
			    struct dpass *p, uint64_t i)
{
	struct cslot *s = p->v[i];
	uint64_t dw[META_MAX_WORDS];
	int w, changed = 0;

	srw_wrlock(&s->rw);
	pthread_mutex_lock(&c->lock);
	/* all it held when its pages were read is durable now */
	if (s->dirty_epoch < p->eps[i])
		s->dirty_epoch = p->eps[i];
	if (s->gen == p->gens[i] && s->state == SLOT_DIRTY) {
		pb_get(c, slot_dirty(c, s), dw);
		for (w = 0; w < META_MAX_WORDS; w++) {
			pages_dirty(c, s,
				    -(int64_t)__builtin_popcountll(
					    dw[w] & p->snap[i][w]));
			dw[w] &= ~p->snap[i][w];
		}
		pb_put(c, slot_dirty(c, s), dw);
		if (!pb_any(c, slot_dirty(c, s))) {
			file_mark_clean(c, f, s);
			p->cleaned++;
		}
		slot_settle(c, s);
		changed = 1;
	}
	cache_unlock(c);
	if (changed && slot_persist(c, s))
		log_msg(LOG_ERR, "cannot persist a cleaned slot");
	if (changed && c->test_cleaned)
		c->test_cleaned(c, s);
	/*
	 * Clean now: the second copy is not needed any more, unless someone
	 * else pins the slot: a writer that found the twin (write_cached)
	 * waits for the slot's lock and will dirty it again, counting on the
	 * twin.  The pins are counted under c->lock, where writers take
	 * theirs: counted before it, a writer could pin the slot in between
	 * and find its twin gone ("Two copies" in core/core.h).  The last
	 * unpin frees a twin left on a clean slot.  (A twin appears only
	 * under c->lock and only on a slot that has none: one that reads none
	 * here has nothing to free.)
	 */
	if (changed && s->twin) {
		pthread_mutex_lock(&c->lock);
		if (s->twin && !pb_any(c, slot_dirty(c, s)) && s->pins == 1)
			twin_free_locked(c, s);
		cache_unlock(c);
	}
	srw_unlock(&s->rw);
}

/* The rate writers are paced to past the watermark (wround.c): this
 * pass's, times the passes running. */
static void pass_pace(struct cache *c, const struct dpass *p, uint64_t t0ns)
{
	uint64_t dt, rate;

	if (!p->cleaned)
		return;
	dt = now_ns() - t0ns + 1;
	pthread_mutex_lock(&c->lock);
	rate = p->cleaned * 1000000000ull / dt * (c->active ? c->active : 1);
	c->pace_rate = c->pace_rate ? (3 * c->pace_rate + rate) / 4 : rate;
	cache_unlock(c);
}

/* Durable and noted: the record says so, with the new look; a write around
 * the cache under way (wround.c) keeps it busy until a later pass. */
static void pass_record(struct cache *c, struct cfile *f)
{
	int others;

	if (!f->rec)
		return;
	pthread_mutex_lock(&c->lock);
	others = f->coh.inflight != 0;
	cache_unlock(c);
	pthread_mutex_lock(&f->rec_lock);
	f->bk_busy = others;
	file_persist_record(c, f);
	pthread_mutex_unlock(&f->rec_lock);
}

static void pass_free(struct dpass *p)
{
	free(p->b);
	free(p->v);
	free(p->gens);
	free(p->eps);
	free(p->snap);
	free(p->skip);
}

int destage_claimed_locked(struct cache *c, struct cfile *f,
			   uint64_t max_bytes)
{
	int ret;

	assert_held(&c->lock);
	assert(!f->destaging);
	f->destaging = 1;
	c->active++;
	cache_unlock(c);
	ret = destage_file(c, f, max_bytes);
	pthread_mutex_lock(&c->lock);
	c->active--;
	f->destaging = 0;
	pthread_cond_broadcast(&c->flush_cond);
	return ret;
}

int destage_file(struct cache *c, struct cfile *f, uint64_t max_bytes)
{
	struct dpass p = { 0 };
	uint64_t t0 = stat_clock(&c->stats), t0ns = now_ns(), i;
	int lost = 0, changing = 0, ret;

	ret = pass_open(c, f, &lost);
	if (ret || lost)
		return ret;
	frw_rdlock(f);
	ret = pass_collect(c, f, &p, max_bytes);
	if (ret)
		goto out_free;
	ret = p.n ? file_bk_busy(c, f, 1) : 0;
	if (ret)
		goto out_unpin;
	coh_bk_begin(c, f); /* ended once the new look is noted */
	changing = 1;
	p.b = calloc(1, sizeof(*p.b));
	ret = p.b ? dpipe_init(&p.pipe, c, f) : -ENOMEM;
	if (ret)
		goto out_unpin;
	if (tl_depth && tl_depth < p.pipe.depth)
		p.pipe.depth = tl_depth;
	ret = pass_copy(c, f, &p); /* finishes the pipeline */
	for (i = 0; i < p.n && p.skip[i]; i++)
		;
	if (!ret && (!p.n || i < p.n)) /* not if it yielded at once */
		ret = pass_sync(c, f);
	if (ret)
		goto out_error;
	changing = 0;
	coh_bk_end(c, f); /* the new look is this node's own */
	for (i = 0; i < p.n; i++)
		if (!p.skip[i])
			pass_clean_slot(c, f, &p, i);
	pass_pace(c, &p, t0ns);
	pass_record(c, f);
	goto out_unpin;

out_error:
	CNT_ADD(c, destage_errors, 1);
	log_msg(LOG_ERR,
		"destage of inode %llu failed: %s; the data stays dirty and "
		"destage retries",
		(unsigned long long)f->ino, strerror(-ret));
out_unpin:
	if (changing)
		coh_bk_end(c, f);
	pthread_mutex_lock(&c->lock);
	for (i = 0; i < p.n; i++)
		slot_unpin_locked(c, f, p.v[i]);
	pthread_cond_broadcast(&c->space_cond);
	pthread_cond_broadcast(&c->flush_cond);
	cache_unlock(c);
out_free:
	pass_free(&p);
	frw_unlock(f);
	stat_lat_since(&c->stats, STAT_L_destage, t0);
	return ret ? ret : p.partial;
}

/*
 * Draining by the watermarks (c->lock held): from destage.high_watermark, or
 * from writes going around the cache (wround.c: c->wa_on, set by writers at
 * max(destage.write_around, high_watermark)), down to
 * destage.low_watermark, where both end together.  So writes go around only
 * while destage drains: were the destager to stop above the low watermark
 * with writes still going around, neither would ever end, and the cache
 * would take no write but into its dirty blocks.  Both are compared exactly
 * (dirty_at_least/dirty_at_most): the writers' clear and this one agree.
 */
static void pressure_update_locked(struct cache *c)
{
	struct cache_config *cfg = c->cfg;

	assert_held(&c->lock);
	if (!c->draining && (c->wa_on || dirty_at_least(c, cfg->high_wm))) {
		c->draining = 1;
		log_msg(LOG_DEBUG, "destage: draining from %llu of %llu blocks "
			"dirty%s", (unsigned long long)dirty_occupancy(c),
			(unsigned long long)usable_slots(c),
			c->wa_on ? " (writes go around)" : "");
	}
	if (dirty_at_most(c, cfg->low_wm)) {
		c->draining = 0;
		c->wa_on = 0;
	}
	assert(!c->wa_on || c->draining);
}

/*
 * A drain leaves alone a file being written around the cache.  Writes go
 * around while the cache is past destage.write_around: a writer whose
 * stream the cache cannot take gets the store itself.  A pass over that
 * same file then only competes with it: for the file's lock (a write that
 * moves the file's end waits for the pass, and for its fdatasync, every
 * DESTAGE_YIELD_AFTER blocks) and for the store.  Measured on two 64 MiB
 * devices over a local ext4 store, 8 s of 4 KiB random writes at QD32 over
 * 256 MiB ran at 74-81 MB/s with such passes and at 155-179 without, and a
 * 307 MiB checkpoint of 1 MiB writes right after 2 s of them at 760-780
 * MB/s with and 2,000-2,150 without.  So a drain, and nothing stronger (a
 * flush, writers waiting for space, the unmount, a file's age), skips a
 * file with a write around it in the last AROUND_QUIET_MS; the file is
 * drained once its stream pauses, and writes keep going around until then
 * (the hysteresis above).  Its dirty blocks still take the writes that
 * land on them.
 */
#define AROUND_QUIET_MS 100

static uint64_t around_quiet_ms(const struct cache *c)
{
	return c->test_around_quiet_ms ? c->test_around_quiet_ms
				       : AROUND_QUIET_MS;
}

static int around_recently(const struct cache *c, const struct cfile *f,
			   uint64_t now)
{
	uint64_t t = __atomic_load_n(&f->around_ms, __ATOMIC_RELAXED);

	return t && now - t < around_quiet_ms(c);
}

/*
 * Which file to destage now, if any (c->lock held).  *wait_ms says how long
 * to sleep otherwise.  Reasons, strongest first: a flush is waiting; writers
 * wait for space; dirty slots are above the high watermark (then destage goes
 * on down to the low one); a file's oldest dirty data passed its age (its
 * policy's destage_after, else max_dirty_age: file_age_ms); the mount has
 * been idle for idle_after.
 *
 * The dirty files are listed oldest first (dirty_since), but their ages
 * differ, so the one due first need not be the first.  No age is below
 * bound (the shortest one a file has had, or max_dirty_age), so no file
 * after one whose dirty_since + bound is past the earliest due time found
 * (or past the longest sleep) can be due sooner: the walk stops there.
 * Without policies it stops at the first file, as before.
 */
static struct cfile *destage_pick(struct cache *c, uint64_t *wait_ms,
				  int *pressed, int *drain)
{
	struct cache_config *cfg = c->cfg;
	uint64_t now = now_ms(), bound = cfg->max_dirty_age_ms;
	uint64_t idle = cfg->idle_ms, last = c->last_io, due, best = UINT64_MAX;
	int urgent, strong, skipped = 0;
	struct list *l;

	*wait_ms = 1000;
	if (list_empty(&c->dirty_files))
		return NULL;
	pressure_update_locked(c);
	strong = c->flush_waiters || c->waiting_writers || c->stopping;
	urgent = strong || c->draining;
	*pressed = urgent;
	*drain = !strong && c->draining;
	if (!urgent && idle && now - last >= idle)
		urgent = 1;
	if (c->pol_min_age && (!bound || c->pol_min_age < bound))
		bound = c->pol_min_age;
	for (l = c->dirty_files.next; l != &c->dirty_files; l = l->next) {
		struct cfile *f = list_entry(l, struct cfile, dlink);
		uint64_t age;

		if (f->destaging || (f->fd < 0 && !f->hbytes && !f->path))
			continue;
		if (urgent && !strong && c->draining &&
		    around_recently(c, f, now)) {
			age = file_age_ms(c, f);
			if (age && f->dirty_since + age <= now)
				return f; /* its age is stronger */
			skipped = 1; /* a drain leaves it alone: above */
			continue;
		}
		if (urgent)
			return f;
		if (!bound ||
		    f->dirty_since + bound >=
			    (best < now + *wait_ms ? best : now + *wait_ms))
			break; /* none after it is due sooner */
		age = file_age_ms(c, f);
		if (!age)
			continue; /* never by age */
		due = f->dirty_since + age;
		if (due <= now)
			return f;
		if (due < best)
			best = due;
	}
	if (skipped && *wait_ms > around_quiet_ms(c))
		*wait_ms = around_quiet_ms(c);
	if (best != UINT64_MAX && best - now < *wait_ms)
		*wait_ms = best - now;
	if (idle && now - last < idle && last + idle - now < *wait_ms)
		*wait_ms = last + idle - now;
	return NULL;
}

static void *destage_main(void *arg)
{
	struct cache *c = arg;
	uint64_t wait_ms;
	int backoff = 0, idle_fd, pressed = 0, drain = 0;

	pthread_mutex_lock(&c->lock);
	while (!c->stopping) {
		struct cfile *f = destage_pick(c, &wait_ms, &pressed, &drain);
		struct timespec ts;
		int ret;

		if (!f || backoff) {
			if (freeq_before_wait_locked(c))
				continue;
			if (backoff)
				wait_ms = 1000;
			backoff = 0;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += wait_ms / 1000;
			ts.tv_nsec += (wait_ms % 1000) * 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&c->destage_cond, &c->lock, &ts);
			continue;
		}
		f->destaging = 1;
		f->refs++;
		c->active++;
		/* go to the back of the line, so that other files get a turn */
		list_del(&f->dlink);
		list_add_tail(&c->dirty_files, &f->dlink);
		cache_unlock(c);
		tl_depth = pressed ? 0 : DESTAGE_QUIET_DEPTH;
		tl_yield = drain ? 1 : DESTAGE_YIELD_AFTER + 1;
		ret = destage_file(c, f, DESTAGE_BATCH);
		tl_yield = 0;
		pthread_mutex_lock(&c->lock);
		c->active--;
		f->destaging = 0;
		if (f->ndirty)
			f->dirty_since = now_ms();
		c->last_destage_err = ret;
		if (ret)
			backoff = 1;
		idle_fd = file_idle_fd_locked(c, f);
		file_detach_stream_locked(c, f);
		file_put_locked(c, f);
		if (idle_fd >= 0) {
			/* a close may flush (NFS): not under c->lock */
			cache_unlock(c);
			close(idle_fd);
			pthread_mutex_lock(&c->lock);
		}
		pthread_cond_broadcast(&c->flush_cond);
		pthread_cond_broadcast(&c->space_cond);
	}
	cache_unlock(c);
	return NULL;
}

int destage_start(struct cache *c)
{
	uint64_t i;
	int ret;

	for (i = 0; i < c->cfg->threads && i < 64; i++) {
		ret = pthread_create(&c->destagers[i], NULL, destage_main, c);
		if (ret) {
			destage_stop(c);
			return -ret;
		}
		c->ndestagers++;
	}
	return 0;
}

void destage_stop(struct cache *c)
{
	int i;

	pthread_mutex_lock(&c->lock);
	c->stopping = 1;
	pthread_cond_broadcast(&c->destage_cond);
	pthread_cond_broadcast(&c->space_cond);
	pthread_cond_broadcast(&c->flush_cond);
	cache_unlock(c);
	for (i = 0; i < c->ndestagers; i++)
		pthread_join(c->destagers[i], NULL);
	c->ndestagers = 0;
}

/*
 * A flush owes the backing store what was written before it started, not a
 * cache without dirty data, which never comes while others write.  It takes
 * an epoch; a slot that goes dirty notes the epoch it went dirty in, and a
 * destage pass raises it to the epoch in which it read the slot, since all
 * the slot held then is durable once the pass completes.  The flush is done
 * when no dirty slot has an epoch before its own.  Returns 0 when nothing is
 * owed, 1 when a working device (or a working second copy) holds an owed slot
 * (the scan stops there: owed slots are mostly in the oldest dirty files, at
 * the head of the list), -1 when only failed devices hold what is owed.
 * c->lock held.
 */
static int flush_owed_locked(struct cache *c, uint64_t epoch)
{
	struct list *l, *m;
	int owed = 0;

	assert_held(&c->lock);
	for (l = c->dirty_files.next; l != &c->dirty_files; l = l->next) {
		struct cfile *f = list_entry(l, struct cfile, dlink);

		for (m = f->slots.next; m != &f->slots; m = m->next) {
			struct cslot *s = list_entry(m, struct cslot, flink);

			if (s->state != SLOT_DIRTY || s->dirty_epoch >= epoch)
				continue;
			if (!slot_failed(c, s) ||
			    (s->twin &&
			     !slot_failed(c, &c->slots[s->twin - 1])))
				return 1;
			owed = -1;
		}
	}
	return owed;
}

int cache_flush(struct cache *c, cache_progress_fn fn, void *arg)
{
	return cache_flush_until(c, fn, arg, NULL);
}

int cache_flush_until(struct cache *c, cache_progress_fn fn, void *arg,
		      const int *stop)
{
	uint64_t stuck_since = now_ms(), least = UINT64_MAX, epoch;
	int ret = 0, owed;

	pthread_mutex_lock(&c->lock);
	epoch = ++c->epoch;
	c->flush_waiters++;
	pthread_cond_broadcast(&c->destage_cond);
	while ((owed = flush_owed_locked(c, epoch)) && !c->stopping) {
		if (stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) {
			ret = -ESHUTDOWN;
			break;
		}
		struct timespec ts;
		uint64_t dirty = c->dirty_pages * NVC_PAGE;

		if (fn) {
			cache_unlock(c);
			fn(arg, dirty, CNT_GET(c, destaged_bytes));
			pthread_mutex_lock(&c->lock);
		}
		/* what only a failed device holds can never be destaged */
		if (owed < 0) {
			log_msg(LOG_ERR,
				"flush: dirty blocks written before it are on "
				"a failed cache device and cannot be destaged");
			ret = -EIO;
			break;
		}
		/* give up when destage keeps failing and dirty data does not
		 * shrink (bytes written before a failure are no progress) */
		if (dirty < least) {
			least = dirty;
			stuck_since = now_ms();
		} else if (c->last_destage_err &&
			   now_ms() - stuck_since > 10000) {
			ret = c->last_destage_err;
			break;
		}
		if (freeq_before_wait_locked(c))
			continue;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 200 * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&c->flush_cond, &c->lock, &ts);
	}
	if (!ret && flush_owed_locked(c, epoch))
		ret = -EIO;
	c->flush_waiters--;
	cache_unlock(c);
	if (fn && !ret)
		fn(arg, 0, CNT_GET(c, destaged_bytes));
	return ret;
}

/* f has dirty data written before epoch (c->lock held). */
static int file_owed_locked(struct cache *c, struct cfile *f, uint64_t epoch)
{
	struct list *l;

	assert_held(&c->lock);
	for (l = f->slots.next; l != &f->slots; l = l->next) {
		struct cslot *s = list_entry(l, struct cslot, flink);

		if (s->state == SLOT_DIRTY && s->dirty_epoch < epoch)
			return 1;
	}
	return 0;
}

/*
 * What was written before the call goes to the store, durably; data written
 * meanwhile by others need not (it would never end under a steady writer).
 * The file is destaged by one thread at a time: this one waits for the
 * destager's pass on it to end, and the destager skips it meanwhile.
 */
int cache_file_flush(struct cache *c, struct cfile *f)
{
	uint64_t epoch;
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	epoch = ++c->epoch;
	while (!ret && file_owed_locked(c, f, epoch)) {
		if (c->stopping) {
			ret = -EIO;
			break;
		}
		if (f->destaging) {
			if (!freeq_before_wait_locked(c))
				pthread_cond_wait(&c->flush_cond, &c->lock);
			continue;
		}
		ret = destage_claimed_locked(c, f, UINT64_MAX);
	}
	cache_unlock(c);
	if (!ret)
		ret = file_bk_sync(c, f);
	return ret;
}
