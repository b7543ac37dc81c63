/* cache: a file's lock (f->rw), and in debug builds the holds of each
 * thread (frw.h). */
#include "core.h"

#include <assert.h>
#include <errno.h>

#ifndef NDEBUG
/* A thread holds a lock per asynchronous request it has begun (aio.c) */
#define FRW_MAX_HELD 512

struct frw_hold {
	const struct cfile *f;
	int wr;
	int owe; /* dropped clean data: f->wgen must have moved */
	uint64_t wgen; /* f->wgen when the write hold began */
};

static __thread struct frw_hold held[FRW_MAX_HELD];
static __thread int nheld;

static void frw_note(struct cfile *f, int wr)
{
	assert(nheld < FRW_MAX_HELD);
	held[nheld].f = f;
	held[nheld].wr = wr;
	held[nheld].owe = 0;
	held[nheld].wgen = __atomic_load_n(&f->wgen, __ATOMIC_RELAXED);
	nheld++;
}

static struct frw_hold *frw_find(const struct cfile *f)
{
	int i;

	for (i = nheld - 1; i >= 0; i--)
		if (held[i].f == f)
			return &held[i];
	return NULL;
}

int frw_held(const struct cfile *f, int wr)
{
	struct frw_hold *h = frw_find(f);

	return h && (!wr || h->wr);
}

int frw_held_any(void)
{
	return nheld > 0;
}

void frw_owe_wgen(const struct cfile *f)
{
	struct frw_hold *h = frw_find(f);

	assert(h && h->wr);
	h->owe = 1;
}

static void frw_forget(struct cfile *f)
{
	struct frw_hold *h = frw_find(f);

	assert(h);
	/* under a write hold nobody else bumps f->wgen: the holder did */
	assert(!h->owe ||
	       __atomic_load_n(&f->wgen, __ATOMIC_RELAXED) != h->wgen);
	*h = held[--nheld];
}
#else
#define frw_note(f, wr) ((void)0)
#define frw_forget(f) ((void)0)
#endif

void frw_rdlock(struct cfile *f)
{
	pthread_rwlock_rdlock(&f->rw);
	frw_note(f, 0);
}

int frw_tryrdlock(struct cfile *f)
{
	int ret = -pthread_rwlock_tryrdlock(&f->rw);

	if (!ret)
		frw_note(f, 0);
	return ret;
}

void frw_wrlock(struct cfile *f)
{
	pthread_rwlock_wrlock(&f->rw);
	frw_note(f, 1);
}

int frw_timedwrlock(struct cfile *f, const struct timespec *until)
{
	int ret = -pthread_rwlock_timedwrlock(&f->rw, until);

	if (!ret)
		frw_note(f, 1);
	return ret;
}

void frw_unlock(struct cfile *f)
{
	frw_forget(f);
	pthread_rwlock_unlock(&f->rw);
}
