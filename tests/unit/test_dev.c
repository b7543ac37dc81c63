/* tests: io_uring devices on a real file — every I/O of a batch is finished
 * and has its own result when dev_io_run returns, whatever went wrong. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../../devices/dev.h"
#include "check.h"

#define BLK 4096u
#define NBLK 1024u /* a 4 MiB device */
#define BATCH 320u /* more than twice the ring (128 entries) */
#define UNSET 0x7eadbeef /* res before dev_io_run: never a real result */
#define POISON 0xa5

static struct dev *dev;
static uint8_t *wbuf[2], *rbuf[2]; /* BATCH blocks each */

/*
 * The system calls the devices make synchronously, seen from here: this
 * program's own definitions take the place of the C library's for the
 * devices module linked into it, count, and enter the kernel.
 */
static unsigned sys_writes, sys_dsync_writes, sys_fdatasyncs;

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	__atomic_add_fetch(&sys_writes, 1, __ATOMIC_RELAXED);
	return syscall(SYS_pwrite64, fd, buf, n, off);
}

ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
	__atomic_add_fetch(&sys_writes, 1, __ATOMIC_RELAXED);
	if (flags & (RWF_DSYNC | RWF_SYNC))
		__atomic_add_fetch(&sys_dsync_writes, 1, __ATOMIC_RELAXED);
	return syscall(SYS_pwritev2, fd, iov, cnt, (long)off,
		       (long)((uint64_t)off >> 32), flags);
}

int fdatasync(int fd)
{
	__atomic_add_fetch(&sys_fdatasyncs, 1, __ATOMIC_RELAXED);
	return syscall(SYS_fdatasync, fd);
}

/* A device on a regular file; the file is unlinked at once, so nothing is
 * left behind whatever happens. */
static struct dev *open_file_dev(uint64_t size)
{
	const char *dir =
		getenv("NVC_TEST_DIR") ? getenv("NVC_TEST_DIR") : "/var/tmp";
	char path[256];
	struct dev *d;
	int fd, ret;

	snprintf(path, sizeof(path), "%s/nvc-test-dev-XXXXXX", dir);
	fd = mkstemp(path);
	if (fd < 0 || ftruncate(fd, size)) {
		perror(path);
		exit(1);
	}
	ret = dev_open(path, &d);
	unlink(path);
	close(fd);
	if (ret) {
		fprintf(stderr, "dev_open %s: %s\n", path, strerror(-ret));
		exit(1);
	}
	return d;
}

/* Block blk's contents in generation gen: every word names both. */
static void pattern(uint8_t *p, uint32_t blk, uint32_t gen)
{
	uint64_t *w = (uint64_t *)p;
	unsigned i;

	for (i = 0; i < BLK / 8; i++)
		w[i] = ((uint64_t)gen << 40 | (uint64_t)blk << 16 | i) *
		       0x9e3779b97f4a7c15ull;
}

static int is_pattern(const uint8_t *p, uint32_t blk, uint32_t gen)
{
	static uint8_t want[BLK];

	pattern(want, blk, gen);
	return !memcmp(p, want, BLK);
}

static int all_poison(const uint8_t *p, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (p[i] != POISON)
			return 0;
	return 1;
}

static void set_io(struct dev_io *io, struct dev *d, enum dev_op op,
		   uint8_t *buf, uint64_t blk)
{
	memset(io, 0, sizeof(*io));
	io->dev = d;
	io->op = op;
	io->buf = buf;
	io->off = blk * BLK;
	io->len = BLK;
	io->res = UNSET;
}

/* Write gen to blocks first..first+n-1, with no faults; 0 on success. */
static int write_gen(uint32_t first, unsigned n, uint32_t gen)
{
	static struct dev_io ios[BATCH];
	unsigned i;

	for (i = 0; i < n; i++) {
		pattern(wbuf[0] + i * BLK, first + i, gen);
		set_io(&ios[i], dev, DEV_WRITE, wbuf[0] + i * BLK, first + i);
	}
	return dev_io_run(ios, n);
}

