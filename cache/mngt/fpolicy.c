/* cache: policies by path applied to files — the match at open, a file's
 * change of mode (into bypass above all), and its eviction level. */
#define _GNU_SOURCE
#include "mngt.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <syslog.h>

/*
 * When a file gets its policy.  At every open through the mount
 * (cache_file_policy_match, after the revalidation, before O_TRUNC), against
 * the rules loaded at that moment, by the file's path relative to the mount
 * as its descriptor names it (a hard link: the name the kernel has for it) and
 * its size as the mount shows it.  The result (struct pol_match) is the
 * file's until its next open: every handle of the file follows the latest
 * open's match, and a SIGHUP changes nothing for a file until it is opened
 * again.  A file the daemon knows without an open (dirty data found at mount,
 * a file nobody has opened since) has no policy: the global keys.  A rename
 * keeps the policy until the next open.
 *
 * Modes.  f->pol.mode is read once per request (file_mode), like cache.mode
 * was: a request runs in the mode it read, and the engine keeps any mix
 * coherent (a writethrough or writearound write onto dirty data from
 * writeback goes through the cache, write.c), except for bypass, which
 * promises more: a bypass file has no slot at all.  Invariant: from the
 * moment f->pol.mode says MODE_BYPASS until it says anything else, f has no
 * slot, so every read and write of it is the backing file's, and nothing
 * stale can be served.  Enforced thus:
 *   - mode becomes bypass only here, under f->rw held for writing, with
 *     f->ndirty == 0 and every slot of f dropped in the same c->lock section;
 *   - every path that allocates a slot for f holds f->rw (for reading) and
 *     reads the mode under it: write_cached goes around the cache, a fill keeps
 *     nothing (io.c), a read's misses bypass; slot_alloc_locked asserts it.
 * Getting there: the mode first becomes writethrough, so that no write makes
 * new dirty data; then the file's dirty data is destaged (cache_file_flush);
 * then, under f->rw for writing, if nothing is dirty (a writeback write that
 * read the old mode may have made some meanwhile: it is destaged again) the
 * slots go and the mode is bypass.  A destage that fails leaves the file in
 * writethrough until its next open (logged): its dirty data stays served from
 * the cache, never lost, never stale.
 *
 * Levels.  The eviction level (engine.h, SL_LRU_*) follows the file's
 * priority and pin; when an open changes it, the file's clean slots move to
 * the tail of the new level's list (the most recently used end) at once.
 */

int cache_file_outside(struct cache *c, struct cfile *f)
{
	int mode = file_mode(c, f), ret = 0;

	if (mode == MODE_BYPASS)
		ret |= CACHE_OUT_BYPASS;
	else if (mode == MODE_WRITEAROUND)
		ret |= CACHE_OUT_WRITEAROUND;
	pthread_mutex_lock(&c->lock);
	if (!f->ndirty && !f->lost)
		ret |= CACHE_OUT_CLEAN;
	if (!f->nslots && !f->ndirty && !f->lost)
		ret |= CACHE_OUT_EMPTY;
	if (admit_kept_locked(c, f))
		ret |= CACHE_OUT_KEPT;
	else if (admit_streamed_locked(c, f))
		ret |= CACHE_OUT_STREAMED;
	cache_unlock(c);
	return ret;
}

const char *cache_file_policy(const struct cfile *f)
{
	return __atomic_load_n(&f->pol.name, __ATOMIC_ACQUIRE);
}

const char *cache_policy_for(struct cache *c, const char *path, uint64_t size)
{
	struct pol_set *set;
	struct pol_match m;

	if (!__atomic_load_n(&c->cfg->policies, __ATOMIC_ACQUIRE))
		return NULL;
	set = pol_live_get(&c->cfg->policies);
	pol_match(set, path, size, &m);
	pol_set_put(set);
	return m.name;
}

/* Drop f's slots if none is dirty or pinned: 1 if done (then the mode is
 * bypass), 0 if not now.  f->rw held for writing, c->lock held. */
