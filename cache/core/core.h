/* cache/core: the cache's state in memory (slots, files, lists, counters, per-device flush generations), for every layer above. */
#ifndef NVC_CORE_H
#define NVC_CORE_H

#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "../media/media.h"
#include "admit.h"
#include "frw.h"
#include "slot.h"

struct bks;
struct bks_pool;

struct list {
	struct list *prev, *next;
};

static inline void list_init(struct list *l)
{
	l->prev = l->next = l;
}

static inline int list_empty(const struct list *l)
{
	return l->next == l;
}

static inline void list_del(struct list *e)
{
	e->prev->next = e->next;
	e->next->prev = e->prev;
	list_init(e);
}

static inline void list_add_tail(struct list *head, struct list *e)
{
	e->prev = head->prev;
	e->next = head;
	head->prev->next = e;
	head->prev = e;
}

#define list_entry(p, type, member) \
	((type *)((char *)(p)-offsetof(type, member)))

/*
 * The free list and the LRU lists link slots by index, 8 bytes a slot instead
 * of two pointers.  They are circular like struct list: a node id below
 * room (c->meta.layout.room) is that slot, room + SL_FREE etc. are the heads
 * (c->lheads), so a slot leaves a list without knowing which one it is on,
 * and a slot on no list links to itself.  Ids are 32 bits, like the
 * hash chains and twins: a cache has fewer than 2^32 - 2 slots (recover.c).
 */
struct slink {
	uint32_t prev, next;
};

/*
 * Eviction levels (policies by path, fpolicy.c; pins, filectl.c).  A clean
 * slot is on the LRU list of its file's level: low, normal (SL_LRU) or high
 * priority, or pinned (nvcachectl pin, or a policy's pin = yes).  Eviction
 * takes the least recently used slot of the lowest level that has one it may
 * take, so low-priority clean data goes before normal, normal before high,
 * LRU within a level; pinned data goes only when the pinned list holds more
 * than cache.max_pinned allows (writes grew pinned files past it), and then
 * only when nothing else can.  The level is the file's (file_lru), never
 * stored per slot: the DRAM per slot stays within SLOT_DRAM_BUDGET.  So
 * whoever changes a file's level moves its clean slots (file_relist_locked),
 * under c->lock, and every slot put on an LRU list goes on slot_lru()'s.
 */
enum { SL_FREE, SL_LRU_LOW, SL_LRU, SL_LRU_HIGH, SL_PIN, SL_FREEING,
       SL_NHEADS };
#define SL_LRU_FIRST SL_LRU_LOW /* the unpinned LRU lists, in eviction order */
#define SL_LRU_LAST SL_LRU_HIGH
_Static_assert(SL_LRU_LOW + PRIO_NORMAL == SL_LRU &&
		       SL_LRU_LOW + PRIO_HIGH == SL_LRU_HIGH,
	       "a priority's list is SL_LRU_LOW + priority");

/*
 * The dirty-block lifecycle.  A slot is FREE (on the free list, its
 * persistent entry free), FRESH (just allocated to a (file, block), nothing
 * valid yet, not on any list, pinned by whoever fills it: rebuild.c, "Fresh
 * slots"; its persistent entry is still free, so a crash forgets it; a
 * twin's state stays FRESH, "Two copies" below), CLEAN (valid pages, none
 * dirty: on the LRU list, evictable when unpinned) or DIRTY (some dirty page: on no list; only the destager makes it
 * CLEAN again, and only after the backing file was fsynced).  A slot goes on
 * the free list only once an entry saying free is on the media (persisted ==
 * 0, asserted where slots are taken); until then a freed slot that an entry
 * on the media maps is FREE on the SL_FREEING list, the free queue (map.c,
 * "Free entries"); one whose free entry could not be
 * persisted stays FREE off the list (counted in nlimbo) until the next mount,
 * so that it never receives another file's data while an entry on the media
 * may still map it to the old file.  File records likewise.
 *
 * Lock order: file->rw, then slot->rw (several slots of one file in ascending
 * block order), then c->lock, then file->rec_lock is never taken under
 * c->lock.  A slot's persistent entry is written only
 * by a thread holding slot->rw for writing, or, once the slot is freed
 * (unmapped, pins == 0: nobody can hold slot->rw without a pin), by the
 * free queue's drainer, which took it off SL_FREEING (map.c).  slot->rw is the
 * four-byte futex lock of srw.h; like the pthread_rwlock_t it replaced, it
 * lets readers in while a writer waits.
 */
enum slot_state { SLOT_FREE, SLOT_FRESH, SLOT_CLEAN, SLOT_DIRTY };

/* flags of a slot entry */
#define SLOT_F_TWIN 1u

