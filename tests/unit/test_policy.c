/* tests: policies by path — globs, first match wins, size bounds, FILE:LINE
 * errors, and what a rule does to a file: eviction priority, bypass (never a
 * slot), writethrough and writearound, destage_after, a reload. */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "../../cache/mngt/mngt.h"
#include "env.h"

static struct env e;
static char cpath[] = "/tmp/nvc-unit-polXXXXXX";

/* ------------------------------------------------------------- globs */

static void test_glob_table(void)
{
	static const struct {
		const char *pat, *path;
		int hit;
	} t[] = {
		/* no '/': the base name, at any depth */
		{ "*.tmp", "a.tmp", 1 },
		{ "*.tmp", "x/y/a.tmp", 1 },
		{ "*.tmp", "a.tmp/b", 0 },
		{ "*.tmp", "a.tmpx", 0 },
		{ "*.tmp", ".tmp", 1 }, /* a leading '.' is not special */
		{ "a?c", "d/abc", 1 },
		{ "a?c", "d/a/c", 0 },
		{ "[ab]x", "bx", 1 },
		{ "[!ab]x", "bx", 0 },
		{ "core", "core", 1 },
		{ "core", "src/core", 1 },
		/* with '/': the whole path from the root */
		{ "scratch/**", "scratch/a", 1 },
		{ "scratch/**", "scratch/a/b/c", 1 },
		{ "scratch/**", "scratch", 0 },
		{ "scratch/**", "x/scratch/a", 0 },
		{ "scratch/**", "scratchy/a", 0 },
		{ "/*.log", "a.log", 1 },
		{ "/*.log", "d/a.log", 0 }, /* '*' never crosses '/' */
		{ "d/*.log", "d/a.log", 1 },
		{ "d/*.log", "d/e/a.log", 0 },
		{ "a/**/b", "a/b", 1 },
		{ "a/**/b", "a/x/b", 1 },
		{ "a/**/b", "a/x/y/b", 1 },
		{ "a/**/b", "a/x/y/c", 0 },
		{ "**/b", "b", 1 },
		{ "**/b", "q/r/b", 1 },
		{ "**", "any/thing", 1 },
		{ "a/**/b/**/c", "a/1/b/2/3/c", 1 },
		{ "a/**/b/**/c", "a/1/c/2/b", 0 },
		{ "data/*/in/**", "data/run1/in/x/y", 1 },
		{ "data/*/in/**", "data/run1/out/x", 0 },
	};
	struct pol_glob g;
	char msg[256];
	size_t i;

	for (i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		CHECK_EQ(pol_glob_compile(t[i].pat, &g, msg, sizeof(msg)), 0);
		if (pol_glob_match(&g, t[i].path) != t[i].hit) {
			fprintf(stderr, "  '%s' on '%s': expected %d\n",
				t[i].pat, t[i].path, t[i].hit);
			CHECK(0);
		}
		pol_glob_free(&g);
	}
}

static void test_glob_refused(void)
{
	static const char *const bad[] = { "",	    "  ",   "a**", "**b/c",
					   "x/[ab", "dir/", "a\\" };
	struct pol_glob g;
	char msg[256];
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		msg[0] = 0;
		if (pol_glob_compile(bad[i], &g, msg, sizeof(msg)) != -EINVAL) {
			fprintf(stderr, "  '%s' accepted\n", bad[i]);
			CHECK(0);
			pol_glob_free(&g);
		}
		CHECK(msg[0]);
	}
}

/* ------------------------------------------------------------- config */

static const char base[] = "[cache]\ndevices = /d0\nmetadata = /m0, /m1\n"
			   "[backing]\npath = /b\n";

static int load(const char *text, struct cache_config *c, char *err)
{
	FILE *f;
	int fd = mkstemp(cpath), ret;

	if (fd < 0)
		exit(1);
	f = fdopen(fd, "w");
	fprintf(f, "%s%s", base, text);
	fclose(f);
	cfg_defaults(c);
	err[0] = 0;
	ret = cfg_load(c, cpath, err, CFG_ERRLEN);
	if (!ret)
		ret = cfg_validate(c, err, CFG_ERRLEN);
	unlink(cpath);
	strcpy(cpath, "/tmp/nvc-unit-polXXXXXX");
	return ret;
}

