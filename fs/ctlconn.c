/* fs: one control-socket client's connection — answers sent within a
 * total wait, a client that stops reading dropped. */
#define _GNU_SOURCE
#include "ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
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
