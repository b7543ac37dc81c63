/* cache: per-file control — warm, pin, evict, flush and status of one file
 * (nvcachectl's per-file commands, through fs/ctlfile.c). */
#define _GNU_SOURCE
#include "mngt.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

/*
 * Pins.  A pinned file (f->pinned, MF_PINNED in its record) keeps its clean
 * slots on the pinned list (SL_PIN) instead of the LRU: eviction walks the
 * LRU only, so pinned data is never evicted and eviction stays what it was
 * (no scan past pinned slots).  Dirty slots of a pinned file are on no list,
 * like every dirty slot, and come back to SL_PIN when the destager cleans
 * them (slot_settle asks slot_lru).  A file is on c->pinned_files
 * exactly while f->pinned is set (c->lock), and its record says MF_PINNED
 * once the pin is persisted: pin and unpin persist the record before they
 * answer, so a pin survives remount and kill -9 (recovery puts the file on
 * the list before its slots settle).  The object and its record live while
 * pinned, even with no slot (file_put_locked).  A pinned file that loses its
 * last link gives its pin and its space back at its last release
 * (file_put_locked: file_unpin_locked, then its slots and record go).
 *
 * The cap.  Pins are refused when the pinned files' blocks (the larger of
 * their size and the slots they hold) would pass cache.max_pinned percent
 * of the cache's slots (at most 90: the rest is for dirty data and for
 * everything else).  Writes may grow a pinned file past the cap after its
 * pin; its blocks stay pinned, but should the pinned list grow past the
 * cap, eviction takes from it, least recently used first, when nothing on
 * the LRU can go (evict_one_locked): a writer never waits for space that
 * pinned data holds for ever (PRODUCT §4.5), and while pinned data stays
 * within the cap it is never evicted.
 *
 * Warm reads through the engine (io_read_keep): every miss is kept, the
 * sequential cutoff and the backing readahead play no part, and the read
 * is counted in the statistics like any other (so a warm shows as misses).
 * Of a pinned file, the warm also persists the map entries of what it kept
 * (pin_persist_slots): pinned data survives remount and kill -9, where
 * clean data kept after a miss is otherwise forgotten.
 * Evict drops the clean slots of one file at once, as eviction does (pins
 * == 0, c->lock held, the free entry persisted before the slot is reused:
 * slot_drop_locked); dirty slots stay.
 */

#define WARM_CHUNK (1024 * 1024u)
#define FLUSH_CHUNK (16ull * 1024 * 1024)

static uint64_t blocks_of(struct cache *c, uint64_t size)
{
	return (size + c->bs - 1) / c->bs;
}

/* What f counts against the cap: its size or its slots, the larger. */
static uint64_t pin_footprint_locked(struct cache *c, const struct cfile *f)
{
	uint64_t b = blocks_of(c, f->size);

	assert_held(&c->lock);
	return b > f->nslots ? b : f->nslots;
}

static void room_locked(struct cache *c, struct cache_room *r)
{
	struct list *l;
	int lru;

	assert_held(&c->lock);
	memset(r, 0, sizeof(*r));
	r->capacity = c->nslots * c->bs;
	r->dirty = dirty_occupancy(c) * c->bs;
	r->available = c->nfree;
	for (lru = SL_LRU_FIRST; lru <= SL_LRU_LAST; lru++)
		r->available += c->lcount[lru];
	r->available *= c->bs;
	r->max_pinned = pin_cap_slots(c) * c->bs;
	for (l = c->pinned_files.next; l != &c->pinned_files; l = l->next) {
		struct cfile *f = list_entry(l, struct cfile, plink);

		r->pinned += pin_footprint_locked(c, f) * c->bs;
		r->npinned++;
	}
}

void cache_room(struct cache *c, struct cache_room *r)
{
	pthread_mutex_lock(&c->lock);
	room_locked(c, r);
	cache_unlock(c);
}

int cache_file_lookup(struct cache *c, int fd, struct cfile **out)
{
	struct stat st;
	struct cfile *f;

	cache_may_block(c);
	if (fstat(fd, &st))
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	f = file_find(c, st.st_dev, st.st_ino, 1);
	if (f)
		f->refs++;
	cache_unlock(c);
	*out = f;
	return f ? 0 : -ENOENT;
}

