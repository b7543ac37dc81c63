/* fs: acting as the caller — per-thread fsuid, fsgid, groups, umask and
 * capabilities around the store operations made for a request. */
#define _GNU_SOURCE
#include "cred.h"

#include <assert.h>
#include <errno.h>
#include <linux/capability.h>
#include <sched.h>
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
 *   wrappers change every thread of the process), and an effective
 *   capability set of CAP_SETUID and CAP_SETGID alone (to change callers
 *   again; neither passes a file system check).  Moving fsuid off 0 drops
 *   CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN and the other file capabilities;
 *   the capset drops CAP_SYS_RESOURCE (quotas, root's reserved blocks) and
 *   CAP_SYS_ADMIN (trusted.*).  The store checks the caller as it would
 *   any process of that user.
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
 * Groups are read from /proc (fuse_req_getgroups), which costs an open and
 * a read; each thread remembers a caller's list for GROUPS_TTL_NS, by
 * (pid, uid, gid).  A process that changes its groups is seen with the new
 * list within that time; the kernel (default_permissions) has checked the
 * request with its current groups already.
 */

#define GROUPS_MAX 64
#define GROUPS_SLOTS 16
#define GROUPS_TTL_NS 1000000000ull

struct groups_slot {
	pid_t pid;
	uid_t uid;
	gid_t gid;
	int n;
	uint64_t when;
	gid_t list[GROUPS_MAX];
};

static struct __user_cap_data_struct own_caps[2];
/* the same, with CAP_SETUID and CAP_SETGID alone effective (the permitted
 * set is kept, to take them back) */
static struct __user_cap_data_struct caller_caps[2];
static int setup_done;

static __thread struct {
	int unshared; /* this thread has its own umask */
	int in; /* inside a section */
	int as_caller; /* the IDs and capabilities are a caller's (uid, gid) */
	uid_t uid;
	gid_t gid;
	mode_t umask; /* this thread's umask now */
	int groups_known; /* groups[ngroups] are its supplementary groups now
			   * (a new thread's are the process's: not known) */
	int ngroups;
	gid_t groups[GROUPS_MAX];
	struct groups_slot slots[GROUPS_SLOTS];
} me;

int fs_cred_setup(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };

	if (syscall(SYS_capget, &h, own_caps))
		return -errno;
	memcpy(caller_caps, own_caps, sizeof(own_caps));
	caller_caps[0].effective =
		own_caps[0].effective &
		((1u << CAP_SETUID) | (1u << CAP_SETGID));
	caller_caps[1].effective = 0;
	setup_done = 1;
	return 0;
}

int fs_cred_as_caller(void)
{
	return me.as_caller;
}

static int caps_set(const struct __user_cap_data_struct *d)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };

	return syscall(SYS_capset, &h, d) ? -errno : 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* The caller's supplementary groups: a remembered list, or read anew into
 * the slot; a list too long for it is read each time into *heap (to be
 * freed by the caller). */
static int caller_groups(fuse_req_t req, const struct fuse_ctx *ctx,
			 gid_t **heap, const gid_t **out)
{
	struct groups_slot *s = &me.slots[(unsigned)ctx->pid % GROUPS_SLOTS];
	uint64_t t = now_ns();
	int n, ret;

	*heap = NULL;
	*out = NULL;
	if (s->pid == ctx->pid && s->uid == ctx->uid && s->gid == ctx->gid &&
	    t - s->when < GROUPS_TTL_NS) {
		*out = s->list;
		return s->n;
	}
	if (!ctx->pid)
		return 0;
	n = fuse_req_getgroups(req, GROUPS_MAX, s->list);
	if (n < 0)
		return n;
	if (n <= GROUPS_MAX) {
		s->pid = ctx->pid;
		s->uid = ctx->uid;
		s->gid = ctx->gid;
		s->n = n;
		s->when = t;
		*out = s->list;
		return n;
	}
	s->pid = 0;
	*heap = malloc(n * sizeof(gid_t));
	if (!*heap)
		return -ENOMEM;
	*out = *heap;
	/* a list grown since is cut: fewer groups, never another's */
	ret = fuse_req_getgroups(req, n, *heap);
	return ret < n ? ret : n;
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
 * when they are already (leave keeps them). */
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

/* The thread's IDs become uid, gid and groups: from the daemon's, or from
 * another caller's (CAP_SETUID and CAP_SETGID stay effective for that). */
static int ids_take(uid_t uid, gid_t gid, const gid_t *groups, int n)
{
	int was_caller = me.as_caller, ret = groups_take(groups, n);

	if (ret)
		goto back_to_daemon;
	if (was_caller && me.uid == uid && me.gid == gid)
		return 0;
	if (!was_caller || me.gid != gid)
		syscall(SYS_setfsgid, gid);
	if (!was_caller || me.uid != uid)
		syscall(SYS_setfsuid, uid);
	me.as_caller = 1;
	me.uid = uid;
	me.gid = gid;
	/* setfsuid says nothing of a failure: ask */
	if ((uid_t)syscall(SYS_setfsuid, -1) != uid ||
	    (gid_t)syscall(SYS_setfsgid, -1) != gid) {
		ret = -EPERM;
		goto back_to_daemon;
	}
	/* off the daemon's: the capabilities go once the IDs are set */
	if (!was_caller) {
		ret = caps_set(caller_caps);
		if (ret)
			goto back_to_daemon;
	}
	return 0;
back_to_daemon:
	me.as_caller = 1; /* whatever was set, undo it all */
	fs_cred_daemon();
	return ret;
}

int fs_cred_take(const struct fs_caller *who, const gid_t *groups, int n)
{
	int ret;

	assert(setup_done && !me.in);
	/* only a creating request has a umask (0 in any other) */
	if (who->umask & 0777) {
		ret = umask_take(who->umask & 0777);
		if (ret)
			return ret;
	}
	if (who->uid)
		ret = ids_take(who->uid, who->gid, groups, n);
	else
		ret = fs_cred_daemon();
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
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct fs_caller who = { ctx->uid, ctx->gid, ctx->umask };
	const gid_t *list = NULL;
	gid_t *heap = NULL;
	int n = 0, ret;

	if (ctx->uid) {
		n = caller_groups(req, ctx, &heap, &list);
		if (n < 0)
			return n;
	}
	ret = fs_cred_take(&who, list, n);
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
	if (caps_set(own_caps))
		abort();
	syscall(SYS_setfsuid, 0);
	syscall(SYS_setfsgid, 0);
	if (syscall(SYS_setfsuid, -1) != 0 || syscall(SYS_setfsgid, -1) != 0)
		abort();
	me.as_caller = 0;
	return 0;
}
