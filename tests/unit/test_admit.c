/* tests: the read admission policy — the stream detector, the sequential
 * cutoff and readahead (cache/core/admit.c), and the read path that obeys it. */
#define _GNU_SOURCE
#include "env.h"

#include "../../cache/core/admit.h"

#define TOL (2 * MiB)
#define CUT (4 * MiB)
#define GiB_TEST (1024ull * MiB)

static int note(struct admit_state *a, uint64_t off, uint64_t len,
		uint64_t window, struct admit_verdict *v)
{
	admit_note(a, off, len, TOL, CUT, window, v);
	return v->bypass;
}

static void test_sequential_stream_passes_cutoff(void)
{
	struct admit_state a;
	struct admit_verdict v;
	int i;

	memset(&a, 0, sizeof(a));
	/* bcache's rule: the stream, this read included, longer than 4M */
	for (i = 0; i < 4; i++) {
		CHECK_EQ(note(&a, i * MiB, MiB, 0, &v), 0);
		CHECK_EQ(v.seq, (i + 1) * MiB);
	}
	CHECK_EQ(note(&a, 4 * MiB, MiB, 0, &v), 1);
	CHECK_EQ(note(&a, 5 * MiB, 128 * KiB, 0, &v), 1);
	/* the same reads with the cutoff off: never */
	memset(&a, 0, sizeof(a));
	for (i = 0; i < 64; i++) {
		admit_note(&a, i * MiB, MiB, TOL, 0, 0, &v);
		CHECK_EQ(v.bypass, 0);
	}
	CHECK_EQ(v.seq, 64 * MiB);
}

static void test_random_and_rereads_are_not_streams(void)
{
	struct admit_state a;
	struct admit_verdict v;
	unsigned seed = 1, i, bypassed = 0;

	memset(&a, 0, sizeof(a));
	/* 4K reads at random in a 64 GiB file */
	for (i = 0; i < 100000; i++) {
		seed = seed * 1103515245 + 12345;
		bypassed += note(&a, (uint64_t)(seed >> 8) * 4096, 4096, 0, &v);
	}
	CHECK_EQ(bypassed, 0);
	/* one hot 64K block read again and again */
	memset(&a, 0, sizeof(a));
	for (i = 0; i < 10000; i++)
		bypassed += note(&a, 7 * MiB, 64 * KiB, 0, &v);
	CHECK_EQ(bypassed, 0);
	CHECK_EQ(v.seq, 64 * KiB);
	/* small reads back and forth inside one MiB */
	memset(&a, 0, sizeof(a));
	for (i = 0; i < 10000; i++)
		bypassed += note(&a, (i * 7919 % 256) * 4096, 4096, 0, &v);
	CHECK_EQ(bypassed, 0);
}

/* Issue 25: reads that land within tol of a stream without being
 * sequential: random 4K reads in a small file (most land near some stream),
 * strided reads; neither is a stream, however many there are. */
static void test_dense_random_and_strided_are_not_streams(void)
{
	struct admit_state a;
	struct admit_verdict v;
	unsigned seed = 3, i, bypassed = 0, owed = 0;
	uint64_t stride;

	memset(&a, 0, sizeof(a));
	/* 16 MiB of 4K reads at random in a 64 MiB file */
	for (i = 0; i < 4096; i++) {
		seed = seed * 1103515245 + 12345;
		bypassed += note(&a, (uint64_t)(seed >> 8) % 16384 * 4096, 4096,
				 8 * MiB, &v);
		owed += v.stream;
	}
	CHECK_EQ(bypassed, 0);
	CHECK_EQ(owed, 0);
	/* 4K every 8K, 64K, 1M: 64 MiB each */
	for (stride = 8 * KiB; stride <= MiB; stride *= 8) {
		memset(&a, 0, sizeof(a));
		for (i = 0; i < 64 * MiB / stride; i++)
			bypassed += note(&a, i * stride, 4096, 0, &v);
		CHECK_EQ(bypassed, 0);
	}
	/* 60K of every 64K is a stream (its readahead reads 1/16 more) */
	memset(&a, 0, sizeof(a));
	for (i = 0; i < 128; i++)
		bypassed += note(&a, i * 64 * KiB, 60 * KiB, 0, &v);
	CHECK(bypassed > 0);
	/* a stream knows where the next one ahead of it began */
	memset(&a, 0, sizeof(a));
	note(&a, 8 * MiB, MiB, 0, &v);
	note(&a, 0, MiB, 0, &v);
	CHECK_EQ(v.ahead, 8 * MiB);
	CHECK(v.sid != 0);
	note(&a, 9 * MiB, MiB, 0, &v);
	CHECK_EQ(v.ahead, UINT64_MAX);
}

