/* tests: the asynchronous pipeline — reads and writes begun, their I/O run on
 * a ring, and ended, give what the synchronous path gives, and what it
 * cannot take is refused with nothing done. */
#define _GNU_SOURCE
#include "env.h"

#include <pthread.h>

struct waiter {
	struct dev_acb cb;
	unsigned *pending;
};

static void io_done(struct dev_acb *cb)
{
	(*((struct waiter *)cb)->pending)--;
}

/* Run a begun request's I/O on a ring, as a server's worker does. */
static void run_ios(struct dev_aring *r, struct cache_aio *a)
{
	struct waiter w[CACHE_AIO_MAX_IOS];
	struct dev_io *ios;
	unsigned i, n = cache_aio_ios(a, &ios), pending = 0;

	for (i = 0; i < n; i++) {
		w[i].cb.done = io_done;
		w[i].pending = &pending;
		if (!dev_aring_io(r, &ios[i], &w[i].cb))
			pending++;
	}
	while (pending)
		CHECK(dev_aring_run(r, 1, 0) >= 0);
}

static uint64_t cnt(struct env *e, enum stat_counter k)
{
	return cache_counter(e->c, k);
}

static uint64_t dirty_bytes(struct env *e)
{
	struct stat_snap *s = calloc(1, sizeof(*s));
	uint64_t v;

	cache_snapshot(e->c, s);
	v = STAT_GAUGE(s, dirty_bytes);
	free(s);
	return v;
}

/* Each test's cache (two in-memory devices of 64 slots of 64 KiB), ring and
 * request. */
static struct env e;
static struct dev_aring *ring;
static struct cache_aio *req;

static void setup(void)
{
	env_init(&e, 64, 64 * KiB);
	CHECK_EQ(dev_aring_new(64, &ring), 0);
	CHECK_EQ(cache_aio_new(&req), 0);
}

static void teardown(void)
{
	cache_aio_free(req);
	dev_aring_free(ring);
	env_fini(&e);
}

/* A whole asynchronous request on the test's ring: 0, or begin's or end's
 * error. */
static int aio(struct cfile *f, const char *src, size_t len, uint64_t off,
	       char **data, size_t *n)
{
	int ret = cache_aio_begin(e.c, f, req, src, len, off);

	if (ret)
		return ret;
	CHECK_EQ(cache_aio_held(), 1);
	run_ios(ring, req);
	ret = cache_aio_end(req, data, n);
	CHECK_EQ(cache_aio_held(), 0);
	return ret;
}

/* A read of cached pages is a hit; one of pages not cached is refused. */
static void test_read(void)
{
	char *ref = malloc(512 * KiB), *data;
	struct cfile *f;
	size_t n;
	int fd;

	setup();
	fill(ref, 512 * KiB, 7);
	fd = openat(e.backing_fd, "f", O_RDWR | O_CREAT, 0644);
	CHECK_EQ(pwrite(fd, ref, 512 * KiB, 0), 512 * KiB);
	close(fd);
	f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_write(e.c, f, ref, 256 * KiB, 0), 0);
	/* within one block, across blocks, unaligned */
	CHECK_EQ(aio(f, NULL, 4 * KiB, 8 * KiB, &data, &n), 0);
	CHECK(n == 4 * KiB && !memcmp(data, ref + 8 * KiB, n));
	CHECK_EQ(aio(f, NULL, 200 * KiB, 10, &data, &n), 0);
	CHECK(n == 200 * KiB && !memcmp(data, ref + 10, n));
	CHECK_EQ(cnt(&e, STAT_C_read_hit_ops), 2);
	/* past 256 KiB nothing is cached: the synchronous path reads it */
	CHECK_EQ(aio(f, NULL, 8 * KiB, 252 * KiB, &data, &n),
		 -EAGAIN);
	CHECK_EQ(cnt(&e, STAT_C_read_ops), 2);
	CHECK(same(&e, f, ref, 512 * KiB, 0)); /* keeps what it read */
	CHECK_EQ(aio(f, NULL, 8 * KiB, 252 * KiB, &data, &n), 0);
	CHECK(n == 8 * KiB && !memcmp(data, ref + 252 * KiB, n));
	/* at and past the end of the file */
	CHECK_EQ(aio(f, NULL, 8 * KiB, 508 * KiB, &data, &n), 0);
	CHECK(n == 4 * KiB && !memcmp(data, ref + 508 * KiB, n));
	CHECK_EQ(aio(f, NULL, 8 * KiB, 600 * KiB, &data, &n), 0);
	CHECK_EQ(n, 0);
	cache_file_put(e.c, f);
	close(fd);
	teardown();
	free(ref);
}

