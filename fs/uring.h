/* fs: FUSE over io_uring, the request transport a worker may serve besides /dev/fuse. */
#ifndef NVC_FS_URING_H
#define NVC_FS_URING_H

#include <stddef.h>
#include <sys/uio.h>

/*
 * One worker's FUSE ring: the ring entries of the kernel's queues it owns
 * (queue q for q % nworkers == worker), each a header and a payload buffer
 * the kernel writes a request into and reads its reply from.  Made, used and
 * freed by the owning worker thread (the kernel copies requests into the
 * buffers in that thread's context); furing_reply may be called from any.
 */
struct furing;

/* The kernel's queues: one per possible CPU. */
unsigned furing_nqueues(void);

/* On the owning thread, after the INIT reply granted FUSE_OVER_IO_URING:
 * register the entries of its queues.  *out NULL (and 0): no queue is this
 * worker's.  0 or -errno. */
int furing_start(int fuse_fd, unsigned worker, unsigned nworkers,
		 struct furing **out);
/* What to poll: readable once a request or a reply from another thread
 * waits (an eventfd the ring signals). */
int furing_fd(const struct furing *r);

/*
 * On the owning thread: take every completion, serve(arg, buf, len) each
 * request (buf: the request as /dev/fuse would have given it, its WRITE
 * data at a DEV_ALIGN boundary), and commit the replies other threads left.
 * 0, or -ENOTCONN once no entry is registered any more.
 */
int furing_run(struct furing *r, void (*serve)(void *, char *, size_t),
	       void *arg);

/* A reply (libfuse's iovec: fuse_out_header first): 1 if it answers a
 * request that came through a ring (it is committed), 0 if it is not one of
 * theirs (it goes to /dev/fuse), -errno if it cannot be committed. */
int furing_reply(const struct iovec *iov, int count);

/* Requests served through rings (counters, for the log). */
unsigned long long furing_served(void);

/* On the owning thread, idle: give back the pages of the free entries. */
void furing_idle(struct furing *r);

/* With no thread left to use it. */
void furing_free(struct furing *r);

#endif
