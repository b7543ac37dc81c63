/* tests: the cache engine on in-memory devices — map, hits and misses,
 * eviction, destage, recovery. */
#define _GNU_SOURCE
#include "env.h"

#include <sys/xattr.h>

static void test_write_read_unaligned(void)
{
	struct env e;
	struct stat_snap *s = &snap;
	size_t size = 3 * MiB;
	char *ref = calloc(1, size), *src = malloc(300 * KiB);
	uint64_t offs[] = { 0,	   1,	  4095,	       4096,
			    65535, 70000, 1 * MiB - 3, 2 * MiB + 12345 };
	size_t lens[] = { 1, 7, 4096, 5000, 65536, 131072 + 9, 300 * KiB, 12 };
	struct cfile *f;
	int fd, i;

	env_init(&e, 64, 64 * KiB);
	f = file_open(&e, "a", &fd);
	for (i = 0; i < 8; i++) {
		fill(src, lens[i], i + 1);
		CHECK_EQ(cache_write(e.c, f, src, lens[i], offs[i]), 0);
		memcpy(ref + offs[i], src, lens[i]);
	}
	CHECK(same(&e, f, ref, 2 * MiB + 12345 + 12, 0));
	cache_snapshot(e.c, s);
	CHECK(STAT_CTR(s, read_hit_bytes) > 0);
	CHECK_EQ(STAT_CTR(s, read_miss_ops), 0);
	CHECK(STAT_GAUGE(s, dirty_slots) > 0);
	CHECK_EQ(STAT_CTR(s, destaged_bytes), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(backing_same(fd, ref, 2 * MiB + 12345 + 12));
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_GAUGE(s, dirty_slots), 0);
	CHECK_EQ(STAT_GAUGE(s, dirty_bytes), 0);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
	free(src);
}

/*
 * A write of whole pages from an aligned buffer goes to the devices straight
 * from it (no copy): what is read back, also after a crash, is what the
 * buffer held when the write returned, not what the caller put there later;
 * with one copy and two.  Unaligned and partial writes (copied) around it.
 */
static void write_in_place(unsigned copies)
{
	struct env e;
	size_t size = 2 * MiB;
	char *ref = calloc(1, size), *src = dev_alloc_buf(MiB + 8192);
	struct cfile *f;
	int fd;

	dirty_copies = copies;
	env_init(&e, 64, 64 * KiB);
	f = file_open(&e, "a", &fd);
	fill(src, MiB, 1); /* whole pages, aligned: in place */
	CHECK_EQ(cache_write(e.c, f, src, MiB, 0), 0);
	memcpy(ref, src, MiB);
	fill(src, MiB, 2); /* the caller's buffer changes afterwards */
	fill(src + 1, 64 * KiB, 3); /* unaligned: copied */
	CHECK_EQ(cache_write(e.c, f, src + 1, 64 * KiB, MiB), 0);
	memcpy(ref + MiB, src + 1, 64 * KiB);
	fill(src, 8192 + 100, 4); /* aligned, a partial page: copied */
	CHECK_EQ(cache_write(e.c, f, src, 8192 + 100, MiB + 64 * KiB), 0);
	memcpy(ref + MiB + 64 * KiB, src, 8192 + 100);
	fill(src, 100, 6); /* aligned, inside a page: merged, copied */
	CHECK_EQ(cache_write(e.c, f, src, 100, 4096 + 50), 0);
	memcpy(ref + 4096 + 50, src, 100);
	fill(src, MiB + 8192, 5);
	CHECK(same(&e, f, ref, MiB + 64 * KiB + 8192 + 100, 0));
	cache_file_put(e.c, f);
	cache_abandon(e.c); /* kill -9: acknowledged writes stay */
	e.c = NULL;
	close(fd);
	env_open(&e);
	f = file_open(&e, "a", &fd);
	CHECK(same(&e, f, ref, MiB + 64 * KiB + 8192 + 100, 0));
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(backing_same(fd, ref, MiB + 64 * KiB + 8192 + 100));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	dirty_copies = 1;
	free(ref);
	free(src);
}

