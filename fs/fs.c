/* fs: FUSE low-level operations: attributes, opens and creates, and the data
 * requests through the cache; the ops table (the namespace: names.c,
 * directories: dir.c, extended attributes: xattr.c). */
#define _GNU_SOURCE
#include "fs.h"
#include "aio.h"
#include "claim.h"
#include "cred.h"
#include "killpriv.h"
#include "kinval.h"
#include "passthru.h"
#include "proto.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>

/*
 * Inodes are the backing directory's: each known inode holds an O_PATH
 * descriptor and is found by (st_dev, st_ino), so hard links share one inode
 * and one cache object.  Every handler returns through one reply with a
 * positive errno: the -errno convention of the rest of the code is converted
 * here, at the FUSE boundary, and nowhere else.
 */

struct fs_fh {
	struct cfile *cf;
	int flags;
	fuse_ino_t ino;
	int kdio; /* the kernel opened it FOPEN_DIRECT_IO (kinval.c) */
	uint64_t kdrop; /* without it: what its open took for seen */
	int kfd; /* for the kill checks of its writes (killpriv.c), or -1 */
	int wfd; /* for its writes' claims of store space (claim.c), or -1 */
	struct fs_caller opener; /* who opened it for writing (claims of the
				  * kernel's writeback), if ogroups or
				  * opener_known */
	gid_t *ogroups;
	int opener_known;
	int pt; /* how it is served (FS_PT_*, passthru.c) */
};

/*
 * POSIX ACLs: the kernel evaluates them (default_permissions), reading them
 * through getxattr, and leaves the umask to the daemon (a parent's default
 * ACL replaces it), which creates as the caller with the caller's umask
 * (cred.c), so the store applies both as it would.
 */
static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	fs_cred_daemon();
	proto_conn(conn);
	if ((conn->capable & FUSE_CAP_POSIX_ACL) &&
	    (conn->capable & FUSE_CAP_DONT_MASK))
		conn->want |= FUSE_CAP_POSIX_ACL | FUSE_CAP_DONT_MASK;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	int ret = fs_lookup(fs_of(req), req, parent, name, &e);

	if (ret == -ENOENT) {
		/* a negative entry, kept as long as fuse.negative_timeout
		 * says: other nodes may make the name meanwhile */
		e.ino = 0;
		e.entry_timeout = fs_of(req)->neg_timeout;
		fuse_reply_entry(req, &e);
		return;
	}
	fs_reply_entry(req, ret, &e);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n)
{
	fs_inode_forget(fs_of(req), fs_inode_of(fs_of(req), ino), n);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count,
			    struct fuse_forget_data *f)
{
	size_t i;

	for (i = 0; i < count; i++)
		fs_inode_forget(fs_of(req), fs_inode_of(fs_of(req), f[i].ino),
				f[i].nlookup);
	fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *in = fs_inode_of(fs, ino);
	struct stat st;
	int fd = fs_inode_fd(fs, in), ret = fd < 0 ? fd : fs_stat(fs, fd, &st);

	fs_inode_fd_put(in, fd);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, &st, fs->timeout);
}

/* The cache's object for a regular file's inode. */
static int inode_cfile(struct fs *fs, struct fs_inode *in, struct cfile **cf)
{
	int fd = fs_inode_fd(fs, in), ret;

	assert(!fs_cred_as_caller());
	if (fd < 0)
		return fd;
	ret = cache_file_get(fs->cache, fd, cf);
	fs_inode_fd_put(in, fd);
	return ret;
}

int fs_with_cfile(struct fs *fs, struct fs_inode *in, struct fuse_file_info *fi,
		  struct cfile **cf, int *got)
{
	*got = 0;
	if (fi && fi->fh) {
		*cf = ((struct fs_fh *)(uintptr_t)fi->fh)->cf;
		return 0;
	}
	*got = 1;
	return inode_cfile(fs, in, cf);
}

/* May req's caller have access (R_OK, W_OK) to the inode held as fd?  The
 * store answers, with the caller's groups and its ACLs. */
int fs_access_as(fuse_req_t req, int fd, int mode)
{
	int ret = fs_cred_enter(req);

	if (ret)
		return ret;
	ret = faccessat(fd, "", mode, AT_EACCESS | AT_EMPTY_PATH) ? -errno : 0;
	fs_cred_leave();
	fs_cred_daemon();
	return ret;
}


