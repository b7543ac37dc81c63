/* tools/bench: the FUSE floor, reads from RAM and drops writes, served as nvcachefs serves FUSE. */
#define FUSE_USE_VERSION 312
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "loop.h"
#include "proto.h"

/*
 * What the floor measures: the cost of FUSE itself on this machine, as
 * nvcachefs pays it.  Everything between /dev/fuse and the reply is the same
 * as in nvcachefs — the request loop (fs/loop.c, the same thread count), the
 * INIT settings (fs/fs.c op_init), the open replies (fs/fs.c open_fh_cf), the
 * mount options (fs/main.c add_mount_opts), the bdi read-ahead
 * (fs/main.c readahead_main) and the entry/attribute timeouts — and nothing
 * else happens: a read is answered from one shared RAM buffer, a write is
 * acknowledged and dropped.  Only the names and sizes are kept, so that fio
 * and the suite's metadata workload run unchanged.
 *
 * Protocol negotiation: when nvcachefs negotiates more than libfuse 3.14
 * asks for (fs/proto.c: FUSE_HANDLE_KILLPRIV_V2 in the INIT reply,
 * FOPEN_PARALLEL_DIRECT_WRITES in open replies, through
 * fuse_session_custom_io), the floor does the same: proto_attach in
 * main(), proto_init and proto_open in its ops.
 *
 * Extended attributes are answered as a file without any: nvcachefs
 * implements them, and the kernel asks for security.capability before
 * writes unless the daemon handles killpriv; a floor answering ENOSYS would
 * spare itself round trips nvcachefs pays (-X does just that: the A/B of
 * what FUSE_HANDLE_KILLPRIV_V2 would save).  -v prints, at exit, how many
 * requests of each kind came (to check what the protocol costs).
 *
 * Locking: one mutex for the name space (lookups, creates, unlinks, the
 * attributes of setattr); reads and writes take no lock (the size is read
 * and grown atomically).  Nodes stay alive while the kernel holds a lookup
 * on them (nlookup) or a name points at them.
 */

#define RAM_BYTES (1024 * 1024) /* the bytes every read returns */
#define HASH_BUCKETS 65536
#define TIMEOUT 1.0 /* fuse.attr_timeout's default: entries and attributes */

struct node {
	struct node *hnext; /* hash chain of (parent, name) */
	struct node *parent;
	struct node *child; /* a directory's entries, for readdir */
	struct node *sib_prev, *sib_next;
	char *name; /* NULL once unlinked */
	uint64_t nlookup;
	uint64_t size; /* __atomic: read and write take no lock */
	uint64_t ino;
	mode_t mode;
	uid_t uid;
	gid_t gid;
	nlink_t nlink;
	struct timespec atime, mtime, ctime;
};

enum {
	C_LOOKUP,
	C_GETATTR,
	C_SETATTR,
	C_CREATE,
	C_OPEN,
	C_READ,
	C_WRITE,
	C_FLUSH,
	C_FSYNC,
	C_RELEASE,
	C_GETXATTR,
	C_OTHER,
	C_N
};
static const char *const count_names[C_N] = { "lookup",	 "getattr",  "setattr",
					      "create",	 "open",     "read",
					      "write",	 "flush",    "fsync",
					      "release", "getxattr", "other" };
static uint64_t counts[C_N]; /* __atomic */
static int no_xattr; /* -X: xattr requests answered ENOSYS */
#define COUNT(c) __atomic_fetch_add(&counts[c], 1, __ATOMIC_RELAXED)

static pthread_mutex_t ns_lock = PTHREAD_MUTEX_INITIALIZER;
static struct node *buckets[HASH_BUCKETS];
static struct node root;
static uint64_t next_ino = 2;
static char *ram;

static struct node *node_of(fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID ? &root : (struct node *)(uintptr_t)ino;
}

static fuse_ino_t ino_of(struct node *n)
{
	return n == &root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
}

static unsigned int bucket(struct node *parent, const char *name)
{
	uint64_t h = (uintptr_t)parent * 0x9e3779b97f4a7c15ull;

	while (*name)
		h = (h ^ (unsigned char)*name++) * 0x100000001b3ull;
	return (h >> 20) % HASH_BUCKETS;
}

/* Under ns_lock. */
static struct node *find(struct node *parent, const char *name)
{
	struct node *n;