static const char rules[] = "[policy scratch]\n"
			    "match = scratch/**\n"
			    "mode = bypass\n"
			    "[policy big-tmp]\n"
			    "match = *.tmp\n"
			    "min_size = 1M\n"
			    "mode = writearound\n"
			    "priority = low\n"
			    "[policy tmp]\n"
			    "match = *.tmp\n"
			    "match = *.swp\n"
			    "max_size = 64K\n"
			    "destage_after = 250ms\n"
			    "[policy keep]\n"
			    "match = models/**\n"
			    "pin = yes\n"
			    "priority = high\n"
			    "mode = writethrough\n";

static void test_first_match_and_sizes(void)
{
	struct cache_config c;
	char err[CFG_ERRLEN];
	struct pol_match m;

	CHECK_EQ(load(rules, &c, err), 0);
	if (err[0])
		fprintf(stderr, "  %s\n", err);
	CHECK_EQ(pol_count(c.policies), 4);
	/* scratch/ comes first, whatever the name */
	CHECK_EQ(pol_match(c.policies, "scratch/x.tmp", 5 << 20, &m), 0);
	CHECK(m.name && !strcmp(m.name, "scratch"));
	CHECK_EQ(m.mode, MODE_BYPASS);
	/* a large .tmp: big-tmp; a small one: tmp; in between: none */
	CHECK_EQ(pol_match(c.policies, "a/b.tmp", 1 << 20, &m), 1);
	CHECK_EQ(m.mode, MODE_WRITEAROUND);
	CHECK_EQ(m.prio, PRIO_LOW);
	CHECK_EQ(pol_match(c.policies, "a/b.tmp", 64 << 10, &m), 2);
	CHECK_EQ(m.mode, -1);
	CHECK_EQ(m.age_ms, 250);
	CHECK_EQ(m.prio, PRIO_NORMAL);
	CHECK_EQ(pol_match(c.policies, "b.swp", 0, &m), 2);
	CHECK_EQ(pol_match(c.policies, "a/b.tmp", (64 << 10) + 1, &m), -1);
	CHECK(!m.name);
	CHECK_EQ(m.mode, -1);
	CHECK_EQ(m.age_ms, POL_AGE_GLOBAL);
	CHECK_EQ(pol_match(c.policies, "models/m1/w.bin", 0, &m), 3);
	CHECK_EQ(m.pin, 1);
	CHECK_EQ(m.prio, PRIO_HIGH);
	CHECK_EQ(m.mode, MODE_WRITETHROUGH);
	CHECK_EQ(pol_match(c.policies, "other", 0, &m), -1);
	CHECK_EQ(pol_match(c.policies, NULL, 0, &m), -1);
	cfg_free(&c);
}

