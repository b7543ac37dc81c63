/* fs: the control socket under /run/nvcachefs — stats, flush and the
 * per-file commands (ctlfile.c) for nvcachectl, owner only. */
#define _GNU_SOURCE
#include "ctl.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <unistd.h>

static int ctl_fd = -1;
static char ctl_path[108];
static pthread_t ctl_thread;
static int ctl_pipe[2] = { -1, -1 };
/*
 * Clients run in their own threads, on the list while they may use the cache
 * or their socket; stop shuts their sockets down (an idle or stuck client
 * then returns at once) and waits for the list to empty before the cache goes.
 * CLIENTS_MAX at once, READERS_MAX of them not the owner, so that readers
 * never keep the owner out; a client past them is told so and let go.  With
 * a request's and the answers' total waits (ctl.h), what one reader can cost
 * is bounded: READERS_MAX threads, each with 4 KiB of request, for seconds.
 */
#define CLIENTS_MAX 16
#define READERS_MAX 8
static pthread_mutex_t clients_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t clients_cond = PTHREAD_COND_INITIALIZER;
static struct client *clients;
static int nclients, nreaders, refusing;

/* accept out of descriptors: the next try after this long */
#define ACCEPT_BACKOFF_MS 200

struct client {
	struct fs *fs;
	struct ctl_conn cn;
	int owner; /* may flush and reset, not only read */
	/* running a device-life command (clients_lock): stop lets it answer
	 * (it stops at its next batch: cache_devlife_stop) */
	int devop;
	struct client *next;
};

/* On the list, or -EBUSY: as many clients as may be (said once in the log
 * until one is let in again). */
static int client_add(struct client *cl)
{
	int ret = 0;

	pthread_mutex_lock(&clients_lock);
	if (nclients >= CLIENTS_MAX ||
	    (!cl->owner && nreaders >= READERS_MAX)) {
		if (!refusing)
			log_msg(LOG_WARNING,
				"control socket: %d clients at once (%d not "
				"the owner): refusing more until some are done",
				nclients, nreaders);
		refusing = 1;
		ret = -EBUSY;
	} else {
		cl->next = clients;
		clients = cl;
		nclients++;
		nreaders += !cl->owner;
		refusing = 0;
	}
	pthread_mutex_unlock(&clients_lock);
	return ret;
}

/* Off the list: stop no longer touches cl's socket, nor waits for it. */
static void client_remove(struct client *cl)
{
	struct client **p;

	pthread_mutex_lock(&clients_lock);
	for (p = &clients; *p != cl; p = &(*p)->next)
		assert(*p);
	*p = cl->next;
	nclients--;
	nreaders -= !cl->owner;
	if (!clients)
		pthread_cond_broadcast(&clients_cond);
	pthread_mutex_unlock(&clients_lock);
}

static void flush_progress(void *arg, uint64_t dirty, uint64_t destaged)
{
	ctl_say(arg, "progress %llu %llu\n", (unsigned long long)dirty,
		(unsigned long long)destaged);
}

/* A snapshot in the wire format of stats.h; no lock on the I/O path. */
static void send_stats(struct fs *fs, struct ctl_conn *cn)
{
	struct stat_snap *s = malloc(sizeof(*s));
	char *buf = NULL;
	size_t len = 0;
	FILE *f;

	if (!s) {
		ctl_say(cn, "error out of memory\n");
		return;
	}
	f = open_memstream(&buf, &len);
	if (!f) {
		ctl_say(cn, "error out of memory\n");
		goto out_free_snap;
	}
	cache_snapshot(fs->cache, s);
	fprintf(f, "proto %d\n", CTL_PROTO_VERSION);
	stat_write(f, s);
	if (fclose(f))
		ctl_say(cn, "error out of memory\n");
	else
		ctl_send_all(cn, buf, len);
	free(buf);
out_free_snap:
	free(s);
}

static gid_t readers_gid = (gid_t)-1;

/* The owner (and root) may do anything; the readers group may read. */
static int may_command(const struct ucred *cred)
{
	return cred->uid == 0 || cred->uid == geteuid();
}

static int may_read(int fd, const struct ucred *cred)
{
	gid_t groups[256];
	socklen_t len = sizeof(groups);
	unsigned i;

	if (may_command(cred))
		return 1;
	if (readers_gid == (gid_t)-1)
		return 0;
	if (cred->gid == readers_gid)
		return 1;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len))
		return 0;
	for (i = 0; i < len / sizeof(gid_t); i++)
		if (groups[i] == readers_gid)
			return 1;
	return 0;
}

static int file_command(const char *cmd)
{
	static const char *const cmds[] = { "warm",  "pin",    "unpin",
					    "evict", "status", NULL };
	int i;

	for (i = 0; cmds[i]; i++)
		if (!strcmp(cmd, cmds[i]))
			return 1;
	return 0;
}

/* The device-life commands (cache/mngt/detach.c, mirror.c, replace.c) and
 * the arguments each takes. */
