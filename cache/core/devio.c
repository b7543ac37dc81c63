/* cache: the cache devices as the engine sees them: flushes owed, and
 * which errors mark a device failed. */
#define _GNU_SOURCE
#include "core.h"

#include <assert.h>
#include <string.h>
#include <syslog.h>

void cache_dev_written(struct cache *c, int d)
{
	__atomic_add_fetch(&c->dsync[d].written, 1, __ATOMIC_RELEASE);
}

int cache_dev_sync(struct cache *c, int d)
{
	struct dev_sync *ds = &c->dsync[d];
	uint64_t want = __atomic_load_n(&ds->written, __ATOMIC_ACQUIRE), start;
	int ret = 0;

	if (__atomic_load_n(&ds->flushed, __ATOMIC_ACQUIRE) >= want)
		return 0;
	pthread_mutex_lock(&ds->lock);
	if (ds->flushed < want) {
		/* the sample is taken before the flush starts */
		start = __atomic_load_n(&ds->written, __ATOMIC_ACQUIRE);
		ret = dev_flush(c->devs[d]);
		if (!ret) {
			assert(start >= ds->flushed);
			__atomic_store_n(&ds->flushed, start, __ATOMIC_RELEASE);
		}
	}
	pthread_mutex_unlock(&ds->lock);
	return ret;
}

static const char *dev_op_name(enum dev_op op)
{
	return op == DEV_READ ? "read" : op == DEV_WRITE ? "write" : "flush";
}

/*
 * Which errors mark a cache device failed.  A device marked failed stays so
 * for the rest of the mount: no new data goes to it, its clean data is read
 * from the backing store, its dirty data cannot be served, and an fsync of
 * a file with dirty data there fails with EIO (write.c, cache_fsync).  So only
 * the device's own answer may mark it: an error that a request which
 * reached the device brought back (an I/O error, a device gone: -EIO,
 * -ENODEV, -ENOSPC, ...), or the fence of a device already taken for lost
 * (dev_faults: a degraded mount, a removal).
 *
 * Never the ring's.  A ring (the calling thread's for dev_io_run, a worker's
 * dev_aring) is the kernel's queue to the device, shared by every device:
 * that it had no room, refused a submission or ran short of memory says
 * nothing about the device, and marking the device for it took a healthy
 * device out of the mount for good (issue 25, finding 16).  devices/ keeps
 * those out of a request's result (dev.h, "The device's error, never the
 * ring's"): it does the request again synchronously and gives the device's
 * answer.  What the kernel still refuses after that, for a second on end
 * (dev_refusal: -EAGAIN, -EBUSY, -ENOMEM, -EINTR, -ECANCELED), fails the
 * request here like any error (its callers fall back as for a failed
 * device: reads from the backing store or the second copy, writes around
 * the cache) but is only logged, not charged to the device.
 */
void note_dev_error(struct cache *c, struct dev_io *ios, unsigned n)
{
	unsigned i;
	int d;

	for (i = 0; i < n; i++) {
		int ours = 0;

		if (!ios[i].res)
			continue;
		for (d = 0; d < c->ndevs && !dev_refusal(ios[i].res); d++) {
			if (c->devs[d] != ios[i].dev)
				continue;
			/* a cache device's failure is logged once, when it is
			 * marked failed (a device fenced at mount was logged
			 * then); its I/O errors are counted in its statistics,
			 * not logged one by one */
			ours = 1;
			if (__atomic_compare_exchange_n(
				    &c->dev_failed[d], &(int){ 0 },
				    STAT_DEV_FAILED, 0, __ATOMIC_ACQ_REL,
				    __ATOMIC_ACQUIRE))
				log_msg(LOG_CRIT,
					"cache device %s failed (%s at offset "
					"%llu: %s): no new data goes to it; "
					"its "
					"clean data is read from the backing "
					"store, its dirty data cannot be "
					"served",
					dev_path(ios[i].dev),
					dev_op_name(ios[i].op),
					(unsigned long long)ios[i].off,
					strerror(-ios[i].res));
		}
		if (!ours)
			log_msg(LOG_ERR, "%s: %s at offset %llu: %s",
				dev_path(ios[i].dev), dev_op_name(ios[i].op),
				(unsigned long long)ios[i].off,
				strerror(-ios[i].res));
	}
}
