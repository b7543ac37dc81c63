/* fs: acting as the caller — the store operations made for a request run
 * with the request's user, group, supplementary groups and umask. */
#ifndef NVC_FS_CRED_H
#define NVC_FS_CRED_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

/* Once, on the main thread, before any worker starts: the daemon's own
 * capabilities, which a thread takes back when it leaves a caller. */
int fs_cred_setup(void);

/*
 * Take the caller of req on this thread (fsuid, fsgid, groups, umask, and
 * no capability that lets root past the store's checks and limits) for a
 * section of store operations, ended by fs_cred_leave; 0 or -errno.
 * Sections do not nest.  A root caller is the daemon.  After the section
 * the thread keeps the caller's credentials (cred.c: it "lingers") until
 * fs_cred_daemon, which must come before anything the daemon does for
 * itself.
 */
int fs_cred_enter(fuse_req_t req);
void fs_cred_leave(void);
int fs_cred_daemon(void);

/* Whether this thread has a caller's credentials now (for assertions). */
int fs_cred_as_caller(void);

/* fs_cred_enter's work for a caller known otherwise, with its n
 * supplementary groups (tools/bench/cred_cost.c). */
struct fs_caller {
	uid_t uid;
	gid_t gid;
	mode_t umask;
};
int fs_cred_take(const struct fs_caller *who, const gid_t *groups, int n);

#endif