static int bypass_settle_locked(struct cache *c, struct cfile *f)
{
	struct list *l;

	assert_held(&c->lock);
	if (f->ndirty)
		return 0;
	for (l = f->slots.next; l != &f->slots; l = l->next)
		if (list_entry(l, struct cslot, flink)->pins)
			return 0;
	while (!list_empty(&f->slots)) {
		struct cslot *s =
			list_entry(f->slots.next, struct cslot, flink);

		assert(s->state == SLOT_CLEAN);
		slot_drop_locked(c, s);
	}
	file_wgen_bump_locked(c, f); /* a fill read before now keeps nothing (io.c) */
	frw_owe_wgen(f);
	__atomic_store_n(&f->pol.mode, MODE_BYPASS, __ATOMIC_RELEASE);
	return 1;
}

#define BYPASS_TRIES 8

/* Make f a bypass file: see the essay above.  0, or why not. */
int file_to_bypass(struct cache *c, struct cfile *f)
{
	int tries, done = 0, ret = 0;
	uint64_t ndirty;

	__atomic_store_n(&f->pol.mode, MODE_WRITETHROUGH, __ATOMIC_RELEASE);
	for (tries = 0; tries < BYPASS_TRIES && !done && !ret; tries++) {
		pthread_mutex_lock(&c->lock);
		ndirty = f->ndirty;
		cache_unlock(c);
		if (ndirty)
			ret = cache_file_flush(c, f);
		if (ret)
			break;
		frw_wrlock(f);
		pthread_mutex_lock(&c->lock);
		done = bypass_settle_locked(c, f);
		cache_unlock(c);
		frw_unlock(f);
	}
	return done ? 0 : ret ? ret : -EBUSY;
}

int cache_file_policy_match(struct cache *c, struct cfile *f)
{
	struct pol_set *set;
	struct pol_match m;
	char path[PATH_MAX];
	uint64_t size;
	int ret, old_lru;

	/* no rules, and none held: nothing to do, and no lock taken (an open
	 * costs what it did before policies) */
	if (!__atomic_load_n(&c->cfg->policies, __ATOMIC_ACQUIRE) &&
	    !__atomic_load_n(&f->pol.name, __ATOMIC_ACQUIRE))
		return 0;
	set = pol_live_get(&c->cfg->policies);
	pthread_mutex_lock(&c->lock);
	size = f->size;
	cache_unlock(c);
	ret = f->fd >= 0 ? ident_rel_path(c, f->fd, path, sizeof(path))
			 : -EBADF;
	pol_match(set, ret ? NULL : path, size, &m);
	pol_set_put(set);
	if (m.name && m.mode == MODE_BYPASS && file_mode(c, f) != MODE_BYPASS) {
		ret = file_to_bypass(c, f);
		if (ret) {
			log_msg(LOG_WARNING,
				"%s: policy %s says bypass, but its dirty data "
				"could not be destaged (%s): writethrough "
				"until "
				"its next open",
				path, m.name, strerror(-ret));
			m.mode = MODE_WRITETHROUGH;
		}
	}
	pthread_mutex_lock(&c->lock);
	old_lru = file_lru(f);
	__atomic_store_n(&f->pol.name, m.name, __ATOMIC_RELEASE);
	f->pol.pin = m.pin;
	f->pol.prio = m.prio;
	f->pol.age_ms = m.age_ms;
	/* bypass is set by bypass_settle_locked alone, under f->rw; a
	 * detached cache keeps every file bypass (detach.c) */
	if (m.mode != MODE_BYPASS && !c->detached)
		__atomic_store_n(&f->pol.mode, m.mode, __ATOMIC_RELEASE);
	if (file_lru(f) != old_lru)
		file_relist_locked(c, f);
	if (m.age_ms != POL_AGE_GLOBAL && m.age_ms &&
	    (!c->pol_min_age || m.age_ms < c->pol_min_age))
		c->pol_min_age = m.age_ms;
	if (f->ndirty) /* its age may be due sooner now */
		pthread_cond_signal(&c->destage_cond);
	cache_unlock(c);
	return 0;
}
