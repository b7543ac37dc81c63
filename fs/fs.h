/* fs: the FUSE operations over the backing directory and the cache, and the
 * daemon's pieces. */
#ifndef NVC_FS_H
#define NVC_FS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <pthread.h>

#include "../cache/cache.h"

struct fs_inode {
	int fd; /* O_PATH on the backing inode */
	dev_t dev;
	ino_t ino;
	uint64_t nlookup;
	struct fs_inode *next;
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
	const char *mountpoint;
	const char *config_file;
	char **overrides;
	int noverrides;
};

extern const struct fuse_lowlevel_ops fs_ops;
int fs_init_table(struct fs *fs);
void fs_free_table(struct fs *fs);

/* ctl.c: the control socket */
int fs_ctl_start(struct fs *fs, const char *mountpoint);
void fs_ctl_stop(void);

#endif
