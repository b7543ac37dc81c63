/* cache: direct (O_DIRECT) reads of the backing store for read streams that
 * bypass the cache, with asynchronous readahead. */
#define _GNU_SOURCE
#include "files_int.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * Why.  A stream past cache.sequential_cutoff (admit.c) reads its misses
 * from the backing store and keeps nothing.  Read through the backing file's
 * page cache, each of its bytes is copied twice by the CPU (page cache to the
 * daemon, daemon to the reader through FUSE), the page cache fills with data
 * read once, and on a virtual machine the first touch of a page the host has
 * taken back (free page reporting) costs a fault in the host: measured here
 * (2026-12-01, fio 1M psync of a cold file on the host disk) buffered reads
 * ran at 350-570 MB/s and 0.8 ms of CPU per MiB, O_DIRECT ones at 910-960
 * MB/s, and nvcachefs's uncached stream at 0.4-0.5x the store's own O_DIRECT
 * figure, its CPU in the page cache copy (_copy_to_iter, 85%).  So a
 * bypassing stream reads the backing file with O_DIRECT into buffers the
 * daemon keeps (one CPU copy: the FUSE reply's), and reads ahead of itself
 * so that the store works while FUSE copies: each read starts the reads of
 * the next bytes of its stream, up to backing.direct_read_ahead of them
 * (segments of BKS_SEG; how many, seg_readahead), which BKS_THREADS threads
 * run, and a later read of the stream takes its bytes from those segments,
 * waiting for one still being read.
 *
 * Coherence (PRODUCT.md §4.3, §4.7).  This changes where a stream's misses
 * come from, never which bytes are misses: the read path (io.c read_chunk)
 * still serves every page valid in the cache (dirty ones above all) from the
 * cache and asks bks_read only for pages it found not valid.  For those the
 * truth is the backing file, and a segment read earlier is served only if the
 * backing file cannot have changed since its read began:
 *   - every change the daemon makes to a backing file (backing_write, which
 *     destage and the writethrough and writearound paths use; truncate and
 *     fallocate through file_bk_changed) bumps f->bks_gen after it is made,
 *     and so does every open of the file (the revalidation at open, §4.7:
 *     close-to-open, like the cache's own clean data);
 *   - a write through the mount bumps f->wgen;
 *   - a segment notes both before its read is queued, and is served only
 *     while both are unchanged (else it is dropped and the bytes are read
 *     again).
 * A change still under way when a read checks is either excluded by f->rw
 * (writearound, truncate, fallocate, revalidation hold it for writing; the
 * read holds it for reading) or a destage of pages that are valid in the
 * cache until it completes (a slot becomes clean, hence evictable, only after
 * its destage is durable), which the read path serves from the cache.  Data
 * read ahead is never kept in the cache.
 *
 * Where direct I/O cannot be had (the store refuses O_DIRECT, an unaligned
 * buffer, more than BKS_MAXSTREAMS streams at once, the key set to 0) the
 * read goes through the page cache as before (-EAGAIN to the caller).
 *
 * Locking.  One mutex per cache (p->lock) guards every stream's segments and
 * the queue; it is never held across I/O or a copy (a segment being copied
 * is pinned by users).  Lock order: c->lock, then p->lock (bks_detach runs
 * under c->lock); the readahead threads take no other lock.  A stream belongs
 * to its cfile (f->bks): made by the first bypassing read, gone when the
 * file loses its backing descriptor or is freed (bks_detach), which waits
 * for its segments in flight.  Its descriptor is a second open of f->fd's
 * file (/proc/self/fd), so it names the same file.
 */

#define BKS_MAXSEG 18 /* window / BKS_SEG + 2 at most */
#define BKS_THREADS 2
#define BKS_MAXSTREAMS 8
#define BKS_FREEBUFS BKS_MAXSEG
#define BKS_ACT 8 /* streams whose last read a file remembers */

enum { SEG_FREE, SEG_LOADING, SEG_READY };

struct bks_seg {
	/* file offset, page aligned; the bytes asked for, to a BKS_SEG
	 * boundary (less than BKS_SEG for a stream's first segment) */
	uint64_t off;
	uint32_t want;
	uint32_t len; /* bytes the backing file had there (short: its end) */
	int state;
	int res; /* 0 or -errno of its read */
	int users; /* reads copying from it */
	uint64_t gen, wgen; /* f->bks_gen, f->wgen before its read was queued */
	char *buf;
	struct bks *owner;
	struct bks_seg *qnext;
	uint64_t sid; /* the stream (admit.c) that queued or last used it */
};

struct bks {
	int dfd;
	int nseg; /* segments: the window's, one a late read may still want,
		     and one a reply may pin */
	int nwin; /* segments read ahead of the stream */
	uint64_t clock; /* reads of the file through here */
	struct {
		uint64_t sid, clock; /* a stream, and its last read's clock */
	} act[BKS_ACT];
	uint64_t ra_queued, ra_used; /* bytes read ahead; of them, served */
	struct bks_seg seg[BKS_MAXSEG];
};

struct bks_pool {
	pthread_mutex_t lock;
	pthread_cond_t work, done;
	struct bks_seg *qhead, **qtail;
	pthread_t thr[BKS_THREADS];
	int nthr, stopping;
	unsigned nstreams;
	char *freebuf[BKS_FREEBUFS];
	int nfree;
};

static pthread_mutex_t pool_make_lock = PTHREAD_MUTEX_INITIALIZER;

void bks_changed(struct cfile *f)
{
	__atomic_add_fetch(&f->bks_gen, 1, __ATOMIC_RELEASE);
}

/*
 * Read [off, off+len) of dfd into buf; zeros past the end; the bytes the
 * file had in *got.  A short read is not the end of the file: a network or
 * FUSE store returns one wherever it likes (issue 25: taken for the end, the
 * rest of the request was served as zeros).  The end is a read that returns
 * 0, or a short read that stops where fstat says the file ends; after any
 * other short read the rest is asked again, from the page the read stopped
 * in (O_DIRECT takes only aligned offsets: that page is read again).  A
 * store that keeps returning short without moving on fails the read (EIO)
 * after BKS_SHORT_TRIES tries.
 */
#define BKS_SHORT_TRIES 16

static ssize_t bk_pread(struct cache *c, int fd, void *buf, size_t len,
			uint64_t off)
{
	if (c->test_pread)
		return c->test_pread(fd, buf, len, off);
	cache_may_block(c);
	return pread(fd, buf, len, off);
}

static int direct_pread(struct cache *c, int dfd, char *buf, size_t len,
			uint64_t off, size_t *got)
{
	size_t done = 0;
	int stuck = 0;

	while (done < len) {
		size_t from = done & ~(size_t)(NVC_PAGE - 1);
		ssize_t n =
			bk_pread(c, dfd, buf + from, len - from, off + from);
		struct stat st;

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		if (from + n > done) {
			done = from + n;
			stuck = 0;
		} else if (++stuck >= BKS_SHORT_TRIES) {
			return -EIO;
		}
		if (done == len || !(done % NVC_PAGE))
			continue; /* aligned and short: the rest is asked */
		/* inside a page: the end, or only a short read? */
		cache_may_block(c);
		if (fstat(dfd, &st))
			return -errno;
		if ((uint64_t)st.st_size <= off + done)
			break;
	}
	if (got)
		*got = done;
	memset(buf + done, 0, len - done);
	return 0;
}

static void *bks_thread(void *arg)
{
	struct cache *c = arg;
	struct bks_pool *p = c->bksp;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		struct bks_seg *s = p->qhead;
		uint64_t t0;
		size_t got = 0;
		int res;

		if (!s) {
			if (p->stopping)
				break;
			pthread_cond_wait(&p->work, &p->lock);
			continue;
		}
		p->qhead = s->qnext;
		if (!p->qhead)
			p->qtail = &p->qhead;
		assert(s->state == SEG_LOADING);
		pthread_mutex_unlock(&p->lock);
		t0 = stat_clock(&c->stats);
		res = direct_pread(c, s->owner->dfd, s->buf, s->want, s->off,
				   &got);
		if (!res) {
			CNT_ADD(c, backing_read_bytes, got);
			stat_lat_since(&c->stats, STAT_L_backing_read, t0);
		}
		pthread_mutex_lock(&p->lock);
		s->res = res;
		s->len = got;
		s->state = SEG_READY;
		pthread_cond_broadcast(&p->done);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* The cache's pool, its threads started on first use; NULL if it cannot be
 * had. */
static struct bks_pool *pool_get(struct cache *c)
{
	struct bks_pool *p = __atomic_load_n(&c->bksp, __ATOMIC_ACQUIRE);

	if (p)
		return p;
	pthread_mutex_lock(&pool_make_lock);
	p = c->bksp;
	if (!p) {
		p = calloc(1, sizeof(*p));
		if (p) {
			pthread_mutex_init(&p->lock, NULL);
			pthread_cond_init(&p->work, NULL);
			pthread_cond_init(&p->done, NULL);
			p->qtail = &p->qhead;
			__atomic_store_n(&c->bksp, p, __ATOMIC_RELEASE);
			for (; p->nthr < BKS_THREADS; p->nthr++)
				if (pthread_create(&p->thr[p->nthr], NULL,
						   bks_thread, c))
					break;
		}
	}
	pthread_mutex_unlock(&pool_make_lock);
	return p && p->nthr ? p : NULL;
}

static void bks_free(struct bks_pool *p, struct bks *b)
{
	int i;

	for (i = 0; i < b->nseg; i++) {
		if (!b->seg[i].buf)
			continue;
		if (p && p->nfree < BKS_FREEBUFS)
			p->freebuf[p->nfree++] = b->seg[i].buf;
		else
			free(b->seg[i].buf);
	}
	free(b);
}

/* f's stream, made if it has none; NULL: not this way. */
static struct bks *bks_get(struct cache *c, struct bks_pool *p, struct cfile *f,
			   uint64_t window)
{
	char path[64];
	struct bks *b;
	int i, dfd;

	pthread_mutex_lock(&p->lock);
	b = f->bks;
	if (b || p->nstreams >= BKS_MAXSTREAMS) {
		pthread_mutex_unlock(&p->lock);
		return b;
	}
	p->nstreams++;
	pthread_mutex_unlock(&p->lock);

	snprintf(path, sizeof(path), "/proc/self/fd/%d", f->fd);
	dfd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	b = dfd >= 0 ? calloc(1, sizeof(*b)) : NULL;
	if (!b) {
		if (dfd < 0 && errno == EINVAL)
			__atomic_store_n(&f->bks_off, 1, __ATOMIC_RELAXED);
		if (dfd >= 0)
			close(dfd);
		goto undo;
	}
	b->dfd = dfd;
	b->nwin = window / BKS_SEG;
	if (b->nwin < 1)
		b->nwin = 1;
	if (b->nwin > BKS_MAXSEG - 2)
		b->nwin = BKS_MAXSEG - 2;
	b->nseg = b->nwin + 2;
	for (i = 0; i < b->nseg; i++)
		b->seg[i].owner = b;
	pthread_mutex_lock(&p->lock);
	if (f->bks) {
		/* another read made one meanwhile */
		struct bks *other = f->bks;

		p->nstreams--;
		pthread_mutex_unlock(&p->lock);
		close(dfd);
		free(b);
		return other;
	}
	__atomic_store_n(&f->bks, b, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&p->lock);
	return b;
undo:
	pthread_mutex_lock(&p->lock);
	p->nstreams--;
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static struct bks_seg *seg_find(struct bks *b, uint64_t at)
{
	int i;

	for (i = 0; i < b->nseg; i++) {
		struct bks_seg *s = &b->seg[i];

		if (s->state != SEG_FREE && at >= s->off &&
		    at < s->off + s->want)
			return s;
	}
	return NULL;
}

/* Stream sid reads now (p->lock held): the file's clock moves on. */
static void act_note(struct bks *b, uint64_t sid)
{
	int i, old = 0;

	b->clock++;
	for (i = 0; i < BKS_ACT; i++) {
		if (b->act[i].sid == sid)
			break;
		if (b->act[i].clock < b->act[old].clock)
			old = i;
	}
	if (i == BKS_ACT)
		i = old;
	b->act[i].sid = sid;
	b->act[i].clock = b->clock;
}

/* The clock of stream sid's last read (0: forgotten). */
static uint64_t act_last(struct bks *b, uint64_t sid)
{
	int i;

	for (i = 0; i < BKS_ACT; i++)
		if (b->act[i].sid == sid)
			return b->act[i].clock;
	return 0;
}

/* A segment (not free) that holds a byte of [from, to), or NULL. */
static struct bks_seg *seg_over(struct bks *b, uint64_t from, uint64_t to)
{
	int i;

	for (i = 0; i < b->nseg; i++) {
		struct bks_seg *s = &b->seg[i];

		if (s->state != SEG_FREE && s->off < to &&
		    from < s->off + s->want)
			return s;
	}
	return NULL;
}

/*
 * Queue the reads of the segments ahead of done that stream v is owed and b
 * has not got, in segments no longer wanted (p->lock held).
 *
 * What is read ahead and never served is read for no one; three rules keep
 * it bounded (issue 25: one window per segment shared by all the streams of
 * a file was thrown away by each read of another stream, and interleaved
 * streams read the backing store 46 times over).
 *   - The window grows with the stream: the segment its front is in and
 *     half of what it has read sequentially (v->seq) after it, up to b->nwin
 *     segments in all; a stream shorter than two segments gets none.  A
 *     stream that stops wastes at most half of what it read and a segment
 *     (in practice one window of a long one).
 *   - Nothing is read at or past where the next stream ahead began
 *     (v->ahead): the bytes that stream has read or is reading.
 *   - A budget: the bytes read ahead and not (yet) served never pass the
 *     file's segments (b->nseg of them) and an eighth of what was served.
 *     So in all, whatever the pattern, the file's readahead reads at most
 *     1.125x what it served, plus b->nseg segments.
 * The window starts at the stream's front (admit_front, whose spin lock is
 * taken under p->lock and takes no other: the kernel's readahead
 * requests of a stream run on several threads at once, and a read behind the
 * front must not read ahead what a request in flight is reading), its first
 * segment where the front is, not at the segment boundary before it: the
 * bytes before were asked by the stream itself.
 * Segments no longer wanted: this stream's BKS_LATE behind done (the
 * kernel's readahead requests are answered out of order: a read behind the
 * stream's front still wants the segment before; and a read behind it never
 * drops segments ahead of its own window), any noted in another generation
 * or failed, and another stream's once that stream has not read for
 * BKS_STALE reads of the file (it stopped).
 */
#define BKS_STALE 64
#define BKS_LATE (BKS_SEG / 2)

static void seg_readahead(struct bks_pool *p, struct bks *b,
			  const struct admit_verdict *v, uint64_t front,
			  uint64_t done, uint64_t size, uint64_t g, uint64_t w)
{
	uint64_t win = v->seq / 2 / BKS_SEG, from, to, at,
		 cap = size < v->ahead ? size : v->ahead;
	int i, queued = 0;

	if (front < done)
		front = done;
	from = front / BKS_SEG * BKS_SEG;

	if (win)
		win++; /* the segment the front is in, and those after */
	if (win > (uint64_t)b->nwin)
		win = b->nwin;
	to = from + win * BKS_SEG;
	for (i = 0; i < b->nseg; i++) {
		struct bks_seg *s = &b->seg[i];

		if (s->state != SEG_READY || s->users)
			continue;
		if (s->gen != g || s->wgen != w || s->res ||
		    (s->sid == v->sid && s->off + s->want + BKS_LATE <= done) ||
		    (s->sid != v->sid &&
		     b->clock - act_last(b, s->sid) > BKS_STALE))
			s->state = SEG_FREE;
	}
	for (at = from; at < to && at < cap; at += BKS_SEG) {
		/* a stream's first segment starts where it is (the stream
		 * has read what lies before) */
		uint64_t start = at == from ? front / NVC_PAGE * NVC_PAGE : at,
			 n = size - start < at + BKS_SEG - start
				     ? size - start
				     : at + BKS_SEG - start;
		struct bks_seg *s = seg_over(b, start, at + BKS_SEG);

		if (start >= size)
			break;

		if (s &&
		    (s->state == SEG_LOADING || (s->gen == g && s->wgen == w)))
			continue;
		if (at + n > cap && cap < size)
			break; /* into the next stream */
		if (b->ra_queued + n >
		    b->ra_used + (uint64_t)b->nseg * BKS_SEG + b->ra_used / 8)
			break; /* the budget */
		for (i = 0; i < b->nseg && b->seg[i].state != SEG_FREE; i++)
			;
		if (i == b->nseg)
			break;
		s = &b->seg[i];
		if (!s->buf)
			s->buf = p->nfree ? p->freebuf[--p->nfree]
					  : dev_alloc_buf(BKS_SEG);
		if (!s->buf)
			break;
		s->state = SEG_LOADING;
		s->off = start;
		s->want = at + BKS_SEG - start;
		s->len = 0;
		s->res = 0;
		s->gen = g;
		s->wgen = w;
		s->sid = v->sid;
		s->qnext = NULL;
		*p->qtail = s;
		p->qtail = &s->qnext;
		b->ra_queued += n;
		queued = 1;
	}
	/* the budget (above) holds */
	assert(b->ra_queued <=
	       b->ra_used + (uint64_t)b->nseg * BKS_SEG + b->ra_used / 8);
	if (queued)
		pthread_cond_broadcast(&p->work);
}

/* The file's size and generations a read is checked against (essay). */
static void bks_snap(struct cache *c, struct cfile *f, uint64_t *size,
		     uint64_t *wgen, uint64_t *bks_gen)
{
	pthread_mutex_lock(&c->lock);
	*size = f->size;
	*wgen = f->wgen;
	cache_unlock(c);
	*bks_gen = __atomic_load_n(&f->bks_gen, __ATOMIC_ACQUIRE);
}

int bks_read(struct cache *c, struct cfile *f, char *buf, size_t len,
	     uint64_t off, uint64_t window, const struct admit_verdict *v)
{
	uint64_t end = off + len, cur, g, w, size, t0;
	struct bks_pool *p;
	struct bks *b;
	int ret = 0;

	if (!window || f->fd < 0 || (uintptr_t)buf % NVC_PAGE ||
	    off % NVC_PAGE || len % NVC_PAGE ||
	    __atomic_load_n(&f->bks_off, __ATOMIC_RELAXED))
		return -EAGAIN;
	p = pool_get(c);
	b = p ? bks_get(c, p, f, window) : NULL;
	if (!b)
		return -EAGAIN;
	bks_snap(c, f, &size, &w, &g);

	pthread_mutex_lock(&p->lock);
	act_note(b, v->sid);
	for (cur = off; cur < end && !ret;) {
		struct bks_seg *s = seg_find(b, cur);
		uint64_t e, have;

		if (s && s->state == SEG_LOADING) {
			pthread_cond_wait(&p->done, &p->lock);
			continue;
		}
		if (s && (s->gen != g || s->wgen != w || s->res)) {
			if (!s->users)
				s->state = SEG_FREE;
			s = NULL;
		}
		if (s) {
			/* read ahead: copied outside the lock, pinned */
			e = end < s->off + s->want ? end : s->off + s->want;
			have = s->off + s->len;
			s->users++;
			s->sid = v->sid;
			if (cur < have)
				b->ra_used += (e < have ? e : have) - cur;
			pthread_mutex_unlock(&p->lock);
			if (cur < have)
				memcpy(buf + (cur - off),
				       s->buf + (cur - s->off),
				       (e < have ? e : have) - cur);
			if (e > have)
				memset(buf + ((cur > have ? cur : have) - off),
				       0, e - (cur > have ? cur : have));
			pthread_mutex_lock(&p->lock);
			if (!--s->users)
				pthread_cond_broadcast(&p->done);
			cur = e;
			continue;
		}
		/* not read ahead: read now, up to the next segment */
		e = (cur / BKS_SEG + 1) * BKS_SEG;
		if (e > end)
			e = end;
		pthread_mutex_unlock(&p->lock);
		t0 = stat_clock(&c->stats);
		ret = direct_pread(c, b->dfd, buf + (cur - off), e - cur, cur,
				   NULL);
		if (!ret) {
			CNT_ADD(c, backing_read_bytes, e - cur);
			stat_lat_since(&c->stats, STAT_L_backing_read, t0);
		}
		pthread_mutex_lock(&p->lock);
		cur = e;
	}
	if (!ret)
		seg_readahead(p, b, v, admit_front(&f->adm, v->sid), end, size,
			      g, w);
	pthread_mutex_unlock(&p->lock);
	if (ret == -EINVAL) {
		/* the store takes no direct I/O here after all */
		__atomic_store_n(&f->bks_off, 1, __ATOMIC_RELAXED);
		return -EAGAIN;
	}
	return ret;
}

int bks_read_pinned(struct cache *c, struct cfile *f, size_t len, uint64_t off,
		    uint64_t window, const struct admit_verdict *v,
		    const char **data, void **pin)
{
	struct bks_pool *p = __atomic_load_n(&c->bksp, __ATOMIC_ACQUIRE);
	struct bks_seg *s = NULL;
	uint64_t g, w, size;
	int ret = -EAGAIN;

	/* only a stream that is under way: bks_read makes one */
	if (!window || !p || !__atomic_load_n(&f->bks, __ATOMIC_RELAXED) ||
	    f->fd < 0)
		return -EAGAIN;
	bks_snap(c, f, &size, &w, &g);
	pthread_mutex_lock(&p->lock);
	while (f->bks && (s = seg_find(f->bks, off)) && s->state == SEG_LOADING)
		pthread_cond_wait(&p->done, &p->lock);
	if (!f->bks)
		s = NULL;
	if (s && s->gen == g && s->wgen == w && !s->res &&
	    off + len <= s->off + s->len) {
		s->users++;
		act_note(f->bks, v->sid);
		s->sid = v->sid;
		f->bks->ra_used += len;
		*data = s->buf + (off - s->off);
		*pin = s;
		seg_readahead(p, f->bks, v, admit_front(&f->adm, v->sid),
			      off + len, size, g, w);
		ret = 0;
	}
	pthread_mutex_unlock(&p->lock);
	return ret;
}

void bks_unpin(struct cache *c, void *pin)
{
	struct bks_pool *p = c->bksp;
	struct bks_seg *s = pin;

	pthread_mutex_lock(&p->lock);
	assert(s->users > 0);
	if (!--s->users)
		pthread_cond_broadcast(&p->done);
	pthread_mutex_unlock(&p->lock);
}

void bks_detach(struct cache *c, struct cfile *f)
{
	struct bks_pool *p = __atomic_load_n(&c->bksp, __ATOMIC_ACQUIRE);
	struct bks *b;
	int i;

	if (!p || !__atomic_load_n(&f->bks, __ATOMIC_RELAXED))
		return;
	pthread_mutex_lock(&p->lock);
	b = f->bks;
	for (i = 0; b && i < b->nseg;) {
		if (b->seg[i].state == SEG_LOADING || b->seg[i].users) {
			pthread_cond_wait(&p->done, &p->lock);
			i = 0;
			continue;
		}
		i++;
	}
	__atomic_store_n(&f->bks, NULL, __ATOMIC_RELAXED);
	if (b) {
		p->nstreams--;
		close(b->dfd);
		bks_free(p, b);
	}
	pthread_mutex_unlock(&p->lock);
}

void bks_stop(struct cache *c)
{
	struct bks_pool *p = c->bksp;
	int i;

	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stopping = 1;
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->lock);
	for (i = 0; i < p->nthr; i++)
		pthread_join(p->thr[i], NULL);
	p->nthr = 0;
}

/* After bks_stop and every bks_detach: the pool's memory. */
void bks_pool_free(struct cache *c)
{
	struct bks_pool *p = c->bksp;

	if (!p)
		return;
	assert(!p->nthr && !p->nstreams);
	while (p->nfree)
		free(p->freebuf[--p->nfree]);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->work);
	pthread_cond_destroy(&p->done);
	free(p);
	c->bksp = NULL;
}
