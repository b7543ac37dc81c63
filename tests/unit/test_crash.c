/* tests: crash states — record every device write, flush and metadata persist
 * of a workload, then recover from the states a power loss could leave. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../cache/cache.h"
#include "../../cache/meta.h"
#include "check.h"

/*
 * Every 8-byte word a write puts in a file is a token naming the file, the
 * write (its version) and the word's index, so a word read back after a crash
 * says exactly which write it came from.  At a crash point k, a word may hold:
 * what the last fsync completed before k left there, or what a later write or
 * truncate (started before k) put there; nothing else.  That is "all fsynced
 * data is present" and "no file holds bytes never written to it" at once.
 */

#define KiB 1024u
#define NFILES 4
#define FILE_MAX (1536 * KiB)
#define WORDS ((FILE_MAX + 256 * KiB) / 8)
#define MAXOPS 400
#define SLOTS_PER_DEV 12
#define BS (64 * KiB)

enum { OP_WRITE, OP_TRUNC, OP_FSYNC, OP_READ, OP_UNLINK };

struct op {
	int kind, file;
	uint64_t off, len;
	uint32_t ver;
	size_t start, end; /* event indices of the marks around it */
};

struct snap {
	size_t end;
	uint32_t *ver;
	int *trunc; /* the version is a truncate: the word reads zero */
};

struct mfile {
	char name[16];
	int fd;
	ino_t ino;
	dev_t dev;
	struct cfile *cf;
	struct timespec mtime0;
	uint32_t cur[WORDS];
	int cur_trunc[WORDS];
	uint64_t size;
	struct snap snaps[MAXOPS];
	int nsnaps;
	size_t unlinked_at;
};

static struct rec_log *L;
static struct op ops[MAXOPS];
static int nops;
static struct mfile files[NFILES];
static int backing_fd;
static char dir[64];
static char *rbuf;
static unsigned seed = 12345;

static unsigned rnd(void)
{
	seed = seed * 1103515245 + 12345;
	return seed >> 8;
}

static uint64_t token(int file, uint32_t ver, uint64_t word)
{
	return ((uint64_t)(file + 1) << 56) | ((uint64_t)ver << 24) | word;
}

/* The backing file's mtime after each change, so that crash states carry it
 * too. */
#define MTIME_MARK(f) (-100 - (f))

static void note_mtime(ino_t ino)
{
	struct stat st;
	int f;

	for (f = 0; f < NFILES; f++)
		if (files[f].ino == ino && !files[f].unlinked_at &&
		    !fstat(files[f].fd, &st))
			rec_log_add(L, REC_MARK, MTIME_MARK(f),
				    st.st_mtim.tv_sec * 1000000000ull +
					    st.st_mtim.tv_nsec,
				    NULL, 0, 0);
}

static void bk_write(void *arg, ino_t ino, const void *buf, size_t len,
		     uint64_t off)
{
	rec_log_add(L, REC_BK_WRITE, (int)ino, off, buf, len, 0);
	note_mtime(ino);
}

static void bk_trunc(void *arg, ino_t ino, uint64_t size)
{
	rec_log_add(L, REC_BK_TRUNC, (int)ino, size, NULL, 0, 0);
	note_mtime(ino);
}

static void bk_sync(void *arg, ino_t ino)
{
	rec_log_add(L, REC_BK_SYNC, (int)ino, 0, NULL, 0, 0);
	note_mtime(ino);
}

static const struct cache_bk_hooks hooks = { bk_write, bk_trunc, bk_sync,
					     NULL };

static void config(struct cache_config *cfg)
{
	cfg_defaults(cfg);
	cfg->block_size = BS;
	cfg->ndevs = 2;
	cfg->dev_paths[0] = strdup("rec0");
	cfg->dev_paths[1] = strdup("rec1");
	cfg->meta_paths[0] = strdup("m0");
	cfg->meta_paths[1] = strdup("m1");
	cfg->idle_ms = 0;
	cfg->max_dirty_age_ms = 0;
	cfg->high_wm = 40;
	cfg->low_wm = 20;
	cfg->threads = 1;
	cfg->max_files = 64;
	if (getenv("NVC_CRASH_COPIES"))
		cfg->dirty_copies = atoi(getenv("NVC_CRASH_COPIES"));
}

