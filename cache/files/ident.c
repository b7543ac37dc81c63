/* cache: backing-file identity — kernel file handles where proven stable,
 * else a path and an identity stamp; the probe at mount that decides. */
#define _GNU_SOURCE
#include "files_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>

/*
 * How the cache finds a backing file again (after its descriptor was closed,
 * after a crash) and knows it is the same file.
 *
 * A kernel file handle names an inode with its generation, so a deleted and
 * recreated file never matches, and it follows renames.  But handles are
 * only as good as the file system behind them: a FUSE file system (GlusterFS,
 * MooseFS) opens a handle only while its client still caches the inode, and
 * GlusterFS's client puts a pointer in its handles and reuses it, so a stale
 * handle can open another file.  Handles are used only where a probe at
 * mount proves them: never on FUSE, at once on the local file systems that
 * are known to keep them (ext4, XFS, btrfs, tmpfs), and elsewhere only when
 * a probe file's handle reopens it after the kernel dropped its inode.
 *
 * Everywhere else a file is found by its path relative to the backing
 * directory, kept in its record and updated by renames through the mount.
 *
 * Either way, the file carries an identity stamp: 16 random bytes in an
 * extended attribute (trusted.nvcachefs.id where the store keeps trusted
 * attributes, else user.nvcachefs.id), set when the cache first keeps data
 * of the file and shared by every node that caches it.  Every open by handle
 * or by path is checked against the record: the stamp when the record has
 * one, else the inode number.  A file that does not match is not the file:
 * "not found", never "deleted", and its dirty data goes to lost+found.
 *
 * So the namespace must not change under the cache's feet: a probe that
 * fails (a full store, a quota, an error of a distributed store at mount)
 * would have every stamped file taken for lost.  What the probe finds is
 * recorded in the metadata headers (meta_hdr.probe), and a mount whose
 * probe fails goes on with the recorded result, degraded and logged; with
 * nothing recorded and dirty data of stamped files it is refused.  The
 * probe file's name is random (O_CREAT | O_EXCL | O_NOFOLLOW, again on
 * EEXIST), so that no user who may write the store's root can take it
 * first, and it is removed only while the name is still the probe file.
 */

#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

/* local file systems whose handles are stable (fs/magic.h values) */
static const unsigned long stable_fs[] = {
	0xEF53, /* ext2/3/4 */
	0x58465342, /* XFS */
	0x9123683E, /* btrfs */
	0x01021994, /* tmpfs */
};

static const char *const stamp_names[] = { "trusted.nvcachefs.id",
					   "user.nvcachefs.id" };

struct ident_handle {
	struct file_handle fh;
	uint8_t buf[META_HANDLE_MAX];
};

static int stamp_get(int fd, const char *name, uint8_t out[META_STAMP_LEN])
{
	ssize_t n = fgetxattr(fd, name, out, META_STAMP_LEN);
	char path[64];

	if (n < 0 && errno == EBADF) {
		/* an O_PATH descriptor */
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n = getxattr(path, name, out, META_STAMP_LEN);
	}
	if (n < 0)
		return -errno;
	return n == META_STAMP_LEN ? 0 : -EINVAL;
}

static int stamp_new(uint8_t out[META_STAMP_LEN])
{
	size_t got = 0;

	while (got < META_STAMP_LEN) {
		ssize_t n = getrandom(out + got, META_STAMP_LEN - got, 0);

		if (n < 0 && errno != EINTR)
			return -errno;
		got += n > 0 ? n : 0;
	}
	return 0;
}

static int stamp_none(const uint8_t s[META_STAMP_LEN])
{
	unsigned i;

	for (i = 0; i < META_STAMP_LEN; i++)
		if (s[i])
			return 0;
	return 1;
}

/* The attribute of a META_NS_* namespace; NULL for META_NS_NONE. */
static const char *ns_xattr(uint32_t ns)
{
	return ns == META_NS_TRUSTED ? stamp_names[0]
	       : ns == META_NS_USER  ? stamp_names[1]
				     : NULL;
}

