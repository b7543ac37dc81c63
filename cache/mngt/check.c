/* cache: nvcachectl check — an offline, read-only consistency check of
 * superblocks, mirrors and the map. */
#define _GNU_SOURCE
#include "mngt.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

struct chk {
	FILE *out;
	int problems;
};

static void problem(struct chk *k, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void problem(struct chk *k, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("  PROBLEM ", k->out);
	vfprintf(k->out, fmt, ap);
	fputc('\n', k->out);
	va_end(ap);
	k->problems++;
}

static int check_superblocks(struct chk *k, const struct cache_config *cfg,
			     struct dev **devs, int n,
			     const struct meta_hdr *h)
{
	struct sb_disk *buf = dev_alloc_buf(sizeof(*buf));
	char why[256], u[2][37];
	struct meta_layout l;
	int d, copy;

	if (!buf)
		return -ENOMEM;
	if (h)
		meta_layout_of(h, &l);
	fprintf(k->out, "superblocks:\n");
	for (d = 0; d < n; d++) {
		int good = 0;

		if (h && d < NVC_MAX_DEVS && h->removed[d]) {
			fprintf(k->out, "  member %d: removed (%s)\n", d + 1,
				devs[d] ? dev_path(devs[d])
					: h->names[d][0] ? h->names[d]
							 : "gone");
			continue;
		}
		if (!devs[d])
			continue; /* not found: reported by member_devs */

		for (copy = 0; copy < SB_COPIES; copy++) {
			int ret = dev_read(devs[d], buf, sizeof(*buf),
					   4096 * (copy + 1));

			if (ret) {
				problem(k,
					"%s: superblock copy %d unreadable: %s",
					dev_path(devs[d]), copy + 1,
					strerror(-ret));
				continue;
			}
			if (buf->magic != SB_MAGIC) {
				problem(k,
					"%s: superblock copy %d has no "
					"nvcachefs magic",
					dev_path(devs[d]), copy + 1);
				continue;
			}
			if (buf->csum !=
			    meta_csum(buf, offsetof(struct sb_disk, csum))) {
				problem(k,
					"%s: superblock copy %d checksum "
					"mismatch",
					dev_path(devs[d]), copy + 1);
				continue;
			}
			if (buf->version != SB_VERSION ||
			    sb_check(buf, why, sizeof(why))) {
				if (buf->version != SB_VERSION)
					snprintf(why, sizeof(why),
						 "version %u, expected %u",
						 buf->version, SB_VERSION);
				problem(k, "%s: superblock copy %d: %s",
					dev_path(devs[d]), copy + 1, why);
				continue;
			}
			good++;
			if (h && memcmp(buf->set_uuid, h->set_uuid, 16))
				problem(k,
					"%s: belongs to another cache than the "
					"metadata",
					dev_path(devs[d]));
			else if (h && members_recorded(h) &&
				 d < (int)h->ndevs &&
				 memcmp(buf->dev_uuid, h->members[d], 16))
				problem(k,
					"%s: device UUID %s, but the metadata "
					"records member %d as %s",
					dev_path(devs[d]),
					members_uuid_str(buf->dev_uuid, u[0]),
					d + 1,
					members_uuid_str(h->members[d], u[1]));
			if (buf->dev_index != (uint32_t)d ||
			    (h && buf->ndevs != layout_sb_ndevs(&l, d)))
				problem(k,
					"%s: formatted as device %u of %u, "
					"checked as %d of %d",
					dev_path(devs[d]), buf->dev_index + 1,
					buf->ndevs, d + 1, n);
			if (buf->block_size != cfg->block_size)
				problem(k, "%s: block size %u, configured %llu",
					dev_path(devs[d]), buf->block_size,
					(unsigned long long)cfg->block_size);
			if (h && d < (int)h->ndevs &&
			    buf->slots_per_dev != l.count[d])
				problem(k,
					"%s: %llu slots, the metadata expects "
					"%llu",
					dev_path(devs[d]),
					(unsigned long long)buf->slots_per_dev,
					(unsigned long long)l.count[d]);
		}
		fprintf(k->out, "  %s: %d of %d copies good\n",
			dev_path(devs[d]), good, SB_COPIES);
	}
	free(buf);
	return 0;
}

static int is_zero(const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n--)
		if (*b++)
			return 0;
	return 1;
}

