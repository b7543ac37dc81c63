/* devices: cache devices through io_uring and O_DIRECT, and in memory for
 * tests. */
#define _GNU_SOURCE
#include "dev.h"
#include "dev_int.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <liburing.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

struct rec_log {
	pthread_mutex_t lock;
	struct rec_event *ev;
	size_t n, cap;
};

/* the logging thread's number, given at its first event */
static __thread int rec_thread;
static int rec_threads;


#define RING_DEPTH 128

static pthread_key_t ring_key;
static pthread_once_t ring_once = PTHREAD_ONCE_INIT;

static void ring_free(void *p)
{
	struct io_uring *ring = p;

	io_uring_queue_exit(ring);
	free(ring);
}

static void ring_key_init(void)
{
	pthread_key_create(&ring_key, ring_free);
}

static int ring_get(struct io_uring **out)
{
	struct io_uring *ring;
	int ret;

	pthread_once(&ring_once, ring_key_init);
	ring = pthread_getspecific(ring_key);
	if (ring) {
		*out = ring;
		return 0;
	}
	ring = calloc(1, sizeof(*ring));
	if (!ring)
		return -ENOMEM;
	ret = io_uring_queue_init(RING_DEPTH, ring, 0);
	if (ret < 0)
		goto err_free;
	pthread_setspecific(ring_key, ring);
	*out = ring;
	return 0;
err_free:
	free(ring);
	return ret;
}

void *dev_alloc_buf(size_t len)
{
	void *p;

	if (posix_memalign(&p, DEV_ALIGN, len ? len : DEV_ALIGN))
		return NULL;
	return p;
}

int dev_open(const char *path, struct dev **out)
{
	struct stat st;
	int tries;
	struct dev *d;
	int ret;

	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->kind = DEV_KIND_URING;
	d->path = strdup(path);
	if (!d->path) {
		ret = -ENOMEM;
		goto err_free;
	}
	if (stat(path, &st)) {
		ret = -errno;
		goto err_path;
	}
	/*
	 * A block device is ours alone: not mounted, not in another cache.
	 * A daemon killed a moment ago still holds it until the kernel has
	 * torn down its io_uring, which happens after the process is gone:
	 * "busy" is retried for up to 3 s before it is believed.
	 */
	tries = 0;
	do
		d->fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC |
					   (S_ISBLK(st.st_mode) ? O_EXCL : 0));
	while (d->fd < 0 && errno == EBUSY && dev_busy_wait(&tries));
	if (d->fd < 0) {
		ret = -errno;
		goto err_path;
	}
	if (fstat(d->fd, &st)) {
		ret = -errno;
		goto err_close;
	}
	d->sector = DEV_ALIGN; /* a regular file: its file system's page */
	if (S_ISBLK(st.st_mode)) {
		int lbs;

		if (ioctl(d->fd, BLKGETSIZE64, &d->size)) {
			ret = -errno;
			goto err_close;
		}
		if (!ioctl(d->fd, BLKSSZGET, &lbs) && lbs >= 512 &&
		    lbs <= (int)DEV_ALIGN && !(DEV_ALIGN % lbs))
			d->sector = lbs;
	} else if (S_ISREG(st.st_mode)) {
		d->size = st.st_size;
	} else {
		ret = -ENODEV;
		goto err_close;
	}
	*out = d;
	return 0;
err_close:
	close(d->fd);
err_path:
	free(d->path);
err_free:
	free(d);
	return ret;
}

static struct dev *dev_new_mem(const char *path, uint64_t size)
{
	struct dev *d = calloc(1, sizeof(*d));

	if (!d)
		return NULL;
	d->kind = DEV_KIND_MEM;
	d->fd = -1;
	d->size = size;
	d->sector = 512;
	d->path = strdup(path);
	if (!d->path) {
		free(d);
		return NULL;
	}
	return d;
}

/* An in-memory device named name, zeroed. */
static int dev_mem_named(const char *name, uint64_t size, struct dev **out)
{
	struct dev *d = dev_new_mem(name, size);

	if (!d)
		return -ENOMEM;
	d->mem = calloc(1, size);
	if (!d->mem) {
		dev_close(d);
		return -ENOMEM;
	}
	*out = d;
	return 0;
}

