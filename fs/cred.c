/* fs: acting as the caller — per-thread fsuid, fsgid, groups, umask and
 * capabilities around the store operations made for a request. */
#define _GNU_SOURCE
#include "cred.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/*
 * Why.  The daemon runs as root for many users; the store must see each
 * request's caller, so that its own modes, ACLs, quotas and reserved blocks
 * apply.  The store operations made for a request run in a section,
 * fs_cred_enter ... fs_cred_leave, with the caller's credentials:
 *
 *   fsuid, fsgid, supplementary groups (the raw system calls: glibc's
 *   wrappers change every thread of the process), and the caller's own
 *   effective capabilities (as many of them as the daemon has), plus
 *   CAP_SETUID and CAP_SETGID (to change callers again; neither passes a
 *   file system check).  So a user without capabilities has no
 *   CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SYS_RESOURCE (quotas, root's reserved
 *   blocks) or CAP_SYS_ADMIN (trusted.*), a service given
 *   CAP_DAC_READ_SEARCH keeps it, and uid 0 without capabilities (a
 *   container's root) is not the daemon.  The store checks the caller as it
 *   would that process.
 *
 * Cost.  Each of those system calls makes new credentials (commit_creds):
 * about 2 us on the test machines, 12 us for a section entered and left.
 * So a thread keeps its last caller's credentials after fs_cred_leave (it
 * "lingers"), and the next section of the same caller changes nothing.
 * Before anything the daemon does for itself, the thread takes the daemon's
 * credentials back with fs_cred_daemon (free when it has them):
 *
 *   - every request handler but those that do nothing privileged starts
 *     with it (fs.c: TIMED; the others are TIMED_CALLER, listed there);
 *   - fs_inode_fd before opening by handle, and the handlers after their
 *     section when they go on into the cache;
 *   - the worker's completions and parked requests (aio.c), and the pool.
 *
 * The device I/O a worker queues carries the daemon's credentials whoever
 * submits it (devices/aring.c: a registered personality), since a worker
 * submits its queue after the batch of requests it read, and may linger by
 * then.
 *
 * The rule the code keeps: no privileged system call, no cache call that
 * may do I/O or submit io_uring requests (which carry the submitter's
 * credentials to their workers), runs on a lingering thread.  Enforced in
 * debug builds: fs_cred_daemon asserts it is not inside a section, and the
 * cache's entry points in fs/ are reached through fs_cred_daemon.  Sections
 * do not nest (asserted).
 *
 * Umask.  Each thread has its own fs_struct (unshare(CLONE_FS) at its first
 * creating section), so a creating request's umask is the caller's and no
 * other thread's: the kernel leaves the umask to the daemon when ACLs are
 * on (FUSE_POSIX_ACL), since a parent's default ACL replaces it; the store
 * applies it as it would.  It is put back to 0 at leave.
 *
 * Groups and capabilities are read from /proc/PID/task/PID/status, as the
 * daemon (a /proc mounted hidepid=2 hides another user's processes from a
 * thread lingering as some user), which costs an open and a read; each
 * thread remembers a caller's for CALLER_TTL_NS, by (pid, uid, gid).  A
 * process that changes its groups or capabilities is seen so within that
 * time; the kernel (default_permissions) has checked the request with its
 * current ones already.  fs_cred_daemon puts the daemon's own groups back,
 * so that its work on a store where root is not privileged (NFS with
 * root_squash, a FUSE store that reads groups) has no user's groups.
 */

#define GROUPS_MAX 64
#define CALLER_SLOTS 16
#define CALLER_TTL_NS 1000000000ull
#define CAPS_SWITCH ((1ull << CAP_SETUID) | (1ull << CAP_SETGID))

/* A caller remembered by a thread (pid 0: empty). */
struct caller_slot {
	pid_t pid;
	uid_t uid;
	gid_t gid;
	int n;
	uint64_t caps;
	uint64_t when;
	gid_t list[GROUPS_MAX];
};

static struct __user_cap_data_struct own_caps[2];
static uint64_t own_eff;
static int own_ngroups;
static gid_t own_groups[GROUPS_MAX];
static int setup_done;

static __thread struct {
	int unshared; /* this thread has its own umask */
	int in; /* inside a section */
	int as_caller; /* the IDs and capabilities are a caller's: */
	uid_t uid;
	gid_t gid;
	uint64_t caps; /* effective */
	mode_t umask; /* this thread's umask now */
	int groups_known; /* groups[ngroups] are its supplementary groups now
			   * (a new thread's are the process's: not known) */
	int ngroups;
	gid_t groups[GROUPS_MAX];
	struct caller_slot slots[CALLER_SLOTS];
} me;

