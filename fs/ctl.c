/* fs: the control socket under /run/nvcachefs — stats and flush for nvcachectl,
 * owner only. */
#define _GNU_SOURCE
#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
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
/* clients run in their own threads; stop waits for them before the cache goes
 */
static pthread_mutex_t clients_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t clients_cond = PTHREAD_COND_INITIALIZER;
static int nclients;

struct client {
	struct fs *fs;
	int fd;
};

static void say(int fd, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void say(int fd, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n > 0)
		(void)!send(fd, buf,
			    n < (int)sizeof(buf) ? n : (int)sizeof(buf) - 1,
			    MSG_NOSIGNAL);
}

static void flush_progress(void *arg, uint64_t dirty, uint64_t destaged)
{
	say(*(int *)arg, "progress %llu %llu\n", (unsigned long long)dirty,
	    (unsigned long long)destaged);
}

static void send_stats(struct fs *fs, int fd)
{
	struct cache_stats s;
	int d;

	cache_stats(fs->cache, &s);
#define KV(name) say(fd, "%s %llu\n", #name, (unsigned long long)s.name)
	KV(read_ops);
	KV(read_hit_ops);
	KV(read_miss_ops);
	KV(read_partial_ops);
	KV(read_bytes);
	KV(read_hit_bytes);
	KV(read_miss_bytes);
	KV(write_ops);
	KV(write_hit_ops);
	KV(write_bytes);
	KV(bypass_ops);
	KV(destaged_bytes);
	KV(destage_errors);
	KV(evictions);
	KV(fill_bytes);
	KV(capacity_bytes);
	KV(used_bytes);
	KV(dirty_bytes);
	KV(nslots);
	KV(used_slots);
	KV(dirty_slots);
	KV(destaging);
	KV(meta_repaired);
#undef KV
	for (d = 0; d < s.ndevs; d++)
		say(fd, "dev %d %s errors %llu %s\n", d, fs->cfg->dev_paths[d],
		    (unsigned long long)s.dev_errors[d],
		    s.dev_failed[d] ? "FAILED" : "ok");
	for (d = 0; d < 2; d++)
		say(fd, "mirror %d %s %s\n", d, fs->cfg->meta_paths[d],
		    s.mirror_rebuilt[d] ? "rebuilt-at-mount" : "ok");
	say(fd, "end\n");
}

static void *client_main(void *arg)
{
	struct client *cl = arg;
	char line[128];
	ssize_t n;

	n = recv(cl->fd, line, sizeof(line) - 1, 0);
	if (n > 0) {
		line[n] = 0;
		line[strcspn(line, "\r\n")] = 0;
		if (!strcmp(line, "version")) {
			say(cl->fd, "nvcachefs %s proto %d\n", NVC_VERSION,
			    CTL_PROTO_VERSION);
		} else if (!strcmp(line, "stats")) {
			say(cl->fd, "proto %d\n", CTL_PROTO_VERSION);
			send_stats(cl->fs, cl->fd);
		} else if (!strcmp(line, "flush")) {
			int ret;

			log_msg(LOG_NOTICE, "flush requested");
			ret = cache_flush(cl->fs->cache, flush_progress,
					  &cl->fd);
			if (ret)
				say(cl->fd, "error %s\n", strerror(-ret));
			else
				say(cl->fd, "ok\n");
		} else {
			say(cl->fd, "error unknown command\n");
		}
	}
	close(cl->fd);
	free(cl);
	pthread_mutex_lock(&clients_lock);
	if (!--nclients)
		pthread_cond_broadcast(&clients_cond);
	pthread_mutex_unlock(&clients_lock);
	return NULL;
}

static void *ctl_main(void *arg)
{
	struct fs *fs = arg;

	for (;;) {
		struct pollfd p[2] = { { ctl_fd, POLLIN, 0 },
				       { ctl_pipe[0], POLLIN, 0 } };
		struct ucred cred;
		socklen_t len = sizeof(cred);
		struct client *cl;
		pthread_t t;
		int fd;

		if (poll(p, 2, -1) < 0)
			continue;
		if (p[1].revents)
			break;
		fd = accept4(ctl_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		/* only the daemon's owner (and root) may talk to it */
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) ||
		    (cred.uid != 0 && cred.uid != geteuid())) {
			say(fd, "error permission denied\n");
			close(fd);
			continue;
		}
		cl = malloc(sizeof(*cl));
		if (!cl) {
			close(fd);
			continue;
		}
		cl->fs = fs;
		cl->fd = fd;
		pthread_mutex_lock(&clients_lock);
		nclients++;
		pthread_mutex_unlock(&clients_lock);
		if (pthread_create(&t, NULL, client_main, cl)) {
			close(fd);
			free(cl);
			pthread_mutex_lock(&clients_lock);
			nclients--;
			pthread_mutex_unlock(&clients_lock);
			continue;
		}
		pthread_detach(t);
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
	ctl_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (ctl_fd < 0)
		return -errno;
	if (bind(ctl_fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    chmod(ctl_path, 0600) || listen(ctl_fd, 16) ||
	    pipe2(ctl_pipe, O_CLOEXEC)) {
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
	if (ctl_fd < 0)
		return;
	(void)!write(ctl_pipe[1], "x", 1);
	pthread_join(ctl_thread, NULL);
	pthread_mutex_lock(&clients_lock);
	while (nclients)
		pthread_cond_wait(&clients_cond, &clients_lock);
	pthread_mutex_unlock(&clients_lock);
	close(ctl_fd);
	close(ctl_pipe[0]);
	close(ctl_pipe[1]);
	unlink(ctl_path);
	ctl_fd = -1;
}