/* Each refused with the line that is wrong. */
static void test_errors_name_file_line(void)
{
	static const struct {
		const char *text, *want;
	} t[] = {
		/* lines count from the 5 of base */
		{ "[policy a]\nmatch = x\ncolour = red\n",
		  ":8: unknown key 'colour' in [policy a]" },
		{ "[policy a]\nmatch = x**\n", ":7: '**' must be a whole" },
		{ "[policy a]\nmatch = [ab\n", ":7: '[' without its ']'" },
		{ "[policy a]\nmatch = x\nmode = fast\n",
		  ":8: mode: 'fast' is not one of writeback, writethrough, "
		  "writearound, bypass" },
		{ "[policy a]\nmatch = x\n[policy a]\nmatch = y\n",
		  ":8: a second [policy a]" },
		{ "[policy a]\nmode = bypass\n[policy b]\nmatch = y\n",
		  ":6: [policy a] has no match key" },
		{ "[policy empty]\n", ":6: [policy empty] has no match key" },
		{ "[policy]\nmatch = x\n",
		  ":6: a policy section needs a name" },
		{ "[policy a b]\nmatch = x\n", ":6: policy name 'a b'" },
		{ "[policy a]\nmatch = x\nmin_size = 2M\nmax_size = 1M\n",
		  ":9: [policy a]: max_size (1048576) is below min_size" },
		{ "[policy a]\nmatch = x\nmode = bypass\npin = yes\n",
		  ":9: [policy a]: pin = yes with mode = bypass" },
		{ "[policy a]\nmatch = x\nmin_size = lots\n",
		  ":8: min_size: 'lots' is not a size" },
		{ "[policy a]\nmatch = x\ndestage_after = 2h\n",
		  ":8: destage_after: '2h' is not a time" },
		{ "[policy a]\nmatch = x\npriority = urgent\n",
		  ":8: priority: 'urgent' is not one of low, normal, high" },
		{ "[policy a]\nmatch = x\nmode = bypass\nmode = writeback\n",
		  ":9: mode set twice" },
		{ "[policy a]\nmatch = scratch/\n",
		  ":7: 'scratch/' ends with" },
	};
	struct cache_config c;
	char err[CFG_ERRLEN];
	size_t i;

	for (i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		int ret = load(t[i].text, &c, err);

		CHECK(ret < 0);
		if (!strstr(err, t[i].want) ||
		    !strstr(err, "/tmp/nvc-unit-pol")) {
			fprintf(stderr, "  case %zu: '%s' does not say '%s'\n",
				i, err, t[i].want);
			CHECK(0);
		} else {
			printf("  refused: %s\n", strchr(err, ':'));
		}
		cfg_free(&c);
	}
}

/* A reload takes the new rules (and says it changed something); equal
 * rules change nothing. */
static void test_reload_swaps_rules(void)
{
	struct cache_config live, next;
	char err[CFG_ERRLEN];
	struct pol_match m;

	CHECK_EQ(load(rules, &live, err), 0);
	CHECK_EQ(load(rules, &next, err), 0);
	CHECK_EQ(cfg_reload_into(&live, &next), 0);
	cfg_free(&next);
	CHECK_EQ(load("[policy only]\nmatch = *.bin\nmode = bypass\n", &next,
		      err),
		 0);
	CHECK_EQ(cfg_reload_into(&live, &next), 1);
	CHECK(!next.policies);
	CHECK_EQ(pol_count(live.policies), 1);
	CHECK_EQ(pol_match(live.policies, "scratch/a.bin", 0, &m), 0);
	CHECK(!strcmp(m.name, "only"));
	cfg_free(&next);
	cfg_free(&live);
}

/* ------------------------------------------------------------- engine */

/* Give the open cache of e these rules, as a reload would. */
static void set_rules(const char *text)
{
	struct cache_config c;
	char err[CFG_ERRLEN];

	if (load(text, &c, err)) {
		fprintf(stderr, "rules: %s\n", err);
		exit(1);
	}
	pol_live_swap(&e.cfg.policies, &c.policies);
	cfg_free(&c);
}

/* Open name as the mount does: the object, then its policy. */
static struct cfile *popen_f(const char *name, int *fd)
{
	struct cfile *f = file_open(&e, name, fd);

	CHECK_EQ(cache_file_policy_match(e.c, f), 0);
	return f;
}

static uint64_t nslots(struct cfile *f)
{
	uint64_t n;

	pthread_mutex_lock(&e.c->lock);
	n = f->nslots;
	pthread_mutex_unlock(&e.c->lock);
	return n;
}

/* Read a whole file of n bytes through the cache (its misses are kept). */
static void read_all(struct cfile *f, const char *want, size_t n)
{
	CHECK(same(&e, f, want, n, 0));
}

static void make_file(const char *name, const char *data, size_t n)
{
	int fd = openat(e.backing_fd, name, O_RDWR | O_CREAT | O_TRUNC, 0644);

	CHECK_EQ(pwrite(fd, data, n, 0), (ssize_t)n);
	close(fd);
}

/*
 * 32 slots of 64K.  Low, normal and high files of 8 blocks each, then one
 * normal working set after another: the low file's data goes first, then
 * the normal files' (least recently used first), the high file's last.
 */