/*
 * Two copies of dirty data (cache.dirty_copies = 2).  A slot with dirty pages
 * has a twin on another device; every write to the slot goes to both, and the
 * twin's entry is persisted before the slot's, so that the slot's dirty pages
 * are always a subset of what its twin holds.  The twin is reachable only from
 * its slot (not hashed, not on any list) and is freed once the slot is clean.
 * Reads, page fills and destage fall back to the twin when the slot's device
 * fails, so losing one device loses nothing.
 *
 * A writer finds (or makes) the twin and pins the slot in one hold of
 * c->lock (write_cached), and then relies on the twin until it unpins: it takes
 * the slot's lock later, and marks the slot dirty on the strength of the
 * twin it saw.  So a twin is freed only under c->lock, by a thread that sees
 * in that same hold the slot clean and pinned by nobody else (destage's
 * clean step: pins == its own one; the last unpin; truncate and drops, which
 * shut writers out with f->rw or pins == 0).  Pins counted outside c->lock
 * prove nothing: a writer can pin the slot right after, then find the twin
 * gone and write one copy, whose entry then claims dirty pages no second
 * copy holds (issue 13: destage did so; the crash harness lost data with
 * device 1).  Every slot a writeback write dirties with two working devices
 * has its twin while the write holds it (asserted in wseg_begin).
 */

/*
 * Power loss.  A device may keep a completed write in a volatile cache, while
 * a persisted map entry is durable at once.  So an entry may claim a page valid
 * only once the page's data is durable, or the page would show, after a power
 * loss, whatever the slot held before: another file's data.  A write of pages
 * that the persisted entry does not yet claim (pvalid) is therefore a FUA
 * write; data kept after a read miss is written normally and not persisted at
 * all (clean data need not survive a crash), and should a later entry come to
 * claim such pages (unsynced), the device is flushed before that entry is
 * persisted.  Overwrites of pages the entry already claims need neither: a
 * power loss leaves the old or the new bytes of the same file.
 */

/*
 * Flush generations.  A plain (not FUA) device write is durable only once a
 * flush that started after the write completed has completed too; a flush
 * already under way when the write completed proves nothing.  So each device
 * counts its completed plain writes (written), a flush samples that count
 * before it starts, and only when it completes publishes the sample as
 * flushed.  Whoever needs the writes up to generation g durable waits until
 * flushed >= g, and flushes itself if no flush covers g.  Flushes of one
 * device are serialized by its lock, so concurrent fsyncs share a flush: the
 * one that waited for the lock usually finds its generation covered.
 * flushed never passes written and never goes back (asserted).
 *
 * The backing file's own durability has the same shape (cfile bk_wgen and
 * bk_synced): a change that only the backing file's fsync makes durable (its
 * creation, a write that went around a failed device) bumps bk_wgen; an fsync
 * samples bk_wgen before it starts and publishes the sample when it is done.
 */
struct dev_sync {
	uint64_t written; /* completed plain writes (atomic) */
	uint64_t flushed; /* written, as the last completed flush found it */
	pthread_mutex_t lock;
};

struct cslot {
	uint32_t file; /* record index + 1; 0: free */
	uint32_t pins;
	uint64_t blk;
	/* its page bitmaps (valid, dirty, valid in the persisted entry,
	 * written but maybe only in a device cache) are in c->pbits: slot.h */
	uint64_t gen; /* bumped by every write, checked by destage */
	uint64_t dirty_since;
	uint64_t dirty_epoch; /* flush epoch it went dirty in (cache_flush) */
	uint32_t hnext; /* hash chain: slot index + 1 */
	uint32_t twin; /* slot index + 1 of this slot's second copy */
	struct srw rw;
	uint8_t state;
	uint8_t persisted; /* the persistent entry is not free */
	uint8_t is_twin; /* the second copy of another slot's dirty pages */
	uint8_t on; /* the list link is on: 1 + its head, 0: none */
	struct slink link; /* free list, LRU or pinned list */
	struct list flink; /* the owning file's slots */
};

/*
 * The daemon's DRAM per cache slot: struct cslot, its page bitmaps (slot.h)
 * and its share of the block map's hash table.  At the default block size
 * (64 KiB) it stays within 128 bytes, 2 MiB per GiB of cache (issue 11;
 * test_slot checks it).  File records cost what cache.max_files says,
 * whatever the cache's size.
 */
#define SLOT_DRAM_BUDGET 128u
/* Bytes the engine keeps for its slots, and for its file records. */
uint64_t cache_slot_dram(const struct cache *c);
uint64_t cache_rec_dram(const struct cache *c);

/*
 * What this node knows of its own changes to a backing file (coherence.c).
 * The look recorded in the cfile (bsize, bk_mtime_ns, bk_ctime_ns) is the
 * backing file as it was after this node's last change; anything else is a
 * change made elsewhere.  Changes made under f->rw held for reading may run
 * side by side: each is counted in inflight from before it touches the
 * backing file until it is done, and the look is taken only by a note that
 * saw none under way and none finished after its fstat (gen).  c->lock.
 */
