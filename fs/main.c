/* fs: the nvcachefs daemon — options, configuration, cache, mount, the FUSE
 * loop, orderly exit. */
#define _GNU_SOURCE
#include "cred.h"
#include "fs.h"
#include "kinval.h"
#include "loop.h"
#include "notify.h"
#include "passthru.h"
#include "proto.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <syslog.h>
#include <unistd.h>

#define DEFAULT_CONFIG "/etc/nvcachefs.conf"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: nvcachefs [-f] [-c FILE] [-o KEY=VALUE]... [CONFIG] "
		"MOUNTPOINT\n"
		"\n"
		"A write-back cache on fast block devices in front of a "
		"backing directory.\n"
		"\n"
		"  -f               stay in the foreground, log to stderr\n"
		"  -c FILE          configuration file (default " DEFAULT_CONFIG
		";\n"
		"                   a CONFIG argument before MOUNTPOINT does "
		"the same,\n"
		"                   for /etc/fstab entries of type "
		"fuse.nvcachefs)\n"
		"  -o section.key=value   override a configuration key\n"
		"  -o OPTION        a FUSE mount option (allow_other, ...)\n"
		"  -h, --help       this help\n"
		"  -V, --version    the version\n"
		"\n");
	cfg_help(f);
}

static int is_config_key(const char *opt)
{
	const char *dot = strchr(opt, '.'), *eq = strchr(opt, '=');

	return dot && eq && dot < eq;
}

static int load_config(struct cache_config *cfg, const char *file, char **ov,
		       int nov, char *err, size_t len)
{
	int i, ret;

	cfg_defaults(cfg);
	ret = cfg_load(cfg, file, err, len);
	for (i = 0; !ret && i < nov; i++)
		ret = cfg_override(cfg, ov[i], err, len);
	if (!ret)
		ret = cfg_validate(cfg, err, len);
	return ret;
}

/* SIGHUP: re-read the tunables that may change while mounted. */
static int hup_pipe[2] = { -1, -1 };

/* The request loop's word on its transport. */
static void loop_log(int err, const char *msg)
{
	log_msg(err ? LOG_ERR : LOG_NOTICE, "%s", msg);
}

static void on_hup(int sig)
{
	(void)sig;
	(void)!write(hup_pipe[1], "h", 1);
}

static void *reload_main(void *arg)
{
	struct fs *fs = arg;
	char ch, err[CFG_ERRLEN];

	while (read(hup_pipe[0], &ch, 1) == 1) {
		struct cache_config next;

		if (ch != 'h')
			break;
		log_msg(LOG_NOTICE, "SIGHUP: re-reading %s", fs->config_file);
		if (load_config(&next, fs->config_file, fs->overrides,
				fs->noverrides, err, sizeof(err))) {
			log_msg(LOG_ERR, "reload refused: %s", err);
		} else if (cfg_reload_into(fs->cfg, &next)) {
			cache_kick(fs->cache);
		}
		cfg_free(&next);
	}
	return NULL;
}

/*
 * Sequential reads gain from more read-ahead than the kernel gives a FUSE
 * mount by default; it is set on the mount's bdi once the mount answers.
 */
static void *readahead_main(void *arg)
{
	struct fs *fs = arg;
	struct stat st;
	char path[128];
	FILE *f;

	if (stat(fs->mountpoint, &st))
		return NULL;
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb",
		 major(st.st_dev), minor(st.st_dev));
	f = fopen(path, "w");
	if (!f) {
		log_msg(LOG_INFO, "cannot set read-ahead (%s): %s", path,
			strerror(errno));
		return NULL;
	}
	fprintf(f, "%llu\n", (unsigned long long)fs->cfg->read_ahead / 1024);
	if (fclose(f))
		log_msg(LOG_INFO, "cannot set read-ahead (%s): %s", path,
			strerror(errno));
	return NULL;
}

/* Daemonising: the parent waits for the child to mount, and exits with its
 * status. */
static int status_pipe[2] = { -1, -1 };

