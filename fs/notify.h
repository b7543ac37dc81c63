/* fs: the daemon's reports to systemd (sd_notify): READY, STATUS, STOPPING. */
#ifndef NVC_FS_NOTIFY_H
#define NVC_FS_NOTIFY_H

#include <stdint.h>

struct cache;

/* With NOTIFY_SOCKET set, start the thread that sends READY=1 once the mount
 * at mnt answers and STATUS every NOTIFY_PERIOD_MS after; without it, do
 * nothing.  Call after fuse_session_mount, before the request loop runs. */
void notify_start(struct cache *c, const char *mnt);
/* The loop has ended: STOPPING=1 and what the stop will do with the dirty
 * data (flush: 1 destages it, 0 keeps it); no running STATUS after it. */
void notify_stopping(int flush);
/* A cache_progress_fn for the flush at stop: STATUS with its progress. */
void notify_flush_progress(void *arg, uint64_t dirty, uint64_t destaged);
/* Join the thread and free what notify_start took. */
void notify_end(void);

#endif
