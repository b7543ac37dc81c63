/* cache: a mount by name: the mirrors mapped (followed, recreated or stood
 * in for), the current header, the members found by identity, then the
 * cache opened (recover.c). */
#define _GNU_SOURCE
#include "mngt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <syslog.h>

/* A damaged or lost mirror, made anew at len bytes to be rebuilt. */
static int mirror_recreate(struct cache_config *cfg, int i, const char *why,
			   uint64_t len, struct pm_region *r)
{
	log_msg(LOG_WARNING,
		"metadata mirror %s is damaged or lost (%s); rebuilding it "
		"from %s",
		cfg->meta_paths[i], why, cfg->meta_paths[!i]);
	return pm_map(cfg->meta_paths[i], len, 1, r);
}

/*
 * A mirror on a device that is not there is not made anew (a file in its
 * place under /dev would live in RAM): the cache runs on the other mirror
 * alone, and a stand-in in memory takes the missing one's place for
 * meta_attach.  When the device is back, the next mount brings it up to
 * date record by record.
 */
static int mirror_stand_in(struct cache_config *cfg, int i, uint64_t len,
			   struct pm_region *r)
{
	int ret;

	log_msg(LOG_CRIT,
		"metadata mirror %s is missing (no such device): mounting "
		"degraded, the metadata on %s alone",
		cfg->meta_paths[i], cfg->meta_paths[!i]);
	ret = pm_mem_create(len, r);
	if (!ret)
		r->missing = 1;
	return ret;
}

/*
 * The listed devices: opened (one gone is a stand-in with two dirty copies,
 * *missing its index + 1), or all stand-ins when the cache is detached
 * (detach.c: the devices may be gone or in other use).  0, or -errno with
 * err set and nothing left open.
 */
static int open_devs(struct cache_config *cfg, int detached, int removed,
		     struct dev **devs, int *missing, char *err, size_t errlen)
{
	int i, ret = 0;

	for (i = 0; i < cfg->ndevs && !ret; i++) {
		if (detached) {
			ret = dev_missing_create(cfg->dev_paths[i], UINT64_MAX,
						 &devs[i]);
			continue;
		}
		/* a spare place (replace.c, add) names no device */
		ret = cfg_is_spare(cfg->dev_paths[i]) && removed
			      ? -ENOENT
			      : dev_open(cfg->dev_paths[i], &devs[i]);
		if (ret && ret != -EBUSY && removed) {
			/* a removed member's name or a spare place: its
			 * device may be gone (check_superblocks says which
			 * member is removed) */
			removed--;
			if (!cfg_is_spare(cfg->dev_paths[i]))
				log_msg(LOG_INFO,
					"%s: cannot open it (%s): taken for a "
					"removed member",
					cfg->dev_paths[i], strerror(-ret));
			ret = dev_missing_create(cfg->dev_paths[i], UINT64_MAX,
						 &devs[i]);
			continue;
		}
		if (ret && ret != -EBUSY && cfg->dirty_copies > 1 &&
		    !*missing) {
			/* with two dirty copies, one device may be gone */
			log_msg(LOG_CRIT,
				"%s: cannot open cache device (%s): mounting "
				"degraded, from the second copies",
				cfg->dev_paths[i], strerror(-ret));
			ret = dev_missing_create(cfg->dev_paths[i], UINT64_MAX,
						 &devs[i]);
			*missing = i + 1;
		}
		if (ret)
			snprintf(err, errlen,
				 "%s: cannot open cache device: %s",
				 cfg->dev_paths[i],
				 ret == -EBUSY ? "in use (mounted, or by "
						 "another nvcachefs)"
					       : strerror(-ret));
	}
	if (ret)
		for (i = 0; i < cfg->ndevs; i++)
			if (devs[i]) {
				dev_close(devs[i]);
				devs[i] = NULL;
			}
	return ret;
}

void cache_note_member_names(struct cache *c)
{
	char names[NVC_MAX_DEVS][META_NAME_LEN], name[META_NAME_LEN];
	uint64_t rdevs[NVC_MAX_DEVS], rdev;
	uint8_t removed[NVC_MAX_DEVS];
	int d;

	const struct meta_hdr *h = meta_hdr_of(&c->meta);

	if (!h || !members_recorded(h))
		return;
	meta_member_names(&c->meta, names, rdevs);
	meta_removed(&c->meta, removed);
	for (d = 0; d < c->ndevs; d++) {
		if (removed[d] ||
		    __atomic_load_n(&c->dev_failed[d], __ATOMIC_ACQUIRE) ||
		    members_stable_name(dev_path(c->devs[d]), name,
					sizeof(name), &rdev))
			continue;
		if (!strcmp(name, names[d]) && rdev == rdevs[d])
			continue;
		if (meta_set_member_name(&c->meta, d, name, rdev))
			log_msg(LOG_WARNING,
				"cannot record where member %d was found",
				d + 1);
	}
}

