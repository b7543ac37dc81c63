/* cache: the destage pipeline — a pass's backing writes go on a helper thread,
 * behind the device reads of the next runs, with their writeback started. */
#define _GNU_SOURCE
#include "destage_io.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * Why.  A pass (destage_file) reads runs of dirty pages from the cache
 * devices and writes each to the backing file.  Done one after the other, the
 * devices wait while the backing file is written and the backing store waits
 * while the devices are read; and buffered writes only reach the backing
 * store at the pass's fdatasync, which then finds the whole pass to write
 * (on ext4 here about half the store's own bandwidth).  So each run, once
 * read, is handed to a helper thread that writes it and starts its writeback
 * (sync_file_range, SYNC_FILE_RANGE_WRITE), while the pass reads the next
 * runs into other buffers; the store writes while the devices are read, and
 * the fdatasync finds only the last runs to wait for.  Buffered writes with
 * early writeback were measured against O_DIRECT writes (one or two in
 * flight) on this machine's ext4: they reach 1.2-1.4x the store's own 1 MiB
 * O_DIRECT write, O_DIRECT with its fdatasync about 1.0x, buffered writes
 * left to the fdatasync 0.3-0.5x.
 *
 * Ordering.  The pipeline changes nothing that decides when a block is clean:
 *  1. a buffer is submitted only after all its device reads completed and the
 *     slots they came from were unlocked (batch_flush): the bytes written are
 *     the ones read while the slot's gen was what the pass noted;
 *  2. within a pass each backing offset is written at most once (runs are
 *     cut from disjoint dirty pages, slots in ascending block order, pages in
 *     ascending order; asserted on p->end), so writes in flight need no order
 *     among themselves, and inline writes (dpipe_write_now) may go beside
 *     them;
 *  3. dpipe_finish returns only when every write submitted has completed (or
 *     was given up after an error) and the helper was joined.  The pass syncs
 *     the backing file only after that and only if it returned 0, so its
 *     fdatasync, which covers every write completed before it started, covers
 *     every write of the pass, and the pass marks blocks clean only after it;
 *  4. the first write error stops the writes: later buffers are not written,
 *     dpipe_put and dpipe_finish return it, and the pass marks nothing clean
 *     (destage retries, the data stays dirty);
 *  5. sync_file_range makes nothing durable and nothing relies on it: its
 *     errors are ignored (a writeback error is reported by the fdatasync);
 *  6. the helper holds no file or slot lock and takes only c->lock (for
 *     f->size) and rate_lock; the pass keeps f->rw held for reading (and
 *     MF_BK_BUSY and the coherence note of the change) from before its first
 *     write until after dpipe_finish, so f->fd stays open for the helper.
 * The backing-write hook (BK_HOOK) runs in the helper after each write
 * completed and before the pass's sync begins, so a recorder sees the true
 * order.  A pass with a single run (a small file) writes inline and starts no
 * thread; so does one whose helper cannot be created.
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

/* Write len bytes of buf at off, within the cached size, and start their
 * writeback. */
static int run_write(struct cache *c, struct cfile *f, const char *buf,
		     uint64_t off, uint64_t len)
{
	uint64_t size;
	int ret;

	if (!len)
		return 0;
	pthread_mutex_lock(&c->lock);
	size = f->size;
	pthread_mutex_unlock(&c->lock);
	if (off >= size)
		len = 0;
	else if (off + len > size)
		len = size - off;
	if (!len)
		return 0;
	throttle(c, len);
	ret = backing_write(c, f, buf, len, off);
	if (ret)
		return ret;
	/* 5.: a hint; only the pass's fdatasync counts */
	(void)sync_file_range(f->fd, off, len, SYNC_FILE_RANGE_WRITE);
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
		p->writing = 1;
		ret = p->err;
		pthread_mutex_unlock(&p->lock);
		if (!ret) /* 4.: nothing after an error */
			ret = run_write(p->c, p->f, job.buf, job.off, job.len);
		pthread_mutex_lock(&p->lock);
		if (ret && !p->err)
			p->err = ret;
		p->writing = 0;
		p->head = (p->head + 1) % DPIPE_NBUF;
		p->nq--;
		p->free[p->nfree++] = job.buf;
		pthread_cond_broadcast(&p->cond);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int dpipe_init(struct dpipe *p, struct cache *c, struct cfile *f)
{
	unsigned k;

	memset(p, 0, sizeof(*p));
	p->c = c;
	p->f = f;
	for (k = 0; k < DPIPE_NBUF; k++) {
		p->bufs[k] = dev_alloc_buf(DESTAGE_BUF);
		if (!p->bufs[k])
			goto free_bufs;
		p->free[p->nfree++] = p->bufs[k];
	}
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->cur = p->free[--p->nfree];
	return 0;

free_bufs:
	while (k--)
		free(p->bufs[k]);
	return -ENOMEM;
}

int dpipe_write_now(struct dpipe *p, const char *buf, uint64_t off,
		    uint32_t len)
{
	int ret;

	assert(off >= p->end); /* 2. */
	ret = run_write(p->c, p->f, buf, off, len);
	p->end = off + len;
	return ret;
}

int dpipe_put(struct dpipe *p, uint64_t off, uint32_t len, int more)
{
	int ret;

	if (!len)
		return 0;
	assert(off >= p->end); /* 2. */
	p->end = off + len;
	if (!p->threaded && more &&
	    !pthread_create(&p->thr, NULL, dpipe_main, p))
		p->threaded = 1;
	if (!p->threaded) {
		ret = run_write(p->c, p->f, p->cur, off, len);
		if (ret && !p->err)
			p->err = ret;
		return p->err;
	}
	pthread_mutex_lock(&p->lock);
	assert(p->nq < DPIPE_NBUF);
	p->q[(p->head + p->nq) % DPIPE_NBUF] =
		(struct dpipe_job){ p->cur, off, len };
	p->nq++;
	pthread_cond_broadcast(&p->cond);
	/* the helper gives every buffer back, written or not */
	while (!p->nfree)
		pthread_cond_wait(&p->cond, &p->lock);
	p->cur = p->free[--p->nfree];
	ret = p->err;
	pthread_mutex_unlock(&p->lock);
	return ret;
}

int dpipe_finish(struct dpipe *p)
{
	unsigned k;

	if (p->threaded) {
		pthread_mutex_lock(&p->lock);
		p->stop = 1;
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->lock);
		pthread_join(p->thr, NULL); /* 3. */
		p->threaded = 0;
	}
	assert(!p->nq && !p->writing);
	for (k = 0; k < DPIPE_NBUF; k++)
		free(p->bufs[k]);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->cond);
	return p->err;
}
