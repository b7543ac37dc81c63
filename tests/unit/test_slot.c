/* tests: the compact per-slot state — the slot lock (srw.h) excludes as a
 * rwlock must, and a slot's DRAM stays within its budget. */
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>

#include "check.h"
#include "engine.h"

/* ------------------------------------------------------------ slot lock */

static struct srw lk;
static int writers, readers; /* inside the lock now (atomic) */
static int bad;

static void *hammer(void *arg)
{
	long id = (long)arg;
	int i;

	for (i = 0; i < 200000; i++) {
		if ((i + id) % 4 == 0) {
			srw_wrlock(&lk);
			if (__atomic_add_fetch(&writers, 1, __ATOMIC_SEQ_CST) != 1 ||
			    __atomic_load_n(&readers, __ATOMIC_SEQ_CST))
				__atomic_store_n(&bad, 1, __ATOMIC_SEQ_CST);
			__atomic_sub_fetch(&writers, 1, __ATOMIC_SEQ_CST);
			srw_unlock(&lk);
		} else {
			srw_rdlock(&lk);
			__atomic_add_fetch(&readers, 1, __ATOMIC_SEQ_CST);
			if (__atomic_load_n(&writers, __ATOMIC_SEQ_CST))
				__atomic_store_n(&bad, 1, __ATOMIC_SEQ_CST);
			__atomic_sub_fetch(&readers, 1, __ATOMIC_SEQ_CST);
			srw_unlock(&lk);
		}
	}
	return NULL;
}

static void test_srw_excludes(void)
{
	pthread_t t[6];
	long i;

	srw_init(&lk);
	for (i = 0; i < 6; i++)
		pthread_create(&t[i], NULL, hammer, (void *)i);
	for (i = 0; i < 6; i++)
		pthread_join(t[i], NULL);
	CHECK(!bad);
	CHECK_EQ(lk.v & ~SRW_SLEEPERS, 0);
	CHECK(!srw_held(&lk));
}

static int rd_in;

static void *take_read(void *arg)
{
	(void)arg;
	srw_rdlock(&lk);
	__atomic_store_n(&rd_in, 1, __ATOMIC_SEQ_CST);
	srw_unlock(&lk);
	return NULL;
}

static void *take_write(void *arg)
{
	(void)arg;
	srw_wrlock(&lk);
	srw_unlock(&lk);
	return NULL;
}

/* Readers get in while a writer waits (as with pthread's default), so a
 * thread may read-lock a slot it already holds for reading. */
static void test_srw_readers_preferred(void)
{
	pthread_t w, r;
	int i;

	srw_init(&lk);
	srw_rdlock(&lk);
	pthread_create(&w, NULL, take_write, NULL);
	for (i = 0; i < 100 && !(lk.v & SRW_SLEEPERS); i++)
		usleep(1000);
	CHECK(lk.v & SRW_SLEEPERS); /* the writer sleeps */
	pthread_create(&r, NULL, take_read, NULL);
	pthread_join(r, NULL);
	CHECK(rd_in);
	srw_unlock(&lk);
	pthread_join(w, NULL);
	CHECK_EQ(lk.v, 0);
}

int main(void)
{
	RUN(test_srw_excludes);
	RUN(test_srw_readers_preferred);
	return CHECK_DONE();
}