/* Blocks first..first+n-1 hold gen (read with no faults). */
static int holds_gen(uint32_t first, unsigned n, uint32_t gen)
{
	static struct dev_io ios[BATCH];
	unsigned i, bad = 0;

	memset(rbuf[0], 0, n * BLK);
	for (i = 0; i < n; i++)
		set_io(&ios[i], dev, DEV_READ, rbuf[0] + i * BLK, first + i);
	if (dev_io_run(ios, n))
		return 0;
	for (i = 0; i < n; i++)
		bad += ios[i].res ||
		       !is_pattern(rbuf[0] + i * BLK, first + i, gen);
	return !bad;
}

/* A batch larger than the ring: every I/O done, every byte where it belongs.
 */
static void test_batch_larger_than_ring(void)
{
	static struct dev_io ios[BATCH];
	unsigned i, bad = 0;

	CHECK_EQ(write_gen(0, BATCH, 1), 0);
	CHECK(holds_gen(0, BATCH, 1));
	/* reads and writes mixed: even blocks rewritten, odd ones read */
	memset(rbuf[1], 0, BATCH * BLK);
	for (i = 0; i < BATCH; i++) {
		if (i % 2) {
			set_io(&ios[i], dev, DEV_READ, rbuf[1] + i * BLK, i);
		} else {
			pattern(wbuf[1] + i * BLK, i, 2);
			set_io(&ios[i], dev, DEV_WRITE, wbuf[1] + i * BLK, i);
			ios[i].fua = i % 4 == 0;
		}
	}
	CHECK_EQ(dev_io_run(ios, BATCH), 0);
	for (i = 0; i < BATCH; i++)
		bad += ios[i].res != 0 ||
		       (i % 2 && !is_pattern(rbuf[1] + i * BLK, i, 1));
	CHECK_EQ(bad, 0);
	for (i = 0; i < BATCH; i++)
		bad += !holds_gen(i, 1, i % 2 ? 1 : 2);
	CHECK_EQ(bad, 0);
	CHECK_EQ(dev_flush(dev), 0);
}

static volatile int stop_signals;
static unsigned long signals_seen;

static void on_signal(int sig)
{
	__atomic_add_fetch(&signals_seen, 1, __ATOMIC_RELAXED);
}

static void *signal_thread(void *arg)
{
	pthread_t target = *(pthread_t *)arg;

	while (!stop_signals) {
		pthread_kill(target, SIGUSR1);
		sched_yield();
	}
	return NULL;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000ull + ts.tv_nsec / 1000000;
}

/*
 * Signals without SA_RESTART interrupt every wait of the I/O thread.  Round r
 * writes generation r + 1 to one half of region A and reads the other half,
 * which round r - 1 wrote.  As soon as a round returns its buffers are
 * poisoned: a write still in flight would then put poison on the device
 * (seen by the next round's reads), a read still in flight would overwrite
 * poison (seen before the buffers are used again, and at the end).
 */
