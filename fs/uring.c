/* fs: FUSE over io_uring, the request transport a worker may serve besides /dev/fuse. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/fuse.h>
#include <liburing.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "proto.h"
#include "uring.h"

/*
 * The kernel's side (fs/fuse/dev_uring.c, 6.14 on).  Once the INIT reply
 * has FUSE_OVER_IO_URING, the server registers ring entries for each of
 * the connection's queues (one per possible CPU) with IORING_OP_URING_CMD
 * on /dev/fuse (FUSE_IO_URING_CMD_REGISTER, 128-byte SQEs, the command in
 * the SQE's last 80 bytes): an entry is a header (fuse_uring_req_header)
 * and a payload of at least max(8 KiB, max_write, max_pages pages).  No
 * request is sent before every queue has an entry.  Then a request is put
 * on the queue of the CPU its caller runs on, copied into a free entry of
 * it (in the context of the thread that submitted that entry's command),
 * and the command completes: the fuse_in_header in the header's in_out,
 * the request's first argument (the per-op struct) in op_in, the rest in
 * the payload (ring_ent_in_out.payload_sz bytes).  The reply goes back the
 * same way, fuse_out_header in in_out and every reply argument in the
 * payload, with FUSE_IO_URING_CMD_COMMIT_AND_FETCH, which also makes the
 * entry free for the next request: one system call where /dev/fuse takes a
 * writev and a read.  FORGET, INTERRUPT and notifications stay on
 * /dev/fuse, which fs/loop.c's workers go on reading.
 *
 * Here.  Each worker owns the queues q with q % nworkers == its index, one
 * ring for all of them, URING_ENTS entries per queue.  A completion is
 * turned back into the request /dev/fuse would have given (the in header
 * and op_in copied just before the payload, so a WRITE's data stays at the
 * payload's page-aligned start, where the cache writes it from) and served
 * by the worker as one read from /dev/fuse.  The reply (furing_reply, from
 * proto.c's writev hook) finds its entry by unique (utab), copies itself
 * into the entry and is committed: at once when the owner answers, or
 * handed to the owner (pending, an eventfd the ring polls) when a pool
 * thread does, since the kernel copies the next request in the context of
 * the thread that submitted the command.  A reply given while its request
 * is still being served, to a request that has a payload, waits in a
 * staging buffer until the op returns: the op may still read the name or
 * data the reply would overwrite.
 *
 * The ring is DEFER_TASKRUN (and so SINGLE_ISSUER): the kernel copies a
 * request into an entry only inside the owner's own io_uring_enter on it
 * (io_uring_get_events, or the commit that fetches), never at an arbitrary
 * return to user space; an eventfd registered with the ring says when
 * there is something to run, and the same eventfd carries the pool's kicks.
 *
 * Memory: entries are mapped, not touched; the kernel hands out the entry
 * freed last first, so only as many payloads are touched as requests were
 * in flight at once, and an idle worker drops the pages of its free
 * entries (furing_idle): with DEFER_TASKRUN nothing is copied into them
 * meanwhile.
 */

/* From include/uapi/linux/fuse.h (7.42), which Debian 12's lacks. */
#ifndef FUSE_URING_IN_OUT_HEADER_SZ
#define FUSE_URING_IN_OUT_HEADER_SZ 128
#define FUSE_URING_OP_IN_OUT_SZ 128
struct fuse_uring_ent_in_out {
	uint64_t flags;
	uint64_t commit_id;
	uint32_t payload_sz;
	uint32_t padding;
	uint64_t reserved;
};
struct fuse_uring_req_header {
	char in_out[FUSE_URING_IN_OUT_HEADER_SZ];
	char op_in[FUSE_URING_OP_IN_OUT_SZ];
	struct fuse_uring_ent_in_out ring_ent_in_out;
};
enum fuse_uring_cmd {
	FUSE_IO_URING_CMD_INVALID = 0,
	FUSE_IO_URING_CMD_REGISTER = 1,
	FUSE_IO_URING_CMD_COMMIT_AND_FETCH = 2,
};
struct fuse_uring_cmd_req {
	uint64_t flags;
	uint64_t commit_id;
	uint16_t qid;
	uint8_t padding[6];
};
#endif
_Static_assert(sizeof(struct fuse_uring_req_header) == 288, "uapi layout");
_Static_assert(sizeof(struct fuse_uring_cmd_req) == 24, "uapi layout");

#define URING_ENTS 16 /* per queue */
#define HEADROOM 4096u /* before the payload: the header, the request's */
#define UTAB 8192
#define PROBES 64 /* a slot within this many of its hash */

enum { ENT_DEAD, ENT_KERNEL, ENT_USER };

