/* cache: a cache's devices by identity — which listed device is which member. */
#include "media.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

/*
 * Members.  `nvcachectl format` gives every cache device a UUID of its own
 * (sb_disk.dev_uuid) and records them, in member order, in the metadata
 * header (meta_hdr.members).  Each slot lives on one member (meta.h: the
 * layout), so a device must be used at its member index, whatever name it
 * has today:
 * loop devices and NVMe namespaces are numbered in the order they appear,
 * and that order changes between boots.  cache.devices therefore names the
 * set, not the order: at mount each device found is placed at the index its
 * superblock's UUID has in the header.
 *
 * How the devices are found (members_open, members_pick) is the essay
 * below, "Finding members".
 *
 * A header with no member table (formatted before members were recorded)
 * keeps the listed order, checked by the superblocks' dev_index as before.
 */

static int uuid_is_zero(const uint8_t u[16])
{
	static const uint8_t zero[16];

	return !memcmp(u, zero, 16);
}

int members_uuid_taken(uint8_t (*m)[16], int i)
{
	int j;

	if (uuid_is_zero(m[i]))
		return 1;
	for (j = 0; j < i; j++)
		if (!memcmp(m[j], m[i], 16))
			return 1;
	return 0;
}

const char *members_uuid_str(const uint8_t u[16], char buf[37])
{
	snprintf(buf, 37,
		 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
		 "%02x%02x%02x%02x%02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9],
		 u[10], u[11], u[12], u[13], u[14], u[15]);
	return buf;
}

int members_recorded(const struct meta_hdr *h)
{
	return !uuid_is_zero(h->members[0]);
}

/* The member index of a device's superblock UUID; -1: not a member. */
static int member_of(const struct meta_hdr *h, const uint8_t u[16])
{
	uint32_t k;

	if (uuid_is_zero(u))
		return -1;
	for (k = 0; k < h->ndevs; k++)
		if (!memcmp(h->members[k], u, 16))
			return (int)k;
	return -1;
}

/*
 * Finding members.  A member is the device whose superblock carries this
 * cache's set UUID and, as its dev_uuid, the member's UUID in the current
 * header (meta_current), at the index the header gives it; what it is called
 * today does not matter.  The candidates are every name cache.devices lists
 * (a path, any symlink to one such as /dev/disk/by-id/..., or UUID=<member
 * UUID>), then the names the header recorded where each member was last
 * found, then (for an attach) the names the devices had in this mount, and,
 * if a member is still not found, every block device of the machine
 * (/sys/class/block); one device under several names is read once.  Nothing is written to any of
 * them here: a candidate is opened (O_EXCL for a block device) and its
 * superblock read, and every one that is not a member is closed again.
 *
 *   - a former member (this cache's set UUID, a UUID no longer in the
 *     table: replaced) is logged and not used; a removed member (its UUID
 *     still in the table, removed[k]) is not used either;
 *   - two devices carrying one member's UUID are refused (one is a copy);
 *   - a member found by no candidate is missing: with two dirty copies one
 *     member may be, and the cache mounts degraded; else the mount is
 *     refused naming the member, its UUID and where it was last found;
 *   - cache.devices naming something that is not a member, or not naming a
 *     member where it was found, is logged once, with the line that names
 *     today's set.
 */

/* One candidate name, and what it held. */
struct cand {
	const char *name;
	int listed; /* from cache.devices */
	struct stat st;
	struct dev *dev; /* opened; NULL: could not be, or another's name */
	int err; /* why it was not opened */
	int peeked; /* peek_ours: 1 ours, 0 not, -1 no superblock */
	int sb_bad; /* no valid superblock */
	int k; /* member index, -1: none; -2: a former member; -3: the new
		* device of the replace under way; -4: an old copy */
};

