/* cache: writes past the high watermark, paced into the cache or sent around it. */
#define _GNU_SOURCE
#include "data_int.h"

#include <assert.h>
#include <errno.h>
#include <time.h>

/*
 * Write-around under pressure: the rule.
 *
 * A write-back cache wins a write when the write is acknowledged at the
 * devices' speed and destage later takes it to the store at least as well as
 * the writer could have.  Past the high watermark the first half no longer
 * holds: destage is running, every block a write turns dirty is one more the
 * destager must write back before a writer can have its space, and the
 * writers' sustained rate is destage's, not the devices' (the pacing below
 * holds them to it).  A write into a block the cache already holds dirty
 * costs destage nothing more (the block is written back once, whatever was
 * written into it): the cache still wins it, and it is the only place that
 * write can go (the store does not have the block's newer bytes).  A write
 * into blocks the cache does not hold dirty costs destage a block each, and
 * the cache then wins nothing: the store must take the same bytes anyway, and
 * taking them now, from the writer, costs it one write where the cache costs
 * a device write, a map entry, a destage read and the same store write.
 *
 * So: when destage.write_around is not 0 and the dirty blocks (second copies
 * included, as the watermarks count them) reach max(destage.write_around,
 * destage.high_watermark) percent of the cache's usable blocks, writes go
 * around until destage has brought them down to destage.low_watermark (the
 * hysteresis destage itself has: c->wa_on; while it is set the destager
 * drains, and both end together, destage.c pressure_update_locked): a
 * writeback write none of whose
 * blocks holds a dirty page (or is in use: pinned by a read or write under
 * way) is written to the backing file and clean cached copies of its blocks
 * are dropped.  Any dirty page in the range sends the whole request through
 * the cache as before (paced).  A pinned file (nvcachectl pin) keeps
 * writing into the cache: its data is meant to be there.  Never below the
 * high watermark, so that destage runs whenever writes go around, and
 * writes come back into the cache once it has drained: the burst buffer
 * takes bursts, and the store takes what is past them.  The threshold is a
 * level, not a guess at speeds: past the high watermark the store is busy
 * with destage anyway, and the writer gets the store directly rather than
 * destage's share of it.  Large sequential writes (a checkpoint past the
 * cache) go around by the same rule.  Below the threshold nothing changes.
 *
 * Two paths.  A write inside the file (its end within both the cached size
 * and the store's) goes around with f->rw held for reading
 * (write_around_shared), beside the file's other reads and writes and its
 * destage; one that moves the end takes write_around, the per-file
 * writearound mode's path, with f->rw held for writing (destage extends the
 * store to the cached size under f->rw held for reading).  A destager pass
 * yields f->rw to a writer waiting for it (destage.c, DESTAGE_YIELD_AFTER).
 *
 * The promises (PRODUCT.md §4):
 *   - read-your-writes (§4.3), and no older copy destaged over the write:
 *     at its start, under c->lock, no block of the range is dirty or in
 *     use, its clean copies are dropped, and (shared path) its blocks are
 *     marked in f->around until it ends, so that no slot appears for them
 *     meanwhile: a write through the cache waits (around_cond), the
 *     asynchronous path refuses, and a fill keeps nothing (io.c); f->wgen
 *     moves at both ends, so a fill or direct readahead begun before keeps
 *     nothing either.  A write through the cache that comes after finds no
 *     slot and makes one from the store, which holds the write;
 *   - durability (§4.4): the write is acknowledged once the backing file
 *     holds it (pwrite: it survives kill -9 of the daemon, in the store's
 *     page cache); the next fsync, fdatasync or O_DSYNC/RWF_DSYNC reply of
 *     the file fsyncs the backing file (file_bk_changed, file_bk_sync).
 *     Power loss before that fsync may lose it, as it may a plain write
 *     into the cache, which sits in the device's write cache until the
 *     fsync flushes it: §4.4 promises power loss only after fsync;
 *   - conflicts (§4.7): the change is under way for the look
 *     (coh_bk_begin/done), which is noted after it; a file with dirty data
 *     has MF_BK_BUSY in its record from before the write until a destage
 *     pass ends with no change of the store under way (destage.c), so that
 *     a crash meanwhile is not taken at recovery for a change made
 *     elsewhere; a clean file's record gets the new look after the write.
 *     The price: a change made elsewhere to a file with dirty data while
 *     writes go around it, followed by a crash of this node, is not seen at
 *     recovery (it is at the next open, as always);
 *   - the store space is claimed as the caller before the write reaches
 *     the cache at all (fs/claim.c), whatever path the write takes.
 */