static void run_workload(struct cache *c)
{
	char *buf = malloc(256 * KiB);
	int i, f;

	for (i = 0; i < MAXOPS; i++) {
		struct op *o = &ops[nops];
		struct mfile *m;
		uint64_t w;

		o->kind = rnd() % 100;
		o->kind = o->kind < 50	 ? OP_WRITE
			  : o->kind < 58 ? OP_TRUNC
			  : o->kind < 78 ? OP_FSYNC
					 : OP_READ;
		if (i == MAXOPS * 2 / 3)
			o->kind = OP_UNLINK;
		o->file = f = (o->kind == OP_UNLINK) ? NFILES - 1
						     : (int)(rnd() % NFILES);
		m = &files[f];
		if (m->unlinked_at)
			continue;
		o->ver = nops + 1;
		o->start = rec_log_add(L, REC_MARK, nops, 0, NULL, 0, 0);
		switch (o->kind) {
		case OP_WRITE: {
			static const uint64_t lens[] = { 8, 64, 4096, 12288,
							 65536 };

			o->off = (rnd() % FILE_MAX) & ~7ull;
			o->len = rnd() % 3
					 ? lens[rnd() % 5]
					 : ((rnd() % (200 * KiB)) & ~7ull) + 8;
			for (w = 0; w < o->len / 8; w++)
				((uint64_t *)buf)[w] =
					token(f, o->ver, o->off / 8 + w);
			CHECK_EQ(cache_write(c, m->cf, buf, o->len, o->off), 0);
			for (w = o->off / 8; w < (o->off + o->len) / 8; w++) {
				m->cur[w] = o->ver;
				m->cur_trunc[w] = 0;
			}
			if (o->off + o->len > m->size)
				m->size = o->off + o->len;
			break;
		}
		case OP_TRUNC:
			o->off = (rnd() % FILE_MAX) & ~7ull;
			CHECK_EQ(cache_truncate(c, m->cf, o->off), 0);
			for (w = o->off / 8; w < WORDS; w++) {
				m->cur[w] = o->ver;
				m->cur_trunc[w] = 1;
			}
			m->size = o->off;
			break;
		case OP_FSYNC:
			CHECK_EQ(cache_fsync(c, m->cf), 0);
			break;
		case OP_READ: {
			char *data;
			size_t n, want;

			o->off = (rnd() % FILE_MAX) & ~7ull;
			want = 128 * KiB;
			CHECK_EQ(cache_read(c, m->cf, rbuf, want, o->off, &data,
					    &n),
				 0);
			for (w = 0; w < n / 8; w++) {
				uint64_t word = o->off / 8 + w, got, exp;

				memcpy(&got, data + 8 * w, 8);
				exp = !m->cur[word] || m->cur_trunc[word]
					      ? 0
					      : token(f, m->cur[word], word);
				if (got != exp) {
					CHECK(got == exp);
					break;
				}
			}
			break;
		}
		case OP_UNLINK:
			cache_file_put(c, m->cf);
			close(m->fd);
			CHECK_EQ(unlinkat(backing_fd, m->name, 0), 0);
			cache_file_unlinked(c, m->dev, m->ino);
			break;
		}
		o->end = rec_log_add(L, REC_MARK, nops, 1, NULL, 0, 0);
		if (o->kind == OP_FSYNC) {
			struct snap *s = &m->snaps[m->nsnaps++];

			s->end = o->end;
			s->ver = malloc(sizeof(m->cur));
			s->trunc = malloc(sizeof(m->cur_trunc));
			memcpy(s->ver, m->cur, sizeof(m->cur));
			memcpy(s->trunc, m->cur_trunc, sizeof(m->cur_trunc));
		}
		if (o->kind == OP_UNLINK)
			m->unlinked_at = o->end;
		nops++;
	}
	free(buf);
}

