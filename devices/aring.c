/* devices: an asynchronous io_uring owned by one thread, whose completions call back. */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "dev.h"
#include "dev_int.h"

/*
 * dev_io_run() waits for its batch; a server that must not park a thread per
 * request uses a dev_aring instead: device I/O and "this descriptor is
 * readable" are queued with a callback (struct dev_acb), and dev_aring_run()
 * submits whatever is queued, waits until something completes and runs the
 * callbacks.  The ring belongs to one thread: only it queues, runs and frees
 * (asserted), so no lock is taken.  Callbacks run on that thread, from
 * dev_aring_run(), and may queue more.
 *
 * Every queued request completes exactly once, through its callback, with 0
 * or -errno in res (a device I/O's res is also in its dev_io), run by
 * dev_aring_run(): a caller that queued successfully never completes by
 * itself.  A queue call that fails has queued nothing.  The ring is freed
 * only when nothing is in flight, so the kernel never writes into memory
 * that is gone.
 *
 * The ring's refusals are the ring's (dev.h, "The device's error, never the
 * ring's").  A device I/O the ring has no room for, whose submission the
 * kernel refuses, or whose completion says the kernel ran short, is done
 * synchronously on the owning thread (dev_io_run, then plain system calls)
 * and completes with that result: its callback still comes from the next
 * dev_aring_run() (the list `later`).  A poll the kernel refused is armed
 * again at the next run, never completed: "readable" is the only way it
 * ends, so a thread that waits for a stop event (fs/loop.c) keeps waiting
 * for it.  While polls wait to be armed again, a run waits at most a
 * millisecond, so that they are not left unarmed behind a sleep.
 *
 * Credentials.  io_uring runs a request, and hands it to its async workers,
 * with the credentials of the thread that submits it, at the moment it does:
 * a FUSE worker may by then have taken a caller's credentials for a request
 * that came after the one that queued the I/O (fs/cred.c), and a cache
 * device that is a regular file would see that user allocate its blocks.
 * So the ring registers its creator's credentials (the daemon's) as a
 * personality, and every device I/O carries it.
 */
struct dev_aring {
	struct io_uring ring;
	unsigned short personality; /* the creator's credentials, or 0 */
	unsigned inflight; /* taken by the kernel, not yet completed */
	unsigned nio; /* device I/O queued or in flight */
	pthread_t owner;
	/* device I/O done without the kernel (callback due), polls to arm */
	struct dev_acb *later, **later_tail;
	/* the test hook (dev_aring_set_faults) */
	int fault_err;
	unsigned fault_every, fault_calls;
};

void dev_aring_set_faults(struct dev_aring *r, int err, unsigned every)
{
	r->fault_err = err;
	r->fault_every = err ? every : 0;
	r->fault_calls = 0;
}

/* NVC_TEST_RING_FAULTS="err,every[,first]" (tests only, dev.h) */
static void aring_env_faults(struct dev_aring *r)
{
	const char *v = getenv("NVC_TEST_RING_FAULTS");
	int err;
	unsigned every, first = 0;

	if (v && sscanf(v, "%d,%u,%u", &err, &every, &first) >= 2 && err < 0) {
		dev_aring_set_faults(r, err, every);
		r->fault_calls = every ? (every - first % every) % every : 0;
	}
}

static void aring_later(struct dev_aring *r, struct dev_acb *cb)
{
	cb->next = NULL;
	*r->later_tail = cb;
	r->later_tail = &cb->next;
}

int dev_aring_new(unsigned depth, struct dev_aring **out)
{
	struct dev_aring *r = calloc(1, sizeof(*r));
	int ret;

	if (!r)
		return -ENOMEM;
	ret = io_uring_queue_init(depth, &r->ring, 0);
	if (ret < 0) {
		free(r);
		return ret;
	}
	ret = io_uring_register_personality(&r->ring);
	if (ret < 0) {
		io_uring_queue_exit(&r->ring);
		free(r);
		return ret;
	}
	r->personality = ret;
	r->owner = pthread_self();
	r->later_tail = &r->later;
	aring_env_faults(r);
	*out = r;
	return 0;
}

/* The ring's thread from now on. */
void dev_aring_adopt(struct dev_aring *r)
{
	r->owner = pthread_self();
}

/* Polls may still be armed: the ring's end cancels them. */
void dev_aring_free(struct dev_aring *r)
{
	if (!r)
		return;
	assert(!r->nio);
	io_uring_queue_exit(&r->ring);
	free(r);
}

static int aring_submit(struct dev_aring *r, unsigned wait);

static struct io_uring_sqe *aring_sqe(struct dev_aring *r)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);

	assert(pthread_equal(r->owner, pthread_self()));
	if (sqe)
		return sqe;
	(void)aring_submit(r, 0); /* refused: what is queued stays queued */
	return io_uring_get_sqe(&r->ring);
}

