/* cache: the engine's one interface — configuration, on-media format, data
 * path, destage, statistics. */
#ifndef NVC_CACHE_H
#define NVC_CACHE_H

#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "../devices/dev.h"
#include "base/stats.h"
#include "version.h" /* NVC_VERSION: meson's project version */

#define NVC_MAX_DEVS 16
#define NVC_PAGE 4096u
/* in the backing directory: dirty data whose file could not be found */
#define LOST_FOUND_DIR ".nvcachefs-lost+found"

/* ---------------------------------------------------------------- config */

enum cache_mode { MODE_WRITEBACK, MODE_WRITETHROUGH, MODE_WRITEAROUND };
enum fuse_pt { FUSE_PT_AUTO, FUSE_PT_OFF };
enum unmount_policy { UNMOUNT_FLUSH, UNMOUNT_KEEP };
enum identity_mode { IDENT_AUTO, IDENT_HANDLE, IDENT_PATH };
enum conflict_policy { CONFLICT_OVERWRITE, CONFLICT_KEEP_BOTH };
enum on_close_policy { ON_CLOSE_NONE, ON_CLOSE_FLUSH };

struct pol_set;

/*
 * A cache.devices entry that names no device: a member place kept free at
 * format, for nvcachectl add (replace.c).  Its slots are in the layout from
 * the start, never used until a device is added there.
 */
#define CFG_SPARE "spare"
static inline int cfg_is_spare(const char *path)
{
	return path && !strcmp(path, CFG_SPARE);
}

/* Every tunable is a row of the table in config.c; this struct holds values. */
struct cache_config {
	char *devices; /* comma-separated, split into dev_paths */
	char *metadata; /* exactly two, split into meta_paths */
	char *dev_paths[NVC_MAX_DEVS];
	int ndevs;
	char *meta_paths[2];
	uint64_t block_size;
	int mode;
	uint64_t dirty_copies;
	uint64_t max_files;
	uint64_t max_capacity; /* format: room for grows; 0: 2x */
	uint64_t io_poll_us;
	uint64_t sequential_cutoff;
	uint64_t max_pinned; /* percent of the cache */
	int async_fill;
	uint64_t backing_read_ahead;
	uint64_t backing_direct_ra;
	char *backing_path;
	int identity;
	int on_conflict;
	uint64_t high_wm;
	uint64_t low_wm;
	uint64_t max_dirty_age_ms;
	uint64_t idle_ms;
	uint64_t threads;
	uint64_t max_rate;
	uint64_t destage_depth;
	uint64_t pace_writers;
	uint64_t write_around; /* percent; 0: never (wround.c) */
	uint64_t rebuild_max_rate;
	int on_unmount;
	int on_close;
	uint64_t fuse_workers;
	uint64_t fuse_threads;
	int fuse_transport; /* FSLOOP_* order: auto, uring, dev */
	int fuse_passthrough; /* FUSE_PT_*: auto, off */
	uint64_t attr_timeout_ms;
	uint64_t negative_timeout_ms;
	uint64_t read_ahead;
	int stats_latency;
	char *stats_readers;
	/* [policy NAME] sections, in order (policy.c); NULL: none.  Replaced
	 * by a reload (pol_live_swap) while opens read it (pol_live_get). */
	struct pol_set *policies;
	/* where each key was set, for FILE:LINE messages */
	const char *file;
	int line[40];
};

#define CFG_ERRLEN 512

void cfg_defaults(struct cache_config *c);
/* Parse an INI file; on error fills err with "FILE:LINE: message". */
int cfg_load(struct cache_config *c, const char *path, char *err,
	     size_t errlen);
/* Apply "section.key=value" (a -o override). */
int cfg_override(struct cache_config *c, const char *kv, char *err,
		 size_t errlen);
/* Check values against each other; fills err on contradiction. */
int cfg_validate(struct cache_config *c, char *err, size_t errlen);
/* Copy the tunables that may change while mounted; logs each change.  The
 * policies are taken from next (which keeps none). */
