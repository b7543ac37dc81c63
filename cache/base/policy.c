/* cache: policies by path — the rules of [policy NAME] sections, their
 * parsing and validation, glob matching, and the live set SIGHUP replaces. */
#define _GNU_SOURCE

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

/*
 * The rules.  A configuration file lists [policy NAME] sections; their order
 * in the file is the order of the rules, and a file gets the first rule it
 * matches (first match wins), or none: the global keys.  A rule matches when
 * one of its globs (match, repeatable) matches the file's path relative to
 * the mount, and its size at open lies within min_size and max_size (both
 * inclusive, both optional).
 *
 * Globs.  A pattern is split at '/' into components.  A pattern without a '/'
 * matches the file's base name at any depth ("*.tmp"), as in .gitignore.  A
 * pattern with a '/' matches the whole relative path, from the mount's root
 * (a leading '/' changes nothing: "/a.log" is the a.log at the root only).
 * Within a component, '*', '?' and '[...]' are fnmatch(3)'s and never cross
 * a '/'; a leading '.' is not special.  A component "**" matches any number
 * of directories: "a", "**" (components written apart here, as a C comment
 * cannot hold the pattern) is everything under a, not a itself (a trailing
 * "**" takes one component at least); "a", "**", "b" is a/b, a/x/b, a/x/y/b.
 * Refused: an empty pattern, '**' inside a component ("a**"), a '[' without
 * its ']', a trailing '\', and a trailing '/' (for what is under a directory,
 * add the "**").
 *
 * A set is immutable once parsed.  The live one (cache_config.policies) is
 * replaced by SIGHUP while opens match against it, so it is reference
 * counted: an open takes a reference under pol_lock, matches, and puts it.
 * A file keeps the values its rule gave it (struct pol_match), never a
 * pointer into a set; its rule's name is interned (never freed), so that
 * the name a status shows stays valid whatever reload comes.
 */

struct pol_rule {
	char name[POL_NAME_MAX];
	int line; /* of the section header */
	struct pol_glob pats[POL_MAX_PATTERNS];
	int npats;
	uint64_t min_size, max_size;
	int has_max;
	int mode; /* -1: cache.mode */
	int pin; /* -1: not set (no) */
	int prio; /* -1: not set (normal) */
	uint64_t age_ms; /* POL_AGE_GLOBAL: not set */
	/* lines where each key was set (0: not set), for messages */
	int line_min, line_max, line_mode, line_pin, line_prio, line_age;
};

struct pol_set {
	int refs;
	int n;
	struct pol_rule *rules[POL_MAX_RULES];
};

static const char *const mode_names[] = { "writeback", "writethrough",
					  "writearound", "bypass", NULL };
static const char *const prio_names[] = { "low", "normal", "high", NULL };
static const char *const yesno_names[] = { "no", "yes", NULL };

/* The keys of a policy section, for --help. */
static const struct {
	const char *key, *type, *help;
} pol_keys[] = {
	{ "match", "glob",
	  "a shell glob on the path relative to the mount (required; repeat "
	  "the key for more: any of them matches)" },
	{ "min_size", "size", "only files at least this large when opened" },
	{ "max_size", "size", "only files at most this large when opened" },
	{ "mode", "choice",
	  "writeback, writethrough, writearound, or bypass (never cached) "
	  "[default: cache.mode]" },
	{ "pin", "yes/no", "keep the files' data in the cache [default: no]" },
	{ "destage_after", "time",
	  "dirty data older than this is destaged (0: never by age) "
	  "[default: destage.max_dirty_age]" },
	{ "priority", "choice",
	  "low, normal or high: clean data of a lower priority is evicted "
	  "first, least recently used first within one [default: normal]" },
};

/* ---------------------------------------------------------------- globs */

void pol_glob_free(struct pol_glob *g)
{
	free(g->text);
	free(g->buf);
	free(g->comp);
	memset(g, 0, sizeof(*g));
}

/* One component: no "**" inside it, every '[' closed, no trailing '\'. */
static int comp_check(const char *c, char *msg, size_t len)
{
	const char *p;

	if (strcmp(c, "**") && strstr(c, "**")) {
		snprintf(msg, len, "'**' must be a whole path component ('%s')",
			 c);
		return -EINVAL;
	}
	for (p = c; *p; p++) {
		if (*p == '\\') {
			if (!p[1]) {
				snprintf(msg, len, "trailing '\\' in '%s'", c);
				return -EINVAL;
			}
			p++;
		} else if (*p == '[') {
			const char *q = p + 1;

			if (*q == '!' || *q == '^')
				q++;
			if (*q == ']')
				q++;
			while (*q && *q != ']')
				q++;
			if (!*q) {
				snprintf(msg, len,
					 "'[' without its ']' in '%s'", c);
				return -EINVAL;
			}
			p = q;
		}
	}
	return 0;
}

