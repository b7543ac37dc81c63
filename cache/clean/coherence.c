/* cache: many nodes over one store — the backing file's look compared
 * at open and before destage, and conflicts resolved. */
#define _GNU_SOURCE
#include "clean.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

/*
 * Close-to-open, as NFS gives it.  Every change this node makes to a backing
 * file (destage, writethrough and writearound writes, truncate, fallocate,
 * and through the mount chmod, chown, times, xattrs, links, renames) ends by
 * noting the file's look: size, mtime, ctime.  A look that differs from the
 * noted one was made elsewhere.  An open compares; so does destage before it
 * writes, and recovery.  Changed elsewhere: with no dirty data the clean
 * cached data goes and the store's size is taken; with dirty data it is a
 * conflict, counted once and resolved by backing.on_conflict.
 */

static int coh_persist(struct cache *c, struct cfile *f);

void cache_file_bk_change_begin(struct cache *c, struct cfile *f)
{
	coh_bk_begin(c, f);
}

int cache_file_bk_change_end(struct cache *c, struct cfile *f)
{
	coh_bk_done(c, f);
	return file_note_backing(c, f);
}

void cache_file_meta_before(int fd, struct stat *before)
{
	if (fstatat(fd, "", before, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW))
		before->st_ino = 0;
}

/*
 * A metadata change through the mount moves the ctime (a utime the mtime
 * too): the new look is ours only if the look just before our call was the
 * one this node left, and the size and the times we did not set stayed.
 * Judged by the look after alone, a change made elsewhere at the same size
 * was taken for ours when the times were set, its stale clean data served
 * and a conflict with dirty data never found (issue 25, finding 5).  A
 * change elsewhere between the fstat before and the one after cannot be
 * told from ours: the window is the call's.  The note bumps f->coh.gen, so
 * that a note's fstat from before it is refused (look_take_locked).
 */
void cache_file_meta_changed(struct cache *c, int fd, int times_set,
			     const struct stat *before)
{
	struct cfile *f;
	struct stat st;

	cache_may_block(c);
	if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) ||
	    !S_ISREG(st.st_mode))
		return;
	pthread_mutex_lock(&c->lock);
	f = file_find(c, st.st_dev, st.st_ino, 1);
	/* the change's ctime is shown, not an older write's */
	if (f && f->ctime_set && ts_ns(&st.st_ctim) > ts_ns(&f->ctime))
		f->ctime = st.st_ctim;
	if (f && !f->coh.inflight && before->st_ino == st.st_ino &&
	    before->st_dev == st.st_dev && !look_differs_locked(f, before) &&
	    st.st_size == before->st_size &&
	    (times_set || ts_ns(&st.st_mtim) == ts_ns(&before->st_mtim))) {
		f->bk_mtime_ns = ts_ns(&st.st_mtim);
		f->bk_ctime_ns = ts_ns(&st.st_ctim);
		f->coh.gen++;
	} else {
		times_set = 0;
	}
	if (!times_set) {
		cache_unlock(c);
		return;
	}
	/* recovery compares the mtime: the record must say it is ours */
	f->refs++;
	cache_unlock(c);
	if (coh_persist(c, f))
		log_msg(LOG_ERR, "cannot persist the record of inode %llu",
			(unsigned long long)f->ino);
	pthread_mutex_lock(&c->lock);
	file_put_locked(c, f);
	cache_unlock(c);
}

/*
 * The attributes the mount shows (st: the store's, rewritten).  Size and
 * mtime: the cache's.  ctime: a write, truncate or fallocate through the
 * cache moves it with the mtime (POSIX), to the time the cache took the
 * change (f->ctime), and destage, which changes the store's ctime again
 * long after with no user operation, must not make it jump: while the
 * store's ctime is the look this node noted after its own last change (or
 * one of its changes is under way), the cache's is shown; a change made
 * since, elsewhere or through the mount (cache_file_meta_changed), shows
 * the later of the two.  Never before the mtime shown.  Once the object is
 * gone (closed and evicted, or after a remount) the store's ctime is shown,
 * destage's time: the README's Limits say so.
 *
 * st_blocks: the store's, plus the dirty pages it does not hold yet (data
 * only in the cache, which tar --sparse and backup tools would take for a
 * hole), but not past the size: a rewrite of blocks the store has counts
 * twice otherwise.  After destage the dirty pages are the store's own.
 */
