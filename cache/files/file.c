/* cache: file objects — lookup by inode, persistent records, descriptors of
 * idle files. */
#define _GNU_SOURCE
#include "files_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <syslog.h>
#include <unistd.h>
#include <xxhash.h>

/* ---------------------------------------------------------------- files */

static uint64_t file_key(dev_t dev, ino_t ino)
{
	uint64_t k[2] = { dev, ino };

	return XXH3_64bits(k, sizeof(k));
}

/*
 * The file object of (dev, ino).  One whose backing file lost its last link
 * stays hashed while references to it remain (an open file still reads,
 * writes and shows its size), but an open by name never finds it again: a
 * new file may get the same inode number, and must get a new object
 * (live_only).  Otherwise a live object is preferred.
 */
struct cfile *file_find(struct cache *c, dev_t dev, ino_t ino, int live_only)
{
	struct cfile *f, *dead = NULL;

	for (f = c->fhash[file_key(dev, ino) & c->fmask]; f; f = f->hnext) {
		if (f->dev != dev || f->ino != ino || f->lost)
			continue;
		if (!f->unlinked)
			return f;
		dead = dead ? dead : f;
	}
	return live_only ? NULL : dead;
}

void file_hash_add(struct cache *c, struct cfile *f)
{
	struct cfile **b = &c->fhash[file_key(f->dev, f->ino) & c->fmask];

	f->hnext = *b;
	*b = f;
}

static void file_hash_del(struct cache *c, struct cfile *f)
{
	struct cfile **p = &c->fhash[file_key(f->dev, f->ino) & c->fmask];

	while (*p && *p != f)
		p = &(*p)->hnext;
	if (*p)
		*p = f->hnext;
}

