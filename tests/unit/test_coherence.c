/* tests: many nodes over one store — a backing file changed behind the cache
 * is revalidated at open, dirty data over such a change is a conflict, and
 * the cache's own changes are never taken for another node's. */
#define _GNU_SOURCE
#include "env.h"
#include "../../cache/mngt/mngt.h" /* frw_rdlock: the file's lock held meanwhile */

#include <pthread.h>
#include <sys/stat.h>

static uint64_t cnt(struct env *e, enum stat_counter k)
{
	return cache_counter(e->c, k);
}

/* What another node does: write the backing file, not through the cache. */
static void behind(struct env *e, const char *name, const char *buf, size_t len,
		   uint64_t off)
{
	int fd = openat(e->backing_fd, name, O_WRONLY);

	CHECK(fd >= 0);
	CHECK_EQ(pwrite(fd, buf, len, off), (ssize_t)len);
	CHECK_EQ(fsync(fd), 0);
	close(fd);
}

static uint64_t size_of(struct env *e, struct cfile *f, int fd)
{
	struct stat st;
	uint64_t size = 0;

	(void)f;
	fstat(fd, &st);
	cache_file_attr(e->c, st.st_dev, st.st_ino, &size, NULL);
	return size;
}

/* The first open of a new object is fresh; the second sees no change. */
static void open_settled(struct env *e, struct cfile *f)
{
	int changed;

	CHECK_EQ(cache_file_revalidate(e->c, f, NULL, &changed), 0);
	CHECK_EQ(changed, COH_FRESH);
	CHECK_EQ(cache_file_revalidate(e->c, f, NULL, &changed), 0);
	CHECK_EQ(changed, COH_UNCHANGED);
}

/* Clean cached data of a file another node rewrote (longer) goes at the
 * next open; the next read returns the new bytes, at the new size. */