/* Setting an attribute failed because the store does not keep it (or not
 * for this daemon), not because of the moment (ENOSPC, EDQUOT, EIO). */
static int xattr_unkept(int err)
{
	return err == ENOTSUP || err == EOPNOTSUPP || err == EPERM ||
	       err == EACCES || err == ENOSYS;
}

/*
 * Which attribute namespace the store keeps, tried on the probe file:
 * META_NS_TRUSTED, _USER or _NONE, or -errno when an attempt failed for
 * another reason than the store not keeping it: then the probe says
 * nothing.
 */
static int probe_stamp(int fd, uint8_t stamp[META_STAMP_LEN])
{
	unsigned i;
	int ret = stamp_new(stamp);

	if (ret)
		return ret;
	for (i = 0; i < sizeof(stamp_names) / sizeof(stamp_names[0]); i++) {
		uint8_t back[META_STAMP_LEN];

		if (fsetxattr(fd, stamp_names[i], stamp, META_STAMP_LEN, 0)) {
			if (!xattr_unkept(errno))
				return -errno;
			continue;
		}
		if (!stamp_get(fd, stamp_names[i], back) &&
		    !memcmp(back, stamp, META_STAMP_LEN))
			return META_NS_TRUSTED + i;
	}
	return META_NS_NONE;
}

static int fs_is_stable(unsigned long type)
{
	unsigned i;

	for (i = 0; i < sizeof(stable_fs) / sizeof(stable_fs[0]); i++)
		if (type == stable_fs[i])
			return 1;
	return 0;
}

/*
 * Does the probe file's handle reopen it once the kernel has dropped its
 * inode?  Unused dentries and inodes are dropped for that (drop_caches 2),
 * once, at mount, and only on a file system not known either way.  The
 * probe file is closed.
 */
