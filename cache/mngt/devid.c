/* cache: devices and mirror places known by what they are, not by their names: the checks before a device-life command writes anywhere. */
#define _GNU_SOURCE
#include "mngt.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/*
 * Names change (/dev/loopN and /dev/sdX between boots; /dev/disk/by-id/...
 * links point elsewhere after a swap), so a device or file is compared by
 * what it is: a block device by st_rdev, a regular file by st_dev and
 * st_ino (a hard link or another name of it is the same file), a loop
 * device also by its backing file.  Before a device-life command writes to
 * a device or place, it is either new (devid_new_dev, devid_new_place:
 * nothing there that anyone could need) or proven to be the one a replace
 * cut short recorded (devid_prove_dev, devid_prove_place): the identity
 * written to it as the replace's first step, at the same st_rdev or file,
 * of the same size.  What cannot be proven is left alone, and said.
 */

#define REFUSAL "refusing to use it"

/* A mirror place claimed by a mirror replace before its copy (its first
 * bytes, until the copy's header lands there): "NVCCLAIM". */
#define CLAIM_MAGIC 0x4d49414c4343564eull

struct claim_disk {
	uint64_t magic;
	uint8_t set_uuid[16];
	uint8_t uuid[16];
	uint64_t csum;
};

int devlife_stopping(struct cache *c)
{
	return __atomic_load_n(&c->stopping, __ATOMIC_ACQUIRE) ||
	       __atomic_load_n(&c->devlife_stop, __ATOMIC_ACQUIRE);
}

void cache_devlife_stop(struct cache *c)
{
	__atomic_store_n(&c->devlife_stop, 1, __ATOMIC_RELEASE);
}

/* What a block device or file is: the device number or the file, and for a
 * loop device the file behind it. */
struct thing {
	int blk, reg;
	dev_t rdev, dev, back_dev;
	ino_t ino, back_ino;
};

/* The file behind loop device rdev, if it is one. */
static void loop_backing(struct thing *t)
{
	char p[96], file[4096];
	struct stat st;
	ssize_t n;
	int fd;

	snprintf(p, sizeof(p), "/sys/dev/block/%u:%u/loop/backing_file",
		 major(t->rdev), minor(t->rdev));
	fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, file, sizeof(file) - 1);
	close(fd);
	if (n <= 0)
		return;
	file[n] = 0;
	file[strcspn(file, "\n")] = 0;
	if (!stat(file, &st) && S_ISREG(st.st_mode)) {
		t->back_dev = st.st_dev;
		t->back_ino = st.st_ino;
	}
}

static int thing_of(const struct stat *st, struct thing *t)
{
	memset(t, 0, sizeof(*t));
	t->blk = S_ISBLK(st->st_mode);
	t->reg = S_ISREG(st->st_mode);
	t->rdev = st->st_rdev;
	t->dev = st->st_dev;
	t->ino = st->st_ino;
	if (t->blk)
		loop_backing(t);
	return t->blk || t->reg;
}

static int thing_named(const char *name, struct thing *t)
{
	struct stat st;

	return name && name[0] && !cfg_is_spare(name) && !stat(name, &st) &&
	       thing_of(&st, t);
}

static int file_is(const struct thing *t, dev_t dev, ino_t ino)
{
	return t->reg ? t->dev == dev && t->ino == ino
		      : t->blk && t->back_ino && t->back_dev == dev &&
				t->back_ino == ino;
}

static int same_thing(const struct thing *a, const struct thing *b)
{
	if (a->blk && b->blk && a->rdev == b->rdev)
		return 1;
	if (b->reg)
		return file_is(a, b->dev, b->ino);
	if (a->reg)
		return file_is(b, a->dev, a->ino);
	return a->back_ino && a->back_dev == b->back_dev &&
	       a->back_ino == b->back_ino; /* two loop devices on one file */
}

/* t is member d's open device (0: not, or d has none open). */
static int is_member_dev(struct cache *c, int d, const struct thing *t)
{
	struct thing m;
	struct stat st;

	return !dev_stat(c->devs[d], &st) && thing_of(&st, &m) &&
	       same_thing(&m, t);
}

/* t is this cache's: a member's device, what a name a member (not removed)
 * has or was listed by names now, or a metadata mirror (not the names members were
 * last found at: after a renumbering they may name a new device); place:
 * judged as a mirror's new place.  0, or -EINVAL with err set. */