static const struct {
	const char *cmd;
	unsigned nargs;
} device_cmds[] = { { "detach", 0 },
		    { "attach", 0 },
		    { "replace", 2 },
		    { "remove", 1 },
		    { "add", 1 },
		    { "replace-mirror", 2 } };

static int device_command(const struct ctl_req *req)
{
	size_t i;

	for (i = 0; i < sizeof(device_cmds) / sizeof(device_cmds[0]); i++)
		if (!strcmp(req->cmd, device_cmds[i].cmd) &&
		    req->nargs == device_cmds[i].nargs)
			return 1;
	return 0;
}

/*
 * One of them: progress lines while it destages, then "ok" or "error".
 * device_command matched its argument count; the array has nargs + 1
 * entries (the last NULL), so no argument past nargs is read.
 */
static void device_run(struct client *cl, const struct ctl_req *req)
{
	struct cache *c = cl->fs->cache;
	const char *cmd = req->cmd;
	const char *a = req->nargs > 0 ? req->args[0] : NULL;
	const char *b = req->nargs > 1 ? req->args[1] : NULL;
	char why[768];
	int ret;

	pthread_mutex_lock(&clients_lock);
	cl->devop = 1;
	pthread_mutex_unlock(&clients_lock);
	log_msg(LOG_NOTICE, "%s requested%s%s%s%s", cmd, a ? ": " : "",
		a ? a : "", b ? " -> " : "", b ? b : "");
	if (!strcmp(cmd, "detach"))
		ret = cache_detach(c, flush_progress, &cl->cn, why,
				   sizeof(why));
	else if (!strcmp(cmd, "attach"))
		ret = cache_attach(c, why, sizeof(why));
	else if (!strcmp(cmd, "replace"))
		ret = cache_replace_dev(c, a, b, flush_progress, &cl->cn, why,
					sizeof(why));
	else if (!strcmp(cmd, "remove"))
		ret = cache_remove_dev(c, a, flush_progress, &cl->cn, why,
				       sizeof(why));
	else if (!strcmp(cmd, "add"))
		ret = cache_add_dev(c, a, why, sizeof(why));
	else
		ret = cache_replace_mirror(c, a, b, why, sizeof(why));
	if (ret)
		ctl_say(&cl->cn, "error %s\n", why);
	else
		ctl_say(&cl->cn, "ok\n");
}

/*
 * Requests (ctl.h) start with "COMMAND PROTO": the client's protocol version
 * must be the daemon's, so that an older or newer nvcachectl says so instead
 * of misreading the figures.  "version" is answered to anyone allowed in.
 * Everything but stats and version is the owner's (status too: it tells
 * what files exist and how large they are, whatever their permissions).
 */
static void *client_main(void *arg)
{
	struct client *cl = arg;
	struct ctl_req req;
	char *buf = NULL;
	size_t max = cl->owner ? CTL_REQ_MAX : CTL_READER_REQ_MAX;
	int ret = ctl_read_request(&cl->cn, max, &req, &buf);
	const char *cmd = req.cmd;

	if (!ret)
		cl->cn.what = cmd;
	if (ret == -E2BIG) {
		/* told why, and the rest read (for a while), so that the
		 * client's writes end and it reads this */
		ctl_say(&cl->cn,
			"error request too large (more than %zu bytes)\n", max);
		shutdown(cl->cn.fd, SHUT_WR);
		ctl_discard(&cl->cn);
	} else if (ret) {
	} else if (!strcmp(cmd, "version")) {
		ctl_say(&cl->cn, "nvcachefs %s proto %d\n", NVC_VERSION,
			CTL_PROTO_VERSION);
	} else if (req.proto != CTL_PROTO_VERSION) {
		ctl_say(&cl->cn,
			"error version mismatch: this nvcachefs daemon (%s) "
			"speaks control protocol %d, the client speaks %d; use "
			"the nvcachectl that came with the daemon\n",
			NVC_VERSION, CTL_PROTO_VERSION, req.proto);
	} else if (!strcmp(cmd, "stats")) {
		send_stats(cl->fs, &cl->cn);
	} else if (!cl->owner) {
		ctl_say(&cl->cn,
			"error permission denied: only the daemon's owner "
			"may %s\n",
			cmd);
	} else if (!strcmp(cmd, "reset")) {
		ret = cache_stats_reset(cl->fs->cache);
		if (ret)
			ctl_say(&cl->cn, "error %s\n", strerror(-ret));
		else
			ctl_say(&cl->cn, "ok\n");
	} else if (!strcmp(cmd, "flush") && !req.nargs) {
		log_msg(LOG_NOTICE, "flush requested");
		ret = cache_flush(cl->fs->cache, flush_progress, &cl->cn);
		if (ret)
			ctl_say(&cl->cn, "error %s\n", strerror(-ret));
		else
			ctl_say(&cl->cn, "ok\n");
	} else if (device_command(&req)) {
		device_run(cl, &req);
	} else if (!strcmp(cmd, "flush") || file_command(cmd)) {
		ctl_file_command(cl->fs, &cl->cn, &req);
	} else {
		ctl_say(&cl->cn, "error unknown command '%s'\n", cmd);
	}
	free(req.args);
	free(buf);
	client_remove(cl);
	close(cl->cn.fd);
	free(cl);
	return NULL;
}