/* f->rw and its gate for requests (engine.h, struct cfile) */
static void gate_wait(uint32_t *w, uint32_t v)
{
	/* EAGAIN (it changed) and EINTR: the caller looks again */
	syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void gate_leave(struct cfile *f)
{
	if (!__atomic_sub_fetch(&f->rw_writers, 1, __ATOMIC_SEQ_CST))
		syscall(SYS_futex, &f->rw_writers, FUTEX_WAKE_PRIVATE, INT_MAX,
			NULL, NULL, 0);
}

void file_rw_wrlock(struct cfile *f)
{
	__atomic_add_fetch(&f->rw_writers, 1, __ATOMIC_SEQ_CST);
	frw_wrlock(f);
	gate_leave(f);
}

int file_rw_timedwrlock(struct cfile *f, const struct timespec *abs)
{
	int ret;

	__atomic_add_fetch(&f->rw_writers, 1, __ATOMIC_SEQ_CST);
	ret = frw_timedwrlock(f, abs);
	gate_leave(f);
	return ret;
}

void file_rw_rdlock_req(struct cfile *f)
{
	uint32_t w;

	while ((w = __atomic_load_n(&f->rw_writers, __ATOMIC_SEQ_CST)))
		gate_wait(&f->rw_writers, w);
	frw_rdlock(f);
}

int file_rw_tryrdlock_req(struct cfile *f)
{
	if (__atomic_load_n(&f->rw_writers, __ATOMIC_SEQ_CST))
		return -EBUSY;
	return frw_tryrdlock(f);
}

struct cfile *file_new(void)
{
	struct cfile *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->fd = -1;
	/* no policy yet: the global keys (fpolicy.c) */
	f->pol.mode = -1;
	f->pol.prio = PRIO_NORMAL;
	f->pol.age_ms = POL_AGE_GLOBAL;
	list_init(&f->slots);
	list_init(&f->dlink);
	list_init(&f->plink);
	pthread_rwlock_init(&f->rw, NULL);
	pthread_mutex_init(&f->rec_lock, NULL);
	return f;
}

/* bks_detach waits for reads of the store in flight: never under c->lock
 * (engine.h; file_detach_stream_locked) */
static void file_bks_detach(struct cache *c, struct cfile *f)
{
	assert(!__atomic_load_n(&f->bks, __ATOMIC_RELAXED) ||
	       !cache_lock_mine(c));
	bks_detach(c, f);
}

static void file_free(struct cache *c, struct cfile *f)
{
	file_bks_detach(c, f);
	if (f->fd >= 0)
		close(f->fd);
	pthread_rwlock_destroy(&f->rw);
	pthread_mutex_destroy(&f->rec_lock);
	free(f->path);
	free(f);
}

static void file_fill_record(struct cfile *f, struct meta_file *r)
{
	memset(r, 0, sizeof(*r));
	r->flags = MF_USED | (f->bk_busy ? MF_BK_BUSY : 0) |
		   (f->pinned ? MF_PINNED : 0) |
		   (f->unlinked ? MF_UNLINKED : 0);
	r->ino = f->ino;
	r->size = f->size;
	r->bk_size = f->bsize;
	r->bk_mtime_ns = f->bk_mtime_ns;
	r->bk_ctime_ns = f->bk_ctime_ns;
	r->handle_bytes = f->hbytes;
	r->handle_type = f->htype;
	memcpy(r->handle, f->handle, f->hbytes);
	memcpy(r->stamp, f->stamp, sizeof(r->stamp));
	if (f->path) {
		r->path_len = strlen(f->path);
		memcpy(r->path, f->path, r->path_len + 1);
	}
}

/*
 * Say on the media, before the cache changes the backing file, that it is
 * doing so (busy), and after the change is durable and noted, that it is
 * done: a crash in between leaves a backing mtime that the cache itself
 * moved, which recovery must not take for a change behind its back.
 */
int file_bk_busy(struct cache *c, struct cfile *f, int busy)
{
	int ret = 0;

	pthread_mutex_lock(&f->rec_lock);
	if (f->bk_busy != busy) {
		f->bk_busy = busy;
		ret = f->rec ? file_persist_record(c, f) : 0;
	}
	pthread_mutex_unlock(&f->rec_lock);
	return ret;
}

/*
 * Do the mirrors hold r already?  Every put of f's record happens under
 * f->rec_lock (held here), and a mirror whose write failed is dropped, so
 * the newest valid copy meta_get_file finds is what every mirror still in
 * use holds, durably: persisting the same fields again would change no
 * byte that recovery reads (the sequence number only orders the two
 * mirrors' copies).  A mirror with a damaged copy is rewritten.
 */
static int file_record_held(struct cache *c, const struct cfile *f,
			    const struct meta_file *r)
{
	struct meta_file now;
	int bad;

	if (!meta_get_file(&c->meta, f->rec - 1, &now, &bad) || bad ||
	    !(now.flags & MF_USED))
		return 0;
	return !memcmp((const char *)&now + offsetof(struct meta_file, ino),
		       (const char *)r + offsetof(struct meta_file, ino),
		       offsetof(struct meta_file, csum) -
			       offsetof(struct meta_file, ino));
}

/*
 * Persist the file's record; the caller holds f->rec_lock.  A record the
 * mirrors hold already is not written again: the release of a file just
 * written (file_idle_fd_locked) would otherwise persist, per small file, the
 * record its write persisted a moment before (two msyncs, or two FUA writes
 * on block-device mirrors).
 */
int file_persist_record(struct cache *c, struct cfile *f)
{
	struct meta_file r;
	int ret;

	pthread_mutex_lock(&c->lock);
	file_fill_record(f, &r);
	cache_unlock(c);
	if (file_record_held(c, f, &r)) {
		__atomic_store_n(&f->psize, r.size, __ATOMIC_RELEASE);
		return 0;
	}
	ret = meta_put_file(&c->meta, f->rec - 1, &r);
	if (!ret)
		__atomic_store_n(&f->psize, r.size, __ATOMIC_RELEASE);
	return ret;
}

/*
 * A write that ends at end is acknowledged only once the persisted size
 * covers it.  Another writer may have raised the size in memory and not yet
 * persisted it: the first to get here persists the size as it is now, which
 * covers both.
 */
int file_persist_size(struct cache *c, struct cfile *f, uint64_t end)
{
	int ret = 0;

	if (__atomic_load_n(&f->psize, __ATOMIC_ACQUIRE) >= end)
		return 0;
	pthread_mutex_lock(&f->rec_lock);
	if (f->rec && __atomic_load_n(&f->psize, __ATOMIC_ACQUIRE) < end)
		ret = file_persist_record(c, f);
	pthread_mutex_unlock(&f->rec_lock);
	return ret;
}

/*
 * The daemon itself changed the backing file (truncate, fallocate): note its
 * new size and mtime, so that recovery does not take our own change for one
 * made behind the cache's back.
 */
int file_note_backing_stat(struct cache *c, struct cfile *f)
{
	return coh_note_look(c, f);
}

int file_note_backing(struct cache *c, struct cfile *f)
{
	int ret = file_note_backing_stat(c, f);

	if (ret)
		return ret;
	if (f->rec) {
		pthread_mutex_lock(&f->rec_lock);
		ret = file_persist_record(c, f);
		pthread_mutex_unlock(&f->rec_lock);
	}
	return ret;
}

/* Drop every slot of a file whose data is no longer wanted.  c->lock held. */
static void file_drop_slots_locked(struct cache *c, struct cfile *f)
{
	assert_held(&c->lock);
	while (!list_empty(&f->slots)) {
		struct cslot *s =
			list_entry(f->slots.next, struct cslot, flink);

		slot_drop_locked(c, s);
	}
}

/* Drop a reference; forget the file when nobody uses it and it has no data. */
void file_put_locked(struct cache *c, struct cfile *f)
{
	assert_held(&c->lock);
	if (--f->refs)
		return;
	/* a closed file's clean slots, and so its record, can be taken */
	space_freed_locked(c);
	if (f->unlinked || f->lost)
		file_unpin_locked(c, f); /* a deleted file gives its pin back */
	if (f->unlinked)
		file_drop_slots_locked(c, f);
	/* a pinned file keeps its object and record, even with no slot */
	if (f->nslots || f->pinned)
		return;
	assert(!f->dirty_pages); /* counted in its slots, which are gone */
	if (f->rec) {
		c->recs[f->rec - 1] = NULL;
		/* a record the media may still hold is not handed out again:
		 * zeroed on the media after its slots' free entries, by the
		 * free queue (map.c, "Free entries") */
		freeq_rec_locked(c, f->rec - 1);
		f->rec = 0;
	}
	file_hash_del(c, f);
	file_free(c, f);
}

static int file_reopen(struct cache *c, struct cfile *f, int fd);
static int file_take_fd(struct cache *c, struct cfile *f, int nfd, int ro);

struct handle {
	struct file_handle fh;
	uint8_t buf[META_HANDLE_MAX];
};

static int same_handle(const struct cfile *f, const struct handle *h)
{
	return f->hbytes == h->fh.handle_bytes &&
	       f->htype == h->fh.handle_type &&
	       !memcmp(f->handle, h->fh.f_handle, f->hbytes);
}

/*
 * A file that could not be opened at mount got a descriptor: check its
 * backing file now, as recovery would have, before anything is served.
 */
void file_late_check(struct cache *c, struct cfile *f)
{
	frw_wrlock(f);
	if (f->bk_missing && f->fd >= 0) {
		c->check_backing(c, f);
		__atomic_store_n(&f->bk_missing, 0, __ATOMIC_RELEASE);
		log_msg(LOG_NOTICE,
			"backing file (inode %llu) opened at last; its cached "
			"data is served and destaged again",
			(unsigned long long)f->ino);
	}
	frw_unlock(f);
}

/*
 * A second open of a file whose last name is gone, while it is still open
 * (by handle, open_by_handle_at through the mount, or /proc/self/fd/N;
 * xfstests generic/467): the object that holds it, with its dirty data and
 * size, not a new one that would see the store's empty file.  It is the
 * same inode for sure: the object's descriptor keeps the inode alive, so
 * its number cannot belong to another file, and with handles the handle
 * (its generation) must match too.  A new file never has nlink 0 (st: the
 * inode being opened, nlink 0).  c->lock held.
 */
static struct cfile *file_find_open_unlinked(struct cache *c,
					     const struct stat *st,
					     const struct handle *h)
{
	struct cfile *f;

	for (f = c->fhash[file_key(st->st_dev, st->st_ino) & c->fmask]; f;
	     f = f->hnext)
		if (f->dev == st->st_dev && f->ino == st->st_ino &&
		    f->unlinked && !f->lost && f->fd >= 0 &&
		    (c->by_path || same_handle(f, h)))
			return f;
	return NULL;
}

/*
 * The known object of (dev, ino), if it is the same file (the handle carries
 * the inode's generation), referenced.  Another file with a recycled inode
 * number means the old one is gone behind the cache's back: that object is
 * returned with *stale set, for file_stale.  Found by path, the handle plays
 * no part (a record made while files were found by handle keeps one): the
 * identity stamp decides (file_get).  c->lock held.
 */
static struct cfile *file_lookup_locked(struct cache *c, const struct stat *st,
					const struct handle *h, int *stale)
{
	struct cfile *f = file_find(c, st->st_dev, st->st_ino, 1);

	assert_held(&c->lock);
	if (!f && st->st_nlink == 0)
		f = file_find_open_unlinked(c, st, h);

	*stale = f && !c->by_path && !same_handle(f, h);
	if (f)
		f->refs++;
	return f;
}

/*
 * The object f (referenced) is not the backing file it was taken for: its
 * file cannot be found.  Its dirty data goes to lost+found, and it is never
 * found again; the reference is dropped.
 */
static void file_stale(struct cache *c, struct cfile *f)
{
	int fd, saved;

	frw_wrlock(f);
	log_msg(LOG_WARNING,
		"%s: inode %llu is not the file the cache knew as %s",
		c->root, (unsigned long long)f->ino,
		f->path ? f->path : "(no path)");
	saved = !salvage_lost(c, f);
	/* either way it is never found by inode again; unsaved, it keeps
	 * its data for destage to save (destage_lost) */
	pthread_mutex_lock(&c->lock);
	if (saved)
		f->unlinked = 1;
	else
		f->lost = 1;
	fd = f->fd;
	f->fd = -1;
	cache_unlock(c);
	frw_unlock(f);
	if (fd >= 0)
		close(fd);
	cache_file_put(c, f);
}

int cache_file_get(struct cache *c, int fd, struct cfile **out)
{
	return cache_file_get_st(c, fd, out, NULL);
}

/* A descriptor for a new object's backing file, from fd (O_PATH): read and
 * write if it can be had, else read only (f->ro). */
static int file_open_rw(struct cfile *f, int fd)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	f->fd = open(path, O_RDWR | O_CLOEXEC);
	if (f->fd < 0 && (errno == EROFS || errno == EACCES || errno == EPERM ||
			  errno == ETXTBSY)) {
		f->fd = open(path, O_RDONLY | O_CLOEXEC);
		f->ro = 1;
	}
	return f->fd < 0 ? -errno : 0;
}

