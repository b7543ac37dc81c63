/* cache: a cache device replaced by a new one, or removed, while mounted. */
#define _GNU_SOURCE
#include "mngt.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

/*
 * Replace.  The new device takes member k's place with k's blocks on it:
 *
 *   0. the new device, judged new by what it is (devid.c), gets member
 *      k's superblock under a UUID no member has, then both headers record
 *      its identity (that UUID, its st_rdev or file, its size: replace_id)
 *      and then the replace under way (member, new device's path); the
 *      next mount resumes it on a thread of its own (devlife_resume_start),
 *      onto the recorded path only once it proves to hold that identity
 *      (devid_prove_dev; else nothing is written there and the replace
 *      stays recorded, logged), so that a kill -9 or an unmount during the
 *      rebuild does not leave it half done; a replace that fails otherwise
 *      clears it;
 *   1. k's blocks are copied onto the new device at their offsets, which
 *      shadows k meanwhile (rebuild.c: from the old device, or from the
 *      second copies if it has failed);
 *   2. the new device gets member k's superblock again, under the UUID of
 *      step 0, then both headers record that UUID for member k (and the
 *      name it was found at): the old device is a former member from then
 *      on;
 *   3. the new device is swapped in (cache_dev_swap: under the flush lock),
 *      every I/O begun on the old one waited for, the old one closed;
 *   4. if the old device had failed, data written with one copy while it
 *      was failed gets its second copy (rebuild_twins), or, where there is
 *      no room for one, is destaged.
 * A crash before 2 leaves the old device member k and the new one scratch
 * under the recorded identity (the resumed replace copies again); after 2,
 * the new device is member k.
 */

/*
 * Drain (remove empties member k before it stops using it):
 *   1. c->dev_draining[k]: no new slot goes to k (free_take_locked), a twin
 *      is never placed there (k does not count as working: while it drains,
 *      new dirty data may have one copy), and a write to a clean block on k
 *      moves it off (write_cached drops the slot, then allocates elsewhere);
 *      the asynchronous path leaves such writes to write_cached (aio.c);
 *   2. rounds of: a flush (every dirty page, of k or with a twin on k,
 *      durable in the backing store; a dirty page whose only copy was on a
 *      failed k cannot be, and the remove is refused), then every clean,
 *      unpinned slot of k dropped; until k holds nothing, or too many
 *      rounds (a workload that keeps one block dirty on k: -EBUSY).
 * Then (swap_in) k's device is swapped for its stand-in, k no longer
 * draining, and a last flush destages what was written with one copy
 * while k drained.
 */

#define DRAIN_ROUNDS 50

/* Drop k's clean, unpinned slots; how many are still in use. */
static uint64_t drop_clean_on(struct cache *c, int k)
{
	uint64_t j, left = 0;

	pthread_mutex_lock(&c->lock);
	for (j = 0; j < member_slots(c, k); j++) {
		struct cslot *v = &c->slots[layout_slot(&c->meta.layout, k, j)];
		struct cfile *o;

		if (!v->file)
			continue;
		if (v->is_twin || v->pins || v->state != SLOT_CLEAN) {
			left++;
			continue;
		}
		o = c->recs[v->file - 1];
		slot_drop_locked(c, v);
		if (!o->refs && !o->nslots) {
			o->refs++;
			file_put_locked(c, o);
		}
	}
	cache_unlock(c);
	return left;
}

/* Drain steps 1 and 2: k holds nothing.  0, or -errno with err set (k is then
 * no longer draining). */
