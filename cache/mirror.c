/* cache: a metadata mirror replaced while mounted (nvcachectl replace-mirror). */
#define _GNU_SOURCE
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

/*
 * Replacing a mirror.  The new place (a file that does not exist yet, or a
 * block device with no signature libblkid knows, at least the mirror's
 * size) is mapped, then meta_replace fills it from the other mirror with
 * every record write held off (meta.c: m->swap) and puts it in the old
 * one's place; the old one (failed, missing or healthy) is let go.
 *
 * Order, and what a crash leaves:
 *   0. the new region is mapped (a new file is created at the mirror's
 *      size, O_EXCL) and claimed: a claim header with a new UUID at its
 *      start, persisted; then the headers record the place's identity (that
 *      UUID, its st_rdev or file, its size: meta_hdr.mirror_id) and the
 *      replace under way (mirror, new place).  A crash before 4 leaves the
 *      configuration naming the old place, as before: the next mount uses
 *      it (or rebuilds it, if it was lost or damaged), then resumes the
 *      replace on its thread (replace.c, resume_main) onto the recorded
 *      place, only if it is still the one claimed: the same device or
 *      file, the same size, and its first 4 KiB zero (the copy under way),
 *      the claim, or this cache's header (devid_prove_place); else nothing
 *      is written there and the replace stays recorded, logged;
 *   2. meta_replace: the copy, persisted, its header last (meta_rebuild:
 *      a copy cut short never passes for a mirror); the other mirror's
 *      header then no longer calls mirror k stale;
 *   3. the old place's header is wiped (magic zeroed, if it can still be
 *      written), so that a configuration still naming it can never take
 *      its stale records for current ones: the mount rebuilds it instead;
 *   4. the record is cleared.
 * cache.metadata is the administrator's: the daemon says to change it, and
 * until it is changed every mount rebuilds the old place from the good one.
 */

/* Which mirror old names (as configured, or the same file): 0, 1 or -1. */
static int mirror_index(struct cache *c, const char *old)
{
	struct stat a, b;
	int k;

	for (k = 0; k < 2; k++)
		if (c->cfg->meta_paths[k] &&
		    !strcmp(c->cfg->meta_paths[k], old))
			return k;
	if (stat(old, &a))
		return -1;
	for (k = 0; k < 2; k++)
		if (c->cfg->meta_paths[k] && !stat(c->cfg->meta_paths[k], &b) &&
		    a.st_dev == b.st_dev && a.st_ino == b.st_ino &&
		    a.st_rdev == b.st_rdev)
			return k;
	return -1;
}

/* Step 3: the old place can never pass for a mirror again. */
static void old_place_wipe(struct pm_region *old)
{
	static const uint64_t zero;

	if (old->missing || !old->addr || old->len < META_HDR_SIZE)
		return;
	if (pm_write(old, offsetof(struct meta_hdr, magic), &zero,
		     sizeof(zero)))
		log_msg(LOG_WARNING, "replace-mirror: the old mirror's header "
				     "could not be wiped");
}

/* The place a mirror replace cut short recorded (id), if it is still the
 * one it began on: then a file it made is let go, to be made again.  0, or
 * -ESTALE with the refusal logged (nothing written, the replace stays
 * recorded). */
static int resumed_place(struct cache *c, int k, const char *path,
			 const struct meta_ident *id, char *err, size_t errlen)
{
	struct stat st;
	int gone, ret = devid_prove_place(c, path, id, &gone, err, errlen);

	/* a file proven the one it made (id), if the name still holds it */
	if (!ret && !gone && !lstat(path, &st) && S_ISREG(st.st_mode)) {
		if (st.st_dev != (dev_t)id->dev || st.st_ino != id->ino) {
			snprintf(err, errlen, "%s changed while it was checked",
				 path);
			ret = -EAGAIN;
		} else if (unlink(path)) {
			ret = -errno;
		}
	}
	if (!ret)
		return 0;
	if (!err[0])
		snprintf(err, errlen, "%s: %s", path, strerror(-ret));
	log_msg(LOG_ERR,
		"replace-mirror: the replace of mirror %d (%s) is not resumed, "
		"and nothing was written to %s: %s.  It stays recorded, and "
		"mirror %d is still %s; to finish it, run nvcachectl "
		"replace-mirror MOUNTPOINT %s NEWPLACE (a new place)",
		k, c->cfg->meta_paths[k], path, err, k, c->cfg->meta_paths[k],
		c->cfg->meta_paths[k]);
	return -ESTALE;
}