static int of_this_cache(struct cache *c, const char *path,
			 const struct thing *t, int place, char *err,
			 size_t errlen)
{
	uint8_t removed[NVC_MAX_DEVS];
	struct thing o;
	struct stat st;
	int d, k;

	meta_removed(&c->meta, removed);
	for (d = 0; d < c->ndevs; d++) {
		const char *as = NULL;

		if (removed[d])
			continue; /* its place holds nothing: its names are free */
		if (is_member_dev(c, d, t))
			as = dev_path(c->devs[d]);
		else if (thing_named(dev_path(c->devs[d]), &o) &&
			 same_thing(&o, t))
			as = dev_path(c->devs[d]);
		else if (thing_named(cache_listed_name(c, d), &o) &&
			 same_thing(&o, t))
			as = cache_listed_name(c, d);
		if (as) {
			snprintf(err, errlen,
				 "%s is a %sdevice of this cache (member %d, "
				 "as %s)",
				 path, place ? "cache " : "", d + 1, as);
			return -EINVAL;
		}
	}
	for (k = 0; k < 2; k++) {
		const struct pm_region *r = &c->meta.r[k];
		int hit = thing_named(c->cfg->meta_paths[k], &o) &&
			  same_thing(&o, t);

		if (!hit && r->bdev && !dev_stat(r->bdev, &st) &&
		    thing_of(&st, &o))
			hit = same_thing(&o, t);
		else if (!hit && !r->bdev && !r->missing && !r->is_mem &&
			 r->created_ino)
			hit = file_is(t, r->created_dev, r->created_ino);
		if (hit) {
			snprintf(err, errlen,
				 "%s is a metadata mirror of this cache "
				 "(mirror %d, %s)",
				 path, k, c->cfg->meta_paths[k]);
			return -EINVAL;
		}
	}
	return 0;
}

static int parse_uuid(const char *s, uint8_t u[16])
{
	int i, hi;

	for (i = 0; i < 16; i++) {
		if (*s == '-')
			s++;
		if (sscanf(s, "%2x", &hi) != 1 || !s[0] || !s[1] ||
		    !strchr("0123456789abcdefABCDEF", s[0]) ||
		    !strchr("0123456789abcdefABCDEF", s[1]))
			return -EINVAL;
		u[i] = (uint8_t)hi;
		s += 2;
	}
	return *s ? -EINVAL : 0;
}

int devid_member(struct cache *c, const char *name)
{
	uint8_t members[NVC_MAX_DEVS][16], u[16];
	static const uint8_t zero[16];
	struct thing t;
	struct stat st;
	int k, named;

	if (!strncmp(name, "UUID=", 5)) {
		if (parse_uuid(name + 5, u) || !memcmp(u, zero, 16))
			return c->ndevs;
		meta_members(&c->meta, members);
		for (k = 0; k < c->ndevs && memcmp(members[k], u, 16); k++)
			;
		return k;
	}
	/* what the name is now, against each member's open device */
	named = thing_named(name, &t);
	for (k = 0; named && k < c->ndevs; k++)
		if (is_member_dev(c, k, &t))
			return k;
	/* a member with no device open (missing, removed) by its name; one
	 * whose device is open only by what the name is, if it is anything */
	for (k = 0; k < c->ndevs; k++)
		if ((!named || dev_stat(c->devs[k], &st)) &&
		    (!strcmp(dev_path(c->devs[k]), name) ||
		     !strcmp(cache_listed_name(c, k), name)))
			return k;
	return k;
}

static int is_zero(const void *p, size_t n)
{
	const uint8_t *b = p;

	return !n || (!b[0] && !memcmp(b, b + 1, n - 1));
}

static int claim_ok(const struct claim_disk *cl)
{
	return cl->magic == CLAIM_MAGIC &&
	       cl->csum == meta_csum(cl, offsetof(struct claim_disk, csum));
}

static int hdr_valid(const struct meta_hdr *h)
{
	return h->magic == META_MAGIC &&
	       h->csum == meta_csum(h, offsetof(struct meta_hdr, csum));
}

/* What the first 4 KiB (head) of path say against it being used: a mirror
 * header or a claim of any cache (not a claim of this cache's other than
 * the mirror replace's under way; for a mirror place (place), not a place
 * of this cache that a mirror replace let go, whose header points to its
 * successor).  0, or -EEXIST with err set. */