static int drain(struct cache *c, int k, cache_progress_fn fn, void *arg,
		 char *err, size_t errlen)
{
	uint64_t left = 0;
	int round, ret = 0;

	__atomic_store_n(&c->dev_draining[k], 1, __ATOMIC_RELEASE);
	for (round = 0; round < DRAIN_ROUNDS; round++) {
		if (devlife_stopping(c)) {
			snprintf(err, errlen,
				 "stopped by the unmount; it resumes at the "
				 "next mount");
			ret = -ESHUTDOWN;
			break;
		}
		ret = cache_flush_until(c, fn, arg, &c->devlife_stop);
		if (ret == -ESHUTDOWN) {
			snprintf(err, errlen,
				 "stopped by the unmount; it resumes at the "
				 "next mount");
			break;
		}
		if (ret) {
			snprintf(err, errlen,
				 "its dirty data could not be destaged (%s)%s",
				 strerror(-ret),
				 ret == -EIO ? ": some of it had no second "
					       "copy on a working device"
					     : "");
			break;
		}
		left = drop_clean_on(c, k);
		if (!left)
			break;
		usleep(20000);
	}
	if (!ret && left) {
		snprintf(err, errlen,
			 "%llu blocks on it stay in use (writes keep them "
			 "dirty); try again",
			 (unsigned long long)left);
		ret = -EBUSY;
	}
	if (ret)
		__atomic_store_n(&c->dev_draining[k], 0, __ATOMIC_RELEASE);
	return ret;
}

/* After a drain: dev in member k's place, in state, k no longer draining,
 * the old device closed; then a flush destages what was written with one
 * copy while k drained (or was failed).  The flush's result. */
static int swap_in(struct cache *c, int k, struct dev *dev, int state,
		   cache_progress_fn fn, void *arg)
{
	struct dev *old = cache_dev_swap(c, k, dev, state);

	stats_attach_devs(c);
	__atomic_store_n(&c->dev_draining[k], 0, __ATOMIC_RELEASE);
	dev_close(old);
	return cache_flush(c, fn, arg);
}

/* 1 if members[k] is zero or another member's. */
static int uuid_used(uint8_t (*members)[16], int n, int k)
{
	static const uint8_t zero[16];
	int j;

	if (!memcmp(members[k], zero, 16))
		return 1;
	for (j = 0; j < n; j++)
		if (j != k && !memcmp(members[j], members[k], 16))
			return 1;
	return 0;
}

/*
 * The superblock of member k (count slots) on nd, under uuid (NULL: a new
 * UUID) that members[k] takes (members: the header's table), flushed.  The
 * geometry is copied from a member's superblock: the old one's, or for a
 * failed device, a free place or a grow, another's.  0, or -errno with err
 * set.
 */
int member_sb_write(struct cache *c, int k, uint64_t count, struct dev *nd,
		    uint8_t members[NVC_MAX_DEVS][16], const uint8_t *uuid,
		    char *err, size_t errlen)
{
	struct sb_disk sb;
	int ret = -ENODATA, d;

	if (k < c->ndevs)
		ret = sb_read(c->devs[k], &sb);
	for (d = 0; ret && d < c->ndevs; d++)
		ret = sb_read(c->devs[d], &sb);
	if (ret) {
		snprintf(err, errlen,
			 "no superblock to copy the geometry from");
		return -EIO;
	}
	do {
		if (uuid)
			memcpy(members[k], uuid, 16);
		else if (getrandom(members[k], 16, 0) != 16)
			return -errno;
		if (uuid && uuid_used(members,
				      k + 1 > c->ndevs ? k + 1 : c->ndevs, k)) {
			snprintf(err, errlen, "its UUID is another member's");
			return -EEXIST;
		}
	} while (uuid_used(members, k + 1 > c->ndevs ? k + 1 : c->ndevs, k));
	sb.dev_index = k;
	sb.ndevs = layout_sb_ndevs(&c->meta.layout, k);
	sb.slots_per_dev = count;
	sb.dev_size = dev_size(nd);
	sb.format_time = time(NULL);
	memcpy(sb.dev_uuid, members[k], 16);
	ret = sb_write(nd, &sb);
	if (!ret)
		ret = dev_flush(nd);
	if (ret)
		snprintf(err, errlen, "%s: cannot write its superblock: %s",
			 dev_path(nd), strerror(-ret));
	return ret;
}

/* Replace step 2 (and add's first): the new device's superblock under
 * uuid (NULL: a new one), then the headers' member table. */
static int new_member(struct cache *c, int k, struct dev *nd,
		      const uint8_t *uuid, char *err, size_t errlen)
{
	uint8_t members[NVC_MAX_DEVS][16];
	int ret;

	meta_members(&c->meta, members);
	ret = member_sb_write(c, k, member_slots(c, k), nd, members, uuid, err,
			      errlen);
	if (ret)
		return ret;
	ret = meta_set_members(&c->meta, members);
	if (ret)
		snprintf(err, errlen, "cannot record the new member: %s",
			 strerror(-ret));
	return ret;
}