/* io done here, on the owning thread: its callback at the next run. */
static void aring_io_here(struct dev_aring *r, struct dev_io *io,
			  struct dev_acb *cb)
{
	dev_io_run(io, 1); /* the device's answer, and a shadow's copy */
	cb->ran = 1;
	aring_later(r, cb);
}

int dev_aring_io(struct dev_aring *r, struct dev_io *io, struct dev_acb *cb)
{
	struct io_uring_sqe *sqe;
	int ret = dev_io_check(io);

	if (ret)
		return io->res = ret;
	cb->io = io;
	cb->res = 0;
	cb->t0 = io->dev->obs_timing ? dev_mono_ns() : 0;
	cb->ran = 0;
	r->nio++;
	if (dev_shadow_of(io)) {
		/* a rebuild's copy must land before the completion: rare */
		aring_io_here(r, io, cb);
		return 0;
	}
	sqe = aring_sqe(r);
	if (!sqe) {
		/* no room in the ring, the kernel refusing it any: here */
		dev_note_refusal();
		aring_io_here(r, io, cb);
		return 0;
	}
	if (io->dev->kind == DEV_KIND_MEM) {
		/* done at once; the callback still comes from the ring */
		dev_io_mem(io);
		io_uring_prep_nop(sqe);
	} else if (io->op == DEV_READ) {
		io_uring_prep_read(sqe, io->dev->fd, io->buf, io->len, io->off);
	} else if (io->op == DEV_WRITE) {
		io_uring_prep_write(sqe, io->dev->fd, io->buf, io->len,
				    io->off);
		if (io->fua)
			sqe->rw_flags = RWF_DSYNC;
	} else {
		io_uring_prep_fsync(sqe, io->dev->fd, IORING_FSYNC_DATASYNC);
	}
	sqe->personality = r->personality;
	io_uring_sqe_set_data(sqe, cb);
	return 0;
}

/* Arm cb's poll; -EBUSY: no room in the ring now. */
static int aring_arm(struct dev_aring *r, struct dev_acb *cb)
{
	struct io_uring_sqe *sqe = aring_sqe(r);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_add(sqe, cb->fd,
			       POLLIN | (cb->exclusive ? EPOLLEXCLUSIVE : 0));
	io_uring_sqe_set_data(sqe, cb);
	return 0;
}

/*
 * Completes once fd is readable.  exclusive: waiters are woken one at a time
 * (EPOLLEXCLUSIVE), as threads blocked in read(2) of /dev/fuse are: one
 * request wakes one server thread, not all of them.  No room in the ring:
 * armed at the next run.
 */
int dev_aring_readable(struct dev_aring *r, int fd, struct dev_acb *cb,
		       int exclusive)
{
	cb->io = NULL;
	cb->res = 0;
	cb->t0 = 0;
	cb->ran = 0;
	cb->fd = fd;
	cb->exclusive = exclusive;
	if (aring_arm(r, cb))
		aring_later(r, cb);
	return 0;
}

static void aring_complete(struct dev_aring *r, struct dev_acb *cb, int res)
{
	struct dev_io *io = cb->io;

	if (io) {
		assert(r->nio > 0);
		r->nio--;
		if (cb->ran) {
			cb->res = io->res; /* and observed by dev_io_run */
			cb->done(cb);
			return;
		}
		if (io->dev->kind == DEV_KIND_MEM)
			io->res = res < 0 ? res : 0; /* done when queued */
		else
			io->res = dev_io_complete(io, res);
		dev_observe(io, cb->t0);
		cb->res = io->res;
	} else if (dev_refusal(res)) {
		aring_later(r, cb); /* not readable: armed again */
		return;
	} else {
		cb->res = res < 0 ? res : 0;
	}
	cb->done(cb);
}

/*
 * The kernel will not take what is queued: each request becomes a NOP that
 * belongs to nobody (the queue is the kernel's to read), a device I/O is
 * done here and completes, a poll is armed again at the next run.  Returns
 * how many completed.
 */
static unsigned aring_abandon(struct dev_aring *r)
{
	struct io_uring_sq *sq = &r->ring.sq;
	unsigned i, n = 0, tail = sq->sqe_tail; /* callbacks may queue more */

	for (i = *sq->khead; i != tail; i++) {
		struct io_uring_sqe *sqe = &sq->sqes[i & sq->ring_mask];
		struct dev_acb *cb = (struct dev_acb *)(uintptr_t)sqe->user_data;

		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data(sqe, NULL);
		if (!cb)
			continue;
		if (!cb->io) {
			aring_later(r, cb);
			continue;
		}
		if (!cb->ran && cb->io->dev->kind != DEV_KIND_MEM) {
			dev_note_refusal();
			dev_io_run(cb->io, 1);
			cb->ran = 1;
		}
		aring_complete(r, cb, 0);
		n++;
	}
	return n;
}

