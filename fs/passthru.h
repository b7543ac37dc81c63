/* fs: FUSE passthrough — opens the cache does not serve, served by the
 * kernel straight from the backing file (fuse.passthrough). */
#ifndef NVC_FS_PASSTHRU_H
#define NVC_FS_PASSTHRU_H

#include "fs.h"

/* How an open is served (fs_fh.pt). */
enum fs_pt_how {
	FS_PT_NONE, /* passthrough is off for the mount: nothing counted */
	FS_PT_CACHE, /* the cache's path, counted against passthrough */
	FS_PT_KERNEL, /* passthrough: the kernel reads and writes the store */
};

/*
 * At an open of in (cache object cf), after the cache path's own
 * steps (revalidation, policy, O_TRUNC), before the reply: how it is
 * served (FS_PT_*), or -errno (the store refused the caller).  FS_PT_KERNEL
 * has marked the reply (proto_open_passthrough) and cleared fi->direct_io.
 */
int fs_pt_open(fuse_req_t req, struct fs_inode *in, struct cfile *cf,
	       struct fuse_file_info *fi);
/* The end of an open that fs_pt_open counted (how: its answer). */
void fs_pt_release(struct fs *fs, struct fs_inode *in, struct cfile *cf,
		   int how);
/*
 * A fill of the cache outside any open (nvcachectl warm, pin) of the file
 * (dev, ino): -EBUSY while it is open through passthrough, else it counts
 * as an open on the cache's path until fs_pt_unhold.
 */
int fs_pt_hold(dev_t dev, ino_t ino);
void fs_pt_unhold(dev_t dev, ino_t ino);
/* Counters, one line of text; its length (snprintf's). */
int fs_pt_stats(char *buf, size_t len);

#endif
