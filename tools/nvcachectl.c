/* tools: nvcachectl — format a cache, show its statistics, flush it; the
 * per-file commands are in filecmds.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <json-c/json.h>
#include <limits.h>
#include <mntent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../cache/cache.h"
#include "filecmds.h"
#include "show.h"

/* a request line: the command and the protocol it is spoken in */
#define STR2(x) #x
#define STR(x) STR2(x)
#define CTL_CMD(c) c " " STR(CTL_PROTO_VERSION) "\n"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: nvcachectl COMMAND [OPTIONS]\n"
		"\n"
		"  format -c FILE [--force] [-o section.key=value]...\n"
		"        write fresh superblocks and metadata to the "
		"configured devices\n"
		"  stats MOUNTPOINT [-i SECONDS [--count N]] [--json | "
		"--prometheus]\n"
		"        show the cache's statistics; -i: what changed "
		"every interval,\n"
		"        with running totals, until interrupted\n"
		"  stats MOUNTPOINT --reset\n"
		"        start the counters and latency maxima again "
		"(owner only)\n"
		"  check -c FILE\n"
		"        offline consistency check of an unmounted cache; "
		"non-zero on any problem\n"
		"  devices -c FILE\n"
		"        the cache.devices line naming today's members, "
		"found by their UUIDs\n"
		"        (cache.devices need not change after a device "
		"change: it is a list\n"
		"        of candidates)\n"
		"  flush MOUNTPOINT [PATH... [-r]]\n"
		"        destage all dirty data now (or only that of the "
		"PATHs); returns when\n"
		"        the backing store holds it\n"
		"  detach MOUNTPOINT\n"
		"        destage everything, drop the cache and close its "
		"devices: the mount\n"
		"        then serves every request from the backing store, "
		"also after a\n"
		"        remount, and the devices can be pulled or reused\n"
		"  attach MOUNTPOINT\n"
		"        take the cache devices back (checked as a mount "
		"checks them)\n"
		"  replace MOUNTPOINT OLD NEW\n"
		"        cache device OLD's blocks (from OLD, or from the "
		"second copies if it\n"
		"        failed) are copied onto NEW while the mount serves, "
		"and NEW takes\n"
		"        its place (found by its UUID at the next mount); "
		"OLD by any name of\n"
		"        it, or UUID=its member UUID\n"
		"  remove MOUNTPOINT DEVICE\n"
		"        empty the cache device (dirty data destaged, clean "
		"data dropped) and\n"
		"        stop using it, so that it can be pulled\n"
		"  add MOUNTPOINT DEVICE\n"
		"        DEVICE takes a free member place (a cache.devices "
		"entry \"spare\" at\n"
		"        format, or a removed device's) and is used at once\n"
		"  replace-mirror MOUNTPOINT OLD NEW\n"
		"        metadata mirror OLD (failed or not) becomes NEW (a "
		"new file or an\n"
		"        empty block device), rebuilt from the other mirror "
		"while the mount\n"
		"        serves; then change cache.metadata to name NEW (a "
		"mount finds NEW\n"
		"        through OLD until then)\n"
		"  warm PATH... [-r] [--partial]\n"
		"        read the files into the cache (all of them must "
		"fit, unless --partial:\n"
		"        what fits); -r: directories, recursively; Ctrl-C "
		"stops it\n"
		"  pin PATH... [-r]\n"
		"        keep the files in the cache whatever else is read: "
		"warms them too, and\n"
		"        the pins survive remounts and crashes; at most "
		"cache.max_pinned percent\n"
		"        of the cache; a pinned file deleted gives its pin "
		"back\n"
		"  unpin PATH... [-r]\n"
		"        let the files' data be evicted again\n"
		"  evict PATH... [-r] [--flush]\n"
		"        drop the files' clean cached data now; --flush: "
		"destage their dirty\n"
		"        data first, then drop it too (pinned files: unpin "
		"them first)\n"
		"  status PATH... [-r] [--json]\n"
		"        each file's size, bytes cached, bytes dirty, pin, "
		"age of its oldest\n"
		"        dirty data, whether the backing file is up to date "
		"and its policy;\n"
		"        -r: totals and the top files by cached and by dirty "
		"bytes\n"
		"  --help, --version\n");
}

