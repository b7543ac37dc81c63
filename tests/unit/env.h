/* tests: a cache on in-memory devices and a backing directory, for the engine's
 * unit test programs. */
#ifndef NVC_TEST_ENV_H
#define NVC_TEST_ENV_H

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../cache/cache.h"
#include "../../cache/media/media.h"
#include "check.h"

/* one snapshot for every test (it is large) */
static struct stat_snap snap __attribute__((unused));

#define KiB 1024u
#define MiB (1024u * 1024)

struct env {
	struct cache_config cfg;
	struct dev *devs[2];
	struct pm_region mirrors[2];
	int backing_fd;
	char dir[64];
	struct cache *c;
	uint64_t mlen;
	char err[CFG_ERRLEN]; /* why the last env_try_open failed */
};

static char *rbuf __attribute__((unused));

/* Open the cache: 0, or -errno with the reason in e->err. */
static inline int env_try_open(struct env *e)
{
	e->err[0] = 0;
	return cache_open_devs(&e->cfg, e->devs, 2, e->mirrors, e->backing_fd,
			       &e->c, e->err, sizeof(e->err));
}

static inline void env_open(struct env *e)
{
	if (env_try_open(e)) {
		fprintf(stderr, "cache_open_devs: %s\n", e->err);
		exit(1);
	}
}

static uint64_t max_files __attribute__((unused)) = 65536;
static uint64_t dirty_copies __attribute__((unused)) = 1;

/* A formatted cache, not opened; with a log l, its devices and mirrors
 * record every write, flush and persist there. */
static inline void env_format(struct env *e, uint64_t slots_per_dev,
			      uint32_t bs, struct rec_log *l)
{
	int i;

	memset(e, 0, sizeof(*e));
	cfg_defaults(&e->cfg);
	e->cfg.block_size = bs;
	e->cfg.ndevs = 2;
	e->cfg.dev_paths[0] = strdup("mem0");
	e->cfg.dev_paths[1] = strdup("mem1");
	e->cfg.meta_paths[0] = strdup("m0");
	e->cfg.meta_paths[1] = strdup("m1");
	e->cfg.idle_ms = 0;
	e->cfg.max_dirty_age_ms = 0;
	e->cfg.max_files = max_files;
	e->cfg.dirty_copies = dirty_copies;
	for (i = 0; i < 2; i++)
		if (l ? dev_rec_create(l, i, SB_DATA_OFF + slots_per_dev * bs,
				       &e->devs[i])
		      : dev_mem_create(SB_DATA_OFF + slots_per_dev * bs,
				       &e->devs[i]))
			exit(1);
	e->mlen = fmt_meta_len(&e->cfg, e->devs, 2);
	for (i = 0; i < 2; i++)
		if (l ? pm_rec_create(l, i, e->mlen, &e->mirrors[i])
		      : pm_mem_create(e->mlen, &e->mirrors[i]))
			exit(1);
	if (fmt_format_open(&e->cfg, e->devs, 2, e->mirrors, e->err,
			    sizeof(e->err))) {
		fprintf(stderr, "format: %s\n", e->err);
		exit(1);
	}
	strcpy(e->dir, "/tmp/nvc-unit-XXXXXX");
	if (!mkdtemp(e->dir))
		exit(1);
	e->backing_fd = open(e->dir, O_RDONLY | O_DIRECTORY);
}

/* Mirror i's header, and both headers' checksums made good again after a
 * test crafted them. */
static inline struct meta_hdr *hdr(struct env *e, int i)
{
	return e->mirrors[i].addr;
}

static inline void hdr_seal(struct env *e)
{
	int i;

	for (i = 0; i < 2; i++)
		hdr(e, i)->csum =
			meta_csum(hdr(e, i), offsetof(struct meta_hdr, csum));
}

/* The same, opened. */
static inline void env_init_rec(struct env *e, uint64_t slots_per_dev,
				uint32_t bs, struct rec_log *l)
{
	env_format(e, slots_per_dev, bs, l);
	env_open(e);
}

static inline void env_init(struct env *e, uint64_t slots_per_dev,
			    uint32_t bs)
{
	env_init_rec(e, slots_per_dev, bs, NULL);
}

static inline void env_fini(struct env *e)
{
	char cmd[128];
	int i;

	if (e->c)
		cache_close(e->c, 0);
	for (i = 0; i < 2; i++) {
		dev_close(e->devs[i]);
		pm_unmap(&e->mirrors[i]);
	}
	close(e->backing_fd);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", e->dir);
	(void)!system(cmd);
	cfg_free(&e->cfg);
}

static inline struct cfile *file_open(struct env *e, const char *name, int *fd)
{
	struct cfile *f;

	*fd = openat(e->backing_fd, name, O_RDWR | O_CREAT, 0644);
	if (*fd < 0 || cache_file_get(e->c, *fd, &f)) {
		perror(name);
		exit(1);
	}
	return f;
}

static inline void fill(char *p, size_t n, unsigned seed)
{
	size_t i;

	for (i = 0; i < n; i++) {
		seed = seed * 1103515245 + 12345;
		p[i] = seed >> 16;
	}
}

/* read len at off through the cache and compare with want */
static inline int same(struct env *e, struct cfile *f, const char *want, size_t len,
		uint64_t off)
{
	char *data;
	size_t n, done = 0;

	while (done < len) {
		size_t part = len - done > MiB ? MiB : len - done;

		if (cache_read(e->c, f, rbuf, part, off + done, &data, &n) ||
		    n != part)
			return 0;
		if (memcmp(data, want + done, n))
			return 0;
		done += n;
	}
	return 1;
}

static inline int backing_same(int fd, const char *want, size_t len)
{
	char *b = malloc(len + 1);
	ssize_t n = pread(fd, b, len + 1, 0);
	int ok = n == (ssize_t)len && !memcmp(b, want, len);

	free(b);
	return ok;
}

#endif