int dev_mem_create(uint64_t size, struct dev **out)
{
	return dev_mem_named("mem", size, out);
}

int dev_missing_create(const char *path, uint64_t size, struct dev **out)
{
	struct dev *d = dev_new_mem(path, size);

	if (!d)
		return -ENOMEM;
	d->faults.fail_reads = -ENODEV;
	d->faults.fail_writes = -ENODEV;
	*out = d;
	return 0;
}

void dev_close(struct dev *d)
{
	if (!d)
		return;
	if (d->fd >= 0)
		close(d->fd);
	free(d->mem);
	free(d->path);
	free(d);
}

uint64_t dev_size(const struct dev *d)
{
	return d->size;
}

uint32_t dev_sector(const struct dev *d)
{
	return d->sector;
}

const char *dev_path(const struct dev *d)
{
	return d->path;
}

int dev_stat(const struct dev *d, struct stat *st)
{
	if (d->kind != DEV_KIND_URING || d->fd < 0)
		return -ENODEV;
	return fstat(d->fd, st) ? -errno : 0;
}

struct dev_faults *dev_faults(struct dev *d)
{
	return &d->faults;
}

int dev_io_check(const struct dev_io *io)
{
	/* a fenced device (faults set) fails with its own error, whatever
	 * size the device it stands for has today */
	if (io->op == DEV_READ && io->dev->faults.fail_reads)
		return io->dev->faults.fail_reads;
	if (io->op != DEV_READ && io->dev->faults.fail_writes)
		return io->dev->faults.fail_writes;
	if (io->off + io->len > io->dev->size || io->off + io->len < io->off)
		return -EINVAL;
	return 0;
}

static size_t rec_add_locked(struct rec_log *l, enum rec_kind kind, int target,
			     uint64_t off, const void *data, uint32_t len,
			     int fua)
{
	struct rec_event *e;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 1024;
		struct rec_event *ev = realloc(l->ev, cap * sizeof(*ev));

		if (!ev)
			abort(); /* a test harness: running out is fatal */
		l->ev = ev;
		l->cap = cap;
	}
	e = &l->ev[l->n];
	if (!rec_thread)
		rec_thread =
			__atomic_add_fetch(&rec_threads, 1, __ATOMIC_RELAXED);
	e->thread = rec_thread;
	e->kind = kind;
	e->target = target;
	e->off = off;
	e->len = len;
	e->fua = fua;
	e->data = NULL;
	if (data && len) {
		e->data = malloc(len);
		if (!e->data)
			abort();
		memcpy(e->data, data, len);
	}
	return l->n++;
}

size_t rec_log_add(struct rec_log *l, enum rec_kind kind, int target,
		   uint64_t off, const void *data, uint32_t len, int fua)
{
	size_t i;

	pthread_mutex_lock(&l->lock);
	i = rec_add_locked(l, kind, target, off, data, len, fua);
	pthread_mutex_unlock(&l->lock);
	return i;
}

int rec_log_new(struct rec_log **out)
{
	struct rec_log *l = calloc(1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	pthread_mutex_init(&l->lock, NULL);
	*out = l;
	return 0;
}

void rec_log_free(struct rec_log *l)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		free(l->ev[i].data);
	free(l->ev);
	free(l);
}

size_t rec_log_count(struct rec_log *l)
{
	size_t n;

	pthread_mutex_lock(&l->lock);
	n = l->n;
	pthread_mutex_unlock(&l->lock);
	return n;
}

const struct rec_event *rec_log_get(struct rec_log *l, size_t i)
{
	return &l->ev[i];
}

int dev_rec_create(struct rec_log *l, int target, uint64_t size,
		   struct dev **out)
{
	char name[32];
	int ret;

	snprintf(name, sizeof(name), "rec%d", target);
	ret = dev_mem_named(name, size, out);
	if (ret)
		return ret;
	(*out)->rec = l;
	(*out)->rec_id = target;
	return 0;
}

