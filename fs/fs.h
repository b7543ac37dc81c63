/* fs: the FUSE operations over the backing directory and the cache, and the
 * daemon's pieces. */
#ifndef NVC_FS_H
#define NVC_FS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <pthread.h>

#include "../cache/cache.h"
#include "kinval.h"

#define FS_HANDLE_MAX 48

/*
 * An inode the kernel has looked up.  Directories keep an O_PATH descriptor
 * (they are the dirfd of every name operation); other inodes keep only their
 * file handle and are opened by it for the moment they are needed, so that a
 * kernel holding millions of inodes does not need millions of descriptors.
 * An inode whose handle is too long, or a daemon not allowed to open by
 * handle, keeps its descriptor.
 */
struct fs_claims;

struct fs_inode {
	int fd; /* O_PATH on the backing inode, or -1: open by handle */
	struct fs_claims *claims; /* store space claimed (claim.c), or NULL */
	dev_t dev;
	ino_t ino;
	uint64_t nlookup;
	struct kinval_ino kinval; /* its handles, for the kernel's page
				   * cache (kinval.c) */
	uint64_t pt_gen, pt_seen; /* its passthrough opens, and as the last
				   * cache-path open saw them (passthru.c) */
	uint64_t pt_streams; /* its opens taken as streams (passthru.c) */
	int pt_streamed; /* its last open was taken as a stream (passthru.c) */
	struct fs_inode *next;
	int htype;
	uint8_t hbytes;
	unsigned char handle[FS_HANDLE_MAX];
};

struct fs {
	struct cache *cache;
	struct cache_config *cfg;
	int backing_fd;
	struct fs_inode root;
	pthread_mutex_t ilock;
	struct fs_inode **itab;
	size_t imask;
	double timeout;
	double neg_timeout; /* of a name that does not exist */
	struct fuse_session *se; /* to invalidate what the kernel caches */
	int by_handle; /* open_by_handle_at works here */
	const char *mountpoint;
	const char *config_file;
	char **overrides;
	int noverrides;
};

extern const struct fuse_lowlevel_ops fs_ops;
int fs_init_table(struct fs *fs);
void fs_free_table(struct fs *fs);

/* inode.c: the inode table and lookups (the ops in fs.c use them) */
struct fs *fs_of(fuse_req_t req);
struct fs_inode *fs_inode_of(struct fs *fs, fuse_ino_t ino);
void fs_proc_path(int fd, char *buf, size_t len);
int fs_inode_fd(struct fs *fs, struct fs_inode *in);
void fs_inode_fd_put(struct fs_inode *in, int fd);
void fs_inode_pin(struct fs *fs, const struct stat *st);
void fs_inode_forget(struct fs *fs, struct fs_inode *in, uint64_t n);
int fs_stat(struct fs *fs, int fd, struct stat *st);
void fs_stat_cached(struct fs *fs, struct stat *st);
int fs_entry_of_fd(struct fs *fs, int fd, struct fuse_entry_param *e);
int fs_entry_of_fd_st(struct fs *fs, int fd, const struct stat *st,
		      struct fuse_entry_param *e);
int fs_lookup(struct fs *fs, fuse_req_t req, fuse_ino_t parent,
	      const char *name, struct fuse_entry_param *e);
void fs_reply_entry(fuse_req_t req, int ret, struct fuse_entry_param *e);

/* names.c: namespace ops */
void op_readlink(fuse_req_t req, fuse_ino_t ino);
void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
	      mode_t mode, dev_t rdev);
void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
	      mode_t mode);
void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
		const char *name);
void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent,
	     const char *name);
void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name);
void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name);
void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
	       fuse_ino_t newparent, const char *newname, unsigned int flags);
/* The daemon's own names on the store (conflict copies, lost+found, the
 * identity probe, placeholders), never made, renamed or linked through the
 * mount. */
int fs_name_reserved(const char *name);

/* fs.c: the cache's file of an inode, from the open's handle when there is
 * one (*got: taken here, to put back); may the caller access (R_OK, W_OK)
 * the inode held as fd, as the store answers with its groups and ACLs */
int fs_with_cfile(struct fs *fs, struct fs_inode *in, struct fuse_file_info *fi,
		  struct cfile **cf, int *got);
int fs_access_as(fuse_req_t req, int fd, int mode);
/* The kernel's open flag of an execve (__FMODE_EXEC), which an OPEN carries:
 * such an open asks execute permission of the file, not read. */
#define OPEN_FLAG_EXEC 040

/* setattr.c */
void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int valid,
		struct fuse_file_info *fi);

/* dir.c: directory ops */
void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		struct fuse_file_info *fi);
void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi);
void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
		 struct fuse_file_info *fi);

/* xattr.c: extended attribute ops */
void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		 const char *value, size_t size, int flags);
void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		 size_t size);
void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);

/* ctl.c: the control socket */
int fs_ctl_start(struct fs *fs, const char *mountpoint);
void fs_ctl_stop(void);
/* A write of n bytes at off through the handle fh is in the cache: answer
 * it (fs.c; from fs/aio.c's completions too; flags: FS_RW_*). */
void fs_reply_write(fuse_req_t req, void *fh, off_t off, size_t n, int flags);
/* The calling worker or pool thread is idle: its buffers back (fs/loop.c). */
void fs_thread_idle(void);

#endif
