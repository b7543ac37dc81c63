/* fs: reads and writes answered from io_uring completions, on the loop's workers. */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "aio.h"
#include "cred.h"
#include "loop.h"

/*
 * A read or write that reaches a worker (fs/loop.c) is begun in the cache
 * (cache_aio_begin), its device I/O queued on the worker's ring, and the
 * worker goes on; the last completion ends it in the cache and replies.
 * Between the two the worker holds the request's locks (fsloop_hold), so a
 * request the cache refuses to take this way (-EAGAIN: a miss, a new block,
 * a lock taken) runs synchronously on the worker only when it holds nothing,
 * and otherwise goes to the pool, with a copy of a write's data (the
 * worker's request buffer is reused at once).
 *
 * Busy.  A request refused only because a lock is taken (-EBUSY: most often
 * by the same file's previous request in flight, a sequential stream in one
 * slot) is not handed to the pool, which costs a thread wake-up and a
 * synchronous I/O: it is parked on its worker, with a copy of a write's
 * data, and tried again each time one of the worker's requests ends (its
 * locks are then free).  Only a worker with requests in flight parks, so an
 * end always comes; when its last request in flight has ended, what is
 * still parked (the lock is another worker's) runs synchronously, as it
 * would have at first (rw_sync).  Parked requests are tried in arrival
 * order, and never more than PARK_MAX at once (then the pool, as before).
 */

#define FREE_MAX 64
#define PARK_MAX 64

struct aop_cb {
	struct dev_acb cb;
	struct aop *op;
};

/* A read's or write's arguments, as fs_aio_rw() got them. */
struct rw_args {
	fuse_req_t req;
	struct cache *c;
	struct cfile *cf;
	void *fh;
	fs_rw_sync_fn sync;
	size_t size;
	off_t off;
	uint64_t t0;
	int write;
	int flags; /* FS_RW_* */
};

struct aop {
	struct aop *next; /* on the worker's free list */
	struct rw_args r;
	struct cache_aio *a;
	unsigned pending; /* I/O not yet completed */
	struct aop_cb cbs[CACHE_AIO_MAX_IOS];
};

/* A request for the pool or parked: its arguments, and a write's data,
 * aligned for direct I/O in the same allocation (the cache writes it
 * without a copy). */
struct rw_job {
	struct fsloop_job job;
	struct rw_args r;
	char *data;
};

static __thread struct aop *free_ops;
static __thread unsigned nfree;
static __thread struct fsloop_job *parked, *parked_last;
static __thread unsigned nparked;
static __thread int retrying;
static pthread_key_t ops_key;
static pthread_once_t ops_once = PTHREAD_ONCE_INIT;

static void aop_free(struct aop *op)
{
	cache_aio_free(op->a);
	free(op);
}

static void ops_drop(void *p)
{
	struct aop *op = p, *next;

	for (; op; op = next) {
		next = op->next;
		aop_free(op);
	}
}

/* The worker is idle, nothing in flight: its free requests back. */
void fs_aio_idle(void)
{
	if (!free_ops)
		return;
	ops_drop(free_ops);
	free_ops = NULL;
	nfree = 0;
	pthread_setspecific(ops_key, NULL);
}

static void ops_key_init(void)
{
	pthread_key_create(&ops_key, ops_drop);
}

static struct aop *aop_get(void)
{
	struct aop *op = free_ops;

	if (op) {
		free_ops = op->next;
		nfree--;
		pthread_setspecific(ops_key, free_ops);
		return op;
	}
	pthread_once(&ops_once, ops_key_init);
	op = calloc(1, sizeof(*op));
	if (op && cache_aio_new(&op->a)) {
		free(op);
		op = NULL;
	}
	return op;
}

static void aop_put(struct aop *op)
{
	if (nfree >= FREE_MAX) {
		aop_free(op);
		return;
	}
	op->next = free_ops;
	free_ops = op;
	nfree++;
	pthread_setspecific(ops_key, free_ops); /* freed at the thread's end */
}

static void rw_job_run(struct fsloop_job *j)
{
	struct rw_job *job = (struct rw_job *)j;
	struct rw_args *r = &job->r;

	fs_cred_daemon(); /* a parked request, on a worker that may linger */
	r->sync(r->req, r->fh, r->write ? job->data : NULL, r->size, r->off,
		r->t0, r->flags);
	free(job);
}

static struct rw_job *rw_job_new(const struct rw_args *r, const char *wbuf)
{
	struct rw_job *job;

	_Static_assert(sizeof(*job) <= DEV_ALIGN, "a job's data is aligned");
	job = dev_alloc_buf(DEV_ALIGN + (wbuf ? r->size : 0));
	if (!job)
		return NULL;
	job->job.run = rw_job_run;
	job->job.next = NULL;
	job->r = *r;
	job->data = (char *)job + DEV_ALIGN;
	if (wbuf)
		memcpy(job->data, wbuf, r->size);
	return job;
}

/* Run the request synchronously: here if the worker may, else on the pool
 * (job: the request's copy, if it has one already; taken). */
static void rw_sync_job(const struct rw_args *r, const char *wbuf,
			struct rw_job *job)
{
	if (!fsloop_must_defer()) {
		fsloop_sync_begin();
		r->sync(r->req, r->fh, wbuf, r->size, r->off, r->t0, r->flags);
		fsloop_sync_end();
		free(job);
		return;
	}
	if (!job)
		job = rw_job_new(r, wbuf);
	if (!job) {
		fuse_reply_err(r->req, ENOMEM);
		return;
	}
	fsloop_defer(&job->job);
}

