/* cache: nvcachectl format — superblocks on every device, empty mirrors,
 * refusing devices in use. */
#define _GNU_SOURCE
#include "media.h"

#include <blkid/blkid.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t slots_per_dev(const struct cache_config *cfg, struct dev **devs,
			      int ndev)
{
	uint64_t min = UINT64_MAX;
	int i;

	for (i = 0; i < ndev; i++) {
		uint64_t sz = devs[i] ? dev_size(devs[i]) : UINT64_MAX;
		uint64_t n = sz > SB_DATA_OFF
				     ? (sz - SB_DATA_OFF) / cfg->block_size
				     : 0;

		if (n < min)
			min = n;
	}
	return min;
}

/* slot ids are 32 bits, the list heads' included (engine.h) */
#define FMT_MAX_ROOM 0xffffff00ull

static uint32_t nfiles_for(const struct cache_config *cfg, uint64_t nslots)
{
	return nslots < cfg->max_files ? (uint32_t)nslots
				       : (uint32_t)cfg->max_files;
}

/* The slot entries the mirrors keep room for (grow.c): cache.max_capacity's
 * worth, or twice nslots; never fewer than nslots, and slot ids stay
 * 32 bits (engine.h). */
static uint64_t room_for(const struct cache_config *cfg, uint64_t nslots)
{
	uint64_t room = cfg->max_capacity ? cfg->max_capacity / cfg->block_size
					  : 2 * nslots;

	if (room < nslots)
		room = nslots;
	if (room > FMT_MAX_ROOM)
		room = nslots > FMT_MAX_ROOM ? nslots : FMT_MAX_ROOM;
	return room;
}

uint64_t fmt_meta_len(const struct cache_config *cfg, struct dev **devs,
		      int ndev)
{
	uint64_t nslots = slots_per_dev(cfg, devs, ndev) * ndev;

	return meta_total_len(room_for(cfg, nslots), nfiles_for(cfg, nslots),
			      cfg->block_size);
}

int fmt_format_open(const struct cache_config *cfg, struct dev **devs, int ndev,
		    struct pm_region mirrors[2], char *err, size_t errlen)
{
	uint64_t per = slots_per_dev(cfg, devs, ndev);
	uint64_t nslots = per * ndev, len, room = room_for(cfg, nslots);
	uint32_t nfiles = nfiles_for(cfg, nslots);
	uint8_t uuid[16], members[NVC_MAX_DEVS][16] = { { 0 } };
	struct sb_disk sb;
	int i, k, ret;

	if (per < 4) {
		snprintf(
			err, errlen,
			"cache devices are too small: need at least %llu bytes "
			"each for block size %llu",
			(unsigned long long)(SB_DATA_OFF + 4 * cfg->block_size),
			(unsigned long long)cfg->block_size);
		return -ENOSPC;
	}
	len = meta_total_len(room, nfiles, cfg->block_size);
	for (i = 0; i < 2; i++)
		if (mirrors[i].len < len) {
			snprintf(err, errlen,
				 "metadata mirror %s is too small: %zu bytes, "
				 "need %llu",
				 cfg->meta_paths[i] ? cfg->meta_paths[i] : "?",
				 mirrors[i].len, (unsigned long long)len);
			return -ENOSPC;
		}
	if (getrandom(uuid, sizeof(uuid), 0) != sizeof(uuid))
		return -errno;
	/* each device's own identity, recorded in the header (members.c) */
	for (i = 0; i < ndev; i++) {
		do {
			if (getrandom(members[i], 16, 0) != 16)
				return -errno;
		} while (members_uuid_taken(members, i));
	}