static int probe_handle(struct cache *c, struct ident_handle *h, ino_t ino,
			unsigned long type, const char *xattr,
			const uint8_t stamp[META_STAMP_LEN])
{
	uint8_t back[META_STAMP_LEN];
	struct stat st;
	int fd, dc, ok;

	if (!fs_is_stable(type)) {
		dc = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
		ok = dc >= 0 && write(dc, "2", 1) == 1;
		if (dc >= 0)
			close(dc);
		if (!ok)
			return 0;
	}
	cache_may_block(c);
	fd = open_by_handle_at(c->backing_fd, &h->fh, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	cache_may_block(c);
	ok = !fstat(fd, &st) && st.st_ino == ino;
	if (ok && xattr)
		ok = !stamp_get(fd, xattr, back) &&
		     !memcmp(back, stamp, META_STAMP_LEN);
	close(fd);
	return ok;
}

/* Where the backing directory is, for paths relative to it. */
static int ident_root(struct cache *c)
{
	char link[64], buf[PATH_MAX];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", c->backing_fd);
	n = readlink(link, buf, sizeof(buf) - 1);
	if (n <= 0)
		return n < 0 ? -errno : -EINVAL;
	buf[n] = 0;
	if (n > 1 && buf[n - 1] == '/')
		buf[--n] = 0;
	c->root = strdup(n == 1 ? "" : buf);
	return c->root ? 0 : -ENOMEM;
}

/* The probe file, made under a name nobody can guess (in name): fd, or
 * -errno. */
#define PROBE_TRIES 16
static int probe_create(struct cache *c, char *name, size_t len)
{
	uint8_t r[META_STAMP_LEN];
	unsigned long long v;
	int k, fd = -EEXIST, ret;

	for (k = 0; k < PROBE_TRIES && fd == -EEXIST; k++) {
		ret = stamp_new(r);
		if (ret)
			return ret;
		memcpy(&v, r, sizeof(v));
		snprintf(name, len, ".nvcachefs-probe.%016llx", v);
		fd = ident_open_beneath(c->backing_fd, name,
					O_RDWR | O_CREAT | O_EXCL, 0600);
	}
	return fd;
}

/* The probe file goes, if its name is still the probe file (st). */
static void probe_remove(struct cache *c, const char *name,
			 const struct stat *st)
{
	struct stat at;

	cache_may_block(c);
	if (!fstatat(c->backing_fd, name, &at, AT_SYMLINK_NOFOLLOW) &&
	    at.st_dev == st->st_dev && at.st_ino == st->st_ino)
		unlinkat(c->backing_fd, name, 0);
}

/* The probe: what the store keeps, as meta_hdr.probe says it (*found),
 * or -errno when it cannot tell. */
static int ident_probe(struct cache *c, unsigned long type, uint32_t *found)
{
	uint8_t stamp[META_STAMP_LEN];
	struct ident_handle h;
	struct stat st;
	char name[64];
	int fd, mnt, ns, got_handle, handles;

	fd = probe_create(c, name, sizeof(name));
	if (fd < 0)
		return fd;
	ns = probe_stamp(fd, stamp);
	cache_may_block(c);
	if (fstat(fd, &st)) {
		/* without its inode number the name cannot be told to be the
		 * probe's still: it stays */
		ns = -errno;
		close(fd);
		log_msg(LOG_WARNING,
			"%s: the probe file %s cannot be checked (%s); it is "
			"left there",
			c->root, name, strerror(-ns));
		return ns;
	}
	if (ns < 0)
		goto remove_probe;
	c->own_uid = st.st_uid;
	h.fh.handle_bytes = META_HANDLE_MAX;
	got_handle = !name_to_handle_at(fd, "", &h.fh, &mnt, AT_EMPTY_PATH);
	close(fd);
	fd = -1;
	handles = got_handle && type != FUSE_SUPER_MAGIC &&
		  c->cfg->identity != IDENT_PATH &&
		  probe_handle(c, &h, st.st_ino, type, ns_xattr(ns), stamp);
	/* whole seconds (MooseFS): see coherence.c, look_unsettled_locked */
	*found = ns | (handles ? META_PROBE_HANDLES : 0) |
		 (!st.st_mtim.tv_nsec && !st.st_ctim.tv_nsec ? META_PROBE_COARSE
							     : 0);
remove_probe:
	if (fd >= 0)
		close(fd);
	probe_remove(c, name, &st);
	return ns < 0 ? ns : 0;
}

/* Times in whole seconds, as far as the backing directory tells without a
 * probe: unless its own times have nanoseconds. */
static uint32_t probe_coarse_guess(struct cache *c)
{
	struct stat st;

	cache_may_block(c);
	if (!fstat(c->backing_fd, &st) &&
	    (st.st_mtim.tv_nsec || st.st_ctim.tv_nsec))
		return 0;
	return META_PROBE_COARSE;
}

/*
 * What earlier mounts used, for a cache that does not record it (made by
 * a version before meta_hdr.probe): the namespace of the backing
 * directory's store stamp, if only one namespace holds one; else 0.
 * Nothing about handles (found by path); times as the directory shows.
 */
static uint32_t probe_legacy(struct cache *c)
{
	static const char *const names[] = { "trusted.nvcachefs.store",
					     "user.nvcachefs.store" };
	uint8_t s[META_STAMP_LEN];
	uint32_t ns = 0, i;

	for (i = 0; i < 2; i++) {
		if (stamp_get(c->backing_fd, names[i], s) || stamp_none(s))
			continue;
		if (ns)
			return 0;
		ns = META_NS_TRUSTED + i;
	}
	return ns ? ns | probe_coarse_guess(c) : 0;
}

static const char *ns_name(uint32_t probe)
{
	const char *x = ns_xattr(probe & META_PROBE_NS);

	return x ? x : "no attribute (inode only)";
}

/*
 * What the mount goes by: the probe's result when it has one (found, ret
 * 0), else what the headers recorded (rec), else no stamps.  Sets what is
 * to be recorded once the map is loaded, and why a stamped file might not
 * be checked (ident_store_check refuses the mount then, if it has dirty
 * data).
 */
static uint32_t probe_decide(struct cache *c, int ret, uint32_t found,
			     uint32_t rec, uint32_t legacy)
{
	uint32_t was = rec ? rec : legacy, now = found & META_PROBE_NS;

	c->probe_err = ret;
	if (ret && was) {
		log_msg(LOG_WARNING,
			"%s: the identity probe failed (%s): degraded, with "
			"what an earlier mount found (identity stamp in %s, "
			"files found by %s); no file is taken for lost for it",
			c->root, strerror(-ret), ns_name(was),
			was & META_PROBE_HANDLES ? "file handle" : "path");
		return was;
	}
	if (ret) {
		log_msg(LOG_WARNING,
			"%s: the identity probe failed (%s), and no earlier "
			"one is recorded: files are found by path, without "
			"identity stamps",
			c->root, strerror(-ret));
		c->probe_risk = "the identity probe failed, and the cache "
				"does not record which attribute its files "
				"are stamped with";
		return META_NS_NONE | probe_coarse_guess(c);
	}
	if (found != rec)
		c->probe_record = found;
	if (was && (was & META_PROBE_NS) != now &&
	    (was & META_PROBE_NS) != META_NS_NONE) {
		log_msg(LOG_WARNING,
			"%s: the identity stamps were in %s, and the store "
			"now keeps %s",
			c->root, ns_name(was), ns_name(found));
		c->probe_risk = "the store no longer keeps the attribute the "
				"cache's files are stamped with";
		c->probe_err = -ENOTSUP;
	} else if (!was && now == META_NS_NONE) {
		/* a cache made before the record, on a store that now keeps
		 * no attribute: its files may have been stamped */
		c->probe_risk = "the store keeps no identity attribute now, "
				"and the cache does not record whether its "
				"files were stamped";
		c->probe_err = -ENOTSUP;
	}
	return found;
}

static void ident_store(struct cache *c);

int ident_setup(struct cache *c)
{
	uint32_t found = 0, rec, use;
	struct statfs sfs;
	int ret, handles;

	c->own_uid = geteuid();
	ret = ident_root(c);
	if (ret)
		return ret;
	if (fstatfs(c->backing_fd, &sfs))
		return -errno;
	rec = meta_probe(&c->meta);
	ret = ident_probe(c, sfs.f_type, &found);
	use = probe_decide(c, ret, found, rec, rec ? 0 : probe_legacy(c));
	c->stamp_xattr = ns_xattr(use & META_PROBE_NS);
	c->coarse_times = !!(use & META_PROBE_COARSE);
	handles = (use & META_PROBE_HANDLES) && c->cfg->identity != IDENT_PATH;
	if (c->cfg->identity == IDENT_HANDLE && !handles) {
		log_msg(LOG_ERR,
			"backing.identity = handle, but the file handles of %s "
			"are not stable (file system type %#lx)",
			c->root, (unsigned long)sfs.f_type);
		return -ENOTSUP;
	}
	c->by_path = !handles;
	c->bk_fuse = sfs.f_type == FUSE_SUPER_MAGIC;
	ident_store(c);
	log_msg(LOG_INFO,
		"backing store %s (type %#lx): files are found by %s, identity "
		"stamp in %s%s",
		c->root, (unsigned long)sfs.f_type,
		c->by_path ? "path" : "file handle", ns_name(use),
		c->coarse_times ? "; times in whole seconds" : "");
	return 0;
}

/*
 * The store itself carries a stamp too, on the backing directory
 * (NAMESPACE.nvcachefs.store), and the metadata headers keep the one the
 * cache was last mounted on.  A cache mounted on another directory (the
 * store not mounted, and an empty directory in its place; the wrong volume)
 * would find none of its files: it would take them all for lost.  So a
 * different stamp is refused while the cache holds dirty data (recover.c),
 * and adopted when it holds none.
 */
static void ident_store(struct cache *c)
{
	char name[64];
	uint8_t s[META_STAMP_LEN], want[META_STAMP_LEN];

	if (!c->stamp_xattr)
		return;
	snprintf(name, sizeof(name), "%.*s.nvcachefs.store",
		 (int)(strchr(c->stamp_xattr, '.') - c->stamp_xattr),
		 c->stamp_xattr);
	if (stamp_get(c->backing_fd, name, s) || stamp_none(s)) {
		cache_may_block(c);
		if (stamp_new(s) ||
		    (fsetxattr(c->backing_fd, name, s, sizeof(s),
			       XATTR_CREATE) &&
		     (errno != EEXIST ||
		      stamp_get(c->backing_fd, name, s)))) {
			log_msg(LOG_WARNING,
				"%s: cannot stamp the backing directory (%s): "
				"a different store mounted there would not be "
				"noticed",
				c->root, strerror(errno));
			return;
		}
	}
	memcpy(c->store_stamp, s, sizeof(s));
	meta_store_stamp(&c->meta, want);
	c->store_foreign = !stamp_none(want) && memcmp(want, s, sizeof(s));
}

/* A record of a stamped file with dirty data, not deleted. */
static int stamped_dirty(struct cache *c)
{
	uint32_t r;

	for (r = 0; r < c->meta.nfiles; r++) {
		struct cfile *f = c->recs[r];

		if (f && f->ndirty && !f->unlinked && !stamp_none(f->stamp))
			return 1;
	}
	return 0;
}

/* After the map is loaded: refused if a stamped file's dirty data would be
 * taken for lost for want of the probe; else the probe's result recorded. */
static int ident_probe_check(struct cache *c, char *err, size_t errlen)
{
	int ret;

	if (c->probe_risk && stamped_dirty(c)) {
		snprintf(err, errlen,
			 "backing directory %s: %s (%s): every stamped file "
			 "would be taken for lost and its dirty data moved to "
			 "%s; refused.  Mount again once the store takes the "
			 "probe (space, quota, errors)",
			 c->root, c->probe_risk, strerror(-c->probe_err),
			 LOST_FOUND_DIR);
		return c->probe_err;
	}
	if (!c->probe_record)
		return 0;
	ret = meta_set_probe(&c->meta, c->probe_record);
	if (ret)
		log_msg(LOG_WARNING,
			"cannot record the identity probe's result in the "
			"metadata: %s",
			strerror(-ret));
	return 0;
}

/* After the map is loaded: the probe's result recorded (or the mount
 * refused: ident_probe_check); a foreign store is adopted, or refused when
 * dirty data would all be taken for lost. */
int ident_store_check(struct cache *c, char *err, size_t errlen)
{
	uint8_t want[META_STAMP_LEN];
	int ret = ident_probe_check(c, err, errlen);

	if (ret)
		return ret;
	if (stamp_none(c->store_stamp))
		return 0;
	if (c->store_foreign && c->ndirty_slots) {
		snprintf(err, errlen,
			 "backing directory %s is not the store this cache "
			 "holds dirty data for (its identity stamp differs): "
			 "is the store mounted?  Mount the right one there; "
			 "`nvcachectl format --force` would discard the "
			 "data",
			 c->root);
		return -EXDEV;
	}
	meta_store_stamp(&c->meta, want);
	if (!memcmp(want, c->store_stamp, sizeof(want)))
		return 0;
	if (c->store_foreign)
		log_msg(LOG_NOTICE,
			"backing directory %s is another store than the cache "
			"was last mounted on; nothing is dirty, so it is "
			"adopted",
			c->root);
	return meta_set_store_stamp(&c->meta, c->store_stamp);
}

int cache_handles_trusted(struct cache *c)
{
	return !c->by_path;
}

/* fd's path relative to the backing directory, or -errno. */
int ident_rel_path(struct cache *c, int fd, char *out, size_t len)
{
	char link[64], buf[PATH_MAX];
	size_t rl = strlen(c->root);
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, buf, sizeof(buf) - 1);
	if (n < 0)
		return -errno;
	buf[n] = 0;
	if (n > 10 && !strcmp(buf + n - 10, " (deleted)"))
		return -ENOENT;
	if (!strcmp(buf, c->root) || (!rl && !strcmp(buf, "/"))) {
		out[0] = 0; /* the backing directory itself */
		return 0;
	}
	if (strncmp(buf, c->root, rl) || buf[rl] != '/')
		return -EXDEV;
	if ((size_t)n - rl - 1 >= len)
		return -ENAMETOOLONG;
	memcpy(out, buf + rl + 1, n - rl);
	return 0;
}

