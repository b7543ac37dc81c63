/* cache: what meta.c, metacheck.c and metarec.c share, and no other file. */
#ifndef NVC_META_PRIV_H
#define NVC_META_PRIV_H

#include "media.h"

#include <stdarg.h>
#include <stdio.h>

/* a slot entry's fixed part, before its bitmap words (metarec.c) */
#define SLOT_HDR 24u

static inline int meta_is_zero(const uint8_t *p, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (p[i])
			return 0;
	return 1;
}

/* Fill why (if any) and return ret: the one way a check says no. */
static inline int meta_refuse(char *why, size_t len, int ret, const char *fmt,
			      ...) __attribute__((format(printf, 4, 5)));

static inline int meta_refuse(char *why, size_t len, int ret, const char *fmt,
			      ...)
{
	va_list ap;

	if (why && len) {
		va_start(ap, fmt);
		vsnprintf(why, len, fmt, ap);
		va_end(ap);
	}
	return ret;
}

/* The slot entries the header's mirror has room for. */
static inline uint64_t meta_hdr_room(const struct meta_hdr *h)
{
	return h->room ? h->room : h->nslots;
}

/* meta.c: mirror k's header written with its failed bits set to failed (a
 * generation of its own when they change). */
int meta_hdr_set_failed(struct meta *m, int k, uint32_t failed);

#endif
