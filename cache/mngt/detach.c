/* cache: running without a cache — detach (destage, drop, let the devices go) and attach. */
#define _GNU_SOURCE
#include "mngt.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

/*
 * Detached.  `nvcachectl detach` leaves the mount serving every request from
 * the backing store with the cache devices closed, so that they can be
 * pulled, tested or overwritten; `nvcachectl attach` takes them back.  The
 * state is in both mirrors' headers (meta_hdr.detached): a remount stays
 * detached and opens no device until attach.
 *
 * A detach, in this order:
 *   0. both headers say META_DETACHING: a kill -9 or an unmount before 3
 *      leaves the cache attached, and the next mount resumes the detach
 *      (replace.c, resume_main); a detach that fails otherwise clears it;
 *   1. c->detached = 1 (c->lock): a file object made from now on is bypass
 *      from birth (detach_file_born_locked), and an open's policy match no
 *      longer changes a file's mode (fpolicy.c);
 *   2. everything dirty is destaged (cache_flush), then every file already
 *      known becomes bypass by the policy code's own protocol
 *      (file_to_bypass: writethrough, its dirty data destaged, then under
 *      f->rw for writing its slots dropped with nothing dirty): after it no
 *      slot of it exists and none can be made (fpolicy.c's invariant);
 *   3. no slot is in use, so no device I/O can start: both headers say
 *      detached, mirror 0 first;
 *   4. each device is swapped for a fenced stand-in (cache_dev_swap) and
 *      closed: O_EXCL is let go.
 * A crash before 3 leaves a cache with fewer cached blocks; one inside 3
 * leaves one header saying detached, and either header is enough for the
 * mount to be detached: safe, because the cache was empty by then.  A
 * failure in 2 (a destage error, a file kept busy) undoes 1 and gives the
 * files their modes back; nothing is lost, dirty data stays in the cache.
 *
 * An attach opens the listed devices, puts them in member order (members.c),
 * checks each superblock as a mount does (recover.c: cache_sb_fits), clears
 * the headers, swaps the devices in, and gives every file the mode it had
 * before the detach (one born while detached: the global mode, until its
 * next open matches the policies).
 *
 * devlife_lock serialises detaches, attaches and mirror replacements
 * (mirror.c) of every cache in the process: they are rare.  Lock order:
 * devlife_lock, then f->rw, then c->lock; a device's flush lock
 * (c->dsync[d].lock) is taken alone.
 */

void detach_at_mount(struct cache *c)
{
	struct cfile *f;
	uint64_t b, used;

	pthread_mutex_lock(&c->lock);
	c->detached = 1;
	c->detach_gen++;
	used = c->nslots - c->nfree;
	for (b = 0; b <= c->fmask; b++)
		for (f = c->fhash[b]; f; f = f->hnext)
			if (!f->nslots)
				detach_file_born_locked(c, f);
	cache_unlock(c);
	if (used) /* a detach leaves none: the metadata was changed since */
		log_msg(LOG_CRIT,
			"detached, but the metadata maps %llu cache blocks: "
			"their files are served as far as the devices allow "
			"(attach to read them)",
			(unsigned long long)used);
	log_msg(LOG_NOTICE,
		"detached (nvcachectl detach): no cache device is used; every "
		"request goes to the backing store until nvcachectl attach");
}

/* Every file object, each with a reference taken; *n of them.  c->lock. */
static struct cfile **files_hold_locked(struct cache *c, size_t *n)
{
	struct cfile **v, *f;
	size_t cap = 64, k = 0;
	uint64_t b;

	assert_held(&c->lock);
	v = malloc(cap * sizeof(*v));
	if (!v)
		return NULL;
	for (b = 0; b <= c->fmask; b++)
		for (f = c->fhash[b]; f; f = f->hnext) {
			if (k == cap) {
				struct cfile **w =
					realloc(v, 2 * cap * sizeof(*v));

				if (!w) {
					while (k)
						file_put_locked(c, v[--k]);
					free(v);
					return NULL;
				}
				v = w;
				cap *= 2;
			}
			f->refs++;
			v[k++] = f;
		}
	*n = k;
	return v;
}

