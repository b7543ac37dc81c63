/* fs: the FUSE request loop, shared by the daemon and the benchmark's FUSE floor. */
#ifndef NVC_FS_LOOP_H
#define NVC_FS_LOOP_H

#include <stdint.h>

struct fuse_session;
struct dev_aring;

/* How requests come (fuse.transport): FUSE over io_uring where the INIT
 * request offers it, else /dev/fuse; io_uring or stop; /dev/fuse only.
 * Other than FSLOOP_DEV, the session's proto_attach must have asked for
 * PROTO_URING. */
enum { FSLOOP_AUTO, FSLOOP_URING, FSLOOP_DEV };

/*
 * Serve requests until the session ends: workers (0: one per CPU) answer
 * them, handing device I/O to their rings; pool threads run what a busy
 * worker must not wait for.  spin_ns: how long a worker with I/O in flight
 * spins for a completion before it sleeps.  0 or -errno.
 */
int fsloop_run(struct fuse_session *se, unsigned workers, unsigned pool,
	       uint64_t spin_ns, int transport);
/* fn(0 or -errno, msg) is told which transport serves, or why none can. */
void fsloop_on_log(void (*fn)(int err, const char *msg));
/* libfuse's own multi-threaded loop: a thread per request in progress. */
int fsloop_run_mt(struct fuse_session *se, unsigned int threads);

/* fn is called on a worker or pool thread that served requests and then had
 * nothing to do for a second, with nothing in flight: it gives back the
 * thread's buffers (fsloop_run's essay, Idle).  Set before fsloop_run. */
void fsloop_on_idle(void (*fn)(void));

/* On a worker: its ring; elsewhere NULL (then run requests synchronously). */
struct dev_aring *fsloop_ring(void);
/* Requests the calling worker has in flight (their locks held): +1 / -1. */
void fsloop_hold(int delta);
/* The caller is a worker that must not run a request synchronously now
 * (it holds requests in flight, or enough workers already wait): what it
 * cannot finish at once goes to fsloop_defer(). */
int fsloop_must_defer(void);
/* Around a request a worker runs synchronously (it may wait long). */
void fsloop_sync_begin(void);
void fsloop_sync_end(void);

/* Work for the pool: run(job) is called once, on a pool thread. */
struct fsloop_job {
	void (*run)(struct fsloop_job *j);
	struct fsloop_job *next;
};
void fsloop_defer(struct fsloop_job *j);

#endif