static void test_streams_interleaved_and_out_of_order(void)
{
	struct admit_state a;
	struct admit_verdict v;
	uint64_t base[3] = { 0, 100 * MiB, 900 * MiB };
	int i, k, by[3] = { 0 };

	/* three readers of one file, their requests interleaved */
	memset(&a, 0, sizeof(a));
	for (i = 0; i < 8; i++)
		for (k = 0; k < 3; k++)
			by[k] += note(&a, base[k] + i * MiB, MiB, 0, &v);
	for (k = 0; k < 3; k++)
		CHECK_EQ(by[k], 4); /* reads 5..8 of each */
	/* the kernel's readahead answered out of order by FUSE threads */
	memset(&a, 0, sizeof(a));
	{
		int order[] = { 0, 2, 1, 3, 5, 4, 7, 6, 8, 9 };

		for (i = 0; i < 10; i++)
			note(&a, order[i] * MiB, MiB, 0, &v);
		CHECK_EQ(v.seq, 10 * MiB);
		CHECK_EQ(v.bypass, 1);
	}
	/* more streams than entries: the least recently used one goes */
	memset(&a, 0, sizeof(a));
	for (k = 0; k <= ADMIT_STREAMS; k++)
		note(&a, k * GiB_TEST, MiB, 0, &v);
	note(&a, ADMIT_STREAMS * GiB_TEST + MiB, MiB, 0, &v);
	CHECK_EQ(v.seq, 2 * MiB); /* the newest continues */
	note(&a, MiB, MiB, 0, &v);
	CHECK_EQ(v.seq, MiB); /* the oldest was forgotten */
}

static void test_readahead_window(void)
{
	struct admit_state a;
	struct admit_verdict v;
	uint64_t asked = 0, i;

	memset(&a, 0, sizeof(a));
	note(&a, 0, 256 * KiB, 8 * MiB, &v);
	CHECK_EQ(v.ra_len, 0); /* not a stream yet */
	CHECK_EQ(v.stream, 0);
	note(&a, 256 * KiB, 256 * KiB, 8 * MiB, &v);
	CHECK_EQ(v.stream, 1);
	CHECK_EQ(v.ra_off, 512 * KiB);
	CHECK_EQ(v.ra_len, 8 * MiB);
	asked = v.ra_off + v.ra_len;
	/* asked again only once half the window is used, from where the last
	 * one ended, and never twice for the same bytes */
	for (i = 2; i < 200; i++) {
		note(&a, i * 256 * KiB, 256 * KiB, 8 * MiB, &v);
		if (!v.ra_len)
			continue;
		CHECK_EQ(v.ra_off, asked);
		CHECK(v.ra_off < (i + 1) * 256 * KiB + 4 * MiB + 1);
		CHECK_EQ(v.ra_off + v.ra_len, (i + 1) * 256 * KiB + 8 * MiB);
		asked = v.ra_off + v.ra_len;
	}
	CHECK(asked >= 200 * 256 * KiB + 4 * MiB);
	/* random reads are owed none */
	memset(&a, 0, sizeof(a));
	for (i = 0; i < 100; i++) {
		note(&a, i * 64 * MiB, 64 * KiB, 8 * MiB, &v);
		CHECK_EQ(v.ra_len, 0);
		CHECK_EQ(v.stream, 0);
	}
}

