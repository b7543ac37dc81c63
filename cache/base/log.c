/* cache: logging to stderr in the foreground, to syslog otherwise. */

#include <stdarg.h>
#include <stdio.h>
#include <syslog.h>
#include <time.h>

#include "base.h"

static int log_where = LOG_TO_STDERR;

void log_setup(int where)
{
	log_where = where;
	if (where == LOG_TO_SYSLOG)
		openlog("nvcachefs", LOG_PID, LOG_DAEMON);
}

void log_msg(int prio, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	if (log_where == LOG_TO_SYSLOG) {
		vsyslog(prio, fmt, ap);
	} else {
		static const char *const names[] = { "emerg",	"alert",
						     "crit",	"error",
						     "warning", "notice",
						     "info",	"debug" };

		fprintf(stderr, "nvcachefs: %s: ", names[prio & 7]);
		vfprintf(stderr, fmt, ap);
		fputc('\n', stderr);
	}
	va_end(ap);
}
