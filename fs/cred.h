/* fs: acting as the caller — the store operations made for a request run
 * with the request's user, group, supplementary groups, capabilities and
 * umask. */
#ifndef NVC_FS_CRED_H
#define NVC_FS_CRED_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdint.h>

/* Once, on the main thread, before any worker starts: the daemon's own
 * credentials, which a thread takes back with fs_cred_daemon. */
int fs_cred_setup(void);

/*
 * A caller: IDs, effective capabilities (CAP_* bits), umask and n
 * supplementary groups.  groups points into storage its maker keeps.
 */
struct fs_caller {
	uid_t uid;
	gid_t gid;
	mode_t umask;
	uint64_t caps;
	int ngroups;
	const gid_t *groups;
};

/*
 * Take the caller of req on this thread for a section of store operations,
 * ended by fs_cred_leave; 0 or -errno.  Sections do not nest.  A caller
 * with every capability the daemon has and uid 0 is the daemon.  After the
 * section the thread keeps the caller's credentials (cred.c: it "lingers")
 * until fs_cred_daemon, which must come before anything the daemon does for
 * itself.
 */
int fs_cred_enter(fuse_req_t req);
void fs_cred_leave(void);
int fs_cred_daemon(void);

/* The same for a caller known otherwise (an open's, for the kernel's
 * writeback of its pages: fs/claim.c; tools/bench/cred_cost.c). */
int fs_cred_take(const struct fs_caller *who);

/*
 * req's caller as it is now, for later (*heap, or NULL: its groups, to be
 * freed with it); its capabilities for a check (fs_cred_has).
 */
int fs_cred_caller(fuse_req_t req, struct fs_caller *who, gid_t **heap);
int fs_cred_has(const struct fs_caller *who, int cap);

/* Whether this thread has a caller's credentials now (for assertions). */
int fs_cred_as_caller(void);

#endif
