/* cache: a file's lock (f->rw), with the holds each thread has known in
 * debug builds, so that the rules that rest on it are asserted. */
#ifndef NVC_FRW_H
#define NVC_FRW_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

struct cfile;

/*
 * Every hold of f->rw goes through these.  pthread_rwlock_t says neither
 * who holds it nor how, so debug builds keep, per thread, the files whose
 * lock the thread holds (frw.c): frw_held(f, 0) is true while this thread
 * holds f->rw for reading or writing, frw_held(f, 1) only for writing.
 * A write hold also remembers f->wgen as it found it: a holder that drops
 * clean data of f owes a bump of f->wgen (frw_owe_wgen), and its unlock
 * asserts that it paid (the f->wgen essay, coherence.c).  Release builds
 * keep nothing: the wrappers are the pthread calls.
 */
void frw_rdlock(struct cfile *f);
int frw_tryrdlock(struct cfile *f);
void frw_wrlock(struct cfile *f);
int frw_timedwrlock(struct cfile *f, const struct timespec *until);
void frw_unlock(struct cfile *f);
#ifndef NDEBUG
int frw_held(const struct cfile *f, int wr);
/* This thread holds some file's f->rw. */
int frw_held_any(void);
void frw_owe_wgen(const struct cfile *f);
#else
static inline void frw_owe_wgen(const struct cfile *f)
{
	(void)f;
}
#endif

#endif
