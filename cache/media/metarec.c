/* cache: the metadata records (slot entries, file records) encoded, checked
 * and written to both mirrors. */
#define _GNU_SOURCE
#include "meta_priv.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

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
		return meta_refuse(why, len, -EUCLEAN,
				   "seq %llu is out of range",
				   (unsigned long long)s->seq);
	if (s->flags & ~META_SLOT_FLAGS)
		return meta_refuse(why, len, -EUCLEAN, "unknown flags %#x",
				   s->flags);
	if (!s->file)
		return 0;
	if (s->file > m->nfiles)
		return meta_refuse(why, len, -EUCLEAN,
				   "file %u is past nfiles %u", s->file,
				   m->nfiles);
	if (s->blk >= INT64_MAX / m->block_size)
		return meta_refuse(why, len, -EUCLEAN,
				   "blk %llu is past the largest file",
				   (unsigned long long)s->blk);
	for (w = 0; w < m->words; w++) {
		uint64_t past = ppb >= 64 * (w + 1) ? 0
				: ppb <= 64 * w	    ? ~0ull
						    : ~0ull << (ppb - 64 * w);

		if ((s->valid[w] | s->dirty[w]) & past)
			return meta_refuse(
				why, len, -EUCLEAN,
				"pages past the block's %u are marked", ppb);
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
		return meta_refuse(why, len, -EUCLEAN, "checksum mismatch");
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
		return meta_refuse(why, len, -EUCLEAN, "checksum mismatch");
	if (f->seq >= META_SEQ_MAX)
		return meta_refuse(why, len, -EUCLEAN,
				   "seq %llu is out of range",
				   (unsigned long long)f->seq);
	if (f->flags & ~META_FILE_FLAGS)
		return meta_refuse(why, len, -EUCLEAN, "unknown flags %#x",
				   f->flags);
	if (!(f->flags & MF_USED))
		return 0;
	if (f->handle_bytes > META_HANDLE_MAX)
		return meta_refuse(why, len, -EUCLEAN,
				   "handle_bytes %u is past %u",
				   f->handle_bytes, META_HANDLE_MAX);
	if (!meta_path_ok(f->path, f->path_len))
		return meta_refuse(
			why, len, -EUCLEAN,
			"path (%u bytes) is not a relative path below "
			"the backing directory",
			f->path_len);
	if (!f->handle_bytes && !f->path_len)
		return meta_refuse(why, len, -EUCLEAN,
				   "neither a file handle nor a path");
	if (f->size > INT64_MAX || f->bk_size > INT64_MAX)
		return meta_refuse(
			why, len, -EUCLEAN,
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
		if (meta_is_zero(p, m->slot_size)) {
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
		if (meta_is_zero((const uint8_t *)f[k], META_FILE_SIZE) ||
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

		if (m->have[k] && (meta_is_zero(p, m->slot_size) ||
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
		    (meta_is_zero((const uint8_t *)f, META_FILE_SIZE) ||
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
	err = meta_hdr_set_failed(
		m, o, ((struct meta_hdr *)m->r[o].addr)->failed | 1u << k);
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

	/* never under c->lock (cache/core/core.h) */
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
 * entry's writer calls this (one writer per entry: cache/core/core.h).
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
	/* never under c->lock (cache/core/core.h) */
	assert(!dev_mutex_mine(m->nolock));
	f->seq = __atomic_fetch_add(&m->seq, 1, __ATOMIC_RELAXED);
	f->csum = meta_csum(f, offsetof(struct meta_file, csum));
	return meta_put(m, m->files_off + (uint64_t)i * META_FILE_SIZE, f,
			META_FILE_SIZE);
}