/* May word w of file f hold value got after a crash at event k? */
static int word_ok(int f, uint64_t w, uint64_t got, size_t k)
{
	struct mfile *m = &files[f];
	const struct snap *s = NULL;
	int i;

	for (i = m->nsnaps - 1; i >= 0; i--)
		if (m->snaps[i].end < k) {
			s = &m->snaps[i];
			break;
		}
	/* what the last fsync left */
	if (s) {
		if (!s->ver[w] || s->trunc[w]) {
			if (!got)
				return 1;
		} else if (got == token(f, s->ver[w], w)) {
			return 1;
		}
	} else if (!got) {
		return 1;
	}
	/* or what a later operation put there */
	for (i = 0; i < nops; i++) {
		const struct op *o = &ops[i];

		if (o->file != f || o->start >= k || (s && o->start < s->end))
			continue;
		if (o->kind == OP_WRITE && w >= o->off / 8 &&
		    w < (o->off + o->len) / 8 && got == token(f, o->ver, w))
			return 1;
		if (o->kind == OP_TRUNC && w >= o->off / 8 && !got)
			return 1;
	}
	return 0;
}

static void explain(int f, uint64_t w, size_t k)
{
	int i;
	size_t j;

	for (j = k > 200 ? k - 200 : 0; j < k + 5 && j < rec_log_count(L);
	     j++) {
		const struct rec_event *e = rec_log_get(L, j);
		static const char *const kn[] = { "devw",  "flush", "persist",
						  "mark",  "bkw",   "bktrunc",
						  "bksync" };

		if (e->kind == REC_PM_PERSIST && e->target == 1)
			continue;
		if ((e->kind == REC_BK_WRITE || e->kind == REC_BK_TRUNC ||
		     e->kind == REC_BK_SYNC) &&
		    e->target != (int)files[f].ino)
			continue;
		if (e->kind == REC_BK_WRITE &&
		    !(e->off <= w * 8 && w * 8 < e->off + e->len))
			continue;
		if (e->kind == REC_DEV_WRITE && e->len < 4096)
			continue;
		fprintf(stderr, "    %zu %s t%d off %llu len %u%s\n", j,
			kn[e->kind], e->target, (unsigned long long)e->off,
			e->len, e->fua ? " fua" : "");
	}

	for (i = files[f].nsnaps - 1; i >= 0; i--)
		if (files[f].snaps[i].end < k) {
			fprintf(stderr,
				"  last fsync ended at %zu: version %u%s\n",
				files[f].snaps[i].end, files[f].snaps[i].ver[w],
				files[f].snaps[i].trunc[w] ? " (truncate)"
							   : "");
			break;
		}
	for (i = 0; i < nops; i++) {
		const struct op *o = &ops[i];

		if (o->file == f && ((o->kind == OP_WRITE && w >= o->off / 8 &&
				      w < (o->off + o->len) / 8) ||
				     (o->kind == OP_TRUNC && w >= o->off / 8)))
			fprintf(stderr,
				"  op %d %s off %llu len %llu events "
				"%zu..%zu\n",
				i, o->kind == OP_WRITE ? "write" : "trunc",
				(unsigned long long)o->off,
				(unsigned long long)o->len, o->start, o->end);
	}
}