	/* Mirrors first: a half-formatted cache then fails its superblock
	 * check. */
	for (i = 0; i < 2; i++) {
		struct meta_hdr h;

		memset(mirrors[i].addr, 0, len);
		meta_init_hdr(&h, uuid, i, cfg->block_size, nslots, room,
			      nfiles, ndev);
		memcpy(h.members, members, sizeof(h.members));
		for (k = 0; k < ndev; k++) {
			h.removed[k] = !devs[k]; /* a spare place */
			/* where the next mount looks first (members.c) */
			if (devs[k] &&
			    members_stable_name(dev_path(devs[k]), h.names[k],
						META_NAME_LEN, &h.rdevs[k])) {
				memset(h.names[k], 0, META_NAME_LEN);
				h.rdevs[k] = 0;
			}
		}
		h.csum = meta_csum(&h, offsetof(struct meta_hdr, csum));
		memcpy(mirrors[i].addr, &h, sizeof(h));
		ret = pm_persist(&mirrors[i], mirrors[i].addr, len);
		if (ret) {
			snprintf(err, errlen,
				 "cannot persist metadata mirror %d: %s", i,
				 strerror(-ret));
			return ret;
		}
	}
	for (i = 0; i < ndev; i++) {
		if (!devs[i])
			continue; /* a spare place: nvcachectl add fills it */
		memset(&sb, 0, sizeof(sb));
		sb.magic = SB_MAGIC;
		sb.version = SB_VERSION;
		sb.sb_size = sizeof(sb);
		memcpy(sb.set_uuid, uuid, 16);
		sb.dev_index = i;
		sb.ndevs = ndev;
		sb.block_size = cfg->block_size;
		sb.dev_size = dev_size(devs[i]);
		sb.data_off = SB_DATA_OFF;
		sb.slots_per_dev = per;
		sb.format_time = time(NULL);
		memcpy(sb.dev_uuid, members[i], 16);
		ret = sb_write(devs[i], &sb);
		if (ret) {
			snprintf(err, errlen, "%s: cannot write superblock: %s",
				 dev_path(devs[i]), strerror(-ret));
			return ret;
		}
	}
	return 0;
}

/* Refuse a device that holds anything we can recognise, unless forced. */
#define FMT_REFUSAL "refusing to format it (use --force to overwrite)"

/* What libblkid finds in pr (set up on path), said in err; the probe freed. */
static int probe_run(blkid_probe pr, const char *path, const char *refusal,
		     char *err, size_t errlen)
{
	const char *type = NULL;
	int ret;

	blkid_probe_enable_superblocks(pr, 1);
	blkid_probe_set_superblocks_flags(pr, BLKID_SUBLKS_TYPE);
	blkid_probe_enable_partitions(pr, 1);
	blkid_probe_set_partitions_flags(pr, BLKID_PARTS_ENTRY_DETAILS);
	ret = blkid_do_safeprobe(pr);
	if (ret == 0) {
		if (blkid_probe_lookup_value(pr, "TYPE", &type, NULL) &&
		    blkid_probe_lookup_value(pr, "PTTYPE", &type, NULL))
			type = "unknown";
		snprintf(err, errlen, "%s holds a %s signature; %s", path, type,
			 refusal);
		ret = -EEXIST;
	} else if (ret == -2) {
		snprintf(err, errlen, "%s holds several signatures; %s", path,
			 refusal);
		ret = -EEXIST;
	} else {
		ret = 0;
	}
	blkid_free_probe(pr);
	return ret;
}

int fmt_probe_in_use(const char *path, const char *refusal, char *err,
		     size_t errlen)
{
	blkid_probe pr = blkid_new_probe_from_filename(path);

	if (!pr) {
		snprintf(err, errlen, "%s: cannot probe for signatures: %s",
			 path, strerror(errno));
		return -errno ? -errno : -EIO;
	}
	return probe_run(pr, path, refusal, err, errlen);
}

int fmt_probe_head(int fd, uint64_t len, const char *path, const char *refusal,
		   char *err, size_t errlen)
{
	blkid_probe pr = blkid_new_probe();

	if (!pr || blkid_probe_set_device(pr, fd, 0, len)) {
		snprintf(err, errlen, "%s: cannot probe for signatures", path);
		if (pr)
			blkid_free_probe(pr);
		return -EIO;
	}
	return probe_run(pr, path, refusal, err, errlen);
}

/* A mirror's place, opened by pm_open_place (no link followed, checked by
 * its descriptor), holds no cache's metadata (unless forced) and nothing
 * else a block device could hold. */