struct fent {
	struct furing *r;
	struct fuse_uring_req_header *hdr; /* at mem */
	char *mem, *payload; /* payload = mem + HEADROOM */
	size_t payload_len;
	struct iovec iov[2];
	uint64_t unique;
	uint32_t req_psz; /* the request's payload */
	uint16_t qid;
	int state;
	int staged; /* its reply waits in r->stage */
	struct fent *pnext;
};

struct furing {
	struct io_uring ring;
	int fuse_fd, kickfd;
	unsigned nent, live;
	int in_run, dirty; /* in furing_run; SQEs not submitted */
	struct fent *ents;
	struct fent *pending; /* replied by other threads (atomic stack) */
	struct fent *serving; /* the request the owner serves now */
	char *stage;
	size_t stage_cap, stage_len;
	uint64_t kickbuf;
};

static __thread struct furing *own;
static struct fent *utab[UTAB];
static unsigned long long served;
static int rings; /* furing_start has registered entries: look them up */

unsigned long long furing_served(void)
{
	return __atomic_load_n(&served, __ATOMIC_RELAXED);
}

static unsigned slot(uint64_t unique)
{
	return (unsigned)((unique >> 1) * 0x9e3779b97f4a7c15ull >> 51) % UTAB;
}

static int utab_add(struct fent *e)
{
	unsigned i, h = slot(e->unique);

	for (i = 0; i < PROBES; i++) {
		struct fent *none = NULL;

		if (__atomic_compare_exchange_n(&utab[(h + i) % UTAB], &none, e,
						0, __ATOMIC_RELEASE,
						__ATOMIC_RELAXED))
			return 0;
	}
	return -ENOSPC;
}

static struct fent *utab_take(uint64_t unique)
{
	unsigned i, h = slot(unique);

	if (!__atomic_load_n(&rings, __ATOMIC_RELAXED))
		return NULL;
	for (i = 0; i < PROBES; i++) {
		struct fent **p = &utab[(h + i) % UTAB];
		struct fent *e = __atomic_load_n(p, __ATOMIC_ACQUIRE);

		/* an empty slot may be a hole a take left: go on */
		if (e && e->unique == unique && e->state == ENT_USER &&
		    __atomic_compare_exchange_n(
			    p, &e, NULL, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			return e;
	}
	return NULL;
}

unsigned furing_nqueues(void)
{
	char buf[256], *p = buf;
	unsigned n = 0;
	FILE *f = fopen("/sys/devices/system/cpu/possible", "re");

	if (!f)
		goto fallback;
	if (!fgets(buf, sizeof(buf), f)) {
		fclose(f);
		goto fallback;
	}
	fclose(f);
	while (*p && *p != '\n') { /* "0-3,8-11" */
		char *end;
		unsigned long a = strtoul(p, &end, 10), b = a;

		if (end == p)
			break;
		if (*end == '-')
			b = strtoul(end + 1, &end, 10);
		n = b + 1 > n ? (unsigned)b + 1 : n;
		p = *end == ',' ? end + 1 : end;
	}
	if (n)
		return n;
fallback : {
	long c = sysconf(_SC_NPROCESSORS_CONF);

	return c > 0 ? (unsigned)c : 1;
}
}

static struct io_uring_sqe *sqe_get(struct furing *r)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);

	if (!sqe) {
		io_uring_submit(&r->ring);
		sqe = io_uring_get_sqe(&r->ring);
	}
	if (sqe)
		memset(sqe, 0, 128);
	return sqe;
}

static void submit(struct furing *r)
{
	if (r->in_run) {
		r->dirty = 1;
		return;
	}
	r->dirty = 0;
	io_uring_submit(&r->ring);
}

static int ent_cmd(struct furing *r, struct fent *e, uint32_t op)
{
	struct io_uring_sqe *sqe = sqe_get(r);
	struct fuse_uring_cmd_req *req;

	if (!sqe)
		return -EBUSY;
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = r->fuse_fd;
	sqe->cmd_op = op;
	if (op == FUSE_IO_URING_CMD_REGISTER) {
		sqe->addr = (uintptr_t)e->iov;
		sqe->len = 2;
	}
	req = (void *)sqe->cmd;
	req->qid = e->qid;
	req->commit_id = op == FUSE_IO_URING_CMD_REGISTER ? 0 : e->unique;
	io_uring_sqe_set_data(sqe, e);
	e->state = ENT_KERNEL;
	submit(r);
	return 0;
}

int furing_fd(const struct furing *r)
{
	return r->kickfd;
}

