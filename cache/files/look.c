/* cache: a backing file's look (size, mtime, ctime) as this node last left
 * it, and the bracket around every change this node makes to the file. */
#define _GNU_SOURCE
#include "files_int.h"

#include <assert.h>
#include <errno.h>
#include <sys/stat.h>
#include <time.h>

/* The look is what coherence.c compares ("Close-to-open"); it is taken
 * here, below the data paths and destage, which bracket every change they
 * make to the store with coh_bk_begin and coh_bk_done or coh_bk_end. */

/* ---------------------------------------------------------------- look */

int look_differs_locked(const struct cfile *f, const struct stat *st)
{
	return (uint64_t)st->st_size != f->bsize ||
	       ts_ns(&st->st_mtim) != f->bk_mtime_ns ||
	       ts_ns(&st->st_ctim) != f->bk_ctime_ns;
}

/*
 * Who must bump f->wgen.  A read that misses fetches the backing file's
 * bytes under f->rw held for reading, and keeps them in the cache
 * (fill_from_backing, in the read or after its reply: cache_read_finish,
 * which takes f->rw again) only if f->wgen is still what it was when the
 * read began; the direct read-ahead (bkstream.c) serves what it read ahead
 * only under the same condition.  So whoever makes bytes fetched before it
 * wrong for the cache bumps f->wgen under c->lock before it lets f->rw go:
 * a write through the cache (seg_mark_intent; a punched hole is written
 * as zeros) or around it (write_around), a truncate (cache_truncate,
 * file_trim), a file turned bypass (fpolicy.c), and every drop of clean
 * data because the store was changed elsewhere.  Such a drop is
 * coh_drop_clean's (keep-both's salvage_drop bumps after it), and coh_drop_clean bumps itself in the
 * hold of c->lock that drops: with backing.async_fill a fill deferred past
 * the reply of a read made before another node's change put back the bytes
 * a revalidation had just dropped, when the drop was coh_settle's for a
 * stale or unsettled look, which bumped nothing (issue 25, finding 17).
 * Eviction drops only bytes the store holds too, and bumps nothing.
 * Asserted in debug builds for the drops made under f->rw held for
 * writing (coh_drop_clean, write_around, file_trim, fpolicy.c): each marks
 * its hold (frw_owe_wgen), and the unlock asserts that f->wgen moved while
 * it was held (frw.c); a fill asserts that it holds f->rw (io.c).
 * file_wgen_bump_locked is the only way to bump it (tests/layers.py
 * fails on any other), and asserts c->lock.
 */
void file_wgen_bump_locked(struct cache *c, struct cfile *f)
{
	assert_held(&c->lock);
	assert_held(&c->lock);
	f->wgen++;
}

/*
 * Who may set f->bsize.  It is the backing file's size as far as this node
 * knows, and never below the end of a completed own write: a partial page
 * past it is taken for a hole and prefilled with zeros (page_prefill), so a
 * bsize too low puts zeros in the cache where this node's own bytes are in
 * the store.  So only three kinds of code set it:
 *   - an own write once the store has it, and only upward (backing_write,
 *     write_fallback, write_around);
 *   - the object's making and recovery, and file_check_backing under f->rw
 *     held for writing, from a fstat no own write can overlap;
 *   - look_take_locked, from a fstat that began after every own change
 *     that had completed, with none under way: the caller reads
 *     f->coh.gen before its fstat, and takes the look only if it is
 *     unchanged and nothing is in flight (look_current_locked; asserted
 *     here).  coh_bk_done bumps f->coh.gen, so a fstat that may predate a
 *     write completed since is refused, and that write's own note, which
 *     follows, takes the look.  Before it did (issue 25, finding 17), a
 *     note whose fstat preceded another write's pwrite could take its
 *     stale size in the moment between that write's coh_bk_done and its
 *     own note's bump, lowering bsize below that completed write
 *     (reproduced with delay hooks: test_coherence
 *     test_note_never_lowers_bsize).
 * These are the only ways to set it (tests/layers.py fails on any other):
 * file_bsize_grow_locked for the first kind, file_bsize_found for the
 * second, look_take_locked for the third.
 */
