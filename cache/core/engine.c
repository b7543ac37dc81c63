/* cache: clocks, device observers, statistics snapshots and small accessors. */
#define _GNU_SOURCE
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>
#include <xxhash.h>

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

uint64_t now_ms(void)
{
	return now_ns() / 1000000;
}

/* ----------------------------------------------------------- test stall */

#ifndef NDEBUG
static const char *stall_spec;
static pthread_once_t stall_once = PTHREAD_ONCE_INIT;

static void stall_init(void)
{
	stall_spec = getenv("NVC_TEST_STALL");
}

void cache_test_stall(const char *kind)
{
	size_t n = strlen(kind);

	pthread_once(&stall_once, stall_init);
	if (!stall_spec || strncmp(stall_spec, kind, n) || stall_spec[n] != ':')
		return;
	while (!access(stall_spec + n + 1, F_OK))
		usleep(10000);
}
#else
void cache_test_stall(const char *kind)
{
	(void)kind;
}
#endif

/* ---------------------------------------------------------------- stats */

static void dev_observed(void *arg, enum dev_op op, uint32_t len, int res,
			 uint64_t ns)
{
	struct dev_obs *o = arg;
	struct stat_store *st = &o->c->stats;
	int timed = st->timing;

	if (res < 0)
		stat_dev_add(st, o->d, STAT_DC_errors, 1);
	switch (op) {
	case DEV_READ:
		stat_dev_add(st, o->d, STAT_DC_read_ops, 1);
		stat_dev_add(st, o->d, STAT_DC_read_bytes, len);
		if (timed)
			stat_dev_lat(st, o->d, STAT_DL_read, ns);
		break;
	case DEV_WRITE:
		stat_dev_add(st, o->d, STAT_DC_write_ops, 1);
		stat_dev_add(st, o->d, STAT_DC_write_bytes, len);
		if (timed)
			stat_dev_lat(st, o->d, STAT_DL_write, ns);
		break;
	case DEV_FLUSH:
		stat_dev_add(st, o->d, STAT_DC_flush_ops, 1);
		if (timed)
			stat_dev_lat(st, o->d, STAT_DL_flush, ns);
		break;
	}
}

/* Watch every cache device's I/O (called once the devices are known). */
void stats_attach_devs(struct cache *c)
{
	int d;

	for (d = 0; d < c->ndevs; d++) {
		c->obs[d].c = c;
		c->obs[d].d = d;
		dev_set_observer(c->devs[d], dev_observed, &c->obs[d],
				 c->stats.timing);
		dev_set_nolock(c->devs[d], &c->lock);
	}
}

/* The destage rate: bytes per wall-clock second, in a ring of 16 seconds. */
void stats_note_destaged(struct cache *c, uint64_t bytes)
{
	uint64_t sec = now_ms() / 1000;
	unsigned k = sec % 16;

	pthread_mutex_lock(&c->stats_lock);
	if (c->rate_sec[k] != sec) {
		c->rate_sec[k] = sec;
		c->rate_bytes[k] = 0;
	}
	c->rate_bytes[k] += bytes;
	pthread_mutex_unlock(&c->stats_lock);
}

uint64_t cache_counter(struct cache *c, enum stat_counter k)
{
	return stat_total(&c->stats, k);
}

void cache_note_latency(struct cache *c, enum stat_lat k, uint64_t t0)
{
	stat_lat_since(&c->stats, k, t0);
}

void cache_count(struct cache *c, enum stat_counter k, uint64_t v)
{
	stat_add(&c->stats, k, v);
}

void cache_note_handle(struct cache *c, int delta, int pt)
{
	__atomic_add_fetch(&c->handles, delta, __ATOMIC_RELAXED);
	if (pt)
		__atomic_add_fetch(&c->pt_handles, delta, __ATOMIC_RELAXED);
}

uint64_t cache_clock(struct cache *c)
{
	return stat_clock(&c->stats);
}

uint64_t cache_slot_dram(const struct cache *c)
{
	return c->nslots * (sizeof(*c->slots) + SB_NBITS * c->pbytes) +
	       (c->smask + 1) * sizeof(*c->shash);
}

uint64_t cache_rec_dram(const struct cache *c)
{
	return (c->fmask + 1) * sizeof(*c->fhash) +
	       c->meta.nfiles * (sizeof(*c->recs) + sizeof(*c->free_recs));
}

struct cache_config *cache_config(struct cache *c)
{
	return c->cfg;
}

void cache_set_bk_hooks(struct cache *c, const struct cache_bk_hooks *h)
{
	c->bk = h;
}

int ctl_socket_path(const char *mountpoint, char *out, size_t len)
{
	int n = snprintf(
		out, len, CTL_DIR "/%016llx.sock",
		(unsigned long long)XXH64(mountpoint, strlen(mountpoint), 0));

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

pthread_mutex_t devlife_lock = PTHREAD_MUTEX_INITIALIZER;