static uint64_t caps_u64(const struct __user_cap_data_struct *d, int which)
{
	return which ? (uint64_t)d[1].effective << 32 | d[0].effective
		     : (uint64_t)d[1].permitted << 32 | d[0].permitted;
}

int fs_cred_setup(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	int n;

	if (syscall(SYS_capget, &h, own_caps))
		return -errno;
	own_eff = caps_u64(own_caps, 1);
	n = getgroups(GROUPS_MAX, own_groups);
	if (n < 0)
		return -errno;
	own_ngroups = n;
	setup_done = 1;
	return 0;
}

int fs_cred_as_caller(void)
{
	return me.as_caller;
}

int fs_cred_has(const struct fs_caller *who, int cap)
{
	return (who->caps >> cap) & 1;
}

/* The effective set becomes eff (the permitted set stays the daemon's). */
static int caps_set(uint64_t eff)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];

	memcpy(d, own_caps, sizeof(d));
	d[0].effective = (uint32_t)eff;
	d[1].effective = (uint32_t)(eff >> 32);
	return syscall(SYS_capset, &h, d) ? -errno : 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* /proc/PID/task/PID/status, whole, NUL-terminated, in *buf (to free). */
static int status_read(pid_t pid, char **buf)
{
	size_t len = 0, cap = 4096;
	char path[64], *b = malloc(cap), *nb;
	ssize_t n;
	int fd, ret = 0;

	if (!b)
		return -ENOMEM;
	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid,
		 (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		goto free_buf;
	}
	while ((n = read(fd, b + len, cap - len - 1)) > 0) {
		len += n;
		if (len + 1 < cap)
			continue;
		nb = realloc(b, cap * 2);
		if (!nb) {
			ret = -ENOMEM;
			goto close_fd;
		}
		b = nb;
		cap *= 2;
	}
	if (n < 0)
		ret = -errno;
close_fd:
	close(fd);
	if (!ret) {
		b[len] = 0;
		*buf = b;
		return 0;
	}
free_buf:
	free(b);
	return ret;
}

/* Parse Groups: and CapEff: of status into who (its groups into list, of
 * room for max; the count may be larger). */
static int status_parse(const char *st, struct fs_caller *who, gid_t *list,
			int max)
{
	const char *g = strstr(st, "\nGroups:"), *c = strstr(st, "\nCapEff:");
	unsigned long long caps;
	char *end;
	int n = 0;

	if (!g || !c || sscanf(c + 8, "%llx", &caps) != 1)
		return -EIO;
	who->caps = caps;
	for (g += 8;;) {
		unsigned long v;

		while (*g == ' ' || *g == '\t')
			g++;
		if (*g < '0' || *g > '9')
			break;
		v = strtoul(g, &end, 10);
		if (n < max)
			list[n] = v;
		n++;
		g = end;
	}
	who->ngroups = n;
	return 0;
}

int fs_cred_caller(fuse_req_t req, struct fs_caller *who, gid_t **heap)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct caller_slot *s = &me.slots[(unsigned)ctx->pid % CALLER_SLOTS];
	uint64_t t = now_ns();
	char *st = NULL;
	int ret;

	*heap = NULL;
	who->uid = ctx->uid;
	who->gid = ctx->gid;
	who->umask = ctx->umask;
	who->ngroups = 0;
	who->groups = NULL;
	if (!ctx->pid) {
		/* the kernel's own request (no process): root's, or nobody's */
		who->caps = ctx->uid ? 0 : own_eff;
		return 0;
	}
	if (s->pid == ctx->pid && s->uid == ctx->uid && s->gid == ctx->gid &&
	    t - s->when < CALLER_TTL_NS) {
		who->caps = s->caps;
		who->ngroups = s->n;
		who->groups = s->list;
		return 0;
	}
	/* read as the daemon, or as the same user (hidepid) */
	if (me.as_caller && me.uid != ctx->uid)
		fs_cred_daemon();
	ret = status_read(ctx->pid, &st);
	if (ret)
		return ret;
	s->pid = 0;
	ret = status_parse(st, who, s->list, GROUPS_MAX);
	if (!ret && who->ngroups > GROUPS_MAX) {
		*heap = malloc(who->ngroups * sizeof(gid_t));
		ret = *heap ? status_parse(st, who, *heap, who->ngroups)
			    : -ENOMEM;
		who->groups = *heap;
	} else if (!ret) {
		s->pid = ctx->pid;
		s->uid = ctx->uid;
		s->gid = ctx->gid;
		s->n = who->ngroups;
		s->caps = who->caps;
		s->when = t;
		who->groups = s->list;
	}
	free(st);
	if (ret) {
		free(*heap);
		*heap = NULL;
	}
	return ret;
}

