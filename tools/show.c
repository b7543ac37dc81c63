/* tools: nvcachectl's views of a statistics snapshot — text, interval lines,
 * JSON and Prometheus. */
#define _GNU_SOURCE
#include "show.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <string.h>
#include <time.h>

static const double quantiles[] = { 0.5, 0.9, 0.99, 0.999 };
static const char *const quantile_names[] = { "p50", "p90", "p99", "p99.9" };
#define NQ 4

double show_ratio(uint64_t part, uint64_t whole)
{
	return whole ? (double)part / whole : 0.0;
}

double show_drain_seconds(const struct stat_snap *s)
{
	uint64_t dirty = STAT_GAUGE(s, dirty_bytes);
	uint64_t rate = STAT_GAUGE(s, destage_rate);

	if (!dirty)
		return 0;
	if (!rate)
		return -1;
	return (double)dirty / rate;
}

void show_bytes(double b, char *out, size_t len)
{
	stat_fmt_bytes(b, out, len);
}

void show_span(double secs, char *out, size_t len)
{
	uint64_t s = secs;

	if (secs < 60)
		snprintf(out, len, "%.0f s", secs);
	else if (s < 3600)
		snprintf(out, len, "%" PRIu64 "m%02" PRIu64 "s", s / 60,
			 s % 60);
	else if (s < 86400)
		snprintf(out, len, "%" PRIu64 "h%02" PRIu64 "m", s / 3600,
			 s / 60 % 60);
	else
		snprintf(out, len, "%" PRIu64 "d%02" PRIu64 "h", s / 86400,
			 s / 3600 % 24);
}

/* A latency in the unit that suits it. */
static void lat_str(uint64_t ns, char *out, size_t len)
{
	if (ns < 1000000)
		snprintf(out, len, "%.1fus", ns / 1e3);
	else if (ns < 1000000000)
		snprintf(out, len, "%.2fms", ns / 1e6);
	else
		snprintf(out, len, "%.2fs", ns / 1e9);
}

/* ----------------------------------------------------------------- text */

static void lat_row(FILE *out, const char *name, const struct lat_hist *h)
{
	char v[NQ + 2][16];
	int i;

	if (!h->count) {
		fprintf(out, "%-16s %9s\n", name, "0");
		return;
	}
	lat_str(lat_mean_ns(h), v[0], sizeof(v[0]));
	for (i = 0; i < NQ; i++)
		lat_str(lat_quantile(h, quantiles[i]), v[i + 1], sizeof(v[0]));
	lat_str(h->max_ns, v[NQ + 1], sizeof(v[0]));
	fprintf(out, "%-16s %9" PRIu64, name, h->count);
	for (i = 0; i < NQ + 2; i++)
		fprintf(out, " %9s", v[i]);
	for (i = 0; i < LAT_NHICCUPS; i++)
		fprintf(out, " %8" PRIu64, h->hiccup[i]);
	fputc('\n', out);
}

static void text_latency(FILE *out, const struct stat_snap *s)
{
	char name[32];
	int i, d;

	if (!s->timing) {
		fprintf(out, "latency    not measured (stats.latency = off)\n");
		return;
	}
	fprintf(out, "%-16s %9s %9s", "latency", "count", "mean");
	for (i = 0; i < NQ; i++)
		fprintf(out, " %9s", quantile_names[i]);
	fprintf(out, " %9s", "max");
	for (i = 0; i < LAT_NHICCUPS; i++)
		fprintf(out, " %8s", lat_hiccup_names[i]);
	fputc('\n', out);
	for (i = 0; i < STAT_NLATS; i++)
		lat_row(out, stat_lat_desc[i].name, &s->lat[i]);
	for (d = 0; d < s->ndevs; d++)
		for (i = 0; i < STAT_NDEV_LATS; i++) {
			snprintf(name, sizeof(name), "dev%d_%s", d,
				 stat_dev_lat_desc[i].name);
			lat_row(out, name, &s->dev[d].lat[i]);
		}
}