static int file_get(struct cache *c, int fd, int rwfd, const struct stat *stp,
		    struct cfile **out);

int cache_file_get_st(struct cache *c, int fd, struct cfile **out,
		      struct stat *stp)
{
	struct stat st;

	cache_may_block(c);
	if (fstat(fd, &st))
		return -errno;
	if (stp)
		*stp = st; /* for the revalidation at open */
	return file_get(c, fd, -1, &st, out);
}

int cache_file_get_new(struct cache *c, int fd, int rwfd, const struct stat *st,
		       struct cfile **out)
{
	return file_get(c, fd, rwfd, st, out);
}

/*
 * cache_file_get with the backing file's attributes *stp; rwfd, if not -1, is
 * a descriptor of a file this daemon has just created, open for reading and
 * writing, which a new object takes (it is closed otherwise): no open of the
 * backing file, and no look for an identity stamp it cannot have yet.
 */
static int file_get(struct cache *c, int fd, int rwfd, const struct stat *stp,
		    struct cfile **out)
{
	struct handle h;
	struct cfile *f, *other;
	struct stat st = *stp;
	int mnt, ret, stale;

	if (!S_ISREG(st.st_mode)) {
		ret = -EINVAL;
		goto err_close;
	}
	h.fh.handle_bytes = META_HANDLE_MAX;
	if (c->by_path) {
		/* found by path: the handle plays no part */
		h.fh.handle_bytes = 0;
		h.fh.handle_type = 0;
	} else if (name_to_handle_at(rwfd >= 0 ? rwfd : fd, "", &h.fh, &mnt,
				     AT_EMPTY_PATH)) {
		ret = errno == EOVERFLOW ? -ENOTSUP : -errno;
		log_msg(LOG_ERR,
			"backing file system cannot give file handles (%s): it "
			"cannot be cached",
			strerror(-ret));
		goto err_close;
	}
again:
	pthread_mutex_lock(&c->lock);
	f = file_lookup_locked(c, &st, &h, &stale);
	cache_unlock(c);
	if (stale) {
		file_stale(c, f);
		goto again;
	}
	if (f)
		goto found;