int fail(const char *fmt, ...)
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
	char b[2][32];

	if (ret >= 0)
		return ret;
	ret = fmt_format(&cfg, &o);
	if (ret) {
		cfg_free(&cfg);
		return fail("%s", o.err);
	}
	stat_fmt_bytes(o.capacity, b[0], sizeof(b[0]));
	stat_fmt_bytes(o.max_capacity, b[1], sizeof(b[1]));
	printf("formatted %d device%s with block size %llu; metadata mirrors "
	       "%s, %s\n"
	       "capacity %s; nvcachectl add can grow it to %s "
	       "(cache.max_capacity)\n",
	       cfg.ndevs, cfg.ndevs > 1 ? "s" : "",
	       (unsigned long long)cfg.block_size, cfg.meta_paths[0],
	       cfg.meta_paths[1], b[0], b[1]);
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

/* The cache.devices line that names today's members (found by identity). */
static int cmd_devices(int argc, char **argv)
{
	struct cache_config cfg;
	char err[CFG_ERRLEN] = "", line[NVC_MAX_DEVS * 272];
	int ret = cfg_command(argc, argv, "devices", NULL, &cfg);

	if (ret >= 0)
		return ret;
	ret = fmt_devices_line(&cfg, line, sizeof(line), err, sizeof(err));
	cfg_free(&cfg);
	if (ret < 0)
		return fail("%s", err);
	printf("devices = %s\n", line);
	return 0;
}

/* Is mnt a mounted nvcachefs, by its type in the mount table? */
static int is_nvcachefs_mount(const char *mnt)
{
	FILE *f = setmntent("/proc/self/mounts", "r");
	struct mntent *m;
	int yes = 0;

	if (!f)
		return 0;
	while ((m = getmntent(f)))
		if (!strcmp(m->mnt_dir, mnt) &&
		    !strcmp(m->mnt_type, "fuse.nvcachefs"))
			yes = 1;
	endmntent(f);
	return yes;
}

/*
 * The kernel shows the mount a moment before the daemon listens on its
 * socket: on an nvcachefs mount, a missing socket is waited for (2 s at
 * most), so that "mount; nvcachectl stats" works.
 */
static int connect_retry(const struct sockaddr_un *sa, const char *mnt)
{
	int tries, fd, e;

	for (tries = 0;; tries++) {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (!connect(fd, (const struct sockaddr *)sa, sizeof(*sa)))
			return fd;
		e = errno;
		close(fd);
		if ((e != ENOENT && e != ECONNREFUSED) || tries >= 100 ||
		    !is_nvcachefs_mount(mnt))
			return -e;
		usleep(20000);
	}
}

/*
 * All of the request.  A daemon that refuses it (too large, too many
 * clients) answers before it closes: when a write fails for that, the
 * answer is there to read, and says why better than "Broken pipe" would.
 * 0, or the errno of the write.
 */
static int send_request(int fd, const char *req, size_t len)
{
	char c;

	while (len) {
		ssize_t n = send(fd, req, len, MSG_NOSIGNAL);
		int e = errno;

		if (n < 0 && e == EINTR)
			continue;
		if (n < 0) {
			if ((e == EPIPE || e == ECONNRESET) &&
			    recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 1)
				return 0;
			return e;
		}
		req += n;
		len -= n;
	}
	return 0;
}

int ctl_connect_len(const char *mountpoint, const char *cmd, size_t clen,
		    FILE **out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char mnt[PATH_MAX], path[108];
	int fd, e;

	if (!realpath(mountpoint, mnt))
		return fail("%s: %s", mountpoint, strerror(errno));
	if (ctl_socket_path(mnt, path, sizeof(path)))
		return fail("%s: path too long", mnt);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	fd = connect_retry(&sa, mnt);
	if (fd < 0) {
		e = -fd;
		if (e == ENOENT || e == ECONNREFUSED)
			return fail("%s is not an nvcachefs mount (no daemon "
				    "answers at %s)",
				    mnt, path);
		return fail("%s: %s", path, strerror(e));
	}
	e = send_request(fd, cmd, clen);
	if (e) {
		close(fd);
		return fail("%s: %s", path, strerror(e));
	}
	*out = fdopen(fd, "r");
	return *out ? 0 : fail("fdopen: %s", strerror(errno));
}

static int ctl_connect(const char *mountpoint, const char *cmd, FILE **out)
{
	return ctl_connect_len(mountpoint, cmd, strlen(cmd), out);
}

