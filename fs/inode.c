/* fs: the inode table — backing inodes the kernel knows, found by (st_dev,
 * st_ino), held by descriptor or file handle — and the lookups that fill it. */
#define _GNU_SOURCE
#include "fs.h"
#include "claim.h"
#include "cred.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

struct fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

struct fs_inode *fs_inode_of(struct fs *fs, fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID ? &fs->root
				   : (struct fs_inode *)(uintptr_t)ino;
}

void fs_proc_path(int fd, char *buf, size_t len)
{
	snprintf(buf, len, "/proc/self/fd/%d", fd);
}

struct fs_fhandle {
	struct file_handle fh;
	unsigned char bytes[FS_HANDLE_MAX];
};

/* Remember fd's handle in in and close fd, when the inode can do without. */
static void fs_inode_drop_fd(struct fs *fs, struct fs_inode *in,
			     const struct stat *st)
{
	struct fs_fhandle h;
	int mnt;

	if (!fs->by_handle || S_ISDIR(st->st_mode))
		return;
	h.fh.handle_bytes = FS_HANDLE_MAX;
	if (name_to_handle_at(in->fd, "", &h.fh, &mnt, AT_EMPTY_PATH))
		return;
	in->htype = h.fh.handle_type;
	in->hbytes = h.fh.handle_bytes;
	memcpy(in->handle, h.fh.f_handle, h.fh.handle_bytes);
	close(in->fd);
	in->fd = -1;
}