/*
 * Close-to-open: the file is checked against the store before the open
 * returns.  Changed elsewhere, the cache dropped its clean data, and the
 * kernel drops its own: its attributes now (only them: pages are not
 * invalidated from inside a request, which may hold them), its page cache
 * when the open's reply says not to keep it.  A new cache object does not
 * know what the kernel may hold from before: its attributes and pages go
 * too.  A file just created through the mount (created) is not notified:
 * the kernel knows no inode for it yet, or one of a removed file whose
 * number the store gave again, and either way the create's reply brings
 * the new file's attributes after this, and its open does not keep pages
 * (the notification was a system call per create answered with ENOENT).
 */
static int open_revalidate(struct fs *fs, fuse_ino_t ino, struct cfile *cf,
			   const struct stat *st, struct fuse_file_info *fi,
			   int created)
{
	int changed, ret = cache_file_revalidate(fs->cache, cf, st, &changed);

	if (ret)
		return ret;
	fi->keep_cache = changed == COH_UNCHANGED;
	if (changed != COH_UNCHANGED)
		fs_claims_drop(fs_inode_of(fs, ino));
	if (changed != COH_UNCHANGED && fs->se && !created)
		fuse_lowlevel_notify_inval_inode(fs->se, ino, -1, 0);
	return 0;
}

/* The open of ino, whose cache object is cf (referenced; the handle takes
 * it) and whose backing file looked like *st; created: by this request. */
/* Who opened fh for writing, kept for the claims of the kernel's writeback
 * of its shared mappings, which come without a caller. */
static int fh_keep_opener(fuse_req_t req, struct fs_fh *fh)
{
	gid_t *heap;
	int ret = fs_cred_caller(req, &fh->opener, &heap);

	if (ret)
		return ret;
	if (fh->opener.ngroups) {
		fh->ogroups = heap ? heap
				   : malloc(fh->opener.ngroups * sizeof(gid_t));
		if (!fh->ogroups)
			return -ENOMEM;
		if (!heap)
			memcpy(fh->ogroups, fh->opener.groups,
			       fh->opener.ngroups * sizeof(gid_t));
		fh->opener.groups = fh->ogroups;
	}
	fh->opener.umask = 0;
	fh->opener_known = 1;
	return 0;
}

static int open_fh_cf(fuse_req_t req, fuse_ino_t ino, struct cfile *cf,
		      const struct stat *st, struct fuse_file_info *fi,
		      int created)
{
	struct fs *fs = fs_of(req);
	struct fs_fh *fh = calloc(1, sizeof(*fh));
	int ret;

	assert(!fs_cred_as_caller());
	if (!fh) {
		cache_file_put(fs->cache, cf);
		return -ENOMEM;
	}
	fh->cf = cf;
	fh->kfd = -1;
	fh->wfd = -1;
	ret = open_revalidate(fs, ino, fh->cf, st, fi, created);
	if (!ret) /* its [policy], by path and size before O_TRUNC */
		ret = cache_file_policy_match(fs->cache, fh->cf);
	if (ret) {
		cache_file_put(fs->cache, fh->cf);
		free(fh);
		return ret;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY &&
	    cache_file_readonly(fh->cf)) {
		cache_file_put(fs->cache, fh->cf);
		free(fh);
		return -EROFS;
	}
	if (fi->flags & O_TRUNC) {
		ret = cache_truncate(fs->cache, fh->cf, 0);
		if (ret) {
			cache_file_put(fs->cache, fh->cf);
			free(fh);
			return ret;
		}
		/* after the truncate: claims made before it are gone */
		fs_claims_drop(fs_inode_of(fs, ino));
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		ret = fh_keep_opener(req, fh);
		if (ret) {
			cache_file_put(fs->cache, fh->cf);
			free(fh->ogroups);
			free(fh);
			return ret;
		}
	}
	fh->flags = fi->flags;
	fh->ino = ino;
	fi->fh = (uintptr_t)fh;
	proto_open(fi);
	/* served by the kernel from the store, or through the cache */
	ret = fs_pt_open(req, fs_inode_of(fs, ino), fh->cf, fi);
	if (ret < 0) {
		cache_file_put(fs->cache, fh->cf);
		free(fh->ogroups);
		free(fh);
		return ret;
	}
	fh->pt = ret;
	cache_note_handle(fs->cache, 1, ret == FS_PT_KERNEL);
	/* a close that waits for nothing asks nothing (op_flush) */
	if (fs->cfg->on_close != ON_CLOSE_FLUSH ||
	    (fi->flags & O_ACCMODE) == O_RDONLY)
		fi->noflush = 1;
	fh->kdio = fi->direct_io;
	/* before the reply: a direct write that misses it is in the cache
	 * before this handle reads, and one before it is dropped (kinval.c);
	 * a passthrough handle sends no READ or WRITE */
	if (fh->pt != FS_PT_KERNEL && !fi->direct_io &&
	    kinval_open(&fs_inode_of(fs, ino)->kinval, &fh->kdrop))
		fi->keep_cache = 0;
	return 0;
}

