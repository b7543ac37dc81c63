/* cache: superblocks and the two metadata mirrors, with sequence numbers and
 * checksums. */
#define _GNU_SOURCE
#include "meta.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <syslog.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

_Static_assert(sizeof(struct sb_disk) == 4096, "superblock is 4 KiB");
_Static_assert(sizeof(struct meta_hdr) == META_HDR_SIZE, "header is 4 KiB");
_Static_assert(sizeof(struct meta_file) == META_FILE_SIZE, "file record");

#define SLOT_HDR 24u

uint64_t meta_csum(const void *p, size_t len)
{
	return XXH64(p, len, 0x6e7663u);
}

uint32_t meta_words(uint32_t block_size)
{
	return (block_size / NVC_PAGE + 63) / 64;
}

uint32_t meta_slot_size(uint32_t block_size)
{
	uint32_t raw = SLOT_HDR + 16 * meta_words(block_size) + 8;

	return (raw + 63) & ~63u;
}

uint64_t meta_total_len(uint64_t nslots, uint32_t nfiles, uint32_t block_size)
{
	uint64_t len = META_HDR_SIZE + (uint64_t)nfiles * META_FILE_SIZE +
		       nslots * meta_slot_size(block_size);

	return (len + 4095) & ~4095ull;
}

static int is_zero(const uint8_t *p, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (p[i])
			return 0;
	return 1;
}

