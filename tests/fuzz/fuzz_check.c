/* tests/fuzz: nvcachectl check (fmt_check_open) on fuzzed mirrors and a
 * fuzzed superblock. */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Control byte bits 2-3 as in fuzz_mirrors; bit 4: the input's last 4 KiB
 * are device 0's first superblock copy instead of mirror bytes.
 */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct fz_setup *s;
	struct dev *devs[FZ_NDEVS];
	struct pm_region m[2];
	uint8_t control, *sb = NULL;
	char *out = NULL;
	size_t outlen = 0;
	FILE *f;
	int i, problems;

	if (size < 1)
		return 0;
	control = data[0];
	data++;
	size--;
	s = fz_setup(control);
	fz_devs(s, devs);
	if ((control & 16) && size >= 4096) {
		sb = dev_alloc_buf(4096);
		memcpy(sb, data + size - 4096, 4096);
		size -= 4096;
		if (control & FZ_FIX_CSUM)
			fz_fix_sb(sb);
		if (dev_write(devs[0], sb, 4096, 4096))
			fz_fail("dev_write");
		free(sb);
	}
	fz_mirrors(s, control, data, size, m);
	f = open_memstream(&out, &outlen);
	if (!f)
		fz_fail("open_memstream");
	problems = fmt_check_open(&s->cfg, devs, s->cfg.ndevs, m, f, 0);
	fclose(f);
	/* every problem counted is a line of the report */
	if (problems && (!out || !strstr(out, "  PROBLEM ")))
		fz_fail("check counted a problem it did not report");
	if (!problems && (!out || !strstr(out, "no problems found")))
		fz_fail("check found nothing but did not say so");
	free(out);
	fz_devs_close(devs);
	for (i = 0; i < 2; i++)
		pm_unmap(&m[i]);
	return 0;
}
