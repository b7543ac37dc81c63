/* cache: statistics — the one table of counters and latency histograms, their
 * lock-free sharded store, and the snapshot that nvcachectl reads. */
#ifndef NVC_STATS_H
#define NVC_STATS_H

#include <stdint.h>
#include <stdio.h>

#define STAT_MAX_DEVS 16

/*
 * The tables.  Every figure is declared once here, with its unit and help
 * text; the daemon's snapshot, the wire format, the text summary, JSON and
 * the Prometheus exposition all iterate these lists, so nothing is shown in
 * one place and missing from another.
 *
 * X(name, unit, help); unit is "ops" or "bytes" for counters (Prometheus:
 * nvcachefs_<name>_total) and "bytes", "bytes_per_second", "seconds" or "" for
 * gauges.
 */
#define STAT_COUNTERS(X)                                                       \
	X(read_ops, "ops", "read requests that reached the daemon")            \
	X(read_hit_ops, "ops", "reads served entirely from the cache devices") \
	X(read_miss_ops, "ops",                                                \
	  "reads served entirely from the backing store")                      \
	X(read_partial_ops, "ops", "reads served partly from each")            \
	X(read_bytes, "bytes", "bytes returned by reads")                      \
	X(read_hit_bytes, "bytes", "bytes read from the cache devices")        \
	X(read_miss_bytes, "bytes", "bytes read from the backing store")       \
	X(write_ops, "ops", "write requests that reached the daemon")          \
	X(write_hit_ops, "ops", "writes that overwrote cached blocks only")    \
	X(write_bytes, "bytes", "bytes written by the application")            \
	X(bypass_ops, "ops",                                                   \
	  "reads and writes that went to the backing store around the cache")  \
	X(read_bypass_bytes, "bytes",                                          \
	  "read misses served from the backing store and not kept: "          \
	  "sequential streams past cache.sequential_cutoff")                   \
	X(fsync_ops, "ops", "fsync and fdatasync requests")                    \
	X(meta_ops, "ops", "metadata requests (lookup, getattr, create, ...)") \
	X(fill_bytes, "bytes", "bytes of read misses kept in the cache")       \
	X(evictions, "ops", "clean cache blocks evicted for new data")         \
	X(destaged_bytes, "bytes",                                             \
	  "dirty bytes written back to the backing "                           \
	  "store")                                                             \
	X(destage_errors, "ops", "destage passes that failed and will retry")  \
	X(throttled_ops, "ops",                                                \
	  "writes slowed between the high watermark and full "                 \
	  "(destage.pace_writers)")                                            \
	X(write_around_bytes, "bytes",                                         \
	  "bytes of writes sent to the backing store around the cache "        \
	  "(no dirty copy, past destage.write_around)")                        \
	X(space_wait_ops, "ops",                                               \
	  "writes that waited for a free cache block (the cache full)")        \
	X(backing_read_bytes, "bytes", "bytes read from the backing store")    \
	X(backing_write_bytes, "bytes", "bytes written to the backing store")  \
	X(lost_found_files, "ops",                                             \
	  "files whose dirty data went to .nvcachefs-lost+found/")             \
	X(lost_found_bytes, "bytes", "dirty bytes put in lost+found")          \
	X(conflicts, "ops",                                                    \
	  "dirty files changed elsewhere since cached (backing.on_conflict)")  \
	X(revalidate_drops, "ops",                                             \
	  "opens that found the file changed elsewhere and dropped clean data") \
	X(stream_drops, "ops",                                                 \
	  "opens of a file last read as a stream past the cutoff that dropped " \
	  "its clean data to be served by FUSE passthrough")

