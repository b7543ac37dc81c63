/* cache/files: what the files of this layer share, and no layer above. */
#ifndef NVC_FILES_INT_H
#define NVC_FILES_INT_H

#include "files.h"

/* map.c: the free queue ("Free entries") */
void freeq_note_locked(struct cache *c);
void freeq_rec_locked(struct cache *c, uint32_t r);
void freeq_drain(struct cache *c, uint64_t want);
void slot_hash_del(struct cache *c, struct cslot *s);

/* look.c: take the backing file's look as this node's own, unless another
 * own change is under way or noted after this one (whose note then takes
 * it). */
int coh_note_look(struct cache *c, struct cfile *f);

/* ident.c */
/* Give f (f->fd open, rec_lock held) its path and stamp, before its record
 * is first persisted; an error when files are found by path and it has
 * none. */
int ident_note(struct cache *c, struct cfile *f, uint64_t *seq);
/* 0 if fd is f's backing file, -ESTALE if not. */
int ident_verify(struct cache *c, struct cfile *f, int fd);
void ident_renamed(struct cache *c, const char *from, const char *to);

#endif
