/* cache: the block map, allocation and eviction, and the read/write/truncate
 * data path. */
#define _GNU_SOURCE
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>
#include <xxhash.h>

#define SEG_MAX_BLOCKS 64
#define IO_BUF_BYTES (2u * 1024 * 1024 + 2 * NVC_PAGE)

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

uint64_t now_ms(void)
{
	return now_ns() / 1000000;
}

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

static void slot_hash_del(struct cache *c, struct cslot *s)
{
	uint32_t *p = &c->shash[slot_key(s->file, s->blk) & c->smask];
	uint32_t me = slot_idx(c, s) + 1;

	while (*p && *p != me)
		p = &c->slots[*p - 1].hnext;
	if (*p)
		*p = s->hnext;
	s->hnext = 0;
}

int slot_persist(struct cache *c, struct cslot *s)
{
	struct meta_slot m;
	int w, need = 0, ret;

	for (w = 0; w < META_MAX_WORDS; w++)
		need |= (s->valid[w] & ~s->pvalid[w] & s->unsynced[w]) != 0;
	if (s->file && need) {
		ret = dev_flush(slot_dev(c, slot_idx(c, s)));
		if (ret)
			return ret;
		memset(s->unsynced, 0, sizeof(s->unsynced));
	}
	if (s->file)
		memcpy(s->pvalid, s->valid, sizeof(s->pvalid));
	else
		memset(s->pvalid, 0, sizeof(s->pvalid));
	memset(&m, 0, sizeof(m));
	m.file = s->file;
	m.blk = s->blk;
	m.flags = s->is_twin ? SLOT_F_TWIN : 0;
	memcpy(m.valid, s->valid, sizeof(m.valid));
	memcpy(m.dirty, s->dirty, sizeof(m.dirty));
	s->persisted = s->file != 0;
	return meta_put_slot(&c->meta, slot_idx(c, s), &m);
}

/* The slot no longer holds page p, valid or dirty (c->lock held). */
static void page_forget_locked(struct cache *c, struct cslot *s, uint32_t p)
{
	if (bm_test(s->dirty, p)) {
		bm_clear(s->dirty, p);
		pages_dirty(c, s, -1);
	}
	if (bm_test(s->valid, p)) {
		bm_clear(s->valid, p);
		pages_valid(c, s, -1);
	}
}

/* Put a slot on the list its state calls for.  c->lock held. */
void slot_settle(struct cache *c, struct cslot *s)
{
	if (s->state == SLOT_CLEAN)
		list_del(&s->link);
	if (!s->file) {
		s->state = SLOT_FREE;
		list_add_tail(&c->free_slots, &s->link);
		c->nfree++;
	} else if (bm_any(s->dirty)) {
		s->state = SLOT_DIRTY;
	} else if (bm_any(s->valid)) {
		s->state = SLOT_CLEAN;
		list_add_tail(&c->lru, &s->link);
	} else {
		s->state = SLOT_FRESH;
	}
}

