/* cache: superblocks and metadata headers, every field checked before use;
 * a header laid out for format. */
#define _GNU_SOURCE
#include "meta_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int block_size_ok(uint64_t bs)
{
	return bs >= NVC_PAGE && bs <= META_MAX_WORDS * 64 * NVC_PAGE &&
	       !(bs & (bs - 1));
}

int sb_check(const struct sb_disk *sb, char *why, size_t len)
{
	if (sb->sb_size != sizeof(*sb))
		return meta_refuse(why, len, -EUCLEAN,
				   "sb_size %u, expected %zu", sb->sb_size,
				   sizeof(*sb));
	if (sb->data_off != SB_DATA_OFF)
		return meta_refuse(
			why, len, -EUCLEAN, "data_off %llu, expected %llu",
			(unsigned long long)sb->data_off, SB_DATA_OFF);
	if (sb->ndevs < 1 || sb->ndevs > NVC_MAX_DEVS)
		return meta_refuse(why, len, -EUCLEAN,
				   "ndevs %u is not from 1 to %d", sb->ndevs,
				   NVC_MAX_DEVS);
	if (sb->dev_index >= sb->ndevs)
		return meta_refuse(why, len, -EUCLEAN,
				   "dev_index %u is not below ndevs %u",
				   sb->dev_index, sb->ndevs);
	if (!block_size_ok(sb->block_size))
		return meta_refuse(
			why, len, -EUCLEAN,
			"block_size %u is not a power of two from 4K "
			"to 1M",
			sb->block_size);
	if (sb->dev_size < sb->data_off || sb->slots_per_dev < 1 ||
	    sb->slots_per_dev > (sb->dev_size - sb->data_off) / sb->block_size)
		return meta_refuse(why, len, -EUCLEAN,
				   "slots_per_dev %llu of %u bytes do not fit "
				   "dev_size %llu after data_off",
				   (unsigned long long)sb->slots_per_dev,
				   sb->block_size,
				   (unsigned long long)sb->dev_size);
	return 0;
}

/* One copy of the superblock: 0 and in buf if it is valid. */
static int sb_copy_ok(const struct sb_disk *buf, char *why, size_t len)
{
	if (buf->magic != SB_MAGIC)
		return meta_refuse(why, len, -ENODATA, "no nvcachefs magic");
	if (buf->csum != meta_csum(buf, offsetof(struct sb_disk, csum)))
		return meta_refuse(why, len, -EUCLEAN, "checksum mismatch");
	if (buf->version != SB_VERSION)
		return meta_refuse(why, len, -EPROTO, "version %u, expected %u",
				   buf->version, SB_VERSION);
	return sb_check(buf, why, len);
}

/*
 * The first valid copy wins.  -ENODATA only when no copy carries the magic
 * (never formatted), else the first copy's error; why lists every copy's.
 */
int sb_read_why(struct dev *d, struct sb_disk *out, char *why, size_t len)
{
	struct sb_disk *buf = dev_alloc_buf(sizeof(*buf));
	int copy, ret = -ENODATA;
	size_t at = 0;

	if (why && len)
		why[0] = 0;
	if (!buf)
		return -ENOMEM;
	for (copy = 0; copy < SB_COPIES; copy++) {
		char one[160];
		int r = dev_read(d, buf, sizeof(*buf), 4096 * (copy + 1));

		if (r)
			snprintf(one, sizeof(one), "cannot read: %s",
				 strerror(-r));
		else
			r = sb_copy_ok(buf, one, sizeof(one));
		if (!r) {
			memcpy(out, buf, sizeof(*out));
			ret = 0;
			break;
		}
		if (ret == -ENODATA)
			ret = r;
		if (why && at < len)
			at += snprintf(why + at, len - at, "%scopy %d: %s",
				       copy ? "; " : "", copy + 1, one);
	}
	free(buf);
	return ret;
}

int sb_read(struct dev *d, struct sb_disk *out)
{
	return sb_read_why(d, out, NULL, 0);
}

int sb_write(struct dev *d, const struct sb_disk *sb)
{
	struct sb_disk *buf = dev_alloc_buf(sizeof(*buf));
	int copy, ret = 0;

	if (!buf)
		return -ENOMEM;
	memcpy(buf, sb, sizeof(*buf));
	buf->csum = meta_csum(buf, offsetof(struct sb_disk, csum));
	for (copy = 0; copy < SB_COPIES && !ret; copy++) {
		ret = dev_write(d, buf, sizeof(*buf), 4096 * (copy + 1));
		if (!ret)
			ret = dev_flush(d);
	}
	free(buf);
	return ret;
}

