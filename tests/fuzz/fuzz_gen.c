/* tests/fuzz: writes the seed corpus — valid images of formatted and of used
 * caches, as each target reads them (fuzz_gen OUTDIR). */
#define _GNU_SOURCE
#include "fuzz.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *outdir;

static void put(const char *target, const char *name, uint8_t control,
		const void *a, size_t alen, const void *b, size_t blen)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", outdir, target);
	if (mkdir(path, 0755) && errno != EEXIST)
		fz_fail(path);
	snprintf(path, sizeof(path), "%s/%s/%s", outdir, target, name);
	f = fopen(path, "w");
	if (!f || fwrite(&control, 1, 1, f) != 1 ||
	    fwrite(a, 1, alen, f) != alen ||
	    (blen && fwrite(b, 1, blen, f) != blen) || fclose(f))
		fz_fail(path);
}

/* A cache of the setup's geometry after some writes, abandoned as by a crash:
 * file records, dirty and clean slots (and twins with two copies). */
static void used_cache(const struct fz_setup *s, int copies, uint8_t *img[2])
{
	struct cache_config cfg = s->cfg;
	struct dev *devs[FZ_NDEVS];
	struct pm_region m[2];
	struct cache *c;
	char dir[] = "/tmp/nvc-fuzz-gen-XXXXXX", err[CFG_ERRLEN], *buf;
	int i, dfd, fd;

	cfg.dirty_copies = copies;
	fz_devs(s, devs);
	for (i = 0; i < 2; i++)
		fz_region(&m[i], s->mirror[i], s->mirror_len, s->mirror_len);
	if (!mkdtemp(dir))
		fz_fail("mkdtemp");
	dfd = open(dir, O_RDONLY | O_DIRECTORY);
	if (cache_open_devs(&cfg, devs, FZ_NDEVS, m, dfd, &c, err, sizeof(err)))
		fz_fail(err);
	buf = malloc(cfg.block_size + 5000);
	memset(buf, 'x', cfg.block_size + 5000);
	for (i = 0; i < 3; i++) {
		char name[8];
		struct cfile *f;

		snprintf(name, sizeof(name), "f%d", i);
		fd = openat(dfd, name, O_RDWR | O_CREAT, 0644);
		if (fd < 0 || cache_file_get(c, fd, &f))
			fz_fail("cache_file_get");
		/* one whole block and part of the next; the last file fsynced */
		if (cache_write(c, f, buf, cfg.block_size + 5000 * i, 100 * i))
			fz_fail("cache_write");
		if (i == 2 && cache_fsync(c, f))
			fz_fail("cache_fsync");
		cache_file_put(c, f);
		close(fd);
	}
	free(buf);
	cache_abandon(c);
	for (i = 0; i < 2; i++) {
		img[i] = malloc(s->mirror_len);
		memcpy(img[i], m[i].addr, s->mirror_len);
		pm_unmap(&m[i]);
	}
	fz_devs_close(devs);
	close(dfd);
	snprintf(err, sizeof(err), "rm -rf %s", dir);
	if (system(err))
		fz_fail("rm");
}

/* A header that records a grown third member (grow.c), the rest the used
 * cache img's: the target makes the checksums good (control). */
static void grown_seed(const char *target, const char *g, uint8_t control,
		       const uint8_t *img, size_t n)
{
	uint8_t *grown = malloc(n);
	struct meta_hdr *h = (struct meta_hdr *)grown;
	char name[64];

	if (!grown)
		fz_fail("malloc");
	memcpy(grown, img, n);
	h->ndevs = 3;
	h->grown[2] = 4;
	h->nslots += 4;
	memset(h->members[2], 0x5a, 16);
	snprintf(name, sizeof(name), "%s-grown-hdr", g);
	put(target, name, control, grown, n, NULL, 0);
	free(grown);
}