#define STAT_GAUGES(X)                                                       \
	X(capacity_bytes, "bytes", "cache data capacity")                    \
	X(used_bytes, "bytes", "cache capacity holding valid data")          \
	X(dirty_bytes, "bytes", "data not yet in the backing store")         \
	X(slots, "", "cache blocks")                                         \
	X(used_slots, "", "cache blocks in use")                             \
	X(dirty_slots, "", "cache blocks with dirty data")                   \
	X(high_watermark_bytes, "bytes", "dirty level where destage starts") \
	X(low_watermark_bytes, "bytes", "dirty level where destage stops")   \
	X(destaging, "", "1 while the destager is writing back")             \
	X(destage_rate, "bytes_per_second",                                  \
	  "destage bandwidth over the last 10 seconds")                      \
	X(writer_pace, "",                                                   \
	  "how hard writers are slowed now: 0 at or below the high "         \
	  "watermark, 100 at full")                                          \
	X(writing_around, "",                                                \
	  "1 while writes with no dirty data in the cache go around it "     \
	  "(destage.write_around)")                                          \
	X(meta_repaired, "", "metadata records repaired at mount")           \
	X(uptime, "seconds", "seconds since mount")                          \
	X(since_reset, "seconds", "seconds since the counters were reset")   \
	X(resets, "", "times the counters were reset since mount")          \
	X(detached, "",                                                      \
	  "1 while detached: no cache, every request to the backing store") \
	X(ring_refusals, "",                                                 \
	  "device requests an io_uring refused, done synchronously since "   \
	  "start (not device errors)")                                       \
	X(open_handles, "", "files open through the mount now")              \
	X(passthrough_handles, "",                                           \
	  "of them, opens the kernel serves from the store (FUSE "           \
	  "passthrough)")

/* Latencies as the application sees them, and of the store behind. */
#define STAT_LATS(X)                                               \
	X(read, "read requests, as the application sees them")     \
	X(write, "write requests, as the application sees them")   \
	X(fsync, "fsync requests, as the application sees them")   \
	X(meta, "metadata requests, as the application sees them") \
	X(backing_read, "reads from the backing store")            \
	X(backing_write, "writes to the backing store")            \
	X(backing_fsync, "fsyncs of backing files")                \
	X(destage, "destage passes (one file: read, write back, fsync)") \
	X(pace, "holds of writes slowed past the high watermark")

#define STAT_DEV_COUNTERS(X)                                                 \
	X(read_ops, "ops", "reads issued to the device")                     \
	X(read_bytes, "bytes", "bytes read from the device")                 \
	X(write_ops, "ops", "writes issued to the device")                   \
	X(write_bytes, "bytes", "bytes written to the device")               \
	X(flush_ops, "ops", "cache flushes issued to the device")            \
	X(hit_bytes, "bytes", "application read bytes served by the device") \
	X(errors, "ops", "failed I/O requests")

#define STAT_DEV_GAUGES(X)                                           \
	X(used_bytes, "bytes", "device capacity holding valid data") \
	X(dirty_bytes, "bytes", "dirty data on the device")          \
	X(failed, "",                                                \
	  "1: failed while mounted, 2: missing at mount (fenced), 3: "  \
	  "detached, 4: draining, 5: removed; no new data goes to it; " \
	  "6: rebuilding onto its replacement")                        \
	X(rebuild_bytes, "bytes",                                    \
	  "bytes to copy onto its replacement (nvcachectl replace)")  \
	X(rebuild_left_bytes, "bytes",                               \
	  "bytes still to copy onto its replacement")

/* the failed gauge of a device */
enum stat_dev_state {
	STAT_DEV_OK,
	STAT_DEV_FAILED,
	STAT_DEV_MISSING,
	STAT_DEV_DETACHED, /* closed by nvcachectl detach */
	STAT_DEV_DRAINING, /* being emptied by nvcachectl remove */
	STAT_DEV_REMOVED, /* removed by nvcachectl remove: never used again */
	STAT_DEV_REBUILDING /* its blocks copied onto a replacement */
};

#define STAT_DEV_LATS(X)          \
	X(read, "device reads")   \
	X(write, "device writes") \
	X(flush, "device cache flushes")

#define STAT_C(name, ...) STAT_C_##name,
#define STAT_G(name, ...) STAT_G_##name,
#define STAT_L(name, ...) STAT_L_##name,
#define STAT_DC(name, ...) STAT_DC_##name,
#define STAT_DG(name, ...) STAT_DG_##name,
#define STAT_DL(name, ...) STAT_DL_##name,
enum stat_counter { STAT_COUNTERS(STAT_C) STAT_NCOUNTERS };
enum stat_gauge { STAT_GAUGES(STAT_G) STAT_NGAUGES };
enum stat_lat { STAT_LATS(STAT_L) STAT_NLATS };
enum stat_dev_counter { STAT_DEV_COUNTERS(STAT_DC) STAT_NDEV_COUNTERS };
enum stat_dev_gauge { STAT_DEV_GAUGES(STAT_DG) STAT_NDEV_GAUGES };
enum stat_dev_lat { STAT_DEV_LATS(STAT_DL) STAT_NDEV_LATS };
#undef STAT_C
#undef STAT_G
#undef STAT_L
#undef STAT_DC
#undef STAT_DG
#undef STAT_DL

