/* tools: nvcachectl's per-file commands (filecmds.c), and the control
 * socket connection they share with nvcachectl.c. */
#ifndef NVC_FILECMDS_H
#define NVC_FILECMDS_H

#include <stddef.h>
#include <stdio.h>

/* Connect to the daemon of mountpoint and send the len bytes of req; the
 * answer is read from *out.  0, or 1 with a message said. */
int ctl_connect_len(const char *mountpoint, const char *req, size_t len,
		    FILE **out);
struct stat_snap;
/* One statistics snapshot from the daemon behind mnt; 0 or an exit code. */
int ctl_fetch_stats(const char *mnt, struct stat_snap *s);
/* "nvcachectl: " and the message on stderr; returns 1, the exit code. */
int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* warm, pin, unpin, evict, status; flush MOUNTPOINT PATH...: argv[0] is
 * the command.  The exit code. */
int cmd_file(const char *cmd, int argc, char **argv);

#endif