/* A mirror's state: its name, and what the text output says of it. */
static const char *mirror_state_name(int st)
{
	return st >= 0 && st < STAT_MIRROR_NSTATES ? stat_mirror_state_name[st]
						   : "unknown";
}

static const char *mirror_text(int st)
{
	static const char *const text[STAT_MIRROR_NSTATES] = {
		[STAT_MIRROR_REBUILT] = "rebuilt at mount (it was lost or "
					"damaged)",
		[STAT_MIRROR_MISSING] = "MISSING: the device is not there; "
					"the metadata is on the other mirror "
					"alone",
		[STAT_MIRROR_FAILED] = "FAILED: a write failed while mounted; "
				       "the metadata is on the other mirror "
				       "alone until the next mount rebuilds "
				       "it",
	};

	return st >= 0 && st < STAT_MIRROR_NSTATES && text[st]
		       ? text[st]
		       : mirror_state_name(st);
}

/* A cache device's state (its failed gauge): its name, and its text. */
static const char *dev_state_name(uint64_t st)
{
	return st == STAT_DEV_OK	 ? "ok"
	       : st == STAT_DEV_FAILED	 ? "failed"
	       : st == STAT_DEV_MISSING	 ? "missing"
	       : st == STAT_DEV_DETACHED ? "detached"
	       : st == STAT_DEV_DRAINING ? "draining"
	       : st == STAT_DEV_REMOVED	 ? "removed"
	       : st == STAT_DEV_REBUILDING ? "rebuilding"
					 : "unknown";
}

static const char *dev_state_text(uint64_t st)
{
	return st == STAT_DEV_FAILED ? "FAILED: I/O errors while mounted"
	       : st == STAT_DEV_MISSING
		       ? "MISSING: gone or not this cache's at mount; its "
			 "dirty data is read from the second copies"
	       : st == STAT_DEV_REMOVED
		       ? "removed, or a spare place: not used (nvcachectl add "
			 "puts a device there)"
	       : st == STAT_DEV_DETACHED ? "detached: closed, not used"
	       : st == STAT_DEV_DRAINING
		       ? "DRAINING (nvcachectl remove): its data is being "
			 "destaged and dropped"
		       : dev_state_name(st);
}

