/* devices: cache devices through io_uring and O_DIRECT, and in memory for
 * tests. */
#define _GNU_SOURCE
#include "dev.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum dev_kind { DEV_KIND_URING, DEV_KIND_MEM };

struct rec_log {
	pthread_mutex_t lock;
	struct rec_event *ev;
	size_t n, cap;
};

/* the logging thread's number, given at its first event */
static __thread int rec_thread;
static int rec_threads;

struct dev {
	enum dev_kind kind;
	struct rec_log *rec;
	int rec_id;
	int fd;
	uint64_t size;
	char *path;
	unsigned char *mem;
	struct dev_faults faults;
	dev_observe_fn obs;
	void *obs_arg;
	int obs_timing;
};

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
	for (tries = 0;; tries++) {
		d->fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC |
					   (S_ISBLK(st.st_mode) ? O_EXCL : 0));
		if (d->fd >= 0 || errno != EBUSY || tries >= 60)
			break;
		usleep(50000);
	}
	if (d->fd < 0) {
		ret = -errno;
		goto err_path;
	}
	if (fstat(d->fd, &st)) {
		ret = -errno;
		goto err_close;
	}
	if (S_ISBLK(st.st_mode)) {
		if (ioctl(d->fd, BLKGETSIZE64, &d->size)) {
			ret = -errno;
			goto err_close;
		}
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
	d->path = strdup(path);
	if (!d->path) {
		free(d);
		return NULL;
	}
	return d;
}

