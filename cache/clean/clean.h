/* cache/clean: destage (dirty data to the backing store) and coherence between nodes over one store: what management may use. */
#ifndef NVC_CLEAN_H
#define NVC_CLEAN_H

#include "../data/data.h"

/* destage.c */
int destage_start(struct cache *c);
void destage_stop(struct cache *c);
int destage_file(struct cache *c, struct cfile *f, uint64_t max_bytes);
/* destage_file of a file no pass is destaging, marked as destaging (and
 * counted active) meanwhile: c->lock held, dropped across the pass, held
 * again when it returns; flush_cond told. */
int destage_claimed_locked(struct cache *c, struct cfile *f,
			   uint64_t max_bytes);
/* cache_flush, given up (-ESHUTDOWN) once *stop is set (a device-life
 * command's flush: &c->devlife_stop); checked every 200 ms. */
int cache_flush_until(struct cache *c, cache_progress_fn fn, void *arg,
		      const int *stop);

/* coherence.c: many nodes over one store */
/* Before destage writes f: a change elsewhere is a conflict, resolved now
 * (f->rw not held). */
int coh_destage_check(struct cache *c, struct cfile *f);
/* Recovery found f's backing file changed behind the cache's back while f
 * has dirty data (st: its look now). */
void coh_recovery_conflict(struct cache *c, struct cfile *f,
			   const struct stat *st);

#endif
