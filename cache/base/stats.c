/* cache: statistics — histogram arithmetic, the sharded store, snapshots and
 * their wire format. */
#define _GNU_SOURCE
#include "stats.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define STAT_DESC(name, unit, help) { #name, unit, help },
#define STAT_LDESC(name, help) { #name, "seconds", help },
const struct stat_desc stat_counter_desc[] = { STAT_COUNTERS(STAT_DESC) };
const struct stat_desc stat_gauge_desc[] = { STAT_GAUGES(STAT_DESC) };
const struct stat_desc stat_lat_desc[] = { STAT_LATS(STAT_LDESC) };
const struct stat_desc stat_dev_counter_desc[] = { STAT_DEV_COUNTERS(
	STAT_DESC) };
const struct stat_desc stat_dev_gauge_desc[] = { STAT_DEV_GAUGES(STAT_DESC) };
const struct stat_desc stat_dev_lat_desc[] = { STAT_DEV_LATS(STAT_LDESC) };

const char *const stat_mirror_state_name[STAT_MIRROR_NSTATES] = {
	[STAT_MIRROR_OK] = "ok",
	[STAT_MIRROR_REBUILT] = "rebuilt",
	[STAT_MIRROR_MISSING] = "missing",
	[STAT_MIRROR_FAILED] = "failed",
};

int stat_mirror_state_find(const char *name)
{
	int i;

	for (i = 0; i < STAT_MIRROR_NSTATES; i++)
		if (!strcmp(stat_mirror_state_name[i], name))
			return i;
	return -1;
}

const char *const lat_hiccup_names[LAT_NHICCUPS] = { "<1ms",	 "1ms",
						     "2-10ms",	 "11-50ms",
						     "51-100ms", ">100ms" };

/* ------------------------------------------------------------ histograms */

unsigned lat_bucket(uint64_t ns)
{
	unsigned msb;

	if (ns < LAT_LINEAR)
		return ns;
	msb = 63 - __builtin_clzll(ns);
	if (msb > LAT_MAX_MSB)
		return LAT_NBUCKETS - 1;
	return LAT_LINEAR + (msb - LAT_SUB_BITS - 1) * (1u << LAT_SUB_BITS) +
	       ((ns >> (msb - LAT_SUB_BITS)) & ((1u << LAT_SUB_BITS) - 1));
}

void lat_bucket_range(unsigned i, uint64_t *lo, uint64_t *hi)
{
	unsigned e, m;

	if (i < LAT_LINEAR) {
		*lo = *hi = i;
		return;
	}
	e = (i - LAT_LINEAR) >> LAT_SUB_BITS; /* msb - LAT_SUB_BITS - 1 */
	m = (i - LAT_LINEAR) & ((1u << LAT_SUB_BITS) - 1);
	*lo = (uint64_t)((1u << LAT_SUB_BITS) + m) << (e + 1);
	*hi = *lo + (1ull << (e + 1)) - 1;
}

unsigned lat_hiccup(uint64_t ns)
{
	uint64_t ms = ns / 1000000;

	if (ms < 1)
		return 0;
	if (ms < 2)
		return 1;
	if (ms <= 10)
		return 2;
	if (ms <= 50)
		return 3;
	if (ms <= 100)
		return 4;
	return 5;
}

