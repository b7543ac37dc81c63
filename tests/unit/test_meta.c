/* tests: crafted on-media metadata (valid checksums, bad fields) is refused
 * with a clear error by the superblock and mirror loaders and by check. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "env.h"

#define BS (64 * KiB)
#define PER_DEV 8 /* slots per device */

/* The open must fail cleanly, with an error that names what is wrong. */
static void expect_refused(struct env *e, const char *what)
{
	int ret = env_try_open(e);

	CHECK(ret < 0);
	if (ret < 0)
		printf("  refused: %s\n", e->err);
	if (ret < 0 && !strstr(e->err, what)) {
		fprintf(stderr, "  error '%s' does not name '%s'\n", e->err,
			what);
		CHECK(strstr(e->err, what));
	}
	if (!ret) {
		fprintf(stderr, "  crafted metadata accepted (wanted: %s)\n",
			what);
		cache_close(e->c, 0);
		e->c = NULL;
	}
}

/* A slot entry as meta.c lays it out for a block size, checksum included. */
static void slot_raw(struct env *e, int mirror, uint64_t i, uint32_t bs,
		     uint64_t seq, uint32_t file, uint32_t flags, uint64_t blk,
		     uint64_t valid0, uint64_t dirty0)
{
	const struct meta_hdr *h = hdr(e, mirror);
	uint32_t w = meta_words(bs), size = meta_slot_size(bs);
	uint8_t *p =
		(uint8_t *)e->mirrors[mirror].addr + h->slots_off + i * size;
	uint64_t c;

	memset(p, 0, size);
	memcpy(p, &seq, 8);
	memcpy(p + 8, &file, 4);
	memcpy(p + 12, &flags, 4);
	memcpy(p + 16, &blk, 8);
	memcpy(p + 24, &valid0, 8);
	memcpy(p + 24 + 8 * w, &dirty0, 8);
	c = meta_csum(p, size - 8);
	memcpy(p + size - 8, &c, 8);
}

static struct meta_file *file_rec(struct env *e, int mirror, uint32_t i)
{
	return (struct meta_file *)((char *)e->mirrors[mirror].addr +
				    hdr(e, mirror)->files_off +
				    (uint64_t)i * META_FILE_SIZE);
}

static void file_seal(struct env *e, uint32_t i)
{
	int k;

	for (k = 0; k < 2; k++)
		file_rec(e, k, i)->csum = meta_csum(
			file_rec(e, k, i), offsetof(struct meta_file, csum));
}

/* A header block size of 2M (eight bitmap words) with a slot entry laid out
 * for it: decoding it overran meta_slot.valid. */
static void test_hdr_block_size_2m(void)
{
	struct env e;
	int i;

	env_format(&e, PER_DEV, BS, NULL);
	for (i = 0; i < 2; i++) {
		hdr(&e, i)->block_size = 2048 * KiB;
		hdr(&e, i)->slot_size = meta_slot_size(2048 * KiB);
	}
	hdr_seal(&e);
	for (i = 0; i < 2; i++)
		slot_raw(&e, i, 0, 2048 * KiB, 5, 1, 0, 0, ~0ull, ~0ull);
	expect_refused(&e, "block_size 2097152");
	env_fini(&e);
}

/* A valid block size that is not the configured one (nor the superblocks'). */
static void test_hdr_block_size_differs(void)
{
	struct env e;
	int i;

	env_format(&e, PER_DEV, BS, NULL);
	for (i = 0; i < 2; i++) {
		hdr(&e, i)->block_size = 32 * KiB;
		hdr(&e, i)->slot_size = meta_slot_size(32 * KiB);
		hdr(&e, i)->total_len = meta_total_len(
			hdr(&e, i)->room, hdr(&e, i)->nfiles, 32 * KiB);
	}
	hdr_seal(&e);
	expect_refused(&e, "block_size 32768");
	env_fini(&e);
}

/*
 * One header field made wrong in both mirrors (checksums resealed), each time
 * on a fresh cache: the open is refused, naming the field.
 */
