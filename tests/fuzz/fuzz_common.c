/* tests/fuzz: the fuzz targets' shared setup — formatted in-memory caches,
 * fuzzed regions, checksum repair, one open and close. */
#define _GNU_SOURCE
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* fuzz_gen's images carry this set uuid, so they match the setups' devices */
static const uint8_t fz_uuid[16] = "nvcachefs-fuzz!";

void fz_fail(const char *what)
{
	fprintf(stderr, "fuzz: %s\n", what);
	abort();
}

static void fz_check(int ret, const char *what)
{
	if (ret) {
		fprintf(stderr, "fuzz setup: %s: %d\n", what, ret);
		abort();
	}
}

/* Give the formatted cache the fixed uuid, on the devices and mirrors. */
static void fz_set_uuid(struct fz_setup *s, struct dev **devs,
			struct pm_region *m)
{
	struct sb_disk sb;
	int i;

	for (i = 0; i < FZ_NDEVS; i++) {
		fz_check(sb_read(devs[i], &sb), "sb_read");
		memcpy(sb.set_uuid, fz_uuid, 16);
		fz_check(sb_write(devs[i], &sb), "sb_write");
		fz_check(dev_read(devs[i], s->sb[i], FZ_SB_AREA, 0), "read sb");
	}
	for (i = 0; i < 2; i++) {
		struct meta_hdr *h = m[i].addr;

		memcpy(h->set_uuid, fz_uuid, 16);
		h->csum = meta_csum(h, offsetof(struct meta_hdr, csum));
		memcpy(s->mirror[i], m[i].addr, s->mirror_len);
	}
}

static void fz_build(struct fz_setup *s, uint32_t bs)
{
	struct dev *devs[FZ_NDEVS];
	struct pm_region m[2];
	char err[CFG_ERRLEN];
	int i;

	cfg_defaults(&s->cfg);
	s->cfg.block_size = bs;
	s->cfg.ndevs = FZ_NDEVS;
	s->cfg.dev_paths[0] = strdup("fuzz-dev0");
	s->cfg.dev_paths[1] = strdup("fuzz-dev1");
	s->cfg.meta_paths[0] = strdup("fuzz-mirror0");
	s->cfg.meta_paths[1] = strdup("fuzz-mirror1");
	s->cfg.threads = 1;
	s->cfg.idle_ms = 0;
	s->cfg.max_dirty_age_ms = 0;
	s->cfg.io_poll_us = 0;
	s->dev_size = SB_DATA_OFF + (uint64_t)FZ_PER_DEV * bs;
	for (i = 0; i < FZ_NDEVS; i++) {
		fz_check(dev_mem_create(s->dev_size, &devs[i]), "dev");
		s->sb[i] = dev_alloc_buf(FZ_SB_AREA);
	}
	s->mirror_len = fmt_meta_len(&s->cfg, devs, FZ_NDEVS);
	for (i = 0; i < 2; i++) {
		fz_check(pm_mem_create(s->mirror_len, &m[i]), "mirror");
		s->mirror[i] = malloc(s->mirror_len);
	}
	if (fmt_format_open(&s->cfg, devs, FZ_NDEVS, m, err, sizeof(err)))
		fz_fail(err);
	fz_set_uuid(s, devs, m);
	for (i = 0; i < 2; i++)
		pm_unmap(&m[i]);
	fz_devs_close(devs);
}

const struct fz_setup *fz_setup(uint8_t control)
{
	static struct fz_setup setups[2];
	static int built[2];
	int k = !!(control & FZ_BIG_BLOCKS);

	if (!built[k]) {
		log_setup(LOG_TO_STDERR);
		fz_build(&setups[k], k ? 1024 * 1024 : 4096);
		built[k] = 1;
	}
	return &setups[k];
}

void fz_devs(const struct fz_setup *s, struct dev *devs[FZ_NDEVS])
{
	int i;

	for (i = 0; i < FZ_NDEVS; i++) {
		fz_check(dev_mem_create(s->dev_size, &devs[i]), "dev");
		fz_check(dev_write(devs[i], s->sb[i], FZ_SB_AREA, 0), "sb");
	}
}

void fz_devs_close(struct dev *devs[FZ_NDEVS])
{
	int i;

	for (i = 0; i < FZ_NDEVS; i++)
		dev_close(devs[i]);
}