static int daemon_begin(void)
{
	pid_t pid;
	char st = 1;

	if (pipe2(status_pipe, O_CLOEXEC))
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0) {
		close(status_pipe[1]);
		if (read(status_pipe[0], &st, 1) != 1)
			st = 1;
		_exit(st);
	}
	close(status_pipe[0]);
	setsid();
	return 0;
}

static void daemon_end(int ok)
{
	char st = ok ? 0 : 1;
	int fd;

	if (status_pipe[1] < 0)
		return;
	if (ok) {
		fd = open("/dev/null", O_RDWR);
		if (fd >= 0) {
			dup2(fd, 0);
			dup2(fd, 1);
			dup2(fd, 2);
			if (fd > 2)
				close(fd);
		}
		log_setup(LOG_TO_SYSLOG);
		(void)!chdir("/");
	}
	(void)!write(status_pipe[1], &st, 1);
	close(status_pipe[1]);
	status_pipe[1] = -1;
}

static void die(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	va_list ap;

	fputs("nvcachefs: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	daemon_end(0);
	exit(1);
}

/*
 * Every inode the kernel has looked up holds an O_PATH descriptor, and every
 * cached file an open one: a mount with many files needs many descriptors.
 * Take the system's maximum (nr_open) when privileged, else the hard limit.
 */
static void raise_fd_limit(void)
{
	struct rlimit rl;
	unsigned long nr_open = 0;
	FILE *f = fopen("/proc/sys/fs/nr_open", "r");

	if (f) {
		if (fscanf(f, "%lu", &nr_open) != 1)
			nr_open = 0;
		fclose(f);
	}
	if (getrlimit(RLIMIT_NOFILE, &rl))
		return;
	if (nr_open > rl.rlim_max) {
		struct rlimit want = { nr_open, nr_open };

		if (!setrlimit(RLIMIT_NOFILE, &want))
			return;
	}
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
}

/*
 * The mount's own options.  The backing path goes into fsname escaped as
 * libfuse's option parser reads it (a backslash before each comma and
 * backslash), so that a path with a comma cannot add options of its own.
 */
static int add_mount_opts(struct fuse_args *args, const char *backing)
{
	char *fsname = NULL, *opts = NULL;
	int ret = -ENOMEM;

	if (asprintf(&fsname, "fsname=nvcachefs:%s", backing) < 0)
		return -ENOMEM;
	if (!fuse_opt_add_opt_escaped(&opts, fsname) &&
	    !fuse_opt_add_opt(&opts, "subtype=nvcachefs,default_permissions") &&
	    !fuse_opt_add_arg(args, "-o") && !fuse_opt_add_arg(args, opts))
		ret = 0;
	free(opts);
	free(fsname);
	return ret;
}

/* The command line: what main needs of it. */
struct cmdline {
	const char *config, *mountpoint;
	char **ov; /* KEY=VALUE overrides (-o), argc long */
	int nov, foreground, debug;
};

/* argv into *a, and the FUSE options into args: -1 to go on, else the
 * exit status (--help, --version, a usage error). */
static int parse_args(int argc, char **argv, struct fuse_args *args,
		      struct cmdline *a)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	int opt;

	while ((opt = getopt_long(argc, argv, "hVfdc:o:", longopts, NULL)) !=
	       -1) {
		switch (opt) {
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("nvcachefs %s (libfuse %s)\n", NVC_VERSION,
			       fuse_pkgversion());
			return 0;
		case 'f':
			a->foreground = 1;
			break;
		case 'd':
			a->debug = 1;
			a->foreground = 1;
			break;
		case 'c':
			a->config = optarg;
			break;
		case 'o': {
			char *s = strdup(optarg), *save, *tok;

			for (tok = strtok_r(s, ",", &save); tok;
			     tok = strtok_r(NULL, ",", &save)) {
				if (is_config_key(tok)) {
					a->ov[a->nov++] = strdup(tok);
				} else if (strcmp(tok, "defaults")) {
					fuse_opt_add_arg(args, "-o");
					fuse_opt_add_arg(args, tok);
				}
			}
			free(s);
			break;
		}
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind == argc - 2 && !a->config)
		a->config = argv[optind++];
	if (optind != argc - 1) {
		fprintf(stderr,
			"nvcachefs: expected one MOUNTPOINT (see --help)\n");
		return 2;
	}
	if (!a->config)
		a->config = DEFAULT_CONFIG;
	a->mountpoint = argv[optind];
	return -1;
}

/* After the request loop: device-life commands stopped, the kernel's mount
 * gone, the control socket closed, the dirty data destaged if
 * cache.on_unmount says so, the cache closed, the reload thread joined and
 * the session freed.  0, or the cache's -errno (logged). */
static int unmount_and_close(struct fs *fs, struct fuse_session *se,
			     const char *mnt, pthread_t reload_thread)
{
	char stats[1024];
	int ret, close_ret, flush;

	/* a replace or remove under way stops at its next batch, to resume
	 * at the next mount, and says so to its client (fs_ctl_stop waits) */
	cache_devlife_stop(fs->cache);

	flush = fs->cfg->on_unmount == UNMOUNT_FLUSH;
	notify_stopping(flush);
	fuse_session_unmount(se);
	kinval_stop(); /* after the unmount: nothing waits for a READ now */
	proto_stats(stats, sizeof(stats));
	log_msg(LOG_INFO, "%s", stats);
	fs_pt_stats(stats, sizeof(stats));
	log_msg(LOG_INFO, "%s", stats);
	log_msg(LOG_NOTICE, "unmounted %s; %s", mnt,
		flush ? "destaging all dirty data"
		      : "keeping dirty data in the cache");
	fs_ctl_stop();
	/* cache_close(c, 1) flushes the same way, without the progress */
	ret = flush ? cache_flush(fs->cache, notify_flush_progress, NULL) : 0;
	close_ret = cache_close(fs->cache, 0);
	ret = ret ? ret : close_ret;
	if (ret)
		log_msg(LOG_ERR,
			"closing the cache: %s; dirty data stays in the cache "
			"and is destaged after the next mount",
			strerror(-ret));
	notify_end();
	(void)!write(hup_pipe[1], "q", 1);
	pthread_join(reload_thread, NULL);
	fuse_remove_signal_handlers(se);
	fuse_session_destroy(se);
	fs_free_table(fs);
	log_msg(LOG_NOTICE, "exit");
	return ret;
}

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct cache_config cfg;
	struct fuse_session *se;
	struct fs fs;
	char err[CFG_ERRLEN], mnt[PATH_MAX];
	int loop_ret;
	unsigned int features;
	const char *config, *mountpoint;
	struct cmdline a = { .ov = calloc(argc, sizeof(char *)) };
	int ret;
	pthread_t reload_thread, ra_thread;
	struct sigaction sa;
	struct stat st;

	memset(&fs, 0, sizeof(fs));
	if (!a.ov)
		die("out of memory");
	fuse_opt_add_arg(&args, argv[0]);
	ret = parse_args(argc, argv, &args, &a);
	if (ret >= 0)
		goto out_args;
	config = a.config;
	mountpoint = a.mountpoint;
	if (!realpath(mountpoint, mnt) || stat(mnt, &st) ||
	    !S_ISDIR(st.st_mode))
		die("%s: not a directory to mount on", mountpoint);

	if (load_config(&cfg, config, a.ov, a.nov, err, sizeof(err)))
		die("%s", err);
	fs.cfg = &cfg;
	fs.config_file = config;
	fs.overrides = a.ov;
	fs.noverrides = a.nov;
	fs.mountpoint = mnt;
	fs.timeout = cfg.attr_timeout_ms / 1000.0;
	fs.neg_timeout = cfg.negative_timeout_ms / 1000.0;

	fs.backing_fd =
		open(cfg.backing_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fs.backing_fd < 0)
		die("backing.path %s: %s", cfg.backing_path, strerror(errno));
	fs.root.fd = open(cfg.backing_path, O_PATH | O_CLOEXEC);
	if (fs.root.fd < 0 || fstat(fs.root.fd, &st))
		die("backing.path %s: %s", cfg.backing_path, strerror(errno));
	fs.root.dev = st.st_dev;
	fs.root.ino = st.st_ino;
	fs.root.nlookup = 2;
	if (cfg_check_nesting(mnt, fs.backing_fd, cfg.backing_path, err,
			      sizeof(err)))
		die("%s", err);

	raise_fd_limit();
	if (!a.foreground && daemon_begin())
		die("cannot daemonise: %s", strerror(errno));
	umask(0);
	log_setup(LOG_TO_STDERR);
	if (fs_init_table(&fs))
		die("out of memory");
	if (fs_cred_setup())
		die("cannot read the daemon's capabilities: %s", strerror(errno));
	ret = cache_open(&cfg, fs.backing_fd, &fs.cache, err, sizeof(err));
	if (ret)
		die("%s", err);
	/* hold inodes by handle only where the cache proved handles stable */
	fs.by_handle = fs.by_handle && cache_handles_trusted(fs.cache);

	if (add_mount_opts(&args, cfg.backing_path)) {
		cache_close(fs.cache, 0);
		die("out of memory");
	}
	if (a.debug)
		fuse_opt_add_arg(&args, "-d");
	se = fuse_session_new(&args, &fs_ops, sizeof(fs_ops), &fs);
	if (!se) {
		cache_close(fs.cache, 0);
		die("bad FUSE options (see --help)");
	}
	fs.se = se; /* for invalidations of the kernel's caches */
	if (kinval_start(se)) {
		cache_close(fs.cache, 0);
		die("cannot start the invalidation thread");
	}
	if (fuse_set_signal_handlers(se)) {
		cache_close(fs.cache, 0);
		die("cannot set signal handlers");
	}
	if (pipe2(hup_pipe, O_CLOEXEC) ||
	    pthread_create(&reload_thread, NULL, reload_main, &fs)) {
		cache_close(fs.cache, 0);
		die("cannot start the reload thread");
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_hup;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGHUP, &sa, NULL);
	if (fuse_session_mount(se, mnt)) {
		cache_close(fs.cache, 0);
		die("cannot mount on %s", mnt);
	}
	features = PROTO_KILLPRIV_V2 | PROTO_DIRECT_IO;
	if (cfg.fuse_transport != FSLOOP_DEV)
		features |= PROTO_URING;
	if (cfg.fuse_passthrough == FUSE_PT_AUTO)
		features |= PROTO_PASSTHROUGH;
	ret = proto_attach(se, fuse_session_fd(se), features);
	if (ret)
		log_msg(LOG_WARNING,
			"cannot see the FUSE requests (%s): running without "
			"the protocol features libfuse %s cannot ask for",
			strerror(-ret), fuse_pkgversion());
	ret = fs_ctl_start(&fs, mnt);
	if (ret)
		log_msg(LOG_WARNING,
			"control socket unavailable: %s (nvcachectl "
			"stats/flush will not work)",
			strerror(-ret));
	log_msg(LOG_NOTICE, "mounted %s on %s", cfg.backing_path, mnt);
	daemon_end(1);

	if (!pthread_create(&ra_thread, NULL, readahead_main, &fs))
		pthread_detach(ra_thread);
	fsloop_on_idle(fs_thread_idle);
	fsloop_on_log(loop_log);
	notify_start(fs.cache, mnt);
	loop_ret = fsloop_run(se, cfg.fuse_workers, cfg.fuse_threads,
			      cfg.io_poll_us * 1000ull, cfg.fuse_transport);
	ret = unmount_and_close(&fs, se, mnt, reload_thread);
	(void)ret; /* logged; the exit status is the request loop's */
	cfg_free(&cfg);
	ret = loop_ret ? 1 : 0;
out_args:
	fuse_opt_free_args(&args);
	while (a.nov)
		free(a.ov[--a.nov]);
	free(a.ov);
	return ret;
}