/* One statistics snapshot from the daemon behind mnt; 0 or an exit code. */
int ctl_fetch_stats(const char *mnt, struct stat_snap *s)
{
	char line[512], err[256];
	int proto = 0;
	FILE *f;

	if (ctl_connect(mnt, CTL_CMD("stats"), &f))
		return 1;
	if (!fgets(line, sizeof(line), f)) {
		fclose(f);
		return fail("the daemon closed the connection without an "
			    "answer");
	}
	line[strcspn(line, "\n")] = 0;
	if (!strncmp(line, "error ", 6)) {
		fclose(f);
		return fail("%s", line + 6);
	}
	if (sscanf(line, "proto %d", &proto) != 1 ||
	    proto != CTL_PROTO_VERSION) {
		fclose(f);
		return fail("version mismatch: the daemon answered '%.100s', "
			    "this nvcachectl (%s) speaks control protocol %d; "
			    "use the nvcachectl that came with the daemon",
			    line, NVC_VERSION, CTL_PROTO_VERSION);
	}
	if (stat_read(f, s, err, sizeof(err))) {
		fclose(f);
		return fail("%s", err);
	}
	fclose(f);
	return 0;
}

static int simple_command(const char *mnt, const char *cmd)
{
	char line[512];
	FILE *f;
	int ok = 0;

	if (ctl_connect(mnt, cmd, &f))
		return 1;
	if (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		ok = !strcmp(line, "ok");
		if (!ok)
			fail("%s",
			     !strncmp(line, "error ", 6) ? line + 6 : line);
	} else {
		fail("the daemon closed the connection without an answer");
	}
	fclose(f);
	return ok ? 0 : 1;
}

/* The counters went back to zero between two snapshots: a reset (counted)
 * or a new daemon (some counter smaller than before). */
static int restarted(const struct stat_snap *prev, const struct stat_snap *cur)
{
	int k;

	if (STAT_GAUGE(cur, resets) != STAT_GAUGE(prev, resets))
		return 1;
	for (k = 0; k < STAT_NCOUNTERS; k++)
		if (cur->ctr[k] < prev->ctr[k])
			return 1;
	return 0;
}