/*
 * One mirror's copy of a record was refused but the other stands: a bad
 * checksum was reported with each mirror's records; a good checksum over
 * fields that make no sense is reported here.
 */
static void report_bad_copy(struct chk *k, const char *what, uint64_t i,
			    struct meta *m, int slot)
{
	char why[320];

	if (slot)
		meta_slot_why(m, i, why, sizeof(why));
	else
		meta_file_why(m, i, why, sizeof(why));
	if (why[0] && !strstr(why, "checksum mismatch"))
		problem(k, "%s %llu: %s", what, (unsigned long long)i, why);
}

/* Each mirror's header: valid, and of this cache. */
static void check_mirror_headers(struct chk *k, struct pm_region r[2],
				 const struct meta_hdr *h)
{
	char err[256];
	int mi;

	for (mi = 0; mi < 2; mi++) {
		const struct meta_hdr *x = r[mi].addr;
		int ret = meta_hdr_why(r[mi].addr, r[mi].len, NULL, err,
				       sizeof(err));

		if (ret)
			problem(k, "mirror %d: header not valid: %s", mi, err);
		else if (memcmp(x->set_uuid, h->set_uuid, 16) ||
			 x->nslots != h->nslots || x->nfiles != h->nfiles ||
			 x->block_size != h->block_size || x->ndevs != h->ndevs)
			problem(k, "mirror %d: belongs to another cache", mi);
		else
			fprintf(k->out,
				"  mirror %d: header good, %llu slots, %u file "
				"records\n",
				mi, (unsigned long long)x->nslots, x->nfiles);
	}
}

/* Each mirror's own copy of every record: its checksum. */
static void check_mirror_records(struct chk *k, struct pm_region r[2],
				 const struct meta_hdr *h)
{
	uint64_t i;
	int mi;

	for (mi = 0; mi < 2; mi++) {
		if (meta_hdr_check(r[mi].addr, r[mi].len, NULL) ||
		    r[mi].len < h->total_len)
			continue;
		for (i = 0; i < h->nfiles; i++) {
			const struct meta_file *f =
				(const void *)((const char *)r[mi].addr +
					       h->files_off +
					       i * META_FILE_SIZE);

			if (!is_zero(f, META_FILE_SIZE) &&
			    f->csum != meta_csum(f, offsetof(struct meta_file,
							     csum)))
				problem(k,
					"mirror %d: file record %llu: checksum "
					"mismatch",
					mi, (unsigned long long)i);
		}
		for (i = 0; i < h->nslots; i++) {
			const uint8_t *s = (const uint8_t *)r[mi].addr +
					   h->slots_off + i * h->slot_size;
			uint64_t c;

			memcpy(&c, s + h->slot_size - 8, 8);
			if (!is_zero(s, h->slot_size) &&
			    c != meta_csum(s, h->slot_size - 8))
				problem(k,
					"mirror %d: slot %llu: checksum "
					"mismatch",
					mi, (unsigned long long)i);
		}
	}
}

/* The two mirrors hold the same records (where both are whole and valid). */
static void check_mirrors_agree(struct chk *k, struct pm_region r[2],
				const struct meta_hdr *h)
{
	uint64_t i;

	if (!(r[0].len >= h->total_len && r[1].len >= h->total_len &&
	      !meta_hdr_check(r[0].addr, r[0].len, NULL) &&
	      !meta_hdr_check(r[1].addr, r[1].len, NULL))) {
		fprintf(k->out, "  (map checked from the one good mirror)\n");
	} else {
		uint64_t differ = 0;

		for (i = 0; i < h->nfiles; i++)
			differ += memcmp((char *)r[0].addr + h->files_off +
						 i * META_FILE_SIZE,
					 (char *)r[1].addr + h->files_off +
						 i * META_FILE_SIZE,
					 META_FILE_SIZE) != 0;
		for (i = 0; i < h->nslots; i++)
			differ += memcmp((char *)r[0].addr + h->slots_off +
						 i * h->slot_size,
					 (char *)r[1].addr + h->slots_off +
						 i * h->slot_size,
					 h->slot_size) != 0;
		if (differ)
			problem(k,
				"the mirrors differ in %llu records (the next "
				"mount repairs them from the newer valid copy)",
				(unsigned long long)differ);
	}
}

