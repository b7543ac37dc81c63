/* cache: the slow paths of the slot lock (srw.h): sleeping on the futex. */
#define _GNU_SOURCE
#include "srw.h"

#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

static void futex_wait(uint32_t *w, uint32_t v)
{
	/* EAGAIN (the word changed) and EINTR: the caller looks again */
	syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

void srw_wake(struct srw *l)
{
	syscall(SYS_futex, &l->v, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Mark the word as slept on (v: what it holds now) and sleep while it
 * still does; 0 if the word changed first. */
static int sleep_on(struct srw *l, uint32_t v)
{
	if (!(v & SRW_SLEEPERS) &&
	    !__atomic_compare_exchange_n(&l->v, &v, v | SRW_SLEEPERS, 0,
					 __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		return 0;
	futex_wait(&l->v, v | SRW_SLEEPERS);
	return 1;
}

void srw_rdlock_slow(struct srw *l)
{
	for (;;) {
		uint32_t v = __atomic_load_n(&l->v, __ATOMIC_RELAXED);

		if (!(v & SRW_WRITER)) {
			assert((v & SRW_READERS) != SRW_READERS);
			if (__atomic_compare_exchange_n(&l->v, &v, v + 1, 0,
							__ATOMIC_ACQUIRE,
							__ATOMIC_RELAXED))
				return;
			continue;
		}
		sleep_on(l, v);
	}
}

void srw_wrlock_slow(struct srw *l)
{
	for (;;) {
		uint32_t v = __atomic_load_n(&l->v, __ATOMIC_RELAXED);

		if (!(v & (SRW_WRITER | SRW_READERS))) {
			if (__atomic_compare_exchange_n(&l->v, &v,
							v | SRW_WRITER, 0,
							__ATOMIC_ACQUIRE,
							__ATOMIC_RELAXED))
				return;
			continue;
		}
		sleep_on(l, v);
	}
}