/*
 * Tokens.  Every mount writes a new random token into each working
 * member's superblock and records it in the header (meta_hdr.tokens), so
 * that a block-for-block copy of a member taken before it (a dd backup)
 * is told from the member itself when the member is gone and the copy is
 * the only device with its UUID (members_pick refuses it).  The header
 * first records the tokens being written (tokens_next), then the devices
 * get them, then the header takes them as the members': a crash anywhere
 * leaves every member's superblock with one of the two the header accepts.
 * A member missing at this mount keeps its old token, in the header and on
 * its device, and is taken again when it is back.
 */
void cache_note_tokens(struct cache *c)
{
	const struct meta_hdr *h = meta_hdr_of(&c->meta);
	uint64_t tok[NVC_MAX_DEVS] = { 0 }, done[NVC_MAX_DEVS] = { 0 };
	uint8_t removed[NVC_MAX_DEVS];
	struct sb_disk sb;
	int d, any = 0, left = 0;

	if (!h || !members_recorded(h))
		return;
	meta_removed(&c->meta, removed);
	for (d = 0; d < c->ndevs; d++) {
		if (removed[d] ||
		    __atomic_load_n(&c->dev_failed[d], __ATOMIC_ACQUIRE))
			continue;
		while (!tok[d])
			if (getrandom(&tok[d], sizeof(tok[d]), 0) !=
			    sizeof(tok[d]))
				return;
		any = 1;
	}
	if (!any || meta_set_tokens(&c->meta, tok, 1))
		return;
	for (d = 0; d < c->ndevs; d++) {
		if (!tok[d])
			continue;
		if (sb_read(c->devs[d], &sb)) {
			left++;
			continue;
		}
		sb.token = tok[d];
		if (sb_write(c->devs[d], &sb))
			left++;
		else
			done[d] = tok[d];
	}
	if (left)
		log_msg(LOG_WARNING,
			"%d cache device%s kept the token of the last mount "
			"(cannot write its superblock)",
			left, left > 1 ? "s" : "");
	if (meta_set_tokens(&c->meta, done, 0))
		log_msg(LOG_WARNING, "cannot record the devices' new tokens");
}

/* A detached cache's members as fenced stand-ins, named where each was
 * last found. */
static int standins(const struct cache_config *cfg, const struct meta_hdr *h,
		    struct dev **devs)
{
	uint32_t k;
	int ret = 0;

	for (k = 0; k < h->ndevs && !ret; k++)
		ret = dev_missing_create(h->names[k][0] ? h->names[k]
					 : k < (uint32_t)cfg->ndevs
						 ? cfg->dev_paths[k]
						 : "(member)",
					 UINT64_MAX, &devs[k]);
	return ret;
}

/*
 * Mirror i mapped into *m: *mret 0 where it holds a valid header (loaded,
 * *total its length), else why it does not (a missing, truncated or
 * damaged mirror is recreated later at the good one's size and rebuilt
 * from it by meta_attach; a device that is not there, -ENODEV, stays
 * missing).  A link, a stranger's file or a mirror another nvcachefs has
 * mapped refuse the mount: -errno, err set.
 */
static int mount_map_mirror(const struct cache_config *cfg, int i,
			    struct pm_region *m, int *mret, uint64_t *total,
			    char why[256], char *err, size_t errlen)
{
	*mret = pm_map_err(cfg->meta_paths[i], 0, 0, m, why, 256);
	if (*mret == -ELOOP || *mret == -EPERM) {
		/* a link or a stranger's file: never rebuilt over */
		snprintf(err, errlen, "%s", why);
		if (!why[0])
			snprintf(err, errlen, "%s: %s", cfg->meta_paths[i],
				 strerror(-*mret));
		return *mret;
	}
	if (*mret == -EBUSY) {
		snprintf(err, errlen,
			 "%s: cannot map metadata mirror: in use by another "
			 "nvcachefs",
			 cfg->meta_paths[i]);
		return -EBUSY;
	}
	if (*mret) {
		if (!why[0])
			snprintf(why, 256, "%s", strerror(-*mret));
	} else {
		*mret = meta_hdr_why(m->addr, m->len, total, why, 256);
	}
	if (!*mret) {
		*mret = pm_load(m, *total);
		if (*mret)
			snprintf(why, 256, "cannot read it: %s",
				 strerror(-*mret));
	}
	return 0;
}

/* The members as the current header h records them, opened into devs
 * (*ndevs of them; *missing: the one found missing, + 1), and whether the
 * headers say detached.  0, or -errno with err set. */