void show_text(FILE *out, const char *mnt, const struct stat_snap *s)
{
	uint64_t cap = STAT_GAUGE(s, capacity_bytes);
	uint64_t rb = STAT_CTR(s, read_bytes), drain_rate;
	char a[32], b[64], c[32];
	double drain;

	show_span(STAT_GAUGE(s, uptime), a, sizeof(a));
	show_span(STAT_GAUGE(s, since_reset), b, sizeof(b));
	if (STAT_GAUGE(s, since_reset) < STAT_GAUGE(s, uptime))
		fprintf(out,
			"nvcachefs  %s, up %s; counters since a reset %s "
			"ago\n",
			mnt, a, b);
	else
		fprintf(out, "nvcachefs  %s, up %s; counters since mount\n",
			mnt, a);
	fprintf(out,
		"reads      %" PRIu64 " ops: %" PRIu64 " hits, %" PRIu64
		" misses, %" PRIu64 " partial\n",
		STAT_CTR(s, read_ops), STAT_CTR(s, read_hit_ops),
		STAT_CTR(s, read_miss_ops), STAT_CTR(s, read_partial_ops));
	fprintf(out,
		"           hit ratio %.1f%% of operations, %.1f%% of bytes\n",
		100 * show_ratio(STAT_CTR(s, read_hit_ops),
				 STAT_CTR(s, read_hit_ops) +
					 STAT_CTR(s, read_miss_ops) +
					 STAT_CTR(s, read_partial_ops)),
		100 * show_ratio(STAT_CTR(s, read_hit_bytes), rb));
	show_bytes(STAT_CTR(s, read_hit_bytes), a, sizeof(a));
	show_bytes(STAT_CTR(s, read_miss_bytes), b, sizeof(b));
	show_bytes(rb, c, sizeof(c));
	fprintf(out, "           %s from cache + %s from backing = %s\n", a, b,
		c);
	show_bytes(STAT_CTR(s, write_bytes), a, sizeof(a));
	fprintf(out,
		"writes     %" PRIu64 " ops, %" PRIu64
		" onto cached blocks only, %s; %" PRIu64
		" reads and writes bypassed the cache\n",
		STAT_CTR(s, write_ops), STAT_CTR(s, write_hit_ops), a,
		STAT_CTR(s, bypass_ops));
	fprintf(out, "fsync      %" PRIu64 " ops; metadata %" PRIu64 " ops\n",
		STAT_CTR(s, fsync_ops), STAT_CTR(s, meta_ops));
	if (STAT_GAUGE(s, detached))
		fprintf(out, "cache      DETACHED (nvcachectl detach): every "
			     "request goes to the backing store; nvcachectl "
			     "attach takes the devices back\n");
	show_bytes(STAT_GAUGE(s, used_bytes), a, sizeof(a));
	show_bytes(cap, b, sizeof(b));
	fprintf(out,
		"occupancy  %s of %s (%.1f%%), %" PRIu64 " of %" PRIu64
		" blocks in use\n",
		a, b, 100 * show_ratio(STAT_GAUGE(s, used_bytes), cap),
		STAT_GAUGE(s, used_slots), STAT_GAUGE(s, slots));
	show_bytes(STAT_GAUGE(s, dirty_bytes), a, sizeof(a));
	show_bytes(STAT_GAUGE(s, high_watermark_bytes), b, sizeof(b));
	fprintf(out,
		"dirty      %s (%.1f%%) in %" PRIu64
		" blocks; watermark destage starts at %s\n",
		a, 100 * show_ratio(STAT_GAUGE(s, dirty_bytes), cap),
		STAT_GAUGE(s, dirty_slots), b);
	drain_rate = STAT_GAUGE(s, destage_rate);
	show_bytes(drain_rate, a, sizeof(a));
	drain = show_drain_seconds(s);
	if (drain < 0)
		snprintf(b, sizeof(b), "not draining now");
	else
		show_span(drain, c, sizeof(c)),
			snprintf(b, sizeof(b), "drains in %s", c);
	fprintf(out, "destage    %s, %s/s over the last 10 s, %s\n",
		STAT_GAUGE(s, destaging) ? "destaging" : "idle", a,
		STAT_GAUGE(s, dirty_bytes) ? b : "nothing dirty");
	show_bytes(STAT_CTR(s, destaged_bytes), a, sizeof(a));
	show_bytes(STAT_CTR(s, fill_bytes), b, sizeof(b));
	fprintf(out,
		"           %s destaged, %" PRIu64 " failed passes; %" PRIu64
		" evictions; %s kept after misses\n",
		a, STAT_CTR(s, destage_errors), STAT_CTR(s, evictions), b);
	if (STAT_GAUGE(s, writer_pace))
		snprintf(b, sizeof(b), "slowed now (pace %" PRIu64 "%%)",
			 STAT_GAUGE(s, writer_pace));
	else
		snprintf(b, sizeof(b), "not slowed now");
	lat_str(STAT_LAT(s, pace).sum_ns, a, sizeof(a));
	lat_str(STAT_LAT(s, pace).count ? lat_quantile(&STAT_LAT(s, pace), 0.99)
					: 0,
		c, sizeof(c));
	fprintf(out,
		"           writers %s: %" PRIu64 " writes held %s in all"
		" (p99 %s) past the high watermark, %" PRIu64
		" waited for a free block\n",
		b, STAT_CTR(s, throttled_ops), a, c,
		STAT_CTR(s, space_wait_ops));
	show_bytes(STAT_CTR(s, write_around_bytes), a, sizeof(a));
	fprintf(out,
		"           %s written around the cache; writes with no dirty "
		"copy go %s\n",
		a,
		STAT_GAUGE(s, writing_around) ? "around it now (past "
						"destage.write_around)"
					      : "into it now");
	show_bytes(STAT_CTR(s, backing_read_bytes), a, sizeof(a));
	show_bytes(STAT_CTR(s, backing_write_bytes), b, sizeof(b));
	fprintf(out, "backing    %s read, %s written\n", a, b);
	if (STAT_GAUGE(s, meta_repaired))
		fprintf(out,
			"metadata   %" PRIu64 " records repaired at mount\n",
			STAT_GAUGE(s, meta_repaired));
	fputc('\n', out);
	text_latency(out, s);
	fputc('\n', out);
	show_devices(out, s, 1);
}