static void rw_sync(const struct rw_args *r, const char *wbuf)
{
	rw_sync_job(r, wbuf, NULL);
}

static void park_retry(void);

static void aop_finish(struct aop *op)
{
	char *data = NULL;
	size_t n = 0;
	int ret = cache_aio_end(op->a, &data, &n);

	fsloop_hold(-1);
	if (ret == -EAGAIN && !op->r.write) {
		/* a device failed under the read: the slow path handles it */
		rw_sync(&op->r, NULL);
		aop_put(op);
		park_retry();
		return;
	}
	if (ret)
		fuse_reply_err(op->r.req, -ret);
	else if (op->r.write)
		fs_reply_write(op->r.req, op->r.fh, op->r.off, n, op->r.flags);
	else
		fuse_reply_buf(op->r.req, data, n);
	cache_note_latency(op->r.c, op->r.write ? STAT_L_write : STAT_L_read,
			   op->r.t0);
	aop_put(op);
	park_retry();
}

static void aop_io_done(struct dev_acb *cb)
{
	struct aop *op = ((struct aop_cb *)cb)->op;

	fs_cred_daemon(); /* on the worker, which may linger as a caller */
	assert(op->pending > 0);
	if (!--op->pending)
		aop_finish(op);
}

/* Queue the begun request's I/O on the worker's ring. */
static void aop_start(struct aop *op, struct dev_aring *ring)
{
	struct dev_io *ios;
	unsigned i, n = cache_aio_ios(op->a, &ios);

	assert(n <= CACHE_AIO_MAX_IOS);
	op->pending = n + 1; /* one for the queueing itself */
	for (i = 0; i < n; i++) {
		op->cbs[i].cb.done = aop_io_done;
		op->cbs[i].op = op;
		if (dev_aring_io(ring, &ios[i], &op->cbs[i].cb))
			op->pending--; /* ios[i].res says why */
	}
	aop_io_done(&op->cbs[0].cb);
}

/*
 * Begin r asynchronously: 0 (begun, or failed and replied), -EBUSY (a lock
 * is taken) or -EAGAIN (the synchronous path must take it); nothing is done
 * but on 0.
 */
static int rw_begin(const struct rw_args *r, const char *wbuf,
		    struct dev_aring *ring)
{
	struct aop *op = aop_get();
	int ret;

	if (!op)
		return -EAGAIN;
	ret = cache_aio_begin(r->c, r->cf, op->a, wbuf, r->size, r->off);
	if (ret) {
		aop_put(op);
		if (ret == -EAGAIN || ret == -EBUSY)
			return ret;
		fuse_reply_err(r->req, -ret);
		return 0;
	}
	fsloop_hold(1);
	op->r = *r;
	op->cbs[0].op = op;
	aop_start(op, ring);
	return 0;
}

static void park(struct rw_job *job)
{
	job->job.next = NULL;
	if (parked)
		parked_last->next = &job->job;
	else
		parked = &job->job;
	parked_last = &job->job;
	nparked++;
}

/*
 * A request of the worker's has ended: try the parked ones again, in order;
 * with nothing in flight any more, run what is still parked synchronously.
 * Not again from a request that ends meanwhile (the loop goes on).
 */
static void park_retry(void)
{
	struct fsloop_job *list = parked, *j, *next;
	struct dev_aring *ring = fsloop_ring();

	if (retrying || !list || !ring)
		return;
	retrying = 1;
	parked = NULL;
	nparked = 0;
	for (j = list; j; j = next) {
		struct rw_job *job = (struct rw_job *)j;
		const char *wbuf = job->r.write ? job->data : NULL;
		int ret;

		next = j->next;
		ret = rw_begin(&job->r, wbuf, ring);
		if (!ret) {
			free(job);
		} else if (ret == -EBUSY && cache_aio_held()) {
			park(job);
		} else {
			rw_sync_job(&job->r, wbuf, job);
		}
	}
	/* what ended in the loop may have left nothing in flight */
	for (j = cache_aio_held() ? NULL : parked; j; j = next) {
		struct rw_job *job = (struct rw_job *)j;

		next = j->next;
		rw_sync_job(&job->r, job->r.write ? job->data : NULL, job);
	}
	if (!cache_aio_held()) {
		parked = NULL;
		nparked = 0;
	}
	retrying = 0;
}

int fs_aio_rw(fuse_req_t req, struct cache *c, struct cfile *cf, void *fh,
	      const char *wbuf, size_t size, off_t off, uint64_t t0,
	      fs_rw_sync_fn sync, int flags)
{
	struct rw_args r = { .req = req,
			     .c = c,
			     .cf = cf,
			     .fh = fh,
			     .sync = sync,
			     .size = size,
			     .off = off,
			     .t0 = t0,
			     .write = wbuf != NULL,
			     .flags = flags };
	struct dev_aring *ring = fsloop_ring();
	struct rw_job *job;
	int ret;

	if (!ring)
		return -EAGAIN; /* not a worker: the caller runs it */
	ret = flags & FS_RW_ASYNC ? rw_begin(&r, wbuf, ring) : -EAGAIN;
	if (!ret)
		return 0;
	if (ret == -EBUSY && cache_aio_held() && nparked < PARK_MAX &&
	    (job = rw_job_new(&r, wbuf))) {
		park(job);
		return 0;
	}
	rw_sync(&r, wbuf);
	return 0;
}