/* The access an open's flags ask of the file. */
static int open_access(int flags)
{
	int acc = flags & O_ACCMODE;

	if (acc == O_RDONLY && (flags & OPEN_FLAG_EXEC))
		return X_OK;
	return (acc == O_RDONLY ? R_OK : acc == O_WRONLY ? W_OK : R_OK | W_OK) |
	       (flags & O_TRUNC ? W_OK : 0);
}

/* Slack for the clocks of the nodes that share the store (their ctimes). */
#define ATTR_CLOCK_SLACK_NS 1000000000ll

/*
 * May the kernel's check of an open have used attributes older than a
 * change of st's file?  It checks against what it cached, for up to
 * fuse.attr_timeout; any change of mode, owner or ACL (on any node) sets
 * ctime.  So a file whose ctime is within that long of now (or ahead of
 * it: another node's clock) may have had its access taken away since.
 */
static int attrs_may_be_stale(struct fs *fs, const struct stat *st)
{
	struct timespec now;
	int64_t age;

	if (!fs->cfg->attr_timeout_ms)
		return 0; /* the kernel fetched them for this check */
	clock_gettime(CLOCK_REALTIME, &now);
	age = (int64_t)(now.tv_sec - st->st_ctim.tv_sec) * 1000000000ll +
	      (now.tv_nsec - st->st_ctim.tv_nsec);
	return age < (int64_t)fs->cfg->attr_timeout_ms * 1000000ll +
			     ATTR_CLOCK_SLACK_NS;
}

/*
 * The open of an existing file.  The kernel checked the open already
 * (default_permissions, with the caller's capabilities), against the
 * attributes it cached.  The store says whether the caller may, as the
 * caller, where that check may not hold: an O_CREAT open of a name the
 * kernel did not know, which the daemon found made meanwhile (on the store,
 * by another node: check), and a file whose attributes changed within
 * fuse.attr_timeout (a chmod on another node, PRODUCT.md §5).
 */
static int open_fh(fuse_req_t req, struct fs_inode *in, fuse_ino_t ino,
		   struct fuse_file_info *fi, int check)
{
	struct fs *fs = fs_of(req);
	struct cfile *cf;
	struct stat st;
	int fd, ret = 0;

	fd = fs_inode_fd(fs, in);
	if (fd < 0)
		return fd;
	/* before a truncate's kill of set-ID bits (which sets ctime) */
	if (!check && (fi->flags & O_TRUNC) && proto_open_kill()) {
		ret = fstat(fd, &st) ? -errno : 0;
		check = !ret && attrs_may_be_stale(fs, &st);
	}
	if (!ret && check)
		ret = fs_access_as(req, fd, open_access(fi->flags));
	/* an existing file opened with O_TRUNC by a caller without
	 * CAP_FSETID (a file create_entry made is not truncated) */
	if (!ret && (fi->flags & O_TRUNC) && proto_open_kill())
		ret = fs_kill_privs(fs, ino, in);
	if (!ret)
		ret = cache_file_get_st(fs->cache, fd, &cf, &st);
	if (!ret && !check && attrs_may_be_stale(fs, &st)) {
		ret = fs_access_as(req, fd, open_access(fi->flags));
		if (ret)
			cache_file_put(fs->cache, cf);
	}
	fs_inode_fd_put(in, fd);
	return ret ? ret : open_fh_cf(req, ino, cf, &st, fi, 0);
}

static void fh_free(struct fs *fs, struct fs_fh *fh);

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	int ret = open_fh(req, fs_inode_of(fs, ino), ino, fi, 0);

	if (ret)
		fuse_reply_err(req, -ret);
	else if (fuse_reply_open(req, fi) == -ENOENT)
		/* interrupted: the kernel has no file, and sends no RELEASE
		 * (its passthrough and cache-path counts, passthru.c) */
		fh_free(fs, (struct fs_fh *)(uintptr_t)fi->fh);
}

/*
 * The attributes of a file just created through fd, as the create's reply
 * left them with the backing file system: a FUSE or NFS client has them
 * already, and asking its servers again costs a round trip.
 */