/* Bytes of s's valid (or dirty) pages that lie within size. */
static uint64_t slot_bytes(struct cache *c, struct cslot *s,
			   const uint8_t *bits, uint64_t size)
{
	uint64_t b0 = s->blk * c->bs, n = 0;
	uint32_t p;

	if (b0 + c->bs <= size)
		return (uint64_t)pb_count(c, bits) * NVC_PAGE;
	for (p = 0; p < c->ppb && b0 + p * NVC_PAGE < size; p++)
		if (pb_test(bits, p))
			n += size - (b0 + p * NVC_PAGE) < NVC_PAGE
				     ? size - (b0 + p * NVC_PAGE)
				     : NVC_PAGE;
	return n;
}

void cache_file_info(struct cache *c, struct cfile *f,
		     struct cache_file_info *i)
{
	uint64_t oldest = 0;
	struct list *l;

	memset(i, 0, sizeof(*i));
	pthread_mutex_lock(&c->lock);
	i->size = f->size;
	i->pinned = f->pinned;
	i->blocks = f->nslots;
	for (l = f->slots.next; l != &f->slots; l = l->next) {
		struct cslot *s = list_entry(l, struct cslot, flink);

		i->cached += slot_bytes(c, s, slot_valid(c, s), f->size);
		if (s->state != SLOT_DIRTY)
			continue;
		i->dirty += slot_bytes(c, s, slot_dirty(c, s), f->size);
		if (!oldest || s->dirty_since < oldest)
			oldest = s->dirty_since;
	}
	if (oldest)
		i->dirty_age_ms = now_ms() - oldest + 1;
	/* an object made by an open starts owing the fsync of its
	 * existence (bk_wgen 1): only one this daemon created does */
	i->up_to_date = !f->ndirty && !f->destaging &&
			(f->bk_synced >= f->bk_wgen ||
			 (f->bk_wgen == 1 && !f->created));
	cache_unlock(c);
}

uint64_t cache_file_warm_need(struct cache *c, struct cfile *f, uint64_t size)
{
	uint64_t need = blocks_of(c, size), held = 0;
	struct list *l;

	if (!f)
		return need * c->bs;
	pthread_mutex_lock(&c->lock);
	/* slots it holds off the LRU lists need no room; those on them are
	 * room */
	for (l = f->slots.next; l != &f->slots; l = l->next) {
		int on = list_entry(l, struct cslot, flink)->on;

		held += on < SL_LRU_FIRST + 1 || on > SL_LRU_LAST + 1;
	}
	cache_unlock(c);
	return (need > held ? need - held : 0) * c->bs;
}

/*
 * The warm reads outside an open: a change made elsewhere that it found
 * drops the clean data as an open would, and the kernel's page cache goes
 * at the next open through the mount (kinval), which the warm cannot tell.
 */
static int warm_revalidate(struct cache *c, struct cfile *f)
{
	int changed, ret = cache_file_revalidate(c, f, NULL, &changed);

	if (!ret && changed != COH_UNCHANGED) {
		pthread_mutex_lock(&c->lock);
		f->coh.kinval = 1;
		cache_unlock(c);
	}
	return ret;
}

/*
 * Data kept after a read miss is not persisted (engine.h, power loss): a
 * crash or a remount forgets it.  A pinned file's is: each slot's entry is
 * persisted under its rw held for writing, which first makes the pages it
 * claims durable on the device (slot_persist), so its data survives a
 * remount and kill -9 as the pin does.  The slots are pinned under f->rw
 * held for reading (the pin rule, map.c): a revalidation that finds the
 * backing file changed elsewhere waits for the persist to end, then drops
 * them all (issue 25, finding 4: pinned without it, they were skipped and
 * their old bytes served for good).
 */