int pm_rec_create(struct rec_log *l, int target, size_t len,
		  struct pm_region *out)
{
	int ret = pm_mem_create(len, out);

	if (!ret) {
		out->rec = l;
		out->rec_id = target;
	}
	return ret;
}

/*
 * A recording device's flush takes a moment, like a real one: its start and
 * its completion are logged, and it covers only the writes that completed
 * before it started.
 */
static void rec_flush(struct rec_log *l, int target)
{
	size_t b = rec_log_add(l, REC_DEV_FLUSH_BEGIN, target, 0, NULL, 0, 0);

	usleep(200);
	rec_log_add(l, REC_DEV_FLUSH, target, b, NULL, 0, 0);
}

int pm_rec_create_blk(struct rec_log *l, int target, size_t len,
		      struct pm_region *out)
{
	int ret = pm_rec_create(l, target, len, out);

	if (!ret)
		out->rec_blk = 1;
	return ret;
}

void dev_io_mem(struct dev_io *io)
{
	if (io->op == DEV_FLUSH) {
		if (io->dev->rec)
			rec_flush(io->dev->rec, io->dev->rec_id);
	} else if (io->op == DEV_READ) {
		memcpy(io->buf, io->dev->mem + io->off, io->len);
	} else if (io->dev->rec) {
		/* applied and logged under one lock: the log order is the real
		 * one */
		pthread_mutex_lock(&io->dev->rec->lock);
		memcpy(io->dev->mem + io->off, io->buf, io->len);
		rec_add_locked(io->dev->rec, REC_DEV_WRITE, io->dev->rec_id,
			       io->off, io->buf, io->len, io->fua);
		pthread_mutex_unlock(&io->dev->rec->lock);
	} else {
		memcpy(io->dev->mem + io->off, io->buf, io->len);
	}
	io->res = 0;
}

static uint64_t ring_refusals;

int dev_busy_wait(int *tries)
{
	if (++*tries > 60)
		return 0;
	usleep(50000);
	return 1;
}

uint64_t dev_ring_refusals(void)
{
	return __atomic_load_n(&ring_refusals, __ATOMIC_RELAXED);
}

void dev_note_refusal(void)
{
	__atomic_add_fetch(&ring_refusals, 1, __ATOMIC_RELAXED);
}

int dev_refusal(int res)
{
	return res == -EAGAIN || res == -EBUSY || res == -ENOMEM ||
	       res == -EINTR || res == -ECANCELED;
}

/* A system call the kernel refused for want of something is tried again
 * for about a second (1 ms apart; a signal at once). */
#define SYNC_RETRIES 1000

static int sync_retry(int err, unsigned *tries)
{
	if (!dev_refusal(err) || ++*tries > SYNC_RETRIES)
		return 0;
	if (err != -EINTR)
		usleep(1000);
	return 1;
}

/*
 * The synchronous way of a request: the rest of a short transfer (rare, but
 * allowed by the kernel), or a whole request a ring could not take or run.
 * A fua write keeps its durability: its bytes go with RWF_DSYNC (a kernel
 * without it: a plain write, then fdatasync), so that a fua write reported
 * done is durable however much of it the ring did (issue 25, finding 2).
 */
int dev_io_finish(struct dev_io *io, uint32_t done)
{
	int fd = io->dev->fd, sync_after = 0;
	int flags = io->op == DEV_WRITE && io->fua ? RWF_DSYNC : 0;
	unsigned tries = 0;

	if (io->dev->kind == DEV_KIND_MEM) {
		assert(!done);
		dev_io_mem(io);
		return io->res;
	}
	if (io->op == DEV_FLUSH) {
		while (fdatasync(fd))
			if (!sync_retry(-errno, &tries))
				return -errno;
		return 0;
	}
	while (done < io->len) {
		struct iovec v = { .iov_base = (char *)io->buf + done,
				   .iov_len = io->len - done };
		ssize_t n =
			io->op == DEV_READ
				? preadv2(fd, &v, 1, io->off + done, 0)
				: pwritev2(fd, &v, 1, io->off + done, flags);

		if (n < 0 && flags && errno == EOPNOTSUPP) {
			flags = 0;
			sync_after = 1;
			continue;
		}
		if (n < 0 && sync_retry(-errno, &tries))
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		done += n;
	}
	while (sync_after && fdatasync(fd))
		if (!sync_retry(-errno, &tries))
			return -errno;
	return 0;
}