static int created_stat(int fd, struct stat *st)
{
	struct statx x;

	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_BASIC_STATS,
		  &x))
		return -errno;
	if ((x.stx_mask & STATX_BASIC_STATS) != STATX_BASIC_STATS)
		return fstat(fd, st) ? -errno : 0;
	memset(st, 0, sizeof(*st));
	st->st_dev = makedev(x.stx_dev_major, x.stx_dev_minor);
	st->st_ino = x.stx_ino;
	st->st_mode = x.stx_mode;
	st->st_nlink = x.stx_nlink;
	st->st_uid = x.stx_uid;
	st->st_gid = x.stx_gid;
	st->st_rdev = makedev(x.stx_rdev_major, x.stx_rdev_minor);
	st->st_size = x.stx_size;
	st->st_blksize = x.stx_blksize;
	st->st_blocks = x.stx_blocks;
	st->st_atim.tv_sec = x.stx_atime.tv_sec;
	st->st_atim.tv_nsec = x.stx_atime.tv_nsec;
	st->st_mtim.tv_sec = x.stx_mtime.tv_sec;
	st->st_mtim.tv_nsec = x.stx_mtime.tv_nsec;
	st->st_ctim.tv_sec = x.stx_ctime.tv_sec;
	st->st_ctim.tv_nsec = x.stx_ctime.tv_nsec;
	return 0;
}

/*
 * An existing name is opened as it is (*rwfd = -1).  A new file is made by
 * the caller, open for reading and writing: that descriptor goes to the
 * cache (*rwfd, with the file's attributes in *st), and an O_PATH one to the
 * inode table.
 */
static int create_entry(fuse_req_t req, fuse_ino_t parent, const char *name,
			mode_t mode, int excl, struct fuse_entry_param *e,
			int *rwfd, struct stat *st)
{
	struct fs *fs = fs_of(req);
	int pfd = fs_inode_of(fs, parent)->fd, fd, pathfd, ret;
	char path[64];

	*rwfd = -1;
	if (fs_name_reserved(name))
		return -EPERM;
	ret = fs_cred_enter(req);
	if (ret)
		return ret;
	fd = openat(pfd, name,
		    O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC,
		    mode & 07777);
	ret = fd < 0 ? -errno : 0;
	fs_cred_leave();
	/* made already: opened as it is, if the caller may (open_fh) */
	if (ret == -EEXIST && !excl)
		return fs_lookup(fs, req, parent, name, e);
	if (ret)
		return ret;
	ret = created_stat(fd, st);
	if (ret)
		goto err_close;
	fs_proc_path(fd, path, sizeof(path));
	pathfd = open(path, O_PATH | O_CLOEXEC);
	if (pathfd < 0) {
		ret = -errno;
		goto err_close;
	}
	ret = fs_entry_of_fd_st(fs, pathfd, st, e);
	if (ret)
		goto err_close;
	*rwfd = fd;
	return 0;
err_close:
	close(fd);
	return ret;
}

/*
 * The open of a file create_entry made: its descriptor rwfd goes to the
 * cache's new object (which takes it, or closes it).  rwfd is all the cache
 * needs of the file (its handle, its data): the inode's O_PATH descriptor,
 * which the inode table has just traded for the file's handle, is not opened
 * again by handle for it.
 */
static int open_fh_new(fuse_req_t req, fuse_ino_t ino, int rwfd,
		       const struct stat *st, struct fuse_file_info *fi)
{
	struct cfile *cf;
	int ret = cache_file_get_new(fs_of(req)->cache, -1, rwfd, st, &cf);

	return ret ? ret : open_fh_cf(req, ino, cf, st, fi, 1);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name,
		      mode_t mode, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fuse_entry_param e;
	struct stat st;
	int ret, rwfd;

	ret = create_entry(req, parent, name, mode, fi->flags & O_EXCL, &e,
			   &rwfd, &st);
	/* made as the caller (TIMED_CALLER); the cache's part is the daemon's */
	fs_cred_daemon();
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	if (!S_ISREG(e.attr.st_mode)) {
		fs_inode_forget(fs, fs_inode_of(fs, e.ino), 1);
		fuse_reply_err(req, S_ISDIR(e.attr.st_mode) ? EISDIR : EINVAL);
		return;
	}
	ret = rwfd < 0 ? open_fh(req, fs_inode_of(fs, e.ino), e.ino, fi, 1)
		       : open_fh_new(req, e.ino, rwfd, &st, fi);
	if (ret) {
		fs_inode_forget(fs, fs_inode_of(fs, e.ino), 1);
		fuse_reply_err(req, -ret);
		return;
	}
	if (fi->flags & O_TRUNC)
		e.attr.st_size = 0;
	if (fuse_reply_create(req, &e, fi) == -ENOENT)
		fh_free(fs, (struct fs_fh *)(uintptr_t)fi->fh);
}