	for (n = buckets[bucket(parent, name)]; n; n = n->hnext)
		if (n->parent == parent && !strcmp(n->name, name))
			return n;
	return NULL;
}

static void fill_stat(struct node *n, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = n->ino;
	st->st_mode = n->mode;
	st->st_nlink = n->nlink;
	st->st_uid = n->uid;
	st->st_gid = n->gid;
	st->st_size = __atomic_load_n(&n->size, __ATOMIC_RELAXED);
	st->st_blksize = 4096;
	st->st_blocks = (st->st_size + 511) / 512;
	st->st_atim = n->atime;
	st->st_mtim = n->mtime;
	st->st_ctim = n->ctime;
}

/* Under ns_lock: the kernel now holds one more lookup of n. */
static void entry_of(struct node *n, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	n->nlookup++;
	e->ino = ino_of(n);
	e->attr_timeout = TIMEOUT;
	e->entry_timeout = TIMEOUT;
	fill_stat(n, &e->attr);
}

/* Under ns_lock: a new node named name in parent. */
static struct node *node_new(fuse_req_t req, struct node *parent,
			     const char *name, mode_t mode)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct node *n = calloc(1, sizeof(*n));
	unsigned int b = bucket(parent, name);

	if (!n || !(n->name = strdup(name))) {
		free(n);
		return NULL;
	}
	n->parent = parent;
	n->ino = next_ino++;
	n->mode = mode;
	n->uid = ctx->uid;
	n->gid = ctx->gid;
	n->nlink = S_ISDIR(mode) ? 2 : 1;
	clock_gettime(CLOCK_REALTIME, &n->mtime);
	n->atime = n->ctime = n->mtime;
	n->hnext = buckets[b];
	buckets[b] = n;
	n->sib_next = parent->child;
	if (parent->child)
		parent->child->sib_prev = n;
	parent->child = n;
	if (S_ISDIR(mode))
		parent->nlink++;
	return n;
}

static void node_free_if_unused(struct node *n)
{
	if (n != &root && !n->name && !n->nlookup)
		free(n);
}

/* Under ns_lock: n loses its name; freed when the kernel forgets it too. */
static void node_unlink(struct node *n)
{
	struct node **p = &buckets[bucket(n->parent, n->name)];

	while (*p != n)
		p = &(*p)->hnext;
	*p = n->hnext;
	if (n->sib_prev)
		n->sib_prev->sib_next = n->sib_next;
	else
		n->parent->child = n->sib_next;
	if (n->sib_next)
		n->sib_next->sib_prev = n->sib_prev;
	if (S_ISDIR(n->mode))
		n->parent->nlink--;
	free(n->name);
	n->name = NULL;
	n->nlink = 0;
	node_free_if_unused(n);
}

/* ------------------------------------------------------------ requests */

/* As nvcachefs's op_init (fs/fs.c): the same proto_conn. */
static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	proto_conn(conn);
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	struct node *n;

	COUNT(C_LOOKUP);
	pthread_mutex_lock(&ns_lock);
	n = find(node_of(parent), name);
	if (n) {
		entry_of(n, &e);
	} else {
		/* a negative entry of fuse.negative_timeout's default, 0 */
		memset(&e, 0, sizeof(e));
	}
	pthread_mutex_unlock(&ns_lock);
	fuse_reply_entry(req, &e);
}

static void forget_one(fuse_ino_t ino, uint64_t nlookup)
{
	struct node *n = node_of(ino);

	assert(n->nlookup >= nlookup || n == &root);
	n->nlookup -= nlookup < n->nlookup ? nlookup : n->nlookup;
	node_free_if_unused(n);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	pthread_mutex_lock(&ns_lock);
	forget_one(ino, nlookup);
	pthread_mutex_unlock(&ns_lock);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count,
			    struct fuse_forget_data *f)
{
	size_t i;

	pthread_mutex_lock(&ns_lock);
	for (i = 0; i < count; i++)
		forget_one(f[i].ino, f[i].nlookup);
	pthread_mutex_unlock(&ns_lock);
	fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct stat st;

	COUNT(C_GETATTR);
	pthread_mutex_lock(&ns_lock);
	fill_stat(node_of(ino), &st);
	pthread_mutex_unlock(&ns_lock);
	fuse_reply_attr(req, &st, TIMEOUT);
}

