/* fs: the FUSE request loop, shared by the daemon and the benchmark's FUSE floor. */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "../devices/dev.h"
#include "loop.h"
#include "proto.h"
#include "uring.h"

/*
 * Workers, not a thread per request.  One worker per CPU reads requests
 * from /dev/fuse and answers them; a read or write whose device I/O can run
 * asynchronously (fs/aio.c) is handed to the worker's io_uring, and the
 * worker goes on reading requests while the device works: nothing parks a
 * thread per I/O.  A worker waits in one place, its ring, for either a
 * request (a poll of /dev/fuse; one worker is woken per request, like
 * readers blocked in read(2)) or a completion, spinning briefly first when
 * one request's device I/O is in flight (a DIMM answers in microseconds, a
 * wake-up costs more on a virtual CPU).  With more in flight it does not
 * spin: a completion or the next request comes soon anyway, and the CPU a
 * spin takes is the one the caller, the device's own threads (a loop
 * device's, an emulated DIMM's) or the other workers need.  Measured with
 * fio 4 KiB random reads of cached data, QD32, 2 vCPUs (2026-12-04): 102.6
 * and 90.6K IOPS, 9.1 and 10.3 us of daemon CPU per read, spinning with
 * any I/O in flight; 108.0 and 113.8K, 8.0 and 7.7 us, spinning with one.
 * Workers are not pinned: the scheduler may then wake one on the CPU of the
 * process that is waiting for the answer.
 *
 * Blocking.  A worker with requests in flight holds their locks (fs/aio.c),
 * so it must not run anything that may wait for a lock: every request it
 * cannot finish without waiting goes to the pool, threads that run requests
 * synchronously as libfuse's own loop does.  A worker with nothing in flight
 * holds nothing and runs any request itself (a create, a stat): no hand-over
 * to another thread, which on this kind of machine costs more than the
 * request.  loop_held counts what the worker has in flight.  But a request
 * run synchronously may wait long (a create on a distributed store, a read
 * miss): so that one slow request never holds up the others, at most
 * nworkers - 1 workers (at least one) run requests synchronously at a time,
 * and what comes meanwhile goes to the pool, whose threads wait in parallel.
 *
 * Idle.  A thread's buffers stay with it while it works (a worker's free
 * requests with their 2 MiB I/O buffers, a pool thread's read buffer):
 * taking them again for every request would cost more than the request.
 * A worker or pool thread that has served something and then sees no work
 * for LOOP_IDLE_NS calls the idle hook (fsloop_on_idle), with nothing in
 * flight, once, and gives them back; then it sleeps without a timeout.
 *
 * Transports.  Requests come from /dev/fuse, or, once the INIT reply has
 * taken FUSE_OVER_IO_URING (proto.c, fuse.transport), from each worker's
 * FUSE ring (fs/uring.c), which the worker's own ring polls like
 * /dev/fuse: a request from either is served alike.  The worker that
 * answers INIT wakes the others (startfd) and each registers its queues'
 * entries on its own thread.  /dev/fuse stays polled for FORGET,
 * INTERRUPT and, before every queue is registered, nothing else.  But a
 * request goes to the queue of its caller's CPU, and the kernel copies the
 * next request into an entry in the context of the thread that committed
 * the last: a worker with a ring that waited (a stalled store, a slow
 * create) would hold up every caller on its CPUs.  So such a worker runs
 * nothing that may wait: only what always_here names (reads and writes go
 * to the pool as soon as they would wait, fsloop_must_defer), and every
 * other request goes to the pool, whose replies the worker commits.
 *
 * Exit.  A signal (libfuse's handlers set the session's exit flag) or an
 * unmount (/dev/fuse reads fail with ENODEV) ends the loop: the main thread
 * sees the flag, sets stop and wakes every worker through an eventfd each
 * ring polls; a worker leaves once its own I/O has completed.
 */

#define POOL_MAX 256
#define LOOP_RING_ERRORS 1000 /* in a row, 1 ms apart: the ring is broken */
#define LOOP_IDLE_NS 1000000000ull
#define REQ_BUF (1024 * 1024 + 64 * 1024) /* max_write and headers */
/* where a WRITE request's data begins: the cache writes whole aligned pages
 * to its devices from the request itself, without a copy (cache/data/write.c) */
#define WRITE_DATA (sizeof(struct fuse_in_header) + sizeof(struct fuse_write_in))

struct worker;

