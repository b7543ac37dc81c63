/* tests: the statistics module — histogram buckets, quantiles, hiccup bands,
 * shards from many threads, the wire format and interval differences. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "../../cache/base/stats.h"
#include "check.h"

static struct stat_snap a, b, d;

static void test_buckets_cover_every_value_once(void)
{
	uint64_t lo, hi, prev_hi = 0, v;
	unsigned i;

	for (i = 0; i < LAT_NBUCKETS; i++) {
		lat_bucket_range(i, &lo, &hi);
		CHECK(lo <= hi);
		if (i)
			CHECK_EQ(lo, prev_hi + 1); /* no gaps, no overlap */
		CHECK_EQ(lat_bucket(lo), i);
		CHECK_EQ(lat_bucket(hi), i);
		/* a bucket is at most 1/32 of its values wide */
		CHECK(lo < 64 || (hi - lo + 1) * 32 <= lo);
		prev_hi = hi;
	}
	/* beyond the last bucket: clamped, not out of bounds */
	CHECK_EQ(lat_bucket(UINT64_MAX), LAT_NBUCKETS - 1);
	for (v = 1; v < (1ull << 40); v = v * 3 + 1) {
		lat_bucket_range(lat_bucket(v), &lo, &hi);
		CHECK(lo <= v && v <= hi);
	}
}

static void test_hiccup_bands_are_btest_milliseconds(void)
{
	static const struct {
		uint64_t ns;
		unsigned band;
	} t[] = {
		{ 0, 0 },	  { 999999, 0 },    { 1000000, 1 },
		{ 1999999, 1 },	  { 2000000, 2 },   { 10999999, 2 },
		{ 11000000, 3 },  { 50999999, 3 },  { 51000000, 4 },
		{ 100999999, 4 }, { 101000000, 5 }, { 60000000000ull, 5 },
	};
	unsigned i;

	for (i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		CHECK_EQ(lat_hiccup(t[i].ns), t[i].band);
}

static void test_quantiles_of_a_known_distribution(void)
{
	struct lat_hist *h = calloc(1, sizeof(*h));
	uint64_t q;
	int i;

	/* 1000 samples: 1 us .. 1000 us */
	for (i = 1; i <= 1000; i++)
		lat_record(h, i * 1000ull);
	CHECK_EQ(h->count, 1000);
	CHECK_EQ(h->max_ns, 1000000);
	CHECK_EQ((uint64_t)lat_mean_ns(h), 500500);
	q = lat_quantile(h, 0.5);
	CHECK(q >= 500000 && q <= 500000 * 1.032);
	q = lat_quantile(h, 0.99);
	CHECK(q >= 990000 && q <= 990000 * 1.032);
	q = lat_quantile(h, 0.999);
	CHECK(q >= 999000 && q <= 1000000); /* never above the max */
	CHECK_EQ(lat_quantile(h, 1.0), 1000000);
	CHECK_EQ(h->hiccup[0], 999);
	CHECK_EQ(h->hiccup[1], 1);
	memset(h, 0, sizeof(*h));
	CHECK_EQ(lat_quantile(h, 0.5), 0);
	free(h);
}

static struct stat_store store;

static void *hammer(void *arg)
{
	int i;

	for (i = 0; i < 100000; i++) {
		stat_add(&store, STAT_C_read_ops, 1);
		stat_add(&store, STAT_C_read_bytes, 4096);
		lat_record(&stat_my_shard(&store)->lat[STAT_L_read],
			   1000 + i % 5000000);
		stat_dev_add(&store, 1, STAT_DC_write_ops, 1);
	}
	return arg;
}

static void test_shards_lose_nothing_under_threads(void)
{
	pthread_t t[12];
	int i;

	CHECK_EQ(stat_store_init(&store, 1), 0);
	for (i = 0; i < 12; i++)
		pthread_create(&t[i], NULL, hammer, NULL);
	for (i = 0; i < 12; i++)
		pthread_join(t[i], NULL);
	stat_collect(&store, 2, &a);
	CHECK_EQ(STAT_CTR(&a, read_ops), 1200000);
	CHECK_EQ(stat_total(&store, STAT_C_read_bytes), 1200000ull * 4096);
	CHECK_EQ(STAT_LAT(&a, read).count, 1200000);
	CHECK_EQ(STAT_LAT(&a, read).max_ns, 1000 + 99999);
	CHECK_EQ(STAT_DEV_CTR(&a, 1, write_ops), 1200000);
	CHECK_EQ(STAT_DEV_CTR(&a, 0, write_ops), 0);
	stat_reset_max(&store);
	stat_collect(&store, 2, &b);
	CHECK_EQ(STAT_LAT(&b, read).max_ns, 0);
	CHECK_EQ(STAT_LAT(&b, read).count, 1200000);
	stat_store_free(&store);
}

static void test_wire_format_round_trip_and_diff(void)
{
	char *buf = NULL, err[256];
	char bad[] = "c read_ops 12\nl write 1 2 3 0 0 0 0 0 0 99999:1\nend\n";
	size_t len = 0;
	FILE *f;
	int i;

	memset(&a, 0, sizeof(a));
	a.time_ns = 1234567890123ull;
	a.timing = 1;
	for (i = 0; i < STAT_NCOUNTERS; i++)
		a.ctr[i] = 1000 + i;
	for (i = 0; i < STAT_NGAUGES; i++)
		a.gauge[i] = 7 * i;
	for (i = 0; i < 500; i++)
		lat_record(&a.lat[STAT_L_write], 20000 + 977 * i);
	a.ndevs = 2;
	strcpy(a.dev[1].path, "/dev/loop7 with space");
	STAT_DEV_CTR(&a, 1, errors) = 3;
	STAT_DEV_GAUGE(&a, 1, failed) = 1;
	lat_record(&a.dev[1].lat[STAT_DL_flush], 5000000);
	strcpy(a.mirror_path[1], "/pmem/m1");
	a.mirror_state[1] = STAT_MIRROR_REBUILT;

	f = open_memstream(&buf, &len);
	CHECK_EQ(stat_write(f, &a), 0);
	fclose(f);
	f = fmemopen(buf, len, "r");
	CHECK_EQ(stat_read(f, &b, err, sizeof(err)), 0);
	fclose(f);
	CHECK(!memcmp(&a, &b, sizeof(a)));

	/* a later snapshot minus an earlier one: what happened between */
	STAT_CTR(&b, write_ops) += 5;
	lat_record(&b.lat[STAT_L_write], 50);
	stat_diff(&b, &a, &d);
	CHECK_EQ(STAT_CTR(&d, write_ops), 5);
	CHECK_EQ(STAT_CTR(&d, read_ops), 0);
	CHECK_EQ(STAT_LAT(&d, write).count, 1);
	CHECK_EQ(STAT_LAT(&d, write).b[50], 1);
	CHECK_EQ(lat_quantile(&STAT_LAT(&d, write), 0.5), 50);

	/* truncated and malformed answers are refused */
	f = fmemopen(buf, len / 2, "r");
	CHECK(stat_read(f, &b, err, sizeof(err)) < 0);
	fclose(f);
	f = fmemopen(bad, strlen(bad), "r");
	CHECK(stat_read(f, &b, err, sizeof(err)) < 0);
	fclose(f);
	free(buf);
}

int main(void)
{
	RUN(test_buckets_cover_every_value_once);
	RUN(test_hiccup_bands_are_btest_milliseconds);
	RUN(test_quantiles_of_a_known_distribution);
	RUN(test_shards_lose_nothing_under_threads);
	RUN(test_wire_format_round_trip_and_diff);
	return CHECK_DONE();
}
