/* tools: nvcachectl's per-file commands — warm, pin, unpin, evict, status
 * and flush of PATHs, through the daemon that serves their mount. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../cache/cache.h"
#include "filecmds.h"
#include "show.h"

/*
 * PATH to (mount, path within it): realpath(PATH), then the longest mount
 * point of /proc/self/mountinfo that holds it, which must be of type
 * fuse.nvcachefs.  The daemon gets the path relative to its mount point
 * and resolves it in its backing directory (fs/ctlfile.c); nothing is read
 * through the mount.  Every PATH of one command is on one mount.
 */

#define TOP_N 10

/* mountinfo's octal escapes (\040 for a space) undone in place. */
static void unescape(char *s)
{
	char *d = s;

	while (*s) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] &&
		    s[3]) {
			*d++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 +
				      (s[3] - '0'));
			s += 4;
		} else {
			*d++ = *s++;
		}
	}
	*d = 0;
}

/* The mount point holding path (resolved) and its type; 0 or -errno. */
static int mount_of(const char *path, char *mnt, size_t mlen, char *type,
		    size_t tlen)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	char *line = NULL;
	size_t cap = 0, best = 0;

	if (!f)
		return -errno;
	*mnt = 0;
	while (getline(&line, &cap, f) > 0) {
		char *fld[10], *save = NULL, *p = line, *sep;
		int n = 0;
		size_t l;

		sep = strstr(line, " - ");
		if (!sep)
			continue;
		*sep = 0;
		while (n < 5 && (fld[n] = strtok_r(p, " ", &save))) {
			p = NULL;
			n++;
		}
		if (n < 5)
			continue;
		unescape(fld[4]);
		l = strlen(fld[4]);
		if (strncmp(path, fld[4], l) ||
		    (path[l] != '/' && path[l] && l > 1))
			continue;
		if (l < best && *mnt)
			continue;
		best = l;
		snprintf(mnt, mlen, "%s", fld[4]);
		p = sep + 3;
		sep = strchr(p, ' ');
		if (sep)
			*sep = 0;
		snprintf(type, tlen, "%s", p);
	}
	free(line);
	fclose(f);
	return *mnt ? 0 : -ENOENT;
}

struct req {
	char *buf;
	size_t len;
	char mnt[PATH_MAX];
	char **rel; /* the PATHs within mnt */
	int n;
};

/* The request for cmd on paths: each resolved to its mount. */
static int build(struct req *r, const char *cmd, unsigned flags, char **paths,
		 int n)
{
	FILE *m;
	int i;

	memset(r, 0, sizeof(*r));
	r->rel = calloc(n + 1, sizeof(char *));
	m = open_memstream(&r->buf, &r->len);
	if (!r->rel || !m)
		return fail("out of memory");
	fprintf(m, "%s %d %d %u\n", cmd, CTL_PROTO_VERSION, n, flags);
	for (i = 0; i < n; i++) {
		char real[PATH_MAX], mnt[PATH_MAX], type[64];
		const char *rel;
		int ret;

		if (!realpath(paths[i], real)) {
			fclose(m);
			return fail("%s: %s", paths[i], strerror(errno));
		}
		ret = mount_of(real, mnt, sizeof(mnt), type, sizeof(type));
		if (ret) {
			fclose(m);
			return fail("%s: cannot find its mount: %s", paths[i],
				    strerror(-ret));
		}
		if (strcmp(type, "fuse.nvcachefs")) {
			fclose(m);
			return fail("%s is not on an nvcachefs mount (it is on "
				    "%s, type %s)",
				    paths[i], mnt, type);
		}
		if (i && strcmp(mnt, r->mnt)) {
			fclose(m);
			return fail("%s is on %s, %s on %s: one mount at a "
				    "time",
				    paths[i], mnt, paths[0], r->mnt);
		}
		snprintf(r->mnt, sizeof(r->mnt), "%s", mnt);
		rel = real + strlen(mnt);
		rel += *rel == '/';
		r->rel[i] = strdup(rel);
		fwrite(rel, 1, strlen(rel) + 1, m);
	}
	r->n = n;
	return fclose(m) ? fail("out of memory") : 0;
}

static void req_free(struct req *r)
{
	int i;

	for (i = 0; r->rel && i < r->n; i++)
		free(r->rel[i]);
	free(r->rel);
	free(r->buf);
}

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

