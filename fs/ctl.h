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
/* the FLAGS: CTL_F_* in cache.h */

struct ctl_req {
	char cmd[32];
	int proto;
	unsigned nargs, flags;
	char **args;
};

void ctl_say(int fd, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void ctl_send_all(int fd, const char *buf, size_t len);

/* ctlfile.c: warm, pin, unpin, evict, status and flush of PATHs (relative
 * to the mount); answers on fd, "ok" or "error ..." last. */
void ctl_file_command(struct fs *fs, int fd, const struct ctl_req *req);

#endif