static void set_time(struct timespec *t, const struct timespec *v, int now)
{
	if (now)
		clock_gettime(CLOCK_REALTIME, t);
	else
		*t = *v;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
		       int to_set, struct fuse_file_info *fi)
{
	struct node *n = node_of(ino);
	struct stat st;

	COUNT(C_SETATTR);
	pthread_mutex_lock(&ns_lock);
	if (to_set & FUSE_SET_ATTR_MODE)
		n->mode = (n->mode & S_IFMT) | (attr->st_mode & 07777);
	if (to_set & FUSE_SET_ATTR_UID)
		n->uid = attr->st_uid;
	if (to_set & FUSE_SET_ATTR_GID)
		n->gid = attr->st_gid;
	if (to_set & FUSE_SET_ATTR_SIZE)
		__atomic_store_n(&n->size, (uint64_t)attr->st_size,
				 __ATOMIC_RELAXED);
	if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW))
		set_time(&n->atime, &attr->st_atim,
			 to_set & FUSE_SET_ATTR_ATIME_NOW);
	if (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW))
		set_time(&n->mtime, &attr->st_mtim,
			 to_set & FUSE_SET_ATTR_MTIME_NOW);
	clock_gettime(CLOCK_REALTIME, &n->ctime);
	fill_stat(n, &st);
	pthread_mutex_unlock(&ns_lock);
	fuse_reply_attr(req, &st, TIMEOUT);
}

static void make(fuse_req_t req, fuse_ino_t parent, const char *name,
		 mode_t mode, struct fuse_file_info *fi)
{
	struct fuse_entry_param e;
	struct node *p = node_of(parent), *n;
	int err = 0;

	pthread_mutex_lock(&ns_lock);
	n = find(p, name);
	if (n && (!fi || (fi->flags & O_EXCL)))
		err = EEXIST;
	else if (n && S_ISDIR(n->mode))
		err = EISDIR;
	else if (!n && !(n = node_new(req, p, name, mode)))
		err = ENOMEM;
	if (!err) {
		if (fi && (fi->flags & O_TRUNC))
			__atomic_store_n(&n->size, 0, __ATOMIC_RELAXED);
		entry_of(n, &e);
	}
	pthread_mutex_unlock(&ns_lock);
	if (err) {
		fuse_reply_err(req, err);
	} else if (fi) {
		fi->keep_cache = 1; /* as nvcachefs for an unchanged file */
		proto_open(fi);
		fuse_reply_create(req, &e, fi);
	} else {
		fuse_reply_entry(req, &e);
	}
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name,
		      mode_t mode, struct fuse_file_info *fi)
{
	COUNT(C_CREATE);
	make(req, parent, name, S_IFREG | (mode & 07777), fi);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode, dev_t rdev)
{
	if (!S_ISREG(mode))
		fuse_reply_err(req, EPERM);
	else
		make(req, parent, name, mode, NULL);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode)
{
	make(req, parent, name, S_IFDIR | (mode & 07777), NULL);
}

static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *name,
			int dir)
{
	struct node *n;
	int err = 0;

	pthread_mutex_lock(&ns_lock);
	n = find(node_of(parent), name);
	if (!n)
		err = ENOENT;
	else if (dir && !S_ISDIR(n->mode))
		err = ENOTDIR;
	else if (!dir && S_ISDIR(n->mode))
		err = EISDIR;
	else if (dir && n->child)
		err = ENOTEMPTY;
	else
		node_unlink(n);
	pthread_mutex_unlock(&ns_lock);
	fuse_reply_err(req, err);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, 0);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, 1);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct node *n = node_of(ino);

	COUNT(C_OPEN);
	if (fi->flags & O_TRUNC)
		__atomic_store_n(&n->size, 0, __ATOMIC_RELAXED);
	fi->keep_cache = 1; /* as nvcachefs (open_revalidate) when unchanged */
	proto_open(fi);
	fuse_reply_open(req, fi);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	fuse_reply_open(req, fi);
}

