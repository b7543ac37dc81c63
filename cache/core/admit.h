/* cache: the read admission policy — sequential streams, the sequential
 * cutoff, and readahead of the backing store (admit.c). */
#ifndef NVC_ADMIT_H
#define NVC_ADMIT_H

#include <stdint.h>

/* Streams remembered per file: concurrent sequential readers of one file. */
#define ADMIT_STREAMS 8

struct admit_stream {
	uint64_t end; /* the furthest byte a read of the stream reached */
	uint64_t seq; /* bytes the stream read, this read included */
	uint64_t holes; /* bytes behind end it skipped and has not read yet */
	uint64_t sid; /* the state's serial when the stream began */
	uint64_t ra_end; /* the backing store was asked to read ahead to here */
	uint64_t used; /* the state's clock when it last matched */
};

/* Per file (struct cfile); all zero is a valid empty state. */
struct admit_state {
	int lock; /* a spin lock over the streams: a few compares */
	int seq_hinted; /* the backing fd was told it is read sequentially */
	uint64_t clock;
	uint64_t serial; /* streams begun */
	/* the serial of the stream whose read last missed past the cutoff, 0
	 * when the file's last read was admitted (io.c sets it, a warm clears
	 * it at its start; atomic): a hint for an open (CACHE_OUT_STREAMED), never what a
	 * read returns */
	uint64_t streamed;
	/* a warm filled it (filectl.c; atomic): never given up for a stream
	 * while the cache keeps the file */
	int warmed;
	struct admit_stream st[ADMIT_STREAMS];
};

/* What a read does with its misses. */
struct admit_verdict {
	int bypass; /* serve misses from the backing store, keep nothing */
	uint64_t seq; /* the stream's sequential bytes, this read included */
	uint64_t sid; /* which stream of the file (its serial, never 0) */
	/* where the nearest other stream ahead of this one began (UINT64_MAX:
	 * none): direct readahead stops there (bkstream.c) */
	uint64_t ahead;
	int stream; /* long enough to be owed readahead (ADMIT_RA_AFTER) */
	uint64_t ra_off, ra_len; /* backing readahead to start (ra_len 0: none) */
};

/*
 * The detector alone: note a read of [off, off+len) in a; a read that begins
 * within tol of where a stream ended continues it, unless the stream would
 * then have skipped more than tol bytes it has not read; any other starts a
 * new one (in the least recently used entry).  *v gets the stream's sequential bytes,
 * whether they pass cutoff (0: never), and the readahead that keeps window
 * bytes (0: none) ahead of the stream.
 */
void admit_note(struct admit_state *a, uint64_t off, uint64_t len,
		uint64_t tol, uint64_t cutoff, uint64_t window,
		struct admit_verdict *v);

/* The furthest byte a read of stream sid has asked so far (reads in flight
 * too), or 0 if a forgot it. */
uint64_t admit_front(struct admit_state *a, uint64_t sid);

struct cache;
struct cfile;

/* A read of [off, off+len) of f (f->rw held): the verdict for its misses;
 * starts the backing readahead the stream is owed. */
void admit_read(struct cache *c, struct cfile *f, uint64_t off, uint64_t len,
		struct admit_verdict *v);
/* Start the readahead v is owed (a read of its stream missed). */
/* f is kept on purpose (pinned, pinned by its policy, or warmed): never
 * given up for a stream.  c->lock held. */
int admit_kept_locked(struct cache *c, const struct cfile *f);
/* f's last read missed as a stream past the cutoff and it is not kept: a
 * file an open may give up (CACHE_OUT_STREAMED).  c->lock held. */
int admit_streamed_locked(struct cache *c, const struct cfile *f);

void admit_readahead(struct cache *c, struct cfile *f,
		     const struct admit_verdict *v);

#endif
