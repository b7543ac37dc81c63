/* fs: the namespace: nodes made, linked, unlinked and renamed in the backing
 * directory as the caller, and the cache told what moved. */
#define _GNU_SOURCE
#include "fs.h"
#include "cred.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct fs_inode *in = fs_inode_of(fs_of(req), ino);
	char buf[PATH_MAX + 1];
	int fd = fs_inode_fd(fs_of(req), in);
	ssize_t n = fd < 0 ? (errno = -fd, -1)
			   : readlinkat(fd, "", buf, sizeof(buf));

	if (n < 0)
		n = -errno;
	fs_inode_fd_put(in, fd);
	if (n < 0)
		fuse_reply_err(req, -n);
	else if (n == sizeof(buf))
		fuse_reply_err(req, ENAMETOOLONG);
	else {
		buf[n] = 0;
		fuse_reply_readlink(req, buf);
	}
}

/*
 * A new node is made by its creator: the store makes it the caller's, with
 * the group a set-group-ID directory gives, the parent's default ACL and
 * the caller's umask, as it would for any process of that user, and
 * charges it to the caller's quota.  Nothing is chowned or chmodded after.
 */

/* The daemon's own names on the store (conflict copies, lost+found, the
 * identity probe, placeholders) are not made, renamed or linked through the
 * mount. */
int fs_name_reserved(const char *name)
{
	return !strncmp(name, ".nvcachefs-", 11) ||
	       strstr(name, ".nvcachefs-conflict-");
}

/* Make name as the caller; an O_PATH descriptor of what it names then. */
static int new_node_make(fuse_req_t req, int pfd, const char *name, mode_t mode,
			 dev_t rdev, const char *link)
{
	int ret = fs_cred_enter(req);

	if (ret)
		return ret;
	if (S_ISDIR(mode))
		ret = mkdirat(pfd, name, mode & 07777);
	else if (S_ISLNK(mode))
		ret = symlinkat(link, pfd, name);
	else
		ret = mknodat(pfd, name, mode, rdev);
	if (!ret)
		ret = openat(pfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	ret = ret < 0 ? -errno : ret;
	fs_cred_leave();
	return ret;
}

static void make_node(fuse_req_t req, fuse_ino_t parent, const char *name,
		      mode_t mode, dev_t rdev, const char *link)
{
	struct fs *fs = fs_of(req);
	int pfd = fs_inode_of(fs, parent)->fd, fd, ret;
	struct fuse_entry_param e;
	struct stat st;

	fd = fs_name_reserved(name)
		     ? -EPERM
		     : new_node_make(req, pfd, name, mode, rdev, link);
	if (fd < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
	/* the name may have been replaced since: the kernel gets what it now
	 * names, of the type made, or an error */
	ret = fstat(fd, &st)				 ? -errno
	      : (st.st_mode & S_IFMT) != (mode & S_IFMT) ? -EIO
							 : 0;
	if (ret) {
		close(fd);
		fuse_reply_err(req, -ret);
		return;
	}
	fs_reply_entry(req, fs_entry_of_fd_st(fs, fd, &st, &e), &e);
}

void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
	      dev_t rdev)
{
	make_node(req, parent, name, mode, rdev, NULL);
}

void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	make_node(req, parent, name, S_IFDIR | mode, 0, NULL);
}

void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
		const char *name)
{
	make_node(req, parent, name, S_IFLNK | 0777, 0, link);
}

void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent,
	     const char *name)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *in = fs_inode_of(fs, ino);
	struct fuse_entry_param e;
	struct stat before;
	char path[64];
	int fd = fs_name_reserved(name) ? -EPERM : fs_inode_fd(fs, in), ret;

	if (fd < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
	fs_proc_path(fd, path, sizeof(path));
	cache_file_meta_before(fd, &before);
	/* as the caller: the store's rules for hard links apply */
	ret = fs_cred_enter(req);
	if (!ret) {
		ret = linkat(AT_FDCWD, path, fs_inode_of(fs, parent)->fd, name,
			     AT_SYMLINK_FOLLOW)
			      ? -errno
			      : 0;
		fs_cred_leave();
		fs_cred_daemon();
	}
	if (!ret)
		cache_file_meta_changed(fs->cache, fd, 0, &before);
	fs_inode_fd_put(in, fd);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	fs_reply_entry(req, fs_lookup(fs, NULL, parent, name, &e), &e);
}

/* The inode named name in dfd changed through the mount (its ctime moved;
 * before: its look before): the cache takes the new look as its own. */
