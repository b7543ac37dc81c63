/* fs: FUSE passthrough — the opens the cache does not serve, answered with a
 * backing file the kernel reads and writes itself, and the switch rule. */
#define _GNU_SOURCE
#include "passthru.h"
#include "cred.h"
#include "proto.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <syslog.h>
#include <unistd.h>

/*
 * What passthrough is.  An open whose reply carries FOPEN_PASSTHROUGH and a
 * backing id (registered on /dev/fuse with FUSE_DEV_IOC_BACKING_OPEN) is
 * served by the kernel from that backing file: reads, writes, splice and
 * mmap never reach the daemon.  So such an open bypasses the cache entirely,
 * and it may be used only where the cache has nothing to add or keep: files
 * of which the cache holds nothing, whose mode reads and writes the store
 * itself (bypass), write-only opens of files whose mode writes the store
 * itself (writearound: its reads are kept in the cache, PRODUCT.md §4.2, so
 * they stay on the cache's path), and read-only opens of files the cache
 * would not keep either: streams past the cutoff (Streams, below).
 *
 * The kernel's rule (fs/fuse/iomode.c).  While an inode has a passthrough
 * open, every new open of it must be passthrough with the same backing
 * (another backing, or none, fails the open with EIO); while it has an open
 * in the kernel's caching mode, a passthrough open fails with EIO.  Opens
 * are told apart by the kernel when it processes each reply, and released
 * there before their RELEASE reaches the daemon.
 *
 * The switch rule, per backing inode (dev, ino), kept in this file's table
 * under pt.lock, counting opens from the decision to their RELEASE (so the
 * counts are never below the kernel's):
 *
 *   1. A file with a passthrough open: every open of it is passthrough, with
 *      the same backing id, whatever its policy says now.  The caller is
 *      checked by the store first (an open of the file as the caller, with
 *      the open's access mode; an execve's open, which asks execute and
 *      not read, an access check for execute).
 *   2. Else a file with an open on the cache's path (or a warm or pin under
 *      way, fs_pt_hold): the cache's path.
 *   3. Else passthrough when the mount has it, the cache holds nothing of
 *      the file (cache_file_outside) and its mode is bypass, or writearound
 *      for a write-only open, or the open is a stream (below), and it is
 *      not an execve's (its caller may not read the file); otherwise the
 *      cache's path.  Its backing is registered with the file opened
 *      by the caller (below).
 *
 * Streams.  A file whose last read through the cache was a stream past
 * cache.sequential_cutoff that missed (CACHE_OUT_STREAMED) is one the cache
 * keeps only the head of: the stream's own bytes were read from the store
 * and not kept.  So a read-only open of it, while it has no other open,
 * gives that head up (cache_file_drop_streamed: only clean data, and only
 * if that leaves nothing, so never a file with dirty or lost data: such a
 * file is not even tried, CACHE_OUT_CLEAN, since the drop would wait for
 * its destage) and is a candidate for 3: the kernel streams it from the
 * store.  The cache forgets a file it holds nothing of when its opens end,
 * so the inode remembers that its last open was taken as a stream
 * (in->pt_streamed, under pt.lock; any open on the cache's path clears it:
 * its reads teach the cache again).  Passthrough opens send no reads, so
 * every PT_RELEARN-th open taken as a stream takes the cache's path instead
 * (its reads say whether it is still a stream).  A file pinned, pinned by
 * its policy, or filled by a warm (CACHE_OUT_KEPT; a warm marks it before
 * its first read) is never given up.  The drop is made before pt.lock is
 * taken (it waits for f->rw), so 3 checks the cache holds nothing under
 * pt.lock as always: an open or warm that came between keeps the file on
 * the cache's path.  It is also made before the caller's own open of the
 * store file (3): a caller the store then refuses has cost the file its
 * clean head, never a byte of data.  A writer that opens the file while a
 * stream holds it through passthrough shares it (1), in whatever mode:
 * its writes are the store's, so its fsync (and a flush at close) fsyncs
 * the store's file (cache_file_written_outside).
 *
 * The invariant: while a file has a passthrough open, the cache holds no
 * block of it and nothing fills one: no open is on the cache's path (1, 2)
 * and no warm or pin runs (fs_pt_hold refuses).  Every byte of the file is
 * then the store's alone, and the kernel reads and writes the store, so no
 * open of either kind can be served stale data from the cache.  Switching
 * to passthrough (3) needs nothing more: the cache holds nothing of the
 * file then, and a bypass or writearound file's writes through the cache's
 * path went to the store before they were answered.  Switching back, the
 * kernel's page cache of the FUSE inode is the one place old data could
 * hide (passthrough opens neither read nor fill it; the store's own pages
 * serve them): the first cache-path open after a passthrough one (in->pt_gen,
 * a generation of the inode's passthrough opens, against in->pt_seen) has no
 * FOPEN_KEEP_CACHE, whatever its revalidation (§4.7) found, so the kernel
 * reads through the cache, and so the store, again, whatever the
 * timestamps' granularity.  Asserted in debug builds at each decision (never
 * both kinds of open; nothing cached beside a passthrough open) and at the
 * last passthrough release (nothing cached).
 *
 * Acting as the caller (PRODUCT.md §5).  The kernel does no permission
 * check when it opens its per-open backing file, and runs every read and
 * write of it with the credentials captured at BACKING_OPEN.  So each
 * passthrough open is first opened by the caller (fs_cred_take: its IDs,
 * groups and capabilities), with its access mode: the store refuses it
 * there as it would refuse the caller, and that refusal is the open's.  The
 * backing is registered from that descriptor with the first opener's IDs and
 * groups and its capabilities less CAP_SYS_RESOURCE and CAP_FSETID, plus
 * CAP_SYS_ADMIN, which the ioctl needs and which passes no permission, quota
 * or reserved-block check of the usual stores: later openers of the file (of
 * other users, checked as themselves) share those credentials, and lacking
 * the two, none of them writes past a quota or root's reserved blocks or
 * keeps a set-ID bit it should lose.  (Root's own passthrough writes are
 * held to quotas then: stricter, never looser.)
 */

