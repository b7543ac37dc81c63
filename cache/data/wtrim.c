/* cache: a write's partial first and last pages written in sectors, not read first. */
#define _GNU_SOURCE
#include "data_int.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/*
 * Partial pages in sectors.  A write's partial first or last page that is
 * valid in the cache keeps its other bytes where they are: the device write
 * starts (or ends) at the write's edge instead of the page's, so the page is
 * not read first.  Only when the edge is a multiple of the device's sector
 * (dev_sector), and not for a slot with a second copy (its twin's page is
 * written whole from the same buffer).  Only a page the persisted entry
 * claims already (pvalid): one kept after a read miss may have its other
 * sectors in the device's volatile cache (unsynced), and a FUA write of
 * some sectors must not make the entry claim the whole page without the
 * flush slot_persist would do (see "Power loss" in engine.h).  Overwriting
 * part of a claimed page leaves the old or the new bytes of the same file,
 * as overwriting all of it does.  The page is valid, so it is dirty or
 * clean with its intent marked before the write (seg_mark_intent), as for a
 * whole page; the sectors outside the write are not touched.  If the device
 * write fails, the backing file takes the write as whole pages
 * (write_fallback): wseg_untrim then reads the other bytes.
 *
 * Order, in wseg_begin/wseg_end (write.c), the slots write-locked
 * throughout: the intent is marked and persisted; wseg_trim decides (the
 * page's bits are stable under the slot's lock); the pages not trimmed are
 * prefilled; the I/O is prepared and wseg_trim_ios cuts it; after the I/O,
 * the commit marks the pages valid and dirty as for whole pages, or, on an
 * error, wseg_untrim reads the other bytes before write_fallback.
 */
static int page_trimmable(struct cache *c, struct cslot *s, uint32_t p,
			  uint64_t edge)
{
	return !s->twin && pb_test(slot_pvalid(c, s), p) &&
	       pb_test(slot_valid(c, s), p) &&
	       !(edge % dev_sector(slot_dev(c, slot_idx(c, s))));
}

void wseg_trim(struct cache *c, struct wseg *w)
{
	struct span *last = &w->sp[w->nsp - 1];
	int head = w->lo % NVC_PAGE != 0, tail = w->hi % NVC_PAGE != 0;
	int one = head && tail && w->s1 - NVC_PAGE == w->s0;

	w->trim = 0;
	if (head && page_trimmable(c, w->sp[0].s, w->sp[0].p0, w->lo))
		w->trim |= WSEG_TRIM_HEAD;
	if (tail && page_trimmable(c, last->s, last->p1 - 1, w->hi))
		w->trim |= WSEG_TRIM_TAIL;
	if (one && w->trim != (WSEG_TRIM_HEAD | WSEG_TRIM_TAIL))
		w->trim = 0; /* the page is read for its other edge */
}

/* The device writes of a trimmed segment: from lo, to hi. */
void wseg_trim_ios(struct wseg *w)
{
	struct dev_io *first = &w->ios[0], *end = &w->ios[w->nsp - 1];
	uint64_t cut;

	assert(!w->trim || w->data == w->buf); /* partial pages: copied */

	if (w->trim & WSEG_TRIM_HEAD) {
		assert(!w->sp[0].s->twin);
		cut = w->lo - w->s0;
		assert(cut < NVC_PAGE && first->len > cut);
		first->off += cut;
		first->buf = (char *)first->buf + cut;
		first->len -= cut;
	}
	if (w->trim & WSEG_TRIM_TAIL) {
		assert(!w->sp[w->nsp - 1].s->twin);
		cut = w->s1 - w->hi;
		assert(cut < NVC_PAGE && end->len > cut);
		end->len -= cut;
	}
}

/* The trimmed pages' other bytes into buf, for whole pages after all. */
int wseg_untrim(struct cache *c, struct cfile *f, struct wseg *w)
{
	struct span *first = &w->sp[0], *last = &w->sp[w->nsp - 1];
	uint64_t at = w->s1 - NVC_PAGE;
	char *pg;
	int ret = 0;

	if (!w->trim)
		return 0;
	assert(w->data == w->buf);
	pg = dev_alloc_buf(NVC_PAGE);
	if (!pg)
		return -ENOMEM;
	if (w->trim & WSEG_TRIM_HEAD) {
		ret = page_prefill(c, f, first->s, first->p0, pg, w->s0,
				   bm_test(first->valid, first->p0));
		if (!ret)
			memcpy(w->buf, pg, w->lo - w->s0);
	}
	if (!ret && (w->trim & WSEG_TRIM_TAIL)) {
		ret = page_prefill(c, f, last->s, last->p1 - 1, pg, at,
				   bm_test(last->valid, last->p1 - 1));
		if (!ret)
			memcpy(w->buf + (w->hi - w->s0), pg + (w->hi - at),
			       w->s1 - w->hi);
	}
	free(pg);
	w->trim = 0;
	return ret;
}