#define READ_BUF (2u * 1024 * 1024 + 2 * 4096)
static __thread void *read_buf;

/*
 * A worker or pool thread idle for a while (fs/loop.c): its buffers back,
 * and the allocator's free memory back to the system (its arenas keep what
 * requests freed, up to several MiB each, until trimmed).  Once per thread
 * and idle spell: off every request's path.
 */
void fs_thread_idle(void)
{
	fs_cred_daemon();
	free(read_buf);
	read_buf = NULL;
	fs_aio_idle();
	cache_thread_idle();
	malloc_trim(0);
}

enum fs_kind { FS_READ, FS_WRITE, FS_FSYNC, FS_META };
static void fs_done(struct cache *c, enum fs_kind kind, uint64_t t0);

/* A read on the calling thread, waiting for its I/O. */
static void read_sync(fuse_req_t req, void *fhp, const char *unused,
		      size_t size, off_t off, uint64_t t0, int flags)
{
	struct fs_fh *fh = fhp;
	struct cache *c = fs_of(req)->cache;
	char *data;
	size_t n;
	int ret;

	(void)unused;
	(void)flags;
	assert(!fs_cred_as_caller());
	if (!read_buf)
		read_buf = dev_alloc_buf(READ_BUF);
	if (!read_buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (size > READ_BUF - 2 * 4096 - 1024 * 1024)
		size = READ_BUF - 2 * 4096 - 1024 * 1024;
	ret = cache_read_defer(c, fh->cf, read_buf, size, off, &data, &n, 1);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_buf(req, data, n);
	/* the misses kept, off the reply's path (req is gone; read_buf is
	 * untouched until then) */
	cache_read_finish(c);
	fs_done(c, FS_READ, t0);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct fs_fh *fh = (struct fs_fh *)(uintptr_t)fi->fh;
	struct cache *c = fs_of(req)->cache;
	uint64_t t0 = cache_clock(c);

	fs_cred_daemon();
	if (fs_aio_rw(req, c, fh->cf, fh, NULL, size, off, t0, read_sync,
		      FS_RW_ASYNC))
		read_sync(req, fh, NULL, size, off, t0, 0);
}

/* A write on the calling thread; durable before its reply when synced. */
static void write_now(fuse_req_t req, struct fs_fh *fh, const char *buf,
		      size_t size, off_t off, uint64_t t0, int synced,
		      int flags)
{
	struct fs *fs = fs_of(req);
	int ret;

	assert(!fs_cred_as_caller());
	ret = cache_write(fs->cache, fh->cf, buf, size, off);
	if (!ret && synced)
		ret = cache_fsync(fs->cache, fh->cf);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fs_reply_write(req, fh, off, size, flags);
	fs_done(fs->cache, FS_WRITE, t0);
}

/*
 * A write is in the cache: its answer.  A write through a direct-I/O handle
 * (FS_RW_KINVAL) while buffered handles of the inode are open is answered
 * once the kernel has dropped the range from its page cache (kinval.c).
 */
void fs_reply_write(fuse_req_t req, void *fhp, off_t off, size_t n, int flags)
{
	struct fs_fh *fh = fhp;
	struct fs *fs = fs_of(req);

	if ((flags & FS_RW_KINVAL) && fs->se)
		kinval_reply_write(&fs_inode_of(fs, fh->ino)->kinval, req,
				   fh->ino, off, n);
	else
		fuse_reply_write(req, n);
}

static void write_sync(fuse_req_t req, void *fhp, const char *buf, size_t size,
		       off_t off, uint64_t t0, int flags)
{
	struct fs_fh *fh = fhp;

	write_now(req, fh, buf, size, off, t0,
		  !!(fh->flags & (O_SYNC | O_DSYNC)), flags);
}

/* A write whose own flags ask for O_DSYNC or O_SYNC (below). */
static void write_synced(fuse_req_t req, void *fhp, const char *buf,
			 size_t size, off_t off, uint64_t t0, int flags)
{
	write_now(req, fhp, buf, size, off, t0, 1, flags);
}

/* A write's claim of store space, as its caller, or as the handle's opener
 * for the kernel's writeback of a shared mapping (no caller). */
static int write_claim(fuse_req_t req, struct fs_fh *fh,
		       struct fuse_file_info *fi, fuse_ino_t ino, size_t size,
		       off_t off)
{
	struct fs *fs = fs_of(req);
	struct fs_caller who;
	gid_t *heap;
	int ret;

	if (fi->writepage)
		return fh->opener_known
			       ? fs_claim(fs, &fh->opener, fs_inode_of(fs, ino),
					  fh->cf, &fh->wfd, off, size)
			       : 0;
	ret = fs_cred_caller(req, &who, &heap);
	if (!ret)
		ret = fs_claim(fs, &who, fs_inode_of(fs, ino), fh->cf,
			       &fh->wfd, off, size);
	free(heap);
	return ret;
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
		     size_t size, off_t off, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_fh *fh = (struct fs_fh *)(uintptr_t)fi->fh;
	struct cache *c = fs->cache;
	uint64_t t0 = cache_clock(c);
	/* not the kernel's writeback of a shared mapping: it holds the pages
	 * under writeback until answered (kinval.c) */
	int kinval = fh->kdio && !fi->writepage ? FS_RW_KINVAL : 0;
	int ret;

	fs_cred_daemon();
	/* a writer without CAP_FSETID (FUSE_HANDLE_KILLPRIV_V2, direct io):
	 * on the thread that read the request (proto.c) */
	if (proto_write_kill()) {
		ret = fs_kill_privs_fh(fs, ino, fs_inode_of(fs, ino), &fh->kfd);
		if (ret) {
			fuse_reply_err(req, -ret);
			fs_done(c, FS_WRITE, t0);
			return;
		}
	}
	/* the store's space for it, as the caller: refused now (EDQUOT,
	 * ENOSPC) as the store would, never at destage */
	ret = write_claim(req, fh, fi, ino, size, off);
	if (ret) {
		fuse_reply_err(req, -ret);
		fs_done(c, FS_WRITE, t0);
		return;
	}
	/*
	 * An O_SYNC write waits for a flush: synchronous.  Its flags are the
	 * write's own (fi->flags): for a direct-I/O file the kernel sends no
	 * FSYNC after a write with RWF_DSYNC or RWF_SYNC, or any write on a
	 * sync mount, and says so there; the open's flags (fh->flags) say it
	 * for the page cache's writes.
	 */
	if ((fh->flags | fi->flags) & (O_SYNC | O_DSYNC)) {
		if (fs_aio_rw(req, c, fh->cf, fh, buf, size, off, t0,
			      write_synced, kinval))
			write_synced(req, fh, buf, size, off, t0, kinval);
		return;
	}
	if (fs_aio_rw(req, c, fh->cf, fh, buf, size, off, t0, write_sync,
		      FS_RW_ASYNC | kinval))
		write_sync(req, fh, buf, size, off, t0, kinval);
}

/*
 * close(2) waits for FLUSH (RELEASE comes later, unwaited).  With
 * destage.on_close = flush, the close of a descriptor open for writing
 * returns once the file's data written so far is on the store, durably, for
 * an open on another node; a failure is close's error, and the data stays
 * dirty and is destaged later.  A reader's close does not wait.
 *
 * With destage.on_close = none a close has nothing to wait for: the open
 * replies say so (FOPEN_NOFLUSH, open_fh_cf), and a FLUSH that comes all
 * the same is answered ENOSYS, after which the kernel sends none again.
 * A reader's open says it too with on_close = flush.  That is why on_close
 * is fixed while mounted.
 */
static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_fh *fh = (struct fs_fh *)(uintptr_t)fi->fh;
	int ret = 0;

	if (fs->cfg->on_close != ON_CLOSE_FLUSH) {
		ret = -ENOSYS;
	} else if ((fh->flags & O_ACCMODE) != O_RDONLY) {
		if (fh->pt == FS_PT_KERNEL) /* its writes are the store's */
			cache_file_written_outside(fh->cf);
		ret = cache_file_flush(fs->cache, fh->cf);
	}
	fuse_reply_err(req, -ret);
}