/*
 * The stamp of f's backing file (f->fd open): the one it carries, or a new
 * one set now.  No attribute where the store keeps none: the inode number is
 * all there is.
 */
static void ident_stamp(struct cache *c, struct cfile *f)
{
	uint8_t s[META_STAMP_LEN];
	int ret, err;

	memset(f->stamp, 0, sizeof(f->stamp));
	if (!c->stamp_xattr)
		return;
	if (!f->created && !stamp_get(f->fd, c->stamp_xattr, s) &&
	    !stamp_none(s)) {
		memcpy(f->stamp, s, sizeof(s));
		return;
	}
	if (stamp_new(s))
		return;
	cache_may_block(c);
	coh_bk_begin(c, f); /* the new ctime is this node's own */
	ret = fsetxattr(f->fd, c->stamp_xattr, s, sizeof(s), XATTR_CREATE);
	err = errno;
	coh_bk_end(c, f);
	if (ret) {
		/* another node set it meanwhile: take theirs */
		if (err == EEXIST && !stamp_get(f->fd, c->stamp_xattr, s))
			memcpy(f->stamp, s, sizeof(s));
		return;
	}
	memcpy(f->stamp, s, sizeof(s));
}

int ident_note(struct cache *c, struct cfile *f, uint64_t *seqp)
{
	char path[META_PATH_MAX];
	uint64_t seq;
	int ret;

	if (f->fd < 0)
		return -EBADF;
	ident_stamp(c, f);
	do {
		seq = __atomic_load_n(&c->rename_seq, __ATOMIC_ACQUIRE);
		ret = ident_rel_path(c, f->fd, path, sizeof(path));
		if (ret && c->by_path) {
			log_msg(LOG_WARNING,
				"%s: cannot keep the path of a backing file "
				"(inode %llu): %s; it is not cached",
				c->cfg->backing_path, (unsigned long long)f->ino,
				strerror(-ret));
			return ret == -ENAMETOOLONG ? ret : -ENOENT;
		}
		free(f->path);
		f->path = ret ? NULL : strdup(path);
		if (!ret && !f->path)
			return -ENOMEM;
	} while (seq != __atomic_load_n(&c->rename_seq, __ATOMIC_ACQUIRE));
	if (seqp)
		*seqp = seq;
	return 0;
}