struct spoil {
	void (*spoil)(struct meta_hdr *h, size_t len);
	const char *field; /* what the refusal must name */
};

static void spoil_each(const struct spoil *cases, unsigned n)
{
	struct env e;
	unsigned c;
	int i;

	for (c = 0; c < n; c++) {
		env_format(&e, PER_DEV, BS, NULL);
		for (i = 0; i < 2; i++)
			cases[c].spoil(hdr(&e, i), e.mirrors[i].len);
		hdr_seal(&e);
		expect_refused(&e, cases[c].field);
		env_fini(&e);
	}
}

static void nfiles_past_end(struct meta_hdr *h, size_t len)
{
	h->nfiles += 4096; /* more records than the mirror holds */
}

static void slots_off_past_end(struct meta_hdr *h, size_t len)
{
	h->slots_off = len - 64; /* slot entries past the mirror's end */
}

static void files_off_overlaps(struct meta_hdr *h, size_t len)
{
	h->files_off = 0; /* file records over the header */
}

static void ndevs_differs(struct meta_hdr *h, size_t len)
{
	h->ndevs = 4; /* the configuration and superblocks say two */
	h->stripe_devs = 4; /* all four in the stripe: a valid layout */
}

/* the identity probe's result (ident.c): a namespace past META_NS_NONE,
 * flags without a namespace, an unknown flag */
static void probe_ns_unknown(struct meta_hdr *h, size_t len)
{
	h->probe = META_NS_NONE + 1;
}

static void probe_flags_alone(struct meta_hdr *h, size_t len)
{
	h->probe = META_PROBE_HANDLES;
}

static void probe_flag_unknown(struct meta_hdr *h, size_t len)
{
	h->probe = META_NS_USER | 0x400;
}

static void test_hdr_fields(void)
{
	static const struct spoil cases[] = {
		{ nfiles_past_end, "nfiles" },
		{ slots_off_past_end, "slots_off" },
		{ files_off_overlaps, "files_off" },
		{ ndevs_differs, "ndevs" },
		{ probe_ns_unknown, "probe" },
		{ probe_flags_alone, "probe" },
		{ probe_flag_unknown, "probe" },
	};

	spoil_each(cases, sizeof(cases) / sizeof(cases[0]));
}

/* The layout fields (meta.h): each made wrong in both mirrors is refused,
 * naming it. */
static void grown_on_stripe_member(struct meta_hdr *h, size_t len)
{
	h->grown[0] = 2; /* member 1 is in the stripe */
	h->nslots += 2;
}

static void no_stripe(struct meta_hdr *h, size_t len)
{
	h->stripe_devs = 0;
}

static void room_past_mirror(struct meta_hdr *h, size_t len)
{
	h->room = len; /* entries of 64 bytes or more: past the end */
	h->total_len = meta_total_len(h->room, h->nfiles, h->block_size);
}

static void room_below_nslots(struct meta_hdr *h, size_t len)
{
	h->room = h->nslots - 1;
	h->total_len = meta_total_len(h->room, h->nfiles, h->block_size);
}

static void v2_with_room(struct meta_hdr *h, size_t len)
{
	h->version = META_VERSION_V2; /* which has no layout fields */
}

static void grown_too_few(struct meta_hdr *h, size_t len)
{
	h->ndevs = 3; /* member 3 grown, but with no slots */
	memset(h->members[2], 7, 16);
}

static void test_hdr_layout_fields(void)
{
	static const struct spoil cases[] = {
		{ grown_on_stripe_member, "grown[0]" },
		{ no_stripe, "stripe_devs 0" },
		{ room_past_mirror, "header room" },
		{ room_below_nslots, "header room" },
		{ v2_with_room, "version 2 header with layout fields set" },
		{ grown_too_few, "grown[2] is 0" },
	};

	spoil_each(cases, sizeof(cases) / sizeof(cases[0]));
}

/* A header of version 2 (no layout fields: every member in the stripe, no
 * room to grow) still opens and checks clean; a grow is refused for want of
 * room. */