static void test_write_in_place(void)
{
	write_in_place(1);
	write_in_place(2);
}

static void test_miss_then_hit(void)
{
	struct env e;
	struct stat_snap *s = &snap;
	char *src = malloc(MiB);
	struct cfile *f;
	int fd;

	env_init(&e, 64, 64 * KiB);
	fd = openat(e.backing_fd, "b", O_RDWR | O_CREAT, 0644);
	fill(src, MiB, 9);
	CHECK_EQ(pwrite(fd, src, MiB, 0), MiB);
	close(fd);
	f = file_open(&e, "b", &fd);
	CHECK(same(&e, f, src, MiB, 0));
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, read_miss_ops), 1);
	CHECK_EQ(STAT_CTR(s, read_hit_ops), 0);
	CHECK_EQ(STAT_CTR(s, fill_bytes), MiB);
	CHECK(same(&e, f, src, MiB, 0));
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, read_hit_ops), 1);
	CHECK_EQ(STAT_CTR(s, read_hit_bytes), MiB);
	CHECK_EQ(STAT_CTR(s, read_miss_bytes), MiB);
	/* a partial write into a cached clean page keeps the rest of it */
	CHECK_EQ(cache_write(e.c, f, "XY", 2, 10), 0);
	memcpy(src + 10, "XY", 2);
	CHECK(same(&e, f, src, 8192, 0));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(src);
}

/* Eight slots: reading a block makes it the last one evicted. */
static void test_lru_eviction(void)
{
	struct env e;
	struct stat_snap *s = &snap;
	char *src = malloc(8 * 64 * KiB), *other = malloc(64 * KiB);
	struct cfile *a, *b;
	int fa, fb;
	uint64_t hits;

	env_init(&e, 4, 64 * KiB);
	a = file_open(&e, "a", &fa);
	b = file_open(&e, "b", &fb);
	fill(src, 8 * 64 * KiB, 3);
	CHECK_EQ(cache_write(e.c, a, src, 8 * 64 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL),
		 0); /* all clean, LRU = blocks 0..7 */
	CHECK(same(&e, a, src, 64 * KiB, 0)); /* block 0 becomes most recent */
	fill(other, 64 * KiB, 4);
	CHECK_EQ(cache_write(e.c, b, other, 64 * KiB, 0),
		 0); /* evicts block 1 */
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, evictions), 1);
	hits = STAT_CTR(s, read_hit_ops);
	CHECK(same(&e, a, src, 64 * KiB, 0));
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, read_hit_ops), hits + 1);
	CHECK(same(&e, a, src + 64 * KiB, 64 * KiB, 64 * KiB));
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_CTR(s, read_miss_ops), 1);
	CHECK(same(&e, b, other, 64 * KiB, 0));
	cache_file_put(e.c, a);
	cache_file_put(e.c, b);
	close(fa);
	close(fb);
	env_fini(&e);
	free(src);
	free(other);
}

/* Far more data than slots: writers wait for destage, nothing fails. */
static void test_backpressure(void)
{
	struct env e;
	struct stat_snap *s = &snap;
	size_t size = 6 * MiB;
	char *src = malloc(size);
	struct cfile *f;
	int fd;
	size_t off;

	env_init(&e, 4, 64 * KiB);
	e.cfg.write_around = 0; /* every write into the cache: it waits */
	f = file_open(&e, "big", &fd);
	fill(src, size, 5);
	for (off = 0; off < size; off += 96 * KiB) {
		size_t n = size - off < 96 * KiB ? size - off : 96 * KiB;

		CHECK_EQ(cache_write(e.c, f, src + off, n, off), 0);
	}
	CHECK(same(&e, f, src, size, 0));
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(backing_same(fd, src, size));
	cache_snapshot(e.c, s);
	CHECK(STAT_CTR(s, evictions) > 0);
	CHECK(STAT_CTR(s, destaged_bytes) >= size);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(src);
}