struct stat_desc {
	const char *name, *unit, *help;
};
extern const struct stat_desc stat_counter_desc[STAT_NCOUNTERS];
extern const struct stat_desc stat_gauge_desc[STAT_NGAUGES];
extern const struct stat_desc stat_lat_desc[STAT_NLATS];
extern const struct stat_desc stat_dev_counter_desc[STAT_NDEV_COUNTERS];
extern const struct stat_desc stat_dev_gauge_desc[STAT_NDEV_GAUGES];
extern const struct stat_desc stat_dev_lat_desc[STAT_NDEV_LATS];

/*
 * Latency histograms, HDR style: nanoseconds, exact below 64 ns, then 32
 * linear sub-buckets per power of two, so any value is known within 3.2%
 * (within 3 us at 100 us) up to 2^42 ns (73 minutes; longer is clamped into
 * the last bucket, while max stays exact).  The hiccup buckets count exactly,
 * in whole milliseconds as btest prints them: <1ms, 1ms, 2-10ms, 11-50ms,
 * 51-100ms and >100ms (that is, 101 ms and more).
 */
#define LAT_SUB_BITS 5
#define LAT_LINEAR (2u << LAT_SUB_BITS) /* 64 */
#define LAT_MAX_MSB 41
#define LAT_NBUCKETS \
	(LAT_LINEAR + (LAT_MAX_MSB - LAT_SUB_BITS) * (1u << LAT_SUB_BITS))
#define LAT_NHICCUPS 6

extern const char *const lat_hiccup_names[LAT_NHICCUPS];

struct lat_hist {
	uint64_t count, sum_ns, max_ns;
	uint64_t hiccup[LAT_NHICCUPS];
	uint64_t b[LAT_NBUCKETS];
};

unsigned lat_bucket(uint64_t ns);
/* The range of values bucket i holds: [lo, hi]. */
void lat_bucket_range(unsigned i, uint64_t *lo, uint64_t *hi);
unsigned lat_hiccup(uint64_t ns);
/* The value below which a fraction q (0..1) of the samples lie, in ns: the
 * upper end of its bucket, never above the maximum seen; 0 when empty. */
uint64_t lat_quantile(const struct lat_hist *h, double q);
double lat_mean_ns(const struct lat_hist *h);

/*
 * The store.  Threads update one of STAT_SHARDS shards, picked once per
 * thread, with relaxed atomic adds: no lock, and threads rarely share a cache
 * line.  A reader sums the shards; it may see an operation's counter before
 * its latency (or the other way round) while that operation is in flight, but
 * never loses or invents one.
 */
#define STAT_SHARDS 8

struct stat_shard {
	uint64_t ctr[STAT_NCOUNTERS];
	uint64_t dev_ctr[STAT_MAX_DEVS][STAT_NDEV_COUNTERS];
	struct lat_hist lat[STAT_NLATS];
	struct lat_hist dev_lat[STAT_MAX_DEVS][STAT_NDEV_LATS];
} __attribute__((aligned(64)));

struct stat_store {
	struct stat_shard *shard; /* STAT_SHARDS of them */
	int timing; /* stats.latency: measure latencies at all */
};

int stat_store_init(struct stat_store *s, int timing);
void stat_store_free(struct stat_store *s);
struct stat_shard *stat_my_shard(struct stat_store *s);

static inline void stat_add(struct stat_store *s, enum stat_counter i,
			    uint64_t v)
{
	__atomic_fetch_add(&stat_my_shard(s)->ctr[i], v, __ATOMIC_RELAXED);
}

static inline void stat_dev_add(struct stat_store *s, int dev,
				enum stat_dev_counter i, uint64_t v)
{
	__atomic_fetch_add(&stat_my_shard(s)->dev_ctr[dev][i], v,
			   __ATOMIC_RELAXED);
}