/*
 * Waiting for a completion by sleeping costs a wake-up, which on an idle,
 * virtualised CPU can take longer than the I/O itself.  A flash DIMM answers
 * in microseconds, so the submitting thread first spins on the completion
 * queue for up to poll_ns, and only then sleeps.  Spinning only pays while
 * CPUs are idle: once half the CPUs already spin, further waiters sleep, so
 * that under a deep queue the spinning does not take the CPU from the
 * threads with work to do.
 */
static uint64_t poll_ns = 30000;
static int spinners, max_spinners = 1;

void dev_set_poll(uint64_t ns)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	poll_ns = ns;
	max_spinners = cpus > 2 ? cpus / 2 : 1;
}

uint64_t dev_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static __thread struct dev_ring_faults ring_faults;
static __thread int ring_faults_on;

void dev_set_ring_faults(const struct dev_ring_faults *f)
{
	memset(&ring_faults, 0, sizeof(ring_faults));
	if (f)
		ring_faults = *f;
	ring_faults_on = f != NULL;
}

/* A short transfer the test hook makes of a whole one (done bytes). */
static int fault_short(const struct dev_io *io, int done)
{
	uint32_t half = io->len / 2 / io->dev->sector * io->dev->sector;

	if (!ring_faults.short_count || io->op == DEV_FLUSH ||
	    (uint32_t)done != io->len || !half)
		return done;
	ring_faults.short_count--;
	return half;
}

int dev_io_complete(struct dev_io *io, int res)
{
	if (__builtin_expect(ring_faults_on, 0) && res > 0)
		res = fault_short(io, res);
	if (res < 0 && dev_refusal(res)) {
		dev_note_refusal();
		return dev_io_finish(io, 0);
	}
	if (res < 0)
		return res;
	if (io->op == DEV_FLUSH)
		return 0;
	return dev_io_finish(io, res);
}

/* The injected error for this call, or 0 (the test hook above). */
static int fault_fires(unsigned *skip, unsigned *count, int err)
{
	if (*skip) {
		(*skip)--;
		return 0;
	}
	if (!*count)
		return 0;
	(*count)--;
	return err;
}

static int ring_submit_wait(struct io_uring *ring, unsigned wait_nr)
{
	if (__builtin_expect(ring_faults_on, 0)) {
		int err = fault_fires(&ring_faults.submit_skip,
				      &ring_faults.submit_count,
				      ring_faults.submit_err);

		if (err)
			return err;
	}
	return wait_nr ? io_uring_submit_and_wait(ring, wait_nr)
		       : io_uring_submit(ring);
}

/* Wait until nr completions are there; *cqe is the first. */
static int ring_wait(struct io_uring *ring, struct io_uring_cqe **cqe,
		     unsigned nr)
{
	if (__builtin_expect(ring_faults_on, 0)) {
		int err = fault_fires(&ring_faults.wait_skip,
				      &ring_faults.wait_count,
				      ring_faults.wait_err);

		if (err)
			return err;
	}
	return io_uring_wait_cqe_nr(ring, cqe, nr);
}

static int poll_cqe(struct io_uring *ring, struct io_uring_cqe **cqe)
{
	uint64_t until = dev_mono_ns() + poll_ns;
	unsigned spins = 0;

	while (io_uring_peek_cqe(ring, cqe)) {
		if ((++spins & 63) == 0 && dev_mono_ns() > until)
			return ring_wait(ring, cqe, 1);
		__builtin_ia32_pause();
	}
	return 0;
}

void dev_set_observer(struct dev *d, dev_observe_fn fn, void *arg, int timing)
{
	d->obs = fn;
	d->obs_arg = arg;
	d->obs_timing = timing;
}