static struct cfile **files_hold(struct cache *c, size_t *n)
{
	struct cfile **v;

	pthread_mutex_lock(&c->lock);
	v = files_hold_locked(c, n);
	cache_unlock(c);
	return v;
}

static void files_put(struct cache *c, struct cfile **v, size_t n)
{
	while (n)
		cache_file_put(c, v[--n]);
	free(v);
}

/* Files the detach of this generation made bypass get their modes back. */
static void files_restore_locked(struct cache *c)
{
	uint64_t b;
	struct cfile *f;

	assert_held(&c->lock);
	for (b = 0; b <= c->fmask; b++)
		for (f = c->fhash[b]; f; f = f->hnext)
			if (f->detach_gen == c->detach_gen) {
				__atomic_store_n(&f->pol.mode, f->mode_saved,
						 __ATOMIC_RELEASE);
				f->detach_gen = 0;
				/* what it took writethrough on its way to
				 * bypass (file_to_bypass) is in the backing
				 * file unsynced, and a writeback fsync syncs
				 * that only when bk_wgen says so */
				file_bk_changed(f);
			}
}

/* Step 2 for one file: bypass, remembering the mode it had. */
#define DETACH_TRIES 500 /* a second */

static int file_detach(struct cache *c, struct cfile *f)
{
	int mode = __atomic_load_n(&f->pol.mode, __ATOMIC_ACQUIRE);
	int tries, ret = 0;

	pthread_mutex_lock(&c->lock);
	if (f->detach_gen != c->detach_gen) {
		f->mode_saved = mode;
		f->detach_gen = c->detach_gen;
	}
	cache_unlock(c);
	/* bypass already (by its policy, or born detached): no slot */
	if (mode == MODE_BYPASS)
		return 0;
	/* -EBUSY: a request in flight holds one of its blocks for now */
	for (tries = 0; tries < DETACH_TRIES; tries++) {
		ret = file_to_bypass(c, f);
		if (ret != -EBUSY)
			break;
		usleep(2000);
	}
	return ret;
}

static int files_detach(struct cache *c, char *err, size_t errlen)
{
	struct cfile **v;
	size_t n, i;
	int ret = 0;

	v = files_hold(c, &n);
	if (!v)
		return -ENOMEM;
	for (i = 0; i < n && !ret; i++) {
		ret = file_detach(c, v[i]);
		if (ret)
			snprintf(err, errlen,
				 "a file (inode %llu) could not leave the "
				 "cache: %s",
				 (unsigned long long)v[i]->ino, strerror(-ret));
	}
	files_put(c, v, n);
	return ret;
}

static void detach_undo(struct cache *c)
{
	pthread_mutex_lock(&c->lock);
	c->detached = 0;
	files_restore_locked(c);
	cache_unlock(c);
}

/*
 * Device d becomes dev, its state state; the old one is returned.  Under the
 * device's flush lock, which cache_dev_sync holds while it flushes
 * c->devs[d] and the statistics while they read its name: so nobody uses the
 * old one once this returns.
 */
struct dev *cache_dev_swap(struct cache *c, int d, struct dev *dev, int state)
{
	struct dev *old;

	pthread_mutex_lock(&c->dsync[d].lock);
	old = c->devs[d];
	__atomic_store_n(&c->devs[d], dev, __ATOMIC_RELEASE);
	__atomic_store_n(&c->dev_failed[d], state, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&c->dsync[d].lock);
	return old;
}

/* Step 4: each device swapped for a fenced stand-in, then closed. */
static int devices_release(struct cache *c)
{
	struct dev *standin;
	int d, ret;

	/* step 3's promise: no slot, so no device I/O can start */
	pthread_mutex_lock(&c->lock);
	assert(c->nfree == c->nslots);
	cache_unlock(c);
	for (d = 0; d < c->ndevs; d++) {
		ret = dev_missing_create(dev_path(c->devs[d]), UINT64_MAX,
					 &standin);
		if (ret)
			return ret;
		dev_close(cache_dev_swap(c, d, standin, STAT_DEV_DETACHED));
	}
	stats_attach_devs(c);
	return 0;
}

