/* fs: the control socket's requests, shared by ctl.c and ctlfile.c. */
#ifndef NVC_FS_CTL_H
#define NVC_FS_CTL_H

#include <stddef.h>
#include <stdint.h>

#include "fs.h"

/*
 * A request (protocol 5): one header line "COMMAND PROTO NARGS FLAGS", then
 * NARGS arguments, each ended by a NUL, so that a path may hold any byte but
 * NUL (a newline too).  Older clients send the header alone.
 */
#define CTL_REQ_MAX (1024 * 1024) /* bytes of a request, at most */
/* from a client not the owner (stats and version take no arguments) */
#define CTL_READER_REQ_MAX 4096
/* a request has this long to arrive, in all (not per read) */
#define CTL_REQ_WAIT_MS 5000
/* after a request too large: what follows is read and dropped, this many
 * bytes at most and for CTL_REQ_WAIT_MS at most */
#define CTL_DISCARD_MAX (16 * 1024 * 1024)
/* the FLAGS: CTL_F_* in cache.h */

struct ctl_req {
	char cmd[32];
	int proto;
	unsigned nargs, flags;
	char **args;
};

/*
 * One client's connection (ctlconn.c).  Its answers may wait for the client
 * to read CTL_SEND_WAIT_MS in all, not per line: a client that stops
 * reading is then dropped (its socket shut down, nothing more sent, the
 * command goes on or stops as it would for a client gone away), so that it
 * cannot hold up the command it asked for.
 */
#define CTL_SEND_WAIT_MS 5000

struct ctl_conn {
	int fd; /* non-blocking */
	int dropped; /* stopped reading, or gone: nothing more is sent */
	uint64_t send_wait_ms; /* how long sends have waited, in all */
	const char *what; /* the command, for the log */
};

void ctl_conn_init(struct ctl_conn *cn, int fd);
void ctl_say(struct ctl_conn *cn, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void ctl_send_all(struct ctl_conn *cn, const char *buf, size_t len);
/* A request of max bytes at most, in CTL_REQ_WAIT_MS: 0, or -errno
 * (-E2BIG: too large, -ETIMEDOUT).  *bufp is the caller's to free, and
 * req->args (nargs + 1 entries, the last NULL) point into it. */
int ctl_read_request(struct ctl_conn *cn, size_t max, struct ctl_req *req,
		     char **bufp);
void ctl_discard(struct ctl_conn *cn);

/* ctlfile.c: warm, pin, unpin, evict, status and flush of PATHs (relative
 * to the mount); answers on cn, "ok" or "error ..." last. */
void ctl_file_command(struct fs *fs, struct ctl_conn *cn,
		      const struct ctl_req *req);

#endif
