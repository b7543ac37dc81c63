/* fs: kernel protocol features libfuse cannot ask for, and request counters,
 * through libfuse's custom io hooks on /dev/fuse. */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "proto.h"
#include "uring.h"

/*
 * libfuse (3.14 here) reads each request from /dev/fuse through io.read and
 * writes each reply through io.writev: proto_read and proto_writev, thin
 * wrappers of read(2) and writev(2).  They see the bytes the library hides:
 *
 * - INIT.  The kernel offers FUSE_HANDLE_KILLPRIV_V2 and
 *   FUSE_DIRECT_IO_ALLOW_MMAP; a library too old to know them drops them
 *   from its reply, and proto_writev adds them back to it.
 * - OPEN and CREATE.  FUSE_OPEN_KILL_SUIDGID in open_flags; a library before
 *   3.15 cannot set FOPEN_PARALLEL_DIRECT_WRITES, which proto_writev adds to a
 *   reply that has FOPEN_DIRECT_IO (only proto_open sets that).
 * - WRITE.  FUSE_WRITE_KILL_SUIDGID in write_flags (no libfuse passes it on).
 * - Passthrough (before 3.17 libfuse has no API for it): FUSE_PASSTHROUGH
 *   and max_stack_depth in the INIT reply; FOPEN_PASSTHROUGH and the backing
 *   id in the reply of an open that proto_open_passthrough marked (the
 *   backing ids themselves are fs/passthru.c's).
 *
 * One path per feature: where the library has the API (detected at build
 * time: NVC_FUSE_KILLPRIV_V2, NVC_FUSE_ALLOW_MMAP, NVC_FUSE_PARALLEL_DIO),
 * the feature is asked for through it and the hooks leave that bit alone.
 * The kill flags of WRITE and OPEN come from the hooks with every libfuse
 * (up to 3.18 none passes them to the ops); FATTR_KILL_SUIDGID reaches
 * setattr as FUSE_SET_ATTR_KILL_SUID with all of them.
 *
 * Ordering.  The kernel sends nothing else until INIT is answered, so the
 * INIT reply is patched before any open can ask what was granted (granted is
 * written once, before the reply, and read after).  A request is matched to
 * its reply through the thread that serves it: libfuse's loops hand each
 * request to its op in the thread that read it, before that thread reads
 * again, and the op replies from it.  So the read hook notes the request in a
 * thread-local (cur), the op asks about it (proto_write_kill and
 * proto_open_kill assert that cur is the request being served) and the
 * reply is recognised by its unique.  fs/loop.c reads requests itself: it
 * notes each with proto_request (fresh, counted), and again (not fresh) on
 * the pool thread it hands one to, and ends the noting with
 * proto_request_done once the op has returned, so that a reply sent later
 * from an io_uring completion is not taken for the request being served.
 * Opens and creates are answered before their op returns; writes in flight
 * are matched by unique (wtab).
 *
 * Without the hooks (proto_attach failed) nothing is asked for: a feature is
 * granted only where its kill flags can be seen.
 */

#ifndef FUSE_DIRECT_IO_ALLOW_MMAP
#define FUSE_DIRECT_IO_ALLOW_MMAP (1ULL << 36)
#endif
#ifndef FUSE_OVER_IO_URING
#define FUSE_OVER_IO_URING (1ULL << 41)
#endif
#ifndef FOPEN_PARALLEL_DIRECT_WRITES
#define FOPEN_PARALLEL_DIRECT_WRITES (1 << 6)
#endif
#ifndef FUSE_PASSTHROUGH
#define FUSE_PASSTHROUGH (1ULL << 37)
#endif
#ifndef FOPEN_PASSTHROUGH
#define FOPEN_PASSTHROUGH (1 << 7)
#endif
/* What a backing file may stack on (the store's s_stack_depth must be below
 * it): 1 keeps this mount usable under overlayfs; a store that is itself
 * stacked is refused at BACKING_OPEN (ELOOP) and served by the cache. */
#define PT_STACK_DEPTH 1
/* The tails of fuse_init_out and fuse_open_out past what these headers
 * (older than the kernel) name. */
#define INIT_OUT_STACK_OFF 36 /* max_stack_depth, unused[0] here */
struct pt_open_out {
	uint64_t fh;
	uint32_t open_flags;
	int32_t backing_id; /* padding here */
};

#define NOPS 64 /* counted opcodes; the rest in [0] */
#define CAP_XATTR "security.capability"