#ifndef FUSE_DEV_IOC_BACKING_OPEN
struct fuse_backing_map {
	int32_t fd;
	uint32_t flags;
	uint64_t padding;
};
#define FUSE_DEV_IOC_BACKING_OPEN _IOW(229, 1, struct fuse_backing_map)
#define FUSE_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)
#endif

#define PT_BUCKETS 256
/* every this many opens taken as streams of a file, one goes through the
 * cache, whose reads say again whether it is read as a stream */
#define PT_RELEARN 8

struct pt_ent {
	dev_t dev;
	ino_t ino;
	int pt_opens; /* passthrough opens, from decision to RELEASE */
	int cache_opens; /* cache-path opens and holds */
	int backing_id; /* while pt_opens */
	struct pt_ent *next;
};

static struct {
	pthread_mutex_t lock;
	struct pt_ent *tab[PT_BUCKETS];
	int said; /* the mount's passthrough logged (atomic) */
	uint64_t refused_gen; /* bumped when the kernel refuses a backing
			       * for good (no CAP_SYS_ADMIN, stacked store):
			       * nonzero, every open takes the cache path */
	uint64_t n_kernel, n_cache, n_backings, n_fallback,
		n_streams; /* pt.lock */
} pt = { .lock = PTHREAD_MUTEX_INITIALIZER };

static struct pt_ent **ent_slot(dev_t dev, ino_t ino)
{
	struct pt_ent **p =
		&pt.tab[((ino * 0x9e3779b97f4a7c15ull) ^ dev) % PT_BUCKETS];

	while (*p && ((*p)->dev != dev || (*p)->ino != ino))
		p = &(*p)->next;
	return p;
}

static struct pt_ent *ent_get(dev_t dev, ino_t ino)
{
	struct pt_ent **p = ent_slot(dev, ino);

	if (!*p) {
		*p = calloc(1, sizeof(**p));
		if (!*p)
			return NULL;
		(*p)->dev = dev;
		(*p)->ino = ino;
		(*p)->backing_id = -1;
	}
	return *p;
}

