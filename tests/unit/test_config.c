/* tests: the configuration table — parsing, units, errors with FILE:LINE,
 * validation, nesting of the mount point and the backing directory. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../cache/cache.h"
#include "check.h"

static char path[] = "/tmp/nvc-unit-cfgXXXXXX";

static int load(const char *text, struct cache_config *c, char *err)
{
	FILE *f = fopen(path, "w");
	int ret;

	fputs(text, f);
	fclose(f);
	cfg_defaults(c);
	ret = cfg_load(c, path, err, CFG_ERRLEN);
	if (!ret)
		ret = cfg_validate(c, err, CFG_ERRLEN);
	return ret;
}

static const char *base = "[cache]\ndevices = /dev/a, /dev/b\nmetadata = "
			  "/m0,/m1\n[backing]\npath = /b\n";

static void test_defaults_and_units(void)
{
	struct cache_config c;
	char err[CFG_ERRLEN], text[1024];

	snprintf(text, sizeof(text),
		 "%s[destage]\nmax_dirty_age = 2min\nidle_after = "
		 "250ms\nmax_rate = 100M/s\n"
		 "[cache]\nblock_size = 1M\nmode = writethrough\n",
		 base);
	CHECK_EQ(load(text, &c, err), 0);
	CHECK_EQ(c.ndevs, 2);
	CHECK(!strcmp(c.dev_paths[1], "/dev/b"));
	CHECK(!strcmp(c.meta_paths[1], "/m1"));
	CHECK_EQ(c.block_size, 1 << 20);
	CHECK_EQ(c.max_dirty_age_ms, 120000);
	CHECK_EQ(c.idle_ms, 250);
	CHECK_EQ(c.max_rate, 100 << 20);
	CHECK_EQ(c.mode, MODE_WRITETHROUGH);
	CHECK_EQ(c.high_wm, 80);
	CHECK_EQ(c.low_wm, 50);
	cfg_free(&c);
}

static void expect_error(const char *extra, const char *msg)
{
	struct cache_config c;
	char err[CFG_ERRLEN] = "", text[1024];

	snprintf(text, sizeof(text), "%s%s", base, extra);
	CHECK(load(text, &c, err) != 0);
	if (!strstr(err, msg)) {
		fprintf(stderr, "expected '%s' in '%s'\n", msg, err);
		check_failures++;
	}
	cfg_free(&c);
}

static void test_errors_name_file_and_line(void)
{
	char want[256];

	snprintf(want, sizeof(want), "%s:7: unknown key 'cache.bogus'", path);
	expect_error("[cache]\nbogus = 1\n", want);
	snprintf(want, sizeof(want),
		 "%s:8: destage.low_watermark (90) must be below "
		 "destage.high_watermark (80)",
		 path);
	expect_error("[destage]\nhigh_watermark = 80\nlow_watermark = 90\n",
		     want);
	expect_error("[cache]\nblock_size = 48K\n",
		     ":7: cache.block_size must be a power of two");
	expect_error("[cache]\nblock_size = 2K\n", "out of range");
	expect_error("[destage]\nthreads = 0\n", "out of range");
	expect_error("[destage]\nmax_dirty_age = 3 weeks\n", "is not a time");
	expect_error("[cache]\ndirty_copies = 2\ndevices = /only\n",
		     "needs at least two cache.devices");
	expect_error("[cache]\nmetadata = /m0\n", "exactly two locations");
	expect_error("[cache]\ndevices = /a, /a\n", "names /a twice");
	expect_error("[cache]\ndevices = spare, spare\n",
		     "needs a device besides its spare places");
	expect_error("[cache]\ndirty_copies = 2\ndevices = /a, spare\n",
		     "needs at least two cache.devices (not spare places)");
	expect_error("[cache]\nmetadata = /dev/a, /m1\n",
		     "is both a metadata mirror and a cache device");
}

static void test_override_and_reload(void)
{
	struct cache_config c, n;
	char err[CFG_ERRLEN];

	CHECK_EQ(load(base, &c, err), 0);
	CHECK_EQ(
		cfg_override(&c, "destage.high_watermark=90", err, sizeof(err)),
		0);
	CHECK_EQ(c.high_wm, 90);
	CHECK(cfg_override(&c, "destage.nope=1", err, sizeof(err)) != 0);
	CHECK(strstr(err, "unknown key 'destage.nope'") != NULL);
	CHECK(cfg_override(&c, "novalue", err, sizeof(err)) != 0);
	CHECK_EQ(load(base, &n, err), 0);
	n.high_wm = 70;
	n.block_size = 128 * 1024;
	CHECK_EQ(cfg_reload_into(&c, &n), 1);
	CHECK_EQ(c.high_wm, 70);
	CHECK_EQ(c.block_size, 64 * 1024); /* not reloadable */
	cfg_free(&c);
	cfg_free(&n);
}