/* A device rebuilding onto its replacement: how far it is. */
static void show_rebuild(FILE *out, const struct stat_snap *s, int d)
{
	uint64_t total = STAT_DEV_GAUGE(s, d, rebuild_bytes);
	uint64_t left = STAT_DEV_GAUGE(s, d, rebuild_left_bytes);
	char a[32];

	show_bytes(left, a, sizeof(a));
	fprintf(out,
		"           REBUILDING onto its replacement (nvcachectl "
		"replace): %d%% copied, %s left\n",
		total ? (int)((total - left) * 100 / total) : 100, a);
}

void show_devices(FILE *out, const struct stat_snap *s, int io)
{
	char a[32], b[32], c[32];
	int d;

	for (d = 0; d < s->ndevs; d++) {
		const struct stat_dev_snap *v = &s->dev[d];

		show_bytes(STAT_DEV_GAUGE(s, d, used_bytes), a, sizeof(a));
		show_bytes(STAT_DEV_GAUGE(s, d, dirty_bytes), b, sizeof(b));
		fprintf(out, "device %d   %s  %s; used %s, dirty %s\n", d,
			v->path, dev_state_text(STAT_DEV_GAUGE(s, d, failed)),
			a, b);
		if (STAT_DEV_GAUGE(s, d, failed) == STAT_DEV_REBUILDING)
			show_rebuild(out, s, d);
		if (!io)
			continue;
		show_bytes(STAT_DEV_CTR(s, d, read_bytes), a, sizeof(a));
		show_bytes(STAT_DEV_CTR(s, d, write_bytes), b, sizeof(b));
		show_bytes(STAT_DEV_CTR(s, d, hit_bytes), c, sizeof(c));
		fprintf(out,
			"           %" PRIu64 " reads (%s), %" PRIu64
			" writes (%s), %" PRIu64
			" flushes; %s of read hits; %" PRIu64 " errors\n",
			STAT_DEV_CTR(s, d, read_ops), a,
			STAT_DEV_CTR(s, d, write_ops), b,
			STAT_DEV_CTR(s, d, flush_ops), c,
			STAT_DEV_CTR(s, d, errors));
	}
	for (d = 0; d < 2; d++)
		fprintf(out, "mirror %d   %s  %s\n", d, s->mirror_path[d],
			mirror_text(s->mirror_state[d]));
}

/* ------------------------------------------------------------- interval */

static void compact_bytes(double b, char *out, size_t len)
{
	char *sp;

	show_bytes(b, out, len);
	sp = strchr(out, ' ');
	if (sp)
		memmove(sp, sp + 1, strlen(sp));
}

void show_interval_header(FILE *out)
{
	fprintf(out,
		"%-8s %8s %6s %9s %8s %9s %6s %7s %9s %9s %10s %10s | %10s "
		"%6s %10s %10s\n",
		"time", "reads", "hit%", "read", "writes", "written", "fsync",
		"meta", "rd p99", "wr p99", "dirty", "destaged", "reads",
		"hit%", "writes", "destaged");
}