void fz_region(struct pm_region *r, const void *data, size_t data_len,
	       size_t len)
{
	/* a zero-length mapping is no mapping: pm_mem_create needs a byte */
	fz_check(pm_mem_create(len ? len : 1, r), "region");
	r->len = len;
	if (data_len && len)
		memcpy(r->addr, data, data_len < len ? data_len : len);
}

/*
 * The two mirrors from the input, as control bits 2-3 say: its two halves;
 * a good mirror and the input; the input twice; the input and a lost mirror.
 * Checksums recomputed when control asks (FZ_FIX_CSUM).
 */
void fz_mirrors(const struct fz_setup *s, uint8_t control, const uint8_t *data,
		size_t size, struct pm_region m[2])
{
	size_t half = size / 2;
	int i;

	switch ((control >> 2) & 3) {
	case 0:
		fz_region(&m[0], data, half, half);
		fz_region(&m[1], data + half, size - half, size - half);
		break;
	case 1:
		fz_region(&m[0], s->mirror[0], s->mirror_len, s->mirror_len);
		fz_region(&m[1], data, size, size);
		break;
	case 2:
		fz_region(&m[0], data, size, size);
		fz_region(&m[1], data, size, size);
		break;
	default:
		fz_region(&m[0], data, size, size);
		fz_region(&m[1], NULL, 0, s->mirror_len);
		break;
	}
	if (control & FZ_FIX_CSUM)
		for (i = 0; i < 2; i++)
			fz_fix_mirror(m[i].addr, m[i].len);
}

static int all_zero(const uint8_t *p, size_t n)
{
	while (n--)
		if (*p++)
			return 0;
	return 1;
}

void fz_fix_mirror(uint8_t *p, size_t len)
{
	struct meta_hdr *h = (struct meta_hdr *)p;
	uint64_t i;

	if (len < META_HDR_SIZE)
		return;
	h->csum = meta_csum(h, offsetof(struct meta_hdr, csum));
	if (meta_hdr_check(p, len, NULL))
		return;
	for (i = 0; i < h->nfiles; i++) {
		struct meta_file *f = (struct meta_file *)(p + h->files_off +
							   i * META_FILE_SIZE);

		if (!all_zero((uint8_t *)f, META_FILE_SIZE))
			f->csum =
				meta_csum(f, offsetof(struct meta_file, csum));
	}
	for (i = 0; i < h->nslots; i++) {
		uint8_t *e = p + h->slots_off + i * h->slot_size;
		uint64_t c;

		if (all_zero(e, h->slot_size))
			continue;
		c = meta_csum(e, h->slot_size - 8);
		memcpy(e + h->slot_size - 8, &c, 8);
	}
}

void fz_fix_sb(uint8_t *p)
{
	struct sb_disk *sb = (struct sb_disk *)p;

	sb->csum = meta_csum(sb, offsetof(struct sb_disk, csum));
}

/* The scratch backing directory of FZ_LIVE, made once per process. */
struct fz_live {
	char dir[64];
	int dfd, fd;
	struct {
		struct file_handle fh;
		uint8_t buf[MAX_HANDLE_SZ];
	} h;
	ino_t ino;
};

static struct fz_live live_dir = { .dfd = -1, .fd = -1 };

static void fz_live_remove(void)
{
	unlinkat(live_dir.dfd, "f", 0);
	rmdir(live_dir.dir);
}

/* A run that crashed left its scratch directory: remove those of dead pids. */
static void fz_live_sweep(void)
{
	DIR *d = opendir("/tmp");
	struct dirent *e;

	while (d && (e = readdir(d))) {
		char path[300];
		int pid;

		if (sscanf(e->d_name, "nvc-fuzz-live-%d", &pid) != 1 ||
		    pid <= 0 || !kill(pid, 0) || errno != ESRCH)
			continue;
		snprintf(path, sizeof(path), "/tmp/%s/f", e->d_name);
		unlink(path);
		snprintf(path, sizeof(path), "/tmp/%s", e->d_name);
		rmdir(path);
	}
	if (d)
		closedir(d);
}

static struct fz_live *fz_live(uint32_t bs)
{
	static const struct timespec t[2] = { { 1000000000, 0 },
					      { 1000000000, 0 } };
	struct fz_live *l = &live_dir;
	struct stat st;
	int mnt;