void file_mark_dirty(struct cache *c, struct cfile *f, struct cslot *s)
{
	s->dirty_since = now_ms();
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

/*
 * Unmap a slot and persist it free, so that no map entry can find it after a
 * crash before it is reused.  c->lock held, pins == 0.
 */
/* Free a slot's twin (c->lock held); its entry goes free on the media. */
void twin_free_locked(struct cache *c, struct cslot *s)
{
	struct cslot *t;

	if (!s->twin)
		return;
	t = &c->slots[s->twin - 1];
	s->twin = 0;
	t->is_twin = 0;
	t->file = 0;
	t->blk = 0;
	memset(t->valid, 0, sizeof(t->valid));
	memset(t->dirty, 0, sizeof(t->dirty));
	t->state = SLOT_FRESH;
	if (t->persisted && slot_persist(c, t))
		log_msg(LOG_ERR, "cannot persist a freed twin slot");
	slot_settle(c, t);
}

/* Persist s's twin as a copy of s's dirty pages (s->rw held for writing). */
int twin_persist(struct cache *c, struct cslot *s)
{
	struct cslot *t = &c->slots[s->twin - 1];

	memcpy(t->valid, s->dirty, sizeof(t->valid));
	memcpy(t->dirty, s->dirty, sizeof(t->dirty));
	return slot_persist(c, t);
}

void slot_drop_locked(struct cache *c, struct cslot *s)
{
	struct cfile *f = c->recs[s->file - 1];

	twin_free_locked(c, s);
	if (s->state == SLOT_CLEAN)
		list_del(&s->link);
	if (s->state == SLOT_DIRTY) {
		file_mark_clean(c, f, s);
		pages_dirty(c, s, -(int64_t)(bm_count(s->dirty)));
	}
	pages_valid(c, s, -(int64_t)(bm_count(s->valid)));
	slot_hash_del(c, s);
	list_del(&s->flink);
	f->nslots--;
	s->file = 0;
	s->blk = 0;
	memset(s->valid, 0, sizeof(s->valid));
	memset(s->dirty, 0, sizeof(s->dirty));
	s->state = SLOT_FRESH;
	if (s->persisted && slot_persist(c, s))
		log_msg(LOG_ERR, "cannot persist a freed slot");
	slot_settle(c, s);
}

/* ---------------------------------------------------------------- files */

static uint64_t file_key(dev_t dev, ino_t ino)
{
	uint64_t k[2] = { dev, ino };

	return XXH3_64bits(k, sizeof(k));
}

static struct cfile *file_find(struct cache *c, dev_t dev, ino_t ino)
{
	struct cfile *f;

	for (f = c->fhash[file_key(dev, ino) & c->fmask]; f; f = f->hnext)
		if (f->dev == dev && f->ino == ino)
			return f;
	return NULL;
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

struct cfile *file_new(void)
{
	struct cfile *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->fd = -1;
	list_init(&f->slots);
	list_init(&f->dlink);
	pthread_rwlock_init(&f->rw, NULL);
	pthread_mutex_init(&f->rec_lock, NULL);
	return f;
}

static void file_free(struct cfile *f)
{
	if (f->fd >= 0)
		close(f->fd);
	pthread_rwlock_destroy(&f->rw);
	pthread_mutex_destroy(&f->rec_lock);
	free(f);
}

static void file_fill_record(struct cfile *f, struct meta_file *r)
{
	memset(r, 0, sizeof(*r));
	r->flags = MF_USED;
	r->ino = f->ino;
	r->size = f->size;
	r->bk_size = f->bsize;
	r->bk_mtime_ns = f->bk_mtime_ns;
	r->handle_bytes = f->hbytes;
	r->handle_type = f->htype;
	memcpy(r->handle, f->handle, f->hbytes);
}

/* Persist the file's record; the caller holds f->rec_lock. */
int file_persist_record(struct cache *c, struct cfile *f)
{
	struct meta_file r;

	pthread_mutex_lock(&c->lock);
	file_fill_record(f, &r);
	pthread_mutex_unlock(&c->lock);
	return meta_put_file(&c->meta, f->rec - 1, &r);
}

/*
 * The daemon itself changed the backing file (truncate, fallocate): note its
 * new size and mtime, so that recovery does not take our own change for one
 * made behind the cache's back.
 */
int file_note_backing(struct cache *c, struct cfile *f)
{
	struct stat st;
	int ret = 0;

	if (fstat(f->fd, &st))
		return -errno;
	pthread_mutex_lock(&c->lock);
	f->bsize = st.st_size;
	f->bk_mtime_ns = st.st_mtim.tv_sec * 1000000000ull + st.st_mtim.tv_nsec;
	pthread_mutex_unlock(&c->lock);
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
	while (!list_empty(&f->slots)) {
		struct cslot *s =
			list_entry(f->slots.next, struct cslot, flink);

		slot_drop_locked(c, s);
	}
}

/* Drop a reference; forget the file when nobody uses it and it has no data. */
void file_put_locked(struct cache *c, struct cfile *f)
{
	if (--f->refs)
		return;
	if (f->unlinked)
		file_drop_slots_locked(c, f);
	if (f->nslots)
		return;
	if (f->rec) {
		struct meta_file r;

		memset(&r, 0, sizeof(r));
		if (meta_put_file(&c->meta, f->rec - 1, &r))
			log_msg(LOG_ERR, "cannot persist a freed file record");
		c->recs[f->rec - 1] = NULL;
		c->free_recs[c->nfree_recs++] = f->rec - 1;
		f->rec = 0;
	}
	file_hash_del(c, f);
	file_free(f);
}

static int file_reopen(struct cache *c, struct cfile *f, int fd);

int cache_file_get(struct cache *c, int fd, struct cfile **out)
{
	struct {
		struct file_handle fh;
		uint8_t buf[META_HANDLE_MAX];
	} h;
	struct cfile *f, *other;
	struct stat st;
	char path[64];
	int mnt, ret;

	if (fstat(fd, &st))
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	f = file_find(c, st.st_dev, st.st_ino);
	if (f) {
		f->refs++;
		pthread_mutex_unlock(&c->lock);
		if (f->fd < 0 && !f->unlinked) {
			ret = file_reopen(c, f, fd);
			if (ret) {
				cache_file_put(c, f);
				return ret;
			}
		}
		*out = f;
		return 0;
	}
	pthread_mutex_unlock(&c->lock);

	f = file_new();
	if (!f)
		return -ENOMEM;
	f->dev = st.st_dev;
	f->ino = st.st_ino;
	f->size = f->bsize = st.st_size;
	f->bk_mtime_ns = st.st_mtim.tv_sec * 1000000000ull + st.st_mtim.tv_nsec;
	f->refs = 1;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	f->fd = open(path, O_RDWR | O_CLOEXEC);
	if (f->fd < 0 && (errno == EROFS || errno == EACCES || errno == EPERM ||
			  errno == ETXTBSY)) {
		f->fd = open(path, O_RDONLY | O_CLOEXEC);
		f->ro = 1;
	}
	if (f->fd < 0) {
		ret = -errno;
		goto err_free;
	}
	h.fh.handle_bytes = META_HANDLE_MAX;
	if (name_to_handle_at(fd, "", &h.fh, &mnt, AT_EMPTY_PATH)) {
		ret = errno == EOVERFLOW ? -ENOTSUP : -errno;
		log_msg(LOG_ERR,
			"backing file system cannot give file handles (%s): it "
			"cannot be cached",
			strerror(-ret));
		goto err_free;
	}
	f->hbytes = h.fh.handle_bytes;
	f->htype = h.fh.handle_type;
	memcpy(f->handle, h.fh.f_handle, f->hbytes);

	pthread_mutex_lock(&c->lock);
	other = file_find(c, f->dev, f->ino);
	if (other) {
		other->refs++;
		pthread_mutex_unlock(&c->lock);
		file_free(f);
		*out = other;
		return 0;
	}
	file_hash_add(c, f);
	pthread_mutex_unlock(&c->lock);
	*out = f;
	return 0;
err_free:
	file_free(f);
	return ret;
}

/*
 * A file nobody has open keeps its cached blocks but not its backing
 * descriptor: a cache of many small files would otherwise hold one descriptor
 * per file and run the daemon out of them.  The backing file's look (size,
 * mtime) is recorded first, for the check at the next mount; the descriptor
 * comes back with the next open, or by the file's handle for destage.
 */
static int file_idle(const struct cfile *f)
{
	return f->refs == 1 && !f->destaging && !f->unlinked && f->fd >= 0 &&
	       f->nslots;
}

/*
 * With c->lock held and one reference on f (about to be put): if f is idle,
 * record its backing file's look and take its descriptor away; c->lock is
 * dropped meanwhile.  Returns the descriptor to close, or -1.
 */
int file_idle_fd_locked(struct cache *c, struct cfile *f)
{
	int ok, fd = -1;

	if (!file_idle(f))
		return -1;
	pthread_mutex_unlock(&c->lock);
	ok = !file_note_backing(c, f);
	pthread_mutex_lock(&c->lock);
	if (ok && file_idle(f)) {
		fd = f->fd;
		f->fd = -1;
	}
	return fd;
}

void cache_file_put(struct cache *c, struct cfile *f)
{
	int fd;

	pthread_mutex_lock(&c->lock);
	fd = file_idle_fd_locked(c, f);
	file_put_locked(c, f);
	pthread_mutex_unlock(&c->lock);
	if (fd >= 0)
		close(fd);
}

/* A descriptor for the destage of a file nobody has open (f referenced). */
int file_reopen_by_handle(struct cache *c, struct cfile *f)
{
	struct {
		struct file_handle fh;
		uint8_t buf[META_HANDLE_MAX];
	} h;
	int fd;

	h.fh.handle_bytes = f->hbytes;
	h.fh.handle_type = f->htype;
	memcpy(h.fh.f_handle, f->handle, f->hbytes);
	fd = open_by_handle_at(c->backing_fd, &h.fh, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	pthread_mutex_lock(&c->lock);
	if (f->fd < 0) {
		f->fd = fd;
		fd = -1;
	}
	pthread_mutex_unlock(&c->lock);
	if (fd >= 0)
		close(fd);
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
	pthread_mutex_lock(&c->lock);
	if (f->fd < 0) {
		f->fd = nfd;
		f->ro = ro;
		nfd = -1;
	}
	pthread_mutex_unlock(&c->lock);
	if (nfd >= 0)
		close(nfd);
	return 0;
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
	f = file_find(c, dev, ino);
	if (f) {
		*size = f->size;
		if (mtime && f->mtime_set)
			*mtime = f->mtime;
		else if (mtime)
			mtime->tv_nsec = UTIME_OMIT;
		ret = 0;
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

void cache_file_times_set(struct cache *c, dev_t dev, ino_t ino)
{
	struct cfile *f;

	pthread_mutex_lock(&c->lock);
	f = file_find(c, dev, ino);
	if (f)
		f->mtime_set = 0;
	pthread_mutex_unlock(&c->lock);
}

/* The backing file of f has no link left (checked by its handle). */
static int file_gone(struct cache *c, struct cfile *f)
{
	struct {
		struct file_handle fh;
		uint8_t buf[META_HANDLE_MAX];
	} h;
	struct stat st;
	int fd, gone;

	h.fh.handle_bytes = f->hbytes;
	h.fh.handle_type = f->htype;
	memcpy(h.fh.f_handle, f->handle, f->hbytes);
	fd = open_by_handle_at(c->backing_fd, &h.fh, O_PATH | O_CLOEXEC);
	if (fd < 0)
		return errno == ESTALE || errno == ENOENT;
	gone = !fstat(fd, &st) && st.st_nlink == 0;
	close(fd);
	return gone;
}

void cache_file_unlinked(struct cache *c, dev_t dev, ino_t ino)
{
	struct cfile *f;
	struct stat st;

	pthread_mutex_lock(&c->lock);
	f = file_find(c, dev, ino);
	if (f && f->fd < 0 && !f->unlinked && file_gone(c, f)) {
		/* an idle file: its handle tells whether it still exists */
		f->unlinked = 1;
		f->refs++;
		file_put_locked(c, f);
	} else if (f && f->fd >= 0 && !fstat(f->fd, &st) && st.st_nlink == 0) {
		f->unlinked = 1;
		f->refs++;
		file_put_locked(c, f);
	}
	pthread_mutex_unlock(&c->lock);
}

/* Give the file a persistent record before any slot entry names it. */
static int file_ensure_record(struct cache *c, struct cfile *f)
{
	int ret = 0;

	if (__atomic_load_n(&f->rec, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&f->rec_lock);
	if (f->rec)
		goto out_unlock;
	pthread_mutex_lock(&c->lock);
	while (!c->nfree_recs) {
		/* evict clean data of files nobody has open */
		struct list *l;
		int freed = 0;

		for (l = c->lru.next; l != &c->lru;) {
			struct cslot *s = list_entry(l, struct cslot, link);
			struct cfile *o = c->recs[s->file - 1];

			l = l->next;
			if (s->pins || o->refs)
				continue;
			o->refs++;
			slot_drop_locked(c, s);
			CNT_ADD(c, evictions, 1);
			file_put_locked(c, o);
			if (c->nfree_recs) {
				freed = 1;
				break;
			}
		}
		if (freed)
			break;
		if (c->stopping) {
			ret = -EIO;
			pthread_mutex_unlock(&c->lock);
			goto out_unlock;
		}
		c->waiting_writers++;
		pthread_cond_broadcast(&c->destage_cond);
		pthread_cond_wait(&c->space_cond, &c->lock);
		c->waiting_writers--;
	}
	f->rec = c->free_recs[--c->nfree_recs] + 1;
	c->recs[f->rec - 1] = f;
	pthread_mutex_unlock(&c->lock);
	ret = file_persist_record(c, f);
out_unlock:
	pthread_mutex_unlock(&f->rec_lock);
	return ret;
}

/* ----------------------------------------------------------- allocation */

/* A free slot on a working device other than avoid (-1: any).  c->lock held. */
static struct cslot *free_take_locked(struct cache *c, int avoid)
{
	struct list *l;

	for (l = c->free_slots.next; l != &c->free_slots; l = l->next) {
		struct cslot *s = list_entry(l, struct cslot, link);

		if (slot_failed(c, s) ||
		    (int)(slot_idx(c, s) % c->ndevs) == avoid)
			continue;
		list_del(&s->link);
		c->nfree--;
		return s;
	}
	return NULL;
}

/*
 * Free the least recently used clean slot that nobody pins, on a working
 * device other than avoid (-1: any), never keep.  0 if one went free.
 */
static int evict_one_locked(struct cache *c, int avoid, struct cslot *keep)
{
	struct list *l;

	for (l = c->lru.next; l != &c->lru; l = l->next) {
		struct cslot *v = list_entry(l, struct cslot, link);
		struct cfile *o = c->recs[v->file - 1];

		if (v->pins || v == keep || slot_failed(c, v) ||
		    (int)(slot_idx(c, v) % c->ndevs) == avoid)
			continue;
		slot_drop_locked(c, v);
		CNT_ADD(c, evictions, 1);
		if (!o->refs && !o->nslots) {
			o->refs++;
			file_put_locked(c, o);
		}
		return 0;
	}
	return -ENOSPC;
}

/* A slot from free_take_locked starts empty, for (rec, blk). */
static void slot_claim(struct cslot *s, uint32_t rec, uint64_t blk)
{
	s->file = rec;
	s->blk = blk;
	s->state = SLOT_FRESH;
	s->gen++;
	memset(s->valid, 0, sizeof(s->valid));
	memset(s->dirty, 0, sizeof(s->dirty));
	memset(s->unsynced, 0, sizeof(s->unsynced));
}

/* Take a free slot, or evict the least recently used clean one.  c->lock held. */
static struct cslot *slot_alloc_locked(struct cache *c, struct cfile *f,
				       uint64_t blk)
{
	struct cslot *s;

	while (!(s = free_take_locked(c, -1)))
		if (evict_one_locked(c, -1, NULL))
			return NULL;
	slot_claim(s, f->rec, blk);
	slot_hash_add(c, s);
	list_add_tail(&f->slots, &s->flink);
	f->nslots++;
	return s;
}

/*
 * Devices that work.  With one left, dirty data has one copy: the cache runs
 * degraded (logged when the device failed) rather than stop taking writes.
 */
static int working_devices(struct cache *c)
{
	int d, n = 0;

	for (d = 0; d < c->ndevs; d++)
		n += !c->dev_failed[d];
	return n;
}

/* A twin for s: a free slot on another working device (c->lock held). */
static struct cslot *twin_alloc_locked(struct cache *c, struct cslot *s)
{
	int dev = slot_idx(c, s) % c->ndevs;
	struct cslot *t;

	while (!(t = free_take_locked(c, dev)))
		if (evict_one_locked(c, dev, s))
			return NULL;
	slot_claim(t, s->file, s->blk);
	t->is_twin = 1;
	s->twin = slot_idx(c, t) + 1;
	return t;
}

/* Release a pin; a FRESH slot that got no data goes back free.  c->lock held.
 */
static void slot_unpin_locked(struct cache *c, struct cfile *f, struct cslot *s)
{
	s->pins--;
	if (!s->pins && s->state == SLOT_FRESH && s->file) {
		slot_hash_del(c, s);
		list_del(&s->flink);
		f->nslots--;
		s->file = 0;
		if (s->persisted && slot_persist(c, s))
			log_msg(LOG_ERR, "cannot persist a freed slot");
		slot_settle(c, s);
	}
}

/* ------------------------------------------------------------ I/O bufs */

static __thread void *tl_buf;

static void *io_buf(void)
{
	if (!tl_buf)
		tl_buf = dev_alloc_buf(IO_BUF_BYTES);
	return tl_buf;
}

/* Read [off, off+len) of the backing file, zeros past its end. */
static int backing_read(struct cache *c, struct cfile *f, void *buf, size_t len,
			uint64_t off)
{
	uint64_t t0 = stat_clock(&c->stats);
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(f->fd, (char *)buf + done, len - done,
				  off + done);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0) {
			memset((char *)buf + done, 0, len - done);
			break;
		}
		done += n;
	}
	CNT_ADD(c, backing_read_bytes, done);
	stat_lat_since(&c->stats, STAT_L_backing_read, t0);
	return 0;
}

int backing_write(struct cache *c, struct cfile *f, const void *buf, size_t len,
		  uint64_t off)
{
	uint64_t t0 = stat_clock(&c->stats);
	size_t done = 0;

	while (done < len) {
		ssize_t n = pwrite(f->fd, (const char *)buf + done, len - done,
				   off + done);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		BK_HOOK(c, write, f->ino, (const char *)buf + done, n,
			off + done);
		done += n;
	}
	CNT_ADD(c, backing_write_bytes, len);
	stat_lat_since(&c->stats, STAT_L_backing_write, t0);
	return 0;
}

/* fsync (data_only: fdatasync) a backing file; 0 or -1 with errno set. */
int backing_sync(struct cache *c, struct cfile *f, int data_only)
{
	uint64_t t0 = stat_clock(&c->stats);
	int ret = data_only ? fdatasync(f->fd) : fsync(f->fd);

	if (!ret)
		stat_lat_since(&c->stats, STAT_L_backing_fsync, t0);
	return ret;
}

void note_dev_error(struct cache *c, struct dev_io *ios, unsigned n)
{
	unsigned i;
	int d;

	for (i = 0; i < n; i++) {
		if (!ios[i].res)
			continue;
		for (d = 0; d < c->ndevs; d++) {
			if (c->devs[d] != ios[i].dev)
				continue;
			if (!__atomic_exchange_n(&c->dev_failed[d], 1,
						 __ATOMIC_ACQ_REL))
				log_msg(LOG_CRIT,
					"cache device %s failed (%s at offset "
					"%llu: %s): no new data goes to it; "
					"its "
					"clean data is read from the backing "
					"store, its dirty data cannot be "
					"served",
					dev_path(ios[i].dev),
					ios[i].op == DEV_READ ? "read"
							      : "write",
					(unsigned long long)ios[i].off,
					strerror(-ios[i].res));
		}
		log_msg(LOG_ERR, "%s: %s at offset %llu: %s",
			dev_path(ios[i].dev),
			ios[i].op == DEV_READ ? "read" : "write",
			(unsigned long long)ios[i].off, strerror(-ios[i].res));
	}
}

/* ----------------------------------------------------------------- read */

struct span {
	struct cslot *s;
	uint64_t blk;
	uint32_t p0, p1; /* pages of the request within the block */
	uint64_t valid[META_MAX_WORDS];
	int miss;
};

void cache_touch(struct cache *c)
{
	__atomic_store_n(&c->last_io, now_ms(), __ATOMIC_RELAXED);
}

/* Keep what a read miss fetched: only pages nobody wrote meanwhile. */
static void fill_from_backing(struct cache *c, struct cfile *f, struct span *sp,
			      int nsp, char *buf, uint64_t pstart,
			      uint64_t wgen0)
{
	struct dev_io io;
	int i;

	if (file_ensure_record(c, f))
		return;
	for (i = 0; i < nsp; i++) {
		struct span *x = &sp[i];
		struct cslot *s;
		uint32_t p, run0;
		uint64_t want[META_MAX_WORDS] = { 0 };
		int ret = 0;

		if (!x->miss)
			continue;
		pthread_mutex_lock(&c->lock);
		if (f->wgen != wgen0 || c->stopping) {
			pthread_mutex_unlock(&c->lock);
			return;
		}
		s = slot_find(c, f->rec, x->blk);
		if (s && slot_failed(c, s)) {
			pthread_mutex_unlock(&c->lock);
			continue;
		}
		if (!s)
			s = slot_alloc_locked(c, f, x->blk);
		if (!s) {
			pthread_mutex_unlock(&c->lock);
			return; /* cache full of dirty data: don't wait */
		}
		s->pins++;
		pthread_mutex_unlock(&c->lock);

		pthread_rwlock_wrlock(&s->rw);
		pthread_mutex_lock(&c->lock);
		if (f->wgen == wgen0)
			for (p = x->p0; p < x->p1; p++)
				if (!bm_test(x->valid, p) &&
				    !bm_test(s->valid, p))
					bm_set(want, p);
		pthread_mutex_unlock(&c->lock);
		for (p = x->p0; p < x->p1 && !ret;) {
			if (!bm_test(want, p)) {
				p++;
				continue;
			}
			for (run0 = p; p < x->p1 && bm_test(want, p); p++)
				;
			io.dev = slot_dev(c, slot_idx(c, s));
			io.op = DEV_WRITE;
			io.off = slot_off(c, slot_idx(c, s)) + run0 * NVC_PAGE;
			io.len = (p - run0) * NVC_PAGE;
			io.buf = buf +
				 (x->blk * c->bs + run0 * NVC_PAGE - pstart);
			ret = dev_io_run(&io, 1);
			if (ret) {
				note_dev_error(c, &io, 1);
				for (uint32_t q = run0; q < p; q++)
					bm_clear(want, q);
			} else {
				CNT_ADD(c, fill_bytes, io.len);
			}
		}
		/* clean data is not persisted: a crash just forgets it */
		pthread_mutex_lock(&c->lock);
		if (bm_any(want)) {
			for (p = x->p0; p < x->p1; p++)
				if (bm_test(want, p)) {
					bm_set(s->valid, p);
					bm_set(s->unsynced, p);
					pages_valid(c, s, 1);
				}
			slot_settle(c, s);
		}
		pthread_mutex_unlock(&c->lock);
		pthread_rwlock_unlock(&s->rw);
		pthread_mutex_lock(&c->lock);
		slot_unpin_locked(c, f, s);
		pthread_mutex_unlock(&c->lock);
	}
}

/* Read [off, off+len) into buf, where buf holds the page at pbase. */
static int read_chunk(struct cache *c, struct cfile *f, char *buf,
		      uint64_t pbase, size_t len, uint64_t off, uint64_t wgen0,
		      int *nmiss)
{
	struct span sp[SEG_MAX_BLOCKS + 2];
	struct dev_io ios[SEG_MAX_BLOCKS * 4];
	uint32_t io_p0[SEG_MAX_BLOCKS * 4], io_p1[SEG_MAX_BLOCKS * 4];
	int io_span[SEG_MAX_BLOCKS * 4];
	uint64_t pstart, pend, blk, hit = 0, miss = 0;
	unsigned nio = 0, k;
	int nsp = 0, i, ret = 0;
	uint32_t p, run0;

	pstart = off & ~(uint64_t)(NVC_PAGE - 1);
	pend = (off + len + NVC_PAGE - 1) & ~(uint64_t)(NVC_PAGE - 1);
	buf += pstart - pbase;

	pthread_mutex_lock(&c->lock);
	for (blk = pstart / c->bs; blk * c->bs < pend; blk++) {
		struct span *x = &sp[nsp++];
		uint64_t b0 = blk * c->bs;

		memset(x, 0, sizeof(*x));
		x->blk = blk;
		x->p0 = pstart > b0 ? (pstart - b0) / NVC_PAGE : 0;
		x->p1 = pend < b0 + c->bs ? (pend - b0) / NVC_PAGE : c->ppb;
		x->s = slot_find(c, f->rec, blk);
		if (x->s)
			x->s->pins++;
	}
	pthread_mutex_unlock(&c->lock);

	for (i = 0; i < nsp; i++) {
		struct span *x = &sp[i];

		if (!x->s)
			continue;
		pthread_rwlock_rdlock(&x->s->rw);
		pthread_mutex_lock(&c->lock);
		memcpy(x->valid, x->s->valid, sizeof(x->valid));
		if (x->s->state == SLOT_CLEAN) {
			list_del(&x->s->link);
			list_add_tail(&c->lru, &x->s->link);
		}
		pthread_mutex_unlock(&c->lock);
		for (p = x->p0; p < x->p1;) {
			if (!bm_test(x->valid, p)) {
				p++;
				continue;
			}
			for (run0 = p; p < x->p1 && bm_test(x->valid, p); p++)
				;
			ios[nio].dev = slot_dev(c, slot_idx(c, x->s));
			ios[nio].op = DEV_READ;
			ios[nio].off = slot_off(c, slot_idx(c, x->s)) +
				       run0 * NVC_PAGE;
			ios[nio].len = (p - run0) * NVC_PAGE;
			ios[nio].buf = buf + (x->blk * c->bs + run0 * NVC_PAGE -
					      pstart);
			io_span[nio] = i;
			io_p0[nio] = run0;
			io_p1[nio] = p;
			hit += (p - run0) * NVC_PAGE;
			nio++;
		}
	}
	if (nio && dev_io_run(ios, nio)) {
		unsigned k;

		/*
		 * A device failed under us.  Clean pages are in the backing
		 * file: forget them here and read them from there.  Dirty
		 * pages exist nowhere else: the read fails.
		 */
		note_dev_error(c, ios, nio);
		pthread_mutex_lock(&c->lock);
		for (k = 0; k < nio; k++) {
			struct span *x = &sp[io_span[k]];

			if (!ios[k].res)
				continue;
			for (p = io_p0[k]; p < io_p1[k]; p++) {
				if (bm_test(x->s->dirty, p)) {
					/* only the second copy has it now */
					if (twin_read(c, x->s,
						      (char *)ios[k].buf +
							      (p - io_p0[k]) *
								      NVC_PAGE,
						      p, p + 1))
						ret = -EIO;
					continue;
				}
				bm_clear(x->valid, p);
				page_forget_locked(c, x->s, p);
				hit -= NVC_PAGE;
			}
		}
		pthread_mutex_unlock(&c->lock);
	}
	for (k = 0; k < nio; k++)
		if (!ios[k].res)
			stat_dev_add(&c->stats,
				     slot_idx(c, sp[io_span[k]].s) % c->ndevs,
				     STAT_DC_hit_bytes, ios[k].len);
	for (i = 0; i < nsp; i++)
		if (sp[i].s)
			pthread_rwlock_unlock(&sp[i].s->rw);
	if (ret)
		goto out_unpin;

	/* misses: contiguous runs of pages not valid, from the backing file */
	{
		uint64_t m0 = 0, m1 = 0;

		for (i = 0; i <= nsp && !ret; i++) {
			struct span *x = i < nsp ? &sp[i] : NULL;

			for (p = x ? x->p0 : 0; x && p < x->p1; p++) {
				uint64_t at = x->blk * c->bs + p * NVC_PAGE;

				if (bm_test(x->valid, p))
					continue;
				x->miss = 1;
				if (m1 == at) {
					m1 += NVC_PAGE;
					continue;
				}
				if (m1 > m0)
					ret = backing_read(c, f,
							   buf + (m0 - pstart),
							   m1 - m0, m0);
				miss += m1 - m0;
				m0 = at;
				m1 = at + NVC_PAGE;
			}
			if (!x && m1 > m0) {
				ret = backing_read(c, f, buf + (m0 - pstart),
						   m1 - m0, m0);
				miss += m1 - m0;
			}
		}
	}
	if (ret)
		goto out_unpin;
	if (hit > len)
		hit = len;
	CNT_ADD(c, read_hit_bytes, hit);
	CNT_ADD(c, read_miss_bytes, len - hit);
	*nmiss |= (hit ? 1 : 0) | (miss ? 2 : 0);
	if (miss && !f->unlinked)
		fill_from_backing(c, f, sp, nsp, buf, pstart, wgen0);
out_unpin:
	pthread_mutex_lock(&c->lock);
	for (i = 0; i < nsp; i++)
		if (sp[i].s)
			slot_unpin_locked(c, f, sp[i].s);
	pthread_mutex_unlock(&c->lock);
	return ret;
}

int cache_read(struct cache *c, struct cfile *f, void *vbuf, size_t len,
	       uint64_t off, char **data, size_t *n)
{
	uint64_t size, wgen0, pstart, cur,
		chunk = (uint64_t)SEG_MAX_BLOCKS * c->bs;
	int ret = 0, nmiss = 0;

	CNT_ADD(c, read_ops, 1);
	*n = 0;
	*data = vbuf;
	if (chunk > IO_BUF_BYTES - 2 * NVC_PAGE)
		chunk = IO_BUF_BYTES - 2 * NVC_PAGE;
	if (len > IO_BUF_BYTES - 2 * NVC_PAGE)
		return -EINVAL;
	pthread_rwlock_rdlock(&f->rw);
	pthread_mutex_lock(&c->lock);
	size = f->size;
	wgen0 = f->wgen;
	pthread_mutex_unlock(&c->lock);
	if (off >= size || !len)
		goto out_unlock;
	if (len > size - off)
		len = size - off;
	pstart = off & ~(uint64_t)(NVC_PAGE - 1);
	/* chunks end on block boundaries, so the page layout of buf holds */
	for (cur = off; cur < off + len && !ret;) {
		uint64_t e = (cur / chunk + 1) * chunk;

		if (e > off + len)
			e = off + len;
		ret = read_chunk(c, f, vbuf, pstart, e - cur, cur, wgen0,
				 &nmiss);
		cur = e;
	}
	if (ret)
		goto out_unlock;
	CNT_ADD(c, read_bytes, len);
	if (nmiss == 1)
		CNT_ADD(c, read_hit_ops, 1);
	else if (nmiss == 2)
		CNT_ADD(c, read_miss_ops, 1);
	else
		CNT_ADD(c, read_partial_ops, 1);
	*data = (char *)vbuf + (off - pstart);
	*n = len;
out_unlock:
	pthread_rwlock_unlock(&f->rw);
	cache_touch(c);
	return ret;
}

/* ---------------------------------------------------------------- write */

/* The old content of one page that a write covers only partly. */
static int page_prefill(struct cache *c, struct cfile *f, struct cslot *s,
			uint32_t p, char *dst, uint64_t at)
{
	if (bm_test(s->valid, p)) {
		int ret = dev_read(slot_dev(c, slot_idx(c, s)), dst, NVC_PAGE,
				   slot_off(c, slot_idx(c, s)) + p * NVC_PAGE);
		if (ret) {
			struct dev_io io = { .dev = slot_dev(c, slot_idx(c, s)),
					     .op = DEV_READ,
					     .res = ret };
			note_dev_error(c, &io, 1);
			if (bm_test(s->dirty, p))
				return twin_read(c, s, dst, p, p + 1) ? -EIO
								      : 0;
			if (at < f->bsize)
				return backing_read(c, f, dst, NVC_PAGE, at);
			memset(dst, 0, NVC_PAGE);
		}
		return 0;
	}
	if (at >= f->bsize) {
		memset(dst, 0, NVC_PAGE);
		return 0;
	}
	return backing_read(c, f, dst, NVC_PAGE, at);
}

/*
 * A new twin gets the slot's dirty pages that this write does not cover, so
 * that it holds every dirty page before its entry says so.
 */
static int twin_seed(struct cache *c, struct cslot *s, struct cslot *t,
		     uint32_t p0, uint32_t p1)
{
	char *pg;
	uint32_t p;
	int ret = 0;

	if (bm_any(t->valid) || !bm_any(s->dirty))
		return 0;
	pg = dev_alloc_buf(NVC_PAGE);
	if (!pg)
		return -ENOMEM;
	for (p = 0; p < c->ppb && !ret; p++) {
		if (!bm_test(s->dirty, p) || (p >= p0 && p < p1))
			continue;
		ret = dev_read(slot_dev(c, slot_idx(c, s)), pg, NVC_PAGE,
			       slot_off(c, slot_idx(c, s)) + p * NVC_PAGE);
		if (!ret)
			ret = dev_write_fua(
				slot_dev(c, slot_idx(c, t)), pg, NVC_PAGE,
				slot_off(c, slot_idx(c, t)) + p * NVC_PAGE);
	}
	free(pg);
	return ret;
}

/* Read dirty pages [p0, p1) of s from its twin into buf (s->rw held). */
int twin_read(struct cache *c, struct cslot *s, char *buf, uint32_t p0,
	      uint32_t p1)
{
	struct cslot *t;

	if (!s->twin)
		return -EIO;
	t = &c->slots[s->twin - 1];
	if (slot_failed(c, t))
		return -EIO;
	return dev_read(slot_dev(c, slot_idx(c, t)), buf, (p1 - p0) * NVC_PAGE,
			slot_off(c, slot_idx(c, t)) + p0 * NVC_PAGE);
}

/*
 * A cache device failed while taking a write: the backing file takes it
 * instead, and the cache forgets the pages the write covers (and the clean
 * ones it touches).  Dirty bytes beside the write on the failed device are
 * lost with it; their pages stay dirty, so reading them fails rather than
 * showing older data.  The slots' locks are held.
 */
static int write_fallback(struct cache *c, struct cfile *f, struct span *sp,
			  int nsp, const char *src, uint64_t lo, uint64_t hi)
{
	int i, ret = backing_write(c, f, src, hi - lo, lo);
	uint32_t p;

	if (ret)
		return ret;
	pthread_mutex_lock(&c->lock);
	for (i = 0; i < nsp; i++) {
		struct cslot *s = sp[i].s;
		int was_dirty = bm_any(s->dirty);

		for (p = sp[i].p0; p < sp[i].p1; p++) {
			uint64_t a = sp[i].blk * c->bs + (uint64_t)p * NVC_PAGE;
			int whole = a >= lo && a + NVC_PAGE <= hi;

			/* sp[i].valid: pages that were clean before this write
			 */
			if (bm_test(s->dirty, p) && !whole &&
			    !bm_test(sp[i].valid, p))
				continue;
			page_forget_locked(c, s, p);
		}
		if (was_dirty && !bm_any(s->dirty))
			file_mark_clean(c, f, s);
		slot_settle(c, s);
	}
	if (hi > f->size)
		f->size = hi;
	if (hi > f->bsize)
		f->bsize = hi;
	f->bk_durable = 0; /* the next fsync must reach the backing file */
	pthread_mutex_unlock(&c->lock);
	for (i = 0; i < nsp && !ret; i++)
		if (sp[i].s->persisted || bm_any(sp[i].s->valid))
			ret = slot_persist(c, sp[i].s);
	if (!ret) {
		pthread_mutex_lock(&f->rec_lock);
		ret = f->rec ? file_persist_record(c, f) : 0;
		pthread_mutex_unlock(&f->rec_lock);
	}
	CNT_ADD(c, bypass_ops, 1);
	return ret;
}

/*
 * Write one segment: blocks [b0, b1) of the request, their slots pinned.
 * Data goes to the devices first; only then are the map entries that find it
 * persisted (on both mirrors) and the write acknowledged.
 */
static int write_segment(struct cache *c, struct cfile *f, struct span *sp,
			 int nsp, const char *src, uint64_t off, uint64_t end,
			 int mode)
{
	struct dev_io ios[2 * SEG_MAX_BLOCKS];
	char *buf = io_buf();
	uint64_t s0 = (sp[0].blk * c->bs) + sp[0].p0 * NVC_PAGE;
	uint64_t lo = off > s0 ? off : s0;
	uint64_t s1 = sp[nsp - 1].blk * c->bs + sp[nsp - 1].p1 * NVC_PAGE;
	uint64_t hi = end < s1 ? end : s1;
	uint64_t newsize = 0;
	int i, ret = 0, size_changed = 0, head;
	unsigned nio = nsp;
	uint32_t p;

	if (!buf)
		return -ENOMEM;
	for (i = 0; i < nsp; i++)
		pthread_rwlock_wrlock(&sp[i].s->rw);
	/*
	 * A clean page is overwritten in place only after its entry says dirty
	 * on the media: were the daemon killed between the device write and the
	 * entry update, a page still marked clean would hold data that the
	 * backing file does not, and the file would change when it is evicted.
	 */
	pthread_mutex_lock(&c->lock);
	for (i = 0; i < nsp; i++) {
		struct cslot *s = sp[i].s;
		int was_dirty = bm_any(s->dirty);

		s->gen++;
		sp[i].miss = 0;
		memset(sp[i].valid, 0, sizeof(sp[i].valid));
		for (p = sp[i].p0; p < sp[i].p1; p++) {
			if (!bm_test(s->valid, p) || bm_test(s->dirty, p))
				continue;
			bm_set(sp[i].valid,
			       p); /* the intent: pages to re-clean */
			bm_set(s->dirty, p);
			pages_dirty(c, s, 1);
			sp[i].miss = 1;
		}
		if (!was_dirty && bm_any(s->dirty)) {
			file_mark_dirty(c, f, s);
			slot_settle(c, s);
		}
	}
	f->wgen++;
	pthread_mutex_unlock(&c->lock);
	for (i = 0; i < nsp && !ret; i++)
		if (sp[i].miss)
			ret = slot_persist(c, sp[i].s);
	if (ret)
		goto out_unlock;

	/* partial first and last pages keep their old bytes */
	head = lo % NVC_PAGE != 0;
	if (head)
		ret = page_prefill(c, f, sp[0].s, sp[0].p0, buf, s0);
	if (!ret && hi % NVC_PAGE && !(head && s1 - NVC_PAGE == s0))
		ret = page_prefill(c, f, sp[nsp - 1].s, sp[nsp - 1].p1 - 1,
				   buf + (s1 - NVC_PAGE - s0), s1 - NVC_PAGE);
	if (ret)
		goto out_unlock;
	memcpy(buf + (lo - s0), src + (lo - off), hi - lo);

	if (mode != MODE_WRITEBACK) {
		ret = backing_write(c, f, src + (lo - off), hi - lo, lo);
		if (ret)
			goto out_unlock;
	}
	for (i = 0; i < nsp; i++) {
		struct cslot *s = sp[i].s;

		ios[i].dev = slot_dev(c, slot_idx(c, s));
		ios[i].op = DEV_WRITE;
		ios[i].off = slot_off(c, slot_idx(c, s)) + sp[i].p0 * NVC_PAGE;
		ios[i].len = (sp[i].p1 - sp[i].p0) * NVC_PAGE;
		ios[i].buf =
			buf + (sp[i].blk * c->bs + sp[i].p0 * NVC_PAGE - s0);
		ios[i].fua = 0;
		for (p = sp[i].p0; p < sp[i].p1; p++)
			ios[i].fua |= !bm_test(s->pvalid, p);
	}
	/* second copies: the same pages at the same place in the twin */
	for (i = 0, nio = nsp; i < nsp && !ret; i++) {
		struct cslot *t;

		if (!sp[i].s->twin || mode != MODE_WRITEBACK)
			continue;
		t = &c->slots[sp[i].s->twin - 1];
		ret = twin_seed(c, sp[i].s, t, sp[i].p0, sp[i].p1);
		ios[nio] = ios[i];
		ios[nio].dev = slot_dev(c, slot_idx(c, t));
		ios[nio].off =
			slot_off(c, slot_idx(c, t)) + sp[i].p0 * NVC_PAGE;
		ios[nio].fua = 1;
		nio++;
	}
	if (!ret)
		ret = dev_io_run(ios, nio);
	if (ret) {
		note_dev_error(c, ios, nio);
		ret = write_fallback(c, f, sp, nsp, src + (lo - off), lo, hi);
		goto out_unlock;
	}

	pthread_mutex_lock(&c->lock);
	for (i = 0; i < nsp; i++) {
		struct cslot *s = sp[i].s;
		int was_dirty = bm_any(s->dirty);

		c->dev_dirty[slot_idx(c, s) % c->ndevs] = 1;
		for (p = sp[i].p0; p < sp[i].p1; p++) {
			if (ios[i].fua)
				bm_clear(s->unsynced, p);
			if (!bm_test(s->valid, p)) {
				bm_set(s->valid, p);
				pages_valid(c, s, 1);
			}
			if (mode == MODE_WRITEBACK && !bm_test(s->dirty, p)) {
				bm_set(s->dirty, p);
				pages_dirty(c, s, 1);
			}
		}
		if (mode != MODE_WRITEBACK && sp[i].miss) {
			/* writethrough: the backing file has it, clean again */
			for (p = sp[i].p0; p < sp[i].p1; p++) {
				if (!bm_test(sp[i].valid, p))
					continue;
				bm_clear(s->dirty, p);
				pages_dirty(c, s, -1);
			}
			if (was_dirty && !bm_any(s->dirty))
				file_mark_clean(c, f, s);
		}
		if (!was_dirty && bm_any(s->dirty))
			file_mark_dirty(c, f, s);
		slot_settle(c, s);
	}
	if (hi > f->size) {
		f->size = hi;
		size_changed = 1;
	}
	if (mode != MODE_WRITEBACK && hi > f->bsize)
		f->bsize = hi;
	newsize = f->size;
	/* crossing the high watermark wakes the destager at once */
	if (!c->draining &&
	    c->ndirty_slots * 100 >= c->cfg->high_wm * c->nslots)
		pthread_cond_signal(&c->destage_cond);
	clock_gettime(CLOCK_REALTIME, &f->mtime);
	f->mtime_set = mode == MODE_WRITEBACK;
	pthread_mutex_unlock(&c->lock);
	(void)newsize;

	/* the twin first: a slot's dirty pages are always in its twin */
	for (i = 0; i < nsp && !ret; i++) {
		if (sp[i].s->twin && mode == MODE_WRITEBACK)
			ret = twin_persist(c, sp[i].s);
		if (!ret)
			ret = slot_persist(c, sp[i].s);
	}
	if (!ret && size_changed) {
		pthread_mutex_lock(&f->rec_lock);
		ret = file_persist_record(c, f);
		pthread_mutex_unlock(&f->rec_lock);
	}
out_unlock:
	for (i = nsp - 1; i >= 0; i--)
		pthread_rwlock_unlock(&sp[i].s->rw);
	return ret;
}

static int write_around(struct cache *c, struct cfile *f, const char *src,
			size_t len, uint64_t off);

static int write_any(struct cache *c, struct cfile *f, const void *vsrc,
		     size_t len, uint64_t off)
{
	struct span sp[SEG_MAX_BLOCKS];
	const char *src = vsrc;
	uint64_t end = off + len, cur = off, seg_bytes;
	int nsp, i, ret = 0, mode = c->cfg->mode;
	int copies = mode == MODE_WRITEBACK ? (int)c->cfg->dirty_copies : 1;

	if (f->ro)
		return -EBADF;
	if (!len)
		return 0;
	if (end < off || end > c->max_file_size)
		return -EFBIG;
	if (mode == MODE_WRITEAROUND)
		return write_around(c, f, src, len, off);
	ret = file_ensure_record(c, f);
	if (ret)
		return ret;
	pthread_rwlock_rdlock(&f->rw);
	while (cur < end && !ret) {
		nsp = 0;
		seg_bytes = 0;
		pthread_mutex_lock(&c->lock);
		while (cur < end && nsp < SEG_MAX_BLOCKS &&
		       seg_bytes < IO_BUF_BYTES - 2 * NVC_PAGE - c->bs) {
			uint64_t blk = cur / c->bs, b0 = blk * c->bs;
			uint64_t e = end < b0 + c->bs ? end : b0 + c->bs;
			struct span *x = &sp[nsp];
			struct cslot *s = slot_find(c, f->rec, blk);

			if (s)
				CNT_ADD(c, write_hit_ops, nsp == 0);
			if (!s)
				s = slot_alloc_locked(c, f, blk);
			if (s && copies > 1 && !s->twin &&
			    working_devices(c) > 1 && !twin_alloc_locked(c, s))
				s = NULL; /* no room for the second copy yet */
			if (!s) {
				if (nsp)
					break; /* write what we hold first */
				if (c->stopping) {
					ret = -EIO;
					break;
				}
				c->waiting_writers++;
				pthread_cond_broadcast(&c->destage_cond);
				pthread_cond_wait(&c->space_cond, &c->lock);
				c->waiting_writers--;
				continue;
			}
			s->pins++;
			x->s = s;
			x->blk = blk;
			x->p0 = (cur - b0) / NVC_PAGE;
			x->p1 = (e - b0 + NVC_PAGE - 1) / NVC_PAGE;
			seg_bytes += (x->p1 - x->p0) * NVC_PAGE;
			nsp++;
			cur = e;
		}
		pthread_mutex_unlock(&c->lock);
		if (nsp) {
			uint64_t segoff =
				sp[0].blk * c->bs + sp[0].p0 * NVC_PAGE;

			if (segoff < off)
				segoff = off;
			ret = write_segment(c, f, sp, nsp, src + (segoff - off),
					    segoff, cur, mode);
			pthread_mutex_lock(&c->lock);
			for (i = 0; i < nsp; i++)
				slot_unpin_locked(c, f, sp[i].s);
			pthread_mutex_unlock(&c->lock);
		}
	}
	pthread_rwlock_unlock(&f->rw);
	cache_touch(c);
	return ret;
}

int cache_write(struct cache *c, struct cfile *f, const void *vsrc, size_t len,
		uint64_t off)
{
	int ret;

	CNT_ADD(c, write_ops, 1);
	ret = write_any(c, f, vsrc, len, off);
	if (!ret)
		CNT_ADD(c, write_bytes, len);
	return ret;
}

/* writearound: the backing file takes the write; cached copies are dropped. */
static int write_around(struct cache *c, struct cfile *f, const char *src,
			size_t len, uint64_t off)
{
	uint64_t end = off + len, blk;
	int ret;

	pthread_rwlock_wrlock(&f->rw);
	pthread_mutex_lock(&c->lock);
	for (blk = off / c->bs; blk * c->bs < end; blk++) {
		struct cslot *s = slot_find(c, f->rec, blk);

		if (s && bm_any(s->dirty)) {
			/* dirty data from an earlier mode: keep it coherent */
			pthread_mutex_unlock(&c->lock);
			pthread_rwlock_unlock(&f->rw);
			c->cfg->mode = MODE_WRITETHROUGH;
			ret = write_any(c, f, src, len, off);
			c->cfg->mode = MODE_WRITEAROUND;
			return ret;
		}
	}
	pthread_mutex_unlock(&c->lock);
	ret = backing_write(c, f, src, len, off);
	pthread_mutex_lock(&c->lock);
	if (!ret) {
		for (blk = off / c->bs; blk * c->bs < end; blk++) {
			struct cslot *s = slot_find(c, f->rec, blk);

			if (s && !s->pins)
				slot_drop_locked(c, s);
		}
		if (end > f->size)
			f->size = end;
		if (end > f->bsize)
			f->bsize = end;
		f->wgen++;
	}
	pthread_mutex_unlock(&c->lock);
	pthread_rwlock_unlock(&f->rw);
	CNT_ADD(c, bypass_ops, 1);
	return ret;
}

/* ------------------------------------------------------------- truncate */

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
			s->pins++;
			if (s->blk >= keep_blk) {
				/* pinned by a fill: clear it in place */
				pages_valid(c, s,
					    -(int64_t)(bm_count(s->valid)));
				pages_dirty(c, s,
					    -(int64_t)(bm_count(s->dirty)));
				if (bm_any(s->dirty))
					file_mark_clean(c, f, s);
				memset(s->valid, 0, sizeof(s->valid));
				memset(s->dirty, 0, sizeof(s->dirty));
				slot_settle(c, s);
				slot_unpin_locked(c, f, s);
			}
		}
	}
	f->wgen++;
	pthread_mutex_unlock(&c->lock);

	if (edge) {
		uint32_t p, first_gone = tail_page + (size % NVC_PAGE ? 1 : 0);
		int was_dirty;

		pthread_rwlock_wrlock(&edge->rw);
		if (size % NVC_PAGE && bm_test(edge->valid, tail_page) &&
		    !bm_test(edge->dirty, tail_page)) {
			/* clean: forget it rather than make it differ from
			 * backing */
			pthread_mutex_lock(&c->lock);
			page_forget_locked(c, edge, tail_page);
			pthread_mutex_unlock(&c->lock);
		} else if (size % NVC_PAGE && bm_test(edge->valid, tail_page)) {
			char *pg = dev_alloc_buf(NVC_PAGE);
			uint64_t at = slot_off(c, slot_idx(c, edge)) +
				      tail_page * NVC_PAGE;
			struct dev *d = slot_dev(c, slot_idx(c, edge));

			ret = pg ? dev_read(d, pg, NVC_PAGE, at) : -ENOMEM;
			if (!ret) {
				memset(pg + size % NVC_PAGE, 0,
				       NVC_PAGE - size % NVC_PAGE);
				ret = dev_write_fua(
					d, pg, NVC_PAGE,
					at); /* fsync does not see it */
			}
			free(pg);
			if (ret) {
				/* the page cannot be trimmed: forget it */
				pthread_mutex_lock(&c->lock);
				if (bm_test(edge->dirty, tail_page)) {
					ret = -EIO;
				} else {
					bm_clear(edge->valid, tail_page);
					pages_valid(c, edge, -1);
					ret = 0;
				}
				pthread_mutex_unlock(&c->lock);
			}
		}
		pthread_mutex_lock(&c->lock);
		was_dirty = bm_any(edge->dirty);
		for (p = first_gone; p < c->ppb; p++)
			page_forget_locked(c, edge, p);
		if (was_dirty && !bm_any(edge->dirty))
			file_mark_clean(c, f, edge);
		slot_settle(c, edge);
		pthread_mutex_unlock(&c->lock);
		if (edge->persisted || bm_any(edge->valid))
			slot_persist(c, edge);
		pthread_rwlock_unlock(&edge->rw);
		pthread_mutex_lock(&c->lock);
		slot_unpin_locked(c, f, edge);
		pthread_mutex_unlock(&c->lock);
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
	pthread_rwlock_wrlock(&f->rw);
	/*
	 * The new size is persisted first: a crash after it can only lose the
	 * cut bytes (recovery trims what is past the recorded size and cuts
	 * the backing file to it), never bring back older bytes from the
	 * backing file in place of dirty ones that were dropped.
	 */
	pthread_mutex_lock(&c->lock);
	shrink = size < f->size;
	f->size = size;
	f->wgen++;
	clock_gettime(CLOCK_REALTIME, &f->mtime);
	f->mtime_set = 0;
	pthread_mutex_unlock(&c->lock);
	if (f->rec) {
		pthread_mutex_lock(&f->rec_lock);
		ret = file_persist_record(c, f);
		pthread_mutex_unlock(&f->rec_lock);
	}
	if (!ret && shrink)
		ret = file_trim(c, f, size);
	if (!ret && ftruncate(f->fd, size))
		ret = -errno;
	if (!ret) {
		BK_HOOK(c, truncate, f->ino, size);
		ret = file_note_backing(c, f);
	}
	pthread_rwlock_unlock(&f->rw);
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
		pthread_mutex_unlock(&c->lock);
		for (ret = 0; cur < end && !ret; cur += 1024 * 1024) {
			uint64_t n = end - cur < 1024 * 1024 ? end - cur
							     : 1024 * 1024;

			ret = cache_write(c, f, z, n, cur);
		}
		free(z);
		return ret;
	}
	pthread_rwlock_wrlock(&f->rw);
	ret = fallocate(f->fd, mode, off, len) ? -errno : 0;
	if (!ret && !(mode & FALLOC_FL_KEEP_SIZE)) {
		pthread_mutex_lock(&c->lock);
		if (off + len > f->size)
			f->size = off + len;
		pthread_mutex_unlock(&c->lock);
	}
	if (!ret)
		ret = file_note_backing(c, f);
	pthread_rwlock_unlock(&f->rw);
	return ret;
}

/* ---------------------------------------------------------------- fsync */

int cache_fsync(struct cache *c, struct cfile *f)
{
	int d, ret = 0, r;

	if (f) {
		struct list *l;

		/* dirty data on a failed device cannot be made durable */
		pthread_mutex_lock(&c->lock);
		for (l = f->slots.next; l != &f->slots; l = l->next) {
			struct cslot *s = list_entry(l, struct cslot, flink);

			if (s->state == SLOT_DIRTY && slot_failed(c, s) &&
			    (!s->twin ||
			     slot_failed(c, &c->slots[s->twin - 1])))
				ret = -EIO;
		}
		pthread_mutex_unlock(&c->lock);
		if (ret)
			return ret;
	}
	for (d = 0; d < c->ndevs; d++) {
		if (c->dev_failed[d])
			continue;
		if (!__atomic_exchange_n(&c->dev_dirty[d], 0, __ATOMIC_ACQ_REL))
			continue;
		r = dev_flush(c->devs[d]);
		if (r) {
			c->dev_dirty[d] = 1;
			ret = -EIO;
		}
	}
	/* the backing file's own existence must survive power loss too */
	if (!ret && f && !f->bk_durable) {
		if (backing_sync(c, f, 0))
			return -errno;
		BK_HOOK(c, sync, f->ino);
		f->bk_durable = 1;
	}
	if (!ret && c->cfg->mode != MODE_WRITEBACK && f) {
		if (backing_sync(c, f, 1))
			ret = -errno;
		else
			BK_HOOK(c, sync, f->ino);
	}
	return ret;
}

/* ---------------------------------------------------------------- stats */

static void dev_observed(void *arg, enum dev_op op, uint32_t len, int res,
			 uint64_t ns)
{
	struct dev_obs *o = arg;
	struct stat_store *st = &o->c->stats;
	int timed = st->timing;

	if (res < 0)
		stat_dev_add(st, o->d, STAT_DC_errors, 1);
	switch (op) {
	case DEV_READ:
		stat_dev_add(st, o->d, STAT_DC_read_ops, 1);
		stat_dev_add(st, o->d, STAT_DC_read_bytes, len);
		if (timed)
			stat_dev_lat(st, o->d, STAT_DL_read, ns);
		break;
	case DEV_WRITE:
		stat_dev_add(st, o->d, STAT_DC_write_ops, 1);
		stat_dev_add(st, o->d, STAT_DC_write_bytes, len);
		if (timed)
			stat_dev_lat(st, o->d, STAT_DL_write, ns);
		break;
	case DEV_FLUSH:
		stat_dev_add(st, o->d, STAT_DC_flush_ops, 1);
		if (timed)
			stat_dev_lat(st, o->d, STAT_DL_flush, ns);
		break;
	}
}

/* Watch every cache device's I/O (called once the devices are known). */
void stats_attach_devs(struct cache *c)
{
	int d;

	for (d = 0; d < c->ndevs; d++) {
		c->obs[d].c = c;
		c->obs[d].d = d;
		dev_set_observer(c->devs[d], dev_observed, &c->obs[d],
				 c->stats.timing);
	}
}

/* The destage rate: bytes per wall-clock second, in a ring of 16 seconds. */
void stats_note_destaged(struct cache *c, uint64_t bytes)
{
	uint64_t sec = now_ms() / 1000;
	unsigned k = sec % 16;

	pthread_mutex_lock(&c->stats_lock);
	if (c->rate_sec[k] != sec) {
		c->rate_sec[k] = sec;
		c->rate_bytes[k] = 0;
	}
	c->rate_bytes[k] += bytes;
	pthread_mutex_unlock(&c->stats_lock);
}

/* Average over the last 10 seconds (fewer right after mount), locked. */
static uint64_t destage_rate_locked(struct cache *c)
{
	uint64_t now = now_ms(), sec = now / 1000, sum = 0, span_ms;
	unsigned k;

	for (k = 0; k < 16; k++)
		if (c->rate_sec[k] + 10 > sec)
			sum += c->rate_bytes[k];
	/* the window: 9 whole seconds and the current part second */
	span_ms = 9000 + now % 1000;
	if (now - c->mount_ns / 1000000 < span_ms)
		span_ms = now - c->mount_ns / 1000000;
	return span_ms ? sum * 1000 / span_ms : 0;
}

int cache_snapshot(struct cache *c, struct stat_snap *s)
{
	struct timespec ts;
	uint64_t now = now_ns();
	int d;

	stat_collect(&c->stats, c->ndevs, s);
	pthread_mutex_lock(&c->stats_lock);
	if (c->stats_base)
		stat_diff(s, c->stats_base, s);
	STAT_GAUGE(s, destage_rate) = destage_rate_locked(c);
	STAT_GAUGE(s, since_reset) = (now - c->reset_ns) / 1000000000ull;
	STAT_GAUGE(s, resets) = c->resets;
	pthread_mutex_unlock(&c->stats_lock);
	clock_gettime(CLOCK_REALTIME, &ts);
	s->time_ns = ts.tv_sec * 1000000000ull + ts.tv_nsec;
	s->timing = c->stats.timing;
	STAT_GAUGE(s, uptime) = (now - c->mount_ns) / 1000000000ull;
	STAT_GAUGE(s, meta_repaired) = c->meta_repaired;
	for (d = 0; d < 2; d++) {
		s->mirror_rebuilt[d] = c->meta.rebuilt[d];
		snprintf(s->mirror_path[d], sizeof(s->mirror_path[d]), "%s",
			 c->cfg->meta_paths[d] ? c->cfg->meta_paths[d] : "");
	}
	pthread_mutex_lock(&c->lock);
	STAT_GAUGE(s, slots) = c->nslots;
	STAT_GAUGE(s, used_slots) = c->nslots - c->nfree;
	STAT_GAUGE(s, dirty_slots) = c->ndirty_slots;
	STAT_GAUGE(s, capacity_bytes) = c->nslots * c->bs;
	STAT_GAUGE(s, used_bytes) = c->valid_pages * NVC_PAGE;
	STAT_GAUGE(s, dirty_bytes) = c->dirty_pages * NVC_PAGE;
	STAT_GAUGE(s, high_watermark_bytes) =
		c->nslots * c->bs / 100 * c->cfg->high_wm;
	STAT_GAUGE(s, destaging) = c->active > 0;
	for (d = 0; d < c->ndevs; d++) {
		STAT_DEV_GAUGE(s, d, used_bytes) =
			c->dev_valid_pages[d] * NVC_PAGE;
		STAT_DEV_GAUGE(s, d, dirty_bytes) =
			c->dev_dirty_pages[d] * NVC_PAGE;
		STAT_DEV_GAUGE(s, d, failed) = c->dev_failed[d];
	}
	pthread_mutex_unlock(&c->lock);
	for (d = 0; d < c->ndevs; d++)
		snprintf(s->dev[d].path, sizeof(s->dev[d].path), "%s",
			 dev_path(c->devs[d]));
	return 0;
}

int cache_stats_reset(struct cache *c)
{
	struct stat_snap *base;

	pthread_mutex_lock(&c->stats_lock);
	if (!c->stats_base)
		c->stats_base = calloc(1, sizeof(*c->stats_base));
	base = c->stats_base;
	if (!base) {
		pthread_mutex_unlock(&c->stats_lock);
		return -ENOMEM;
	}
	stat_collect(&c->stats, c->ndevs, base);
	stat_reset_max(&c->stats);
	c->reset_ns = now_ns();
	c->resets++;
	pthread_mutex_unlock(&c->stats_lock);
	log_msg(LOG_NOTICE, "statistics reset");
	return 0;
}

uint64_t cache_counter(struct cache *c, enum stat_counter k)
{
	return stat_total(&c->stats, k);
}

void cache_note_latency(struct cache *c, enum stat_lat k, uint64_t t0)
{
	stat_lat_since(&c->stats, k, t0);
}

void cache_count(struct cache *c, enum stat_counter k, uint64_t v)
{
	stat_add(&c->stats, k, v);
}

uint64_t cache_clock(struct cache *c)
{
	return stat_clock(&c->stats);
}

struct cache_config *cache_config(struct cache *c)
{
	return c->cfg;
}

void cache_set_bk_hooks(struct cache *c, const struct cache_bk_hooks *h)
{
	c->bk = h;
}

void cache_kick(struct cache *c)
{
	pthread_mutex_lock(&c->lock);
	pthread_cond_broadcast(&c->destage_cond);
	pthread_mutex_unlock(&c->lock);
}

int ctl_socket_path(const char *mountpoint, char *out, size_t len)
{
	int n = snprintf(
		out, len, CTL_DIR "/%016llx.sock",
		(unsigned long long)XXH64(mountpoint, strlen(mountpoint), 0));

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}