int cache_detach(struct cache *c, cache_progress_fn fn, void *arg, char *err,
		 size_t errlen)
{
	uint64_t used;
	int ret;

	err[0] = 0;
	devlife_enter(c);
	pthread_mutex_lock(&c->lock);
	if (c->detached) {
		cache_unlock(c);
		snprintf(err, errlen, "already detached");
		ret = -EALREADY;
		goto out_unlock;
	}
	c->detached = 1;
	c->detach_gen++;
	cache_unlock(c);
	log_msg(LOG_NOTICE, "detach: destaging everything, then closing the "
			    "cache devices");
	ret = meta_set_detached(&c->meta, META_DETACHING); /* step 0 */
	if (ret) {
		snprintf(err, errlen, "cannot write the metadata: %s",
			 strerror(-ret));
		goto err_undo;
	}

	ret = cache_flush(c, fn, arg);
	if (ret) {
		snprintf(err, errlen, "destage failed: %s", strerror(-ret));
		goto err_undo;
	}
	ret = files_detach(c, err, errlen);
	if (ret)
		goto err_undo;
	pthread_mutex_lock(&c->lock);
	used = c->nslots - c->nfree;
	cache_unlock(c);
	if (used) {
		snprintf(err, errlen,
			 "%llu cache blocks are still in use; try again",
			 (unsigned long long)used);
		ret = -EBUSY;
		goto err_undo;
	}
	ret = meta_set_detached(&c->meta, 1);
	if (ret) {
		snprintf(err, errlen, "cannot write the metadata: %s",
			 strerror(-ret));
		goto err_undo;
	}
	ret = devices_release(c);
	if (ret) /* still detached: the devices left are fenced later */
		snprintf(err, errlen, "cannot close the cache devices: %s",
			 strerror(-ret));
	else
		log_msg(LOG_NOTICE,
			"detached: no cache; every request goes to the "
			"backing store, and the cache devices are closed "
			"until nvcachectl attach");
	goto out_unlock;
err_undo:
	/* stopped by an unmount: the next mount goes on; else it is over */
	if (!__atomic_load_n(&c->stopping, __ATOMIC_ACQUIRE))
		meta_set_detached(&c->meta, 0);
	detach_undo(c);
	log_msg(LOG_ERR, "detach failed: %s; still attached", err);
out_unlock:
	pthread_mutex_unlock(&devlife_lock);
	return ret;
}

/* Close what an attach took for the members, except the caller's own
 * candidates (cache_attach_with: they stay the caller's on failure). */
static void devices_drop(struct cache *c, struct dev **devs,
			 struct dev **cand, int ncand)
{
	int d, i, theirs;

	for (d = 0; d < c->ndevs; d++) {
		for (i = 0, theirs = 0; i < ncand && !theirs; i++)
			theirs = devs[d] == cand[i];
		if (!theirs)
			dev_close(devs[d]);
		devs[d] = NULL;
	}
}

/* The members among ncand already open candidates (members_pick against
 * the current header), a removed member's place a fenced stand-in; 0, or
 * -errno with err set and nothing made left open. */
static int devices_pick(struct cache *c, struct dev **cand, int ncand,
			struct dev **devs, char *err, size_t errlen)
{
	const struct meta_hdr *h = meta_hdr_of(&c->meta);
	int kof[NVC_MAX_DEVS * 4], d, ret;
	char u[37];

	if (!h || ncand > (int)(sizeof(kof) / sizeof(kof[0]))) {
		snprintf(err, errlen, "%s",
			 h ? "too many devices" : "no usable metadata mirror");
		return -EINVAL;
	}
	ret = members_pick(h, cand, ncand, devs, kof, err, errlen);
	for (d = 0; d < c->ndevs && !ret; d++) {
		if (devs[d])
			continue;
		if (h->removed[d]) {
			ret = dev_missing_create(h->names[d][0] ? h->names[d]
								: CFG_SPARE,
						 UINT64_MAX, &devs[d]);
			continue;
		}
		snprintf(err, errlen,
			 "member %d of %d of this cache (UUID %s) is not among "
			 "the devices given",
			 d + 1, c->ndevs, members_uuid_str(h->members[d], u));
		ret = -ENODEV;
	}
	if (ret)
		devices_drop(c, devs, cand, ncand);
	return ret;
}