	f = file_new();
	if (!f) {
		ret = -ENOMEM;
		goto err_close;
	}
	f->dev = st.st_dev;
	f->ino = st.st_ino;
	f->size = st.st_size;
	file_bsize_found(f, st.st_size);
	f->bk_mtime_ns = ts_ns(&st.st_mtim);
	f->bk_ctime_ns = ts_ns(&st.st_ctim);
	f->refs = 1;
	f->bk_wgen = 1; /* its existence: not known to be durable yet */
	if (rwfd >= 0) {
		f->fd = rwfd; /* the object owns it now */
		f->created = 1;
		rwfd = -1;
	} else {
		ret = file_open_rw(f, fd);
		if (ret)
			goto err_free;
	}
	f->hbytes = h.fh.handle_bytes;
	f->htype = h.fh.handle_type;
	memcpy(f->handle, h.fh.f_handle, f->hbytes);

	pthread_mutex_lock(&c->lock);
	other = file_lookup_locked(c, &st, &h, &stale);
	if (stale) {
		cache_unlock(c);
		file_free(c, f);
		file_stale(c, other);
		goto again;
	}
	if (other) {
		/* another open made it meanwhile */
		cache_unlock(c);
		file_free(c, f);
		f = other;
		goto found;
	}
	file_hash_add(c, f);
	detach_file_born_locked(c, f);
	cache_unlock(c);
	*out = f;
	return 0;
found:
	if (f->fd < 0 && rwfd >= 0) {
		/* the descriptor of the file just created serves as one opened
		 * again would, checked first: if f is another file, rwfd is
		 * still this call's for the new object */
		ret = c->by_path ? ident_verify(c, f, rwfd) : 0;
		if (!ret) {
			file_take_fd(c, f, rwfd, 0);
			rwfd = -1;
		}
	} else if (f->fd < 0) {
		ret = file_reopen(c, f, fd);
		if (!ret && c->by_path)
			ret = ident_verify(c, f, f->fd);
	} else {
		ret = 0;
	}
	if (ret == -ESTALE) {
		/* the same inode number, another file */
		file_stale(c, f);
		goto again;
	}
	if (ret) {
		cache_file_put(c, f);
		goto err_close;
	}
	if (rwfd >= 0)
		close(rwfd);
	if (__atomic_load_n(&f->bk_missing, __ATOMIC_ACQUIRE))
		file_late_check(c, f);
	*out = f;
	return 0;
err_free:
	file_free(c, f);
err_close:
	if (rwfd >= 0)
		close(rwfd);
	return ret;
}