/* Is fd f's backing file?  0, or -ESTALE. */
int ident_verify(struct cache *c, struct cfile *f, int fd)
{
	uint8_t s[META_STAMP_LEN];
	struct stat st;

	cache_may_block(c);
	if (fstat(fd, &st))
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -ESTALE;
	if (!stamp_none(f->stamp))
		return c->stamp_xattr && !stamp_get(fd, c->stamp_xattr, s) &&
				       !memcmp(s, f->stamp, sizeof(s))
			       ? 0
			       : -ESTALE;
	return st.st_ino == f->ino ? 0 : -ESTALE;
}

int ident_open_beneath(int dirfd, const char *path, int flags, mode_t mode)
{
	struct open_how how = {
		.flags = flags | O_NOFOLLOW | O_CLOEXEC,
		/* openat2 refuses a mode it would not use */
		.mode = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE
				? mode
				: 0,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
			   RESOLVE_NO_MAGICLINKS,
	};
	long fd;

	/* Debian 12's glibc has no openat2() */
	fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	return fd < 0 ? -errno : (int)fd;
}

static int open_by_path(struct cache *c, struct cfile *f, int flags)
{
	if (!f->path)
		return -ESTALE;
	return ident_open_beneath(c->backing_fd, f->path, flags, 0);
}

