/* cache/files: backing files, the slots that hold their data and their identity on the store: what the data paths, destage and management may use. */
#ifndef NVC_FILES_H
#define NVC_FILES_H

#include "../core/core.h"
#include "bkstream.h"

/* map.c: the block map, allocation, pins and eviction */
struct cslot *slot_find(struct cache *c, uint32_t rec, uint64_t blk);
void slot_hash_add(struct cache *c, struct cslot *s);
void slot_settle(struct cache *c, struct cslot *s);
/* The free queue (map.c, "Free entries"). */
void freeq_flush(struct cache *c);
int freeq_wait_locked(struct cache *c);
int freeq_before_wait_locked(struct cache *c);
/* Drop c->lock, then persist the free entries this thread waits for. */
void cache_unlock(struct cache *c);
int slot_persist(struct cache *c, struct cslot *s);
int slots_persist(struct cache *c, struct cslot **v, int n);
void slot_drop_locked(struct cache *c, struct cslot *s);
void page_forget_locked(struct cache *c, struct cslot *s, uint32_t p);
struct cslot *slot_alloc_locked(struct cache *c, struct cfile *f, uint64_t blk);
struct cslot *twin_alloc_locked(struct cache *c, struct cslot *s);
/* A slot just allocated for f that got nothing goes back free. */
void slot_unclaim_locked(struct cache *c, struct cfile *f, struct cslot *s);
/* Pin s, a slot of f (c->lock held, and f->rw: map.c, "Pins") */
void slot_pin_locked(struct cache *c, struct cfile *f, struct cslot *s);
void slot_unpin_locked(struct cache *c, struct cfile *f, struct cslot *s);
int working_devices(struct cache *c);
void twin_free_locked(struct cache *c, struct cslot *s);
int twin_persist(struct cache *c, struct cslot *s);
/* Pages [p0, p1) of s read from its twin, for a failed device. */
int twin_read(struct cache *c, struct cslot *s, char *buf, uint32_t p0,
	      uint32_t p1);
void file_mark_dirty(struct cache *c, struct cfile *f, struct cslot *s);
void file_mark_clean(struct cache *c, struct cfile *f, struct cslot *s);
/* Slots pinned files may keep (cache.max_pinned of the cache). */
uint64_t pin_cap_slots(struct cache *c);
/* Move f's clean slots to the LRU list of its level now (c->lock held). */
void file_relist_locked(struct cache *c, struct cfile *f);
/* Rebuilds begun so far: sampled by whoever locks a slot to write it. */
uint64_t rebuild_seq(struct cache *c);
/* Debug builds: s, locked for writing when rebuild_seq() was seq0, may take
 * its device write's pages as valid now (mngt/rebuild.c, "Fresh slots"). */
void rebuild_check_commit(struct cache *c, struct cslot *s, uint64_t seq0);

/* file.c: file objects and their records */
void file_hash_add(struct cache *c, struct cfile *f);
struct cfile *file_find(struct cache *c, dev_t dev, ino_t ino, int live_only);
int file_ensure_record(struct cache *c, struct cfile *f);
int file_bk_busy(struct cache *c, struct cfile *f, int busy);
void file_late_check(struct cache *c, struct cfile *f);
struct cfile *file_new(void);
/* f->rw for writing, shutting the gate of requests while it waits; the
 * same with a deadline (0 or -errno); all through frw_* (core/frw.h) */
void file_rw_wrlock(struct cfile *f);
int file_rw_timedwrlock(struct cfile *f, const struct timespec *abs);
/* f->rw for reading, for a request: through the gate (struct cfile); the
 * try gives 0 or -EBUSY */
void file_rw_rdlock_req(struct cfile *f);
int file_rw_tryrdlock_req(struct cfile *f);
void file_put_locked(struct cache *c, struct cfile *f);
int file_idle_fd_locked(struct cache *c, struct cfile *f);
int file_detach_stream_locked(struct cache *c, struct cfile *f);
int file_reopen_ident(struct cache *c, struct cfile *f);
int file_persist_record(struct cache *c, struct cfile *f);
int file_persist_size(struct cache *c, struct cfile *f, uint64_t end);
int file_note_backing(struct cache *c, struct cfile *f);
/* The same in memory only: the caller persists the record. */
int file_note_backing_stat(struct cache *c, struct cfile *f);
/* A file off the pinned list, its clean slots to the LRU (it was
 * unlinked, or unpinned).  c->lock held. */
