/* fs: killing setuid, setgid and file capabilities of a backing file when the
 * kernel asks (FUSE_HANDLE_KILLPRIV_V2, direct writes). */
#define _GNU_SOURCE
#include "killpriv.h"

#include <errno.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

/*
 * The kernel asks (FUSE_WRITE_KILL_SUIDGID, FATTR_KILL_SUIDGID,
 * FUSE_OPEN_KILL_SUIDGID) when the writer, truncater or chown caller has no
 * CAP_FSETID; it no longer looks at the mode itself, so the daemon looks at
 * the backing file's, every time: another node may have set the bits.  The
 * rule is the kernel's own for FUSE (fuse_setattr without killpriv): setuid
 * always, setgid only with group execute (without it, it marks mandatory
 * locking), regular files only.  File capabilities go as with any write.
 * A chmod racing with this may be undone by it, as with the kernel's own
 * read-modify-write of the mode.
 */
static int kill_fd(struct fs *fs, int fd, int *changed)
{
	struct stat st;
	mode_t kill = 0;
	char path[64];

	if (fstat(fd, &st))
		return -errno;
	if (!S_ISREG(st.st_mode))
		return 0;
	if (st.st_mode & S_ISUID)
		kill |= S_ISUID;
	if ((st.st_mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP))
		kill |= S_ISGID;
	fs_proc_path(fd, path, sizeof(path));
	if (kill) {
		if (chmod(path, st.st_mode & 07777 & ~kill))
			return -errno;
		*changed = 1;
	}
	/* asked first: removing needs CAP_SETFCAP even where there is none */
	if (getxattr(path, "security.capability", NULL, 0) < 0)
		return errno == ENODATA || errno == EOPNOTSUPP ? 0 : -errno;
	if (removexattr(path, "security.capability") && errno != ENODATA)
		return -errno;
	*changed = 1;
	return 0;
}

int fs_kill_privs(struct fs *fs, fuse_ino_t ino, struct fs_inode *in)
{
	int fd = fs_inode_fd(fs, in), changed = 0, ret;

	if (fd < 0)
		return fd;
	ret = kill_fd(fs, fd, &changed);
	if (changed) {
		/* the new ctime is ours; the kernel's mode is stale */
		cache_file_meta_changed(fs->cache, fd, 0);
		if (fs->se)
			fuse_lowlevel_notify_inval_inode(fs->se, ino, -1, 0);
	}
	fs_inode_fd_put(in, fd);
	return ret;
}