static int mount_open_members(struct cache_config *cfg,
			      const struct meta_hdr *h, struct dev **devs,
			      int *ndevs, int *missing, int *detached,
			      char *err, size_t errlen)
{
	int i, removed = 0, ret;

	/* detached (detach.c), or a detach under way: resumed once mounted */
	*detached = h->detached == 1;
	*ndevs = cfg->ndevs;
	if (*detached || !members_recorded(h)) {
		for (i = 0; i < NVC_MAX_DEVS; i++)
			removed += h->removed[i];
		if (*detached && members_recorded(h))
			ret = standins(cfg, h, devs);
		else
			ret = open_devs(cfg, *detached, removed, devs, missing,
					err, errlen);
		if (*detached && members_recorded(h))
			*ndevs = (int)h->ndevs;
	} else {
		/* devices by identity, whatever their names (members.c) */
		ret = members_open(cfg, h, NULL, 0, cfg->dirty_copies > 1, devs,
				   missing, err, errlen);
		*ndevs = (int)h->ndevs;
	}
	return ret;
}

int cache_open(struct cache_config *cfg, int backing_fd, struct cache **out,
	       char *err, size_t errlen)
{
	struct dev *devs[NVC_MAX_DEVS] = { 0 };
	struct pm_region mirrors[2] = { { .lock_fd = -1 }, { .lock_fd = -1 } };
	uint64_t total[2] = { 0, 0 };
	char why[2][256] = { "", "" }, *followed[2] = { NULL, NULL };
	const struct meta_hdr *h;
	int i, ret, mret[2], missing = 0, detached = 0, cur, ndevs;

	for (i = 0; i < 2; i++) {
		ret = mount_map_mirror(cfg, i, &mirrors[i], &mret[i], &total[i],
				       why[i], err, errlen);
		if (ret)
			goto err_close;
	}
	/* a mirror replaced while the configuration names the old place */
	ret = mirror_follow((const char *const *)cfg->meta_paths, mirrors, mret,
			    why, total, followed, err, errlen);
	for (i = 0; i < 2; i++)
		if (followed[i]) { /* the place the mount uses, by its name */
			free(cfg->meta_paths[i]);
			cfg->meta_paths[i] = followed[i];
		}
	if (ret)
		goto err_close;
	if (mret[0] && mret[1]) {
		snprintf(err, errlen,
			 "neither metadata mirror (%s, %s) holds a valid "
			 "nvcachefs header (%s / %s); run nvcachectl format",
			 cfg->meta_paths[0], cfg->meta_paths[1], why[0],
			 why[1]);
		ret = -ENODATA;
		goto err_close;
	}
	for (i = 0; i < 2; i++) {
		if (!mret[i])
			continue;
		pm_unmap(&mirrors[i]);
		ret = mret[i] == -ENODEV
			      ? mirror_stand_in(cfg, i, total[!i], &mirrors[i])
			      : mirror_recreate(cfg, i, why[i], total[!i],
						&mirrors[i]);
		if (ret) {
			snprintf(err, errlen,
				 "%s: cannot recreate metadata mirror: %s",
				 cfg->meta_paths[i], strerror(-ret));
			goto err_close;
		}
		/* whatever is left of it is not trusted: meta_attach copies it
		 * whole */
		memset(mirrors[i].addr, 0, META_HDR_SIZE);
	}
	/* the current header (meta_current) says what the mount opens */
	{
		const struct meta_hdr *hh[2] = { mirrors[0].addr,
						 mirrors[1].addr };
		int valid[2] = { !mret[0], !mret[1] };

		cur = meta_current(hh, valid);
		if (cur == -EUCLEAN) {
			snprintf(err, errlen,
				 "each metadata mirror says the other failed; "
				 "the cache cannot tell which one is current");
			ret = -EUCLEAN;
			goto err_close;
		}
		h = hh[cur];
	}
	ret = mount_open_members(cfg, h, devs, &ndevs, &missing, &detached,
				 err, errlen);
	if (ret)
		goto err_close;
	ret = recover_open(cfg, devs, ndevs, mirrors, backing_fd, missing,
			   detached, out, err, errlen);
	if (ret)
		goto err_close;
	if (!detached) {
		cache_note_member_names(*out);
		cache_note_tokens(*out);
	}
	if (detached)
		detach_at_mount(*out);
	else if (devlife_resume_start(*out))
		log_msg(LOG_ERR,
			"cannot resume the replace, remove or detach under "
			"way: run it again");
	(*out)->own_devs = 1;
	return 0;
err_close:
	for (i = 0; i < 2; i++)
		pm_unmap(&mirrors[i]);
	for (i = 0; i < NVC_MAX_DEVS; i++)
		dev_close(devs[i]);
	return ret;
}