void file_unpin_locked(struct cache *c, struct cfile *f);
/* A file object just hashed is bypass if the cache is detached. */
void detach_file_born_locked(struct cache *c, struct cfile *f);

/* look.c: the backing file's look as this node last left it, its size as
 * this node knows it (f->bsize) and the generation of f's cached bytes
 * (f->wgen): their essays are there, and these the only ways to set them */
/* Bytes a fill or a read-ahead fetched before now are wrong for the cache
 * (c->lock held). */
void file_wgen_bump_locked(struct cache *c, struct cfile *f);
/* An own write up to end is in the store: bsize is at least end (c->lock). */
void file_bsize_grow_locked(struct cache *c, struct cfile *f, uint64_t end);
/* The size a fstat found that no own write can overlap: the object's
 * making, recovery, file_check_backing under f->rw held for writing. */
void file_bsize_found(struct cfile *f, uint64_t size);
/* This node is about to change f's backing file (f->rw held), or is done. */
void coh_bk_begin(struct cache *c, struct cfile *f);
void coh_bk_done(struct cache *c, struct cfile *f);
/* coh_bk_done, then the look noted as this node's own (look.c). */
int coh_bk_end(struct cache *c, struct cfile *f);
/* A change through the cache (write, truncate, fallocate) moved f's ctime,
 * at now (c->lock held; cache_file_attr_st). */
void coh_ctime_now_locked(struct cfile *f, const struct timespec *now);
/* The look st differs from the one noted (c->lock held). */
int look_differs_locked(const struct cfile *f, const struct stat *st);
/* A look whose fstat began after f->coh.gen was gen may be taken. */
int look_current_locked(const struct cfile *f, uint64_t gen);
uint64_t look_gen(struct cache *c, struct cfile *f);
void look_take_locked(struct cfile *f, const struct stat *st, uint64_t gen);
/* A look too close to the file's last change on a whole-second store. */
int look_unsettled_locked(const struct cache *c, const struct cfile *f,
			  const struct stat *st);

/* ident.c: backing-file identity */
int ident_setup(struct cache *c);
/* path opened beneath dirfd without following any link (openat2 with
 * RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS, and
 * O_NOFOLLOW): the descriptor, or -errno. */
int ident_open_beneath(int dirfd, const char *path, int flags, mode_t mode);
/* fd's path relative to the backing directory ("" for itself). */
int ident_rel_path(struct cache *c, int fd, char *out, size_t len);
/* f's backing file opened again and verified: fd, -ESTALE (not found), or
 * -errno (cannot be opened now). */
int ident_open(struct cache *c, struct cfile *f, int flags);
/* The backing directory is the store the cache knows, or may become it. */
int ident_store_check(struct cache *c, char *err, size_t errlen);

/* salvage.c: dirty data that cannot go where it belongs */
/* Write f's cached pages over srcfd's bytes (-1: holes), at f's size, to a
 * new file name in dirfd (O_EXCL | O_NOFOLLOW, the daemon's, mode 0600;
 * -EEXIST if taken), durably; f->rw held for writing.  *dirty_bytes: how
 * many of them were dirty. */
int salvage_copy(struct cache *c, struct cfile *f, int srcfd, int dirfd,
		 const char *name, uint64_t *dirty_bytes);
/* Unlink name in dirfd if it still is the file fd is open on (a user may
 * have put something else in its place). */
void salvage_unlink_own(int dirfd, const char *name, int fd);
/* Forget every slot of f, dirty or not (its data went elsewhere). */
void salvage_drop(struct cache *c, struct cfile *f);
/* f cannot be found: its dirty data to lost+found, then forgotten. */
int salvage_lost(struct cache *c, struct cfile *f);

#endif
