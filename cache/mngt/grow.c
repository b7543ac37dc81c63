/* cache: growing a mounted cache by a member past the places it was formatted with (nvcachectl add). */
#define _GNU_SOURCE
#include "mngt.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

/*
 * Grow.  The members a cache is formatted with share its slots round robin
 * (the stripe: meta.h, struct meta_layout); a member added later holds a run
 * of slots of its own after every slot there was, as many as it has room
 * for, so that nothing already in the cache moves and any size of device can
 * be added.  The metadata mirrors keep room for more slot entries than the
 * formatted devices need (cache.max_capacity, read by format: header
 * `room`), and the slot arrays in memory are allocated for that room at
 * mount (untouched pages cost nothing), so a grow moves nothing either: the
 * new slots' entries and array elements were there all along, unused.
 *
 * A grow, devlife_lock held, in this order:
 *   1. the new device gets the superblock of member k = ndevs (its slot
 *      count, a new UUID), flushed (member_sb_write);
 *   2. the new slots' entries are zeroed and persisted in each mirror (free),
 *      then each header records member k: ndevs, nslots, grown[k], its UUID,
 *      mirror 0 first, each persisted before the next (meta_grow);
 *   3. the new slots are made ready in memory, the device takes place k,
 *      then under c->lock the cache counts them (ndevs, nslots) and puts
 *      them on the free list interleaved with the other members' free slots,
 *      so that new data spreads onto the new member at once.
 * A crash before 2 leaves a device whose UUID no header records: the mount
 * does not know it (add it again); one inside 2 leaves mirror 0 with the new
 * member and mirror 1 without, and mirror 1 takes mirror 0's set at mount
 * (meta.c: hdr_reconcile); after 2 the cache has k + 1 members, which
 * the next mount finds by their UUIDs (members.c).  Nothing was in
 * the new slots, so no crash point can lose or misplace data.
 *
 * Readers of the layout (slot_member, slot_off) never take a lock: a slot
 * index reaches them only through the free list or a map entry, which is
 * after step 3's c->lock, and step 2 wrote base[k] and count[k] before it.
 */

/* The free list in the order a stripe would give: by index on the member,
 * then by member (c->lock held). */
static int by_place(const void *a, const void *b, void *arg)
{
	const struct meta_layout *l = arg;
	uint64_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	uint64_t ix = layout_index(l, x), iy = layout_index(l, y);

	if (ix != iy)
		return ix < iy ? -1 : 1;
	return layout_member(l, x) - layout_member(l, y);
}

int grow_interleave_locked(struct cache *c)
{
	uint32_t *v = malloc(c->nfree * sizeof(*v) + 1);
	struct cslot *s;
	uint64_t i, n = 0;

	assert_held(&c->lock);
	if (!v)
		return -ENOMEM; /* the list stays as it is: still right */
	while ((s = slot_list_next(c, SL_FREE, NULL))) {
		assert(n < c->nfree);
		v[n++] = slot_idx(c, s);
		slot_list_del(c, s);
	}
	qsort_r(v, n, sizeof(*v), by_place, &c->meta.layout);
	for (i = 0; i < n; i++)
		slot_list_add_tail(c, SL_FREE, &c->slots[v[i]]);
	free(v);
	return 0;
}

/* Step 3: count new slots from c->nslots on, on nd as member k. */
static void grow_publish(struct cache *c, int k, struct dev *nd,
			 uint64_t count)
{
	uint64_t i, first = c->nslots;

	for (i = first; i < first + count; i++)
		cache_slot_init(c, i);
	c->devs[k] = nd;
	c->dev_failed[k] = STAT_DEV_OK;
	__atomic_store_n(&c->dev_draining[k], 0, __ATOMIC_RELEASE);
	pthread_mutex_lock(&c->lock);
	assert(c->meta.nslots == first + count && c->ndevs == k);
	__atomic_store_n(&c->ndevs, k + 1, __ATOMIC_RELEASE);
	c->nslots = first + count;
	for (i = first; i < first + count; i++)
		slot_settle(c, &c->slots[i]); /* free, on the free list */
	grow_interleave_locked(c);
	space_freed_locked(c); /* writers waiting for room have it */
	cache_unlock(c);
	stats_attach_devs(c);
}

/* Why the cache cannot grow by a member; 0 if it can. */
static int grow_refused(struct cache *c, char *err, size_t errlen)
{
	if (c->ndevs == NVC_MAX_DEVS) {
		snprintf(err, errlen,
			 "no free member place, and the cache has %d members, "
			 "the most it can have",
			 NVC_MAX_DEVS);
		return -ENOSPC;
	}
	if (!devlife_identified(c, "grow", err, errlen))
		return -EINVAL;
	if (c->meta.layout.room - c->nslots < GROW_MIN_SLOTS) {
		char b[32];

		stat_fmt_bytes(c->meta.layout.room * c->bs, b, sizeof(b));
		snprintf(err, errlen,
			 "no free member place, and the metadata mirrors have "
			 "no room for more slots: they were formatted for %s "
			 "of cache (cache.max_capacity), all of it in use",
			 b);
		return -ENOSPC;
	}
	return 0;
}

int grow_run(struct cache *c, struct dev *nd, char *err, size_t errlen)
{
	uint8_t members[NVC_MAX_DEVS][16];
	uint64_t fits, count, room = c->meta.layout.room - c->nslots;
	int k = c->ndevs, ret = grow_refused(c, err, errlen);
	char b[2][32];

	if (ret)
		goto err_log;
	fits = dev_size(nd) > SB_DATA_OFF
		       ? (dev_size(nd) - SB_DATA_OFF) / c->bs
		       : 0;
	if (fits < GROW_MIN_SLOTS) {
		snprintf(err, errlen, "%s is too small: %llu bytes",
			 dev_path(nd), (unsigned long long)dev_size(nd));
		ret = -ENOSPC;
		goto err_log;
	}
	count = fits < room ? fits : room;
	meta_members(&c->meta, members);
	ret = member_sb_write(c, k, count, nd, members, NULL, err, errlen);
	if (ret)
		goto err_log;
	ret = meta_grow(&c->meta, k, members[k], count);
	if (ret) {
		snprintf(err, errlen, "cannot record the new member: %s",
			 strerror(-ret));
		goto err_log;
	}
	free(c->grown_names[k]);
	c->grown_names[k] = strdup(dev_path(nd));
	grow_publish(c, k, nd, count);
	cache_note_member_names(c);
	stat_fmt_bytes(count * c->bs, b[0], sizeof(b[0]));
	stat_fmt_bytes(usable_slots(c) * c->bs, b[1], sizeof(b[1]));
	log_msg(LOG_NOTICE,
		"add: %s is member %d, in use now with %s%s; the cache holds "
		"%s (the next mount finds it by its UUID)",
		dev_path(nd), k + 1, b[0],
		count < fits ? " (what the metadata has room for)" : "", b[1]);
	return 0;
err_log:
	log_msg(LOG_ERR, "add of %s failed: %s", dev_path(nd), err);
	return ret;
}