/* Steps 3 and 4 of a replace: nd in member k's place, the old device
 * closed once nothing uses it.  0, or a flush's error. */
static int replace_swap(struct cache *c, int k, struct dev *nd,
			cache_progress_fn fn, void *arg)
{
	int failed = __atomic_load_n(&c->dev_failed[k], __ATOMIC_ACQUIRE);
	struct dev *old = cache_dev_swap(c, k, nd, STAT_DEV_OK);

	stats_attach_devs(c);
	rebuild_settle(c);
	rebuild_end(c, old);
	dev_close(old);
	if (failed && rebuild_twins(c))
		return cache_flush(c, fn, arg); /* no room for every twin */
	return 0;
}

/* Member k by the name it has now, if it can be replaced; else c->ndevs,
 * with err set. */
int devlife_identified(struct cache *c, const char *what, char *err,
		       size_t errlen)
{
	const struct meta_hdr *h = meta_hdr_of(&c->meta);

	if (h && members_recorded(h))
		return 1;
	snprintf(err, errlen,
		 "this cache was formatted before its devices had UUIDs: %s "
		 "it offline (unmount, format, mount)",
		 what);
	return 0;
}

static int replaceable(struct cache *c, const char *old, char *err,
		       size_t errlen)
{
	int k = devid_member(c, old);

	if (k == c->ndevs || c->dev_failed[k] == STAT_DEV_REMOVED)
		snprintf(err, errlen, "%s is not a device of this cache%s", old,
			 k < c->ndevs ? " any more (removed)" : "");
	else if (c->detached)
		snprintf(err, errlen, "the cache is detached: attach first");
	else if (devlife_identified(c, "replace", err, errlen))
		return k;
	return c->ndevs;
}

/* Step 0's first half: nd gets member k's superblock under a UUID that no
 * member has, and both headers record nd's identity under it (id). */
static int replace_claim(struct cache *c, int k, struct dev *nd,
			 struct meta_ident *id, char *err, size_t errlen)
{
	uint8_t members[NVC_MAX_DEVS][16];
	int ret;

	meta_members(&c->meta, members);
	ret = member_sb_write(c, k, member_slots(c, k), nd, members, NULL, err,
			      errlen);
	if (ret)
		return ret;
	devid_of(nd, members[k], id);
	ret = meta_set_replace_id(&c->meta, id);
	if (ret)
		snprintf(err, errlen, "cannot record the new device: %s",
			 strerror(-ret));
	return ret;
}

/* Steps 0 to 4 onto nd (named new_path), member k being old; devlife_lock
 * held; id: nd's identity as recorded by the replace cut short that this
 * one resumes, else NULL.  0, or -errno with err set; *placed: nd is
 * member k (else it is the caller's to close). */
static int replace_run(struct cache *c, int k, const char *old, struct dev *nd,
		       const char *new_path, const struct meta_ident *resumed,
		       cache_progress_fn fn, void *arg, int *placed, char *err,
		       size_t errlen)
{
	static const uint8_t none[16];
	struct meta_ident id;
	int ret = 0;

	if (resumed && memcmp(resumed->uuid, none, 16))
		id = *resumed;
	else /* step 0: nd known by what it is before anything is copied */
		ret = replace_claim(c, k, nd, &id, err, errlen);
	if (ret)
		goto err_log;
	ret = meta_set_replacing(&c->meta, k + 1, new_path);
	if (ret) {
		snprintf(err, errlen, "cannot record the replace: %s",
			 strerror(-ret));
		goto err_log;
	}
	log_msg(LOG_NOTICE, "replace: rebuilding member %d (%s) onto %s",
		k + 1, old, new_path);
	ret = rebuild_onto(c, k, nd, fn, arg, err, errlen);
	if (ret)
		goto err_record;
	ret = new_member(c, k, nd, id.uuid, err, errlen);
	if (ret) {
		rebuild_end(c, c->devs[k]);
		goto err_record;
	}
	meta_set_replacing(&c->meta, 0, NULL);
	meta_set_replace_id(&c->meta, NULL);
	*placed = 1;
	ret = replace_swap(c, k, nd, fn, arg);
	cache_note_member_names(c); /* where the next mount looks first */
	if (ret)
		snprintf(err, errlen,
			 "%s is in place, but data written with one copy "
			 "while it was replaced could not be destaged (%s): "
			 "destage retries",
			 new_path, strerror(-ret));
	log_msg(LOG_NOTICE,
		"replace: member %d is now %s (found by its UUID at the next "
		"mount; cache.devices need not change); %s is a former member",
		k + 1, new_path, old);
	return ret;
err_record:
	/* stopped by an unmount: the next mount goes on; else it is over */
	if (!devlife_stopping(c)) {
		meta_set_replacing(&c->meta, 0, NULL);
		meta_set_replace_id(&c->meta, NULL);
	}
err_log:
	log_msg(LOG_ERR, "replace of %s failed: %s", old, err);
	return ret;
}