int pol_glob_compile(const char *pat, struct pol_glob *g, char *msg, size_t len)
{
	const char *p = pat;
	char *tok, *save;
	size_t n;
	int slash, ret = -ENOMEM, k = 0;

	memset(g, 0, sizeof(*g));
	while (isspace((unsigned char)*p))
		p++;
	n = strlen(p);
	while (n && isspace((unsigned char)p[n - 1]))
		n--;
	if (!n) {
		snprintf(msg, len, "an empty glob");
		return -EINVAL;
	}
	if (p[n - 1] == '/') {
		snprintf(msg, len,
			 "'%.*s' ends with '/': write '%.*s**' for what is "
			 "under a directory",
			 (int)n, p, (int)n, p);
		return -EINVAL;
	}
	g->text = strndup(p, n);
	/* one more component for the "**" a base-name pattern gets */
	g->buf = malloc(n + 4);
	g->comp = calloc(n / 2 + 2, sizeof(*g->comp));
	if (!g->text || !g->buf || !g->comp)
		goto err_free;
	slash = memchr(p, '/', n) != NULL;
	if (!slash) /* a base name, at any depth */
		strcpy(g->buf, "**/");
	else
		g->buf[0] = 0;
	strncat(g->buf, *p == '/' ? p + 1 : p, *p == '/' ? n - 1 : n);
	for (tok = strtok_r(g->buf, "/", &save); tok;
	     tok = strtok_r(NULL, "/", &save)) {
		ret = comp_check(tok, msg, len);
		if (ret)
			goto err_free;
		g->comp[k++] = tok;
	}
	if (!k) {
		snprintf(msg, len, "'%s' names no file", g->text);
		ret = -EINVAL;
		goto err_free;
	}
	/* a trailing "**" is what is under the directory, not the directory:
	 * one component at least */
	if (!strcmp(g->comp[k - 1], "**"))
		g->comp[k++] = (char *)"*";
	g->ncomp = k;
	return 0;
err_free:
	if (ret == -ENOMEM)
		snprintf(msg, len, "out of memory");
	pol_glob_free(g);
	return ret;
}

/*
 * Components of the pattern against components of the path: each ordinary
 * component matches one path component (fnmatch), "**" any run of them.  The
 * classic greedy match with one backtrack point (the last "**" seen) is
 * exact here, since every other component takes exactly one path component;
 * it costs at most ncomp * npath fnmatch calls.
 */
static int comps_match(char *const *pc, int np, char *const *sc, int ns)
{
	int i = 0, j = 0, star = -1, star_j = 0;

	while (j < ns) {
		if (i < np && !strcmp(pc[i], "**")) {
			star = i++;
			star_j = j;
		} else if (i < np && !fnmatch(pc[i], sc[j], 0)) {
			i++;
			j++;
		} else if (star >= 0) {
			i = star + 1;
			j = ++star_j;
		} else {
			return 0;
		}
	}
	while (i < np && !strcmp(pc[i], "**"))
		i++;
	return i == np;
}

/* path split at '/' into buf (a copy) and sc; the count, or -1. */
static int path_split(const char *path, char *buf, char **sc, int max)
{
	char *tok, *save;
	int n = 0;

	strcpy(buf, path);
	for (tok = strtok_r(buf, "/", &save); tok;
	     tok = strtok_r(NULL, "/", &save)) {
		if (n == max)
			return -1;
		sc[n++] = tok;
	}
	return n;
}

static int globs_match(const struct pol_glob *g, int ng, const char *path)
{
	size_t n = strlen(path);
	char *buf = malloc(n + 1), **sc = calloc(n / 2 + 1, sizeof(*sc));
	int k, ns, hit = 0;

	if (buf && sc) {
		ns = path_split(path, buf, sc, n / 2 + 1);
		for (k = 0; k < ng && !hit && ns > 0; k++)
			hit = comps_match(g[k].comp, g[k].ncomp, sc, ns);
	}
	free(buf);
	free(sc);
	return hit;
}