/* An entry counting nothing goes. */
static void ent_put(struct pt_ent *e)
{
	struct pt_ent **p = ent_slot(e->dev, e->ino);

	if (e->pt_opens || e->cache_opens)
		return;
	*p = e->next;
	free(e);
}

/* The mount's passthrough, decided by the INIT reply and the config; said
 * once in the log. */
static int pt_live(struct fs *fs)
{
	int on = fs->cfg->fuse_passthrough == FUSE_PT_AUTO;

	if (on && !__atomic_exchange_n(&pt.said, 1, __ATOMIC_RELAXED))
		log_msg(proto_passthrough() ? LOG_INFO : LOG_NOTICE, "%s",
			proto_passthrough()
				? "fuse.passthrough = auto: the kernel "
				  "serves bypass files, writes of "
				  "writearound ones and files read as "
				  "streams, the cache holds nothing of"
			: proto_passthrough_offered()
				? "fuse.passthrough = auto: the INIT reply "
				  "could not take FUSE_PASSTHROUGH: every "
				  "open through the cache"
				: "fuse.passthrough = auto: the kernel does "
				  "not offer FUSE_PASSTHROUGH "
				  "(CONFIG_FUSE_PASSTHROUGH, Linux 6.9): "
				  "every open through the cache");
	return on && proto_passthrough() && fs->se;
}

/* The access an open asks of the store, as an open(2) of the caller. */
static int caller_flags(int flags)
{
	return (flags & (O_ACCMODE | O_NOATIME)) | O_CLOEXEC | O_NOCTTY;
}

/*
 * in opened by req's caller with the open's access mode, and closed: 0, or
 * the store's refusal.  With id, the backing is registered from that
 * descriptor first (credentials: see above), into *id.
 */
static int open_as_caller(fuse_req_t req, struct fs *fs, struct fs_inode *in,
			  int flags, int *id)
{
	struct fs_caller who;
	char path[64];
	gid_t *heap;
	int pfd, fd, ret;

	pfd = fs_inode_fd(fs, in);
	if (pfd < 0)
		return pfd;
	if (flags & OPEN_FLAG_EXEC) {
		/* an execve's: the caller may lack read (decide keeps it
		 * from registering a backing) */
		assert(!id);
		ret = fs_access_as(req, pfd, X_OK);
		fs_inode_fd_put(in, pfd);
		return ret;
	}
	fs_proc_path(pfd, path, sizeof(path));
	ret = fs_cred_caller(req, &who, &heap);
	if (ret)
		goto put_pfd;
	who.umask = 0;
	ret = fs_cred_take(&who);
	if (ret)
		goto free_heap;
	fd = open(path, caller_flags(flags));
	ret = fd < 0 ? -errno : 0;
	fs_cred_leave();
	if (ret || !id)
		goto close_fd;
	who.caps &= ~((1ull << CAP_SYS_RESOURCE) | (1ull << CAP_FSETID));
	who.caps |= 1ull << CAP_SYS_ADMIN;
	ret = fs_cred_take(&who);
	if (!ret) {
		struct fuse_backing_map map = { .fd = fd };

		*id = ioctl(fuse_session_fd(fs->se), FUSE_DEV_IOC_BACKING_OPEN,
			    &map);
		ret = *id < 0 ? -errno : 0;
		fs_cred_leave();
	}
close_fd:
	fs_cred_daemon();
	if (fd >= 0)
		close(fd);
free_heap:
	free(heap);
put_pfd:
	fs_inode_fd_put(in, pfd);
	return ret;
}

/* A refusal of BACKING_OPEN that every file of the mount would get. */
static int refused_for_good(int err)
{
	return err == -EPERM || err == -ELOOP || err == -ENOTTY ||
	       err == -EOPNOTSUPP;
}

static void backing_refused(int err)
{
	if (!refused_for_good(err)) {
		log_msg(LOG_INFO,
			"fuse.passthrough: a backing file refused (%s): "
			"that open through the cache",
			strerror(-err));
		return;
	}
	if (__atomic_fetch_add(&pt.refused_gen, 1, __ATOMIC_RELAXED))
		return;
	log_msg(LOG_WARNING,
		"fuse.passthrough = auto: the kernel refuses "
		"backing files (%s%s): every open through the "
		"cache from now on",
		strerror(-err),
		err == -EPERM	? ": the daemon lacks CAP_SYS_ADMIN"
		: err == -ELOOP ? ": the store is stacked already"
				: "");
}

