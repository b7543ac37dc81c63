/* cache: the block map — slot lookup, the dirty-block lifecycle, allocation
 * and eviction. */
#define _GNU_SOURCE
#include "files_int.h"

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

/* ------------------------------------------------------------ block map */

static uint64_t slot_key(uint32_t rec, uint64_t blk)
{
	uint64_t k[2] = { rec, blk };

	return XXH3_64bits(k, sizeof(k));
}

struct cslot *slot_find(struct cache *c, uint32_t rec, uint64_t blk)
{
	uint32_t i;

	if (!rec)
		return NULL;
	for (i = c->shash[slot_key(rec, blk) & c->smask]; i;
	     i = c->slots[i - 1].hnext) {
		struct cslot *s = &c->slots[i - 1];

		if (s->file == rec && s->blk == blk)
			return s;
	}
	return NULL;
}

void slot_hash_add(struct cache *c, struct cslot *s)
{
	uint32_t *b = &c->shash[slot_key(s->file, s->blk) & c->smask];

	s->hnext = *b;
	*b = slot_idx(c, s) + 1;
}

void slot_hash_del(struct cache *c, struct cslot *s)
{
	uint32_t *p = &c->shash[slot_key(s->file, s->blk) & c->smask];
	uint32_t me = slot_idx(c, s) + 1;

	while (*p && *p != me)
		p = &c->slots[*p - 1].hnext;
	if (*p)
		*p = s->hnext;
	s->hnext = 0;
}

/*
 * The device would not flush: pages kept after a read miss and not known to
 * be durable cannot be claimed by an entry.  They are clean (the backing file
 * has them, even when a write has just marked them dirty as its intent), so
 * the slot forgets them; the device is charged with the error.
 */
static void slot_unclaim_unsynced(struct cache *c, struct cslot *s, int err)
{
	struct dev_io io = { .dev = slot_dev(c, slot_idx(c, s)),
			     .op = DEV_FLUSH,
			     .res = err };
	uint32_t p;

	note_dev_error(c, &io, 1);
	pthread_mutex_lock(&c->lock);
	for (p = 0; p < c->ppb; p++) {
		int was_dirty;

		if (!pb_test(slot_unsynced(c, s), p) ||
		    pb_test(slot_pvalid(c, s), p) ||
		    !pb_test(slot_valid(c, s), p))
			continue;
		was_dirty = pb_any(c, slot_dirty(c, s));
		page_forget_locked(c, s, p);
		if (was_dirty && !pb_any(c, slot_dirty(c, s)))
			file_mark_clean(c, c->recs[s->file - 1], s);
	}
	slot_settle(c, s);
	cache_unlock(c);
}

/*
 * What s's entry is to say, in *m; 0 if the media says it already (nothing
 * to write), else 1.  Pages that are not known durable on the device are
 * made so first.
 */
static int slot_persist_prep(struct cache *c, struct cslot *s,
			     struct meta_slot *m)
{
	const uint8_t *valid = slot_valid(c, s),
		      *unsynced = slot_unsynced(c, s);
	const uint8_t *pvalid = slot_pvalid(c, s);
	int need = 0, ret;
	uint32_t i;

	for (i = 0; i < c->pbytes; i++)
		need |= (valid[i] & ~pvalid[i] & unsynced[i]) != 0;
	if (s->file && need) {
		ret = cache_dev_sync(c, slot_member(c, slot_idx(c, s)));
		if (ret)
			slot_unclaim_unsynced(c, s, ret);
		pb_zero(c, slot_unsynced(c, s));
	}
	memset(m, 0, sizeof(*m));
	m->file = s->file;
	m->blk = s->blk;
	m->flags = s->is_twin ? SLOT_F_TWIN : 0;
	pb_get(c, slot_valid(c, s), m->valid);
	pb_get(c, slot_dirty(c, s), m->dirty);
	/* an overwrite of dirty pages changes nothing the entry says */
	if (s->persisted && meta_slot_same(&c->meta, slot_idx(c, s), m)) {
		pb_put(c, slot_pvalid(c, s), m->valid);
		return 0;
	}
	return 1;
}

