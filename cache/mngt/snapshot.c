/* cache: the statistics snapshot: counters, gauges and the destage rate. */
#define _GNU_SOURCE
#include "mngt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <syslog.h>
#include <time.h>

/* Average over the last 10 seconds (fewer right after mount), under
 * c->stats_lock. */
static uint64_t destage_rate_stats_locked(struct cache *c)
{
	uint64_t now = now_ms(), sec = now / 1000, sum = 0, span_ms;
	unsigned k;

	assert(dev_mutex_mine(&c->stats_lock));
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
	STAT_GAUGE(s, destage_rate) = destage_rate_stats_locked(c);
	STAT_GAUGE(s, since_reset) = (now - c->reset_ns) / 1000000000ull;
	STAT_GAUGE(s, resets) = c->resets;
	pthread_mutex_unlock(&c->stats_lock);
	clock_gettime(CLOCK_REALTIME, &ts);
	s->time_ns = ts.tv_sec * 1000000000ull + ts.tv_nsec;
	s->timing = c->stats.timing;
	STAT_GAUGE(s, uptime) = (now - c->mount_ns) / 1000000000ull;
	STAT_GAUGE(s, meta_repaired) = c->meta_repaired;
	STAT_GAUGE(s, ring_refusals) = dev_ring_refusals();
	STAT_GAUGE(s, open_handles) =
		__atomic_load_n(&c->handles, __ATOMIC_RELAXED);
	STAT_GAUGE(s, passthrough_handles) =
		__atomic_load_n(&c->pt_handles, __ATOMIC_RELAXED);
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

void cache_kick(struct cache *c)
{
	pthread_mutex_lock(&c->lock);
	pthread_cond_broadcast(&c->destage_cond);
	cache_unlock(c);
}
