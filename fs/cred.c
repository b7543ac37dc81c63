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
 * Why and how.  The daemon runs as root for many users; the store must see
 * each request's caller, so that its own modes, ACLs, quotas and reserved
 * blocks apply.  A section of store operations made for a request is
 * bracketed by fs_cred_enter / fs_cred_leave on the thread that makes them:
 *
 *   enter: setgroups, setfsgid, setfsuid (the raw system calls: glibc's
 *          wrappers change every thread of the process), then an empty
 *          effective capability set (no CAP_DAC_OVERRIDE, CAP_FOWNER,
 *          CAP_SYS_RESOURCE, CAP_SYS_ADMIN: the store checks the caller as
 *          it would any process of that user, quotas and root's reserved
 *          blocks included, and trusted.* is not listed);
 *   leave: the daemon's effective set back, then fsuid and fsgid 0.
 *
 * The IDs are set before the capabilities go (setfsuid needs CAP_SETUID)
 * and come back after they return.  The supplementary groups are not put
 * back at leave: root's operations pass on its capabilities, whatever its
 * groups; a thread's next caller sets its own (or none).  Each thread has
 * its own fs_struct (unshare(CLONE_FS) at its first section), so the umask
 * of a creating request is the caller's and no other thread's: the kernel
 * leaves the umask to the daemon when ACLs are on (FUSE_POSIX_ACL), since a
 * parent's default ACL replaces it; the store applies it as it would.  A
 * creating request's umask is taken at enter and 0 is put back at leave.
 *
 * Only store system calls run inside a section: nothing that opens by
 * handle (CAP_DAC_READ_SEARCH), no cache I/O, no lock of the cache.  That
 * is an invariant: fs_cred_as_caller() is asserted false where the daemon
 * acts for itself (fs/inode.c).  Sections do not nest (asserted).
 *
 * Supplementary groups are read from /proc (fuse_req_getgroups), which
 * costs an open and a read; each thread remembers a caller's list for
 * GROUPS_TTL_NS, by (pid, uid, gid).  A process that changes its groups is
 * seen with the new list within that time; the kernel (default_permissions)
 * has checked the request with its current groups already.
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
/* the same, with no effective capability (the permitted set is kept, to
 * take them back) */
static struct __user_cap_data_struct caller_caps[2];
static int setup_done;

static __thread struct {
	int unshared; /* this thread has its own umask */
	int in; /* inside a section */
	int changed; /* the section changed the IDs and capabilities */
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
	caller_caps[0].effective = caller_caps[1].effective = 0;
	setup_done = 1;
	return 0;
}

int fs_cred_as_caller(void)
{
	return me.in;
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

static int ids_take(uid_t uid, gid_t gid, const gid_t *groups, int n)
{
	int ret = groups_take(groups, n);

	if (ret)
		return ret;
	syscall(SYS_setfsgid, gid);
	syscall(SYS_setfsuid, uid);
	/* setfsuid says nothing of a failure: ask */
	if ((uid_t)syscall(SYS_setfsuid, -1) != uid ||
	    (gid_t)syscall(SYS_setfsgid, -1) != gid) {
		ret = -EPERM;
		goto undo_ids;
	}
	me.changed = 1;
	ret = caps_set(caller_caps);
	if (ret)
		goto undo_ids;
	return 0;
undo_ids:
	me.changed = 0;
	syscall(SYS_setfsuid, 0);
	syscall(SYS_setfsgid, 0);
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
	if (who->uid) {
		ret = ids_take(who->uid, who->gid, groups, n);
		if (ret) {
			if (me.umask)
				umask_take(0);
			return ret;
		}
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
	if (me.changed) {
		/* nothing the daemon does after may run as the caller */
		if (caps_set(own_caps))
			abort();
		syscall(SYS_setfsuid, 0);
		syscall(SYS_setfsgid, 0);
		me.changed = 0;
	}
	/* the daemon's own files are made with the modes it gives them */
	if (me.umask)
		umask_take(0);
	me.in = 0;
}