int cache_file_attr_st(struct cache *c, struct stat *st)
{
	uint64_t blocks, cap, bk;
	struct cfile *f;
	int own;

	pthread_mutex_lock(&c->lock);
	f = file_find(c, st->st_dev, st->st_ino, 0);
	/* clean, and changed elsewhere since: the store's attributes are the
	 * file's (its next open takes them) */
	if (f && !f->ndirty && !f->coh.inflight && look_differs_locked(f, st))
		f = NULL;
	if (!f) {
		cache_unlock(c);
		return -ENOENT;
	}
	st->st_size = f->size;
	if (f->mtime_set)
		st->st_mtim = f->mtime;
	own = f->coh.inflight || ts_ns(&st->st_ctim) == f->bk_ctime_ns;
	if (f->ctime_set && (own || ts_ns(&f->ctime) > ts_ns(&st->st_ctim)))
		st->st_ctim = f->ctime;
	if (ts_ns(&st->st_mtim) > ts_ns(&st->st_ctim))
		st->st_ctim = st->st_mtim;
	bk = st->st_blocks;
	blocks = bk + f->dirty_pages * (NVC_PAGE / 512);
	cap = (f->size + 511) / 512;
	if (blocks > cap)
		blocks = cap > bk ? cap : bk;
	st->st_blocks = blocks;
	cache_unlock(c);
	return 0;
}

/* ------------------------------------------------------------ changes */

/* The backing file's path for the log (or its inode number). */
static void coh_path(const struct cfile *f, char *buf, size_t len)
{
	char proc[64];
	ssize_t n = -1;

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", f->fd);
	if (f->fd >= 0)
		n = readlink(proc, buf, len - 1);
	if (n < 0)
		snprintf(buf, len, "backing inode %llu",
			 (unsigned long long)f->ino);
	else
		buf[n] = 0;
}

static int coh_persist(struct cache *c, struct cfile *f)
{
	int ret = 0;

	pthread_mutex_lock(&f->rec_lock);
	if (f->rec)
		ret = file_persist_record(c, f);
	pthread_mutex_unlock(&f->rec_lock);
	return ret;
}

/*
 * coh_drop_clean forgets every clean page of f: clean slots go, dirty ones
 * keep only their dirty pages (their entries persisted, so that a crash
 * does not bring the forgotten pages back).  f->rw held for writing, so by
 * the pin rule (map.c) no slot of f is pinned.  A pinned one found anyway
 * (a bug: asserted) would keep its old bytes: in a release build the file
 * stays stale, and the next open drops again, rather than the look being
 * taken with old pages kept.
 */
static int coh_drop_clean(struct cache *c, struct cfile *f)
{
	struct cslot **keep = NULL;
	uint64_t n = 0, i;
	struct list *l;
	int ret = 0;

	assert(frw_held(f, 1));
	frw_owe_wgen(f);
	pthread_mutex_lock(&c->lock);
	file_wgen_bump_locked(c, f); /* in the hold that drops (look.c) */
	if (f->ndirty)
		keep = calloc(f->ndirty, sizeof(*keep));
	for (l = f->slots.next; l != &f->slots;) {
		struct cslot *s = list_entry(l, struct cslot, flink);
		uint32_t p, gone = 0;

		l = l->next;
		assert(!s->pins);
		if (s->pins) {
			f->coh.stale = 1;
			continue;
		}
		if (s->state != SLOT_DIRTY) {
			slot_drop_locked(c, s);
			continue;
		}
		for (p = 0; p < c->ppb; p++) {
			if (pb_test(slot_valid(c, s), p) &&
			    !pb_test(slot_dirty(c, s), p)) {
				page_forget_locked(c, s, p);
				gone = 1;
			}
		}
		if (!gone)
			continue;
		if (!keep || n == f->ndirty) {
			ret = -ENOMEM;
			continue;
		}
		slot_pin_locked(c, f, s);
		keep[n++] = s;
	}
	cache_unlock(c);
	for (i = 0; i < n; i++) {
		srw_wrlock(&keep[i]->rw);
		if (slot_persist(c, keep[i]))
			ret = -EIO;
		srw_unlock(&keep[i]->rw);
	}
	pthread_mutex_lock(&c->lock);
	for (i = 0; i < n; i++)
		slot_unpin_locked(c, f, keep[i]);
	cache_unlock(c);
	free(keep);
	return ret;
}

