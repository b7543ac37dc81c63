/* cache: a cache's devices by identity — which listed device is which member. */
#include "meta.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>

/*
 * Members.  `nvcachectl format` gives every cache device a UUID of its own
 * (sb_disk.dev_uuid) and records them, in member order, in the metadata
 * header (meta_hdr.members).  Each slot lives on one member (meta.h: the
 * layout), so a device must be used at its member index, whatever name it
 * has today:
 * loop devices and NVMe namespaces are numbered in the order they appear,
 * and that order changes between boots.  cache.devices therefore names the
 * set, not the order: at mount each listed device is placed at the index its
 * superblock's UUID has in the header.
 *
 * What is refused, naming the device:
 *   - a device of this cache whose UUID is no longer in the header (a member
 *     that was replaced or removed: its contents are stale);
 *   - two devices carrying one member's UUID (a copy of a device).
 * What is left to check_superblocks (recover.c), which names it too: a
 * device of another cache, a device with no valid superblock (missing,
 * blank or overwritten: degraded with two dirty copies, else refused).
 * Such unidentified devices take the indexes left free, in listed order.
 *
 * A header with no member table (formatted before members were recorded)
 * keeps the listed order, checked by the superblocks' dev_index as before.
 */

static int uuid_is_zero(const uint8_t u[16])
{
	static const uint8_t zero[16];

	return !memcmp(u, zero, 16);
}

int members_uuid_taken(uint8_t (*m)[16], int i)
{
	int j;

	if (uuid_is_zero(m[i]))
		return 1;
	for (j = 0; j < i; j++)
		if (!memcmp(m[j], m[i], 16))
			return 1;
	return 0;
}

const char *members_uuid_str(const uint8_t u[16], char buf[37])
{
	snprintf(buf, 37,
		 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
		 "%02x%02x%02x%02x%02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9],
		 u[10], u[11], u[12], u[13], u[14], u[15]);
	return buf;
}

int members_recorded(const struct meta_hdr *h)
{
	return !uuid_is_zero(h->members[0]);
}

/* The member index of a device's superblock UUID; -1: not a member. */
static int member_of(const struct meta_hdr *h, const uint8_t u[16])
{
	uint32_t k;

	if (uuid_is_zero(u))
		return -1;
	for (k = 0; k < h->ndevs; k++)
		if (!memcmp(h->members[k], u, 16))
			return (int)k;
	return -1;
}

/*
 * Identify devs[i] (-1: unidentified, left to check_superblocks); 0 or
 * -EINVAL with err set.
 */
static int identify(const struct meta_hdr *h, struct dev *d, int *k, char *err,
		    size_t errlen)
{
	struct sb_disk sb;
	char u[37];

	*k = -1;
	if (sb_read(d, &sb) || memcmp(sb.set_uuid, h->set_uuid, 16))
		return 0;
	*k = member_of(h, sb.dev_uuid);
	if (*k < 0) {
		snprintf(err, errlen,
			 "%s is a former member of this cache: its device "
			 "UUID %s is no longer in the set (replaced or "
			 "removed), so its contents are stale; take it out of "
			 "cache.devices (or format it to use it again)",
			 dev_path(d), members_uuid_str(sb.dev_uuid, u));
		return -EINVAL;
	}
	if (sb.dev_index != (uint32_t)*k) {
		snprintf(err, errlen,
			 "%s: its superblock says device %u, but the metadata "
			 "records its UUID as member %d",
			 dev_path(d), sb.dev_index + 1, *k + 1);
		return -EINVAL;
	}
	return 0;
}

int members_order(const struct meta_hdr *h, struct dev **devs, int n,
		  int *missing, char *err, size_t errlen)
{
	struct dev *out[NVC_MAX_DEVS] = { 0 };
	int from[NVC_MAX_DEVS], kof[NVC_MAX_DEVS];
	int i, k, ret, next = 0, moved = 0, was_missing = *missing;

	if (!members_recorded(h) || h->ndevs != (uint32_t)n)
		return 0; /* the listed order, checked as before */
	for (i = 0; i < n; i++) {
		kof[i] = -1;
		if (i + 1 == was_missing)
			continue;
		ret = identify(h, devs[i], &kof[i], err, errlen);
		if (ret)
			return ret;
		k = kof[i];
		if (k < 0)
			continue;
		if (out[k]) {
			snprintf(err, errlen,
				 "%s and %s both carry the identity of member "
				 "%d of this cache: one is a copy of the "
				 "other; take the copy out of cache.devices",
				 dev_path(out[k]), dev_path(devs[i]), k + 1);
			return -EINVAL;
		}
		out[k] = devs[i];
		from[k] = i;
	}
	for (i = 0; i < n; i++) {
		if (kof[i] >= 0)
			continue;
		while (out[next])
			next++;
		out[next] = devs[i];
		from[next] = i;
		if (i + 1 == was_missing)
			*missing = next + 1;
	}
	for (k = 0; k < n; k++) {
		if (from[k] == k)
			continue;
		moved = 1;
		if (kof[from[k]] >= 0)
			log_msg(LOG_NOTICE,
				"%s is member %d of %d of this cache (listed "
				"as device %d in cache.devices): taken by its "
				"identity",
				dev_path(out[k]), k + 1, n, from[k] + 1);
	}
	if (moved)
		memcpy(devs, out, n * sizeof(*devs));
	return 0;
}
