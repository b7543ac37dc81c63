/* tools: nvcachectl — format a cache, show its statistics, flush it. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../cache/cache.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: nvcachectl COMMAND [OPTIONS]\n"
		   "\n"
		   "  format -c FILE [--force] [-o section.key=value]...\n"
		   "        write fresh superblocks and metadata to the "
		   "configured devices\n"
		   "  stats MOUNTPOINT [--json]\n"
		   "        show the cache's statistics\n"
		   "  check -c FILE\n"
		   "        offline consistency check of an unmounted cache; "
		   "non-zero on any problem\n"
		   "  flush MOUNTPOINT\n"
		   "        destage all dirty data now; returns when the "
		   "backing store holds it\n"
		   "  --help, --version\n");
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int fail(const char *fmt, ...)
{
	va_list ap;

	fputs("nvcachectl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

static int load_cfg(struct cache_config *cfg, const char *file, char **ov,
		    int nov)
{
	char err[CFG_ERRLEN];
	int i, ret;

	cfg_defaults(cfg);
	ret = cfg_load(cfg, file, err, sizeof(err));
	for (i = 0; !ret && i < nov; i++)
		ret = cfg_override(cfg, ov[i], err, sizeof(err));
	if (!ret)
		ret = cfg_validate(cfg, err, sizeof(err));
	if (ret)
		fail("%s", err);
	return ret;
}

/*
 * "-c FILE [-o section.key=value]... [--force]": the configuration that format
 * and check work on.  Returns -1 once cfg is loaded, else the exit code.
 */
static int cfg_command(int argc, char **argv, const char *cmd, int *force,
		       struct cache_config *cfg)
{
	static const struct option lo[] = { { "force", no_argument, NULL, 'F' },
					    { "help", no_argument, NULL, 'h' },
					    { NULL, 0, NULL, 0 } };
	const char *file = NULL;
	char *ov[64];
	int nov = 0, opt;