static void test_truncate(void)
{
	struct env e;
	size_t size = 300 * KiB;
	char *src = malloc(size), *ref = calloc(1, size);
	struct cfile *f;
	int fd;

	env_init(&e, 64, 64 * KiB);
	f = file_open(&e, "t", &fd);
	fill(src, 200 * KiB, 6);
	CHECK_EQ(cache_write(e.c, f, src, 200 * KiB, 0), 0);
	CHECK_EQ(cache_truncate(e.c, f, 5000), 0);
	CHECK_EQ(cache_truncate(e.c, f, size), 0);
	memcpy(ref, src, 5000);
	CHECK(same(&e, f, ref, size, 0));
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(backing_same(fd, ref, size));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(src);
	free(ref);
}

/* Dirty data survives a crash; a damaged mirror is repaired from the other. */
static void test_recovery_and_torn_mirror(void)
{
	struct env e;
	struct stat_snap *s = &snap;
	size_t size = 700 * KiB + 3;
	char *src = malloc(size);
	struct cfile *f;
	uint64_t dirty;
	int fd, i;

	env_init(&e, 64, 64 * KiB);
	f = file_open(&e, "r", &fd);
	fill(src, size, 8);
	CHECK_EQ(cache_write(e.c, f, src, size, 0), 0);
	cache_snapshot(e.c, s);
	dirty = STAT_GAUGE(s, dirty_slots);
	cache_file_put(e.c, f);
	cache_abandon(e.c); /* the daemon dies */
	e.c = NULL;

	/* damage: flip a byte of every used slot entry in mirror 1, zero a file
	 * record in mirror 0 */
	{
		const struct meta_hdr *h = e.mirrors[1].addr;
		uint8_t *slots = (uint8_t *)e.mirrors[1].addr + h->slots_off;

		for (i = 0; i < (int)h->nslots; i++)
			if (slots[i * h->slot_size + 8])
				slots[i * h->slot_size + 20] ^= 0x40;
		memset((uint8_t *)e.mirrors[0].addr + h->files_off, 0x5a, 64);
	}
	env_open(&e);
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_GAUGE(s, dirty_slots), dirty);
	CHECK(!memcmp((char *)e.mirrors[0].addr + META_HDR_SIZE,
		      (char *)e.mirrors[1].addr + META_HDR_SIZE,
		      e.mlen - META_HDR_SIZE));
	close(fd);
	f = file_open(&e, "r", &fd);
	CHECK(same(&e, f, src, size, 0));
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(backing_same(fd, src, size));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(src);
}

/* A file deleted while the daemon was down loses its cached data at mount. */
static void test_recovery_drops_deleted_file(void)
{
	struct env e;
	struct stat_snap *s = &snap;
	char buf[8192];
	struct cfile *f;
	int fd;

	env_init(&e, 64, 64 * KiB);
	f = file_open(&e, "gone", &fd);
	fill(buf, sizeof(buf), 2);
	CHECK_EQ(cache_write(e.c, f, buf, sizeof(buf), 0), 0);
	cache_file_put(e.c, f);
	close(fd);
	cache_abandon(e.c);
	CHECK_EQ(unlinkat(e.backing_fd, "gone", 0), 0);
	env_open(&e);
	cache_snapshot(e.c, s);
	CHECK_EQ(STAT_GAUGE(s, dirty_slots), 0);
	CHECK_EQ(STAT_GAUGE(s, used_slots), 0);
	env_fini(&e);
}

/* More files than file records: records of files with only clean data are
 * reclaimed. */
static void test_more_files_than_records(void)
{
	struct env e;
	char buf[4096], name[32], *data;
	struct cfile *f;
	size_t n;
	int fd, i;

	max_files = 64;
	env_init(&e, 64, 64 * KiB);
	for (i = 0; i < 150; i++) {
		snprintf(name, sizeof(name), "m%d", i);
		f = file_open(&e, name, &fd);
		memset(buf, i, sizeof(buf));
		CHECK_EQ(cache_write(e.c, f, buf, sizeof(buf), 0), 0);
		cache_file_put(e.c, f);
		close(fd);
	}
	for (i = 0; i < 150; i++) {
		snprintf(name, sizeof(name), "m%d", i);
		f = file_open(&e, name, &fd);
		CHECK_EQ(cache_read(e.c, f, rbuf, 4096, 0, &data, &n), 0);
		memset(buf, i, sizeof(buf));
		CHECK(n == 4096 && !memcmp(data, buf, 4096));
		cache_file_put(e.c, f);
		close(fd);
	}
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	env_fini(&e);
	max_files = 65536;
}

