/* tests: a metadata mirror replaced while the cache runs (meta_replace): the
 * new region is a copy, takes the records written after, and a reopen from
 * it alone finds every byte; a region too small, or nothing to copy from,
 * changes nothing; a mirror replace resumed at mount writes only to the place
 * it claimed. */
#define _GNU_SOURCE
#include "env.h"
#include "../../cache/mngt/mngt.h"

#include <limits.h>

#define BS (64 * KiB)
#define PER_DEV 64

static int records_same(struct meta *m)
{
	uint64_t total = meta_total_len(m->nslots, m->nfiles, m->block_size);

	return !memcmp((char *)m->r[0].addr + META_HDR_SIZE,
		       (char *)m->r[1].addr + META_HDR_SIZE,
		       total - META_HDR_SIZE);
}

static void test_replace_then_reopen_from_it(void)
{
	size_t size = 2 * MiB + 300;
	char *ref = malloc(size);
	struct pm_region nr, old;
	struct cfile *f;
	struct env e;
	int fd;

	env_init(&e, PER_DEV, BS);
	f = file_open(&e, "a", &fd);
	fill(ref, MiB, 1);
	CHECK_EQ(cache_write(e.c, f, ref, MiB, 0), 0);
	CHECK_EQ(pm_mem_create(e.mlen, &nr), 0);
	CHECK_EQ(meta_replace(&e.c->meta, 1, &nr, &old), 0);
	CHECK(old.addr == e.mirrors[1].addr);
	CHECK(e.c->meta.r[1].addr == nr.addr);
	CHECK(records_same(&e.c->meta));
	/* written after: into both, the new one included */
	fill(ref + MiB, size - MiB, 2);
	CHECK_EQ(cache_write(e.c, f, ref + MiB, size - MiB, MiB), 0);
	CHECK(records_same(&e.c->meta));
	cache_file_put(e.c, f);
	close(fd);
	cache_abandon(e.c); /* kill -9 */
	e.c = NULL;
	pm_unmap(&old);
	/* the new mirror alone: mirror 0 is lost (zeroed) */
	memset(e.mirrors[0].addr, 0, e.mlen);
	e.mirrors[1] = nr;
	env_open(&e);
	f = file_open(&e, "a", &fd);
	CHECK(same(&e, f, ref, size, 0));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
}

static void test_replace_refused_changes_nothing(void)
{
	struct pm_region nr, old;
	struct env e;
	void *before;

	env_init(&e, PER_DEV, BS);
	before = e.c->meta.r[1].addr;
	CHECK_EQ(pm_mem_create(META_HDR_SIZE, &nr), 0);
	CHECK_EQ(meta_replace(&e.c->meta, 1, &nr, &old), -ENOSPC);
	CHECK(e.c->meta.r[1].addr == before && e.c->meta.have[1]);
	pm_unmap(&nr);
	/* nothing to copy from: mirror 0 not usable */
	CHECK_EQ(pm_mem_create(e.mlen, &nr), 0);
	e.c->meta.have[0] = 0;
	CHECK_EQ(meta_replace(&e.c->meta, 1, &nr, &old), -ENODATA);
	CHECK(e.c->meta.r[1].addr == before);
	e.c->meta.have[0] = 1;
	pm_unmap(&nr);
	env_fini(&e);
}

/* A file put at p (its first bytes what), of len bytes, through a second
 * name, so that it is another inode than any file p held before. */
static void put_file(const char *p, size_t len, const char *what)
{
	char tmp[PATH_MAX + 8];
	int fd;

	snprintf(tmp, sizeof(tmp), "%s.tmp", p);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
	CHECK(fd >= 0);
	CHECK_EQ(pwrite(fd, what, strlen(what), 0), (ssize_t)strlen(what));
	CHECK_EQ(ftruncate(fd, len), 0);
	close(fd);
	CHECK_EQ(rename(tmp, p), 0);
}

static int holds(const char *p, const char *what)
{
	char buf[64] = "";
	int fd = open(p, O_RDONLY);

	if (fd < 0)
		return 0;
	CHECK(pread(fd, buf, sizeof(buf) - 1, 0) >= 0);
	close(fd);
	return !strncmp(buf, what, strlen(what));
}

