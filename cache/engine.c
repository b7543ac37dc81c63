/* cache: clocks, device observers, statistics snapshots and small accessors. */
#define _GNU_SOURCE
#include "engine.h"

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

/* Average over the last 10 seconds (fewer right after mount), locked. */
static uint64_t destage_rate_locked(struct cache *c)
{
	uint64_t now = now_ms(), sec = now / 1000, sum = 0, span_ms;
	unsigned k;

	for (k = 0; k < 16; k++)
		if (c->rate_sec[k] + 10 > sec)
			sum += c->rate_bytes[k];
	/* the window: 9 whole seconds and the current part second */
	span_ms = 9000 + now % 1000;
	if (now - c->mount_ns / 1000000 < span_ms)
		span_ms = now - c->mount_ns / 1000000;
	return span_ms ? sum * 1000 / span_ms : 0;
}

/* Device d's state, as its failed gauge says it. */
static uint64_t dev_state(struct cache *c, int d)
{
	if (__atomic_load_n(&c->rebuild_member, __ATOMIC_ACQUIRE) == d + 1)
		return STAT_DEV_REBUILDING;
	if (c->dev_failed[d])
		return c->dev_failed[d];
	return __atomic_load_n(&c->dev_draining[d], __ATOMIC_ACQUIRE)
		       ? STAT_DEV_DRAINING
		       : STAT_DEV_OK;
}

/* Bytes of device d still to copy onto its replacement, of *total. */
static uint64_t rebuild_left(struct cache *c, int d, uint64_t *total)
{
	uint64_t done = __atomic_load_n(&c->rebuild_done, __ATOMIC_ACQUIRE);

	*total = 0;
	if (__atomic_load_n(&c->rebuild_member, __ATOMIC_ACQUIRE) != d + 1)
		return 0;
	*total = __atomic_load_n(&c->rebuild_total, __ATOMIC_ACQUIRE);
	return *total > done ? *total - done : 0;
}

int cache_snapshot(struct cache *c, struct stat_snap *s)
{
	struct timespec ts;
	uint64_t now = now_ns();
	int d;

	stat_collect(&c->stats, c->ndevs, s);
	pthread_mutex_lock(&c->stats_lock);
	if (c->stats_base)
		stat_diff(s, c->stats_base, s);
	STAT_GAUGE(s, destage_rate) = destage_rate_locked(c);
	STAT_GAUGE(s, since_reset) = (now - c->reset_ns) / 1000000000ull;
	STAT_GAUGE(s, resets) = c->resets;
	pthread_mutex_unlock(&c->stats_lock);
	clock_gettime(CLOCK_REALTIME, &ts);
	s->time_ns = ts.tv_sec * 1000000000ull + ts.tv_nsec;
	s->timing = c->stats.timing;
	STAT_GAUGE(s, uptime) = (now - c->mount_ns) / 1000000000ull;
	STAT_GAUGE(s, meta_repaired) = c->meta_repaired;
	STAT_GAUGE(s, ring_refusals) = dev_ring_refusals();
	for (d = 0; d < 2; d++) {
		s->mirror_state[d] =
			__atomic_load_n(&c->meta.failed[d], __ATOMIC_ACQUIRE)
				? STAT_MIRROR_FAILED
				: c->meta.rebuilt[d];
		snprintf(s->mirror_path[d], sizeof(s->mirror_path[d]), "%s",
			 c->cfg->meta_paths[d] ? c->cfg->meta_paths[d] : "");
	}
	pthread_mutex_lock(&c->lock);
	STAT_GAUGE(s, slots) = c->nslots;
	STAT_GAUGE(s, used_slots) = c->nslots - c->nfree;
	STAT_GAUGE(s, dirty_slots) = c->ndirty_slots;
	STAT_GAUGE(s, capacity_bytes) = usable_slots(c) * c->bs;
	STAT_GAUGE(s, used_bytes) = c->valid_pages * NVC_PAGE;
	STAT_GAUGE(s, dirty_bytes) = c->dirty_pages * NVC_PAGE;
	STAT_GAUGE(s, high_watermark_bytes) =
		usable_slots(c) * c->bs / 100 * c->cfg->high_wm;
	STAT_GAUGE(s, low_watermark_bytes) =
		usable_slots(c) * c->bs / 100 * c->cfg->low_wm;
	STAT_GAUGE(s, destaging) = c->active > 0;
	STAT_GAUGE(s, writer_pace) = write_pace_locked(c);
	STAT_GAUGE(s, writing_around) = write_around_now_locked(c);
	STAT_GAUGE(s, detached) = c->detached;
	for (d = 0; d < c->ndevs; d++) {
		STAT_DEV_GAUGE(s, d, used_bytes) =
			c->dev_valid_pages[d] * NVC_PAGE;
		STAT_DEV_GAUGE(s, d, dirty_bytes) =
			c->dev_dirty_pages[d] * NVC_PAGE;
		STAT_DEV_GAUGE(s, d, failed) = dev_state(c, d);
		STAT_DEV_GAUGE(s, d, rebuild_left_bytes) =
			rebuild_left(c, d, &STAT_DEV_GAUGE(s, d, rebuild_bytes));
	}
	cache_unlock(c);
	for (d = 0; d < c->ndevs; d++) {
		/* attach and detach swap devices under it (detach.c) */
		pthread_mutex_lock(&c->dsync[d].lock);
		snprintf(s->dev[d].path, sizeof(s->dev[d].path), "%s",
			 dev_path(c->devs[d]));
		pthread_mutex_unlock(&c->dsync[d].lock);
	}
	return 0;
}

int cache_stats_reset(struct cache *c)
{
	struct stat_snap *base;

	pthread_mutex_lock(&c->stats_lock);
	if (!c->stats_base)
		c->stats_base = calloc(1, sizeof(*c->stats_base));
	base = c->stats_base;
	if (!base) {
		pthread_mutex_unlock(&c->stats_lock);
		return -ENOMEM;
	}
	stat_collect(&c->stats, c->ndevs, base);
	stat_reset_max(&c->stats);
	c->reset_ns = now_ns();
	c->resets++;
	pthread_mutex_unlock(&c->stats_lock);
	log_msg(LOG_NOTICE, "statistics reset");
	return 0;
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

void cache_kick(struct cache *c)
{
	pthread_mutex_lock(&c->lock);
	pthread_cond_broadcast(&c->destage_cond);
	cache_unlock(c);
}

int ctl_socket_path(const char *mountpoint, char *out, size_t len)
{
	int n = snprintf(
		out, len, CTL_DIR "/%016llx.sock",
		(unsigned long long)XXH64(mountpoint, strlen(mountpoint), 0));

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}