int cache_file_drop_streamed(struct cache *c, struct cfile *f)
{
	int ret = -EBUSY;
	uint64_t n;

	cache_may_block(c);
	file_rw_wrlock(f);
	pthread_mutex_lock(&c->lock);
	/* dirty pages would stay: drop only what leaves it empty */
	if (admit_streamed_locked(c, f) && !f->ndirty && !f->lost)
		ret = 0;
	n = f->nslots;
	cache_unlock(c);
	if (!ret && n)
		ret = coh_drop_clean(c, f);
	frw_unlock(f);
	if (!ret && n)
		CNT_ADD(c, stream_drops, 1);
	return ret;
}

/* Dirty bytes of f (c->lock held). */
static uint64_t dirty_bytes_locked(struct cache *c, struct cfile *f)
{
	uint64_t n = 0;
	struct list *l;

	assert_held(&c->lock);
	for (l = f->slots.next; l != &f->slots; l = l->next)
		n += pb_count(
			c, slot_dirty(c, list_entry(l, struct cslot, flink)));
	return n * NVC_PAGE;
}

/*
 * overwrite: this node's dirty pages go to the store as usual, over what the
 * other node wrote; its clean data (the store's old bytes) goes; a file the
 * other node made longer stays that long.  The new look is taken, so that
 * the conflict is counted once.
 */
static int coh_overwrite(struct cache *c, struct cfile *f,
			 const struct stat *st, uint64_t gen)
{
	int ret = coh_drop_clean(c, f);

	pthread_mutex_lock(&c->lock);
	if ((uint64_t)st->st_size > f->size)
		f->size = st->st_size;
	if (look_current_locked(f, gen)) /* else its change notes it */
		look_take_locked(f, st, gen); /* coh_drop_clean bumped wgen */
	cache_unlock(c);
	return coh_persist(c, f) ? -EIO : ret;
}

/*
 * The directory of the backing file f (opened) and its name in it, opened
 * beneath the backing directory without following links (a user may have
 * put a symlink where a directory of the path was), and checked: the name
 * must still be f's file there.  -EAGAIN: it was renamed meanwhile.
 */
static int coh_dir_of(struct cache *c, struct cfile *f, char *name, size_t len)
{
	char rel[PATH_MAX], *slash;
	struct stat st, at;
	int ret = ident_rel_path(c, f->fd, rel, sizeof(rel)), dirfd;

	if (ret)
		return ret;
	slash = strrchr(rel, '/');
	if (strlen(slash ? slash + 1 : rel) >= len)
		return -ENAMETOOLONG;
	strcpy(name, slash ? slash + 1 : rel);
	if (slash)
		*slash = 0;
	dirfd = ident_open_beneath(c->backing_fd, slash ? rel : ".",
				   O_RDONLY | O_DIRECTORY, 0);
	if (dirfd < 0)
		return dirfd == -ELOOP || dirfd == -EXDEV ? -EAGAIN : dirfd;
	cache_may_block(c);
	if (fstat(f->fd, &st) ||
	    fstatat(dirfd, name, &at, AT_SYMLINK_NOFOLLOW)) {
		ret = errno == ENOENT ? -EAGAIN : -errno;
		goto close_dir;
	}
	if (st.st_dev != at.st_dev || st.st_ino != at.st_ino) {
		ret = -EAGAIN;
		goto close_dir;
	}
	return dirfd;
close_dir:
	close(dirfd);
	return ret;
}

/* This node's name and the time, for a conflict copy's name. */
static void coh_host_time(char *host, size_t len, time_t now, struct tm *tm)
{
	if (gethostname(host, len))
		snprintf(host, len, "localhost");
	host[len - 1] = 0;
	gmtime_r(&now, tm);
}

/*
 * The conflict copy's name: <name>.nvcachefs-conflict-<host>-<UTC time>,
 * then .1, .2 ... when taken; the file's name is cut short rather than the
 * whole going past NAME_MAX.
 */
