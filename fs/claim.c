/* fs: claiming store space as the caller — fallocate(KEEP_SIZE) of what a
 * write makes dirty, remembered per inode so that it is claimed once. */
#define _GNU_SOURCE
#include "claim.h"
#include "cred.h"

#include <linux/capability.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

/*
 * Why.  The daemon destages as root, past quotas and into the blocks the
 * store keeps for root.  So the space a write will need is taken on the
 * store when the write is accepted, by its caller: fallocate with
 * FALLOC_FL_KEEP_SIZE of the write's range in whole pages (the size is the
 * cache's to change), with the caller's credentials (cred.c), so that the
 * store charges the file's owner and refuses with EDQUOT or ENOSPC as it
 * would have refused the write itself.  Destage then writes into blocks
 * that exist.
 *
 * Once.  Each inode remembers the ranges claimed, as a sorted list of
 * disjoint extents (a sequential writer makes one), so that a rewrite asks
 * the store nothing.  The list is a memo, never a promise: it is dropped
 * whole when the file may have lost space (a truncate, O_TRUNC, a change
 * seen on the store) or grows past CLAIMS_MAX extents, and then the next
 * writes claim again; a claim of space the file has already costs the store
 * a lookup, and moves the file's times (noted as this node's own change).
 * A punched hole loses none: the cache writes its zeros there (claimed).
 *
 * A drop counts in a generation: a claim made while a truncate freed
 * blocks (the fallocate before it, the list's update after it) is not
 * remembered, and the next write claims again.
 *
 * Not claimed: a caller with CAP_SYS_RESOURCE (it passes quotas and
 * reserves anyway), and a file the store has no fallocate for (EOPNOTSUPP:
 * some FUSE stores, an ext4 file without extents), where the store's
 * limits apply at destage only; that is logged once.  The kernel's
 * writeback of a shared mapping's pages comes without a caller: it claims
 * as the handle's opener (fs.c).
 */

#define CLAIM_PAGE 4096ull
#define CLAIMS_MAX 1024

struct claim_ext {
	uint64_t lo, hi;
};

struct fs_claims {
	pthread_mutex_t lock;
	int n, cap;
	struct claim_ext *x;
	uint64_t gen; /* of the drops: a claim made across one is not kept */
	int unsupported; /* the store has no fallocate for this file */
};

static int claims_unsupported; /* said once in the log */

/* The first extent whose end is at or past lo. */
static int ext_find(const struct fs_claims *cl, uint64_t lo)
{
	int a = 0, b = cl->n;

	while (a < b) {
		int m = (a + b) / 2;

		if (cl->x[m].hi < lo)
			a = m + 1;
		else
			b = m;
	}
	return a;
}

/* Whether [lo, hi) needs no claim; *gen: the drops so far. */
static int claimed(struct fs_claims *cl, uint64_t lo, uint64_t hi,
		   uint64_t *gen)
{
	int i, yes;

	pthread_mutex_lock(&cl->lock);
	i = ext_find(cl, lo);
	yes = cl->unsupported ||
	      (i < cl->n && cl->x[i].lo <= lo && cl->x[i].hi >= hi);
	*gen = cl->gen;
	pthread_mutex_unlock(&cl->lock);
	return yes;
}

/* Add [lo, hi), merging what it touches, unless the list was dropped since
 * gen (a truncate may have freed what the claim took). */
static void claims_add(struct fs_claims *cl, uint64_t lo, uint64_t hi,
		       uint64_t gen)
{
	int i, j;

	pthread_mutex_lock(&cl->lock);
	if (cl->gen != gen)
		goto unlock;
	i = ext_find(cl, lo);
	for (j = i; j < cl->n && cl->x[j].lo <= hi; j++) {
		if (cl->x[j].lo < lo)
			lo = cl->x[j].lo;
		if (cl->x[j].hi > hi)
			hi = cl->x[j].hi;
	}
	if (i == j && cl->n == cl->cap) {
		int cap = cl->cap ? cl->cap * 2 : 8;
		struct claim_ext *x;

		if (cap > CLAIMS_MAX) {
			/* too scattered to remember: start again */
			cl->n = 0;
			i = j = 0;
		} else {
			x = realloc(cl->x, cap * sizeof(*x));
			if (!x)
				goto unlock;
			cl->x = x;
			cl->cap = cap;
		}
	}
	/* the extents i..j-1 become one */
	if (i == j) {
		memmove(&cl->x[i + 1], &cl->x[i], (cl->n - i) * sizeof(*cl->x));
		cl->n++;
	} else if (j - i > 1) {
		memmove(&cl->x[i + 1], &cl->x[j], (cl->n - j) * sizeof(*cl->x));
		cl->n -= j - i - 1;
	}
	cl->x[i].lo = lo;
	cl->x[i].hi = hi;
unlock:
	pthread_mutex_unlock(&cl->lock);
}

