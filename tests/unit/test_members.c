/* tests: a cache's devices are taken by identity (members_pick): listed in
 * any order they are put back in member order; a former member, a blank
 * device and another cache's are not taken; a copied device and a damaged
 * member table are refused, naming what is wrong. */
#define _GNU_SOURCE
#include "env.h"

#include <sys/random.h>

#define BS (64 * KiB)
#define PER_DEV 64

static void swap_devs(struct env *e)
{
	struct dev *t = e->devs[0];

	e->devs[0] = e->devs[1];
	e->devs[1] = t;
}

/* The two devices in member order, as members_open puts them (a header
 * with no member table: the listed order, as cache_open keeps it); kof
 * gets each listed device's verdict.  0 or -errno with e->err. */
static int pick(struct env *e, struct dev **devs, int kof[2])
{
	struct dev *out[NVC_MAX_DEVS];
	int ret;

	e->err[0] = 0;
	if (!members_recorded(hdr(e, 0)))
		return 0;
	ret = members_pick(hdr(e, 0), devs, 2, out, kof, e->err,
			   sizeof(e->err));
	if (!ret)
		memcpy(devs, out, 2 * sizeof(*devs));
	return ret;
}

static int order(struct env *e)
{
	int kof[2];

	return pick(e, e->devs, kof);
}

static void expect_err(struct env *e, int ret, const char *what)
{
	CHECK(ret < 0);
	printf("  refused: %s\n", e->err);
	if (!strstr(e->err, what)) {
		fprintf(stderr, "  error '%s' does not name '%s'\n", e->err,
			what);
		CHECK(strstr(e->err, what));
	}
}

/* Format writes a distinct UUID per device, recorded in member order. */
static void test_format_records_members(void)
{
	struct env e;
	struct sb_disk sb;
	int i;

	env_format(&e, PER_DEV, BS, NULL);
	CHECK(members_recorded(hdr(&e, 0)));
	CHECK(memcmp(hdr(&e, 0)->members[0], hdr(&e, 0)->members[1], 16));
	CHECK_EQ(memcmp(hdr(&e, 0)->members, hdr(&e, 1)->members,
			sizeof(hdr(&e, 0)->members)),
		 0);
	for (i = 0; i < 2; i++) {
		CHECK_EQ(sb_read(e.devs[i], &sb), 0);
		CHECK_EQ(memcmp(sb.dev_uuid, hdr(&e, 0)->members[i], 16), 0);
	}
	env_fini(&e);
}

/*
 * Devices listed in the other order (loop devices renumbered at boot): the
 * data written before is read back, and dirty data destages to its files.
 * Without members the open refused ("formatted as device 2 of 2").
 */
static void test_swapped_devices_taken_by_identity(void)
{
	size_t size = 2 * MiB + 777;
	char *ref = malloc(size);
	struct cfile *f;
	struct dev *d0;
	struct env e;
	int fd;

	env_init(&e, PER_DEV, BS);
	d0 = e.devs[0];
	f = file_open(&e, "a", &fd);
	fill(ref, size, 3);
	CHECK_EQ(cache_write(e.c, f, ref, size, 0), 0);
	cache_file_put(e.c, f);
	cache_abandon(e.c); /* kill -9: all of it dirty in the cache */
	e.c = NULL;
	close(fd);

	swap_devs(&e);
	CHECK_EQ(order(&e), 0);
	CHECK(e.devs[0] == d0); /* member 0 back at index 0 */
	env_open(&e);
	f = file_open(&e, "a", &fd);
	CHECK(same(&e, f, ref, size, 0));
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(backing_same(fd, ref, size));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(ref);
}

/* Without ordering, the swapped devices are refused by their indexes: the
 * check finding by identity makes unnecessary is still there for old
 * headers. */
static void test_swapped_refused_without_members(void)
{
	struct env e;
	int i;

	env_format(&e, PER_DEV, BS, NULL);
	for (i = 0; i < 2; i++)
		memset(hdr(&e, i)->members, 0, sizeof(hdr(&e, i)->members));
	hdr_seal(&e);
	swap_devs(&e);
	CHECK_EQ(order(&e), 0); /* no members recorded: listed order kept */
	CHECK(env_try_open(&e) < 0);
	printf("  refused: %s\n", e.err);
	CHECK(strstr(e.err, "formatted as device"));
	swap_devs(&e);
	CHECK_EQ(env_try_open(&e), 0); /* and in the right order it opens */
	env_fini(&e);
}

