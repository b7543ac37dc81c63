/* tests: a metadata mirror replaced while the cache runs (meta_replace): the
 * new region is a copy, takes the records written after, and a reopen from
 * it alone finds every byte; a region too small, or nothing to copy from,
 * changes nothing. */
#define _GNU_SOURCE
#include "env.h"
#include "../../cache/engine.h"

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

static const struct {
	const char *name;
	void (*fn)(void);
} tests[] = {
	{ "test_replace_then_reopen_from_it",
	  test_replace_then_reopen_from_it },
	{ "test_replace_refused_changes_nothing",
	  test_replace_refused_changes_nothing },
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
