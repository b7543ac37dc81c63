/* fs: the per-file commands of the control socket — paths resolved in the
 * backing directory, directories walked, progress streamed. */
#define _GNU_SOURCE
#include "ctl.h"
#include "passthru.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

/*
 * Paths.  nvcachectl sends each PATH relative to the mount (it resolved it
 * with realpath, so it names no symbolic link and no ".."); the daemon
 * still trusts nothing: an absolute path or a ".." component is refused,
 * and the path is opened beneath the backing directory with openat2
 * (RESOLVE_BENEATH, no symbolic links; openat with O_NOFOLLOW where the
 * kernel has no openat2), O_PATH: nothing is read through it, and the
 * engine opens the backing file itself (cache_file_get).  Directories
 * (-r) are walked here, on the backing directory, never through the mount;
 * symbolic links and other non-regular files are skipped, and so is the
 * lost+found directory at the top.
 *
 * Answers.  Each command streams lines to the client: "progress A B" while
 * it works (at most every PROGRESS_MS), "perr PATHLEN" then the path and a
 * message line for a PATH that could not be done (the others go on),
 * "file ..." lines for status, a "done ..." summary, and "ok" or "error
 * MESSAGE" last.  A client that goes away (Ctrl-C) is seen between steps
 * (a chunk of warm, a step of flush): the command stops there.
 */

#define PROGRESS_MS 100
#define WALK_DEPTH_MAX 64

struct entry {
	char *rel;
	uint64_t size;
};

struct job {
	struct fs *fs;
	struct ctl_conn *cn;
	const struct ctl_req *req;
	struct entry *e;
	size_t n, cap;
	int failed; /* some PATH could not be done */
	uint64_t base, total; /* progress: bytes before this file, in all */
	uint64_t last_ms;
};

/* The policy of a file (cache/mngt/fpolicy.c): what its object got at its last
 * open; without an object (nothing cached), what its next open would get. */
static const char *file_policy(struct job *j, const struct entry *e,
			       struct cfile *f)
{
	const char *p = f ? cache_file_policy(f)
			  : cache_policy_for(j->fs->cache, e->rel, e->size);

	return p ? p : "-";
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000ull + ts.tv_nsec / 1000000;
}

/* A PATH failed: the client says so and goes on. */
static void perr(struct job *j, const char *rel, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void perr(struct job *j, const char *rel, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	msg[strcspn(msg, "\n")] = 0;
	ctl_say(j->cn, "perr %zu\n", strlen(rel));
	ctl_send_all(j->cn, rel, strlen(rel));
	ctl_say(j->cn, "\n%s\n", msg);
	j->failed = 1;
}

/* The client closed its end (or the daemon is stopping): stop the work. */
static int client_gone(void *arg)
{
	struct job *j = arg;
	struct pollfd p = { j->cn->fd, POLLIN | POLLRDHUP, 0 };
	char c;

	if (j->cn->dropped)
		return 1; /* stopped reading: as good as gone */
	if (poll(&p, 1, 0) <= 0)
		return 0;
	if (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL))
		return 1;
	/* bytes after the request: not ours to wait for, but an EOF is */
	return recv(j->cn->fd, &c, 1, MSG_DONTWAIT | MSG_PEEK) == 0;
}

static int rel_ok(const char *rel)
{
	const char *p = rel;

	if (*rel == '/')
		return 0;
	while (*p) {
		size_t n = strcspn(p, "/");

		if (n == 2 && p[0] == '.' && p[1] == '.')
			return 0;
		p += n;
		p += *p == '/';
	}
	return 1;
}

