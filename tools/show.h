/* tools: how nvcachectl shows a statistics snapshot — text, interval lines,
 * JSON and the Prometheus text exposition format. */
#ifndef NVC_SHOW_H
#define NVC_SHOW_H

#include <stdio.h>

#include "../cache/base/stats.h"

/* The full summary of s (counters since the last reset). */
void show_text(FILE *out, const char *mnt, const struct stat_snap *s);
/* Each cache device and mirror: its role, name and state (io: and its
 * I/O counters). */
void show_devices(FILE *out, const struct stat_snap *s, int io);
/* One line per interval, iostat style: what happened in d, then totals t. */
void show_interval_header(FILE *out);
void show_interval(FILE *out, const struct stat_snap *d,
		   const struct stat_snap *t, double secs);
/* JSON: the snapshot; with an interval (d, secs) as well when d != NULL. */
int show_json(FILE *out, const char *mnt, const struct stat_snap *t,
	      const struct stat_snap *d, double secs, int pretty);
void show_prometheus(FILE *out, const char *mnt, const struct stat_snap *s);

/* "12.5 MiB", "3m05s" */
void show_bytes(double b, char *out, size_t len);
void show_span(double secs, char *out, size_t len);

/* Derived figures, shared by every format. */
double show_ratio(uint64_t part, uint64_t whole);
/* Seconds to destage the dirty data at the current rate; < 0: unknown. */
double show_drain_seconds(const struct stat_snap *s);

#endif