/* Rewrite whichever superblock copy differs from the good one. */
int sb_repair(struct dev *d, const struct sb_disk *good, int *repaired)
{
	struct sb_disk *buf = dev_alloc_buf(sizeof(*buf));
	int copy, ret = 0;

	*repaired = 0;
	if (!buf)
		return -ENOMEM;
	for (copy = 0; copy < SB_COPIES && !ret; copy++) {
		if (!dev_read(d, buf, sizeof(*buf), 4096 * (copy + 1)) &&
		    !memcmp(buf, good, sizeof(*buf)))
			continue;
		memcpy(buf, good, sizeof(*buf));
		ret = dev_write(d, buf, sizeof(*buf), 4096 * (copy + 1));
		if (!ret)
			ret = dev_flush(d);
		(*repaired)++;
	}
	free(buf);
	return ret;
}

void meta_init_hdr(struct meta_hdr *h, const uint8_t uuid[16], uint32_t mirror,
		   uint32_t block_size, uint64_t nslots, uint64_t room,
		   uint32_t nfiles, uint32_t ndevs)
{
	memset(h, 0, sizeof(*h));
	h->magic = META_MAGIC;
	h->version = META_VERSION;
	h->hdr_size = META_HDR_SIZE;
	memcpy(h->set_uuid, uuid, 16);
	h->mirror = mirror;
	h->block_size = block_size;
	h->nslots = nslots;
	h->nfiles = nfiles;
	h->slot_size = meta_slot_size(block_size);
	h->file_size = META_FILE_SIZE;
	h->ndevs = ndevs;
	h->files_off = META_HDR_SIZE;
	h->slots_off = META_HDR_SIZE + (uint64_t)nfiles * META_FILE_SIZE;
	h->stripe_devs = ndevs;
	h->room = room;
	h->total_len = meta_total_len(room, nfiles, block_size);
	h->csum = meta_csum(h, offsetof(struct meta_hdr, csum));
}

/* What a valid header says (a version 2 one: every member in the stripe,
 * no room past nslots). */
void meta_layout_of(const struct meta_hdr *h, struct meta_layout *l)
{
	uint64_t next, grown = 0;
	uint32_t k;

	memset(l, 0, sizeof(*l));
	l->nstripe = h->stripe_devs ? h->stripe_devs : h->ndevs;
	l->room = h->room ? h->room : h->nslots;
	for (k = l->nstripe; k < h->ndevs; k++)
		grown += h->grown[k];
	l->stripe_slots = h->nslots - grown;
	for (k = 0; k < l->nstripe; k++)
		l->count[k] = l->stripe_slots / l->nstripe;
	for (k = l->nstripe, next = l->stripe_slots; k < h->ndevs; k++) {
		l->base[k] = next;
		l->count[k] = h->grown[k];
		next += h->grown[k];
	}
}

/*
 * A header is used only if every field is what format writes for its
 * geometry: the layout is recomputed, never trusted, so that no offset or
 * count can reach past the mapped length.
 */
static int uuid_zero(const uint8_t u[16])
{
	static const uint8_t zero[16];

	return !memcmp(u, zero, 16);
}

/* The member table: all zero (not recorded), or ndevs distinct non-zero
 * UUIDs followed by zeros. */
static int members_ok(const struct meta_hdr *h, char *why, size_t len)
{
	uint32_t k, j, n = 0;

	for (k = 0; k < NVC_MAX_DEVS; k++)
		n += !uuid_zero(h->members[k]);
	if (!n)
		return 0;
	for (k = 0; k < NVC_MAX_DEVS; k++) {
		if (uuid_zero(h->members[k]) != (k >= h->ndevs))
			return meta_refuse(
				why, len, -EUCLEAN,
				"header member table: entry %u is %s, "
				"but ndevs is %u",
				k, k < h->ndevs ? "empty" : "set", h->ndevs);
		for (j = 0; j < k && k < h->ndevs; j++)
			if (!memcmp(h->members[j], h->members[k], 16))
				return meta_refuse(
					why, len, -EUCLEAN,
					"header member table: members "
					"%u and %u have one UUID",
					j, k);
	}
	return 0;
}

/* The names members were last found at: each NUL-terminated, none past
 * ndevs. */
static int names_ok(const struct meta_hdr *h, char *why, size_t len)
{
	uint32_t k;

	for (k = 0; k < NVC_MAX_DEVS; k++) {
		if (!memchr(h->names[k], 0, META_NAME_LEN))
			return meta_refuse(why, len, -EUCLEAN,
					   "header names[%u] is not terminated",
					   k);
		if (k >= h->ndevs && (h->names[k][0] || h->rdevs[k] ||
				      h->tokens[k] || h->tokens_next[k]))
			return meta_refuse(
				why, len, -EUCLEAN,
				"header names[%u] (or its rdev or tokens) set "
				"past ndevs %u",
				k, h->ndevs);
	}
	return 0;
}