static int head_refused(struct cache *c, const char *path, const void *head,
			int place, char *err, size_t errlen)
{
	const struct claim_disk *cl = head;
	const struct meta_hdr *h = head;
	struct meta_ident mid;
	char u[37];
	int mine;

	if (hdr_valid(h)) {
		mine = !memcmp(h->set_uuid, c->meta.set_uuid, 16);
		if (place && mine && h->mirror < 2 &&
		    h->mirror_replacing == h->mirror + 1 && h->mirror_path[0])
			return 0; /* a place of ours replaced (mirror.c) */
		snprintf(err, errlen,
			 "%s holds a metadata mirror of nvcachefs cache %s%s; "
			 "%s (to reuse it, zero its first 4 KiB: wipefs does "
			 "not know nvcachefs)",
			 path, members_uuid_str(h->set_uuid, u),
			 mine ? " (this cache)" : " (another cache)", REFUSAL);
		return -EEXIST;
	}
	if (!claim_ok(cl))
		return 0;
	meta_mirror_id(&c->meta, &mid);
	mine = !memcmp(cl->set_uuid, c->meta.set_uuid, 16);
	if (mine && memcmp(cl->uuid, mid.uuid, 16))
		return 0; /* a mirror replace of ours that is over */
	snprintf(err, errlen,
		 "%s is the new place of a mirror replace under way in "
		 "nvcachefs cache %s%s; %s",
		 path, members_uuid_str(cl->set_uuid, u),
		 mine ? " (this cache)" : " (another cache)", REFUSAL);
	return -EEXIST;
}

/* A superblock on nd that it must not lose: another cache's, or a member's
 * of this one (a copy of it).  A former or removed member of this cache
 * holds nothing the cache needs.  0, or -EEXIST with err set. */
static int sb_refused(struct cache *c, struct dev *nd, const char *path,
		      char *err, size_t errlen)
{
	uint8_t members[NVC_MAX_DEVS][16], removed[NVC_MAX_DEVS];
	struct sb_disk sb;
	char u[37], v[37];
	int k;

	if (sb_read(nd, &sb))
		return 0;
	if (memcmp(sb.set_uuid, c->meta.set_uuid, 16)) {
		snprintf(err, errlen,
			 "%s holds the superblock of member %u (UUID %s) of "
			 "another nvcachefs cache, %s: its data would be lost; "
			 "%s (if that cache is gone for good, zero its first "
			 "MiB first)",
			 path, sb.dev_index + 1,
			 members_uuid_str(sb.dev_uuid, v),
			 members_uuid_str(sb.set_uuid, u), REFUSAL);
		return -EEXIST;
	}
	meta_members(&c->meta, members);
	meta_removed(&c->meta, removed);
	for (k = 0; k < c->ndevs; k++)
		if (!removed[k] && !memcmp(members[k], sb.dev_uuid, 16)) {
			snprintf(err, errlen,
				 "%s carries the identity of member %d of this "
				 "cache (UUID %s: a copy of it?); %s",
				 path, k + 1, members_uuid_str(sb.dev_uuid, u),
				 REFUSAL);
			return -EEXIST;
		}
	return 0;
}

/* The checks of what nd holds (opened on path); place: for a mirror. */
static int content_refused(struct cache *c, struct dev *nd, const char *path,
			   int place, char *err, size_t errlen)
{
	void *head = dev_alloc_buf(META_HDR_SIZE);
	int ret;

	if (!head)
		return -ENOMEM;
	ret = dev_read(nd, head, META_HDR_SIZE, 0);
	if (ret)
		snprintf(err, errlen, "%s: cannot read it: %s", path,
			 strerror(-ret));
	else
		ret = head_refused(c, path, head, place, err, errlen);
	free(head);
	return ret ? ret : sb_refused(c, nd, path, err, errlen);
}

static int open_err(const char *path, int ret, char *err, size_t errlen)
{
	snprintf(err, errlen, "%s: cannot open it: %s", path,
		 ret == -EBUSY ? "in use" : strerror(-ret));
	return ret;
}

/* path by name, judged: a block device or file, not this cache's. */
static int judge_name(struct cache *c, const char *path, struct thing *t,
		      char *err, size_t errlen)
{
	struct stat st;

	if (stat(path, &st))
		return open_err(path, -errno, err, errlen);
	if (!thing_of(&st, t)) {
		snprintf(err, errlen,
			 "%s is not a block device or regular file", path);
		return -ENODEV;
	}
	return of_this_cache(c, path, t, 0, err, errlen);
}

/* nd, opened on path, is still what t was judged (no name changed
 * meanwhile). */
