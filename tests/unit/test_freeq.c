/* tests: a slot's free entry is persisted with c->lock dropped (issue 25,
 * finding 14): other requests get the lock while its mirror page write is
 * held. */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "../../cache/mngt/mngt.h"
#include "env.h"

static struct env e;
static pthread_mutex_t hk_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hk_cond = PTHREAD_COND_INITIALIZER;
static int hk_armed, hk_reached, hk_released;

static struct timespec in_secs(int s)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += s;
	return ts;
}

/* Holds the first page write into the slot entries once armed, until
 * released. */
static void hold_slot_page(const struct pm_region *r, size_t off)
{
	struct meta *m = &e.c->meta;
	uint64_t end = m->slots_off + m->nslots * m->slot_size;

	(void)r;
	if (off + DEV_ALIGN <= m->slots_off || off >= end)
		return;
	pthread_mutex_lock(&hk_lock);
	if (hk_armed) {
		hk_armed = 0;
		hk_reached = 1;
		pthread_cond_broadcast(&hk_cond);
		while (!hk_released)
			pthread_cond_wait(&hk_cond, &hk_lock);
	}
	pthread_mutex_unlock(&hk_lock);
}

struct trunc {
	struct cfile *f;
	int ret;
};

static void *truncator(void *arg)
{
	struct trunc *t = arg;

	t->ret = cache_truncate(e.c, t->f, 0);
	return NULL;
}

/*
 * A truncate drops a block whose entry is on the media; the drop's free
 * entry is a page write of a block-device mirror, held here.  Meanwhile
 * c->lock must be free: before the fix the drop persisted under it and the
 * lock was not to be had (the timed lock below gave up after 10 s).
 */
static void test_free_entry_not_under_lock(void)
{
	char *buf = malloc(64 * KiB);
	struct rec_log *L;
	struct trunc t = { 0 };
	struct timespec ts;
	pthread_t th;
	int fd, i, ret, got;

	if (rec_log_new(&L))
		exit(1);
	env_format(&e, 16, 64 * KiB, L);
	for (i = 0; i < 2; i++)
		e.mirrors[i].rec_blk = 1; /* persisted by FUA page writes */
	env_open(&e);
	fill(buf, 64 * KiB, 5);
	t.f = file_open(&e, "a", &fd);
	CHECK_EQ(cache_write(e.c, t.f, buf, 64 * KiB, 0), 0);
	CHECK_EQ(cache_fsync(e.c, t.f), 0); /* its entry is on the media */
	pm_test_page_write = hold_slot_page;
	hk_armed = 1;
	CHECK_EQ(pthread_create(&th, NULL, truncator, &t), 0);
	pthread_mutex_lock(&hk_lock);
	ts = in_secs(20);
	while (!hk_reached &&
	       pthread_cond_timedwait(&hk_cond, &hk_lock, &ts) != ETIMEDOUT)
		;
	got = hk_reached;
	pthread_mutex_unlock(&hk_lock);
	CHECK(got); /* the truncate wrote the slot's free entry */
	/* while that write is held, the cache's lock is to be had */
	ts = in_secs(10);
	ret = pthread_mutex_timedlock(&e.c->lock, &ts);
	CHECK_EQ(ret, 0);
	if (!ret)
		pthread_mutex_unlock(&e.c->lock);
	pthread_mutex_lock(&hk_lock);
	hk_released = 1;
	pthread_cond_broadcast(&hk_cond);
	pthread_mutex_unlock(&hk_lock);
	pthread_join(th, NULL);
	CHECK_EQ(t.ret, 0);
	pm_test_page_write = NULL;
	/* the free entry was durable when the truncate returned: a crash
	 * then finds no block of the file */
	cache_file_put(e.c, t.f);
	cache_abandon(e.c);
	e.c = NULL;
	env_open(&e);
	cache_snapshot(e.c, &snap);
	CHECK_EQ(STAT_GAUGE(&snap, used_slots), 0);
	close(fd);
	env_fini(&e);
	rec_log_free(L);
	free(buf);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_free_entry_not_under_lock);
	free(rbuf);
	return CHECK_DONE();
}