/* One counter summed over the shards. */
uint64_t stat_total(struct stat_store *s, enum stat_counter i);

void lat_record(struct lat_hist *h, uint64_t ns);

/* Monotonic clock for latencies; 0 when timing is off. */
uint64_t stat_clock(const struct stat_store *s);

/* Record the time since t0 (from stat_clock); nothing when t0 is 0. */
static inline void stat_lat_since(struct stat_store *s, enum stat_lat i,
				  uint64_t t0)
{
	if (t0)
		lat_record(&stat_my_shard(s)->lat[i], stat_clock(s) - t0);
}

static inline void stat_dev_lat(struct stat_store *s, int dev,
				enum stat_dev_lat i, uint64_t ns)
{
	lat_record(&stat_my_shard(s)->dev_lat[dev][i], ns);
}

/*
 * The state of a metadata mirror, one per mirror in a snapshot.  The wire
 * format, the JSON and the Prometheus output carry the names; a new state is
 * added before STAT_MIRROR_NSTATES, with its name in stat_mirror_state_name
 * (and its wording in tools/show.c's text output).
 */
enum stat_mirror_state {
	STAT_MIRROR_OK, /* "ok" */
	STAT_MIRROR_REBUILT, /* "rebuilt": damaged or lost at mount, rebuilt
				from the other */
	STAT_MIRROR_MISSING, /* "missing": a device that is not there; the
				cache runs on the other mirror alone */
	STAT_MIRROR_FAILED, /* "failed": failed a write while mounted; the
			       cache runs on the other mirror alone, and it
			       is rebuilt at the next mount */
	STAT_MIRROR_NSTATES
};

extern const char *const stat_mirror_state_name[STAT_MIRROR_NSTATES];
/* The state named name, or -1. */
int stat_mirror_state_find(const char *name);

/*
 * A snapshot: the sum of the shards minus the baseline taken by the last
 * reset, plus gauges and the device and mirror states.  It is what the
 * daemon sends and nvcachectl reads (stat_write / stat_read), and what
 * intervals are computed on (stat_diff).
 */
struct stat_dev_snap {
	char path[256];
	uint64_t ctr[STAT_NDEV_COUNTERS];
	uint64_t gauge[STAT_NDEV_GAUGES];
	struct lat_hist lat[STAT_NDEV_LATS];
};

struct stat_snap {
	uint64_t time_ns; /* CLOCK_REALTIME when taken */
	uint64_t ctr[STAT_NCOUNTERS];
	uint64_t gauge[STAT_NGAUGES];
	struct lat_hist lat[STAT_NLATS];
	int ndevs;
	struct stat_dev_snap dev[STAT_MAX_DEVS];
	char mirror_path[2][256];
	int mirror_state[2]; /* enum stat_mirror_state */
	int timing;
};

#define STAT_CTR(snap, n) ((snap)->ctr[STAT_C_##n])
#define STAT_GAUGE(snap, n) ((snap)->gauge[STAT_G_##n])
#define STAT_LAT(snap, n) ((snap)->lat[STAT_L_##n])
#define STAT_DEV_CTR(snap, d, n) ((snap)->dev[d].ctr[STAT_DC_##n])
#define STAT_DEV_GAUGE(snap, d, n) ((snap)->dev[d].gauge[STAT_DG_##n])
#define STAT_DEV_LAT(snap, d, n) ((snap)->dev[d].lat[STAT_DL_##n])

/* Sum the shards into out's counters and histograms (gauges untouched). */
void stat_collect(struct stat_store *s, int ndevs, struct stat_snap *out);
/* b bytes for people: "512 B", "1.5 MiB". */
void stat_fmt_bytes(double b, char *out, size_t len);
/* out = a - b for counters and histograms; gauges and max are a's. */
void stat_diff(const struct stat_snap *a, const struct stat_snap *b,
	       struct stat_snap *out);
/* Zero the maxima in every shard (after a reset, max starts again). */
void stat_reset_max(struct stat_store *s);

/* The wire format: "key value" lines; histograms list non-empty buckets. */
int stat_write(FILE *out, const struct stat_snap *s);
/* Parse until "end"; -EPROTO on a malformed line, with the line in err. */
int stat_read(FILE *in, struct stat_snap *s, char *err, size_t errlen);

#endif