struct coh {
	uint32_t inflight; /* own backing changes under way */
	uint64_t gen; /* own notes of the look begun, own changes done
			 (a look is taken only while it is what it was
			 before the fstat: coherence.c, f->bsize) */
	int opened; /* revalidated at an open since the object was made */
	int conflict; /* a conflict counted and not yet resolved */
	int kinval; /* handled a change outside an open: the kernel's page
		       cache goes at the next open */
	uint64_t look_ns; /* when the look was taken (CLOCK_REALTIME) */
	int stale; /* clean data older than a change made elsewhere, to drop
		      when the file's lock is had */
};

/* Writes around the cache one file may have in flight at once under f->rw
 * held for reading (wround.c); more wait for one of them to end. */
#define WA_SHARED 8

struct cfile {
	uint32_t rec; /* record index + 1; 0: none yet */
	dev_t dev;
	ino_t ino;
	int fd;
	int ro;
	int created; /* made by this daemon (O_EXCL) when the object was: it
			carries no identity stamp yet */
	uint64_t size; /* as the mount shows it */
	uint64_t psize; /* the size the persisted record says (atomic) */
	/* of the backing file, as far as we know: never below the end of a
	 * completed own write (backing_write), whose look may be noted later;
	 * who may set it: coherence.c */
	uint64_t bsize;
	struct timespec mtime;
	int mtime_set;
	/* the ctime the mount shows (c->lock): a write's or truncate's time,
	 * as its mtime, kept over the store's own (destage's) while the
	 * store's is this node's last noted look (cache_file_attr_st) */
	struct timespec ctime;
	int ctime_set;
	uint32_t refs;
	uint64_t nslots, ndirty;
	/* its dirty pages, twins not counted: what st_blocks adds to the
	 * store's (c->lock; pages_dirty keeps it) */
	int64_t dirty_pages;
	uint64_t wgen; /* who must bump it: coherence.c, coh_drop_clean */
	uint64_t dirty_since;
	int destaging;
	int unlinked;
	int lost; /* not found, its dirty data not yet saved (salvage.c):
		     never found by inode again, kept until destage saves it */
	uint64_t bk_wgen; /* backing changes that need the file's fsync */
	uint64_t bk_synced; /* bk_wgen as the last completed fsync found it */
	int bk_missing; /* the backing file could not be opened at mount; it is
			   checked once it has a descriptor (file_late_check) */
	uint64_t bk_mtime_ns;
	int bk_busy; /* changing the backing file: MF_BK_BUSY (rec_lock) */
	uint64_t bk_ctime_ns;
	uint32_t hbytes;
	int32_t htype;
	uint8_t handle[META_HANDLE_MAX];
	uint8_t stamp[META_STAMP_LEN]; /* identity stamp; all zero: none */
	char *path; /* relative to the backing directory (rec_lock); or NULL */
	struct coh coh;
	/* what its policy gives it (fpolicy.c): matched at each open, under
	 * c->lock; pol.mode also read without it (atomic) */
	struct pol_match pol;
	struct admit_state adm; /* its read streams (admit.c) */
	struct bks *bks; /* its direct backing reads (bkstream.c) */
	uint64_t bks_gen; /* backing changes and opens (atomic; bkstream.c) */
	int bks_off; /* its store refused direct I/O (atomic) */
	struct list slots;
	struct list dlink; /* on c->dirty_files while ndirty > 0 */
	int pinned; /* nvcachectl pin (c->lock; MF_PINNED): filectl.c */
	struct list plink; /* on c->pinned_files while pinned */
	/* the detach that made it bypass (c->detach_gen; 0: none) and the
	 * mode it had before, given back at attach (detach.c; c->lock) */
	uint64_t detach_gen;
	int mode_saved;
	struct cfile *hnext;
	/*
	 * f->rw: held for reading by reads and writes (the asynchronous ones
	 * from begin to end, across their device I/O: cache/data/aio.c) and by
	 * destage, for writing by what changes the file as a whole (truncate,
	 * an O_TRUNC open, writearound, fallocate, revalidation).  The lock
	 * itself lets readers in while a writer waits, and must: a write
	 * waiting for space holds it for reading, and so does the destage of
	 * the same file that frees the space.  So that reads that keep
	 * overlapping cannot starve a writer (issue 25), a request's read or
	 * write passes a gate first (file_rw_rdlock_req, or the try of an
	 * asynchronous begin, refused then: -EBUSY), which is shut while
	 * rw_writers counts a writer waiting (file_rw_wrlock): the writer
	 * waits only for the holders already in.  Destage and rebuild take
	 * the lock without the gate.  No thread takes it for reading twice.
	 */
	uint32_t rw_writers; /* writers waiting for f->rw (atomic; futex) */
	pthread_rwlock_t rw;
	pthread_mutex_t rec_lock;
	/* writes going around the cache under f->rw held for reading: their
	 * blocks [b0, b1], which get no slot meanwhile (wround.c; c->lock) */
	struct { uint64_t b0, b1; } around[WA_SHARED];
	unsigned naround;
	/* now_ms() of its last write that went around the cache under
	 * pressure (wround.c sets it; a drain leaves the file alone while it
	 * is recent: destage.c) (atomic) */
	uint64_t around_ms;
};