void show_interval(FILE *out, const struct stat_snap *d,
		   const struct stat_snap *t, double secs)
{
	char rb[16], wb[16], dirty[16], ds[16], tds[16], p1[16], p2[16];
	char when[16];
	time_t now = t->time_ns / 1000000000ull;
	struct tm tm;

	localtime_r(&now, &tm);
	strftime(when, sizeof(when), "%H:%M:%S", &tm);
	/* one word per column, for people and for awk */
	compact_bytes(STAT_CTR(d, read_bytes), rb, sizeof(rb));
	compact_bytes(STAT_CTR(d, write_bytes), wb, sizeof(wb));
	compact_bytes(STAT_GAUGE(t, dirty_bytes), dirty, sizeof(dirty));
	compact_bytes(STAT_CTR(d, destaged_bytes), ds, sizeof(ds));
	compact_bytes(STAT_CTR(t, destaged_bytes), tds, sizeof(tds));
	strcpy(p1, "-");
	strcpy(p2, "-");
	if (t->timing && STAT_LAT(d, read).count)
		lat_str(lat_quantile(&STAT_LAT(d, read), 0.99), p1, sizeof(p1));
	if (t->timing && STAT_LAT(d, write).count)
		lat_str(lat_quantile(&STAT_LAT(d, write), 0.99), p2,
			sizeof(p2));
	fprintf(out,
		"%-8s %8" PRIu64 " %6.1f %9s %8" PRIu64 " %9s %6" PRIu64
		" %7" PRIu64 " %9s %9s %10s %10s | %10" PRIu64
		" %6.1f %10" PRIu64 " %10s\n",
		when, STAT_CTR(d, read_ops),
		100 * show_ratio(STAT_CTR(d, read_hit_bytes),
				 STAT_CTR(d, read_bytes)),
		rb, STAT_CTR(d, write_ops), wb, STAT_CTR(d, fsync_ops),
		STAT_CTR(d, meta_ops), p1, p2, dirty, ds, STAT_CTR(t, read_ops),
		100 * show_ratio(STAT_CTR(t, read_hit_bytes),
				 STAT_CTR(t, read_bytes)),
		STAT_CTR(t, write_ops), tds);
	(void)secs;
}

/* ----------------------------------------------------------------- JSON */

static struct json_object *json_hist(const struct lat_hist *h)
{
	struct json_object *o = json_object_new_object(),
			   *hc = json_object_new_object();
	char key[16];
	int i;

	json_object_object_add(o, "count", json_object_new_uint64(h->count));
	json_object_object_add(o, "mean_us",
			       json_object_new_double(lat_mean_ns(h) / 1e3));
	for (i = 0; i < NQ; i++) {
		snprintf(key, sizeof(key), "%s_us", quantile_names[i]);
		json_object_object_add(
			o, key,
			json_object_new_double(lat_quantile(h, quantiles[i]) /
					       1e3));
	}
	json_object_object_add(o, "max_us",
			       json_object_new_double(h->max_ns / 1e3));
	for (i = 0; i < LAT_NHICCUPS; i++)
		json_object_object_add(hc, lat_hiccup_names[i],
				       json_object_new_uint64(h->hiccup[i]));
	json_object_object_add(o, "hiccups", hc);
	return o;
}

static struct json_object *json_snap(const struct stat_snap *s, int gauges)
{
	struct json_object *o = json_object_new_object(), *x, *devs, *y;
	double drain;
	int i, d;

