/* fs: a direct write's range dropped from the kernel's page cache before the
 * write is answered (kinval.c). */
#ifndef NVC_FS_KINVAL_H
#define NVC_FS_KINVAL_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdint.h>

/* What an inode's handles did that its page cache in the kernel depends on
 * (atomic; in struct fs_inode). */
struct kinval_ino {
	uint32_t kopen; /* handles without FOPEN_DIRECT_IO open now */
	uint64_t dio_seq; /* direct writes answered */
	uint64_t dio_seen; /* dio_seq as a handle that dropped the page
			    * cache at its open found it, once released */
};

/* The thread that answers such writes: started once the session exists,
 * stopped (what it holds answered first) once the request loop has ended. */
int kinval_start(struct fuse_session *se);
void kinval_stop(void);
/* Answer a direct write of n bytes at off on ino, whose data is in the
 * cache: once the kernel has dropped its pages of that range if a buffered
 * handle is open (see kinval.c for which writes may come here). */
void kinval_reply_write(struct kinval_ino *k, fuse_req_t req, fuse_ino_t ino,
			off_t off, size_t n);
/* A handle without FOPEN_DIRECT_IO is opened, before its reply: 1 if it
 * must not keep the kernel's page cache (*drop: give it to its release). */
int kinval_open(struct kinval_ino *k, uint64_t *drop);
void kinval_release(struct kinval_ino *k, uint64_t drop);

#endif