static struct {
	unsigned int want; /* PROTO_* asked for by the daemon */
	int attached; /* the hooks are installed */
	int uring_ok; /* the loop serves ring entries (proto_uring_allow) */
	size_t payload; /* a ring entry's, from the INIT reply */
	uint64_t offered; /* the kernel's INIT flags (flags2 << 32) */
	uint64_t granted; /* what the INIT reply grants of the above */
	uint64_t count[NOPS]; /* requests read, by opcode (atomic) */
	uint64_t cap_getxattr; /* GETXATTRs of security.capability */
	int64_t writes; /* WRITEs read and not answered (atomic) */
	int64_t writes_max; /* most WRITEs in flight at once */
} pr;

/* The request this thread read last and is serving (see Ordering). */
static __thread struct {
	uint64_t unique; /* 0: answered, or none */
	uint32_t opcode;
	int kill;
	int pt; /* the open's reply serves it through backing_id */
	int32_t backing_id;
} cur;

static void note_init(const struct fuse_init_in *in, size_t len)
{
	uint64_t flags = in->flags;

	if ((flags & FUSE_INIT_EXT) &&
	    len >= offsetof(struct fuse_init_in, unused))
		flags |= (uint64_t)in->flags2 << 32;
	pr.offered = flags;
}

/*
 * WRITEs in flight, by unique: a write may be answered by another thread, or
 * by the same one after it has read other requests (fs/loop.c's workers
 * answer from io_uring completions), so its reply is found by its unique in
 * this small open-addressed table, not through cur.  A table that is full
 * leaves a write uncounted.
 */
#define WTAB 1024
static uint64_t wtab[WTAB];

static int wtab_add(uint64_t unique)
{
	unsigned i, h = (unsigned)(unique * 0x9e3779b97f4a7c15ull >> 54);

	for (i = 0; i < 16; i++) {
		uint64_t zero = 0;

		if (__atomic_compare_exchange_n(&wtab[(h + i) % WTAB], &zero,
						unique, 0, __ATOMIC_RELAXED,
						__ATOMIC_RELAXED))
			return 1;
	}
	return 0;
}

static int wtab_del(uint64_t unique)
{
	unsigned i, h = (unsigned)(unique * 0x9e3779b97f4a7c15ull >> 54);

	for (i = 0; i < 16; i++) {
		uint64_t u = unique;

		if (__atomic_compare_exchange_n(&wtab[(h + i) % WTAB], &u, 0, 0,
						__ATOMIC_RELAXED,
						__ATOMIC_RELAXED))
			return 1;
	}
	return 0;
}

