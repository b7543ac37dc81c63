/* fs: killing setuid, setgid and file capabilities of a backing file when the
 * kernel asks (FUSE_HANDLE_KILLPRIV_V2, direct writes). */
#define _GNU_SOURCE
#include "killpriv.h"

#include <errno.h>
#include <fcntl.h>
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
 *
 * The mode comes with the fstat; the capability is an xattr, read by path
 * (an O_PATH descriptor has no fgetxattr), which costs a walk of
 * /proc/self/fd: 12% of the daemon's time under 4K writes at QD32 by a user
 * without CAP_FSETID.  So each thread remembers the files it found without
 * one, as their ctime was then: setting an xattr or a mode moves the ctime,
 * on this node or another, and the file is asked again.
 */
#define NOCAP_SLOTS 16

static __thread struct nocap {
	dev_t dev;
	ino_t ino;
	struct timespec ctime;
} nocap[NOCAP_SLOTS];

static struct nocap *nocap_slot(const struct stat *st)
{
	return &nocap[st->st_ino % NOCAP_SLOTS];
}

static int nocap_known(const struct stat *st)
{
	const struct nocap *n = nocap_slot(st);

	return n->ino == st->st_ino && n->dev == st->st_dev &&
	       n->ctime.tv_sec == st->st_ctim.tv_sec &&
	       n->ctime.tv_nsec == st->st_ctim.tv_nsec;
}

static void nocap_note(const struct stat *st)
{
	struct nocap *n = nocap_slot(st);

	n->dev = st->st_dev;
	n->ino = st->st_ino;
	n->ctime = st->st_ctim;
}

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
	if (!kill && nocap_known(&st))
		return 0;
	fs_proc_path(fd, path, sizeof(path));
	if (kill) {
		if (chmod(path, st.st_mode & 07777 & ~kill))
			return -errno;
		*changed = 1;
	}
	/* asked first: removing needs CAP_SETFCAP even where there is none */
	if (getxattr(path, "security.capability", NULL, 0) < 0) {
		if (errno != ENODATA && errno != EOPNOTSUPP)
			return -errno;
		if (!kill)
			nocap_note(&st);
		return 0;
	}
	if (removexattr(path, "security.capability") && errno != ENODATA)
		return -errno;
	*changed = 1;
	return 0;
}

static int kill_note(struct fs *fs, fuse_ino_t ino, int fd)
{
	struct stat before;
	int changed = 0, ret;

	cache_file_meta_before(fd, &before);
	ret = kill_fd(fs, fd, &changed);
	if (changed) {
		/* the new ctime is ours; the kernel's mode is stale */
		cache_file_meta_changed(fs->cache, fd, 0, &before);
		if (fs->se)
			fuse_lowlevel_notify_inval_inode(fs->se, ino, -1, 0);
	}
	return ret;
}

int fs_kill_privs(struct fs *fs, fuse_ino_t ino, struct fs_inode *in)
{
	int fd = fs_inode_fd(fs, in), ret;

	if (fd < 0)
		return fd;
	ret = kill_note(fs, ino, fd);
	fs_inode_fd_put(in, fd);
	return ret;
}

/*
 * An inode held by handle is opened by it for each use: for every write of a
 * writer without CAP_FSETID that was 10% of the daemon's time (4K, QD32).
 * The open file keeps a descriptor of its own, made at its first such write
 * (writes of one open file may run side by side: the first one in keeps
 * its).
 */
int fs_kill_privs_fh(struct fs *fs, fuse_ino_t ino, struct fs_inode *in,
		     int *kfd)
{
	int fd = __atomic_load_n(kfd, __ATOMIC_ACQUIRE), own, expect = -1;

	if (fd < 0) {
		fd = fs_inode_fd(fs, in);
		if (fd < 0)
			return fd;
		own = fcntl(fd, F_DUPFD_CLOEXEC, 3);
		fs_inode_fd_put(in, fd);
		if (own < 0)
			return -errno;
		if (__atomic_compare_exchange_n(kfd, &expect, own, 0,
						__ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE)) {
			fd = own;
		} else {
			close(own);
			fd = expect;
		}
	}
	return kill_note(fs, ino, fd);
}