static void coh_copy_name(char *out, size_t len, const char *name,
			  const char *host, const struct tm *tm, int k)
{
	char tail[NAME_MAX + 1], when[32];
	int keep;

	strftime(when, sizeof(when), "%Y%m%dT%H%M%S", tm);
	if (k)
		snprintf(tail, sizeof(tail), ".nvcachefs-conflict-%s-%s.%d",
			 host, when, k);
	else
		snprintf(tail, sizeof(tail), ".nvcachefs-conflict-%s-%s", host,
			 when);
	keep = NAME_MAX - (int)strlen(tail);
	if (keep < 1)
		keep = 1;
	if (snprintf(out, len, "%.*s%s", keep, name, tail) >= (int)len)
		out[len - 1] = 0;
}

/*
 * keep-both: this node's version goes beside the file — its cached pages,
 * dirty and clean, over the store's bytes where it caches nothing, at its
 * size, durably — and is then forgotten: the file keeps the other node's
 * version, at the store's size.  The copy is the daemon's, mode 0600, like
 * every file it makes for itself (PRODUCT §5): it is made in a directory
 * the file's owner may write, where its name can be swapped for a link
 * the moment it exists, so nothing is done to it by name, and giving it
 * away is for an administrator.  f->rw held for writing.
 */
static int coh_keep_both(struct cache *c, struct cfile *f,
			 const struct stat *st, uint64_t gen, const char *path)
{
	char name[NAME_MAX + 1], copy[NAME_MAX + 1], host[64];
	uint64_t dirty;
	struct tm tm;
	time_t now = time(NULL);
	int dirfd, k, ret = -EEXIST;

	dirfd = coh_dir_of(c, f, name, sizeof(name));
	if (dirfd < 0)
		return dirfd;
	coh_host_time(host, sizeof(host), now, &tm);
	for (k = 0; k < 1000 && ret == -EEXIST; k++) {
		coh_copy_name(copy, sizeof(copy), name, host, &tm, k);
		ret = salvage_copy(c, f, f->fd, dirfd, copy, &dirty);
	}
	if (!ret)
		log_msg(LOG_WARNING,
			"conflict: this node's version of %s (%llu dirty "
			"bytes) is kept as %s (the daemon's, mode 0600)",
			path, (unsigned long long)dirty, copy);
	close(dirfd);
	if (ret)
		return ret;
	salvage_drop(c, f);
	pthread_mutex_lock(&c->lock);
	f->size = st->st_size;
	f->mtime_set = 0;
	file_wgen_bump_locked(c, f);
	if (look_current_locked(f, gen))
		look_take_locked(f, st, gen);
	cache_unlock(c);
	return coh_persist(c, f);
}

/*
 * f has dirty data and its backing file was changed elsewhere (st: its look
 * now).  Counted and logged once, resolved by backing.on_conflict; a
 * resolution that fails (keep-both could not write the copy) leaves the data
 * dirty, and the next destage or open tries again.  f->rw held for writing.
 */
static void coh_conflict_note(struct cache *c, struct cfile *f,
			      const struct stat *st, const char *when,
			      const char *path, int keep)
{
	uint64_t dirty;
	int counted;

	pthread_mutex_lock(&c->lock);
	counted = f->coh.conflict;
	f->coh.conflict = 1;
	dirty = dirty_bytes_locked(c, f);
	cache_unlock(c);
	if (!counted) {
		CNT_ADD(c, conflicts, 1);
		log_msg(LOG_WARNING,
			"conflict (%s): %s was changed elsewhere (now %llu "
			"bytes) while this node holds %llu dirty bytes of it "
			"(size %llu); backing.on_conflict = %s: %s",
			when, path, (unsigned long long)st->st_size,
			(unsigned long long)dirty, (unsigned long long)f->size,
			keep ? "keep-both" : "overwrite",
			keep ? "this node's version goes beside it, the file "
			       "keeps the other one"
			     : "this node's dirty pages overwrite the store's");
	}
}

static int coh_conflict(struct cache *c, struct cfile *f, const struct stat *st,
			uint64_t gen, const char *when)
{
	int keep = __atomic_load_n(&c->cfg->on_conflict, __ATOMIC_RELAXED) ==
		   CONFLICT_KEEP_BOTH;
	char path[PATH_MAX];
	int ret;

	coh_path(f, path, sizeof(path));
	coh_conflict_note(c, f, st, when, path, keep);
	ret = keep ? coh_keep_both(c, f, st, gen, path)
		   : coh_overwrite(c, f, st, gen);
	if (ret) {
		log_msg(LOG_ERR,
			"conflict (%s): %s: cannot resolve it: %s; the data "
			"stays dirty and it is tried again",
			when, path, strerror(-ret));
		return ret;
	}
	pthread_mutex_lock(&c->lock);
	f->coh.conflict = 0;
	f->coh.kinval = 1;
	cache_unlock(c);
	return 0;
}