/* The end of a handle: what its open took, given back. */
static void fh_free(struct fs *fs, struct fs_fh *fh)
{
	fs_cred_daemon();
	if (!fh->kdio && fh->pt != FS_PT_KERNEL)
		kinval_release(&fs_inode_of(fs, fh->ino)->kinval, fh->kdrop);
	fs_pt_release(fs, fs_inode_of(fs, fh->ino), fh->cf, fh->pt);
	cache_note_handle(fs->cache, -1, fh->pt == FS_PT_KERNEL);
	cache_file_put(fs->cache, fh->cf);
	if (fh->kfd >= 0)
		close(fh->kfd);
	if (fh->wfd >= 0)
		close(fh->wfd);
	free(fh->ogroups);
	free(fh);
}

static void op_release(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	fh_free(fs_of(req), (struct fs_fh *)(uintptr_t)fi->fh);
	fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
		     struct fuse_file_info *fi)
{
	struct fs_fh *fh = (struct fs_fh *)(uintptr_t)fi->fh;
	int ret;

	/* the kernel wrote the store's file itself: whatever the file's mode
	 * (a writeback file passed through as a stream, or renamed), only its
	 * fsync makes those writes durable, whichever passthrough open of the
	 * file asks (a reader's fsync covers a writer's writes too) */
	if (fh->pt == FS_PT_KERNEL)
		cache_file_written_outside(fh->cf);
	ret = cache_fsync(fs_of(req)->cache, fh->cf);
	fuse_reply_err(req, -ret);
}

