/* tests: a metadata mirror that fails its writes while mounted is dropped,
 * the cache goes on with the other, and nothing is lost or misplaced after a
 * restart, even when the failed mirror reads back its stale records (issue 9,
 * defect 2). */
#define _GNU_SOURCE
#include "env.h"

/*
 * A mirror fails its writes: from now on nothing written to it reaches the
 * media (the code under test may still copy into the mapping; what it reads
 * back after the crash is what the media kept).
 */
static char *kept[2];

static void mirror_break(struct env *e, int k)
{
	kept[k] = malloc(e->mlen);
	memcpy(kept[k], e->mirrors[k].addr, e->mlen);
	e->mirrors[k].faults->fail_write = -EIO;
}

static void mirror_back(struct env *e, int k)
{
	memcpy(e->mirrors[k].addr, kept[k], e->mlen);
	free(kept[k]);
	kept[k] = NULL;
	e->mirrors[k].faults->fail_write = 0;
}

/*
 * File A's clean blocks are evicted for file B while mirror k fails every
 * write: B's writes must succeed (one mirror is enough), and after a crash,
 * with mirror k readable again and holding A's old entries, A must read A's
 * bytes and B B's.
 */
static void mirror_fails(int k)
{
	struct env e;
	size_t size = 2 * MiB;
	char *a_ref = malloc(size), *b_ref = malloc(size);
	struct cfile *a, *b;
	int fa, fb;

	env_init(&e, 16, 64 * KiB); /* 32 slots: 2 MiB */
	a = file_open(&e, "a", &fa);
	b = file_open(&e, "b", &fb);
	fill(a_ref, size, 1);
	CHECK_EQ(cache_write(e.c, a, a_ref, size, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0); /* A clean, every slot */
	mirror_break(&e, k);
	fill(b_ref, size, 2);
	CHECK_EQ(cache_write(e.c, b, b_ref, size, 0), 0); /* evicts A */
	CHECK_EQ(cache_fsync(e.c, b), 0);
	CHECK(same(&e, b, b_ref, size, 0));
	cache_snapshot(e.c, &snap); /* shown as failed, the other as ok */
	CHECK_EQ(snap.mirror_state[k], STAT_MIRROR_FAILED);
	CHECK_EQ(snap.mirror_state[!k], STAT_MIRROR_OK);
	cache_file_put(e.c, a);
	cache_file_put(e.c, b);
	cache_abandon(e.c); /* the power goes */
	e.c = NULL;
	close(fa);
	close(fb);
	mirror_back(&e, k); /* the failed mirror reads again */
	env_open(&e);
	a = file_open(&e, "a", &fa);
	b = file_open(&e, "b", &fb);
	CHECK(same(&e, a, a_ref, size, 0));
	CHECK(same(&e, b, b_ref, size, 0));
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(backing_same(fa, a_ref, size));
	CHECK(backing_same(fb, b_ref, size));
	/* the stale mirror was rebuilt from the good one */
	CHECK(!memcmp((char *)e.mirrors[0].addr + META_HDR_SIZE,
		      (char *)e.mirrors[1].addr + META_HDR_SIZE,
		      e.mlen - META_HDR_SIZE));
	cache_file_put(e.c, a);
	cache_file_put(e.c, b);
	close(fa);
	close(fb);
	env_fini(&e);
	free(a_ref);
	free(b_ref);
}

static void test_mirror0_fails_while_mounted(void)
{
	mirror_fails(0);
}

static void test_mirror1_fails_while_mounted(void)
{
	mirror_fails(1);
}

/* Both mirrors fail: writes get an error, and no slot is reused while the
 * media may still map it: after a restart every file reads its own bytes. */
static void test_both_mirrors_fail(void)
{
	struct env e;
	size_t size = 2 * MiB;
	char *a_ref = malloc(size), *b_ref = malloc(size);
	struct cfile *a, *b;
	int fa, fb, k, r;
	uint64_t off;

	env_init(&e, 16, 64 * KiB);
	a = file_open(&e, "a", &fa);
	b = file_open(&e, "b", &fb);
	fill(a_ref, size, 3);
	CHECK_EQ(cache_write(e.c, a, a_ref, size, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	for (k = 0; k < 2; k++)
		mirror_break(&e, k);
	fill(b_ref, size, 4);
	for (off = 0; off < size; off += 64 * KiB) {
		r = cache_write(e.c, b, b_ref + off, 64 * KiB, off);
		CHECK(r == 0 || r == -EIO);
	}
	cache_file_put(e.c, a);
	cache_file_put(e.c, b);
	cache_abandon(e.c);
	e.c = NULL;
	close(fa);
	close(fb);
	for (k = 0; k < 2; k++)
		mirror_back(&e, k);
	env_open(&e);
	a = file_open(&e, "a", &fa);
	CHECK(same(&e, a, a_ref, size, 0));
	cache_file_put(e.c, a);
	close(fa);
	env_fini(&e);
	free(a_ref);
	free(b_ref);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_mirror0_fails_while_mounted);
	RUN(test_mirror1_fails_while_mounted);
	RUN(test_both_mirrors_fail);
	free(rbuf);
	return CHECK_DONE();
}