struct cache {
	struct cache_config *cfg;
	struct dev *devs[NVC_MAX_DEVS];
	int ndevs;
	int own_devs;
	/* bit d: devs[d] is a stand-in the cache made (remove, detach): it is
	 * closed with the cache even when the caller owns the devices */
	uint32_t made_devs;
	struct meta meta;
	int backing_fd;
	dev_t backing_dev;
	uint64_t max_file_size; /* of the backing file system */
	uint32_t bs, ppb; /* block size, pages per block */
	/* slots in the layout (c->lock; grows with nvcachectl add: grow.c);
	 * the slot arrays are meta.layout.room long, the most there can be,
	 * so that a grow moves nothing */
	uint64_t nslots;
	struct cslot *slots;
	uint8_t *pbits; /* the slots' page bitmaps (slot.h) */
	uint32_t pbytes; /* bytes of one bitmap: ceil(ppb / 8) */
	uint32_t *shash;
	uint64_t smask;
	struct cfile **fhash;
	uint64_t fmask;
	struct cfile **recs;
	uint32_t *free_recs;
	uint32_t nfree_recs;
	/* the free queue (map.c, "Free entries"): records freed whose zeroed
	 * record is not yet known durable, oldest first; c->lock */
	uint32_t *freeing_recs;
	uint32_t nfreeing_recs;
	struct slink lheads[SL_NHEADS]; /* the free list and the LRU lists */
	uint64_t lcount[SL_NHEADS]; /* slots on each list */
	struct list pinned_files; /* files pinned (filectl.c) */
	uint64_t pol_min_age; /* the shortest destage_after a file has had
				 (0: none); c->lock */
	struct list dirty_files;
	uint64_t nfree, ndirty_slots, dirty_pages, valid_pages;
	uint64_t ntwins; /* second copies: slots that dirty data occupies too */
	uint64_t dev_valid_pages[NVC_MAX_DEVS], dev_dirty_pages[NVC_MAX_DEVS];
	struct dev_sync dsync[NVC_MAX_DEVS];
	/* no new data goes there: STAT_DEV_FAILED (I/O errors while mounted) or
	 * STAT_DEV_MISSING (gone or not this cache's at mount: fenced) */
	int dev_failed[NVC_MAX_DEVS];
	/* 1 while detached (detach.c): every file is bypass, no slot is in
	 * use and the devices are fenced stand-ins; c->lock to change */
	int detached;
	uint64_t detach_gen;
	/* 1 while nvcachectl remove empties device d (replace.c): no new
	 * slot goes there, and a write moves a clean block off it (atomic) */
	int dev_draining[NVC_MAX_DEVS];
	/* members removed (nvcachectl remove): their slots are never used;
	 * c->lock */
	uint64_t removed_slots; /* the slots of removed members (c->lock) */
	/* the names of members grown since the mount (grow.c): not in
	 * cache.devices yet */
	char *grown_names[NVC_MAX_DEVS];
	/* member + 1 whose blocks nvcachectl replace copies onto its successor
	 * (rebuild.c), 0: none; bytes of it to copy, and copied (atomic) */
	int rebuild_member;
	uint64_t rebuild_total, rebuild_done;
	/* rebuilds begun, bumped once the shadow is set, and the member's
	 * slot the scan is at (atomic; rebuild.c, "Fresh slots") */
	uint64_t rebuild_seq, rebuild_pos;
	/* a replace resumed at mount runs on it (replace.c) */
	pthread_t resume_thread;
	int resume_started;
	/* an unmount began: device-life commands stop at their next batch
	 * (atomic; devid.c, cache_devlife_stop) */
	int devlife_stop;

