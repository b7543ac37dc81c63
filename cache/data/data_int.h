/* cache/data: what the read and write paths share, and no layer above. */
#ifndef NVC_DATA_INT_H
#define NVC_DATA_INT_H

#include "data.h"

/* One block of a request: its slot (pinned) and the request's pages in it. */
struct span {
	struct cslot *s;
	uint64_t blk;
	uint32_t p0, p1; /* pages of the request within the block */
	uint64_t valid[META_MAX_WORDS];
	int miss;
};

/*
 * One write segment in two halves around its device I/O (write.c): see
 * wseg_begin().  sp/nsp/off/end/mode/buf are the caller's; the rest is
 * filled in.
 */
struct wseg {
	struct span *sp;
	int nsp;
	uint64_t off, end; /* the bytes of the request in this segment */
	int mode;
	char *buf; /* IO_BUF_BYTES, aligned */
	const char *data; /* the segment's pages from s0: buf, or the
			   * caller's src when it is whole pages, aligned */
	uint64_t s0, s1, lo, hi;
	struct dev_io ios[2 * SEG_MAX_BLOCKS];
	unsigned nio;
	int prep_err; /* the I/O could not be prepared: goes around */
	int locked;
	uint64_t rbseq; /* rebuild_seq() when the slots were locked */
	int trim; /* partial pages written in sectors, not read first:
		     WSEG_TRIM_HEAD, WSEG_TRIM_TAIL */
};
#define WSEG_TRIM_HEAD 1
#define WSEG_TRIM_TAIL 2

/* io.c */
/* The calling thread's I/O buffer (IO_BUF_BYTES, aligned). */
void *io_buf(void);
int backing_read(struct cache *c, struct cfile *f, void *buf, size_t len,
		 uint64_t off);

/* wtrim.c: partial pages in sectors (see its essay) */
void wseg_trim(struct cache *c, struct wseg *w);
void wseg_trim_ios(struct wseg *w);
int wseg_untrim(struct cache *c, struct cfile *f, struct wseg *w);

/* write.c and wround.c: the write paths: through the cache in mode; a
 * write-back write that may go around the cache under pressure; the
 * backing file alone (1, nothing done: the range has dirty data); the hold
 * of a write that turned n blocks dirty past the high watermark. */
int write_cached(struct cache *c, struct cfile *f, const void *src,
		 size_t len, uint64_t off, int mode);
int write_pressed(struct cache *c, struct cfile *f, const void *src,
		  size_t len, uint64_t off, int mode);
int write_around(struct cache *c, struct cfile *f, const char *src,
		 size_t len, uint64_t off);
void write_pace(struct cache *c, uint64_t n);
/* Block blk of f is being written around the cache (no slot may be made
 * for it, nor pinned by a write, until around_cond says it ended).
 * c->lock held. */
int write_around_busy_locked(const struct cfile *f, uint64_t blk);
int page_prefill(struct cache *c, struct cfile *f, struct cslot *s,
		 uint32_t p, char *dst, uint64_t at, int clean);
int wseg_begin(struct cache *c, struct cfile *f, struct wseg *w,
	       const char *src, int nowait);
int wseg_end(struct cache *c, struct cfile *f, struct wseg *w, int err);
void wseg_unlock(struct wseg *w);

#endif