static int pin_persist_slots(struct cache *c, struct cfile *f)
{
	struct cslot **v;
	struct list *l;
	uint64_t n = 0, i;
	int ret = 0, err;

	frw_rdlock(f);
	pthread_mutex_lock(&c->lock);
	v = calloc(f->nslots ? f->nslots : 1, sizeof(*v));
	if (!v) {
		ret = -ENOMEM;
		goto unlock;
	}
	for (l = f->slots.next; l != &f->slots; l = l->next) {
		v[n] = list_entry(l, struct cslot, flink);
		slot_pin_locked(c, f, v[n++]);
	}
	cache_unlock(c);
	if (c->test_pin_persist)
		c->test_pin_persist(c, f);
	for (i = 0; i < n; i++) {
		srw_wrlock(&v[i]->rw);
		err = v[i]->file == f->rec ? slot_persist(c, v[i]) : 0;
		srw_unlock(&v[i]->rw);
		ret = ret ? ret : err;
	}
	pthread_mutex_lock(&c->lock);
	for (i = 0; i < n; i++)
		slot_unpin_locked(c, f, v[i]);
	free(v);
unlock:
	cache_unlock(c);
	frw_unlock(f);
	return ret;
}

int cache_file_warm(struct cache *c, struct cfile *f, uint64_t limit,
		    cache_progress_fn fn, cache_stop_fn stop, void *arg,
		    uint64_t *done)
{
	uint64_t off;
	size_t n;
	char *buf;
	int ret;

	*done = 0;
	if (f->fd < 0) {
		/* an object found without an open (cache_file_lookup) */
		ret = file_reopen_ident(c, f);
		if (ret)
			return ret;
	}
	ret = warm_revalidate(c, f);
	if (ret)
		return ret;
	/* kept on purpose: never given up for a stream (admit.h), not even
	 * while this warm runs */
	__atomic_store_n(&f->adm.warmed, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&f->adm.streamed, 0, __ATOMIC_RELAXED);
	buf = aligned_alloc(NVC_PAGE, WARM_CHUNK + 2 * NVC_PAGE);
	if (!buf)
		return -ENOMEM;
	for (off = 0; off < limit; off += n) {
		size_t len =
			limit - off < WARM_CHUNK ? limit - off : WARM_CHUNK;

		if (stop && stop(arg)) {
			ret = -EINTR;
			break;
		}
		ret = io_read_keep(c, f, buf, len, off, &n);
		if (ret || !n)
			break;
		*done += n;
		if (fn)
			fn(arg, *done, 0);
	}
	free(buf);
	if (!ret && __atomic_load_n(&f->pinned, __ATOMIC_ACQUIRE))
		ret = pin_persist_slots(c, f);
	return ret;
}

int cache_file_pin(struct cache *c, struct cfile *f, int pin,
		   struct cache_room *r)
{
	int ret = 0;

	if (pin) {
		ret = file_ensure_record(c, f);
		if (ret)
			return ret == -ENOSPC ? -EMFILE : ret;
	}
	pthread_mutex_lock(&c->lock);
	room_locked(c, r);
	if (!!f->pinned == !!pin) {
		cache_unlock(c);
		return 0;
	}
	if (pin) {
		uint64_t want = pin_footprint_locked(c, f) * c->bs;

		if (r->pinned + want > r->max_pinned) {
			r->want = want;
			cache_unlock(c);
			return -ENOSPC;
		}
		f->pinned = 1;
		list_add_tail(&c->pinned_files, &f->plink);
		file_relist_locked(c, f);
	} else {
		file_unpin_locked(c, f);
	}
	cache_unlock(c);
	pthread_mutex_lock(&f->rec_lock);
	if (f->rec)
		ret = file_persist_record(c, f);
	pthread_mutex_unlock(&f->rec_lock);
	if (ret)
		log_msg(LOG_ERR, "cannot persist the %s of %s: %s",
			pin ? "pin" : "unpin", f->path ? f->path : "a file",
			strerror(-ret));
	return ret;
}

int cache_file_evict(struct cache *c, struct cfile *f, uint64_t *dropped)
{
	struct list *l, *n;

	*dropped = 0;
	pthread_mutex_lock(&c->lock);
	if (f->pinned) {
		cache_unlock(c);
		return -EBUSY;
	}
	for (l = f->slots.next; l != &f->slots; l = n) {
		struct cslot *s = list_entry(l, struct cslot, flink);

		n = l->next;
		if (s->state != SLOT_CLEAN || s->pins)
			continue;
		*dropped += slot_bytes(c, s, slot_valid(c, s), f->size);
		slot_drop_locked(c, s);
	}
	cache_unlock(c);
	return 0;
}