static struct fs_claims *claims_of(struct fs_inode *in)
{
	struct fs_claims *cl = __atomic_load_n(&in->claims, __ATOMIC_ACQUIRE),
			 *none = NULL;

	if (cl)
		return cl;
	cl = calloc(1, sizeof(*cl));
	if (!cl)
		return NULL;
	pthread_mutex_init(&cl->lock, NULL);
	if (__atomic_compare_exchange_n(&in->claims, &none, cl, 0,
					__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return cl;
	pthread_mutex_destroy(&cl->lock);
	free(cl);
	return none;
}

/* The handle's descriptor for claims: its inode reopened for writing, by
 * the daemon (the handle was opened for writing; the file's mode may no
 * longer let its opener open it so). */
static int claim_fd(struct fs *fs, struct fs_inode *in, int *wfd)
{
	int fd = __atomic_load_n(wfd, __ATOMIC_ACQUIRE), pfd, expect = -1;
	char path[64];

	if (fd >= 0)
		return fd;
	pfd = fs_inode_fd(fs, in);
	if (pfd < 0)
		return pfd;
	fs_proc_path(pfd, path, sizeof(path));
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		fd = -errno;
	fs_inode_fd_put(in, pfd);
	if (fd < 0)
		return fd;
	if (!__atomic_compare_exchange_n(wfd, &expect, fd, 0, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE)) {
		close(fd);
		fd = expect;
	}
	return fd;
}

int fs_claim(struct fs *fs, const struct fs_caller *who, struct fs_inode *in,
	     struct cfile *cf, int *wfd, uint64_t off, uint64_t len)
{
	uint64_t lo = off & ~(CLAIM_PAGE - 1),
		 hi = (off + len + CLAIM_PAGE - 1) & ~(CLAIM_PAGE - 1), gen;
	struct fs_claims *cl;
	int fd, ret, end;

	/* past quotas and reserves anyway */
	if (!len || fs_cred_has(who, CAP_SYS_RESOURCE))
		return 0;
	cl = claims_of(in);
	if (!cl)
		return -ENOMEM;
	if (claimed(cl, lo, hi, &gen))
		return 0;
	fd = claim_fd(fs, in, wfd);
	if (fd < 0)
		return fd;
	/* the claim moves the file's mtime and ctime: a change of this node's
	 * own, not another's */
	cache_file_bk_change_begin(fs->cache, cf);
	ret = fs_cred_take(who);
	if (!ret) {
		ret = fallocate(fd, FALLOC_FL_KEEP_SIZE, lo, hi - lo) ? -errno
								     : 0;
		fs_cred_leave();
		fs_cred_daemon();
	}
	end = cache_file_bk_change_end(fs->cache, cf);
	if (!ret)
		ret = end;
	if (ret == -EOPNOTSUPP || ret == -ENOSYS) {
		if (!__atomic_exchange_n(&claims_unsupported, 1,
					 __ATOMIC_RELAXED))
			log_msg(LOG_WARNING,
				"the backing store has no fallocate (inode "
				"%llu): the quotas of a file without it apply "
				"when its data is destaged, not when it is "
				"written",
				(unsigned long long)in->ino);
		__atomic_store_n(&cl->unsupported, 1, __ATOMIC_RELAXED);
		return 0;
	}
	if (ret)
		return ret;
	claims_add(cl, lo, hi, gen);
	return 0;
}

void fs_claims_drop(struct fs_inode *in)
{
	struct fs_claims *cl = __atomic_load_n(&in->claims, __ATOMIC_ACQUIRE);

	if (!cl)
		return;
	pthread_mutex_lock(&cl->lock);
	cl->n = 0;
	cl->gen++;
	pthread_mutex_unlock(&cl->lock);
}

void fs_claims_free(struct fs_inode *in)
{
	struct fs_claims *cl = in->claims;

	if (!cl)
		return;
	pthread_mutex_destroy(&cl->lock);
	free(cl->x);
	free(cl);
	in->claims = NULL;
}
