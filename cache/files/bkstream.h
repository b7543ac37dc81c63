/* cache: direct reads of the backing store for read streams that bypass the
 * cache, with asynchronous readahead (bkstream.c). */
#ifndef NVC_BKSTREAM_H
#define NVC_BKSTREAM_H

#include <stddef.h>
#include <stdint.h>

struct cache;
struct cfile;
struct bks;
struct admit_verdict;

/* Readahead unit: one asynchronous backing read. */
#define BKS_SEG (2u * 1024 * 1024)

/*
 * Read [off, off+len) of f's backing file into buf, for a stream that
 * bypasses the cache (v: admit.c's verdict for the read: its stream, how long
 * it is, where the next stream ahead begins), and start the readahead that
 * keeps up to window bytes ahead of it; zeros past the backing file's end.
 * off, len and buf are 4 KiB aligned; f->rw is held for reading.  -EAGAIN:
 * not this way (the file's store cannot do direct I/O, window 0): read it
 * with backing_read.
 */
int bks_read(struct cache *c, struct cfile *f, char *buf, size_t len,
	     uint64_t off, uint64_t window, const struct admit_verdict *v);

/*
 * The same without a copy, when a segment read ahead holds all of [off,
 * off+len): *data points into it, and the segment stays as it is until
 * bks_unpin(c, *pin) (after the reply is sent).  0, or -EAGAIN: use bks_read.
 * The caller has checked that no page of the range is valid in the cache.
 */
int bks_read_pinned(struct cache *c, struct cfile *f, size_t len, uint64_t off,
		    uint64_t window, const struct admit_verdict *v,
		    const char **data, void **pin);
void bks_unpin(struct cache *c, void *pin);

/* The daemon changed f's backing file, or it was opened (and revalidated):
 * data read ahead before this is not served.  Called after the change. */
void bks_changed(struct cfile *f);

/* f loses its backing descriptor, or is freed: its readahead state goes (no
 * readahead is in flight: each holds a reference).  c->lock may be held. */
void bks_detach(struct cache *c, struct cfile *f);

/* Before the cache is freed: the readahead threads end (their work done). */
void bks_stop(struct cache *c);
/* After bks_stop and every file's bks_detach: the rest of its memory. */
void bks_pool_free(struct cache *c);

#endif
