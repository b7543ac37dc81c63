/* devices: one small interface to cache block devices and persistent memory. */
#ifndef NVC_DEV_H
#define NVC_DEV_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * A cache device is anything addressed in bytes that can be read and written
 * with buffers, offsets and lengths that are multiples of its sector
 * (dev_sector: a block device's logical block size, 512 in memory, 4 KiB for
 * a regular file; never more than DEV_ALIGN): a block device or regular
 * file driven through io_uring with O_DIRECT (dev_open), or memory (dev_mem_*,
 * for unit tests of the engine).  Every function returns 0 or -errno.
 *
 * I/O is issued in batches: dev_io_run() submits every element of the array
 * at once (they may target different devices, which then work in parallel)
 * and returns when all have completed.  Each calling thread owns its own
 * io_uring, created on first use and torn down at thread exit, so no lock is
 * taken on the I/O path.
 *
 * Whatever fails, dev_io_run() returns only when the kernel holds no request
 * of the batch any more (nothing can touch the array or the buffers
 * afterwards), and every element has its own res: 0 or the device's error.
 * It returns the first error in array order.  A DEV_FLUSH element flushes
 * its device's write cache; it is not ordered with the batch's writes.
 *
 * The device's error, never the ring's.  A ring is the kernel's queue, not
 * the device: when it cannot take or run a request (no ring to be had, no
 * room in it, a submission refused, a completion that says the kernel ran
 * short: -EAGAIN, -EBUSY, -ENOMEM, -EINTR, -ECANCELED, see dev_refusal), the
 * request is carried out again synchronously on the calling thread, with
 * plain system calls on the device's descriptor, and its result is what
 * they return.  So a res other than 0 is the answer of the device (or of
 * dev_io_check: a fenced device, an offset out of range): the cache may take
 * it for the device's failure (cache/data/io.c, note_dev_error).  A short
 * transfer is finished the same way, with the request's own durability: a
 * fua write that completes with res 0 is durable however it was done.
 */

#define DEV_ALIGN 4096u

enum dev_op { DEV_READ, DEV_WRITE, DEV_FLUSH };

struct dev;

struct dev_io {
	struct dev *dev;
	enum dev_op op;
	void *buf;
	uint64_t off;
	uint32_t len;
	int fua; /* a write that is durable when it completes (res 0): kept
		    by every way it may be done (dev_io_finish) */
	int res; /* 0 or -errno, filled in by dev_io_run */
};

/*
 * Asynchronous I/O on a ring owned by one thread (aring.c): each queued
 * request completes once, through its callback, run by dev_aring_run() on
 * the owning thread.
 */
struct dev_aring;
struct dev_acb {
	void (*done)(struct dev_acb *cb);
	struct dev_io *io; /* the device I/O, or NULL (dev_aring_readable) */
	int res; /* 0 or -errno */
	/* the ring's own, set when queued */
	uint64_t t0;
	int ran; /* done when queued (a shadowed write, no room): res is final */
	int fd, exclusive; /* a poll's (dev_aring_readable) */
	struct dev_acb *next; /* on the ring's list of what waits for a run */
};

int dev_aring_new(unsigned depth, struct dev_aring **out);
/* The calling thread owns the ring from now on. */
void dev_aring_adopt(struct dev_aring *r);
/* Only with no device I/O in flight (armed polls are cancelled). */
void dev_aring_free(struct dev_aring *r);
/* Queue a device I/O; -errno: nothing queued, io->res is the device's
 * answer (dev_io_check: a fenced device, out of range), never the ring's. */
int dev_aring_io(struct dev_aring *r, struct dev_io *io, struct dev_acb *cb);
/* Queue a wait until fd is readable (exclusive: one waiter per event); 0. */
int dev_aring_readable(struct dev_aring *r, int fd, struct dev_acb *cb,
		       int exclusive);
/* Submit, wait (if asked) and run the callbacks of what completed; -errno:
 * the kernel refused the submission (what it held is done, see aring.c). */