/* Each member found checked against the metadata as a mount does (the
 * removed ones are not read); nothing dropped. */
static int devices_fit(struct cache *c, struct dev **devs,
		       const uint8_t removed[NVC_MAX_DEVS], char *err,
		       size_t errlen)
{
	int d, ret = 0;

	for (d = 0; d < c->ndevs && !ret; d++)
		if (!removed[d])
			ret = cache_sb_fits(c, devs[d], d, err, errlen);
	return ret;
}

/* The members opened by identity (members.c: cache.devices' names, where
 * the headers say each was last found, and the names they had in this
 * mount); 0, or -errno with err set and nothing left open. */
static int devices_take(struct cache *c, struct dev **devs, char *err,
			size_t errlen)
{
	const char *now[NVC_MAX_DEVS];
	int d, missing = 0;

	for (d = 0; d < c->ndevs; d++)
		now[d] = dev_path(c->devs[d]);
	/* the header stays put: mirrors are replaced under devlife_lock */
	return members_open(c->cfg, meta_hdr_of(&c->meta), now, c->ndevs, 0,
			    devs, &missing, err, errlen);
}

/* An attach: the members opened by name (cand NULL) or picked among the
 * caller's open candidates, checked, then swapped in. */
static int attach(struct cache *c, struct dev **cand, int ncand, char *err,
		  size_t errlen)
{
	struct dev *devs[NVC_MAX_DEVS], *old[NVC_MAX_DEVS];
	uint8_t removed[NVC_MAX_DEVS];
	int d, ret;

	err[0] = 0;
	devlife_enter(c);
	if (!__atomic_load_n(&c->detached, __ATOMIC_ACQUIRE)) {
		snprintf(err, errlen, "not detached");
		ret = -EALREADY;
		goto out_unlock;
	}
	meta_removed(&c->meta, removed);
	ret = cand ? devices_pick(c, cand, ncand, devs, err, errlen)
		   : devices_take(c, devs, err, errlen);
	if (ret)
		goto out_unlock;
	ret = devices_fit(c, devs, removed, err, errlen);
	if (ret)
		goto out_drop;
	ret = meta_set_detached(&c->meta, 0);
	if (ret) {
		snprintf(err, errlen, "cannot write the metadata: %s",
			 strerror(-ret));
		meta_set_detached(&c->meta, 1);
		goto out_drop;
	}
	for (d = 0; d < c->ndevs; d++) {
		if (removed[d]) /* fenced again: never used */
			dev_faults(devs[d])->fail_reads =
				dev_faults(devs[d])->fail_writes = -ENODEV;
		old[d] = cache_dev_swap(c, d, devs[d],
					removed[d] ? STAT_DEV_REMOVED
						   : STAT_DEV_OK);
	}
	pthread_mutex_lock(&c->lock);
	c->detached = 0;
	files_restore_locked(c);
	cache_unlock(c);
	for (d = 0; d < c->ndevs; d++)
		dev_close(old[d]);
	stats_attach_devs(c);
	cache_note_member_names(c); /* where the next mount looks first */
	log_msg(LOG_NOTICE, "attached: caching again on %d device%s", c->ndevs,
		c->ndevs > 1 ? "s" : "");
	goto out_unlock;
out_drop:
	devices_drop(c, devs, cand, ncand);
out_unlock:
	pthread_mutex_unlock(&devlife_lock);
	return ret;
}

int cache_attach(struct cache *c, char *err, size_t errlen)
{
	return attach(c, NULL, 0, err, errlen);
}

int cache_attach_with(struct cache *c, struct dev **devs, int n, char *err,
		      size_t errlen)
{
	return attach(c, devs, n, err, errlen);
}
