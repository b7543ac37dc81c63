/* tests: the example configuration (tools/examples/nvcachefs.conf, shipped in
 * the package) parses and validates, and says what its comments say. */
#include <string.h>

#include "../../cache/cache.h"
#include "../../cache/base/policy.h"
#include "check.h"

int main(int argc, char **argv)
{
	struct cache_config c;
	char err[CFG_ERRLEN] = "";
	int ret;

	if (argc != 2) {
		fprintf(stderr, "usage: test_example CONFIG\n");
		return 2;
	}
	cfg_defaults(&c);
	ret = cfg_load(&c, argv[1], err, sizeof(err));
	if (!ret)
		ret = cfg_validate(&c, err, sizeof(err));
	if (ret)
		fprintf(stderr, "%s\n", err);
	CHECK_EQ(ret, 0);
	if (!ret) {
		CHECK_EQ(c.ndevs, 2);
		CHECK_EQ(c.dirty_copies, 2);
		CHECK_EQ(c.block_size, 64 * 1024);
		CHECK_EQ(pol_count(c.policies), 2);
	}
	cfg_free(&c);
	if (!check_failures)
		printf("ok: %s\n", argv[1]);
	return check_failures ? 1 : 0;
}
