/* fs: the daemon's reports to systemd (sd_notify): READY, STATUS, STOPPING. */
#define _GNU_SOURCE
#include "notify.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <linux/magic.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <syslog.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "../cache/cache.h"

/*
 * What systemd is told, and when (a unit with Type=notify; nvcachefs@.service).
 *
 * READY=1 means the mount answers.  fuse_session_mount returning is not
 * enough: the kernel then has the mount, but no request on it is answered
 * before the request loop runs and has replied to the kernel's INIT.  So a
 * thread, started just before the loop, stats the mount point and statfs()s
 * it: both calls go through the kernel to this daemon (GETATTR and STATFS on
 * the root, queued behind INIT) and return only once the loop answers them.
 * When statfs shows a FUSE file system and the mount point's device differs
 * from its parent directory's (so it is the mount, not the directory under
 * it, nor a FUSE mount it was made on), the mount answers: READY=1.  A unit
 * that runs after this one (or systemctl start) can then use the mount.
 *
 * STATUS=... every NOTIFY_PERIOD_MS from the same thread while mounted: the
 * dirty bytes, the destage rate and the time to drain, from cache_snapshot
 * (the statistics interface, as nvcachectl stats sees them).
 *
 * STOPPING=1 as soon as the loop ends (SIGTERM, SIGINT or an unmount), before
 * the daemon unmounts and destages, with a STATUS saying what happens to the
 * dirty data; then STATUS with the flush's progress (cache_flush's callback,
 * at most once a second) and EXTEND_TIMEOUT_USEC while the dirty bytes
 * shrink, so a stop that makes progress is not killed at TimeoutStopSec (a
 * kill would be safe: the dirty data stays in the cache, destaged after the
 * next mount), and a stuck one is.
 *
 * Order: every message is sent under lock, and stopping is set under it, so
 * no running STATUS follows STOPPING=1; READY=1 is sent before the first
 * STATUS by the one thread that sends both.
 *
 * Without NOTIFY_SOCKET nothing of this runs: no thread, no messages.
 */

#define NOTIFY_PERIOD_MS 2000
#define NOTIFY_FLUSH_MS 1000
#define NOTIFY_EXTEND_US 30000000ull /* after the last sign of progress */

static struct {
	struct cache *cache;
	const char *mnt;
	pthread_t thread;
	int running; /* the thread was started */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int stopping;
	struct stat_snap *snap;
	/* the flush at stop */
	uint64_t t0_ms, last_ms, destaged0, least;
} N = { .lock = PTHREAD_MUTEX_INITIALIZER };

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000ull + ts.tv_nsec / 1000000;
}

/* 1 once the mount point shows this daemon's mount, answered (see above). */
static int mount_answers(const char *mnt)
{
	char up[PATH_MAX + 4];
	struct statfs sfs;
	struct stat st, pst;

	snprintf(up, sizeof(up), "%s/..", mnt);
	if (statfs(mnt, &sfs) || sfs.f_type != FUSE_SUPER_MAGIC)
		return 0;
	if (stat(mnt, &st) || stat(up, &pst))
		return 0;
	return st.st_dev != pst.st_dev;
}

/* Sleep ms or until stopping; returns stopping.  Called with N.lock held. */
static int wait_locked(unsigned ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (ms % 1000) * 1000000l;
	if (ts.tv_nsec >= 1000000000l) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000l;
	}
	while (!N.stopping &&
	       pthread_cond_timedwait(&N.cond, &N.lock, &ts) != ETIMEDOUT)
		;
	return N.stopping;
}

/* STATUS with the dirty bytes and the destage rate.  N.lock held. */
static void send_status_locked(void)
{
	char dirty[32], cap[32], rate[32], drain[32] = "";
	uint64_t d, c, r;

	if (cache_snapshot(N.cache, N.snap))
		return;
	d = STAT_GAUGE(N.snap, dirty_bytes);
	c = STAT_GAUGE(N.snap, capacity_bytes);
	r = STAT_GAUGE(N.snap, destage_rate);
	stat_fmt_bytes(d, dirty, sizeof(dirty));
	stat_fmt_bytes(c, cap, sizeof(cap));
	stat_fmt_bytes(r, rate, sizeof(rate));
	if (d && r)
		snprintf(drain, sizeof(drain), ", drain %.0f s", (double)d / r);
	sd_notifyf(0, "STATUS=dirty %s of %s (%.1f%%), destage %s/s%s", dirty,
		   cap, c ? 100.0 * d / c : 0.0, rate, drain);
}