	x = json_object_new_object();
	for (i = 0; i < STAT_NCOUNTERS; i++)
		json_object_object_add(x, stat_counter_desc[i].name,
				       json_object_new_uint64(s->ctr[i]));
	json_object_object_add(o, "counters", x);
	x = json_object_new_object();
	json_object_object_add(
		x, "read_hit_ratio_ops",
		json_object_new_double(show_ratio(
			STAT_CTR(s, read_hit_ops),
			STAT_CTR(s, read_hit_ops) + STAT_CTR(s, read_miss_ops) +
				STAT_CTR(s, read_partial_ops))));
	json_object_object_add(
		x, "read_hit_ratio_bytes",
		json_object_new_double(show_ratio(STAT_CTR(s, read_hit_bytes),
						  STAT_CTR(s, read_bytes))));
	if (gauges) {
		uint64_t cap = STAT_GAUGE(s, capacity_bytes);

		json_object_object_add(
			x, "used_percent",
			json_object_new_double(
				100 *
				show_ratio(STAT_GAUGE(s, used_bytes), cap)));
		json_object_object_add(
			x, "dirty_percent",
			json_object_new_double(
				100 *
				show_ratio(STAT_GAUGE(s, dirty_bytes), cap)));
		drain = show_drain_seconds(s);
		json_object_object_add(
			x, "drain_seconds",
			drain < 0 ? NULL : json_object_new_double(drain));
	}
	json_object_object_add(o, "derived", x);
	if (gauges) {
		x = json_object_new_object();
		for (i = 0; i < STAT_NGAUGES; i++)
			json_object_object_add(
				x, stat_gauge_desc[i].name,
				json_object_new_uint64(s->gauge[i]));
		json_object_object_add(o, "gauges", x);
	}
	if (s->timing) {
		x = json_object_new_object();
		for (i = 0; i < STAT_NLATS; i++)
			json_object_object_add(x, stat_lat_desc[i].name,
					       json_hist(&s->lat[i]));
		json_object_object_add(o, "latency", x);
	}
	devs = json_object_new_array();
	for (d = 0; d < s->ndevs; d++) {
		struct json_object *dv = json_object_new_object();

		json_object_object_add(dv, "index", json_object_new_int(d));
		json_object_object_add(dv, "path",
				       json_object_new_string(s->dev[d].path));
		y = json_object_new_object();
		for (i = 0; i < STAT_NDEV_COUNTERS; i++)
			json_object_object_add(
				y, stat_dev_counter_desc[i].name,
				json_object_new_uint64(s->dev[d].ctr[i]));
		json_object_object_add(dv, "counters", y);
		if (gauges) {
			json_object_object_add(
				dv, "state",
				json_object_new_string(dev_state_name(
					STAT_DEV_GAUGE(s, d, failed))));
			y = json_object_new_object();
			for (i = 0; i < STAT_NDEV_GAUGES; i++)
				json_object_object_add(
					y, stat_dev_gauge_desc[i].name,
					json_object_new_uint64(
						s->dev[d].gauge[i]));
			json_object_object_add(dv, "gauges", y);
		}
		if (s->timing) {
			y = json_object_new_object();
			for (i = 0; i < STAT_NDEV_LATS; i++)
				json_object_object_add(
					y, stat_dev_lat_desc[i].name,
					json_hist(&s->dev[d].lat[i]));
			json_object_object_add(dv, "latency", y);
		}
		json_object_array_add(devs, dv);
	}
	json_object_object_add(o, "devices", devs);
	if (gauges) {
		x = json_object_new_array();
		for (d = 0; d < 2; d++) {
			y = json_object_new_object();
			json_object_object_add(y, "index",
					       json_object_new_int(d));
			json_object_object_add(
				y, "path",
				json_object_new_string(s->mirror_path[d]));
			json_object_object_add(
				y, "state",
				json_object_new_string(
					mirror_state_name(s->mirror_state[d])));
			json_object_array_add(x, y);
		}
		json_object_object_add(o, "mirrors", x);
	}
	return o;
}

int show_json(FILE *out, const char *mnt, const struct stat_snap *t,
	      const struct stat_snap *d, double secs, int pretty)
{
	struct json_object *o = json_object_new_object();
	int flags = JSON_C_TO_STRING_NOSLASHESCAPE |
		    (pretty ? JSON_C_TO_STRING_PRETTY : JSON_C_TO_STRING_PLAIN);

	/* microseconds to the nanosecond, ratios to 1e-6: enough, and short */
	json_c_set_serialization_double_format("%.6g", JSON_C_OPTION_GLOBAL);
	json_object_object_add(o, "mountpoint", json_object_new_string(mnt));
	json_object_object_add(o, "time_unix_ns",
			       json_object_new_uint64(t->time_ns));
	json_object_object_add(o, "latency_measured",
			       json_object_new_boolean(t->timing));
	if (d) {
		json_object_object_add(o, "interval_seconds",
				       json_object_new_double(secs));
		json_object_object_add(o, "interval", json_snap(d, 0));
	}
	json_object_object_add(o, "total", json_snap(t, 1));
	fprintf(out, "%s\n", json_object_to_json_string_ext(o, flags));
	json_object_put(o);
	return 0;
}