static int check_mirror_file(const char *path, int force, char *err,
			     size_t errlen)
{
	struct meta_hdr h;
	struct stat st;
	int fd, rfd, created, ret;
	ssize_t n;

	fd = pm_open_place(path, 0, &st, &created, err, errlen);
	if (fd == -ENOENT)
		return 0;
	if (fd < 0) {
		if (!err[0])
			snprintf(err, errlen, "%s: %s", path, strerror(-fd));
		return fd;
	}
	ret = 0;
	if (force || S_ISCHR(st.st_mode))
		goto out_close;
	if (S_ISBLK(st.st_mode)) {
		ret = fmt_probe_in_use(path, FMT_REFUSAL, err, errlen);
		if (ret)
			goto out_close;
	}
	rfd = pm_reopen(fd, O_RDONLY);
	if (rfd < 0) {
		ret = rfd;
		snprintf(err, errlen, "%s: %s", path, strerror(-ret));
		goto out_close;
	}
	n = pread(rfd, &h, sizeof(h), 0);
	close(rfd);
	if (n == sizeof(h) && h.magic == META_MAGIC) {
		snprintf(err, errlen,
			 "%s holds nvcachefs metadata of a cache; refusing to "
			 "format it (use --force to overwrite)",
			 path);
		ret = -EEXIST;
	}
out_close:
	close(fd);
	return ret;
}

int fmt_format(const struct cache_config *cfg, struct fmt_opts *o)
{
	struct dev *devs[NVC_MAX_DEVS] = { 0 };
	struct pm_region mirrors[2] = { { .lock_fd = -1 }, { .lock_fd = -1 } };
	struct sb_disk sb;
	struct stat st;
	uint64_t len;
	int i, ret = 0;

	o->err[0] = 0;
	for (i = 0; i < cfg->ndevs; i++) {
		const char *p = cfg->dev_paths[i];

		if (cfg_is_spare(p))
			continue; /* devs[i] stays NULL */
		if (stat(p, &st)) {
			snprintf(o->err, sizeof(o->err), "%s: %s", p,
				 strerror(errno));
			ret = -errno;
			goto out_devs;
		}
		if (!S_ISBLK(st.st_mode) && !S_ISREG(st.st_mode)) {
			snprintf(o->err, sizeof(o->err),
				 "%s: not a block device or regular file", p);
			ret = -ENODEV;
			goto out_devs;
		}
		if (!o->force) {
			ret = fmt_probe_in_use(p, FMT_REFUSAL, o->err,
					       sizeof(o->err));
			if (ret)
				goto out_devs;
		}
		ret = dev_open(p, &devs[i]);
		if (ret) {
			snprintf(o->err, sizeof(o->err), "%s: cannot open: %s",
				 p,
				 ret == -EBUSY ? "in use (mounted, or by a "
						 "running nvcachefs)"
					       : strerror(-ret));
			goto out_devs;
		}
		if (!o->force && !sb_read(devs[i], &sb)) {
			snprintf(o->err, sizeof(o->err),
				 "%s holds the superblock of an nvcachefs "
				 "cache; "
				 "refusing to format it (use --force to "
				 "overwrite)",
				 p);
			ret = -EEXIST;
			goto out_devs;
		}
	}
	for (i = 0; i < 2; i++) {
		ret = check_mirror_file(cfg->meta_paths[i], o->force, o->err,
					sizeof(o->err));
		if (ret)
			goto out_devs;
	}
	len = fmt_meta_len(cfg, devs, cfg->ndevs);
	for (i = 0; i < 2; i++) {
		ret = pm_map_err(cfg->meta_paths[i], len, PM_CREATE,
				 &mirrors[i], o->err, sizeof(o->err));
		if (ret) {
			if (!o->err[0])
				snprintf(o->err, sizeof(o->err),
					 "%s: cannot create metadata mirror "
					 "of %llu bytes: %s",
					 cfg->meta_paths[i],
					 (unsigned long long)len,
					 ret == -EBUSY ? "in use by a running "
							 "nvcachefs"
						       : strerror(-ret));
			goto out_mirrors;
		}
	}
	ret = fmt_format_open(cfg, devs, cfg->ndevs, mirrors, o->err,
			      sizeof(o->err));
	if (!ret) {
		uint64_t nslots = slots_per_dev(cfg, devs, cfg->ndevs) *
				  cfg->ndevs;

		o->capacity = nslots * cfg->block_size;
		o->max_capacity = room_for(cfg, nslots) * cfg->block_size;
	}
out_mirrors:
	for (i = 0; i < 2; i++) {
		pm_unmap(&mirrors[i]);
		if (ret) /* a format that failed leaves no new file */
			pm_unlink_created(&mirrors[i], cfg->meta_paths[i]);
	}
out_devs:
	for (i = 0; i < cfg->ndevs; i++)
		dev_close(devs[i]);
	return ret;
}