/* The put of s's entry *m ended with ret. */
static int slot_persist_done(struct cache *c, struct cslot *s,
			     const struct meta_slot *m, int ret)
{
	uint8_t *pvalid = slot_pvalid(c, s);
	uint64_t pw[META_MAX_WORDS];
	int w;

	if (!ret) {
		pb_put(c, pvalid, m->valid);
		s->persisted = s->file != 0;
		return 0;
	}
	/*
	 * No mirror took it: the media may hold the old entry or the new one.
	 * Claimed are only the pages both claim; and the slot counts as
	 * mapped until an entry saying free is known to be on the media.
	 */
	pb_get(c, pvalid, pw);
	for (w = 0; w < META_MAX_WORDS; w++)
		pw[w] &= m->valid[w];
	pb_put(c, pvalid, pw);
	s->persisted |= s->file != 0;
	log_msg(LOG_ERR, "cannot persist the map entry of slot %llu: %s",
		(unsigned long long)slot_idx(c, s), strerror(-ret));
	return ret;
}

int slot_persist(struct cache *c, struct cslot *s)
{
	struct meta_slot m;

	if (!slot_persist_prep(c, s, &m))
		return 0;
	return slot_persist_done(c, s, &m,
				 meta_put_slot(&c->meta, slot_idx(c, s), &m));
}

static int slot_idx_cmp(const void *a, const void *b)
{
	const struct cslot *x = *(struct cslot *const *)a,
			   *y = *(struct cslot *const *)b;

	return (x > y) - (x < y);
}

/*
 * slot_persist() of n slots (v is sorted), with one persist per mirror for
 * each run of adjacent entries (meta_put_slots): the slots of one write,
 * whose caller acknowledges it after all of them.  Each slot's rw held for
 * writing; at most SEG_MAX_BLOCKS.  The first error, or 0.
 */
int slots_persist(struct cache *c, struct cslot **v, int n)
{
	struct meta_slot m[SEG_MAX_BLOCKS];
	uint64_t idx[SEG_MAX_BLOCKS];
	int res[SEG_MAX_BLOCKS], put[SEG_MAX_BLOCKS];
	int i, k = 0, ret = 0, err;

	assert(n <= SEG_MAX_BLOCKS);
	qsort(v, n, sizeof(*v), slot_idx_cmp); /* slots[] order: by index */
	for (i = 0; i < n; i++) {
		put[i] = slot_persist_prep(c, v[i], &m[k]);
		if (put[i])
			idx[k++] = slot_idx(c, v[i]);
	}
	meta_put_slots(&c->meta, idx, m, k, res);
	for (i = 0, k = 0; i < n; i++) {
		if (!put[i])
			continue;
		err = slot_persist_done(c, v[i], &m[k], res[k]);
		k++;
		if (!ret)
			ret = err;
	}
	return ret;
}

/* ------------------------------------------------------------ free queue */

/*
 * Free entries.  A slot whose entry on the media maps it (persisted) must not
 * receive new data before an entry saying free is durable, or after a crash
 * the old entry would claim the new bytes for its file (PRODUCT §4.4); a file
 * record is not handed out again before its zeroed record is durable, and is
 * zeroed only after the free entries of the slots it had (a slot entry whose
 * record is reused would claim a block of the new file: recover.c takes an
 * entry whose record is free for a free slot).  Those persists are mirror
 * writes (FUA page writes on block devices), so they never run under
 * c->lock (its essay in engine.h).  Whoever frees a slot or a record under
 * c->lock puts it on the free queue instead: the slot on the SL_FREEING list
 * (FREE, not counted free, never taken: free_take_locked looks at SL_FREE
 * only), the record on c->freeing_recs; each bumps c->freeq_enq, and the
 * thread notes that count as what it waits for (freeq_note_locked).  Its
 * cache_unlock() then persists the queue (freeq_drain) before it goes on,
 * so that what it acknowledges or persists next comes after the free
 * entries: a truncate's dropped blocks stay dropped after a crash.  An
 * allocation made while the queue is not empty notes it too (slot_claim,
 * file_ensure_record): the new entry for a block must not reach the media
 * before an older entry that maps the same block goes free (recovery
 * refuses two entries for one block).  An allocator that finds only queued
 * slots does not evict more: it drains the queue and looks again
 * (freeq_wait_locked; a writer does so before it writes the blocks it has
 * gathered, which would otherwise end up in two segments).  A thread about
 * to wait with c->lock held drains what it queued first
 * (freeq_before_wait_locked: the destager's idle wait could be long).
 * Where slots are taken, free_take_locked asserts that no entry maps them.
 *
 * One thread drains at a time (freeq_lock, held across the persists; never
 * taken under c->lock): it takes, under c->lock, the records queued and the
 * count of slots queued, persists those slots' free entries (c->lock
 * dropped), then the records' zeroed ones, and only then puts them on the
 * free list and free_recs and sets c->freeq_done to the count it started
 * from.  Every slot of a queued record was queued before it (its nslots was
 * 0), so it is among the slots persisted first.  A free entry that fails
 * leaves its slot out of use until the next mount (nlimbo, as before), and
 * from then on no freed record is handed out again (freeq_failed).
 */