/* resumed: new_path is the one the headers recorded, written by the
 * replace cut short, with the identity *resumed: it is proven to be that
 * device before anything is written to it. */
static int replace_dev(struct cache *c, const char *old_arg,
		       const char *new_path, const struct meta_ident *resumed,
		       cache_progress_fn fn, void *arg, char *err,
		       size_t errlen)
{
	struct dev *nd = NULL;
	char old[PATH_MAX]; /* old_arg may be the old device's own name */
	int k, ret, placed = 0;

	err[0] = 0;
	snprintf(old, sizeof(old), "%s", old_arg);
	devlife_enter(c);
	k = replaceable(c, old, err, errlen);
	ret = -EINVAL;
	if (k == c->ndevs)
		goto out_unlock;
	if (resumed) {
		ret = devid_prove_dev(c, new_path, resumed, member_slots(c, k),
				      &nd, err, errlen);
		if (ret)
			log_msg(LOG_ERR,
				"replace: the replace of member %d (%s) is not "
				"resumed, and nothing was written to %s: %s.  "
				"It stays recorded, and member %d is still %s; "
				"to finish it, run nvcachectl replace "
				"MOUNTPOINT %s NEWDEVICE (the device it began "
				"on, once %s names it again, or another new "
				"one)",
				k + 1, old, new_path, err, k + 1, old, old,
				new_path);
		if (ret) {
			ret = -ESTALE; /* said */
			goto out_unlock;
		}
	} else
		ret = devid_new_dev(c, new_path, member_slots(c, k), &nd, err,
				    errlen);
	if (ret)
		goto out_unlock;
	ret = replace_run(c, k, old, nd, new_path, resumed, fn, arg, &placed,
			  err, errlen);
	if (!placed)
		dev_close(nd);
out_unlock:
	pthread_mutex_unlock(&devlife_lock);
	return ret;
}

int cache_replace_dev_with(struct cache *c, const char *old, struct dev *nd,
			   char *err, size_t errlen)
{
	int k, ret = -EINVAL, placed = 0;

	err[0] = 0;
	devlife_enter(c);
	k = replaceable(c, old, err, errlen);
	if (k < c->ndevs)
		ret = replace_run(c, k, old, nd, dev_path(nd), NULL, NULL, NULL,
				  &placed, err, errlen);
	pthread_mutex_unlock(&devlife_lock);
	return ret;
}

int cache_replace_dev(struct cache *c, const char *old, const char *new_path,
		      cache_progress_fn fn, void *arg, char *err,
		      size_t errlen)
{
	return replace_dev(c, old, new_path, NULL, fn, arg, err, errlen);
}

/* The replace the headers say was under way, run again onto the device it
 * began on, proven by its identity; if it is not there, nothing is written
 * and the replace stays recorded. */
