/* fs: the FUSE request loop, shared by the daemon and the benchmark's FUSE floor. */
#ifndef NVC_FS_LOOP_H
#define NVC_FS_LOOP_H

struct fuse_session;

/* Serve requests until the session ends; 0 or -errno. */
int fsloop_run(struct fuse_session *se, unsigned int threads);

#endif