static void materialize_and_check(struct cache_config *cfg, size_t k,
				  uint64_t devsize, size_t mlen, int *checked)
{
	struct dev *devs[2];
	struct pm_region r[2];
	size_t last_flush[2] = { 0, 0 }, j;
	struct cache *c;
	char err[CFG_ERRLEN] = "";
	FILE *devnull = fopen("/dev/null", "w");
	int d, f, problems;

	for (d = 0; d < 2; d++) {
		dev_mem_create(devsize, &devs[d]);
		pm_mem_create(mlen, &r[d]);
	}
	for (j = 0; j < k; j++) {
		const struct rec_event *e = rec_log_get(L, j);

		if (e->kind == REC_DEV_FLUSH)
			last_flush[e->target] = j;
	}
	for (j = 0; j < k; j++) {
		const struct rec_event *e = rec_log_get(L, j);

		switch (e->kind) {
		case REC_DEV_WRITE:
			/* durable: flushed or FUA; after the last flush: maybe
			 */
			if (j < last_flush[e->target] || e->fua || rnd() % 2)
				dev_write(devs[e->target], e->data, e->len,
					  e->off);
			break;
		case REC_PM_PERSIST:
			memcpy((char *)r[e->target].addr + e->off, e->data,
			       e->len);
			break;
		default:
			break;
		}
	}
	/* backing files, rewritten in place so that their handles stay valid,
	 * with the contents and mtime they had at the crash */
	for (f = 0; f < NFILES; f++) {
		struct timespec ts[2] = { { 0, UTIME_OMIT }, files[f].mtime0 };

		if (files[f].unlinked_at)
			continue;
		CHECK_EQ(ftruncate(files[f].fd, 0), 0);
		for (j = 0; j < k; j++) {
			const struct rec_event *e = rec_log_get(L, j);

			if (e->kind == REC_MARK && e->target == MTIME_MARK(f)) {
				ts[1].tv_sec = e->off / 1000000000ull;
				ts[1].tv_nsec = e->off % 1000000000ull;
			}
			if (e->target != (int)files[f].ino)
				continue;
			if (e->kind == REC_BK_WRITE)
				CHECK_EQ(pwrite(files[f].fd, e->data, e->len,
						e->off),
					 e->len);
			else if (e->kind == REC_BK_TRUNC)
				CHECK_EQ(ftruncate(files[f].fd, e->off), 0);
		}
		CHECK_EQ(futimens(files[f].fd, ts), 0);
	}

	if (cache_open_devs(cfg, devs, 2, r, backing_fd, &c, err,
			    sizeof(err))) {
		fprintf(stderr, "crash point %zu: recovery failed: %s\n", k,
			err);
		check_failures++;
		goto out;
	}
	CHECK(!memcmp((char *)r[0].addr + META_HDR_SIZE,
		      (char *)r[1].addr + META_HDR_SIZE, mlen - META_HDR_SIZE));
	for (f = 0; f < NFILES; f++) {
		struct cfile *cf;
		uint64_t size, off, w;
		char *data;
		size_t n;

		if (files[f].unlinked_at)
			continue; /* its inode is gone: nothing to read back */
		CHECK_EQ(cache_file_get(c, files[f].fd, &cf), 0);
		CHECK_EQ(cache_file_attr(c, files[f].dev, files[f].ino, &size,
					 NULL),
			 0);
		for (off = 0; off < WORDS * 8ull; off += 512 * KiB) {
			CHECK_EQ(cache_read(c, cf, rbuf, 512 * KiB, off, &data,
					    &n),
				 0);
			for (w = 0; w < 512 * KiB / 8 && off / 8 + w < WORDS;
			     w++) {
				uint64_t got = 0;

				if (w < n / 8)
					memcpy(&got, data + 8 * w, 8);
				if (!word_ok(f, off / 8 + w, got, k)) {
					fprintf(stderr,
						"crash point %zu: file %d word "
						"%llu holds %016llx (size "
						"%llu)\n",
						k, f,
						(unsigned long long)(off / 8 +
								     w),
						(unsigned long long)got,
						(unsigned long long)size);
					if (getenv("NVC_CRASH_DEBUG"))
						explain(f, off / 8 + w, k);
					check_failures++;
					break;
				}
			}
		}
		cache_file_put(c, cf);
	}
	cache_close(c, 0);
	problems = fmt_check_open(cfg, devs, r, devnull, 0);
	if (problems) {
		fprintf(stderr, "crash point %zu: check found %d problems\n", k,
			problems);
		check_failures++;
	}
	(*checked)++;
out:
	fclose(devnull);
	for (d = 0; d < 2; d++) {
		dev_close(devs[d]);
		pm_unmap(&r[d]);
	}
}

