/* tests: fs/proto.c's hooks on a real libfuse session over a socket pair
 * (this test plays the kernel): what the INIT and open replies grant, the
 * kill flags the ops see, the request counters. */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../fs/proto.h"
#include "check.h"

#ifndef FUSE_DIRECT_IO_ALLOW_MMAP
#define FUSE_DIRECT_IO_ALLOW_MMAP (1ULL << 36)
#endif
#ifndef FOPEN_PARALLEL_DIRECT_WRITES
#define FOPEN_PARALLEL_DIRECT_WRITES (1 << 6)
#endif

static int peer = -1; /* the kernel's end of the pair */
static struct fuse_session *se;
static uint64_t next_unique = 2;
static int seen_kill = -1; /* what the last write or open op was told */

static void t_init(void *ud, struct fuse_conn_info *conn)
{
	proto_init(conn);
}

static void t_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	seen_kill = proto_open_kill();
	proto_open(fi);
	fuse_reply_open(req, fi);
}

static void t_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
		    size_t size, off_t off, struct fuse_file_info *fi)
{
	seen_kill = proto_write_kill();
	fuse_reply_write(req, size);
}

static const struct fuse_lowlevel_ops ops = {
	.init = t_init,
	.open = t_open,
	.write = t_write,
};

/* One request as the kernel sends it, served by the session; the reply's
 * length (its bytes in reply), or -1. */
static ssize_t serve(uint32_t opcode, const void *arg, size_t len,
		     const void *data, size_t dlen, void *reply, size_t rlen)
{
	char msg[8192];
	struct fuse_in_header *h = (void *)msg;
	struct fuse_buf fbuf;
	ssize_t n;

	memset(&fbuf, 0, sizeof(fbuf));
	memset(h, 0, sizeof(*h));
	h->len = sizeof(*h) + len + dlen;
	h->opcode = opcode;
	h->unique = next_unique;
	next_unique += 2;
	h->nodeid = opcode == FUSE_INIT ? 0 : 2;
	memcpy(h + 1, arg, len);
	if (dlen)
		memcpy((char *)(h + 1) + len, data, dlen);
	if (write(peer, msg, h->len) != (ssize_t)h->len)
		return -1;
	if (fuse_session_receive_buf(se, &fbuf) <= 0)
		return -1;
	fuse_session_process_buf(se, &fbuf);
	free(fbuf.mem);
	n = read(peer, reply, rlen);
	if (n < (ssize_t)sizeof(struct fuse_out_header) ||
	    ((struct fuse_out_header *)reply)->unique != h->unique)
		return -1;
	return n;
}

static struct fuse_init_out init(uint64_t offer)
{
	struct fuse_init_in in;
	char reply[256];
	struct fuse_init_out out;

	memset(&in, 0, sizeof(in));
	memset(&out, 0, sizeof(out));
	in.major = 7;
	in.minor = 41;
	in.max_readahead = 1 << 20;
	in.flags = (uint32_t)offer | FUSE_INIT_EXT;
	in.flags2 = offer >> 32;
	CHECK_EQ(serve(FUSE_INIT, &in, sizeof(in), NULL, 0, reply,
		       sizeof(reply)),
		 sizeof(struct fuse_out_header) + sizeof(out));
	memcpy(&out, reply + sizeof(struct fuse_out_header), sizeof(out));
	return out;
}

/* An open's reply flags; *kill what the op was told. */
static uint32_t open_flags(uint32_t flags, uint32_t kflags, int *kill)
{
	struct fuse_open_in in = { .flags = flags, .open_flags = kflags };
	char reply[256];
	struct fuse_open_out out;

	seen_kill = -1;
	CHECK_EQ(serve(FUSE_OPEN, &in, sizeof(in), NULL, 0, reply,
		       sizeof(reply)),
		 sizeof(struct fuse_out_header) + sizeof(out));
	memcpy(&out, reply + sizeof(struct fuse_out_header), sizeof(out));
	*kill = seen_kill;
	return out.open_flags;
}

static int write_kill(uint32_t wflags)
{
	struct fuse_write_in in = { .size = 4, .write_flags = wflags };
	char reply[256];

	seen_kill = -1;
	CHECK_EQ(serve(FUSE_WRITE, &in, sizeof(in), "data", 4, reply,
		       sizeof(reply)),
		 sizeof(struct fuse_out_header) +
			 sizeof(struct fuse_write_out));
	return seen_kill;
}

static void session(unsigned int features)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	int sv[2];

	fuse_opt_add_arg(&args, "test_proto");
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv))
		abort();
	se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
	if (!se)
		abort();
	peer = sv[1];
	CHECK_EQ(proto_attach(se, sv[0], features), 0);
	fuse_opt_free_args(&args);
}