/* cfg_check_nesting of mount point m and backing directory b under dir. */
static int nesting(const char *dir, const char *m, const char *b, char *err)
{
	char mp[256], bp[256];
	int bfd, ret;

	snprintf(mp, sizeof(mp), "%s/%s", dir, m);
	snprintf(bp, sizeof(bp), "%s/%s", dir, b);
	bfd = open(bp, O_RDONLY | O_DIRECTORY);
	if (bfd < 0)
		return -errno;
	err[0] = 0;
	ret = cfg_check_nesting(mp, bfd, bp, err, CFG_ERRLEN);
	close(bfd);
	return ret;
}

/*
 * A mount point inside the backing directory, or holding it, is refused,
 * however either is named (issue 24, finding 10); a name that only begins
 * like the other's is not inside it.
 */
static void test_nesting_refused(void)
{
	char dir[] = "/tmp/nvc-unit-nestXXXXXX", err[CFG_ERRLEN], sub[300];
	int bfd;

	CHECK(mkdtemp(dir) != NULL);
	snprintf(sub, sizeof(sub), "mkdir -p '%s/b/sub/deeper'", dir);
	CHECK_EQ(system(sub), 0);
	snprintf(sub, sizeof(sub), "%s/b-mnt", dir);
	CHECK_EQ(mkdir(sub, 0755), 0);
	snprintf(sub, sizeof(sub), "%s/lb", dir);
	CHECK_EQ(symlink("b", sub), 0);

	CHECK_EQ(nesting(dir, "b-mnt", "b", err), 0);
	CHECK_EQ(nesting(dir, "b/sub", "b", err), -EINVAL);
	CHECK(strstr(err, "/b/sub is inside the backing directory") != NULL);
	CHECK_EQ(nesting(dir, "lb/sub/deeper", "b", err), -EINVAL);
	CHECK(strstr(err, "/b/sub/deeper is inside the backing directory") !=
	      NULL);
	CHECK_EQ(nesting(dir, "b/sub", "lb", err), -EINVAL);
	CHECK(strstr(err, "is inside the backing directory") != NULL);
	CHECK_EQ(nesting(dir, "b", "b/sub", err), -EINVAL);
	CHECK(strstr(err, "/b/sub is inside the mount point") != NULL);
	CHECK_EQ(nesting(dir, "lb", "lb/sub", err), -EINVAL);
	CHECK(strstr(err, "is inside the mount point") != NULL);
	CHECK_EQ(nesting(dir, "lb", "b", err), -EINVAL);
	CHECK(strstr(err, "cannot be the backing directory") != NULL);
	/* the backing directory is the tree the mount point is in */
	bfd = open("/", O_RDONLY | O_DIRECTORY);
	CHECK_EQ(cfg_check_nesting(dir, bfd, "/", err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "is inside the backing directory /:") != NULL);
	close(bfd);

	snprintf(sub, sizeof(sub), "rm -rf '%s'", dir);
	CHECK_EQ(system(sub), 0);
}

int main(void)
{
	int fd = mkstemp(path);

	close(fd);
	log_setup(LOG_TO_STDERR);
	RUN(test_defaults_and_units);
	RUN(test_errors_name_file_and_line);
	RUN(test_override_and_reload);
	RUN(test_nesting_refused);
	unlink(path);
	return CHECK_DONE();
}