	if (l->dfd < 0) {
		fz_live_sweep();
		snprintf(l->dir, sizeof(l->dir), "/tmp/nvc-fuzz-live-%d",
			 (int)getpid());
		if (mkdir(l->dir, 0700) && errno != EEXIST)
			fz_fail("mkdir the scratch directory");
		l->dfd = open(l->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		l->fd = openat(l->dfd, "f", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		l->h.fh.handle_bytes = MAX_HANDLE_SZ;
		if (l->fd < 0 || fstat(l->fd, &st) ||
		    name_to_handle_at(l->fd, "", &l->h.fh, &mnt, AT_EMPTY_PATH))
			fz_fail("scratch backing file");
		if (l->h.fh.handle_bytes > META_HANDLE_MAX)
			fz_fail("scratch file handle too long");
		l->ino = st.st_ino;
		atexit(fz_live_remove);
	}
	/* the same file every time: three blocks, an old fixed mtime */
	if (ftruncate(l->fd, 0) || ftruncate(l->fd, 3ull * bs) ||
	    futimens(l->fd, t))
		fz_fail("reset the scratch file");
	return l;
}

/* Every used file record of a mirror names the scratch file (and, with
 * FZ_LIVE_SAME, its mtime); a record whose checksum was good stays good. */
static void fz_live_records(uint8_t *p, size_t len, const struct fz_live *l,
			    unsigned live)
{
	struct meta_hdr *h = (struct meta_hdr *)p;
	uint32_t i;

	if (meta_hdr_check(p, len, NULL))
		return;
	/* the scratch directory is the store the cache knows */
	memset(h->store_stamp, 0, sizeof(h->store_stamp));
	h->csum = meta_csum(h, offsetof(struct meta_hdr, csum));
	for (i = 0; i < h->nfiles; i++) {
		struct meta_file *f =
			(struct meta_file *)(p + h->files_off +
					     (uint64_t)i * META_FILE_SIZE);
		int good = f->csum ==
			   meta_csum(f, offsetof(struct meta_file, csum));

		if (!(f->flags & MF_USED))
			continue;
		f->ino = l->ino;
		f->handle_bytes = l->h.fh.handle_bytes;
		f->handle_type = l->h.fh.handle_type;
		memcpy(f->handle, l->h.fh.f_handle, l->h.fh.handle_bytes);
		/* found by handle or by path, checked by inode number */
		memset(f->stamp, 0, sizeof(f->stamp));
		memset(f->path, 0, sizeof(f->path));
		f->path_len = 1;
		f->path[0] = 'f';
		if (live & FZ_LIVE_SAME)
			f->bk_mtime_ns = 1000000000ull * 1000000000ull;
		if (good)
			f->csum =
				meta_csum(f, offsetof(struct meta_file, csum));
	}
}

int fz_open_close(const struct fz_setup *s, struct dev *devs[FZ_NDEVS],
		  struct pm_region mirrors[2], unsigned live)
{
	static int proc_fd = -1;
	struct cache_config cfg = s->cfg;
	struct cache *c;
	char err[CFG_ERRLEN] = "";
	int ret, i, backing_fd;

	/* procfs: open_by_handle_at finds nothing there (ESTALE), so a
	 * fuzzed file handle can never open, truncate or write a real file */
	if (proc_fd < 0)
		proc_fd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (proc_fd < 0)
		fz_fail("cannot open /proc");
	backing_fd = proc_fd;
	if (live & FZ_LIVE) {
		struct fz_live *l = fz_live(cfg.block_size);

		for (i = 0; i < 2; i++)
			fz_live_records(mirrors[i].addr, mirrors[i].len, l,
					live);
		backing_fd = l->dfd;
	}
	ret = cache_open_devs(&cfg, devs, FZ_NDEVS, mirrors, backing_fd, &c,
			      err, sizeof(err));
	if (ret) {
		if (!err[0])
			fz_fail("cache_open_devs refused without an error");
		fprintf(stderr, "fuzz: refused: %s\n", err);
		return ret;
	}
	if ((live & FZ_LIVE_FLUSH) && (live & FZ_LIVE))
		cache_flush(c, NULL, NULL);
	cache_close(c, 0);
	return 0;
}