/* Everything offered and asked for. */
static void test_all_granted(void)
{
	uint64_t offer = FUSE_HANDLE_KILLPRIV_V2 | FUSE_DIRECT_IO_ALLOW_MMAP |
			 FUSE_ASYNC_READ | FUSE_BIG_WRITES;
	struct fuse_init_out out;
	char stats[1024];
	uint32_t f;
	int kill;

	session(PROTO_KILLPRIV_V2 | PROTO_DIRECT_IO);
	out = init(offer);
	CHECK(out.flags & FUSE_HANDLE_KILLPRIV_V2);
	CHECK(out.flags & FUSE_INIT_EXT);
	CHECK(out.flags2 & (FUSE_DIRECT_IO_ALLOW_MMAP >> 32));

	/* O_DIRECT: direct and parallel; buffered: neither */
	f = open_flags(O_RDWR | O_DIRECT, 0, &kill);
	CHECK(f & FOPEN_DIRECT_IO);
	CHECK(f & FOPEN_PARALLEL_DIRECT_WRITES);
	CHECK_EQ(kill, 0);
	f = open_flags(O_RDWR | O_TRUNC, FUSE_OPEN_KILL_SUIDGID, &kill);
	CHECK(!(f & (FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES)));
	CHECK_EQ(kill, 1);

	/* the write's kill flag, request by request */
	CHECK_EQ(write_kill(FUSE_WRITE_KILL_SUIDGID), 1);
	CHECK_EQ(write_kill(0), 0);
	CHECK_EQ(write_kill(FUSE_WRITE_KILL_SUIDGID | FUSE_WRITE_LOCKOWNER), 1);

	CHECK(proto_stats(stats, sizeof(stats)) > 0);
	CHECK(strstr(stats, " OPEN 2") != NULL);
	CHECK(strstr(stats, " WRITE 3") != NULL);
	CHECK(strstr(stats, " INIT 1") != NULL);
	CHECK(strstr(stats, "at most 1 WRITEs in flight") != NULL);
	CHECK(strstr(stats, "granted KILLPRIV_V2 DIRECT_IO_ALLOW_MMAP"));
	if (check_failures)
		fprintf(stderr, "%s\n", stats);
}

/* What the kernel does not offer is not granted, and O_DIRECT opens stay
 * cached without FUSE_DIRECT_IO_ALLOW_MMAP (MAP_SHARED must keep working). */
static void test_not_offered(void)
{
	struct fuse_init_out out;
	int kill;

	session(PROTO_KILLPRIV_V2 | PROTO_DIRECT_IO);
	out = init(FUSE_ASYNC_READ);
	CHECK(!(out.flags & FUSE_HANDLE_KILLPRIV_V2));
	CHECK(!(out.flags2 & (FUSE_DIRECT_IO_ALLOW_MMAP >> 32)));
	CHECK(!(open_flags(O_RDWR | O_DIRECT, 0, &kill) & FOPEN_DIRECT_IO));
}

/* Offered but not asked for: nothing changes. */
static void test_not_asked(void)
{
	struct fuse_init_out out;
	int kill;

	session(0);
	out = init(FUSE_HANDLE_KILLPRIV_V2 | FUSE_DIRECT_IO_ALLOW_MMAP);
	CHECK(!(out.flags & FUSE_HANDLE_KILLPRIV_V2));
	CHECK(!(out.flags2 & (FUSE_DIRECT_IO_ALLOW_MMAP >> 32)));
	CHECK(!(open_flags(O_RDWR | O_DIRECT, 0, &kill) & FOPEN_DIRECT_IO));
	/* the flags are still seen: a kernel sends them on direct writes */
	CHECK_EQ(write_kill(FUSE_WRITE_KILL_SUIDGID), 1);
}

/* Each case in a child: the hooks serve one session per process. */
static void in_child(void (*fn)(void), const char *name)
{
	int status;
	pid_t pid;

	fflush(stdout);
	pid = fork();

	if (pid == 0) {
		check_failures = 0;
		fn();
		exit(check_failures ? 1 : 0);
	}
	waitpid(pid, &status, 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		check_failures++;
	printf("%s %s\n",
	       WIFEXITED(status) && !WEXITSTATUS(status) ? "ok  " : "FAIL",
	       name);
}

int main(void)
{
	in_child(test_all_granted, "test_all_granted");
	in_child(test_not_offered, "test_not_offered");
	in_child(test_not_asked, "test_not_asked");
	return CHECK_DONE();
}
