/* cache: superblocks and the two metadata mirrors, with sequence numbers and
 * checksums. */
#define _GNU_SOURCE
#include "meta.h"

#include <errno.h>
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

int sb_read(struct dev *d, struct sb_disk *out)
{
	struct sb_disk *buf = dev_alloc_buf(sizeof(*buf));
	int copy, ret = -EUCLEAN;

	if (!buf)
		return -ENOMEM;
	for (copy = 0; copy < SB_COPIES; copy++) {
		int r = dev_read(d, buf, sizeof(*buf), 4096 * (copy + 1));

		if (r) {
			ret = r;
			continue;
		}
		if (buf->magic != SB_MAGIC) {
			ret = -ENODATA;
			continue;
		}
		if (buf->csum !=
			    meta_csum(buf, offsetof(struct sb_disk, csum)) ||
		    buf->version != SB_VERSION) {
			ret = -EUCLEAN;
			continue;
		}
		memcpy(out, buf, sizeof(*out));
		ret = 0;
		break;
	}
	free(buf);
	return ret;
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
		   uint32_t block_size, uint64_t nslots, uint32_t nfiles,
		   uint32_t ndevs)
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
	h->total_len = meta_total_len(nslots, nfiles, block_size);
	h->csum = meta_csum(h, offsetof(struct meta_hdr, csum));
}

static int hdr_ok(const struct meta_hdr *h, size_t maplen)
{
	if (h->magic != META_MAGIC)
		return -ENODATA;
	if (h->csum != meta_csum(h, offsetof(struct meta_hdr, csum)))
		return -EUCLEAN;
	if (h->version != META_VERSION)
		return -EPROTO;
	if (h->failed & ~3u || (h->failed >> h->mirror & 1) || h->mirror > 1)
		return -EUCLEAN;
	if (h->total_len > maplen ||
	    h->slot_size != meta_slot_size(h->block_size) ||
	    h->file_size != META_FILE_SIZE)
		return -EUCLEAN;
	return 0;
}

int meta_hdr_check(const void *addr, size_t len, uint64_t *total_len)
{
	const struct meta_hdr *h = addr;
	int ret;

	if (!addr || len < META_HDR_SIZE)
		return -ENODATA;
	ret = hdr_ok(h, len);
	if (!ret && total_len)
		*total_len = h->total_len;
	return ret;
}

/* Write mirror k's header with its failed bits set to failed. */
static int hdr_set_failed(struct meta *m, int k, uint32_t failed)
{
	struct meta_hdr *h = m->r[k].addr;

	h->failed = failed;
	h->csum = meta_csum(h, offsetof(struct meta_hdr, csum));
	return pm_persist(&m->r[k], h, META_HDR_SIZE);
}

/*
 * The bad mirror becomes a copy of the good one; only then does the good
 * one's header stop calling it stale (a crash in between rebuilds it again).
 */
static int meta_rebuild(struct meta *m, int bad, int good, uint64_t total)
{
	struct meta_hdr *h = m->r[bad].addr;
	int ret;

	memcpy(m->r[bad].addr, m->r[good].addr, total);
	h->mirror = bad;
	h->failed = 0;
	h->csum = meta_csum(h, offsetof(struct meta_hdr, csum));
	m->have[bad] = 1;
	m->rebuilt[bad] = 1;
	ret = pm_persist(&m->r[bad], m->r[bad].addr, total);
	/* a stand-in for a missing device is no copy: the mark stays */
	if (!ret && !m->r[bad].missing &&
	    ((const struct meta_hdr *)m->r[good].addr)->failed)
		ret = hdr_set_failed(m, good, 0);
	return ret;
}

/* A mirror that a valid header of the other calls stale is not trusted. */
static void drop_stale(struct meta *m, const struct meta_hdr *h[2], int ret[2])
{
	int i;

	for (i = 0; i < 2; i++)
		if (m->have[i] && m->have[!i] && (h[i]->failed >> !i & 1)) {
			m->have[!i] = 0;
			ret[!i] = -ESTALE;
		}
}

/* Attach without repairing anything: the offline check only reads. */
int meta_attach_ro(struct meta *m, struct pm_region r[2], char *err, size_t len)
{
	const struct meta_hdr *h = NULL;
	int i;

	memset(m, 0, sizeof(*m));
	const struct meta_hdr *hh[2] = { r[0].addr, r[1].addr };
	int ret[2];

	for (i = 0; i < 2; i++) {
		m->r[i] = r[i];
		ret[i] = meta_hdr_check(r[i].addr, r[i].len, NULL);
		m->have[i] = !ret[i];
	}
	drop_stale(m, hh, ret);
	for (i = 0; i < 2 && !h; i++)
		if (m->have[i])
			h = r[i].addr;
	if (!h) {
		snprintf(err, len, "no valid metadata mirror");
		return -ENODATA;
	}
	if (m->have[0] && m->have[1] &&
	    memcmp(((const struct meta_hdr *)r[0].addr)->set_uuid,
		   ((const struct meta_hdr *)r[1].addr)->set_uuid, 16))
		m->have[1] = 0;
	memcpy(m->set_uuid, h->set_uuid, 16);
	m->nslots = h->nslots;
	m->nfiles = h->nfiles;
	m->words = meta_words(h->block_size);
	m->slot_size = h->slot_size;
	m->files_off = h->files_off;
	m->slots_off = h->slots_off;
	return 0;
}

