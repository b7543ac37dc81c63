/* fs: a direct write's range dropped from the kernel's page cache before the
 * write is answered, on a thread of its own (the replies it holds back). */
#define _GNU_SOURCE
#include "kinval.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

/*
 * Why (issue 25, finding 9; xfstests generic/451).  A write on a handle the
 * kernel opened with FOPEN_DIRECT_IO (proto_open: an O_DIRECT open) goes
 * around the kernel's page cache of the inode.  The kernel drops the
 * range's pages before it sends the write, not after: a buffered reader of
 * the same inode that reads the range while the write is under way brings
 * the old bytes back into the page cache, and once the write has completed
 * every buffered read (and every open that keeps the cache) gets them.  So
 * the daemon drops the range again (fuse_lowlevel_notify_inval_inode) after
 * the write is in the cache and before it answers: a page read before the
 * write reached the cache is locked until its READ is answered, and the
 * invalidation waits for it; a page read after comes from the cache, new.
 *
 * Why a thread.  The invalidation waits for those pages' READs, which the
 * daemon itself answers, perhaps from the very worker that would wait (its
 * io_uring holds them in flight): invalidating on a worker or a pool thread
 * could wait for itself.  So the answer of such a write is handed to this
 * thread, which invalidates and then answers; it waits for nothing the
 * daemon serves but the READs, and nothing the daemon serves waits for it.
 * (A buffered write's reply must never come here: the kernel holds its
 * pages locked until it is answered.  Only FOPEN_DIRECT_IO handles, whose
 * writes the kernel never sends from the page cache but for a shared
 * mapping's writeback, which is not sent here either: fi->writepage.)
 *
 * When.  Only for an inode some handle opened without FOPEN_DIRECT_IO
 * (fs_inode.cached_open, set before that open's reply and never cleared):
 * the kernel can hold pages of an inode only once one has.  A file only
 * ever opened O_DIRECT (a database, a VM image) pays nothing.  The store of
 * the flag and its load after the write's data is in the cache are both
 * sequentially consistent: a buffered open whose flag the write's check
 * misses was answered after the check, and its reads find the new bytes.
 */

struct kinval_job {
	struct kinval_job *next;
	fuse_req_t req;
	fuse_ino_t ino;
	off_t off;
	size_t n;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t thread;
	struct fuse_session *se;
	struct kinval_job *head, **tail;
	int running, stop;
} K = { .lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER };

static void kinval_run(struct fuse_session *se, struct kinval_job *j)
{
	/* -ENOENT: the kernel holds no such inode, nothing to drop */
	fuse_lowlevel_notify_inval_inode(se, j->ino, j->off, j->n);
	fuse_reply_write(j->req, j->n);
}

static void *kinval_main(void *arg)
{
	struct kinval_job *j;

	(void)arg;
	pthread_mutex_lock(&K.lock);
	for (;;) {
		while (!K.head && !K.stop)
			pthread_cond_wait(&K.cond, &K.lock);
		j = K.head;
		if (!j)
			break; /* stopped, and nothing left to answer */
		K.head = j->next;
		if (!K.head)
			K.tail = &K.head;
		pthread_mutex_unlock(&K.lock);
		kinval_run(K.se, j);
		free(j);
		pthread_mutex_lock(&K.lock);
	}
	pthread_mutex_unlock(&K.lock);
	return NULL;
}

int kinval_start(struct fuse_session *se)
{
	int ret;

	K.se = se;
	K.head = NULL;
	K.tail = &K.head;
	K.stop = 0;
	ret = -pthread_create(&K.thread, NULL, kinval_main, NULL);
	K.running = !ret;
	return ret;
}

void kinval_stop(void)
{
	if (!K.running)
		return;
	pthread_mutex_lock(&K.lock);
	K.stop = 1;
	pthread_cond_signal(&K.cond);
	pthread_mutex_unlock(&K.lock);
	pthread_join(K.thread, NULL);
	K.running = 0;
}

void kinval_reply_write(fuse_req_t req, fuse_ino_t ino, off_t off, size_t n)
{
	struct kinval_job *j = K.running ? malloc(sizeof(*j)) : NULL;

	if (!j) {
		/* no thread (or no memory): answered without the drop, as
		 * before; the kernel's own drop before the write stays */
		fuse_reply_write(req, n);
		return;
	}
	j->next = NULL;
	j->req = req;
	j->ino = ino;
	j->off = off;
	j->n = n;
	pthread_mutex_lock(&K.lock);
	*K.tail = j;
	K.tail = &j->next;
	pthread_cond_signal(&K.cond);
	pthread_mutex_unlock(&K.lock);
}