static __thread struct cache *fq_cache;
static __thread uint64_t fq_want;

void freeq_note_locked(struct cache *c)
{
	assert_held(&c->lock);
	fq_cache = c;
	fq_want = c->freeq_enq;
}

/* Queue file record r (0-based), freed (c->lock held). */
void freeq_rec_locked(struct cache *c, uint32_t r)
{
	assert_held(&c->lock);
	c->freeing_recs[c->nfreeing_recs++] = r;
	c->freeq_enq++;
	freeq_note_locked(c);
}

#define FQ_BATCH 64

/* Persist the free queue until freeq_done >= want (c->lock not held). */
void freeq_drain(struct cache *c, uint64_t want)
{
	struct cslot *v[FQ_BATCH], *s;
	struct meta_slot m[FQ_BATCH];
	uint64_t idx[FQ_BATCH], upto, left;
	int res[FQ_BATCH], n, i;
	uint32_t k0, r, *ok = NULL;

	assert(!cache_lock_mine(c));
	pthread_mutex_lock(&c->freeq_lock);
	pthread_mutex_lock(&c->lock);
	if (c->freeq_done >= want)
		goto out_unlock;
	upto = c->freeq_enq;
	k0 = c->nfreeing_recs;
	/* the list is in queue order: its first `left` are older than upto */
	for (left = c->lcount[SL_FREEING]; left;) {
		for (n = 0; n < FQ_BATCH && left; n++, left--) {
			s = slot_list_next(c, SL_FREEING, NULL);
			slot_list_del(c, s);
			v[n] = s;
		}
		pthread_mutex_unlock(&c->lock);
		qsort(v, n, sizeof(*v), slot_idx_cmp);
		for (i = 0; i < n; i++) {
			memset(&m[i], 0, sizeof(m[i]));
			idx[i] = slot_idx(c, v[i]);
		}
		meta_put_slots(&c->meta, idx, m, n, res);
		pthread_mutex_lock(&c->lock);
		for (i = 0; i < n; i++) {
			/* the slot is on no list and unmapped: ours alone */
			slot_persist_done(c, v[i], &m[i], res[i]);
			c->nfreeing--;
			if (res[i]) {
				c->nlimbo++;
				c->freeq_failed = 1;
				continue;
			}
			slot_settle(c, v[i]);
		}
	}
	if (k0 && !c->freeq_failed)
		ok = calloc(k0, sizeof(*ok));
	pthread_mutex_unlock(&c->lock);
	/* [0, k0) of freeing_recs stays as it is: only appended to */
	for (r = 0; ok && r < k0; r++) {
		struct meta_file mf;

		memset(&mf, 0, sizeof(mf));
		ok[r] = !meta_put_file(&c->meta, c->freeing_recs[r], &mf);
		if (!ok[r])
			log_msg(LOG_ERR, "cannot persist a freed file record");
	}
	pthread_mutex_lock(&c->lock);
	for (r = 0; r < k0; r++)
		if (ok && ok[r] && !c->freeq_failed)
			c->free_recs[c->nfree_recs++] = c->freeing_recs[r];
	if (k0 && !ok)
		log_msg(LOG_ERR, "%u freed file records kept out of use", k0);
	memmove(c->freeing_recs, c->freeing_recs + k0,
		(c->nfreeing_recs - k0) * sizeof(*c->freeing_recs));
	c->nfreeing_recs -= k0;
	__atomic_store_n(&c->freeq_done, upto, __ATOMIC_RELEASE);
	space_freed_locked(c);
out_unlock:
	if (fq_cache == c && fq_want <= c->freeq_done)
		fq_want = 0;
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_unlock(&c->freeq_lock);
	free(ok);
}