static int still_same(struct dev *nd, const char *path, const struct thing *t,
		      char *err, size_t errlen)
{
	struct thing o;
	struct stat st;

	if (!dev_stat(nd, &st) && thing_of(&st, &o) && same_thing(&o, t))
		return 0;
	snprintf(err, errlen, "%s changed while it was checked", path);
	return -EAGAIN;
}

/* path opened into *out, and still what t was judged; 0, or -errno with
 * err set and nothing left open. */
static int open_judged(const char *path, const struct thing *t,
		       struct dev **out, char *err, size_t errlen)
{
	int ret = dev_open(path, out);

	if (ret)
		return open_err(path, ret, err, errlen);
	ret = still_same(*out, path, t, err, errlen);
	if (ret) {
		dev_close(*out);
		*out = NULL;
	}
	return ret;
}

static int big_enough(struct dev *nd, const char *path, uint64_t need,
		      char *err, size_t errlen)
{
	if (dev_size(nd) >= need)
		return 0;
	snprintf(err, errlen,
		 "%s is too small: %llu bytes, its place in this cache needs "
		 "%llu",
		 path, (unsigned long long)dev_size(nd),
		 (unsigned long long)need);
	return -ENOSPC;
}

int devid_new_dev(struct cache *c, const char *path, uint64_t min_slots,
		  struct dev **out, char *err, size_t errlen)
{
	uint64_t need = SB_DATA_OFF + min_slots * (uint64_t)c->bs;
	struct thing t;
	int ret = judge_name(c, path, &t, err, errlen);

	if (ret)
		return ret;
	ret = fmt_probe_in_use(path, REFUSAL " (wipefs -a it first)", err,
			       errlen);
	if (ret)
		return ret;
	ret = open_judged(path, &t, out, err, errlen);
	if (ret)
		return ret;
	ret = big_enough(*out, path, need, err, errlen);
	if (!ret)
		ret = content_refused(c, *out, path, 0, err, errlen);
	if (ret) {
		dev_close(*out);
		*out = NULL;
	}
	return ret;
}

int devid_new_place(struct cache *c, const char *path, char *err, size_t errlen)
{
	struct dev *nd;
	struct thing t;
	struct stat st;
	int fd, created, ret;

	/* as the mirror is opened: no link followed (pm_open_place) */
	fd = pm_open_place(path, 0, &st, &created, err, errlen);
	if (fd == -ENOENT)
		return 0; /* a new file: made O_EXCL, never through a link */
	if (fd < 0) {
		if (!err[0])
			snprintf(err, errlen, "%s: %s", path, strerror(-fd));
		return fd;
	}
	close(fd);
	if (!thing_of(&st, &t)) {
		snprintf(err, errlen,
			 "%s is not a block device or regular file", path);
		return -ENODEV;
	}
	ret = of_this_cache(c, path, &t, 1, err, errlen);
	if (ret)
		return ret;
	if (!t.blk) {
		snprintf(err, errlen,
			 "%s exists; a new mirror goes to a file that does not "
			 "exist yet, or to a block device",
			 path);
		return -EEXIST;
	}
	ret = fmt_probe_in_use(path, REFUSAL " (wipefs -a it first)", err,
			       errlen);
	if (ret)
		return ret;
	ret = dev_open(path, &nd);
	if (ret)
		return open_err(path, ret, err, errlen);
	ret = still_same(nd, path, &t, err, errlen);
	if (!ret)
		ret = content_refused(c, nd, path, 1, err, errlen);
	dev_close(nd);
	return ret;
}

void devid_of(struct dev *d, const uint8_t uuid[16], struct meta_ident *id)
{
	struct stat st;

	memset(id, 0, sizeof(*id));
	memcpy(id->uuid, uuid, 16);
	if (!dev_stat(d, &st)) {
		if (S_ISBLK(st.st_mode)) {
			id->rdev = st.st_rdev;
		} else {
			id->dev = st.st_dev;
			id->ino = st.st_ino;
		}
	}
	id->size = dev_size(d);
}

static int ident_zero(const struct meta_ident *id)
{
	static const struct meta_ident none;

	return !memcmp(id, &none, sizeof(none));
}