/*
 * Whether a read-only open of cf is taken as a stream (Streams, above): 1
 * after its clean data went, or 0.  Before pt.lock is taken for the
 * decision; counts the open against PT_RELEARN.
 */
static int stream_ready(struct fs *fs, struct fs_inode *in, struct cfile *cf,
			int flags)
{
	int out, take = 0;
	struct pt_ent *e;

	if ((flags & O_ACCMODE) != O_RDONLY)
		return 0;
	out = cache_file_outside(fs->cache, cf);
	/* a drop would wait for f->rw and find dirty data: never tried */
	if (!(out & CACHE_OUT_CLEAN) ||
	    (out & (CACHE_OUT_BYPASS | CACHE_OUT_KEPT)))
		return 0;
	pthread_mutex_lock(&pt.lock);
	e = *ent_slot(in->dev, in->ino);
	/* another open: 1 or 2 decides; every PT_RELEARN-th: the cache's */
	if (((out & CACHE_OUT_STREAMED) || in->pt_streamed) &&
	    !(e && (e->cache_opens || e->pt_opens)))
		take = ++in->pt_streams % PT_RELEARN != 0;
	pthread_mutex_unlock(&pt.lock);
	if (take && !(out & CACHE_OUT_EMPTY) &&
	    cache_file_drop_streamed(fs->cache, cf))
		take = 0;
	return take;
}

/* The decision, under pt.lock (the rule above); ret: FS_PT_* or -errno. */
static int decide(fuse_req_t req, struct fs *fs, struct fs_inode *in,
		  struct cfile *cf, struct fuse_file_info *fi, struct pt_ent *e,
		  int stream, int *id)
{
	int out, ret;

	if (e->pt_opens) { /* 1 */
		ret = open_as_caller(req, fs, in, fi->flags, NULL);
		if (ret)
			return ret;
		*id = e->backing_id;
		e->pt_opens++;
		in->pt_gen++;
		return FS_PT_KERNEL;
	}
	if (e->cache_opens ||
	    __atomic_load_n(&pt.refused_gen, __ATOMIC_RELAXED)) /* 2 */
		goto cache_path;
	/* a backing is registered from a descriptor the caller opened for
	 * reading, which an execve's caller may not: the cache's path */
	if (fi->flags & OPEN_FLAG_EXEC)
		goto cache_path;
	/* a writearound file's reads fill the cache (§4.2): only its
	 * write-only opens, or streams */
	out = cache_file_outside(fs->cache, cf);
	if (out & (CACHE_OUT_BYPASS | CACHE_OUT_KEPT))
		stream = 0; /* passed through as a bypass file, or kept */
	if (!(out & CACHE_OUT_EMPTY) ||
	    !((out & CACHE_OUT_BYPASS) || stream ||
	      ((out & CACHE_OUT_WRITEAROUND) &&
	       (fi->flags & O_ACCMODE) == O_WRONLY)))
		goto cache_path;
	ret = open_as_caller(req, fs, in, fi->flags, id); /* 3 */
	if (ret == -EACCES || ret == -EPERM || ret == -EROFS ||
	    ret == -ENOENT || ret == -ESTALE)
		return ret; /* the caller's, or the file is gone */
	if (ret) {
		backing_refused(ret);
		pt.n_fallback++;
		goto cache_path;
	}
	pt.n_backings++;
	pt.n_streams += stream;
	in->pt_streamed = stream;
	e->pt_opens = 1;
	e->backing_id = *id;
	in->pt_gen++;
	return FS_PT_KERNEL;
cache_path:
	e->cache_opens++;
	in->pt_streamed = 0; /* its reads say it now (Streams) */
	if (in->pt_seen != in->pt_gen) {
		fi->keep_cache = 0;
		in->pt_seen = in->pt_gen;
	}
	return FS_PT_CACHE;
}

