/* tests: destage — runs of many small blocks, flush on a busy mount, a backing
 * write failing in the middle of a pipelined pass, direct and buffered
 * backing writes, scattered pages written with several writes in flight,
 * writes around the cache ending with destage's drain, which leaves a file
 * written around alone. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "../../cache/mngt/mngt.h"
#include "env.h"

/* 4 KiB blocks: a 1 MiB run of destage reads spans 256 slots, each still
 * locked while the batch is read (it overflowed its list of held slots). */
static void test_destage_runs_of_small_blocks(void)
{
	struct env e;
	size_t size = 3 * MiB;
	char *buf = malloc(size);
	struct cfile *f;
	int fd;

	env_init(&e, 1024, 4 * KiB);
	f = file_open(&e, "f", &fd);
	fill(buf, size, 1);
	CHECK_EQ(cache_write(e.c, f, buf, size, 0), 0);
	CHECK_EQ(cache_flush(e.c, NULL, NULL), 0);
	CHECK(backing_same(fd, buf, size));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(buf);
}

/*
 * A pass of several runs writes them behind its reads (cache/clean/destage_io.c).
 * When a write behind fails (here: the file size limit, EFBIG, at 2.5 MiB of
 * 6 MiB; the backing file has its size already, so only writes fail), the
 * pass fails, marks nothing clean, and a later pass writes all.
 */
static struct env e_err;

static void test_pipelined_pass_write_error(void)
{
	struct rlimit old, lim;
	struct stat_snap *st = malloc(sizeof(*st));
	size_t size = 6 * MiB;
	char *buf = malloc(size);
	struct cfile *f;
	int fd;

	env_init(&e_err, 256, 64 * KiB);
	fd = openat(e_err.backing_fd, "f", O_RDWR | O_CREAT, 0644);
	CHECK_EQ(ftruncate(fd, size), 0);
	close(fd);
	f = file_open(&e_err, "f", &fd);
	fill(buf, size, 4);
	CHECK_EQ(cache_write(e_err.c, f, buf, size, 0), 0);
	signal(SIGXFSZ, SIG_IGN);
	CHECK_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
	lim = old;
	lim.rlim_cur = 5 * MiB / 2;
	CHECK_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
	CHECK_EQ(cache_file_flush(e_err.c, f), -EFBIG);
	CHECK_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
	cache_snapshot(e_err.c, st);
	CHECK_EQ(STAT_GAUGE(st, dirty_bytes), size); /* nothing clean */
	CHECK(STAT_CTR(st, destage_errors) >= 1);
	CHECK_EQ(cache_file_flush(e_err.c, f), 0);
	CHECK(backing_same(fd, buf, size));
	cache_snapshot(e_err.c, st);
	CHECK_EQ(STAT_GAUGE(st, dirty_bytes), 0);
	cache_file_put(e_err.c, f);
	close(fd);
	env_fini(&e_err);
	free(buf);
	free(st);
}

static struct env fe;
static int stop;

static void *busy_writer(void *arg)
{
	struct cfile *f = arg;
	char buf[64 * 1024];
	unsigned i = 0;

	fill(buf, sizeof(buf), 3);
	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED))
		CHECK_EQ(cache_write(fe.c, f, buf, sizeof(buf),
				     (i++ % 32) * sizeof(buf)),
			 0);
	return NULL;
}

static void hung(int sig)
{
	static const char msg[] =
		"flush still waiting after 30 s while a writer runs\n";

	(void)!write(2, msg, sizeof(msg) - 1);
	_exit(1);
}

/* A flush returns once what was written before it is destaged, even while
 * another writer keeps the cache dirty. */
static void test_flush_on_a_busy_mount(void)
{
	char *buf = malloc(MiB);
	struct cfile *a, *b;
	pthread_t t;
	int fa, fb;

	env_init(&fe, 64, 64 * KiB);
	/* destage slower than the writer: the cache never runs clean */
	cache_config(fe.c)->max_rate = 16 * MiB;
	a = file_open(&fe, "a", &fa);
	b = file_open(&fe, "b", &fb);
	fill(buf, MiB, 2);
	CHECK_EQ(cache_write(fe.c, a, buf, MiB, 0), 0);
	pthread_create(&t, NULL, busy_writer, b);
	usleep(100000);
	signal(SIGALRM, hung);
	alarm(30);
	CHECK_EQ(cache_flush(fe.c, NULL, NULL), 0);
	alarm(0);
	CHECK(backing_same(fa, buf, MiB));
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	pthread_join(t, NULL);
	cache_file_put(fe.c, a);
	cache_file_put(fe.c, b);
	close(fa);
	close(fb);
	env_fini(&fe);
	free(buf);
}