/* rel opened beneath the backing directory (O_PATH): fd or -errno. */
static int open_beneath(struct fs *fs, int dirfd, const char *rel)
{
	struct open_how how = {
		.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
			   RESOLVE_NO_MAGICLINKS,
	};
	int fd;

	(void)fs;
	if (!*rel)
		rel = ".";
	fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
	if (fd < 0 && errno == ENOSYS)
		fd = openat(dirfd, rel, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

static int add_entry(struct job *j, const char *rel, const struct stat *st)
{
	uint64_t size = st->st_size;

	if (j->n == j->cap) {
		size_t cap = j->cap ? 2 * j->cap : 64;
		struct entry *e = realloc(j->e, cap * sizeof(*e));

		if (!e)
			return -ENOMEM;
		j->e = e;
		j->cap = cap;
	}
	/* data not yet destaged counts: the size the mount shows */
	cache_file_attr(j->fs->cache, st->st_dev, st->st_ino, &size, NULL);
	j->e[j->n].rel = strdup(rel);
	if (!j->e[j->n].rel)
		return -ENOMEM;
	j->e[j->n++].size = size;
	return 0;
}

static char *join(const char *dir, const char *name)
{
	char *p;

	if (asprintf(&p, "%s%s%s", dir, *dir ? "/" : "", name) < 0)
		return NULL;
	return p;
}

/* The regular files under the directory rel (open as dfd, which this
 * takes), in name order within each directory. */
static int walk(struct job *j, int dfd, const char *rel, int depth)
{
	struct dirent **names;
	int i, n, ret = 0;

	if (depth > WALK_DEPTH_MAX) {
		close(dfd);
		perr(j, rel, "directories nested deeper than %d: not walked",
		     WALK_DEPTH_MAX);
		return 0;
	}
	{
		/* scandir needs a path: the descriptor's, through /proc */
		char proc[64];
		int rfd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		close(dfd);
		if (rfd < 0) {
			perr(j, rel, "%s", strerror(errno));
			return 0;
		}
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", rfd);
		n = scandir(proc, &names, NULL, alphasort);
		if (n < 0) {
			perr(j, rel, "%s", strerror(errno));
			close(rfd);
			return 0;
		}
		dfd = rfd;
	}
	for (i = 0; i < n; i++) {
		const char *name = names[i]->d_name;
		struct stat st;
		char *child;
		int cfd;

		if (ret || !strcmp(name, ".") || !strcmp(name, "..") ||
		    (!*rel && !strcmp(name, LOST_FOUND_DIR)))
			goto next;
		if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW))
			goto next;
		child = join(rel, name);
		if (!child) {
			ret = -ENOMEM;
			goto next;
		}
		if (S_ISREG(st.st_mode)) {
			ret = add_entry(j, child, &st);
		} else if (S_ISDIR(st.st_mode)) {
			cfd = open_beneath(j->fs, dfd, name);
			if (cfd >= 0)
				ret = walk(j, cfd, child, depth + 1);
		}
		free(child);
	next:
		free(names[i]);
	}
	free(names);
	close(dfd);
	return ret;
}

/* Every regular file that the request's PATHs name. */
static int collect(struct job *j)
{
	unsigned i;
	int ret = 0;

	for (i = 0; i < j->req->nargs && !ret; i++) {
		const char *rel = j->req->args[i];
		struct stat st;
		int fd;

		if (!rel_ok(rel)) {
			perr(j, rel, "not a path within the mount");
			continue;
		}
		fd = open_beneath(j->fs, j->fs->backing_fd, rel);
		if (fd < 0) {
			perr(j, rel, "%s", strerror(-fd));
			continue;
		}
		if (fstat(fd, &st)) {
			perr(j, rel, "%s", strerror(errno));
			close(fd);
			continue;
		}
		if (S_ISREG(st.st_mode)) {
			ret = add_entry(j, rel, &st);
			close(fd);
		} else if (S_ISDIR(st.st_mode) &&
			   (j->req->flags & CTL_F_RECURSIVE)) {
			ret = walk(j, fd, rel, 0);
		} else {
			perr(j, rel,
			     S_ISDIR(st.st_mode) ? "is a directory (use -r)"
						 : "not a regular file");
			close(fd);
		}
	}
	return ret;
}

/* The engine's object of e (made if make), referenced; -ENOENT: none. */
static int entry_file(struct job *j, const struct entry *e, int make,
		      struct cfile **f)
{
	int fd = open_beneath(j->fs, j->fs->backing_fd, e->rel), ret;

	if (fd < 0)
		return fd;
	ret = make ? cache_file_get(j->fs->cache, fd, f)
		   : cache_file_lookup(j->fs->cache, fd, f);
	close(fd);
	return ret;
}

