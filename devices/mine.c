/* devices: which thread holds a mutex (glibc records its owner), for the cache's lock assertions. */
#define _GNU_SOURCE
#include "dev.h"

#include <pthread.h>
#include <unistd.h>

#if !defined(NDEBUG) && defined(__GLIBC__)
/* The calling thread's id, once asked; a forked child's thread has another,
 * so the fork forgets it (in the one thread the child has). */
static __thread pid_t mine_tid;
static pthread_once_t mine_once = PTHREAD_ONCE_INIT;

static void mine_forget(void)
{
	mine_tid = 0;
}

static void mine_init(void)
{
	pthread_atfork(NULL, NULL, mine_forget);
}
#endif

int dev_mutex_mine(pthread_mutex_t *m)
{
#if !defined(NDEBUG) && defined(__GLIBC__)
	if (!m)
		return 0;
	if (!mine_tid) {
		pthread_once(&mine_once, mine_init);
		mine_tid = gettid();
	}
	return __atomic_load_n(&m->__data.__owner, __ATOMIC_RELAXED) ==
	       mine_tid;
#else
	(void)m;
	return 0;
#endif
}