/* A client allowed in gets a thread; fd is then its, else closed. */
static void client_start(struct fs *fs, int fd)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	struct client *cl;
	pthread_t t;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) ||
	    !may_read(fd, &cred)) {
		static const char no[] = "error permission denied\n";

		/* a fresh socket: the line fits, nothing waits */
		(void)!send(fd, no, sizeof(no) - 1,
			    MSG_NOSIGNAL | MSG_DONTWAIT);
		goto err_close;
	}
	cl = malloc(sizeof(*cl));
	if (!cl)
		goto err_close;
	cl->fs = fs;
	ctl_conn_init(&cl->cn, fd);
	cl->owner = may_command(&cred);
	if (client_add(cl)) {
		/* a fresh socket: the line fits, this thread never waits */
		cl->cn.send_wait_ms = CTL_SEND_WAIT_MS;
		ctl_say(&cl->cn,
			"error too many clients at once (%d, or %d not the "
			"daemon's owner): try again later\n",
			CLIENTS_MAX, READERS_MAX);
		goto err_free;
	}
	if (pthread_create(&t, NULL, client_main, cl)) {
		client_remove(cl);
		goto err_free;
	}
	pthread_detach(t);
	return;
err_free:
	free(cl);
err_close:
	close(fd);
}

/* Whether accept failed for want of descriptors (or memory), to be waited
 * out, not retried at once; said once (*said), until an accept works. */
static int accept_starved(int err, int *said)
{
	if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM)
		return 0;
	if (!*said)
		log_msg(LOG_WARNING,
			"control socket: cannot accept a client: %s; "
			"retrying every %d ms",
			strerror(err), ACCEPT_BACKOFF_MS);
	*said = 1;
	return 1;
}

static void *ctl_main(void *arg)
{
	struct fs *fs = arg;
	int starved = 0, said = 0;

	for (;;) {
		/* the stop pipe first: when starved, only it is watched */
		struct pollfd p[2] = { { ctl_pipe[0], POLLIN, 0 },
				       { ctl_fd, POLLIN, 0 } };
		int fd;

		if (poll(p, starved ? 1 : 2, starved ? ACCEPT_BACKOFF_MS : -1) <
		    0)
			continue;
		if (p[0].revents)
			break;
		fd = accept4(ctl_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			starved = accept_starved(errno, &said);
			continue;
		}
		starved = said = 0;
		client_start(fs, fd);
	}
	return NULL;
}

int fs_ctl_start(struct fs *fs, const char *mountpoint)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int ret;

	ret = ctl_socket_path(mountpoint, ctl_path, sizeof(ctl_path));
	if (ret)
		return ret;
	mkdir(CTL_DIR, 0755);
	unlink(ctl_path);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", ctl_path);
	/* non-blocking: a retry after a backoff may find nobody waiting */
	ctl_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (ctl_fd < 0)
		return -errno;
	if (bind(ctl_fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    chmod(ctl_path, 0600)) {
		ret = -errno;
		goto err_close;
	}
	if (fs->cfg->stats_readers && *fs->cfg->stats_readers) {
		struct group *g = getgrnam(fs->cfg->stats_readers);

		if (!g) {
			log_msg(LOG_ERR,
				"stats.readers: no group named '%s'; the "
				"statistics stay readable by the owner only",
				fs->cfg->stats_readers);
		} else if (chown(ctl_path, -1, g->gr_gid) ||
			   chmod(ctl_path, 0660)) {
			ret = -errno;
			goto err_close;
		} else {
			readers_gid = g->gr_gid;
		}
	}
	if (listen(ctl_fd, 16) || pipe2(ctl_pipe, O_CLOEXEC)) {
		ret = -errno;
		goto err_close;
	}
	ret = -pthread_create(&ctl_thread, NULL, ctl_main, fs);
	if (ret)
		goto err_close;
	return 0;
err_close:
	close(ctl_fd);
	ctl_fd = -1;
	unlink(ctl_path);
	return ret;
}

void fs_ctl_stop(void)
{
	struct client *cl;

	if (ctl_fd < 0)
		return;
	(void)!write(ctl_pipe[1], "x", 1);
	pthread_join(ctl_thread, NULL);
	pthread_mutex_lock(&clients_lock);
	for (cl = clients; cl; cl = cl->next)
		if (!cl->devop)
			shutdown(cl->cn.fd, SHUT_RDWR);
	while (clients)
		pthread_cond_wait(&clients_cond, &clients_lock);
	pthread_mutex_unlock(&clients_lock);
	close(ctl_fd);
	close(ctl_pipe[0]);
	close(ctl_pipe[1]);
	unlink(ctl_path);
	ctl_fd = -1;
}