static void test_v2_header_opens(void)
{
	struct env e;
	struct dev *nd;
	int i;

	env_format(&e, PER_DEV, BS, NULL);
	for (i = 0; i < 2; i++) {
		struct meta_hdr *h = hdr(&e, i);

		h->version = META_VERSION_V2;
		h->stripe_devs = 0;
		h->room = 0;
		h->total_len = meta_total_len(h->nslots, h->nfiles, BS);
	}
	hdr_seal(&e);
	CHECK_EQ(env_try_open(&e), 0);
	if (e.c) {
		CHECK_EQ(dev_mem_create(SB_DATA_OFF + PER_DEV * BS, &nd), 0);
		CHECK_EQ(cache_add_dev_with(e.c, nd, e.err, sizeof(e.err)),
			 -ENOSPC);
		CHECK(strstr(e.err, "no room for more slots"));
		dev_close(nd);
		cache_close(e.c, 0);
		e.c = NULL;
	}
	CHECK_EQ(fmt_check_open(&e.cfg, e.devs, e.cfg.ndevs, e.mirrors, stdout, 0), 0);
	env_fini(&e);
}

/* A slot count whose entries would wrap 64 bits, with superblocks to match. */
static void test_hdr_nslots_wraps(void)
{
	struct env e;
	uint64_t per = (1ull << 58) + PER_DEV;
	int i;

	env_format(&e, PER_DEV, BS, NULL);
	for (i = 0; i < 2; i++)
		hdr(&e, i)->nslots = 2 * per;
	hdr_seal(&e);
	for (i = 0; i < 2; i++) {
		struct sb_disk sb;

		CHECK_EQ(sb_read(e.devs[i], &sb), 0);
		sb.slots_per_dev = per;
		CHECK_EQ(sb_write(e.devs[i], &sb), 0);
	}
	expect_refused(&e, "nslots");
	env_fini(&e);
}

/* Field checks of single records, at the loader: a copy with bad fields is
 * damaged, like one with a bad checksum. */
static void test_record_fields(void)
{
	struct {
		const char *what;
		uint32_t file, flags;
		uint64_t blk, valid, seq;
	} bad[] = {
		{ "file index past nfiles", 9999, 0, 0, 1, 1 },
		{ "unknown flag", 1, 0x80, 0, 1, 1 },
		{ "blk * block size wraps", 1, 0, 1ull << 48, 1, 1 },
		{ "page past the block valid", 1, 0, 0, 1ull << 20, 1 },
		{ "seq at the top", 1, 0, 0, 1, ~0ull },
	};
	struct env e;
	struct meta m;
	struct meta_slot ms;
	struct meta_file mf;
	size_t t;
	int bad_copies, i;

	env_format(&e, PER_DEV, BS, NULL);
	for (t = 0; t < sizeof(bad) / sizeof(bad[0]); t++) {
		for (i = 0; i < 2; i++)
			slot_raw(&e, i, 1, BS, bad[t].seq, bad[t].file,
				 bad[t].flags, bad[t].blk, bad[t].valid, 0);
		CHECK_EQ(meta_attach_ro(&m, e.mirrors, e.err, sizeof(e.err)),
			 0);
		if (meta_get_slot(&m, 1, &ms, &bad_copies)) {
			fprintf(stderr, "  slot with %s accepted\n",
				bad[t].what);
			CHECK(0);
		}
	}
	/* file records: handle size, flags, size, seq */
	for (t = 0; t < 4; t++) {
		for (i = 0; i < 2; i++) {
			struct meta_file *f = file_rec(&e, i, 2);

			memset(f, 0, sizeof(*f));
			f->flags = MF_USED;
			f->handle_bytes = 8;
			f->seq = 3;
			if (t == 0)
				f->handle_bytes = 4000;
			else if (t == 1)
				f->flags = MF_USED | 16; /* no such flag */
			else if (t == 2)
				f->size = 1ull << 63;
			else
				f->seq = ~0ull;
		}
		file_seal(&e, 2);
		CHECK_EQ(meta_attach_ro(&m, e.mirrors, e.err, sizeof(e.err)),
			 0);
		if (meta_get_file(&m, 2, &mf, &bad_copies)) {
			fprintf(stderr, "  file record %zu accepted\n", t);
			CHECK(0);
		}
	}
	env_fini(&e);
}