/* Steps 0 to 3 onto new_path, mirror k being old: the place made or taken,
 * claimed, and its identity recorded with the replace, then the copy. */
static int mirror_onto(struct cache *c, int k, const char *old,
		       const char *new_path, char *err, size_t errlen)
{
	struct pm_region nr, oldr;
	uint64_t total = meta_total_len(c->meta.layout.room, c->meta.nfiles,
					c->meta.block_size);
	struct meta_ident id;
	char *keep;
	int ret;

	/* made O_EXCL, never through a link (pm_open_place) */
	ret = pm_map_err(new_path, total, PM_NEW, &nr, err, errlen);
	if (ret) {
		if (!err[0])
			snprintf(err, errlen, "%s: cannot map it: %s", new_path,
				 ret == -EBUSY	  ? "in use"
				 : ret == -ENOSPC ? "smaller than the mirror"
						  : strerror(-ret));
		return ret;
	}
	ret = devid_claim_place(c, &nr, &id);
	if (!ret)
		ret = meta_set_mirror_id(&c->meta, &id);
	if (!ret) /* step 0 */
		ret = meta_set_mirror_replacing(&c->meta, k + 1, new_path);
	if (ret) {
		snprintf(err, errlen, "cannot record the replace: %s",
			 strerror(-ret));
		goto err_unmap;
	}
	log_msg(LOG_NOTICE,
		"replace-mirror: rebuilding mirror %d (%s) on %s from %s", k,
		c->cfg->meta_paths[k], new_path, c->cfg->meta_paths[!k]);
	ret = meta_replace(&c->meta, k, &nr, &oldr);
	if (ret) {
		snprintf(err, errlen, "%s: cannot rebuild the mirror there: %s",
			 new_path, strerror(-ret));
		goto err_unmap;
	}
	old_place_wipe(&oldr);
	pm_unmap(&oldr);
	/* the old name stays allocated: the statistics may be reading it */
	keep = strdup(new_path);
	if (keep)
		__atomic_store_n(&c->cfg->meta_paths[k], keep,
				 __ATOMIC_RELEASE);
	log_msg(LOG_NOTICE,
		"replace-mirror: mirror %d is now %s (a copy of %s); change "
		"cache.metadata in the configuration from %s to %s before the "
		"next mount",
		k, new_path, c->cfg->meta_paths[!k], old, new_path);
	return 0;
err_unmap:
	pm_unmap(&nr);
	pm_unlink_created(&nr, new_path);
	return ret;
}

int mirror_replace(struct cache *c, const char *old, const char *new_path,
		   int resumed, char *err, size_t errlen)
{
	struct meta_ident id;
	int k, ret;

	err[0] = 0;
	pthread_mutex_lock(&devlife_lock);
	k = mirror_index(c, old);
	if (k < 0) {
		snprintf(err, errlen,
			 "%s is not a metadata mirror of this cache (%s, %s)",
			 old, c->cfg->meta_paths[0], c->cfg->meta_paths[1]);
		ret = -EINVAL;
		goto out_unlock;
	}
	if (!__atomic_load_n(&c->meta.have[!k], __ATOMIC_ACQUIRE)) {
		snprintf(err, errlen,
			 "the other mirror (%s) is not usable: nothing to "
			 "rebuild from",
			 c->cfg->meta_paths[!k]);
		ret = -ENODATA;
		goto out_unlock;
	}
	if (mirror_index(c, new_path) >= 0) {
		snprintf(err, errlen,
			 "%s is already a metadata mirror of this cache",
			 new_path);
		ret = -EINVAL;
		goto out_unlock;
	}
	meta_mirror_id(&c->meta, &id);
	ret = resumed ? resumed_place(c, k, new_path, &id, err, errlen)
		      : devid_new_place(c, new_path, err, errlen);
	if (ret)
		goto out_unlock;
	ret = mirror_onto(c, k, old, new_path, err, errlen);
	if (!ret || !devlife_stopping(c)) { /* 4, or failed */
		meta_set_mirror_replacing(&c->meta, 0, NULL);
		meta_set_mirror_id(&c->meta, NULL);
	}
out_unlock:
	pthread_mutex_unlock(&devlife_lock);
	return ret;
}

int cache_replace_mirror(struct cache *c, const char *old, const char *new_path,
			 char *err, size_t errlen)
{
	return mirror_replace(c, old, new_path, 0, err, errlen);
}
