/* cache: a metadata mirror replaced while mounted (nvcachectl replace-mirror). */
#define _GNU_SOURCE
#include "mngt.h"

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
 *      replace under way (mirror, new place).  A crash before the copy's
 *      header lands leaves the configuration naming the old place, as
 *      before: the next mount uses it (or rebuilds it, if it was lost or
 *      damaged), then resumes the replace on its thread (replace.c,
 *      resume_main) onto the recorded place, only if it is still the one
 *      claimed: the same device or file, the same size, and its first 4
 *      KiB zero (the copy under way), the claim, or this cache's header
 *      (devid_prove_place); else nothing is written there and the replace
 *      stays recorded, logged;
 *   1. meta_replace: the copy, persisted, its header last (meta_rebuild:
 *      a copy cut short never passes for a mirror); the other mirror's
 *      header then no longer calls mirror k stale.  The old place, if it
 *      can still be written, then takes the new header (meta.c old_point:
 *      a healthy one recorded the replace already, a failed one missed
 *      it), and nothing is written there again: its header records its own
 *      replace by the new place (mirror_replacing = its own index + 1,
 *      mirror_path, mirror_id), a pointer to its successor;
 *   2. the record is cleared (in the other mirror and the new place).
 *
 * The old place is not wiped.  A mount whose cache.metadata still names it
 * (the administrator did not change it yet, or a crash came before the
 * daemon said to) follows the pointer, and the new place's own pointer
 * after a later replace (mirror_follow): the new place, if proven, is
 * mirror k, and the old one is left alone.  Wiping it instead left the
 * mount one valid header among the places it was given, so that a torn
 * write of the other mirror's header or record lost the cache although the
 * new place held all of it (the crash harness's NVC_CRASH_MIRROR run found
 * this).  An old place that cannot be written (failed, gone) holds no
 * pointer: if it comes back with its old header while the configuration
 * still names it and the other mirror is lost, its records are taken
 * (README, Limits); the daemon says so at the replace.
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

/* Steps 0 and 1 onto new_path, mirror k being old: the place made or taken
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
	devlife_enter(c);
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
	if (!ret || !devlife_stopping(c)) { /* 2, or failed */
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
 * Following a replaced mirror (the essay at the top).  The place mirror k
 * is taken from starts as the configured one.  A valid header that records
 * a replace of k names the new place P and its identity: at the first step
 * either header (the newer, if both do: the other mirror records a replace
 * the old place may have missed, if it had failed), then only the current
 * place's own header, since each later replace froze a header there.  Then:
 *   - P is the current place itself: it is mirror k;
 *   - P holds a valid header of this cache for mirror k, of a generation no
 *     older than the recording header's, and is not the other mirror's
 *     place; and it is the place recorded (the same file, or the same block
 *     device number; a block device under another number only if all the
 *     rest holds, as after a reboot): the copy finished there, and P is
 *     mirror k now (the current place may have missed every write since);
 *     the next step looks at P's own header, for a later replace;
 *   - P is the place recorded, its start zero or our claim: the copy never
 *     finished, and the current place is mirror k (the replace resumes);
 *   - else (P gone, another thing, unreadable): if the current place's own
 *     header records its replace, it may have missed writes since the copy:
 *     it is rebuilt from the other mirror, or, with no other, the mount is
 *     refused rather than served from records that may be old.
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

/* What a header records of a replace of mirror k: the new place. */
struct fwd {
	char path[256];
	uint8_t set[16];
	struct meta_ident id;
	uint64_t gen;
};

static void fwd_of(const struct meta_hdr *h, struct fwd *f)
{
	memcpy(f->path, h->mirror_path, sizeof(f->path));
	f->path[sizeof(f->path) - 1] = 0;
	memcpy(f->set, h->set_uuid, 16);
	f->id = h->mirror_id;
	f->gen = h->gen;
}

/* a and b are the same file or block device */
static int same_place(const struct pm_region *a, const struct pm_region *b)
{
	struct stat x, y;

	if (!a->addr || !b->addr || !a->bdev != !b->bdev)
		return 0;
	if (a->bdev)
		return !dev_stat(a->bdev, &x) && !dev_stat(b->bdev, &y) &&
		       x.st_rdev == y.st_rdev;
	return !a->is_mem && !b->is_mem && a->created_dev == b->created_dev &&
	       a->created_ino == b->created_ino;
}