/* Pages of the backing file in the page cache. */
static size_t resident_pages(int fd, size_t size)
{
	size_t n = (size + 4095) / 4096, i, k = 0;
	unsigned char *v = calloc(n, 1);
	void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);

	CHECK(m != MAP_FAILED);
	CHECK_EQ(mincore(m, size, v), 0);
	for (i = 0; i < n; i++)
		k += v[i] & 1;
	munmap(m, size);
	free(v);
	return k;
}

/*
 * A pass writes whole pages to the backing file with O_DIRECT (they do not
 * land in the page cache) and the file's last partial page through it
 * (destage_io.c); on a store that refuses direct I/O (bks_off) everything
 * goes through the page cache.  Either way the backing file ends up holding
 * exactly what was written.
 */
static void test_direct_and_buffered_writes(void)
{
	size_t size = 5 * MiB + 1234;
	char *buf = malloc(size);
	struct cfile *f;
	int fd, off;

	for (off = 0; off < 2; off++) {
		env_init(&e_err, 256, 64 * KiB);
		f = file_open(&e_err, "f", &fd);
		if (off)
			__atomic_store_n(&f->bks_off, 1, __ATOMIC_RELAXED);
		fill(buf, size, 7 + off);
		CHECK_EQ(cache_write(e_err.c, f, buf, size, 0), 0);
		CHECK_EQ(cache_flush(e_err.c, NULL, NULL), 0);
		if (off)
			CHECK_EQ(resident_pages(fd, size), (size + 4095) / 4096);
		else /* only the tail page went through the page cache */
			CHECK(resident_pages(fd, size) <= 1);
		CHECK(backing_same(fd, buf, size));
		cache_file_put(e_err.c, f);
		close(fd);
		env_fini(&e_err);
	}
	free(buf);
}

/*
 * Scattered dirty pages (one 4 KiB page in each of 96 blocks of 64 KiB) are
 * many short runs of one pass: they go to the store with several writes in
 * flight, not two at a time.  The backing-write hook (run by the helper
 * after its write) holds each write until WANT_INFLIGHT are in it at once,
 * or 100 ms; the most seen at once must reach WANT_INFLIGHT (a pass that
 * keeps two in flight sees two), and the backing file is byte-identical.
 */
#define WANT_INFLIGHT 8
static int in_hook, most_in_hook;
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hook_cond = PTHREAD_COND_INITIALIZER;

static void bk_write_held(void *arg, ino_t ino, const void *buf, size_t len,
			  uint64_t off)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += 100 * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&hook_lock);
	if (++in_hook > most_in_hook)
		most_in_hook = in_hook;
	pthread_cond_broadcast(&hook_cond);
	while (in_hook < WANT_INFLIGHT &&
	       !pthread_cond_timedwait(&hook_cond, &hook_lock, &ts))
		;
	in_hook--;
	pthread_mutex_unlock(&hook_lock);
}

static const struct cache_bk_hooks held_hooks = { .write = bk_write_held };

static void test_scattered_pages_destage_deep(void)
{
	size_t size = 95 * 64 * KiB + 4 * KiB; /* ends with the last page */
	char *buf = malloc(96 * 64 * KiB);
	struct cfile *f;
	int fd, k;

	env_init(&e_err, 256, 64 * KiB);
	f = file_open(&e_err, "f", &fd);
	fill(buf, 96 * 64 * KiB, 9);
	/* what is not written is zeros in the reference too */
	for (k = 0; k < 96; k++)
		memset(buf + k * 64 * KiB + 4 * KiB, 0, 60 * KiB);
	for (k = 0; k < 96; k++)
		CHECK_EQ(cache_write(e_err.c, f, buf + k * 64 * KiB, 4 * KiB,
				     k * 64 * KiB),
			 0);
	cache_set_bk_hooks(e_err.c, &held_hooks);
	CHECK_EQ(cache_flush(e_err.c, NULL, NULL), 0);
	cache_set_bk_hooks(e_err.c, NULL);
	CHECK(most_in_hook >= WANT_INFLIGHT);
	CHECK(backing_same(fd, buf, size));
	cache_file_put(e_err.c, f);
	close(fd);
	env_fini(&e_err);
	free(buf);
}

/*
 * Writes go around the cache only while destage drains, and both end at the
 * low watermark together.  200 blocks; b (59 blocks) dirty first, then a
 * (101): at 160 (80%) the destager starts on b, the oldest, and is held at
 * its fdatasync while a write of c goes around (writes go around from
 * there).  Once b is clean 101 blocks are dirty, 50.5%: above the low
 * watermark (50), so destage must go on (it once took 50.5% for 50, went
 * idle, and writes went around for good).  It must clean a, after which a
 * new block is cached again, and everything reads back.
 */
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static int gate_shut, gate_waiting;