int cfg_reload_into(struct cache_config *live, struct cache_config *next);
void cfg_help(FILE *f);
/* The keys as roff for nvcachefs.conf(5) (tools/man/mkconfman.c). */
void cfg_man(FILE *f);
/* s as roff text (no request, backslashes escaped). */
void cfg_roff(FILE *f, const char *s);
void cfg_print(const struct cache_config *c, FILE *f);
void cfg_free(struct cache_config *c);
/* 0, or -errno said in err: the mount point mnt is the backing directory
 * (backing, open as backing_fd), inside it, or holds it, by resolved names
 * and by the identity of their ancestors (cache/base/nest.c). */
int cfg_check_nesting(const char *mnt, int backing_fd, const char *backing,
		      char *err, size_t errlen);

/* ------------------------------------------------------------------- log */

enum { LOG_TO_STDERR, LOG_TO_SYSLOG };
void log_setup(int where);
void log_msg(int prio, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------- format */

struct fmt_opts {
	int force;
	char err[CFG_ERRLEN];
	/* out: the capacity formatted, and how far nvcachectl add can grow
	 * it (the mirrors' room), in bytes */
	uint64_t capacity, max_capacity;
};

/* Write superblocks and empty metadata for the configured devices. */
int fmt_format(const struct cache_config *cfg, struct fmt_opts *o);
/* 0 if path (a block device) holds no signature libblkid knows; else
 * -EEXIST with err naming it and ending with refusal. */
int fmt_probe_in_use(const char *path, const char *refusal, char *err,
		     size_t errlen);
/* The same for the first len bytes of fd (opened on path) alone: what a
 * cache device's superblock area holds, whatever its data slots hold. */
int fmt_probe_head(int fd, uint64_t len, const char *path, const char *refusal,
		   char *err, size_t errlen);
/* Bytes each metadata mirror needs for this configuration and devices. */
uint64_t fmt_meta_len(const struct cache_config *cfg, struct dev **devs,
		      int ndev);
/* The same on devices and regions that are already open (tests). */
int fmt_format_open(const struct cache_config *cfg, struct dev **devs, int ndev,
		    struct pm_region mirrors[2], char *err, size_t errlen);

/* Offline check: a report to out; 0 clean, 1 problems found, <0 cannot check
 * (err). */
int fmt_check(const struct cache_config *cfg, FILE *out, char *err,
	      size_t errlen);
/* The cache.devices line naming today's members (check.c): where each is
 * found now (unmounted), or where the daemon recorded finding it (mounted);
 * a member not found as UUID=..., a removed one as spare.  0, or -errno
 * with err set. */
int fmt_devices_line(const struct cache_config *cfg, char *line, size_t len,
		     char *err, size_t errlen);
/* The same on open devices and regions; returns the number of problems. */
int fmt_check_open(const struct cache_config *cfg, struct dev **devs, int ndev,
		   struct pm_region r[2], FILE *out, int problems);

/* ----------------------------------------------------------------- cache */

struct cache;
struct cfile;

/*
 * Open a formatted cache: devices and mirrors by the configuration's paths,
 * checked against their superblocks.  backing_fd is the backing directory.
 */
int cache_open(struct cache_config *cfg, int backing_fd, struct cache **out,
	       char *err, size_t errlen);
/* The same on devices and regions that are already open (tests). */
int cache_open_devs(struct cache_config *cfg, struct dev **devs, int ndev,
		    struct pm_region mirrors[2], int backing_fd,
		    struct cache **out, char *err, size_t errlen);
/* Stop destage (after flushing everything if flush), persist, close. */
int cache_close(struct cache *c, int flush);
/* Simulate a crash in tests: drop everything without persisting more. */
void cache_abandon(struct cache *c);

/* Find or create the cache's object for the backing file that fd refers to. */
int cache_file_get(struct cache *c, int fd, struct cfile **out);
/* The same, and the backing file's attributes as it found them. */
int cache_file_get_st(struct cache *c, int fd, struct cfile **out,
		      struct stat *st);
/* The same for a file this daemon has just created (O_EXCL): st as the create
 * left it, rwfd open for reading and writing (taken, or closed); fd is not
 * used and may be -1. */
int cache_file_get_new(struct cache *c, int fd, int rwfd,
		       const struct stat *st, struct cfile **out);
void cache_file_put(struct cache *c, struct cfile *f);
/*
 * At an open (after cache_file_revalidate, before O_TRUNC): match f against
 * the [policy] rules loaded now, by its path and size; f keeps what it got
 * until its next open (fpolicy.c).  0, or -ENOMEM.
 */
int cache_file_policy_match(struct cache *c, struct cfile *f);
/*
 * What an open served outside the cache (fs/passthru.c) needs of f, as bits:
 * CACHE_OUT_EMPTY, the cache holds nothing of it (no block, clean or dirty,
 * nothing lost); CACHE_OUT_BYPASS, its mode reads and writes the backing
 * file itself; CACHE_OUT_WRITEAROUND, its mode writes the backing file
 * itself (and keeps what reads miss); CACHE_OUT_STREAMED, its last read
 * through the cache missed as a stream past cache.sequential_cutoff (a hint:
 * reads of other opens change it) and it is not kept; CACHE_OUT_KEPT, it is
 * pinned, its policy pins it, or a warm filled it; CACHE_OUT_CLEAN, it has
 * no dirty or lost data (it may have clean blocks).  Only fills made for an
 * open or a warm add blocks: the caller keeps both away while it relies on
 * EMPTY.
 */
#define CACHE_OUT_EMPTY 1
#define CACHE_OUT_BYPASS 2
#define CACHE_OUT_WRITEAROUND 4
#define CACHE_OUT_STREAMED 8
#define CACHE_OUT_KEPT 16
#define CACHE_OUT_CLEAN 32
int cache_file_outside(struct cache *c, struct cfile *f);
/*
 * A file read as a stream (CACHE_OUT_STREAMED) gives up its clean data, the
 * head its last stream left, so that the next stream of it can be served
 * outside the cache: 0 (the cache may now hold nothing of it: check with
 * cache_file_outside under the same exclusion), -EBUSY if it is no longer
 * streamed, holds dirty data or is lost (nothing dropped), or -errno.  Takes
 * f->rw for writing; the caller keeps opens and warms of f away.
 */
int cache_file_drop_streamed(struct cache *c, struct cfile *f);
/* The name of the policy f got at its last open, or NULL (none); valid for
 * the life of the process. */
const char *cache_file_policy(const struct cfile *f);
/* The policy a file at path (relative to the mount) of size bytes would get
 * at an open now, or NULL (none); valid for the life of the process. */
const char *cache_policy_for(struct cache *c, const char *path, uint64_t size);
/* The backing file could only be opened for reading. */
int cache_file_readonly(const struct cfile *f);
/* Size and mtime as the mount must show them, if the cache tracks the file. */
int cache_file_attr(struct cache *c, dev_t dev, ino_t ino, uint64_t *size,
		    struct timespec *mtime);
/* The attributes of the backing inode whose store attributes are *st, as the
 * mount must show them (size, mtime, ctime, st_blocks rewritten), unless the
 * cache does not track it, or it has no dirty data and st shows a change
 * made elsewhere (-ENOENT: the store's are the file's). */
int cache_file_attr_st(struct cache *c, struct stat *st);
/* The backing file's times were set: stop showing a cached mtime. */
void cache_file_times_set(struct cache *c, dev_t dev, ino_t ino);
/* A name is about to be removed through the mount (unlink, rename over it);
 * cache_unlink_end after, whatever came of it. */
void cache_unlink_begin(struct cache *c);
void cache_unlink_end(struct cache *c);
/* A name of the backing file was removed through the mount, which had nlink
 * links before: drop its data once it has none left. */
void cache_file_unlinked(struct cache *c, dev_t dev, ino_t ino,
			 nlink_t nlink);
/* A name was renamed through the mount (directories as descriptors): cached
 * files found by path follow it. */
void cache_renamed(struct cache *c, int from_dir, const char *from_name,
		   int to_dir, const char *to_name);
/* Kernel file handles of the backing store are proven stable: the file
 * system may hold inodes by handle. */
int cache_handles_trusted(struct cache *c);

/*
 * Many nodes, one store (coherence.c).  At an open, check f's backing file
 * (st: its attributes just taken, or NULL) against what this node last saw of
 * it: changed elsewhere, its clean data
 * is dropped (with dirty data it is a conflict, resolved by
 * backing.on_conflict).  *changed: 0 unchanged, COH_CHANGED the kernel must
 * drop its page cache and attributes, COH_FRESH the object is new (the
 * kernel's page cache of the inode is unknown: not to be kept).
 */
enum { COH_UNCHANGED, COH_CHANGED, COH_FRESH };
int cache_file_revalidate(struct cache *c, struct cfile *f,
			  const struct stat *st, int *changed);
/* Destage f's dirty data written so far and fsync its backing file:
 * close-to-open for other nodes (destage.on_close = flush). */
int cache_file_flush(struct cache *c, struct cfile *f);
/* The mount is about to change the metadata of the backing inode open as
 * fd (chmod, chown, times, xattrs, links, rename): its look before, for
 * cache_file_meta_changed (st_ino 0 if it cannot be had). */
void cache_file_meta_before(int fd, struct stat *before);
/* It has: its new ctime (and with times_set its mtime) is this node's own
 * if the look before was the one this node left, else a change made
 * elsewhere stays to be found by the next open or destage. */
void cache_file_meta_changed(struct cache *c, int fd, int times_set,
			     const struct stat *before);
/* The mount is about to change f's backing file itself (a claim of store
 * space, fs/claim.c) and has changed it: the change is this node's own, its
 * new look noted and recorded. */
void cache_file_bk_change_begin(struct cache *c, struct cfile *f);
int cache_file_bk_change_end(struct cache *c, struct cfile *f);

/* Read up to len bytes at off into the page-aligned buffer buf, which must hold
 * len + 2 * NVC_PAGE bytes; *data points at the first byte, *n is the count. */
/*
 * Reads and writes whose device I/O the caller runs without waiting for it
 * (aio.c): begin, run the I/O in cache_aio_ios() (e.g. on a dev_aring), end
 * on the same thread.  -EAGAIN from begin (nothing done) or from a read's
 * end: use cache_read/cache_write.  A thread that has begun requests and not
 * ended them (cache_aio_held) must not call anything that may wait for a
 * file's lock.
 */
struct cache_aio;
#define CACHE_AIO_MAX_IOS 130 /* device I/Os of one request, at most */
int cache_aio_new(struct cache_aio **out);
void cache_aio_free(struct cache_aio *a);
int cache_aio_begin(struct cache *c, struct cfile *f, struct cache_aio *a,
		    const void *src, size_t len, uint64_t off);
unsigned cache_aio_ios(struct cache_aio *a, struct dev_io **ios);
int cache_aio_end(struct cache_aio *a, char **data, size_t *n);
unsigned cache_aio_held(void);

int cache_read(struct cache *c, struct cfile *f, void *buf, size_t len,
	       uint64_t off, char **data, size_t *n);
/* The same; with defer (and cache.async_fill on), the misses it keeps are
 * written to the cache by cache_read_finish, which the same thread calls
 * after the reply, before buf is used again (io.c: fills after the reply).
 * With defer, *data may point into memory of the cache's (a segment read
 * ahead, bkstream.c), which cache_read_finish gives back. */
int cache_read_defer(struct cache *c, struct cfile *f, void *buf, size_t len,
		     uint64_t off, char **data, size_t *n, int defer);
void cache_read_finish(struct cache *c);
/* The calling thread is idle, with nothing under way: it gives back its
 * buffers (they are made again on use). */
void cache_thread_idle(void);
int cache_write(struct cache *c, struct cfile *f, const void *buf, size_t len,
		uint64_t off);
int cache_truncate(struct cache *c, struct cfile *f, uint64_t size);
/* Durable against power loss: device caches flushed, metadata persisted. */
int cache_fsync(struct cache *c, struct cfile *f);
/* Punch or allocate through to the backing file, keeping cached data right. */
int cache_fallocate(struct cache *c, struct cfile *f, int mode, uint64_t off,
		    uint64_t len);

/* Destage everything dirty now; progress is called every interval. */
typedef void (*cache_progress_fn)(void *arg, uint64_t dirty_bytes,
				  uint64_t destaged_bytes);
int cache_flush(struct cache *c, cache_progress_fn fn, void *arg);
/* Destage everything, drop every cached block and close the cache devices:
 * the mount then serves everything from the backing store, also after a
 * remount, until cache_attach (detach.c).  0, or -errno with err set. */
int cache_detach(struct cache *c, cache_progress_fn fn, void *arg, char *err,
		 size_t errlen);
/* Take the listed devices back (checked as a mount does). */
int cache_attach(struct cache *c, char *err, size_t errlen);
/* The same with n devices already open instead of the listed names (tests):
 * the members among them are picked by identity (members_pick) and, on
 * success, belong to the cache; the others, and all of them on failure,
 * stay the caller's. */
int cache_attach_with(struct cache *c, struct dev **devs, int n, char *err,
		      size_t errlen);
/* Metadata mirror old (a path of cache.metadata) becomes new_path, rebuilt
 * from the other mirror while the mount serves (mirror.c).  0, or -errno
 * with err set. */
int cache_replace_mirror(struct cache *c, const char *old,
			 const char *new_path, char *err, size_t errlen);
/* The same onto region r, mapped by the caller (the crash harness) and
 * named new_name; on success r is mirror k's and the old one is unmapped,
 * else r stays the caller's. */
int cache_replace_mirror_with(struct cache *c, const char *old,
			      const char *new_name, const struct pm_region *r,
			      char *err, size_t errlen);
/* new_path takes cache device old's place as a new member, with old's
 * blocks copied onto it (replace.c, rebuild.c).  0, or -errno with err
 * set. */
int cache_replace_dev(struct cache *c, const char *old, const char *new_path,
		      cache_progress_fn fn, void *arg, char *err,
		      size_t errlen);
/* The same onto nd, opened by the caller (the crash harness); on success
 * the old device is closed and nd is member k, else nd is the caller's. */
int cache_replace_dev_with(struct cache *c, const char *old, struct dev *nd,
			   char *err, size_t errlen);
/* The device at path takes a free member place (spare at format, or
 * removed), used at once (replace.c).  0, or -errno with err set. */
int cache_add_dev(struct cache *c, const char *path, char *err, size_t errlen);
/* The same with nd, opened by the caller (the crash harness); on success
 * the place's stand-in is closed and nd is its member, else nd is the
 * caller's. */
int cache_add_dev_with(struct cache *c, struct dev *nd, char *err,
		       size_t errlen);
/* Cache device path is emptied as for a replace and then never used again,
 * so that it can be pulled (replace.c).  0, or -errno with err set. */
int cache_remove_dev(struct cache *c, const char *path, cache_progress_fn fn,
		     void *arg, char *err, size_t errlen);
/* An unmount begins: a replace, remove or mirror replace under way stops
 * at its next batch, recorded, to resume at the next mount (devid.c). */
void cache_devlife_stop(struct cache *c);
/* ------------------------------------------- per-file control (filectl.c) */

/* What nvcachectl status shows of one file. */
struct cache_file_info {
	uint64_t size; /* as the mount shows it */
	uint64_t cached; /* bytes of it in the cache (within size) */
	uint64_t dirty; /* of them, not yet destaged */
	uint64_t dirty_age_ms; /* of its oldest dirty data; 0: none */
	uint64_t blocks; /* cache blocks it holds */
	int pinned;
	int up_to_date; /* the backing file holds everything, durably */
};
/* The cache's space as warm and pin see it, in bytes. */
struct cache_room {
	uint64_t capacity, dirty, pinned, npinned;
	uint64_t available; /* free, or clean and evictable */
	uint64_t max_pinned; /* cache.max_pinned of the capacity */
	uint64_t want; /* a refused pin: what it would have added */
};
typedef int (*cache_stop_fn)(void *arg); /* non-zero: stop now */
/* The object of fd's backing file, referenced, if the cache has one; never
 * makes one (-ENOENT). */
int cache_file_lookup(struct cache *c, int fd, struct cfile **out);
void cache_file_info(struct cache *c, struct cfile *f,
		     struct cache_file_info *i);
void cache_room(struct cache *c, struct cache_room *r);
/* Bytes of room that warming size bytes of f (NULL: no object) takes. */
uint64_t cache_file_warm_need(struct cache *c, struct cfile *f, uint64_t size);
/* Read [0, limit) of f into the cache, keeping every miss, in 1 MiB
 * requests; fn(arg, bytes so far, 0) after each; -EINTR when stop says. */
int cache_file_warm(struct cache *c, struct cfile *f, uint64_t limit,
		    cache_progress_fn fn, cache_stop_fn stop, void *arg,
		    uint64_t *done);
/* Pin (pin = 1) or unpin f, persisted; -ENOSPC past cache.max_pinned (the
 * figures in *r), -EMFILE when no file record is free. */
int cache_file_pin(struct cache *c, struct cfile *f, int pin,
		   struct cache_room *r);
/* Drop f's clean cached data now; -EBUSY if it is pinned. */
int cache_file_evict(struct cache *c, struct cfile *f, uint64_t *dropped);
/* cache_file_flush with fn(arg, dirty left, destaged) between steps. */
int cache_file_flush_progress(struct cache *c, struct cfile *f,
			      cache_progress_fn fn, cache_stop_fn stop,
			      void *arg, uint64_t *destaged);

/* Note that the mount is busy, for idle destage. */
void cache_touch(struct cache *c);
/* Statistics (stats.h): a snapshot of everything, counters since the last
 * reset; cache_stats_reset starts the counters and maxima again. */
int cache_snapshot(struct cache *c, struct stat_snap *s);
int cache_stats_reset(struct cache *c);
uint64_t cache_counter(struct cache *c, enum stat_counter k);
/* For the file system's own figures: count an event, and record a latency
 * from a cache_clock() taken when the request came in (0: not timed). */
void cache_count(struct cache *c, enum stat_counter k, uint64_t v);
/* f's backing file was written outside the cache (by FUSE passthrough)
 * before this call: the next cache_fsync or cache_file_flush fsyncs it,
 * whatever f's mode. */
void cache_file_written_outside(struct cfile *f);
/* The file system's open handles (open_handles), delta +1 at an open and -1
 * at its release, and of them the ones FUSE passthrough serves (pt). */
void cache_note_handle(struct cache *c, int delta, int pt);
uint64_t cache_clock(struct cache *c);
void cache_note_latency(struct cache *c, enum stat_lat k, uint64_t t0);
struct cache_config *cache_config(struct cache *c);
/* Wake the destager after a tunable changed. */
void cache_kick(struct cache *c);

/* Told of every change made to a backing file (crash-state tests record them).
 */
struct cache_bk_hooks {
	void (*write)(void *arg, ino_t ino, const void *buf, size_t len,
		      uint64_t off);
	void (*truncate)(void *arg, ino_t ino, uint64_t size);
	void (*sync)(void *arg, ino_t ino);
	void *arg;
};
void cache_set_bk_hooks(struct cache *c, const struct cache_bk_hooks *h);

/* ------------------------------------------------------------------- ctl */

/* The daemon's control socket for a mount point (realpath). */
int ctl_socket_path(const char *mountpoint, char *out, size_t len);
#define CTL_DIR "/run/nvcachefs"
#define CTL_PROTO_VERSION 5
/* flags of a per-file request (fs/ctl.h) */
#define CTL_F_RECURSIVE 1u /* -r: directories, walked in the daemon */
#define CTL_F_PARTIAL 2u /* warm: what fits */
#define CTL_F_FLUSH 4u /* evict: destage first */

#endif