/* A mirror replace recorded (cut short) and another file at its place
 * since, not one the replace made: the resumed replace writes nothing
 * there, unlinks nothing, and the replace stays recorded. */
static void test_resumed_mirror_replace_spares_a_file_not_its_own(void)
{
	static const char what[] = "someone else's file";
	char p[PATH_MAX], err[768], rec[256];
	struct env e;

	env_init(&e, PER_DEV, BS);
	snprintf(p, sizeof(p), "%s/new-m1", e.dir);
	CHECK_EQ(meta_set_mirror_replacing(&e.c->meta, 2, p), 0);
	put_file(p, e.mlen, what);
	CHECK(mirror_replace(e.c, "m1", p, 1, err, sizeof(err)) != 0);
	CHECK(holds(p, what));
	CHECK_EQ(meta_mirror_replacing(&e.c->meta, rec), 2);
	CHECK(!strcmp(e.c->cfg->meta_paths[1], "m1"));
	env_fini(&e);
}

/* The place a mirror replace claimed and recorded (then a kill -9): the
 * resumed replace proves it and finishes there; a file of the same size
 * put there since is refused. */
static void test_resumed_mirror_replace_proves_its_place(void)
{
	static const char what[] = "not a mirror";
	char p[PATH_MAX], err[768], rec[256], *was;
	struct pm_region nr;
	struct meta_ident id;
	struct env e;

	env_init(&e, PER_DEV, BS);
	snprintf(p, sizeof(p), "%s/new-m1", e.dir);
	CHECK_EQ(pm_map(p, e.mlen, PM_NEW, &nr), 0);
	CHECK_EQ(devid_claim_place(e.c, &nr, &id), 0);
	CHECK_EQ(meta_set_mirror_id(&e.c->meta, &id), 0);
	CHECK_EQ(meta_set_mirror_replacing(&e.c->meta, 2, p), 0);
	pm_unmap(&nr);
	put_file(p, e.mlen, what); /* another inode, the same size */
	CHECK_EQ(mirror_replace(e.c, "m1", p, 1, err, sizeof(err)), -ESTALE);
	CHECK(holds(p, what));
	CHECK_EQ(meta_mirror_replacing(&e.c->meta, rec), 2);
	/* the claimed place back, as the replace left it */
	CHECK_EQ(unlink(p), 0);
	CHECK_EQ(pm_map(p, e.mlen, PM_NEW, &nr), 0);
	CHECK_EQ(devid_claim_place(e.c, &nr, &id), 0);
	CHECK_EQ(meta_set_mirror_id(&e.c->meta, &id), 0);
	pm_unmap(&nr);
	was = e.cfg.meta_paths[1]; /* kept allocated by the replace */
	CHECK_EQ(mirror_replace(e.c, "m1", p, 1, err, sizeof(err)), 0);
	if (e.cfg.meta_paths[1] != was)
		free(was);
	CHECK_EQ(meta_mirror_replacing(&e.c->meta, rec), 0);
	CHECK(!strcmp(e.c->cfg->meta_paths[1], p));
	CHECK(records_same(&e.c->meta));
	e.mirrors[1] = e.c->meta.r[1]; /* the file's region, unmapped last */
	env_fini(&e);
}

static const struct {
	const char *name;
	void (*fn)(void);
} tests[] = {
	{ "test_replace_then_reopen_from_it",
	  test_replace_then_reopen_from_it },
	{ "test_replace_refused_changes_nothing",
	  test_replace_refused_changes_nothing },
	{ "test_resumed_mirror_replace_spares_a_file_not_its_own",
	  test_resumed_mirror_replace_spares_a_file_not_its_own },
	{ "test_resumed_mirror_replace_proves_its_place",
	  test_resumed_mirror_replace_proves_its_place },
};

int main(int argc, char **argv)
{
	size_t t;
	int a;

	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	for (t = 0; t < sizeof(tests) / sizeof(tests[0]); t++) {
		int before = check_failures, run = argc < 2;

		for (a = 1; a < argc; a++)
			run |= !strcmp(argv[a], tests[t].name);
		if (!run)
			continue;
		tests[t].fn();
		printf("%s %s\n", check_failures == before ? "ok  " : "FAIL",
		       tests[t].name);
	}
	return check_failures ? 1 : 0;
}
