/* cache: the table of tunables, and the INI file and -o overrides that set
 * them. */
#define _GNU_SOURCE

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <sys/stat.h>

#include "base.h"

enum cfg_type { T_STR, T_SIZE, T_UINT, T_TIME, T_ENUM, T_RATE };

struct cfg_key {
	const char *section;
	const char *key;
	enum cfg_type type;
	size_t off;
	uint64_t min, max;
	const char *def; /* NULL: required */
	int reload; /* may change on SIGHUP */
	const char *const *names;
	const char *help;
};

static const char *const mode_names[] = { "writeback", "writethrough",
					  "writearound", NULL };
static const char *const unmount_names[] = { "flush", "keep", NULL };
static const char *const onoff_names[] = { "off", "on", NULL };
static const char *const identity_names[] = { "auto", "handle", "path",
					      NULL };
static const char *const conflict_names[] = { "overwrite", "keep-both",
					      NULL };
static const char *const on_close_names[] = { "none", "flush", NULL };
static const char *const transport_names[] = { "auto", "uring", "dev", NULL };
static const char *const passthrough_names[] = { "auto", "off", NULL };

#define OFF(f) offsetof(struct cache_config, f)
#define KIB 1024ull
#define MIB (1024ull * KIB)

/* The one table: parsing, validation, --help and the stats output read it. */
static const struct cfg_key keys[] = {
	{ "cache", "devices", T_STR, OFF(devices), 0, 0, NULL, 0, NULL,
	  "comma-separated cache data devices (block devices or files); an "
	  "entry \"spare\" keeps a member place free for nvcachectl add" },
	{ "cache", "metadata", T_STR, OFF(metadata), 0, 0, NULL, 0, NULL,
	  "two locations for the metadata mirrors (files, pmem/DAX)" },
	{ "cache", "block_size", T_SIZE, OFF(block_size), 4 * KIB, 1 * MIB,
	  "64K", 0, NULL, "cache block size, a power of two" },
	{ "cache", "mode", T_ENUM, OFF(mode), 0, 2, "writeback", 0, mode_names,
	  "writeback, writethrough or writearound" },
	{ "cache", "dirty_copies", T_UINT, OFF(dirty_copies), 1, 2, "1", 0,
	  NULL, "copies of each dirty block on different devices" },
	{ "cache", "rebuild_max_rate", T_RATE, OFF(rebuild_max_rate), 0,
	  UINT64_MAX, "0", 1, NULL,
	  "nvcachectl replace: copy bandwidth cap per second (0: unlimited)" },
	{ "cache", "max_capacity", T_SIZE, OFF(max_capacity), 0, 1ull << 50,
	  "0", 0, NULL,
	  "format: the capacity the metadata keeps room for, so that "
	  "nvcachectl add can grow the cache past the devices it is "
	  "formatted with (0: twice theirs)" },
	{ "cache", "max_files", T_UINT, OFF(max_files), 64, 1u << 24, "65536",
	  0, NULL, "files that can have data in the cache at once" },
	{ "cache", "io_poll_us", T_UINT, OFF(io_poll_us), 0, 1000000, "30", 0,
	  NULL,
	  "spin this many microseconds for a device completion before "
	  "sleeping, while a worker has one request in flight" },
	{ "cache", "sequential_cutoff", T_SIZE, OFF(sequential_cutoff), 0,
	  1ull << 50, "4M", 1, NULL,
	  "a read stream sequential past this many bytes is served from the "
	  "backing store and not kept in the cache (0: keep every miss)" },
	{ "cache", "max_pinned", T_UINT, OFF(max_pinned), 0, 90, "50", 1, NULL,
	  "percent of the cache that pinned files (nvcachectl pin) may "
	  "take; pins past it are refused" },
	{ "cache", "async_fill", T_ENUM, OFF(async_fill), 0, 1, "off", 1,
	  onoff_names,
	  "keep read misses in the cache after the reply is sent (off: "
	  "before)" },
	{ "backing", "path", T_STR, OFF(backing_path), 0, 0, NULL, 0, NULL,
	  "the backing directory" },
	{ "backing", "identity", T_ENUM, OFF(identity), 0, 2, "auto", 0,
	  identity_names,
	  "how cached files are found again: handle (kernel file handles), "
	  "path (path and identity stamp), auto (handles where proven stable)" },
	{ "backing", "on_conflict", T_ENUM, OFF(on_conflict), 0, 1,
	  "overwrite", 1, conflict_names,
	  "dirty data of a file changed elsewhere: overwrite the store's "
	  "pages, or keep-both (this node's version beside it)" },
	{ "backing", "read_ahead", T_SIZE, OFF(backing_read_ahead), 0,
	  1024 * MIB, "0", 1, NULL,
	  "how far ahead of a sequential read stream that misses the backing "
	  "store is also asked to read (posix_fadvise); 0: only the backing "
	  "file system's own readahead, best on a local disk" },
	{ "backing", "direct_read_ahead", T_SIZE, OFF(backing_direct_ra), 0,
	  32 * MIB, "8M", 1, NULL,
	  "a read stream past cache.sequential_cutoff reads the backing "
	  "store with direct I/O (O_DIRECT), this far ahead of itself in the "
	  "background; 0: through the backing file's page cache" },
	{ "destage", "high_watermark", T_UINT, OFF(high_wm), 1, 100, "80", 1,
	  NULL, "percent of cache blocks dirty at which destage starts" },
	{ "destage", "low_watermark", T_UINT, OFF(low_wm), 0, 99, "50", 1, NULL,
	  "percent at which watermark destage stops" },
	{ "destage", "max_dirty_age", T_TIME, OFF(max_dirty_age_ms), 0,
	  86400000, "30s", 1, NULL,
	  "dirty data older than this is destaged (0: never by age)" },
	{ "destage", "idle_after", T_TIME, OFF(idle_ms), 0, 86400000, "2s", 1,
	  NULL, "destage while the mount has been idle this long (0: off)" },
	{ "destage", "threads", T_UINT, OFF(threads), 1, 64, "2", 0, NULL,
	  "destage concurrency" },
	{ "destage", "max_rate", T_RATE, OFF(max_rate), 0, UINT64_MAX, "0", 1,
	  NULL, "destage bandwidth cap per second (0: unlimited)" },
	{ "destage", "queue_depth", T_UINT, OFF(destage_depth), 1, 64, "16", 1,
	  NULL,
	  "backing writes a destage pass keeps in flight (short runs of "
	  "scattered pages want a deep queue)" },
	{ "destage", "pace_writers", T_UINT, OFF(pace_writers), 0, 1, "1", 1,
	  NULL,
	  "1: between destage.high_watermark and full, writes that add "
	  "dirty blocks are slowed in proportion, to what destage takes "
	  "away; 0: writers run until the cache is full, then wait" },
	{ "destage", "write_around", T_UINT, OFF(write_around), 0, 100, "80",
	  1, NULL,
	  "percent of cache blocks dirty (never below "
	  "destage.high_watermark) at which a write with no dirty data in "
	  "the cache goes straight to the backing store and drops its clean "
	  "cached copy; 0: writes always go into the cache (paced)" },
	{ "destage", "on_unmount", T_ENUM, OFF(on_unmount), 0, 1, "flush", 1,
	  unmount_names, "flush: destage all before exit; keep: leave dirty" },
	{ "destage", "on_close", T_ENUM, OFF(on_close), 0, 1, "none", 0,
	  on_close_names,
	  "flush: close(2) of a writer waits until the store holds the "
	  "file's data written so far (none: close(2) asks the daemon "
	  "nothing)" },
	{ "fuse", "workers", T_UINT, OFF(fuse_workers), 0, 256, "0", 0, NULL,
	  "threads that read FUSE requests and answer reads and writes from "
	  "io_uring completions, none waiting for its I/O (0: one per CPU)" },
	{ "fuse", "threads", T_UINT, OFF(fuse_threads), 1, 256, "16", 0, NULL,
	  "threads that run requests which may wait (misses, metadata on a "
	  "slow store) while the workers go on" },
	{ "fuse", "transport", T_ENUM, OFF(fuse_transport), 0, 2, "auto", 0,
	  transport_names,
	  "how FUSE requests come: uring (FUSE over io_uring; the "
	  "administrator turns it on with the fuse module's enable_uring=1), "
	  "dev (/dev/fuse), auto (uring where the kernel offers it, else "
	  "/dev/fuse; the log says which)" },
	{ "fuse", "passthrough", T_ENUM, OFF(fuse_passthrough), 0, 1, "auto", 0,
	  passthrough_names,
	  "auto: an open of a bypass file, a write-only open of a "
	  "writearound one, or a read-only open of a file last read as a "
	  "stream past cache.sequential_cutoff, that the cache holds nothing "
	  "of (a stream's clean head is given up) is served by the "
	  "kernel from the backing file (FUSE passthrough: its reads, writes "
	  "and maps reach no daemon; needs CAP_SYS_ADMIN and a kernel that "
	  "offers it, else logged and off); off: every open through the "
	  "cache" },
	{ "fuse", "read_ahead", T_SIZE, OFF(read_ahead), 0, 64 * MIB, "1M", 0,
	  NULL, "kernel read-ahead of the mount (its bdi read_ahead_kb)" },
	{ "fuse", "attr_timeout", T_TIME, OFF(attr_timeout_ms), 0, 3600000,
	  "1s", 0, NULL, "how long the kernel may cache attributes" },
	{ "fuse", "negative_timeout", T_TIME, OFF(negative_timeout_ms), 0,
	  3600000, "0", 0, NULL,
	  "how long the kernel may remember that a name does not exist (0: "
	  "ask the store each time, so a file made on another node is seen "
	  "at once)" },
	{ "stats", "latency", T_ENUM, OFF(stats_latency), 0, 1, "on", 0,
	  onoff_names,
	  "time every request for the latency histograms (off: counters "
	  "only)" },
	{ "stats", "readers", T_STR, OFF(stats_readers), 0, 0, "", 0, NULL,
	  "a group whose members may read the statistics (empty: the "
	  "owner only)" },
};