/* One file of a status answer. */
struct finfo {
	uint64_t size, cached, dirty, age_ms;
	int pinned, uptodate;
	char policy[64];
	char *path;
};

struct answer {
	const char *cmd;
	const char *mnt;
	int tty, json, failed;
	double t0;
	uint64_t p0, last_a; /* progress: the first figure seen */
	int seen;
	struct finfo *files;
	size_t n, cap;
	char done[1024];
};

/* n bytes of the answer, then the newline after them; malloc'd. */
static char *read_name(FILE *f, size_t n)
{
	char *s = malloc(n + 1);

	if (!s || fread(s, 1, n, f) != n || fgetc(f) != '\n') {
		free(s);
		return NULL;
	}
	s[n] = 0;
	return s;
}

static void show_progress(struct answer *a, uint64_t x, uint64_t y)
{
	char b1[32], b2[32], b3[32], b4[32];
	double t = mono_s() - a->t0;
	int flushing = !strcmp(a->cmd, "flush") || !strcmp(a->cmd, "evict");

	if (!a->seen) {
		a->seen = 1;
		a->p0 = flushing ? y : x;
	}
	if (!a->tty)
		return;
	if (flushing) {
		/* x: dirty left, y: destaged */
		double rate = t > 0.5 ? (y - a->p0) / t : 0;

		show_bytes(x, b1, sizeof(b1));
		if (rate > 0) {
			show_bytes(rate, b2, sizeof(b2));
			show_span(x / rate, b3, sizeof(b3));
			printf("\r%s: %s left, %s/s, about %s to go     ",
			       a->cmd, b1, b2, b3);
		} else {
			printf("\r%s: %s left                          ",
			       a->cmd, b1);
		}
	} else {
		/* x: bytes read, y: bytes to read */
		double rate = t > 0.5 ? x / t : 0;

		show_bytes(x, b1, sizeof(b1));
		show_bytes(y, b2, sizeof(b2));
		if (rate > 0 && y >= x) {
			show_bytes(rate, b3, sizeof(b3));
			show_span((y - x) / rate, b4, sizeof(b4));
			printf("\r%s: %s of %s (%.0f%%), %s/s, about %s "
			       "left     ",
			       a->cmd, b1, b2, y ? 100.0 * x / y : 100.0, b3,
			       b4);
		} else {
			printf("\r%s: %s of %s                     ", a->cmd,
			       b1, b2);
		}
	}
	fflush(stdout);
	a->last_a = x;
}

static int add_file(struct answer *a, const char *line, FILE *f)
{
	struct finfo *x;
	size_t len;

	if (a->n == a->cap) {
		size_t cap = a->cap ? 2 * a->cap : 64;
		struct finfo *v = realloc(a->files, cap * sizeof(*v));

		if (!v)
			return -1;
		a->files = v;
		a->cap = cap;
	}
	x = &a->files[a->n];
	memset(x, 0, sizeof(*x));
	if (sscanf(line, "file %lu %lu %lu %lu %d %d %63s %zu", &x->size,
		   &x->cached, &x->dirty, &x->age_ms, &x->pinned, &x->uptodate,
		   x->policy, &len) != 8 ||
	    !(x->path = read_name(f, len)))
		return -1;
	a->n++;
	return 0;
}

/* Read the daemon's answer to the end: 0 on "ok". */
static int read_answer(FILE *f, struct answer *a)
{
	char line[1024];
	unsigned long long x, y;
	size_t len;

	while (!interrupted && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		if (sscanf(line, "progress %llu %llu", &x, &y) == 2) {
			show_progress(a, x, y);
		} else if (sscanf(line, "perr %zu", &len) == 1) {
			char *p = read_name(f, len), msg[600];

			if (!p || !fgets(msg, sizeof(msg), f)) {
				free(p);
				break;
			}
			msg[strcspn(msg, "\n")] = 0;
			if (a->tty && a->seen)
				putchar('\n');
			fail("%s%s%s: %s", a->mnt, *p ? "/" : "", p, msg);
			a->failed = 1;
			free(p);
		} else if (!strncmp(line, "file ", 5)) {
			if (add_file(a, line, f))
				break;
		} else if (!strncmp(line, "done ", 5)) {
			snprintf(a->done, sizeof(a->done), "%s", line + 5);
		} else if (!strcmp(line, "ok")) {
			return 0;
		} else if (!strncmp(line, "error ", 6)) {
			if (a->tty && a->seen)
				putchar('\n');
			if (strcmp(line + 6, "some paths failed"))
				fail("%s: %s", a->cmd, line + 6);
			return 1;
		}
	}
	if (a->tty && a->seen)
		putchar('\n');
	if (interrupted)
		return fail("%s: interrupted; the daemon stops it", a->cmd);
	return fail("the daemon went away before the %s finished", a->cmd);
}

