/* fs: directories: opened through the inode's descriptor, read (plain and
 * with each entry's attributes), synced. */
#define _GNU_SOURCE
#include "fs.h"
#include "cred.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fs_dir {
	DIR *dp;
	off_t offset;
	struct dirent *entry;
};

void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs_dir *d = calloc(1, sizeof(*d));
	char path[64];
	int fd;

	if (!d) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	/* as the caller: may it read the directory?  Through the inode's
	 * descriptor (a lookup of "." would need search permission too) */
	fs_proc_path(fs_inode_of(fs_of(req), ino)->fd, path, sizeof(path));
	fd = fs_cred_enter(req);
	if (!fd) {
		fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		fs_cred_leave();
	} else {
		errno = -fd;
		fd = -1;
	}
	if (fd < 0 || !(d->dp = fdopendir(fd))) {
		int e = errno;

		if (fd >= 0)
			close(fd);
		free(d);
		fuse_reply_err(req, e);
		return;
	}
	fi->fh = (uintptr_t)d;
	fuse_reply_open(req, fi);
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi, int plus)
{
	struct fs *fs = fs_of(req);
	struct fs_dir *d = (struct fs_dir *)(uintptr_t)fi->fh;
	char *buf = calloc(1, size), *p = buf;
	size_t rem = size;
	int err = 0;

	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (off != d->offset) {
		seekdir(d->dp, off);
		d->entry = NULL;
		d->offset = off;
	}
	for (;;) {
		struct fuse_entry_param e;
		size_t n;

		if (!d->entry) {
			errno = 0;
			d->entry = readdir(d->dp);
			if (!d->entry) {
				err = errno;
				break;
			}
		}
		if (plus) {
			const char *nm = d->entry->d_name;

			int r = !strcmp(nm, ".") || !strcmp(nm, "..")
					? -EACCES
					: fs_lookup(fs, req, ino, nm, &e);

			/* a name only, as the caller may not search the
			 * directory (r--): it is listed, not looked up */
			if (r == -EACCES || r == -EPERM) {
				memset(&e, 0, sizeof(e));
				e.attr.st_ino = d->entry->d_ino;
				e.attr.st_mode = d->entry->d_type << 12;
			} else if (r) {
				err = -r;
				break;
			}
			n = fuse_add_direntry_plus(req, p, rem, nm, &e,
						   telldir(d->dp));
			if (n > rem) {
				if (e.ino)
					fs_inode_forget(
						fs, fs_inode_of(fs, e.ino), 1);
				break;
			}
		} else {
			struct stat st = { .st_ino = d->entry->d_ino,
					   .st_mode = d->entry->d_type << 12 };

			n = fuse_add_direntry(req, p, rem, d->entry->d_name,
					      &st, telldir(d->dp));
			if (n > rem)
				break;
		}
		p += n;
		rem -= n;
		d->entry = NULL;
		d->offset = telldir(d->dp);
	}
	if (err && rem == size)
		fuse_reply_err(req, err);
	else
		fuse_reply_buf(req, buf, size - rem);
	free(buf);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 0);
}

void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 1);
}

void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs_dir *d = (struct fs_dir *)(uintptr_t)fi->fh;

	closedir(d->dp);
	free(d);
	fuse_reply_err(req, 0);
}

void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
		 struct fuse_file_info *fi)
{
	struct fs_dir *d = (struct fs_dir *)(uintptr_t)fi->fh;
	int fd = dirfd(d->dp);

	fuse_reply_err(req, (datasync ? fdatasync(fd) : fsync(fd)) ? errno : 0);
}