static uint64_t wa_threshold(const struct cache *c)
{
	uint64_t wa = __atomic_load_n(&c->cfg->write_around, __ATOMIC_RELAXED);
	uint64_t hi = __atomic_load_n(&c->cfg->high_wm, __ATOMIC_RELAXED);

	return !wa ? 0 : wa > hi ? wa : hi;
}

int write_around_now_locked(struct cache *c)
{
	uint64_t thr = wa_threshold(c);

	assert_held(&c->lock);
	if (!thr || !usable_slots(c))
		return c->wa_on = 0;
	if (dirty_at_least(c, thr)) {
		if (!c->wa_on)
			pthread_cond_signal(&c->destage_cond); /* it drains */
		c->wa_on = 1;
	} else if (dirty_at_most(c, c->cfg->low_wm)) {
		c->wa_on = 0;
	}
	return c->wa_on;
}

/* Whether a writeback write of f goes around the cache now (the rule). */
static int write_around_due(struct cache *c, struct cfile *f)
{
	int due;

	if (!wa_threshold(c))
		return 0;
	pthread_mutex_lock(&c->lock);
	due = !f->pinned && write_around_now_locked(c);
	cache_unlock(c);
	return due;
}

int write_around_busy_locked(const struct cfile *f, uint64_t blk)
{
	unsigned i;

	for (i = 0; i < f->naround; i++)
		if (blk >= f->around[i].b0 && blk <= f->around[i].b1)
			return 1;
	return 0;
}

/* The cache's mtime of a written file follows a write the store took (the
 * destage of its older dirty data sets the store's to it).  c->lock held. */
static void around_times_locked(struct cfile *f)
{
	if (!f->mtime_set)
		return; /* the store's mtime is the file's */
	clock_gettime(CLOCK_REALTIME, &f->mtime);
	coh_ctime_now_locked(f, &f->mtime);
}

/*
 * The same write with f->rw held for reading, so that writes around the
 * cache and through it, reads and destage of one file go on side by side
 * (WA_SHARED writes around at once; more wait for one to end): 0 or -errno
 * when done, 1 if a block of the range is dirty or in use (the cache takes
 * the write), 2 if this path cannot take it (write_around does).  Only inside the file as both the cache and the store see it:
 * destage extends the store to the cached size under f->rw held for
 * reading, and a write that moves the end takes f->rw for writing.  While
 * it is in flight its blocks are in f->around: no write through the cache
 * pins them (write_cached waits on around_cond, the asynchronous path
 * refuses), no fill keeps what it read of them (io.c), and f->wgen moves
 * before and after (a fill begun before either keeps nothing).  At its
 * start no slot of the range is dirty or pinned and its clean ones are
 * dropped, so none exists while it is in flight: nothing older can be
 * served after it, or destaged over it.
 */