/*
 * The layout fields (ndevs already checked): the stripe's slots a non-empty
 * multiple of its members, every grown member holding slots and no other
 * member any grown ones, nslots within room, room within the mirror's
 * space (bytes after the header).
 */
static int layout_ok(const struct meta_hdr *h, uint64_t space, char *why,
		     size_t len)
{
	uint64_t grown = 0;
	uint32_t k, nstripe = h->stripe_devs;

	if (h->version == META_VERSION_V2 &&
	    (h->stripe_devs || h->room || h->reserved5 ||
	     !meta_is_zero((const uint8_t *)h->grown, sizeof(h->grown))))
		return meta_refuse(why, len, -EUCLEAN,
				   "version 2 header with layout fields set");
	if (h->version == META_VERSION_V2)
		nstripe = h->ndevs;
	if (nstripe < 1 || nstripe > h->ndevs || h->reserved5)
		return meta_refuse(
			why, len, -EUCLEAN,
			"header stripe_devs %u (reserved5 %u): not from "
			"1 to ndevs %u",
			nstripe, h->reserved5, h->ndevs);
	for (k = 0; k < NVC_MAX_DEVS; k++) {
		int inrun = k >= nstripe && k < h->ndevs;

		if (!inrun != !h->grown[k] || h->grown[k] > h->nslots)
			return meta_refuse(
				why, len, -EUCLEAN,
				"header grown[%u] is %llu: members %u "
				"to %u hold grown slots, no other",
				k, (unsigned long long)h->grown[k], nstripe + 1,
				h->ndevs);
		grown += h->grown[k];
	}
	if (grown > h->nslots || h->nslots - grown < nstripe ||
	    (h->nslots - grown) % nstripe)
		return meta_refuse(
			why, len, -EUCLEAN,
			"header nslots %llu: with %llu grown slots, not "
			"a multiple of the stripe's %u members",
			(unsigned long long)h->nslots,
			(unsigned long long)grown, nstripe);
	if (meta_hdr_room(h) < h->nslots ||
	    meta_hdr_room(h) > space / h->slot_size)
		return meta_refuse(
			why, len, -EUCLEAN,
			"header room %llu: not from nslots %llu to what "
			"the mirror's %llu bytes hold",
			(unsigned long long)meta_hdr_room(h),
			(unsigned long long)h->nslots,
			(unsigned long long)space + META_HDR_SIZE);
	return 0;
}