/* An entry is "the same" only if every mirror in use holds exactly it: a
 * persist skipped on a wrong answer would lose a dirty bit at a crash. */
static void test_slot_same(void)
{
	struct env e;
	struct meta m;
	struct meta_slot ms = { .file = 1, .blk = 7 };

	env_format(&e, PER_DEV, BS, NULL);
	CHECK_EQ(meta_attach(&m, e.mirrors, e.err, sizeof(e.err)), 0);
	ms.valid[0] = 0xff;
	ms.dirty[0] = 0x0f;
	CHECK_EQ(meta_slot_same(&m, 3, &ms), 0);
	CHECK_EQ(meta_put_slot(&m, 3, &ms), 0);
	CHECK_EQ(meta_slot_same(&m, 3, &ms), 1);
	ms.dirty[0] = 0x1f; /* one more dirty page */
	CHECK_EQ(meta_slot_same(&m, 3, &ms), 0);
	ms.dirty[0] = 0x0f;
	ms.blk = 8;
	CHECK_EQ(meta_slot_same(&m, 3, &ms), 0);
	ms.blk = 7;
	/* one mirror differs (a torn write): not the same */
	((uint8_t *)e.mirrors[1].addr)[m.slots_off + 3 * m.slot_size + 20] ^= 1;
	CHECK_EQ(meta_slot_same(&m, 3, &ms), 0);
	env_fini(&e);
}

/*
 * meta_put_slots writes adjacent entries as one record per run: the mirrors
 * must hold byte for byte what one meta_put_slot per entry would have
 * written (same sequence numbers, checksums), and nothing between the runs.
 */
static void test_slots_runs(void)
{
	struct env a, b;
	struct meta ma, mb;
	const uint64_t idx[] = { 2, 3, 4, 6, 9, 10 };
	const int n = sizeof(idx) / sizeof(idx[0]);
	struct meta_slot sa[6], sb[6], got;
	int res[6], i, k, bad;

	env_format(&a, PER_DEV, BS, NULL);
	env_format(&b, PER_DEV, BS, NULL);
	CHECK_EQ(meta_attach(&ma, a.mirrors, a.err, sizeof(a.err)), 0);
	CHECK_EQ(meta_attach(&mb, b.mirrors, b.err, sizeof(b.err)), 0);
	for (i = 0; i < n; i++) {
		memset(&sa[i], 0, sizeof(sa[i]));
		sa[i].file = 1;
		sa[i].blk = 100 + i;
		sa[i].valid[0] = 0xffff;
		sa[i].dirty[0] = 0x3ull << i;
		sb[i] = sa[i];
		res[i] = 1;
	}
	meta_put_slots(&ma, idx, sa, n, res);
	for (i = 0; i < n; i++) {
		CHECK_EQ(res[i], 0);
		CHECK_EQ(meta_put_slot(&mb, idx[i], &sb[i]), 0);
		CHECK_EQ(sa[i].seq, sb[i].seq);
		CHECK_EQ(meta_get_slot(&ma, idx[i], &got, &bad), 1);
		CHECK_EQ(bad, 0);
		CHECK_EQ(got.blk, 100 + (uint64_t)i);
		CHECK_EQ(got.dirty[0], 0x3ull << i);
	}
	for (k = 0; k < 2; k++)
		CHECK(!memcmp((char *)a.mirrors[k].addr + ma.slots_off,
			      (char *)b.mirrors[k].addr + mb.slots_off,
			      ma.nslots * ma.slot_size));
	env_fini(&a);
	env_fini(&b);
}

/* A file record with a handle too large for the handle buffer refuses the
 * mount with the record and field named (it was dropped silently). */