/* An overwrite of cached whole pages is taken, is read back, is dirty, and
 * is in the cache after it is opened again (its entries persisted). */
static void test_write(void)
{
	char *ref = malloc(256 * KiB), *upd = malloc(64 * KiB), *data;
	struct cfile *f;
	size_t n;
	int fd;

	setup();
	fill(ref, 256 * KiB, 1);
	fill(upd, 64 * KiB, 2);
	f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_write(e.c, f, ref, 256 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0); /* clean: the intent path */
	CHECK_EQ(aio(f, upd, 8 * KiB, 60 * KiB, &data, &n), 0);
	CHECK_EQ(n, 8 * KiB);
	memcpy(ref + 60 * KiB, upd, 8 * KiB);
	CHECK_EQ(aio(f, upd + 8 * KiB, 4 * KiB, 200 * KiB, &data,
		     &n),
		 0);
	memcpy(ref + 200 * KiB, upd + 8 * KiB, 4 * KiB);
	CHECK(same(&e, f, ref, 256 * KiB, 0));
	CHECK_EQ(dirty_bytes(&e), 12 * KiB);
	CHECK_EQ(cnt(&e, STAT_C_write_ops), 3);
	CHECK_EQ(cnt(&e, STAT_C_write_hit_ops), 2);
	/* what was acknowledged is found again after the cache is reopened */
	cache_file_put(e.c, f);
	cache_close(e.c, 0);
	e.c = NULL;
	env_open(&e);
	CHECK_EQ(dirty_bytes(&e), 12 * KiB);
	CHECK_EQ(cache_file_get(e.c, fd, &f), 0);
	CHECK(same(&e, f, ref, 256 * KiB, 0));
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(backing_same(fd, ref, 256 * KiB));
	cache_file_put(e.c, f);
	close(fd);
	teardown();
	free(ref);
	free(upd);
}

/* A write of part of a page is taken when the page is cached (its other
 * bytes come from the device), refused when the backing file must give
 * them; either way the file reads back as written. */
static void test_partial(void)
{
	char *ref = malloc(256 * KiB), *upd = malloc(8 * KiB), *data;
	struct cfile *f;
	size_t n;
	int fd;

	setup();
	fill(ref, 256 * KiB, 8);
	fill(upd, 8 * KiB, 9);
	fd = openat(e.backing_fd, "f", O_RDWR | O_CREAT, 0644);
	CHECK_EQ(pwrite(fd, ref, 256 * KiB, 0), 256 * KiB);
	close(fd);
	f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_write(e.c, f, ref, 64 * KiB, 0), 0); /* block 0 */
	CHECK_EQ(cache_write(e.c, f, ref + 64 * KiB, 4 * KiB, 64 * KiB), 0);
	/* within one cached page; across two cached pages */
	CHECK_EQ(aio(f, upd, 100, 4096 + 10, &data, &n), 0);
	memcpy(ref + 4096 + 10, upd, 100);
	CHECK_EQ(aio(f, upd + 100, 5000, 3 * 4096 + 100, &data, &n),
		 0);
	memcpy(ref + 3 * 4096 + 100, upd + 100, 5000);
	CHECK_EQ(cnt(&e, STAT_C_write_hit_ops), 2);
	/* block 1 holds only its first page: its third comes from the file */
	CHECK_EQ(cache_aio_begin(e.c, f, req, upd, 100, 72 * KiB + 5), -EAGAIN);
	CHECK_EQ(cache_aio_held(), 0);
	CHECK_EQ(cache_write(e.c, f, upd, 100, 72 * KiB + 5), 0);
	memcpy(ref + 72 * KiB + 5, upd, 100);
	CHECK(same(&e, f, ref, 256 * KiB, 0));
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(backing_same(fd, ref, 256 * KiB));
	cache_file_put(e.c, f);
	close(fd);
	teardown();
	free(ref);
	free(upd);
}