void cache_unlock(struct cache *c)
{
	uint64_t want = fq_cache == c ? fq_want : 0;
	int pending = want && c->freeq_done < want;

	pthread_mutex_unlock(&c->lock);
	if (pending)
		freeq_drain(c, want);
}

/* Persist the whole free queue (c->lock not held). */
void freeq_flush(struct cache *c)
{
	uint64_t want;

	pthread_mutex_lock(&c->lock);
	want = c->freeq_enq;
	pthread_mutex_unlock(&c->lock);
	freeq_drain(c, want);
}

/*
 * Before a wait with c->lock held: the free entries this thread queued are
 * persisted first (the wait could be long: the destager's idle one), c->lock
 * dropped meanwhile.  1 if it was dropped: the caller looks again instead
 * of waiting, as what it waits for may have come meanwhile.
 */
int freeq_before_wait_locked(struct cache *c)
{
	uint64_t want = fq_cache == c ? fq_want : 0;

	assert_held(&c->lock);
	if (!want || c->freeq_done >= want)
		return 0;
	cache_unlock(c);
	pthread_mutex_lock(&c->lock);
	return 1;
}

/*
 * An allocation found no free slot (or record) while some are queued: drop
 * c->lock, persist the queue, take c->lock again.  1 if it did (the caller
 * looks again: anything may have changed), 0 if nothing is queued.
 */
int freeq_wait_locked(struct cache *c)
{
	assert_held(&c->lock);
	if (!c->nfreeing && !c->nfreeing_recs)
		return 0;
	freeq_note_locked(c);
	cache_unlock(c);
	pthread_mutex_lock(&c->lock);
	return 1;
}

/* The slot no longer holds page p, valid or dirty (c->lock held). */
void page_forget_locked(struct cache *c, struct cslot *s, uint32_t p)
{
	assert_held(&c->lock);
	if (pb_test(slot_dirty(c, s), p)) {
		pb_clear(slot_dirty(c, s), p);
		pages_dirty(c, s, -1);
	}
	if (pb_test(slot_valid(c, s), p)) {
		pb_clear(slot_valid(c, s), p);
		pages_valid(c, s, -1);
	}
}

/* Put a slot on the list its state calls for.  c->lock held. */
void slot_settle(struct cache *c, struct cslot *s)
{
	if (s->state == SLOT_CLEAN)
		slot_list_del(c, s);
	if (!s->file && s->persisted) {
		/* its entry on the media may still map it: not reused before
		 * an entry saying free is durable ("Free entries" above) */
		s->state = SLOT_FREE;
		slot_list_add_tail(c, SL_FREEING, s);
		c->nfreeing++;
		c->freeq_enq++;
		freeq_note_locked(c);
	} else if (!s->file) {
		s->state = SLOT_FREE;
		slot_list_add_tail(c, SL_FREE, s);
		c->nfree++;
		space_freed_locked(c);
	} else if (pb_any(c, slot_dirty(c, s))) {
		s->state = SLOT_DIRTY;
	} else if (pb_any(c, slot_valid(c, s))) {
		s->state = SLOT_CLEAN;
		slot_list_add_tail(c, slot_lru(c, s), s);
		if (!s->pins)
			space_freed_locked(c);
	} else {
		/* mapped and empty: only while whoever fills it pins it
		 * (rebuild.c, "Fresh slots") */
		assert(s->pins || s->is_twin);
		s->state = SLOT_FRESH;
	}
}

void file_mark_dirty(struct cache *c, struct cfile *f, struct cslot *s)
{
	s->dirty_since = now_ms();
	s->dirty_epoch = c->epoch;
	c->ndirty_slots++;
	if (!f->ndirty++) {
		f->dirty_since = s->dirty_since;
		list_add_tail(&c->dirty_files, &f->dlink);
	}
}

void file_mark_clean(struct cache *c, struct cfile *f, struct cslot *s)
{
	(void)s;
	c->ndirty_slots--;
	if (!--f->ndirty)
		list_del(&f->dlink);
}