static void test_priority_eviction_order(void)
{
	const size_t n = 512 * KiB;
	char *d[8];
	const char *names[8] = { "l.low", "n1", "h.high", "w1",
				 "w2",	  "w3", "w4",	  "w5" };
	struct cfile *f[8];
	int fd[8], i;

	env_init(&e, 16, 64 * KiB);
	set_rules("[policy lo]\nmatch = *.low\npriority = low\n"
		  "[policy hi]\nmatch = *.high\npriority = high\n");
	for (i = 0; i < 8; i++) {
		d[i] = malloc(n);
		fill(d[i], n, 100 + i);
		make_file(names[i], d[i], n);
		f[i] = popen_f(names[i], &fd[i]);
	}
	CHECK(!strcmp(cache_file_policy(f[0]), "lo"));
	CHECK(!cache_file_policy(f[1]));
	CHECK(!strcmp(cache_file_policy(f[2]), "hi"));
	/* low, normal, high, normal: the cache is full */
	read_all(f[0], d[0], n);
	read_all(f[1], d[1], n);
	read_all(f[2], d[2], n);
	read_all(f[3], d[3], n);
	CHECK_EQ(nslots(f[0]) + nslots(f[1]) + nslots(f[2]) + nslots(f[3]), 32);
	/* the high file is the least recently used of all */
	read_all(f[4], d[4], n);
	CHECK_EQ(nslots(f[0]), 0); /* low first */
	CHECK_EQ(nslots(f[1]), 8);
	CHECK_EQ(nslots(f[2]), 8);
	read_all(f[5], d[5], n);
	CHECK_EQ(nslots(f[1]), 0); /* then the oldest normal */
	CHECK_EQ(nslots(f[2]), 8);
	read_all(f[6], d[6], n);
	read_all(f[7], d[7], n);
	CHECK_EQ(nslots(f[3]), 0);
	CHECK_EQ(nslots(f[4]), 0);
	CHECK_EQ(nslots(f[2]), 8); /* high: still all there */
	/* and served from the cache, byte for byte */
	cache_snapshot(e.c, &snap);
	{
		uint64_t miss0 = STAT_CTR(&snap, read_miss_bytes);

		read_all(f[2], d[2], n);
		cache_snapshot(e.c, &snap);
		CHECK_EQ(STAT_CTR(&snap, read_miss_bytes) - miss0, 0);
	}
	for (i = 0; i < 8; i++) {
		cache_file_put(e.c, f[i]);
		close(fd[i]);
		free(d[i]);
	}
	env_fini(&e);
}

/* An open that changes a file's priority moves its clean data at once. */
static void test_priority_change_moves_clean_data(void)
{
	const size_t n = 256 * KiB;
	char *a = malloc(n), *b = malloc(4 * n);
	struct cfile *fa, *fb;
	int fda, fdb;

	env_init(&e, 4, 64 * KiB); /* 8 slots */
	fill(a, n, 1);
	fill(b, 4 * n, 2);
	make_file("a.dat", a, n);
	make_file("b.dat", b, 4 * n);
	fa = popen_f("a.dat", &fda);
	read_all(fa, a, n); /* 4 slots, normal */
	set_rules("[policy hi]\nmatch = a.dat\npriority = high\n");
	cache_file_put(e.c, fa);
	close(fda);
	fa = popen_f("a.dat", &fda); /* now high: its slots move */
	fb = popen_f("b.dat", &fdb);
	read_all(fb, b, 4 * n); /* 16 blocks through 4 free slots */
	CHECK_EQ(nslots(fa), 4);
	CHECK(!strcmp(cache_file_policy(fa), "hi"));
	cache_file_put(e.c, fa);
	cache_file_put(e.c, fb);
	close(fda);
	close(fdb);
	free(a);
	free(b);
	env_fini(&e);
}