static void test_signals_interrupt_waits(void)
{
	static struct dev_io ios[BATCH];
	const unsigned half = BATCH / 2;
	struct sigaction sa = { .sa_handler = on_signal }, old;
	pthread_t self = pthread_self(), killer;
	unsigned r, i, bad_res = 0, bad_data = 0, late = 0, rounds = 0;
	uint64_t until;
	int bad_ret = 0;

	CHECK_EQ(write_gen(0, half, 1), 0); /* what round 1 reads */
	memset(rbuf[0], POISON, BATCH * BLK);
	memset(rbuf[1], POISON, BATCH * BLK);
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0; /* no SA_RESTART */
	sigaction(SIGUSR1, &sa, &old);
	stop_signals = 0;
	pthread_create(&killer, NULL, signal_thread, &self);
	until = now_ms() + 3000;
	for (r = 1; r <= 400 && now_ms() < until; r++) {
		uint32_t wbase = (r % 2) * half, rbase = ((r + 1) % 2) * half;
		uint8_t *w = wbuf[r % 2], *rd = rbuf[r % 2];
		int ret;

		if (!all_poison(rd, half * BLK))
			late++;
		for (i = 0; i < half; i++) {
			pattern(w + i * BLK, wbase + i, r + 1);
			set_io(&ios[i], dev, DEV_WRITE, w + i * BLK, wbase + i);
			set_io(&ios[half + i], dev, DEV_READ, rd + i * BLK,
			       rbase + i);
		}
		ret = dev_io_run(ios, BATCH);
		bad_ret += ret != 0;
		for (i = 0; i < BATCH; i++)
			bad_res += ios[i].res != 0;
		for (i = 0; i < half; i++)
			bad_data += !is_pattern(rd + i * BLK, rbase + i, r);
		memset(w, POISON, half * BLK);
		memset(rd, POISON, half * BLK);
		rounds++;
	}
	stop_signals = 1;
	pthread_join(killer, NULL);
	sigaction(SIGUSR1, &old, NULL);
	usleep(50000);
	late += !all_poison(rbuf[0], half * BLK) +
		!all_poison(rbuf[1], half * BLK);
	printf("     %u rounds of %u I/Os, %lu signals\n", rounds, BATCH,
	       signals_seen);
	CHECK(signals_seen > 0);
	CHECK_EQ(bad_ret, 0);
	CHECK_EQ(bad_res, 0);
	CHECK_EQ(bad_data, 0);
	CHECK_EQ(late, 0);
	/* the last round (r - 1) wrote generation r, unpoisoned */
	CHECK(holds_gen(((r - 1) % 2) * half, half, r));
}

/*
 * Errors of single I/Os in a batch: past the device's end, a misaligned
 * O_DIRECT buffer (refused by the kernel at completion), a device that fails
 * writes.  Each gets its own error; every other I/O completes.
 */
static void test_errors_stay_with_their_io(void)
{
	static struct dev_io ios[BATCH];
	struct dev *bad_dev = open_file_dev(NBLK * BLK);
	unsigned i, bad = 0;
	int ret;

	dev_faults(bad_dev)->fail_writes = -EIO;
	for (i = 0; i < BATCH; i++) {
		pattern(wbuf[0] + i * BLK, i, 3);
		set_io(&ios[i], dev, DEV_WRITE, wbuf[0] + i * BLK, i);
	}
	ios[5].off = NBLK * BLK; /* past the end */
	ios[200].buf = wbuf[1] + 1; /* misaligned */
	ios[300].dev = bad_dev;
	ret = dev_io_run(ios, BATCH);
	CHECK_EQ(ret, -EINVAL); /* the first error in the array */
	CHECK_EQ(ios[5].res, -EINVAL);
	CHECK_EQ(ios[200].res, -EINVAL);
	CHECK_EQ(ios[300].res, -EIO);
	for (i = 0; i < BATCH; i++)
		if (i != 5 && i != 200 && i != 300)
			bad += ios[i].res != 0 || !holds_gen(i, 1, 3);
	CHECK_EQ(bad, 0);
	dev_close(bad_dev);
}

/*
 * The kernel refusing a submission for a while (a signal, no memory for a
 * request, a full completion queue) is retried; every I/O completes.
 */
static void test_transient_submit_errors(void)
{
	static const int errs[] = { -EINTR, -EAGAIN, -EBUSY };
	unsigned k;

	for (k = 0; k < 3; k++) {
		struct dev_ring_faults f = { .submit_err = errs[k],
					     .submit_skip = k,
					     .submit_count = 5 };

		dev_set_ring_faults(&f);
		CHECK_EQ(write_gen(0, BATCH, 10 + k), 0);
		dev_set_ring_faults(NULL);
		CHECK(holds_gen(0, BATCH, 10 + k));
	}
}

/*
 * A submission that keeps failing: what was submitted before completes, the
 * rest is done synchronously (a ring's refusal is not the device's answer,
 * dev.h), every I/O succeeds, and what the kernel was not given never
 * reaches the device later, not even when later batches submit again: the
 * buffers changed after the batch returned are not written.
 */