/* Free a slot's twin (c->lock held); its entry goes to the free queue. */
void twin_free_locked(struct cache *c, struct cslot *s)
{
	struct cslot *t;

	assert_held(&c->lock);
	if (!s->twin)
		return;
	t = &c->slots[s->twin - 1];
	s->twin = 0;
	t->is_twin = 0;
	c->ntwins--;
	t->file = 0;
	t->blk = 0;
	pb_zero(c, slot_valid(c, t));
	pb_zero(c, slot_dirty(c, t));
	t->state = SLOT_FRESH;
	slot_settle(c, t); /* persisted: to the free queue */
}

/* Persist s's twin as a copy of s's dirty pages (s->rw held for writing). */
int twin_persist(struct cache *c, struct cslot *s)
{
	struct cslot *t = &c->slots[s->twin - 1];

	pb_copy(c, slot_valid(c, t), slot_dirty(c, s));
	pb_copy(c, slot_dirty(c, t), slot_dirty(c, s));
	return slot_persist(c, t);
}

/*
 * Unmap a slot; an entry on the media that maps it goes free through the
 * free queue before the slot is reused.  c->lock held, pins == 0.
 */
void slot_drop_locked(struct cache *c, struct cslot *s)
{
	struct cfile *f = c->recs[s->file - 1];

	assert_held(&c->lock);
	twin_free_locked(c, s);
	if (s->state == SLOT_CLEAN)
		slot_list_del(c, s);
	if (s->state == SLOT_DIRTY) {
		file_mark_clean(c, f, s);
		pages_dirty(c, s, -(int64_t)(pb_count(c, slot_dirty(c, s))));
	}
	pages_valid(c, s, -(int64_t)(pb_count(c, slot_valid(c, s))));
	slot_hash_del(c, s);
	list_del(&s->flink);
	f->nslots--;
	s->file = 0;
	s->blk = 0;
	pb_zero(c, slot_valid(c, s));
	pb_zero(c, slot_dirty(c, s));
	s->state = SLOT_FRESH;
	slot_settle(c, s); /* persisted: to the free queue */
}

/* ----------------------------------------------------------- allocation */

/* A free slot on a working device other than avoid (-1: any), on prefer if
 * one of the first few free slots is there (-1: the first).  c->lock held. */
struct cslot *free_take_locked(struct cache *c, int avoid, int prefer)
{
	struct cslot *s, *pick = NULL;
	int tries = 0;

	assert_held(&c->lock);
	for (s = slot_list_next(c, SL_FREE, NULL); s;
	     s = slot_list_next(c, SL_FREE, s)) {
		int d;

		d = slot_member(c, slot_idx(c, s));
		if (slot_failed(c, s) || slot_draining(c, s) || d == avoid)
			continue;
		if (!pick || d == prefer)
			pick = s;
		/* a few candidates for the preferred device, not a scan */
		if (prefer < 0 || d == prefer || ++tries >= 2 * c->ndevs)
			break;
	}
	if (!pick)
		return NULL;
	assert(!pick->persisted); /* no entry on the media maps it */
	slot_list_del(c, pick);
	c->nfree--;
	return pick;
}

/*
 * Free the least recently used clean slot that nobody pins, on a working
 * device other than avoid (-1: any), never keep, from the lowest eviction
 * level that has one (engine.h).  0 if one went free.
 */
int evict_one_locked(struct cache *c, int avoid, struct cslot *keep)
{
	struct cslot *v;
	int lru;

	assert_held(&c->lock);
	for (lru = SL_LRU_FIRST; lru <= SL_PIN; lru++) {
		/* pinned files that writes grew past cache.max_pinned give
		 * back what is over it, as a last resort (filectl.c) */
		if (lru == SL_PIN && c->lcount[SL_PIN] <= pin_cap_slots(c))
			break;
		for (v = slot_list_next(c, lru, NULL); v;
		     v = slot_list_next(c, lru, v)) {
			struct cfile *o = c->recs[v->file - 1];

			if (v->pins || v == keep || slot_failed(c, v) ||
			    (int)(slot_member(c, slot_idx(c, v))) == avoid)
				continue;
			slot_drop_locked(c, v);
			CNT_ADD(c, evictions, 1);
			if (!o->refs && !o->nslots) {
				o->refs++;
				file_put_locked(c, o);
			}
			return 0;
		}
	}
	return -ENOSPC;
}