struct other {
	struct env *e;
	struct cfile *f;
	int ret;
};

/* Another server thread's read of the first page, with its own ring. */
static void *other_read(void *arg)
{
	struct other *o = arg;
	struct dev_aring *r;
	struct cache_aio *a;
	char *data;
	size_t n;

	CHECK_EQ(dev_aring_new(16, &r), 0);
	CHECK_EQ(cache_aio_new(&a), 0);
	o->ret = cache_aio_begin(o->e->c, o->f, a, NULL, 4 * KiB, 0);
	if (!o->ret) {
		run_ios(r, a);
		CHECK_EQ(cache_aio_end(a, &data, &n), 0);
		CHECK_EQ(n, 4 * KiB);
	}
	cache_aio_free(a);
	dev_aring_free(r);
	return NULL;
}

/* What the pipeline cannot take is refused before anything changes. */
static void test_refused(void)
{
	char *ref = malloc(256 * KiB), *data;
	struct other o;
	pthread_t t;
	struct cfile *f;
	size_t n;
	int fd;

	setup();
	fill(ref, 256 * KiB, 3);
	f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_write(e.c, f, ref, 128 * KiB, 0), 0);
	/* a block not cached */
	CHECK_EQ(cache_aio_begin(e.c, f, req, ref, 4096, 128 * KiB), -EAGAIN);
	/* writethrough writes the backing file: not here */
	e.cfg.mode = MODE_WRITETHROUGH;
	CHECK_EQ(cache_aio_begin(e.c, f, req, ref, 4096, 0), -EAGAIN);
	e.cfg.mode = MODE_WRITEBACK;
	CHECK_EQ(cache_aio_held(), 0);
	CHECK_EQ(cnt(&e, STAT_C_write_ops), 1);
	/* a write in flight holds its slot: another thread's read of it is
	 * refused, not left waiting */
	CHECK_EQ(cache_aio_begin(e.c, f, req, ref, 4096, 0), 0);
	o.e = &e;
	o.f = f;
	CHECK_EQ(pthread_create(&t, NULL, other_read, &o), 0);
	pthread_join(t, NULL);
	CHECK_EQ(o.ret, -EBUSY);
	run_ios(ring, req);
	CHECK_EQ(cache_aio_end(req, &data, &n), 0);
	CHECK_EQ(pthread_create(&t, NULL, other_read, &o), 0);
	pthread_join(t, NULL);
	CHECK_EQ(o.ret, 0);
	cache_file_put(e.c, f);
	close(fd);
	teardown();
	free(ref);
}

/* A device that fails under a read: the read is redone synchronously, which
 * takes clean pages from the backing file. */
