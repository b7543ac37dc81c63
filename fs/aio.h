/* fs: reads and writes answered from io_uring completions, on the loop's workers. */
#ifndef NVC_FS_AIO_H
#define NVC_FS_AIO_H

#include "fs.h"

/* The synchronous path of a read (wbuf NULL) or write: replies itself
 * (flags: fs_aio_rw's). */
typedef void (*fs_rw_sync_fn)(fuse_req_t req, void *fh, const char *wbuf,
			      size_t size, off_t off, uint64_t t0, int flags);

/* fs_aio_rw's flags: it may go asynchronously; a write's answer waits for
 * the kernel's drop of its range (fs_reply_write, kinval.c). */
enum { FS_RW_ASYNC = 1, FS_RW_KINVAL = 2 };

/*
 * Serve a read (wbuf NULL) or a write on a worker: asynchronously if the
 * cache can and flags has FS_RW_ASYNC, else through sync (here, or on the pool if the
 * worker must not wait: fsloop_must_defer).  0: taken (replied, or the reply
 * will come); -EAGAIN: not a worker, the caller runs sync itself.
 */
int fs_aio_rw(fuse_req_t req, struct cache *c, struct cfile *cf, void *fh,
	      const char *wbuf, size_t size, off_t off, uint64_t t0,
	      fs_rw_sync_fn sync, int flags);

/* The calling worker is idle (nothing in flight): its free requests and
 * their buffers go. */
void fs_aio_idle(void);

#endif