int pol_glob_match(const struct pol_glob *g, const char *path)
{
	return globs_match(g, 1, path);
}

/* ---------------------------------------------------------------- parsing */

int pol_is_section(const char *section, const char **name)
{
	if (strncasecmp(section, "policy", 6) ||
	    (section[6] && !isspace((unsigned char)section[6])))
		return 0;
	for (section += 6; isspace((unsigned char)*section); section++)
		;
	*name = section;
	return 1;
}

static struct pol_rule *rule_find(const struct pol_set *s, const char *name)
{
	int i;

	for (i = 0; s && i < s->n; i++)
		if (!strcmp(s->rules[i]->name, name))
			return s->rules[i];
	return NULL;
}

int pol_section_begin(struct pol_set **sp, const char *name, int line,
		      char *msg, size_t len)
{
	struct pol_set *s = *sp;
	struct pol_rule *r;
	size_t n = strlen(name), i;

	while (n && isspace((unsigned char)name[n - 1]))
		n--;
	if (!n) {
		snprintf(msg, len,
			 "a policy section needs a name: [policy NAME]");
		return -EINVAL;
	}
	if (n >= POL_NAME_MAX) {
		snprintf(msg, len, "policy name '%.*s' is longer than %d bytes",
			 (int)n, name, POL_NAME_MAX - 1);
		return -EINVAL;
	}
	for (i = 0; i < n; i++)
		if (!isalnum((unsigned char)name[i]) &&
		    !strchr("_-.", name[i])) {
			snprintf(msg, len,
				 "policy name '%.*s': only letters, digits, "
				 "'_', '-' and '.'",
				 (int)n, name);
			return -EINVAL;
		}
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s)
			return -ENOMEM;
		s->refs = 1;
		*sp = s;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	memcpy(r->name, name, n);
	if (rule_find(s, r->name)) {
		snprintf(msg, len, "a second [policy %s]: names must differ",
			 r->name);
		free(r);
		return -EINVAL;
	}
	if (s->n == POL_MAX_RULES) {
		snprintf(msg, len, "more than %d policies", POL_MAX_RULES);
		free(r);
		return -EINVAL;
	}
	r->line = line;
	r->mode = r->pin = r->prio = -1;
	r->max_size = UINT64_MAX;
	r->age_ms = POL_AGE_GLOBAL;
	s->rules[s->n++] = r;
	return 0;
}

static int choice(const char *const *names, const char *v, const char *key,
		  char *msg, size_t len)
{
	char all[128] = "";
	int i;

	for (i = 0; names[i]; i++)
		if (!strcasecmp(names[i], v))
			return i;
	for (i = 0; names[i]; i++) {
		strcat(all, i ? ", " : "");
		strcat(all, names[i]);
	}
	snprintf(msg, len, "%s: '%s' is not one of %s", key, v, all);
	return -1;
}

static int once(int *at, int line, const char *key, char *msg, size_t len)
{
	if (*at) {
		snprintf(msg, len, "%s set twice in one policy (line %d)", key,
			 *at);
		return -EINVAL;
	}
	*at = line;
	return 0;
}