static void test_file_record_refused(void)
{
	struct env e;
	int i;

	env_format(&e, PER_DEV, BS, NULL);
	for (i = 0; i < 2; i++) {
		struct meta_file *f = file_rec(&e, i, 0);

		f->flags = MF_USED;
		f->handle_bytes = 4000;
		f->ino = 12;
		f->seq = 1;
	}
	file_seal(&e, 0);
	expect_refused(&e, "handle_bytes 4000");
	env_fini(&e);
}

/* A record whose file size does not fit an off_t. */
static void test_file_size_refused(void)
{
	struct env e;
	int i;

	env_format(&e, PER_DEV, BS, NULL);
	for (i = 0; i < 2; i++) {
		struct meta_file *f = file_rec(&e, i, 0);

		f->flags = MF_USED;
		f->handle_bytes = 8;
		f->ino = 12;
		f->seq = 1;
		f->size = 1ull << 63;
	}
	file_seal(&e, 0);
	expect_refused(&e, "size 9223372036854775808");
	env_fini(&e);
}

/* The largest file the backing directory's file system holds (as the cache
 * probes it), or 0 if there is no limit below 2^63 to test with. */
static uint64_t backing_limit(int dirfd)
{
	uint64_t lo = 0, hi = INT64_MAX;
	int fd = openat(dirfd, ".", O_TMPFILE | O_RDWR, 0600);

	if (fd < 0)
		return 0;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo + 1) / 2;

		if (ftruncate(fd, mid))
			hi = mid - 1;
		else
			lo = mid;
	}
	close(fd);
	return lo < INT64_MAX ? lo : 0;
}

/* A real file's record, its size made larger than the backing file system's
 * largest file: destage could never write there, and flush would wait for
 * ever. */
static void test_file_size_past_backing(void)
{
	struct env e;
	struct cfile *f = NULL;
	uint64_t limit;
	int fd, i;

	env_format(&e, PER_DEV, BS, NULL);
	limit = backing_limit(e.backing_fd);
	if (!limit) {
		printf("  skipped: the backing file system has no size "
		       "limit\n");
		env_fini(&e);
		return;
	}
	CHECK_EQ(env_try_open(&e), 0);
	fd = openat(e.backing_fd, "a", O_RDWR | O_CREAT, 0644);
	CHECK(fd >= 0 && !cache_file_get(e.c, fd, &f));
	CHECK_EQ(cache_write(e.c, f, "data", 4, 0), 0);
	cache_file_put(e.c, f);
	close(fd);
	cache_abandon(e.c);
	e.c = NULL;
	for (i = 0; i < 2; i++) {
		CHECK(file_rec(&e, i, 0)->flags & MF_USED);
		file_rec(&e, i, 0)->size = limit + 1;
	}
	file_seal(&e, 0);
	expect_refused(&e, "past the largest file the backing file system");
	env_fini(&e);
}

/* Superblocks with a good checksum and nonsense fields, read directly. */
static void test_superblock_fields(void)
{
	const char *what[] = {
		"sb_size",    "data_off",      "dev_index",	     "ndevs",
		"block_size", "slots_per_dev", "slots_per_dev wrap",
	};
	struct env e;
	struct sb_disk sb, good;
	size_t t;

	env_format(&e, PER_DEV, BS, NULL);
	CHECK_EQ(sb_read(e.devs[1], &good), 0);
	for (t = 0; t < sizeof(what) / sizeof(what[0]); t++) {
		sb = good;
		switch (t) {
		case 0:
			sb.sb_size = 100;
			break;
		case 1:
			sb.data_off = 4096;
			break;
		case 2:
			sb.dev_index = 7;
			break;
		case 3:
			sb.ndevs = 1000;
			sb.dev_index = 900;
			break;
		case 4:
			sb.block_size = 2048 * KiB;
			break;
		case 5:
			sb.slots_per_dev = PER_DEV + 1;
			break;
		case 6:
			/* slots_per_dev * block_size wraps to 4 MiB */
			sb.slots_per_dev = (1ull << 48) + 64;
			break;
		}
		CHECK_EQ(sb_write(e.devs[1], &sb), 0);
		if (!sb_read(e.devs[1], &sb)) {
			fprintf(stderr, "  superblock with bad %s accepted\n",
				what[t]);
			CHECK(0);
		}
	}
	/* and the mount names the device and the field */
	sb = good;
	sb.ndevs = 1000;
	sb.dev_index = 900;
	CHECK_EQ(sb_write(e.devs[1], &sb), 0);
	expect_refused(&e, "ndevs 1000");
	env_fini(&e);
}