void furing_idle(struct furing *r)
{
	unsigned i;

	if (!r)
		return;
	/* no request is copied into an entry but in this thread's own
	 * io_uring_enter on the ring (DEFER_TASKRUN): a free entry's pages
	 * can be dropped here; a copy later finds fresh zero pages */
	for (i = 0; i < r->nent; i++)
		if (r->ents[i].state == ENT_KERNEL)
			madvise(r->ents[i].payload, r->ents[i].payload_len,
				MADV_DONTNEED);
	madvise(r->stage, r->stage_cap, MADV_DONTNEED);
}

void furing_free(struct furing *r)
{
	unsigned i;

	if (!r)
		return;
	io_uring_queue_exit(&r->ring);
	for (i = 0; i < r->nent; i++) {
		struct fent *e = &r->ents[i];
		unsigned j;

		for (j = 0; j < UTAB; j++)
			if (__atomic_load_n(&utab[j], __ATOMIC_RELAXED) == e)
				utab[j] = NULL;
		if (e->mem)
			munmap(e->mem, HEADROOM + e->payload_len);
	}
	if (r->stage)
		munmap(r->stage, r->stage_cap);
	if (r->kickfd >= 0)
		close(r->kickfd);
	if (own == r)
		own = NULL;
	free(r->ents);
	free(r);
}

int furing_start(int fuse_fd, unsigned worker, unsigned nworkers,
		 struct furing **out)
{
	unsigned nq = furing_nqueues(), mine = 0, q, i;
	size_t plen = proto_uring_payload();
	struct furing *r;
	int ret;