/* A slot from free_take_locked starts empty, for (rec, blk). */
static void slot_claim(struct cache *c, struct cslot *s, uint32_t rec,
		       uint64_t blk)
{
	s->file = rec;
	s->blk = blk;
	s->state = SLOT_FRESH;
	s->gen++;
	pb_zero(c, slot_valid(c, s));
	pb_zero(c, slot_dirty(c, s));
	pb_zero(c, slot_unsynced(c, s));
	/* its entry must not be persisted before older free entries: one
	 * of them may map the same block (recovery refuses two) */
	if (c->freeq_done != c->freeq_enq)
		freeq_note_locked(c);
}

/* Take a free slot, or evict the least recently used clean one.  c->lock held. */
struct cslot *slot_alloc_locked(struct cache *c, struct cfile *f,
				       uint64_t blk)
{
	struct cslot *s;

	assert_held(&c->lock);
	/* a bypass file has no slot (fpolicy.c) */
	assert(__atomic_load_n(&f->pol.mode, __ATOMIC_RELAXED) != MODE_BYPASS);
	/* blocks spread over the devices by position, first copies too */
	while (!(s = free_take_locked(c, -1, (blk + f->rec) % c->ndevs))) {
		/* freed slots on their way to the free list: the caller
		 * persists them and looks again (freeq_wait_locked) */
		if (c->nfreeing)
			return NULL;
		if (evict_one_locked(c, -1, NULL))
			return NULL;
	}
	slot_claim(c, s, f->rec, blk);
	slot_hash_add(c, s);
	list_add_tail(&f->slots, &s->flink);
	f->nslots++;
	return s;
}

/*
 * Give back a slot that slot_alloc_locked has just taken for f, which got
 * nothing and which nobody pinned (a write that finds no room for the
 * block's second copy: write_cached).  Left as it is, FRESH and mapped, it
 * would be on no list, neither free nor evictable, until its block is read
 * or written again: lost to the cache, and to a rebuild's rule ("Fresh
 * slots", rebuild.c), if the write then ends with an error.  Unlike the
 * last unpin it wakes nobody: whoever freed the slot has woken the waiters
 * already, and writers that wait for a twin would wake each other for ever.
 * c->lock held.
 */
void slot_unclaim_locked(struct cache *c, struct cfile *f, struct cslot *s)
{
	assert_held(&c->lock);
	assert(s->state == SLOT_FRESH && s->file == f->rec && !s->pins &&
	       !s->twin && !s->is_twin && !s->persisted);
	slot_hash_del(c, s);
	list_del(&s->flink);
	f->nslots--;
	s->file = 0;
	s->blk = 0;
	s->state = SLOT_FREE;
	slot_list_add_tail(c, SL_FREE, s);
	c->nfree++;
}

/*
 * Devices that work.  With one left, dirty data has one copy: the cache runs
 * degraded (logged when the device failed) rather than stop taking writes.
 */
int working_devices(struct cache *c)
{
	int d, n = 0;

	for (d = 0; d < c->ndevs; d++)
		n += !c->dev_failed[d] &&
		     !__atomic_load_n(&c->dev_draining[d], __ATOMIC_ACQUIRE);
	return n;
}

/* A twin for s: a free slot on another working device (c->lock held). */
struct cslot *twin_alloc_locked(struct cache *c, struct cslot *s)
{
	int dev = slot_member(c, slot_idx(c, s));
	struct cslot *t;

	assert_held(&c->lock);
	while (!(t = free_take_locked(c, dev, -1))) {
		if (c->nfreeing) /* as in slot_alloc_locked */
			return NULL;
		if (evict_one_locked(c, dev, s))
			return NULL;
	}
	slot_claim(c, t, s->file, s->blk);
	t->is_twin = 1;
	s->twin = slot_idx(c, t) + 1;
	c->ntwins++;
	return t;
}