struct loop {
	struct fuse_session *se;
	int fd; /* /dev/fuse, non-blocking */
	int stopfd; /* eventfd: readable once stopping */
	int startfd; /* eventfd: readable once the INIT reply took io_uring */
	int stop;
	int uring_started; /* startfd written */
	int uring_failed; /* a worker could not register its entries */
	unsigned nworkers;
	struct worker *workers;
	uint64_t spin_ns;
	int transport; /* FSLOOP_* */
	unsigned blocking; /* workers running a request synchronously */
	/* the pool */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct fsloop_job *head, **tail;
	pthread_t pool[POOL_MAX];
	unsigned npool;
};

struct worker {
	struct loop *L;
	pthread_t thread;
	struct dev_aring *ring;
	struct dev_acb req_cb, stop_cb, start_cb, fr_cb;
	struct furing *fr; /* its FUSE ring, once started; NULL: none */
	unsigned index;
	char *mem; /* REQ_BUF + DEV_ALIGN, aligned */
	char *buf; /* in mem: a WRITE's data lands aligned (WRITE_DATA) */
	int started, failed;
	int used; /* served a request since the idle hook last ran */
};

static struct loop *the_loop;
static void (*idle_fn)(void);
static void (*log_fn)(int err, const char *msg);

void fsloop_on_log(void (*fn)(int err, const char *msg))
{
	log_fn = fn;
}

static void loop_log(int err, const char *msg)
{
	if (log_fn)
		log_fn(err, msg);
}

void fsloop_on_idle(void (*fn)(void))
{
	idle_fn = fn;
}
static __thread struct worker *cur_worker;
static __thread unsigned loop_held;

struct dev_aring *fsloop_ring(void)
{
	return cur_worker ? cur_worker->ring : NULL;
}

void fsloop_hold(int delta)
{
	assert(delta > 0 || loop_held >= (unsigned)-delta);
	loop_held += delta;
}

/* Enough workers run requests synchronously already. */
static int blocking_full(struct loop *L)
{
	unsigned most = L->nworkers > 1 ? L->nworkers - 1 : 1;

	return __atomic_load_n(&L->blocking, __ATOMIC_RELAXED) >= most;
}

/* A worker serving a FUSE ring must never wait: the requests of its CPUs'
 * queues would wait with it (the kernel copies the next request into an
 * entry in the context of the thread that committed it). */
int fsloop_must_defer(void)
{
	return cur_worker && (loop_held || blocking_full(cur_worker->L) ||
			      cur_worker->fr);
}

void fsloop_sync_begin(void)
{
	if (cur_worker)
		__atomic_add_fetch(&cur_worker->L->blocking, 1,
				   __ATOMIC_RELAXED);
}

