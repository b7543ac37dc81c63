/* cache: a slot's page bitmaps, kept apart from struct cslot and sized to
 * the mount's pages per block. */
#ifndef NVC_SLOT_H
#define NVC_SLOT_H

#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "../media/media.h"

/*
 * Every slot has four bitmaps of its block's pages (valid, dirty, valid in
 * the persisted entry, written but maybe only in a device cache): in one
 * array, c->pbits, slot after slot, each bitmap c->pbytes = ceil(ppb / 8)
 * bytes (2 at the default 64 KiB block), bit p of a bitmap in byte p / 8.
 * Bits at or past ppb are never set (asserted where words come in).  Map
 * entries and a request's spans keep the words of struct meta_slot
 * (bm_* on uint64_t); a slot's bitmaps are only reached through the
 * accessors here (pb_* on uint8_t), so the two cannot be mixed up.
 */
enum slot_bits { SB_VALID, SB_DIRTY, SB_PVALID, SB_UNSYNCED, SB_NBITS };

static inline int pb_test(const uint8_t *b, uint32_t p)
{
	return (b[p / 8] >> (p % 8)) & 1;
}

static inline void pb_set(uint8_t *b, uint32_t p)
{
	b[p / 8] |= 1u << (p % 8);
}

static inline void pb_clear(uint8_t *b, uint32_t p)
{
	b[p / 8] &= ~(1u << (p % 8));
}

static inline int pb_any_n(const uint8_t *b, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if (b[i])
			return 1;
	return 0;
}

static inline uint32_t pb_count_n(const uint8_t *b, uint32_t n)
{
	uint32_t i, k = 0;

	for (i = 0; i < n; i++)
		k += __builtin_popcount(b[i]);
	return k;
}

/* The bitmap as the words of a map entry (words past it zero). */
static inline void pb_get_n(const uint8_t *b, uint32_t n,
			    uint64_t w[META_MAX_WORDS])
{
	uint32_t i;

	memset(w, 0, META_MAX_WORDS * sizeof(*w));
	for (i = 0; i < n; i++)
		w[i / 8] |= (uint64_t)b[i] << (8 * (i % 8));
}

/* Set the bitmap from words (no page at or past ppb may be set in them). */
static inline void pb_put_n(uint8_t *b, uint32_t n, uint32_t ppb,
			    const uint64_t w[META_MAX_WORDS])
{
	uint32_t i;

	for (i = 0; i < n; i++)
		b[i] = w[i / 8] >> (8 * (i % 8));
#ifndef NDEBUG
	for (i = ppb; i < META_MAX_WORDS * 64; i++)
		assert(!((w[i / 64] >> (i % 64)) & 1));
#else
	(void)ppb;
#endif
}

#endif