static void test_failed_submit_leaves_nothing_behind(void)
{
	static struct dev_io ios[BATCH];
	struct dev_ring_faults f = { .submit_err = -ENOMEM,
				     .submit_skip = 1,
				     .submit_count = 1000000 };
	unsigned i, bad = 0;
	uint64_t refused = dev_ring_refusals();
	int ret;

	CHECK_EQ(write_gen(0, BATCH, 20), 0);
	for (i = 0; i < BATCH; i++) {
		pattern(wbuf[1] + i * BLK, i, 21);
		set_io(&ios[i], dev, DEV_WRITE, wbuf[1] + i * BLK, i);
	}
	dev_set_ring_faults(&f);
	ret = dev_io_run(ios, BATCH);
	dev_set_ring_faults(NULL);
	CHECK_EQ(ret, 0);
	for (i = 0; i < BATCH; i++)
		bad += ios[i].res != 0;
	CHECK_EQ(bad, 0); /* every I/O done, by the ring or here */
	/* the first submission went through, the rest was done here */
	CHECK(dev_ring_refusals() - refused > 0 &&
	      dev_ring_refusals() - refused <= BATCH - 128);
	for (i = 0; i < BATCH; i++)
		pattern(wbuf[1] + i * BLK, i, 23);
	/* more batches and a flush go through the same ring */
	CHECK_EQ(write_gen(BATCH, BATCH, 22), 0);
	CHECK_EQ(dev_flush(dev), 0);
	usleep(20000);
	for (i = 0; i < BATCH; i++)
		bad += !holds_gen(i, 1, 21);
	CHECK_EQ(bad, 0);
	CHECK(holds_gen(BATCH, BATCH, 22));
}

/*
 * Waiting for completions fails: transient errors are retried, others too
 * (the kernel owns the buffers until the I/O completes), and dev_io_run
 * returns only when every I/O is done.
 */
static void test_failed_waits(void)
{
	static const struct dev_ring_faults fs[] = {
		{ .wait_err = -EINTR, .wait_count = 50 },
		{ .wait_err = -EBADR, .wait_count = 3 },
		{ .wait_err = -EFAULT, .wait_skip = 1, .wait_count = 2 },
	};
	static struct dev_io ios[BATCH];
	unsigned k, i, bad = 0;

	CHECK_EQ(write_gen(0, BATCH, 21), 0);
	for (k = 0; k < 3; k++) {
		memset(rbuf[1], POISON, BATCH * BLK);
		for (i = 0; i < BATCH; i++)
			set_io(&ios[i], dev, DEV_READ, rbuf[1] + i * BLK, i);
		dev_set_ring_faults(&fs[k]);
		CHECK_EQ(dev_io_run(ios, BATCH), 0);
		dev_set_ring_faults(NULL);
		for (i = 0; i < BATCH; i++)
			bad += ios[i].res != 0 ||
			       !is_pattern(rbuf[1] + i * BLK, i, 21);
		memset(rbuf[1], POISON, BATCH * BLK);
		/* the next batch must not see this one's completions */
		CHECK_EQ(write_gen(0, BATCH, 21), 0);
		usleep(10000);
		CHECK(all_poison(rbuf[1], BATCH * BLK));
	}
	CHECK_EQ(bad, 0);
	CHECK(holds_gen(0, BATCH, 21));
}

/*
 * No ring (a thread out of file descriptors): the memory device's I/O in the
 * same batch completes, every io_uring I/O is done synchronously.
 */