#define NKEYS (sizeof(keys) / sizeof(keys[0]))
_Static_assert(NKEYS <= sizeof(((struct cache_config *)0)->line) / sizeof(int),
	       "cache_config.line needs a slot per key");

static const struct cfg_key *key_find(const char *section, const char *name)
{
	size_t i;

	for (i = 0; i < NKEYS; i++)
		if (!strcasecmp(keys[i].section, section) &&
		    !strcasecmp(keys[i].key, name))
			return &keys[i];
	return NULL;
}

static int parse_u64(const char *s, uint64_t *out, const char **end)
{
	char *e;
	unsigned long long v;

	while (isspace((unsigned char)*s))
		s++;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &e, 10);
	if (errno)
		return -ERANGE;
	*out = v;
	*end = e;
	return 0;
}

int cfg_parse_size(const char *s, uint64_t *out)
{
	const char *e;
	uint64_t v, mul = 1;
	int ret = parse_u64(s, &v, &e);

	if (ret)
		return ret;
	switch (toupper((unsigned char)*e)) {
	case 'K':
		mul = KIB;
		e++;
		break;
	case 'M':
		mul = MIB;
		e++;
		break;
	case 'G':
		mul = 1024 * MIB;
		e++;
		break;
	case 'T':
		mul = 1024 * 1024 * MIB;
		e++;
		break;
	}
	if (mul > 1 && (*e == 'i' || *e == 'I'))
		e++;
	if (*e == 'B' || *e == 'b')
		e++;
	if (*e)
		return -EINVAL;
	if (v && mul > UINT64_MAX / v)
		return -ERANGE;
	*out = v * mul;
	return 0;
}