static void test_read_device_fails(void)
{
	char *ref = malloc(128 * KiB), *data;
	struct cfile *f;
	size_t n;
	int fd;

	setup();
	fill(ref, 128 * KiB, 4);
	f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_write(e.c, f, ref, 128 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	dev_faults(e.devs[0])->fail_reads = -EIO;
	dev_faults(e.devs[1])->fail_reads = -EIO;
	CHECK_EQ(aio(f, NULL, 8 * KiB, 0, &data, &n), -EAGAIN);
	CHECK(same(&e, f, ref, 128 * KiB, 0));
	cache_file_put(e.c, f);
	close(fd);
	teardown();
	free(ref);
}

/* A device that fails under a write: the write goes to the backing file,
 * as on the synchronous path, and is read back. */
static void test_write_device_fails(void)
{
	char *ref = malloc(128 * KiB), *upd = malloc(8 * KiB), *data;
	struct cfile *f;
	size_t n;
	int fd;

	setup();
	fill(ref, 128 * KiB, 5);
	fill(upd, 8 * KiB, 6);
	f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_write(e.c, f, ref, 128 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	dev_faults(e.devs[0])->fail_writes = -EIO;
	dev_faults(e.devs[1])->fail_writes = -EIO;
	CHECK_EQ(aio(f, upd, 8 * KiB, 16 * KiB, &data, &n), 0);
	memcpy(ref + 16 * KiB, upd, 8 * KiB);
	CHECK(backing_same(fd, ref, 128 * KiB));
	CHECK(same(&e, f, ref, 128 * KiB, 0));
	cache_file_put(e.c, f);
	close(fd);
	teardown();
	free(ref);
	free(upd);
}

static int dev_state(struct env *e, int d)
{
	struct stat_snap *s = calloc(1, sizeof(*s));
	int v;

	cache_snapshot(e->c, s);
	v = STAT_DEV_GAUGE(s, d, failed);
	free(s);
	return v;
}

/*
 * A ring that refuses its submissions (issue 25, finding 16): the requests
 * still complete, done without the kernel, and no device is marked failed
 * for a refusal that was the ring's: the write is there, read back through
 * the ring, and fsync succeeds.
 */
static void test_ring_refuses(void)
{
	char *ref = malloc(128 * KiB), *upd = malloc(8 * KiB), *data;
	struct cfile *f;
	size_t n;
	int fd;

	setup();
	fill(ref, 128 * KiB, 20);
	fill(upd, 8 * KiB, 21);
	f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_write(e.c, f, ref, 128 * KiB, 0), 0);
	dev_aring_set_faults(ring, -ENOMEM, 1); /* every submission */
	CHECK_EQ(aio(f, upd, 8 * KiB, 16 * KiB, &data, &n), 0);
	memcpy(ref + 16 * KiB, upd, 8 * KiB);
	n = 0;
	CHECK_EQ(aio(f, NULL, 8 * KiB, 16 * KiB, &data, &n), 0);
	CHECK(n == 8 * KiB && !memcmp(data, upd, 8 * KiB));
	dev_aring_set_faults(ring, 0, 0);
	CHECK_EQ(dev_state(&e, 0), STAT_DEV_OK);
	CHECK_EQ(dev_state(&e, 1), STAT_DEV_OK);
	CHECK_EQ(cache_fsync(e.c, f), 0);
	CHECK(same(&e, f, ref, 128 * KiB, 0));
	cache_file_put(e.c, f);
	close(fd);
	teardown();
	free(ref);
	free(upd);
}

/* One write at off, by the pipeline (async) or the synchronous path. */
static int put(struct cfile *f, char *ref, const char *src, size_t len,
	       uint64_t off, int async)
{
	char *data;
	size_t n;
	int ret = async ? aio(f, src, len, off, &data, &n)
			: cache_write(e.c, f, src, len, off);

	if (!ret)
		memcpy(ref + off, src, len);
	return ret;
}

/*
 * Partial pages at sector edges are written in sectors, not read first:
 * with every device read failing, writes into dirty cached pages (whose old
 * bytes are on the devices only) still succeed, and keep the pages' other
 * bytes.  Edges off a sector still read the page.
 */
static void test_sector_writes(void)
{
	char *ref = malloc(256 * KiB), *upd = malloc(16 * KiB);
	struct dev_io *ios;
	struct cfile *f;
	char *data;
	size_t n;
	int fd, async;

	for (async = 0; async < 2; async++) {
		setup();
		fill(ref, 256 * KiB, 11);
		fill(upd, 16 * KiB, 12 + async);
		f = file_open(&e, "f", &fd);
		CHECK_EQ(cache_write(e.c, f, ref, 256 * KiB, 0), 0);
		dev_faults(e.devs[0])->fail_reads = -EIO;
		dev_faults(e.devs[1])->fail_reads = -EIO;
		/* inside one page; across two; from a sector to a page's end;
		 * across a block's end; two partial pages around whole ones */
		CHECK_EQ(put(f, ref, upd, 512, 4096 + 512, async), 0);
		CHECK_EQ(put(f, ref, upd + 512, 1024, 2 * 4096 - 512, async),
			 0);
		CHECK_EQ(put(f, ref, upd + 1536, 3584, 5 * 4096 + 512, async),
			 0);
		CHECK_EQ(put(f, ref, upd + 5120, 2048, 64 * KiB - 1024, async),
			 0);
		CHECK_EQ(put(f, ref, upd, 3 * 4096, 9 * 4096 + 1536, async), 0);
		/* the device writes start and end at the request's edges */
		CHECK_EQ(cache_aio_begin(e.c, f, req, upd, 512,
					 30 * 4096 + 1024),
			 0);
		CHECK_EQ(cache_aio_ios(req, &ios), 1);
		CHECK_EQ(ios[0].len, 512);
		CHECK_EQ(ios[0].off % 4096, 1024);
		run_ios(ring, req);
		CHECK_EQ(cache_aio_end(req, &data, &n), 0);
		memcpy(ref + 30 * 4096 + 1024, upd, 512);
		dev_faults(e.devs[0])->fail_reads = 0;
		dev_faults(e.devs[1])->fail_reads = 0;
		CHECK(same(&e, f, ref, 256 * KiB, 0));
		CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
		CHECK(backing_same(fd, ref, 256 * KiB));
		/* an edge off a sector reads its page (failing here) */
		CHECK_EQ(cache_write(e.c, f, upd, 4096, 0), 0);
		dev_faults(e.devs[0])->fail_reads = -EIO;
		dev_faults(e.devs[1])->fail_reads = -EIO;
		CHECK(put(f, ref, upd, 100, 10, async) != 0);
		cache_file_put(e.c, f);
		close(fd);
		teardown();
	}
	free(ref);
	free(upd);
}

static uint64_t flushes(struct env *e)
{
	struct stat_snap *s = calloc(1, sizeof(*s));
	uint64_t v = 0;
	int d;

	cache_snapshot(e->c, s);
	for (d = 0; d < s->ndevs; d++)
		v += STAT_DEV_LAT(s, d, flush).count;
	free(s);
	return v;
}

/*
 * A page kept after a read miss (its bytes maybe in a device's volatile
 * cache, not claimed by the persisted entry) is written in sectors only
 * once its entry claims it after a flush: the write's intent is persisted
 * first, with the flush that makes the kept bytes durable.
 */
static void test_sector_write_unclaimed(void)
{
	char *ref = malloc(128 * KiB), *upd = malloc(4096), *got;
	struct dev_io *ios;
	struct cfile *f;
	uint64_t fl;
	size_t n;
	int fd;

	setup();
	fill(ref, 128 * KiB, 16);
	fill(upd, 4096, 17);
	fd = openat(e.backing_fd, "f", O_RDWR | O_CREAT, 0644);
	CHECK_EQ(pwrite(fd, ref, 128 * KiB, 0), 128 * KiB);
	close(fd);
	f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_read(e.c, f, rbuf, 64 * KiB, 0, &got, &n), 0);
	fl = flushes(&e);
	CHECK_EQ(cache_aio_begin(e.c, f, req, upd, 512, 4096 + 512), 0);
	CHECK(flushes(&e) > fl);
	CHECK_EQ(cache_aio_ios(req, &ios), 1);
	CHECK_EQ(ios[0].len, 512);
	run_ios(ring, req);
	CHECK_EQ(cache_aio_end(req, &got, &n), 0);
	memcpy(ref + 4096 + 512, upd, 512);
	CHECK(same(&e, f, ref, 128 * KiB, 0));
	cache_file_put(e.c, f);
	close(fd);
	teardown();
	free(ref);
	free(upd);
}

