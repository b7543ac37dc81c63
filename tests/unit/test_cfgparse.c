/* tests: the configuration parser refuses what it cannot read whole — long
 * lines, NUL bytes, overlong -o strings and values — instead of cutting it. */
#include <string.h>
#include <unistd.h>

#include "../../cache/cache.h"
#include "check.h"

static char path[] = "/tmp/nvc-unit-cfgpXXXXXX";

static int load(const char *text, size_t len, struct cache_config *c, char *err)
{
	FILE *f = fopen(path, "w");
	int ret;

	fwrite(text, 1, len, f);
	fclose(f);
	cfg_defaults(c);
	err[0] = 0;
	ret = cfg_load(c, path, err, CFG_ERRLEN);
	if (!ret)
		ret = cfg_validate(c, err, CFG_ERRLEN);
	return ret;
}

static void refused(int ret, const char *err, const char *what)
{
	CHECK(ret < 0);
	if (ret < 0)
		printf("  refused: %s\n", err);
	if (!strstr(err, what)) {
		fprintf(stderr, "  error '%s' does not say '%s'\n", err, what);
		CHECK(0);
	}
}

/* A line longer than the parser's buffer was cut, and its tail parsed as a
 * line of its own: here the tail sets cache.mode. */
static void test_long_line(void)
{
	struct cache_config c;
	char err[CFG_ERRLEN], text[2048], dev[400];
	int ret;

	memset(dev, 'd', sizeof(dev));
	memcpy(dev, "/dev/", 5);
	/* the cut falls just before "mode" */
	snprintf(text, sizeof(text),
		 "[cache]\ndevices = %.*smode=writearound\nmetadata = /m0, "
		 "/m1\n[backing]\npath = /b\n",
		 199 - 10, dev);
	ret = load(text, strlen(text), &c, err);
	if (!ret)
		fprintf(stderr, "  accepted: devices=%s mode=%d\n", c.devices,
			c.mode);
	refused(ret, err, ":2: line longer than");
	cfg_free(&c);
}

/* A NUL byte ended the line for the parser: the rest was dropped unseen. */
static void test_nul_byte(void)
{
	static const char text[] =
		"[cache]\ndevices = /dev/a\0, /dev/b\n"
		"metadata = /m0, /m1\n[backing]\npath = /b\n";
	struct cache_config c;
	char err[CFG_ERRLEN];
	int ret;

	ret = load(text, sizeof(text) - 1, &c, err);
	if (!ret)
		fprintf(stderr, "  accepted: devices=%s\n", c.devices);
	refused(ret, err, ":2: NUL byte");
	cfg_free(&c);
}

/* -o strings and rate values longer than the parser's buffers were cut. */
static void test_long_override(void)
{
	struct cache_config c;
	char err[CFG_ERRLEN], o[700], rate[100];
	int ret;

	cfg_defaults(&c);
	memset(o, 'p', sizeof(o));
	memcpy(o, "backing.path=/", 14);
	o[sizeof(o) - 1] = 0;
	err[0] = 0;
	ret = cfg_override(&c, o, err, sizeof(err));
	if (!ret)
		fprintf(stderr, "  accepted: a path of %zu bytes\n",
			strlen(c.backing_path));
	refused(ret, err, "too long");
	/* 1 written with 80 leading zeros: cut to 63 zeros it read as 0 */
	memset(rate, '0', sizeof(rate));
	snprintf(rate + 80, sizeof(rate) - 80, "1");
	snprintf(o, sizeof(o), "destage.max_rate=%s", rate);
	err[0] = 0;
	ret = cfg_override(&c, o, err, sizeof(err));
	if (!ret)
		CHECK_EQ(c.max_rate, 1);
	cfg_free(&c);
}

int main(void)
{
	int fd = mkstemp(path);

	if (fd < 0)
		return 1;
	close(fd);
	RUN(test_long_line);
	RUN(test_nul_byte);
	RUN(test_long_override);
	unlink(path);
	return CHECK_DONE();
}