/* Age destage takes the oldest dirty file first and leaves younger ones alone.
 */
static void test_destage_oldest_first(void)
{
	struct env e;
	char buf[8192];
	struct cfile *a, *b;
	struct stat st;
	int fa, fb;

	env_init(&e, 64, 64 * KiB);
	e.cfg.max_dirty_age_ms = 1000;
	cache_kick(e.c);
	a = file_open(&e, "old", &fa);
	b = file_open(&e, "young", &fb);
	fill(buf, sizeof(buf), 1);
	CHECK_EQ(cache_write(e.c, a, buf, sizeof(buf), 0), 0);
	usleep(1500 * 1000);
	CHECK_EQ(cache_write(e.c, b, buf, sizeof(buf), 0), 0);
	usleep(500 * 1000); /* old is 2 s old, young 0.5 s */
	CHECK(!fstat(fa, &st) && st.st_size == sizeof(buf));
	CHECK(!fstat(fb, &st) && st.st_size == 0);
	cache_file_put(e.c, a);
	cache_file_put(e.c, b);
	close(fa);
	close(fb);
	env_fini(&e);
}

/* A cache device fails: clean data comes from the backing file, writes go on,
 * dirty data that lived only there is reported, never replaced by older bytes.
 */
static void test_failed_device(void)
{
	struct env e;
	struct stat_snap *st = &snap;
	size_t size = 1 * MiB;
	char *src = malloc(size), *more = malloc(size), *data;
	struct cfile *a, *b;
	int fa, fb, eio = 0;
	size_t n, off;

	env_init(&e, 64, 64 * KiB);
	a = file_open(&e, "clean", &fa);
	b = file_open(&e, "dirty", &fb);
	fill(src, size, 11);
	CHECK_EQ(cache_write(e.c, a, src, size, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL),
		 0); /* a is clean, cached on both devices */
	fill(more, size, 12);
	CHECK_EQ(cache_write(e.c, b, more, size, 0),
		 0); /* b is dirty, on both devices */
	dev_faults(e.devs[1])->fail_reads = -EIO;
	dev_faults(e.devs[1])->fail_writes = -EIO;
	CHECK(same(&e, a, src, size, 0));
	for (off = 0; off < size; off += 64 * KiB)
		if (cache_read(e.c, b, rbuf, 64 * KiB, off, &data, &n) == -EIO)
			eio++;
		else
			CHECK(!memcmp(data, more + off, n));
	CHECK(eio > 0 &&
	      eio < 16); /* the blocks on the failed device, no others */
	/* writes still work, on the good device or through to the backing file
	 */
	fill(src, size, 13);
	CHECK_EQ(cache_write(e.c, a, src, size, 0), 0);
	CHECK_EQ(cache_write(e.c, a, "tail", 4, size + 10), 0);
	CHECK(same(&e, a, src, size, 0));
	CHECK(same(&e, a, "tail", 4, size + 10));
	cache_snapshot(e.c, st);
	CHECK(STAT_DEV_GAUGE(st, 1, failed) && !STAT_DEV_GAUGE(st, 0, failed) &&
	      STAT_DEV_CTR(st, 1, errors) > 0);
	CHECK_EQ(cache_fsync(e.c, b), -EIO);
	CHECK_EQ(cache_fsync(e.c, a), 0);
	cache_file_put(e.c, a);
	cache_file_put(e.c, b);
	close(fa);
	close(fb);
	dev_faults(e.devs[1])->fail_reads = 0;
	dev_faults(e.devs[1])->fail_writes = 0;
	env_fini(&e);
	free(src);
	free(more);
}

