/* cache/data: the read and write paths (synchronous and asynchronous, around the cache under pressure), and the backing file's I/O: what destage and management may use. */
#ifndef NVC_DATA_H
#define NVC_DATA_H

#include "../files/files.h"

/* io.c: backing I/O and the read path */
/* A read that keeps every miss (no admission, no readahead). */
int io_read_keep(struct cache *c, struct cfile *f, void *buf, size_t len,
		 uint64_t off, size_t *n);
int backing_write(struct cache *c, struct cfile *f, const void *buf, size_t len,
		  uint64_t off);
/* The same through another descriptor of f's backing file (O_DIRECT). */
int backing_write_fd(struct cache *c, struct cfile *f, int fd, const void *buf,
		     size_t len, uint64_t off);
int backing_sync(struct cache *c, struct cfile *f, int data_only);
/* The backing file changed in a way only its fsync makes durable. */
void file_bk_changed(struct cfile *f);
/* An fsync that started when bk_wgen was gen has completed. */
void file_bk_synced(struct cfile *f, uint64_t gen);
/* Every such change before the call is durable (fsync of the backing file). */
int file_bk_sync(struct cache *c, struct cfile *f);

/* write.c */
/* Copy the pages of s in mask to t, each durable when it returns. */
int twin_copy(struct cache *c, struct cslot *s, struct cslot *t,
	      const uint64_t *mask);
int file_trim(struct cache *c, struct cfile *f, uint64_t size);

/* wround.c: writers under pressure */
/* How hard writers are paced now, 0 (at or below the high watermark) to 100
 * (full).  c->lock held. */
unsigned write_pace_locked(struct cache *c);
/* Writes with no dirty data in the cache go around it now (the rule:
 * destage.write_around).  c->lock held. */
int write_around_now_locked(struct cache *c);

#endif