	*out = NULL;
	for (q = worker; q < nq; q += nworkers)
		mine++;
	if (!mine)
		return 0;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->kickfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	r->fuse_fd = fuse_fd;
	r->nent = mine * URING_ENTS;
	r->ents = calloc(r->nent, sizeof(*r->ents));
	ret = -ENOMEM;
	if (r->kickfd < 0 || !r->ents)
		goto err_alloc;
	{
		struct io_uring_params p = {
			.flags = IORING_SETUP_SQE128 |
				 IORING_SETUP_SINGLE_ISSUER |
				 IORING_SETUP_DEFER_TASKRUN,
		};

		ret = io_uring_queue_init_params(2 * r->nent + 8, &r->ring, &p);
	}
	if (ret)
		goto err_alloc;
	ret = io_uring_register_eventfd(&r->ring, r->kickfd);
	if (ret) {
		io_uring_queue_exit(&r->ring);
		goto err_alloc;
	}
	r->stage_cap = plen;
	r->stage = mmap(NULL, plen, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r->stage == MAP_FAILED) {
		r->stage = NULL;
		goto err_ring;
	}
	for (i = 0, q = worker; q < nq; q += nworkers) {
		unsigned k;

		for (k = 0; k < URING_ENTS; k++, i++) {
			struct fent *e = &r->ents[i];

			e->r = r;
			e->qid = q;
			e->payload_len = plen;
			e->mem = mmap(NULL, HEADROOM + plen,
				      PROT_READ | PROT_WRITE,
				      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (e->mem == MAP_FAILED) {
				e->mem = NULL;
				goto err_ring;
			}
			e->hdr = (void *)e->mem;
			e->payload = e->mem + HEADROOM;
			e->iov[0].iov_base = e->hdr;
			e->iov[0].iov_len = sizeof(*e->hdr);
			e->iov[1].iov_base = e->payload;
			e->iov[1].iov_len = plen;
		}
	}
	own = r;
	__atomic_store_n(&rings, 1, __ATOMIC_RELAXED);
	r->in_run = 1; /* one submission for all */
	ret = 0;
	for (i = 0; i < r->nent && !ret; i++) {
		ret = ent_cmd(r, &r->ents[i], FUSE_IO_URING_CMD_REGISTER);
		r->live += !ret;
	}
	r->in_run = 0;
	if (ret)
		goto err_ring;
	ret = io_uring_submit(&r->ring);
	if (ret < 0)
		goto err_ring;
	*out = r;
	return 0;
err_ring:
	furing_free(r);
	return ret ? ret : -ENOMEM;
err_alloc:
	if (r->kickfd >= 0)
		close(r->kickfd);
	free(r->ents);
	free(r);
	return ret;
}

/* Copy the reply after its header into dst: its length, or -EMSGSIZE. */
static ssize_t gather(const struct iovec *iov, int count, char *dst, size_t cap)
{
	size_t skip = sizeof(struct fuse_out_header), n = 0;
	int i;

	for (i = 0; i < count; i++) {
		const char *src = iov[i].iov_base;
		size_t len = iov[i].iov_len;

		if (skip) {
			size_t s = skip < len ? skip : len;

			src += s;
			len -= s;
			skip -= s;
		}
		if (!len)
			continue;
		if (n + len > cap)
			return -EMSGSIZE;
		memmove(dst + n, src, len);
		n += len;
	}
	return n;
}

static void commit(struct fent *e)
{
	struct furing *r = e->r;

	if (r == own) {
		ent_cmd(r, e, FUSE_IO_URING_CMD_COMMIT_AND_FETCH);
		return;
	}
	{
		uint64_t one = 1;
		struct fent *head =
			__atomic_load_n(&r->pending, __ATOMIC_RELAXED);

		do
			e->pnext = head;
		while (!__atomic_compare_exchange_n(&r->pending, &head, e, 1,
						    __ATOMIC_RELEASE,
						    __ATOMIC_RELAXED));
		(void)!write(r->kickfd, &one, sizeof(one));
	}
}

int furing_reply(const struct iovec *iov, int count)
{
	const struct fuse_out_header *oh = iov[0].iov_base;
	struct fuse_out_header h;
	struct fent *e;
	ssize_t n;
	int stage;

	if (count < 1 || iov[0].iov_len < sizeof(*oh) || !oh->unique)
		return 0;
	e = utab_take(oh->unique);
	if (!e)
		return 0;
	h = *oh;
	/* the request is still being read by its op: stage the reply */
	stage = own && own->serving == e && e->req_psz;
	n = gather(iov, count, stage ? own->stage : e->payload,
		   stage ? own->stage_cap : e->payload_len);
	if (n < 0) {
		h.error = -EIO;
		n = 0;
	}
	memcpy(e->hdr->in_out, &h, sizeof(h));
	e->hdr->ring_ent_in_out.payload_sz = n;
	if (stage) {
		e->staged = 1;
		own->stage_len = n;
		return 1;
	}
	commit(e);
	return 1;
}

static void serve_ent(struct furing *r, struct fent *e,
		      void (*serve)(void *, char *, size_t), void *arg)
{
	struct fuse_in_header ih;
	uint32_t psz = e->hdr->ring_ent_in_out.payload_sz;
	size_t s0;
	char *buf;

	memcpy(&ih, e->hdr->in_out, sizeof(ih));
	e->unique = ih.unique;
	e->state = ENT_USER;
	e->staged = 0;
	if (ih.len < sizeof(ih) + psz || psz > e->payload_len ||
	    ih.len - sizeof(ih) - psz > FUSE_URING_OP_IN_OUT_SZ) {
		struct fuse_out_header h = { sizeof(h), -EIO, ih.unique };

		memcpy(e->hdr->in_out, &h, sizeof(h));
		e->hdr->ring_ent_in_out.payload_sz = 0;
		commit(e);
		return;
	}
	s0 = ih.len - sizeof(ih) - psz;
	buf = e->payload - s0 - sizeof(ih);
	memcpy(buf, &ih, sizeof(ih));
	memcpy(buf + sizeof(ih), e->hdr->op_in, s0);
	e->req_psz = psz;
	if (utab_add(e)) { /* cannot happen: more slots than entries */
		struct fuse_out_header h = { sizeof(h), -EIO, ih.unique };

		memcpy(e->hdr->in_out, &h, sizeof(h));
		e->hdr->ring_ent_in_out.payload_sz = 0;
		commit(e);
		return;
	}
	__atomic_add_fetch(&served, 1, __ATOMIC_RELAXED);
	r->serving = e;
	serve(arg, buf, ih.len);
	r->serving = NULL;
	if (e->staged) {
		e->staged = 0;
		memcpy(e->payload, r->stage, r->stage_len);
		commit(e);
	}
}

int furing_run(struct furing *r, void (*serve)(void *, char *, size_t),
	       void *arg)
{
	struct io_uring_cqe *cqe;
	struct fent *p;

	r->in_run = 1;
	/* the eventfd first: what comes after it is told again */
	(void)!read(r->kickfd, &r->kickbuf, sizeof(r->kickbuf));
	io_uring_get_events(&r->ring); /* copies the requests queued */
	while (!io_uring_peek_cqe(&r->ring, &cqe)) {
		struct fent *e = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		io_uring_cqe_seen(&r->ring, cqe);
		if (res < 0) { /* torn down (-ENOTCONN), refused */
			if (e->state != ENT_DEAD && r->live)
				r->live--;
			e->state = ENT_DEAD;
			continue;
		}
		serve_ent(r, e, serve, arg);
	}
	p = __atomic_exchange_n(&r->pending, NULL, __ATOMIC_ACQUIRE);
	while (p) {
		struct fent *next = p->pnext;

		ent_cmd(r, p, FUSE_IO_URING_CMD_COMMIT_AND_FETCH);
		p = next;
	}
	r->in_run = 0;
	if (r->dirty)
		submit(r);
	return r->live ? 0 : -ENOTCONN;
}