/* ----------------------------------------------------------- Prometheus */

/* A label value with \, " and newlines escaped. */
static void prom_escape(const char *s, char *out, size_t len)
{
	size_t n = 0;

	for (; *s && n + 3 < len; s++) {
		if (*s == '\\' || *s == '"') {
			out[n++] = '\\';
			out[n++] = *s;
		} else if (*s == '\n') {
			out[n++] = '\\';
			out[n++] = 'n';
		} else {
			out[n++] = *s;
		}
	}
	out[n] = 0;
}

static void prom_head(FILE *out, const char *name, const char *type,
		      const char *help)
{
	fprintf(out, "# HELP nvcachefs_%s %s\n# TYPE nvcachefs_%s %s\n", name,
		help, name, type);
}

/* name with its unit, if the name does not end in it already */
static void prom_name(char *out, size_t len, const struct stat_desc *d,
		      const char *prefix, const char *suffix)
{
	size_t n = strlen(d->name), u = strlen(d->unit);
	int has = !u || !strcmp(d->unit, "ops") ||
		  (n >= u && !strcmp(d->name + n - u, d->unit));

	snprintf(out, len, "%s%s%s%s%s", prefix, d->name, has ? "" : "_",
		 has ? "" : d->unit, suffix);
}

static void prom_summary(FILE *out, const char *labels,
			 const struct lat_hist *h, const char *base)
{
	int i;

	for (i = 0; i < NQ; i++)
		fprintf(out, "nvcachefs_%s{%s,quantile=\"%g\"} %.9f\n", base,
			labels, quantiles[i],
			lat_quantile(h, quantiles[i]) / 1e9);
	fprintf(out, "nvcachefs_%s_sum{%s} %.9f\n", base, labels,
		h->sum_ns / 1e9);
	fprintf(out, "nvcachefs_%s_count{%s} %" PRIu64 "\n", base, labels,
		h->count);
}

/* One per-device family: counter k (or gauge k) of every device. */
static void prom_dev_family(FILE *out, const char *m, const struct stat_snap *s,
			    const struct stat_desc *desc, int gauge, int k)
{
	char name[128], help[256], p[600];
	int d;

	prom_name(name, sizeof(name), desc, "device_", gauge ? "" : "_total");
	snprintf(help, sizeof(help), "per cache device: %s", desc->help);
	prom_head(out, name, gauge ? "gauge" : "counter", help);
	for (d = 0; d < s->ndevs; d++) {
		prom_escape(s->dev[d].path, p, sizeof(p));
		fprintf(out,
			"nvcachefs_%s{mountpoint=\"%s\",device=\"%s\"} %" PRIu64
			"\n",
			name, m, p,
			gauge ? s->dev[d].gauge[k] : s->dev[d].ctr[k]);
	}
}