/* A file of size bytes in the backing directory, its bytes in *ref. */
static struct cfile *backing_file(struct env *e, const char *name, size_t size,
				  char **ref, int *fd)
{
	int wfd = openat(e->backing_fd, name, O_RDWR | O_CREAT, 0644);

	*ref = malloc(size);
	fill(*ref, size, 77);
	CHECK_EQ(pwrite(wfd, *ref, size, 0), (ssize_t)size);
	close(wfd);
	return file_open(e, name, fd);
}

static void read_seq(struct env *e, struct cfile *f, const char *ref,
		     size_t size, size_t bs)
{
	uint64_t off;

	for (off = 0; off < size; off += bs)
		CHECK(same(e, f, ref + off, bs, off));
}

static void test_read_path_bypasses_past_cutoff(void)
{
	struct env e;
	struct stat_snap *s = &snap;
	size_t size = 16 * MiB;
	struct cfile *f;
	char *ref;
	int fd;

	env_init(&e, 256, 64 * KiB); /* 32 MiB: room for all of it */
	CHECK_EQ(e.cfg.sequential_cutoff, CUT); /* the default */
	f = backing_file(&e, "big", size, &ref, &fd);
	read_seq(&e, f, ref, size, MiB);
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, fill_bytes), CUT);
	CHECK_EQ(STAT_CTR(s, read_bypass_bytes), size - CUT);
	CHECK_EQ(STAT_CTR(s, bypass_ops), 12);
	CHECK_EQ(STAT_CTR(s, read_miss_bytes), size);
	/* again: the head is cached now, the rest is read around again */
	read_seq(&e, f, ref, size, MiB);
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, read_hit_bytes), CUT);
	CHECK_EQ(STAT_CTR(s, fill_bytes), CUT);
	CHECK_EQ(STAT_CTR(s, read_bypass_bytes), 2 * (size - CUT));
	/* random reads of the tail are kept */
	CHECK(same(&e, f, ref + 13 * MiB, 64 * KiB, 13 * MiB));
	CHECK(same(&e, f, ref + 9 * MiB, 64 * KiB, 9 * MiB));
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, fill_bytes), CUT + 128 * KiB);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
}

static void test_cutoff_off_keeps_every_miss(void)
{
	struct env e;
	struct stat_snap *s = &snap;
	size_t size = 16 * MiB;
	struct cfile *f;
	char *ref;
	int fd;

	env_init(&e, 256, 64 * KiB);
	e.cfg.sequential_cutoff = 0;
	f = backing_file(&e, "big", size, &ref, &fd);
	read_seq(&e, f, ref, size, MiB);
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, fill_bytes), size);
	CHECK_EQ(STAT_CTR(s, read_bypass_bytes), 0);
	CHECK_EQ(STAT_CTR(s, bypass_ops), 0);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
}

/* Dirty data inside a bypassed stream comes from the cache: the backing file
 * does not have it yet. */
static void test_dirty_data_in_a_stream(void)
{
	struct env e;
	struct stat_snap *s = &snap;
	size_t size = 16 * MiB;
	char *ref, *w = malloc(300 * KiB), *old = malloc(300 * KiB);
	uint64_t at[] = { 6 * MiB + 5, 11 * MiB - 4096, 15 * MiB + 100 };
	struct cfile *f;
	int fd, i;

	env_init(&e, 256, 64 * KiB);
	f = backing_file(&e, "big", size, &ref, &fd);
	for (i = 0; i < 3; i++) {
		fill(w, 300 * KiB, 100 + i);
		CHECK_EQ(cache_write(e.c, f, w, i == 2 ? 7 : 300 * KiB, at[i]),
			 0);
		memcpy(ref + at[i], w, i == 2 ? 7 : 300 * KiB);
	}
	/* not destaged: the backing file still has the old bytes */
	CHECK_EQ(pread(fd, old, 300 * KiB, at[0]), 300 * KiB);
	CHECK(memcmp(old, ref + at[0], 300 * KiB) != 0);
	/* in 1M reads, and in 128K reads (the kernel's readahead size) */
	read_seq(&e, f, ref, size, MiB);
	read_seq(&e, f, ref, size, 128 * KiB);
	cache_snapshot(e.c, s);
	CHECK(STAT_CTR(s, read_bypass_bytes) > 0);
	CHECK(STAT_CTR(s, read_partial_ops) > 0);
	CHECK_EQ(STAT_GAUGE(s, dirty_bytes), (76 + 75 + 1) * 4096);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
	free(w);
	free(old);
}