/* A write in sectors whose device write fails goes to the backing file as
 * whole pages: their other bytes, dirty in the cache, are read then. */
static void test_sector_write_fails(void)
{
	static const uint64_t offs[2] = { 4096 + 1024, 7 * 4096 - 512 };
	static const size_t lens[2] = { 512, 5120 };
	char *ref = malloc(128 * KiB), *upd = malloc(8 * KiB);
	char *got = malloc(3 * 4096);
	struct cfile *f;
	int fd, k;

	for (k = 0; k < 4; k++) {
		uint64_t off = offs[k % 2], p0 = off / 4096 * 4096;
		uint64_t p1 = (off + lens[k % 2] + 4095) / 4096 * 4096;

		setup();
		fill(ref, 128 * KiB, 14);
		fill(upd, 8 * KiB, 15);
		f = file_open(&e, "f", &fd);
		CHECK_EQ(cache_write(e.c, f, ref, 128 * KiB, 0), 0);
		dev_faults(e.devs[0])->fail_writes = -EIO;
		dev_faults(e.devs[1])->fail_writes = -EIO;
		CHECK_EQ(put(f, ref, upd, lens[k % 2], off, k / 2), 0);
		/* the pages written, whole */
		CHECK_EQ(pread(fd, got, p1 - p0, p0), (ssize_t)(p1 - p0));
		CHECK(!memcmp(got, ref + p0, p1 - p0));
		dev_faults(e.devs[0])->fail_writes = 0;
		dev_faults(e.devs[1])->fail_writes = 0;
		CHECK(same(&e, f, ref, 128 * KiB, 0));
		cache_file_put(e.c, f);
		close(fd);
		teardown();
	}
	free(ref);
	free(upd);
	free(got);
}