static void *no_ring_thread(void *arg)
{
	static struct dev_io ios[4];
	struct dev *mem;
	struct rlimit old, lim;
	int *ret = arg, fd;

	if (dev_mem_create(BLK, &mem))
		exit(1);
	for (fd = 0; fd < 4; fd++) {
		pattern(wbuf[0] + fd * BLK, 40 + fd, 24);
		set_io(&ios[fd], fd ? dev : mem, DEV_WRITE, wbuf[0] + fd * BLK,
		       40 + fd);
	}
	ios[0].off = 0;
	getrlimit(RLIMIT_NOFILE, &old);
	fd = dup(0); /* the lowest free descriptor: the limit */
	close(fd);
	lim = old;
	lim.rlim_cur = fd;
	setrlimit(RLIMIT_NOFILE, &lim);
	*ret = dev_io_run(ios, 4);
	setrlimit(RLIMIT_NOFILE, &old);
	for (fd = 0; fd < 4; fd++)
		CHECK_EQ(ios[fd].res, 0);
	dev_close(mem);
	return NULL;
}

static void test_no_ring(void)
{
	pthread_t t;
	int ret = -1;

	pthread_create(&t, NULL, no_ring_thread, &ret);
	pthread_join(t, NULL);
	CHECK_EQ(ret, 0);
	CHECK(holds_gen(41, 3, 24));
}

/*
 * pm_map never creates a file on the file system /dev is on (it would live
 * in RAM, in the place of a device that is gone), nor maps one found there.
 */
static void test_pm_map_creates_nothing_under_dev(void)
{
	struct pm_region r;
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/dev/nvc-test-dev-%d", (int)getpid());
	if (pm_map(path, 1 << 20, 1, &r) != -ENODEV) {
		CHECK(!"pm_map created a mirror under /dev");
		pm_unmap(&r);
	}
	CHECK_EQ(access(path, F_OK), -1);
	unlink(path);
	CHECK_EQ(pm_map(path, 0, 0, &r), -ENODEV);
	/* a path in a directory that is not there either */
	strcat(path, "/sub/mirror");
	CHECK_EQ(pm_map(path, 1 << 20, 1, &r), -ENODEV);
	/* a regular file found there is not a mirror */
	snprintf(path, sizeof(path), "/dev/nvc-test-dev-%d", (int)getpid());
	fd = open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
	CHECK(fd >= 0);
	if (fd >= 0) {
		CHECK_EQ(ftruncate(fd, 1 << 20), 0);
		close(fd);
		CHECK_EQ(pm_map(path, 0, 0, &r), -ENODEV);
		unlink(path);
	}
	/* elsewhere a lost mirror is still made anew */
	snprintf(path, sizeof(path), "/var/tmp/nvc-test-dev-%d", (int)getpid());
	CHECK_EQ(pm_map(path, 1 << 20, 1, &r), 0);
	CHECK_EQ(access(path, F_OK), 0);
	pm_unmap(&r);
	unlink(path);
}

/* The victim's bytes, still all there: 1 if untouched. */
static int victim_intact(const char *path)
{
	char buf[16] = { 0 };
	struct stat st;
	int fd = open(path, O_RDONLY), n;

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	return !lstat(path, &st) && st.st_size == 8 && n == 8 &&
	       !memcmp(buf, "victim!!", 8);
}

/*
 * pm_map never follows a symbolic link at a mirror's place (root would write
 * the metadata over what a user's link points at, or make a file where a
 * dangling one points), and takes no regular file of another user.
 * (Issue 24, finding 10.)
 */
