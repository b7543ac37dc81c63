/* cache: the two metadata mirrors: sizes, the current header, header fields
 * written to both, attach, rebuild and replace (records: metarec.c; checks:
 * metacheck.c). */
#define _GNU_SOURCE
#include "meta_priv.h"

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
	       meta_hdr_room(a) == meta_hdr_room(b) && a->total_len == b->total_len;
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
int meta_hdr_set_failed(struct meta *m, int k, uint32_t failed)
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
	ret = meta_hdr_set_failed(m, good, 0);
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
	return meta_hdr_set_failed(m, !i, h->failed | 1u << i);
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
/*
 * The old place of mirror k, replaced: the new mirror's header written
 * there, if it can still be written (mirror.c: a pointer to its successor;
 * the header records the replace under way, the new place and its
 * identity).  A healthy old place has that record already (the replace
 * wrote it to both before the copy); a failed one missed it, and without
 * it a mount on a configuration naming it would take its records, older
 * than the failure, for current ones.  Nothing else is written there again.
 */
static void old_point(struct pm_region *old, const struct meta_hdr *cur,
		      int k)
{
	struct meta_hdr h;

	memcpy(&h, cur, sizeof(h));
	h.mirror = k;
	h.failed = 0;
	h.csum = meta_csum(&h, offsetof(struct meta_hdr, csum));
	if (old->missing || !old->addr || old->len < META_HDR_SIZE ||
	    pm_write(old, 0, &h, sizeof(h)))
		log_msg(LOG_WARNING,
			"replace-mirror: the old place of mirror %d cannot be "
			"written: it keeps no pointer to its successor, so "
			"change cache.metadata before the next mount",
			k);
}

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
	old_point(old, m->r[k].addr, k);
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