/*
 * A file nobody has open keeps its cached blocks but not its backing
 * descriptor: a cache of many small files would otherwise hold one descriptor
 * per file and run the daemon out of them.  Its record is persisted first,
 * with the look of its backing file (size, mtime, ctime) as this node last
 * changed it, for the check at the next open or mount; the descriptor
 * comes back with the next open, or by the file's handle for destage.
 */
static int file_idle(const struct cfile *f)
{
	return f->refs == 1 && !f->destaging && !f->unlinked && f->fd >= 0 &&
	       f->nslots;
}

/*
 * With c->lock held and one reference on f (about to be put): if f is idle,
 * persist its record (with the look noted at this node's last change) and
 * take its descriptor away; c->lock is dropped meanwhile.  Returns the
 * descriptor to close, or -1.
 */
int file_idle_fd_locked(struct cache *c, struct cfile *f)
{
	int ok, fd = -1;

	assert_held(&c->lock);
again:
	if (!file_idle(f))
		return -1;
	/* its stream's descriptor came from f->fd: it goes first */
	if (file_detach_stream_locked(c, f))
		goto again;
	cache_unlock(c);
	/* the look noted at this node's last change, not the backing file's
	 * now: a change made elsewhere meanwhile is found at the next open */
	pthread_mutex_lock(&f->rec_lock);
	ok = !f->rec || !file_persist_record(c, f);
	pthread_mutex_unlock(&f->rec_lock);
	pthread_mutex_lock(&c->lock);
	if (ok && file_idle(f) && !__atomic_load_n(&f->bks, __ATOMIC_RELAXED)) {
		fd = f->fd;
		f->fd = -1;
		f->ro = 0; /* the next descriptor says */
	}
	return fd;
}

