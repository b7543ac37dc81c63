/* fs: extended attributes through the mount, without the cache's own. */
#define _GNU_SOURCE
#include "cred.h"
#include "fs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

/*
 * The cache's identity stamp (cache/files/ident.c) is its own: not shown, not set
 * or removed through the mount, so that a copy made through the mount with
 * its attributes does not take on the identity of the original.
 */
static int xattr_ours(const char *name)
{
	return !strncmp(name, "trusted.nvcachefs.", 18) ||
	       !strncmp(name, "user.nvcachefs.", 15);
}

static int xattr_acl(const char *name)
{
	return !strcmp(name, "system.posix_acl_access") ||
	       !strcmp(name, "system.posix_acl_default");
}

/* A name list without the cache's own names; the new length. */
static ssize_t xattr_filter(char *list, ssize_t n)
{
	ssize_t in = 0, out = 0;

	while (in < n) {
		size_t len = strnlen(list + in, n - in) + 1;

		if (!xattr_ours(list + in)) {
			memmove(list + out, list + in, len);
			out += len;
		}
		in += len;
	}
	return out;
}

/* listxattr through the mount: the full list is read to filter it. */
static ssize_t xattr_list(const char *path, char **out)
{
	ssize_t n = listxattr(path, NULL, 0);

	*out = NULL;
	while (n > 0) {
		*out = malloc(n);
		if (!*out)
			return -ENOMEM;
		n = listxattr(path, *out, n);
		if (n >= 0)
			return xattr_filter(*out, n);
		free(*out);
		*out = NULL;
		if (errno != ERANGE)
			return -errno;
		n = listxattr(path, NULL, 0);
	}
	return n < 0 ? -errno : 0;
}

void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			const char *value, size_t size, int flags)
{
	struct fs_inode *in = fs_inode_of(fs_of(req), ino);
	int fd = fs_inode_fd(fs_of(req), in), ret;
	struct stat before;
	char path[64];

	if (xattr_ours(name)) {
		fs_inode_fd_put(in, fd);
		fuse_reply_err(req, EPERM);
		return;
	}
	if (fd < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
	fs_proc_path(fd, path, sizeof(path));
	cache_file_meta_before(fd, &before);
	ret = -fs_cred_enter(req);
	if (!ret) {
		ret = setxattr(path, name, value, size, flags) ? errno : 0;
		fs_cred_leave();
		fs_cred_daemon();
	}
	if (!ret)
		cache_file_meta_changed(fs_of(req)->cache, fd, 0, &before);
	fs_inode_fd_put(in, fd);
	fuse_reply_err(req, ret);
}

/* getxattr (name) or listxattr (NULL) of path into *buf (size 0: the
 * length only); as the caller, so that names it may not list (trusted.*)
 * are not. */
static ssize_t xattr_read(const char *path, const char *name, size_t size,
			  char **buf)
{
	ssize_t n;

	if (name && xattr_ours(name))
		return -ENODATA;
	if (!name) {
		n = xattr_list(path, buf);
		return n > (ssize_t)size && size ? -ERANGE : n;
	}
	if (size && !(*buf = malloc(size)))
		return -ENOMEM;
	n = getxattr(path, name, *buf, size);
	return n < 0 ? -errno : n;
}

/* getxattr and listxattr: size 0 asks for the length, else for the bytes. */
static void xattr_reply(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	struct fs_inode *in = fs_inode_of(fs_of(req), ino);
	char path[64], *buf = NULL;
	int fd = fs_inode_fd(fs_of(req), in);
	ssize_t n;

	if (fd < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
	fs_proc_path(fd, path, sizeof(path));
	if (name && xattr_acl(name)) {
		/* the kernel's own question, for its permission checks (a
		 * file's ACL is read alike by anyone who reaches it) */
		n = xattr_read(path, name, size, &buf);
	} else {
		n = fs_cred_enter(req);
		if (!n) {
			n = xattr_read(path, name, size, &buf);
			fs_cred_leave();
		}
	}
	fs_inode_fd_put(in, fd);
	if (n < 0)
		fuse_reply_err(req, -n);
	else if (size)
		fuse_reply_buf(req, buf, n);
	else
		fuse_reply_xattr(req, n);
	free(buf);
}

void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	xattr_reply(req, ino, name, size);
}

void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	xattr_reply(req, ino, NULL, size);
}

void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct fs_inode *in = fs_inode_of(fs_of(req), ino);
	int fd = fs_inode_fd(fs_of(req), in), ret;
	struct stat before;
	char path[64];

	if (fd < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
	fs_proc_path(fd, path, sizeof(path));
	cache_file_meta_before(fd, &before);
	if (xattr_ours(name)) {
		ret = EPERM;
	} else if (!strcmp(name, "security.capability")) {
		/* the kernel's own removal when a file is written by a caller
		 * without CAP_FSETID (file_remove_privs): the caller could not
		 * remove it (CAP_SETFCAP), and the kernel refuses a caller's
		 * own removal before it reaches the daemon */
		ret = removexattr(path, name) ? errno : 0;
	} else {
		ret = -fs_cred_enter(req);
		if (!ret) {
			ret = removexattr(path, name) ? errno : 0;
			fs_cred_leave();
			fs_cred_daemon();
		}
	}
	if (!ret)
		cache_file_meta_changed(fs_of(req)->cache, fd, 0, &before);
	fs_inode_fd_put(in, fd);
	fuse_reply_err(req, ret);
}