static void mirror_seeds(const char *target, uint8_t big)
{
	const struct fz_setup *s = fz_setup(big);
	size_t n = s->mirror_len;
	const char *g = big ? "1m" : "4k";
	uint8_t *img[2], *two[2], ctl;
	char name[64];

	used_cache(s, 1, img);
	used_cache(s, 2, two);
	ctl = big | FZ_FIX_CSUM;
	snprintf(name, sizeof(name), "%s-empty-same", g);
	put(target, name, big | 8, s->mirror[0], n, NULL, 0);
	snprintf(name, sizeof(name), "%s-used-both", g);
	put(target, name, ctl, img[0], n, img[1], n);
	snprintf(name, sizeof(name), "%s-used-one-good", g);
	put(target, name, ctl | 4, img[1], n, NULL, 0);
	snprintf(name, sizeof(name), "%s-used-rebuild", g);
	put(target, name, ctl | 12, img[0], n, NULL, 0);
	snprintf(name, sizeof(name), "%s-twins-both", g);
	put(target, name, big, two[0], n, two[1], n);
	grown_seed(target, g, ctl | 12, img[1], n);
	if (!strcmp(target, "mirrors")) {
		/* recovery with a real backing file behind the records */
		snprintf(name, sizeof(name), "%s-used-live", g);
		put(target, name, ctl | FZ_LIVE, img[0], n, img[1], n);
		snprintf(name, sizeof(name), "%s-used-live-same-flush", g);
		put(target, name, ctl | FZ_LIVE | FZ_LIVE_SAME | FZ_LIVE_FLUSH,
		    img[0], n, img[1], n);
		snprintf(name, sizeof(name), "%s-twins-live-flush", g);
		put(target, name, big | FZ_LIVE | FZ_LIVE_SAME | FZ_LIVE_FLUSH,
		    two[0], n, two[1], n);
	}
	if (!strcmp(target, "check")) {
		/* and device 0's superblock from the input */
		snprintf(name, sizeof(name), "%s-used-sb", g);
		put(target, name, ctl | 8 | 16, img[0], n, s->sb[0] + 4096,
		    4096);
	}
	free(img[0]);
	free(img[1]);
	free(two[0]);
	free(two[1]);
}

static void sb_seeds(uint8_t big)
{
	const struct fz_setup *s = fz_setup(big);
	char name[64];
	int d;

	for (d = 0; d < FZ_NDEVS; d++) {
		snprintf(name, sizeof(name), "%s-dev%d-two-copies",
			 big ? "1m" : "4k", d);
		put("superblock", name, big | (d << 2) | 8, s->sb[d] + 4096,
		    2 * 4096, NULL, 0);
	}
	snprintf(name, sizeof(name), "%s-dev0-one-copy-fix", big ? "1m" : "4k");
	put("superblock", name, big | FZ_FIX_CSUM, s->sb[0] + 4096, 4096, NULL,
	    0);
}

static const char *const configs[][2] = {
	{ "minimal", "[cache]\ndevices = /dev/nvme0n1\n"
		     "metadata = /mnt/pmem0/m, /mnt/pmem1/m\n"
		     "[backing]\npath = /srv/data\n" },
	{ "full",
	  "# every key\n[cache]\ndevices = /dev/a, /dev/b\n"
	  "metadata = /x/m0 , /y/m1\nblock_size = 1M\nmode = writethrough\n"
	  "dirty_copies = 2\nmax_files = 4096\nio_poll_us = 0\n"
	  "[backing]\npath = /b\n[destage]\nhigh_watermark = 60\n"
	  "low_watermark = 30\nmax_dirty_age = 500ms\nidle_after = 1min\n"
	  "threads = 4\nmax_rate = 100M/s\non_unmount = keep\n"
	  "[fuse]\nthreads = 8\nread_ahead = 128K\nattr_timeout = 2s\n"
	  "[stats]\nlatency = off\nreaders = adm\n" },
};

static void config_seeds(void)
{
	static const char overrides[] = "cache.block_size=4K\0"
					"destage.max_rate=1GiB\0"
					"cache.mode=writearound";
	size_t i;

	for (i = 0; i < sizeof(configs) / sizeof(configs[0]); i++) {
		const char *t = configs[i][1];

		/* put() writes a first byte: here it is the text's own */
		put("config", configs[i][0], (uint8_t)t[0], t + 1,
		    strlen(t) - 1, NULL, 0);
	}
	put("config", "overrides", '[', configs[0][1] + 1,
	    strlen(configs[0][1]), overrides, sizeof(overrides) - 1);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: fuzz_gen OUTDIR\n");
		return 2;
	}
	outdir = argv[1];
	if (mkdir(outdir, 0755) && errno != EEXIST)
		fz_fail(outdir);
	mirror_seeds("mirrors", 0);
	mirror_seeds("mirrors", FZ_BIG_BLOCKS);
	mirror_seeds("check", 0);
	mirror_seeds("check", FZ_BIG_BLOCKS);
	sb_seeds(0);
	sb_seeds(FZ_BIG_BLOCKS);
	config_seeds();
	return 0;
}