/* A figure of the "done" summary, 0 if absent. */
static uint64_t done_val(const struct answer *a, const char *key)
{
	size_t l = strlen(key);
	const char *p = a->done;

	while (p && *p) {
		if (!strncmp(p, key, l) && p[l] == '=')
			return strtoull(p + l + 1, NULL, 10);
		p = strchr(p, ' ');
		p += p != NULL;
	}
	return 0;
}

static void summary(const struct answer *a)
{
	char b1[32], b2[32], b3[32];
	double t = mono_s() - a->t0;
	uint64_t files = done_val(a, "files");

	if (a->tty)
		printf("\r");
	if (!strcmp(a->cmd, "warm") || !strcmp(a->cmd, "pin")) {
		show_bytes(done_val(a, "read"), b1, sizeof(b1));
		show_bytes(done_val(a, "cached"), b2, sizeof(b2));
		show_bytes(done_val(a, "size"), b3, sizeof(b3));
		printf("%s %llu file%s: %s cached of %s (%s read in %.1f s)"
		       "          \n",
		       !strcmp(a->cmd, "pin") ? "pinned" : "warmed",
		       (unsigned long long)files, files == 1 ? "" : "s", b2, b3,
		       b1, t);
	} else if (!strcmp(a->cmd, "unpin")) {
		printf("unpinned %llu file%s\n", (unsigned long long)files,
		       files == 1 ? "" : "s");
	} else if (!strcmp(a->cmd, "evict")) {
		show_bytes(done_val(a, "dropped"), b1, sizeof(b1));
		show_bytes(done_val(a, "left"), b2, sizeof(b2));
		show_bytes(done_val(a, "destaged"), b3, sizeof(b3));
		printf("evicted %llu file%s: %s dropped, %s destaged, %s still "
		       "cached (dirty, pinned or in use)          \n",
		       (unsigned long long)files, files == 1 ? "" : "s", b1, b3,
		       b2);
	} else if (!strcmp(a->cmd, "flush")) {
		show_bytes(done_val(a, "destaged"), b1, sizeof(b1));
		printf("flush: done, %llu file%s, %s destaged in %.1f s      "
		       "            \n",
		       (unsigned long long)files, files == 1 ? "" : "s", b1, t);
	}
}

static int by_cached(const void *x, const void *y)
{
	const struct finfo *a = x, *b = y;

	return (b->cached > a->cached) - (b->cached < a->cached);
}

static int by_dirty(const void *x, const void *y)
{
	const struct finfo *a = x, *b = y;

	return (b->dirty > a->dirty) - (b->dirty < a->dirty);
}

static void status_row(FILE *out, const char *mnt, const struct finfo *x)
{
	char s[32], c[32], d[32], age[32];

	show_bytes(x->size, s, sizeof(s));
	show_bytes(x->cached, c, sizeof(c));
	show_bytes(x->dirty, d, sizeof(d));
	if (x->age_ms)
		show_span(x->age_ms / 1000.0, age, sizeof(age));
	else
		snprintf(age, sizeof(age), "-");
	fprintf(out, "%10s %10s %10s  %-3s  %9s  %-8s %-10s %s%s%s\n", s, c, d,
		x->pinned ? "yes" : "no", age, x->uptodate ? "yes" : "no",
		x->policy, mnt, *x->path ? "/" : "", x->path);
}

static void status_header(FILE *out)
{
	fprintf(out, "%10s %10s %10s  %-3s  %9s  %-8s %-10s %s\n", "SIZE",
		"CACHED", "DIRTY", "PIN", "DIRTY AGE", "BACKING", "POLICY",
		"PATH");
}

