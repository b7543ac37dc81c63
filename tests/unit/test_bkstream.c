/* tests: direct reads of the backing store with readahead for streams past
 * the sequential cutoff (cache/files/bkstream.c): they read ahead, and what they
 * read ahead is never served after the file changed. */
#define _GNU_SOURCE
#include "env.h"

#include <time.h>

#include "../../cache/mngt/mngt.h"

#define SIZE (24 * MiB)

static unsigned pinned; /* reads answered from a segment, no copy */

/* Read [from, upto) of f sequentially in 1 MiB reads as the server does
 * (the reply, then cache_read_finish), comparing with ref. */
static void stream_to(struct env *e, struct cfile *f, const char *ref,
		      uint64_t from, uint64_t upto)
{
	uint64_t off;
	char *data;
	size_t n;

	for (off = from; off < upto; off += MiB) {
		CHECK_EQ(
			cache_read_defer(e->c, f, rbuf, MiB, off, &data, &n, 1),
			0);
		CHECK_EQ(n, MiB);
		CHECK(!memcmp(data, ref + off, MiB));
		pinned += data < rbuf || data >= rbuf + 2 * MiB;
		cache_read_finish(e->c);
	}
}

/* Wait until the backing store has been read up to want bytes in all. */
static int read_ahead_to(struct env *e, uint64_t want)
{
	int i;

	for (i = 0; i < 2000; i++) {
		cache_snapshot(e->c, &snap);
		if (STAT_CTR(&snap, backing_read_bytes) >= want)
			return 1;
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	return 0;
}

static struct cfile *make_file(struct env *e, const char *name, char **ref,
			       int *fd)
{
	int wfd = openat(e->backing_fd, name, O_RDWR | O_CREAT, 0644);

	*ref = malloc(SIZE);
	fill(*ref, SIZE, 5);
	CHECK_EQ(pwrite(wfd, *ref, SIZE, 0), (ssize_t)SIZE);
	close(wfd);
	return file_open(e, name, fd);
}

/* A stream past the cutoff reads directly, and ahead of itself. */
static void test_stream_reads_ahead(void)
{
	struct env e;
	struct cfile *f;
	char *ref;
	int fd;

	env_init(&e, 512, 64 * KiB);
	CHECK_EQ(e.cfg.backing_direct_ra, 8 * MiB); /* the default */
	f = make_file(&e, "s", &ref, &fd);
	stream_to(&e, f, ref, 0, 6 * MiB);
	CHECK(f->bks != NULL);
	/* 6 MiB read, and the segment after it read ahead: the window is half
	 * of what the stream read (3 MiB: one whole segment) */
	CHECK(read_ahead_to(&e, 8 * MiB));
	pinned = 0;
	stream_to(&e, f, ref, 6 * MiB, SIZE);
	CHECK(pinned > 0); /* answered from what was read ahead */
	cache_snapshot(e.c, &snap);
	CHECK_EQ(STAT_CTR(&snap, read_bypass_bytes), SIZE - 4 * MiB);
	/* never past the file's end, nothing twice: the first segment read
	 * ahead starts where the stream's first direct read ended */
	CHECK_EQ(STAT_CTR(&snap, backing_read_bytes), SIZE);
	CHECK_EQ(STAT_CTR(&snap, fill_bytes), 4 * MiB);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
}

/*
 * A change to the file between a segment's read and its use: the read sees
 * the change.  how: 0 a write through the mount (writeback: the page is
 * dirty in the cache), 1 in writearound mode (the backing file takes it, the
 * cache keeps nothing), 2 a truncate down and up again (zeros), 3 a change
 * behind the cache, then an open (revalidation).
 */
static void change_read_ahead(int how)
{
	char *ref, *w = malloc(300 * KiB);
	uint64_t at = 6 * MiB + 8192;
	struct env e;
	struct cfile *f;
	int fd, changed;

	env_init(&e, 512, 64 * KiB);
	if (how == 1)
		e.cfg.mode = MODE_WRITEAROUND;
	f = make_file(&e, "c", &ref, &fd);
	stream_to(&e, f, ref, 0, 6 * MiB);
	CHECK(read_ahead_to(&e, 8 * MiB)); /* [6M, 8M) read ahead */
	fill(w, 300 * KiB, 40 + how);
	switch (how) {
	case 0:
	case 1:
		CHECK_EQ(cache_write(e.c, f, w, 300 * KiB, at), 0);
		memcpy(ref + at, w, 300 * KiB);
		break;
	case 2:
		CHECK_EQ(cache_truncate(e.c, f, at), 0);
		CHECK_EQ(cache_truncate(e.c, f, SIZE), 0);
		memset(ref + at, 0, SIZE - at);
		break;
	case 3:
		/* another node rewrites it, with a later mtime */
		nanosleep(&(struct timespec){ 0, 20000000 }, NULL);
		CHECK_EQ(pwrite(fd, w, 300 * KiB, at), 300 * KiB);
		memcpy(ref + at, w, 300 * KiB);
		CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
		break;
	}
	stream_to(&e, f, ref, 6 * MiB, SIZE);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
	free(w);
}

static void test_write_after_read_ahead(void)
{
	change_read_ahead(0);
}

static void test_writearound_after_read_ahead(void)
{
	change_read_ahead(1);
}

static void test_truncate_after_read_ahead(void)
{
	change_read_ahead(2);
}

static void test_change_behind_then_open(void)
{
	change_read_ahead(3);
}

/*
 * Data written before the read ahead (dirty in the cache, old in the backing
 * file, which the read ahead reads), destaged after it, then evicted: the
 * read finds the page not cached and must not take the read-ahead copy.
 */
static void test_destage_and_evict_after_read_ahead(void)
{
	char *ref, *other, *w = malloc(64 * KiB);
	uint64_t at = 6 * MiB + 64 * KiB, off;
	struct env e;
	struct cfile *f, *g;
	int fd, gfd, i;

	env_init(&e, 64, 64 * KiB); /* 8 MiB */
	f = make_file(&e, "e", &ref, &fd);
	fill(w, 64 * KiB, 123);
	CHECK_EQ(cache_write(e.c, f, w, 64 * KiB, at), 0);
	memcpy(ref + at, w, 64 * KiB);
	stream_to(&e, f, ref, 0, 6 * MiB);
	CHECK(read_ahead_to(&e, 8 * MiB)); /* the old bytes at 6M + 64K */
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	/* random reads of another file take every clean slot */
	g = make_file(&e, "other", &other, &gfd);
	for (i = 0; i < 256; i++) {
		off = (i * 37 % 256) * 64 * KiB;
		CHECK(same(&e, g, other + off, 64 * KiB, off));
	}
	cache_snapshot(e.c, &snap);
	CHECK(STAT_CTR(&snap, evictions) > 0);
	stream_to(&e, f, ref, 6 * MiB, SIZE);
	cache_file_put(e.c, g);
	cache_file_put(e.c, f);
	close(gfd);
	close(fd);
	env_fini(&e);
	free(ref);
	free(other);
	free(w);
}

/*
 * What the readahead reads and no one asked for is bounded (issue 25): four
 * streams of one file taking turns read the backing store once (each read
 * of one used to drop what the others had read ahead), and random reads
 * that bypass (a cutoff of 4 KiB) read nothing ahead.
 */
static void test_readahead_reads_what_is_asked(void)
{
	struct env e;
	struct cfile *f;
	char *ref, *data;
	uint64_t i, off, asked = 0;
	unsigned seed = 9;
	int fd, k;
	size_t n;

	env_init(&e, 512, 64 * KiB);
	f = make_file(&e, "il", &ref, &fd);
	for (i = 0; i < SIZE / 4; i += 64 * KiB)
		for (k = 0; k < 4; k++) {
			off = k * (SIZE / 4) + i;
			CHECK_EQ(cache_read_defer(e.c, f, rbuf, 64 * KiB, off,
						  &data, &n, 1),
				 0);
			CHECK(n == 64 * KiB && !memcmp(data, ref + off, n));
			cache_read_finish(e.c);
		}
	cache_snapshot(e.c, &snap);
	CHECK(STAT_CTR(&snap, read_bypass_bytes) > 0);
	CHECK_EQ(STAT_CTR(&snap, backing_read_bytes), SIZE);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);

	env_init(&e, 512, 64 * KiB);
	e.cfg.sequential_cutoff = 4 * KiB;
	f = make_file(&e, "rnd", &ref, &fd);
	for (i = 0; i < 512; i++) {
		seed = seed * 1103515245 + 12345;
		off = (seed >> 8) % (SIZE / (8 * KiB)) * 8 * KiB;
		CHECK(same(&e, f, ref + off, 8 * KiB, off));
		asked += 8 * KiB;
	}
	cache_snapshot(e.c, &snap);
	CHECK(STAT_CTR(&snap, read_bypass_bytes) > 0);
	CHECK(STAT_CTR(&snap, backing_read_bytes) <= asked + asked / 2);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
}