static void name_meta_changed(struct fs *fs, int dfd, const char *name,
			      const struct stat *before)
{
	int fd = openat(dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);

	if (fd >= 0) {
		cache_file_meta_changed(fs->cache, fd, 0, before);
		close(fd);
	}
}

/* A name is about to go: remember its inode, to drop cached data if it was the
 * last link. */
static int name_ino(int pfd, const char *name, struct stat *st)
{
	return fstatat(pfd, name, st, AT_SYMLINK_NOFOLLOW) ? -errno : 0;
}

/* unlinkat as the caller: the store's rules (a sticky directory's) apply. */
static int unlink_as(fuse_req_t req, int pfd, const char *name, int flags)
{
	int ret = fs_cred_enter(req);

	if (ret)
		return ret;
	ret = unlinkat(pfd, name, flags) ? -errno : 0;
	fs_cred_leave();
	return ret;
}

void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	int pfd = fs_inode_of(fs, parent)->fd;
	struct stat st, before;
	int known = !name_ino(pfd, name, &st), other = -1, ret;

	if (known)
		fs_inode_pin(fs, &st);
	/* the file's other links stay, with a new ctime */
	if (known && S_ISREG(st.st_mode) && st.st_nlink > 1)
		other = openat(pfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (other >= 0)
		cache_file_meta_before(other, &before);
	cache_unlink_begin(fs->cache);
	ret = unlink_as(req, pfd, name, 0);
	fs_cred_daemon();
	if (ret) {
		cache_unlink_end(fs->cache);
		if (other >= 0)
			close(other);
		fuse_reply_err(req, -ret);
		return;
	}
	if (other >= 0) {
		cache_file_meta_changed(fs->cache, other, 0, &before);
		close(other);
	}
	if (known && S_ISREG(st.st_mode))
		cache_file_unlinked(fs->cache, st.st_dev, st.st_ino,
				    st.st_nlink);
	cache_unlink_end(fs->cache);
	fuse_reply_err(req, 0);
}

void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	fuse_reply_err(req, -unlink_as(req, fs_inode_of(fs_of(req), parent)->fd,
				       name, AT_REMOVEDIR));
}

void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
	       fuse_ino_t newparent, const char *newname, unsigned int flags)
{
	struct fs *fs = fs_of(req);
	int nfd = fs_inode_of(fs, newparent)->fd;
	struct stat st, moved, swapped;
	int known = !(flags & RENAME_EXCHANGE) && !name_ino(nfd, newname, &st);

	int pfd = fs_inode_of(fs, parent)->fd, ret;

	if (fs_name_reserved(name) || fs_name_reserved(newname)) {
		fuse_reply_err(req, EPERM);
		return;
	}
	if (known)
		fs_inode_pin(fs, &st);
	/* the looks before, of what the rename moves (name_meta_changed) */
	if (fstatat(pfd, name, &moved, AT_SYMLINK_NOFOLLOW))
		moved.st_ino = 0;
	if (!(flags & RENAME_EXCHANGE) ||
	    fstatat(nfd, newname, &swapped, AT_SYMLINK_NOFOLLOW))
		swapped.st_ino = 0;
	cache_unlink_begin(fs->cache);
	ret = fs_cred_enter(req);
	if (!ret) {
		ret = renameat2(pfd, name, nfd, newname, flags) ? -errno : 0;
		fs_cred_leave();
		fs_cred_daemon();
	}
	if (ret) {
		cache_unlink_end(fs->cache);
		fuse_reply_err(req, -ret);
		return;
	}
	if (known && S_ISREG(st.st_mode))
		cache_file_unlinked(fs->cache, st.st_dev, st.st_ino,
				    st.st_nlink);
	if (flags & RENAME_EXCHANGE) {
		/* both names moved: through a name neither has now */
		cache_renamed(fs->cache, pfd, name, pfd, ".nvcachefs-xchg");
		cache_renamed(fs->cache, nfd, newname, pfd, name);
		cache_renamed(fs->cache, pfd, ".nvcachefs-xchg", nfd, newname);
	} else {
		cache_renamed(fs->cache, pfd, name, nfd, newname);
	}
	/* a rename moves the ctime of what it moves */
	name_meta_changed(fs, nfd, newname, &moved);
	if (flags & RENAME_EXCHANGE)
		name_meta_changed(fs, pfd, name, &swapped);
	cache_unlink_end(fs->cache);
	fuse_reply_err(req, 0);
}