static void progress(struct job *j, uint64_t a, uint64_t b, int force)
{
	uint64_t t = mono_ms();

	if (!force && t - j->last_ms < PROGRESS_MS)
		return;
	j->last_ms = t;
	ctl_say(j->cn, "progress %llu %llu\n", (unsigned long long)a,
		(unsigned long long)b);
}

static void warm_progress(void *arg, uint64_t done, uint64_t unused)
{
	struct job *j = arg;

	(void)unused;
	progress(j, j->base + done, j->total, 0);
}

static const char *mib(uint64_t b, char *buf, size_t len)
{
	snprintf(buf, len, "%.1f MiB", b / 1048576.0);
	return buf;
}

/* Warm e up to limit bytes (with the file f, referenced); *cached after. */
/* A warm fills the cache outside any open: not while the file is open
 * through passthrough, and no passthrough open while it runs (passthru.c). */
static int warm_one(struct job *j, const struct entry *e, struct cfile *f,
		    uint64_t limit, uint64_t *read, uint64_t *cached)
{
	struct cache_file_info i;
	struct stat st;
	int fd = open_beneath(j->fs, j->fs->backing_fd, e->rel), ret;

	if (fd < 0)
		return fd;
	ret = fstat(fd, &st) ? -errno : 0;
	close(fd);
	if (!ret)
		ret = fs_pt_hold(st.st_dev, st.st_ino);
	if (ret) {
		*read = *cached = 0;
		perr(j, e->rel, "warm: %s",
		     ret == -EBUSY
			     ? "open through passthrough (fuse.passthrough)"
			     : strerror(-ret));
		return ret;
	}
	ret = cache_file_warm(j->fs->cache, f, limit, warm_progress,
			      client_gone, j, read);
	fs_pt_unhold(st.st_dev, st.st_ino);

	cache_file_info(j->fs->cache, f, &i);
	*cached = i.cached;
	if (ret && ret != -EINTR)
		perr(j, e->rel, "warm: %s", strerror(-ret));
	return ret;
}

static void cmd_warm(struct job *j, int pin)
{
	struct cache *c = j->fs->cache;
	uint64_t need = 0, budget, nread = 0, cached = 0, files = 0;
	struct cache_room r;
	char a[32], b[32], d[32], p[32], q[32];
	size_t k;
	int ret = 0;

	for (k = 0; k < j->n; k++) {
		struct cfile *f = NULL;

		entry_file(j, &j->e[k], 0, &f);
		need += cache_file_warm_need(c, f, j->e[k].size);
		if (f)
			cache_file_put(c, f);
		j->total += j->e[k].size;
	}
	cache_room(c, &r);
	budget = r.available;
	if (!pin && need > budget && !(j->req->flags & CTL_F_PARTIAL)) {
		ctl_say(j->cn,
			"error the files need %s of cache and %s is available "
			"(capacity %s, dirty %s, pinned %s): warm fewer files, "
			"or use --partial to warm what fits\n",
			mib(need, a, sizeof(a)), mib(budget, b, sizeof(b)),
			mib(r.capacity, d, sizeof(d)),
			mib(r.dirty, p, sizeof(p)),
			mib(r.pinned, q, sizeof(q)));
		return;
	}
	for (k = 0; k < j->n && ret != -EINTR; k++) {
		struct entry *e = &j->e[k];
		uint64_t lim = e->size, want, got = 0, in = 0;
		struct cfile *f;

		ret = entry_file(j, e, 1, &f);
		if (ret) {
			perr(j, e->rel, "%s", strerror(-ret));
			continue;
		}
		if (pin) {
			ret = cache_file_pin(c, f, 1, &r);
			if (ret == -ENOSPC) {
				perr(j, e->rel,
				     "not pinned: it needs %s and pinned files "
				     "hold %s of the %s that cache.max_pinned "
				     "allows",
				     mib(r.want, a, sizeof(a)),
				     mib(r.pinned, b, sizeof(b)),
				     mib(r.max_pinned, d, sizeof(d)));
				cache_file_put(c, f);
				continue;
			}
			if (ret) {
				perr(j, e->rel, "not pinned: %s",
				     ret == -EMFILE
					     ? "every file record of the cache "
					       "is taken (cache.max_files)"
					     : strerror(-ret));
				cache_file_put(c, f);
				continue;
			}
			/* warm what fits, the rest stays pinned uncached */
			budget = (cache_room(c, &r), r.available);
		}
		want = cache_file_warm_need(c, f, e->size);
		if (want > budget) {
			/* --partial (or pin): what fits, from the start */
			lim = budget;
			lim = lim < e->size ? lim : e->size;
			want = budget;
		}
		if (lim)
			ret = warm_one(j, e, f, lim, &in, &got);
		else
			ret = 0;
		budget -= want < budget ? want : budget;
		cache_file_put(c, f);
		j->base += e->size;
		nread += in;
		cached += got;
		files++;
	}
	progress(j, j->base > j->total ? j->total : j->base, j->total, 1);
	if (ret == -EINTR) {
		log_msg(LOG_NOTICE, "%s stopped: the client went away",
			pin ? "pin" : "warm");
		ctl_say(j->cn, "error interrupted\n");
		return;
	}
	ctl_say(j->cn, "done files=%llu read=%llu cached=%llu size=%llu\n",
		(unsigned long long)files, (unsigned long long)nread,
		(unsigned long long)cached, (unsigned long long)j->total);
	ctl_say(j->cn, j->failed ? "error some paths failed\n" : "ok\n");
}

