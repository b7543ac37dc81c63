/* tests: crash states — record every device write, flush, metadata persist and
 * backing-file change of a workload run by one or several threads, then recover
 * from the states a power loss or a kill -9 could leave, and check them. */
#define _GNU_SOURCE
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../cache/cache.h"
#include "../../cache/mngt/mngt.h" /* test_committing, a slot's member and lock */
#include "../../cache/media/media.h"
#include "check.h"

/*
 * The model.  Every 8-byte word a write puts in a file is a token naming the
 * file, the write and the word's index, so a word read back says which write
 * it came from.  Each operation logs a mark when it starts and one when it
 * returns, in the same log as the devices' writes, flushes and persists and
 * the backing files' writes, truncates and syncs, so the log order is the real
 * order of all of them.
 *
 * A crash at point k keeps events [0, k).  Ops that ended before a point g
 * are "guaranteed": after a power loss g is the start of the latest fsync of
 * the file that returned before k (an fsync covers the writes that returned
 * before it started; a write with its own sync flag is followed by one, as
 * fs.c does for RWF_DSYNC, and is covered by it); after a kill -9 g = k
 * (every acknowledged write).  Word
 * w may then hold the value put there by any write or truncate X that started
 * before k, unless a guaranteed op that also covers w started after X ended;
 * or its initial zero, if no guaranteed op covers it.  Truncates and unlinks
 * hold the file exclusively in the workload (the engine serialises them with
 * writes anyway), so sizes have a simple model too: the size is that of the
 * last guaranteed truncate (or 0) grown by the guaranteed writes after it, or
 * that of a later truncate, in either case possibly grown by any write started
 * before k after that truncate (a write under way at k, to any size within
 * it: a write larger than the free space goes in steps).
 *
 * The crash states.  Power loss: a device write survives if it was FUA or a
 * flush of its device came after it; otherwise it may be kept, lost, or kept
 * in some of its 4 KiB pages.  A metadata persist survives; the one a thread
 * was in (its next event) may be torn: a prefix, or some of its 64-byte lines.
 * A block-device mirror (NVC_CRASH_BLK) keeps the page writes that completed;
 * each lands at some moment between its start and completion, so overlapping
 * writes of one page land in either order, and one in flight may land torn in
 * 512-byte sectors.  A backing write or truncate survives if an fsync of its
 * file that started after it completed before k; otherwise it may be kept,
 * lost or kept in some pages.  Kill -9: everything logged before k survives
 * (and whatever a thread was in may be partly done).  With two copies, one
 * device may be lost at the crash as well: missing or full of garbage.
 *
 * Checked in each state: the newest valid copy of every metadata record is at
 * least as new as its last completed persist (before recovery); recovery
 * succeeds; every word and the size of every file fit the model; both mirrors
 * agree afterwards; the offline check finds nothing.  Reads during the
 * workload are checked against the same model.
 */

#define KiB 1024u
#define NSLOTF 4 /* files at once; an unlink makes a new one in its place */
#define FILE_MAX (256 * KiB)
#define WORDS ((FILE_MAX + 64 * KiB) / 8)
#define IMG (FILE_MAX + 128 * KiB)
#define MAXOPS 8192
#define MAXINC 64
#define SLOTS_PER_DEV 12
#define BS (16 * KiB)
#define WINDOW_KEEP 48 /* crash points a sample keeps in the device-life op */
#define READ_LEN (64 * KiB)

enum { OP_WRITE, OP_TRUNC, OP_FSYNC, OP_READ, OP_UNLINK };
static const char *const op_names[] = { "write", "trunc", "fsync", "read",
					"unlink" };

struct op {
	int kind, inc, res;
	uint64_t off, len;
	size_t start, end; /* event indices of its marks */
	/* a write with its own sync flag (RWF_DSYNC, O_DSYNC, a sync mount:
	 * fs.c write_now) is followed by an fsync, from sstart to send */
	int sync;
	size_t sstart, send;
	char *rdata; /* a read's bytes */
	size_t rn;
};

struct inc {
	int slot, gen;
	char name[24];
	int fd;
	ino_t ino;
	dev_t dev;
	struct cfile *cf;
	struct timespec mtime0;
	size_t born; /* a mark before it was created */
	size_t created; /* a mark after the cache knew it */
	int unlinked;
	/* after the workload: its writes and truncates by start, and per word
	 * the ops that cover it (wl[wo[w]] .. wl[wo[w + 1]]) */
	int *ops, nops;
	uint32_t *wo;
	int *wl;
	int *syncs, nsyncs; /* its fsyncs */
};

struct fslot {
	pthread_rwlock_t lock;
	int cur;
};

static FILE *out;
static struct rec_log *L;
static int recording;
static struct op ops[MAXOPS];
static int nops, nops_max;
static struct inc incs[MAXINC];
static int nincs;
static struct fslot fslots[NSLOTF];
static pthread_mutex_t inc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cache *C;
static int backing_fd;
static char dir[64];
static char *rbuf;
static unsigned seed, mseed;
static int nthreads = 1, copies = 1, blk, debug, total_ops = 300;
static int failed_states;
static int hold_inodes, held_fds[MAXINC], nheld;
/* NVC_CRASH_IDENT: 2 finds files by path; NVC_CRASH_BEHIND: files are
 * renamed or replaced behind the cache's back at the crash (behind_apply) */
static int ident_mode, behind;
/* NVC_CRASH_REPLACE=1: halfway through the workload, device 1 is replaced
 * by a third one (rebuilt onto it while the workload runs); a crash state
 * is recovered with the device its metadata calls member 1.  The replace
 * starts while a write or a fill into a fresh slot of member 1 is held
 * between its device write and its commit (race_commit), if one comes in
 * the next quarter of the workload */
static int replace_mode, replaced, force_pick;
/* NVC_CRASH_REMOVE=1: device 1 removed halfway (drained, then marked
 * removed); NVC_CRASH_ADD=1: the cache formatted with a spare third place,
 * into which a third device is added halfway; NVC_CRASH_ADD=2: formatted
 * with two devices and no spare place, grown by a third halfway (a crash
 * state is recovered with the devices its metadata names) */
static int remove_mode, add_mode, removed_ok, added_ok;
/* NVC_CRASH_DETACH=1: the cache detached a quarter in (destaged, emptied, both
 * headers marked, devices closed), then attached again (detach_attach) */
static int detach_mode, reattached, devs_gone;
static struct dev *live_devs[2]; /* the devices the attach took */
static size_t detach_done, attach_begin; /* no device write between */
static size_t n_detaching, n_detached, n_torn; /* states recovered so */
static struct dev *spare_standin;
static size_t devlife_begin; /* events logged when it was called */
static size_t devlife_done; /* events logged when it returned */
/* NVC_CRASH_MIRROR=1: metadata mirror 1 replaced halfway by a third region
 * (cache_replace_mirror_with); a crash state after the replace returned is
 * recovered with the configuration naming the new mirror or, as an
 * administrator who did not change it yet, the old one */
static int mirror_mode, mirrored_ok;
static struct pm_region new_mirror;
static size_t n_mrec, n_mtorn, n_newcfg, n_followed; /* states so */
/* NVC_CRASH_MODE=1: cache.mode = writethrough */
static int cache_mode;
/* NVC_CRASH_AROUND=1: destage.write_around at the high watermark (writes
 * with no dirty data go around the cache while it is past it) */
static int around_mode;
static struct dev *new_dev;