static void test_pm_map_follows_no_link(void)
{
	char victim[64], link[64], gone[64];
	struct pm_region r;
	struct stat st;
	int fd, pid = (int)getpid();

	snprintf(victim, sizeof(victim), "/var/tmp/nvc-test-victim-%d", pid);
	snprintf(link, sizeof(link), "/var/tmp/nvc-test-link-%d", pid);
	snprintf(gone, sizeof(gone), "/var/tmp/nvc-test-gone-%d", pid);
	fd = open(victim, O_CREAT | O_EXCL | O_WRONLY, 0600);
	CHECK(fd >= 0);
	CHECK_EQ(write(fd, "victim!!", 8), 8);
	close(fd);
	CHECK_EQ(symlink(victim, link), 0);
	if (pm_map(link, 1 << 20, 1, &r) != -ELOOP) {
		CHECK(!"pm_map followed a link to an existing file");
		pm_unmap(&r);
	}
	if (pm_map(link, 0, 0, &r) != -ELOOP) {
		CHECK(!"pm_map followed a link to map a file");
		pm_unmap(&r);
	}
	CHECK(victim_intact(victim));
	unlink(link);
	CHECK_EQ(symlink(gone, link), 0);
	if (pm_map(link, 1 << 20, 1, &r) != -ELOOP) {
		CHECK(!"pm_map followed a dangling link");
		pm_unmap(&r);
	}
	CHECK_EQ(access(gone, F_OK), -1);
	unlink(gone);
	unlink(link);
	if (!geteuid()) { /* another user's file is not taken */
		CHECK_EQ(chown(victim, 65534, 65534), 0);
		if (pm_map(victim, 1 << 20, 1, &r) != -EPERM) {
			CHECK(!"pm_map took another user's file");
			pm_unmap(&r);
		}
		CHECK(victim_intact(victim));
	}
	/* a new place (replace-mirror) takes no file that is there already */
	if (pm_map(victim, 1 << 20, PM_NEW, &r) != -EEXIST) {
		CHECK(!"PM_NEW took an existing file");
		pm_unmap(&r);
	}
	CHECK(victim_intact(victim));
	unlink(victim);
	/* and makes one, 0600, that a failure afterwards removes again */
	CHECK_EQ(pm_map(victim, 1 << 20, PM_NEW, &r), 0);
	CHECK(r.created);
	CHECK(!lstat(victim, &st) && S_ISREG(st.st_mode) &&
	      !(st.st_mode & 077));
	pm_unmap(&r);
	pm_unlink_created(&r, victim);
	CHECK_EQ(access(victim, F_OK), -1);
	unlink(victim);
}

static void shadow_done(struct dev_acb *cb)
{
	(void)cb;
}

/*
 * A shadow gets every write the device completed, in a batch larger than
 * the ring and through a ring, and its flushes; not the writes that
 * failed on the device, and not after it is cleared.  A shadow's own
 * failure leaves the request's result alone and is counted.
 */
static void test_shadow_copies_writes(void)
{
	struct dev *sh = open_file_dev(NBLK * BLK), *bad;
	struct dev_io ios[BATCH];
	struct dev_aring *r;
	struct dev_acb cb = { .done = shadow_done };
	unsigned i;

	dev_set_shadow(dev, sh);
	for (i = 0; i < BATCH; i++) {
		pattern(wbuf[0] + i * BLK, i, 7);
		ios[i] = (struct dev_io){ .dev = dev, .op = DEV_WRITE,
					  .buf = wbuf[0] + i * BLK,
					  .off = (uint64_t)i * BLK, .len = BLK,
					  .fua = i % 2 };
	}
	ios[3].off = (uint64_t)NBLK * BLK; /* past the end: fails */
	CHECK_EQ(dev_io_run(ios, BATCH), -EINVAL);
	CHECK_EQ(ios[3].res, -EINVAL);
	CHECK_EQ(dev_read(sh, rbuf[0], BATCH * BLK, 0), 0);
	for (i = 0; i < BATCH; i++)
		CHECK(is_pattern(rbuf[0] + i * BLK, i, 7) == (i != 3));
	/* through a ring: the copy is there when the callback runs */
	CHECK_EQ(dev_aring_new(8, &r), 0);
	pattern(wbuf[1], 3, 8);
	ios[0] = (struct dev_io){ .dev = dev, .op = DEV_WRITE, .buf = wbuf[1],
				  .off = 3 * BLK, .len = BLK };
	CHECK_EQ(dev_aring_io(r, &ios[0], &cb), 0);
	CHECK(dev_aring_run(r, 1, 0) >= 0);
	CHECK_EQ(cb.res, 0);
	CHECK_EQ(dev_read(sh, rbuf[1], BLK, 3 * BLK), 0);
	CHECK(is_pattern(rbuf[1], 3, 8));
	dev_aring_free(r);
	CHECK_EQ(dev_flush(dev), 0);
	CHECK_EQ(dev_shadow_errors(dev), 0);
	/* a shadow that fails: the device's write stands, counted */
	CHECK_EQ(dev_missing_create("gone", NBLK * BLK, &bad), 0);
	dev_set_shadow(dev, bad);
	CHECK_EQ(dev_write(dev, wbuf[1], BLK, 5 * BLK), 0);
	CHECK_EQ(dev_shadow_errors(dev), 1);
	/* cleared: nothing more goes to it */
	dev_set_shadow(dev, NULL);
	pattern(wbuf[1], 6, 9);
	CHECK_EQ(dev_write(dev, wbuf[1], BLK, 6 * BLK), 0);
	CHECK_EQ(dev_read(sh, rbuf[1], BLK, 6 * BLK), 0);
	CHECK(is_pattern(rbuf[1], 6, 7));
	dev_close(bad);
	dev_close(sh);
}

