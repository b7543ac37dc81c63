/* tests: what the statistics add to one request — the clock reads, counter
 * adds and histogram records of a read through the mount, timed in a loop. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../../cache/base/stats.h"

#define N 5000000

static struct stat_store store;

/* CPU time of the process: what the statistics cost, wherever they ran */
static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * What a cache-hit read through the mount records: the request's clock and
 * latency (fs), read_ops, read_bytes, read_hit_ops, read_hit_bytes,
 * read_miss_bytes (engine), and for its one device read the observer's two
 * adds, one latency record and the hit bytes.
 */
static void *one_request_loop(void *arg)
{
	int i;

	for (i = 0; i < N; i++) {
		uint64_t t0 = stat_clock(&store);

		stat_add(&store, STAT_C_read_ops, 1);
		stat_add(&store, STAT_C_read_bytes, 4096);
		stat_add(&store, STAT_C_read_hit_ops, 1);
		stat_add(&store, STAT_C_read_hit_bytes, 4096);
		stat_add(&store, STAT_C_read_miss_bytes, 0);
		stat_dev_add(&store, 0, STAT_DC_read_ops, 1);
		stat_dev_add(&store, 0, STAT_DC_read_bytes, 4096);
		stat_dev_lat(&store, 0, STAT_DL_read, 14000 + (i & 4095));
		stat_dev_add(&store, 0, STAT_DC_hit_bytes, 4096);
		stat_lat_since(&store, STAT_L_read, t0);
	}
	return arg;
}

int main(int argc, char **argv)
{
	int threads = argc > 1 ? atoi(argv[1]) : 1, i, timing;
	pthread_t t[64];

	if (threads < 1 || threads > 64)
		threads = 1;
	for (timing = 1; timing >= 0; timing--) {
		double t0;

		stat_store_init(&store, timing);
		t0 = now_s();
		for (i = 0; i < threads; i++)
			pthread_create(&t[i], NULL, one_request_loop, NULL);
		for (i = 0; i < threads; i++)
			pthread_join(t[i], NULL);
		printf("%d thread%s, latency %s: %.1f ns of CPU for the "
		       "statistics of one request\n",
		       threads, threads > 1 ? "s" : "", timing ? "on " : "off",
		       (now_s() - t0) * 1e9 / N / threads);
		stat_store_free(&store);
	}
	return 0;
}