/*
 * With c->lock held and one reference on f: if it is the last one and f has
 * a direct read stream (bkstream.c), detach the stream, which waits for its
 * reads of the store in flight, with c->lock dropped (engine.h) and f->rw
 * held for writing (bks_read runs under f->rw held for reading).  1 if
 * c->lock was dropped, when the caller looks at f again.
 */
int file_detach_stream_locked(struct cache *c, struct cfile *f)
{
	int dropped = 0;

	assert_held(&c->lock);
	while (f->refs == 1 && __atomic_load_n(&f->bks, __ATOMIC_RELAXED)) {
		cache_unlock(c);
		file_rw_wrlock(f);
		file_bks_detach(c, f);
		frw_unlock(f);
		pthread_mutex_lock(&c->lock);
		dropped = 1;
	}
	return dropped;
}

void cache_file_put(struct cache *c, struct cfile *f)
{
	int fd;

	pthread_mutex_lock(&c->lock);
	fd = file_idle_fd_locked(c, f);
	file_detach_stream_locked(c, f);
	file_put_locked(c, f);
	cache_unlock(c);
	if (fd >= 0)
		close(fd);
}

/*
 * A descriptor for the destage of a file nobody has open (f referenced), by
 * handle or by path, verified (ident.c); -ESTALE: the file cannot be found.
 */
int file_reopen_ident(struct cache *c, struct cfile *f)
{
	int fd = ident_open(c, f, O_RDWR);

	if (fd < 0)
		return fd;
	pthread_mutex_lock(&c->lock);
	if (f->fd < 0) {
		f->fd = fd;
		f->ro = 0;
		fd = -1;
	}
	cache_unlock(c);
	if (fd >= 0)
		close(fd);
	return 0;
}

/* Give f the descriptor nfd (read-only: ro) unless it has one meanwhile;
 * nfd is taken or closed. */
static int file_take_fd(struct cache *c, struct cfile *f, int nfd, int ro)
{
	pthread_mutex_lock(&c->lock);
	if (f->fd < 0) {
		f->fd = nfd;
		f->ro = ro;
		nfd = -1;
	}
	cache_unlock(c);
	if (nfd >= 0)
		close(nfd);
	return 0;
}

/* Give a file found without a descriptor one again, from the caller's fd. */
static int file_reopen(struct cache *c, struct cfile *f, int fd)
{
	char path[64];
	int nfd, ro = 0;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	nfd = open(path, O_RDWR | O_CLOEXEC);
	if (nfd < 0 && (errno == EROFS || errno == EACCES || errno == EPERM ||
			errno == ETXTBSY)) {
		nfd = open(path, O_RDONLY | O_CLOEXEC);
		ro = 1;
	}
	if (nfd < 0)
		return -errno;
	return file_take_fd(c, f, nfd, ro);
}

int cache_file_readonly(const struct cfile *f)
{
	return f->ro;
}

int cache_file_attr(struct cache *c, dev_t dev, ino_t ino, uint64_t *size,
		    struct timespec *mtime)
{
	struct cfile *f;
	int ret = -ENOENT;

	pthread_mutex_lock(&c->lock);
	f = file_find(c, dev, ino, 0);
	if (f) {
		*size = f->size;
		if (mtime && f->mtime_set)
			*mtime = f->mtime;
		else if (mtime)
			mtime->tv_nsec = UTIME_OMIT;
		ret = 0;
	}
	cache_unlock(c);
	return ret;
}

