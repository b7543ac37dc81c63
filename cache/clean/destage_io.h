/* cache: the destage pipeline's interface (destage_io.c), used by destage.c. */
#ifndef NVC_DESTAGE_IO_H
#define NVC_DESTAGE_IO_H

#include "clean.h"

/* A run of a pass: up to DESTAGE_BUF contiguous bytes of the file. */
#define DESTAGE_BUF (1024u * 1024)
/* Buffers of a pipeline: the one being read and up to DPIPE_NBUF - 1 written
 * behind.  A buffer holds one run or several short ones (scattered dirty
 * pages, packed); each run is a job of its own, written by one of
 * destage.queue_depth helpers (DPIPE_WRITERS at most), so that the store
 * sees as many writes in flight as it takes (destage_io.c).  Buffers are
 * allocated as the pass needs them, so a small file's pass takes one. */
#define DPIPE_NBUF 8
#define DPIPE_WRITERS 64
#define DPIPE_RUNS (DESTAGE_BUF / NVC_PAGE) /* runs of one buffer, at most */

/* One run of a buffer: len bytes at buffer offset at, for file offset off. */
struct dpipe_run {
	uint64_t off;
	uint32_t len, at;
};

struct dpipe_job {
	uint64_t off;
	uint32_t len, at;
	unsigned bi; /* index in bufs[] */
};

struct dpipe {
	struct cache *c;
	struct cfile *f;
	int dfd; /* f's backing file opened with O_DIRECT, -1 (none), or -2
		    before the pass's first whole page (destage_io.c) */
	char *cur; /* the buffer the pass reads into now */
	unsigned ci; /* its index in bufs[] */
	char *bufs[DPIPE_NBUF];
	unsigned refs[DPIPE_NBUF]; /* jobs of each buffer not yet done */
	unsigned nbufs; /* allocated */
	unsigned free[DPIPE_NBUF];
	unsigned nfree;
	/* submitted, not yet taken: a ring */
	struct dpipe_job q[DPIPE_NBUF * DPIPE_RUNS];
	unsigned head, nq;
	unsigned writing; /* jobs taken by helpers and not yet done */
	int err; /* the first write error: nothing after it is written */
	unsigned nthreads, depth; /* helpers started; at most depth */
	int stop;
	uint64_t end; /* end of the last write submitted (offsets ascend) */
	pthread_t thr[DPIPE_WRITERS];
	pthread_mutex_t lock;
	pthread_cond_t cond; /* helpers wait for jobs */
	pthread_cond_t done; /* the pass waits for a free buffer */
};

/* Set up a pipeline for one pass over f (f->rw held for reading). */
int dpipe_init(struct dpipe *p, struct cache *c, struct cfile *f);
/* Write p->cur's first len bytes at off (written behind when more runs
 * follow), and make p->cur a free buffer.  Returns the first write error of
 * the pass so far. */
int dpipe_put(struct dpipe *p, uint64_t off, uint32_t len, int more);
/* The same for n runs of p->cur, in ascending file order. */
int dpipe_put_runs(struct dpipe *p, const struct dpipe_run *r, unsigned n,
		   int more);
/* Write buf's len bytes at off now, in the calling thread. */
int dpipe_write_now(struct dpipe *p, const char *buf, uint64_t off,
		    uint32_t len);
/* Wait until every write submitted is done, stop the helper, free the
 * buffers.  Returns the first write error of the pass, or 0. */
int dpipe_finish(struct dpipe *p);

#endif