/* The file records as a mount would read them; how many are in use. */
static uint64_t check_files(struct chk *k, struct meta *m,
			    const struct meta_hdr *h)
{
	uint64_t i, used_files = 0;
	char err[256];

	for (i = 0; i < h->nfiles; i++) {
		struct meta_file f;
		int bad;

		if (!meta_get_file(m, i, &f, &bad)) {
			meta_file_why(m, i, err, sizeof(err));
			problem(k,
				"file record %llu: damaged in both mirrors "
				"(%s)",
				(unsigned long long)i, err);
			continue;
		}
		if (bad)
			report_bad_copy(k, "file record", i, m, 0);
		if (!(f.flags & MF_USED))
			continue;
		used_files++;
		if (f.handle_bytes > META_HANDLE_MAX)
			problem(k, "file record %llu: file handle of %u bytes",
				(unsigned long long)i, f.handle_bytes);
	}
	return used_files;
}

/* Every slot entry as a mount would read it: its file in use, its bitmaps
 * sane, one slot per (file, block) besides second copies (seen: a hash
 * table of 2 * nslots words). */
static void check_slots(struct chk *k, struct meta *m, const struct meta_hdr *h,
			uint64_t *seen, uint64_t *used_slots,
			uint64_t *dirty_slots)
{
	uint32_t words = meta_words(h->block_size),
		 ppb = h->block_size / NVC_PAGE;
	uint64_t i, dup = 0;
	char err[256];

	for (i = 0; i < h->nslots; i++) {
		struct meta_slot s;
		struct meta_file f;
		uint32_t w, p;
		int bad;

		if (!meta_get_slot(m, i, &s, &bad)) {
			meta_slot_why(m, i, err, sizeof(err));
			problem(k, "slot %llu: damaged in both mirrors (%s)",
				(unsigned long long)i, err);
			continue;
		}
		if (bad)
			report_bad_copy(k, "slot", i, m, 1);
		if (!s.file)
			continue;
		(*used_slots)++;
		if (s.file > h->nfiles ||
		    !meta_get_file(m, s.file - 1, &f, &bad) ||
		    !(f.flags & MF_USED)) {
			problem(k,
				"slot %llu: maps block %llu of file record %u, "
				"which is not in use",
				(unsigned long long)i,
				(unsigned long long)s.blk, s.file - 1);
			continue;
		}
		for (w = 0; w < words; w++)
			if (s.dirty[w] & ~s.valid[w])
				problem(k,
					"slot %llu: dirty pages that are not "
					"valid",
					(unsigned long long)i);
		for (p = ppb; p < words * 64; p++)
			if ((s.valid[p / 64] >> (p % 64)) & 1) {
				problem(k,
					"slot %llu: page %u beyond the block "
					"is valid",
					(unsigned long long)i, p);
				break;
			}
		for (w = 0; w < words; w++)
			if (s.dirty[w]) {
				(*dirty_slots)++;
				break;
			}
		if ((s.blk + 1) * h->block_size > f.size + h->block_size &&
		    !is_zero(s.dirty, sizeof(s.dirty)))
			fprintf(k->out,
				"  note: slot %llu holds dirty data past the "
				"end of its file (an unacknowledged write)\n",
				(unsigned long long)i);
		/* one slot per (file, block), besides second copies */
		if (!(s.flags & SLOT_F_TWIN)) {
			uint64_t key = XXH3_64bits(&s.blk, 8) ^ s.file,
				 at = key % h->nslots;

			while (seen[2 * at] && !(seen[2 * at] == s.file &&
						 seen[2 * at + 1] == s.blk))
				at = (at + 1) % h->nslots;
			if (seen[2 * at]) {
				dup++;
				problem(k,
					"slot %llu: block %llu of file record "
					"%u is mapped twice",
					(unsigned long long)i,
					(unsigned long long)s.blk, s.file - 1);
			}
			seen[2 * at] = s.file;
			seen[2 * at + 1] = s.blk;
		}
	}
}