	while ((opt = getopt_long(argc, argv, "c:o:h", lo, NULL)) != -1) {
		switch (opt) {
		case 'c':
			file = optarg;
			break;
		case 'o':
			if (nov < 64)
				ov[nov++] = optarg;
			break;
		case 'F':
			if (!force)
				return fail("%s takes no --force", cmd);
			*force = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!file)
		return fail("%s needs -c FILE", cmd);
	if (load_cfg(cfg, file, ov, nov)) {
		cfg_free(cfg);
		return 1;
	}
	return -1;
}

static int cmd_format(int argc, char **argv)
{
	struct cache_config cfg;
	struct fmt_opts o = { 0 };
	int ret = cfg_command(argc, argv, "format", &o.force, &cfg);

	if (ret >= 0)
		return ret;
	ret = fmt_format(&cfg, &o);
	if (ret) {
		cfg_free(&cfg);
		return fail("%s", o.err);
	}
	printf("formatted %d device%s with block size %llu; metadata mirrors "
	       "%s, %s\n",
	       cfg.ndevs, cfg.ndevs > 1 ? "s" : "",
	       (unsigned long long)cfg.block_size, cfg.meta_paths[0],
	       cfg.meta_paths[1]);
	cfg_free(&cfg);
	return 0;
}

static int cmd_check(int argc, char **argv)
{
	struct cache_config cfg;
	char err[CFG_ERRLEN] = "";
	int ret = cfg_command(argc, argv, "check", NULL, &cfg);

	if (ret >= 0)
		return ret;
	ret = fmt_check(&cfg, stdout, err, sizeof(err));
	cfg_free(&cfg);
	if (ret < 0)
		return fail("%s", err);
	if (ret)
		fprintf(stderr, "nvcachectl: the cache is not consistent (see "
				"the report above)\n");
	return ret ? 1 : 0;
}

static int ctl_connect(const char *mountpoint, const char *cmd, FILE **out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char mnt[PATH_MAX], path[108];
	int fd;

	if (!realpath(mountpoint, mnt))
		return fail("%s: %s", mountpoint, strerror(errno));
	if (ctl_socket_path(mnt, path, sizeof(path)))
		return fail("%s: path too long", mnt);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fail("socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		int e = errno;

		close(fd);
		if (e == ENOENT || e == ECONNREFUSED)
			return fail("%s is not an nvcachefs mount (no daemon "
				    "answers at %s)",
				    mnt, path);
		return fail("%s: %s", path, strerror(e));
	}
	if (send(fd, cmd, strlen(cmd), MSG_NOSIGNAL) < 0) {
		close(fd);
		return fail("%s: %s", path, strerror(errno));
	}
	*out = fdopen(fd, "r");
	return *out ? 0 : fail("fdopen: %s", strerror(errno));
}

struct kv {
	char key[64];
	unsigned long long v;
};

static unsigned long long kv_get(const struct kv *k, int n, const char *name)
{
	int i;

	for (i = 0; i < n; i++)
		if (!strcmp(k[i].key, name))
			return k[i].v;
	return 0;
}

static void human(double b, char *out, size_t len)
{
	const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	int i = 0;

	while (b >= 1024 && i < 4) {
		b /= 1024;
		i++;
	}
	snprintf(out, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static int cmd_stats(int argc, char **argv)
{
	static const struct option lo[] = { { "json", no_argument, NULL, 'j' },
					    { "help", no_argument, NULL, 'h' },
					    { NULL, 0, NULL, 0 } };
	struct kv kv[64];
	char line[512], devs[16][512], mirrors[2][512];
	int nkv = 0, ndev = 0, nmir = 0, json = 0, opt, proto = 0, i;
	FILE *f;

	while ((opt = getopt_long(argc, argv, "jh", lo, NULL)) != -1) {
		switch (opt) {
		case 'j':
			json = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1)
		return fail("stats needs one MOUNTPOINT");
	if (ctl_connect(argv[optind], "stats\n", &f))
		return 1;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		if (!strcmp(line, "end"))
			break;
		if (!strncmp(line, "error ", 6)) {
			fclose(f);
			return fail("daemon: %s", line + 6);
		}
		if (sscanf(line, "proto %d", &proto) == 1)
			continue;
		if (!strncmp(line, "dev ", 4)) {
			if (ndev < 16)
				snprintf(devs[ndev++], sizeof(devs[0]),
					 "%.500s", line + 4);
			continue;
		}
		if (!strncmp(line, "mirror ", 7)) {
			if (nmir < 2)
				snprintf(mirrors[nmir++], sizeof(mirrors[0]),
					 "%.500s", line + 7);
			continue;
		}
		if (nkv < 64 &&
		    sscanf(line, "%63s %llu", kv[nkv].key, &kv[nkv].v) == 2)
			nkv++;
	}
	fclose(f);
	if (proto != CTL_PROTO_VERSION)
		return fail("the daemon speaks statistics protocol %d, this "
			    "nvcachectl "
			    "speaks %d; use the nvcachectl of the same version",
			    proto, CTL_PROTO_VERSION);
#define GET(name) kv_get(kv, nkv, name)
	if (json) {
		struct json_object *o = json_object_new_object(),
				   *d = json_object_new_array();

		for (i = 0; i < nkv; i++)
			json_object_object_add(o, kv[i].key,
					       json_object_new_int64(kv[i].v));
		for (i = 0; i < ndev; i++)
			json_object_array_add(d,
					      json_object_new_string(devs[i]));
		json_object_object_add(o, "devices", d);
		d = json_object_new_array();
		for (i = 0; i < nmir; i++)
			json_object_array_add(
				d, json_object_new_string(mirrors[i]));
		json_object_object_add(o, "mirrors", d);
		puts(json_object_to_json_string_ext(o,
						    JSON_C_TO_STRING_PRETTY));
		json_object_put(o);
		return 0;
	}
	{
		unsigned long long rops = GET("read_ops"),
				   hit = GET("read_hit_ops");
		unsigned long long rb = GET("read_bytes"),
				   hb = GET("read_hit_bytes");
		unsigned long long cap = GET("capacity_bytes"),
				   used = GET("used_bytes");
		unsigned long long dirty = GET("dirty_bytes");
		char a[32], b[32], c[32];

		printf("reads       %llu ops, %llu hits, %llu misses, %llu "
		       "partial; hit ratio %.1f%% (ops), %.1f%% (bytes)\n",
		       rops, hit, GET("read_miss_ops"), GET("read_partial_ops"),
		       rops ? 100.0 * hit / rops : 0.0,
		       rb ? 100.0 * hb / rb : 0.0);
		human(hb, a, sizeof(a));
		human(GET("read_miss_bytes"), b, sizeof(b));
		printf("read bytes  %s from cache, %s from backing\n", a, b);
		human(GET("write_bytes"), a, sizeof(a));
		printf("writes      %llu ops (%llu hit cached blocks), %s, "
		       "%llu bypassed\n",
		       GET("write_ops"), GET("write_hit_ops"), a,
		       GET("bypass_ops"));
		human(used, a, sizeof(a));
		human(cap, b, sizeof(b));
		human(dirty, c, sizeof(c));
		printf("occupancy   %s of %s (%.1f%%), dirty %s (%.1f%%)\n", a,
		       b, cap ? 100.0 * used / cap : 0.0, c,
		       cap ? 100.0 * dirty / cap : 0.0);
		human(GET("destaged_bytes"), a, sizeof(a));
		printf("destage     %s, %s destaged, %llu errors, %llu "
		       "evictions\n",
		       GET("destaging") ? "destaging" : "idle", a,
		       GET("destage_errors"), GET("evictions"));
		for (i = 0; i < ndev; i++)
			printf("device      %s\n", devs[i]);
		for (i = 0; i < nmir; i++)
			printf("mirror      %s\n", mirrors[i]);
		if (GET("meta_repaired"))
			printf("metadata    %llu records repaired at mount\n",
			       GET("meta_repaired"));
	}
	return 0;
}

static int cmd_flush(int argc, char **argv)
{
	char line[256];
	int tty = isatty(STDOUT_FILENO), ok = 0;
	unsigned long long dirty, destaged, first = 0;
	FILE *f;

	if (argc != 2)
		return fail("flush needs one MOUNTPOINT");
	if (ctl_connect(argv[1], "flush\n", &f))
		return 1;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		if (sscanf(line, "progress %llu %llu", &dirty, &destaged) ==
		    2) {
			char a[32];

			if (!first)
				first = destaged + 1;
			if (tty) {
				human(dirty, a, sizeof(a));
				printf("\rflush: %s dirty left      ", a);
				fflush(stdout);
			}
			continue;
		}
		if (!strcmp(line, "ok")) {
			ok = 1;
			break;
		}
		if (!strncmp(line, "error ", 6)) {
			if (tty)
				putchar('\n');
			fclose(f);
			return fail("flush failed: %s", line + 6);
		}
	}
	fclose(f);
	if (tty)
		printf("\rflush: done                      \n");
	return ok ? 0 : fail("the daemon went away before the flush finished");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
		printf("nvcachectl %s\n", NVC_VERSION);
		return 0;
	}
	if (!strcmp(argv[1], "format"))
		return cmd_format(argc - 1, argv + 1);
	if (!strcmp(argv[1], "stats"))
		return cmd_stats(argc - 1, argv + 1);
	if (!strcmp(argv[1], "flush"))
		return cmd_flush(argc - 1, argv + 1);
	if (!strcmp(argv[1], "check"))
		return cmd_check(argc - 1, argv + 1);
	fprintf(stderr, "nvcachectl: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