static void note_write(uint64_t unique, const struct fuse_write_in *in,
		       int fresh)
{
	int64_t n, max = __atomic_load_n(&pr.writes_max, __ATOMIC_RELAXED);

	cur.kill = !!(in->write_flags & FUSE_WRITE_KILL_SUIDGID);
	if (!fresh || !wtab_add(unique))
		return;
	n = __atomic_add_fetch(&pr.writes, 1, __ATOMIC_RELAXED);
	while (n > max &&
	       !__atomic_compare_exchange_n(&pr.writes_max, &max, n, 1,
					    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

static void note_getxattr(const char *name, size_t len)
{
	if (len >= sizeof(CAP_XATTR) &&
	    !memcmp(name, CAP_XATTR, sizeof(CAP_XATTR)))
		__atomic_add_fetch(&pr.cap_getxattr, 1, __ATOMIC_RELAXED);
}

/* A request about to be served by this thread: note what the ops and the
 * reply need; fresh (just read): count it too. */
static void note_request(const void *buf, size_t n, int fresh)
{
	const struct fuse_in_header *h = buf;
	const char *arg = (const char *)(h + 1);
	size_t len = n - sizeof(*h);

	cur.unique = h->unique;
	cur.opcode = h->opcode;
	cur.kill = 0;
	cur.pt = 0;
	if (fresh)
		__atomic_add_fetch(&pr.count[h->opcode < NOPS ? h->opcode : 0],
				   1, __ATOMIC_RELAXED);
	switch (h->opcode) {
	case FUSE_INIT:
		if (len >= offsetof(struct fuse_init_in, flags2))
			note_init((const void *)arg, len);
		break;
	case FUSE_WRITE:
		if (len >= sizeof(struct fuse_write_in))
			note_write(h->unique, (const void *)arg, fresh);
		break;
	case FUSE_OPEN:
		if (len >= sizeof(struct fuse_open_in))
			cur.kill = !!(
				((const struct fuse_open_in *)arg)->open_flags &
				FUSE_OPEN_KILL_SUIDGID);
		break;
	case FUSE_CREATE:
		if (len >= sizeof(struct fuse_create_in))
			cur.kill = !!(((const struct fuse_create_in *)arg)
					      ->open_flags &
				      FUSE_OPEN_KILL_SUIDGID);
		break;
	case FUSE_GETXATTR:
		if (fresh && len > sizeof(struct fuse_getxattr_in))
			note_getxattr(arg + sizeof(struct fuse_getxattr_in),
				      len - sizeof(struct fuse_getxattr_in));
		break;
	}
}

static ssize_t proto_read(int fd, void *buf, size_t len, void *userdata)
{
	ssize_t n = read(fd, buf, len);

	if (n >= (ssize_t)sizeof(struct fuse_in_header))
		note_request(buf, n, 1);
	return n;
}

void proto_request(const void *buf, size_t n, int fresh)
{
	if (n >= sizeof(struct fuse_in_header))
		note_request(buf, n, fresh);
}

void proto_request_done(void)
{
	cur.unique = 0;
	cur.opcode = 0;
}

/* The bits of the INIT reply this library cannot set itself. */
static uint64_t init_wanted(void)
{
	uint64_t want = 0;

#ifndef NVC_FUSE_KILLPRIV_V2
	if (pr.want & PROTO_KILLPRIV_V2)
		want |= FUSE_HANDLE_KILLPRIV_V2;
#endif
#ifndef NVC_FUSE_ALLOW_MMAP
	if (pr.want & PROTO_DIRECT_IO)
		want |= FUSE_DIRECT_IO_ALLOW_MMAP;
#endif
	if ((pr.want & PROTO_URING) && pr.uring_ok)
		want |= FUSE_OVER_IO_URING;
	if (pr.want & PROTO_PASSTHROUGH)
		want |= FUSE_PASSTHROUGH;
	return want & pr.offered;
}

static void patch_init(struct iovec *iov, int count)
{
	struct fuse_init_out *out = iov[1].iov_base;
	uint64_t want = init_wanted(), got;

	if (count != 2 ||
	    iov[1].iov_len < offsetof(struct fuse_init_out, unused))
		return;
	if ((want >> 32) && (pr.offered & FUSE_INIT_EXT))
		out->flags |= FUSE_INIT_EXT;
	if (!(out->flags & FUSE_INIT_EXT))
		want &= 0xffffffffu;
	out->flags |= (uint32_t)want;
	out->flags2 |= (uint32_t)(want >> 32);
	got = out->flags;
	if (out->flags & FUSE_INIT_EXT)
		got |= (uint64_t)out->flags2 << 32;
	pr.granted = got & pr.offered;
	if ((pr.granted & FUSE_PASSTHROUGH) &&
	    iov[1].iov_len >= INIT_OUT_STACK_OFF + sizeof(uint32_t))
		memcpy((char *)out + INIT_OUT_STACK_OFF,
		       &(uint32_t){ PT_STACK_DEPTH }, sizeof(uint32_t));
	else
		pr.granted &= ~FUSE_PASSTHROUGH;
	pr.payload = out->max_write;
	if ((size_t)out->max_pages * 4096 > pr.payload)
		pr.payload = (size_t)out->max_pages * 4096;
	if (pr.payload < 8192)
		pr.payload = 8192;
}

/* An open's reply: fuse_open_out ends the reply (after fuse_entry_out in a
 * create's). */
static void patch_open(struct iovec *iov, int count)
{
	struct pt_open_out *out;

	if (count != 2 || iov[1].iov_len < sizeof(*out))
		return;
	out = (void *)((char *)iov[1].iov_base + iov[1].iov_len - sizeof(*out));
	if (cur.pt) {
		/* FOPEN_DIRECT_IO would override passthrough in the kernel */
		out->open_flags &= ~(FOPEN_DIRECT_IO | FOPEN_KEEP_CACHE |
				     FOPEN_PARALLEL_DIRECT_WRITES);
		out->open_flags |= FOPEN_PASSTHROUGH;
		out->backing_id = cur.backing_id;
		return;
	}
#ifndef NVC_FUSE_PARALLEL_DIO
	if (out->open_flags & FOPEN_DIRECT_IO)
		out->open_flags |= FOPEN_PARALLEL_DIRECT_WRITES;
#endif
}

static void note_reply(struct iovec *iov, int count)
{
	const struct fuse_out_header *h = iov[0].iov_base;

	switch (cur.opcode) {
	case FUSE_INIT:
		if (!h->error)
			patch_init(iov, count);
		break;
	case FUSE_OPEN:
	case FUSE_CREATE:
		if (!h->error)
			patch_open(iov, count);
		break;
	}
	cur.unique = 0;
}

static ssize_t proto_writev(int fd, struct iovec *iov, int count,
			    void *userdata)
{
	const struct fuse_out_header *h = iov[0].iov_base;

	/* notifications (unique 0) may go out while a request is served */
	if (h->unique && h->unique == cur.unique)
		note_reply(iov, count);
	if (h->unique && wtab_del(h->unique))
		__atomic_sub_fetch(&pr.writes, 1, __ATOMIC_RELAXED);
	if (pr.granted & FUSE_OVER_IO_URING) {
		int ret = furing_reply(iov, count);

		if (ret < 0)
			return ret;
		if (ret) {
			ssize_t n = 0;
			int i;

			for (i = 0; i < count; i++)
				n += iov[i].iov_len;
			return n;
		}
	}
	return writev(fd, iov, count);
}

int proto_attach(struct fuse_session *se, int fd, unsigned int features)
{
	static const struct fuse_custom_io io = {
		.read = proto_read,
		.writev = proto_writev,
	};
	int ret;

	pr.want = features;
	ret = fuse_session_custom_io(se, &io, fd);
	if (ret)
		return ret < 0 ? ret : -EIO;
	pr.attached = 1;
	return 0;
}

void proto_uring_allow(void)
{
	pr.uring_ok = 1;
}

int proto_uring_offered(void)
{
	return !!(pr.offered & FUSE_OVER_IO_URING);
}

int proto_uring(void)
{
	return !!(pr.granted & FUSE_OVER_IO_URING);
}

size_t proto_uring_payload(void)
{
	return pr.payload ? pr.payload : 1024 * 1024;
}

/*
 * The connection nvcachefs asks for, and the FUSE floor with it: no
 * writeback cache (it would acknowledge writes from RAM and break kill -9),
 * parallel directory operations, 1 MiB writes and read-ahead, 64 background
 * requests; then the features of proto_attach.
 */
void proto_conn(struct fuse_conn_info *conn)
{
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	conn->max_write = 1024 * 1024;
	conn->max_readahead = 1024 * 1024;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	proto_init(conn);
}

void proto_init(struct fuse_conn_info *conn)
{
	if (!pr.attached)
		return;
#ifdef NVC_FUSE_KILLPRIV_V2
	if ((pr.want & PROTO_KILLPRIV_V2) &&
	    (conn->capable & FUSE_CAP_HANDLE_KILLPRIV_V2)) {
		conn->want |= FUSE_CAP_HANDLE_KILLPRIV_V2;
		pr.granted |= FUSE_HANDLE_KILLPRIV_V2;
	}
#endif
#ifdef NVC_FUSE_ALLOW_MMAP
	if ((pr.want & PROTO_DIRECT_IO) &&
	    (conn->capable & FUSE_CAP_DIRECT_IO_ALLOW_MMAP)) {
		conn->want |= FUSE_CAP_DIRECT_IO_ALLOW_MMAP;
		pr.granted |= FUSE_DIRECT_IO_ALLOW_MMAP;
	}
#endif
}

void proto_open(struct fuse_file_info *fi)
{
	/* a MAP_SHARED map of an O_DIRECT file works today: keep it so */
	if (!(fi->flags & O_DIRECT) || !(pr.want & PROTO_DIRECT_IO) ||
	    !(pr.granted & FUSE_DIRECT_IO_ALLOW_MMAP))
		return;
	fi->direct_io = 1;
#ifdef NVC_FUSE_PARALLEL_DIO
	fi->parallel_direct_writes = 1;
#endif
}

int proto_passthrough_offered(void)
{
	return !!(pr.offered & FUSE_PASSTHROUGH);
}

int proto_passthrough(void)
{
	return !!(pr.granted & FUSE_PASSTHROUGH);
}

void proto_open_passthrough(int backing_id)
{
	assert(!pr.attached || cur.opcode == FUSE_OPEN ||
	       cur.opcode == FUSE_CREATE);
	cur.pt = 1;
	cur.backing_id = backing_id;
}

int proto_write_kill(void)
{
	assert(!pr.attached || cur.opcode == FUSE_WRITE);
	return pr.attached && cur.kill;
}

int proto_open_kill(void)
{
	assert(!pr.attached || cur.opcode == FUSE_OPEN ||
	       cur.opcode == FUSE_CREATE);
	return pr.attached && cur.kill;
}

static const char *const op_names[NOPS] = {
	[FUSE_LOOKUP] = "LOOKUP",
	[FUSE_FORGET] = "FORGET",
	[FUSE_GETATTR] = "GETATTR",
	[FUSE_SETATTR] = "SETATTR",
	[FUSE_READLINK] = "READLINK",
	[FUSE_SYMLINK] = "SYMLINK",
	[FUSE_MKNOD] = "MKNOD",
	[FUSE_MKDIR] = "MKDIR",
	[FUSE_UNLINK] = "UNLINK",
	[FUSE_RMDIR] = "RMDIR",
	[FUSE_RENAME] = "RENAME",
	[FUSE_LINK] = "LINK",
	[FUSE_OPEN] = "OPEN",
	[FUSE_READ] = "READ",
	[FUSE_WRITE] = "WRITE",
	[FUSE_STATFS] = "STATFS",
	[FUSE_RELEASE] = "RELEASE",
	[FUSE_FSYNC] = "FSYNC",
	[FUSE_SETXATTR] = "SETXATTR",
	[FUSE_GETXATTR] = "GETXATTR",
	[FUSE_LISTXATTR] = "LISTXATTR",
	[FUSE_REMOVEXATTR] = "REMOVEXATTR",
	[FUSE_FLUSH] = "FLUSH",
	[FUSE_INIT] = "INIT",
	[FUSE_OPENDIR] = "OPENDIR",
	[FUSE_READDIR] = "READDIR",
	[FUSE_RELEASEDIR] = "RELEASEDIR",
	[FUSE_FSYNCDIR] = "FSYNCDIR",
	[FUSE_ACCESS] = "ACCESS",
	[FUSE_CREATE] = "CREATE",
	[FUSE_INTERRUPT] = "INTERRUPT",
	[FUSE_DESTROY] = "DESTROY",
	[FUSE_BATCH_FORGET] = "BATCH_FORGET",
	[FUSE_FALLOCATE] = "FALLOCATE",
	[FUSE_READDIRPLUS] = "READDIRPLUS",
	[FUSE_RENAME2] = "RENAME2",
	[FUSE_LSEEK] = "LSEEK",
	[FUSE_GETLK] = "GETLK",
	[FUSE_SETLK] = "SETLK",
	[FUSE_SETLKW] = "SETLKW",
	[FUSE_BMAP] = "BMAP",
	[FUSE_IOCTL] = "IOCTL",
	[FUSE_POLL] = "POLL",
	[FUSE_COPY_FILE_RANGE] = "COPY_FILE_RANGE",
	[FUSE_SYNCFS] = "SYNCFS",
	[FUSE_TMPFILE] = "TMPFILE",
};

int proto_stats(char *buf, size_t len)
{
	size_t n = 0;
	int i, w;

	w = snprintf(buf, len, "fuse requests:");
	for (i = 0; i < NOPS && w >= 0; i++) {
		uint64_t c = __atomic_load_n(&pr.count[i], __ATOMIC_RELAXED);

		n += w;
		if (!c) {
			w = 0;
		} else if (op_names[i]) {
			w = snprintf(buf + (n < len ? n : len),
				     n < len ? len - n : 0, " %s %llu",
				     op_names[i], (unsigned long long)c);
		} else {
			w = snprintf(buf + (n < len ? n : len),
				     n < len ? len - n : 0, " op%d %llu", i,
				     (unsigned long long)c);
		}
	}
	if (w < 0)
		return w;
	n += w;
	w = snprintf(
		buf + (n < len ? n : len), n < len ? len - n : 0,
		"; GETXATTR %s %llu; at most %lld WRITEs in flight; "
		"granted%s%s%s%s",
		CAP_XATTR,
		(unsigned long long)__atomic_load_n(&pr.cap_getxattr,
						    __ATOMIC_RELAXED),
		(long long)__atomic_load_n(&pr.writes_max, __ATOMIC_RELAXED),
		pr.granted & FUSE_HANDLE_KILLPRIV_V2 ? " KILLPRIV_V2" : "",
		pr.granted & FUSE_DIRECT_IO_ALLOW_MMAP ? " DIRECT_IO_ALLOW_MMAP"
						       : "",
		pr.granted & FUSE_OVER_IO_URING ? " OVER_IO_URING" : "",
		pr.granted & FUSE_PASSTHROUGH ? " PASSTHROUGH" : "");
	return w < 0 ? w : (int)(n + w);
}