static void cmd_unpin(struct job *j)
{
	struct cache_room r;
	size_t k;
	uint64_t n = 0;

	for (k = 0; k < j->n; k++) {
		struct cfile *f;
		int ret = entry_file(j, &j->e[k], 0, &f);

		if (ret == -ENOENT)
			continue; /* never cached: not pinned */
		if (!ret) {
			ret = cache_file_pin(j->fs->cache, f, 0, &r);
			cache_file_put(j->fs->cache, f);
		}
		if (ret)
			perr(j, j->e[k].rel, "%s", strerror(-ret));
		else
			n++;
	}
	ctl_say(j->cn, "done files=%llu\n", (unsigned long long)n);
	ctl_say(j->cn, j->failed ? "error some paths failed\n" : "ok\n");
}

struct flush_arg {
	struct job *j;
	uint64_t dirty0; /* of the files not yet flushed */
};

static void flush_progress(void *arg, uint64_t dirty, uint64_t destaged)
{
	struct flush_arg *fa = arg;

	progress(fa->j, fa->dirty0 + dirty, fa->j->base + destaged, 0);
}

static int flush_stop(void *arg)
{
	return client_gone(((struct flush_arg *)arg)->j);
}

/* Flush f (referenced) with progress; the dirty bytes of the files after
 * it are dirty_after. */
static int flush_one(struct job *j, const struct entry *e, struct cfile *f,
		     uint64_t dirty_after)
{
	struct flush_arg fa = { j, dirty_after };
	uint64_t destaged = 0;
	int ret = cache_file_flush_progress(j->fs->cache, f, flush_progress,
					    flush_stop, &fa, &destaged);

	j->base += destaged;
	if (ret && ret != -EINTR)
		perr(j, e->rel, "flush: %s", strerror(-ret));
	return ret;
}