int main(void)
{
	struct cache_config cfg;
	struct dev *devs[2];
	struct pm_region r[2];
	struct cache *c;
	char err[CFG_ERRLEN];
	uint64_t devsize = SB_DATA_OFF + SLOTS_PER_DEV * BS;
	size_t mlen, n, j, points[200];
	int d, f, npoints = 0, checked = 0, flushes = 0;
	size_t opened;

	log_setup(LOG_TO_STDERR);
	if (getenv("NVC_CRASH_SEED"))
		seed = atoi(getenv("NVC_CRASH_SEED"));
	printf("seed %u (NVC_CRASH_SEED)\n", seed);
	rbuf = dev_alloc_buf(2 * 1024 * KiB + 8192);
	strcpy(dir, "/tmp/nvc-crash-XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	backing_fd = open(dir, O_RDONLY | O_DIRECTORY);
	rec_log_new(&L);
	config(&cfg);
	for (d = 0; d < 2; d++)
		dev_rec_create(L, d, devsize, &devs[d]);
	mlen = fmt_meta_len(&cfg, devs, 2);
	for (d = 0; d < 2; d++)
		pm_rec_create(L, d, mlen, &r[d]);
	if (fmt_format_open(&cfg, devs, 2, r, err, sizeof(err)) ||
	    cache_open_devs(&cfg, devs, 2, r, backing_fd, &c, err,
			    sizeof(err))) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	cache_set_bk_hooks(c, &hooks);
	opened = rec_log_add(L, REC_MARK, -1, 0, NULL, 0, 0);
	for (f = 0; f < NFILES; f++) {
		struct stat st;

		snprintf(files[f].name, sizeof(files[f].name), "f%d", f);
		files[f].fd = openat(backing_fd, files[f].name,
				     O_RDWR | O_CREAT, 0644);
		fstat(files[f].fd, &st);
		files[f].ino = st.st_ino;
		files[f].dev = st.st_dev;
		files[f].mtime0 = st.st_mtim;
		CHECK_EQ(cache_file_get(c, files[f].fd, &files[f].cf), 0);
	}
	run_workload(c);
	cache_abandon(c); /* the power goes */

	/* crash points: after every device flush and fsync, and at random */
	n = rec_log_count(L);
	for (j = opened; j < n && npoints < 120; j++) {
		const struct rec_event *e = rec_log_get(L, j);

		flushes += e->kind == REC_DEV_FLUSH;
		if ((e->kind == REC_DEV_FLUSH ||
		     (e->kind == REC_MARK && e->off == 1 && e->target >= 0 &&
		      ops[e->target].kind == OP_FSYNC)) &&
		    (!npoints || j + 1 > points[npoints - 1] + 20))
			points[npoints++] = j + 1;
	}
	for (j = 0; j < 60; j++)
		points[npoints++] = opened + 1 + rnd() % (n - opened);
	points[npoints++] = n;
	for (j = 0; j < (size_t)npoints; j++)
		materialize_and_check(&cfg, points[j], devsize, mlen, &checked);

	printf("%d operations, %zu recorded events (%d device flushes), %d "
	       "crash states recovered and checked\n",
	       nops, n, flushes, checked);
	CHECK(checked == npoints);
	for (f = 0; f < NFILES; f++)
		if (!files[f].unlinked_at)
			close(files[f].fd);
	for (d = 0; d < 2; d++) {
		dev_close(devs[d]);
		pm_unmap(&r[d]);
	}
	close(backing_fd);
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		(void)!system(cmd);
	}
	rec_log_free(L);
	cfg_free(&cfg);
	free(rbuf);
	return CHECK_DONE();
}