int pol_set_key(struct pol_set *s, const char *key, const char *value, int line,
		char *msg, size_t len)
{
	struct pol_rule *r = s && s->n ? s->rules[s->n - 1] : NULL;
	int v;

	assert(r); /* the section began first */
	if (!r)
		return -EINVAL;
	if (!strcasecmp(key, "match")) {
		if (r->npats == POL_MAX_PATTERNS) {
			snprintf(msg, len,
				 "more than %d match keys in one "
				 "policy",
				 POL_MAX_PATTERNS);
			return -EINVAL;
		}
		if (pol_glob_compile(value, &r->pats[r->npats], msg, len))
			return -EINVAL;
		r->npats++;
		return 0;
	}
	if (!strcasecmp(key, "min_size") || !strcasecmp(key, "max_size")) {
		int mx = tolower((unsigned char)key[1]) == 'a';
		uint64_t sz;

		if (once(mx ? &r->line_max : &r->line_min, line, key, msg, len))
			return -EINVAL;
		if (cfg_parse_size(value, &sz)) {
			snprintf(msg, len,
				 "%s: '%s' is not a size (use K, M, "
				 "G, T)",
				 key, value);
			return -EINVAL;
		}
		*(mx ? &r->max_size : &r->min_size) = sz;
		r->has_max |= mx;
		return 0;
	}
	if (!strcasecmp(key, "mode")) {
		if (once(&r->line_mode, line, key, msg, len) ||
		    (v = choice(mode_names, value, key, msg, len)) < 0)
			return -EINVAL;
		r->mode = v;
		return 0;
	}
	if (!strcasecmp(key, "pin")) {
		if (once(&r->line_pin, line, key, msg, len) ||
		    (v = choice(yesno_names, value, key, msg, len)) < 0)
			return -EINVAL;
		r->pin = v;
		return 0;
	}
	if (!strcasecmp(key, "priority")) {
		if (once(&r->line_prio, line, key, msg, len) ||
		    (v = choice(prio_names, value, key, msg, len)) < 0)
			return -EINVAL;
		r->prio = v;
		return 0;
	}
	if (!strcasecmp(key, "destage_after")) {
		if (once(&r->line_age, line, key, msg, len))
			return -EINVAL;
		if (cfg_parse_time_ms(value, &r->age_ms) ||
		    r->age_ms > 86400000) {
			snprintf(msg, len,
				 "destage_after: '%s' is not a time "
				 "up to 1 day (use s, ms or min)",
				 value);
			r->age_ms = POL_AGE_GLOBAL;
			return -EINVAL;
		}
		return 0;
	}
	snprintf(msg, len,
		 "unknown key '%s' in [policy %s] (keys: match, min_size, "
		 "max_size, mode, pin, destage_after, priority)",
		 key, r->name);
	return -EINVAL;
}

int pol_validate(const struct pol_set *s, int *line, char *msg, size_t len)
{
	int i;

	for (i = 0; s && i < s->n; i++) {
		const struct pol_rule *r = s->rules[i];

		if (!r->npats) {
			*line = r->line;
			snprintf(msg, len, "[policy %s] has no match key",
				 r->name);
			return -EINVAL;
		}
		if (r->has_max && r->min_size > r->max_size) {
			*line = r->line_max;
			snprintf(msg, len,
				 "[policy %s]: max_size (%llu) is below "
				 "min_size (%llu)",
				 r->name, (unsigned long long)r->max_size,
				 (unsigned long long)r->min_size);
			return -EINVAL;
		}
		if (r->pin == 1 && r->mode == MODE_BYPASS) {
			*line = r->line_pin;
			snprintf(msg, len,
				 "[policy %s]: pin = yes with mode = bypass: a "
				 "bypass file has nothing in the cache to pin",
				 r->name);
			return -EINVAL;
		}
	}
	return 0;
}

static void rule_free(struct pol_rule *r)
{
	int k;

	for (k = 0; k < r->npats; k++)
		pol_glob_free(&r->pats[k]);
	free(r);
}

static pthread_mutex_t pol_lock = PTHREAD_MUTEX_INITIALIZER;

void pol_set_put(struct pol_set *s)
{
	int i, last;

	if (!s)
		return;
	pthread_mutex_lock(&pol_lock);
	last = !--s->refs;
	pthread_mutex_unlock(&pol_lock);
	if (!last)
		return;
	for (i = 0; i < s->n; i++)
		rule_free(s->rules[i]);
	free(s);
}

int pol_count(const struct pol_set *s)
{
	return s ? s->n : 0;
}

static int rule_equal(const struct pol_rule *a, const struct pol_rule *b)
{
	int k;

	if (strcmp(a->name, b->name) || a->npats != b->npats ||
	    a->min_size != b->min_size || a->max_size != b->max_size ||
	    a->mode != b->mode || a->pin != b->pin || a->prio != b->prio ||
	    a->age_ms != b->age_ms)
		return 0;
	for (k = 0; k < a->npats; k++)
		if (strcmp(a->pats[k].text, b->pats[k].text))
			return 0;
	return 1;
}

int pol_set_equal(const struct pol_set *a, const struct pol_set *b)
{
	int i;

	if (pol_count(a) != pol_count(b))
		return 0;
	for (i = 0; i < pol_count(a); i++)
		if (!rule_equal(a->rules[i], b->rules[i]))
			return 0;
	return 1;
}