/* The shared buffer, as many times as the read needs. */
static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	uint64_t end = __atomic_load_n(&node_of(ino)->size, __ATOMIC_RELAXED);
	struct iovec iov[16];
	size_t n, cnt = 0;

	COUNT(C_READ);
	n = (uint64_t)off >= end ? 0 : end - off < size ? end - off : size;
	while (n && cnt < sizeof(iov) / sizeof(iov[0])) {
		iov[cnt].iov_base = ram;
		iov[cnt].iov_len = n < RAM_BYTES ? n : RAM_BYTES;
		n -= iov[cnt++].iov_len;
	}
	fuse_reply_iov(req, iov, cnt);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
		     size_t size, off_t off, struct fuse_file_info *fi)
{
	struct node *n = node_of(ino);
	uint64_t end = off + size,
		 cur = __atomic_load_n(&n->size, __ATOMIC_RELAXED);

	COUNT(C_WRITE);
	while (cur < end &&
	       !__atomic_compare_exchange_n(&n->size, &cur, end, 0,
					    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	fuse_reply_write(req, size);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off,
			 off_t len, struct fuse_file_info *fi)
{
	struct node *n = node_of(ino);
	uint64_t end = off + len,
		 cur = __atomic_load_n(&n->size, __ATOMIC_RELAXED);

	while (!(mode & FALLOC_FL_KEEP_SIZE) && cur < end &&
	       !__atomic_compare_exchange_n(&n->size, &cur, end, 0,
					    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	fuse_reply_err(req, 0);
}

static void op_ok(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	COUNT(C_OTHER);
	fuse_reply_err(req, 0);
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	COUNT(C_FLUSH);
	fuse_reply_err(req, 0);
}

static void op_release(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	COUNT(C_RELEASE);
	fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
		     struct fuse_file_info *fi)
{
	COUNT(C_FSYNC);
	fuse_reply_err(req, 0);
}

/* A file without extended attributes (see the essay at the top). */
static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	COUNT(C_GETXATTR);
	fuse_reply_err(req, no_xattr ? ENOSYS : ENODATA);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	COUNT(C_OTHER);
	if (size)
		fuse_reply_buf(req, NULL, 0);
	else
		fuse_reply_xattr(req, 0);
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			const char *value, size_t size, int flags)
{
	COUNT(C_OTHER);
	fuse_reply_err(req, ENOTSUP);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	COUNT(C_OTHER);
	fuse_reply_err(req, ENODATA);
}

/* Entries by position: ".", "..", then the children in list order. */
static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct node *d = node_of(ino), *c;
	char *buf = malloc(size);
	size_t used = 0, len;
	off_t i = 0;
	struct stat st;

	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	memset(&st, 0, sizeof(st));
	pthread_mutex_lock(&ns_lock);
	for (c = d->child; i < 2 || c; i++) {
		const char *name = i == 0 ? "." : i == 1 ? ".." : c->name;

		if (i >= off) {
			st.st_ino = i < 2 ? 1 : c->ino;
			st.st_mode = i < 2 ? S_IFDIR : c->mode;
			len = fuse_add_direntry(req, buf + used, size - used,
						name, &st, i + 1);
			if (len > size - used)
				break;
			used += len;
		}
		if (i >= 2)
			c = c->sib_next;
	}
	pthread_mutex_unlock(&ns_lock);
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv = {
		.f_bsize = 4096,
		.f_frsize = 4096,
		.f_blocks = 1ull << 32,
		.f_bfree = 1ull << 32,
		.f_bavail = 1ull << 32,
		.f_files = 1ull << 24,
		.f_ffree = 1ull << 24,
		.f_favail = 1ull << 24,
		.f_namemax = 255,
	};

	fuse_reply_statfs(req, &sv);
}

static const struct fuse_lowlevel_ops floor_ops = {
	.init = op_init,
	.lookup = op_lookup,
	.forget = op_forget,
	.forget_multi = op_forget_multi,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.open = op_open,
	.create = op_create,
	.read = op_read,
	.write = op_write,
	.flush = op_flush,
	.release = op_release,
	.fsync = op_fsync,
	.fallocate = op_fallocate,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.releasedir = op_ok,
	.fsyncdir = op_fsync,
	.statfs = op_statfs,
	.setxattr = op_setxattr,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.removexattr = op_removexattr,
};

/* ------------------------------------------------------------ main */

/* As nvcachefs's readahead_main (fs/main.c): the bdi's read-ahead, 1 MiB. */
static void *readahead_main(void *arg)
{
	const char *mnt = arg;
	struct stat st;
	char path[128];
	FILE *f;

	if (stat(mnt, &st))
		return NULL;
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb",
		 major(st.st_dev), minor(st.st_dev));
	f = fopen(path, "w");
	if (f) {
		fprintf(f, "1024\n");
		fclose(f);
	}
	return NULL;
}

static void floor_log(int err, const char *msg)
{
	(void)err;
	fprintf(stderr, "fuse-floor: %s\n", msg);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: fuse-floor [-f] [-t THREADS] [-T TRANSPORT] "
		   "[-o OPTION]... "
		   "MOUNTPOINT\n"
		   "\n"
		   "The FUSE floor of tools/bench/suite.py: reads come from "
		   "RAM, writes are\n"
		   "dropped; served as nvcachefs serves FUSE.\n"
		   "\n"
		   "  -f          accepted (always in the foreground)\n"
		   "  -t THREADS  FUSE worker threads at most (nvcachefs's "
		   "fuse.threads; 16)\n"
		   "  -T TRANSPORT  auto, uring or dev (nvcachefs's "
		   "fuse.transport; auto)\n"
		   "  -o OPTION   a FUSE mount option\n"
		   "  -X          answer extended-attribute requests ENOSYS "
		   "(the kernel then\n"
		   "              stops asking; nvcachefs does not)\n"
		   "  -v          at exit, the number of requests of each "
		   "kind\n");
}

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse_session *se;
	char mnt[PATH_MAX];
	int transport = FSLOOP_AUTO;
	unsigned int threads = 16;
	pthread_t ra;
	int opt, ra_started, verbose = 0, ret = 1;

	fuse_opt_add_arg(&args, argv[0]);
	while ((opt = getopt(argc, argv, "hft:T:o:vX")) != -1) {
		switch (opt) {
		case 'f':
			break;
		case 'v':
			verbose = 1;
			break;
		case 'X':
			no_xattr = 1;
			break;
		case 'T':
			if (!strcmp(optarg, "auto"))
				transport = FSLOOP_AUTO;
			else if (!strcmp(optarg, "uring"))
				transport = FSLOOP_URING;
			else if (!strcmp(optarg, "dev"))
				transport = FSLOOP_DEV;
			else {
				usage(stderr);
				return 2;
			}
			break;
		case 't':
			threads = strtoul(optarg, NULL, 0);
			break;
		case 'o':
			fuse_opt_add_arg(&args, "-o");
			fuse_opt_add_arg(&args, optarg);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1 || !threads || !realpath(argv[optind], mnt)) {
		usage(stderr);
		return 2;
	}
	ram = malloc(RAM_BYTES);
	if (!ram)
		return 1;
	for (size_t i = 0; i < RAM_BYTES; i++)
		ram[i] = (char)(i * 131 + 7);
	root.mode = S_IFDIR | 0755;
	root.nlink = 2;
	root.ino = 1;
	clock_gettime(CLOCK_REALTIME, &root.mtime);
	root.atime = root.ctime = root.mtime;

	/* the options of nvcachefs's add_mount_opts (fs/main.c) */
	fuse_opt_add_arg(&args, "-o");
	fuse_opt_add_arg(&args, "fsname=fuse-floor,subtype=fuse-floor,"
				"default_permissions");
	se = fuse_session_new(&args, &floor_ops, sizeof(floor_ops), NULL);
	if (!se)
		goto out_args;
	if (fuse_set_signal_handlers(se))
		goto out_session;
	if (fuse_session_mount(se, mnt))
		goto out_handlers;
	/* the protocol features nvcachefs asks for (fs/main.c) */
	if (proto_attach(se, fuse_session_fd(se),
			 PROTO_KILLPRIV_V2 | PROTO_DIRECT_IO |
				 (transport != FSLOOP_DEV ? PROTO_URING : 0)))
		fprintf(stderr, "fuse-floor: no protocol features\n");
	ra_started = !pthread_create(&ra, NULL, readahead_main, mnt);
	fsloop_on_log(floor_log);
	ret = fsloop_run(se, 0, threads, 0, transport) ? 1 : 0;
	fuse_session_unmount(se);
	if (ra_started)
		pthread_join(ra, NULL);
	for (int i = 0; verbose && i < C_N; i++)
		fprintf(stderr, "fuse-floor: %s %llu\n", count_names[i],
			(unsigned long long)counts[i]);
out_handlers:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
out_args:
	fuse_opt_free_args(&args);
	free(ram);
	return ret;
}
