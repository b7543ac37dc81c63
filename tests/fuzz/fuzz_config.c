/* tests/fuzz: the configuration parser — cfg_load on the fuzzed file,
 * cfg_override on fuzzed -o strings, cfg_validate, a policy match. */
#define _GNU_SOURCE
#include "fuzz.h"
#include "../../cache/base/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void must_say(int ret, const char *err, const char *what)
{
	if (ret && !err[0])
		fz_fail(what);
}

/*
 * The input up to its first NUL byte is the INI file; each NUL-separated
 * string after it is one -o override.
 */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int fd = -1;
	static FILE *null;
	struct cache_config c, live;
	const uint8_t *nul = memchr(data, 0, size);
	size_t ini = nul ? (size_t)(nul - data) : size, at;
	char path[64], err[CFG_ERRLEN];
	int ret;

	if (fd < 0) {
		fd = memfd_create("nvcachefs-fuzz.conf", MFD_CLOEXEC);
		null = fopen("/dev/null", "w");
		log_setup(LOG_TO_STDERR);
	}
	if (fd < 0 || !null)
		fz_fail("memfd_create or /dev/null");
	if (ftruncate(fd, 0) || pwrite(fd, data, ini, 0) != (ssize_t)ini)
		fz_fail("write the configuration");
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	cfg_defaults(&c);
	err[0] = 0;
	ret = cfg_load(&c, path, err, sizeof(err));
	must_say(ret, err, "cfg_load refused without an error");
	for (at = ini + 1; !ret && at < size;) {
		const char *kv = (const char *)data + at;
		size_t n = strnlen(kv, size - at);
		char *o = strndup(kv, n);

		err[0] = 0;
		ret = cfg_override(&c, o, err, sizeof(err));
		must_say(ret, err, "cfg_override refused without an error");
		free(o);
		at += n + 1;
	}
	if (!ret) {
		err[0] = 0;
		ret = cfg_validate(&c, err, sizeof(err));
		must_say(ret, err, "cfg_validate refused without an error");
	}
	if (!ret) {
		struct pol_match m;

		pol_match(c.policies, "scratch/a/b.tmp", 12345, &m);
		pol_match(c.policies, "x", 0, &m);
		cfg_print(&c, null);
		cfg_defaults(&live);
		cfg_reload_into(&live, &c);
		cfg_free(&live);
	}
	cfg_free(&c);
	return 0;
}