static void totals(const struct answer *a, struct finfo *t, uint64_t *npinned)
{
	size_t i;

	memset(t, 0, sizeof(*t));
	*npinned = 0;
	t->uptodate = 1;
	for (i = 0; i < a->n; i++) {
		const struct finfo *x = &a->files[i];

		t->size += x->size;
		t->cached += x->cached;
		t->dirty += x->dirty;
		t->age_ms = x->age_ms > t->age_ms ? x->age_ms : t->age_ms;
		t->uptodate &= x->uptodate;
		*npinned += x->pinned;
	}
}

/* The cache's devices and mirrors, as the statistics show them: their role,
 * name and state (said, not fatal, if the daemon does not answer). */
static void status_devices(const char *mnt)
{
	struct stat_snap *snap = calloc(1, sizeof(*snap));

	if (snap && !ctl_fetch_stats(mnt, snap)) {
		putchar('\n');
		show_devices(stdout, snap, 0);
	}
	free(snap);
}

static void status_text(struct answer *a, int recursive)
{
	struct finfo t;
	uint64_t np;
	char s[32], c[32], d[32];
	size_t i, k;

	totals(a, &t, &np);
	if (!recursive) {
		status_header(stdout);
		for (i = 0; i < a->n; i++)
			status_row(stdout, a->mnt, &a->files[i]);
		return;
	}
	show_bytes(t.size, s, sizeof(s));
	show_bytes(t.cached, c, sizeof(c));
	show_bytes(t.dirty, d, sizeof(d));
	printf("%zu files, %s; cached %s (%.1f%%), dirty %s, %llu pinned; "
	       "backing %s\n",
	       a->n, s, c, t.size ? 100.0 * t.cached / t.size : 0.0, d,
	       (unsigned long long)np,
	       t.uptodate ? "up to date" : "behind (dirty data)");
	status_devices(a->mnt);
	for (k = 0; k < 2; k++) {
		size_t shown = 0;

		qsort(a->files, a->n, sizeof(*a->files),
		      k ? by_dirty : by_cached);
		for (i = 0; i < a->n && shown < TOP_N; i++) {
			if (!(k ? a->files[i].dirty : a->files[i].cached))
				break;
			if (!shown++) {
				printf("\ntop files by %s bytes:\n",
				       k ? "dirty" : "cached");
				status_header(stdout);
			}
			status_row(stdout, a->mnt, &a->files[i]);
		}
	}
}

static struct json_object *file_json(const char *mnt, const struct finfo *x)
{
	struct json_object *o = json_object_new_object();
	char *p = NULL, age[32];

	if (x->path &&
	    asprintf(&p, "%s%s%s", mnt, *x->path ? "/" : "", x->path) >= 0) {
		json_object_object_add(o, "path", json_object_new_string(p));
		free(p);
	}
	json_object_object_add(o, "size", json_object_new_int64(x->size));
	json_object_object_add(o, "cached_bytes",
			       json_object_new_int64(x->cached));
	json_object_object_add(o, "dirty_bytes",
			       json_object_new_int64(x->dirty));
	json_object_object_add(o, "pinned", json_object_new_boolean(x->pinned));
	snprintf(age, sizeof(age), "%.3f", x->age_ms / 1000.0);
	json_object_object_add(
		o, "oldest_dirty_age_s",
		json_object_new_double_s(x->age_ms / 1000.0, age));
	json_object_object_add(o, "backing_up_to_date",
			       json_object_new_boolean(x->uptodate));
	json_object_object_add(o, "policy", json_object_new_string(x->policy));
	return o;
}