static int umask_take(mode_t m)
{
	if (!me.unshared) {
		if (unshare(CLONE_FS))
			return -errno;
		me.unshared = 1;
		me.umask = umask(0);
	}
	if (m != me.umask) {
		umask(m);
		me.umask = m;
	}
	return 0;
}

/* This thread's supplementary groups become list (n of them); unchanged
 * when they are already. */
static int groups_take(const gid_t *list, int n)
{
	if (me.groups_known && me.ngroups == n &&
	    (!n || !memcmp(me.groups, list, n * sizeof(*list))))
		return 0;
	me.groups_known = 0;
	if (syscall(SYS_setgroups, (size_t)n, list))
		return -errno;
	if (n <= GROUPS_MAX) {
		if (n)
			memcpy(me.groups, list, n * sizeof(*list));
		me.ngroups = n;
		me.groups_known = 1;
	}
	return 0;
}

/* The thread's IDs, groups and capabilities become who's: from the
 * daemon's, or from another caller's. */
static int ids_take(const struct fs_caller *who)
{
	uint64_t caps = (who->caps & own_eff) | (own_eff & CAPS_SWITCH);
	int was_caller = me.as_caller, ids = 0, ret;

	ret = groups_take(who->groups, who->ngroups);
	if (ret)
		goto back_to_daemon;
	if (!was_caller || me.gid != who->gid) {
		syscall(SYS_setfsgid, who->gid);
		ids = 1;
	}
	if (!was_caller || me.uid != who->uid) {
		syscall(SYS_setfsuid, who->uid);
		ids = 1;
	}
	me.as_caller = 1;
	me.uid = who->uid;
	me.gid = who->gid;
	/* setfsuid says nothing of a failure: ask */
	if (ids && ((uid_t)syscall(SYS_setfsuid, -1) != who->uid ||
		    (gid_t)syscall(SYS_setfsgid, -1) != who->gid)) {
		ret = -EPERM;
		goto back_to_daemon;
	}
	/* after the IDs (setfsuid needs CAP_SETUID; moving fsuid to or off 0
	 * changes the effective file capabilities by itself) */
	if (ids || me.caps != caps) {
		ret = caps_set(caps);
		if (ret)
			goto back_to_daemon;
		me.caps = caps;
	}
	return 0;
back_to_daemon:
	me.as_caller = 1; /* whatever was set, undo it all */
	me.groups_known = 0;
	fs_cred_daemon();
	return ret;
}

int fs_cred_take(const struct fs_caller *who)
{
	int ret;

	assert(setup_done && !me.in);
	/* only a creating request has a umask (0 in any other) */
	if (who->umask & 0777) {
		ret = umask_take(who->umask & 0777);
		if (ret)
			return ret;
	}
	if (!who->uid && (who->caps & own_eff) == own_eff)
		ret = fs_cred_daemon(); /* root with all the daemon may */
	else
		ret = ids_take(who);
	if (ret) {
		if (me.umask)
			umask_take(0);
		return ret;
	}
	me.in = 1;
	return 0;
}

int fs_cred_enter(fuse_req_t req)
{
	struct fs_caller who;
	gid_t *heap;
	int ret = fs_cred_caller(req, &who, &heap);

	if (ret)
		return ret;
	ret = fs_cred_take(&who);
	free(heap);
	return ret;
}

void fs_cred_leave(void)
{
	assert(me.in);
	/* the daemon's own files are made with the modes it gives them */
	if (me.umask)
		umask_take(0);
	me.in = 0;
}

int fs_cred_daemon(void)
{
	assert(!me.in);
	if (!me.as_caller)
		return 0;
	/* nothing the daemon does after may run as the caller */
	if (caps_set(own_eff))
		abort();
	syscall(SYS_setfsuid, 0);
	syscall(SYS_setfsgid, 0);
	if (syscall(SYS_setfsuid, -1) != 0 || syscall(SYS_setfsgid, -1) != 0 ||
	    groups_take(own_groups, own_ngroups))
		abort();
	me.as_caller = 0;
	me.caps = own_eff;
	return 0;
}