struct overlap {
	struct cfile *f;
	int truncating, truncated;
	unsigned long rounds; /* the reader's, once the truncate began */
};

#define OVERLAP_ROUNDS 200000ul

/* Reads that always overlap: the next one begins before the last ends,
 * so that some read holds the file at every moment, until the truncate is
 * done or OVERLAP_ROUNDS rounds after it began. */
static void *overlapping_reads(void *arg)
{
	struct overlap *o = arg;
	struct cache_aio *a[2];
	struct dev_aring *r;
	unsigned long round = 0;
	int held[2] = { 0, 0 }, k = 0;
	char *data;
	size_t n;

	CHECK_EQ(dev_aring_new(16, &r), 0);
	CHECK_EQ(cache_aio_new(&a[0]), 0);
	CHECK_EQ(cache_aio_new(&a[1]), 0);
	while (!__atomic_load_n(&o->truncated, __ATOMIC_ACQUIRE) &&
	       o->rounds < OVERLAP_ROUNDS) {
		int ret = cache_aio_begin(e.c, o->f, a[k], NULL, 4 * KiB, 0);

		CHECK(ret == 0 || ret == -EBUSY);
		if (!ret) {
			run_ios(r, a[k]);
			held[k] = 1;
		}
		k = !k;
		if (held[k]) {
			CHECK_EQ(cache_aio_end(a[k], &data, &n), 0);
			held[k] = 0;
		}
		if (__atomic_load_n(&o->truncating, __ATOMIC_ACQUIRE))
			o->rounds++;
		round++;
		sched_yield();
	}
	for (k = 0; k < 2; k++) {
		if (held[k])
			CHECK_EQ(cache_aio_end(a[k], &data, &n), 0);
		cache_aio_free(a[k]);
	}
	dev_aring_free(r);
	return NULL;
}

