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
 *      header then no longer calls mirror k stale.  From here on nothing is
 *      written to the old place: its header stays as the copy found it,
 *      recording its own replace by the new place (mirror_replacing = its
 *      own index + 1, mirror_path, mirror_id): a pointer to its successor;
 *   3. the record is cleared (in the other mirror and the new place).
 *
 * The old place is not wiped.  A mount whose cache.metadata still names it
 * (the administrator did not change it yet, or a crash came before the
 * daemon said to) follows the pointer (mirror_follow): the new place, if it
 * is the one recorded and holds a header of this cache, is mirror k, and
 * the old one is left alone.  Wiping it instead left the mount one valid
 * header among the places it was given, so that a torn write of the other
 * mirror's header or record lost the cache although the new place held
 * all of it (the crash harness's NVC_CRASH_MIRROR run found this).
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

/* Steps 0 to 2 onto new_path, mirror k being old: the place made or taken
 * (or given, mapped already), claimed, and its identity recorded with the
 * replace, then the copy. */
static int mirror_onto(struct cache *c, int k, const char *old,
		       const char *new_path, const struct pm_region *given,
		       char *err, size_t errlen)
{
	struct pm_region nr, oldr;
	uint64_t total = meta_total_len(c->meta.layout.room, c->meta.nfiles,
					c->meta.block_size);
	struct meta_ident id;
	char *keep;
	int ret = 0;

	/* made O_EXCL, never through a link (pm_open_place) */
	if (given)
		nr = *given;
	else
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
	pm_unmap(&oldr);
	/* the old name stays allocated: the statistics may be reading it */
	keep = strdup(new_path);
	if (keep)
		__atomic_store_n(&c->cfg->meta_paths[k], keep,
				 __ATOMIC_RELEASE);
	log_msg(LOG_NOTICE,
		"replace-mirror: mirror %d is now %s (a copy of %s); change "
		"cache.metadata in the configuration from %s to %s (until "
		"then a mount finds the new place through the old one)",
		k, new_path, c->cfg->meta_paths[!k], old, new_path);
	return 0;
err_unmap:
	if (!given) {
		pm_unmap(&nr);
		pm_unlink_created(&nr, new_path);
	}
	return ret;
}

/* A replace of the mirror at old by new_path, proven new (or, resumed, the
 * place recorded), or by the region given (the crash harness). */
static int mirror_replace_on(struct cache *c, const char *old,
			     const char *new_path, int resumed,
			     const struct pm_region *given, char *err,
			     size_t errlen)
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
	ret = given     ? 0
	      : resumed ? resumed_place(c, k, new_path, &id, err, errlen)
			: devid_new_place(c, new_path, err, errlen);
	if (ret)
		goto out_unlock;
	ret = mirror_onto(c, k, old, new_path, given, err, errlen);
	if (!ret || !devlife_stopping(c)) { /* 3, or failed */
		meta_set_mirror_replacing(&c->meta, 0, NULL);
		meta_set_mirror_id(&c->meta, NULL);
	}
out_unlock:
	pthread_mutex_unlock(&devlife_lock);
	return ret;
}

int mirror_replace(struct cache *c, const char *old, const char *new_path,
		   int resumed, char *err, size_t errlen)
{
	return mirror_replace_on(c, old, new_path, resumed, NULL, err, errlen);
}

int cache_replace_mirror(struct cache *c, const char *old, const char *new_path,
			 char *err, size_t errlen)
{
	return mirror_replace(c, old, new_path, 0, err, errlen);
}

int cache_replace_mirror_with(struct cache *c, const char *old,
			      const char *new_name, const struct pm_region *r,
			      char *err, size_t errlen)
{
	return mirror_replace_on(c, old, new_name, 0, r, err, errlen);
}

/*
 * Following a replaced mirror (the essay at the top).  For mirror k, the
 * valid header that records a replace of k (the newer, if both do) names
 * the new place P and its identity.  Then, at a mount:
 *   - the configuration names P already (the same place): nothing to do;
 *   - P is the place recorded and holds a valid header of this cache: the
 *     copy finished, and P is mirror k (the old place may have missed
 *     every write since);
 *   - P is the place recorded, its start zero or our claim: the copy never
 *     finished, and the configured place is mirror k (the replace resumes);
 *   - else (P gone, another thing, unreadable): if the configured place's
 *     own header records its replace, it may have missed writes since the
 *     copy: it is rebuilt from the other mirror, or, with no other, the
 *     mount is refused rather than served from records that may be old.
 */