static int hdr_ok(const struct meta_hdr *h, size_t maplen, char *why,
		  size_t len)
{
	uint32_t k, n;
	int ret;
	uint64_t room = maplen - META_HDR_SIZE;

	if (h->magic != META_MAGIC)
		return meta_refuse(why, len, -ENODATA,
				   "no nvcachefs metadata header");
	if (h->csum != meta_csum(h, offsetof(struct meta_hdr, csum)))
		return meta_refuse(why, len, -EUCLEAN,
				   "header checksum mismatch");
	if (h->version != META_VERSION && h->version != META_VERSION_V2)
		return meta_refuse(why, len, -EPROTO,
				   "header version %u, expected %u or %u",
				   h->version, META_VERSION_V2, META_VERSION);
	if (h->hdr_size != META_HDR_SIZE || h->file_size != META_FILE_SIZE ||
	    h->mirror > 1)
		return meta_refuse(
			why, len, -EUCLEAN,
			"header hdr_size %u, file_size %u, mirror %u; "
			"expected %u, %u, 0 or 1",
			h->hdr_size, h->file_size, h->mirror, META_HDR_SIZE,
			META_FILE_SIZE);
	if ((h->probe &
	     ~(META_PROBE_NS | META_PROBE_HANDLES | META_PROBE_COARSE)) ||
	    (h->probe && !(h->probe & META_PROBE_NS)) ||
	    (h->probe & META_PROBE_NS) > META_NS_NONE)
		return meta_refuse(
			why, len, -EUCLEAN,
			"header probe %#x: not a namespace from 1 to %u "
			"with flags %#x, or 0",
			h->probe, META_NS_NONE,
			META_PROBE_HANDLES | META_PROBE_COARSE);
	if (h->failed & ~3u || (h->failed >> h->mirror & 1))
		return meta_refuse(
			why, len, -EUCLEAN,
			"header failed %#x: not bits 0 and 1, or names "
			"its own mirror %u",
			h->failed, h->mirror);
	if (!block_size_ok(h->block_size))
		return meta_refuse(why, len, -EUCLEAN,
				   "header block_size %u is not a power of two "
				   "from 4K to 1M",
				   h->block_size);
	if (h->slot_size != meta_slot_size(h->block_size))
		return meta_refuse(why, len, -EUCLEAN,
				   "header slot_size %u, expected %u for "
				   "block_size %u",
				   h->slot_size, meta_slot_size(h->block_size),
				   h->block_size);
	if (h->ndevs < 1 || h->ndevs > NVC_MAX_DEVS)
		return meta_refuse(why, len, -EUCLEAN,
				   "header ndevs %u is not from 1 to %d",
				   h->ndevs, NVC_MAX_DEVS);
	ret = layout_ok(h, room, why, len);
	if (ret)
		return ret;
	if (h->nfiles < 1 || h->nfiles > META_MAX_FILES ||
	    (uint64_t)h->nfiles * META_FILE_SIZE >
		    room - meta_hdr_room(h) * h->slot_size)
		return meta_refuse(why, len, -EUCLEAN,
				   "header nfiles %u: not from 1 to %u records "
				   "that fit the mirror's %zu bytes",
				   h->nfiles, META_MAX_FILES, maplen);
	if (h->files_off != META_HDR_SIZE)
		return meta_refuse(why, len, -EUCLEAN,
				   "header files_off %llu, expected %u",
				   (unsigned long long)h->files_off,
				   META_HDR_SIZE);
	if (h->slots_off != h->files_off + (uint64_t)h->nfiles * META_FILE_SIZE)
		return meta_refuse(
			why, len, -EUCLEAN,
			"header slots_off %llu, expected %llu",
			(unsigned long long)h->slots_off,
			(unsigned long long)(h->files_off +
					     (uint64_t)h->nfiles *
						     META_FILE_SIZE));
	if (h->total_len !=
	    meta_total_len(meta_hdr_room(h), h->nfiles, h->block_size))
		return meta_refuse(
			why, len, -EUCLEAN,
			"header total_len %llu, expected %llu",
			(unsigned long long)h->total_len,
			(unsigned long long)meta_total_len(
				meta_hdr_room(h), h->nfiles, h->block_size));
	if (h->total_len > maplen)
		return meta_refuse(
			why, len, -EUCLEAN,
			"header total_len %llu exceeds the mirror's %zu "
			"bytes",
			(unsigned long long)h->total_len, maplen);
	if (h->detached > META_DETACHING || h->removing > h->ndevs)
		return meta_refuse(
			why, len, -EUCLEAN,
			"header detached %u, removing %u: not 0, 1 or 2, "
			"and not a member (of %u)",
			h->detached, h->removing, h->ndevs);
	for (k = 0, n = 0; k < NVC_MAX_DEVS; k++) {
		if (h->removed[k] > 1 || (h->removed[k] && k >= h->ndevs))
			return meta_refuse(
				why, len, -EUCLEAN,
				"header removed[%u] is %u: not 0 or 1, "
				"or past ndevs %u",
				k, h->removed[k], h->ndevs);
		n += h->removed[k];
	}
	if (n >= h->ndevs)
		return meta_refuse(
			why, len, -EUCLEAN,
			"header: every one of the %u members is removed",
			h->ndevs);
	if (h->replacing > h->ndevs || h->reserved3 ||
	    !memchr(h->replace_path, 0, sizeof(h->replace_path)) ||
	    !h->replacing != !h->replace_path[0])
		return meta_refuse(
			why, len, -EUCLEAN,
			"header replacing %u (of %u members), reserved3 "
			"%u, or its path: not a member with a path, or "
			"none without one",
			h->replacing, h->ndevs, h->reserved3);
	if (h->mirror_replacing > 2 || h->reserved4 ||
	    !memchr(h->mirror_path, 0, sizeof(h->mirror_path)) ||
	    !h->mirror_replacing != !h->mirror_path[0])
		return meta_refuse(
			why, len, -EUCLEAN,
			"header mirror_replacing %u, reserved4 %u, or its "
			"path: not a mirror with a path, or none without "
			"one",
			h->mirror_replacing, h->reserved4);
	ret = names_ok(h, why, len);
	if (ret)
		return ret;
	return members_ok(h, why, len);
}

int meta_hdr_why(const void *addr, size_t len, uint64_t *total_len, char *why,
		 size_t whylen)
{
	const struct meta_hdr *h = addr;
	int ret;

	if (!addr || len < META_HDR_SIZE)
		return meta_refuse(why, whylen, -ENODATA,
				   "%zu bytes, too small for a header", len);
	ret = hdr_ok(h, len, why, whylen);
	if (!ret && total_len)
		*total_len = h->total_len;
	return ret;
}

int meta_hdr_check(const void *addr, size_t len, uint64_t *total_len)
{
	return meta_hdr_why(addr, len, total_len, NULL, 0);
}