/* What waits for a run: polls armed (those with no room wait on), device
 * I/O done here completed.  Returns how many completed. */
static unsigned aring_run_later(struct dev_aring *r)
{
	struct dev_acb *cb = r->later, *next;
	unsigned n = 0;

	r->later = NULL;
	r->later_tail = &r->later;
	for (; cb; cb = next) {
		next = cb->next;
		if (!cb->io) {
			if (aring_arm(r, cb))
				aring_later(r, cb);
			continue;
		}
		assert(cb->ran);
		aring_complete(r, cb, 0);
		n++;
	}
	return n;
}

/* The test hook's refusal of this submission, or 0. */
static int aring_fault(struct dev_aring *r)
{
	if (!r->fault_every || !io_uring_sq_ready(&r->ring))
		return 0;
	return r->fault_calls++ % r->fault_every ? 0 : r->fault_err;
}

static int aring_submit(struct dev_aring *r, unsigned wait)
{
	int ret;

	for (;;) {
		ret = aring_fault(r);
		if (!ret)
			ret = wait ? io_uring_submit_and_wait(&r->ring, 1)
				   : io_uring_submit(&r->ring);
		if (ret >= 0) {
			r->inflight += ret;
			return 0;
		}
		if (ret != -EINTR)
			return ret;
	}
}

static unsigned aring_reap(struct dev_aring *r)
{
	struct io_uring_cqe *cqe;
	unsigned n = 0;

	while (!io_uring_peek_cqe(&r->ring, &cqe)) {
		struct dev_acb *cb = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		io_uring_cqe_seen(&r->ring, cqe);
		assert(r->inflight > 0);
		r->inflight--;
		n++;
		if (cb)
			aring_complete(r, cb, res);
	}
	return n;
}

static int aring_run(struct dev_aring *r, int wait, uint64_t spin_ns,
		     uint64_t timeout_ns)
{
	struct io_uring_cqe *cqe;
	unsigned n;
	int ret, refused = 0, brief = 0;

	assert(pthread_equal(r->owner, pthread_self()));
	n = aring_run_later(r);
	ret = aring_submit(r, 0);
	if (ret == -EAGAIN || ret == -EBUSY) {
		refused = 1; /* left queued: submitted at the next run */
		ret = 0;
	} else if (ret) {
		refused = 1;
		n += aring_abandon(r);
	}
	n += aring_reap(r);
	if (n || !wait)
		return n ? (int)n : ret;
	if (!r->inflight || (refused && r->later)) {
		/* nothing to wait for, or polls to arm again after a
		 * refusal: neither a busy loop nor a sleep that leaves them
		 * unarmed */
		if (refused || r->later)
			usleep(1000);
		return ret;
	}
	if (r->later && (!timeout_ns || timeout_ns > 1000000)) {
		timeout_ns = 1000000; /* polls to arm again soon */
		brief = 1;
	}
	if (spin_ns) {
		uint64_t until = dev_mono_ns() + spin_ns;
		unsigned spins = 0;

		while (io_uring_peek_cqe(&r->ring, &cqe)) {
			if ((++spins & 63) == 0 && dev_mono_ns() > until)
				break;
			__builtin_ia32_pause();
		}
	}
	if (io_uring_peek_cqe(&r->ring, &cqe)) {
		struct __kernel_timespec ts = {
			.tv_sec = timeout_ns / 1000000000,
			.tv_nsec = timeout_ns % 1000000000,
		};

		ret = timeout_ns ? io_uring_wait_cqe_timeout(&r->ring, &cqe, &ts)
				 : io_uring_wait_cqe(&r->ring, &cqe);
		if (ret == -ETIME) {
			n = aring_reap(r);
			return n ? (int)n : brief ? 0 : -ETIME;
		}
		if (ret && ret != -EINTR && ret != -EAGAIN)
			return ret;
	}
	return aring_reap(r);
}

/*
 * Submit what is queued; then, if wait and nothing has completed, spin up
 * to spin_ns looking for a completion and sleep until one comes.  Runs the
 * callbacks of every completion there is.  Returns how many completed, or
 * -errno when the kernel refused the queued requests and nothing completed
 * (the device I/O among them was done here and has completed, the polls are
 * armed again at the next run).
 */
int dev_aring_run(struct dev_aring *r, int wait, uint64_t spin_ns)
{
	return aring_run(r, wait, spin_ns, 0);
}

/* The same, waiting; but -ETIME once timeout_ns pass with nothing done. */
int dev_aring_run_timeout(struct dev_aring *r, uint64_t spin_ns,
			  uint64_t timeout_ns)
{
	return aring_run(r, 1, spin_ns, timeout_ns);
}
