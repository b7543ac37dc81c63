/* tests: per-file control (cache/mngt/filectl.c) — pins that survive reopen and
 * crash, evict, warm past the sequential cutoff, the cache.max_pinned cap. */
#include "env.h"
#include "../../cache/mngt/mngt.h" /* test_pin_persist */

#include <pthread.h>
#include <unistd.h>

/* A backing file of len bytes of pattern seed, and its cache object. */
static struct cfile *backing_file(struct env *e, const char *name, size_t len,
				  unsigned seed, int *fd, char **data)
{
	*data = malloc(len);
	fill(*data, len, seed);
	*fd = openat(e->backing_fd, name, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (*fd < 0 || pwrite(*fd, *data, len, 0) != (ssize_t)len)
		exit(1);
	return file_open(e, name, fd);
}

static uint64_t cached(struct env *e, struct cfile *f)
{
	struct cache_file_info i;

	cache_file_info(e->c, f, &i);
	return i.cached;
}

static int pinned(struct env *e, struct cfile *f)
{
	struct cache_file_info i;

	cache_file_info(e->c, f, &i);
	return i.pinned;
}

/* The object of name, never made: NULL if the cache has none. */
static struct cfile *lookup(struct env *e, const char *name)
{
	struct cfile *f = NULL;
	int fd = openat(e->backing_fd, name, O_RDONLY);

	if (fd < 0 || cache_file_lookup(e->c, fd, &f))
		f = NULL;
	close(fd);
	return f;
}

static void warm(struct env *e, struct cfile *f, uint64_t len)
{
	uint64_t done;

	CHECK_EQ(cache_file_warm(e->c, f, len, NULL, NULL, NULL, &done), 0);
	CHECK_EQ(done, len);
}

/* A read of every file other than the pinned one, several times the cache. */
static void flood(struct env *e)
{
	char *d;
	int fd;
	struct cfile *g = backing_file(e, "flood", 32 * MiB, 9, &fd, &d);

	warm(e, g, 32 * MiB);
	cache_file_put(e->c, g);
	close(fd);
	free(d);
}

static void test_pin_survives_reopen_and_crash(void)
{
	struct env e;
	struct cache_room r;
	struct cfile *f;
	char *data;
	int fd;

	env_init(&e, 64, 64 * KiB); /* 8 MiB */
	f = backing_file(&e, "p", MiB + 100, 1, &fd, &data);
	CHECK_EQ(cache_file_pin(e.c, f, 1, &r), 0);
	warm(&e, f, MiB + 100);
	CHECK_EQ(cached(&e, f), MiB + 100);
	cache_file_put(e.c, f);
	close(fd);
	flood(&e);
	f = lookup(&e, "p");
	CHECK(f != NULL);
	if (!f)
		goto out;
	CHECK_EQ(cached(&e, f), MiB + 100);
	cache_file_put(e.c, f);

	/* a clean remount */
	CHECK_EQ(cache_close(e.c, 1), 0);
	env_open(&e);
	f = lookup(&e, "p");
	CHECK(f && pinned(&e, f) && cached(&e, f) == MiB + 100);
	if (f)
		cache_file_put(e.c, f);
	flood(&e);
	/* kill -9 */
	cache_abandon(e.c);
	env_open(&e);
	f = lookup(&e, "p");
	CHECK(f && pinned(&e, f) && cached(&e, f) == MiB + 100);
	if (!f)
		goto out;
	flood(&e);
	CHECK_EQ(cached(&e, f), MiB + 100);
	CHECK(same(&e, f, data, MiB + 100, 0));
	/* unpinned, it goes like anything else */
	CHECK_EQ(cache_file_pin(e.c, f, 0, &r), 0);
	cache_file_put(e.c, f);
	flood(&e);
	cache_abandon(e.c);
	env_open(&e);
	f = lookup(&e, "p");
	CHECK(!f || !pinned(&e, f));
	if (f)
		cache_file_put(e.c, f);
out:
	free(data);
	env_fini(&e);
}

static void test_evict_leaves_no_clean_slot(void)
{
	struct env e;
	struct cache_room r, r0;
	struct cfile *f;
	uint64_t dropped;
	char *data, w[64 * KiB];
	int fd;

	env_init(&e, 64, 64 * KiB);
	cache_room(e.c, &r0);
	f = backing_file(&e, "a", 2 * MiB, 2, &fd, &data);
	warm(&e, f, 2 * MiB);
	CHECK_EQ(cached(&e, f), 2 * MiB);
	fill(w, sizeof(w), 3);
	CHECK_EQ(cache_write(e.c, f, w, sizeof(w), 128 * KiB), 0); /* dirty */
	memcpy(data + 128 * KiB, w, sizeof(w));
	CHECK_EQ(cache_file_evict(e.c, f, &dropped), 0);
	CHECK_EQ(dropped, 2 * MiB - 64 * KiB);
	CHECK_EQ(cached(&e, f), 64 * KiB); /* the dirty block alone */
	cache_room(e.c, &r);
	CHECK_EQ(r.available, r0.available - 64 * KiB);
	CHECK(same(&e, f, data, 2 * MiB, 0)); /* from the backing file */
	/* clean data whose entries are persisted (destaged writes): after
	 * evict and a crash, the entries say free and nothing clean returns */
	CHECK_EQ(cache_write(e.c, f, data, 2 * MiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK_EQ(cache_write(e.c, f, w, sizeof(w), 128 * KiB), 0); /* dirty */
	CHECK_EQ(cached(&e, f), 2 * MiB);
	CHECK_EQ(cache_file_evict(e.c, f, &dropped), 0);
	CHECK_EQ(dropped, 2 * MiB - 64 * KiB);
	cache_file_put(e.c, f);
	close(fd);
	cache_abandon(e.c);
	env_open(&e);
	f = lookup(&e, "a");
	CHECK(f && cached(&e, f) == 64 * KiB);
	if (f) {
		/* pinned: evict refuses, the data stays */
		CHECK_EQ(cache_file_pin(e.c, f, 1, &r), 0);
		warm(&e, f, 2 * MiB);
		CHECK_EQ(cache_file_evict(e.c, f, &dropped), -EBUSY);
		CHECK_EQ(cached(&e, f), 2 * MiB);
		cache_file_put(e.c, f);
	}
	free(data);
	env_fini(&e);
}

static void test_warm_admits_past_cutoff(void)
{
	struct env e;
	struct cfile *f, *g;
	char *data, *d2, *out;
	size_t n;
	uint64_t off;
	int fd, fd2;

	env_init(&e, 64, 64 * KiB);
	cache_config(e.c)->sequential_cutoff = 256 * KiB;
	/* control: a sequential read keeps only what comes before the
	 * cutoff */
	g = backing_file(&e, "seq", 4 * MiB, 4, &fd2, &d2);
	for (off = 0; off < 4 * MiB; off += 128 * KiB)
		CHECK_EQ(cache_read(e.c, g, rbuf, 128 * KiB, off, &out, &n), 0);
	CHECK(cached(&e, g) < MiB);
	/* warm keeps all of it */
	f = backing_file(&e, "w", 4 * MiB, 5, &fd, &data);
	warm(&e, f, 4 * MiB);
	CHECK_EQ(cached(&e, f), 4 * MiB);
	CHECK(same(&e, f, data, 4 * MiB, 0));
	cache_file_put(e.c, f);
	cache_file_put(e.c, g);
	close(fd);
	close(fd2);
	free(data);
	free(d2);
	env_fini(&e);
}

static void test_max_pinned(void)
{
	struct env e;
	struct cache_room r;
	struct cfile *a, *b;
	char *da, *db;
	int fa, fb;

	env_init(&e, 64, 64 * KiB); /* 8 MiB, max_pinned 50%: 4 MiB */
	CHECK_EQ(cache_config(e.c)->max_pinned, 50);
	a = backing_file(&e, "a", 3 * MiB, 6, &fa, &da);
	b = backing_file(&e, "b", 2 * MiB, 7, &fb, &db);
	CHECK_EQ(cache_file_pin(e.c, a, 1, &r), 0);
	CHECK_EQ(cache_file_pin(e.c, b, 1, &r), -ENOSPC);
	CHECK_EQ(r.want, 2 * MiB);
	CHECK_EQ(r.pinned, 3 * MiB);
	CHECK_EQ(r.max_pinned, 4 * MiB);
	CHECK(!pinned(&e, b));
	CHECK_EQ(cache_file_pin(e.c, a, 0, &r), 0);
	CHECK_EQ(cache_file_pin(e.c, b, 1, &r), 0);
	CHECK(pinned(&e, b) && !pinned(&e, a));
	cache_file_put(e.c, a);
	cache_file_put(e.c, b);
	close(fa);
	close(fb);
	free(da);
	free(db);
	env_fini(&e);
}

/* A pinned file deleted gives its space and its pin back. */
static void test_pinned_deleted(void)
{
	struct env e;
	struct cache_room r;
	struct cfile *f;
	struct stat st;
	char *data;
	int fd;

	env_init(&e, 64, 64 * KiB);
	f = backing_file(&e, "d", 2 * MiB, 8, &fd, &data);
	CHECK_EQ(cache_file_pin(e.c, f, 1, &r), 0);
	warm(&e, f, 2 * MiB);
	cache_room(e.c, &r);
	CHECK_EQ(r.npinned, 1);
	fstat(fd, &st);
	cache_file_put(e.c, f);
	close(fd);
	CHECK_EQ(unlinkat(e.backing_fd, "d", 0), 0);
	cache_file_unlinked(e.c, st.st_dev, st.st_ino, 1);
	cache_room(e.c, &r);
	CHECK_EQ(r.npinned, 0);
	CHECK_EQ(r.pinned, 0);
	CHECK_EQ(r.available, r.capacity);
	free(data);
	env_fini(&e);
}

/* Writes grow a pinned file past the cap: other writers still get space
 * (PRODUCT §4.5), from what the pinned file holds past the cap. */
static void test_pinned_growth_past_cap(void)
{
	struct env e;
	struct cache_room r;
	struct cfile *f, *g;
	char *data, *w = malloc(8 * MiB);
	int fd, fd2;

	env_init(&e, 64, 64 * KiB);
	f = backing_file(&e, "grow", MiB, 10, &fd, &data);
	CHECK_EQ(cache_file_pin(e.c, f, 1, &r), 0);
	/* the whole cache: without the evictor's last resort, the next
	 * writer would wait for ever */
	fill(w, 8 * MiB, 11);
	CHECK_EQ(cache_write(e.c, f, w, 8 * MiB, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK_EQ(cached(&e, f), 8 * MiB); /* clean, pinned, past the cap */
	g = file_open(&e, "other", &fd2);
	fill(w, 4 * MiB, 12);
	CHECK_EQ(cache_write(e.c, g, w, 4 * MiB, 0), 0);
	CHECK(same(&e, g, w, 4 * MiB, 0));
	CHECK(cached(&e, f) >= 4 * MiB); /* the cap's worth stays */
	cache_file_put(e.c, f);
	cache_file_put(e.c, g);
	close(fd);
	close(fd2);
	free(data);
	free(w);
	env_fini(&e);
}

/*
 * Issue 25, finding 4: another node rewrites a pinned file while a warm of
 * it persists its slots, and an open revalidates meanwhile.  The warm
 * pinned every slot without f->rw, so the revalidation, finding the change,
 * skipped them all and took the new look: the old bytes were served for
 * good.  The hook runs the open in the window and gives it time to end.
 */
struct warm_race {
	struct env *e;
	struct cfile *f;
	const char *theirs;
	size_t len;
	pthread_t t;
	int started, done;
};

static struct warm_race *race;

static void *race_open(void *arg)
{
	struct warm_race *r = arg;
	int changed;

	CHECK_EQ(cache_file_revalidate(r->e->c, r->f, NULL, &changed), 0);
	CHECK_EQ(changed, COH_CHANGED);
	__atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void race_hook(struct cache *c, struct cfile *f)
{
	struct warm_race *r = race;
	int fd, i;

	(void)c;
	if (!r || r->f != f || r->started)
		return;
	r->started = 1;
	fd = openat(r->e->backing_fd, "p", O_WRONLY);
	CHECK(fd >= 0);
	CHECK_EQ(pwrite(fd, r->theirs, r->len, 0), (ssize_t)r->len);
	CHECK_EQ(fsync(fd), 0);
	close(fd);
	CHECK_EQ(pthread_create(&r->t, NULL, race_open, r), 0);
	for (i = 0; i < 100 && !__atomic_load_n(&r->done, __ATOMIC_ACQUIRE);
	     i++)
		usleep(2000);
}

static void test_warm_of_pinned_changed_elsewhere(void)
{
	struct warm_race r = { 0 };
	struct cache_room room;
	struct env e;
	struct cfile *f;
	char *ours, *theirs = malloc(MiB + 64 * KiB);
	int fd, changed;

	env_init(&e, 64, 64 * KiB);
	f = backing_file(&e, "p", MiB, 13, &fd, &ours);
	CHECK_EQ(cache_file_pin(e.c, f, 1, &room), 0);
	fill(theirs, MiB + 64 * KiB, 14); /* longer: the look differs */
	r.e = &e;
	r.f = f;
	r.theirs = theirs;
	r.len = MiB + 64 * KiB;
	race = &r;
	e.c->test_pin_persist = race_hook;
	warm(&e, f, MiB);
	CHECK(r.started);
	CHECK_EQ(pthread_join(r.t, NULL), 0);
	e.c->test_pin_persist = NULL;
	race = NULL;
	CHECK(same(&e, f, theirs, MiB + 64 * KiB, 0));
	/* and at every later open */
	CHECK_EQ(cache_file_revalidate(e.c, f, NULL, &changed), 0);
	CHECK(same(&e, f, theirs, MiB + 64 * KiB, 0));
	cache_file_put(e.c, f);
	close(fd);
	free(ours);
	free(theirs);
	env_fini(&e);
}

int main(void)
{
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_pin_survives_reopen_and_crash);
	RUN(test_evict_leaves_no_clean_slot);
	RUN(test_warm_admits_past_cutoff);
	RUN(test_max_pinned);
	RUN(test_pinned_deleted);
	RUN(test_pinned_growth_past_cap);
	RUN(test_warm_of_pinned_changed_elsewhere);
	return CHECK_DONE();
}