/* A store that returns short reads (a network or FUSE store does): the
 * read is made as asked (O_DIRECT takes aligned lengths only), then cut to
 * 300 KiB + 100 bytes at most, so that it stops inside a page, and every
 * third one to a byte; the bytes past the cut are garbage. */
static ssize_t short_pread(int fd, void *buf, size_t len, uint64_t off)
{
	static unsigned calls;
	ssize_t n = pread(fd, buf, len, off), cut = 300 * KiB + 100;

	if (++calls % 3 == 0)
		cut = 1;
	if (n > cut) {
		memset((char *)buf + cut, 0xee, n - cut);
		n = cut;
	}
	return n;
}

/* Short direct reads in the middle of the file are not its end (issue 25):
 * the stream returns the file's bytes, not zeros, and a short file's end
 * inside a page still ends in zeros. */
static void test_short_reads_are_not_the_end(void)
{
	struct env e;
	struct cfile *f;
	char *ref;
	int fd, wfd;
	uint64_t off;
	char *data;
	size_t n, tail = 5 * MiB + 1234;

	env_init(&e, 512, 64 * KiB);
	e.c->test_pread = short_pread;
	f = make_file(&e, "short", &ref, &fd);
	stream_to(&e, f, ref, 0, SIZE);
	cache_snapshot(e.c, &snap);
	CHECK(STAT_CTR(&snap, read_bypass_bytes) > 0);
	cache_file_put(e.c, f);
	close(fd);
	/* a file that ends inside a page, read past the cutoff to its end */
	wfd = openat(e.backing_fd, "tail", O_RDWR | O_CREAT, 0644);
	CHECK_EQ(pwrite(wfd, ref, tail, 0), (ssize_t)tail);
	close(wfd);
	f = file_open(&e, "tail", &fd);
	for (off = 0; off < tail; off += MiB) {
		size_t want = tail - off < MiB ? tail - off : MiB;

		CHECK_EQ(cache_read_defer(e.c, f, rbuf, MiB, off, &data, &n, 1),
			 0);
		CHECK_EQ(n, want);
		CHECK(!memcmp(data, ref + off, want));
		cache_read_finish(e.c);
	}
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_stream_reads_ahead);
	RUN(test_write_after_read_ahead);
	RUN(test_writearound_after_read_ahead);
	RUN(test_truncate_after_read_ahead);
	RUN(test_change_behind_then_open);
	RUN(test_destage_and_evict_after_read_ahead);
	RUN(test_readahead_reads_what_is_asked);
	RUN(test_short_reads_are_not_the_end);
	free(rbuf);
	return CHECK_DONE();
}