/*
 * fallocate: the kernel leaves the set-ID bits to the daemon
 * (FUSE_HANDLE_KILLPRIV_V2) and says nothing of the caller's CAP_FSETID,
 * which the daemon reads (cred.c): a caller without it loses them, as with
 * a write.  Space it allocates is claimed as the caller first (quotas); so
 * is a hole punched inside the file, which is written as zeros through the
 * cache.
 */
static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off,
			 off_t len, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_fh *fh = (struct fs_fh *)(uintptr_t)fi->fh;
	struct fs_inode *in = fs_inode_of(fs, ino);
	uint64_t size, end = off + len;
	struct fs_caller who;
	gid_t *heap;
	int ret = fs_cred_caller(req, &who, &heap);

	if (!ret && !fs_cred_has(&who, CAP_FSETID))
		ret = fs_kill_privs_fh(fs, ino, in, &fh->kfd);
	/* a punched hole is written as zeros, inside the file: claimed too */
	if (!ret && (mode & FALLOC_FL_PUNCH_HOLE) &&
	    !cache_file_attr(fs->cache, in->dev, in->ino, &size, NULL))
		end = end < size ? end : size;
	if (!ret && end > (uint64_t)off)
		ret = fs_claim(fs, &who, in, fh->cf, &fh->wfd, off, end - off);
	free(heap);
	if (!ret)
		ret = cache_fallocate(fs->cache, fh->cf, mode, off, len);
	fuse_reply_err(req, -ret);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv;

	if (fstatvfs(fs_of(req)->root.fd, &sv))
		fuse_reply_err(req, errno);
	else
		fuse_reply_statfs(req, &sv);
}


/*
 * Every request the application waits for is timed from its arrival to the
 * return of its reply: reads, writes, fsyncs and everything else as
 * "metadata".  forget and release are not counted (nobody waits for them).
 * The request is gone once replied to, so the cache is looked up first.
 */
static void fs_done(struct cache *c, enum fs_kind kind, uint64_t t0)
{
	static const enum stat_lat lat[] = { STAT_L_read, STAT_L_write,
					     STAT_L_fsync, STAT_L_meta };

	/* reads and writes are counted by the cache, which sees them */
	if (kind == FS_FSYNC)
		cache_count(c, STAT_C_fsync_ops, 1);
	else if (kind == FS_META)
		cache_count(c, STAT_C_meta_ops, 1);
	cache_note_latency(c, lat[kind], t0);
}

/*
 * A handler runs with the daemon's credentials (TIMED: they are taken back
 * first, from a thread's last caller, fs/cred.c), but for those whose every
 * step is a store operation made as the caller or one that depends on no
 * credentials (an fstat of a descriptor, the inode table, the cache's
 * attributes in memory): TIMED_CALLER, which leave the thread as the caller
 * for the next request of the same caller.  A TIMED_CALLER handler that
 * goes on into the cache takes the daemon's credentials back first.
 */