void cache_file_times_set(struct cache *c, dev_t dev, ino_t ino)
{
	struct cfile *f;

	pthread_mutex_lock(&c->lock);
	f = file_find(c, dev, ino, 0);
	if (f)
		f->mtime_set = 0;
	cache_unlock(c);
}

/*
 * The backing file of an idle f has no link left: by handle, its inode says
 * so; by path, the name just removed through the mount was its last link
 * (nlink before the removal).
 */
static int file_gone(struct cache *c, struct cfile *f, nlink_t nlink)
{
	struct stat st;
	int fd, gone;

	if (c->by_path)
		return nlink <= 1;
	fd = ident_open(c, f, O_PATH);
	if (fd < 0)
		return fd == -ESTALE;
	cache_may_block(c);
	gone = !fstat(fd, &st) && st.st_nlink == 0;
	close(fd);
	return gone;
}

void cache_unlink_begin(struct cache *c)
{
	__atomic_add_fetch(&c->unlinking, 1, __ATOMIC_ACQ_REL);
}

void cache_unlink_end(struct cache *c)
{
	__atomic_add_fetch(&c->unlinked_seq, 1, __ATOMIC_ACQ_REL);
	__atomic_sub_fetch(&c->unlinking, 1, __ATOMIC_ACQ_REL);
}

/* An open f just lost its last name: its record says MF_UNLINKED, so that
 * a crash before its last close does not pass its data off as a lost
 * file's (recovery drops it).  A reference held. */
static void file_note_unlinked(struct cache *c, struct cfile *f)
{
	pthread_mutex_lock(&f->rec_lock);
	if (f->rec && file_persist_record(c, f))
		log_msg(LOG_ERR, "cannot persist a deleted file's record");
	pthread_mutex_unlock(&f->rec_lock);
}

/*
 * The store is asked outside c->lock (engine.h: it may not answer), with a
 * reference on f, which also keeps an open file's descriptor (file_idle);
 * if f got or lost its descriptor meanwhile, it is asked again.
 */
void cache_file_unlinked(struct cache *c, dev_t dev, ino_t ino, nlink_t nlink)
{
	struct cfile *f;
	struct stat st;
	int idle, gone, have_st = 0;

	pthread_mutex_lock(&c->lock);
	f = file_find(c, dev, ino, 1);
	if (!f) {
		cache_unlock(c);
		return;
	}
	f->refs++;
	do {
		idle = f->fd < 0;
		cache_unlock(c);
		if (idle) {
			gone = file_gone(c, f, nlink);
		} else if (c->by_path) {
			/* as file_gone: a store's fstat of an open file whose
			 * last name went may still count the name (MooseFS) */
			gone = nlink <= 1;
		} else {
			cache_blocking(c, "fstat");
			have_st = !fstat(f->fd, &st);
			gone = have_st && st.st_nlink == 0;
		}
		pthread_mutex_lock(&c->lock);
	} while (!f->unlinked && idle != (f->fd < 0));
	if (gone && !f->unlinked) {
		f->unlinked = 1;
		if (!idle) {
			cache_unlock(c);
			/* the unlink moved its ctime: this node's own change,
			 * not one made elsewhere, for an open of it by handle
			 * after (the look taken after the unlink above, or by
			 * path none yet) */
			if (!have_st) {
				cache_blocking(c, "fstat");
				have_st = !fstat(f->fd, &st);
			}
			if (have_st) {
				pthread_mutex_lock(&c->lock);
				if (!f->coh.inflight &&
				    (uint64_t)st.st_size == f->bsize &&
				    ts_ns(&st.st_mtim) == f->bk_mtime_ns)
					f->bk_ctime_ns = ts_ns(&st.st_ctim);
				cache_unlock(c);
			}
			file_note_unlinked(c, f); /* its record says so too */
			pthread_mutex_lock(&c->lock);
		}
	}
	file_put_locked(c, f);
	cache_unlock(c);
}