/*
 * f->rw held for writing: if the backing file's look is not the one this
 * node left, it was changed elsewhere.  *changed says whether it was.
 */
static int coh_settle(struct cache *c, struct cfile *f, const char *when,
		      int *changed)
{
	uint64_t ndirty, gen = look_gen(c, f);
	struct stat st;
	int differs, stale, unsettled, ret;

	cache_may_block(c);
	if (fstat(f->fd, &st))
		return -errno;
	pthread_mutex_lock(&c->lock);
	/* an own change not under f->rw (the identity stamp) notes the look
	 * when it is done */
	differs = look_differs_locked(f, &st) && !f->coh.inflight;
	ndirty = f->ndirty;
	stale = f->coh.stale;
	f->coh.stale = 0;
	unsettled = !f->coh.inflight && look_unsettled_locked(c, f, &st);
	cache_unlock(c);
	if (!differs && (stale || unsettled)) {
		/* a conflict resolved without the lock left clean data, or a
		 * change elsewhere could hide in the same second */
		*changed = COH_CHANGED;
		ret = coh_drop_clean(c, f);
		if (unsettled) {
			pthread_mutex_lock(&c->lock);
			if (look_current_locked(f, gen))
				look_take_locked(f, &st, gen);
			cache_unlock(c);
		}
		return ret;
	}
	if (!differs)
		return 0;
	*changed = COH_CHANGED;
	if (ndirty)
		return coh_conflict(c, f, &st, gen, when);
	ret = coh_drop_clean(c, f);
	pthread_mutex_lock(&c->lock);
	f->size = st.st_size;
	f->mtime_set = 0;
	if (look_current_locked(f, gen)) /* else its change notes it */
		look_take_locked(f, &st, gen); /* coh_drop_clean bumped wgen */
	cache_unlock(c);
	CNT_ADD(c, revalidate_drops, 1);
	if (!ret)
		ret = coh_persist(c, f);
	return ret;
}

int cache_file_revalidate(struct cache *c, struct cfile *f,
			  const struct stat *seen, int *changed)
{
	struct stat st;
	int first, differs, kinval, ret = 0;

	*changed = COH_UNCHANGED;
	cache_may_block(c);
	/* what was read ahead before this open is not served after it */
	bks_changed(f);
	if (seen)
		st = *seen; /* a change since is found by the slow path */
	else if (fstat(f->fd, &st))
		return -errno;
	pthread_mutex_lock(&c->lock);
	first = !f->coh.opened;
	f->coh.opened = 1;
	kinval = f->coh.kinval;
	f->coh.kinval = 0;
	differs = look_differs_locked(f, &st) || f->coh.stale ||
		  look_unsettled_locked(c, f, &st);
	cache_unlock(c);
	if (differs) {
		/* own changes under way end before the write lock is had */
		file_rw_wrlock(f);
		ret = coh_settle(c, f, "open", changed);
		frw_unlock(f);
	}
	if (*changed == COH_UNCHANGED && kinval)
		*changed = COH_CHANGED;
	if (*changed == COH_UNCHANGED && first)
		*changed = COH_FRESH;
	return ret;
}

/* f->rw for writing, if it comes within COH_LOCK_WAIT_MS: 0, or -errno. */
#define COH_LOCK_WAIT_MS 200
static int coh_wrlock_timed(struct cfile *f)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += COH_LOCK_WAIT_MS * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return file_rw_timedwrlock(f, &ts);
}

/*
 * The other node's version, as the store holds it now, copied beside the
 * file under a conflict name (f->fd open; nothing of the cache is read);
 * the daemon's, mode 0600, as coh_keep_both's.
 */