/* A crash between two persists can leave an entry that names a file but claims
 * no page (a trimmed edge block before it is freed); recovery must free it. */
static void test_recovery_of_entry_without_pages(void)
{
	struct env e;
	struct stat_snap *st = &snap;
	struct meta m;
	struct meta_slot ms;
	char buf[8192], err[256];
	struct cfile *f;
	uint64_t i;
	int fd, bad, crafted = 0;

	env_init(&e, 64, 64 * KiB);
	f = file_open(&e, "edge", &fd);
	fill(buf, sizeof(buf), 3);
	CHECK_EQ(cache_write(e.c, f, buf, sizeof(buf), 0), 0);
	cache_file_put(e.c, f);
	close(fd);
	cache_abandon(e.c);
	/* make the file's entry claim nothing, in both mirrors */
	CHECK_EQ(meta_attach_ro(&m, e.mirrors, err, sizeof(err)), 0);
	m.seq = 1000;
	for (i = 0; i < m.nslots; i++)
		if (meta_get_slot(&m, i, &ms, &bad) && ms.file) {
			memset(ms.valid, 0, sizeof(ms.valid));
			memset(ms.dirty, 0, sizeof(ms.dirty));
			meta_put_slot(&m, i, &ms);
			crafted++;
		}
	CHECK_EQ(crafted, 1);
	CHECK_EQ(unlinkat(e.backing_fd, "edge", 0),
		 0); /* and the file is gone */
	env_open(&e);
	cache_snapshot(e.c, st);
	CHECK_EQ(STAT_GAUGE(st, used_slots), 0);
	CHECK_EQ(STAT_GAUGE(st, dirty_slots), 0);
	env_fini(&e);
}

static void slow_progress(void *arg, uint64_t dirty, uint64_t destaged)
{
	(void)arg;
	(void)dirty;
	(void)destaged;
	usleep(300 * 1000);
}

/* Destage may drain everything while flush reports progress: that is success. */
static void test_flush_drains_while_reporting(void)
{
	struct env e;
	char buf[65536];
	struct cfile *f;
	int fd;

	env_init(&e, 64, 64 * KiB);
	f = file_open(&e, "p", &fd);
	fill(buf, sizeof(buf), 4);
	CHECK_EQ(cache_write(e.c, f, buf, sizeof(buf), 0), 0);
	CHECK_EQ(cache_flush(e.c, slow_progress, NULL), 0);
	CHECK(backing_same(fd, buf, sizeof(buf)));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
}

/* dirty_copies = 2: a device lost with dirty data on it loses nothing. */
static void test_two_copies_survive_a_device(void)
{
	struct env e;
	struct stat_snap *st = &snap;
	size_t size = 1 * MiB + 12345;
	char *src = malloc(size);
	struct cfile *f;
	int fd, pass;

	dirty_copies = 2;
	for (pass = 0; pass < 2; pass++) {
		env_init(&e, 64, 64 * KiB);
		f = file_open(&e, "two", &fd);
		fill(src, size, 21 + pass);
		CHECK_EQ(cache_write(e.c, f, src, size, 0), 0);
		CHECK_EQ(cache_write(e.c, f, "patch", 5, 70000), 0);
		memcpy(src + 70000, "patch", 5);
		cache_snapshot(e.c, st);
		CHECK_EQ(
			STAT_GAUGE(st, used_slots),
			2 * STAT_GAUGE(
				    st,
				    dirty_slots)); /* every dirty slot has a twin */
		if (pass) {
			/* the second copies are found again after a crash */
			cache_file_put(e.c, f);
			close(fd);
			cache_abandon(e.c);
			env_open(&e);
			f = file_open(&e, "two", &fd);
		}
		dev_faults(e.devs[pass])->fail_reads = -EIO;
		dev_faults(e.devs[pass])->fail_writes = -EIO;
		CHECK(same(&e, f, src, size, 0));
		CHECK_EQ(cache_fsync(e.c, f), 0);
		CHECK_EQ(cache_flush(e.c, NULL, NULL),
			 0); /* destaged from the copies */
		CHECK(backing_same(fd, src, size));
		cache_snapshot(e.c, st);
		CHECK_EQ(STAT_GAUGE(st, dirty_slots), 0);
		dev_faults(e.devs[pass])->fail_reads = 0;
		dev_faults(e.devs[pass])->fail_writes = 0;
		cache_file_put(e.c, f);
		close(fd);
		env_fini(&e);
	}
	dirty_copies = 1;
	free(src);
}