static void bk_sync_gated(void *arg, ino_t ino)
{
	(void)arg;
	(void)ino;
	pthread_mutex_lock(&gate_lock);
	gate_waiting++;
	pthread_cond_broadcast(&gate_cond);
	while (gate_shut)
		pthread_cond_wait(&gate_cond, &gate_lock);
	gate_waiting--;
	pthread_mutex_unlock(&gate_lock);
}

static const struct cache_bk_hooks gated_hooks = { .sync = bk_sync_gated };

static uint64_t dirty_slots_now(struct env *e)
{
	cache_snapshot(e->c, &snap);
	return STAT_GAUGE(&snap, dirty_slots);
}

static void test_write_around_ends_with_destage(void)
{
	uint64_t bs = 64 * KiB, t;
	char *ref = malloc(102 * bs);
	struct cfile *f[3];
	int fd[3], k;

	env_init(&e_err, 100, 64 * KiB);
	cache_close(e_err.c, 0);
	e_err.cfg.threads = 1;
	e_err.cfg.high_wm = 80;
	e_err.cfg.low_wm = 50;
	e_err.cfg.write_around = 80;
	env_open(&e_err);
	cache_snapshot(e_err.c, &snap);
	CHECK_EQ(STAT_GAUGE(&snap, slots), 200);
	f[0] = file_open(&e_err, "a", &fd[0]);
	f[1] = file_open(&e_err, "b", &fd[1]);
	f[2] = file_open(&e_err, "c", &fd[2]);
	fill(ref, 102 * bs, 11);
	gate_shut = 1;
	cache_set_bk_hooks(e_err.c, &gated_hooks);
	CHECK_EQ(cache_write(e_err.c, f[1], ref, 59 * bs, 0), 0);
	for (k = 0; k < 101; k++) /* block by block: the 101st crosses 80% */
		CHECK_EQ(cache_write(e_err.c, f[0], ref + k * bs, bs, k * bs),
			 0);
	CHECK_EQ(dirty_slots_now(&e_err), 160);
	/* b's pass reaches its fdatasync and waits there */
	pthread_mutex_lock(&gate_lock);
	while (!gate_waiting)
		pthread_cond_wait(&gate_cond, &gate_lock);
	pthread_mutex_unlock(&gate_lock);
	CHECK_EQ(cache_write(e_err.c, f[2], ref, bs, 0), 0);
	cache_snapshot(e_err.c, &snap);
	CHECK_EQ(STAT_CTR(&snap, write_around_bytes), bs);
	CHECK_EQ(STAT_GAUGE(&snap, writing_around), 1);
	pthread_mutex_lock(&gate_lock);
	gate_shut = 0;
	pthread_cond_broadcast(&gate_cond);
	pthread_mutex_unlock(&gate_lock);
	/* b clean: 101 of 200 dirty, then a's pass; 5 s is plenty in memory */
	for (t = 0; t < 500 && dirty_slots_now(&e_err) > 100; t++)
		usleep(10000);
	CHECK(dirty_slots_now(&e_err) <= 100);
	cache_snapshot(e_err.c, &snap);
	CHECK_EQ(STAT_GAUGE(&snap, writing_around), 0);
	/* a new block of c is the cache's again */
	CHECK_EQ(cache_write(e_err.c, f[2], ref + bs, bs, bs), 0);
	cache_snapshot(e_err.c, &snap);
	CHECK_EQ(STAT_CTR(&snap, write_around_bytes), bs);
	cache_set_bk_hooks(e_err.c, NULL);
	CHECK(same(&e_err, f[0], ref, 101 * bs, 0));
	CHECK(same(&e_err, f[1], ref, 59 * bs, 0));
	CHECK(same(&e_err, f[2], ref, 2 * bs, 0));
	CHECK_EQ(cache_flush(e_err.c, NULL, NULL), 0);
	CHECK(backing_same(fd[0], ref, 101 * bs));
	CHECK(backing_same(fd[1], ref, 59 * bs));
	CHECK(backing_same(fd[2], ref, 2 * bs));
	for (k = 0; k < 3; k++) {
		cache_file_put(e_err.c, f[k]);
		close(fd[k]);
	}
	env_fini(&e_err);
	free(ref);
}

/*
 * A drain leaves alone a file written around the cache, until its stream
 * pauses.  As above, b (59 blocks) then a (101 of its 200) make 80%, the
 * destager is held at b's fdatasync, and a write into a's clean part goes
 * around.  A thread then writes around a every 5 ms: once b is clean,
 * 101 of 200 are dirty and destage drains, but not a, whose dirty blocks
 * stay while the stream lasts (it would only compete with it: destage.c);
 * its stream stops, and the drain takes a down to the low watermark.
 */
struct stream {
	struct cfile *f;
	const char *ref;
	volatile int stop;
	int ret, n;
};