static int coh_copy_theirs(struct cache *c, struct cfile *f, const char *path)
{
	char name[NAME_MAX + 1], copy[NAME_MAX + 1], host[64];
	time_t now = time(NULL);
	int dirfd, dfd = -1, k, ret = 0;
	struct tm tm;
	char *buf = NULL;
	off_t off = 0;
	ssize_t n;

	dirfd = coh_dir_of(c, f, name, sizeof(name));
	if (dirfd < 0)
		return dirfd;
	coh_host_time(host, sizeof(host), now, &tm);
	for (k = 0; k < 1000 && dfd < 0; k++) {
		coh_copy_name(copy, sizeof(copy), name, host, &tm, k);
		cache_may_block(c);
		dfd = openat(dirfd, copy,
			     O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
				     O_CLOEXEC,
			     0600);
		if (dfd < 0 && errno != EEXIST) {
			ret = -errno;
			goto out_dir;
		}
	}
	buf = malloc(1024 * 1024);
	if (dfd < 0 || !buf) {
		ret = dfd < 0 ? -EEXIST : -ENOMEM;
		goto out_file;
	}
	cache_may_block(c);
	while ((n = pread(f->fd, buf, 1024 * 1024, off)) > 0) {
		cache_may_block(c);
		if (pwrite(dfd, buf, n, off) != n) {
			ret = errno ? -errno : -EIO;
			goto out_file;
		}
		off += n;
	}
	cache_may_block(c);
	if (n < 0 || fsync(dfd) || fsync(dirfd)) {
		ret = -errno;
		goto out_file;
	}
	log_msg(LOG_WARNING,
		"conflict: writes to %s are waiting on this node: the other "
		"node's version is kept as %s (the daemon's, mode 0600), and "
		"this node's goes to the file",
		path, copy);
out_file:
	if (dfd >= 0) {
		if (ret)
			salvage_unlink_own(dirfd, copy, dfd);
		close(dfd);
	}
	free(buf);
out_dir:
	close(dirfd);
	return ret;
}

/*
 * A change elsewhere found by a destage that could not have the file's lock:
 * writes to it are under way on this node, maybe waiting for cache space
 * that only this destage can make.  The destage goes on (overwrite); with
 * keep-both, the other node's version is copied beside the file first.  The
 * clean data goes at the next open or destage that has the lock (stale).
 */
static int coh_conflict_busy(struct cache *c, struct cfile *f)
{
	int keep = __atomic_load_n(&c->cfg->on_conflict, __ATOMIC_RELAXED) ==
		   CONFLICT_KEEP_BOTH;
	uint64_t gen = look_gen(c, f);
	char path[PATH_MAX];
	struct stat st;
	int ret;

	cache_may_block(c);
	if (fstat(f->fd, &st))
		return -errno;
	coh_path(f, path, sizeof(path));
	coh_conflict_note(c, f, &st, "destage, writes under way", path, keep);
	ret = keep ? coh_copy_theirs(c, f, path) : 0;
	if (ret) {
		log_msg(LOG_ERR,
			"conflict (destage): %s: cannot copy the other node's "
			"version: %s; the data stays dirty and it is tried "
			"again",
			path, strerror(-ret));
		return ret;
	}
	pthread_mutex_lock(&c->lock);
	if ((uint64_t)st.st_size > f->size)
		f->size = st.st_size;
	if (look_current_locked(f, gen)) /* else a write under way notes it */
		look_take_locked(f, &st, gen);
	f->coh.conflict = 0;
	f->coh.stale = 1;
	f->coh.kinval = 1;
	cache_unlock(c);
	return coh_persist(c, f);
}

int coh_destage_check(struct cache *c, struct cfile *f)
{
	struct stat st;
	int differs, changed = COH_UNCHANGED, ret;

	cache_may_block(c);
	if (fstat(f->fd, &st))
		return -errno;
	pthread_mutex_lock(&c->lock);
	differs = look_differs_locked(f, &st);
	cache_unlock(c);
	if (!differs)
		return 0;
	if (coh_wrlock_timed(f))
		return coh_conflict_busy(c, f);
	ret = coh_settle(c, f, "destage", &changed);
	frw_unlock(f);
	if (changed != COH_UNCHANGED) {
		pthread_mutex_lock(&c->lock);
		f->coh.kinval = 1;
		cache_unlock(c);
	}
	return ret;
}

void coh_recovery_conflict(struct cache *c, struct cfile *f,
			   const struct stat *st)
{
	assert(frw_held(f, 1)); /* file_check_backing's caller's */
	/* at mount nothing else changes the file: st is current */
	coh_conflict(c, f, st, look_gen(c, f), "recovery");
}