static void check_map(struct chk *k, struct pm_region r[2],
		      const struct meta_hdr *h)
{
	uint64_t used_files, used_slots = 0, dirty_slots = 0;
	uint64_t *seen;
	struct meta m;
	char err[256];

	fprintf(k->out, "metadata mirrors:\n");
	check_mirror_headers(k, r, h);
	check_mirror_records(k, r, h);
	check_mirrors_agree(k, r, h);
	/* the map as a mount would see it: newest valid copy of each record */
	if (meta_attach_ro(&m, r, err, sizeof(err))) {
		problem(k, "%s", err);
		return;
	}
	seen = calloc(h->nslots, 2 * sizeof(*seen));
	if (!seen) {
		problem(k, "no memory for the map check of %llu slots",
			(unsigned long long)h->nslots);
		return;
	}
	used_files = check_files(k, &m, h);
	check_slots(k, &m, h, seen, &used_slots, &dirty_slots);
	free(seen);
	fprintf(k->out,
		"map: %llu files, %llu of %llu slots in use, %llu dirty\n",
		(unsigned long long)used_files, (unsigned long long)used_slots,
		(unsigned long long)h->nslots, (unsigned long long)dirty_slots);
}

/* The header against the configuration (the device count only for a
 * cache without a member table: the others are found by identity). */
static void check_geometry(struct chk *k, const struct cache_config *cfg,
			   const struct meta_hdr *h)
{
	if (h->block_size != cfg->block_size)
		problem(k,
			"metadata header block_size %u, configured "
			"cache.block_size %llu",
			h->block_size, (unsigned long long)cfg->block_size);
	if (!members_recorded(h) && h->ndevs != (uint32_t)cfg->ndevs)
		problem(k, "metadata header ndevs %u, cache.devices lists %d",
			h->ndevs, cfg->ndevs);
}

/* The ndev devices given in member order into ord, as a mount takes them
 * (members_pick); *n: how many places. */
static void member_devs(struct chk *k, const struct cache_config *cfg,
			struct dev **devs, int ndev, const struct meta_hdr *h,
			struct dev **ord, int *n)
{
	char err[512], u[37];
	int kof[NVC_MAX_DEVS];
	uint32_t m;

	memcpy(ord, devs, ndev * sizeof(*devs));
	*n = ndev;
	if (!h || !members_recorded(h))
		return; /* the listed order, checked by dev_index */
	*n = (int)h->ndevs;
	if (members_pick(h, devs, ndev, ord, kof, err, sizeof(err))) {
		problem(k, "%s", err);
		return;
	}
	for (m = 0; m < h->ndevs; m++)
		if (!ord[m] && !h->removed[m])
			problem(k,
				"member %u of %u (UUID %s, last found at %s) is "
				"not among the devices checked",
				m + 1, h->ndevs,
				members_uuid_str(h->members[m], u),
				h->names[m][0] ? h->names[m] : "no recorded name");
}

int fmt_check_open(const struct cache_config *cfg, struct dev **devs, int ndev,
		   struct pm_region r[2], FILE *out, int problems)
{
	struct chk k = { .out = out, .problems = problems };
	const struct meta_hdr *h = NULL, *hh[2] = { r[0].addr, r[1].addr };
	struct dev *ord[NVC_MAX_DEVS] = { 0 };
	char why[2][256];
	int i, n, valid[2];

	for (i = 0; i < 2; i++)
		valid[i] = !meta_hdr_why(r[i].addr, r[i].len, NULL, why[i],
					 sizeof(why[i]));
	/* the header a mount takes as current (meta_current) */
	i = meta_current(hh, valid);
	if (i == -EUCLEAN)
		problem(&k, "each metadata mirror's header says the other "
			    "failed: which one is current cannot be told");
	else if (i >= 0)
		h = hh[i];
	member_devs(&k, cfg, devs, ndev, h, ord, &n);
	check_superblocks(&k, cfg, ord, n, h);
	if (h)
		check_geometry(&k, cfg, h);
	if (h)
		check_map(&k, r, h);
	else if (i != -EUCLEAN)
		problem(&k,
			"neither metadata mirror has a valid header (mirror "
			"0: %s; mirror 1: %s)",
			why[0], why[1]);
	if (k.problems)
		fprintf(out, "%d problem%s found\n", k.problems,
			k.problems > 1 ? "s" : "");
	else
		fprintf(out, "no problems found\n");
	return k.problems;
}

/*
 * What lost+found in the backing directory holds: data the cache saved
 * there because it could not find its file.  Listed for the administrator;
 * not a fault of the cache.
 */