int cfg_parse_time_ms(const char *s, uint64_t *out)
{
	const char *e;
	uint64_t v, mul;
	int ret = parse_u64(s, &v, &e);

	if (ret)
		return ret;
	if (!*e || !strcmp(e, "s"))
		mul = 1000;
	else if (!strcmp(e, "ms"))
		mul = 1;
	else if (!strcmp(e, "min"))
		mul = 60000;
	else
		return -EINVAL;
	if (v > UINT64_MAX / mul)
		return -ERANGE;
	*out = v * mul;
	return 0;
}

static int cfg_set_key(struct cache_config *c, const struct cfg_key *k,
		       const char *value, char *msg, size_t len)
{
	void *field = (char *)c + k->off;
	uint64_t v = 0;
	int ret = 0;
	char *dup, *end;
	size_t i;

	switch (k->type) {
	case T_STR:
		dup = strdup(value);
		if (!dup)
			return -ENOMEM;
		/* trim */
		while (isspace((unsigned char)*dup))
			memmove(dup, dup + 1, strlen(dup));
		end = dup + strlen(dup);
		while (end > dup && isspace((unsigned char)end[-1]))
			*--end = 0;
		if (!*dup) {
			free(dup);
			snprintf(msg, len, "%s.%s must not be empty",
				 k->section, k->key);
			return -EINVAL;
		}
		free(*(char **)field);
		*(char **)field = dup;
		return 0;
	case T_SIZE:
		ret = cfg_parse_size(value, &v);
		if (ret) {
			snprintf(msg, len,
				 "%s.%s: '%s' is not a size (use K, M, G, T)",
				 k->section, k->key, value);
			return ret;
		}
		break;
	case T_RATE: {
		char tmp[64];

		snprintf(tmp, sizeof(tmp), "%s", value);
		end = strstr(tmp, "/s");
		if (end && !end[2])
			*end = 0;
		ret = strlen(value) < sizeof(tmp) ? cfg_parse_size(tmp, &v)
						  : -EINVAL;
		if (ret) {
			snprintf(msg, len,
				 "%s.%s: '%s' is not a rate (bytes per second, "
				 "e.g. 100M)",
				 k->section, k->key, value);
			return ret;
		}
		break;
	}
	case T_UINT:
		ret = parse_u64(value, &v, (const char **)&end);
		if (ret || *end) {
			snprintf(msg, len, "%s.%s: '%s' is not a whole number",
				 k->section, k->key, value);
			return -EINVAL;
		}
		break;
	case T_TIME:
		ret = cfg_parse_time_ms(value, &v);
		if (ret) {
			snprintf(msg, len,
				 "%s.%s: '%s' is not a time (use s, ms or min)",
				 k->section, k->key, value);
			return ret;
		}
		break;
	case T_ENUM:
		for (i = 0; k->names[i]; i++)
			if (!strcasecmp(k->names[i], value))
				break;
		if (!k->names[i]) {
			char all[128] = "";

			for (i = 0; k->names[i]; i++) {
				strcat(all, i ? ", " : "");
				strcat(all, k->names[i]);
			}
			snprintf(msg, len, "%s.%s: '%s' is not one of %s",
				 k->section, k->key, value, all);
			return -EINVAL;
		}
		*(int *)field = i;
		return 0;
	}
	if (v < k->min || v > k->max) {
		snprintf(msg, len, "%s.%s: %s is out of range [%llu, %llu]",
			 k->section, k->key, value, (unsigned long long)k->min,
			 (unsigned long long)k->max);
		return -ERANGE;
	}
	*(uint64_t *)field = v;
	return 0;
}

