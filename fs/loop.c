/* fs: the FUSE request loop, shared by the daemon and the benchmark's FUSE floor. */
#define FUSE_USE_VERSION 312
#include <errno.h>
#include <fuse_lowlevel.h>

#include "loop.h"

/*
 * libfuse's multi-threaded loop: up to `threads` workers, each reading
 * /dev/fuse and answering its request itself; half of them may idle.
 */
int fsloop_run(struct fuse_session *se, unsigned int threads)
{
	struct fuse_loop_config *lc;
	int ret;

	lc = fuse_loop_cfg_create();
	if (!lc)
		return -ENOMEM;
	fuse_loop_cfg_set_max_threads(lc, threads);
	fuse_loop_cfg_set_idle_threads(lc, threads / 2 > 1 ? threads / 2 : 1);
	ret = fuse_session_loop_mt(se, lc);
	fuse_loop_cfg_destroy(lc);
	return ret < 0 ? ret : 0;
}
