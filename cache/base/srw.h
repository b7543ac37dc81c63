/* cache: a four-byte reader-writer lock on a futex, one per cache slot. */
#ifndef NVC_SRW_H
#define NVC_SRW_H

#include <assert.h>
#include <stdint.h>

/*
 * One 32-bit word: bits 0-29 count the readers holding the lock, bit 30 says
 * a writer holds it, bit 31 says someone may sleep on the word.  A reader gets
 * in whenever no writer holds the lock, even while a writer waits: readers are
 * preferred, as with glibc's default pthread_rwlock_t that this replaces, so a
 * thread may take a read lock it already holds.  Whoever takes the word out of
 * a held state (a writer leaving, the last reader leaving) clears the sleeper
 * bit and, if it was set, wakes every sleeper; each tries again and sets the
 * bit again before it sleeps, and sleeps only while the word still shows what
 * it saw, so no wake-up is lost.  Never more than one writer, and never a
 * writer with readers (asserted).  The lock order these locks take part in is
 * the essay in engine.h.
 */
struct srw {
	uint32_t v;
};

#define SRW_READERS ((1u << 30) - 1)
#define SRW_WRITER (1u << 30)
#define SRW_SLEEPERS (1u << 31)

void srw_rdlock_slow(struct srw *l);
void srw_wrlock_slow(struct srw *l);
void srw_wake(struct srw *l);

static inline void srw_init(struct srw *l)
{
	l->v = 0;
}

static inline void srw_rdlock(struct srw *l)
{
	uint32_t v = __atomic_load_n(&l->v, __ATOMIC_RELAXED);

	if ((v & SRW_WRITER) ||
	    !__atomic_compare_exchange_n(&l->v, &v, v + 1, 0, __ATOMIC_ACQUIRE,
					 __ATOMIC_RELAXED))
		srw_rdlock_slow(l);
}

static inline void srw_wrlock(struct srw *l)
{
	uint32_t v = 0;

	if (!__atomic_compare_exchange_n(&l->v, &v, SRW_WRITER, 0,
					 __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
		srw_wrlock_slow(l);
}

/* Take the lock for reading if no writer holds it: 1, else 0 (never
 * waits: for a thread that must not, cache/data/aio.c). */
static inline int srw_tryrdlock(struct srw *l)
{
	uint32_t v = __atomic_load_n(&l->v, __ATOMIC_RELAXED);

	while (!(v & SRW_WRITER))
		if (__atomic_compare_exchange_n(&l->v, &v, v + 1, 0,
						__ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED))
			return 1;
	return 0;
}

/* Take the lock for writing if nobody holds it: 1, else 0. */
static inline int srw_trywrlock(struct srw *l)
{
	uint32_t v = __atomic_load_n(&l->v, __ATOMIC_RELAXED);

	while (!(v & (SRW_WRITER | SRW_READERS)))
		if (__atomic_compare_exchange_n(&l->v, &v, v | SRW_WRITER, 0,
						__ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED))
			return 1;
	return 0;
}

/* Release a read or a write hold (a writer is alone: the bit says which). */
static inline void srw_unlock(struct srw *l)
{
	uint32_t v = __atomic_load_n(&l->v, __ATOMIC_RELAXED), n;

	do {
		if (v & SRW_WRITER) {
			assert(!(v & SRW_READERS));
			n = 0;
		} else {
			assert(v & SRW_READERS);
			n = v - 1;
			if (!(n & SRW_READERS))
				n = 0;
		}
	} while (!__atomic_compare_exchange_n(&l->v, &v, n, 0, __ATOMIC_RELEASE,
					      __ATOMIC_RELAXED));
	if ((v & SRW_SLEEPERS) && !(n & SRW_SLEEPERS))
		srw_wake(l);
}

/* Held for writing by anyone (for assertions). */
static inline int srw_wrheld(struct srw *l)
{
	return (__atomic_load_n(&l->v, __ATOMIC_RELAXED) & SRW_WRITER) != 0;
}

/* Held by anyone (for assertions). */
static inline int srw_held(struct srw *l)
{
	return (__atomic_load_n(&l->v, __ATOMIC_RELAXED) &
		(SRW_WRITER | SRW_READERS)) != 0;
}

#endif