struct counted {
	struct dev_acb cb;
	unsigned *n;
};

static void counted_done(struct dev_acb *cb)
{
	(*((struct counted *)cb)->n)++;
}

/*
 * A short write (the kernel may complete a write in part) is finished
 * synchronously, and a fua write's rest is as durable as its first part
 * (issue 25, finding 2): a write with RWF_DSYNC, or a plain write and then
 * a flush, before the write is reported done; a plain write's rest is plain.
 * Through dev_io_run and through a ring; the bytes all land.
 */
static void test_short_write_keeps_fua(void)
{
	struct dev_ring_faults f = { .short_count = 1 };
	struct dev_aring *r;
	unsigned k;

	CHECK_EQ(dev_aring_new(8, &r), 0);
	for (k = 0; k < 4; k++) {
		int fua = k & 1, ring = k >> 1;
		unsigned i, w0 = sys_writes, d0 = sys_dsync_writes;
		unsigned s0 = sys_fdatasyncs, done = 0;
		struct dev_io io;
		struct counted cb = { .cb.done = counted_done, .n = &done };

		for (i = 0; i < 4; i++)
			pattern(wbuf[0] + i * BLK, 8 + i, 30 + k);
		set_io(&io, dev, DEV_WRITE, wbuf[0], 8);
		io.len = 4 * BLK;
		io.fua = fua;
		dev_set_ring_faults(&f);
		if (!ring) {
			CHECK_EQ(dev_io_run(&io, 1), 0);
		} else {
			CHECK_EQ(dev_aring_io(r, &io, &cb.cb), 0);
			for (i = 0; i < 100 && !done; i++)
				CHECK(dev_aring_run(r, 1, 0) >= 0);
			CHECK_EQ(done, 1);
			CHECK_EQ(cb.cb.res, 0);
		}
		dev_set_ring_faults(NULL);
		CHECK_EQ(io.res, 0);
		/* the rest went synchronously: the hook made it short */
		CHECK_EQ(sys_writes - w0, 1);
		CHECK_EQ((sys_dsync_writes - d0 == 1 || sys_fdatasyncs - s0 > 0),
			 fua);
		CHECK(holds_gen(8, 4, 30 + k));
	}
	dev_aring_free(r);
}

/*
 * A worker's ring that refuses (issue 25, finding 16): no room for a
 * request, a submission refused.  The device I/O is done synchronously and
 * succeeds (a refusal is the ring's, not the device's: it must not come back
 * as the request's error); a poll is not completed by a refusal, since
 * nothing became readable, but armed again: it completes once its
 * descriptor is readable, after the ring took submissions again.
 */