static void status_json(struct answer *a, int recursive)
{
	struct json_object *o = json_object_new_object(), *v;
	struct finfo t;
	uint64_t np;
	size_t i, k;

	totals(a, &t, &np);
	json_object_object_add(o, "mount", json_object_new_string(a->mnt));
	v = json_object_new_array();
	for (i = 0; i < a->n; i++)
		json_object_array_add(v, file_json(a->mnt, &a->files[i]));
	json_object_object_add(o, "files", v);
	v = json_object_new_object();
	json_object_object_add(v, "files", json_object_new_int64(a->n));
	json_object_object_add(v, "size", json_object_new_int64(t.size));
	json_object_object_add(v, "cached_bytes",
			       json_object_new_int64(t.cached));
	json_object_object_add(v, "dirty_bytes",
			       json_object_new_int64(t.dirty));
	json_object_object_add(v, "pinned_files", json_object_new_int64(np));
	json_object_object_add(v, "backing_up_to_date",
			       json_object_new_boolean(t.uptodate));
	json_object_object_add(o, "totals", v);
	for (k = 0; recursive && k < 2; k++) {
		v = json_object_new_array();
		qsort(a->files, a->n, sizeof(*a->files),
		      k ? by_dirty : by_cached);
		for (i = 0; i < a->n && i < TOP_N; i++)
			if (k ? a->files[i].dirty : a->files[i].cached)
				json_object_array_add(
					v, file_json(a->mnt, &a->files[i]));
		json_object_object_add(o, k ? "top_dirty" : "top_cached", v);
	}
	printf("%s\n", json_object_to_json_string_ext(
			       o, JSON_C_TO_STRING_PRETTY |
					  JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(o);
}

static void file_usage(FILE *f)
{
	fprintf(f, "usage: nvcachectl warm PATH... [-r] [--partial]\n"
		   "       nvcachectl pin PATH... [-r] | unpin PATH... [-r]\n"
		   "       nvcachectl evict PATH... [-r] [--flush]\n"
		   "       nvcachectl status PATH... [-r] [--json]\n"
		   "       nvcachectl flush MOUNTPOINT PATH... [-r]\n");
}

int cmd_file(const char *cmd, int argc, char **argv)
{
	static const struct option lo[] = {
		{ "recursive", no_argument, NULL, 'r' },
		{ "partial", no_argument, NULL, 'P' },
		{ "flush", no_argument, NULL, 'F' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	struct answer a = { .cmd = cmd };
	struct sigaction sa = { .sa_handler = on_sigint };
	unsigned flags = 0;
	struct req r;
	FILE *f;
	int opt, ret, first;

	while ((opt = getopt_long(argc, argv, "rh", lo, NULL)) != -1) {
		switch (opt) {
		case 'r':
			flags |= CTL_F_RECURSIVE;
			break;
		case 'P':
			flags |= CTL_F_PARTIAL;
			break;
		case 'F':
			flags |= CTL_F_FLUSH;
			break;
		case 'j':
			a.json = 1;
			break;
		case 'h':
			file_usage(stdout);
			return 0;
		default:
			file_usage(stderr);
			return 2;
		}
	}
	if ((flags & CTL_F_PARTIAL) && strcmp(cmd, "warm"))
		return fail("--partial goes with warm only");
	if ((flags & CTL_F_FLUSH) && strcmp(cmd, "evict"))
		return fail("--flush goes with evict only");
	if (a.json && strcmp(cmd, "status"))
		return fail("--json goes with status only");
	first = optind;
	if (!strcmp(cmd, "flush"))
		first++; /* flush MOUNTPOINT PATH...: the mount is the PATHs' */
	if (first >= argc)
		return fail("%s needs at least one PATH", cmd);
	if (build(&r, cmd, flags, argv + first, argc - first)) {
		req_free(&r);
		return 1;
	}
	if (!strcmp(cmd, "flush")) {
		char m[PATH_MAX];

		if (!realpath(argv[optind], m) || strcmp(m, r.mnt)) {
			req_free(&r);
			return fail("%s is not the mount of the PATHs (%s)",
				    argv[optind], r.mnt);
		}
	}
	if (ctl_connect_len(r.mnt, r.buf, r.len, &f)) {
		req_free(&r);
		return 1;
	}
	sigaction(SIGINT, &sa, NULL); /* no SA_RESTART: the read returns */
	a.mnt = r.mnt;
	a.tty = isatty(STDOUT_FILENO) && !a.json;
	a.t0 = mono_s();
	ret = read_answer(f, &a);
	fclose(f);
	if (!ret || (a.failed && done_val(&a, "files"))) {
		if (!strcmp(cmd, "status") && a.json)
			status_json(&a, flags & CTL_F_RECURSIVE);
		else if (!strcmp(cmd, "status"))
			status_text(&a, flags & CTL_F_RECURSIVE);
		else
			summary(&a);
	}
	for (size_t i = 0; i < a.n; i++)
		free(a.files[i].path);
	free(a.files);
	req_free(&r);
	if (interrupted)
		return 130;
	return ret || a.failed ? 1 : 0;
}