static void check_lost_found(const struct cache_config *cfg, FILE *out)
{
	struct dirent *d;
	char *path;
	DIR *dir;
	int n = 0;

	if (!cfg->backing_path ||
	    asprintf(&path, "%s/%s", cfg->backing_path, LOST_FOUND_DIR) < 0)
		return;
	dir = opendir(path);
	while (dir && (d = readdir(dir))) {
		struct stat st;
		char when[32];

		if (d->d_name[0] == '.' ||
		    fstatat(dirfd(dir), d->d_name, &st, AT_SYMLINK_NOFOLLOW))
			continue;
		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S",
			 localtime(&st.st_mtime));
		fprintf(out, "lost+found: %s/%s: %lld bytes, saved %s\n", path,
			d->d_name, (long long)st.st_size, when);
		n++;
	}
	if (n)
		fprintf(out,
			"lost+found: %d file(s) hold dirty data whose backing "
			"file could not be found; move what is wanted back and "
			"remove the rest\n",
			n);
	if (dir)
		closedir(dir);
	free(path);
}

/* The devices to check: by identity where the current header records
 * members (members.c, as a mount finds them; one not found is reported by
 * fmt_check_open), else cache.devices in its order.  0, or -errno with err
 * set. */
static int check_open_devs(const struct cache_config *cfg,
			   struct pm_region r[2], struct chk *k,
			   struct dev **devs, int *ndev, char *err,
			   size_t errlen)
{
	const struct meta_hdr *hh[2] = { r[0].addr, r[1].addr };
	int i, ret, valid[2], spare = 0, missing;

	for (i = 0; i < 2; i++)
		valid[i] = r[i].addr && !meta_hdr_check(r[i].addr, r[i].len, NULL);
	i = meta_current(hh, valid);
	if (i >= 0 && members_recorded(hh[i])) {
		ret = members_open(cfg, hh[i], NULL, 0, 1, devs, &missing, err,
				   errlen);
		if (ret == -EBUSY)
			return ret;
		if (ret) {
			problem(k, "%s", err);
			err[0] = 0;
			return 0;
		}
		if (missing) {
			/* fmt_check_open names it */
			dev_close(devs[missing - 1]);
			devs[missing - 1] = NULL;
		}
		*ndev = (int)hh[i]->ndevs;
		return 0;
	}
	if (i >= 0)
		for (int d = 0; d < NVC_MAX_DEVS; d++)
			spare += hh[i]->removed[d];
	for (i = 0; i < cfg->ndevs; i++) {
		ret = dev_open(cfg->dev_paths[i], &devs[i]);
		if (ret && ret != -EBUSY && spare) {
			/* a removed member's name: its device may be gone */
			spare--;
			ret = dev_missing_create(cfg->dev_paths[i], UINT64_MAX,
						 &devs[i]);
		}
		if (ret) {
			snprintf(err, errlen, "%s: %s", cfg->dev_paths[i],
				 ret == -EBUSY
					 ? "in use: unmount the cache first"
					 : strerror(-ret));
			return ret;
		}
	}
	*ndev = cfg->ndevs;
	return 0;
}

int fmt_check(const struct cache_config *cfg, FILE *out, char *err,
	      size_t errlen)
{
	struct dev *devs[NVC_MAX_DEVS] = { 0 };
	struct pm_region r[2] = { { .lock_fd = -1 }, { .lock_fd = -1 } };
	struct chk k = { .out = out };
	char why[2][256], *followed[2] = { NULL, NULL };
	uint64_t total[2] = { 0, 0 };
	int i, ret = 0, ndev = 0, mret[2];

	for (i = 0; i < 2; i++) {
		ret = pm_map(cfg->meta_paths[i], 0, 0, &r[i]);
		if (ret == -EBUSY) {
			snprintf(err, errlen,
				 "%s: in use: unmount the cache first",
				 cfg->meta_paths[i]);
			goto out;
		}
		mret[i] = ret ? ret
			      : meta_hdr_check(r[i].addr, r[i].len, &total[i]);
		if (!mret[i])
			ret = mret[i] = pm_load(&r[i], total[i]);
		if (ret)
			problem(&k, "mirror %d (%s): cannot map: %s", i,
				cfg->meta_paths[i], strerror(-ret));
	}
	/* as a mount would: a replaced mirror's successor in its place */
	ret = mirror_follow((const char *const *)cfg->meta_paths, r, mret, why,
			    total, followed, err, errlen);
	for (i = 0; i < 2; i++)
		if (followed[i])
			fprintf(out,
				"mirror %d: %s was replaced by %s, which is "
				"checked in its place; change cache.metadata\n",
				i, cfg->meta_paths[i], followed[i]);
	for (i = 0; i < 2; i++)
		if (mret[i] == -ESTALE)
			problem(&k, "mirror %d (%s): %s", i, cfg->meta_paths[i],
				why[i]);
	free(followed[0]);
	free(followed[1]);
	if (ret)
		goto out;
	ret = check_open_devs(cfg, r, &k, devs, &ndev, err, errlen);
	if (ret)
		goto out;
	ret = fmt_check_open(cfg, devs, ndev, r, out, k.problems) ? 1 : 0;
	check_lost_found(cfg, out);
out:
	for (i = 0; i < 2; i++)
		pm_unmap(&r[i]);
	for (i = 0; i < NVC_MAX_DEVS; i++)
		dev_close(devs[i]);
	return ret;
}