/* An O_PATH descriptor for in, or -errno; give it back with fs_inode_fd_put. */
int fs_inode_fd(struct fs *fs, struct fs_inode *in)
{
	int fd = __atomic_load_n(&in->fd, __ATOMIC_ACQUIRE);
	struct fs_fhandle h;

	if (fd >= 0)
		return fd;
	/* by handle: the daemon's own act (CAP_DAC_READ_SEARCH) */
	fs_cred_daemon();
	h.fh.handle_bytes = in->hbytes;
	h.fh.handle_type = in->htype;
	memcpy(h.fh.f_handle, in->handle, in->hbytes);
	fd = open_by_handle_at(fs->backing_fd, &h.fh, O_PATH | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

void fs_inode_fd_put(struct fs_inode *in, int fd)
{
	if (fd >= 0 && fd != __atomic_load_n(&in->fd, __ATOMIC_ACQUIRE))
		close(fd);
}

static size_t fs_ihash(struct fs *fs, dev_t dev, ino_t ino)
{
	return (ino * 0x9e3779b97f4a7c15ull ^ dev) & fs->imask;
}

/*
 * A name is about to go and may be the inode's last: an inode the kernel
 * still holds (an open, unlinked file) keeps a descriptor from now on, as its
 * handle will not open any more.
 */
void fs_inode_pin(struct fs *fs, const struct stat *st)
{
	struct fs_inode *in;
	int fd;

	pthread_mutex_lock(&fs->ilock);
	for (in = fs->itab[fs_ihash(fs, st->st_dev, st->st_ino)]; in;
	     in = in->next)
		if (in->ino == st->st_ino && in->dev == st->st_dev)
			break;
	if (in && in->fd < 0) {
		fd = fs_inode_fd(fs, in);
		if (fd >= 0)
			__atomic_store_n(&in->fd, fd, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&fs->ilock);
}

int fs_init_table(struct fs *fs)
{
	struct fs_fhandle h;
	int mnt, fd;

	/* can this daemon open by handle (CAP_DAC_READ_SEARCH)? */
	h.fh.handle_bytes = FS_HANDLE_MAX;
	if (!name_to_handle_at(fs->backing_fd, "", &h.fh, &mnt,
			       AT_EMPTY_PATH)) {
		fd = open_by_handle_at(fs->backing_fd, &h.fh,
				       O_PATH | O_CLOEXEC);
		if (fd >= 0) {
			fs->by_handle = 1;
			close(fd);
		}
	}
	fs->imask = (1u << 16) - 1;
	fs->itab = calloc(fs->imask + 1, sizeof(*fs->itab));
	pthread_mutex_init(&fs->ilock, NULL);
	return fs->itab ? 0 : -ENOMEM;
}

void fs_free_table(struct fs *fs)
{
	size_t i;

	for (i = 0; fs->itab && i <= fs->imask; i++) {
		struct fs_inode *n, *in;

		for (in = fs->itab[i]; in; in = n) {
			n = in->next;
			if (in->fd >= 0)
				close(in->fd);
			fs_claims_free(in);
			free(in);
		}
	}
	free(fs->itab);
	fs->itab = NULL;
}

/* Find or add the inode for fd (which we then own or close). */
static struct fs_inode *fs_inode_get(struct fs *fs, int fd,
				     const struct stat *st)
{
	struct fs_inode *in;
	size_t h = fs_ihash(fs, st->st_dev, st->st_ino);

	if (st->st_dev == fs->root.dev && st->st_ino == fs->root.ino) {
		close(fd);
		pthread_mutex_lock(&fs->ilock);
		fs->root.nlookup++;
		pthread_mutex_unlock(&fs->ilock);
		return &fs->root;
	}
	pthread_mutex_lock(&fs->ilock);
	for (in = fs->itab[h]; in; in = in->next)
		if (in->ino == st->st_ino && in->dev == st->st_dev)
			break;
	if (in) {
		in->nlookup++;
		pthread_mutex_unlock(&fs->ilock);
		close(fd);
		return in;
	}
	in = calloc(1, sizeof(*in));
	if (!in) {
		pthread_mutex_unlock(&fs->ilock);
		close(fd);
		return NULL;
	}
	in->fd = fd;
	in->dev = st->st_dev;
	in->ino = st->st_ino;
	in->nlookup = 1;
	fs_inode_drop_fd(fs, in, st);
	in->next = fs->itab[h];
	fs->itab[h] = in;
	pthread_mutex_unlock(&fs->ilock);
	return in;
}

void fs_inode_forget(struct fs *fs, struct fs_inode *in, uint64_t n)
{
	struct fs_inode **p;

	if (in == &fs->root)
		return;
	pthread_mutex_lock(&fs->ilock);
	in->nlookup -= n < in->nlookup ? n : in->nlookup;
	if (!in->nlookup) {
		for (p = &fs->itab[fs_ihash(fs, in->dev, in->ino)]; *p;
		     p = &(*p)->next)
			if (*p == in) {
				*p = in->next;
				break;
			}
		if (in->fd >= 0)
			close(in->fd);
		fs_claims_free(in);
		free(in);
	}
	pthread_mutex_unlock(&fs->ilock);
}

/* Attributes as the mount must show them: the cache's size, times and
 * blocks win (cache_file_attr_st). */
int fs_stat(struct fs *fs, int fd, struct stat *st)
{
	if (fstatat(fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW))
		return -errno;
	fs_stat_cached(fs, st);
	return 0;
}

/* The backing file's attributes st as the mount must show them. */
void fs_stat_cached(struct fs *fs, struct stat *st)
{
	if (S_ISREG(st->st_mode))
		cache_file_attr_st(fs->cache, st);
}

/* The entry for a node the daemon holds as fd (which the inode then owns). */
int fs_entry_of_fd(struct fs *fs, int fd, struct fuse_entry_param *e)
{
	struct stat st;

	if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)) {
		close(fd);
		return -errno;
	}
	return fs_entry_of_fd_st(fs, fd, &st, e);
}

/* The same for a node whose backing attributes are known: *st. */
int fs_entry_of_fd_st(struct fs *fs, int fd, const struct stat *st,
		      struct fuse_entry_param *e)
{
	struct fs_inode *in;

	memset(e, 0, sizeof(*e));
	e->attr_timeout = fs->timeout;
	e->entry_timeout = fs->timeout;
	e->attr = *st;
	fs_stat_cached(fs, &e->attr);
	in = fs_inode_get(fs, fd, &e->attr);
	if (!in)
		return -ENOMEM;
	e->ino = in == &fs->root ? FUSE_ROOT_ID : (uintptr_t)in;
	return 0;
}

/* The lookup of name in parent, as req's caller (the store checks its
 * search permission), or as the daemon when req is NULL. */
int fs_lookup(struct fs *fs, fuse_req_t req, fuse_ino_t parent,
	      const char *name, struct fuse_entry_param *e)
{
	int fd = req ? fs_cred_enter(req) : 0;

	if (fd)
		return fd;
	fd = openat(fs_inode_of(fs, parent)->fd, name,
		    O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		fd = -errno;
	if (req)
		fs_cred_leave();
	return fd < 0 ? fd : fs_entry_of_fd(fs, fd, e);
}

void fs_reply_entry(fuse_req_t req, int ret, struct fuse_entry_param *e)
{
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_entry(req, e);
}