/* The same device or file as b: by st_rdev, or st_dev and st_ino. */
static int same_node(const struct stat *a, const struct stat *b)
{
	if (S_ISBLK(a->st_mode) || S_ISBLK(b->st_mode))
		return S_ISBLK(a->st_mode) && S_ISBLK(b->st_mode) &&
		       a->st_rdev == b->st_rdev;
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

int members_parse_uuid(const char *s, uint8_t out[16])
{
	int i, n = 0;

	for (i = 0; i < 16; i++) {
		unsigned int v;

		if (*s == '-' && (i == 4 || i == 6 || i == 8 || i == 10))
			s++;
		if (sscanf(s, "%2x%n", &v, &n) != 1 || n != 2)
			return -EINVAL;
		out[i] = (uint8_t)v;
		s += 2;
	}
	return *s ? -EINVAL : 0;
}

/* The member index whose UUID a "UUID=..." entry names; -1: none. */
static int member_by_entry(const struct meta_hdr *h, const char *entry)
{
	uint8_t u[16];

	if (strncmp(entry, "UUID=", 5) || members_parse_uuid(entry + 5, u))
		return -1;
	return member_of(h, u);
}

static int cand_add(struct cand *cs, int *n, int max, const char *name,
		    int listed)
{
	struct cand *c = &cs[*n];
	int i;

	if (!name || !name[0] || cfg_is_spare(name) ||
	    !strncmp(name, "UUID=", 5) || *n >= max)
		return 0;
	memset(c, 0, sizeof(*c));
	c->name = name;
	c->listed = listed;
	c->k = -1;
	if (stat(name, &c->st)) {
		c->err = -errno;
		(*n)++;
		return 0;
	}
	for (i = 0; i < *n; i++)
		if (!cs[i].err && same_node(&cs[i].st, &c->st)) {
			cs[i].listed |= listed;
			return 0; /* another name of one already there */
		}
	(*n)++;
	return 0;
}

/*
 * 1 if name's superblock copies (read without opening it for use: no
 * O_EXCL, nothing written) name set as their cache, 0 if not, -1 if
 * neither copy is an nvcachefs superblock, -errno - 1 if it cannot be
 * opened.  Only a filter: a device that passes is opened for use (dev_open:
 * O_EXCL for a block device) and its superblock checked in full (sb_read).
 */
static int peek_ours(const char *name, const uint8_t set[16])
{
	struct sb_disk sb;
	int fd = open(name, O_RDONLY | O_CLOEXEC | O_NONBLOCK), copy, any = 0;

	if (fd < 0)
		return -errno - 1; /* below -1: why it could not be read */
	for (copy = 0; copy < SB_COPIES; copy++) {
		if (pread(fd, &sb, sizeof(sb), 4096 * (copy + 1)) !=
			    (ssize_t)sizeof(sb) ||
		    sb.magic != SB_MAGIC)
			continue;
		any = 1;
		if (!memcmp(sb.set_uuid, set, 16)) {
			close(fd);
			return 1;
		}
	}
	close(fd);
	return any ? 0 : -1;
}

/* Every block device of the machine, for members no name found. */
static int cand_scan(struct cand *cs, int *n, int max, char (*names)[64],
		     int nnames)
{
	DIR *dir = opendir("/sys/class/block");
	struct dirent *e;
	int used = 0;

	if (!dir)
		return 0;
	while ((e = readdir(dir)) && used < nnames && *n < max) {
		char p[300], size[32] = "";
		char *c;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		/* no medium (an unbound loop device, an empty drive): skip */
		snprintf(p, sizeof(p), "/sys/class/block/%s/size", e->d_name);
		f = fopen(p, "re");
		if (f) {
			if (!fgets(size, sizeof(size), f))
				size[0] = 0;
			fclose(f);
		}
		if (!strtoull(size, NULL, 10))
			continue;
		snprintf(names[used], 64, "/dev/%.58s", e->d_name);
		for (c = names[used]; *c; c++)
			if (*c == '!') /* cciss!c0d0: /dev/cciss/c0d0 */
				*c = '/';
		cand_add(cs, n, max, names[used++], 0);
	}
	closedir(dir);
	return 0;
}

int members_pick(const struct meta_hdr *h, struct dev **cand, int ncand,
		 struct dev **devs, int *kof, char *err, size_t errlen)
{
	struct sb_disk sb;
	uint32_t k;
	int i;

	for (k = 0; k < h->ndevs; k++)
		devs[k] = NULL;
	for (i = 0; i < ncand; i++) {
		kof[i] = -1;
		if (!cand[i] || sb_read(cand[i], &sb) ||
		    memcmp(sb.set_uuid, h->set_uuid, 16))
			continue;
		kof[i] = member_of(h, sb.dev_uuid);
		if (kof[i] < 0) {
			/* the replace under way's new device, or a former
			 * member */
			kof[i] = h->replacing && !memcmp(sb.dev_uuid,
							 h->replace_id.uuid, 16)
					 ? -3
					 : -2;
			continue;
		}
		k = (uint32_t)kof[i];
		if (h->tokens[k] && sb.token != h->tokens[k] &&
		    (!h->tokens_next[k] || sb.token != h->tokens_next[k])) {
			kof[i] = -4; /* a copy taken before the last mount */
			continue;
		}
		if (sb.dev_index != k) {
			snprintf(err, errlen,
				 "%s: its superblock says device %u, but the "
				 "metadata records its UUID as member %u",
				 dev_path(cand[i]), sb.dev_index + 1, k + 1);
			return -EINVAL;
		}
		if (h->removed[k])
			continue;
		if (devs[k]) {
			snprintf(err, errlen,
				 "%s and %s both carry the identity of member "
				 "%u of this cache: one is a copy of the "
				 "other; take the copy away",
				 dev_path(devs[k]), dev_path(cand[i]), k + 1);
			return -EINVAL;
		}
		devs[k] = cand[i];
	}
	return 0;
}

/* The names cache.devices should list for today's set, one line. */
void members_line(const struct meta_hdr *h, struct dev *const *devs,
		  char *out, size_t len)
{
	char uu[5 + 37] = "UUID=", *u = uu + 5;
	size_t at = 0;
	uint32_t k;

	out[0] = 0;
	for (k = 0; k < h->ndevs && at < len; k++)
		at += snprintf(out + at, len - at, "%s%s", k ? ", " : "",
			       h->removed[k] ? CFG_SPARE
			       : devs[k]     ? dev_path(devs[k])
					     : members_uuid_str(h->members[k], u) - 5);
}

/* Why member k was not found, into err. */
static void missing_why(const struct meta_hdr *h, int k, struct cand *cs,
			int n, char *err, size_t errlen)
{
	char u[37];
	const char *blank = NULL;
	struct sb_disk sb;
	int i;

	for (i = 0; i < n && !blank; i++)
		if (cs[i].listed && cs[i].sb_bad)
			blank = cs[i].name;
	for (i = 0; i < n; i++)
		if (cs[i].k == -4 && cs[i].dev && !sb_read(cs[i].dev, &sb) &&
		    !memcmp(sb.dev_uuid, h->members[k], 16)) {
			snprintf(err, errlen,
				 "%s is an old copy of member %d of %u (UUID "
				 "%s, last found at %s): its superblock's token "
				 "is not the one the last mount wrote; the "
				 "member itself is not found",
				 cs[i].name, k + 1, h->ndevs,
				 members_uuid_str(h->members[k], u),
				 h->names[k][0] ? h->names[k]
						: "no recorded name");
			return;
		}
	if (blank)
		snprintf(err, errlen,
			 "%s has no nvcachefs superblock (blank or "
			 "overwritten?), and member %d of %u (UUID %s, last "
			 "found at %s) is nowhere else: run nvcachectl format "
			 "to start anew, or list the member's device",
			 blank, k + 1, h->ndevs, members_uuid_str(h->members[k], u),
			 h->names[k][0] ? h->names[k] : "no recorded name");
	else
		snprintf(err, errlen,
			 "member %d of %u of this cache (UUID %s, last found "
			 "at %s) is not among the devices found: name it in "
			 "cache.devices (any name of it, or UUID=%s)",
			 k + 1, h->ndevs, members_uuid_str(h->members[k], u),
			 h->names[k][0] ? h->names[k] : "no recorded name", u);
}

/* The log line saying that cache.devices does not name today's set. */
static void log_stale_config(const struct cache_config *cfg,
			     const struct meta_hdr *h, struct dev **devs,
			     struct cand *cs, int n)
{
	char line[NVC_MAX_DEVS * (META_NAME_LEN + 2)];
	int i, stale = 0;
	uint32_t k;

	for (i = 0; i < n; i++)
		stale |= cs[i].listed && (cs[i].k < 0 || !cs[i].dev);
	for (k = 0; k < h->ndevs; k++) {
		int listed = h->removed[k] || !devs[k];

		for (i = 0; i < n && !listed; i++)
			listed = cs[i].dev == devs[k] && cs[i].listed;
		for (i = 0; i < cfg->ndevs && !listed; i++)
			listed = member_by_entry(h, cfg->dev_paths[i]) == (int)k;
		stale |= !listed;
	}
	if (!stale)
		return;
	members_line(h, devs, line, sizeof(line));
	for (i = 0; i < n; i++)
		if (cs[i].listed && cs[i].k == -1)
			log_msg(LOG_NOTICE,
				"cache.devices: %s holds no member of this "
				"cache (%s): not used",
				cs[i].name,
				cs[i].err    ? strerror(-cs[i].err)
				: cs[i].sb_bad ? "no nvcachefs superblock"
					       : "another cache's superblock");
	log_msg(LOG_NOTICE,
		"cache.devices is out of date: the members were found by "
		"their UUIDs; the line naming today's set is: devices = %s",
		line);
}

/* 1 if d is one of the candidates (opened by name), not a stand-in. */
static int is_candidate(const struct dev *d, const struct cand *cs, int n)
{
	int i;

	for (i = 0; i < n; i++)
		if (cs[i].dev == d)
			return 1;
	return 0;
}

/* Each candidate not looked at yet read without being opened for use
 * (peek_ours); only those holding this cache's superblock opened; cd[i]
 * each one's device or NULL.  -EBUSY with err set when one is in use. */
static int cands_open(const struct meta_hdr *h, struct cand *cs, int n,
		      struct dev **cd, char *err, size_t errlen)
{
	int i;

	for (i = 0; i < n; i++) {
		cd[i] = cs[i].dev;
		if (cs[i].dev || cs[i].err || cs[i].peeked)
			continue;
		cs[i].peeked = peek_ours(cs[i].name, h->set_uuid);
		if (cs[i].peeked < -1)
			cs[i].err = cs[i].peeked + 1;
		if (cs[i].peeked < 1) {
			cs[i].sb_bad = cs[i].peeked == -1;
			continue;
		}
		cs[i].err = dev_open(cs[i].name, &cs[i].dev);
		if (cs[i].err == -EBUSY) {
			/* this cache's superblock, held by someone: the
			 * cache is mounted, or being checked */
			snprintf(err, errlen,
				 "%s: cannot open cache device: in use "
				 "(mounted, or by another nvcachefs)",
				 cs[i].name);
			return -EBUSY;
		}
		if (cs[i].err)
			cs[i].dev = NULL;
		cd[i] = cs[i].dev;
	}
	return 0;
}

/* The log says which member was found where, and what the other
 * candidates were. */
static void log_found(const struct meta_hdr *h, struct dev **devs,
		      const struct cand *cs, int n)
{
	uint32_t k;
	int i;

	for (k = 0; k < h->ndevs; k++)
		if (devs[k] && h->names[k][0] &&
		    strcmp(dev_path(devs[k]), h->names[k]))
			log_msg(LOG_NOTICE,
				"%s is member %u of %u of this cache (last found "
				"at %s): taken by its identity",
				dev_path(devs[k]), k + 1, h->ndevs, h->names[k]);
	for (i = 0; i < n; i++)
		if (cs[i].k == -4)
			log_msg(LOG_WARNING,
				"%s carries the UUID of a member of this cache "
				"but is an old copy of it (its superblock's "
				"token is not the one the last mount wrote): "
				"not used",
				cs[i].name);
	for (i = 0; i < n; i++)
		if (cs[i].k == -3)
			log_msg(LOG_NOTICE,
				"%s is the new device of the replace under way "
				"(of member %u): not a member yet",
				cs[i].name, h->replacing);
	for (i = 0; i < n; i++)
		if (cs[i].k == -2)
			log_msg(LOG_NOTICE,
				"%s is a former member of this cache (replaced "
				"or removed): not used",
				cs[i].name);
}

/* A stand-in for each member not found (mounting degraded) or removed,
 * named where the member was last found unless another member is there
 * now.  0, or -errno. */
static int standins_missing(const struct meta_hdr *h, struct dev **devs)
{
	char u[37];
	uint32_t k;
	int ret = 0;

	for (k = 0; k < h->ndevs && !ret; k++) {
		char uu[5 + 37] = "UUID=";
		const char *name = h->names[k][0] ? h->names[k] : CFG_SPARE;
		uint32_t j;

		if (devs[k])
			continue;
		/* a missing member's stand-in is named where it was last
		 * found, unless another member is there now */
		for (j = 0; j < h->ndevs && !h->removed[k]; j++)
			if (devs[j] && !strcmp(dev_path(devs[j]), name))
				name = members_uuid_str(h->members[k], uu + 5) - 5;
		if (!h->removed[k]) {
			log_msg(LOG_CRIT,
				"member %u of %u (UUID %s, last found at %s) "
				"is not found: mounting degraded, from the "
				"second copies",
				k + 1, h->ndevs,
				members_uuid_str(h->members[k], u),
				h->names[k][0] ? h->names[k]
					       : "no recorded name");
		}
		ret = dev_missing_create(name, UINT64_MAX, &devs[k]);
	}
	return ret;
}

int members_open(const struct cache_config *cfg, const struct meta_hdr *h,
		 const char *const *extra, int nextra, int allow_missing,
		 struct dev **devs, int *missing, char *err, size_t errlen)
{
	enum { NSCAN = 1024, MAXC = 3 * NVC_MAX_DEVS + NSCAN };
	struct work {
		struct cand cs[MAXC];
		struct dev *cd[MAXC];
		char scanned[NSCAN][64];
		int kof[MAXC];
	} *w = calloc(1, sizeof(*w));
	struct cand *cs;
	struct dev **cd;
	int n = 0, i, ret = 0, nmiss = 0, want_scan = 0, *kof;
	uint32_t k;

	*missing = 0;
	if (!w) {
		snprintf(err, errlen, "cannot look for the cache devices: %s",
			 strerror(ENOMEM));
		return -ENOMEM;
	}
	cs = w->cs;
	cd = w->cd;
	kof = w->kof;
	for (i = 0; i < cfg->ndevs; i++)
		cand_add(cs, &n, MAXC, cfg->dev_paths[i], 1);
	for (k = 0; k < h->ndevs; k++)
		cand_add(cs, &n, MAXC, h->names[k], 0);
	for (i = 0; i < nextra; i++)
		cand_add(cs, &n, MAXC, extra[i], 0);
again:
	ret = cands_open(h, cs, n, cd, err, errlen);
	if (ret)
		goto out_close;
	ret = members_pick(h, cd, n, devs, kof, err, errlen);
	if (ret)
		goto out_close;
	for (i = 0; i < n; i++) {
		struct sb_disk sb;

		cs[i].k = kof[i];
		if (cs[i].dev && kof[i] == -1 && sb_read(cs[i].dev, &sb))
			cs[i].sb_bad = 1;
	}
	/* a member no name found: every block device of the machine is a
	 * candidate (read only, as mdadm --assemble --scan does) */
	for (k = 0; k < h->ndevs && !want_scan; k++)
		want_scan = !devs[k] && !h->removed[k];
	if (want_scan == 1) {
		want_scan = 2; /* once */
		cand_scan(cs, &n, MAXC, w->scanned, NSCAN);
		goto again;
	}
	for (k = 0; k < h->ndevs; k++) {
		if (devs[k] || h->removed[k])
			continue;
		if (nmiss++ >= allow_missing) {
			missing_why(h, (int)k, cs, n, err, errlen);
			ret = -ENODEV;
			goto out_close;
		}
		if (!*missing)
			*missing = (int)k + 1;
	}
	log_found(h, devs, cs, n);
	log_stale_config(cfg, h, devs, cs, n);
	ret = standins_missing(h, devs);
	if (ret) {
		snprintf(err, errlen, "cannot open the cache: %s",
			 strerror(-ret));
		for (k = 0; k < h->ndevs; k++)
			if (devs[k] && !is_candidate(devs[k], cs, n))
				dev_close(devs[k]);
	}
out_close:
	for (i = 0; i < n; i++) {
		int kept = 0;

		for (k = 0; k < h->ndevs && !ret; k++)
			kept |= devs[k] == cs[i].dev;
		if (!kept)
			dev_close(cs[i].dev);
	}
	if (ret)
		for (k = 0; k < h->ndevs; k++)
			devs[k] = NULL;
	free(w);
	return ret;
}

int members_stable_name(const char *name, char *out, size_t len,
			uint64_t *rdev)
{
	static const char byid[] = "/dev/disk/by-id";
	struct stat st, o;
	size_t n = strlen(name);
	struct dirent *e;
	DIR *dir;

	*rdev = 0;
	if (n >= len)
		return -ENAMETOOLONG;
	memcpy(out, name, n + 1);
	if (stat(name, &st))
		return -errno;
	if (!S_ISBLK(st.st_mode))
		return 0;
	*rdev = st.st_rdev;
	dir = opendir(byid);
	if (!dir)
		return 0;
	while ((e = readdir(dir))) {
		char p[sizeof(byid) + 256];

		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "%s/%s", byid, e->d_name);
		if (!stat(p, &o) && S_ISBLK(o.st_mode) &&
		    o.st_rdev == st.st_rdev && strlen(p) < len) {
			snprintf(out, len, "%s", p);
			break;
		}
	}
	closedir(dir);
	return 0;
}