/* Mirror i's header, read without mapping or locking it (the daemon may
 * hold it): 0, or -errno. */
static int hdr_read(const char *path, struct meta_hdr *h)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), ret = 0;
	uint64_t size = 0;
	struct stat st;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st))
		ret = -errno;
	else if (S_ISBLK(st.st_mode) ? ioctl(fd, BLKGETSIZE64, &size) : 0)
		ret = -errno;
	if (!ret && !S_ISBLK(st.st_mode))
		size = st.st_size;
	if (!ret && pread(fd, h, sizeof(*h), 0) != (ssize_t)sizeof(*h))
		ret = -EIO;
	close(fd);
	/* the header's own checks, against the mirror's size */
	if (!ret && meta_hdr_check(h, size, NULL))
		ret = -EUCLEAN;
	return ret;
}

int fmt_devices_line(const struct cache_config *cfg, char *line, size_t len,
		     char *err, size_t errlen)
{
	static struct meta_hdr hh[2];
	const struct meta_hdr *h[2] = { &hh[0], &hh[1] };
	struct dev *devs[NVC_MAX_DEVS] = { 0 };
	int i, valid[2], missing, ret;
	uint32_t k;
	size_t at = 0;

	for (i = 0; i < 2; i++)
		valid[i] = !hdr_read(cfg->meta_paths[i], &hh[i]);
	i = meta_current(h, valid);
	if (i < 0) {
		snprintf(err, errlen,
			 i == -EUCLEAN ? "each metadata mirror says the other "
					 "failed: run nvcachectl check"
				       : "neither metadata mirror (%s, %s) holds "
					 "a valid header",
			 cfg->meta_paths[0], cfg->meta_paths[1]);
		return i;
	}
	if (!members_recorded(h[i])) {
		snprintf(err, errlen,
			 "this cache was formatted before its devices had "
			 "UUIDs: cache.devices must list them in order");
		return -EINVAL;
	}
	/* unmounted: where the members are now; mounted (the devices are
	 * the daemon's): where the daemon recorded finding them */
	ret = members_open(cfg, h[i], NULL, 0, NVC_MAX_DEVS, devs, &missing,
			   err, errlen);
	if (!ret) {
		for (k = 0; k < h[i]->ndevs; k++) {
			struct sb_disk sb;

			if (!h[i]->removed[k] && sb_read(devs[k], &sb)) {
				dev_close(devs[k]); /* a stand-in: not found */
				devs[k] = NULL;
			}
		}
		members_line(h[i], devs, line, len);
		for (k = 0; k < NVC_MAX_DEVS; k++)
			dev_close(devs[k]);
		return 0;
	}
	if (ret != -EBUSY)
		return ret;
	line[0] = 0;
	for (k = 0; k < h[i]->ndevs && at < len; k++) {
		char u[37];

		at += snprintf(line + at, len - at, "%s%s%s", k ? ", " : "",
			       h[i]->removed[k] || h[i]->names[k][0] ? ""
								     : "UUID=",
			       h[i]->removed[k]	   ? CFG_SPARE
			       : h[i]->names[k][0] ? h[i]->names[k]
						   : members_uuid_str(
							     h[i]->members[k], u));
	}
	return 0;
}