void dev_observe(const struct dev_io *io, uint64_t t0)
{
	struct dev *d = io->dev;

	if (d->obs)
		d->obs(d->obs_arg, io->op, io->len, io->res,
		       d->obs_timing && t0 ? dev_mono_ns() - t0 : 0);
}

/*
 * One batch on the calling thread's ring.  inflight counts the requests the
 * kernel has taken and not yet completed to us; a batch returns only when it
 * is 0, so that no request of it can touch the caller's memory afterwards.
 * A request that could not be submitted is turned into a NOP that belongs to
 * nobody (user data NULL): whoever submits it later reaps it and ignores it.
 */
struct batch {
	struct io_uring *ring;
	unsigned inflight;
	int err; /* no ring, or submission given up: the rest fails with it */
	int spin;
	uint64_t t0;
};

/* Transient refusals of a submission are retried this often (about 1 s). */
#define SUBMIT_RETRIES 1000

static int transient(int err)
{
	return err == -EINTR || err == -EAGAIN || err == -EBUSY;
}

static void batch_complete(struct batch *b, struct io_uring_cqe *cqe)
{
	struct dev_io *c = io_uring_cqe_get_data(cqe);
	int res = cqe->res;

	io_uring_cqe_seen(b->ring, cqe);
	assert(b->inflight > 0);
	b->inflight--;
	if (!c)
		return; /* a given-up request's NOP */
	c->res = dev_io_complete(c, res);
	dev_observe(c, b->t0);
}

/*
 * Reap completions until at most left requests are in flight.  This never
 * gives up: until a request completes, the kernel may still write to its
 * buffer, and cancelling does not stop I/O already at the device.  A wait
 * that fails for good is replaced by looking at the queue every millisecond.
 */
static void batch_reap(struct batch *b, unsigned left)
{
	while (b->inflight > left) {
		unsigned nr = b->inflight - left;
		struct io_uring_cqe *cqe;
		int ret = b->spin ? poll_cqe(b->ring, &cqe)
				  : ring_wait(b->ring, &cqe, nr);

		if (ret && !transient(ret)) {
			usleep(1000);
			ret = io_uring_peek_cqe(b->ring, &cqe);
		}
		if (!ret)
			batch_complete(b, cqe);
	}
}

/*
 * Hand everything prepared to the kernel, in the same call waiting until at
 * most left requests are in flight (UINT_MAX: no waiting).  A transient
 * refusal is retried, after a completion (which frees what the kernel ran
 * short of) or a millisecond.  Returns 0, or the error that left requests
 * unsubmitted.
 */
static int batch_submit(struct batch *b, unsigned left)
{
	unsigned ready, tries = 0;

	while ((ready = io_uring_sq_ready(b->ring))) {
		unsigned all = b->inflight + ready;
		int ret =
			ring_submit_wait(b->ring, all > left ? all - left : 0);

		if (ret > 0) {
			b->inflight += ret;
			tries = 0;
			continue;
		}
		if (!ret)
			ret = -EAGAIN; /* nothing taken */
		if (ret == -EINTR)
			continue;
		if (!transient(ret) || ++tries > SUBMIT_RETRIES)
			return ret;
		if (b->inflight)
			batch_reap(b, b->inflight - 1);
		else
			usleep(1000);
	}
	return 0;
}

/*
 * The kernel will not take the requests still in the submission queue: each
 * becomes a NOP that belongs to nobody (the queue is the kernel's to read),
 * and is carried out synchronously here instead.  The rest of the batch too
 * (b->err).  The batch's requests are not ordered with each other, so doing
 * these while others are in flight changes nothing that was promised.
 */
static void batch_abandon(struct batch *b, int err)
{
	struct io_uring_sq *sq = &b->ring->sq;
	unsigned shift = b->ring->flags & IORING_SETUP_SQE128 ? 1 : 0;
	unsigned i;

	for (i = *sq->khead; i != sq->sqe_tail; i++) {
		struct io_uring_sqe *sqe =
			&sq->sqes[(i & sq->ring_mask) << shift];
		struct dev_io *io = (struct dev_io *)(uintptr_t)sqe->user_data;

		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data(sqe, NULL);
		if (io) {
			dev_note_refusal();
			io->res = dev_io_finish(io, 0);
			dev_observe(io, b->t0);
		}
	}
	b->err = err;
}

