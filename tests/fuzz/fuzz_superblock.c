/* tests/fuzz: the superblock loader — sb_read and the checks cache_open
 * makes, on an in-memory device holding the fuzzed superblock. */
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

/*
 * Control byte bit 2: which device gets the fuzzed superblock; bit 3: the
 * input holds both copies (8 KiB), else one copy written to both places.
 */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct fz_setup *s;
	struct dev *devs[FZ_NDEVS];
	struct pm_region m[2];
	struct sb_disk sb;
	uint8_t control, *area;
	char why[512];
	int d, copy, i;

	if (size < 1)
		return 0;
	control = data[0];
	data++;
	size--;
	s = fz_setup(control);
	d = (control >> 2) & 1;
	area = dev_alloc_buf(FZ_SB_AREA);
	memcpy(area, s->sb[d], FZ_SB_AREA);
	for (copy = 0; copy < SB_COPIES; copy++) {
		const uint8_t *src = data;
		size_t n = size;
		uint8_t *dst = area + 4096 * (copy + 1);

		if (control & 8) {
			src = copy ? data + 4096 : data;
			n = copy ? (size > 4096 ? size - 4096 : 0)
				 : (size < 4096 ? size : 4096);
		}
		memset(dst, 0, 4096);
		memcpy(dst, src, n < 4096 ? n : 4096);
		if (control & FZ_FIX_CSUM)
			fz_fix_sb(dst);
	}
	fz_devs(s, devs);
	if (dev_write(devs[d], area, FZ_SB_AREA, 0))
		fz_fail("dev_write");
	free(area);
	why[0] = 0;
	if (sb_read_why(devs[d], &sb, why, sizeof(why)) && !why[0])
		fz_fail("sb_read refused without an error");
	for (i = 0; i < 2; i++)
		fz_region(&m[i], s->mirror[i], s->mirror_len, s->mirror_len);
	fz_open_close(s, devs, m, 0);
	fz_devs_close(devs);
	for (i = 0; i < 2; i++)
		pm_unmap(&m[i]);
	return 0;
}