void pol_print(const struct pol_set *s, FILE *f)
{
	int i, k;

	for (i = 0; i < pol_count(s); i++) {
		const struct pol_rule *r = s->rules[i];

		fprintf(f, "[policy %s]\n", r->name);
		for (k = 0; k < r->npats; k++)
			fprintf(f, "match = %s\n", r->pats[k].text);
		if (r->line_min)
			fprintf(f, "min_size = %llu\n",
				(unsigned long long)r->min_size);
		if (r->has_max)
			fprintf(f, "max_size = %llu\n",
				(unsigned long long)r->max_size);
		if (r->mode >= 0)
			fprintf(f, "mode = %s\n", mode_names[r->mode]);
		if (r->pin >= 0)
			fprintf(f, "pin = %s\n", yesno_names[r->pin]);
		if (r->age_ms != POL_AGE_GLOBAL)
			fprintf(f, "destage_after = %llums\n",
				(unsigned long long)r->age_ms);
		if (r->prio >= 0)
			fprintf(f, "priority = %s\n", prio_names[r->prio]);
	}
}

void pol_help(FILE *f)
{
	size_t i;

	fprintf(f,
		"\nPolicies by path: sections [policy NAME], tried in the "
		"order of the file;\na file opened gets the first that "
		"matches it (else the keys above).\nA glob without '/' "
		"matches the base name at any depth ('*.tmp'); with '/'\nthe "
		"whole path from the mount's root ('scratch/**'); '*', '?' "
		"and [...]\nnever cross '/'; '**' is any number of "
		"directories.  SIGHUP reloads the\nrules; a file keeps what "
		"its last open matched.\n");
	for (i = 0; i < sizeof(pol_keys) / sizeof(pol_keys[0]); i++)
		fprintf(f, "  policy.%-17s %-6s %s\n", pol_keys[i].key,
			pol_keys[i].type, pol_keys[i].help);
}

/* The policy keys for nvcachefs.conf(5), after cfg_man's own. */
void pol_man(FILE *f)
{
	size_t i;

	for (i = 0; i < sizeof(pol_keys) / sizeof(pol_keys[0]); i++) {
		fprintf(f, ".TP\n\\fBpolicy.%s\\fR (\\fI%s\\fR)\n",
			pol_keys[i].key, pol_keys[i].type);
		cfg_roff(f, pol_keys[i].help);
		fputs("\n", f);
	}
}

/* ---------------------------------------------------------------- names */

/*
 * A rule's name, interned: one copy per distinct name for the life of the
 * process, so a file can keep a pointer to it across reloads.  Distinct
 * names are few (at most POL_MAX_RULES per configuration file loaded).
 */
struct iname {
	struct iname *next;
	char name[POL_NAME_MAX];
};

static struct iname *inames;

static const char *intern(const char *name)
{
	struct iname *n;

	pthread_mutex_lock(&pol_lock);
	for (n = inames; n; n = n->next)
		if (!strcmp(n->name, name))
			break;
	if (!n) {
		n = calloc(1, sizeof(*n));
		if (n) {
			snprintf(n->name, sizeof(n->name), "%s", name);
			n->next = inames;
			inames = n;
		}
	}
	pthread_mutex_unlock(&pol_lock);
	return n ? n->name : NULL;
}

/* ---------------------------------------------------------------- match */

int pol_match(const struct pol_set *s, const char *path, uint64_t size,
	      struct pol_match *out)
{
	int i;

	out->name = NULL;
	out->mode = -1;
	out->pin = 0;
	out->prio = PRIO_NORMAL;
	out->age_ms = POL_AGE_GLOBAL;
	for (i = 0; path && i < pol_count(s); i++) {
		const struct pol_rule *r = s->rules[i];

		if (size < r->min_size || size > r->max_size ||
		    !globs_match(r->pats, r->npats, path))
			continue;
		out->name = intern(r->name);
		out->mode = r->mode;
		out->pin = r->pin == 1;
		out->prio = r->prio >= 0 ? r->prio : PRIO_NORMAL;
		out->age_ms = r->age_ms;
		return i;
	}
	return -1;
}

struct pol_set *pol_live_get(struct pol_set *const *slot)
{
	struct pol_set *s;

	pthread_mutex_lock(&pol_lock);
	s = *slot;
	if (s)
		s->refs++;
	pthread_mutex_unlock(&pol_lock);
	return s;
}

void pol_live_swap(struct pol_set **slot, struct pol_set **next)
{
	struct pol_set *old;

	pthread_mutex_lock(&pol_lock);
	old = *slot;
	/* read without the lock by an open's fast path (fpolicy.c) */
	__atomic_store_n(slot, *next, __ATOMIC_RELEASE);
	*next = NULL;
	pthread_mutex_unlock(&pol_lock);
	pol_set_put(old);
}