void show_prometheus(FILE *out, const char *mnt, const struct stat_snap *s)
{
	char m[1024], p[600], name[128], labels[2048];
	int i, d, k;

	prom_escape(mnt, m, sizeof(m));
	for (i = 0; i < STAT_NCOUNTERS; i++) {
		prom_name(name, sizeof(name), &stat_counter_desc[i], "",
			  "_total");
		prom_head(out, name, "counter", stat_counter_desc[i].help);
		fprintf(out, "nvcachefs_%s{mountpoint=\"%s\"} %" PRIu64 "\n",
			name, m, s->ctr[i]);
	}
	for (i = 0; i < STAT_NGAUGES; i++) {
		prom_name(name, sizeof(name), &stat_gauge_desc[i], "", "");
		prom_head(out, name, "gauge", stat_gauge_desc[i].help);
		fprintf(out, "nvcachefs_%s{mountpoint=\"%s\"} %" PRIu64 "\n",
			name, m, s->gauge[i]);
	}
	if (s->timing) {
		prom_head(out, "latency_seconds", "summary",
			  "latency of requests and of the I/O behind them");
		for (i = 0; i < STAT_NLATS; i++) {
			snprintf(labels, sizeof(labels),
				 "mountpoint=\"%s\",op=\"%s\"", m,
				 stat_lat_desc[i].name);
			prom_summary(out, labels, &s->lat[i],
				     "latency_seconds");
		}
		prom_head(out, "latency_max_seconds", "gauge",
			  "the longest request since the counters were "
			  "reset");
		for (i = 0; i < STAT_NLATS; i++)
			fprintf(out,
				"nvcachefs_latency_max_seconds{mountpoint="
				"\"%s\",op=\"%s\"} %.9f\n",
				m, stat_lat_desc[i].name,
				s->lat[i].max_ns / 1e9);
		prom_head(out, "latency_hiccups_total", "counter",
			  "requests by latency band, as btest counts them");
		for (i = 0; i < STAT_NLATS; i++)
			for (k = 0; k < LAT_NHICCUPS; k++)
				fprintf(out,
					"nvcachefs_latency_hiccups_total{"
					"mountpoint=\"%s\",op=\"%s\",band=\"%"
					"s\"}"
					" %" PRIu64 "\n",
					m, stat_lat_desc[i].name,
					lat_hiccup_names[k],
					s->lat[i].hiccup[k]);
	}
	for (i = 0; i < STAT_NDEV_COUNTERS; i++)
		prom_dev_family(out, m, s, &stat_dev_counter_desc[i], 0, i);
	for (i = 0; i < STAT_NDEV_GAUGES; i++)
		prom_dev_family(out, m, s, &stat_dev_gauge_desc[i], 1, i);
	if (s->timing) {
		prom_head(out, "device_latency_seconds", "summary",
			  "latency of I/O to each cache device");
		for (d = 0; d < s->ndevs; d++) {
			prom_escape(s->dev[d].path, p, sizeof(p));
			for (i = 0; i < STAT_NDEV_LATS; i++) {
				snprintf(labels, sizeof(labels),
					 "mountpoint=\"%s\",device=\"%s\","
					 "op=\"%s\"",
					 m, p, stat_dev_lat_desc[i].name);
				prom_summary(out, labels, &s->dev[d].lat[i],
					     "device_latency_seconds");
			}
		}
	}
	prom_head(out, "mirror_rebuilt", "gauge",
		  "1 if the metadata mirror was lost or damaged and rebuilt at "
		  "mount");
	for (d = 0; d < 2; d++) {
		prom_escape(s->mirror_path[d], p, sizeof(p));
		fprintf(out,
			"nvcachefs_mirror_rebuilt{mountpoint=\"%s\",mirror=\"%"
			"d\","
			"path=\"%s\"} %d\n",
			m, d, p, s->mirror_state[d] == STAT_MIRROR_REBUILT);
	}
	prom_head(out, "mirror_state", "gauge",
		  "the metadata mirror's state: 1 for the state it is in, 0 "
		  "for the others");
	for (d = 0; d < 2; d++) {
		prom_escape(s->mirror_path[d], p, sizeof(p));
		for (i = 0; i < STAT_MIRROR_NSTATES; i++)
			fprintf(out,
				"nvcachefs_mirror_state{mountpoint=\"%s\","
				"mirror=\"%d\",path=\"%s\",state=\"%s\"} %d\n",
				m, d, p, stat_mirror_state_name[i],
				s->mirror_state[d] == i);
	}
}