static void *notify_main(void *arg)
{
	int ready = 0;

	pthread_mutex_lock(&N.lock);
	while (!N.stopping) {
		if (!ready) {
			/* stat may wait for the loop: not under the lock */
			pthread_mutex_unlock(&N.lock);
			ready = mount_answers(N.mnt);
			pthread_mutex_lock(&N.lock);
			if (!ready) {
				wait_locked(20);
				continue;
			}
			if (N.stopping)
				break;
			sd_notify(0, "READY=1");
			log_msg(LOG_INFO, "told systemd: ready");
		}
		send_status_locked();
		wait_locked(NOTIFY_PERIOD_MS);
	}
	pthread_mutex_unlock(&N.lock);
	return NULL;
}

void notify_start(struct cache *c, const char *mnt)
{
	pthread_condattr_t ca;

	if (!getenv("NOTIFY_SOCKET"))
		return;
	N.cache = c;
	N.mnt = mnt;
	N.snap = malloc(sizeof(*N.snap));
	if (!N.snap) {
		log_msg(LOG_WARNING, "systemd notification: out of memory");
		return;
	}
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* wait_locked */
	pthread_cond_init(&N.cond, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&N.thread, NULL, notify_main, NULL)) {
		log_msg(LOG_WARNING, "systemd notification: no thread");
		pthread_cond_destroy(&N.cond);
		free(N.snap);
		N.snap = NULL;
		return;
	}
	N.running = 1;
}

void notify_stopping(int flush)
{
	char dirty[32];

	if (!N.running)
		return;
	pthread_mutex_lock(&N.lock);
	N.stopping = 1;
	pthread_cond_broadcast(&N.cond);
	if (cache_snapshot(N.cache, N.snap))
		memset(N.snap, 0, sizeof(*N.snap));
	stat_fmt_bytes(STAT_GAUGE(N.snap, dirty_bytes), dirty, sizeof(dirty));
	sd_notifyf(0, "STOPPING=1\nSTATUS=stopping: unmounting, %s dirty %s",
		   dirty,
		   flush ? "to destage"
			 : "kept in the cache (on_unmount keep)");
	N.t0_ms = now_ms();
	N.destaged0 = STAT_CTR(N.snap, destaged_bytes);
	N.least = UINT64_MAX;
	pthread_mutex_unlock(&N.lock);
}

void notify_flush_progress(void *arg, uint64_t dirty, uint64_t destaged)
{
	char left[32], done[32], rate[32];
	uint64_t now = now_ms(), secs;

	if (!N.running)
		return;
	pthread_mutex_lock(&N.lock);
	assert(N.stopping); /* the flush at stop only */
	if (dirty && N.last_ms && now - N.last_ms < NOTIFY_FLUSH_MS)
		goto out_unlock;
	N.last_ms = now;
	secs = now - N.t0_ms;
	/* destaged counts since the last reset: the progress is its growth */
	destaged = destaged > N.destaged0 ? destaged - N.destaged0 : 0;
	stat_fmt_bytes(dirty, left, sizeof(left));
	stat_fmt_bytes(destaged, done, sizeof(done));
	stat_fmt_bytes(secs ? destaged * 1000.0 / secs : 0, rate, sizeof(rate));
	if (dirty < N.least) {
		N.least = dirty;
		sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu",
			   (unsigned long long)NOTIFY_EXTEND_US);
	}
	sd_notifyf(0,
		   "STATUS=stopping: flushing, %s dirty left, %s destaged "
		   "(%s/s)",
		   left, done, rate);
out_unlock:
	pthread_mutex_unlock(&N.lock);
}

void notify_end(void)
{
	if (!N.running)
		return;
	pthread_mutex_lock(&N.lock);
	N.stopping = 1;
	pthread_cond_broadcast(&N.cond);
	pthread_mutex_unlock(&N.lock);
	pthread_join(N.thread, NULL);
	N.running = 0;
	pthread_cond_destroy(&N.cond);
	free(N.snap);
	N.snap = NULL;
}