static void resume_replace(struct cache *c, uint32_t m, const char *path)
{
	uint8_t members[NVC_MAX_DEVS][16];
	static const uint8_t zero[16];
	char err[768], old[PATH_MAX];
	struct meta_ident id;
	int ret;

	if (m > (uint32_t)c->ndevs)
		return;
	meta_replace_id(&c->meta, &id);
	meta_members(&c->meta, members);
	if (memcmp(id.uuid, zero, 16)
		    ? !memcmp(members[m - 1], id.uuid, 16)
		    : !strcmp(dev_path(c->devs[m - 1]), path)) {
		/* it took member m's place before the record was cleared */
		meta_set_replacing(&c->meta, 0, NULL);
		meta_set_replace_id(&c->meta, NULL);
		cache_flush(c, NULL, NULL);
		return;
	}
	snprintf(old, sizeof(old), "%s", dev_path(c->devs[m - 1]));
	log_msg(LOG_NOTICE,
		"replace: resuming the replace of member %u (%s) by %s, cut "
		"short by the last stop",
		m, old, path);
	ret = replace_dev(c, old, path, &id, NULL, NULL, err, sizeof(err));
	if (ret && ret != -ESTALE && !devlife_stopping(c))
		log_msg(LOG_ERR,
			"replace: the resumed replace failed (%s): run "
			"nvcachectl replace again",
			err);
}

/* The remove the headers say was under way, run again. */
static void resume_remove(struct cache *c, uint32_t m)
{
	uint8_t removed[NVC_MAX_DEVS];
	char err[768], name[PATH_MAX];

	meta_removed(&c->meta, removed);
	if (m > (uint32_t)c->ndevs || removed[m - 1]) {
		/* it was marked removed before the record was cleared */
		meta_set_removing(&c->meta, 0);
		return;
	}
	snprintf(name, sizeof(name), "%s", dev_path(c->devs[m - 1]));
	log_msg(LOG_NOTICE,
		"remove: resuming the remove of member %u (%s), cut short by "
		"the last stop",
		m, name);
	if (cache_remove_dev(c, name, NULL, NULL, err, sizeof(err)) &&
	    !devlife_stopping(c))
		log_msg(LOG_ERR,
			"remove: the resumed remove failed (%s): run "
			"nvcachectl remove again",
			err);
}

/* The mirror replace the headers say was under way, run again. */
static void resume_mirror(struct cache *c, uint32_t m, const char *path)
{
	char err[768], old[PATH_MAX];
	struct stat a, b;

	if (m > 2)
		return;
	snprintf(old, sizeof(old), "%s", c->cfg->meta_paths[m - 1]);
	if (!strcmp(old, path) ||
	    (!stat(old, &a) && !stat(path, &b) && a.st_ino == b.st_ino &&
	     a.st_dev == b.st_dev && a.st_rdev == b.st_rdev)) {
		/* the configuration names the new place already */
		meta_set_mirror_replacing(&c->meta, 0, NULL);
		return;
	}
	log_msg(LOG_NOTICE,
		"replace-mirror: resuming the replace of mirror %u (%s) by %s, "
		"cut short by the last stop",
		m - 1, old, path);
	if (mirror_replace(c, old, path, 1, err, sizeof(err)))
		log_msg(LOG_ERR,
			"replace-mirror: the resumed replace failed (%s): run "
			"nvcachectl replace-mirror again",
			err);
}

/* A device-life operation cut short by the last stop, finished on its own
 * thread: a replace, a remove, a detach or a mirror replace (each records
 * itself in both headers first; one runs at a time, under devlife_lock). */
static void *resume_main(void *arg)
{
	struct cache *c = arg;
	char path[256], err[768];
	uint32_t m = meta_mirror_replacing(&c->meta, path);

	if (m)
		resume_mirror(c, m, path);
	m = meta_replacing(&c->meta, path);
	if (m) {
		resume_replace(c, m, path);
	} else if ((m = meta_removing(&c->meta))) {
		resume_remove(c, m);
	} else if (meta_detach_state(&c->meta) == META_DETACHING) {
		log_msg(LOG_NOTICE, "detach: resuming the detach cut short by "
				    "the last stop");
		if (cache_detach(c, NULL, NULL, err, sizeof(err)) &&
		    !__atomic_load_n(&c->stopping, __ATOMIC_ACQUIRE))
			log_msg(LOG_ERR,
				"detach: the resumed detach failed (%s): run "
				"nvcachectl detach again",
				err);
	}
	return NULL;
}