static void *truncate_it(void *arg)
{
	struct overlap *o = arg;

	__atomic_store_n(&o->truncating, 1, __ATOMIC_RELEASE);
	CHECK_EQ(cache_truncate(e.c, o->f, 128 * KiB), 0);
	__atomic_store_n(&o->truncated, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Issue 25: f->rw preferred readers, and reads held it across their
 * asynchronous I/O, so a truncate waited as long as reads overlapped.  It
 * gets in now once it waits: the reads are refused meanwhile. */
static void test_truncate_not_starved(void)
{
	char *ref = malloc(256 * KiB);
	struct overlap o = { 0 };
	pthread_t rt, tt;
	struct stat st;
	int fd;

	setup();
	fill(ref, 256 * KiB, 9);
	o.f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_write(e.c, o.f, ref, 256 * KiB, 0), 0);
	CHECK_EQ(pthread_create(&rt, NULL, overlapping_reads, &o), 0);
	CHECK_EQ(pthread_create(&tt, NULL, truncate_it, &o), 0);
	pthread_join(rt, NULL);
	if (!o.truncated)
		fprintf(stderr,
			"truncate still waiting after %lu rounds of "
			"overlapping reads\n",
			o.rounds);
	CHECK(o.rounds < OVERLAP_ROUNDS);
	pthread_join(tt, NULL);
	CHECK(o.truncated);
	CHECK(!fstat(fd, &st) && st.st_size == 128 * KiB);
	cache_file_put(e.c, o.f);
	close(fd);
	teardown();
	free(ref);
}

struct spacewait {
	struct cfile *f;
	const char *src;
	int calls, done;
};

/* 32 MiB into a cache of 8: each 1 MiB write waits for destage to free
 * space, holding f->rw for reading. */
static void *fill_writer(void *arg)
{
	struct spacewait *w = arg;
	int i;

	for (i = 0; i < 32; i++) {
		CHECK_EQ(cache_write(e.c, w->f, w->src, MiB, (uint64_t)i * MiB),
			 0);
		__atomic_store_n(&w->calls, i + 1, __ATOMIC_RELEASE);
	}
	__atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Truncates as the writer goes on, each a chance to meet it waiting. */
static void *truncate_to_0(void *arg)
{
	struct spacewait *w = arg;
	int k;

	for (k = 0; k < 8; k++) {
		while (__atomic_load_n(&w->calls, __ATOMIC_ACQUIRE) <
		       10 + 2 * k)
			usleep(500);
		CHECK_EQ(cache_truncate(e.c, w->f, 0), 0);
	}
	return NULL;
}

/* The gate must not shut out destage: a truncate that waits behind a
 * write waiting for space, whose destage takes f->rw for reading too
 * (with a writer-preferring f->rw, the three waited for each other). */
static void test_truncate_behind_space_wait(void)
{
	char *src = malloc(MiB);
	struct spacewait w = { 0 };
	struct timespec ts;
	pthread_t wt, tt;
	int fd;

	setup();
	fill(src, MiB, 5);
	w.f = file_open(&e, "f", &fd);
	w.src = src;
	CHECK_EQ(pthread_create(&wt, NULL, fill_writer, &w), 0);
	CHECK_EQ(pthread_create(&tt, NULL, truncate_to_0, &w), 0);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 20;
	if (pthread_timedjoin_np(wt, NULL, &ts)) {
		fprintf(stderr, "the writer waits for space for ever\n");
		_exit(1);
	}
	if (pthread_timedjoin_np(tt, NULL, &ts)) {
		fprintf(stderr, "a truncate waits for ever\n");
		_exit(1);
	}
	CHECK(w.done);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	cache_file_put(e.c, w.f);
	close(fd);
	teardown();
	free(src);
}

int main(void)
{
	rbuf = dev_alloc_buf(2 * MiB);
	test_read();
	test_write();
	test_partial();
	test_read_device_fails();
	test_write_device_fails();
	test_sector_writes();
	test_sector_write_fails();
	test_sector_write_unclaimed();
	test_refused();
	test_ring_refuses();
	test_truncate_not_starved();
	test_truncate_behind_space_wait();
	if (!check_failures)
		printf("test_aio: ok\n");
	return CHECK_DONE();
}