void cfg_defaults(struct cache_config *c)
{
	char msg[CFG_ERRLEN];
	size_t i;

	memset(c, 0, sizeof(*c));
	for (i = 0; i < NKEYS; i++)
		if (keys[i].def)
			cfg_set_key(c, &keys[i], keys[i].def, msg, sizeof(msg));
}

struct parse_ctx {
	struct cache_config *c;
	FILE *f;
	int line;
	char *err;
	size_t errlen;
	int failed;
};

static char *reader_refuse(struct parse_ctx *p, const char *what)
{
	snprintf(p->err, p->errlen, "%s:%d: %s", p->c->file, p->line, what);
	p->failed = 1;
	return NULL;
}

/*
 * A section header: a [policy NAME] section begins a rule here, before inih
 * hands over its keys, so that a section without keys, or with a name taken
 * already, is seen at its own line.  inih reads the name between the
 * brackets as it is; so does pol_is_section.
 */
static int section_seen(struct parse_ctx *p, const char *line)
{
	char name[INI_MAX_LINE + 1], msg[CFG_ERRLEN];
	const char *end, *pname;

	while (isspace((unsigned char)*line))
		line++;
	if (*line != '[' || !(end = strchr(line, ']')) ||
	    (size_t)(end - line) > sizeof(name))
		return 0;
	snprintf(name, sizeof(name), "%.*s", (int)(end - line - 1), line + 1);
	if (!pol_is_section(name, &pname))
		return 0;
	if (pol_section_begin(&p->c->policies, pname, p->line, msg,
			      sizeof(msg))) {
		reader_refuse(p, msg);
		return -EINVAL;
	}
	return 0;
}

