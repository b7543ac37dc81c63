/* fs: a direct write's range dropped from the kernel's page cache before the
 * write is answered (kinval.c). */
#ifndef NVC_FS_KINVAL_H
#define NVC_FS_KINVAL_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

/* The thread that answers such writes: started once the session exists,
 * stopped (what it holds answered first) once the request loop has ended. */
int kinval_start(struct fuse_session *se);
void kinval_stop(void);
/* Answer a write of n bytes at off on ino once the kernel has dropped its
 * pages of that range (see kinval.c for which writes may come here). */
void kinval_reply_write(fuse_req_t req, fuse_ino_t ino, off_t off, size_t n);

#endif