int devlife_resume_start(struct cache *c)
{
	char path[256];

	if (!meta_mirror_replacing(&c->meta, path) &&
	    (c->detached || (!meta_replacing(&c->meta, path) &&
			     !meta_removing(&c->meta) &&
			     meta_detach_state(&c->meta) != META_DETACHING)))
		return 0;
	if (pthread_create(&c->resume_thread, NULL, resume_main, c))
		return -EAGAIN;
	c->resume_started = 1;
	return 0;
}

void devlife_resume_join(struct cache *c)
{
	if (c->resume_started)
		pthread_join(c->resume_thread, NULL);
	c->resume_started = 0;
}

/*
 * Remove: member k is emptied as for a replace (steps 1 and 2), then both
 * headers mark it removed (meta_hdr.removed), and its device is swapped for
 * a fenced stand-in and closed, so that it can be pulled.  Its slots stay
 * in the layout, never used (slot_failed; usable_slots leaves them out of
 * the capacity and the watermarks); a mount identifies the old device, if
 * still there, as the removed member (members.c).  A crash before the headers say removed
 * leaves member k in use, emptier, and both headers recording the remove
 * under way (meta_hdr.removing, written before the drain): the next mount
 * runs it again (resume_main); after, it is removed.
 */
int cache_remove_dev(struct cache *c, const char *name, cache_progress_fn fn,
		     void *arg, char *err, size_t errlen)
{
	uint8_t removed[NVC_MAX_DEVS];
	/* the device's own name, whatever name was given */
	char path[PATH_MAX];
	struct dev *standin;
	int k, d, left = 0, ret;

	err[0] = 0;
	devlife_enter(c);
	k = devid_member(c, name);
	meta_removed(&c->meta, removed);
	if (k == c->ndevs || removed[k]) {
		snprintf(err, errlen, "%s is not a device of this cache%s",
			 name, k < c->ndevs ? " any more (removed)" : "");
		ret = -EINVAL;
		goto out_unlock;
	}
	snprintf(path, sizeof(path), "%s", dev_path(c->devs[k]));
	for (d = 0; d < c->ndevs; d++)
		left += d != k && !removed[d] && !c->dev_failed[d];
	if (c->detached || !left || (c->cfg->dirty_copies > 1 && left < 2)) {
		snprintf(err, errlen,
			 c->detached ? "the cache is detached: attach first"
			 : !left     ? "it is the last working device"
				     : "dirty_copies = 2 needs two working "
				       "devices besides it");
		ret = -EINVAL;
		goto out_unlock;
	}
	ret = meta_set_removing(&c->meta, k + 1); /* resumed if cut short */
	if (ret) {
		snprintf(err, errlen, "cannot record the remove: %s",
			 strerror(-ret));
		goto err_log;
	}
	log_msg(LOG_NOTICE,
		"remove: emptying member %d (%s): its dirty data destaged, "
		"its clean data dropped",
		k + 1, path);
	ret = drain(c, k, fn, arg, err, errlen);
	if (ret)
		goto err_record;
	ret = dev_missing_create(path, UINT64_MAX, &standin);
	if (!ret) {
		removed[k] = 1;
		ret = meta_set_removed(&c->meta, removed);
		if (ret)
			dev_close(standin);
	}
	if (ret) {
		snprintf(err, errlen, "cannot record the removal: %s",
			 strerror(-ret));
		__atomic_store_n(&c->dev_draining[k], 0, __ATOMIC_RELEASE);
		goto err_record;
	}
	meta_set_removing(&c->meta, 0);
	pthread_mutex_lock(&c->lock);
	c->removed_slots += member_slots(c, k);
	cache_unlock(c);
	c->made_devs |= 1u << k;
	ret = swap_in(c, k, standin, STAT_DEV_REMOVED, fn, arg);
	if (ret)
		snprintf(err, errlen,
			 "removed, but data written with one copy meanwhile "
			 "could not be destaged (%s): destage retries",
			 strerror(-ret));
	log_msg(LOG_NOTICE,
		"remove: member %d (%s) is removed: not used again, it can be "
		"pulled",
		k + 1, path);
	goto out_unlock;
err_record:
	/* stopped by an unmount: the next mount goes on; else it is over */
	if (!devlife_stopping(c))
		meta_set_removing(&c->meta, 0);
err_log:
	log_msg(LOG_ERR, "remove of %s failed: %s", name, err);
out_unlock:
	pthread_mutex_unlock(&devlife_lock);
	return ret;
}