static void test_aring_refusal(void)
{
	struct counted cbs[6], pcb;
	struct dev_io ios[6];
	struct dev_aring *r;
	uint64_t one = 1, refused = dev_ring_refusals();
	unsigned i, done = 0, polled = 0, bad = 0;
	int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

	CHECK(efd >= 0);
	CHECK_EQ(dev_aring_new(4, &r), 0); /* room for four */
	pcb = (struct counted){ .cb.done = counted_done, .n = &polled };
	CHECK_EQ(dev_aring_readable(r, efd, &pcb.cb, 0), 0);
	dev_aring_set_faults(r, -ENOMEM, 1); /* every submission refused */
	for (i = 0; i < 6; i++) {
		pattern(wbuf[1] + i * BLK, 60 + i, 40);
		set_io(&ios[i], dev, DEV_WRITE, wbuf[1] + i * BLK, 60 + i);
		ios[i].fua = i & 1;
		cbs[i] = (struct counted){ .cb.done = counted_done, .n = &done };
		CHECK_EQ(dev_aring_io(r, &ios[i], &cbs[i].cb), 0);
	}
	for (i = 0; i < 20 && done < 6; i++)
		dev_aring_run(r, 1, 0);
	CHECK_EQ(done, 6);
	for (i = 0; i < 6; i++)
		bad += ios[i].res != 0 || cbs[i].cb.res != 0;
	CHECK_EQ(bad, 0);
	CHECK(holds_gen(60, 6, 40));
	CHECK(dev_ring_refusals() - refused >= 6);
	/* the poll: not completed by the refusals, nothing was readable */
	dev_aring_run(r, 0, 0);
	CHECK_EQ(polled, 0);
	dev_aring_set_faults(r, 0, 0);
	for (i = 0; i < 5; i++)
		dev_aring_run(r, 0, 0); /* armed, for real now */
	CHECK_EQ(polled, 0);
	CHECK_EQ(write(efd, &one, sizeof(one)), (ssize_t)sizeof(one));
	for (i = 0; i < 200 && !polled; i++)
		dev_aring_run_timeout(r, 0, 10000000);
	CHECK_EQ(polled, 1);
	CHECK_EQ(pcb.cb.res, 0);
	dev_aring_free(r);
	close(efd);
}

/* A test that hangs fails: an I/O that never completes is a bug here. */
static const char *current;

static void on_alarm(int sig)
{
	static const char msg[] = "TIMEOUT (an I/O never completed) in ";

	(void)!write(2, msg, sizeof(msg) - 1);
	(void)!write(2, current, strlen(current));
	(void)!write(2, "\n", 1);
	_exit(1);
}

/* Run fn if no test names are given or it is one of them. */
#define RUN_SOME(fn)                                    \
	do {                                            \
		int _k, _run = argc < 2;                \
		for (_k = 1; _k < argc; _k++)           \
			_run |= !strcmp(argv[_k], #fn); \
		if (_run) {                             \
			current = #fn;                  \
			alarm(30);                      \
			RUN(fn);                        \
			alarm(0);                       \
		}                                       \
	} while (0)

int main(int argc, char **argv)
{
	int i;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (i = 0; i < 2; i++) {
		wbuf[i] = dev_alloc_buf(BATCH * BLK + BLK);
		rbuf[i] = dev_alloc_buf(BATCH * BLK);
		if (!wbuf[i] || !rbuf[i])
			return 1;
	}
	signal(SIGALRM, on_alarm);
	dev = open_file_dev(NBLK * BLK);
	RUN_SOME(test_batch_larger_than_ring);
	RUN_SOME(test_signals_interrupt_waits);
	RUN_SOME(test_errors_stay_with_their_io);
	RUN_SOME(test_transient_submit_errors);
	RUN_SOME(test_failed_submit_leaves_nothing_behind);
	RUN_SOME(test_failed_waits);
	RUN_SOME(test_no_ring);
	RUN_SOME(test_pm_map_creates_nothing_under_dev);
	RUN_SOME(test_pm_map_follows_no_link);
	RUN_SOME(test_shadow_copies_writes);
	RUN_SOME(test_short_write_keeps_fua);
	RUN_SOME(test_aring_refusal);
	dev_close(dev);
	for (i = 0; i < 2; i++) {
		free(wbuf[i]);
		free(rbuf[i]);
	}
	return CHECK_DONE();
}
