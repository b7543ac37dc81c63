/* fs: SETATTR (chmod, chown, truncate, times) as the caller, through the cache for sizes. */
#define _GNU_SOURCE
#include "fs.h"
#include "claim.h"
#include "cred.h"
#include "killpriv.h"
#include "kinval.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* chmod and chown as the caller: the store's rules for who may. */
static int setattr_owner(fuse_req_t req, int fd, const char *path,
			 const struct stat *attr, int valid)
{
	int ret;

	if (!(valid & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID |
		       FUSE_SET_ATTR_GID)))
		return 0;
	ret = fs_cred_enter(req);
	if (ret)
		return ret;
	if ((valid & FUSE_SET_ATTR_MODE) && chmod(path, attr->st_mode))
		ret = -errno;
	if (!ret && (valid & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))) {
		uid_t u = valid & FUSE_SET_ATTR_UID ? attr->st_uid : (uid_t)-1;
		gid_t g = valid & FUSE_SET_ATTR_GID ? attr->st_gid : (gid_t)-1;

		if (fchownat(fd, "", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW))
			ret = -errno;
	}
	fs_cred_leave();
	fs_cred_daemon();
	return ret;
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
		       int valid, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *in = fs_inode_of(fs, ino);
	char path[64];
	struct stat st, before;
	int ret = 0, fd = fs_inode_fd(fs, in);

	if (fd < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
	fs_proc_path(fd, path, sizeof(path));
	/* each change's look before it: the cache tells its own changes from
	 * another node's by it (cache_file_meta_changed) */
	cache_file_meta_before(fd, &before);
	ret = setattr_owner(req, fd, path, attr, valid);
	if (!ret && (valid & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID |
			      FUSE_SET_ATTR_GID)))
		cache_file_meta_changed(fs->cache, fd, 0, &before);
	/* FATTR_KILL_SUIDGID: a truncate or chown by a caller without
	 * CAP_FSETID (FUSE_HANDLE_KILLPRIV_V2) */
	if (!ret && (valid & FUSE_SET_ATTR_KILL_SUID))
		ret = fs_kill_privs(fs, ino, in);
	if (!ret && (valid & FUSE_SET_ATTR_SIZE)) {
		struct cfile *cf;
		int got;

		/* truncate(2) by name: may the caller write the file? (an
		 * ftruncate's handle was opened for writing) */
		if (!fi || !fi->fh)
			ret = fs_access_as(req, fd, W_OK);
		if (!ret)
			ret = fs_with_cfile(fs, in, fi, &cf, &got);
		if (!ret) {
			ret = cache_truncate(fs->cache, cf, attr->st_size);
			if (got)
				cache_file_put(fs->cache, cf);
		}
		if (!ret)
			fs_claims_drop(in);
	}
	if (!ret && (valid & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
		struct timespec tv[2] = { { 0, UTIME_OMIT },
					  { 0, UTIME_OMIT } };

		if (valid & FUSE_SET_ATTR_ATIME_NOW)
			tv[0].tv_nsec = UTIME_NOW;
		else if (valid & FUSE_SET_ATTR_ATIME)
			tv[0] = attr->st_atim;
		if (valid & FUSE_SET_ATTR_MTIME_NOW)
			tv[1].tv_nsec = UTIME_NOW;
		else if (valid & FUSE_SET_ATTR_MTIME)
			tv[1] = attr->st_mtim;
		cache_file_meta_before(fd, &before);
		ret = fs_cred_enter(req);
		if (!ret) {
			ret = utimensat(AT_FDCWD, path, tv, 0) ? -errno : 0;
			fs_cred_leave();
			fs_cred_daemon();
		}
		if (!ret && (valid & FUSE_SET_ATTR_MTIME))
			cache_file_times_set(fs->cache, in->dev, in->ino);
		if (!ret)
			cache_file_meta_changed(fs->cache, fd,
						!!(valid & FUSE_SET_ATTR_MTIME),
						&before);
	}
	if (!ret)
		ret = fs_stat(fs, fd, &st);
	fs_inode_fd_put(in, fd);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, &st, fs->timeout);
}