/* A device with no superblock (blank, or a stand-in for one that could not
 * be opened) is no member: the member it stood for is not found, and the
 * other member is placed at its own index. */
static void test_missing_member_left_out(void)
{
	struct dev *listed[2], *blank;
	struct env e;
	int kof[2];

	env_format(&e, PER_DEV, BS, NULL);
	CHECK_EQ(dev_mem_create(SB_DATA_OFF + PER_DEV * BS, &blank), 0);
	/* listed: member 2's device, then the blank one */
	listed[0] = e.devs[1];
	listed[1] = blank;
	CHECK_EQ(pick(&e, listed, kof), 0);
	CHECK(listed[0] == NULL);
	CHECK(listed[1] == e.devs[1]);
	CHECK_EQ(kof[0], 1);
	CHECK_EQ(kof[1], -1);
	dev_close(blank);
	env_fini(&e);
}

/* A member replaced (its UUID no longer in the header) is a former member:
 * never taken, whatever name it has. */
static void test_former_member_not_taken(void)
{
	struct dev *listed[2];
	struct env e;
	int i, kof[2];

	env_format(&e, PER_DEV, BS, NULL);
	for (i = 0; i < 2; i++)
		hdr(&e, i)->members[1][0] ^= 0x5a;
	hdr_seal(&e);
	listed[0] = e.devs[0];
	listed[1] = e.devs[1];
	CHECK_EQ(pick(&e, listed, kof), 0);
	CHECK(listed[0] == e.devs[0]);
	CHECK(listed[1] == NULL);
	CHECK_EQ(kof[1], -2);
	env_fini(&e);
}

/* Two devices with one member's superblock: one is a copy. */
static void test_copied_device_refused(void)
{
	struct env e;
	struct sb_disk sb;

	env_format(&e, PER_DEV, BS, NULL);
	CHECK_EQ(sb_read(e.devs[0], &sb), 0);
	CHECK_EQ(sb_write(e.devs[1], &sb), 0);
	expect_err(&e, order(&e), "both carry the identity of member 1");
	env_fini(&e);
}

/* A device of another cache is no member: not taken. */
static void test_foreign_device_not_taken(void)
{
	struct dev *listed[2];
	struct env e, o;
	int kof[2];

	env_format(&e, PER_DEV, BS, NULL);
	env_format(&o, PER_DEV, BS, NULL);
	listed[0] = e.devs[0];
	listed[1] = o.devs[0];
	CHECK_EQ(pick(&e, listed, kof), 0);
	CHECK(listed[0] == e.devs[0]);
	CHECK(listed[1] == NULL);
	CHECK_EQ(kof[1], -1);
	env_fini(&e);
	env_fini(&o);
}

/* A damaged member table (checksum good) is refused by the header check. */
static void test_member_table_fields(void)
{
	struct env e;
	char why[256];
	int i;

	env_format(&e, PER_DEV, BS, NULL);
	for (i = 0; i < 2; i++)
		memcpy(hdr(&e, i)->members[1], hdr(&e, i)->members[0], 16);
	hdr_seal(&e);
	CHECK(meta_hdr_why(hdr(&e, 0), e.mirrors[0].len, NULL, why,
			   sizeof(why)) < 0);
	printf("  refused: %s\n", why);
	CHECK(strstr(why, "member"));
	env_fini(&e);

	env_format(&e, PER_DEV, BS, NULL);
	for (i = 0; i < 2; i++)
		CHECK_EQ(getrandom(hdr(&e, i)->members[5], 16, 0), 16);
	hdr_seal(&e);
	CHECK(meta_hdr_why(hdr(&e, 0), e.mirrors[0].len, NULL, why,
			   sizeof(why)) < 0);
	printf("  refused: %s\n", why);
	CHECK(strstr(why, "entry 5"));
	env_fini(&e);
}

static const struct {
	const char *name;
	void (*fn)(void);
} tests[] = {
	{ "test_format_records_members", test_format_records_members },
	{ "test_swapped_devices_taken_by_identity",
	  test_swapped_devices_taken_by_identity },
	{ "test_swapped_refused_without_members",
	  test_swapped_refused_without_members },
	{ "test_missing_member_left_out", test_missing_member_left_out },
	{ "test_former_member_not_taken", test_former_member_not_taken },
	{ "test_copied_device_refused", test_copied_device_refused },
	{ "test_foreign_device_not_taken", test_foreign_device_not_taken },
	{ "test_member_table_fields", test_member_table_fields },
};

int main(int argc, char **argv)
{
	size_t t;
	int a;

	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB);
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