/* pin = yes: evicted after every priority, high included. */
static void test_pinned_outlasts_high(void)
{
	const size_t n = 256 * KiB;
	char *p = malloc(n), *h = malloc(n), *x = malloc(n / 2);
	struct cfile *fp, *fh, *fx;
	int fdp, fdh, fdx;

	env_init(&e, 4, 64 * KiB); /* 8 slots */
	set_rules("[policy keep]\nmatch = *.pin\npin = yes\n"
		  "[policy hi]\nmatch = *.high\npriority = high\n");
	fill(p, n, 11);
	fill(h, n, 12);
	fill(x, n / 2, 13);
	make_file("p.pin", p, n);
	make_file("h.high", h, n);
	make_file("x", x, n / 2);
	fp = popen_f("p.pin", &fdp);
	fh = popen_f("h.high", &fdh);
	fx = popen_f("x", &fdx);
	read_all(fp, p, n); /* the least recently used */
	read_all(fh, h, n);
	read_all(fx, x, n / 2); /* 2 blocks: the high file gives one */
	CHECK_EQ(nslots(fp), 4);
	CHECK_EQ(nslots(fh), 3);
	CHECK(same(&e, fp, p, n, 0));
	cache_file_put(e.c, fp);
	cache_file_put(e.c, fh);
	cache_file_put(e.c, fx);
	close(fdp);
	close(fdh);
	close(fdx);
	free(p);
	free(h);
	free(x);
	env_fini(&e);
}

/* A bypass file never gets a slot, reads and writes are the backing
 * file's, byte for byte; data cached before it became bypass is destaged
 * and dropped at the open that made it so. */
static void test_bypass_never_allocates(void)
{
	const size_t n = 1 * MiB;
	char *d = malloc(n), *w = malloc(n);
	struct cfile *f;
	uint64_t valid0, used0;
	int fd, i;

	env_init(&e, 64, 64 * KiB);
	fill(d, n, 7);
	make_file("s.raw", d, n);
	/* first cached, with dirty data */
	f = popen_f("s.raw", &fd);
	read_all(f, d, n);
	fill(w, 100 * KiB, 8);
	CHECK_EQ(cache_write(e.c, f, w, 100 * KiB, 4096), 0);
	memcpy(d + 4096, w, 100 * KiB);
	CHECK(nslots(f) > 0);
	CHECK(!backing_same(fd, d, n)); /* dirty: not there yet */
	set_rules("[policy raw]\nmatch = *.raw\nmode = bypass\n");
	cache_file_put(e.c, f);
	close(fd);
	f = popen_f("s.raw", &fd);
	CHECK_EQ(nslots(f), 0);
	CHECK(backing_same(fd, d, n)); /* destaged before it was dropped */
	CHECK_EQ(file_mode(e.c, f), MODE_BYPASS);
	cache_snapshot(e.c, &snap);
	valid0 = e.c->valid_pages;
	used0 = STAT_GAUGE(&snap, used_slots);
	for (i = 0; i < 50; i++) {
		uint64_t off = (i * 37 * 4096 + i * 511) % (n - 70000);

		fill(w, 70000, 20 + i);
		CHECK_EQ(cache_write(e.c, f, w, 70000, off), 0);
		memcpy(d + off, w, 70000);
		read_all(f, d, n);
		CHECK_EQ(nslots(f), 0);
	}
	/* past the end too */
	CHECK_EQ(cache_write(e.c, f, w, 5000, n + 3), 0);
	CHECK(same(&e, f, w, 5000, n + 3));
	cache_snapshot(e.c, &snap);
	CHECK_EQ(e.c->valid_pages, valid0);
	CHECK_EQ(STAT_GAUGE(&snap, used_slots), used0);
	{
		char *all = malloc(n + 5003);

		memcpy(all, d, n);
		memset(all + n, 0, 3);
		memcpy(all + n + 3, w, 5000);
		CHECK(backing_same(fd, all, n + 5003));
		free(all);
	}
	CHECK_EQ(cache_fsync(e.c, f), 0);
	/* back to the global mode at the next open with other rules */
	set_rules("[policy none]\nmatch = nothing\n");
	cache_file_put(e.c, f);
	close(fd);
	f = popen_f("s.raw", &fd);
	CHECK_EQ(file_mode(e.c, f), MODE_WRITEBACK);
	CHECK(!cache_file_policy(f));
	CHECK_EQ(cache_write(e.c, f, w, 4096, 0), 0);
	CHECK_EQ(nslots(f), 1);
	cache_file_put(e.c, f);
	close(fd);
	free(d);
	free(w);
	env_fini(&e);
}