static void *stream_main(void *arg)
{
	struct stream *st = arg;
	uint64_t bs = 64 * KiB;

	while (!st->stop && !st->ret) {
		uint64_t k = 101 + st->n % 98;

		st->ret = cache_write(e_err.c, st->f, st->ref + k * 4096,
				      4096, k * bs);
		st->n++;
		usleep(5000);
	}
	return NULL;
}

static void test_drain_leaves_a_stream_around_alone(void)
{
	uint64_t bs = 64 * KiB, t, around;
	char *ref = malloc(200 * bs), *want = malloc(200 * bs);
	struct stream st = { 0 };
	struct cfile *a, *b;
	pthread_t thr;
	int fa, fb, k;

	env_init(&e_err, 100, 64 * KiB);
	cache_close(e_err.c, 0);
	e_err.cfg.threads = 1;
	e_err.cfg.high_wm = 80;
	e_err.cfg.low_wm = 50;
	e_err.cfg.write_around = 80;
	env_open(&e_err);
	e_err.c->test_around_quiet_ms = 2000; /* no scheduling gap is as long */
	a = file_open(&e_err, "a", &fa);
	b = file_open(&e_err, "b", &fb);
	fill(ref, 200 * bs, 13);
	memset(want, 0, 200 * bs);
	gate_shut = 1;
	cache_set_bk_hooks(e_err.c, &gated_hooks);
	CHECK_EQ(cache_write(e_err.c, b, ref, 59 * bs, 0), 0);
	CHECK_EQ(cache_write(e_err.c, a, ref + 199 * bs, bs, 199 * bs), 0);
	memcpy(want + 199 * bs, ref + 199 * bs, bs);
	for (k = 0; k < 100; k++) {
		CHECK_EQ(cache_write(e_err.c, a, ref + k * bs, bs, k * bs), 0);
		memcpy(want + k * bs, ref + k * bs, bs);
	}
	CHECK_EQ(dirty_slots_now(&e_err), 160);
	pthread_mutex_lock(&gate_lock);
	while (!gate_waiting)
		pthread_cond_wait(&gate_cond, &gate_lock);
	pthread_mutex_unlock(&gate_lock);
	st.f = a;
	st.ref = ref;
	pthread_create(&thr, NULL, stream_main, &st);
	while (!st.n && !st.ret)
		usleep(1000);
	cache_snapshot(e_err.c, &snap);
	CHECK(STAT_CTR(&snap, write_around_bytes) >= 4096);
	pthread_mutex_lock(&gate_lock);
	gate_shut = 0;
	pthread_cond_broadcast(&gate_cond);
	pthread_mutex_unlock(&gate_lock);
	/* b clean; a's 101 dirty blocks stay while its stream goes on */
	for (t = 0; t < 500 && dirty_slots_now(&e_err) > 101; t++)
		usleep(10000);
	CHECK_EQ(dirty_slots_now(&e_err), 101);
	usleep(500000);
	CHECK_EQ(dirty_slots_now(&e_err), 101);
	cache_snapshot(e_err.c, &snap);
	around = STAT_CTR(&snap, write_around_bytes);
	CHECK(around >= 20 * 4096); /* the stream went around all along */
	CHECK_EQ(STAT_GAUGE(&snap, writing_around), 1);
	st.stop = 1;
	pthread_join(thr, NULL);
	CHECK_EQ(st.ret, 0);
	for (k = 0; k < st.n; k++) {
		uint64_t blk = 101 + k % 98;

		memcpy(want + blk * bs, ref + blk * 4096, 4096);
	}
	/* the stream paused: the drain takes a */
	for (t = 0; t < 1000 && dirty_slots_now(&e_err) > 100; t++)
		usleep(10000);
	CHECK(dirty_slots_now(&e_err) <= 100);
	cache_snapshot(e_err.c, &snap);
	CHECK_EQ(STAT_GAUGE(&snap, writing_around), 0);
	cache_set_bk_hooks(e_err.c, NULL);
	CHECK(same(&e_err, a, want, 200 * bs, 0));
	CHECK(same(&e_err, b, ref, 59 * bs, 0));
	CHECK_EQ(cache_flush(e_err.c, NULL, NULL), 0);
	CHECK(backing_same(fa, want, 200 * bs));
	CHECK(backing_same(fb, ref, 59 * bs));
	cache_file_put(e_err.c, a);
	cache_file_put(e_err.c, b);
	close(fa);
	close(fb);
	env_fini(&e_err);
	free(ref);
	free(want);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_destage_runs_of_small_blocks);
	RUN(test_flush_on_a_busy_mount);
	RUN(test_pipelined_pass_write_error);
	RUN(test_direct_and_buffered_writes);
	RUN(test_scattered_pages_destage_deep);
	RUN(test_write_around_ends_with_destage);
	RUN(test_drain_leaves_a_stream_around_alone);
	free(rbuf);
	return CHECK_DONE();
}