static void test_clean_changed_elsewhere(void)
{
	struct env e;
	char *a = malloc(256 * KiB), *b = malloc(320 * KiB);
	struct cfile *f;
	int fd, changed;

	env_init(&e, 64, 64 * KiB);
	fill(a, 256 * KiB, 1);
	fill(b, 320 * KiB, 2);
	f = file_open(&e, "f", &fd);
	open_settled(&e, f);
	CHECK_EQ(cache_write(e.c, f, a, 256 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(same(&e, f, a, 256 * KiB, 0)); /* cached, clean */
	behind(&e, "f", b, 320 * KiB, 0);
	CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
	CHECK_EQ(changed, COH_CHANGED);
	CHECK_EQ(cnt(&e, STAT_C_revalidate_drops), 1);
	CHECK_EQ(cnt(&e, STAT_C_conflicts), 0);
	CHECK_EQ(size_of(&e, f, fd), 320 * KiB);
	CHECK(same(&e, f, b, 320 * KiB, 0));
	/* counted once: the new look is the known one now */
	CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
	CHECK_EQ(changed, COH_UNCHANGED);
	CHECK_EQ(cnt(&e, STAT_C_revalidate_drops), 1);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(a);
	free(b);
}

/* The same for a file made shorter elsewhere, its data then read again. */
static void test_clean_shrunk_elsewhere(void)
{
	struct env e;
	char *a = malloc(256 * KiB), *b = malloc(100 * KiB);
	struct cfile *f;
	int fd, changed, bfd;

	env_init(&e, 64, 64 * KiB);
	fill(a, 256 * KiB, 3);
	fill(b, 100 * KiB, 4);
	f = file_open(&e, "f", &fd);
	open_settled(&e, f);
	CHECK_EQ(cache_write(e.c, f, a, 256 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	bfd = openat(e.backing_fd, "f", O_WRONLY | O_TRUNC);
	CHECK_EQ(pwrite(bfd, b, 100 * KiB, 0), 100 * KiB);
	close(bfd);
	CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
	CHECK_EQ(changed, COH_CHANGED);
	CHECK_EQ(size_of(&e, f, fd), 100 * KiB);
	CHECK(same(&e, f, b, 100 * KiB, 0));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(a);
	free(b);
}

/*
 * Dirty data over a change made elsewhere, overwrite: one conflict, whether
 * the open or the destage finds it first; this node's dirty pages go over
 * the store's, the bytes past them stay the store's (a file the other node
 * made longer is not cut), and its own destage is no further conflict.
 */
static void conflict_overwrite(int at_open)
{
	struct env e;
	char *a = malloc(128 * KiB), *b = malloc(320 * KiB),
	     *want = malloc(320 * KiB);
	struct cfile *f;
	int fd, changed;

	env_init(&e, 64, 64 * KiB);
	fill(a, 128 * KiB, 5);
	fill(b, 320 * KiB, 6);
	f = file_open(&e, "f", &fd);
	open_settled(&e, f);
	CHECK_EQ(cache_write(e.c, f, a, 128 * KiB, 0), 0); /* dirty */
	behind(&e, "f", b, 320 * KiB, 0);
	if (at_open) {
		CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
		CHECK_EQ(changed, COH_CHANGED);
		CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
	}
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK_EQ(cnt(&e, STAT_C_conflicts), 1);
	CHECK_EQ(cnt(&e, STAT_C_revalidate_drops), 0);
	memcpy(want, b, 320 * KiB);
	memcpy(want, a, 128 * KiB);
	CHECK(backing_same(fd, want, 320 * KiB));
	CHECK_EQ(size_of(&e, f, fd), 320 * KiB);
	CHECK(same(&e, f, want, 320 * KiB, 0));
	/* this node's own destage took the look: no second conflict */
	CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
	CHECK_EQ(changed, at_open ? COH_UNCHANGED : COH_CHANGED);
	CHECK_EQ(cache_write(e.c, f, a, 4 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK_EQ(cnt(&e, STAT_C_conflicts), 1);
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(a);
	free(b);
	free(want);
}

static void test_conflict_overwrite_at_open(void)
{
	conflict_overwrite(1);
}

static void test_conflict_overwrite_at_destage(void)
{
	conflict_overwrite(0);
}

/* The one name in the backing directory that starts with prefix, or NULL. */
static char *find_copy(struct env *e, const char *prefix)
{
	char cmd[256], *line = NULL;
	size_t n = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "ls -1 %s | grep '^%s'", e->dir, prefix);
	p = popen(cmd, "r");
	if (getline(&line, &n, p) > 0)
		line[strcspn(line, "\n")] = 0;
	else {
		free(line);
		line = NULL;
	}
	pclose(p);
	return line;
}

/* A conflict copy is the daemon's, mode 0600, whoever owns the file
 * (PRODUCT §5): never given away by name (issue 24, finding 2). */
static void check_daemon_own(int cfd)
{
	struct stat st;

	CHECK_EQ(fstat(cfd, &st), 0);
	CHECK_EQ(st.st_uid, geteuid());
	CHECK_EQ(st.st_gid, getegid());
	CHECK_EQ(st.st_mode, S_IFREG | 0600);
}

/*
 * keep-both, found at the open or at the destage: this node's version — its
 * cached pages, dirty and clean, over the store's bytes, at its size — goes
 * beside the file under a conflict name; the file keeps the other node's
 * version, and this node's cache serves that one, with nothing dirty.
 */
static void conflict_keep_both(int at_open)
{
	struct env e;
	char *x = malloc(256 * KiB), *y = malloc(64 * KiB),
	     *z = malloc(320 * KiB), *want = malloc(256 * KiB), *copy, host[64];
	struct cfile *f;
	int fd, cfd, changed;

	env_init(&e, 64, 64 * KiB);
	e.cfg.on_conflict = CONFLICT_KEEP_BOTH;
	fill(x, 256 * KiB, 11);
	fill(y, 64 * KiB, 12);
	fill(z, 320 * KiB, 13);
	f = file_open(&e, "f", &fd);
	open_settled(&e, f);
	CHECK_EQ(cache_write(e.c, f, x, 256 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK_EQ(cache_write(e.c, f, y, 64 * KiB, 0), 0); /* dirty */
	behind(&e, "f", z, 320 * KiB, 0);
	CHECK_EQ(fchown(fd, 65534, 65534), 0); /* a user's file */
	CHECK_EQ(fchmod(fd, 0644), 0);
	if (at_open) {
		CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
		CHECK_EQ(changed, COH_CHANGED);
	}
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK_EQ(cnt(&e, STAT_C_conflicts), 1);
	CHECK(backing_same(fd, z, 320 * KiB));
	CHECK_EQ(size_of(&e, f, fd), 320 * KiB);
	CHECK(same(&e, f, z, 320 * KiB, 0));
	copy = find_copy(&e, "f.nvcachefs-conflict-");
	CHECK(copy != NULL);
	if (copy) {
		gethostname(host, sizeof(host));
		CHECK(strstr(copy, host) != NULL);
		memcpy(want, x, 256 * KiB);
		memcpy(want, y, 64 * KiB);
		cfd = openat(e.backing_fd, copy, O_RDONLY);
		CHECK(backing_same(cfd, want, 256 * KiB));
		check_daemon_own(cfd);
		close(cfd);
		free(copy);
	}
	CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK_EQ(cnt(&e, STAT_C_conflicts), 1);
	CHECK(backing_same(fd, z, 320 * KiB));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(x);
	free(y);
	free(z);
	free(want);
}

static void test_conflict_keep_both_at_open(void)
{
	conflict_keep_both(1);
}

static void test_conflict_keep_both_at_destage(void)
{
	conflict_keep_both(0);
}

/*
 * The cache's own changes to the backing file — destage, truncate (both
 * ways), writethrough and writearound writes, fallocate, a chmod and times
 * set through the mount — are not changes made elsewhere: no drop, no
 * conflict, at the next open.
 */
static void test_own_changes_are_not_changes(void)
{
	struct stat before;
	struct env e;
	char *a = malloc(256 * KiB);
	struct cfile *f;
	int fd, changed;
	struct timespec ts[2] = { { 0, UTIME_OMIT }, { 12345, 0 } };

	env_init(&e, 64, 64 * KiB);
	fill(a, 256 * KiB, 7);
	f = file_open(&e, "f", &fd);
	open_settled(&e, f);
#define SETTLED()                                                     \
	do {                                                          \
		CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0); \
		CHECK_EQ(changed, COH_UNCHANGED);                     \
		CHECK_EQ(cnt(&e, STAT_C_revalidate_drops), 0);        \
		CHECK_EQ(cnt(&e, STAT_C_conflicts), 0);               \
	} while (0)
	CHECK_EQ(cache_write(e.c, f, a, 256 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	SETTLED();
	CHECK_EQ(cache_write(e.c, f, a, 8 * KiB, 300 * KiB), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0); /* destage extends */
	SETTLED();
	CHECK_EQ(cache_truncate(e.c, f, 100 * KiB), 0);
	SETTLED();
	CHECK_EQ(cache_truncate(e.c, f, 400 * KiB), 0);
	SETTLED();
	CHECK_EQ(cache_fallocate(e.c, f, 0, 400 * KiB, 64 * KiB), 0);
	SETTLED();
	e.cfg.mode = MODE_WRITETHROUGH;
	CHECK_EQ(cache_write(e.c, f, a, 64 * KiB, 500 * KiB), 0);
	SETTLED();
	e.cfg.mode = MODE_WRITEAROUND;
	CHECK_EQ(cache_write(e.c, f, a, 64 * KiB, 600 * KiB), 0);
	SETTLED();
	e.cfg.mode = MODE_WRITEBACK;
	cache_file_meta_before(fd, &before);
	CHECK_EQ(fchmod(fd, 0600), 0);
	cache_file_meta_changed(e.c, fd, 0, &before);
	SETTLED();
	cache_file_meta_before(fd, &before);
	CHECK_EQ(futimens(fd, ts), 0);
	cache_file_meta_changed(e.c, fd, 1, &before);
	SETTLED();
	/* and the file's data is all there */
	CHECK(same(&e, f, a, 64 * KiB, 600 * KiB));
	CHECK(same(&e, f, a, 100 * KiB, 0));
#undef SETTLED
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(a);
}

/* A file closed and opened again keeps its look across the idle time: a
 * change elsewhere while nobody had it open is found at the next open. */
static void test_change_while_idle(void)
{
	struct env e;
	char *a = malloc(128 * KiB), *b = malloc(192 * KiB);
	struct cfile *f;
	int fd, changed;

	env_init(&e, 64, 64 * KiB);
	fill(a, 128 * KiB, 8);
	fill(b, 192 * KiB, 9);
	f = file_open(&e, "f", &fd);
	open_settled(&e, f);
	CHECK_EQ(cache_write(e.c, f, a, 128 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	cache_file_put(e.c, f); /* idle: its descriptor goes */
	close(fd);
	behind(&e, "f", b, 192 * KiB, 0);
	f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
	CHECK_EQ(changed, COH_CHANGED);
	CHECK(same(&e, f, b, 192 * KiB, 0));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(a);
	free(b);
}

/* Times set through the mount on a file with dirty data, then a crash:
 * recovery must not take the new mtime for a change made elsewhere. */
static void test_times_set_then_crash(void)
{
	struct stat before;
	struct env e;
	char *a = malloc(128 * KiB);
	struct timespec ts[2] = { { 0, UTIME_OMIT }, { 12345, 0 } };
	struct cfile *f;
	int fd;

	env_init(&e, 64, 64 * KiB);
	fill(a, 128 * KiB, 14);
	f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_write(e.c, f, a, 64 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK_EQ(cache_write(e.c, f, a + 64 * KiB, 64 * KiB, 64 * KiB), 0);
	cache_file_meta_before(fd, &before);
	CHECK_EQ(futimens(fd, ts), 0);
	cache_file_meta_changed(e.c, fd, 1, &before);
	cache_abandon(e.c); /* still open: no record written at its close */
	close(fd);
	env_open(&e);
	CHECK_EQ(cnt(&e, STAT_C_conflicts), 0);
	f = file_open(&e, "f", &fd);
	CHECK(same(&e, f, a, 128 * KiB, 0));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(a);
}

struct writer {
	struct env *e;
	struct cfile *f;
	int k;
};

/* Writethrough writes that each make the file longer, four threads. */
static void *writer_main(void *arg)
{
	struct writer *w = arg;
	char buf[4096];
	int i;

	memset(buf, 'a' + w->k, sizeof(buf));
	for (i = 0; i < 300; i++)
		CHECK_EQ(cache_write(w->e->c, w->f, buf, sizeof(buf),
				     ((uint64_t)i * 4 + w->k) * 64 * KiB),
			 0);
	return NULL;
}

/* Own changes side by side (writers under f->rw read-locked) note the look
 * in the order they happened: the last note is the backing file as it is. */
static void test_concurrent_own_changes(void)
{
	struct writer w[4];
	pthread_t t[4];
	struct env e;
	struct cfile *f;
	int fd, changed, k, round;

	env_init(&e, 256, 64 * KiB);
	f = file_open(&e, "f", &fd);
	open_settled(&e, f);
	e.cfg.mode = MODE_WRITETHROUGH;
	for (round = 0; round < 5; round++) {
		for (k = 0; k < 4; k++) {
			w[k] = (struct writer){ &e, f, k };
			pthread_create(&t[k], NULL, writer_main, &w[k]);
		}
		for (k = 0; k < 4; k++)
			pthread_join(t[k], NULL);
		CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
		CHECK_EQ(changed, COH_UNCHANGED);
		CHECK_EQ(cnt(&e, STAT_C_revalidate_drops), 0);
		CHECK_EQ(cache_truncate(e.c, f, 0), 0);
	}
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
}

struct big_writer {
	struct env *e;
	struct cfile *f;
	const char *buf;
	size_t len;
	int ret;
};

static void *big_writer_main(void *arg)
{
	struct big_writer *w = arg;

	w->ret = cache_write(w->e->c, w->f, w->buf, w->len, 0);
	return NULL;
}

/*
 * A write larger than the cache waits for space with the file's lock held
 * for reading, and only the destage of that same file can make the space:
 * a change made elsewhere must not stop that destage (it waited for the
 * file's write lock: a deadlock).  Both policies keep both versions there:
 * keep-both puts the other node's version beside the file.
 */
static void conflict_while_writer_waits(int keep)
{
	struct big_writer w;
	struct timespec ts;
	struct env e;
	char *a = malloc(4 * MiB), *b = malloc(256 * KiB), *copy;
	struct cfile *f;
	pthread_t t;
	int fd, cfd;

	env_init(&e, 16, 64 * KiB); /* 32 slots: 2 MiB */
	e.cfg.on_conflict = keep ? CONFLICT_KEEP_BOTH : CONFLICT_OVERWRITE;
	fill(a, 4 * MiB, 15);
	fill(b, 256 * KiB, 16);
	f = file_open(&e, "f", &fd);
	open_settled(&e, f);
	CHECK_EQ(cache_write(e.c, f, b, 64 * KiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	behind(&e, "f", b, 256 * KiB, 0);
	CHECK_EQ(fchown(fd, 65534, 65534), 0); /* a user's file */
	w = (struct big_writer){ &e, f, a, 4 * MiB, -1 };
	pthread_create(&t, NULL, big_writer_main, &w);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 60;
	if (pthread_timedjoin_np(t, NULL, &ts)) {
		fprintf(stderr, "%s:%d: the writer is still waiting after 60 "
				"s: deadlock\n",
			__FILE__, __LINE__);
		exit(1);
	}
	CHECK_EQ(w.ret, 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK_EQ(cnt(&e, STAT_C_conflicts), 1);
	CHECK(backing_same(fd, a, 4 * MiB));
	copy = find_copy(&e, "f.nvcachefs-conflict-");
	CHECK(!keep == !copy);
	if (copy) {
		cfd = openat(e.backing_fd, copy, O_RDONLY);
		CHECK(backing_same(cfd, b, 256 * KiB));
		check_daemon_own(cfd);
		close(cfd);
		free(copy);
	}
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(a);
	free(b);
}

static void test_conflict_while_writer_waits_overwrite(void)
{
	conflict_while_writer_waits(0);
}

static void test_conflict_while_writer_waits_keep_both(void)
{
	conflict_while_writer_waits(1);
}

/* cache_file_flush: what was written is on the store when it returns. */
static void test_file_flush(void)
{
	struct env e;
	char *a = malloc(512 * KiB);
	struct cfile *f;
	int fd;

	env_init(&e, 64, 64 * KiB);
	fill(a, 512 * KiB, 10);
	f = file_open(&e, "f", &fd);
	CHECK_EQ(cache_write(e.c, f, a, 512 * KiB, 0), 0);
	CHECK(!backing_same(fd, a, 512 * KiB));
	CHECK_EQ(cache_file_flush(e.c, f), 0);
	CHECK(backing_same(fd, a, 512 * KiB));
	CHECK_EQ(cache_file_flush(e.c, f), 0); /* nothing owed */
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(a);
}

/* Holds f->rw for reading until told to stop (a read under way). */
struct holder {
	struct cfile *f;
	int held, stop;
};

static void *holder_main(void *arg)
{
	struct holder *h = arg;

	frw_rdlock(h->f);
	__atomic_store_n(&h->held, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&h->stop, __ATOMIC_ACQUIRE))
		usleep(1000);
	frw_unlock(h->f);
	return NULL;
}

/*
 * Issue 25, finding 17: a revalidation drop without f->wgen++.  A read's
 * fill deferred past its reply (backing.async_fill) fetched the old bytes;
 * another node rewrites the file; the destage that finds the conflict
 * cannot have the file's lock (a read holds it), so the clean data is left
 * stale for the next open to drop.  That drop (coh_settle, the look
 * unchanged) bumped nothing, and the fill, run after the open, put the old
 * bytes back: served for good.
 */
static void test_deferred_fill_after_stale_drop(void)
{
	struct holder h = { 0 };
	struct env e;
	char *a = malloc(256 * KiB), *b = malloc(256 * KiB),
	     *d = malloc(64 * KiB), *want = malloc(256 * KiB), *data,
	     *buf = dev_alloc_buf(128 * KiB + 2 * NVC_PAGE);
	struct cfile *f;
	pthread_t t;
	size_t n;
	int fd, changed;

	env_init(&e, 64, 64 * KiB);
	e.cfg.async_fill = 1;
	fill(a, 256 * KiB, 17);
	fill(b, 256 * KiB, 18);
	fill(d, 64 * KiB, 19);
	fd = openat(e.backing_fd, "f", O_RDWR | O_CREAT, 0644);
	CHECK_EQ(pwrite(fd, a, 256 * KiB, 0), 256 * KiB);
	close(fd);
	f = file_open(&e, "f", &fd);
	open_settled(&e, f);
	CHECK_EQ(cache_write(e.c, f, d, 64 * KiB, 192 * KiB), 0); /* dirty */
	CHECK_EQ(cache_read_defer(e.c, f, buf, 128 * KiB, 0, &data, &n, 1),
		 0);
	CHECK_EQ(n, 128 * KiB);
	CHECK(!memcmp(data, a, 128 * KiB)); /* its fill is deferred */
	behind(&e, "f", b, 256 * KiB, 0);
	h.f = f;
	CHECK_EQ(pthread_create(&t, NULL, holder_main, &h), 0);
	while (!__atomic_load_n(&h.held, __ATOMIC_ACQUIRE))
		usleep(1000);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0); /* conflict, overwrite */
	__atomic_store_n(&h.stop, 1, __ATOMIC_RELEASE);
	CHECK_EQ(pthread_join(t, NULL), 0);
	CHECK_EQ(cnt(&e, STAT_C_conflicts), 1);
	CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
	CHECK_EQ(changed, COH_CHANGED);
	cache_read_finish(e.c); /* the read's fill, after the open */
	memcpy(want, b, 256 * KiB);
	memcpy(want + 192 * KiB, d, 64 * KiB);
	CHECK(backing_same(fd, want, 256 * KiB));
	CHECK(same(&e, f, want, 256 * KiB, 0));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(a);
	free(b);
	free(d);
	free(want);
	free(buf);
}

/*
 * Issue 25, finding 17: can a note of the look lower f->bsize below a
 * completed write of this node?  Write A notes the look: its fstat comes
 * before write B's pwrite (the hook starts B there), and A takes the look
 * while B has ended its backing write (coh_bk_done; the hook holds B there)
 * but not begun its own note.  bsize must stay at B's end.
 */
struct lowering {
	struct env *e;
	struct cfile *f;
	const char *b;
	pthread_t t;
	int phase, b_done, release, ret;
};

static struct lowering *low;
static __thread int low_is_b;

static void wait_for(int *flag)
{
	int i;

	for (i = 0; i < 2000 && !__atomic_load_n(flag, __ATOMIC_ACQUIRE); i++)
		usleep(1000);
}

static void *low_b_main(void *arg)
{
	struct lowering *w = arg;

	low_is_b = 1;
	w->ret = cache_write(w->e->c, w->f, w->b, 64 * KiB, 64 * KiB);
	return NULL;
}

static void low_fstat_hook(struct cache *c, struct cfile *f)
{
	struct lowering *w = low;

	(void)c;
	if (!w || w->f != f || low_is_b || w->phase)
		return;
	w->phase = 1;
	CHECK_EQ(pthread_create(&w->t, NULL, low_b_main, w), 0);
	wait_for(&w->b_done);
	CHECK(w->b_done);
}

static void low_done_hook(struct cache *c, struct cfile *f)
{
	struct lowering *w = low;

	(void)c;
	if (!w || w->f != f || !low_is_b || w->b_done)
		return;
	__atomic_store_n(&w->b_done, 1, __ATOMIC_RELEASE);
	wait_for(&w->release);
}

static void test_note_never_lowers_bsize(void)
{
	struct lowering w = { 0 };
	struct env e;
	char *a = malloc(4 * KiB), *b = malloc(64 * KiB),
	     *want = calloc(1, 128 * KiB);
	struct cfile *f;
	uint64_t bsize;
	int fd;

	env_init(&e, 64, 64 * KiB);
	e.cfg.mode = MODE_WRITETHROUGH;
	fill(a, 4 * KiB, 20);
	fill(b, 64 * KiB, 21);
	f = file_open(&e, "f", &fd);
	open_settled(&e, f);
	/* its record and identity stamp first: their note is not A's */
	CHECK_EQ(cache_write(e.c, f, a, 4 * KiB, 0), 0);
	w.e = &e;
	w.f = f;
	w.b = b;
	low = &w;
	e.c->test_look_fstat = low_fstat_hook;
	e.c->test_bk_done = low_done_hook;
	CHECK_EQ(cache_write(e.c, f, a, 4 * KiB, 0), 0); /* A */
	CHECK(w.b_done);
	pthread_mutex_lock(&e.c->lock);
	bsize = f->bsize;
	pthread_mutex_unlock(&e.c->lock);
	CHECK_EQ(bsize, 128 * KiB); /* B's backing write is done */
	__atomic_store_n(&w.release, 1, __ATOMIC_RELEASE);
	CHECK_EQ(pthread_join(w.t, NULL), 0);
	CHECK_EQ(w.ret, 0);
	e.c->test_look_fstat = NULL;
	e.c->test_bk_done = NULL;
	low = NULL;
	memcpy(want, a, 4 * KiB);
	memcpy(want + 64 * KiB, b, 64 * KiB);
	CHECK(backing_same(fd, want, 128 * KiB));
	CHECK(same(&e, f, want, 128 * KiB, 0));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(a);
	free(b);
	free(want);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_clean_changed_elsewhere);
	RUN(test_clean_shrunk_elsewhere);
	RUN(test_conflict_overwrite_at_open);
	RUN(test_conflict_overwrite_at_destage);
	RUN(test_conflict_keep_both_at_open);
	RUN(test_conflict_keep_both_at_destage);
	RUN(test_own_changes_are_not_changes);
	RUN(test_change_while_idle);
	RUN(test_times_set_then_crash);
	RUN(test_concurrent_own_changes);
	RUN(test_conflict_while_writer_waits_overwrite);
	RUN(test_conflict_while_writer_waits_keep_both);
	RUN(test_file_flush);
	RUN(test_deferred_fill_after_stale_drop);
	RUN(test_note_never_lowers_bsize);
	free(rbuf);
	return CHECK_DONE();
}