/* writethrough and writearound by policy, beside a writeback file. */
static void test_modes_by_policy(void)
{
	const size_t n = 256 * KiB;
	char *w = malloc(n);
	struct cfile *t, *a, *b;
	int ft, fa, fb;
	uint64_t valid0;

	env_init(&e, 64, 64 * KiB);
	set_rules("[policy wt]\nmatch = *.wt\nmode = writethrough\n"
		  "[policy wa]\nmatch = *.wa\nmode = writearound\n");
	t = popen_f("x.wt", &ft);
	a = popen_f("x.wa", &fa);
	b = popen_f("x.wb", &fb);
	fill(w, n, 3);
	CHECK_EQ(cache_write(e.c, t, w, n, 0), 0);
	CHECK(backing_same(ft, w, n)); /* there before any destage */
	CHECK_EQ(nslots(t), 4);
	pthread_mutex_lock(&e.c->lock);
	CHECK_EQ(t->ndirty, 0);
	valid0 = e.c->valid_pages;
	pthread_mutex_unlock(&e.c->lock);
	CHECK_EQ(cache_write(e.c, a, w, n, 0), 0);
	CHECK(backing_same(fa, w, n));
	CHECK_EQ(nslots(a), 0); /* not cached */
	CHECK_EQ(e.c->valid_pages, valid0);
	CHECK_EQ(cache_write(e.c, b, w, n, 0), 0);
	CHECK(!backing_same(fb, w, n)); /* writeback: dirty in the cache */
	pthread_mutex_lock(&e.c->lock);
	CHECK_EQ(b->ndirty, 4);
	pthread_mutex_unlock(&e.c->lock);
	cache_file_put(e.c, t);
	cache_file_put(e.c, a);
	cache_file_put(e.c, b);
	close(ft);
	close(fa);
	close(fb);
	free(w);
	env_fini(&e);
}

static int ndirty(struct cfile *f)
{
	int n;

	pthread_mutex_lock(&e.c->lock);
	n = f->ndirty;
	pthread_mutex_unlock(&e.c->lock);
	return n;
}

/* destage_after: the matching file is destaged by age, the other one (no
 * age: max_dirty_age = 0) stays dirty.  The wait is a bound, not a timing
 * assertion. */
static void test_destage_after_picks_the_file(void)
{
	const size_t n = 128 * KiB;
	char *w = malloc(n);
	struct cfile *q, *s;
	int fq, fs, i;

	env_init(&e, 64, 64 * KiB); /* idle_after and max_dirty_age: off */
	set_rules("[policy quick]\nmatch = quick/**\ndestage_after = 50ms\n");
	mkdirat(e.backing_fd, "quick", 0755);
	s = popen_f("slow", &fs);
	q = popen_f("quick/f", &fq);
	CHECK(!strcmp(cache_file_policy(q), "quick"));
	fill(w, n, 4);
	CHECK_EQ(cache_write(e.c, s, w, n, 0), 0); /* older, first in line */
	CHECK_EQ(cache_write(e.c, q, w, n, 0), 0);
	for (i = 0; i < 1000 && ndirty(q); i++)
		usleep(10000);
	CHECK_EQ(ndirty(q), 0);
	CHECK(backing_same(fq, w, n));
	CHECK_EQ(ndirty(s), 2);
	CHECK(!backing_same(fs, w, n));
	cache_file_put(e.c, q);
	cache_file_put(e.c, s);
	close(fq);
	close(fs);
	free(w);
	env_fini(&e);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_glob_table);
	RUN(test_glob_refused);
	RUN(test_first_match_and_sizes);
	RUN(test_errors_name_file_line);
	RUN(test_reload_swaps_rules);
	RUN(test_priority_eviction_order);
	RUN(test_priority_change_moves_clean_data);
	RUN(test_pinned_outlasts_high);
	RUN(test_bypass_never_allocates);
	RUN(test_modes_by_policy);
	RUN(test_destage_after_picks_the_file);
	free(rbuf);
	return CHECK_DONE();
}