/* f's dirty bytes, and whether any were written before epoch (c->lock). */
static uint64_t dirty_owed_locked(struct cache *c, struct cfile *f,
				  uint64_t epoch, int *owed)
{
	uint64_t bytes = 0;
	struct list *l;

	assert_held(&c->lock);
	*owed = 0;
	for (l = f->slots.next; l != &f->slots; l = l->next) {
		struct cslot *s = list_entry(l, struct cslot, flink);

		if (s->state != SLOT_DIRTY)
			continue;
		bytes += slot_bytes(c, s, slot_dirty(c, s), f->size);
		*owed |= s->dirty_epoch < epoch;
	}
	return bytes;
}

/*
 * cache_file_flush (coherence.c) in steps of FLUSH_CHUNK, with progress
 * between them: what was written before the call reaches the store, and
 * the backing file is fsynced.  *destaged: bytes this call destaged.
 */
int cache_file_flush_progress(struct cache *c, struct cfile *f,
			      cache_progress_fn fn, cache_stop_fn stop,
			      void *arg, uint64_t *destaged)
{
	uint64_t epoch, dirty, first;
	int ret = 0, owed;

	pthread_mutex_lock(&c->lock);
	epoch = ++c->epoch;
	first = dirty = dirty_owed_locked(c, f, epoch, &owed);
	while (!ret && owed) {
		if (c->stopping) {
			ret = -EIO;
			break;
		}
		if (f->destaging) {
			if (!freeq_before_wait_locked(c))
				pthread_cond_wait(&c->flush_cond, &c->lock);
		} else {
			ret = destage_claimed_locked(c, f, FLUSH_CHUNK);
		}
		dirty = dirty_owed_locked(c, f, epoch, &owed);
		cache_unlock(c);
		*destaged = first > dirty ? first - dirty : 0;
		if (fn)
			fn(arg, dirty, *destaged);
		if (!ret && owed && stop && stop(arg))
			ret = -EINTR;
		pthread_mutex_lock(&c->lock);
	}
	cache_unlock(c);
	*destaged = first > dirty ? first - dirty : 0;
	if (!ret && f->fd < 0)
		ret = file_reopen_ident(c, f); /* for the fsync */
	if (!ret)
		ret = file_bk_sync(c, f);
	return ret;
}

/*
 * After a mount: recovery keeps no clean partial last page (file_trim
 * forgets it rather than make it differ from the backing file), so each
 * pinned file's tail is read again here and its entry persisted, and a
 * pinned file reads all hits after a remount or a crash as before it.
 */
void pin_reload_tails(struct cache *c)
{
	struct cfile **v;
	struct list *l;
	size_t n = 0, i, k;
	char *buf;

	pthread_mutex_lock(&c->lock);
	for (l = c->pinned_files.next; l != &c->pinned_files; l = l->next)
		n++;
	v = calloc(n ? n : 1, sizeof(*v));
	for (l = c->pinned_files.next, k = 0; v && l != &c->pinned_files;
	     l = l->next) {
		struct cfile *f = list_entry(l, struct cfile, plink);

		if (f->size % NVC_PAGE && !f->lost && !f->unlinked) {
			f->refs++;
			v[k++] = f;
		}
	}
	cache_unlock(c);
	buf = aligned_alloc(NVC_PAGE, 3 * NVC_PAGE);
	for (i = 0; v && i < k; i++) {
		struct cfile *f = v[i];
		uint64_t off = f->size & ~(uint64_t)(NVC_PAGE - 1);
		size_t got;

		if (buf && (f->fd >= 0 || !file_reopen_ident(c, f)) &&
		    !io_read_keep(c, f, buf, f->size - off, off, &got))
			pin_persist_slots(c, f);
		cache_file_put(c, f);
	}
	free(buf);
	free(v);
}