/* t (size bytes) is where id was recorded; else err says what it is. */
static int ident_matches(const char *path, const struct thing *t, uint64_t size,
			 const struct meta_ident *id, char *err, size_t errlen)
{
	if (id->rdev && !(t->blk && t->rdev == (dev_t)id->rdev)) {
		char now[32] = "a regular file";

		if (t->blk)
			snprintf(now, sizeof(now), "block device %u:%u",
				 major(t->rdev), minor(t->rdev));
		snprintf(err, errlen,
			 "%s is not the device it began on: it is %s, the "
			 "replace began on block device %u:%u",
			 path, now, major(id->rdev), minor(id->rdev));
		return -ESTALE;
	}
	if (!id->rdev &&
	    !(t->reg && t->dev == (dev_t)id->dev && t->ino == id->ino)) {
		snprintf(err, errlen,
			 "%s is not the file it began on (inode %llu, the "
			 "replace began on inode %llu)",
			 path, (unsigned long long)t->ino,
			 (unsigned long long)id->ino);
		return -ESTALE;
	}
	if (size != id->size) {
		snprintf(err, errlen,
			 "%s holds %llu bytes; the one it began on held %llu",
			 path, (unsigned long long)size,
			 (unsigned long long)id->size);
		return -ESTALE;
	}
	return 0;
}

/* Nothing but what a replace writes in nd's superblock area: no other
 * signature there, no mirror header; its superblock ours, under id. */
