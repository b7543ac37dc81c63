/* tests: how long recovery takes — fill a cache on in-memory devices, drop it,
 * time the next open. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../cache/cache.h"
#include "../../cache/media/media.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* usage: bench_recovery BLOCK_SIZE DEVICE_MIB */
int main(int argc, char **argv)
{
	uint32_t bs = argc > 1 ? atoi(argv[1]) : 4096;
	uint64_t dev_mib = argc > 2 ? atoll(argv[2]) : 512, per, nslots,
		 written = 0;
	struct cache_config cfg;
	struct dev *devs[2];
	struct pm_region r[2];
	struct cache *c;
	char err[CFG_ERRLEN], dir[] = "/tmp/nvc-bench-XXXXXX", *buf;
	int d, fd, bfd, i;
	double t;

	log_setup(LOG_TO_STDERR);
	cfg_defaults(&cfg);
	cfg.block_size = bs;
	cfg.ndevs = 2;
	cfg.idle_ms = cfg.max_dirty_age_ms = 0;
	cfg.high_wm = 100;
	cfg.low_wm = 99;
	cfg.max_files = 1 << 20;
	per = (dev_mib << 20) / bs;
	for (d = 0; d < 2; d++)
		dev_mem_create(SB_DATA_OFF + per * bs, &devs[d]);
	for (d = 0; d < 2; d++)
		pm_mem_create(fmt_meta_len(&cfg, devs, 2), &r[d]);
	if (fmt_format_open(&cfg, devs, 2, r, err, sizeof(err)) ||
	    !mkdtemp(dir))
		return 1;
	bfd = open(dir, O_RDONLY | O_DIRECTORY);
	if (cache_open_devs(&cfg, devs, 2, r, bfd, &c, err, sizeof(err)))
		return 1;
	nslots = per * 2;
	buf = malloc(1 << 20);
	memset(buf, 7, 1 << 20);
	/* fill 95% of the slots with dirty data, 64 files */
	for (i = 0; i < 64; i++) {
		struct cfile *f;
		char name[16];
		uint64_t off;

		snprintf(name, sizeof(name), "f%d", i);
		fd = openat(bfd, name, O_RDWR | O_CREAT, 0644);
		cache_file_get(c, fd, &f);
		for (off = 0; off < nslots * bs * 95 / 100 / 64;
		     off += 1 << 20, written += 1 << 20)
			cache_write(c, f, buf, 1 << 20, off);
		cache_file_put(c, f);
		close(fd);
	}
	cache_abandon(c);
	t = now();
	if (cache_open_devs(&cfg, devs, 2, r, bfd, &c, err, sizeof(err)))
		return 1;
	t = now() - t;
	printf("block %u, %llu slots (%.2f GiB of cache, %.0f MiB dirty): "
	       "recovery %.3f s = %.3f s per GiB, %.3f s per million blocks\n",
	       bs, (unsigned long long)nslots, nslots * (double)bs / (1 << 30),
	       written / 1048576.0, t, t / (nslots * (double)bs / (1 << 30)),
	       t / (nslots / 1e6));
	cache_close(c, 0);
	(void)!system("rm -rf /tmp/nvc-bench-*");
	return 0;
}