static int cmd_stats(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "prometheus", no_argument, NULL, 'p' },
		{ "interval", required_argument, NULL, 'i' },
		{ "count", required_argument, NULL, 'n' },
		{ "reset", no_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	struct stat_snap *cur = NULL, *prev = NULL, *diff = NULL;
	int json = 0, prom = 0, reset = 0, opt, ret = 1;
	double interval = 0;
	long count = -1, n;
	char mnt[PATH_MAX], *e;

	while ((opt = getopt_long(argc, argv, "jpi:n:rh", lo, NULL)) != -1) {
		switch (opt) {
		case 'j':
			json = 1;
			break;
		case 'p':
			prom = 1;
			break;
		case 'i':
			interval = strtod(optarg, &e);
			if (*e || !(interval >= 0.1 && interval <= 86400))
				return fail("-i takes seconds between 0.1 and "
					    "86400, not '%s'",
					    optarg);
			break;
		case 'n':
			count = strtol(optarg, &e, 10);
			if (*e || count < 1)
				return fail("--count takes a positive number, "
					    "not '%s'",
					    optarg);
			break;
		case 'r':
			reset = 1;
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
	if (json + prom + reset > 1)
		return fail("--json, --prometheus and --reset exclude each "
			    "other");
	if (interval && (prom || reset))
		return fail("-i goes with the text or --json output only");
	if (!realpath(argv[optind], mnt))
		return fail("%s: %s", argv[optind], strerror(errno));
	if (reset) {
		ret = simple_command(mnt, CTL_CMD("reset"));
		if (!ret)
			printf("statistics of %s reset\n", mnt);
		return ret;
	}
	cur = malloc(sizeof(*cur));
	prev = malloc(sizeof(*prev));
	diff = malloc(sizeof(*diff));
	if (!cur || !prev || !diff) {
		fail("out of memory");
		goto out_free;
	}
	if (ctl_fetch_stats(mnt, cur))
		goto out_free;
	if (!interval) {
		if (json)
			show_json(stdout, mnt, cur, NULL, 0, 1);
		else if (prom)
			show_prometheus(stdout, mnt, cur);
		else
			show_text(stdout, mnt, cur);
		ret = 0;
		goto out_free;
	}
	/* every interval: what happened in it, and the running totals */
	if (!json)
		show_interval_header(stdout);
	for (n = 0; count < 0 || n < count; n++) {
		struct stat_snap *t = prev;
		struct timespec ts = { (time_t)interval,
				       (long)((interval - (time_t)interval) *
					      1e9) };

		fflush(stdout);
		prev = cur;
		cur = t;
		while (nanosleep(&ts, &ts) && errno == EINTR)
			;
		if (ctl_fetch_stats(mnt, cur))
			goto out_free;
		/* after a reset or a restart, the interval starts from zero */
		if (restarted(prev, cur)) {
			memset(prev->ctr, 0, sizeof(prev->ctr));
			memset(prev->lat, 0, sizeof(prev->lat));
			memset(prev->dev, 0, sizeof(prev->dev));
		}
		stat_diff(cur, prev, diff);
		if (json)
			show_json(stdout, mnt, cur, diff,
				  (cur->time_ns - prev->time_ns) / 1e9, 0);
		else
			show_interval(stdout, diff, cur,
				      (cur->time_ns - prev->time_ns) / 1e9);
	}
	ret = 0;
out_free:
	free(cur);
	free(prev);
	free(diff);
	return ret;
}

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* flush and detach (which destages everything first): progress on a
 * terminal only, bytes left, destage rate, time left. */
static int destage_answer(FILE *f, const char *cmd)
{
	char line[1024], a[32], b[32], c[32];
	int tty = isatty(STDOUT_FILENO), ok = 0;
	unsigned long long dirty, destaged = 0, d0 = 0;
	double t0 = mono_s(), t;

	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		if (sscanf(line, "progress %llu %llu", &dirty, &destaged) ==
		    2) {
			if (!d0)
				d0 = destaged + 1;
			if (!tty)
				continue;
			t = mono_s() - t0;
			show_bytes(dirty, a, sizeof(a));
			if (t > 0.5 && destaged + 1 > d0) {
				double rate = (destaged + 1 - d0) / t;

				show_bytes(rate, b, sizeof(b));
				show_span(dirty / rate, c, sizeof(c));
				printf("\r%s: %s left, %s/s, about %s to "
				       "go     ",
				       cmd, a, b, c);
			} else {
				printf("\r%s: %s left                    "
				       "      ",
				       cmd, a);
			}
			fflush(stdout);
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
			return fail("%s failed: %s", cmd, line + 6);
		}
	}
	fclose(f);
	if (tty && ok) {
		show_bytes(d0 ? destaged + 1 - d0 : 0, a, sizeof(a));
		printf("\r%s: done, %s destaged in %.1f s                  "
		       "      \n",
		       cmd, a, mono_s() - t0);
	}
	return ok ? 0
		  : fail("the daemon went away before the %s finished", cmd);
}

static int cmd_destage(const char *cmd, int argc, char **argv)
{
	FILE *f;
	int ret;

	if (argc > 2 && !strcmp(cmd, "flush"))
		return cmd_file("flush", argc, argv);
	if (argc != 2)
		return fail("%s needs one MOUNTPOINT", cmd);
	if (ctl_connect(argv[1],
			!strcmp(cmd, "flush") ? CTL_CMD("flush")
					      : CTL_CMD("detach"),
			&f))
		return 1;
	ret = destage_answer(f, cmd);
	if (!ret && !strcmp(cmd, "detach"))
		printf("detached: every request goes to the backing store; "
		       "the cache devices are closed until nvcachectl "
		       "attach\n");
	return ret;
}

/*
 * An absolute path for p, which need not exist (its directory must); its
 * last component is kept as it is, not resolved: the daemon is to see the
 * name given (a /dev/disk/by-id link, a link in cache.devices), and it
 * finds devices by what the name is, not by its spelling.  "UUID=..." (a
 * member's UUID) goes as it is.
 */
static int abs_path(const char *p, char *out, size_t len)
{
	char dir[PATH_MAX], *slash;

	if (!strncmp(p, "UUID=", 5) || p[0] == '/')
		return snprintf(out, len, "%s", p) >= (int)len ? -ENAMETOOLONG
							       : 0;
	if (strlen(p) >= sizeof(dir))
		return -ENAMETOOLONG;
	strcpy(dir, p);
	slash = strrchr(dir, '/');
	if (slash == dir)
		return snprintf(out, len, "%s", p) >= (int)len ? -ENAMETOOLONG
							       : 0;
	if (slash)
		*slash = 0;
	if (!realpath(slash ? dir : ".", out))
		return -errno;
	if (strlen(out) + strlen(slash ? slash : p) + 2 > len)
		return -ENAMETOOLONG;
	strcat(out, "/");
	strcat(out, slash ? slash + 1 : p);
	return 0;
}

/* One answer line: ok, or error WHY (said as "what failed: WHY"). */
static int simple_answer(FILE *f, const char *what)
{
	char line[1024];
	int ok = 0;

	if (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		ok = !strcmp(line, "ok");
		if (!ok && !strncmp(line, "error ", 6)) {
			fclose(f);
			return fail("%s failed: %s", what, line + 6);
		}
	}
	fclose(f);
	return ok ? 0
		  : fail("the daemon went away before the %s finished", what);
}

/* replace and replace-mirror: MNT OLD NEW, sent as two absolute paths. */
static int cmd_replace(const char *cmd, int argc, char **argv)
{
	char old[PATH_MAX], nw[PATH_MAX], req[3 * PATH_MAX];
	int n, ret, mirror = !strcmp(cmd, "replace-mirror");
	FILE *f;

	if (argc != 4)
		return fail("%s needs MOUNTPOINT OLD NEW", cmd);
	ret = abs_path(argv[2], old, sizeof(old));
	if (!ret)
		ret = abs_path(argv[3], nw, sizeof(nw));
	if (ret)
		return fail("%s: %s", cmd, strerror(-ret));
	n = snprintf(req, sizeof(req), "%s %d 2 0\n%s", cmd, CTL_PROTO_VERSION,
		     old);
	memcpy(req + n + 1, nw, strlen(nw) + 1);
	n += 1 + strlen(nw) + 1;
	if (ctl_connect_len(argv[1], req, n, &f))
		return 1;
	ret = mirror ? simple_answer(f, cmd) : destage_answer(f, cmd);
	if (!ret && mirror)
		printf("mirror %s replaced by %s (rebuilt from the other one); "
		       "change cache.metadata in the configuration to name %s "
		       "(until then a mount finds it through %s, left as it "
		       "was)\n",
		       old, nw, nw, old);
	else if (!ret)
		printf("device %s replaced by %s (its blocks copied onto it); "
		       "it is found by its UUID at the next mount: "
		       "cache.devices need not change\n",
		       old, nw);
	return ret;
}

/* remove MNT DEV */
/* remove and add: one device. */
static int cmd_one_dev(const char *cmd, int argc, char **argv)
{
	char dev[PATH_MAX], req[2 * PATH_MAX];
	int n, ret, add = !strcmp(cmd, "add");
	FILE *f;

	if (argc != 3)
		return fail("%s needs MOUNTPOINT DEVICE", cmd);
	ret = abs_path(argv[2], dev, sizeof(dev));
	if (ret)
		return fail("%s: %s", cmd, strerror(-ret));
	n = snprintf(req, sizeof(req), "%s %d 1 0\n%s", cmd,
		     CTL_PROTO_VERSION, dev);
	if (ctl_connect_len(argv[1], req, n + 1, &f))
		return 1;
	ret = add ? simple_answer(f, cmd) : destage_answer(f, cmd);
	if (!ret && add)
		printf("device %s added: new data goes to it from now on; it "
		       "is found by its UUID at the next mount (nvcachectl "
		       "stats lists the places)\n",
		       dev);
	else if (!ret)
		printf("device %s removed: it is not used any more and can be "
		       "pulled\n",
		       dev);
	return ret;
}

/* attach: the daemon answers ok or why not. */
static int cmd_attach(int argc, char **argv)
{
	FILE *f;
	int ret;

	if (argc != 2)
		return fail("attach needs one MOUNTPOINT");
	if (ctl_connect(argv[1], CTL_CMD("attach"), &f))
		return 1;
	ret = simple_answer(f, "attach");
	if (!ret)
		printf("attached: caching again\n");
	return ret;
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
	if (!strcmp(argv[1], "flush") || !strcmp(argv[1], "detach"))
		return cmd_destage(argv[1], argc - 1, argv + 1);
	if (!strcmp(argv[1], "attach"))
		return cmd_attach(argc - 1, argv + 1);
	if (!strcmp(argv[1], "remove") || !strcmp(argv[1], "add"))
		return cmd_one_dev(argv[1], argc - 1, argv + 1);
	if (!strcmp(argv[1], "replace-mirror") || !strcmp(argv[1], "replace"))
		return cmd_replace(argv[1], argc - 1, argv + 1);
	if (!strcmp(argv[1], "check"))
		return cmd_check(argc - 1, argv + 1);
	if (!strcmp(argv[1], "devices"))
		return cmd_devices(argc - 1, argv + 1);
	if (!strcmp(argv[1], "warm") || !strcmp(argv[1], "pin") ||
	    !strcmp(argv[1], "unpin") || !strcmp(argv[1], "evict") ||
	    !strcmp(argv[1], "status"))
		return cmd_file(argv[1], argc - 1, argv + 1);
	fprintf(stderr, "nvcachectl: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