/*
 * The hint an open reads (CACHE_OUT_STREAMED): set by a stream's misses past
 * the cutoff, cleared by an admitted read, left by a stream that only hits
 * (a warmed file); and the drop that hands a streamed file to passthrough,
 * refused with dirty data or once the hint is gone.
 */
static void test_streamed_hint_and_drop(void)
{
	struct env e;
	struct stat_snap *s = &snap;
	size_t size = 16 * MiB;
	struct cfile *f;
	char *ref, w[4096];
	int fd;

	env_init(&e, 256, 64 * KiB);
	f = backing_file(&e, "big", size, &ref, &fd);
	CHECK(!(cache_file_outside(e.c, f) & CACHE_OUT_STREAMED));
	read_seq(&e, f, ref, size, MiB);
	CHECK(cache_file_outside(e.c, f) & CACHE_OUT_STREAMED);
	CHECK(!(cache_file_outside(e.c, f) & CACHE_OUT_EMPTY)); /* its head */
	/* an admitted read clears it, and a drop is refused then */
	CHECK(same(&e, f, ref + 9 * MiB, 64 * KiB, 9 * MiB));
	CHECK(!(cache_file_outside(e.c, f) & CACHE_OUT_STREAMED));
	CHECK_EQ(cache_file_drop_streamed(e.c, f), -EBUSY);
	/* streamed again, but dirty: nothing dropped */
	read_seq(&e, f, ref, size, MiB);
	fill(w, sizeof(w), 9);
	CHECK_EQ(cache_write(e.c, f, w, sizeof(w), 3 * MiB), 0);
	memcpy(ref + 3 * MiB, w, sizeof(w));
	CHECK(cache_file_outside(e.c, f) & CACHE_OUT_STREAMED);
	CHECK_EQ(cache_file_drop_streamed(e.c, f), -EBUSY);
	CHECK(same(&e, f, ref, size, 0));
	/* destaged: the drop leaves nothing, and the bytes are the store's */
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	read_seq(&e, f, ref, size, MiB);
	CHECK_EQ(cache_file_drop_streamed(e.c, f), 0);
	CHECK(cache_file_outside(e.c, f) & CACHE_OUT_EMPTY);
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, stream_drops), 1);
	CHECK(same(&e, f, ref, size, 0));
	/* warmed, then read as a stream that only hits: not a stream */
	{
		uint64_t done;

		CHECK_EQ(cache_file_warm(e.c, f, size, NULL, NULL, NULL, &done),
			 0);
	}
	CHECK(!(cache_file_outside(e.c, f) & CACHE_OUT_STREAMED));
	read_seq(&e, f, ref, size, MiB);
	CHECK(!(cache_file_outside(e.c, f) & CACHE_OUT_STREAMED));
	CHECK_EQ(cache_file_drop_streamed(e.c, f), -EBUSY);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
}

/* A drop tried while a warm runs (an open's, between its check and the
 * warm's hold): refused, the warm marked the file before its first read. */
struct warm_race {
	struct cache *c;
	struct cfile *f;
	int tried, ret;
};

static void drop_during_warm(void *arg, uint64_t done, uint64_t unused)
{
	struct warm_race *w = arg;

	(void)done;
	(void)unused;
	if (w->tried++)
		return;
	w->ret = cache_file_drop_streamed(w->c, w->f);
}

/* Warmed, wholly or in part, or pinned: a later stream that misses never
 * makes it one to give up; nor a drop during the warm. */