/* Fill why (if any) and return ret: the one way a check says no. */
static int refuse(char *why, size_t len, int ret, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int refuse(char *why, size_t len, int ret, const char *fmt, ...)
{
	va_list ap;

	if (why && len) {
		va_start(ap, fmt);
		vsnprintf(why, len, fmt, ap);
		va_end(ap);
	}
	return ret;
}

static int block_size_ok(uint64_t bs)
{
	return bs >= NVC_PAGE && bs <= META_MAX_WORDS * 64 * NVC_PAGE &&
	       !(bs & (bs - 1));
}

int sb_check(const struct sb_disk *sb, char *why, size_t len)
{
	if (sb->sb_size != sizeof(*sb))
		return refuse(why, len, -EUCLEAN, "sb_size %u, expected %zu",
			      sb->sb_size, sizeof(*sb));
	if (sb->data_off != SB_DATA_OFF)
		return refuse(why, len, -EUCLEAN,
			      "data_off %llu, expected %llu",
			      (unsigned long long)sb->data_off, SB_DATA_OFF);
	if (sb->ndevs < 1 || sb->ndevs > NVC_MAX_DEVS)
		return refuse(why, len, -EUCLEAN,
			      "ndevs %u is not from 1 to %d", sb->ndevs,
			      NVC_MAX_DEVS);
	if (sb->dev_index >= sb->ndevs)
		return refuse(why, len, -EUCLEAN,
			      "dev_index %u is not below ndevs %u",
			      sb->dev_index, sb->ndevs);
	if (!block_size_ok(sb->block_size))
		return refuse(why, len, -EUCLEAN,
			      "block_size %u is not a power of two from 4K "
			      "to 1M",
			      sb->block_size);
	if (sb->dev_size < sb->data_off || sb->slots_per_dev < 1 ||
	    sb->slots_per_dev > (sb->dev_size - sb->data_off) / sb->block_size)
		return refuse(why, len, -EUCLEAN,
			      "slots_per_dev %llu of %u bytes do not fit "
			      "dev_size %llu after data_off",
			      (unsigned long long)sb->slots_per_dev,
			      sb->block_size, (unsigned long long)sb->dev_size);
	return 0;
}

/* One copy of the superblock: 0 and in buf if it is valid. */
static int sb_copy_ok(const struct sb_disk *buf, char *why, size_t len)
{
	if (buf->magic != SB_MAGIC)
		return refuse(why, len, -ENODATA, "no nvcachefs magic");
	if (buf->csum != meta_csum(buf, offsetof(struct sb_disk, csum)))
		return refuse(why, len, -EUCLEAN, "checksum mismatch");
	if (buf->version != SB_VERSION)
		return refuse(why, len, -EPROTO, "version %u, expected %u",
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
			return refuse(why, len, -EUCLEAN,
				      "header member table: entry %u is %s, "
				      "but ndevs is %u",
				      k, k < h->ndevs ? "empty" : "set",
				      h->ndevs);
		for (j = 0; j < k && k < h->ndevs; j++)
			if (!memcmp(h->members[j], h->members[k], 16))
				return refuse(why, len, -EUCLEAN,
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
			return refuse(why, len, -EUCLEAN,
				      "header names[%u] is not terminated", k);
		if (k >= h->ndevs && (h->names[k][0] || h->rdevs[k] ||
				      h->tokens[k] || h->tokens_next[k]))
			return refuse(why, len, -EUCLEAN,
				      "header names[%u] (or its rdev or tokens) set "
				      "past ndevs %u", k,
				      h->ndevs);
	}
	return 0;
}

/* The slot entries the header's mirror has room for. */
static uint64_t hdr_room(const struct meta_hdr *h)
{
	return h->room ? h->room : h->nslots;
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
	     !is_zero((const uint8_t *)h->grown, sizeof(h->grown))))
		return refuse(why, len, -EUCLEAN,
			      "version 2 header with layout fields set");
	if (h->version == META_VERSION_V2)
		nstripe = h->ndevs;
	if (nstripe < 1 || nstripe > h->ndevs || h->reserved5)
		return refuse(why, len, -EUCLEAN,
			      "header stripe_devs %u (reserved5 %u): not from "
			      "1 to ndevs %u",
			      nstripe, h->reserved5, h->ndevs);
	for (k = 0; k < NVC_MAX_DEVS; k++) {
		int inrun = k >= nstripe && k < h->ndevs;

		if (!inrun != !h->grown[k] || h->grown[k] > h->nslots)
			return refuse(why, len, -EUCLEAN,
				      "header grown[%u] is %llu: members %u "
				      "to %u hold grown slots, no other",
				      k, (unsigned long long)h->grown[k],
				      nstripe + 1, h->ndevs);
		grown += h->grown[k];
	}
	if (grown > h->nslots || h->nslots - grown < nstripe ||
	    (h->nslots - grown) % nstripe)
		return refuse(why, len, -EUCLEAN,
			      "header nslots %llu: with %llu grown slots, not "
			      "a multiple of the stripe's %u members",
			      (unsigned long long)h->nslots,
			      (unsigned long long)grown, nstripe);
	if (hdr_room(h) < h->nslots || hdr_room(h) > space / h->slot_size)
		return refuse(why, len, -EUCLEAN,
			      "header room %llu: not from nslots %llu to what "
			      "the mirror's %llu bytes hold",
			      (unsigned long long)hdr_room(h),
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
		return refuse(why, len, -ENODATA,
			      "no nvcachefs metadata header");
	if (h->csum != meta_csum(h, offsetof(struct meta_hdr, csum)))
		return refuse(why, len, -EUCLEAN, "header checksum mismatch");
	if (h->version != META_VERSION && h->version != META_VERSION_V2)
		return refuse(why, len, -EPROTO,
			      "header version %u, expected %u or %u",
			      h->version, META_VERSION_V2, META_VERSION);
	if (h->hdr_size != META_HDR_SIZE || h->file_size != META_FILE_SIZE ||
	    h->mirror > 1)
		return refuse(why, len, -EUCLEAN,
			      "header hdr_size %u, file_size %u, mirror %u; "
			      "expected %u, %u, 0 or 1",
			      h->hdr_size, h->file_size, h->mirror,
			      META_HDR_SIZE, META_FILE_SIZE);
	if ((h->probe &
	     ~(META_PROBE_NS | META_PROBE_HANDLES | META_PROBE_COARSE)) ||
	    (h->probe && !(h->probe & META_PROBE_NS)) ||
	    (h->probe & META_PROBE_NS) > META_NS_NONE)
		return refuse(why, len, -EUCLEAN,
			      "header probe %#x: not a namespace from 1 to %u "
			      "with flags %#x, or 0",
			      h->probe, META_NS_NONE,
			      META_PROBE_HANDLES | META_PROBE_COARSE);
	if (h->failed & ~3u || (h->failed >> h->mirror & 1))
		return refuse(why, len, -EUCLEAN,
			      "header failed %#x: not bits 0 and 1, or names "
			      "its own mirror %u",
			      h->failed, h->mirror);
	if (!block_size_ok(h->block_size))
		return refuse(why, len, -EUCLEAN,
			      "header block_size %u is not a power of two "
			      "from 4K to 1M",
			      h->block_size);
	if (h->slot_size != meta_slot_size(h->block_size))
		return refuse(why, len, -EUCLEAN,
			      "header slot_size %u, expected %u for "
			      "block_size %u",
			      h->slot_size, meta_slot_size(h->block_size),
			      h->block_size);
	if (h->ndevs < 1 || h->ndevs > NVC_MAX_DEVS)
		return refuse(why, len, -EUCLEAN,
			      "header ndevs %u is not from 1 to %d", h->ndevs,
			      NVC_MAX_DEVS);
	ret = layout_ok(h, room, why, len);
	if (ret)
		return ret;
	if (h->nfiles < 1 || h->nfiles > META_MAX_FILES ||
	    (uint64_t)h->nfiles * META_FILE_SIZE >
		    room - hdr_room(h) * h->slot_size)
		return refuse(why, len, -EUCLEAN,
			      "header nfiles %u: not from 1 to %u records "
			      "that fit the mirror's %zu bytes",
			      h->nfiles, META_MAX_FILES, maplen);
	if (h->files_off != META_HDR_SIZE)
		return refuse(why, len, -EUCLEAN,
			      "header files_off %llu, expected %u",
			      (unsigned long long)h->files_off, META_HDR_SIZE);
	if (h->slots_off != h->files_off + (uint64_t)h->nfiles * META_FILE_SIZE)
		return refuse(why, len, -EUCLEAN,
			      "header slots_off %llu, expected %llu",
			      (unsigned long long)h->slots_off,
			      (unsigned long long)(h->files_off +
						   (uint64_t)h->nfiles *
							   META_FILE_SIZE));
	if (h->total_len != meta_total_len(hdr_room(h), h->nfiles, h->block_size))
		return refuse(why, len, -EUCLEAN,
			      "header total_len %llu, expected %llu",
			      (unsigned long long)h->total_len,
			      (unsigned long long)meta_total_len(
				      hdr_room(h), h->nfiles, h->block_size));
	if (h->total_len > maplen)
		return refuse(why, len, -EUCLEAN,
			      "header total_len %llu exceeds the mirror's %zu "
			      "bytes",
			      (unsigned long long)h->total_len, maplen);
	if (h->detached > META_DETACHING || h->removing > h->ndevs)
		return refuse(why, len, -EUCLEAN,
			      "header detached %u, removing %u: not 0, 1 or 2, "
			      "and not a member (of %u)",
			      h->detached, h->removing, h->ndevs);
	for (k = 0, n = 0; k < NVC_MAX_DEVS; k++) {
		if (h->removed[k] > 1 || (h->removed[k] && k >= h->ndevs))
			return refuse(why, len, -EUCLEAN,
				      "header removed[%u] is %u: not 0 or 1, "
				      "or past ndevs %u",
				      k, h->removed[k], h->ndevs);
		n += h->removed[k];
	}
	if (n >= h->ndevs)
		return refuse(why, len, -EUCLEAN,
			      "header: every one of the %u members is removed",
			      h->ndevs);
	if (h->replacing > h->ndevs || h->reserved3 ||
	    !memchr(h->replace_path, 0, sizeof(h->replace_path)) ||
	    !h->replacing != !h->replace_path[0])
		return refuse(why, len, -EUCLEAN,
			      "header replacing %u (of %u members), reserved3 "
			      "%u, or its path: not a member with a path, or "
			      "none without one",
			      h->replacing, h->ndevs, h->reserved3);
	if (h->mirror_replacing > 2 || h->reserved4 ||
	    !memchr(h->mirror_path, 0, sizeof(h->mirror_path)) ||
	    !h->mirror_replacing != !h->mirror_path[0])
		return refuse(why, len, -EUCLEAN,
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
		return refuse(why, whylen, -ENODATA,
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

/* Two valid headers describe the same cache and the same layout. */
static int hdr_same(const struct meta_hdr *a, const struct meta_hdr *b)
{
	return !memcmp(a->set_uuid, b->set_uuid, 16) &&
	       a->nslots == b->nslots && a->nfiles == b->nfiles &&
	       a->block_size == b->block_size && a->ndevs == b->ndevs &&
	       a->stripe_devs == b->stripe_devs && a->room == b->room &&
	       !memcmp(a->grown, b->grown, sizeof(a->grown)) &&
	       !memcmp(a->members, b->members, sizeof(a->members));
}

/* Two valid headers are mirrors of one cache with one mirror geometry (the
 * rest, the device set included, the current header says). */
static int hdr_one_cache(const struct meta_hdr *a, const struct meta_hdr *b)
{
	return !memcmp(a->set_uuid, b->set_uuid, 16) &&
	       a->nfiles == b->nfiles && a->block_size == b->block_size &&
	       hdr_room(a) == hdr_room(b) && a->total_len == b->total_len;
}

int meta_current(const struct meta_hdr *h[2], const int valid[2])
{
	if (!valid[0] && !valid[1])
		return -ENODATA;
	if (!valid[0] || !valid[1])
		return valid[0] ? 0 : 1;
	if ((h[0]->failed >> 1 & 1) && (h[1]->failed & 1))
		return -EUCLEAN;
	if (h[0]->failed >> 1 & 1)
		return 0;
	if (h[1]->failed & 1)
		return 1;
	return h[1]->gen > h[0]->gen ? 1 : 0;
}

/* The header the live mirrors make current; -1 if none is usable. */
static int cur_idx(struct meta *m)
{
	const struct meta_hdr *h[2] = { m->r[0].addr, m->r[1].addr };
	int k = meta_current(h, m->have);

	/* -EUCLEAN: refused at attach, so only a mirror failed since */
	return k >= 0 ? k : m->have[0] ? 0 : m->have[1] ? 1 : -1;
}

const struct meta_hdr *meta_hdr_of(struct meta *m)
{
	int k = cur_idx(m);

	return k < 0 ? NULL : m->r[k].addr;
}

/*
 * 1 if old (valid, of the same cache, not marked stale) is behind cur (the
 * current header, mirror c) no more than a crash between the two persists
 * of one header write leaves it: the same generation (the same writes, or
 * two headers written before generations), or mirror 0 one ahead (written
 * first).  Anything else (mirror 1 ahead without calling mirror 0 stale, or
 * a larger gap: a place that missed writes, found again) is not a torn write
 * but a stale mirror, rebuilt whole: its records may have missed writes
 * too.
 */
static int hdr_torn(const struct meta_hdr *cur, const struct meta_hdr *old,
		    int c)
{
	return cur->gen == old->gen || (c == 0 && cur->gen == old->gen + 1);
}

/*
 * The two headers of one attached cache are made the same: the older takes
 * every field of the current one (its own mirror index aside), persisted.
 * A crash between the two persists of a header write (hdr_apply: the member
 * set of a replace or an add, a grow, a remove's marks, a detach) leaves
 * mirror 0 one generation ahead; a write while mirror 0 had failed leaves
 * mirror 1 ahead (and calling mirror 0 stale, which is rebuilt whole).
 */
static int hdr_reconcile(struct meta *m, int cur)
{
	struct meta_hdr *to = m->r[!cur].addr;
	const struct meta_hdr *from = m->r[cur].addr;
	struct meta_hdr want;

	memcpy(&want, from, sizeof(want));
	want.mirror = !cur;
	want.csum = meta_csum(&want, offsetof(struct meta_hdr, csum));
	if (!memcmp(&want, to, sizeof(want)))
		return 0;
	log_msg(LOG_NOTICE,
		"metadata mirror %d's header (generation %llu) was older than "
		"mirror %d's (generation %llu): it takes the current one",
		!cur, (unsigned long long)to->gen, cur,
		(unsigned long long)from->gen);
	memcpy(to, &want, sizeof(want));
	return pm_persist(&m->r[!cur], to, META_HDR_SIZE);
}

static void meta_geometry(struct meta *m, const struct meta_hdr *h)
{
	memcpy(m->set_uuid, h->set_uuid, 16);
	m->nslots = h->nslots;
	m->nfiles = h->nfiles;
	m->block_size = h->block_size;
	m->ndevs = h->ndevs;
	m->words = meta_words(h->block_size);
	m->slot_size = h->slot_size;
	m->files_off = h->files_off;
	m->slots_off = h->slots_off;
	meta_layout_of(h, &m->layout);
}

static const char *mname(const char *const names[2], int i, char *buf,
			 size_t len)
{
	if (names && names[i])
		snprintf(buf, len, "%s", names[i]);
	else
		snprintf(buf, len, "%d", i);
	return buf;
}

/* The generation the next header write takes: one past both mirrors'. */
static uint64_t next_gen(struct meta *m)
{
	uint64_t g = 0;
	int k;

	for (k = 0; k < 2; k++)
		if (m->have[k] && ((const struct meta_hdr *)m->r[k].addr)->gen > g)
			g = ((const struct meta_hdr *)m->r[k].addr)->gen;
	return g + 1;
}

/* Write mirror k's header with its failed bits set to failed. */
static int hdr_set_failed(struct meta *m, int k, uint32_t failed)
{
	struct meta_hdr *h = m->r[k].addr;

	/* a header write like any other: a generation of its own */
	if (failed != h->failed)
		h->gen = next_gen(m);
	h->failed = failed;
	h->csum = meta_csum(h, offsetof(struct meta_hdr, csum));
	return pm_persist(&m->r[k], h, META_HDR_SIZE);
}

/* A header field (off, len) as the first usable mirror has it; zeros if
 * none. */
static void hdr_get(struct meta *m, size_t off, void *out, size_t len)
{
	int k;

	memset(out, 0, len);
	pthread_rwlock_rdlock(&m->swap);
	k = cur_idx(m);
	if (k >= 0)
		memcpy(out, (const char *)m->r[k].addr + off, len);
	pthread_rwlock_unlock(&m->swap);
}

/* fn applied to each usable mirror's header in turn, each checksummed and
 * persisted before the next is touched. */
static int hdr_apply(struct meta *m,
		     void (*fn)(struct meta_hdr *h, const void *arg),
		     const void *arg)
{
	int k, ret = 0, done = 0;
	uint64_t gen;

	pthread_rwlock_rdlock(&m->swap);
	gen = next_gen(m);
	for (k = 0; k < 2; k++) {
		struct meta_hdr *h = m->r[k].addr;

		if (!m->have[k] || m->failed[k])
			continue;
		fn(h, arg);
		h->gen = gen;
		h->csum = meta_csum(h, offsetof(struct meta_hdr, csum));
		ret = pm_persist(&m->r[k], h, META_HDR_SIZE);
		if (ret)
			break;
		done++;
	}
	pthread_rwlock_unlock(&m->swap);
	return ret ? ret : done ? 0 : -EIO;
}

struct hdr_field {
	size_t off, len;
	const void *val;
};

static void field_set(struct meta_hdr *h, const void *arg)
{
	const struct hdr_field *f = arg;

	memcpy((char *)h + f->off, f->val, f->len);
}

/* A header field (off, len) written into each usable mirror in turn. */
static int hdr_put(struct meta *m, size_t off, const void *val, size_t len)
{
	struct hdr_field f = { off, len, val };

	assert(off + len <= offsetof(struct meta_hdr, csum));
	return hdr_apply(m, field_set, &f);
}

void meta_store_stamp(struct meta *m, uint8_t out[16])
{
	hdr_get(m, offsetof(struct meta_hdr, store_stamp), out, 16);
}

int meta_set_store_stamp(struct meta *m, const uint8_t stamp[16])
{
	return hdr_put(m, offsetof(struct meta_hdr, store_stamp), stamp, 16);
}

uint32_t meta_probe(struct meta *m)
{
	uint32_t v;

	hdr_get(m, offsetof(struct meta_hdr, probe), &v, sizeof(v));
	return v;
}

int meta_set_probe(struct meta *m, uint32_t probe)
{
	return hdr_put(m, offsetof(struct meta_hdr, probe), &probe,
		       sizeof(probe));
}

uint32_t meta_detach_state(struct meta *m)
{
	uint32_t v;

	hdr_get(m, offsetof(struct meta_hdr, detached), &v, sizeof(v));
	return v;
}

uint32_t meta_removing(struct meta *m)
{
	uint32_t v;

	hdr_get(m, offsetof(struct meta_hdr, removing), &v, sizeof(v));
	return v;
}

int meta_set_removing(struct meta *m, uint32_t member1)
{
	return hdr_put(m, offsetof(struct meta_hdr, removing), &member1,
		       sizeof(member1));
}

int meta_set_detached(struct meta *m, uint32_t detached)
{
	return hdr_put(m, offsetof(struct meta_hdr, detached), &detached,
		       sizeof(detached));
}

/*
 * The bad mirror becomes a copy of the good one; only then does the good
 * one's header stop calling it stale (a crash in between rebuilds it again).
 */
static int meta_rebuild(struct meta *m, int bad, int good, uint64_t total)
{
	struct meta_hdr *h = m->r[bad].addr;
	int ret;

	/* the records first, the header last: a copy cut short by a crash
	 * has no valid header, so it never passes for a mirror */
	memset(h, 0, META_HDR_SIZE);
	ret = pm_persist(&m->r[bad], h, META_HDR_SIZE);
	memcpy((char *)m->r[bad].addr + META_HDR_SIZE,
	       (const char *)m->r[good].addr + META_HDR_SIZE,
	       total - META_HDR_SIZE);
	if (!ret)
		ret = pm_persist(&m->r[bad],
				 (char *)m->r[bad].addr + META_HDR_SIZE,
				 total - META_HDR_SIZE);
	memcpy(h, m->r[good].addr, META_HDR_SIZE);
	h->mirror = bad;
	h->failed = 0;
	h->csum = meta_csum(h, offsetof(struct meta_hdr, csum));
	m->have[bad] = 1;
	m->rebuilt[bad] = 1;
	if (!ret)
		ret = pm_persist(&m->r[bad], h, META_HDR_SIZE);
	/* a stand-in for a missing device is no copy: the mark stays */
	if (ret || m->r[bad].missing ||
	    !((const struct meta_hdr *)m->r[good].addr)->failed)
		return ret;
	/* the mark goes (a generation of its own, so that a place that was
	 * stale before, found again, is never one generation behind), then
	 * the copy takes that header too */
	ret = hdr_set_failed(m, good, 0);
	if (ret)
		return ret;
	memcpy(h, m->r[good].addr, META_HDR_SIZE);
	h->mirror = bad;
	h->csum = meta_csum(h, offsetof(struct meta_hdr, csum));
	return pm_persist(&m->r[bad], h, META_HDR_SIZE);
}

int meta_mark_stale(struct meta *m, int i)
{
	struct meta_hdr *h = m->r[!i].addr;

	assert(m->have[!i]);
	return hdr_set_failed(m, !i, h->failed | 1u << i);
}

/* A mirror that a valid header of the other calls stale is not trusted. */
void meta_members(struct meta *m, uint8_t out[NVC_MAX_DEVS][16])
{
	hdr_get(m, offsetof(struct meta_hdr, members), out, NVC_MAX_DEVS * 16);
}

/* The member table; a member whose UUID changes (a replace, an add) has no
 * token until the next mount writes one. */
static void members_set(struct meta_hdr *h, const void *arg)
{
	const uint8_t(*members)[16] = arg;
	int k;

	for (k = 0; k < NVC_MAX_DEVS; k++)
		if (memcmp(h->members[k], members[k], 16))
			h->tokens[k] = h->tokens_next[k] = 0;
	memcpy(h->members, members, sizeof(h->members));
}

int meta_set_members(struct meta *m, uint8_t members[NVC_MAX_DEVS][16])
{
	return hdr_apply(m, members_set, members);
}

struct tokens {
	const uint64_t *tok;
	int next;
};

static void tokens_set(struct meta_hdr *h, const void *arg)
{
	const struct tokens *t = arg;
	int k;

	for (k = 0; k < NVC_MAX_DEVS; k++) {
		if (!t->tok[k])
			continue;
		if (t->next) {
			h->tokens_next[k] = t->tok[k];
		} else {
			h->tokens[k] = t->tok[k];
			h->tokens_next[k] = 0;
		}
	}
}

int meta_set_tokens(struct meta *m, const uint64_t tok[NVC_MAX_DEVS],
		    int next)
{
	struct tokens t = { tok, next };

	return hdr_apply(m, tokens_set, &t);
}

struct hdr_replacing {
	uint32_t replacing;
	uint32_t reserved3;
	char path[256];
};
_Static_assert(offsetof(struct meta_hdr, replace_path) ==
		       offsetof(struct meta_hdr, replacing) + 8,
	       "replacing, reserved3 and replace_path are one run");

_Static_assert(offsetof(struct meta_hdr, mirror_path) ==
		       offsetof(struct meta_hdr, mirror_replacing) + 8,
	       "mirror_replacing, reserved4 and mirror_path are one run");

/* A (number, path) run of the header at off: hdr_replacing's shape. */
static uint32_t run_get(struct meta *m, size_t off, char path[256])
{
	struct hdr_replacing r;

	hdr_get(m, off, &r, sizeof(r));
	memcpy(path, r.path, sizeof(r.path));
	return r.replacing;
}

static int run_put(struct meta *m, size_t off, uint32_t v, const char *path)
{
	struct hdr_replacing r = { .replacing = v };

	if (path && strlen(path) >= sizeof(r.path))
		return -ENAMETOOLONG;
	if (path)
		strcpy(r.path, path);
	return hdr_put(m, off, &r, sizeof(r));
}

uint32_t meta_mirror_replacing(struct meta *m, char path[256])
{
	return run_get(m, offsetof(struct meta_hdr, mirror_replacing), path);
}

int meta_set_mirror_replacing(struct meta *m, uint32_t mirror1,
			      const char *path)
{
	return run_put(m, offsetof(struct meta_hdr, mirror_replacing), mirror1,
		       path);
}

uint32_t meta_replacing(struct meta *m, char path[256])
{
	return run_get(m, offsetof(struct meta_hdr, replacing), path);
}

int meta_set_replacing(struct meta *m, uint32_t member1, const char *path)
{
	return run_put(m, offsetof(struct meta_hdr, replacing), member1, path);
}

void meta_removed(struct meta *m, uint8_t out[NVC_MAX_DEVS])
{
	hdr_get(m, offsetof(struct meta_hdr, removed), out, NVC_MAX_DEVS);
}

int meta_set_removed(struct meta *m, const uint8_t removed[NVC_MAX_DEVS])
{
	return hdr_put(m, offsetof(struct meta_hdr, removed), removed,
		       NVC_MAX_DEVS);
}

struct grow {
	int k;
	const uint8_t *uuid;
	uint64_t count;
};

static void grow_set(struct meta_hdr *h, const void *arg)
{
	const struct grow *g = arg;

	if (h->version == META_VERSION_V2) {
		h->version = META_VERSION;
		h->stripe_devs = h->ndevs;
		h->room = h->nslots;
	}
	memcpy(h->members[g->k], g->uuid, 16);
	h->tokens[g->k] = h->tokens_next[g->k] = 0;
	h->grown[g->k] = g->count;
	h->ndevs = g->k + 1;
	h->nslots += g->count;
}

int meta_grow(struct meta *m, int k, const uint8_t uuid[16], uint64_t count)
{
	struct grow g = { k, uuid, count };
	uint64_t off = m->slots_off + m->nslots * m->slot_size;
	size_t len = count * m->slot_size;
	int i, ret;

	assert(k == (int)m->ndevs && k < NVC_MAX_DEVS && count);
	if (m->nslots + count > m->layout.room)
		return -ENOSPC;
	pthread_rwlock_rdlock(&m->swap);
	for (i = 0, ret = 0; i < 2 && !ret; i++) {
		if (!m->have[i] || m->failed[i])
			continue;
		memset((char *)m->r[i].addr + off, 0, len);
		ret = pm_persist(&m->r[i], (char *)m->r[i].addr + off, len);
	}
	pthread_rwlock_unlock(&m->swap);
	if (!ret)
		ret = hdr_apply(m, grow_set, &g);
	if (ret)
		return ret;
	m->layout.base[k] = m->nslots;
	m->layout.count[k] = count;
	m->ndevs = k + 1;
	m->nslots += count;
	return 0;
}

/*
 * Replacing a mirror while mounted.  Every access to m->r[] at run time holds
 * m->swap for reading; here it is held for writing, so no record write is
 * under way while the new region is filled from the other mirror (a copy
 * that is all the other holds, by meta_rebuild, header last marked good)
 * and takes mirror k's place.  A failure leaves the old region in place, in
 * the state it had.
 */
int meta_replace(struct meta *m, int k, struct pm_region *nr,
		 struct pm_region *old)
{
	int o = !k, ret, had, failed, rebuilt;
	uint64_t total;

	pthread_rwlock_wrlock(&m->swap);
	had = m->have[k];
	failed = m->failed[k];
	rebuilt = m->rebuilt[k];
	if (!m->have[o]) {
		ret = -ENODATA;
		goto out_unlock;
	}
	total = ((const struct meta_hdr *)m->r[o].addr)->total_len;
	if (nr->len < total) {
		ret = -ENOSPC;
		goto out_unlock;
	}
	*old = m->r[k];
	m->r[k] = *nr;
	ret = meta_rebuild(m, k, o, total);
	if (ret) {
		m->r[k] = *old;
		m->have[k] = had;
		m->failed[k] = failed;
		m->rebuilt[k] = rebuilt;
		goto out_unlock;
	}
	m->failed[k] = 0;
	m->rebuilt[k] = 0;
out_unlock:
	pthread_rwlock_unlock(&m->swap);
	return ret;
}

static void drop_stale(struct meta *m, const struct meta_hdr *h[2], int ret[2],
		       char why[2][256])
{
	int i;

	for (i = 0; i < 2; i++)
		if (m->have[i] && m->have[!i] && (h[i]->failed >> !i & 1)) {
			m->have[!i] = 0;
			ret[!i] = -ESTALE;
			snprintf(why[!i], 256,
				 "stale: the other mirror's header says it "
				 "failed a write");
		}
}

/* Attach without repairing anything: the offline check only reads.  The
 * current header (meta_current) gives the geometry; the other mirror is
 * read too only where its header describes the same set. */
int meta_attach_ro_named(struct meta *m, struct pm_region r[2],
			 const char *const names[2], char *err, size_t len)
{
	const struct meta_hdr *hh[2] = { r[0].addr, r[1].addr };
	char why[2][256], n[2][128];
	int i, ret[2], cur;

	memset(m, 0, sizeof(*m));
	pthread_rwlock_init(&m->swap, NULL);
	for (i = 0; i < 2; i++) {
		m->r[i] = r[i];
		ret[i] = meta_hdr_why(r[i].addr, r[i].len, NULL, why[i],
				      sizeof(why[i]));
		m->have[i] = !ret[i];
	}
	cur = meta_current(hh, m->have);
	if (cur == -EUCLEAN)
		cur = 0; /* check reports it; the records are still read */
	if (cur < 0) {
		snprintf(err, len,
			 "no valid metadata mirror (mirror %s: %s; mirror %s: "
			 "%s)",
			 mname(names, 0, n[0], sizeof(n[0])), why[0],
			 mname(names, 1, n[1], sizeof(n[1])), why[1]);
		return -ENODATA;
	}
	drop_stale(m, hh, ret, why);
	m->have[cur] = 1;
	if (m->have[!cur] && !hdr_same(hh[cur], hh[!cur]))
		m->have[!cur] = 0;
	meta_geometry(m, hh[cur]);
	return 0;
}

int meta_attach_ro(struct meta *m, struct pm_region r[2], char *err, size_t len)
{
	return meta_attach_ro_named(m, r, NULL, err, len);
}

int meta_attach_named(struct meta *m, struct pm_region r[2],
		      const char *const names[2], char *err, size_t len)
{
	const struct meta_hdr *h[2];
	char why[2][256], n[2][128];
	int i, ret[2], good = -1;

	memset(m, 0, sizeof(*m));
	pthread_rwlock_init(&m->swap, NULL);
	for (i = 0; i < 2; i++) {
		m->r[i] = r[i];
		h[i] = r[i].addr;
		ret[i] = meta_hdr_why(r[i].addr, r[i].len, NULL, why[i],
				      sizeof(why[i]));
		mname(names, i, n[i], sizeof(n[i]));
		m->have[i] = !ret[i];
	}
	good = meta_current(h, m->have);
	if (good == -EUCLEAN) {
		snprintf(err, len,
			 "each metadata mirror says the other failed; the "
			 "cache cannot tell which one is current");
		return -EUCLEAN;
	}
	if (good < 0) {
		snprintf(err, len,
			 "neither metadata mirror holds a valid nvcachefs "
			 "header (mirror %s: %s; mirror %s: %s); run "
			 "nvcachectl format",
			 n[0], why[0], n[1], why[1]);
		return -ENODATA;
	}
	drop_stale(m, h, ret, why);
	assert(m->have[good]);
	if (m->have[!good] && !hdr_one_cache(h[good], h[!good])) {
		snprintf(err, len,
			 "the two metadata mirrors (%s, %s) belong to "
			 "different caches",
			 n[0], n[1]);
		return -EINVAL;
	}
	if (m->have[!good] && !hdr_torn(h[good], h[!good], good)) {
		/* it missed header writes, so maybe records too */
		m->have[!good] = 0;
		ret[!good] = -ESTALE;
		snprintf(why[!good], sizeof(why[!good]),
			 "stale: its header's generation %llu is behind the "
			 "other's %llu by more than one interrupted write",
			 (unsigned long long)h[!good]->gen,
			 (unsigned long long)h[good]->gen);
	}
	if (m->have[!good]) {
		ret[!good] = hdr_reconcile(m, good);
		if (ret[!good]) {
			snprintf(err, len,
				 "cannot bring metadata mirror %s's header up "
				 "to date: %s",
				 n[!good], strerror(-ret[!good]));
			return ret[!good];
		}
	}
	for (i = 0; i < 2; i++) {
		if (m->have[i])
			continue;
		/* the damaged or lost mirror becomes a copy of the good one */
		if (!r[i].addr || r[i].len < h[good]->total_len) {
			snprintf(err, len,
				 "metadata mirror %s is not valid (%s) and too "
				 "small to rebuild",
				 n[i], why[i]);
			return -EUCLEAN;
		}
		m->bad_reason[i] = ret[i];
		ret[i] = meta_rebuild(m, i, good, h[good]->total_len);
		if (ret[i]) {
			snprintf(err, len,
				 "cannot rebuild metadata mirror %s: %s", n[i],
				 strerror(-ret[i]));
			return ret[i];
		}
	}
	meta_geometry(m, h[good]);
	return 0;
}

int meta_attach(struct meta *m, struct pm_region r[2], char *err, size_t len)
{
	return meta_attach_named(m, r, NULL, err, len);
}

static void slot_encode(const struct meta *m, const struct meta_slot *s,
			uint8_t *out)
{
	uint32_t w = m->words;

	memset(out, 0, m->slot_size);
	memcpy(out, &s->seq, 8);
	memcpy(out + 8, &s->file, 4);
	memcpy(out + 12, &s->flags, 4);
	memcpy(out + 16, &s->blk, 8);
	memcpy(out + SLOT_HDR, s->valid, 8 * w);
	memcpy(out + SLOT_HDR + 8 * w, s->dirty, 8 * w);
	{
		uint64_t c = meta_csum(out, m->slot_size - 8);

		memcpy(out + m->slot_size - 8, &c, 8);
	}
}

/* The fields of a decoded slot entry that the map trusts. */
static int slot_fields_ok(const struct meta *m, const struct meta_slot *s,
			  char *why, size_t len)
{
	uint32_t ppb = m->block_size / NVC_PAGE, w;

	if (s->seq >= META_SEQ_MAX)
		return refuse(why, len, -EUCLEAN, "seq %llu is out of range",
			      (unsigned long long)s->seq);
	if (s->flags & ~META_SLOT_FLAGS)
		return refuse(why, len, -EUCLEAN, "unknown flags %#x",
			      s->flags);
	if (!s->file)
		return 0;
	if (s->file > m->nfiles)
		return refuse(why, len, -EUCLEAN, "file %u is past nfiles %u",
			      s->file, m->nfiles);
	if (s->blk >= INT64_MAX / m->block_size)
		return refuse(why, len, -EUCLEAN,
			      "blk %llu is past the largest file",
			      (unsigned long long)s->blk);
	for (w = 0; w < m->words; w++) {
		uint64_t past = ppb >= 64 * (w + 1) ? 0
				: ppb <= 64 * w	    ? ~0ull
						    : ~0ull << (ppb - 64 * w);

		if ((s->valid[w] | s->dirty[w]) & past)
			return refuse(why, len, -EUCLEAN,
				      "pages past the block's %u are marked",
				      ppb);
	}
	return 0;
}

static int slot_decode(const struct meta *m, const uint8_t *in,
		       struct meta_slot *s, char *why, size_t len)
{
	uint64_t c;
	uint32_t w = m->words;

	assert(w <= META_MAX_WORDS && m->slot_size >= SLOT_HDR + 16 * w + 8);
	memcpy(&c, in + m->slot_size - 8, 8);
	if (c != meta_csum(in, m->slot_size - 8))
		return refuse(why, len, -EUCLEAN, "checksum mismatch");
	memset(s, 0, sizeof(*s));
	memcpy(&s->seq, in, 8);
	memcpy(&s->file, in + 8, 4);
	memcpy(&s->flags, in + 12, 4);
	memcpy(&s->blk, in + 16, 8);
	memcpy(s->valid, in + SLOT_HDR, 8 * w);
	memcpy(s->dirty, in + SLOT_HDR + 8 * w, 8 * w);
	return slot_fields_ok(m, s, why, len);
}

/*
 * A path a file record may hold: empty, or relative, below the backing
 * directory (no "..", ".", empty or absolute component), NUL-terminated at
 * len and nowhere before.
 */
int meta_path_ok(const char *path, uint32_t len)
{
	const char *p, *end = path + len;

	if (len >= META_PATH_MAX || path[len] || strnlen(path, len) != len)
		return 0;
	for (p = path; p < end;) {
		const char *e = memchr(p, '/', end - p);
		size_t n = (e ? e : end) - p;

		if (!n || (n == 1 && p[0] == '.') ||
		    (n == 2 && p[0] == '.' && p[1] == '.'))
			return 0;
		if (!e)
			break;
		p = e + 1;
		if (p == end)
			return 0;
	}
	return 1;
}

/* A file record copy: free (all zero), or checksummed with sane fields. */
static int file_ok(const struct meta_file *f, char *why, size_t len)
{
	if (f->csum != meta_csum(f, offsetof(struct meta_file, csum)))
		return refuse(why, len, -EUCLEAN, "checksum mismatch");
	if (f->seq >= META_SEQ_MAX)
		return refuse(why, len, -EUCLEAN, "seq %llu is out of range",
			      (unsigned long long)f->seq);
	if (f->flags & ~META_FILE_FLAGS)
		return refuse(why, len, -EUCLEAN, "unknown flags %#x",
			      f->flags);
	if (!(f->flags & MF_USED))
		return 0;
	if (f->handle_bytes > META_HANDLE_MAX)
		return refuse(why, len, -EUCLEAN,
			      "handle_bytes %u is past %u", f->handle_bytes,
			      META_HANDLE_MAX);
	if (!meta_path_ok(f->path, f->path_len))
		return refuse(why, len, -EUCLEAN,
			      "path (%u bytes) is not a relative path below "
			      "the backing directory",
			      f->path_len);
	if (!f->handle_bytes && !f->path_len)
		return refuse(why, len, -EUCLEAN,
			      "neither a file handle nor a path");
	if (f->size > INT64_MAX || f->bk_size > INT64_MAX)
		return refuse(why, len, -EUCLEAN,
			      "size %llu or bk_size %llu is past the largest "
			      "file",
			      (unsigned long long)f->size,
			      (unsigned long long)f->bk_size);
	return 0;
}

static uint8_t *slot_addr(struct meta *m, int mirror, uint64_t i)
{
	return (uint8_t *)m->r[mirror].addr + m->slots_off + i * m->slot_size;
}

static uint8_t *file_addr(struct meta *m, int mirror, uint32_t i)
{
	return (uint8_t *)m->r[mirror].addr + m->files_off +
	       (uint64_t)i * META_FILE_SIZE;
}

/*
 * An all-zero entry is a free one, as format leaves it.  A checksum mismatch
 * in one mirror is a torn or damaged copy: the other mirror decides.
 */
static int get_slot_locked(struct meta *m, uint64_t i, struct meta_slot *out,
			   int *bad);

int meta_get_slot(struct meta *m, uint64_t i, struct meta_slot *out, int *bad)
{
	int ret;

	pthread_rwlock_rdlock(&m->swap);
	ret = get_slot_locked(m, i, out, bad);
	pthread_rwlock_unlock(&m->swap);
	return ret;
}

static int get_slot_locked(struct meta *m, uint64_t i, struct meta_slot *out,
			   int *bad)
{
	struct meta_slot s[2];
	int ok[2], k;

	*bad = 0;
	for (k = 0; k < 2; k++) {
		const uint8_t *p = slot_addr(m, k, i);

		ok[k] = 0;
		if (!m->have[k])
			continue;
		if (is_zero(p, m->slot_size)) {
			memset(&s[k], 0, sizeof(s[k]));
			ok[k] = 1;
		} else if (!slot_decode(m, p, &s[k], NULL, 0)) {
			ok[k] = 1;
		} else {
			(*bad)++;
		}
	}
	if (ok[0] && ok[1])
		k = s[1].seq > s[0].seq;
	else if (ok[0] || ok[1])
		k = ok[1];
	else
		return 0;
	*out = s[k];
	return 1;
}

static int get_file_locked(struct meta *m, uint32_t i, struct meta_file *out,
			   int *bad);

int meta_get_file(struct meta *m, uint32_t i, struct meta_file *out, int *bad)
{
	int ret;

	pthread_rwlock_rdlock(&m->swap);
	ret = get_file_locked(m, i, out, bad);
	pthread_rwlock_unlock(&m->swap);
	return ret;
}

static int get_file_locked(struct meta *m, uint32_t i, struct meta_file *out,
			   int *bad)
{
	const struct meta_file *f[2];
	int ok[2], k;
	static const struct meta_file zero;

	*bad = 0;
	for (k = 0; k < 2; k++) {
		f[k] = (const struct meta_file *)file_addr(m, k, i);
		ok[k] = 0;
		if (!m->have[k])
			continue;
		if (is_zero((const uint8_t *)f[k], META_FILE_SIZE) ||
		    !file_ok(f[k], NULL, 0))
			ok[k] = 1;
		else
			(*bad)++;
	}
	if (ok[0] && ok[1])
		k = f[1]->seq > f[0]->seq;
	else if (ok[0] || ok[1])
		k = ok[1];
	else
		return 0;
	*out = (f[k]->flags & MF_USED) ? *f[k] : zero;
	return 1;
}

/* "mirror 0: why; mirror 1: why" for a record refused in both */
void meta_slot_why(struct meta *m, uint64_t i, char *why, size_t len)
{
	size_t at = 0;
	int k;

	why[0] = 0;
	for (k = 0; k < 2 && at < len; k++) {
		const uint8_t *p = slot_addr(m, k, i);
		struct meta_slot s;
		char one[128] = "not attached";

		if (m->have[k] && (is_zero(p, m->slot_size) ||
				   !slot_decode(m, p, &s, one, sizeof(one))))
			continue;
		at += snprintf(why + at, len - at, "%smirror %d: %s",
			       at ? "; " : "", k, one);
	}
}

void meta_file_why(struct meta *m, uint32_t i, char *why, size_t len)
{
	size_t at = 0;
	int k;

	why[0] = 0;
	for (k = 0; k < 2 && at < len; k++) {
		const struct meta_file *f =
			(const struct meta_file *)file_addr(m, k, i);
		char one[128] = "not attached";

		if (m->have[k] &&
		    (is_zero((const uint8_t *)f, META_FILE_SIZE) ||
		     !file_ok(f, one, sizeof(one))))
			continue;
		at += snprintf(why + at, len - at, "%smirror %d: %s",
			       at ? "; " : "", k, one);
	}
}

/*
 * Mirror k failed a write: it is written no more, and the other mirror's
 * header says so before anything else is written there.  Once per mirror.
 */
static void meta_fail(struct meta *m, int k, int err)
{
	int o = !k;

	if (__atomic_exchange_n(&m->failed[k], 1, __ATOMIC_ACQ_REL))
		return;
	__atomic_store_n(&m->have[k], 0, __ATOMIC_RELEASE);
	log_msg(LOG_CRIT,
		"metadata mirror %d failed a write (%s): the cache goes on "
		"with mirror %d alone; the failed one is rebuilt at the next "
		"mount",
		k, strerror(-err), o);
	if (!__atomic_load_n(&m->have[o], __ATOMIC_ACQUIRE))
		return;
	err = hdr_set_failed(m, o,
			     ((struct meta_hdr *)m->r[o].addr)->failed | 1u << k);
	if (err)
		meta_fail(m, o, err);
}

static int meta_put_locked(struct meta *m, uint64_t off, const void *rec,
			   size_t len);

/* Write one record at offset off of every mirror in turn. */
static int meta_put(struct meta *m, uint64_t off, const void *rec, size_t len)
{
	int ret;

	pthread_rwlock_rdlock(&m->swap);
	ret = meta_put_locked(m, off, rec, len);
	pthread_rwlock_unlock(&m->swap);
	return ret;
}

static int meta_put_locked(struct meta *m, uint64_t off, const void *rec,
			   size_t len)
{
	int k, ret, held = 0;

	for (k = 0; k < 2; k++) {
		if (!__atomic_load_n(&m->have[k], __ATOMIC_ACQUIRE))
			continue;
		ret = pm_write(&m->r[k], off, rec, len);
		if (ret)
			meta_fail(m, k, ret);
		else
			held++;
	}
	/* a mirror dropped after its write still holds the record, but it
	 * is stale for the next mount: only the surviving one counts */
	for (k = 0; k < 2; k++)
		if (__atomic_load_n(&m->have[k], __ATOMIC_ACQUIRE))
			return held ? 0 : -EIO;
	return -EIO;
}

uint64_t meta_next_seq(struct meta *m)
{
	uint64_t i, next = 0;
	struct meta_slot s;
	int k;

	for (k = 0; k < 2; k++) {
		if (!m->have[k])
			continue;
		for (i = 0; i < m->nfiles; i++) {
			const struct meta_file *f =
				(const struct meta_file *)file_addr(m, k, i);

			if (!file_ok(f, NULL, 0) && f->seq >= next)
				next = f->seq + 1;
		}
		for (i = 0; i < m->nslots; i++)
			if (!slot_decode(m, slot_addr(m, k, i), &s, NULL, 0) &&
			    s.seq >= next)
				next = s.seq + 1;
	}
	return next;
}

int meta_writable(struct meta *m)
{
	return __atomic_load_n(&m->have[0], __ATOMIC_ACQUIRE) ||
	       __atomic_load_n(&m->have[1], __ATOMIC_ACQUIRE);
}

int meta_put_slot(struct meta *m, uint64_t i, struct meta_slot *s)
{
	uint8_t buf[128];

	/* never under c->lock (cache/engine.h) */
	assert(!dev_mutex_mine(m->nolock));
	s->seq = __atomic_fetch_add(&m->seq, 1, __ATOMIC_RELAXED);
	slot_encode(m, s, buf);
	return meta_put(m, m->slots_off + i * m->slot_size, buf, m->slot_size);
}

/*
 * Entries idx[0..n) (ascending, no two alike) as s[] says them, each mirror
 * written and persisted before the other as by meta_put_slot(), but each run
 * of adjacent entries as one record: one persist per mirror and run instead
 * of one per entry.  res[j]: entry j's result.  The entries' order among
 * themselves is free: their writer acknowledges nothing before all of them
 * are persisted.
 */
void meta_put_slots(struct meta *m, const uint64_t *idx, struct meta_slot *s,
		    int n, int *res)
{
	uint8_t buf[SLOTS_RUN_MAX * 128];
	int j, k;

	for (j = 0; j < n; j = k) {
		int ret;

		assert(j == 0 || idx[j] > idx[j - 1]);
		assert(!dev_mutex_mine(m->nolock));
		for (k = j; k < n && k - j < SLOTS_RUN_MAX &&
			    idx[k] == idx[j] + (uint64_t)(k - j);
		     k++) {
			s[k].seq = __atomic_fetch_add(&m->seq, 1,
						      __ATOMIC_RELAXED);
			slot_encode(m, &s[k], buf + (k - j) * m->slot_size);
		}
		ret = meta_put(m, m->slots_off + idx[j] * m->slot_size, buf,
			       (k - j) * m->slot_size);
		while (j < k)
			res[j++] = ret;
	}
}

/*
 * Every mirror in use already holds entry i as s says it (the sequence
 * number aside), with a valid checksum: writing it again would change
 * nothing the next mount reads, so the caller may skip the persist.  The
 * entry's writer calls this (one writer per entry: cache/engine.h).
 */
int meta_slot_same(struct meta *m, uint64_t i, const struct meta_slot *s)
{
	uint8_t buf[128];
	int k, any = 0;

	slot_encode(m, s, buf);
	pthread_rwlock_rdlock(&m->swap);
	for (k = 0; k < 2; k++) {
		const uint8_t *p;
		uint64_t c;

		if (!__atomic_load_n(&m->have[k], __ATOMIC_ACQUIRE))
			continue;
		p = slot_addr(m, k, i);
		memcpy(&c, p + m->slot_size - 8, 8);
		if (memcmp(p + 8, buf + 8, m->slot_size - 16) ||
		    c != meta_csum(p, m->slot_size - 8)) {
			any = 0;
			break;
		}
		any = 1;
	}
	pthread_rwlock_unlock(&m->swap);
	return any;
}

int meta_put_file(struct meta *m, uint32_t i, struct meta_file *f)
{
	/* never under c->lock (cache/engine.h) */
	assert(!dev_mutex_mine(m->nolock));
	f->seq = __atomic_fetch_add(&m->seq, 1, __ATOMIC_RELAXED);
	f->csum = meta_csum(f, offsetof(struct meta_file, csum));
	return meta_put(m, m->files_off + (uint64_t)i * META_FILE_SIZE, f,
			META_FILE_SIZE);
}

void meta_member_names(struct meta *m, char names[NVC_MAX_DEVS][META_NAME_LEN],
		       uint64_t rdevs[NVC_MAX_DEVS])
{
	hdr_get(m, offsetof(struct meta_hdr, names), names,
		NVC_MAX_DEVS * META_NAME_LEN);
	hdr_get(m, offsetof(struct meta_hdr, rdevs), rdevs,
		NVC_MAX_DEVS * sizeof(uint64_t));
}

struct member_name {
	int k;
	char name[META_NAME_LEN];
	uint64_t rdev;
};

static void name_set(struct meta_hdr *h, const void *arg)
{
	const struct member_name *n = arg;

	memcpy(h->names[n->k], n->name, META_NAME_LEN);
	h->rdevs[n->k] = n->rdev;
}

int meta_set_member_name(struct meta *m, int k, const char *name,
			 uint64_t rdev)
{
	struct member_name n = { .k = k, .rdev = rdev };

	assert(k >= 0 && k < NVC_MAX_DEVS);
	/* a name too long to keep is not kept: the configuration's stand */
	if (name && strlen(name) < META_NAME_LEN)
		strcpy(n.name, name);
	return hdr_apply(m, name_set, &n);
}

static int ident_put(struct meta *m, size_t off, const struct meta_ident *id)
{
	static const struct meta_ident none;

	return hdr_put(m, off, id ? id : &none, sizeof(*id));
}

void meta_replace_id(struct meta *m, struct meta_ident *out)
{
	hdr_get(m, offsetof(struct meta_hdr, replace_id), out, sizeof(*out));
}

int meta_set_replace_id(struct meta *m, const struct meta_ident *id)
{
	return ident_put(m, offsetof(struct meta_hdr, replace_id), id);
}

void meta_mirror_id(struct meta *m, struct meta_ident *out)
{
	hdr_get(m, offsetof(struct meta_hdr, mirror_id), out, sizeof(*out));
}

int meta_set_mirror_id(struct meta *m, const struct meta_ident *id)
{
	return ident_put(m, offsetof(struct meta_hdr, mirror_id), id);
}