	/*
	 * c->lock guards the slots, lists and file objects; every request
	 * takes it, and so does `nvcachectl stats`.  So it is never held
	 * across a call that can block on a cache device, the backing store
	 * or a metadata mirror: a store that stops answering must hang only
	 * the requests that need it (issue 25).  Whoever needs such a call
	 * drops c->lock first, keeps what it works on by a reference, a pin,
	 * f->rw or s->rw, and looks again after.  Debug builds assert it at
	 * the entry of each such call: device requests (dev_io_run, by the
	 * devices' nolock), mirror persists (meta_put_slot(s), meta_put_file,
	 * by the meta's nolock), the backing file's reads, writes, syncs, its
	 * opens by handle or path and an unlink's fstat (cache_blocking),
	 * and the detach of a direct read stream (file_free).  Without an
	 * exception: a slot or record freed under c->lock goes to the free
	 * queue, and its free entry is persisted after the unlock
	 * (cache_unlock, map.c "Free entries"), before it is used again.
	 */
	pthread_mutex_t lock;
	/* 0 while the opening thread has the cache alone (recovery, before
	 * any other thread can reach it): set once, by recover_open before it
	 * starts the destagers, and never cleared (assert_held) */
	int shared;
	pthread_cond_t space_cond, destage_cond, flush_cond;
	pthread_cond_t around_cond; /* a write around the cache ended */
	int wa_on; /* writes go around: set by writers at destage.write_around,
		    * cleared at the low watermark by writers or the destager,
		    * which drains while it is set (wround.c, destage.c) */
	int waiting_writers, flush_waiters, draining, stopping, active;
	uint64_t epoch; /* flush epochs: one per flush started */
	int last_destage_err;
	uint64_t last_io;
	pthread_t destagers[64];
	int ndestagers;
	pthread_mutex_t rate_lock;
	uint64_t rate_next_ns;
	/* writer pacing between the high watermark and full (write.c),
	 * under c->lock: the rate destage cleans blocks at (blocks per
	 * second, destage.c) and the pacing clock */
	uint64_t pace_rate, pace_next_ns;
	struct stat_store stats;
	/* under stats_lock: the counters at the last reset, and samples of
	 * destaged bytes for the destage rate */
	pthread_mutex_t stats_lock;
	struct stat_snap *stats_base;
	uint64_t mount_ns, reset_ns, resets;
	uint64_t rate_sec[16], rate_bytes[16]; /* destaged per second */
	struct dev_obs {
		struct cache *c;
		int d;
	} obs[NVC_MAX_DEVS];
	uint64_t meta_repaired;
	int64_t handles, pt_handles; /* the file system's (atomic;
					cache_note_handle) */
	uint64_t nlimbo; /* freed slots whose free entry could not be persisted:
			    never reused while mounted */
	/* the free queue (map.c, "Free entries"): slots and records freed,
	 * counted (freeq_enq) and those known durable (freeq_done), both
	 * under c->lock (freeq_done also read atomically); slots queued or
	 * being persisted (nfreeing); a free entry that failed (freeq_failed:
	 * no freed record is handed out again while mounted); freeq_lock
	 * makes one thread at a time persist the queue, across its I/O */
	pthread_mutex_t freeq_lock;
	uint64_t freeq_enq, freeq_done, nfreeing;
	int freeq_failed;
	const struct cache_bk_hooks *bk;
	/* backing-file identity (ident.c) */
	char *root; /* the backing directory's path ("" for /) */
	const char *stamp_xattr; /* the stamp's attribute, or NULL */
	/* the owner the store gives the daemon's own files (the probe file's:
	 * root's, or whom a squashing store maps it to) */
	uid_t own_uid;
	/* the probe (ident.c): what to record in the headers once the map is
	 * loaded (0: nothing new), and why a file stamped earlier may not be
	 * checked now (NULL: it can), with the probe's error */
	uint32_t probe_record;
	const char *probe_risk;
	int probe_err;
	int by_path; /* files are found by path, not by handle */
	int bk_fuse; /* the store is a FUSE file system: destage writes go
		      * through its page cache (destage_io.c) */
	uint64_t rename_seq; /* renames through the mount (atomic) */
	/* tests only: run by file_ensure_record between the path's reading
	 * and the record's publication (the window a rename can fall in) */
	void (*test_noted)(struct cache *c, struct cfile *f);
	/* tests only: run by destage after a slot it cleaned is persisted,
	 * s->rw held for writing, before it decides whether the slot's twin
	 * goes (the window a writer can pin the slot in) */
	void (*test_cleaned)(struct cache *c, struct cslot *s);
	/* how long a write around a file keeps a drain off it (destage.c);
	 * 0: AROUND_QUIET_MS.  Tests lengthen it. */
	uint64_t test_around_quiet_ms;
	/* tests only: the pread of the direct backing reads (bkstream.c), to
	 * play a store that returns short reads */
	ssize_t (*test_pread)(int fd, void *buf, size_t len, uint64_t off);
	/* tests only: run by a write (wseg_end) and a read miss's fill
	 * after a slot's device write completed and before its pages are
	 * committed, s->rw held for writing (the window a rebuild's scan
	 * can pass the slot in: rebuild.c) */
	void (*test_committing)(struct cache *c, struct cslot *s);
	/* recovery's check of a backing file against its record
	 * (recover.c: file_check_backing), for a file whose descriptor
	 * came after the mount (file_late_check): set once at open, so
	 * that files/ calls up into management only through it */
	void (*check_backing)(struct cache *c, struct cfile *f);
	/* tests only: run by a warm of a pinned file once it has pinned the
	 * file's slots, before it persists them (filectl.c) */
	void (*test_pin_persist)(struct cache *c, struct cfile *f);
	/* tests only: run by a note of a backing file's look after its
	 * fstat, and by coh_bk_done once a change is done (coherence.c) */
	void (*test_look_fstat)(struct cache *c, struct cfile *f);
	void (*test_bk_done)(struct cache *c, struct cfile *f);
	uint8_t store_stamp[META_STAMP_LEN]; /* of the backing directory */
	int store_foreign; /* not the one the headers name */
	int coarse_times; /* the store keeps whole seconds (coherence.c) */
	/* unlinks through the mount: under way, and finished (atomic); a file
	 * that cannot be found meanwhile may be one of them, not lost */
	uint64_t unlinking, unlinked_seq;
	struct bks_pool *bksp; /* direct backing reads (bkstream.c) */
};