static int open_by_handle(struct cache *c, struct cfile *f, int flags)
{
	struct ident_handle h;
	int fd;

	if (!f->hbytes)
		return -ESTALE;
	h.fh.handle_bytes = f->hbytes;
	h.fh.handle_type = f->htype;
	memcpy(h.fh.f_handle, f->handle, f->hbytes);
	cache_may_block(c);
	fd = open_by_handle_at(c->backing_fd, &h.fh, flags | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/*
 * Open f's backing file again, by handle or by path, and check that it is
 * f's file.  -ESTALE: it cannot be found (gone, renamed or recreated behind
 * the cache's back); other errors: it may be there but cannot be opened now.
 */
int ident_open(struct cache *c, struct cfile *f, int flags)
{
	int fd, ret;

	cache_blocking(c, "open");
	/* a record made while files were found by path has no handle */
	fd = c->by_path || !f->hbytes ? open_by_path(c, f, flags)
				      : open_by_handle(c, f, flags);
	if (fd == -ENOENT || fd == -ENOTDIR || fd == -ELOOP || fd == -EXDEV ||
	    fd == -ESTALE)
		return -ESTALE;
	if (fd < 0)
		return fd;
	ret = ident_verify(c, f, fd);
	if (ret) {
		close(fd);
		return ret;
	}
	return fd;
}

/*
 * A name was renamed through the mount: every file whose path is it, or is
 * below it, gets the new path, persisted.  rename_seq tells a record being
 * made meanwhile to look at its path again.
 */
void ident_renamed(struct cache *c, const char *from, const char *to)
{
	size_t fl = strlen(from), tl = strlen(to), n = 0, i, cap = 0;
	struct cfile **v = NULL, **nv;
	uint32_t r;

	__atomic_add_fetch(&c->rename_seq, 1, __ATOMIC_ACQ_REL);
	pthread_mutex_lock(&c->lock);
	for (r = 0; r < c->meta.nfiles; r++) {
		struct cfile *f = c->recs[r];

		if (!f || !f->path || strncmp(f->path, from, fl) ||
		    (f->path[fl] && f->path[fl] != '/'))
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			nv = realloc(v, cap * sizeof(*v));
			if (!nv)
				break;
			v = nv;
		}
		f->refs++;
		v[n++] = f;
	}
	cache_unlock(c);
	for (i = 0; i < n; i++) {
		struct cfile *f = v[i];
		char *p;

		pthread_mutex_lock(&f->rec_lock);
		if (f->path && !strncmp(f->path, from, fl) &&
		    (!f->path[fl] || f->path[fl] == '/') &&
		    tl + strlen(f->path + fl) < META_PATH_MAX &&
		    asprintf(&p, "%s%s", to, f->path + fl) >= 0) {
			free(f->path);
			f->path = p;
			if (f->rec && file_persist_record(c, f))
				log_msg(LOG_ERR,
					"cannot persist the new path %s", p);
		} else if (f->path) {
			log_msg(LOG_WARNING,
				"%s renamed to %s: the new path of %s is too "
				"long to keep; after a crash its dirty data "
				"would go to %s",
				from, to, f->path, LOST_FOUND_DIR);
		}
		pthread_mutex_unlock(&f->rec_lock);
	}
	pthread_mutex_lock(&c->lock);
	for (i = 0; i < n; i++)
		file_put_locked(c, v[i]);
	cache_unlock(c);
	free(v);
}

void cache_renamed(struct cache *c, int from_dir, const char *from_name,
		   int to_dir, const char *to_name)
{
	char a[META_PATH_MAX], b[META_PATH_MAX], *pa = NULL, *pb = NULL;

	if (ident_rel_path(c, from_dir, a, sizeof(a)) ||
	    ident_rel_path(c, to_dir, b, sizeof(b)))
		return;
	if (asprintf(&pa, "%s%s%s", a, a[0] ? "/" : "", from_name) < 0 ||
	    asprintf(&pb, "%s%s%s", b, b[0] ? "/" : "", to_name) < 0)
		goto out_free;
	ident_renamed(c, pa, pb);
out_free:
	free(pa);
	free(pb);
}