int fs_pt_open(fuse_req_t req, struct fs_inode *in, struct cfile *cf,
	       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct pt_ent *e;
	int how, stream, id = -1;

	if (!pt_live(fs))
		return FS_PT_NONE;
	fs_cred_daemon();
	stream = stream_ready(fs, in, cf, fi->flags);
	pthread_mutex_lock(&pt.lock);
	e = ent_get(in->dev, in->ino);
	if (!e) {
		pthread_mutex_unlock(&pt.lock);
		return -ENOMEM;
	}
	how = decide(req, fs, in, cf, fi, e, stream, &id);
	/* the invariant: never both kinds; nothing cached beside passthrough */
	assert(!(e->pt_opens && e->cache_opens));
	assert(how != FS_PT_KERNEL ||
	       (cache_file_outside(fs->cache, cf) & CACHE_OUT_EMPTY));
	if (how == FS_PT_KERNEL)
		pt.n_kernel++;
	else if (how == FS_PT_CACHE)
		pt.n_cache++;
	if (how < 0)
		ent_put(e);
	pthread_mutex_unlock(&pt.lock);
	if (how == FS_PT_KERNEL) {
		proto_open_passthrough(id);
		fi->direct_io = 0;
		fi->keep_cache = 0;
	}
	return how;
}

void fs_pt_release(struct fs *fs, struct fs_inode *in, struct cfile *cf,
		   int how)
{
	struct pt_ent *e;
	uint32_t id;

	if (how == FS_PT_NONE)
		return;
	fs_cred_daemon();
	pthread_mutex_lock(&pt.lock);
	e = *ent_slot(in->dev, in->ino);
	assert(e);
	if (how == FS_PT_CACHE) {
		assert(e->cache_opens > 0);
		e->cache_opens--;
	} else if (!--e->pt_opens) {
		/* the last: the cache was kept out all along */
		assert(cache_file_outside(fs->cache, cf) & CACHE_OUT_EMPTY);
		id = e->backing_id;
		/* under pt.lock: a new open registers a new backing after
		 * this one is gone */
		if (ioctl(fuse_session_fd(fs->se), FUSE_DEV_IOC_BACKING_CLOSE,
			  &id))
			log_msg(LOG_WARNING,
				"fuse.passthrough: closing backing %u: %s", id,
				strerror(errno));
		e->backing_id = -1;
	}
	ent_put(e);
	pthread_mutex_unlock(&pt.lock);
	(void)cf;
}

int fs_pt_hold(dev_t dev, ino_t ino)
{
	struct pt_ent *e;
	int ret = 0;

	pthread_mutex_lock(&pt.lock);
	e = ent_get(dev, ino);
	if (!e)
		ret = -ENOMEM;
	else if (e->pt_opens)
		ret = -EBUSY;
	else
		e->cache_opens++;
	pthread_mutex_unlock(&pt.lock);
	return ret;
}

void fs_pt_unhold(dev_t dev, ino_t ino)
{
	struct pt_ent *e;

	pthread_mutex_lock(&pt.lock);
	e = *ent_slot(dev, ino);
	assert(e && e->cache_opens > 0);
	e->cache_opens--;
	ent_put(e);
	pthread_mutex_unlock(&pt.lock);
}

int fs_pt_stats(char *buf, size_t len)
{
	uint64_t k, c, b, f, st;
	int n = 0, i;
	struct pt_ent *e;

	pthread_mutex_lock(&pt.lock);
	k = pt.n_kernel;
	c = pt.n_cache;
	b = pt.n_backings;
	f = pt.n_fallback;
	st = pt.n_streams;
	for (i = 0; i < PT_BUCKETS; i++)
		for (e = pt.tab[i]; e; e = e->next)
			n += e->pt_opens > 0;
	pthread_mutex_unlock(&pt.lock);
	return snprintf(buf, len,
			"passthrough: %s; opens %llu passthrough, %llu cache; "
			"backings %llu (%llu of streams), %d open now; "
			"fallbacks %llu",
			!proto_passthrough() ? "off"
			: __atomic_load_n(&pt.refused_gen, __ATOMIC_RELAXED)
				? "refused"
				: "on",
			(unsigned long long)k, (unsigned long long)c,
			(unsigned long long)b, (unsigned long long)st, n,
			(unsigned long long)f);
}