#undef CHECK_EQ
#define CHECK_EQ(a, b)                                               \
	do {                                                         \
		long long _a = (long long)(a), _b = (long long)(b);  \
		if (_a != _b) {                                      \
			fprintf(out,                                 \
				"%s:%d: CHECK failed: %s == %s "     \
				"(%lld != %lld)\n",                  \
				__FILE__, __LINE__, #a, #b, _a, _b); \
			check_failures++;                            \
		}                                                    \
	} while (0)
#undef CHECK
#define CHECK(cond)                                                         \
	do {                                                                \
		if (!(cond)) {                                              \
			fprintf(out, "%s:%d: CHECK failed: %s\n", __FILE__, \
				__LINE__, #cond);                           \
			check_failures++;                                   \
		}                                                           \
	} while (0)

static unsigned rnd_r(unsigned *s)
{
	*s = *s * 1103515245 + 12345;
	return *s >> 8;
}

/* the materializer's dice */
static unsigned rnd(void)
{
	return rnd_r(&mseed);
}

static uint64_t token(int inc, uint32_t ver, uint64_t word)
{
	return ((uint64_t)(inc + 1) << 56) | ((uint64_t)ver << 24) | word;
}

static const struct rec_event *ev(size_t i)
{
	return rec_log_get(L, i);
}

/* ------------------------------------------------------ recording hooks */

/* The backing file's mtime after each change, so that crash states carry it
 * too: a mark per incarnation. */
#define MTIME_MARK(i) (-100 - (i))

static void note_mtime(ino_t ino)
{
	struct stat st;
	int i;

	pthread_mutex_lock(&inc_lock);
	for (i = nincs - 1; i >= 0; i--)
		if (incs[i].ino == ino && !incs[i].unlinked) {
			if (!fstat(incs[i].fd, &st))
				rec_log_add(L, REC_MARK, MTIME_MARK(i),
					    st.st_mtim.tv_sec * 1000000000ull +
						    st.st_mtim.tv_nsec,
					    NULL, 0, 0);
			break;
		}
	pthread_mutex_unlock(&inc_lock);
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

static const struct cache_bk_hooks hooks = { bk_write, bk_trunc, NULL, NULL };

/*
 * The engine's fsync and fdatasync of backing files, seen from both ends: an
 * fsync covers the writes that completed before it started, so its start is
 * logged too (the engine's own sync hook comes only after it returned).
 */
static int bk_sync_call(int fd, long nr)
{
	struct stat st;
	int rec = __atomic_load_n(&recording, __ATOMIC_ACQUIRE) &&
		  !fstat(fd, &st) && S_ISREG(st.st_mode);
	size_t b = 0;
	long ret;

	if (rec)
		b = rec_log_add(L, REC_BK_SYNC_BEGIN, (int)st.st_ino, 0, NULL,
				0, 0);
	ret = syscall(nr, fd);
	if (rec && !ret) {
		rec_log_add(L, REC_BK_SYNC, (int)st.st_ino, b, NULL, 0, 0);
		note_mtime(st.st_ino);
	}
	return ret;
}

int fdatasync(int fd)
{
	return bk_sync_call(fd, SYS_fdatasync);
}

int fsync(int fd)
{
	return bk_sync_call(fd, SYS_fsync);
}

/* ------------------------------------------------------------ workload */

static int inc_create(int slot, int gen)
{
	struct inc *I;
	struct stat st;
	int i;

	pthread_mutex_lock(&inc_lock);
	i = nincs;
	I = &incs[i];
	memset(I, 0, sizeof(*I));
	I->slot = slot;
	I->gen = gen;
	I->fd = -1;
	snprintf(I->name, sizeof(I->name), "f%d.%d", slot, gen);
	I->born = rec_log_add(L, REC_MARK, -2, i, NULL, 0, 0);
	I->fd = openat(backing_fd, I->name, O_RDWR | O_CREAT | O_EXCL, 0644);
	if (I->fd < 0 || fstat(I->fd, &st)) {
		pthread_mutex_unlock(&inc_lock);
		return -1;
	}
	I->ino = st.st_ino;
	I->dev = st.st_dev;
	I->mtime0 = st.st_mtim;
	nincs++;
	pthread_mutex_unlock(&inc_lock);
	CHECK_EQ(cache_file_get(C, I->fd, &I->cf), 0);
	I->created = rec_log_add(L, REC_MARK, -3, i, NULL, 0, 0);
	return i;
}

static void inc_unlink(int i)
{
	struct inc *I = &incs[i];

	cache_file_put(C, I->cf);
	pthread_mutex_lock(&inc_lock);
	I->unlinked = 1;
	if (hold_inodes)
		held_fds[nheld++] = I->fd; /* its number is not recycled */
	else
		close(I->fd);
	I->fd = -1;
	pthread_mutex_unlock(&inc_lock);
	cache_unlink_begin(C);
	CHECK_EQ(unlinkat(backing_fd, I->name, 0), 0);
	cache_file_unlinked(C, I->dev, I->ino, 1);
	cache_unlink_end(C);
}

/*
 * A detach closes the cache devices (detach.c, step 4), and an attach takes
 * open ones (cache_attach_with): the devices given back are fresh recording
 * devices with the same ids, so that the log of each id stays one device's
 * history, the one a crash state is built from.  Each is first given what
 * its predecessor held, as a real device keeps it while detached: every
 * write the log has for its id, in log order (the detach left no slot, so
 * nothing is written to it meanwhile: devlife_check), in one FUA write;
 * the bytes are those the log holds there already.
 */
static int detach_attach(char *e, size_t elen)
{
	struct dev *fresh[2] = { 0 };
	uint64_t size[2];
	uint8_t *img;
	size_t j;
	int d, r = 0;

	for (d = 0; d < 2; d++)
		size[d] = dev_size(C->devs[d]);
	r = cache_detach(C, NULL, NULL, e, elen);
	detach_done = rec_log_count(L);
	devs_gone = !r; /* the detach closed them */
	CHECK(r || C->detached);
	/* the other threads go on detached for an eighth of the workload
	 * (at most 2 s), and leave some for after the attach */
	for (j = 0; !r && nthreads > 1 && j < 2000 &&
	     __atomic_load_n(&nops, __ATOMIC_RELAXED) < total_ops * 5 / 8;
	     j++)
		usleep(1000);
	attach_begin = rec_log_count(L);
	for (d = 0; d < 2 && !r; d++) {
		img = dev_alloc_buf(size[d]);
		r = img ? dev_rec_create(L, d, size[d], &fresh[d]) : -ENOMEM;
		if (!r) {
			memset(img, 0, size[d]);
			for (j = 0; j < attach_begin; j++)
				if (ev(j)->kind == REC_DEV_WRITE &&
				    ev(j)->target == d)
					memcpy(img + ev(j)->off, ev(j)->data,
					       ev(j)->len);
			r = dev_write_fua(fresh[d], img, size[d], 0);
		}
		free(img);
		if (r)
			snprintf(e, elen, "fresh device: %s", strerror(-r));
	}
	if (!r)
		r = cache_attach_with(C, fresh, 2, e, elen);
	reattached = !r;
	CHECK(r || !C->detached);
	for (d = 0; d < 2; d++) {
		if (r)
			dev_close(fresh[d]);
		live_devs[d] = r ? NULL : fresh[d];
	}
	return r;
}

/* Halfway through the workload: the device-life operation of the run, while
 * the other threads go on. */
static void devlife_op(void)
{
	const char *what = replace_mode ? "replace"
			   : remove_mode ? "remove"
			   : add_mode	 ? "add"
			   : detach_mode ? "detach+attach"
			   : mirror_mode ? "replace-mirror"
					 : NULL;
	char e[512];
	int r;

	if (!what)
		return;
	devlife_begin = rec_log_count(L);
	r = replace_mode  ? cache_replace_dev_with(C, "rec1", new_dev, e,
						   sizeof(e))
	    : remove_mode ? cache_remove_dev(C, "rec1", NULL, NULL, e,
					     sizeof(e))
	    : detach_mode ? detach_attach(e, sizeof(e))
	    : mirror_mode ? cache_replace_mirror_with(C, "m1", "m2",
						      &new_mirror, e, sizeof(e))
			  : cache_add_dev_with(C, new_dev, e, sizeof(e));
	if (r)
		fprintf(out, "%s failed: %s\n", what, e);
	CHECK_EQ(r, 0);
	replaced = replace_mode && !r;
	removed_ok = remove_mode && !r;
	added_ok = add_mode && !r;
	mirrored_ok = mirror_mode && !r;
	devlife_done = rec_log_count(L);
}

/*
 * A rebuild racing a commit (cache/mngt/rebuild.c, "Fresh slots"; issue 25,
 * finding 3).  Once armed, the first commit into a fresh slot of member 1
 * (its block on the device already, nothing valid yet) starts the replace
 * on a thread of its own and waits, its slot's lock held, until the
 * rebuild's scan waits for that lock (or, had it skipped the slot, has
 * passed it), or the replace is over.
 */
enum { RACE_OFF, RACE_ARMED, RACE_STARTED };
static int race_state, race_held, race_ms, devlife_over;
static pthread_t devlife_thread;

static void *devlife_main(void *arg)
{
	(void)arg;
	devlife_op();
	__atomic_store_n(&devlife_over, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* The rebuild's scan has passed slot s (index j of member 1), or waits at
 * it, or the replace is over.  *still counts the polls that found the scan
 * where the last one did. */
static int race_reached(struct cache *c, struct cslot *s, uint64_t j,
			uint64_t *pos0, int *still)
{
	uint64_t pos = __atomic_load_n(&c->rebuild_pos, __ATOMIC_ACQUIRE);
	int on = __atomic_load_n(&c->rebuild_member, __ATOMIC_ACQUIRE) == 2;
	uint32_t v = __atomic_load_n(&s->rw.v, __ATOMIC_ACQUIRE);

	*still = on && pos == *pos0 ? *still + 1 : 0;
	*pos0 = pos;
	if (__atomic_load_n(&devlife_over, __ATOMIC_ACQUIRE))
		return 1;
	return on && (pos > j || (pos == j && (v & SRW_SLEEPERS)));
}

static void race_commit(struct cache *c, struct cslot *s)
{
	uint64_t j = layout_index(&c->meta.layout, slot_idx(c, s)), pos0 = 0;
	int i, still = 0, armed = RACE_ARMED;

	if (s->state != SLOT_FRESH || s->is_twin ||
	    slot_member(c, slot_idx(c, s)) != 1 ||
	    !__atomic_compare_exchange_n(&race_state, &armed, RACE_STARTED, 0,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return;
	race_held = 1;
	CHECK_EQ(pthread_create(&devlife_thread, NULL, devlife_main, NULL), 0);
	/* a scan stopped for 50 ms short of s waits for another slot this
	 * thread holds (a write of several blocks): then the race is not run;
	 * at most 5 s in all */
	for (i = 0;
	     i < 5000 && still < 50 && !race_reached(c, s, j, &pos0, &still);
	     i++)
		usleep(1000);
	race_ms = i;
}

static void do_op(unsigned *rs, int nth, char *buf, char *rb)
{
	static const uint64_t lens[] = { 8, 64, 4096, 12288, 16384 };
	int kind = rnd_r(rs) % 100, slot = rnd_r(rs) % NSLOTF, idx, i;
	struct op *o;
	struct inc *I;
	uint64_t w;

	kind = kind < 50   ? OP_WRITE
	       : kind < 57 ? OP_TRUNC
	       : kind < 75 ? OP_FSYNC
	       : kind < 98 ? OP_READ
			   : OP_UNLINK;
	if (kind == OP_UNLINK && nthreads == 1)
		kind = OP_READ;
	idx = __atomic_fetch_add(&nops, 1, __ATOMIC_RELAXED);
	if (idx >= MAXOPS)
		return;
	if (nthreads == 1 && idx == total_ops * 2 / 3) {
		kind = OP_UNLINK;
		slot = NSLOTF - 1;
	}
	if (idx == total_ops / 2 && replace_mode)
		__atomic_store_n(&race_state, RACE_ARMED, __ATOMIC_RELEASE);
	else if (idx == (detach_mode ? total_ops / 4 : total_ops / 2))
		devlife_op(); /* a detach takes long: a quarter in */
	if (idx == total_ops * 3 / 4 && replace_mode &&
	    __atomic_compare_exchange_n(&race_state, &(int){ RACE_ARMED },
					RACE_STARTED, 0, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE))
		devlife_op(); /* no fresh slot of member 1 came */
	o = &ops[idx];
	if (kind == OP_TRUNC || kind == OP_UNLINK)
		pthread_rwlock_wrlock(&fslots[slot].lock);
	else
		pthread_rwlock_rdlock(&fslots[slot].lock);
	o->kind = kind;
	o->inc = i = fslots[slot].cur;
	I = &incs[i];
	o->off = (rnd_r(rs) % FILE_MAX) & ~7ull;
	if (kind == OP_WRITE) {
		o->len = rnd_r(rs) % 3 ? lens[rnd_r(rs) % 5]
				       : ((rnd_r(rs) % (48 * KiB)) & ~7ull) + 8;
		for (w = 0; w < o->len / 8; w++)
			((uint64_t *)buf)[w] =
				token(i, idx + 1, o->off / 8 + w);
		o->sync = rnd_r(rs) % 8 == 0;
	}
	o->start = rec_log_add(L, REC_MARK, idx, 0, NULL, 0, 0);
	switch (kind) {
	case OP_WRITE:
		o->res = cache_write(C, I->cf, buf, o->len, o->off);
		break;
	case OP_TRUNC:
		o->res = cache_truncate(C, I->cf, o->off);
		break;
	case OP_FSYNC:
		o->res = cache_fsync(C, I->cf);
		break;
	case OP_READ: {
		char *data;

		o->res = cache_read(C, I->cf, rb, READ_LEN, o->off, &data,
				    &o->rn);
		if (!o->res && o->rn) {
			o->rdata = malloc(o->rn);
			memcpy(o->rdata, data, o->rn);
		}
		break;
	}
	case OP_UNLINK:
		inc_unlink(i);
		o->res = 0;
		break;
	}
	o->end = rec_log_add(L, REC_MARK, idx, 1, NULL, 0, 0);
	if (kind == OP_WRITE && o->sync && !o->res) {
		/* what fs.c's write_now does for a write's own sync flag */
		o->sstart = rec_log_add(L, REC_MARK, idx, 2, NULL, 0, 0);
		o->res = cache_fsync(C, I->cf);
		o->send = rec_log_add(L, REC_MARK, idx, 3, NULL, 0, 0);
	}
	if (kind == OP_UNLINK) {
		int n = inc_create(slot, I->gen + 1);

		CHECK(n >= 0);
		if (n >= 0)
			fslots[slot].cur = n;
	}
	pthread_rwlock_unlock(&fslots[slot].lock);
	if (o->res)
		fprintf(out, "op %d (%s) failed: %s\n", idx, op_names[kind],
			strerror(-o->res));
	CHECK(o->res == 0);
	(void)nth;
}

static void *worker(void *arg)
{
	int t = (int)(intptr_t)arg, i;
	unsigned rs = seed * 7919u + t * 104729u + 1;
	char *buf = malloc(64 * KiB);
	char *rb = dev_alloc_buf(READ_LEN + 4 * NVC_PAGE);

	for (i = 0; i < total_ops / nthreads; i++)
		do_op(&rs, t, buf, rb);
	free(buf);
	free(rb);
	return NULL;
}

/* --------------------------------------------------------------- model */

/* A remove let its device go: no write reached it after it returned; an
 * added device took new data.  A detach let both go (no write between its
 * return and the attach's superblock copies), and the attach took them back
 * (new data reached them). */
static void devlife_check(void)
{
	size_t j, to[3] = { 0, 0, 0 };

	if (detach_mode && reattached) {
		for (j = detach_done; j < attach_begin; j++)
			CHECK(ev(j)->kind != REC_DEV_WRITE &&
			      ev(j)->kind != REC_DEV_FLUSH_BEGIN);
		for (j = devlife_done; j < rec_log_count(L); j++)
			if (ev(j)->kind == REC_DEV_WRITE && ev(j)->target < 3)
				to[ev(j)->target]++;
		CHECK(to[0] + to[1] > 0);
	}
	if (!remove_mode && !add_mode)
		return;
	for (j = devlife_done; j < rec_log_count(L); j++)
		if (ev(j)->kind == REC_DEV_WRITE && ev(j)->target < 3)
			to[ev(j)->target]++;
	if (remove_mode)
		CHECK_EQ(to[1], 0);
	if (add_mode)
		CHECK(to[2] > 0);
}

static int op_cmp_start(const void *a, const void *b)
{
	const struct op *x = &ops[*(const int *)a], *y = &ops[*(const int *)b];

	return x->start < y->start ? -1 : x->start > y->start;
}

static void op_words(const struct op *o, uint64_t *w0, uint64_t *w1)
{
	*w0 = o->off / 8;
	*w1 = o->kind == OP_WRITE ? (o->off + o->len) / 8 : WORDS;
}

/* Per incarnation: its writes and truncates by start, per-word lists. */
static void model_build(void)
{
	int i, j;

	for (i = 0; i < nincs; i++) {
		struct inc *I = &incs[i];
		uint64_t w, w0, w1;

		I->ops = calloc(nops_max + 1, sizeof(int));
		I->syncs = calloc(nops_max + 1, sizeof(int));
		I->wo = calloc(WORDS + 1, sizeof(uint32_t));
		for (j = 0; j < nops_max; j++) {
			if (ops[j].inc != i)
				continue;
			if (ops[j].kind == OP_WRITE || ops[j].kind == OP_TRUNC)
				I->ops[I->nops++] = j;
			if ((ops[j].kind == OP_FSYNC || ops[j].sync) &&
			    !ops[j].res)
				I->syncs[I->nsyncs++] = j;
		}
		qsort(I->ops, I->nops, sizeof(int), op_cmp_start);
		for (j = 0; j < I->nops; j++) {
			op_words(&ops[I->ops[j]], &w0, &w1);
			for (w = w0; w < w1; w++)
				I->wo[w + 1]++;
		}
		for (w = 0; w < WORDS; w++)
			I->wo[w + 1] += I->wo[w];
		I->wl = calloc(I->wo[WORDS] + 1, sizeof(int));
		{
			uint32_t *fill = calloc(WORDS, sizeof(uint32_t));

			for (j = 0; j < I->nops; j++) {
				op_words(&ops[I->ops[j]], &w0, &w1);
				for (w = w0; w < w1; w++)
					I->wl[I->wo[w] + fill[w]++] = I->ops[j];
			}
			free(fill);
		}
	}
}

/* The guarantee point of incarnation i after a power loss at k. */
static size_t guarantee(const struct inc *I, size_t k)
{
	size_t g = 0;
	int j;

	for (j = 0; j < I->nsyncs; j++) {
		const struct op *f = &ops[I->syncs[j]];
		size_t start = f->sync ? f->sstart : f->start;
		size_t end = f->sync ? f->send : f->end;

		if (end < k && start > g)
			g = start;
	}
	return g;
}

/* A guaranteed op (ended before g) covering w started after x ended. */
static int superseded(const struct inc *I, uint64_t w, size_t xend, size_t g)
{
	uint32_t j;

	for (j = I->wo[w]; j < I->wo[w + 1]; j++) {
		const struct op *y = &ops[I->wl[j]];

		if (y->end < g && y->start > xend)
			return 1;
	}
	return 0;
}

/* May word w of incarnation i hold got, with ops ended before g guaranteed
 * and ops started at or after h not begun? */
static int word_ok(int i, uint64_t w, uint64_t got, size_t g, size_t h)
{
	const struct inc *I = &incs[i];
	uint32_t j;

	if (got) {
		uint64_t ver = (got >> 24) & 0xffffffffull;
		const struct op *x;

		if ((int)(got >> 56) != i + 1 || (got & 0xffffff) != w ||
		    !ver || ver > (uint64_t)nops_max)
			return 0;
		x = &ops[ver - 1];
		if (x->kind != OP_WRITE || x->inc != i || w < x->off / 8 ||
		    w >= (x->off + x->len) / 8 || x->start >= h)
			return 0;
		return !superseded(I, w, x->end, g);
	}
	for (j = I->wo[w]; j < I->wo[w + 1]; j++)
		if (ops[I->wl[j]].end < g)
			break;
	if (j == I->wo[w + 1])
		return 1; /* its initial zero */
	for (j = I->wo[w]; j < I->wo[w + 1]; j++) {
		const struct op *x = &ops[I->wl[j]];

		if (x->kind == OP_TRUNC && x->start < h &&
		    !superseded(I, w, x->end, g))
			return 1;
	}
	return 0;
}

/* May incarnation i show size s? */
static int size_ok(int i, uint64_t s, size_t g, size_t h)
{
	const struct inc *I = &incs[i];
	int b, j, tg = -1;

	for (j = 0; j < I->nops; j++) {
		const struct op *o = &ops[I->ops[j]];

		if (o->kind == OP_TRUNC && o->end < g)
			tg = j;
	}
	for (b = tg; b < I->nops; b++) {
		const struct op *t = b >= 0 ? &ops[I->ops[b]] : NULL;
		uint64_t lower = t ? t->off : 0;

		if (b > tg && (t->kind != OP_TRUNC || t->start >= h))
			continue;
		for (j = b + 1; j < I->nops; j++) {
			const struct op *x = &ops[I->ops[j]];

			if (x->kind == OP_WRITE && x->end < g &&
			    x->off + x->len > lower)
				lower = x->off + x->len;
		}
		if (s == lower)
			return 1;
		for (j = b + 1; j < I->nops; j++) {
			const struct op *x = &ops[I->ops[j]];

			if (x->kind != OP_WRITE || x->start >= h || s <= lower)
				continue;
			/* one under way may have grown the file in steps */
			if (x->off + x->len == s ||
			    (x->end >= h && s > x->off && s < x->off + x->len))
				return 1;
		}
	}
	return 0;
}

static void dump_events(const char *range);

static void explain(int i, uint64_t w, size_t g, size_t h)
{
	const struct inc *I = &incs[i];
	uint32_t j;

	if (debug > 1 && g <= h) {
		char range[64];

		snprintf(range, sizeof(range), "%zu-%zu", g > 60 ? g - 60 : 0,
			 h + 3);
		dump_events(range);
	}
	fprintf(out,
		"    guaranteed: ops ended before event %zu; begun: "
		"before %zu\n",
		g, h);
	for (j = I->wo[w]; j < I->wo[w + 1]; j++) {
		const struct op *x = &ops[I->wl[j]];

		fprintf(out, "    op %d %s off %llu len %llu events %zu..%zu\n",
			I->wl[j], op_names[x->kind], (unsigned long long)x->off,
			(unsigned long long)x->len, x->start, x->end);
	}
}

static void explain_size(int i, size_t g, size_t h)
{
	const struct inc *I = &incs[i];
	int j;

	fprintf(out,
		"    guaranteed: ops ended before event %zu; begun: "
		"before %zu\n",
		g, h);
	for (j = 0; j < I->nops; j++) {
		const struct op *x = &ops[I->ops[j]];

		if (x->start < h)
			fprintf(out,
				"    op %d %s off %llu len %llu events "
				"%zu..%zu\n",
				I->ops[j], op_names[x->kind],
				(unsigned long long)x->off,
				(unsigned long long)x->len, x->start, x->end);
	}
}

/* Reads during the workload saw what the model allows. */
static void check_reads(void)
{
	int j;

	for (j = 0; j < nops_max; j++) {
		const struct op *o = &ops[j];
		uint64_t w;

		if (o->kind != OP_READ || o->res)
			continue;
		for (w = 0; w < o->rn / 8; w++) {
			uint64_t got;

			memcpy(&got, o->rdata + 8 * w, 8);
			if (!word_ok(o->inc, o->off / 8 + w, got, o->start,
				     o->end)) {
				fprintf(out,
					"read op %d (events %zu..%zu): file "
					"%s word %llu holds %016llx\n",
					j, o->start, o->end, incs[o->inc].name,
					(unsigned long long)(o->off / 8 + w),
					(unsigned long long)got);
				if (debug)
					explain(o->inc, o->off / 8 + w,
						o->start, o->end);
				check_failures++;
				break;
			}
		}
	}
}

/* ----------------------------------------------------- crash states */

/* a device lost at the crash: gone, failing every I/O (and full of garbage),
 * overwritten with garbage, or blank */
enum { LOSE_NONE, LOSE_MISSING, LOSE_EIO, LOSE_GARBAGE, LOSE_ZERO };

struct crash {
	size_t k;
	int kill; /* the process died, the machine did not */
	int lose, lose_dev; /* two copies: a device lost too */
	int whole; /* a kill before the next persist's copy began */
};

static size_t nev, opened;
static size_t *next_flush, *page_end; /* page_end: also a flush's end */
static uint64_t devsize;
static size_t mlen;

static void index_events(void)
{
	size_t j, first_end[3] = { SIZE_MAX, SIZE_MAX, SIZE_MAX };
	int d;

	nev = rec_log_count(L);
	next_flush = malloc(nev * sizeof(size_t));
	page_end = malloc(nev * sizeof(size_t));
	for (j = 0; j < nev; j++) {
		page_end[j] = SIZE_MAX;
		if (ev(j)->kind == REC_PM_PAGE_END ||
		    ev(j)->kind == REC_DEV_FLUSH)
			page_end[ev(j)->off] = j;
	}
	/* a write is durable once a flush of its device that started after it
	 * completed: the first such completion */
	for (j = nev; j-- > 0;) {
		const struct rec_event *e = ev(j);

		if (e->kind == REC_DEV_FLUSH_BEGIN &&
		    page_end[j] < first_end[e->target])
			first_end[e->target] = page_end[j];
		d = e->kind == REC_DEV_WRITE ? e->target : 0;
		next_flush[j] = first_end[d];
	}
}

/*
 * The event at the crash point was under way: its thread had begun it (a
 * persist's bytes copied, a write issued) and would have logged it once done.
 * Later events of other threads were not: what they carry may depend on
 * events after the crash point.
 */
static const struct rec_event *under_way(size_t k, enum rec_kind kind)
{
	return k < nev && ev(k)->kind == kind ? ev(k) : NULL;
}

/* Apply a device write: all of it, or (part) some of its 4 KiB pages. */
static void apply_dev(struct dev *d, const struct rec_event *e, int part)
{
	uint32_t at;

	if (!part) {
		dev_write(d, e->data, e->len, e->off);
		return;
	}
	for (at = 0; at < e->len; at += NVC_PAGE)
		if (rnd() % 2)
			dev_write(d, e->data + at,
				  e->len - at < NVC_PAGE ? e->len - at
							 : NVC_PAGE,
				  e->off + at);
}

static void materialize_devs(const struct crash *cr, struct dev **devs)
{
	const struct rec_event *e;
	size_t j;

	for (j = 0; j < cr->k; j++) {
		e = ev(j);
		if (e->kind != REC_DEV_WRITE)
			continue;
		if (cr->kill || e->fua || next_flush[j] < cr->k) {
			apply_dev(devs[e->target], e, 0);
			continue;
		}
		switch (rnd() % 3) {
		case 0:
			apply_dev(devs[e->target], e, 0);
			break;
		case 1:
			break;
		default:
			apply_dev(devs[e->target], e, 1);
		}
	}
	/* after a kill, it completes or was never issued */
	e = under_way(cr->k, REC_DEV_WRITE);
	if (e && (!cr->kill || rnd() % 2))
		apply_dev(devs[e->target], e, !cr->kill);
}

/* A persist the crash interrupted: a prefix of it, or some of its lines. */
static void apply_torn(uint8_t *dst, const uint8_t *src, uint32_t len,
		       uint32_t unit, int prefix)
{
	uint32_t at, cut = (rnd() % (len / unit + 1)) * unit;

	prefix |= rnd() % 2;

	for (at = 0; at < len; at += unit) {
		uint32_t n = len - at < unit ? len - at : unit;

		if (prefix ? at < cut : rnd() % 2)
			memcpy(dst + at, src + at, n);
	}
}

struct landing {
	size_t t, j;
	int torn;
};

static int landing_cmp(const void *a, const void *b)
{
	const struct landing *x = a, *y = b;

	if (x->t != y->t)
		return x->t < y->t ? -1 : 1;
	return x->j < y->j ? -1 : x->j > y->j;
}

static void materialize_meta(const struct crash *cr, struct pm_region *r)
{
	const struct rec_event *e;
	size_t j, n = 0;
	struct landing *v;

	if (!blk) {
		for (j = 0; j < cr->k; j++) {
			e = ev(j);
			if (e->kind == REC_PM_PERSIST)
				memcpy((char *)r[e->target].addr + e->off,
				       e->data, e->len);
		}
		/* torn: a kill leaves a prefix (the copy stopped) */
		e = under_way(cr->k, REC_PM_PERSIST);
		if (e && !cr->whole)
			apply_torn((uint8_t *)r[e->target].addr + e->off,
				   e->data, e->len, 64, cr->kill);
		return;
	}
	/* page writes land in the order of their landing moments */
	v = malloc(cr->k * sizeof(*v) + sizeof(*v));
	for (j = 0; j < cr->k; j++) {
		const struct rec_event *e = ev(j);
		size_t end = page_end[j];

		if (e->kind != REC_PM_PAGE_BEGIN)
			continue;
		v[n].j = j;
		v[n].torn = 0;
		if (end < cr->k || cr->kill) {
			if (end == SIZE_MAX)
				end = j;
			v[n].t = j + rnd() % (end - j + 1);
		} else {
			/* in flight: landed before the crash, or not */
			if (rnd() % 2)
				continue;
			v[n].t = j + rnd() % (cr->k - j);
			v[n].torn = rnd() % 2;
		}
		n++;
	}
	qsort(v, n, sizeof(*v), landing_cmp);
	for (j = 0; j < n; j++) {
		const struct rec_event *e = ev(v[j].j);
		uint8_t *dst = (uint8_t *)r[e->target].addr + e->off;

		if (v[j].torn)
			apply_torn(dst, e->data, e->len, 512, 0);
		else
			memcpy(dst, e->data, e->len);
	}
	free(v);
}

/* The incarnation a backing event of inode target at j belongs to. */
static int inc_of(int target, size_t j)
{
	int i;

	for (i = nincs - 1; i >= 0; i--)
		if ((int)incs[i].ino == target && incs[i].born < j)
			return i;
	return -1;
}

/* Write e's data, all of it or (part) some of its pages, and (meta) its size. */
static void img_write(uint8_t *img, uint64_t *size, const struct rec_event *e,
		      int part, int meta)
{
	uint64_t at, end = e->off + e->len;

	for (at = e->off; at < end;) {
		uint64_t pe = (at / NVC_PAGE + 1) * NVC_PAGE;

		if (pe > end)
			pe = end;
		if (!part || rnd() % 2)
			memcpy(img + at, e->data + (at - e->off), pe - at);
		at = pe;
	}
	if (meta && end > *size)
		*size = end;
}

static void img_trunc(uint8_t *img, uint64_t *size, uint64_t to)
{
	memset(img + to, 0, IMG - to);
	*size = to;
}

/* The mtime that event j of incarnation i left (the mark after it). */
static void mtime_after(int i, size_t j, struct timespec *ts)
{
	size_t x;

	for (x = j + 1; x < nev; x++) {
		const struct rec_event *e = ev(x);

		if (e->kind == REC_MARK && e->target == MTIME_MARK(i) &&
		    e->thread == ev(j)->thread) {
			ts->tv_sec = e->off / 1000000000ull;
			ts->tv_nsec = e->off % 1000000000ull;
			return;
		}
	}
}

/*
 * Backing file i as the crash left it.  The file system's metadata (sizes,
 * truncates, mtime) goes durable in order: a prefix of its changes, at least
 * up to the start of the last fsync that completed; data written before that
 * start is there, later data may be there, in part, or not.  After a kill,
 * everything before the crash point is there.
 */
static void materialize_backing(const struct crash *cr, int i, uint8_t *img)
{
	struct inc *I = &incs[i];
	struct timespec ts[2] = { { 0, UTIME_OMIT }, I->mtime0 };
	size_t j, durable = 0, cut, last = cr->k, meta_last = SIZE_MAX;
	uint64_t size = 0;

	for (j = I->born; j < cr->k; j++) {
		const struct rec_event *e = ev(j);

		if (e->kind == REC_BK_SYNC && inc_of(e->target, j) == i &&
		    e->off > durable)
			durable = e->off;
	}
	/* the event under way at the crash point may have been done */
	if (cr->k < nev &&
	    (ev(cr->k)->kind == REC_BK_WRITE ||
	     ev(cr->k)->kind == REC_BK_TRUNC) &&
	    inc_of(ev(cr->k)->target, cr->k) == i && rnd() % 2)
		last = cr->k + 1;
	if (cr->kill)
		durable = last;
	cut = durable + rnd() % (last - durable + 1);
	memset(img, 0, IMG);
	for (j = I->born; j < last; j++) {
		const struct rec_event *e = ev(j);
		int part;

		if ((e->kind != REC_BK_WRITE && e->kind != REC_BK_TRUNC &&
		     e->kind != REC_BK_SYNC) ||
		    inc_of(e->target, j) != i)
			continue;
		if (j < cut)
			meta_last = j;
		if (e->kind == REC_BK_SYNC)
			continue;
		/* 0: all of it, 1: none, 2: some pages */
		part = j < durable ? 0 : rnd() % 3;
		if (e->kind == REC_BK_TRUNC && j < cut)
			img_trunc(img, &size, e->off);
		else if (e->kind == REC_BK_WRITE && part != 1)
			img_write(img, &size, e, part == 2, j < cut);
	}
	if (meta_last != SIZE_MAX)
		mtime_after(i, meta_last, &ts[1]);
	memset(img + size, 0, IMG - size);
	CHECK_EQ(ftruncate(I->fd, 0), 0);
	CHECK_EQ(pwrite(I->fd, img, size, 0), (ssize_t)size);
	CHECK_EQ(futimens(I->fd, ts), 0);
	if (debug > 1)
		fprintf(out, "  %s (ino %llu): size %llu mtime %llu.%09llu\n",
			I->name, (unsigned long long)I->ino,
			(unsigned long long)size,
			(unsigned long long)ts[1].tv_sec,
			(unsigned long long)ts[1].tv_nsec);
}

/*
 * Before recovery: the newest valid copy of each record is at least as new as
 * the last persist of it that completed before the crash.
 */
static int check_records(const struct crash *cr, struct pm_region *r)
{
	const struct meta_hdr *h = r[0].addr;
	uint64_t *want = calloc(mlen / 64, sizeof(uint64_t));
	size_t j;
	int bad = 0;

	for (j = opened; j < cr->k; j++) {
		const struct rec_event *e = ev(j);
		uint64_t seq;

		if (e->kind != REC_PM_PERSIST || e->len > META_FILE_SIZE ||
		    e->off < h->files_off)
			continue;
		memcpy(&seq, e->data, 8);
		if (seq > want[e->off / 64])
			want[e->off / 64] = seq;
	}
	for (j = 0; j < mlen / 64; j++) {
		uint64_t best = 0, off = j * 64;
		uint32_t len;
		int m, ok = 0;

		if (!want[j])
			continue;
		len = off < h->slots_off ? META_FILE_SIZE : h->slot_size;
		for (m = 0; m < 2; m++) {
			const uint8_t *p = (const uint8_t *)r[m].addr + off;
			uint64_t c, seq;
			uint32_t z;

			for (z = 0; z < len && !p[z]; z++)
				;
			memcpy(&c, p + len - 8, 8);
			memcpy(&seq, p, 8);
			if (z == len || c == meta_csum(p, len - 8)) {
				ok = 1;
				if (z < len && seq > best)
					best = seq;
			}
		}
		if (!ok || best < want[j]) {
			fprintf(out,
				"crash point %zu: metadata record at %llu: "
				"newest valid copy has seq %llu%s, but seq "
				"%llu was persisted\n",
				cr->k, (unsigned long long)off,
				(unsigned long long)best,
				ok ? "" : " (none valid)",
				(unsigned long long)want[j]);
			bad++;
		}
	}
	free(want);
	return bad;
}

/*
 * Behind the cache's back.  With NVC_CRASH_BEHIND, each file is, at the
 * crash, left alone, renamed aside, or renamed aside and replaced by a new
 * file at its name (what another node, or a store whose handles went stale,
 * does to it).  Found by handle, the cache follows the renamed inode, and the
 * model is checked there.  Found by path, the file cannot be found: its
 * dirty data must go to lost+found and the renamed file stay as it was.
 * Either way a new file at the name must read as exactly what it holds.
 */
enum { BH_NONE, BH_RENAMED, BH_REPLACED };
#define BH_NEW_LEN (24 * KiB + 100)
static int bh[MAXINC];
static uint64_t bh_sum[MAXINC]; /* the renamed file's bytes, before recovery */

static uint64_t file_sum(int fd)
{
	static uint8_t buf[IMG];
	ssize_t n = pread(fd, buf, sizeof(buf), 0);

	return n < 0 ? 0 : meta_csum(buf, n) ^ (uint64_t)n;
}

static void bh_aside(const struct inc *I, char *out, size_t len)
{
	snprintf(out, len, "%s.aside", I->name);
}

static void bh_new_bytes(uint8_t *p)
{
	unsigned i;

	for (i = 0; i < BH_NEW_LEN; i++)
		p[i] = 0xee ^ (i * 7);
}

static void behind_apply(const struct crash *cr)
{
	static uint8_t nb[BH_NEW_LEN];
	char aside[48];
	int i, fd;

	bh_new_bytes(nb);
	for (i = 0; i < nincs; i++) {
		struct inc *I = &incs[i];

		bh[i] = BH_NONE;
		if (!behind || I->unlinked || I->created >= cr->k)
			continue;
		bh[i] = rnd() % 3;
		if (bh[i] == BH_NONE)
			continue;
		bh_aside(I, aside, sizeof(aside));
		CHECK_EQ(renameat(backing_fd, I->name, backing_fd, aside), 0);
		if (bh[i] == BH_REPLACED) {
			fd = openat(backing_fd, I->name,
				    O_WRONLY | O_CREAT | O_EXCL, 0644);
			CHECK(fd >= 0);
			CHECK_EQ(pwrite(fd, nb, sizeof(nb), 0),
				 (ssize_t)sizeof(nb));
			close(fd);
		}
		bh_sum[i] = file_sum(I->fd);
	}
}

/* Whatever behind_apply did is undone, and lost+found emptied. */
static void behind_undo(void)
{
	char aside[48];
	int i, dfd;

	for (i = 0; i < nincs; i++) {
		if (bh[i] == BH_NONE)
			continue;
		bh_aside(&incs[i], aside, sizeof(aside));
		if (bh[i] == BH_REPLACED)
			unlinkat(backing_fd, incs[i].name, 0);
		CHECK_EQ(renameat(backing_fd, aside, backing_fd, incs[i].name),
			 0);
		bh[i] = BH_NONE;
	}
	dfd = openat(backing_fd, LOST_FOUND_DIR, O_RDONLY | O_DIRECTORY);
	if (dfd >= 0) {
		DIR *d = fdopendir(dfd);
		struct dirent *e;

		while ((e = readdir(d)))
			if (e->d_name[0] != '.')
				unlinkat(dfd, e->d_name, 0);
		closedir(d);
		unlinkat(backing_fd, LOST_FOUND_DIR, AT_REMOVEDIR);
	}
}

/*
 * A file the cache could not find (by path) lost nothing: its cached pages
 * in lost+found over the renamed file's bytes are the file as the cache
 * showed it, and must fit the model like a file read through the cache.
 */
static int check_lost_model(const struct crash *cr, int i)
{
	static uint8_t lf[IMG], aside[IMG];
	struct inc *I = &incs[i];
	size_t g = cr->kill ? cr->k : guarantee(I, cr->k);
	char prefix[64];
	int dfd, fd;
	ssize_t nl = 0, na;
	uint64_t w;
	struct dirent *e;
	DIR *d;

	memset(lf, 0, sizeof(lf));
	snprintf(prefix, sizeof(prefix), "%s.ino%llu.", I->name,
		 (unsigned long long)I->ino);
	dfd = openat(backing_fd, LOST_FOUND_DIR, O_RDONLY | O_DIRECTORY);
	d = dfd >= 0 ? fdopendir(dfd) : NULL;
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, prefix, strlen(prefix)))
			continue;
		fd = openat(dfd, e->d_name, O_RDONLY);
		nl = fd < 0 ? 0 : pread(fd, lf, sizeof(lf), 0);
		if (fd >= 0)
			close(fd);
	}
	if (d)
		closedir(d);
	na = pread(I->fd, aside, sizeof(aside), 0);
	for (w = 0; w < WORDS; w++) {
		uint64_t got = 0, a = 0;

		if ((ssize_t)(8 * w + 8) <= nl)
			memcpy(&got, lf + 8 * w, 8);
		if (!got && (ssize_t)(8 * w + 8) <= na &&
		    (!nl || (ssize_t)(8 * w + 8) <= nl))
			memcpy(&a, aside + 8 * w, 8);
		if (word_ok(i, w, got ? got : a, g, cr->k))
			continue;
		/* a cut the crash left unfinished (the record has the new
		 * size) cannot be finished in a file that cannot be found:
		 * it keeps its older bytes of its own */
		if (!got && a && (int)(a >> 56) == i + 1 &&
		    word_ok(i, w, 0, g, cr->k))
			continue;
		fprintf(out,
			"crash point %zu%s: %s, not found by path: word %llu "
			"is %016llx (from %s; lost+found %zd bytes, renamed "
			"file %zd)\n",
			cr->k, cr->kill ? " (kill)" : "", I->name,
			(unsigned long long)w,
			(unsigned long long)(got ? got : a),
			got ? "lost+found" : "the renamed file", nl, na);
		if (debug)
			explain(i, w, g, cr->k);
		return 1;
	}
	return 0;
}

/* A file replaced behind the cache's back reads, through the cache, as
 * exactly its own bytes; the one renamed aside is untouched when the cache
 * could not find it (by path). */
static int check_behind(const struct crash *cr, struct cache *c, int i)
{
	static uint8_t nb[BH_NEW_LEN];
	struct inc *I = &incs[i];
	struct cfile *cf;
	char *data;
	size_t n = 0;
	int fd, bad = 0;

	if (bh[i] == BH_REPLACED) {
		bh_new_bytes(nb);
		fd = openat(backing_fd, I->name, O_RDWR);
		if (fd < 0 || cache_file_get(c, fd, &cf)) {
			fprintf(out, "crash point %zu: new %s cannot be opened\n",
				cr->k, I->name);
			return 1;
		}
		if (cache_read(c, cf, rbuf, 512 * KiB, 0, &data, &n) ||
		    n != BH_NEW_LEN || memcmp(data, nb, n)) {
			fprintf(out,
				"crash point %zu%s: %s, replaced behind the "
				"cache's back, reads %zu other bytes\n",
				cr->k, cr->kill ? " (kill)" : "", I->name, n);
			bad++;
		}
		cache_file_put(c, cf);
		close(fd);
	}
	if (ident_mode == IDENT_PATH && file_sum(I->fd) != bh_sum[i]) {
		fprintf(out,
			"crash point %zu%s: %s, renamed behind the cache's "
			"back, was changed by the cache\n",
			cr->k, cr->kill ? " (kill)" : "", I->name);
		bad++;
	}
	return bad;
}

/*
 * What lost+found holds is the data of files the cache could not find:
 * every word is zero or a token of such a file (renamed aside by path, or
 * unlinked by the workload while the crash left its record), at its place.
 */
static int check_lost_found(const struct crash *cr)
{
	static uint8_t buf[IMG];
	int dfd = openat(backing_fd, LOST_FOUND_DIR, O_RDONLY | O_DIRECTORY);
	struct dirent *e;
	DIR *d;
	int bad = 0;

	if (dfd < 0)
		return 0;
	d = fdopendir(dfd);
	while ((e = readdir(d))) {
		ssize_t n, w;
		int fd;

		if (e->d_name[0] == '.')
			continue;
		fd = openat(dfd, e->d_name, O_RDONLY);
		n = fd < 0 ? -1 : pread(fd, buf, sizeof(buf), 0);
		if (fd >= 0)
			close(fd);
		for (w = 0; w + 8 <= n; w += 8) {
			uint64_t t;
			int inc;

			memcpy(&t, buf + w, 8);
			inc = (int)(t >> 56) - 1;
			if (!t || (inc >= 0 && inc < nincs &&
				   (t & 0xffffff) == (uint64_t)w / 8 &&
				   (incs[inc].unlinked ||
				    (ident_mode == IDENT_PATH && bh[inc]))))
				continue;
			fprintf(out,
				"crash point %zu%s: %s/%s word %zd holds "
				"%016llx: not the data of a file the cache "
				"could not find\n",
				cr->k, cr->kill ? " (kill)" : "", LOST_FOUND_DIR,
				e->d_name, w / 8, (unsigned long long)t);
			bad++;
			break;
		}
	}
	closedir(d);
	return bad;
}

static int check_files(const struct crash *cr, struct cache *c)
{
	int i, bad = 0;

	for (i = 0; i < nincs; i++) {
		struct inc *I = &incs[i];
		size_t g = cr->kill ? cr->k : guarantee(I, cr->k);
		struct cfile *cf;
		uint64_t size, off, w;

		if (I->unlinked || I->created >= cr->k)
			continue;
		if (bh[i])
			bad += check_behind(cr, c, i);
		if (bh[i] && ident_mode == IDENT_PATH)
			continue; /* not found: its data is in lost+found */
		if (cache_file_get(c, I->fd, &cf)) {
			fprintf(out, "crash point %zu: %s cannot be opened\n",
				cr->k, I->name);
			bad++;
			continue;
		}
		if (cache_file_attr(c, I->dev, I->ino, &size, NULL)) {
			size = lseek(I->fd, 0, SEEK_END);
			if (debug)
				fprintf(out, "  %s: not in the cache\n",
					I->name);
		}
		if (!size_ok(i, size, g, cr->k)) {
			fprintf(out,
				"crash point %zu%s: file %s has size %llu, "
				"which no allowed history gives\n",
				cr->k, cr->kill ? " (kill)" : "", I->name,
				(unsigned long long)size);
			if (debug)
				explain_size(i, g, cr->k);
			bad++;
		}
		for (off = 0; off < WORDS * 8ull; off += 512 * KiB) {
			char *data;
			size_t n = 0;
			int ret = cache_read(c, cf, rbuf, 512 * KiB, off, &data,
					     &n);

			if (ret) {
				fprintf(out,
					"crash point %zu%s: reading %s at "
					"%llu: "
					"%s (device %d lost: %d)\n",
					cr->k, cr->kill ? " (kill)" : "",
					I->name, (unsigned long long)off,
					strerror(-ret), cr->lose_dev, cr->lose);
				bad++;
				break;
			}
			for (w = 0; w < 512 * KiB / 8 && off / 8 + w < WORDS;
			     w++) {
				uint64_t got = 0;

				if (w < n / 8)
					memcpy(&got, data + 8 * w, 8);
				if (word_ok(i, off / 8 + w, got, g, cr->k))
					continue;
				fprintf(out,
					"crash point %zu%s%s: file %s word "
					"%llu "
					"holds %016llx (size %llu)\n",
					cr->k, cr->kill ? " (kill)" : "",
					cr->lose ? " (device lost)" : "",
					I->name,
					(unsigned long long)(off / 8 + w),
					(unsigned long long)got,
					(unsigned long long)size);
				if (debug)
					explain(i, off / 8 + w, g, cr->k);
				bad++;
				break;
			}
		}
		cache_file_put(c, cf);
	}
	return bad;
}

static void lose_device(const struct crash *cr, struct dev **devs)
{
	uint64_t at;
	char *junk;

	if (cr->lose == LOSE_MISSING) {
		dev_close(devs[cr->lose_dev]);
		dev_missing_create("lost", devsize, &devs[cr->lose_dev]);
		return;
	}
	junk = malloc(64 * KiB);
	for (at = 0; at < devsize; at += 64 * KiB) {
		uint32_t n = devsize - at < 64 * KiB ? devsize - at : 64 * KiB;
		uint32_t b;

		for (b = 0; b < n; b++)
			junk[b] = cr->lose == LOSE_ZERO ? 0 : rnd();
		dev_write(devs[cr->lose_dev], junk, n, at);
	}
	free(junk);
	if (cr->lose == LOSE_EIO) {
		dev_faults(devs[cr->lose_dev])->fail_reads = -EIO;
		dev_faults(devs[cr->lose_dev])->fail_writes = -EIO;
	}
}

/* The slot entries of mirror 0 (debugging). */
static void dump_slots(struct pm_region *r)
{
	const struct meta_hdr *h = r[0].addr;
	uint64_t i;

	for (i = 0; i < h->nslots; i++) {
		const uint8_t *p = (const uint8_t *)r[0].addr + h->slots_off +
				   i * h->slot_size;
		uint64_t seq, blk, valid, dirty;
		uint32_t file, flags;

		memcpy(&seq, p, 8);
		memcpy(&file, p + 8, 4);
		memcpy(&flags, p + 12, 4);
		memcpy(&blk, p + 16, 8);
		memcpy(&valid, p + 24, 8);
		memcpy(&dirty, p + 32, 8);
		if (file)
			fprintf(out,
				"  slot %llu (dev %llu): seq %llu file %u blk "
				"%llu valid %llx dirty %llx%s\n",
				(unsigned long long)i,
				(unsigned long long)(i % 2),
				(unsigned long long)seq, file,
				(unsigned long long)blk,
				(unsigned long long)valid,
				(unsigned long long)dirty,
				flags & 1 ? " twin" : "");
	}
}

/* The header a mount takes as current (meta_current), or NULL. */
static const struct meta_hdr *cur_hdr(struct pm_region *r)
{
	const struct meta_hdr *hh[2] = { r[0].addr, r[1].addr };
	int valid[2], m;

	for (m = 0; m < 2; m++)
		valid[m] = !meta_hdr_check(r[m].addr, mlen, NULL);
	m = meta_current(hh, valid);
	return m < 0 ? NULL : hh[m];
}

/* Grow runs: the members the current header records. */
static int members_of(struct pm_region *r)
{
	const struct meta_hdr *h = cur_hdr(r);

	return h ? (int)h->ndevs : 2;
}

/* Replace runs: 2 if the new device (all[2]) is member 1 by the current
 * header, else 1: which device a mount finds as member 1 (members.c). */
static int member1_of(struct dev **all, struct pm_region *r)
{
	const struct meta_hdr *h = cur_hdr(r);
	struct sb_disk sb;

	if (!h)
		return 1;
	return !sb_read(all[2], &sb) && !memcmp(sb.dev_uuid, h->members[1], 16)
		       ? 2
		       : 1;
}

/* A copy of a crash state's device (for the check after a resumed detach
 * closed the one it had). */
static struct dev *dev_copy(struct dev *from)
{
	uint64_t size = dev_size(from), at;
	char *buf = dev_alloc_buf(64 * KiB);
	struct dev *to = NULL;

	if (!buf || dev_mem_create(size, &to)) {
		free(buf);
		return NULL;
	}
	for (at = 0; at < size; at += 64 * KiB) {
		uint32_t n = size - at < 64 * KiB ? size - at : 64 * KiB;

		if (!dev_read(from, buf, n, at))
			dev_write(to, buf, n, at);
	}
	free(buf);
	return to;
}

/*
 * A crash state whose current header says detached, or a detach under way:
 * what cache_open does after opening it.  Detached (1): the mount opens no
 * device and is detached (detach_at_mount); here the devices are opened and
 * fenced instead (cache_open_devs takes no stand-ins for members), after
 * checking that the metadata maps no block: every read then comes from the
 * backing store.  A detach under way (META_DETACHING): the mount resumes it
 * (devlife_resume_start); here it runs to its end before the files are
 * checked, and must succeed.  It closes the devices: the check after it
 * reads copies (devs[] and all[] take them).  0 or the failures.
 */
static int detached_open(const struct crash *cr, struct cache *c,
			 uint32_t state, struct dev **devs, struct dev **all,
			 int pick)
{
	struct dev *copy[2] = { 0 };
	char err[512];
	uint64_t used;
	int d, bad = 0;

	if (state == META_DETACHING) {
		for (d = 0; d < 2; d++)
			copy[d] = dev_copy(devs[d]);
		if (cache_detach(c, NULL, NULL, err, sizeof(err))) {
			fprintf(out,
				"crash point %zu%s: the resumed detach "
				"failed: %s\n",
				cr->k, cr->kill ? " (kill)" : "", err);
			bad++;
		}
		for (d = 0; d < 2; d++) {
			if (c->devs[d] == devs[d]) { /* not released */
				dev_close(copy[d]);
				continue;
			}
			/* closed by the detach; c->devs[d] is its stand-in */
			devs[d] = copy[d];
			all[d ? pick : 0] = copy[d];
		}
	}
	pthread_mutex_lock(&c->lock);
	used = c->nslots - c->nfree;
	cache_unlock(c);
	if (used) {
		fprintf(out,
			"crash point %zu%s: detached (header %u), but the "
			"cache maps %llu blocks\n",
			cr->k, cr->kill ? " (kill)" : "", state,
			(unsigned long long)used);
		bad++;
	}
	if (state == 1) {
		for (d = 0; d < 2; d++)
			dev_faults(devs[d])->fail_reads =
				dev_faults(devs[d])->fail_writes = -ENODEV;
		detach_at_mount(c);
	}
	return bad;
}

/* Mirror replace runs: the states whose current header records the replace
 * under way, and those whose two live mirrors disagree on it: a crash
 * between the two persists of the record (mirror 0 and the old mirror 1,
 * the copy not made) or of its clearing (mirror 0 and the new one). */
static void mirror_census(struct pm_region *r)
{
	const struct meta_hdr *h = cur_hdr(r), *h0 = r[0].addr,
			      *h1 = r[1].addr, *h2 = r[2].addr;
	int v0, v1, v2;

	if (!mirror_mode)
		return;
	v0 = !meta_hdr_check(h0, mlen, NULL);
	v1 = !meta_hdr_check(h1, mlen, NULL);
	v2 = !meta_hdr_check(h2, mlen, NULL);
	n_mrec += h && h->mirror_replacing;
	n_mtorn += v0 && (v2 ? h0->mirror_replacing != h2->mirror_replacing
			     : v1 && h0->mirror_replacing != h1->mirror_replacing);
}

/* The new place as the harness's crash state has it (mirror_test_place):
 * a copy, which mirror_follow then owns. */
static struct pm_region *place_m2;

static int place_of(const char *path, struct pm_region *out)
{
	if (strcmp(path, "m2") || !place_m2 || pm_mem_create(mlen, out))
		return -ENOENT;
	memcpy(out->addr, place_m2->addr, mlen);
	out->created_ino = 3; /* the file the replace made (run_seed) */
	return 0;
}

/* What a mount with cache.metadata naming the old place (m0, m1) does
 * before it attaches (recover.c, cache_open): mirror_follow, then a place
 * found stale is given to the attach to be rebuilt whole.  1 if the mount
 * was refused. */
static int mirror_at_mount(struct cache_config *cfg, const struct crash *cr,
			   struct pm_region *r)
{
	char why[2][256], err[512], *followed[2] = { NULL, NULL };
	uint64_t total[2] = { 0, 0 };
	int mret[2], d, ret;

	for (d = 0; d < 2; d++)
		mret[d] = meta_hdr_check(r[d].addr, mlen, &total[d]) ? -EINVAL
								    : 0;
	place_m2 = &r[2];
	mirror_test_place = place_of;
	ret = mirror_follow((const char *const *)cfg->meta_paths, r, mret, why,
			    total, followed, err, sizeof(err));
	mirror_test_place = NULL;
	for (d = 0; d < 2; d++)
		if (followed[d]) {
			free(cfg->meta_paths[d]);
			cfg->meta_paths[d] = followed[d];
		}
	if (ret) {
		fprintf(out, "crash point %zu%s: the mount was refused: %s\n",
			cr->k, cr->kill ? " (kill)" : "", err);
		return 1;
	}
	n_followed += !strcmp(cfg->meta_paths[1], "m2");
	for (d = 0; d < 2; d++)
		if (mret[d] == -ESTALE)
			memset(r[d].addr, 0, META_HDR_SIZE);
	return 0;
}

/* After recovery both headers agree on the device-life state. */
static int headers_agree(const struct crash *cr, struct pm_region *r)
{
	const struct meta_hdr *h0 = r[0].addr, *h1 = r[1].addr;

	if (meta_hdr_check(h0, mlen, NULL) || meta_hdr_check(h1, mlen, NULL))
		return 0; /* a mirror lost with its device: rebuilt later */
	if (h0->detached == h1->detached && h0->ndevs == h1->ndevs &&
	    !memcmp(h0->removed, h1->removed, sizeof(h0->removed)) &&
	    !memcmp(h0->members, h1->members, sizeof(h0->members)) &&
	    h0->removing == h1->removing && h0->replacing == h1->replacing &&
	    h0->mirror_replacing == h1->mirror_replacing &&
	    !strcmp(h0->mirror_path, h1->mirror_path) &&
	    !memcmp(&h0->mirror_id, &h1->mirror_id, sizeof(h0->mirror_id)))
		return 0;
	fprintf(out,
		"crash point %zu%s: the headers differ after recovery "
		"(detached %u / %u, mirror replace %u / %u)\n",
		cr->k, cr->kill ? " (kill)" : "", h0->detached, h1->detached,
		h0->mirror_replacing, h1->mirror_replacing);
	return 1;
}

static void crash_check(struct cache_config *cfg, const struct crash *cr,
			uint8_t *img)
{
	struct dev *standin[2] = { 0 };
	const struct meta_hdr *h;
	uint32_t dstate = 0;
	struct dev *devs[3] = { 0 }, *all[3] = { 0 };
	struct pm_region r[3], swap;
	struct cache *c;
	char err[CFG_ERRLEN] = "";
	FILE *devnull = fopen("/dev/null", "w");
	int d, i, bad = 0, problems, pick;

	for (d = 0; d < 2 + (replace_mode || add_mode); d++)
		dev_mem_create(devsize, &all[d]);
	for (d = 0; d < 2 + mirror_mode; d++) {
		pm_mem_create(mlen, &r[d]);
		r[d].created_ino = d + 1; /* m0, m1, m2 as files */
	}
	materialize_devs(cr, all);
	materialize_meta(cr, r);
	mirror_census(r);
	if (mirrored_ok && cr->k >= devlife_done && rnd() % 2) {
		/* cache.metadata changed as the replace said */
		swap = r[1];
		r[1] = r[2];
		r[2] = swap;
		n_newcfg++;
		free(cfg->meta_paths[1]);
		cfg->meta_paths[1] = strdup("m2");
	} else if (mirror_mode && mirror_at_mount(cfg, cr, r)) {
		bad++;
		goto out;
	}
	pick = force_pick ? force_pick : replace_mode ? member1_of(all, r) : 1;
	devs[0] = all[0];
	devs[1] = all[pick];
	devs[2] = add_mode ? all[2] : NULL; /* the spare place's, added or not */
	if (add_mode == 2) /* grown or not: the metadata says */
		cfg->ndevs = members_of(r);
	for (i = 0; i < nincs; i++)
		if (!incs[i].unlinked)
			materialize_backing(cr, i, img);
	if (cr->lose)
		lose_device(cr, devs);
	all[0] = devs[0];
	all[pick] = devs[1];
	h = cur_hdr(r);
	dstate = h ? h->detached : 0;
	n_detaching += dstate == META_DETACHING;
	n_detached += dstate == 1;
	n_torn += !meta_hdr_check(r[0].addr, mlen, NULL) &&
		  !meta_hdr_check(r[1].addr, mlen, NULL) &&
		  ((const struct meta_hdr *)r[0].addr)->detached !=
			  ((const struct meta_hdr *)r[1].addr)->detached;
	behind_apply(cr);
	bad += check_records(cr, r);
	if (debug > 1)
		dump_slots(r);
	if (debug > 1)
		for (i = 0; i < 6; i++) {
			const struct meta_hdr *h = r[0].addr;
			const struct meta_file *mf0 =
				(const void *)((char *)r[0].addr +
					       h->files_off + i * META_FILE_SIZE);
			const struct meta_file *mf1 =
				(const void *)((char *)r[1].addr +
					       h->files_off + i * META_FILE_SIZE);

			fprintf(out,
				"  record %d: seq %llu/%llu ino %llu size "
				"%llu/%llu mtime %llu/%llu\n",
				i, (unsigned long long)mf0->seq,
				(unsigned long long)mf1->seq,
				(unsigned long long)mf0->ino,
				(unsigned long long)mf0->size,
				(unsigned long long)mf1->size,
				(unsigned long long)mf0->bk_mtime_ns,
				(unsigned long long)mf1->bk_mtime_ns);
		}
	if (cache_open_devs(cfg, devs, cfg->ndevs, r, backing_fd, &c, err,
			    sizeof(err))) {
		if (replace_mode && !force_pick && strstr(err, "former member")) {
			/* the mirrors disagree on member 1 (a torn header
			 * update): the administrator names the other one */
			force_pick = 3 - pick;
			behind_undo();
			crash_check(cfg, cr, img);
			force_pick = 0;
			goto out_close;
		}
		fprintf(out, "crash point %zu%s: recovery failed: %s\n", cr->k,
			cr->kill ? " (kill)" : "", err);
		bad++;
		goto out;
	}
	if (dstate) {
		bad += detached_open(cr, c, dstate, devs, all, pick);
		for (d = 0; d < 2; d++)
			if (c->devs[d] != devs[d])
				standin[d] = c->devs[d]; /* the detach's */
	}
	bad += check_files(cr, c);
	cache_close(c, 0); /* destage stops: the mirrors must agree */
	for (d = 0; d < 2; d++) {
		dev_close(standin[d]);
		if (dstate == 1) /* fenced by detached_open */
			dev_faults(devs[d])->fail_reads =
				dev_faults(devs[d])->fail_writes = 0;
	}
	bad += headers_agree(cr, r);
	bad += check_lost_found(cr);
	for (i = 0; i < nincs && ident_mode == IDENT_PATH; i++)
		if (bh[i])
			bad += check_lost_model(cr, i);
	if (memcmp((char *)r[0].addr + META_HDR_SIZE,
		   (char *)r[1].addr + META_HDR_SIZE, mlen - META_HDR_SIZE)) {
		fprintf(out, "crash point %zu: mirrors differ after recovery\n",
			cr->k);
		bad++;
	}
	if (!cr->lose) {
		problems = fmt_check_open(cfg, devs, cfg->ndevs, r, devnull, 0);
		if (problems) {
			fprintf(out,
				"crash point %zu: check found %d problems\n",
				cr->k, problems);
			bad++;
		}
	}
out:
	behind_undo();
	if (bad && detach_mode)
		fprintf(out,
			"crash point %zu%s: current header: detached %u; "
			"detach returned at %zu, attach began at %zu, returned "
			"at %zu\n",
			cr->k, cr->kill ? " (kill)" : "", dstate, detach_done,
			attach_begin, devlife_done);
	if (bad) {
		check_failures += bad;
		failed_states++;
	}
out_close:
	if (add_mode == 2)
		cfg->ndevs = 2;
	if (mirror_mode && strcmp(cfg->meta_paths[1], "m1")) {
		free(cfg->meta_paths[1]); /* the configuration names m1 */
		cfg->meta_paths[1] = strdup("m1");
	}
	fclose(devnull);
	for (d = 0; d < 3; d++)
		dev_close(all[d]);
	for (d = 0; d < 2 + mirror_mode; d++)
		pm_unmap(&r[d]);
}

/* ---------------------------------------------------------- the run */

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
	cfg->high_wm = nthreads > 1 ? 30 : 40;
	cfg->low_wm = nthreads > 1 ? 10 : 20;
	cfg->threads = nthreads > 1 ? 3 : 1;
	cfg->max_files = 64;
	cfg->dirty_copies = copies;
	cfg->identity = ident_mode;
	cfg->mode = cache_mode;
	if (around_mode)
		cfg->write_around = cfg->high_wm;
	if (add_mode) {
		cfg->ndevs = add_mode == 1 ? 3 : 2;
		cfg->dev_paths[2] = strdup(add_mode == 1 ? "spare" : "rec2");
	}
}

static int is_boundary(const struct rec_event *e)
{
	switch (e->kind) {
	case REC_DEV_FLUSH:
	case REC_DEV_FLUSH_BEGIN:
	case REC_PM_PERSIST:
	case REC_PM_PAGE_BEGIN:
	case REC_PM_PAGE_END:
	case REC_BK_SYNC:
	case REC_BK_SYNC_BEGIN:
		return 1;
	case REC_DEV_WRITE:
		return e->fua;
	default:
		return 0;
	}
}

static void dump_events(const char *range)
{
	static const char *const kn[] = { "devw",    "flush", "persist",
					  "mark",    "bkw",   "bktrunc",
					  "bksync",  "pagew", "pagedone",
					  "bksync0", "flush0" };
	size_t a = 0, b = 0, j;

	if (sscanf(range, "%zu-%zu", &a, &b) < 2)
		b = a + 100;
	for (j = a; j < b && j < nev; j++) {
		const struct rec_event *e = ev(j);

		if (debug > 1 && e->kind == REC_PM_PERSIST)
			continue;
		fprintf(out, "  %zu t%d %s target %d off %llu len %u%s\n", j,
			e->thread, kn[e->kind], e->target,
			(unsigned long long)e->off, e->len,
			e->fua ? " fua" : "");
	}
	for (j = 0; j < (size_t)nincs && !debug; j++)
		fprintf(out, "  inc %zu %s ino %d\n", j, incs[j].name,
			(int)incs[j].ino);
}

static int env_int(const char *name, int def);

static int size_cmp(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;

	return x < y ? -1 : x > y;
}

static int run_seed(unsigned s)
{
	struct cache_config cfg;
	struct dev *devs[3] = { 0 };
	struct pm_region r[2];
	char err[CFG_ERRLEN], held[160] = "";
	size_t *points, npoints = 0, j, nkill = 0, nlost = 0, nstates = 0;
	size_t limit = getenv("NVC_CRASH_POINTS")
			       ? strtoul(getenv("NVC_CRASH_POINTS"), NULL, 0)
			       : 0;
	pthread_t th[16];
	uint8_t *img;
	char *m1_name;
	int d, i, t, ret, failures0 = check_failures;
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	seed = s;
	mseed = s * 2654435761u + 7;
	memset(ops, 0, sizeof(ops));
	nops = 0;
	nincs = 0;
	failed_states = 0;
	strcpy(dir, "/tmp/nvc-crash-XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	backing_fd = open(dir, O_RDONLY | O_DIRECTORY);
	rec_log_new(&L);
	config(&cfg);
	m1_name = cfg.meta_paths[1]; /* a mirror replace leaves it allocated */
	devsize = SB_DATA_OFF + SLOTS_PER_DEV * BS;
	for (d = 0; d < 2 + (replace_mode || add_mode); d++)
		dev_rec_create(L, d, devsize, &devs[d]);
	new_dev = devs[2];
	replaced = removed_ok = added_ok = reattached = devs_gone = 0;
	mirrored_ok = 0;
	n_detaching = n_detached = n_torn = 0;
	n_mrec = n_mtorn = n_newcfg = n_followed = 0;
	{
		/* with a spare place: none at format, a stand-in at open */
		struct dev *fdevs[3] = { devs[0], devs[1], NULL };

		spare_standin = NULL;
		if (add_mode == 1)
			dev_missing_create("spare", devsize, &spare_standin);
		mlen = fmt_meta_len(&cfg, fdevs, cfg.ndevs);
		for (d = 0; d < 2; d++)
			(blk ? pm_rec_create_blk : pm_rec_create)(L, d, mlen,
								  &r[d]);
		if (mirror_mode) {
			pm_rec_create(L, 2, mlen, &new_mirror);
			/* told apart as files are (devid_place_is) */
			new_mirror.created_ino = 3;
		}
		ret = fmt_format_open(&cfg, fdevs, cfg.ndevs, r, err,
				      sizeof(err));
		fdevs[2] = spare_standin;
		if (!ret)
			ret = cache_open_devs(&cfg, fdevs, cfg.ndevs, r,
					      backing_fd, &C, err, sizeof(err));
	}
	if (ret) {
		fprintf(out, "%s\n", err);
		check_failures++;
		rmdir(dir);
		return 1;
	}
	cache_set_bk_hooks(C, &hooks);
	race_state = RACE_OFF;
	race_held = devlife_over = 0;
	if (replace_mode)
		C->test_committing = race_commit;
	__atomic_store_n(&recording, 1, __ATOMIC_RELEASE);
	opened = rec_log_add(L, REC_MARK, -1, 0, NULL, 0, 0);
	for (i = 0; i < NSLOTF; i++) {
		pthread_rwlock_init(&fslots[i].lock, NULL);
		fslots[i].cur = inc_create(i, 0);
	}
	for (t = 0; t < nthreads; t++)
		pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
	for (t = 0; t < nthreads; t++)
		pthread_join(th[t], NULL);
	if (race_held)
		pthread_join(devlife_thread, NULL);
	C->test_committing = NULL;
	nops_max = nops < MAXOPS ? nops : MAXOPS;
	cache_abandon(C); /* the power goes */
	if (mirrored_ok) { /* the configuration still names m1 */
		free(cfg.meta_paths[1]); /* "m2" */
		cfg.meta_paths[1] = m1_name;
	}
	__atomic_store_n(&recording, 0, __ATOMIC_RELEASE);

	model_build();
	check_reads();
	index_events();
	devlife_check();

	if (getenv("NVC_CRASH_DUMP"))
		dump_events(getenv("NVC_CRASH_DUMP"));
	if (debug > 2)
		for (i = 0; i < nops_max; i++)
			fprintf(out,
				"  op %d %s %s off %llu len %llu events "
				"%zu..%zu\n",
				i, op_names[ops[i].kind], incs[ops[i].inc].name,
				(unsigned long long)ops[i].off,
				(unsigned long long)ops[i].len, ops[i].start,
				ops[i].end);

	/* crash points: both sides of every flush, FUA write, persist, page
	 * write and backing sync; after every op; and at random */
	points = malloc((3 * nev + 64) * sizeof(size_t));
	for (j = opened; j < nev; j++) {
		const struct rec_event *e = ev(j);

		if (is_boundary(e)) {
			points[npoints++] = j;
			points[npoints++] = j + 1;
		} else if (e->kind == REC_MARK && e->target >= 0 &&
			   (e->off == 1 || e->off == 3)) {
			points[npoints++] = j + 1;
		}
	}
	for (j = 0; j < nev / 50 + 10; j++)
		points[npoints++] = opened + 1 + rnd() % (nev - opened);
	points[npoints++] = nev;
	qsort(points, npoints, sizeof(size_t), size_cmp);
	for (i = 0, j = 0; j < npoints; j++)
		if (!i || points[j] != points[i - 1])
			points[i++] = points[j];
	npoints = i;
	if (limit && limit < npoints) {
		/* a quick run: a random sample, and up to WINDOW_KEEP points
		 * spread evenly over the device-life operation's own events,
		 * so that a sample is sure to crash inside its window however
		 * the threads interleaved (a random 400 of ~1,200 missed a
		 * replace-mirror's few persists now and then) */
		size_t keep[WINDOW_KEEP], nkeep = 0, w0 = npoints, w1 = 0;

		for (j = 0; j < npoints; j++)
			if (points[j] > devlife_begin &&
			    points[j] <= devlife_done) {
				w0 = j < w0 ? j : w0;
				w1 = j + 1;
			}
		for (j = 0; w1 > w0 && j < WINDOW_KEEP && j < w1 - w0; j++)
			keep[nkeep++] = points[w0 + j * (w1 - w0) /
						      (w1 - w0 < WINDOW_KEEP
							       ? w1 - w0
							       : WINDOW_KEEP)];
		for (j = 0; j < limit; j++) {
			size_t x = j + rnd() % (npoints - j), tmp = points[j];

			points[j] = points[x];
			points[x] = tmp;
		}
		npoints = limit;
		for (j = 0; j < nkeep; j++)
			points[npoints++] = keep[j];
		qsort(points, npoints, sizeof(size_t), size_cmp);
		for (i = 0, j = 0; j < npoints; j++)
			if (!i || points[j] != points[i - 1])
				points[i++] = points[j];
		npoints = i;
	}

	if (getenv("NVC_CRASH_AT")) {
		points[0] = strtoul(getenv("NVC_CRASH_AT"), NULL, 0);
		npoints = 1;
	}
	img = malloc(IMG);
	for (j = 0; j < npoints; j++) {
		struct crash cr = { points[j], 0, LOSE_NONE, 0, 0 };
		const struct rec_event *prev = ev(points[j] - 1);

		if (copies > 1 && rnd() % 2) {
			cr.lose = 1 + rnd() % 4;
			cr.lose_dev = rnd() % 2;
		}
		if (getenv("NVC_CRASH_LOSE")) /* DEV:HOW, HOW 0 none 1 missing
						 2 EIO 3 garbage 4 zeros */
			sscanf(getenv("NVC_CRASH_LOSE"), "%d:%d", &cr.lose_dev,
			       &cr.lose);
		nlost += cr.lose != LOSE_NONE;
		crash_check(&cfg, &cr, img);
		nstates++;
		/* the kill -9 state: after every op, and now and then; with
		 * NVC_CRASH_DETACH after every header persist too, so that
		 * each state between the two mirrors' persists of a header
		 * field comes whole: the second mirror's copy not begun */
		cr.whole = (detach_mode || mirror_mode) &&
			   prev->kind == REC_PM_PERSIST && prev->off == 0;
		if (((prev->kind == REC_MARK && prev->target >= 0 &&
		      (prev->off == 1 || prev->off == 3)) ||
		     rnd() % 4 == 0 || getenv("NVC_CRASH_AT") || cr.whole) &&
		    env_int("NVC_CRASH_KILL", 1)) {
			cr.kill = 1;
			cr.lose = LOSE_NONE;
			crash_check(&cfg, &cr, img);
			nkill++;
			nstates++;
		}
		if (check_failures - failures0 > 20) {
			fprintf(out, "too many failures; stopping\n");
			break;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (race_held)
		snprintf(held, sizeof(held),
			 ", replaced while a commit was held %d ms", race_ms);
	if (detach_mode)
		snprintf(held, sizeof(held),
			 ", detached at event %zu, attached %zu..%zu; %zu "
			 "states detaching, %zu detached, %zu torn",
			 detach_done, attach_begin, devlife_done, n_detaching,
			 n_detached, n_torn);
	/* each kind came, the torn one too: sure when every crash point is
	 * taken (both sides of each persist, the attach's FUA writes while
	 * still detached); a sanitizer build samples them, and only the
	 * detach's long destage is sure to be hit */
	if (detach_mode)
		CHECK(n_detaching && (limit || (n_detached && n_torn)));
	if (mirror_mode) {
		snprintf(held, sizeof(held),
			 ", mirror 1 replaced at event %zu; %zu states "
			 "replacing, %zu torn, %zu on the new mirror, %zu "
			 "followed to it",
			 devlife_done, n_mrec, n_mtorn, n_newcfg, n_followed);
		CHECK(mirrored_ok && n_mrec && n_followed &&
		      (limit || (n_mtorn && n_newcfg)));
	}
	fprintf(out,
		"seed %u: %d threads, %d copies%s%s: %d ops, %d files, %zu "
		"events, %zu crash points, %zu states (%zu kill -9, %zu with a "
		"device lost), %d failed, %.1f s\n",
		s, nthreads, copies, blk ? ", block-device mirrors" : "", held,
		nops_max, nincs, nev, npoints, nstates, nkill, nlost,
		failed_states,
		(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
	fflush(out);

	free(img);
	free(points);
	free(next_flush);
	free(page_end);
	for (i = 0; i < nincs; i++) {
		if (!incs[i].unlinked)
			close(incs[i].fd);
		free(incs[i].ops);
		free(incs[i].syncs);
		free(incs[i].wo);
		free(incs[i].wl);
	}
	for (j = 0; j < (size_t)nops_max; j++)
		free(ops[j].rdata);
	while (nheld)
		close(held_fds[--nheld]);
	if (replaced) { /* the replace closed the old one */
		devs[1] = devs[2];
		devs[2] = NULL;
	}
	if (removed_ok) /* so did the remove, for the stand-in it made */
		devs[1] = NULL;
	for (d = 0; d < 2 && devs_gone; d++) /* and the detach */
		devs[d] = live_devs[d];
	if (!added_ok) /* the add closed the spare place's stand-in */
		dev_close(spare_standin);
	if (mirrored_ok) { /* the replace unmapped the old mirror 1 */
		r[1] = new_mirror;
	} else if (mirror_mode) {
		pm_unmap(&new_mirror);
	}
	for (d = 0; d < 3; d++)
		dev_close(devs[d]);
	for (d = 0; d < 2; d++)
		pm_unmap(&r[d]);
	close(backing_fd);
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		(void)!system(cmd);
	}
	rec_log_free(L);
	L = NULL;
	cfg_free(&cfg);
	return check_failures != failures0;
}

static int env_int(const char *name, int def)
{
	const char *v = getenv(name);

	return v && *v ? atoi(v) : def;
}

int main(void)
{
	unsigned s0, s1, s;
	const char *seeds = getenv("NVC_CRASH_SEEDS");

	out = fdopen(dup(2), "w");
	setvbuf(out, NULL, _IOLBF, 0);
	if (!getenv("NVC_CRASH_VERBOSE") && !freopen("/dev/null", "w", stderr))
		return 1;
	log_setup(LOG_TO_STDERR);
	nthreads = env_int("NVC_CRASH_THREADS", 1);
	if (nthreads < 1 || nthreads > 16)
		nthreads = 1;
	copies = env_int("NVC_CRASH_COPIES", 1);
	blk = env_int("NVC_CRASH_BLK", 0);
	debug = env_int("NVC_CRASH_DEBUG", 0);
	hold_inodes = env_int("NVC_CRASH_HOLD_INODES", 0);
	ident_mode = env_int("NVC_CRASH_IDENT", IDENT_AUTO);
	behind = env_int("NVC_CRASH_BEHIND", 0);
	replace_mode = !!env_int("NVC_CRASH_REPLACE", 0);
	remove_mode = !!env_int("NVC_CRASH_REMOVE", 0);
	detach_mode = !!env_int("NVC_CRASH_DETACH", 0);
	mirror_mode = !!env_int("NVC_CRASH_MIRROR", 0);
	add_mode = env_int("NVC_CRASH_ADD", 0);
	cache_mode = env_int("NVC_CRASH_MODE", 0);
	around_mode = env_int("NVC_CRASH_AROUND", 0);
	total_ops = env_int("NVC_CRASH_OPS", total_ops);
	s0 = s1 = env_int("NVC_CRASH_SEED", 12345);
	if (seeds && sscanf(seeds, "%u-%u", &s0, &s1) < 2)
		s1 = s0;
	rbuf = dev_alloc_buf(512 * KiB + 4 * NVC_PAGE);
	for (s = s0; s <= s1; s++) {
		fprintf(out,
			"seed %u (NVC_CRASH_SEED=%u NVC_CRASH_THREADS=%d "
			"NVC_CRASH_COPIES=%d NVC_CRASH_BLK=%d "
			"NVC_CRASH_IDENT=%d NVC_CRASH_BEHIND=%d "
			"NVC_CRASH_REPLACE=%d)\n",
			s, s, nthreads, copies, blk, ident_mode, behind,
			replace_mode);
		run_seed(s);
	}
	free(rbuf);
	return check_failures
		       ? (fprintf(out, "%d check(s) failed\n", check_failures),
			  1)
		       : 0;
}