/* The calling thread holds c->lock (debug builds; else 0). */
static inline int cache_lock_mine(struct cache *c)
{
	return dev_mutex_mine(&c->lock);
}

/*
 * The lock rules as code, like the kernel's lockdep_assert_held(): a
 * function whose name ends in _locked runs with c->lock held and says so
 * first (assert_held(&c->lock)); a call that may block on a device, the
 * backing store or a metadata mirror is made without it (assert_not_held,
 * in cache_blocking below, dev_io_run and the meta's persists).  Recovery
 * is the one exception to the first: until c->shared is set no other
 * thread can reach the cache, and it runs the same functions without the
 * lock.  Debug and sanitizer builds check them; NDEBUG builds compile them
 * away.  tests/layers.py fails on a _locked function of cache/ that takes
 * c and does not assert.  assert_held is for c->lock only.
 */
static inline int cache_lock_held(pthread_mutex_t *m)
{
	const struct cache *c = list_entry(m, struct cache, lock);

	return dev_mutex_mine(m) || !__atomic_load_n(&c->shared, __ATOMIC_ACQUIRE);
}
#define assert_held(m) assert(cache_lock_held((pthread_mutex_t *)(m)))
#define assert_not_held(m) assert(!dev_mutex_mine((pthread_mutex_t *)(m)))

/* Tests (debug builds): stall a blocking call of this kind ("open",
 * "fstat", "read", "write", "sync") while the file that NVC_TEST_STALL
 * names after "kind:" exists (engine.c). */
void cache_test_stall(const char *kind);

/* Before a call that may block on the backing store (c->lock essay); the
 * same with a test's stall of its kind. */
#define cache_may_block(c) assert_not_held(&(c)->lock)
#define cache_blocking(c, kind)              \
	do {                                 \
		assert_not_held(&(c)->lock); \
		cache_test_stall(kind);      \
	} while (0)

#define BK_HOOK(c, fn, ...)                                     \
	do {                                                    \
		if ((c)->bk && (c)->bk->fn)                     \
			(c)->bk->fn((c)->bk->arg, __VA_ARGS__); \
	} while (0)

#define CNT_ADD(c, field, v) stat_add(&(c)->stats, STAT_C_##field, (v))
#define CNT_GET(c, field) stat_total(&(c)->stats, STAT_C_##field)

uint64_t now_ms(void);

static inline uint64_t ts_ns(const struct timespec *ts)
{
	return ts->tv_sec * 1000000000ull + ts->tv_nsec;
}
uint64_t now_ns(void);

/* The member global slot s lives on (meta.h: the layout). */
static inline int slot_member(const struct cache *c, uint64_t s)
{
	return layout_member(&c->meta.layout, s);
}

static inline struct dev *slot_dev(struct cache *c, uint64_t s)
{
	return c->devs[slot_member(c, s)];
}

static inline int slot_failed(struct cache *c, struct cslot *s)
{
	return c->dev_failed[slot_member(c, s - c->slots)];
}

static inline int slot_draining(struct cache *c, struct cslot *s)
{
	return __atomic_load_n(&c->dev_draining[slot_member(c, s - c->slots)],
			       __ATOMIC_ACQUIRE);
}

/* Cached and dirty page counts, in all and per device; under c->lock. */
static inline void pages_valid(struct cache *c, struct cslot *s, int64_t n)
{
	c->valid_pages += n;
	c->dev_valid_pages[slot_member(c, s - c->slots)] += n;
}

static inline void pages_dirty(struct cache *c, struct cslot *s, int64_t n)
{
	struct cfile *f = c->recs[s->file - 1];

	assert(s->file && f);
	c->dirty_pages += n;
	c->dev_dirty_pages[slot_member(c, s - c->slots)] += n;
	f->dirty_pages += n;
	assert(f->dirty_pages >= 0);
}