/* check reads the same crafted header without crashing, and reports it. */
static void test_check_2m_header(void)
{
	struct env e;
	char *out = NULL;
	size_t outlen = 0;
	FILE *f;
	int i;

	env_format(&e, PER_DEV, BS, NULL);
	for (i = 0; i < 2; i++) {
		hdr(&e, i)->block_size = 2048 * KiB;
		hdr(&e, i)->slot_size = meta_slot_size(2048 * KiB);
	}
	hdr_seal(&e);
	for (i = 0; i < 2; i++)
		slot_raw(&e, i, 0, 2048 * KiB, 5, 1, 0, 0, ~0ull, ~0ull);
	f = open_memstream(&out, &outlen);
	CHECK(fmt_check_open(&e.cfg, e.devs, e.cfg.ndevs, e.mirrors, f, 0) > 0);
	fclose(f);
	CHECK(out && strstr(out, "block_size 2097152"));
	free(out);
	env_fini(&e);
}

/* check names a copy refused for its fields while the other mirror stands. */
static void test_check_one_bad_copy(void)
{
	struct env e;
	char *out = NULL;
	size_t outlen = 0;
	FILE *f;

	env_format(&e, PER_DEV, BS, NULL);
	slot_raw(&e, 0, 1, BS, 7, 1, 0x80, 0, 1, 0);
	f = open_memstream(&out, &outlen);
	CHECK(fmt_check_open(&e.cfg, e.devs, e.cfg.ndevs, e.mirrors, f, 0) > 0);
	fclose(f);
	CHECK(out && strstr(out, "slot 1: mirror 0: unknown flags 0x80"));
	free(out);
	env_fini(&e);
}

/* The formatted cache itself opens: the checks refuse nothing valid. */
static void test_valid_opens(void)
{
	struct env e;
	char *out = NULL;
	size_t outlen = 0;
	FILE *f;

	env_format(&e, PER_DEV, BS, NULL);
	CHECK_EQ(env_try_open(&e), 0);
	if (e.c) {
		cache_close(e.c, 0);
		e.c = NULL;
	}
	f = open_memstream(&out, &outlen);
	CHECK_EQ(fmt_check_open(&e.cfg, e.devs, e.cfg.ndevs, e.mirrors, f, 0), 0);
	fclose(f);
	free(out);
	env_fini(&e);
}

/* every test, or only those named on the command line */
static const struct {
	const char *name;
	void (*fn)(void);
} tests[] = {
	{ "test_valid_opens", test_valid_opens },
	{ "test_hdr_block_size_differs", test_hdr_block_size_differs },
	{ "test_hdr_fields", test_hdr_fields },
	{ "test_hdr_nslots_wraps", test_hdr_nslots_wraps },
	{ "test_hdr_layout_fields", test_hdr_layout_fields },
	{ "test_v2_header_opens", test_v2_header_opens },
	{ "test_record_fields", test_record_fields },
	{ "test_file_record_refused", test_file_record_refused },
	{ "test_file_size_refused", test_file_size_refused },
	{ "test_file_size_past_backing", test_file_size_past_backing },
	{ "test_superblock_fields", test_superblock_fields },
	{ "test_check_2m_header", test_check_2m_header },
	{ "test_check_one_bad_copy", test_check_one_bad_copy },
	{ "test_hdr_block_size_2m", test_hdr_block_size_2m },
	{ "test_slot_same", test_slot_same },
	{ "test_slots_runs", test_slots_runs },
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
