/* tests/fuzz: the mirror loaders — meta_attach and recover_load through
 * cache_open_devs, on fuzzed metadata mirrors. */
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

/*
 * Control byte bits 2-3, what the rest of the input is:
 *	0	both mirrors: the first half is mirror 0, the second mirror 1
 *	1	mirror 1; mirror 0 is a good, formatted one
 *	2	both mirrors, the same bytes
 *	3	mirror 0; mirror 1 is lost (zeros) and is rebuilt from it
 * and bits 4-6 (FZ_LIVE...): a real backing file behind the file records.
 */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct fz_setup *s;
	struct dev *devs[FZ_NDEVS];
	struct pm_region m[2];
	uint8_t control;
	int i;

	if (size < 1)
		return 0;
	control = data[0];
	data++;
	size--;
	s = fz_setup(control);
	fz_mirrors(s, control, data, size, m);
	fz_devs(s, devs);
	fz_open_close(s, devs, m, control);
	fz_devs_close(devs);
	for (i = 0; i < 2; i++)
		pm_unmap(&m[i]);
	return 0;
}