int dev_aring_run(struct dev_aring *r, int wait, uint64_t spin_ns);
/* The same, waiting at most timeout_ns (> 0): -ETIME when nothing came. */
int dev_aring_run_timeout(struct dev_aring *r, uint64_t spin_ns,
			  uint64_t timeout_ns);

/* Fault hooks, so that tests can make a device fail (issue 3 builds on it). */
struct dev_faults {
	int fail_reads; /* -errno returned by every read, 0 for none */
	int fail_writes; /* -errno returned by every write, 0 for none */
	unsigned flush_delay_us; /* an in-memory device's flush takes this long
				    (the flush counts when it ends) */
	int flushing; /* an in-memory device's flushes under way */
};

int dev_open(const char *path, struct dev **out);
int dev_mem_create(uint64_t size, struct dev **out);
/* A device that is not there: every I/O fails (a degraded mount). */
int dev_missing_create(const char *path, uint64_t size, struct dev **out);
void dev_close(struct dev *d);

uint64_t dev_size(const struct dev *d);
/* The smallest unit of its offsets and lengths: 512 ... DEV_ALIGN. */
uint32_t dev_sector(const struct dev *d);
const char *dev_path(const struct dev *d);
struct stat;
/* What d is, by its descriptor (fstat): st_rdev of a block device, st_dev
 * and st_ino of a regular file.  -ENODEV: an in-memory device or stand-in. */
int dev_stat(const struct dev *d, struct stat *st);
struct dev_faults *dev_faults(struct dev *d);

int dev_io_run(struct dev_io *ios, unsigned n);

/*
 * A shadow takes a copy of every write and flush that its device completes
 * (a cache device's rebuild onto its replacement, cache/mngt/rebuild.c): once
 * the device's own request succeeded, the same request goes to the shadow,
 * before dev_io_run() returns or the ring's callback runs.  So a write that
 * completed on the device is on the shadow too, and a flush of the device
 * is a flush of the shadow: what the device has durable, the shadow has.
 * A shadow's failure does not fail the request; dev_shadow_errors() counts
 * them.  A ring (dev_aring_io) runs a shadowed write synchronously.  Set
 * and cleared while requests run; NULL clears it.
 */
void dev_set_shadow(struct dev *d, struct dev *shadow);
int dev_shadow_errors(struct dev *d);

/*
 * Test hook: make the calling thread's io_uring calls fail, as the kernel
 * may (a signal, no memory, a full completion queue).  After skip calls
 * succeed, the next count calls return err instead of entering the kernel;
 * submissions and waits are counted separately.  NULL clears it.  It covers
 * the thread's dev_io_run ring; a dev_aring has its own (below).
 *
 * short_count: the next short_count reads and writes completed from this
 * thread's rings (either kind) are taken as short, half done, as the kernel
 * may complete them; the rest is then finished synchronously (dev_io_finish).
 */
struct dev_ring_faults {
	int submit_err;
	unsigned submit_skip, submit_count;
	int wait_err;
	unsigned wait_skip, wait_count;
	unsigned short_count;
};
void dev_set_ring_faults(const struct dev_ring_faults *f);

/*
 * Test hook of one dev_aring: one in every `every` submissions with
 * something to submit (the first, then every every-th) is refused with err
 * instead of entering the kernel; every 0: none.  dev_aring_new takes it
 * from NVC_TEST_RING_FAULTS="err,every[,first]" (err a negative errno; the
 * first refusal at submission number first, 0 by default) if that is set:
 * the integration tests' way into the daemon's workers.
 */
void dev_aring_set_faults(struct dev_aring *r, int err, unsigned every);

/*
 * A ring's refusal, not the device's answer: the kernel could not take or
 * run the request (-EAGAIN, -EBUSY, -ENOMEM, -EINTR, -ECANCELED).  A request
 * whose ring says so is done again synchronously (above); should the plain
 * system calls too keep saying so for a second, the request fails with it,
 * and the cache does not take that for the device's failure.
 */