/*
 * A rename through the mount between the path's reading (ident_note) and the
 * record's publication in c->recs is not seen by ident_renamed, which only
 * walks published records: the record would keep the old path, and after a
 * crash its dirty data would go to lost+found.  So once published, the path
 * is read again if rename_seq moved since it was read.  A rename after that
 * finds the record (it waits for f->rec_lock, held here, and then sees
 * whether the path is still under its old name).  f->rec_lock held.
 */
static void file_recheck_path(struct cache *c, struct cfile *f, uint64_t seq)
{
	while (seq != __atomic_load_n(&c->rename_seq, __ATOMIC_ACQUIRE)) {
		if (ident_note(c, f, &seq)) {
			log_msg(LOG_WARNING,
				"%s: renamed while it got its record, and its "
				"new path cannot be read; after a crash its "
				"dirty data would go to %s",
				f->path ? f->path : "a file", LOST_FOUND_DIR);
			return;
		}
	}
}

/* Give the file a persistent record before any slot entry names it; -ENOSPC
 * when none can be had now (the caller does without the cache). */
int file_ensure_record(struct cache *c, struct cfile *f)
{
	uint64_t seq = 0;
	int ret = 0;

	if (__atomic_load_n(&f->rec, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&f->rec_lock);
	if (f->rec)
		goto out_unlock;
	ret = ident_note(c, f, &seq);
	if (ret) {
		/* cannot be found again after a crash: not cached */
		ret = ret == -ENOMEM ? ret : -ENOSPC;
		goto out_unlock;
	}
	if (c->test_noted)
		c->test_noted(c, f);
	pthread_mutex_lock(&c->lock);
	while (!c->nfree_recs) {
		/* evict clean data of files nobody has open */
		struct cslot *s, *n;
		int freed = 0, lru;

		/* records on their way to free_recs: persist, look again */
		if (freeq_wait_locked(c))
			continue;
		/* pinned data is not dropped for a record: the request
		 * goes around the cache instead */
		for (lru = SL_LRU_FIRST; lru <= SL_LRU_HIGH && !freed; lru++)
			for (s = slot_list_next(c, lru, NULL); s; s = n) {
				struct cfile *o = c->recs[s->file - 1];

				n = slot_list_next(c, lru, s);
				if (s->pins || o->refs)
					continue;
				o->refs++;
				slot_drop_locked(c, s);
				CNT_ADD(c, evictions, 1);
				file_put_locked(c, o);
				if (c->nfree_recs || c->nfreeing_recs) {
					freed = 1;
					break;
				}
			}
		if (freed)
			continue; /* taken, or queued: looked at again */
		/*
		 * Every record is held by a file that is open, or that has
		 * dirty data.  Waiting could deadlock: only a release frees
		 * the former, and it needs a FUSE thread, all of which may be
		 * waiting here.  The caller goes around the cache instead;
		 * the destager is told, so that closed files' records free up.
		 */
		ret = c->stopping || !meta_writable(&c->meta) ? -EIO : -ENOSPC;
		pthread_cond_broadcast(&c->destage_cond);
		cache_unlock(c);
		goto out_unlock;
	}
	f->rec = c->free_recs[--c->nfree_recs] + 1;
	c->recs[f->rec - 1] = f;
	/* persisted after the free entries queued so far (map.c) */
	if (c->freeq_done != c->freeq_enq)
		freeq_note_locked(c);
	cache_unlock(c);
	file_recheck_path(c, f, seq);
	ret = file_persist_record(c, f);
out_unlock:
	pthread_mutex_unlock(&f->rec_lock);
	return ret;
}

void detach_file_born_locked(struct cache *c, struct cfile *f)
{
	assert_held(&c->lock);
	if (!c->detached)
		return;
	assert(!f->nslots);
	f->mode_saved = -1;
	f->detach_gen = c->detach_gen;
	__atomic_store_n(&f->pol.mode, MODE_BYPASS, __ATOMIC_RELEASE);
}

void file_unpin_locked(struct cache *c, struct cfile *f)
{
	assert_held(&c->lock);
	if (!f->pinned)
		return;
	assert(!list_empty(&f->plink));
	f->pinned = 0;
	list_del(&f->plink);
	file_relist_locked(c, f);
	space_freed_locked(c);
}