void file_bsize_grow_locked(struct cache *c, struct cfile *f, uint64_t end)
{
	assert_held(&c->lock);
	assert_held(&c->lock);
	if (end > f->bsize)
		__atomic_store_n(&f->bsize, end, __ATOMIC_RELAXED);
}

void file_bsize_found(struct cfile *f, uint64_t size)
{
	f->bsize = size;
}

int look_current_locked(const struct cfile *f, uint64_t gen)
{
	return f->coh.gen == gen && !f->coh.inflight;
}

/* f->coh.gen, read before a fstat whose look may be taken (c->lock not
 * held). */
uint64_t look_gen(struct cache *c, struct cfile *f)
{
	uint64_t gen;

	pthread_mutex_lock(&c->lock);
	gen = f->coh.gen;
	cache_unlock(c);
	return gen;
}

void look_take_locked(struct cfile *f, const struct stat *st,
			     uint64_t gen)
{
	struct timespec now;

	assert(look_current_locked(f, gen));
	(void)gen;
	clock_gettime(CLOCK_REALTIME, &now);
	f->bsize = st->st_size;
	f->bk_mtime_ns = ts_ns(&st->st_mtim);
	f->bk_ctime_ns = ts_ns(&st->st_ctim);
	f->coh.look_ns = ts_ns(&now);
}

/*
 * A store that keeps whole seconds (MooseFS) cannot show a same-size change
 * made elsewhere in the same second as the file's last change: the look
 * would not differ.  A look taken before that second ended proves nothing
 * (the node's and the store's clocks are taken to be in step), so an open
 * treats it as changed: the clean data goes, and the look is taken again.
 * After a crash the time a look was taken is not known (0): unsettled too.
 */
int look_unsettled_locked(const struct cache *c, const struct cfile *f,
				 const struct stat *st)
{
	uint64_t last = st->st_ctim.tv_sec > st->st_mtim.tv_sec
				? st->st_ctim.tv_sec
				: st->st_mtim.tv_sec;

	assert_held(&c->lock);
	return c->coarse_times && f->coh.look_ns < (last + 1) * 1000000000ull;
}

void coh_bk_begin(struct cache *c, struct cfile *f)
{
	pthread_mutex_lock(&c->lock);
	f->coh.inflight++;
	cache_unlock(c);
}

void coh_bk_done(struct cache *c, struct cfile *f)
{
	pthread_mutex_lock(&c->lock);
	assert(f->coh.inflight > 0);
	f->coh.inflight--;
	f->coh.gen++; /* a fstat before now may predate it (look_take) */
	cache_unlock(c);
	if (c->test_bk_done)
		c->test_bk_done(c, f);
}

int coh_note_look(struct cache *c, struct cfile *f)
{
	struct stat st;
	uint64_t gen;
	int busy;

	pthread_mutex_lock(&c->lock);
	gen = ++f->coh.gen;
	busy = f->coh.inflight;
	cache_unlock(c);
	cache_may_block(c);
	if (busy)
		return 0; /* the change under way notes the look when done */
	if (fstat(f->fd, &st))
		return -errno;
	if (c->test_look_fstat)
		c->test_look_fstat(c, f);
	pthread_mutex_lock(&c->lock);
	if (look_current_locked(f, gen))
		look_take_locked(f, &st, gen);
	cache_unlock(c);
	return 0;
}

int coh_bk_end(struct cache *c, struct cfile *f)
{
	coh_bk_done(c, f);
	return coh_note_look(c, f);
}

/* The ctime a change through the mount gives the file (c->lock held). */
void coh_ctime_now_locked(struct cfile *f, const struct timespec *now)
{
	f->ctime = *now;
	f->ctime_set = 1;
}
