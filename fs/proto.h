/* fs: kernel protocol features libfuse cannot ask for, and request counters,
 * through libfuse's custom io hooks on /dev/fuse (shared with the FUSE floor). */
#ifndef NVC_FS_PROTO_H
#define NVC_FS_PROTO_H

#include <stddef.h>

struct fuse_session;
struct fuse_conn_info;
struct fuse_file_info;

/*
 * Features a daemon may ask for.  Both make the kernel leave the killing of
 * setuid, setgid and file capabilities to the daemon: a daemon asking for
 * either kills them when proto_write_kill() or proto_open_kill() says so, and
 * in a setattr whose valid has FUSE_SET_ATTR_KILL_SUID (the kernel's
 * FATTR_KILL_SUIDGID, which every libfuse passes on).
 *
 * PROTO_KILLPRIV_V2: FUSE_HANDLE_KILLPRIV_V2.  The kernel stops asking for
 * security.capability before every write (a GETXATTR round trip under the
 * inode lock) and asks the daemon to kill instead.
 * PROTO_DIRECT_IO: O_DIRECT opens bypass the kernel's page cache
 * (FOPEN_DIRECT_IO) and may write in parallel (FOPEN_PARALLEL_DIRECT_WRITES);
 * MAP_SHARED maps of them stay allowed (FUSE_DIRECT_IO_ALLOW_MMAP).  The
 * kernel's direct write path sends FUSE_WRITE_KILL_SUIDGID with or without
 * KILLPRIV_V2.
 */
#define PROTO_KILLPRIV_V2 1u
#define PROTO_DIRECT_IO 2u
/* PROTO_URING: FUSE_OVER_IO_URING where the kernel offers it (only while
 * /sys/module/fuse/parameters/enable_uring is Y) and the loop can serve it
 * (proto_uring_allow): requests then come through fs/uring.c. */
#define PROTO_URING 4u
/* PROTO_PASSTHROUGH: FUSE_PASSTHROUGH (max_stack_depth 1) where the kernel
 * offers it; an open is then served by the kernel from a backing file when
 * its reply is marked (proto_open_passthrough; fs/passthru.c). */
#define PROTO_PASSTHROUGH 8u

/*
 * Install the hooks on a session, reading and writing fd (a mounted session's
 * fuse_session_fd), before its loop runs (the INIT request comes in the
 * loop).  0 or -errno; without the hooks no feature is asked for.  One session
 * per process.
 */
int proto_attach(struct fuse_session *se, int fd, unsigned int features);

/* A loop reading requests itself (fs/loop.c): the request this thread is
 * about to serve (fresh: just read, count it), and the end of serving it. */
void proto_request(const void *buf, size_t n, int fresh);
void proto_request_done(void);

/* From the init op: ask through the library where it can. */
void proto_init(struct fuse_conn_info *conn);
/* From the init op: the whole connection nvcachefs asks for (settings and
 * proto_init), shared with the FUSE floor. */
void proto_conn(struct fuse_conn_info *conn);

/* From the open and create ops, before the reply: the open's reply flags. */
void proto_open(struct fuse_file_info *fi);

/* Whether the write, or the open or create (with O_TRUNC), being served by
 * this thread asks the daemon to kill setuid, setgid and capabilities. */
int proto_write_kill(void);
int proto_open_kill(void);

/* Called by a loop that serves io_uring entries (fs/loop.c), before the
 * INIT request: without it PROTO_URING asks for nothing. */
void proto_uring_allow(void);
/* After the INIT reply: whether the kernel offered FUSE_OVER_IO_URING, and
 * whether the reply took it. */
int proto_uring_offered(void);
int proto_uring(void);
/* The payload a ring entry needs: max(8 KiB, max_write, max_pages pages)
 * of the INIT reply. */
size_t proto_uring_payload(void);

/* After the INIT reply: whether the kernel offered FUSE_PASSTHROUGH, and
 * whether the reply took it. */
int proto_passthrough_offered(void);
int proto_passthrough(void);
/* From the open and create ops, before the reply: serve this open through
 * the backing file registered as backing_id (FOPEN_PASSTHROUGH). */
void proto_open_passthrough(int backing_id);

/* The request counters, one line of text; its length (snprintf's). */
int proto_stats(char *buf, size_t len);

#endif