/* evict (drop: with --flush, flush first) or flush of every entry. */
static void cmd_flush_evict(struct job *j, int drop)
{
	struct cache *c = j->fs->cache;
	uint64_t *dirty = calloc(j->n + 1, sizeof(*dirty)), after = 0;
	uint64_t dropped = 0, left = 0, files = 0;
	int flush = !drop || (j->req->flags & CTL_F_FLUSH), ret = 0;
	size_t k;

	if (!dirty) {
		ctl_say(j->cn, "error out of memory\n");
		return;
	}
	for (k = j->n; k-- > 0;) {
		struct cache_file_info i;
		struct cfile *f;

		if (!entry_file(j, &j->e[k], 0, &f)) {
			cache_file_info(c, f, &i);
			dirty[k] = i.dirty;
			cache_file_put(c, f);
		}
		after += dirty[k];
		dirty[k] = after; /* from k on */
	}
	for (k = 0; k < j->n && ret != -EINTR; k++) {
		struct entry *e = &j->e[k];
		struct cache_file_info i;
		struct cfile *f;
		uint64_t n;

		ret = entry_file(j, e, 0, &f);
		if (ret == -ENOENT) {
			ret = 0;
			files++;
			continue; /* nothing cached */
		}
		if (ret) {
			perr(j, e->rel, "%s", strerror(-ret));
			continue;
		}
		if (drop) {
			/* a pinned file's data stays: nothing done to it, its
			 * dirty data not destaged either */
			cache_file_info(c, f, &i);
			if (i.pinned) {
				perr(j, e->rel,
				     "pinned: its data stays (unpin it "
				     "first)");
				left += i.cached;
				cache_file_put(c, f);
				files++;
				continue;
			}
		}
		if (flush)
			ret = flush_one(j, e, f, dirty[k + 1]);
		if (drop && ret != -EINTR) {
			if (cache_file_evict(c, f, &n) == -EBUSY)
				perr(j, e->rel,
				     "pinned: its data stays (unpin it "
				     "first)");
			dropped += n;
			cache_file_info(c, f, &i);
			left += i.cached;
		}
		cache_file_put(c, f);
		files++;
	}
	free(dirty);
	if (ret == -EINTR) {
		ctl_say(j->cn, "error interrupted\n");
		return;
	}
	if (flush)
		progress(j, 0, j->base, 1);
	ctl_say(j->cn, "done files=%llu destaged=%llu dropped=%llu left=%llu\n",
		(unsigned long long)files, (unsigned long long)j->base,
		(unsigned long long)dropped, (unsigned long long)left);
	ctl_say(j->cn, j->failed ? "error some paths failed\n" : "ok\n");
}

static void cmd_status(struct job *j)
{
	size_t k;

	for (k = 0; k < j->n; k++) {
		struct cache_file_info i;
		struct cfile *f;
		const char *pol;

		memset(&i, 0, sizeof(i));
		i.size = j->e[k].size;
		i.up_to_date = 1;
		if (!entry_file(j, &j->e[k], 0, &f)) {
			cache_file_info(j->fs->cache, f, &i);
			/* names live as long as the process (policy.c) */
			pol = file_policy(j, &j->e[k], f);
			cache_file_put(j->fs->cache, f);
		} else {
			pol = file_policy(j, &j->e[k], NULL);
		}
		ctl_say(j->cn, "file %llu %llu %llu %llu %d %d %s %zu\n",
			(unsigned long long)i.size,
			(unsigned long long)i.cached,
			(unsigned long long)i.dirty,
			(unsigned long long)i.dirty_age_ms, i.pinned,
			i.up_to_date, pol, strlen(j->e[k].rel));
		ctl_send_all(j->cn, j->e[k].rel, strlen(j->e[k].rel));
		ctl_say(j->cn, "\n");
	}
	ctl_say(j->cn, "done files=%zu\n", j->n);
	ctl_say(j->cn, j->failed ? "error some paths failed\n" : "ok\n");
}

void ctl_file_command(struct fs *fs, struct ctl_conn *cn,
		      const struct ctl_req *req)
{
	struct job j = { .fs = fs, .cn = cn, .req = req };
	size_t k;
	int ret;

	if (!req->nargs) {
		ctl_say(cn, "error %s needs at least one PATH\n", req->cmd);
		return;
	}
	ret = collect(&j);
	if (ret) {
		ctl_say(cn, "error %s\n", strerror(-ret));
		goto out_free;
	}
	if (strcmp(req->cmd, "status"))
		log_msg(LOG_NOTICE, "%.31s requested for %zu file(s)",
			j.req->cmd, j.n);
	if (!strcmp(req->cmd, "status"))
		cmd_status(&j);
	else if (!strcmp(req->cmd, "warm"))
		cmd_warm(&j, 0);
	else if (!strcmp(req->cmd, "pin"))
		cmd_warm(&j, 1);
	else if (!strcmp(req->cmd, "unpin"))
		cmd_unpin(&j);
	else if (!strcmp(req->cmd, "evict"))
		cmd_flush_evict(&j, 1);
	else if (!strcmp(req->cmd, "flush"))
		cmd_flush_evict(&j, 0);
	else
		ctl_say(cn, "error unknown command '%s'\n", req->cmd);
out_free:
	for (k = 0; k < j.n; k++)
		free(j.e[k].rel);
	free(j.e);
}