#define TIMED_AS(name, kind, params, args, daemon)   \
	static void timed_##name params              \
	{                                            \
		struct cache *c = fs_of(req)->cache; \
		uint64_t t0 = cache_clock(c);        \
                                                     \
		if (daemon)                          \
			fs_cred_daemon();            \
		op_##name args;                      \
		fs_done(c, FS_##kind, t0);           \
	}
#define TIMED(name, kind, params, args) TIMED_AS(name, kind, params, args, 1)
#define TIMED_CALLER(name, kind, params, args) \
	TIMED_AS(name, kind, params, args, 0)

TIMED_CALLER(lookup, META, (fuse_req_t req, fuse_ino_t parent, const char *name),
      (req, parent, name))
TIMED_CALLER(getattr, META,
      (fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi),
      (req, ino, fi))
TIMED(setattr, META,
      (fuse_req_t req, fuse_ino_t ino, struct stat *attr, int valid,
       struct fuse_file_info *fi),
      (req, ino, attr, valid, fi))
TIMED(readlink, META, (fuse_req_t req, fuse_ino_t ino), (req, ino))
TIMED_CALLER(mknod, META,
      (fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
       dev_t rdev),
      (req, parent, name, mode, rdev))
TIMED_CALLER(mkdir, META,
      (fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode),
      (req, parent, name, mode))
TIMED_CALLER(symlink, META,
      (fuse_req_t req, const char *link, fuse_ino_t parent, const char *name),
      (req, link, parent, name))
TIMED(link, META,
      (fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char *name),
      (req, ino, parent, name))
TIMED(unlink, META, (fuse_req_t req, fuse_ino_t parent, const char *name),
      (req, parent, name))
TIMED_CALLER(rmdir, META, (fuse_req_t req, fuse_ino_t parent, const char *name),
      (req, parent, name))
TIMED(rename, META,
      (fuse_req_t req, fuse_ino_t parent, const char *name,
       fuse_ino_t newparent, const char *newname, unsigned int flags),
      (req, parent, name, newparent, newname, flags))
TIMED(open, META, (fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi),
      (req, ino, fi))
TIMED_CALLER(create, META,
      (fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
       struct fuse_file_info *fi),
      (req, parent, name, mode, fi))
TIMED(flush, META, (fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi),
      (req, ino, fi))
TIMED(fsync, FSYNC,
      (fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi),
      (req, ino, datasync, fi))
TIMED(fallocate, META,
      (fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
       struct fuse_file_info *fi),
      (req, ino, mode, off, len, fi))
TIMED_CALLER(opendir, META,
      (fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi),
      (req, ino, fi))
TIMED_CALLER(readdir, META,
      (fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
       struct fuse_file_info *fi),
      (req, ino, size, off, fi))
TIMED_CALLER(readdirplus, META,
      (fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
       struct fuse_file_info *fi),
      (req, ino, size, off, fi))
TIMED(fsyncdir, FSYNC,
      (fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi),
      (req, ino, datasync, fi))
TIMED_CALLER(statfs, META, (fuse_req_t req, fuse_ino_t ino), (req, ino))
TIMED(setxattr, META,
      (fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
       size_t size, int flags),
      (req, ino, name, value, size, flags))
TIMED_CALLER(getxattr, META,
      (fuse_req_t req, fuse_ino_t ino, const char *name, size_t size),
      (req, ino, name, size))
TIMED_CALLER(listxattr, META, (fuse_req_t req, fuse_ino_t ino, size_t size),
      (req, ino, size))
TIMED(removexattr, META, (fuse_req_t req, fuse_ino_t ino, const char *name),
      (req, ino, name))

const struct fuse_lowlevel_ops fs_ops = {
	.init = op_init,
	.lookup = timed_lookup,
	.forget = op_forget,
	.forget_multi = op_forget_multi,
	.getattr = timed_getattr,
	.setattr = timed_setattr,
	.readlink = timed_readlink,
	.mknod = timed_mknod,
	.mkdir = timed_mkdir,
	.symlink = timed_symlink,
	.link = timed_link,
	.unlink = timed_unlink,
	.rmdir = timed_rmdir,
	.rename = timed_rename,
	.open = timed_open,
	.create = timed_create,
	.read = op_read, /* timed where they end */
	.write = op_write,
	.flush = timed_flush,
	.release = op_release,
	.fsync = timed_fsync,
	.fallocate = timed_fallocate,
	.opendir = timed_opendir,
	.readdir = timed_readdir,
	.readdirplus = timed_readdirplus,
	.releasedir = op_releasedir,
	.fsyncdir = timed_fsyncdir,
	.statfs = timed_statfs,
	.setxattr = timed_setxattr,
	.getxattr = timed_getxattr,
	.listxattr = timed_listxattr,
	.removexattr = timed_removexattr,
};