/*
 * One line for inih, or NULL.  inih cuts a line at its buffer and parses the
 * rest as a line of its own, and ends it at a NUL byte: both would change what
 * the file says without a word, so both are refused here.
 */
static char *counting_reader(char *str, int num, void *stream)
{
	struct parse_ctx *p = stream;
	long before = ftell(p->f), after;
	char *r = fgets(str, num, p->f);
	size_t len;
	int next;

	if (!r)
		return NULL;
	p->line++;
	len = strlen(str);
	after = ftell(p->f);
	if (before >= 0 && after >= 0 && (size_t)(after - before) != len)
		return reader_refuse(p, "NUL byte in the line; a configuration "
					"file is text");
	if (len && str[len - 1] != '\n' && (next = getc(p->f)) != EOF) {
		if (next != '\n') {
			char msg[64];

			snprintf(msg, sizeof(msg),
				 "line longer than %d characters", num - 1);
			return reader_refuse(p, msg);
		}
		/* exactly a full buffer: the newline is all that is left */
	}
	if (section_seen(p, str))
		return NULL;
	return r;
}

static int cfg_ini_handler(void *user, const char *section, const char *name,
			   const char *value)
{
	struct parse_ctx *p = user;
	const struct cfg_key *k = key_find(section, name);
	char msg[CFG_ERRLEN];
	const char *pname;

	if (p->failed)
		return 0;
	if (pol_is_section(section, &pname)) {
		if (pol_set_key(p->c->policies, name, value, p->line, msg,
				sizeof(msg))) {
			snprintf(p->err, p->errlen, "%s:%d: %s", p->c->file,
				 p->line, msg);
			p->failed = 1;
			return 0;
		}
		return 1;
	}
	if (!k) {
		snprintf(p->err, p->errlen, "%s:%d: unknown key '%s.%s'",
			 p->c->file, p->line, section, name);
		p->failed = 1;
		return 0;
	}
	if (cfg_set_key(p->c, k, value, msg, sizeof(msg))) {
		snprintf(p->err, p->errlen, "%s:%d: %s", p->c->file, p->line,
			 msg);
		p->failed = 1;
		return 0;
	}
	p->c->line[k - keys] = p->line;
	return 1;
}

int cfg_load(struct cache_config *c, const char *path, char *err, size_t errlen)
{
	struct parse_ctx p = { .c = c, .err = err, .errlen = errlen };
	int ret;

	p.f = fopen(path, "r");
	if (!p.f) {
		snprintf(err, errlen, "%s: cannot read configuration: %s", path,
			 strerror(errno));
		return -errno;
	}
	free((char *)c->file);
	c->file = strdup(path);
	ret = ini_parse_stream(counting_reader, &p, cfg_ini_handler, &p);
	fclose(p.f);
	if (p.failed)
		return -EINVAL;
	if (ret > 0) {
		snprintf(err, errlen,
			 "%s:%d: syntax error (expected [section] or key = "
			 "value)",
			 path, ret);
		return -EINVAL;
	}
	if (ret < 0) {
		snprintf(err, errlen, "%s: cannot parse", path);
		return -EIO;
	}
	{
		char msg[CFG_ERRLEN];
		int line = 0;

		if (pol_validate(c->policies, &line, msg, sizeof(msg))) {
			snprintf(err, errlen, "%s:%d: %s", path, line, msg);
			return -EINVAL;
		}
	}
	return 0;
}

int cfg_override(struct cache_config *c, const char *kv, char *err,
		 size_t errlen)
{
	char buf[512], *dot, *eq, msg[CFG_ERRLEN];
	const struct cfg_key *k;

	if (strlen(kv) >= sizeof(buf)) {
		snprintf(err, errlen,
			 "-o %.40s...: too long (at most %zu bytes)", kv,
			 sizeof(buf) - 1);
		return -EINVAL;
	}
	snprintf(buf, sizeof(buf), "%s", kv);
	eq = strchr(buf, '=');
	dot = strchr(buf, '.');
	if (!eq || !dot || dot > eq) {
		snprintf(err, errlen, "-o %s: expected section.key=value", kv);
		return -EINVAL;
	}
	*eq = 0;
	*dot = 0;
	k = key_find(buf, dot + 1);
	if (!k) {
		snprintf(err, errlen, "-o %s: unknown key '%s.%s'", kv, buf,
			 dot + 1);
		return -EINVAL;
	}
	if (cfg_set_key(c, k, eq + 1, msg, sizeof(msg))) {
		snprintf(err, errlen, "-o %s: %s", kv, msg);
		return -EINVAL;
	}
	c->line[k - keys] = -1;
	return 0;
}