/* The submission queue is full: submit it and reap everything, as at the end.
 */
static int batch_make_room(struct batch *b)
{
	int ret = batch_submit(b, 0);

	if (ret)
		batch_abandon(b, ret);
	batch_reap(b, 0);
	return ret;
}

/* Prepare io's request; 0, or -errno if it cannot be queued (the ring's
 * error: io is then done synchronously). */
static int batch_queue(struct batch *b, struct dev_io *io)
{
	struct io_uring_sqe *sqe;
	int ret;

	if (b->err)
		return b->err;
	if (!b->ring) {
		ret = ring_get(&b->ring);
		if (ret)
			return b->err = ret;
	}
	sqe = io_uring_get_sqe(b->ring);
	if (!sqe) {
		ret = batch_make_room(b);
		if (ret)
			return ret;
		sqe = io_uring_get_sqe(b->ring);
		if (!sqe) /* full of NOPs nobody could submit */
			return b->err = -EBUSY;
	}
	if (io->op == DEV_READ)
		io_uring_prep_read(sqe, io->dev->fd, io->buf, io->len, io->off);
	else if (io->op == DEV_WRITE)
		io_uring_prep_write(sqe, io->dev->fd, io->buf, io->len,
				    io->off);
	else
		io_uring_prep_fsync(sqe, io->dev->fd, IORING_FSYNC_DATASYNC);
	if (io->op == DEV_WRITE && io->fua)
		sqe->rw_flags = RWF_DSYNC;
	io_uring_sqe_set_data(sqe, io);
	return 0;
}

/* Submit the rest and reap everything: one system call in the common case. */
static void batch_finish(struct batch *b)
{
	int ret;

	if (!b->inflight && (b->err || !io_uring_sq_ready(b->ring)))
		return;
	b->spin =
		poll_ns && __atomic_add_fetch(&spinners, 1, __ATOMIC_RELAXED) <=
				   max_spinners;
	if (poll_ns && !b->spin)
		__atomic_sub_fetch(&spinners, 1, __ATOMIC_RELAXED);
	ret = b->err ? 0 : batch_submit(b, b->spin ? UINT_MAX : 0);
	if (ret)
		batch_abandon(b, ret);
	batch_reap(b, 0);
	if (b->spin)
		__atomic_sub_fetch(&spinners, 1, __ATOMIC_RELAXED);
}

/*
 * A flush runs as fdatasync(2) on the calling thread.  io_uring cannot issue
 * a flush without blocking, so its IORING_OP_FSYNC always goes to an io-wq
 * worker: two thread hand-overs (a wake-up of the worker, then of the waiter)
 * around a flush that the loop or NVMe driver answers in microseconds, and a
 * caller that waits for it anyway (dev_io_run returns when all is done).
 */
static void dev_flush_now(struct dev_io *io)
{
	io->res = dev_io_finish(io, 0);
}

void dev_set_shadow(struct dev *d, struct dev *shadow)
{
	assert(!shadow || !shadow->shadow);
	__atomic_store_n(&d->shadow, shadow, __ATOMIC_RELEASE);
}

int dev_shadow_errors(struct dev *d)
{
	return __atomic_load_n(&d->shadow_errors, __ATOMIC_ACQUIRE);
}

struct dev *dev_shadow_of(const struct dev_io *io)
{
	if (io->op == DEV_READ)
		return NULL;
	return __atomic_load_n(&io->dev->shadow, __ATOMIC_ACQUIRE);
}

static int dev_io_batch(struct dev_io *ios, unsigned n);

#define SHADOW_BATCH 32