void fsloop_sync_end(void)
{
	if (cur_worker)
		__atomic_sub_fetch(&cur_worker->L->blocking, 1,
				   __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------------- pool */

void fsloop_defer(struct fsloop_job *j)
{
	struct loop *L = the_loop;

	j->next = NULL;
	pthread_mutex_lock(&L->lock);
	*L->tail = j;
	L->tail = &j->next;
	pthread_cond_signal(&L->cond);
	pthread_mutex_unlock(&L->lock);
}

/* Wait for a job; 1 once the thread has waited LOOP_IDLE_NS in vain. */
static int pool_wait(struct loop *L, int used)
{
	struct timespec ts;

	if (!used || !idle_fn) {
		pthread_cond_wait(&L->cond, &L->lock);
		return 0;
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += LOOP_IDLE_NS / 1000000000;
	return pthread_cond_timedwait(&L->cond, &L->lock, &ts) == ETIMEDOUT;
}

static void *pool_main(void *arg)
{
	struct loop *L = arg;
	int used = 0;

	pthread_mutex_lock(&L->lock);
	for (;;) {
		struct fsloop_job *j = L->head;

		if (!j) {
			if (L->stop)
				break;
			if (pool_wait(L, used) && !L->head) {
				pthread_mutex_unlock(&L->lock);
				idle_fn();
				used = 0;
				pthread_mutex_lock(&L->lock);
			}
			continue;
		}
		L->head = j->next;
		if (!L->head)
			L->tail = &L->head;
		pthread_mutex_unlock(&L->lock);
		j->run(j);
		used = 1;
		pthread_mutex_lock(&L->lock);
	}
	pthread_mutex_unlock(&L->lock);
	return NULL;
}

/* A request a busy worker cannot run: a copy, run by the pool; the copy in
 * the same allocation, placed as in a worker's buffer (WRITE_DATA). */
struct raw_job {
	struct fsloop_job job;
	size_t len;
	char *data;
};

static void raw_run(struct fsloop_job *j)
{
	struct raw_job *r = (struct raw_job *)j;
	struct fuse_buf fbuf = { .size = r->len, .mem = r->data };

	proto_request(r->data, r->len, 0);
	fuse_session_process_buf(the_loop->se, &fbuf);
	proto_request_done();
	free(r);
}

/* ------------------------------------------------------------- workers */

static void loop_stop(struct loop *L)
{
	uint64_t one = 1;

	fuse_session_exit(L->se);
	if (!__atomic_exchange_n(&L->stop, 1, __ATOMIC_SEQ_CST))
		(void)!write(L->stopfd, &one, sizeof(one));
}

/* Taken by the worker always: reads and writes (fs/aio.c sends what would
 * wait to the pool), and what never waits. */
static int always_here(uint32_t opcode)
{
	return opcode == FUSE_READ || opcode == FUSE_WRITE ||
	       opcode == FUSE_FORGET || opcode == FUSE_BATCH_FORGET ||
	       opcode == FUSE_INTERRUPT;
}

/*
 * What takes no file or slot lock (the cache's c->lock at most, never held
 * across I/O), so a worker with requests in flight may run it.  The kernel
 * asks for security.capability before every write it cannot leave to the
 * server: a round trip that must not cost a hand-over.
 */
static int lock_free(uint32_t opcode)
{
	switch (opcode) {
	case FUSE_GETATTR:
	case FUSE_GETXATTR:
	case FUSE_LISTXATTR:
	case FUSE_STATFS:
	case FUSE_LOOKUP:
		return 1;
	}
	return 0;
}

static void run_here(struct worker *w, char *buf, size_t len, int sync)
{
	struct fuse_buf fbuf = { .size = len, .mem = buf };

	if (sync)
		fsloop_sync_begin();
	fuse_session_process_buf(w->L->se, &fbuf);
	if (sync)
		fsloop_sync_end();
	proto_request_done();
}

/* The INIT reply is out: if it took io_uring, every worker starts its
 * FUSE ring; if it did not where fuse.transport = uring asked, stop. */
static void after_init(struct loop *L)
{
	uint64_t one = 1;

	if (proto_uring()) {
		if (!__atomic_exchange_n(&L->uring_started, 1,
					 __ATOMIC_SEQ_CST))
			(void)!write(L->startfd, &one, sizeof(one));
		return;
	}
	if (L->transport == FSLOOP_URING) {
		loop_log(-EOPNOTSUPP,
			 proto_uring_offered()
				 ? "fuse.transport = uring: the INIT reply "
				   "could not take it"
				 : "fuse.transport = uring: the kernel does "
				   "not offer FUSE over io_uring "
				   "(/sys/module/fuse/parameters/enable_uring)");
		__atomic_store_n(&L->uring_failed, 1, __ATOMIC_RELAXED);
		loop_stop(L);
		return;
	}
	loop_log(0, proto_uring_offered()
			    ? "FUSE transport: /dev/fuse (io_uring offered, "
			      "not asked for)"
			    : "FUSE transport: /dev/fuse (the kernel does not "
			      "offer io_uring)");
}

static void dispatch(struct worker *w, char *buf, size_t len)
{
	const struct fuse_in_header *h = (const void *)buf;
	struct raw_job *r;

	if (!w->used) /* no store a request: the line is shared */
		w->used = 1;
	proto_request(buf, len, 1);
	if (len >= sizeof(*h) && h->opcode == FUSE_INIT) {
		run_here(w, buf, len, 0);
		after_init(w->L);
		return;
	}
	if (len < sizeof(*h) || always_here(h->opcode)) {
		run_here(w, buf, len, 0);
		return;
	}
	if (!w->fr && !blocking_full(w->L) &&
	    (!loop_held || lock_free(h->opcode))) {
		run_here(w, buf, len, 1);
		return;
	}
	proto_request_done();
	_Static_assert(sizeof(*r) <= DEV_ALIGN - WRITE_DATA, "data after r");
	r = dev_alloc_buf(DEV_ALIGN + len);
	if (!r) { /* run it here, late rather than never */
		proto_request(buf, len, 0);
		run_here(w, buf, len, 1);
		return;
	}
	r->data = (char *)r + DEV_ALIGN - WRITE_DATA;
	memcpy(r->data, buf, len);
	r->len = len;
	r->job.run = raw_run;
	fsloop_defer(&r->job);
}

/* /dev/fuse is readable: take what is there (a few), then poll again. */
static void on_request(struct dev_acb *cb)
{
	struct worker *w = (struct worker *)((char *)cb -
					     offsetof(struct worker, req_cb));
	struct loop *L = w->L;
	int i;

	for (i = 0; i < 8 && !L->stop; i++) {
		ssize_t n = read(L->fd, w->buf, REQ_BUF);

		if (n > 0) {
			dispatch(w, w->buf, n);
			continue;
		}
		if (n < 0 && (errno == EINTR || errno == ENOENT))
			continue; /* interrupted, or a request gone */
		if (n < 0 && errno == EAGAIN)
			break;
		loop_stop(L); /* ENODEV: unmounted */
		return;
	}
	if (!L->stop && dev_aring_readable(w->ring, L->fd, &w->req_cb, 1))
		loop_stop(L);
}

static void on_stop(struct dev_acb *cb)
{
	(void)cb;
}

static void serve_ring(void *arg, char *buf, size_t len)
{
	struct worker *w = arg;

	if (!w->L->stop)
		dispatch(w, buf, len);
}

/* The worker's FUSE ring has completions: serve them, poll it again. */
static void on_ring(struct dev_acb *cb)
{
	struct worker *w = (struct worker *)((char *)cb -
					     offsetof(struct worker, fr_cb));

	if (furing_run(w->fr, serve_ring, w))
		return; /* no entry left: torn down by the kernel */
	dev_aring_readable(w->ring, furing_fd(w->fr), &w->fr_cb, 0);
}

/* The INIT reply took io_uring: register this worker's entries. */
static void on_start(struct dev_acb *cb)
{
	struct worker *w = (struct worker *)((char *)cb -
					     offsetof(struct worker, start_cb));
	struct loop *L = w->L;
	char msg[160];
	int ret;

	if (L->stop)
		return;
	ret = furing_start(L->fd, w->index, L->nworkers, &w->fr);
	if (ret) {
		/* the kernel goes back to /dev/fuse when a registration
		 * fails (fs/fuse/dev_uring.c); one not even tried would
		 * leave every request waiting: stop */
		snprintf(msg, sizeof(msg),
			 "FUSE over io_uring: worker %u cannot register its "
			 "queues: %s",
			 w->index, strerror(-ret));
		loop_log(ret, msg);
		__atomic_store_n(&L->uring_failed, 1, __ATOMIC_RELAXED);
		loop_stop(L);
		return;
	}
	if (w->index == 0) {
		snprintf(msg, sizeof(msg),
			 "FUSE transport: io_uring, %u queues, %zu KiB "
			 "payloads",
			 furing_nqueues(), proto_uring_payload() / 1024);
		loop_log(0, msg);
	}
	if (w->fr)
		dev_aring_readable(w->ring, furing_fd(w->fr), &w->fr_cb, 0);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct loop *L = w->L;
	unsigned errors = 0; /* the ring's, one after the other */
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals go to main */
	dev_aring_adopt(w->ring); /* made by main, used here only */
	cur_worker = w;
	w->req_cb.done = on_request;
	w->stop_cb.done = on_stop;
	w->start_cb.done = on_start;
	w->fr_cb.done = on_ring;
	if (dev_aring_readable(w->ring, L->fd, &w->req_cb, 1) ||
	    dev_aring_readable(w->ring, L->stopfd, &w->stop_cb, 0) ||
	    (L->transport != FSLOOP_DEV &&
	     dev_aring_readable(w->ring, L->startfd, &w->start_cb, 0))) {
		loop_stop(L);
		return NULL;
	}
	while (!__atomic_load_n(&L->stop, __ATOMIC_ACQUIRE) || loop_held) {
		int ret;

		if (!loop_held && w->used && idle_fn) {
			ret = dev_aring_run_timeout(w->ring, 0, LOOP_IDLE_NS);
			if (ret == -ETIME) {
				w->used = 0;
				idle_fn(); /* nothing in flight: loop_held 0 */
				furing_idle(w->fr);
				continue;
			}
		} else {
			ret = dev_aring_run(w->ring, 1,
					    loop_held == 1 ? L->spin_ns : 0);
		}
		/* a refusal by the ring is the kernel short of something for
		 * a moment: the ring did the device I/O itself and arms its
		 * polls again (devices/aring.c); only a ring that fails
		 * otherwise, for a second on end, ends the loop */
		if (ret >= 0 || ret == -ETIME || dev_refusal(ret))
			errors = 0;
		else if (++errors > LOOP_RING_ERRORS && !loop_held)
			loop_stop(L);
		else
			usleep(1000);
	}
	cur_worker = NULL;
	return NULL;
}

static void loop_free(struct loop *L)
{
	unsigned i;

	for (i = 0; i < L->nworkers; i++) {
		dev_aring_free(L->workers[i].ring);
		furing_free(L->workers[i].fr);
		free(L->workers[i].mem);
	}
	free(L->workers);
	if (L->stopfd >= 0)
		close(L->stopfd);
	if (L->startfd >= 0)
		close(L->startfd);
	pthread_mutex_destroy(&L->lock);
	pthread_cond_destroy(&L->cond);
	free(L);
}

static int loop_new(struct fuse_session *se, unsigned nworkers,
		    struct loop **out)
{
	struct loop *L = calloc(1, sizeof(*L));
	pthread_condattr_t ca;
	unsigned i;
	int ret = -ENOMEM, fl;

	if (!L)
		return -ENOMEM;
	pthread_mutex_init(&L->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* pool_wait */
	pthread_cond_init(&L->cond, &ca);
	pthread_condattr_destroy(&ca);
	L->tail = &L->head;
	L->se = se;
	L->fd = fuse_session_fd(se);
	L->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	L->startfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	L->nworkers = nworkers;
	L->workers = calloc(nworkers, sizeof(*L->workers));
	if (L->stopfd < 0 || L->startfd < 0 || !L->workers)
		goto err;
	fl = fcntl(L->fd, F_GETFL);
	if (fl < 0 || fcntl(L->fd, F_SETFL, fl | O_NONBLOCK)) {
		ret = -errno;
		goto err;
	}
	for (i = 0; i < nworkers; i++) {
		struct worker *w = &L->workers[i];

		w->L = L;
		w->index = i;
		w->mem = dev_alloc_buf(REQ_BUF + DEV_ALIGN);
		if (!w->mem)
			goto err;
		w->buf = w->mem + DEV_ALIGN - WRITE_DATA;
		ret = dev_aring_new(256, &w->ring);
		if (ret)
			goto err;
	}
	*out = L;
	return 0;
err:
	loop_free(L);
	return ret;
}

/*
 * Serve requests until the session ends: nworkers workers (0: one per CPU)
 * and a pool of up to pool threads.  A machine where the workers' rings
 * cannot be had is served by libfuse's own loop, with pool threads.
 */
int fsloop_run(struct fuse_session *se, unsigned nworkers, unsigned pool,
	       uint64_t spin_ns, int transport)
{
	struct loop *L = NULL;
	unsigned i;
	int ret;

	if (!nworkers) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		nworkers = n > 0 ? n : 1;
	}
	if (pool > POOL_MAX)
		pool = POOL_MAX;
	ret = loop_new(se, nworkers, &L);
	if (ret) {
		if (transport == FSLOOP_URING)
			return ret;
		return fsloop_run_mt(se, pool);
	}
	L->transport = transport;
	if (transport != FSLOOP_DEV)
		proto_uring_allow();
	L->spin_ns = spin_ns;
	the_loop = L;
	for (i = 0; i < pool; i++)
		if (!pthread_create(&L->pool[L->npool], NULL, pool_main, L))
			L->npool++;
	for (i = 0; i < nworkers; i++) {
		struct worker *w = &L->workers[i];

		w->started = !pthread_create(&w->thread, NULL, worker_main, w);
		if (!w->started)
			loop_stop(L);
	}
	while (!__atomic_load_n(&L->stop, __ATOMIC_ACQUIRE)) {
		struct pollfd p = { .fd = L->stopfd, .events = POLLIN };

		poll(&p, 1, 200);
		if (fuse_session_exited(se))
			loop_stop(L);
	}
	for (i = 0; i < nworkers; i++)
		if (L->workers[i].started)
			pthread_join(L->workers[i].thread, NULL);
	pthread_mutex_lock(&L->lock);
	pthread_cond_broadcast(&L->cond);
	pthread_mutex_unlock(&L->lock);
	for (i = 0; i < L->npool; i++)
		pthread_join(L->pool[i], NULL);
	the_loop = NULL;
	ret = L->uring_failed ? -EPROTO : 0;
	loop_free(L);
	return ret;
}

/*
 * libfuse's multi-threaded loop: up to `threads` workers, each reading
 * /dev/fuse and answering its request itself; half of them may idle.
 */
int fsloop_run_mt(struct fuse_session *se, unsigned int threads)
{
	struct fuse_loop_config *lc;
	int ret;

	lc = fuse_loop_cfg_create();
	if (!lc)
		return -ENOMEM;
	fuse_loop_cfg_set_max_threads(lc, threads);
	fuse_loop_cfg_set_idle_threads(lc, threads / 2 > 1 ? threads / 2 : 1);
	ret = fuse_session_loop_mt(se, lc);
	fuse_loop_cfg_destroy(lc);
	return ret < 0 ? ret : 0;
}
