/* tests: which metadata header is current (meta_current), and the older one
 * brought up to date whole at attach, after a crash between the two persists
 * of a header write. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "env.h"

#define BS (64 * KiB)
#define PER_DEV 8

/* The rule itself: stale marks first, then the larger generation, mirror 0
 * on a tie. */
static void test_current_rule(void)
{
	struct meta_hdr a, b;
	const struct meta_hdr *h[2] = { &a, &b };
	int both[2] = { 1, 1 }, only1[2] = { 0, 1 }, none[2] = { 0, 0 };

	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	CHECK_EQ(meta_current(h, both), 0); /* equal: mirror 0 */
	b.gen = 7;
	CHECK_EQ(meta_current(h, both), 1); /* mirror 1 written alone since */
	a.gen = 8;
	CHECK_EQ(meta_current(h, both), 0); /* torn write: mirror 0 ahead */
	b.failed = 1; /* mirror 1 calls mirror 0 stale: whatever its gen */
	CHECK_EQ(meta_current(h, both), 1);
	a.failed = 2; /* and mirror 0 calls mirror 1 stale too */
	CHECK_EQ(meta_current(h, both), -EUCLEAN);
	CHECK_EQ(meta_current(h, only1), 1);
	CHECK_EQ(meta_current(h, none), -ENODATA);
}

/* A remove's mark written into mirror 0, the crash before mirror 1: the
 * next attach makes mirror 1's header mirror 0's, every field (it took only
 * the member set before), so that losing mirror 0 later loses nothing. */
static void test_torn_write_reconciled(void)
{
	struct meta_hdr old1;
	struct meta m;
	struct env e;
	char err[512];
	uint8_t removed[NVC_MAX_DEVS] = { 0 };

	env_format(&e, PER_DEV, BS, NULL);
	CHECK_EQ(meta_attach(&m, e.mirrors, err, sizeof(err)), 0);
	memcpy(&old1, hdr(&e, 1), sizeof(old1));
	CHECK_EQ(meta_set_removing(&m, 2), 0);
	removed[1] = 1;
	CHECK_EQ(meta_set_removed(&m, removed), 0);
	CHECK(hdr(&e, 0)->gen == hdr(&e, 1)->gen && hdr(&e, 0)->gen >= 2);
	memcpy(hdr(&e, 1), &old1, sizeof(old1)); /* the crash */
	CHECK(hdr(&e, 0)->gen > hdr(&e, 1)->gen);

	CHECK_EQ(meta_attach(&m, e.mirrors, err, sizeof(err)), 0);
	CHECK_EQ(hdr(&e, 1)->removing, 2u);
	CHECK_EQ(hdr(&e, 1)->removed[1], 1);
	CHECK(hdr(&e, 1)->gen == hdr(&e, 0)->gen);
	CHECK_EQ(hdr(&e, 1)->mirror, 1u);
	CHECK_EQ(meta_hdr_check(hdr(&e, 1), e.mlen, NULL), 0);

	/* mirror 0 lost: mirror 1 alone says the same */
	memset(hdr(&e, 0), 0, META_HDR_SIZE);
	CHECK_EQ(meta_attach(&m, e.mirrors, err, sizeof(err)), 0);
	CHECK_EQ(meta_removing(&m), 2u);
	meta_removed(&m, removed);
	CHECK_EQ(removed[1], 1);
	env_fini(&e);
}

/* A header write while mirror 0 had failed goes to mirror 1 alone, which
 * marks mirror 0 stale: at the next attach mirror 1 is current and mirror
 * 0 is rebuilt from it, although mirror 0's header is valid and was written
 * first. */
static void test_stale_mirror0_not_current(void)
{
	struct meta_hdr old0;
	struct meta m;
	struct env e;
	char err[512];
	uint8_t members[NVC_MAX_DEVS][16];

	env_format(&e, PER_DEV, BS, NULL);
	CHECK_EQ(meta_attach(&m, e.mirrors, err, sizeof(err)), 0);
	memcpy(&old0, hdr(&e, 0), sizeof(old0));
	/* as meta_fail leaves it: mirror 0 no longer written, marked stale */
	m.failed[0] = 1;
	hdr(&e, 1)->failed = 1;
	hdr_seal(&e);
	meta_members(&m, members);
	members[1][0] ^= 0xff; /* a replace of member 2 */
	CHECK_EQ(meta_set_members(&m, members), 0);
	CHECK(!memcmp(hdr(&e, 0), &old0, sizeof(old0)));
	CHECK(!memcmp(hdr(&e, 1)->members[1], members[1], 16));
	{
		const struct meta_hdr *h[2] = { hdr(&e, 0), hdr(&e, 1) };
		int both[2] = { 1, 1 };

		CHECK_EQ(meta_current(h, both), 1);
	}
	CHECK_EQ(meta_attach(&m, e.mirrors, err, sizeof(err)), 0);
	CHECK(!memcmp(hdr(&e, 0)->members[1], members[1], 16));
	CHECK_EQ(m.rebuilt[0], 1);
	env_fini(&e);
}

static const struct {
	const char *name;
	void (*fn)(void);
} tests[] = {
	{ "test_current_rule", test_current_rule },
	{ "test_torn_write_reconciled", test_torn_write_reconciled },
	{ "test_stale_mirror0_not_current", test_stale_mirror0_not_current },
};

int main(int argc, char **argv)
{
	size_t t;
	int a;

	log_setup(LOG_TO_STDERR);
	for (t = 0; t < sizeof(tests) / sizeof(tests[0]); t++) {
		int before = check_failures, run = argc < 2;

		for (a = 1; a < argc; a++)
			run |= !strcmp(argv[a], tests[t].name);
		if (!run)
			continue;
		tests[t].fn();
		printf("%s %s\n", check_failures == before ? "ok  " : "FAIL",
		       tests[t].name);
		fflush(stdout);
	}
	return CHECK_DONE();
}
