/* cache: the destage pipeline — a pass's backing writes go on a helper thread,
 * behind the device reads of the next runs, with their writeback started. */
#define _GNU_SOURCE
#include "destage_io.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/*
 * Why.  A pass (destage_file) reads runs of dirty pages from the cache
 * devices and writes each to the backing file.  Done one after the other, the
 * devices wait while the backing file is written and the backing store waits
 * while the devices are read.  So each run, once read, is handed to helper
 * threads that write it while the pass reads the next runs into other
 * buffers; the store writes while the devices are read.
 *
 * Direct writes.  The data being destaged is already cached, on the cache
 * devices: written through the page cache it is cached twice, and every byte
 * costs a copy into a page-cache page that memory must be found for first.
 * An earlier measurement on an idle machine put buffered writes with early
 * writeback at 1.2-1.4x the store's own 1 MiB O_DIRECT write; but after the
 * benchmark's earlier phases the buffered pass spent 57% of both CPUs
 * copying into the page cache and reached 0.26x, and later on the same
 * machine a lone 2 GiB flush took 4.7-5.3 s buffered against 1.05-1.22 s
 * direct (0.92-1.0x the store's own write, measured after each).  So runs go
 * to a second open of the backing file with O_DIRECT (every run starts on a
 * page and its buffer is page-aligned), destage.queue_depth of them in
 * flight (scattered dirty pages are many short runs: a random-write store
 * wants a deep queue; on the suite's ext4 over virtio 4 KiB random direct
 * writes went 32 MB/s at QD1, 184 at QD8, 282 at QD32);
 * only a run's last partial page (the end of the file) is written through
 * the page cache.  A store that refuses O_DIRECT (at the open, or EINVAL at
 * a write) gets buffered writes with their writeback started at once
 * (sync_file_range), and f->bks_off remembers it, as for direct reads.
 *
 * FUSE stores.  A FUSE store's client may keep a cache of its own that a
 * direct write through it does not update: ceph-fuse's object cache keeps
 * the old bytes, and programs reading the backing file through the same
 * client read them after a flush (through close, reopen and fdatasync).
 * Buffered writes are the path such a client keeps coherent with itself.
 * So on a FUSE store (c->bk_fuse, from the probe's statfs) every write
 * goes through f->fd; the pass's fdatasync (3.) makes them durable, through
 * the store's client, before any block is marked clean.  Measured here (a
 * 256 MiB flush, two cores, against a 1 MiB-write + fdatasync of the store
 * alone in the same run): on ceph-fuse direct 0.08-0.10x, buffered
 * 0.96-1.28x (each direct write waits for the OSDs; ceph-fuse's
 * client_oc=false, the client option that keeps direct writes coherent,
 * makes every writer, the store alone included, as slow, about 25 MB/s);
 * GlusterFS 0.56-0.88x direct, 0.72-0.77x buffered; MooseFS 1.10-1.24x
 * either way.
 *
 * Ordering.  The pipeline changes nothing that decides when a block is clean:
 *  1. a buffer is submitted only after all its device reads completed and the
 *     slots they came from were unlocked (batch_flush): the bytes written are
 *     the ones read while the slot's gen was what the pass noted;
 *  2. within a pass each backing offset is written at most once (runs are
 *     cut from disjoint dirty pages, slots in ascending block order, pages in
 *     ascending order; asserted on p->end), so writes in flight need no order
 *     among themselves, and inline writes (dpipe_write_now) may go beside
 *     them; a direct and a buffered write never cover the same bytes;
 *  3. dpipe_finish returns only when every write submitted has completed (or
 *     was given up after an error) and the helpers were joined.  The pass
 *     syncs the backing file only after that and only if it returned 0, so
 *     its fdatasync, which covers every write completed before it started
 *     through any descriptor of the file, covers every write of the pass,
 *     and the pass marks blocks clean only after it;
 *  4. the first write error stops the writes: later buffers are not written,
 *     dpipe_put and dpipe_finish return it, and the pass marks nothing clean
 *     (destage retries, the data stays dirty);
 *  5. sync_file_range makes nothing durable and nothing relies on it: its
 *     errors are ignored (a writeback error is reported by the fdatasync);
 *  6. the helpers hold no file or slot lock and take only c->lock (for
 *     f->size) and rate_lock; the pass keeps f->rw held for reading (and
 *     MF_BK_BUSY and the coherence note of the change) from before its first
 *     write until after dpipe_finish, so f->fd and the direct descriptor
 *     stay open for the helpers.
 * The backing-write hook (BK_HOOK) runs in a helper after each write
 * completed and before the pass's sync begins, so a recorder sees the true
 * order.  A pass with a single run (a small file) writes inline and starts no
 * thread; so does one whose helpers cannot be created.
 */

static void throttle(struct cache *c, uint64_t bytes)
{
	uint64_t rate = __atomic_load_n(&c->cfg->max_rate, __ATOMIC_RELAXED);
	uint64_t now, at;

	if (!rate)
		return;
	pthread_mutex_lock(&c->rate_lock);
	now = now_ns();
	if (c->rate_next_ns < now)
		c->rate_next_ns = now;
	at = c->rate_next_ns;
	c->rate_next_ns += bytes * 1000000000ull / rate;
	pthread_mutex_unlock(&c->rate_lock);
	if (at > now) {
		struct timespec ts = { (at - now) / 1000000000ull,
				       (at - now) % 1000000000ull };

		nanosleep(&ts, NULL);
	}
}

/* Bytes of [off, off + len) that a direct write may take: whole pages. */
static uint64_t direct_part(uint64_t off, uint64_t len)
{
	assert(off % NVC_PAGE == 0);
	return len - len % NVC_PAGE;
}

/*
 * Write len bytes of buf at off, within the cached size: whole pages through
 * the direct descriptor when there is one, the rest (the file's last partial
 * page) and everything on a store without direct I/O through f->fd, with its
 * writeback started.
 */
static int run_write(struct dpipe *p, const char *buf, uint64_t off,
		     uint64_t len)
{
	struct cache *c = p->c;
	struct cfile *f = p->f;
	uint64_t size, d = 0;
	int ret, dfd;

	if (!len)
		return 0;
	pthread_mutex_lock(&c->lock);
	size = f->size;
	cache_unlock(c);
	if (off >= size)
		len = 0;
	else if (off + len > size)
		len = size - off;
	if (!len)
		return 0;
	throttle(c, len);
	dfd = __atomic_load_n(&p->dfd, __ATOMIC_ACQUIRE);
	if (dfd >= 0 && !__atomic_load_n(&f->bks_off, __ATOMIC_RELAXED))
		d = direct_part(off, len);
	if (d) {
		ret = backing_write_fd(c, f, dfd, buf, d, off);
		if (ret == -EINVAL) {
			/* the store takes no direct writes after all */
			__atomic_store_n(&f->bks_off, 1, __ATOMIC_RELAXED);
			d = 0;
		} else if (ret) {
			return ret;
		}
	}
	if (d < len) {
		ret = backing_write(c, f, buf + d, len - d, off + d);
		if (ret)
			return ret;
		/* 5.: a hint; only the pass's fdatasync counts */
		(void)sync_file_range(f->fd, off + d, len - d,
				      SYNC_FILE_RANGE_WRITE);
	}
	CNT_ADD(c, destaged_bytes, len);
	stats_note_destaged(c, len);
	return 0;
}

static void *dpipe_main(void *arg)
{
	struct dpipe *p = arg;
	struct dpipe_job job;
	int ret;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->nq && !p->stop)
			pthread_cond_wait(&p->cond, &p->lock);
		if (!p->nq)
			break;
		job = p->q[p->head];
		p->head = (p->head + 1) % (DPIPE_NBUF * DPIPE_RUNS);
		p->nq--;
		p->writing++;
		ret = p->err;
		pthread_mutex_unlock(&p->lock);
		if (!ret) /* 4.: nothing after an error */
			ret = run_write(p, p->bufs[job.bi] + job.at, job.off,
					job.len);
		pthread_mutex_lock(&p->lock);
		if (ret && !p->err)
			p->err = ret;
		p->writing--;
		if (!--p->refs[job.bi]) { /* its last run */
			p->free[p->nfree++] = job.bi;
			pthread_cond_signal(&p->done);
		}
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* p->dfd before the pass's first write of a whole page: a pass of a small
 * file (its one partial page) opens nothing more. */
#define DFD_UNOPENED (-2)

/* A second open of f's backing file for direct writes, or -1 (none on a
 * FUSE store). */
static int open_direct(struct cache *c, struct cfile *f)
{
	char path[64];
	int fd;

	if (c->bk_fuse || __atomic_load_n(&f->bks_off, __ATOMIC_RELAXED))
		return -1;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", f->fd);
	fd = open(path, O_WRONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0 && errno == EINVAL)
		__atomic_store_n(&f->bks_off, 1, __ATOMIC_RELAXED);
	return fd;
}

int dpipe_init(struct dpipe *p, struct cache *c, struct cfile *f)
{
	memset(p, 0, sizeof(*p));
	p->c = c;
	p->f = f;
	p->cur = p->bufs[0] = dev_alloc_buf(DESTAGE_BUF);
	if (!p->cur)
		return -ENOMEM;
	p->nbufs = 1;
	p->depth = __atomic_load_n(&c->cfg->destage_depth, __ATOMIC_RELAXED);
	if (p->depth > DPIPE_WRITERS)
		p->depth = DPIPE_WRITERS;
	p->dfd = DFD_UNOPENED;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	pthread_cond_init(&p->done, NULL);
	return 0;
}

/* The direct descriptor, opened on the pass's thread before the first
 * write that holds a whole page (helpers only read p->dfd). */
static void need_direct(struct dpipe *p, uint32_t len)
{
	if (p->dfd == DFD_UNOPENED && len >= NVC_PAGE)
		__atomic_store_n(&p->dfd, open_direct(p->c, p->f),
				 __ATOMIC_RELEASE);
}

int dpipe_write_now(struct dpipe *p, const char *buf, uint64_t off,
		    uint32_t len)
{
	int ret;

	assert(off >= p->end); /* 2. */
	need_direct(p, len);
	ret = run_write(p, buf, off, len);
	p->end = off + len;
	return ret;
}

/* Start the helpers when more runs follow; 0 started: writes stay inline. */
static void dpipe_start(struct dpipe *p)
{
	while (p->nthreads < p->depth &&
	       !pthread_create(&p->thr[p->nthreads], NULL, dpipe_main, p))
		p->nthreads++;
}

/* The next buffer to read into: a free one, a new one, or the first that a
 * helper gives back (p->lock held). */
static void next_buf_locked(struct dpipe *p)
{
	if (!p->nfree && p->nbufs < DPIPE_NBUF) {
		char *b = dev_alloc_buf(DESTAGE_BUF);

		if (b) {
			p->ci = p->nbufs;
			p->bufs[p->nbufs++] = b;
			p->cur = b;
			return;
		}
	}
	/* the helpers give every buffer back, written or not */
	while (!p->nfree)
		pthread_cond_wait(&p->done, &p->lock);
	p->ci = p->free[--p->nfree];
	p->cur = p->bufs[p->ci];
}

int dpipe_put_runs(struct dpipe *p, const struct dpipe_run *r, unsigned n,
		   int more)
{
	unsigned k;
	int ret;

	if (!n)
		return 0;
	for (k = 0; k < n; k++) {
		assert(r[k].off >= p->end); /* 2. */
		assert(r[k].at + r[k].len <= DESTAGE_BUF);
		p->end = r[k].off + r[k].len;
		need_direct(p, r[k].len);
	}
	if (!p->nthreads && (more || n > 1))
		dpipe_start(p);
	if (!p->nthreads) {
		for (k = 0; k < n && !p->err; k++) {
			ret = run_write(p, p->cur + r[k].at, r[k].off,
					r[k].len);
			if (ret && !p->err)
				p->err = ret;
		}
		return p->err;
	}
	pthread_mutex_lock(&p->lock);
	assert(p->nq + n <= DPIPE_NBUF * DPIPE_RUNS);
	for (k = 0; k < n; k++)
		p->q[(p->head + p->nq++) % (DPIPE_NBUF * DPIPE_RUNS)] =
			(struct dpipe_job){ r[k].off, r[k].len, r[k].at,
					    p->ci };
	p->refs[p->ci] = n;
	if (n == 1)
		pthread_cond_signal(&p->cond);
	else
		pthread_cond_broadcast(&p->cond);
	next_buf_locked(p);
	ret = p->err;
	pthread_mutex_unlock(&p->lock);
	return ret;
}

int dpipe_put(struct dpipe *p, uint64_t off, uint32_t len, int more)
{
	struct dpipe_run r = { off, len, 0 };

	return len ? dpipe_put_runs(p, &r, 1, more) : 0;
}

int dpipe_finish(struct dpipe *p)
{
	unsigned k;

	if (p->nthreads) {
		pthread_mutex_lock(&p->lock);
		p->stop = 1;
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->lock);
		for (k = 0; k < p->nthreads; k++)
			pthread_join(p->thr[k], NULL); /* 3. */
		p->nthreads = 0;
	}
	assert(!p->nq && !p->writing);
	for (k = 0; k < p->nbufs; k++)
		free(p->bufs[k]);
	if (p->dfd >= 0)
		close(p->dfd);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->cond);
	pthread_cond_destroy(&p->done);
	return p->err;
}