int dev_refusal(int res);
/* Device requests done synchronously because a ring refused them, in this
 * process so far (the statistics' ring_refusals). */
uint64_t dev_ring_refusals(void);

/*
 * An observer sees every completed request to a device: its operation,
 * length, result and latency (submission to completion, in ns; 0 when the
 * observer did not ask for timing).  The statistics use it; it runs on the
 * I/O path, so it must be short and must not block.
 */
typedef void (*dev_observe_fn)(void *arg, enum dev_op op, uint32_t len, int res,
			       uint64_t ns);
void dev_set_observer(struct dev *d, dev_observe_fn fn, void *arg, int timing);
/*
 * A lock never held across d's I/O (cache/core/core.h: c->lock): in debug
 * builds every request asserts that the calling thread does not hold it.
 * NULL: none.
 */
void dev_set_nolock(struct dev *d, pthread_mutex_t *m);
/* The calling thread holds m: 1, else 0; always 0 in NDEBUG builds and
 * where the C library records no owner (glibc does).  For assertions. */
int dev_mutex_mine(pthread_mutex_t *m);
int dev_read(struct dev *d, void *buf, uint32_t len, uint64_t off);
int dev_write(struct dev *d, const void *buf, uint32_t len, uint64_t off);
/* A write that is durable when it returns. */
int dev_write_fua(struct dev *d, const void *buf, uint32_t len, uint64_t off);
/* Spin this long for a completion before sleeping (0: always sleep). */
void dev_set_poll(uint64_t ns);
/* Flush the device's volatile write cache. */
int dev_flush(struct dev *d);

/* An aligned buffer for device I/O; free with free(). */
void *dev_alloc_buf(size_t len);

/*
 * Persistent memory: a byte-addressable region that survives the process
 * (a DAX file, or a file on any file system, mapped through libpmem), or plain
 * memory for unit tests.  pm_persist() makes a range durable: cache-line
 * flushes on real persistent memory, msync elsewhere.
 */
struct rec_log;
struct stat;

struct pm_region {
	void *addr;
	size_t len;
	int is_pmem; /* pmem_is_pmem(): flushes instead of msync */
	int is_mem; /* plain memory, unit tests only */
	int lock_fd; /* holds an exclusive flock while mapped */
	struct rec_log *rec; /* recording region (crash tests) */
	int rec_id;
	struct dev
		*bdev; /* a block device: a RAM copy, persisted by FUA writes */
	size_t loaded; /* bytes of the block device read into the copy */
	int missing; /* memory standing in for a device that is not there */
	struct pm_faults *faults; /* plain memory: shared by copies */
	int rec_blk; /* recording region persisted like a block device (tests) */
	int created; /* pm_map made the file: pm_unlink_created removes it */
	dev_t created_dev; /* the file mapped (st_dev, st_ino) */
	ino_t created_ino;
};

/* Tests: a region of plain memory that fails its writes (pm_write writes
 * nothing, pm_persist reports the error) with this -errno; 0: works. */
struct pm_faults {
	int fail_write;
};

/* pm_map's create: a file is made if there is none (PM_CREATE), or must be
 * made: an existing regular file is -EEXIST (PM_NEW); a device is taken. */
#define PM_CREATE 1
#define PM_NEW 2

/*
 * Map the region at path: a block device, or a file, created (create != 0)
 * at len bytes if it does not exist.  Nothing is ever created on the file
 * system /dev is on (devtmpfs: RAM): a path there that does not exist, or is
 * not a device, is a device that is not there, -ENODEV.  The place is opened
 * by pm_open_place; pm_map_err says in err why a place was refused.
 */
int pm_map(const char *path, size_t len, int create, struct pm_region *out);
int pm_map_err(const char *path, size_t len, int create, struct pm_region *out,
	       char *err, size_t errlen);
