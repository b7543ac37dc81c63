/* fs: one control-socket client's connection — answers sent within a
 * total wait, a client that stops reading dropped. */
#define _GNU_SOURCE
#include "ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <syslog.h>
#include <time.h>

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000ull + ts.tv_nsec / 1000000;
}

void ctl_conn_init(struct ctl_conn *cn, int fd)
{
	memset(cn, 0, sizeof(*cn));
	cn->fd = fd;
	cn->what = "a request";
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Nothing more for this client: its socket shut down (client_gone in
 * ctlfile.c then sees it gone), said once in the log. */
static void drop(struct ctl_conn *cn, int err)
{
	if (cn->dropped)
		return;
	cn->dropped = 1;
	shutdown(cn->fd, SHUT_RDWR);
	if (err == ETIMEDOUT)
		log_msg(LOG_WARNING,
			"control socket: a client is not reading its answer "
			"to %.31s: dropped after %d s of waiting for it",
			cn->what, CTL_SEND_WAIT_MS / 1000);
}

/*
 * All of buf, or nothing more once the client is dropped: a send that
 * would block waits for room while the client's total wait lasts.
 */
void ctl_send_all(struct ctl_conn *cn, const char *buf, size_t len)
{
	while (len && !cn->dropped) {
		ssize_t n = send(cn->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		struct pollfd p = { cn->fd, POLLOUT, 0 };
		uint64_t t;

		if (n > 0) {
			buf += n;
			len -= n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
			drop(cn, n ? errno : EPIPE);
			return;
		}
		if (cn->send_wait_ms >= CTL_SEND_WAIT_MS) {
			drop(cn, ETIMEDOUT);
			return;
		}
		t = mono_ms();
		poll(&p, 1, CTL_SEND_WAIT_MS - cn->send_wait_ms);
		cn->send_wait_ms += mono_ms() - t;
	}
}

void ctl_say(struct ctl_conn *cn, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n > 0)
		ctl_send_all(cn, buf,
			     n < (int)sizeof(buf) ? n : (int)sizeof(buf) - 1);
}

/* What fd has to read, waiting until deadline: bytes, 0 at the end of
 * the stream, or -errno (-ETIMEDOUT). */
static ssize_t recv_by(struct ctl_conn *cn, char *buf, size_t len,
		       uint64_t deadline)
{
	for (;;) {
		ssize_t n = recv(cn->fd, buf, len, MSG_DONTWAIT);
		struct pollfd p = { cn->fd, POLLIN, 0 };
		uint64_t t;

		if (n >= 0)
			return n;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		t = mono_ms();
		if (t >= deadline)
			return -ETIMEDOUT;
		poll(&p, 1, deadline - t);
	}
}

/*
 * A request (ctl.h): the header line, then its NARGS arguments, each ended
 * by a NUL.  Each byte is looked at once, wherever the reads end: pos is
 * where the search for the header's newline, then for the next NUL, goes
 * on after the next read.
 */
int ctl_read_request(struct ctl_conn *cn, size_t max, struct ctl_req *req,
		     char **bufp)
{
	uint64_t deadline = mono_ms() + CTL_REQ_WAIT_MS;
	size_t len = 0, cap = max < 4096 ? max : 4096, hdr = 0, pos = 0, off;
	char *buf = malloc(cap), *p;
	unsigned found = 0, i;
	ssize_t n;

	*bufp = buf;
	memset(req, 0, sizeof(*req));
	if (!buf)
		return -ENOMEM;
	for (;;) {
		if (!hdr && (p = memchr(buf + pos, '\n', len - pos))) {
			*p = 0;
			hdr = pos = p - buf + 1;
			buf[strcspn(buf, "\r")] = 0;
			sscanf(buf, "%31s %d %u %u", req->cmd, &req->proto,
			       &req->nargs, &req->flags);
			/* each argument takes a byte at least */
			if (req->nargs > max - hdr)
				return -E2BIG;
		}
		while (hdr && found < req->nargs &&
		       (p = memchr(buf + pos, 0, len - pos))) {
			pos = p - buf + 1;
			found++;
		}
		if (hdr && found == req->nargs)
			break;
		pos = len;
		if (len + 1 >= cap) {
			size_t nc = cap * 2 < max ? cap * 2 : max;
			char *nb;

			if (cap >= max)
				return -E2BIG;
			nb = realloc(buf, nc);
			if (!nb)
				return -ENOMEM;
			*bufp = buf = nb;
			cap = nc;
		}
		n = recv_by(cn, buf + len, cap - 1 - len, deadline);
		if (n <= 0)
			return n ? n : -ECONNRESET;
		len += n;
		buf[len] = 0;
	}
	req->args = calloc(req->nargs + 1, sizeof(char *));
	if (!req->args)
		return -ENOMEM;
	for (i = 0, off = hdr; i < req->nargs; i++) {
		req->args[i] = buf + off;
		off += strlen(buf + off) + 1;
	}
	return 0;
}

/* What the client still sends after a request too large: read and
 * dropped, so that its writes end and it reads the answer. */
void ctl_discard(struct ctl_conn *cn)
{
	uint64_t deadline = mono_ms() + CTL_REQ_WAIT_MS;
	size_t total = 0;
	char buf[16384];
	ssize_t n;

	while (total < CTL_DISCARD_MAX &&
	       (n = recv_by(cn, buf, sizeof(buf), deadline)) > 0)
		total += n;
}