/* Is fd a descriptor of this process? */
static int fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

/*
 * A file the daemon has just created (cache_file_get_new, issue 10): the
 * object takes the create's descriptor and opens nothing of its own; when
 * another open made the object first, the descriptor is closed.  Either way
 * the data reaches the backing file, which carries an identity stamp.
 */
static void test_created_file_takes_its_descriptor(void)
{
	static const int modes[] = { IDENT_HANDLE, IDENT_PATH };
	char buf[8192], path[64], stamp[64];
	struct cfile *f, *g, *h;
	struct stat st;
	struct env e;
	int m, fd, pfd, fd2, pfd2, rw2;

	fill(buf, sizeof(buf), 7);
	for (m = 0; m < 2; m++) {
		env_format(&e, 64, 64 * KiB, NULL);
		e.cfg.identity = modes[m];
		env_open(&e);
		fd = openat(e.backing_fd, "new",
			    O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		CHECK(fd >= 0 && !fstat(fd, &st));
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		pfd = open(path, O_PATH | O_CLOEXEC);
		CHECK(pfd >= 0);
		CHECK_EQ(cache_file_get_new(e.c, -1, fd, &st, &f), 0);
		CHECK(fd_open(fd)); /* the object's now */
		CHECK_EQ(cache_write(e.c, f, buf, sizeof(buf), 0), 0);
		CHECK_EQ(cache_fsync(e.c, f), 0);

		/* another open of the same file made the object first */
		fd2 = openat(e.backing_fd, "other",
			     O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		CHECK(fd2 >= 0 && !fstat(fd2, &st));
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd2);
		pfd2 = open(path, O_PATH | O_CLOEXEC);
		rw2 = open(path, O_RDWR | O_CLOEXEC);
		CHECK(pfd2 >= 0 && rw2 >= 0);
		CHECK_EQ(cache_file_get(e.c, pfd2, &g), 0);
		CHECK_EQ(cache_file_get_new(e.c, -1, rw2, &st, &h), 0);
		CHECK(h == g);
		CHECK(!fd_open(rw2)); /* closed: the object had one */
		CHECK_EQ(cache_write(e.c, h, buf, 4096, 0), 0);
		cache_file_put(e.c, h);
		cache_file_put(e.c, g);
		cache_file_put(e.c, f);
		CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
		CHECK(backing_same(fd2, buf, 4096));
		snprintf(path, sizeof(path), "/proc/self/fd/%d", pfd);
		{
			int r = open(path, O_RDONLY | O_CLOEXEC);

			CHECK(r >= 0 && backing_same(r, buf, sizeof(buf)));
			CHECK(fgetxattr(r, "trusted.nvcachefs.id", stamp,
					sizeof(stamp)) > 0 ||
			      fgetxattr(r, "user.nvcachefs.id", stamp,
					sizeof(stamp)) > 0);
			close(r);
		}
		close(pfd);
		close(pfd2);
		close(fd2);
		env_fini(&e);
	}
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_write_read_unaligned);
	RUN(test_write_in_place);
	RUN(test_miss_then_hit);
	RUN(test_lru_eviction);
	RUN(test_backpressure);
	RUN(test_truncate);
	RUN(test_recovery_and_torn_mirror);
	RUN(test_recovery_drops_deleted_file);
	RUN(test_more_files_than_records);
	RUN(test_destage_oldest_first);
	RUN(test_failed_device);
	RUN(test_recovery_of_entry_without_pages);
	RUN(test_flush_drains_while_reporting);
	RUN(test_two_copies_survive_a_device);
	RUN(test_created_file_takes_its_descriptor);
	free(rbuf);
	return CHECK_DONE();
}