/*
 * Open the place of a metadata mirror without following a name that someone
 * else could have changed: the last component is never a symbolic link
 * (-ELOOP), but a root's link on the file system /dev is on (udev's names) to
 * a device; with create a missing file is made O_CREAT | O_EXCL | O_NOFOLLOW,
 * mode 0600 (*created = 1).  What was opened is judged by fstat of the
 * descriptor (*st): a regular file owned by the daemon's user (else -EPERM),
 * a block or character device (owned by root or that user), else -EINVAL;
 * with PM_NEW, a regular file found is -EEXIST.  Returns an O_PATH (or, for a
 * file made, O_RDWR) descriptor, or -errno, said in err when refused (err
 * may be NULL).  A file made and then refused is removed again.
 */
int pm_open_place(const char *path, int create, struct stat *st, int *created,
		  char *err, size_t errlen);
/* fd opened again with flags, through the descriptor, not by any name. */
int pm_reopen(int fd, int flags);
/* Remove the file pm_map made for r at path, if path still names it. */
void pm_unlink_created(const struct pm_region *r, const char *path);
int pm_mem_create(size_t len, struct pm_region *out);
/* Make sure the first len bytes are there (a block device is read on demand). */
int pm_load(struct pm_region *r, size_t len);
int pm_persist(const struct pm_region *r, const void *addr, size_t len);
/* Copy len bytes to offset off of the region and make them durable. */
int pm_write(const struct pm_region *r, size_t off, const void *src,
	     size_t len);
void pm_unmap(struct pm_region *r);

/*
 * Recording, for the crash-state tests: in-memory devices and regions that log
 * every write, flush and persist, in the order they happened, so that a test
 * can later build any state a power loss could have left.
 */
enum rec_kind {
	REC_DEV_WRITE, /* data: the bytes written */
	REC_DEV_FLUSH, /* off: the index of its REC_DEV_FLUSH_BEGIN */
	REC_PM_PERSIST, /* data: the persisted bytes */
	REC_MARK, /* the test's own events */
	REC_BK_WRITE,
	REC_BK_TRUNC,
	REC_BK_SYNC, /* off: the index of its REC_BK_SYNC_BEGIN */
	/* a block-device mirror's page write (pm_rec_create_blk): the page as
	 * it was when the write was issued, and its completion (off: the index
	 * of its REC_PM_PAGE_BEGIN); its REC_PM_PERSIST comes after the last
	 * page, when pm_persist returns */
	REC_PM_PAGE_BEGIN,
	REC_PM_PAGE_END,
	REC_BK_SYNC_BEGIN,
	REC_DEV_FLUSH_BEGIN, /* REC_DEV_FLUSH comes when it completed, its off
				the index of this */
};

struct rec_event {
	enum rec_kind kind;
	int target;
	uint64_t off;
	uint32_t len;
	int fua;
	uint8_t *data;
	int thread; /* which thread logged it: 1, 2, ... in order of first event */
};

int rec_log_new(struct rec_log **out);
void rec_log_free(struct rec_log *l);
size_t rec_log_count(struct rec_log *l);
const struct rec_event *rec_log_get(struct rec_log *l, size_t i);
/* Append an event; returns its index. */
size_t rec_log_add(struct rec_log *l, enum rec_kind kind, int target,
		   uint64_t off, const void *data, uint32_t len, int fua);
int dev_rec_create(struct rec_log *l, int target, uint64_t size,
		   struct dev **out);
int pm_rec_create(struct rec_log *l, int target, size_t len,
		  struct pm_region *out);
/* A recording region persisted the way a block-device mirror is: whole 4 KiB
 * pages, each logged as a write that starts and later completes. */
int pm_rec_create_blk(struct rec_log *l, int target, size_t len,
		      struct pm_region *out);
/* Tests: run as a recording block-device mirror's page write at off starts
 * (NULL: nothing); it may hold the write. */
extern void (*pm_test_page_write)(const struct pm_region *r, size_t off);

#endif