/*
 * No slot of a file is pinned without its lock.  A pin keeps a slot and its
 * pages where they are: nobody drops or evicts a pinned slot.  A thread that
 * holds f->rw for writing (a revalidation that found the backing file
 * changed elsewhere, a write around the cache, a truncate) drops f's clean
 * slots and must find none pinned, or it keeps pages that no longer match
 * the store and serves them for good (issue 25, finding 4: a warm of a
 * pinned file pinned every slot without f->rw).  So whoever pins a slot of
 * f holds f->rw, for reading or writing, from before the pin until after
 * the unpin; a write hold then sees only its own pins.  Asserted here
 * (frw.h tells whether this thread holds f->rw), and by the drops that
 * count on it (coh_drop_clean, write_around).  Eviction, which takes no
 * file lock, skips pinned slots, as ever.
 */
void slot_pin_locked(struct cache *c, struct cfile *f, struct cslot *s)
{
	assert_held(&c->lock);
	assert(frw_held(f, 0));
	assert(c->recs[s->file - 1] == f);
	s->pins++;
}

/* Release a pin; a FRESH slot that got no data goes back free.  c->lock held.
 */
void slot_unpin_locked(struct cache *c, struct cfile *f, struct cslot *s)
{
	assert_held(&c->lock);
	s->pins--;
	if (!s->pins && s->twin && !pb_any(c, slot_dirty(c, s)))
		twin_free_locked(c, s); /* clean or empty: one copy is enough */
	if (!s->pins && s->state == SLOT_CLEAN)
		space_freed_locked(c); /* evictable now */
	if (!s->pins && s->state == SLOT_FRESH && s->file) {
		slot_hash_del(c, s);
		list_del(&s->flink);
		f->nslots--;
		s->file = 0;
		slot_settle(c, s); /* persisted: to the free queue */
	}
}

uint64_t pin_cap_slots(struct cache *c)
{
	return c->nslots *
	       __atomic_load_n(&c->cfg->max_pinned, __ATOMIC_RELAXED) / 100;
}

void file_relist_locked(struct cache *c, struct cfile *f)
{
	struct list *l;
	int lru = file_lru(f);

	assert_held(&c->lock);
	for (l = f->slots.next; l != &f->slots; l = l->next) {
		struct cslot *s = list_entry(l, struct cslot, flink);

		if (s->state != SLOT_CLEAN)
			continue;
		slot_list_del(c, s);
		slot_list_add_tail(c, lru, s);
	}
}

/* The rebuild's rule at every commit (rebuild.c, "Fresh slots"), kept here
 * below the data paths that commit, so that they call nothing above them. */
uint64_t rebuild_seq(struct cache *c)
{
	return __atomic_load_n(&c->rebuild_seq, __ATOMIC_SEQ_CST);
}

#ifndef NDEBUG
static void rb_check_one(struct cache *c, struct cslot *x, int m)
{
	uint64_t i = slot_idx(c, x);

	if (slot_member(c, i) == m - 1)
		assert(layout_index(&c->meta.layout, i) >=
		       __atomic_load_n(&c->rebuild_pos, __ATOMIC_SEQ_CST));
}
#endif

void rebuild_check_commit(struct cache *c, struct cslot *s, uint64_t seq0)
{
#ifndef NDEBUG
	int m = __atomic_load_n(&c->rebuild_member, __ATOMIC_SEQ_CST);

	assert(srw_wrheld(&s->rw));
	if (!m || rebuild_seq(c) == seq0)
		return; /* no rebuild, or the shadow was set before the lock */
	rb_check_one(c, s, m);
	if (s->twin)
		rb_check_one(c, &c->slots[s->twin - 1], m);
#else
	(void)c;
	(void)s;
	(void)seq0;
#endif
}

/*
 * Read pages [p0, p1) of s from its twin into buf (s->rw held): only pages
 * the twin is known to hold; a twin not seeded yet holds nothing.
 */
int twin_read(struct cache *c, struct cslot *s, char *buf, uint32_t p0,
	      uint32_t p1)
{
	struct cslot *t;
	uint32_t p;

	if (!s->twin)
		return -EIO;
	t = &c->slots[s->twin - 1];
	if (slot_failed(c, t))
		return -EIO;
	for (p = p0; p < p1; p++)
		if (!pb_test(slot_valid(c, t), p))
			return -EIO;
	return dev_read(slot_dev(c, slot_idx(c, t)), buf, (p1 - p0) * NVC_PAGE,
			slot_off(c, slot_idx(c, t)) + p0 * NVC_PAGE);
}
