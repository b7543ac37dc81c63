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
 * When.  Only while a handle without FOPEN_DIRECT_IO is open on the inode
 * (kopen): no page of the inode is read into the kernel's page cache but
 * through one (a shared mapping keeps its handle open until unmapped), or
 * through a mapping of, or readahead asked on, an O_DIRECT handle, which
 * this does not cover (README, Limits).  A
 * direct write answered with none open leaves what a handle closed
 * meanwhile read during it; so every direct write counts (dio_seq), and a
 * buffered open that finds a count it has not seen dropped does not keep
 * the page cache (keep_cache = 0: the kernel drops it before that open
 * returns).  A count is taken for seen only once the handle that dropped
 * it is released, long after its drop: every buffered open until then
 * drops too, and none keeps what another's drop has not yet removed.  The
 * write counts then looks at kopen; the open counts in kopen then looks at
 * dio_seq, all sequentially consistent: either the write sees the open and
 * drops the range, or the open sees the write and drops everything.  A
 * file only ever opened O_DIRECT (a database, a VM image), or opened
 * buffered only between its direct writes, pays no invalidation.
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
} K = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

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

void kinval_reply_write(struct kinval_ino *k, fuse_req_t req, fuse_ino_t ino,
			off_t off, size_t n)
{
	struct kinval_job *j;

	__atomic_add_fetch(&k->dio_seq, 1, __ATOMIC_SEQ_CST);
	j = K.running && __atomic_load_n(&k->kopen, __ATOMIC_SEQ_CST)
		    ? malloc(sizeof(*j))
		    : NULL;
	if (!j) {
		/* no buffered handle open (no thread, or no memory: the
		 * kernel's own drop before the write stays) */
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

int kinval_open(struct kinval_ino *k, uint64_t *drop)
{
	uint64_t seq;

	__atomic_add_fetch(&k->kopen, 1, __ATOMIC_SEQ_CST);
	seq = __atomic_load_n(&k->dio_seq, __ATOMIC_SEQ_CST);
	*drop = seq;
	return seq != __atomic_load_n(&k->dio_seen, __ATOMIC_SEQ_CST);
}

void kinval_release(struct kinval_ino *k, uint64_t drop)
{
	uint64_t seen = __atomic_load_n(&k->dio_seen, __ATOMIC_SEQ_CST);

	/* the largest count dropped and released (counts only grow) */
	while (drop > seen &&
	       !__atomic_compare_exchange_n(&k->dio_seen, &seen, drop, 0,
					    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
		;
	assert(__atomic_load_n(&k->kopen, __ATOMIC_SEQ_CST) > 0);
	__atomic_sub_fetch(&k->kopen, 1, __ATOMIC_SEQ_CST);
}