/*
 * Waiting for space.  Writers wait on space_cond for a slot (free, or clean
 * and unpinned, to evict).  Whatever makes one appear calls
 * space_freed_locked: a slot settling free or clean, an unpin, the last close
 * of a file.  The destager is not the only one that frees space.  Nobody
 * waits for a file record: those only a release can free, and a release needs
 * a FUSE thread that may itself be waiting; without a record a request goes
 * around the cache (file_ensure_record).
 */
static inline void space_freed_locked(struct cache *c)
{
	assert_held(&c->lock);
	if (c->waiting_writers)
		pthread_cond_broadcast(&c->space_cond);
}

/* Slots that dirty data occupies, second copies included: what the
 * watermarks compare with (c->lock held). */
static inline uint64_t dirty_occupancy(const struct cache *c)
{
	return c->ndirty_slots + c->ntwins;
}


/* Slots that can hold data: those of removed members never do. */
static inline uint64_t usable_slots(const struct cache *c)
{
	return c->nslots - c->removed_slots;
}

/*
 * Whether that occupancy is at least, or at most, pct percent of the usable
 * slots (c->lock held).  Every watermark is compared by these two, exactly:
 * destage's (destage.c) and the writes around the cache (wround.c) share a
 * hysteresis, and one rounded down where the other was not once left the
 * destager idle at 50.1% while writes went around for good.
 */
static inline int dirty_at_least(const struct cache *c, uint64_t pct)
{
	return dirty_occupancy(c) * 100 >= pct * usable_slots(c);
}

static inline int dirty_at_most(const struct cache *c, uint64_t pct)
{
	return dirty_occupancy(c) * 100 <= pct * usable_slots(c);
}

/* Member k's slots (meta.h: the layout). */
static inline uint64_t member_slots(const struct cache *c, int k)
{
	return c->meta.layout.count[k];
}

static inline uint64_t slot_off(struct cache *c, uint64_t s)
{
	return SB_DATA_OFF + layout_index(&c->meta.layout, s) * (uint64_t)c->bs;
}

static inline uint64_t slot_idx(struct cache *c, struct cslot *s)
{
	return s - c->slots;
}

/* The free list and the LRU list (struct slink); c->lock held. */
static inline struct slink *sl_node(struct cache *c, uint32_t id)
{
	return id < c->meta.layout.room ? &c->slots[id].link
					: &c->lheads[id - c->meta.layout.room];
}

static inline void slot_list_init(struct cache *c, int head)
{
	c->lheads[head].prev = c->lheads[head].next =
		c->meta.layout.room + head;
}

static inline void slot_list_del(struct cache *c, struct cslot *s)
{
	uint32_t id = slot_idx(c, s);

	sl_node(c, s->link.prev)->next = s->link.next;
	sl_node(c, s->link.next)->prev = s->link.prev;
	s->link.prev = s->link.next = id;
	if (s->on)
		c->lcount[s->on - 1]--;
	s->on = 0;
}

static inline void slot_list_add_tail(struct cache *c, int head,
				      struct cslot *s)
{
	struct slink *h = &c->lheads[head];
	uint32_t id = slot_idx(c, s);

	assert(s->link.next == id && !s->on); /* on no list */
	s->link.prev = h->prev;
	s->link.next = c->meta.layout.room + head;
	sl_node(c, h->prev)->next = id;
	h->prev = id;
	s->on = head + 1;
	c->lcount[head]++;
}

/* The slot after s on the list (from its start if s is NULL); NULL at its
 * end. */
static inline struct cslot *slot_list_next(struct cache *c, int head,
					   struct cslot *s)
{
	uint32_t id = s ? s->link.next : c->lheads[head].next;

	return id < c->meta.layout.room ? &c->slots[id] : NULL;
}

/*
 * Is f's data pinned?  The one place that says so: nvcachectl pin (f->pinned,
 * persisted: filectl.c) or its policy's pin = yes (fpolicy.c).  Whoever
 * changes the answer calls file_relist_locked.  c->lock held.
 */
static inline int file_pinned(const struct cfile *f)
{
	return f->pinned || f->pol.pin;
}

/* The LRU list of f's clean slots (c->lock held). */
static inline int file_lru(const struct cfile *f)
{
	return file_pinned(f) ? SL_PIN : SL_LRU_LOW + f->pol.prio;
}

/* The LRU list a clean slot goes on (c->lock held); a twin is never on one,
 * a slot no file claims goes on the normal one. */
static inline int slot_lru(struct cache *c, const struct cslot *s)
{
	const struct cfile *f;

	if (!s->file || s->is_twin)
		return SL_LRU;
	f = c->recs[s->file - 1];
	return f ? file_lru(f) : SL_LRU;
}

/* A hit on a clean slot: to the tail of its list.  c->lock held. */
static inline void slot_touch_locked(struct cache *c, struct cslot *s)
{
	assert_held(&c->lock);
	if (s->state != SLOT_CLEAN)
		return;
	slot_list_del(c, s);
	slot_list_add_tail(c, slot_lru(c, s), s);
}