/*
 * Add: a device takes a free member place, one kept spare at format (a
 * cache.devices entry "spare") or left by a remove; with none free, the
 * cache grows by a member (grow.c).  A free place's slots are in the
 * layout already and free on the media, so nothing moves:
 *   1. the new device (checked as for a replace) gets the place's
 *      superblock with a new UUID, flushed, and both headers record the
 *      UUID (new_member);
 *   2. both headers clear the place's removed flag;
 *   3. the device is swapped in for the place's stand-in: its slots are
 *      taken from now on (free_take_locked no longer skips them), and the
 *      capacity and the watermarks count them (usable_slots).
 * A crash after 1 leaves the place free under the new UUID (a mount takes
 * the device there as the free place it still is); add runs again.
 */
/* The first free member place (removed[] read into removed), or c->ndevs
 * if there is none. */
static int free_place(struct cache *c, uint8_t removed[NVC_MAX_DEVS])
{
	int k;

	meta_removed(&c->meta, removed);
	for (k = 0; k < c->ndevs && !removed[k]; k++)
		;
	return k;
}

/* Steps 1 to 3: nd in place k.  0, or -errno with err set (nd is the
 * caller's then); the place's stand-in is closed. */
static int add_run(struct cache *c, int k, uint8_t removed[NVC_MAX_DEVS],
		   struct dev *nd, char *err, size_t errlen)
{
	int ret = new_member(c, k, nd, NULL, err, errlen);

	if (!ret) {
		removed[k] = 0;
		ret = meta_set_removed(&c->meta, removed);
		if (ret)
			snprintf(err, errlen, "cannot record the device: %s",
				 strerror(-ret));
	}
	if (ret) {
		log_msg(LOG_ERR, "add of %s failed: %s", dev_path(nd), err);
		return ret;
	}
	pthread_mutex_lock(&c->lock);
	c->removed_slots -= member_slots(c, k);
	cache_unlock(c);
	dev_close(cache_dev_swap(c, k, nd, STAT_DEV_OK));
	cache_note_member_names(c);
	c->made_devs &= ~(1u << k); /* nd is its caller's, as the others */
	stats_attach_devs(c);
	pthread_mutex_lock(&c->lock);
	space_freed_locked(c); /* writers waiting for room have it */
	cache_unlock(c);
	log_msg(LOG_NOTICE,
		"add: %s is member %d, in use now (found by its UUID at the "
		"next mount)",
		dev_path(nd), k + 1);
	return 0;
}

/* Add nd (opened by path if NULL): into a free place, else as a new
 * member.  0, or -errno with err set; nd given is the caller's on failure,
 * one opened here is closed. */
static int add_dev(struct cache *c, const char *path, struct dev *nd,
		   char *err, size_t errlen)
{
	uint8_t removed[NVC_MAX_DEVS];
	struct dev *opened = NULL;
	uint64_t need;
	int k, ret = -EINVAL;

	err[0] = 0;
	devlife_enter(c);
	if (c->detached) {
		snprintf(err, errlen, "the cache is detached: attach first");
		goto out_unlock;
	}
	k = free_place(c, removed);
	need = k < c->ndevs ? member_slots(c, k) : GROW_MIN_SLOTS;
	if (!nd) {
		ret = devid_new_dev(c, path, need, &opened, err, errlen);
		if (ret)
			goto out_unlock;
		nd = opened;
	}
	if (k < c->ndevs)
		ret = add_run(c, k, removed, nd, err, errlen);
	else
		ret = grow_run(c, nd, err, errlen);
	if (ret && opened)
		dev_close(opened);
out_unlock:
	pthread_mutex_unlock(&devlife_lock);
	return ret;
}

int cache_add_dev(struct cache *c, const char *path, char *err, size_t errlen)
{
	return add_dev(c, path, NULL, err, errlen);
}

int cache_add_dev_with(struct cache *c, struct dev *nd, char *err,
		       size_t errlen)
{
	return add_dev(c, dev_path(nd), nd, err, errlen);
}