static void test_kept_files_are_never_dropped(void)
{
	struct env e;
	size_t size = 16 * MiB;
	struct cache_room room;
	struct cfile *f, *g;
	uint64_t done;
	char *ref, *ref2;
	int fd, fd2;
	struct warm_race w = { 0 };

	env_init(&e, 256, 64 * KiB);
	f = backing_file(&e, "big", size, &ref, &fd);
	read_seq(&e, f, ref, size, MiB); /* streamed: the hint is set */
	CHECK(cache_file_outside(e.c, f) & CACHE_OUT_STREAMED);
	w.c = e.c;
	w.f = f;
	CHECK_EQ(cache_file_warm(e.c, f, size / 2, drop_during_warm, NULL, &w,
				 &done),
		 0);
	CHECK(w.tried && w.ret == -EBUSY);
	CHECK(cache_file_outside(e.c, f) & CACHE_OUT_KEPT);
	/* half warmed, then a stream that misses past the half */
	read_seq(&e, f, ref, size, MiB);
	CHECK_EQ(cache_file_drop_streamed(e.c, f), -EBUSY);
	CHECK(same(&e, f, ref, size, 0));
	cache_file_put(e.c, f);
	close(fd);
	/* pinned */
	g = backing_file(&e, "other", size, &ref2, &fd2);
	CHECK_EQ(cache_file_pin(e.c, g, 1, &room), 0);
	read_seq(&e, g, ref2, size, MiB);
	CHECK(cache_file_outside(e.c, g) & CACHE_OUT_KEPT);
	CHECK_EQ(cache_file_drop_streamed(e.c, g), -EBUSY);
	CHECK_EQ(cache_file_pin(e.c, g, 0, &room), 0);
	cache_file_put(e.c, g);
	close(fd2);
	env_fini(&e);
	free(ref);
	free(ref2);
}

/* Fills after the reply: kept only by cache_read_finish, and never over a
 * write that came between the read and the fill. */
static void test_fill_after_reply(void)
{
	struct env e;
	struct stat_snap *s = &snap;
	size_t size = 2 * MiB;
	char *ref, *data, w[8192];
	struct cfile *f;
	size_t n;
	int fd;

	env_init(&e, 256, 64 * KiB);
	CHECK_EQ(e.cfg.async_fill, 0); /* the default */
	e.cfg.async_fill = 1;
	f = backing_file(&e, "f", size, &ref, &fd);
	CHECK_EQ(cache_read_defer(e.c, f, rbuf, 256 * KiB, 0, &data, &n, 1), 0);
	CHECK(n == 256 * KiB && !memcmp(data, ref, n));
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, fill_bytes), 0); /* not yet */
	cache_read_finish(e.c);
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, fill_bytes), 256 * KiB);
	CHECK(same(&e, f, ref, 256 * KiB, 0));
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, read_hit_bytes), 256 * KiB);

	/* a write between the read and its fill: the fill keeps nothing */
	CHECK_EQ(cache_read_defer(e.c, f, rbuf, 128 * KiB, MiB, &data, &n, 1),
		 0);
	fill(w, sizeof(w), 5);
	CHECK_EQ(cache_write(e.c, f, w, sizeof(w), MiB + 64 * KiB), 0);
	memcpy(ref + MiB + 64 * KiB, w, sizeof(w));
	cache_read_finish(e.c);
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, fill_bytes), 256 * KiB);
	CHECK(same(&e, f, ref + MiB, 128 * KiB, MiB));
	CHECK(same(&e, f, ref, size, 0));

	/* the file's last reference goes before the fill: the fill keeps it */
	CHECK_EQ(cache_read_defer(e.c, f, rbuf, 64 * KiB, 1536 * KiB, &data,
				  &n, 1),
		 0);
	cache_file_put(e.c, f);
	cache_read_finish(e.c);
	close(fd);
	f = file_open(&e, "f", &fd);
	CHECK(same(&e, f, ref, size, 0));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_sequential_stream_passes_cutoff);
	RUN(test_random_and_rereads_are_not_streams);
	RUN(test_dense_random_and_strided_are_not_streams);
	RUN(test_streams_interleaved_and_out_of_order);
	RUN(test_readahead_window);
	RUN(test_read_path_bypasses_past_cutoff);
	RUN(test_cutoff_off_keeps_every_miss);
	RUN(test_dirty_data_in_a_stream);
	RUN(test_streamed_hint_and_drop);
	RUN(test_kept_files_are_never_dropped);
	RUN(test_fill_after_reply);
	free(rbuf);
	return CHECK_DONE();
}