int mirror_successor_ok(const uint8_t set_uuid[16],
			const struct meta_ident *id, uint64_t gen, int k,
			const struct pm_region *other,
			const struct pm_region *s)
{
	const struct meta_hdr *sh = s->addr;

	if (meta_hdr_check(s->addr, s->len, NULL) ||
	    memcmp(sh->set_uuid, set_uuid, 16) || sh->mirror != (uint32_t)k ||
	    sh->gen < gen || same_place(s, other))
		return 0;
	return devid_place_is(s, id) || (s->bdev && id->rdev);
}

int (*mirror_test_place)(const char *path, struct pm_region *out);

/* The successor f names mapped and loaded into *s if it is proven; 1 then,
 * 0 if not (*unfinished: the copy never finished there). */
static int successor_map(const struct fwd *f, int k,
			 const struct pm_region *other, struct pm_region *s,
			 int *unfinished)
{
	char why[256];
	uint64_t total;

	*unfinished = 0;
	if (mirror_test_place
		    ? mirror_test_place(f->path, s)
		    : pm_map_err(f->path, 0, 0, s, why, sizeof(why)))
		return 0;
	*unfinished = devid_place_unfinished(s, f->set, &f->id);
	if (!meta_hdr_why(s->addr, s->len, &total, why, sizeof(why)) &&
	    mirror_successor_ok(f->set, &f->id, f->gen, k, other, s) &&
	    !pm_load(s, total)) {
		if (!devid_place_is(s, &f->id))
			log_msg(LOG_NOTICE,
				"metadata mirror %d: %s holds its current "
				"header under another device number than "
				"recorded (renumbered)",
				k, f->path);
		return 1;
	}
	pm_unmap(s);
	return 0;
}

/* Mirror k's place m[k] (named cur) records its own replace. */
static int self_replaced(const struct pm_region *r, int valid, int k)
{
	const struct meta_hdr *h = r->addr;

	return valid && h->mirror_replacing == (uint32_t)k + 1 &&
	       h->mirror_path[0];
}

/* The successor s takes m[k]'s place, named as f says. */
static int follow(const char *cur, int k, const struct fwd *f,
		  struct pm_region m[2], struct pm_region *s, char **followed)
{
	char *name = strdup(f->path);

	if (!name) {
		pm_unmap(s);
		return -ENOMEM;
	}
	log_msg(LOG_WARNING,
		"cache.metadata names %s as mirror %d, but a replace-mirror "
		"replaced it by %s: using %s, and leaving %s alone; change "
		"cache.metadata",
		cur, k, f->path, f->path, cur);
	pm_unmap(&m[k]);
	m[k] = *s;
	free(*followed);
	*followed = name;
	return 0;
}

#define FOLLOW_MAX 16 /* replaces in a row, each froze a pointer */

int mirror_follow(const char *const names[2], struct pm_region m[2],
		  int mret[2], char why[2][256], uint64_t total[2],
		  char *followed[2], char *err, size_t errlen)
{
	const struct meta_hdr *h[2] = { m[0].addr, m[1].addr };
	int valid[2] = { !mret[0], !mret[1] };
	int k, i, hop, unfinished, ret;
	struct pm_region s;
	struct fwd f;

	for (k = 0; k < 2; k++) {
		i = mirror_forward_of(h, valid, k);
		for (hop = 0; i >= 0 && hop < FOLLOW_MAX; hop++) {
			const char *cur = followed[k] ? followed[k] : names[k];

			fwd_of(h[i], &f);
			if (!strcmp(f.path, cur) ||
			    (m[k].addr && devid_place_is(&m[k], &f.id)))
				break; /* the current place is the new one */
			if (!successor_map(&f, k, &m[!k], &s, &unfinished)) {
				if (unfinished || !self_replaced(&m[k], valid[k],
								 k))
					break; /* the current place is k */
				if (!valid[!k]) {
					snprintf(err, errlen,
						 "metadata mirror %s records "
						 "its replace by %s, which is "
						 "not there or not the place "
						 "recorded: %s may have missed "
						 "writes since, and the other "
						 "mirror (%s) is not usable; "
						 "nothing mounted",
						 cur, f.path, cur, names[!k]);
					return -ESTALE;
				}
				mret[k] = -ESTALE;
				valid[k] = 0;
				snprintf(why[k], sizeof(why[k]),
					 "replaced by %.180s, which is not there: "
					 "it may have missed writes since",
					 f.path);
				break;
			}
			ret = follow(cur, k, &f, m, &s, &followed[k]);
			if (ret)
				return ret;
			h[k] = m[k].addr;
			mret[k] = 0;
			valid[k] = 1;
			total[k] = h[k]->total_len;
			why[k][0] = 0;
			/* a later replace froze a pointer there too */
			i = self_replaced(&m[k], 1, k) ? k : -1;
		}
	}
	return 0;
}