/* "FILE:LINE: " for the key at index i, or "-o " when set on the command line.
 */
static void where(const struct cache_config *c, const char *section,
		  const char *key, char *out, size_t len)
{
	const struct cfg_key *k = key_find(section, key);
	int line = k ? c->line[k - keys] : 0;

	if (line > 0)
		snprintf(out, len, "%s:%d: ", c->file ? c->file : "?", line);
	else if (line < 0)
		snprintf(out, len, "-o %s.%s: ", section, key);
	else if (c->file)
		snprintf(out, len, "%s: ", c->file);
	else
		snprintf(out, len, "configuration: ");
}

static int split_list(char *s, char **out, int max)
{
	int n = 0;
	char *save, *tok;

	for (tok = strtok_r(s, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		char *end;

		while (isspace((unsigned char)*tok))
			tok++;
		end = tok + strlen(tok);
		while (end > tok && isspace((unsigned char)end[-1]))
			*--end = 0;
		if (!*tok)
			continue;
		if (n == max)
			return max + 1;
		out[n++] = tok;
	}
	return n;
}

int cfg_validate(struct cache_config *c, char *err, size_t errlen)
{
	char w[CFG_ERRLEN];
	char *list, *parts[NVC_MAX_DEVS + 1];
	int n, i, j;
	size_t k;

	for (k = 0; k < NKEYS; k++) {
		if (keys[k].def || *(char **)((char *)c + keys[k].off))
			continue;
		snprintf(err, errlen, "%s: required key %s.%s is missing",
			 c->file ? c->file : "configuration", keys[k].section,
			 keys[k].key);
		return -EINVAL;
	}
	where(c, "cache", "block_size", w, sizeof(w));
	if (c->block_size & (c->block_size - 1)) {
		snprintf(err, errlen,
			 "%scache.block_size must be a power of two", w);
		return -EINVAL;
	}
	where(c, "destage", "low_watermark", w, sizeof(w));
	if (c->low_wm >= c->high_wm) {
		snprintf(err, errlen,
			 "%sdestage.low_watermark (%llu) must be below "
			 "destage.high_watermark (%llu)",
			 w, (unsigned long long)c->low_wm,
			 (unsigned long long)c->high_wm);
		return -EINVAL;
	}

	for (i = 0; i < NVC_MAX_DEVS; i++) {
		free(c->dev_paths[i]);
		c->dev_paths[i] = NULL;
	}
	where(c, "cache", "devices", w, sizeof(w));
	list = strdup(c->devices);
	if (!list)
		return -ENOMEM;
	n = split_list(list, parts, NVC_MAX_DEVS);
	if (n < 1 || n > NVC_MAX_DEVS) {
		snprintf(err, errlen, "%scache.devices needs 1 to %d devices",
			 w, NVC_MAX_DEVS);
		free(list);
		return -EINVAL;
	}
	for (i = 0, j = 0; i < n; i++)
		j += !cfg_is_spare(parts[i]);
	if (!j) {
		snprintf(err, errlen,
			 "%scache.devices needs a device besides its spare "
			 "places",
			 w);
		free(list);
		return -EINVAL;
	}
	for (i = 0; i < n; i++)
		for (j = 0; j < i; j++)
			if (!strcmp(parts[i], parts[j]) &&
			    !cfg_is_spare(parts[i])) {
				snprintf(err, errlen,
					 "%scache.devices names %s twice", w,
					 parts[i]);
				free(list);
				return -EINVAL;
			}
	for (i = 0; i < n; i++)
		c->dev_paths[i] = strdup(parts[i]);
	c->ndevs = n;
	free(list);

	where(c, "cache", "dirty_copies", w, sizeof(w));
	for (i = 0, j = 0; i < c->ndevs; i++)
		j += !cfg_is_spare(c->dev_paths[i]);
	if (c->dirty_copies == 2 && j < 2) {
		snprintf(err, errlen,
			 "%scache.dirty_copies = 2 needs at least two "
			 "cache.devices (not spare places)",
			 w);
		return -EINVAL;
	}

	where(c, "cache", "metadata", w, sizeof(w));
	list = strdup(c->metadata);
	if (!list)
		return -ENOMEM;
	n = split_list(list, parts, 2);
	if (n != 2) {
		snprintf(err, errlen,
			 "%scache.metadata needs exactly two locations, one "
			 "per mirror",
			 w);
		free(list);
		return -EINVAL;
	}
	if (!strcmp(parts[0], parts[1])) {
		snprintf(err, errlen,
			 "%scache.metadata: both mirrors are %s; they must be "
			 "two different locations",
			 w, parts[0]);
		free(list);
		return -EINVAL;
	}
	for (i = 0; i < 2; i++) {
		free(c->meta_paths[i]);
		c->meta_paths[i] = strdup(parts[i]);
		for (j = 0; j < c->ndevs; j++)
			if (!strcmp(parts[i], c->dev_paths[j])) {
				snprintf(err, errlen,
					 "%s%s is both a metadata mirror and a "
					 "cache device",
					 w, parts[i]);
				free(list);
				return -EINVAL;
			}
	}
	free(list);
	return 0;
}

int cfg_reload_into(struct cache_config *live, struct cache_config *next)
{
	size_t i;
	int changed = 0;

	for (i = 0; i < NKEYS; i++) {
		const struct cfg_key *k = &keys[i];
		void *a = (char *)live + k->off;
		const void *b = (const char *)next + k->off;

		if (k->type == T_STR)
			continue;
		if (k->type == T_ENUM) {
			if (*(int *)a == *(const int *)b)
				continue;
			if (!k->reload)
				goto fixed;
			log_msg(LOG_NOTICE, "reload: %s.%s: %s -> %s",
				k->section, k->key, k->names[*(int *)a],
				k->names[*(const int *)b]);
			*(int *)a = *(const int *)b;
			changed++;
			continue;
		}
		if (*(uint64_t *)a == *(const uint64_t *)b)
			continue;
		if (!k->reload)
			goto fixed;
		log_msg(LOG_NOTICE, "reload: %s.%s: %llu -> %llu", k->section,
			k->key, (unsigned long long)*(uint64_t *)a,
			(unsigned long long)*(const uint64_t *)b);
		*(uint64_t *)a = *(const uint64_t *)b;
		changed++;
		continue;
	fixed:
		log_msg(LOG_WARNING,
			"reload: %s.%s cannot change while mounted; kept",
			k->section, k->key);
	}
	if (!pol_set_equal(live->policies, next->policies)) {
		log_msg(LOG_NOTICE,
			"reload: policies: %d rules -> %d; files opened from "
			"now on match the new ones",
			pol_count(live->policies), pol_count(next->policies));
		pol_live_swap(&live->policies, &next->policies);
		changed++;
	}
	if (!changed)
		log_msg(LOG_NOTICE, "reload: no tunable changed");
	return changed;
}

static const char *type_name(enum cfg_type t)
{
	switch (t) {
	case T_STR:
		return "text";
	case T_SIZE:
		return "size";
	case T_UINT:
		return "number";
	case T_TIME:
		return "time";
	case T_ENUM:
		return "choice";
	case T_RATE:
		return "rate";
	}
	return "?";
}

void cfg_help(FILE *f)
{
	size_t i;

	fprintf(f, "Configuration keys (file sections, or -o "
		   "section.key=value):\n");
	for (i = 0; i < NKEYS; i++) {
		const struct cfg_key *k = &keys[i];
		char name[64];

		snprintf(name, sizeof(name), "%s.%s", k->section, k->key);
		fprintf(f, "  %-24s %-6s %s%s [default: %s]\n", name,
			type_name(k->type), k->help,
			k->reload ? " (SIGHUP)" : "",
			k->def ? k->def : "required");
	}
	pol_help(f);
}

/* ------------------------------------------------------------ man page */

/* s as roff text: a backslash printed as one, no line read as a request. */
void cfg_roff(FILE *f, const char *s)
{
	if (*s == '.' || *s == '\'')
		fputs("\\&", f);
	for (; *s; s++)
		if (*s == '\\')
			fputs("\\e", f);
		else
			fputc(*s, f);
}

/* v in the largest unit of the key's type that shows it exactly. */
static void fmt_value(const struct cfg_key *k, uint64_t v, char *out,
		      size_t len)
{
	static const char units[] = "KMGT";
	int u = -1;

	if (k->type == T_TIME) {
		if (!v)
			snprintf(out, len, "0");
		else if (v % 60000 == 0)
			snprintf(out, len, "%llumin",
				 (unsigned long long)v / 60000);
		else if (v % 1000 == 0)
			snprintf(out, len, "%llus",
				 (unsigned long long)v / 1000);
		else
			snprintf(out, len, "%llums", (unsigned long long)v);
		return;
	}
	if (k->type == T_SIZE || k->type == T_RATE)
		while (v && v % 1024 == 0 && u < 3) {
			v /= 1024;
			u++;
		}
	snprintf(out, len, "%llu%.*s", (unsigned long long)v, u >= 0 ? 1 : 0,
		 u >= 0 ? &units[u] : "");
}

/* The key's type, default, range and SIGHUP mark, for its man page tag. */
static void man_tag(FILE *f, const struct cfg_key *k)
{
	char lo[32], hi[32];
	size_t i;

	fprintf(f, ".TP\n\\fB%s.%s\\fR (\\fI%s\\fR", k->section, k->key,
		type_name(k->type));
	if (!k->def)
		fputs(", required", f);
	else if (*k->def)
		fprintf(f, ", default \\fB%s\\fR", k->def);
	else
		fputs(", default empty", f);
	if (k->type == T_ENUM) {
		fputs(": ", f);
		for (i = 0; k->names[i]; i++)
			fprintf(f, "%s\\fB%s\\fR", i ? ", " : "", k->names[i]);
	} else if (k->type != T_STR) {
		fmt_value(k, k->min, lo, sizeof(lo));
		fmt_value(k, k->max, hi, sizeof(hi));
		if (k->max == UINT64_MAX && k->min)
			fprintf(f, ", at least %s", lo);
		else if (k->max != UINT64_MAX)
			fprintf(f, ", %s to %s", lo, hi);
	}
	fprintf(f, "%s)\n", k->reload ? "; re-read on SIGHUP" : "");
}

void cfg_man(FILE *f)
{
	const char *section = "";
	size_t i;

	for (i = 0; i < NKEYS; i++) {
		const struct cfg_key *k = &keys[i];

		if (strcmp(section, k->section)) {
			section = k->section;
			fprintf(f, ".SS \"[%s]\"\n", section);
		}
		man_tag(f, k);
		cfg_roff(f, k->help);
		fputs("\n", f);
	}
	fputs(".SS \"[policy NAME]\"\n", f);
	pol_man(f);
}

void cfg_print(const struct cache_config *c, FILE *f)
{
	size_t i;

	for (i = 0; i < NKEYS; i++) {
		const struct cfg_key *k = &keys[i];
		const void *v = (const char *)c + k->off;

		fprintf(f, "%s.%s = ", k->section, k->key);
		if (k->type == T_STR)
			fprintf(f, "%s\n",
				*(char *const *)v ? *(char *const *)v : "");
		else if (k->type == T_ENUM)
			fprintf(f, "%s\n", k->names[*(const int *)v]);
		else
			fprintf(f, "%llu%s\n",
				(unsigned long long)*(const uint64_t *)v,
				k->type == T_TIME ? "ms" : "");
	}
	pol_print(c->policies, f);
}

void cfg_free(struct cache_config *c)
{
	size_t i;
	int j;

	for (i = 0; i < NKEYS; i++)
		if (keys[i].type == T_STR)
			free(*(char **)((char *)c + keys[i].off));
	for (j = 0; j < NVC_MAX_DEVS; j++)
		free(c->dev_paths[j]);
	free(c->meta_paths[0]);
	free(c->meta_paths[1]);
	free((char *)c->file);
	pol_set_put(c->policies);
	memset(c, 0, sizeof(*c));
}