static int write_around_shared(struct cache *c, struct cfile *f,
			       const char *src, size_t len, uint64_t off)
{
	uint64_t end = off + len, b0 = off / c->bs, b1 = (end - 1) / c->bs;
	uint64_t blk;
	int ret, busy, k;

	file_rw_rdlock_req(f);
	pthread_mutex_lock(&c->lock);
	if (file_mode(c, f) == MODE_BYPASS || end > f->size || end > f->bsize) {
		cache_unlock(c);
		frw_unlock(f);
		return 2;
	}
	/* WA_SHARED in flight: the next one ends soon (none waits for us) */
	while (f->naround == WA_SHARED)
		pthread_cond_wait(&c->around_cond, &c->lock);
	for (blk = b0; blk <= b1; blk++) {
		struct cslot *s = slot_find(c, f->rec, blk);

		if (s && (s->pins || pb_any(c, slot_dirty(c, s)))) {
			cache_unlock(c);
			frw_unlock(f);
			return 1;
		}
	}
	for (blk = b0; blk <= b1; blk++) {
		struct cslot *s = slot_find(c, f->rec, blk);

		if (s)
			slot_drop_locked(c, s);
	}
	k = f->naround++;
	f->around[k].b0 = b0;
	f->around[k].b1 = b1;
	file_wgen_bump_locked(c, f);
	busy = f->rec && f->ndirty;
	f->coh.inflight++; /* coh_bk_begin */
	cache_unlock(c);
	/* with dirty data elsewhere in the file, the record says the store
	 * is being changed (destage clears it): see the essay above */
	ret = busy ? file_bk_busy(c, f, 1) : 0;
	if (!ret)
		ret = backing_write(c, f, src, len, off);
	coh_bk_done(c, f);
	pthread_mutex_lock(&c->lock);
	for (k = 0; k < (int)f->naround; k++)
		if (f->around[k].b0 == b0 && f->around[k].b1 == b1)
			break;
	assert(k < (int)f->naround);
	f->around[k] = f->around[--f->naround];
	file_wgen_bump_locked(c, f);
	if (!ret)
		around_times_locked(f);
	pthread_cond_broadcast(&c->around_cond);
	cache_unlock(c);
	if (!ret) {
		file_bk_changed(f); /* only the backing file's fsync keeps it */
		ret = busy ? file_note_backing_stat(c, f)
			   : file_note_backing(c, f);
	}
	frw_unlock(f);
	CNT_ADD(c, bypass_ops, 1);
	return ret;
}

int write_pressed(struct cache *c, struct cfile *f, const void *src, size_t len,
		  uint64_t off, int mode)
{
	int ret;

	if (mode != MODE_WRITEBACK || f->ro || !len || off + len < off ||
	    off + len > c->max_file_size || !write_around_due(c, f))
		return write_cached(c, f, src, len, off, mode);
	ret = write_around_shared(c, f, src, len, off);
	if (ret == 2)
		ret = write_around(c, f, src, len, off);
	if (ret == 1) /* dirty data in the range: it stays the cache's */
		return write_cached(c, f, src, len, off, mode);
	if (!ret) {
		CNT_ADD(c, write_around_bytes, len);
		__atomic_store_n(&f->around_ms, now_ms(), __ATOMIC_RELAXED);
	}
	return ret;
}

/*
 * writearound: the backing file takes the write; cached copies are dropped.
 * 1, with nothing done, if a block of the range holds dirty data (an earlier
 * writeback write, or another mode's): the caller writes through the cache.
 */
int write_around(struct cache *c, struct cfile *f, const char *src, size_t len,
		 uint64_t off)
{
	uint64_t end = off + len, blk;
	int ret, busy;

	file_rw_wrlock(f);
	pthread_mutex_lock(&c->lock);
	for (blk = off / c->bs; blk * c->bs < end; blk++) {
		struct cslot *s = slot_find(c, f->rec, blk);

		if (s && pb_any(c, slot_dirty(c, s))) {
			/* dirty data: keep it coherent */
			cache_unlock(c);
			frw_unlock(f);
			return 1;
		}
	}
	/* a file with dirty data elsewhere says it is changing the store */
	busy = f->rec && f->ndirty;
	cache_unlock(c);
	ret = busy ? file_bk_busy(c, f, 1) : 0;
	if (!ret)
		ret = backing_write(c, f, src, len, off);
	pthread_mutex_lock(&c->lock);
	if (!ret) {
		frw_owe_wgen(f);
		for (blk = off / c->bs; blk * c->bs < end; blk++) {
			struct cslot *s = slot_find(c, f->rec, blk);

			/* f->rw held for writing: nobody pins f's slots
			 * (map.c); one pinned anyway keeps old bytes, and
			 * the next open drops it (stale) */
			assert(!s || !s->pins);
			if (s && s->pins)
				f->coh.stale = 1;
			else if (s)
				slot_drop_locked(c, s);
		}
		if (end > f->size)
			f->size = end;
		file_bsize_grow_locked(c, f, end);
		file_wgen_bump_locked(c, f);
		around_times_locked(f);
		file_bk_changed(f); /* only the backing file's fsync keeps it */
	}
	cache_unlock(c);
	if (!ret)
		ret = file_note_backing_stat(c, f);
	if (f->rec) {
		/* the new look, and not busy any more, in one persist */
		int err;

		pthread_mutex_lock(&f->rec_lock);
		f->bk_busy = 0;
		err = f->rec ? file_persist_record(c, f) : 0;
		pthread_mutex_unlock(&f->rec_lock);
		if (!ret)
			ret = err;
	}
	frw_unlock(f);
	CNT_ADD(c, bypass_ops, 1);
	return ret;
}