int dev_mem_create(uint64_t size, struct dev **out)
{
	struct dev *d = dev_new_mem("mem", size);

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

const char *dev_path(const struct dev *d)
{
	return d->path;
}

struct dev_faults *dev_faults(struct dev *d)
{
	return &d->faults;
}

static int io_check(const struct dev_io *io)
{
	if (io->off + io->len > io->dev->size || io->off + io->len < io->off)
		return -EINVAL;
	if (io->op == DEV_READ && io->dev->faults.fail_reads)
		return io->dev->faults.fail_reads;
	if (io->op == DEV_WRITE && io->dev->faults.fail_writes)
		return io->dev->faults.fail_writes;
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
		rec_thread = __atomic_add_fetch(&rec_threads, 1,
						__ATOMIC_RELAXED);
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
	int ret = dev_mem_create(size, out);

	if (!ret) {
		(*out)->rec = l;
		(*out)->rec_id = target;
	}
	return ret;
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

static void io_mem(struct dev_io *io)
{
	if (io->op == DEV_READ) {
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

/* Finish a short transfer synchronously; rare, but allowed by the kernel. */
static int io_finish(struct dev_io *io, uint32_t done)
{
	while (done < io->len) {
		ssize_t n;

		if (io->op == DEV_READ)
			n = pread(io->dev->fd, (char *)io->buf + done,
				  io->len - done, io->off + done);
		else
			n = pwrite(io->dev->fd, (char *)io->buf + done,
				   io->len - done, io->off + done);
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		done += n;
	}
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

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static int poll_cqe(struct io_uring *ring, struct io_uring_cqe **cqe)
{
	uint64_t until = mono_ns() + poll_ns;
	unsigned spins = 0;

	while (io_uring_peek_cqe(ring, cqe)) {
		if ((++spins & 63) == 0 && mono_ns() > until)
			return io_uring_wait_cqe(ring, cqe);
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

static void observe(const struct dev_io *io, uint64_t t0)
{
	struct dev *d = io->dev;

	if (d->obs)
		d->obs(d->obs_arg, io->op, io->len, io->res,
		       d->obs_timing && t0 ? mono_ns() - t0 : 0);
}

int dev_io_run(struct dev_io *ios, unsigned n)
{
	struct io_uring *ring = NULL;
	unsigned i, queued = 0, done = 0;
	int ret, first = 0, spin = 0;
	uint64_t t0 = 0;

	for (i = 0; i < n && !t0; i++)
		if (ios[i].dev->obs_timing)
			t0 = mono_ns();

	for (i = 0; i < n; i++) {
		struct dev_io *io = &ios[i];
		struct io_uring_sqe *sqe;

		io->res = io_check(io);
		if (io->res) {
			observe(io, t0);
			continue;
		}
		if (io->dev->kind == DEV_KIND_MEM) {
			io_mem(io);
			observe(io, t0);
			continue;
		}
		if (!ring) {
			ret = ring_get(&ring);
			if (ret)
				return ret;
		}
		sqe = io_uring_get_sqe(ring);
		if (!sqe) {
			/* ring full: drain what is queued, then go on */
			ret = io_uring_submit_and_wait(ring, queued - done);
			(void)ret;
			while (done < queued) {
				struct io_uring_cqe *cqe;
				struct dev_io *c;

				if (io_uring_wait_cqe(ring, &cqe))
					break;
				c = io_uring_cqe_get_data(cqe);
				c->res = cqe->res < 0 ? cqe->res
						      : io_finish(c, cqe->res);
				io_uring_cqe_seen(ring, cqe);
				observe(c, t0);
				done++;
			}
			sqe = io_uring_get_sqe(ring);
			if (!sqe)
				return -EBUSY;
		}
		if (io->op == DEV_READ)
			io_uring_prep_read(sqe, io->dev->fd, io->buf, io->len,
					   io->off);
		else
			io_uring_prep_write(sqe, io->dev->fd, io->buf, io->len,
					    io->off);
		if (io->op == DEV_WRITE && io->fua)
			sqe->rw_flags = RWF_DSYNC;
		io_uring_sqe_set_data(sqe, io);
		queued++;
	}
	if (queued > done) {
		spin = poll_ns &&
		       __atomic_add_fetch(&spinners, 1, __ATOMIC_RELAXED) <=
			       max_spinners;
		if (poll_ns && !spin)
			__atomic_sub_fetch(&spinners, 1, __ATOMIC_RELAXED);
		ret = spin ? io_uring_submit(ring)
			   : io_uring_submit_and_wait(ring, queued - done);
		if (ret < 0 && ret != -EINTR)
			goto out_spin;
	}
	ret = 0;
	while (done < queued) {
		struct io_uring_cqe *cqe;
		struct dev_io *c;

		ret = spin ? poll_cqe(ring, &cqe)
			   : io_uring_wait_cqe(ring, &cqe);
		if (ret == -EINTR)
			continue;
		if (ret)
			goto out_spin;
		c = io_uring_cqe_get_data(cqe);
		c->res = cqe->res < 0 ? cqe->res : io_finish(c, cqe->res);
		io_uring_cqe_seen(ring, cqe);
		observe(c, t0);
		done++;
	}
out_spin:
	if (spin)
		__atomic_sub_fetch(&spinners, 1, __ATOMIC_RELAXED);
	if (ret)
		return ret;
	for (i = 0; i < n; i++)
		if (ios[i].res && !first)
			first = ios[i].res;
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

static int dev_flush_io(struct dev *d);

int dev_flush(struct dev *d)
{
	struct dev_io io = { .dev = d, .op = DEV_FLUSH };
	uint64_t t0 = d->obs_timing ? mono_ns() : 0;

	io.res = dev_flush_io(d);
	observe(&io, t0);
	return io.res;
}

static int dev_flush_io(struct dev *d)
{
	struct io_uring *ring;
	struct io_uring_sqe *sqe;
	struct io_uring_cqe *cqe;
	int ret;

	if (d->kind == DEV_KIND_MEM) {
		if (d->rec && !d->faults.fail_writes)
			rec_flush(d->rec, d->rec_id);
		return d->faults.fail_writes;
	}
	if (d->faults.fail_writes)
		return d->faults.fail_writes;
	ret = ring_get(&ring);
	if (ret)
		return ret;
	sqe = io_uring_get_sqe(ring);
	if (!sqe)
		return fdatasync(d->fd) ? -errno : 0;
	io_uring_prep_fsync(sqe, d->fd, IORING_FSYNC_DATASYNC);
	io_uring_sqe_set_data(sqe, NULL);
	ret = io_uring_submit_and_wait(ring, 1);
	if (ret < 0)
		return ret;
	do
		ret = io_uring_wait_cqe(ring, &cqe);
	while (ret == -EINTR);
	if (ret)
		return ret;
	ret = cqe->res;
	io_uring_cqe_seen(ring, cqe);
	return ret < 0 ? ret : 0;
}
