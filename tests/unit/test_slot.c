/* tests: the compact per-slot state — the slot lock (srw.h) excludes as a
 * rwlock must, and a slot's DRAM stays within its budget. */
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>

#include "engine.h"
#include "env.h"

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

/* ------------------------------------------------------------ DRAM */

_Static_assert(sizeof(struct cslot) <= 80, "struct cslot grew");

/* A cache of 64 KiB blocks (the default) keeps at most SLOT_DRAM_BUDGET
 * bytes of DRAM a slot, 2 MiB per GiB; bitmaps follow the block size. */
static void test_slot_dram_budget(void)
{
	static const uint32_t bs[] = { 4 * KiB, 64 * KiB, 1 * MiB };
	struct env e;
	unsigned k;

	for (k = 0; k < sizeof(bs) / sizeof(bs[0]); k++) {
		uint64_t per_slot, per_gib;

		env_init(&e, bs[k] < MiB ? 1024 : 64, bs[k]);
		per_slot = cache_slot_dram(e.c) / e.c->nslots;
		per_gib = cache_slot_dram(e.c) * (1024ull * MiB) /
			  (e.c->nslots * bs[k]);
		printf("  %u KiB blocks: %llu slots, %llu bytes a slot, "
		       "%llu KiB a GiB; file records %llu KiB\n",
		       bs[k] / KiB, (unsigned long long)e.c->nslots,
		       (unsigned long long)per_slot,
		       (unsigned long long)per_gib / KiB,
		       (unsigned long long)cache_rec_dram(e.c) / KiB);
		CHECK_EQ(e.c->pbytes, (bs[k] / NVC_PAGE + 7) / 8);
		if (bs[k] == 64 * KiB) {
			CHECK(per_slot <= SLOT_DRAM_BUDGET);
			CHECK(per_gib <= 2 * MiB);
		}
		env_fini(&e);
	}
}

int main(void)
{
	RUN(test_srw_excludes);
	RUN(test_srw_readers_preferred);
	RUN(test_slot_dram_budget);
	return CHECK_DONE();
}