/* Run the k copies in cp; a failed one is counted on its device (from). */
static void shadow_run(struct dev_io *cp, struct dev **from, unsigned k)
{
	unsigned i;

	dev_io_batch(cp, k);
	for (i = 0; i < k; i++)
		if (cp[i].res)
			__atomic_add_fetch(&from[i]->shadow_errors, 1,
					   __ATOMIC_ACQ_REL);
}

/* The shadows' copies of the requests in ios that succeeded. */
static void shadow_copies(struct dev_io *ios, unsigned n)
{
	struct dev_io cp[SHADOW_BATCH];
	struct dev *from[SHADOW_BATCH];
	unsigned i, k = 0;

	for (i = 0; i < n; i++) {
		struct dev *sh = dev_shadow_of(&ios[i]);

		if (!sh || ios[i].res)
			continue;
		cp[k] = ios[i];
		cp[k].dev = sh;
		from[k] = ios[i].dev;
		if (++k == SHADOW_BATCH) {
			shadow_run(cp, from, k);
			k = 0;
		}
	}
	if (k)
		shadow_run(cp, from, k);
}

static int dev_io_batch(struct dev_io *ios, unsigned n)
{
	struct batch b = { 0 };
	unsigned i;
	int first = 0;

	for (i = 0; i < n && !b.t0; i++)
		if (ios[i].dev->obs_timing)
			b.t0 = dev_mono_ns();
	for (i = 0; i < n; i++) {
		struct dev_io *io = &ios[i];

		io->res = dev_io_check(io);
		if (!io->res && io->dev->kind == DEV_KIND_MEM)
			dev_io_mem(io);
		else if (!io->res && io->op == DEV_FLUSH)
			dev_flush_now(io);
		else if (!io->res && !batch_queue(&b, io))
			continue; /* observed when it completes */
		else if (!io->res) { /* the ring cannot take it: done here */
			dev_note_refusal();
			io->res = dev_io_finish(io, 0);
		}
		dev_observe(io, b.t0);
	}
	if (b.ring)
		batch_finish(&b);
	assert(!b.inflight);
	for (i = 0; i < n; i++)
		if (ios[i].res && !first)
			first = ios[i].res;
	return first;
}

void dev_set_nolock(struct dev *d, pthread_mutex_t *m)
{
	d->nolock = m;
}

int dev_io_run(struct dev_io *ios, unsigned n)
{
	unsigned i;
	int first;

	for (i = 0; i < n; i++)
		assert(!dev_mutex_mine(ios[i].dev->nolock));
	first = dev_io_batch(ios, n);

	for (i = 0; i < n; i++)
		if (dev_shadow_of(&ios[i])) {
			shadow_copies(ios, n);
			break;
		}
	return first;
}

int dev_read(struct dev *d, void *buf, uint32_t len, uint64_t off)
{
	struct dev_io io = {
		.dev = d, .op = DEV_READ, .buf = buf, .off = off, .len = len
	};

	return dev_io_run(&io, 1);
}

static int dev_write_io(struct dev *d, const void *buf, uint32_t len,
			uint64_t off, int fua)
{
	struct dev_io io = { .dev = d,
			     .op = DEV_WRITE,
			     .buf = (void *)buf,
			     .off = off,
			     .len = len,
			     .fua = fua };

	return dev_io_run(&io, 1);
}

int dev_write(struct dev *d, const void *buf, uint32_t len, uint64_t off)
{
	return dev_write_io(d, buf, len, off, 0);
}

int dev_write_fua(struct dev *d, const void *buf, uint32_t len, uint64_t off)
{
	return dev_write_io(d, buf, len, off, 1);
}

int dev_flush(struct dev *d)
{
	struct dev_io io = { .dev = d, .op = DEV_FLUSH };

	if (d->kind == DEV_KIND_MEM && d->faults.flush_delay_us) {
		/* tests: a slow flush, under way until it ends */
		__atomic_add_fetch(&d->faults.flushing, 1, __ATOMIC_SEQ_CST);
		usleep(d->faults.flush_delay_us);
		__atomic_sub_fetch(&d->faults.flushing, 1, __ATOMIC_SEQ_CST);
	}
	return dev_io_run(&io, 1);
}