static int dev_is_ours(struct cache *c, struct dev *nd, const char *path,
		       const struct thing *t, const struct meta_ident *id,
		       char *err, size_t errlen)
{
	struct sb_disk sb;
	char why[256], u[37], v[37];
	struct stat st;
	struct thing o;
	int fd, ret;

	if (sb_read_why(nd, &sb, why, sizeof(why))) {
		snprintf(err, errlen,
			 "%s holds no nvcachefs superblock (%s): not what the "
			 "replace wrote there",
			 path, why);
		return -ESTALE;
	}
	if (memcmp(sb.set_uuid, c->meta.set_uuid, 16) ||
	    memcmp(sb.dev_uuid, id->uuid, 16)) {
		snprintf(err, errlen,
			 "%s holds the superblock of device %s of cache %s, "
			 "not the one the replace wrote (%s of this cache)",
			 path, members_uuid_str(sb.dev_uuid, u),
			 members_uuid_str(sb.set_uuid, v),
			 members_uuid_str(id->uuid, why));
		return -ESTALE;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return open_err(path, -errno, err, errlen);
	cache_may_block(c);
	ret = fstat(fd, &st) || !thing_of(&st, &o) || !same_thing(&o, t)
		      ? -EAGAIN
		      : 0;
	if (ret)
		snprintf(err, errlen, "%s changed while it was checked", path);
	else
		ret = fmt_probe_head(fd, SB_DATA_OFF, path,
				     "it was overwritten since", err, errlen);
	close(fd);
	return ret ? ret : content_refused(c, nd, path, 0, err, errlen);
}

int devid_prove_dev(struct cache *c, const char *path,
		    const struct meta_ident *id, uint64_t min_slots,
		    struct dev **out, char *err, size_t errlen)
{
	struct thing t;
	int ret;

	if (ident_zero(id)) /* recorded before identities were: a new one */
		return devid_new_dev(c, path, min_slots, out, err, errlen);
	ret = judge_name(c, path, &t, err, errlen);
	if (ret)
		return ret;
	ret = open_judged(path, &t, out, err, errlen);
	if (ret)
		return ret;
	ret = ident_matches(path, &t, dev_size(*out), id, err, errlen);
	if (!ret)
		ret = dev_is_ours(c, *out, path, &t, id, err, errlen);
	if (!ret)
		ret = big_enough(*out, path,
				 SB_DATA_OFF + min_slots * (uint64_t)c->bs, err,
				 errlen);
	if (ret) {
		dev_close(*out);
		*out = NULL;
	}
	return ret;
}

int devid_claim_place(struct cache *c, struct pm_region *r,
		      struct meta_ident *id)
{
	struct claim_disk cl = { .magic = CLAIM_MAGIC };
	struct stat st;

	memset(id, 0, sizeof(*id));
	if (getrandom(cl.uuid, 16, 0) != 16)
		return -errno;
	memcpy(cl.set_uuid, c->meta.set_uuid, 16);
	cl.csum = meta_csum(&cl, offsetof(struct claim_disk, csum));
	memcpy(id->uuid, cl.uuid, 16);
	if (r->bdev && !dev_stat(r->bdev, &st)) {
		id->rdev = st.st_rdev;
		id->size = dev_size(r->bdev);
	} else {
		id->dev = r->created_dev;
		id->ino = r->created_ino;
		id->size = r->len;
	}
	return pm_write(r, 0, &cl, sizeof(cl));
}

int devid_place_is(const struct pm_region *r, const struct meta_ident *id)
{
	struct stat st;

	if (id->rdev)
		return r->bdev && !dev_stat(r->bdev, &st) &&
		       st.st_rdev == (dev_t)id->rdev;
	if (ident_zero(id) || r->bdev)
		return 0;
	return r->created_dev == (dev_t)id->dev &&
	       r->created_ino == (ino_t)id->ino;
}

int devid_place_unfinished(const struct pm_region *r,
			   const uint8_t set_uuid[16],
			   const struct meta_ident *id)
{
	const struct claim_disk *cl = r->addr;

	if (!r->addr || r->len < META_HDR_SIZE || !devid_place_is(r, id))
		return 0;
	return is_zero(r->addr, META_HDR_SIZE) ||
	       (claim_ok(cl) && !memcmp(cl->set_uuid, set_uuid, 16) &&
		!memcmp(cl->uuid, id->uuid, 16));
}

/* The place's first 4 KiB (read from fd): zero, our claim under id, or a
 * header of this cache. */
static int place_head_ours(struct cache *c, int fd, const char *path,
			   const struct meta_ident *id, char *err,
			   size_t errlen)
{
	uint8_t head[META_HDR_SIZE];
	const struct claim_disk *cl = (const void *)head;
	const struct meta_hdr *h = (const void *)head;

	cache_may_block(c);
	if (pread(fd, head, sizeof(head), 0) != (ssize_t)sizeof(head)) {
		snprintf(err, errlen, "%s: cannot read its first 4 KiB", path);
		return -EIO;
	}
	if (is_zero(head, sizeof(head)) ||
	    (claim_ok(cl) && !memcmp(cl->set_uuid, c->meta.set_uuid, 16) &&
	     !memcmp(cl->uuid, id->uuid, 16)) ||
	    (hdr_valid(h) && !memcmp(h->set_uuid, c->meta.set_uuid, 16)))
		return 0;
	snprintf(err, errlen,
		 "%s holds something else at its start than the mirror "
		 "replace left there (neither zeros, nor its claim, nor this "
		 "cache's header)",
		 path);
	return -ESTALE;
}

int devid_prove_place(struct cache *c, const char *path,
		      const struct meta_ident *id, int *gone, char *err,
		      size_t errlen)
{
	struct stat st;
	struct thing t;
	uint64_t size;
	int fd, rfd, created, ret;

	*gone = 0;
	fd = pm_open_place(path, 0, &st, &created, err, errlen);
	if (fd == -ENOENT) {
		*gone = 1; /* nothing there to lose */
		return 0;
	}
	if (fd < 0) {
		if (!err[0])
			snprintf(err, errlen, "%s: %s", path, strerror(-fd));
		return fd;
	}
	ret = !thing_of(&st, &t) ? -ENODEV
				 : of_this_cache(c, path, &t, 1, err, errlen);
	if (ret == -ENODEV)
		snprintf(err, errlen,
			 "%s is not a block device or regular file", path);
	rfd = ret ? -1 : pm_reopen(fd, O_RDONLY);
	if (!ret && rfd < 0) {
		ret = rfd;
		snprintf(err, errlen, "%s: %s", path, strerror(-ret));
	}
	size = st.st_size;
	if (!ret && t.blk && ioctl(rfd, BLKGETSIZE64, &size))
		size = 0;
	if (!ret && ident_zero(id) && t.reg) {
		/* recorded before identities were: a file there cannot be
		 * told from another one */
		snprintf(err, errlen,
			 "%s exists, and the replace recorded no identity to "
			 "prove it is the file it made",
			 path);
		ret = -ESTALE;
	} else if (!ret && ident_zero(id)) {
		ret = place_head_ours(c, rfd, path, id, err, errlen);
	} else if (!ret) {
		ret = ident_matches(path, &t, size, id, err, errlen);
		if (!ret)
			ret = place_head_ours(c, rfd, path, id, err, errlen);
	}
	if (!ret && t.blk) /* nothing made there since */
		ret = fmt_probe_in_use(path, "it was overwritten since", err,
				       errlen);
	if (rfd >= 0)
		close(rfd);
	close(fd);
	return ret;
}

/* Members are found by identity (members.c), so the name is the one the
 * device was opened under, not cache.devices' entry d. */
const char *cache_listed_name(struct cache *c, int d)
{
	if (c->devs[d])
		return dev_path(c->devs[d]);
	return c->grown_names[d] ? c->grown_names[d] : "";
}