void lat_record(struct lat_hist *h, uint64_t ns)
{
	uint64_t m = __atomic_load_n(&h->max_ns, __ATOMIC_RELAXED);

	__atomic_fetch_add(&h->count, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&h->sum_ns, ns, __ATOMIC_RELAXED);
	__atomic_fetch_add(&h->b[lat_bucket(ns)], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&h->hiccup[lat_hiccup(ns)], 1, __ATOMIC_RELAXED);
	while (ns > m &&
	       !__atomic_compare_exchange_n(&h->max_ns, &m, ns, 1,
					    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

uint64_t lat_quantile(const struct lat_hist *h, double q)
{
	uint64_t want, seen = 0, lo, hi;
	unsigned i;

	if (!h->count)
		return 0;
	want = (uint64_t)(q * h->count + 0.999999);
	if (want < 1)
		want = 1;
	if (want > h->count)
		want = h->count;
	for (i = 0; i < LAT_NBUCKETS; i++) {
		seen += h->b[i];
		if (seen >= want)
			break;
	}
	if (i == LAT_NBUCKETS)
		return h->max_ns;
	lat_bucket_range(i, &lo, &hi);
	return hi < h->max_ns || !h->max_ns ? hi : h->max_ns;
}

double lat_mean_ns(const struct lat_hist *h)
{
	return h->count ? (double)h->sum_ns / h->count : 0.0;
}

static void hist_add(struct lat_hist *to, const struct lat_hist *from)
{
	unsigned i;

	to->count += __atomic_load_n(&from->count, __ATOMIC_RELAXED);
	to->sum_ns += __atomic_load_n(&from->sum_ns, __ATOMIC_RELAXED);
	if (from->max_ns > to->max_ns)
		to->max_ns = from->max_ns;
	for (i = 0; i < LAT_NHICCUPS; i++)
		to->hiccup[i] +=
			__atomic_load_n(&from->hiccup[i], __ATOMIC_RELAXED);
	for (i = 0; i < LAT_NBUCKETS; i++)
		to->b[i] += __atomic_load_n(&from->b[i], __ATOMIC_RELAXED);
}

static void hist_sub(struct lat_hist *out, const struct lat_hist *a,
		     const struct lat_hist *b)
{
	unsigned i;

	out->count = a->count - b->count;
	out->sum_ns = a->sum_ns - b->sum_ns;
	out->max_ns = a->max_ns;
	for (i = 0; i < LAT_NHICCUPS; i++)
		out->hiccup[i] = a->hiccup[i] - b->hiccup[i];
	for (i = 0; i < LAT_NBUCKETS; i++)
		out->b[i] = a->b[i] - b->b[i];
}

/* ----------------------------------------------------------------- store */

/*
 * The shards are STAT_SHARDS * sizeof(struct stat_shard), 4.2 MiB, nearly
 * all of it histogram buckets that are never hit (latencies cluster in a few
 * buckets; devices past the cache's own are never counted).  They are mapped
 * anonymous and never written here: a page takes DRAM only once a thread
 * counts into it, and reading an untouched page (a snapshot) costs nothing.
 * Clearing them with memset once cost every daemon 4.2 MiB (issue 11).
 */
#define STAT_STORE_BYTES (STAT_SHARDS * sizeof(struct stat_shard))

int stat_store_init(struct stat_store *s, int timing)
{
	void *p = mmap(NULL, STAT_STORE_BYTES, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return -ENOMEM;
	s->shard = p; /* zero, page-aligned (shards are 64-byte aligned) */
	s->timing = timing;
	return 0;
}

void stat_store_free(struct stat_store *s)
{
	if (s->shard)
		munmap(s->shard, STAT_STORE_BYTES);
	s->shard = NULL;
}

struct stat_shard *stat_my_shard(struct stat_store *s)
{
	static unsigned next;
	static __thread int mine = -1;

	if (mine < 0)
		mine = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED) %
		       STAT_SHARDS;
	return &s->shard[mine];
}

uint64_t stat_total(struct stat_store *s, enum stat_counter k)
{
	uint64_t v = 0;
	int i;

	for (i = 0; i < STAT_SHARDS; i++)
		v += __atomic_load_n(&s->shard[i].ctr[k], __ATOMIC_RELAXED);
	return v;
}

uint64_t stat_clock(const struct stat_store *s)
{
	struct timespec ts;

	if (!__atomic_load_n(&s->timing, __ATOMIC_RELAXED))
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	/* never 0, which means "not timed" */
	return ts.tv_sec * 1000000000ull + ts.tv_nsec + 1;
}

void stat_collect(struct stat_store *s, int ndevs, struct stat_snap *out)
{
	int i, d, k;

	memset(out->ctr, 0, sizeof(out->ctr));
	memset(out->lat, 0, sizeof(out->lat));
	out->ndevs = ndevs;
	for (d = 0; d < ndevs; d++) {
		memset(out->dev[d].ctr, 0, sizeof(out->dev[d].ctr));
		memset(out->dev[d].lat, 0, sizeof(out->dev[d].lat));
	}
	for (i = 0; i < STAT_SHARDS; i++) {
		struct stat_shard *sh = &s->shard[i];

		for (k = 0; k < STAT_NCOUNTERS; k++)
			out->ctr[k] +=
				__atomic_load_n(&sh->ctr[k], __ATOMIC_RELAXED);
		for (k = 0; k < STAT_NLATS; k++)
			hist_add(&out->lat[k], &sh->lat[k]);
		for (d = 0; d < ndevs; d++) {
			for (k = 0; k < STAT_NDEV_COUNTERS; k++)
				out->dev[d].ctr[k] += __atomic_load_n(
					&sh->dev_ctr[d][k], __ATOMIC_RELAXED);
			for (k = 0; k < STAT_NDEV_LATS; k++)
				hist_add(&out->dev[d].lat[k],
					 &sh->dev_lat[d][k]);
		}
	}
}

/* Only a maximum that is set is cleared: a store into a histogram nobody
 * used would take a page for it (stat_store_init). */
static void max_clear(struct lat_hist *h)
{
	if (__atomic_load_n(&h->max_ns, __ATOMIC_RELAXED))
		__atomic_store_n(&h->max_ns, 0, __ATOMIC_RELAXED);
}

void stat_reset_max(struct stat_store *s)
{
	int i, d, k;

	for (i = 0; i < STAT_SHARDS; i++) {
		struct stat_shard *sh = &s->shard[i];

		for (k = 0; k < STAT_NLATS; k++)
			max_clear(&sh->lat[k]);
		for (d = 0; d < STAT_MAX_DEVS; d++)
			for (k = 0; k < STAT_NDEV_LATS; k++)
				max_clear(&sh->dev_lat[d][k]);
	}
}

void stat_diff(const struct stat_snap *a, const struct stat_snap *b,
	       struct stat_snap *out)
{
	int k, d;

	if (out != a)
		*out = *a;
	for (k = 0; k < STAT_NCOUNTERS; k++)
		out->ctr[k] = a->ctr[k] - b->ctr[k];
	for (k = 0; k < STAT_NLATS; k++)
		hist_sub(&out->lat[k], &a->lat[k], &b->lat[k]);
	for (d = 0; d < a->ndevs && d < b->ndevs; d++) {
		for (k = 0; k < STAT_NDEV_COUNTERS; k++)
			out->dev[d].ctr[k] =
				a->dev[d].ctr[k] - b->dev[d].ctr[k];
		for (k = 0; k < STAT_NDEV_LATS; k++)
			hist_sub(&out->dev[d].lat[k], &a->dev[d].lat[k],
				 &b->dev[d].lat[k]);
	}
}

/* ----------------------------------------------------------- wire format */

/*
 * Lines, after the "proto N" line the caller writes:
 *   time NS
 *   timing 0|1
 *   c NAME VALUE            counter
 *   g NAME VALUE            gauge
 *   l NAME COUNT SUM MAX H0..H5 [I:N]...     latency histogram
 *   dev D PATH              then, for that device:
 *   dc D NAME VALUE / dg D NAME VALUE / dl D NAME ... as above
 *   mirror M STATE PATH     STATE: a stat_mirror_state_name
 *   end
 */
static void write_hist(FILE *out, const char *prefix, const char *name,
		       const struct lat_hist *h)
{
	unsigned i;

	fprintf(out, "%s %s %" PRIu64 " %" PRIu64 " %" PRIu64, prefix, name,
		h->count, h->sum_ns, h->max_ns);
	for (i = 0; i < LAT_NHICCUPS; i++)
		fprintf(out, " %" PRIu64, h->hiccup[i]);
	for (i = 0; i < LAT_NBUCKETS; i++)
		if (h->b[i])
			fprintf(out, " %u:%" PRIu64, i, h->b[i]);
	fputc('\n', out);
}

int stat_write(FILE *out, const struct stat_snap *s)
{
	int k, d;

	fprintf(out, "time %" PRIu64 "\ntiming %d\n", s->time_ns, s->timing);
	for (k = 0; k < STAT_NCOUNTERS; k++)
		fprintf(out, "c %s %" PRIu64 "\n", stat_counter_desc[k].name,
			s->ctr[k]);
	for (k = 0; k < STAT_NGAUGES; k++)
		fprintf(out, "g %s %" PRIu64 "\n", stat_gauge_desc[k].name,
			s->gauge[k]);
	for (k = 0; k < STAT_NLATS; k++)
		write_hist(out, "l", stat_lat_desc[k].name, &s->lat[k]);
	for (d = 0; d < s->ndevs; d++) {
		char p[16];

		fprintf(out, "dev %d %s\n", d, s->dev[d].path);
		snprintf(p, sizeof(p), "dl %d", d);
		for (k = 0; k < STAT_NDEV_COUNTERS; k++)
			fprintf(out, "dc %d %s %" PRIu64 "\n", d,
				stat_dev_counter_desc[k].name,
				s->dev[d].ctr[k]);
		for (k = 0; k < STAT_NDEV_GAUGES; k++)
			fprintf(out, "dg %d %s %" PRIu64 "\n", d,
				stat_dev_gauge_desc[k].name,
				s->dev[d].gauge[k]);
		for (k = 0; k < STAT_NDEV_LATS; k++)
			write_hist(out, p, stat_dev_lat_desc[k].name,
				   &s->dev[d].lat[k]);
	}
	for (d = 0; d < 2; d++) {
		unsigned st = s->mirror_state[d];

		assert(st < STAT_MIRROR_NSTATES);
		fprintf(out, "mirror %d %s %s\n", d,
			st < STAT_MIRROR_NSTATES ? stat_mirror_state_name[st]
						 : "unknown",
			s->mirror_path[d]);
	}
	fprintf(out, "end\n");
	return ferror(out) ? -EIO : 0;
}

static int find(const struct stat_desc *t, int n, const char *name)
{
	int i;

	for (i = 0; i < n; i++)
		if (!strcmp(t[i].name, name))
			return i;
	return -1;
}

/* Parse "COUNT SUM MAX H0..H5 [I:N]..." at p. */
static int read_hist(char *p, struct lat_hist *h)
{
	char *e;
	unsigned i;

	memset(h, 0, sizeof(*h));
	errno = 0;
	h->count = strtoull(p, &e, 10);
	if (e == p)
		return -EPROTO;
	h->sum_ns = strtoull(p = e, &e, 10);
	if (e == p)
		return -EPROTO;
	h->max_ns = strtoull(p = e, &e, 10);
	if (e == p)
		return -EPROTO;
	for (i = 0; i < LAT_NHICCUPS; i++) {
		h->hiccup[i] = strtoull(p = e, &e, 10);
		if (e == p)
			return -EPROTO;
	}
	for (p = e; *p == ' ';) {
		unsigned long b = strtoul(p + 1, &e, 10);

		if (e == p + 1 || *e != ':' || b >= LAT_NBUCKETS)
			return -EPROTO;
		p = e + 1;
		h->b[b] = strtoull(p, &e, 10);
		if (e == p)
			return -EPROTO;
		p = e;
	}
	return *p ? -EPROTO : 0;
}

int stat_read(FILE *in, struct stat_snap *s, char *err, size_t errlen)
{
	char *line = NULL, name[64], *rest;
	size_t cap = 0;
	ssize_t len;
	int ret = -EPROTO, d, k, n;
	unsigned long long v;

	memset(s, 0, sizeof(*s));
	while ((len = getline(&line, &cap, in)) > 0) {
		if (line[len - 1] == '\n')
			line[--len] = 0;
		n = 0;
		if (!strcmp(line, "end")) {
			ret = 0;
			break;
		}
		if (sscanf(line, "time %llu%n", &v, &n) == 1 && !line[n]) {
			s->time_ns = v;
		} else if (sscanf(line, "timing %d%n", &s->timing, &n) == 1 &&
			   !line[n]) {
		} else if (sscanf(line, "c %63s %llu%n", name, &v, &n) == 2 &&
			   !line[n]) {
			k = find(stat_counter_desc, STAT_NCOUNTERS, name);
			if (k >= 0)
				s->ctr[k] = v;
		} else if (sscanf(line, "g %63s %llu%n", name, &v, &n) == 2 &&
			   !line[n]) {
			k = find(stat_gauge_desc, STAT_NGAUGES, name);
			if (k >= 0)
				s->gauge[k] = v;
		} else if (sscanf(line, "l %63s %n", name, &n) == 1 && n) {
			struct lat_hist tmp;

			k = find(stat_lat_desc, STAT_NLATS, name);
			if (read_hist(line + n, k >= 0 ? &s->lat[k] : &tmp))
				goto bad;
		} else if (sscanf(line, "dev %d %n", &d, &n) == 1 && n &&
			   d >= 0 && d < STAT_MAX_DEVS) {
			snprintf(s->dev[d].path, sizeof(s->dev[d].path), "%s",
				 line + n);
			if (d >= s->ndevs)
				s->ndevs = d + 1;
		} else if (sscanf(line, "dc %d %63s %llu%n", &d, name, &v,
				  &n) == 3 &&
			   !line[n] && d >= 0 && d < STAT_MAX_DEVS) {
			k = find(stat_dev_counter_desc, STAT_NDEV_COUNTERS,
				 name);
			if (k >= 0)
				s->dev[d].ctr[k] = v;
		} else if (sscanf(line, "dg %d %63s %llu%n", &d, name, &v,
				  &n) == 3 &&
			   !line[n] && d >= 0 && d < STAT_MAX_DEVS) {
			k = find(stat_dev_gauge_desc, STAT_NDEV_GAUGES, name);
			if (k >= 0)
				s->dev[d].gauge[k] = v;
		} else if (sscanf(line, "dl %d %63s %n", &d, name, &n) == 2 &&
			   n && d >= 0 && d < STAT_MAX_DEVS) {
			struct lat_hist tmp;

			k = find(stat_dev_lat_desc, STAT_NDEV_LATS, name);
			if (read_hist(line + n,
				      k >= 0 ? &s->dev[d].lat[k] : &tmp))
				goto bad;
		} else if (sscanf(line, "mirror %d %63s %n", &d, name, &n) ==
				   2 &&
			   n && (d == 0 || d == 1)) {
			rest = line + n;
			k = stat_mirror_state_find(name);
			if (k < 0)
				goto bad;
			s->mirror_state[d] = k;
			snprintf(s->mirror_path[d], sizeof(s->mirror_path[d]),
				 "%s", rest);
		} else {
			goto bad;
		}
	}
	if (ret)
		snprintf(err, errlen, "the daemon's answer ended early");
	free(line);
	return ret;
bad:
	snprintf(err, errlen, "malformed statistics line: %.200s", line);
	free(line);
	return -EPROTO;
}

void stat_fmt_bytes(double b, char *out, size_t len)
{
	static const char *const u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	int i = 0;

	while (b >= 1024 && i < 4) {
		b /= 1024;
		i++;
	}
	snprintf(out, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}