int mirror_forward_of(const struct meta_hdr *const h[2], const int valid[2],
		      int k)
{
	int i, best = -1;

	for (i = 0; i < 2; i++)
		if (valid[i] && h[i]->mirror_replacing == (uint32_t)k + 1 &&
		    h[i]->mirror_path[0] &&
		    (best < 0 || h[i]->gen > h[best]->gen))
			best = i;
	return best;
}

int mirror_successor_ok(const uint8_t set_uuid[16],
			const struct meta_ident *id, const struct pm_region *s)
{
	const struct meta_hdr *sh = s->addr;

	return !meta_hdr_check(s->addr, s->len, NULL) &&
	       !memcmp(sh->set_uuid, set_uuid, 16) && devid_place_is(s, id);
}

int (*mirror_test_place)(const char *path, struct pm_region *out);

/* The successor at path mapped and loaded into *s if it is proven; 1 then,
 * 0 if not (*unfinished: the copy never finished there). */
static int successor_map(const char *path, const uint8_t set_uuid[16],
			 const struct meta_ident *id, struct pm_region *s,
			 int *unfinished)
{
	char why[256];
	uint64_t total;

	*unfinished = 0;
	if (mirror_test_place ? mirror_test_place(path, s)
			      : pm_map_err(path, 0, 0, s, why, sizeof(why)))
		return 0;
	*unfinished = devid_place_unfinished(s, set_uuid, id);
	if (!meta_hdr_why(s->addr, s->len, &total, why, sizeof(why)) &&
	    mirror_successor_ok(set_uuid, id, s) && !pm_load(s, total))
		return 1;
	pm_unmap(s);
	return 0;
}

int mirror_follow(const char *const names[2], struct pm_region m[2],
		  int mret[2], char why[2][256], uint64_t total[2],
		  char *followed[2], char *err, size_t errlen)
{
	const struct meta_hdr *h[2] = { m[0].addr, m[1].addr };
	int valid[2] = { !mret[0], !mret[1] };
	struct meta_ident id;
	uint8_t set[16];
	char path[256];
	struct pm_region s;
	int k, i, self, unfinished;

	for (k = 0; k < 2; k++) {
		i = mirror_forward_of(h, valid, k);
		if (i < 0)
			continue;
		memcpy(path, h[i]->mirror_path, sizeof(path));
		path[sizeof(path) - 1] = 0;
		memcpy(set, h[i]->set_uuid, 16);
		id = h[i]->mirror_id;
		self = valid[k] && h[k]->mirror_replacing == (uint32_t)k + 1;
		if (!strcmp(path, names[k]) ||
		    (m[k].addr && devid_place_is(&m[k], &id)))
			continue; /* configured: the new place itself */
		if (successor_map(path, set, &id, &s, &unfinished)) {
			followed[k] = strdup(path);
			if (!followed[k]) {
				pm_unmap(&s);
				return -ENOMEM;
			}
			log_msg(LOG_WARNING,
				"cache.metadata names %s as mirror %d, but a "
				"replace-mirror replaced it by %s: using %s, "
				"and leaving %s alone; change cache.metadata",
				names[k], k, path, path, names[k]);
			pm_unmap(&m[k]);
			m[k] = s;
			h[k] = s.addr;
			mret[k] = 0;
			valid[k] = 1;
			total[k] = h[k]->total_len;
			why[k][0] = 0;
			continue;
		}
		if (unfinished || !self)
			continue; /* the configured place is mirror k */
		if (!valid[!k]) {
			snprintf(err, errlen,
				 "metadata mirror %s records its replace by %s, "
				 "which is not there or not the place recorded: "
				 "%s may have missed writes since, and the other "
				 "mirror (%s) is not usable; nothing mounted",
				 names[k], path, names[k], names[!k]);
			return -ESTALE;
		}
		mret[k] = -ESTALE;
		valid[k] = 0;
		snprintf(why[k], sizeof(why[k]),
			 "replaced by %s, which is not there: it may have "
			 "missed writes since",
			 path);
	}
	return 0;
}