/*
 * Pacing writers past the high watermark.  Without it a writer that adds
 * dirty blocks runs at the devices' speed until no block is free, then waits
 * on space_cond for whatever a whole destage pass frees: every writer at once,
 * for as long as the pass takes (a cliff: 4K random writes at QD32 saw p99.9
 * of 250 ms against the store's 7 ms).  As Linux's balance_dirty_pages does
 * with the writeback bandwidth, a write that turned n blocks dirty (fresh or
 * clean before) is held, after its data is on the devices and before it is
 * acknowledged, for n blocks' worth of a rate that is twice what destage
 * cleans at the high watermark and falls in proportion to nothing at full:
 *
 *     pace = (dirty% - high_watermark) / (100 - high_watermark)   in [0, 1]
 *     rate = 2 * (1 - pace) * cleaned blocks per second
 *
 * so that halfway between the high watermark and full writers add dirty
 * blocks as fast as destage cleans them.  The holds are taken one after the
 * other on one clock (c->pace_next_ns), so the rate is the writers' together,
 * however many there are; a hold is at most PACE_MAX_NS, and the clock never
 * runs further ahead than that (no debt is carried into a burst).  The cleaned
 * rate is destage's own: each pass notes the blocks it cleaned over its
 * time, times the passes running, smoothed (destage.c); before the first
 * pass it is taken as PACE_MIN_RATE.  Waiting for a free block
 * at full stays the backstop (PRODUCT.md §4.5: writers wait, nothing is
 * dropped).  Pacing only delays the reply of a write whose data is on the
 * devices already, holding no lock: nothing about durability, ordering or
 * what a read returns changes.
 */
#define PACE_MAX_NS (20ull * 1000000)
#define PACE_MIN_RATE 64 /* blocks per second */

unsigned write_pace_locked(struct cache *c)
{
	uint64_t usable = usable_slots(c), hi = c->cfg->high_wm, occ;

	assert_held(&c->lock);
	if (!usable || hi >= 100)
		return 0;
	occ = dirty_occupancy(c) * 100 / usable;
	if (occ <= hi)
		return 0;
	return occ >= 100 ? 100 : (unsigned)((occ - hi) * 100 / (100 - hi));
}

/* The hold owed for n blocks turned dirty (c->lock held); 0: none. */
static uint64_t pace_hold_locked(struct cache *c, uint64_t n)
{
	uint64_t now, at, rate, cost;
	unsigned pace = write_pace_locked(c);

	assert_held(&c->lock);
	now = now_ns();
	if (!pace || !n ||
	    !__atomic_load_n(&c->cfg->pace_writers, __ATOMIC_RELAXED))
		return 0;
	rate = c->pace_rate > PACE_MIN_RATE ? c->pace_rate : PACE_MIN_RATE;
	rate = rate * 2 * (100 - pace) / 100;
	cost = rate ? n * 1000000000ull / rate : PACE_MAX_NS;
	if (cost > PACE_MAX_NS)
		cost = PACE_MAX_NS;
	at = c->pace_next_ns > now ? c->pace_next_ns : now;
	if (at > now + PACE_MAX_NS - cost)
		at = now + PACE_MAX_NS - cost;
	c->pace_next_ns = at + cost;
	return at + cost - now;
}

/* Hold a write that turned n blocks dirty, as the pacing above says. */
void write_pace(struct cache *c, uint64_t n)
{
	uint64_t hold;

	pthread_mutex_lock(&c->lock);
	hold = pace_hold_locked(c, n);
	cache_unlock(c);
	if (!hold)
		return;
	CNT_ADD(c, throttled_ops, 1);
	/* how long: recorded whatever stats.latency says */
	lat_record(&stat_my_shard(&c->stats)->lat[STAT_L_pace], hold);
	nanosleep(&(struct timespec){ hold / 1000000000ull,
				      hold % 1000000000ull },
		  NULL);
}
