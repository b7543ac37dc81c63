/* tests/fuzz: what the fuzz targets share — in-memory caches formatted once,
 * fuzzed bytes laid over them, checksums recomputed on request. */
#ifndef NVC_FUZZ_H
#define NVC_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "../../cache/cache.h"
#include "../../cache/media/media.h"

/*
 * Every target's input starts with one control byte:
 *
 *	bit 0	recompute the checksums of whatever the input supplies
 *		(headers, records, superblocks), so that the fuzzer gets past
 *		them and only the field checks can refuse the input
 *	bit 1	geometry: 0 = 4 KiB blocks, 1 = 1 MiB blocks (4 bitmap words)
 *	bits 2-3, 4-7	per target (see each target)
 *
 * Caches are 2 devices of 4 slots each, formatted once per process with a
 * fixed set uuid, so that corpus images made by fuzz_gen fit the devices.
 */
#define FZ_FIX_CSUM 1u
#define FZ_BIG_BLOCKS 2u

#define FZ_NDEVS 2
#define FZ_PER_DEV 4
#define FZ_SB_AREA (3 * 4096u) /* both superblock copies */

struct fz_setup {
	struct cache_config cfg;
	uint64_t dev_size;
	uint64_t mirror_len;
	uint8_t *sb[FZ_NDEVS]; /* each device's first FZ_SB_AREA bytes */
	uint8_t *mirror[2]; /* formatted, empty mirrors */
};

/* The formatted geometry for a control byte (built on first use). */
const struct fz_setup *fz_setup(uint8_t control);

/* Fresh in-memory devices holding the formatted superblocks. */
void fz_devs(const struct fz_setup *s, struct dev *devs[FZ_NDEVS]);
void fz_devs_close(struct dev *devs[FZ_NDEVS]);

/* A region of len bytes holding data (zero-filled past data_len). */
void fz_mirrors(const struct fz_setup *s, uint8_t control, const uint8_t *data,
		size_t size, struct pm_region m[2]);
void fz_region(struct pm_region *r, const void *data, size_t data_len,
	       size_t len);

/* Recompute the header, record and slot checksums of a mirror image. */
void fz_fix_mirror(uint8_t *p, size_t len);
/* Recompute a superblock copy's checksum. */
void fz_fix_sb(uint8_t *p);

/*
 * Open and close a cache on devs and mirrors.  An open that fails must say
 * why: the target aborts if err is empty.  The backing directory is /proc,
 * on which no file handle resolves, so recovery touches no real file; or,
 * with FZ_LIVE, a private scratch directory: then every file record of the
 * mirrors is first made to name its one scratch file (nothing fuzzed reaches
 * open_by_handle_at), so that recovery opens, trims and destages for real.
 */
#define FZ_LIVE 0x10u /* a scratch backing file stands behind every record */
#define FZ_LIVE_SAME 0x20u /* ... unchanged since the cache last saw it */
#define FZ_LIVE_FLUSH 0x40u /* ... and everything is destaged before close */

int fz_open_close(const struct fz_setup *s, struct dev *devs[FZ_NDEVS],
		  struct pm_region mirrors[2], unsigned live);

/* abort() with a message: a rejection without an error string. */
void fz_fail(const char *what) __attribute__((noreturn));

#endif