/* f's mode: its policy's, else cache.mode; read once per request. */
static inline int file_mode(struct cache *c, const struct cfile *f)
{
	int m = __atomic_load_n(&f->pol.mode, __ATOMIC_ACQUIRE);

	return m >= 0 ? m : __atomic_load_n(&c->cfg->mode, __ATOMIC_RELAXED);
}

/* Dirty data of f older than this is destaged (0: never by age); c->lock. */
static inline uint64_t file_age_ms(struct cache *c, const struct cfile *f)
{
	return f->pol.age_ms != POL_AGE_GLOBAL ? f->pol.age_ms
					       : c->cfg->max_dirty_age_ms;
}

/* A slot's page bitmaps (slot.h) and what is done with them. */
static inline uint8_t *slot_bits(struct cache *c, const struct cslot *s,
				 enum slot_bits k)
{
	return c->pbits + ((size_t)(s - c->slots) * SB_NBITS + k) * c->pbytes;
}

static inline uint8_t *slot_valid(struct cache *c, const struct cslot *s)
{
	return slot_bits(c, s, SB_VALID);
}

static inline uint8_t *slot_dirty(struct cache *c, const struct cslot *s)
{
	return slot_bits(c, s, SB_DIRTY);
}

/* valid in the persisted entry */
static inline uint8_t *slot_pvalid(struct cache *c, const struct cslot *s)
{
	return slot_bits(c, s, SB_PVALID);
}

/* written, maybe only in a device cache */
static inline uint8_t *slot_unsynced(struct cache *c, const struct cslot *s)
{
	return slot_bits(c, s, SB_UNSYNCED);
}

static inline int pb_any(struct cache *c, const uint8_t *b)
{
	return pb_any_n(b, c->pbytes);
}

static inline uint32_t pb_count(struct cache *c, const uint8_t *b)
{
	return pb_count_n(b, c->pbytes);
}

static inline void pb_zero(struct cache *c, uint8_t *b)
{
	memset(b, 0, c->pbytes);
}

static inline void pb_copy(struct cache *c, uint8_t *dst, const uint8_t *src)
{
	memcpy(dst, src, c->pbytes);
}

static inline void pb_get(struct cache *c, const uint8_t *b,
			  uint64_t w[META_MAX_WORDS])
{
	pb_get_n(b, c->pbytes, w);
}

static inline void pb_put(struct cache *c, uint8_t *b,
			  const uint64_t w[META_MAX_WORDS])
{
	pb_put_n(b, c->pbytes, c->ppb, w);
}

static inline int bm_test(const uint64_t *w, uint32_t i)
{
	return (w[i / 64] >> (i % 64)) & 1;
}

static inline void bm_set(uint64_t *w, uint32_t i)
{
	w[i / 64] |= 1ull << (i % 64);
}

static inline void bm_clear(uint64_t *w, uint32_t i)
{
	w[i / 64] &= ~(1ull << (i % 64));
}

static inline int bm_any(const uint64_t *w)
{
	int i;

	for (i = 0; i < META_MAX_WORDS; i++)
		if (w[i])
			return 1;
	return 0;
}

static inline uint32_t bm_count(const uint64_t *w)
{
	uint32_t n = 0;
	int i;

	for (i = 0; i < META_MAX_WORDS; i++)
		n += __builtin_popcountll(w[i]);
	return n;
}

/* Blocks of one request segment at most (a run of slot entries persisted
 * at once is no longer), and the I/O buffer each thread keeps. */
#define SEG_MAX_BLOCKS 64
#define IO_BUF_BYTES (2u * 1024 * 1024 + 2 * NVC_PAGE)

/* engine.c: counters, clocks and the device-life lock */
void stats_attach_devs(struct cache *c);
void stats_note_destaged(struct cache *c, uint64_t bytes);
/* Serialises detach, attach, replace-mirror and the other device-life
 * commands (cache/mngt): the outermost lock, taken by devlife_enter, which
 * asserts the caller holds neither a file's lock nor c->lock. */
extern pthread_mutex_t devlife_lock;
#define devlife_enter(c)                          \
	do {                                      \
		assert(!frw_held_any());          \
		assert_not_held(&(c)->lock);      \
		pthread_mutex_lock(&devlife_lock); \
	} while (0)

/* devio.c: device writes' flush generations, and device failures */
/* Device d wrote plain (not FUA) data: one more generation to flush. */
void cache_dev_written(struct cache *c, int d);
/* Every plain write to device d that completed before the call is durable. */
int cache_dev_sync(struct cache *c, int d);
/* The failed requests among ios[0..n) fail their devices (STAT_DEV_FAILED). */
void note_dev_error(struct cache *c, struct dev_io *ios, unsigned n);

#endif