int meta_attach(struct meta *m, struct pm_region r[2], char *err, size_t len)
{
	const struct meta_hdr *h[2];
	int i, ret[2], good = -1;

	memset(m, 0, sizeof(*m));
	for (i = 0; i < 2; i++) {
		m->r[i] = r[i];
		h[i] = r[i].addr;
		ret[i] = r[i].addr && r[i].len >= META_HDR_SIZE
				 ? hdr_ok(h[i], r[i].len)
				 : -ENODATA;
		m->have[i] = !ret[i];
	}
	if (m->have[0] && m->have[1] && (h[0]->failed >> 1 & 1) &&
	    (h[1]->failed & 1)) {
		snprintf(err, len,
			 "each metadata mirror says the other failed; the "
			 "cache cannot tell which one is current");
		return -EUCLEAN;
	}
	drop_stale(m, h, ret);
	for (i = 0; i < 2 && good < 0; i++)
		if (m->have[i])
			good = i;
	if (good < 0) {
		snprintf(err, len,
			 "neither metadata mirror holds a valid nvcachefs "
			 "header (%s / %s); run nvcachectl format",
			 strerror(-ret[0]), strerror(-ret[1]));
		return -ENODATA;
	}
	if (m->have[0] && m->have[1] &&
	    (memcmp(h[0]->set_uuid, h[1]->set_uuid, 16) ||
	     h[0]->nslots != h[1]->nslots || h[0]->nfiles != h[1]->nfiles ||
	     h[0]->block_size != h[1]->block_size)) {
		snprintf(err, len,
			 "the two metadata mirrors belong to different caches");
		return -EINVAL;
	}
	memcpy(m->set_uuid, h[good]->set_uuid, 16);
	for (i = 0; i < 2; i++) {
		if (m->have[i])
			continue;
		/* the damaged or lost mirror becomes a copy of the good one */
		if (!r[i].addr || r[i].len < h[good]->total_len) {
			snprintf(err, len,
				 "metadata mirror %d is not valid (%s) and too "
				 "small to rebuild",
				 i, strerror(-ret[i]));
			return -EUCLEAN;
		}
		m->bad_reason[i] = ret[i];
		ret[i] = meta_rebuild(m, i, good, h[good]->total_len);
		if (ret[i]) {
			snprintf(err, len,
				 "cannot rebuild metadata mirror %d: %s", i,
				 strerror(-ret[i]));
			return ret[i];
		}
	}
	m->nslots = h[good]->nslots;
	m->nfiles = h[good]->nfiles;
	m->words = meta_words(h[good]->block_size);
	m->slot_size = h[good]->slot_size;
	m->files_off = h[good]->files_off;
	m->slots_off = h[good]->slots_off;
	return 0;
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

static int slot_decode(const struct meta *m, const uint8_t *in,
		       struct meta_slot *s)
{
	uint64_t c;
	uint32_t w = m->words;

	memcpy(&c, in + m->slot_size - 8, 8);
	if (c != meta_csum(in, m->slot_size - 8))
		return -EUCLEAN;
	memset(s, 0, sizeof(*s));
	memcpy(&s->seq, in, 8);
	memcpy(&s->file, in + 8, 4);
	memcpy(&s->flags, in + 12, 4);
	memcpy(&s->blk, in + 16, 8);
	memcpy(s->valid, in + SLOT_HDR, 8 * w);
	memcpy(s->dirty, in + SLOT_HDR + 8 * w, 8 * w);
	return 0;
}

static int is_zero(const uint8_t *p, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (p[i])
			return 0;
	return 1;
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
int meta_get_slot(struct meta *m, uint64_t i, struct meta_slot *out, int *bad)
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
		} else if (!slot_decode(m, p, &s[k])) {
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

int meta_get_file(struct meta *m, uint32_t i, struct meta_file *out, int *bad)
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
		    f[k]->csum ==
			    meta_csum(f[k], offsetof(struct meta_file, csum)))
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

/* Write one record at offset off of every mirror in turn. */
static int meta_put(struct meta *m, uint64_t off, const void *rec, size_t len)
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

			if (f->csum ==
				    meta_csum(f, offsetof(struct meta_file,
							  csum)) &&
			    f->seq >= next)
				next = f->seq + 1;
		}
		for (i = 0; i < m->nslots; i++)
			if (!slot_decode(m, slot_addr(m, k, i), &s) &&
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

	s->seq = __atomic_fetch_add(&m->seq, 1, __ATOMIC_RELAXED);
	slot_encode(m, s, buf);
	return meta_put(m, m->slots_off + i * m->slot_size, buf, m->slot_size);
}

int meta_put_file(struct meta *m, uint32_t i, struct meta_file *f)
{
	f->seq = __atomic_fetch_add(&m->seq, 1, __ATOMIC_RELAXED);
	f->csum = meta_csum(f, offsetof(struct meta_file, csum));
	return meta_put(m, m->files_off + (uint64_t)i * META_FILE_SIZE, f,
			META_FILE_SIZE);
}
