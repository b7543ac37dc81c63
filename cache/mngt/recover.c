/* cache: opening a cache — superblock checks, rebuilding the map from the
 * mirrors, closing. */
#define _GNU_SOURCE
#include "mngt.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

/*
 * Recovery never needs the backing store to agree with the cache first.  It
 * reads every file record and slot entry from both mirrors, keeps the newer
 * valid copy, rewrites the other mirror where they differ, and then opens
 * each file by its handle: a file that no longer exists (ESTALE: deleted, or
 * its inode recycled) loses its cached data; one whose backing copy changed
 * behind the cache's back keeps its dirty pages but loses its clean ones.
 */
static int mirrors_differ(struct meta *m, uint64_t off, size_t len)
{
	return memcmp((char *)m->r[0].addr + off, (char *)m->r[1].addr + off,
		      len) != 0;
}

/*
 * The backing file of f has a descriptor (at mount, or later for one that
 * could not be opened at mount): check it against the record.  Nobody touched
 * it since the cache last saw it (same mtime): the record is the truth, and a
 * truncate cut short by a crash (size recorded, backing file not yet cut or
 * grown) is finished, durably: the record may go once the file has no cached
 * data, and then the backing file's size is all there is; what lies between
 * the two sizes and is not cached reads as zeros either way.  The same holds
 * when the record says the cache was changing the backing file (MF_BK_BUSY:
 * a destage or truncate under way), whatever its mtime.  Changed behind
 * the cache's back: its clean data goes, its dirty data stays; with nothing
 * dirty the backing copy wins.  Nothing cached past the size may come back.
 * f->rw held for writing (recovery too).
 */
void file_check_backing(struct cache *c, struct cfile *f)
{
	struct stat st;
	struct list *l;
	uint64_t mt;

	cache_may_block(c);
	if (fstat(f->fd, &st))
		return;
	f->dev = st.st_dev;
	file_bsize_found(f, st.st_size);
	mt = st.st_mtim.tv_sec * 1000000000ull + st.st_mtim.tv_nsec;
	if (f->bk_busy) {
		/* the cache itself was changing it when it stopped */
		mt = f->bk_mtime_ns;
		f->bk_busy = 0;
	}
	if (mt == f->bk_mtime_ns && (uint64_t)st.st_size != f->size) {
		cache_may_block(c);
		if (ftruncate(f->fd, f->size) || fsync(f->fd))
			log_msg(LOG_ERR,
				"recovery: cannot truncate backing file (inode "
				"%llu) to %llu: %s",
				(unsigned long long)f->ino,
				(unsigned long long)f->size, strerror(errno));
		else
			file_bsize_found(f, f->size);
	} else if (mt != f->bk_mtime_ns) {
		log_msg(f->ndirty ? LOG_WARNING : LOG_NOTICE,
			"recovery: backing file (inode %llu) changed behind the "
			"cache's back; %s",
			(unsigned long long)f->ino,
			f->ndirty ? "keeping its dirty data, dropping clean data"
				  : "dropping its clean cached data");
		pthread_mutex_lock(&c->lock);
		for (l = f->slots.next; l != &f->slots;) {
			struct cslot *s = list_entry(l, struct cslot, flink);

			l = l->next;
			if (s->state == SLOT_CLEAN && !s->pins)
				slot_drop_locked(c, s);
		}
		if (!f->ndirty)
			f->size = st.st_size;
		cache_unlock(c);
		if (f->ndirty)
			coh_recovery_conflict(c, f, &st);
	}
	cache_may_block(c);
	if (!fstat(f->fd, &st)) {
		mt = ts_ns(&st.st_mtim);
		f->bk_ctime_ns = ts_ns(&st.st_ctim);
	}
	f->bk_mtime_ns = mt;
	if (f->nslots)
		file_trim(c, f, f->size);
}

/*
 * Open a recovered file by handle or by path (ident.c).  Not found (-ESTALE:
 * deleted, renamed or replaced behind the cache's back, or a handle gone
 * stale): nothing proves its data unwanted, so its dirty data goes to
 * lost+found and the file is forgotten.  Unopenable for another reason (EIO,
 * EPERM, ENOMEM): it keeps everything and waits, findable by inode, for an
 * open through the mount or a later destage to give it a descriptor
 * (bk_missing).
 */
static void recover_file_open(struct cache *c, struct cfile *f)
{
	int fd = ident_open(c, f, O_RDWR);

	if (fd == -ESTALE) {
		log_msg(LOG_INFO,
			"recovery: backing file %s (inode %llu) cannot be "
			"found",
			f->path ? f->path : "(no path)",
			(unsigned long long)f->ino);
		if (!salvage_lost(c, f)) {
			f->unlinked = 1;
			return;
		}
		fd = -EIO;
	}
	if (fd < 0) {
		log_msg(LOG_ERR,
			"recovery: cannot open backing file %s (inode %llu): "
			"%s; its data stays in the cache until it can be "
			"opened",
			f->path ? f->path : "(no path)",
			(unsigned long long)f->ino, strerror(-fd));
		f->bk_missing = 1;
		f->dev = c->backing_dev;
		return;
	}
	f->fd = fd;
	file_check_backing(c, f);
}

/* What recovery found and mended, across its steps. */
struct rstate {
	uint64_t maxseq; /* past every record's sequence on the media */
	uint64_t fixed; /* records rewritten to agree in both mirrors */
	uint64_t bad; /* damaged copies found */
	struct rtwin {
		uint64_t idx;
		struct meta_slot ms;
	} *twins; /* second copies, linked once every slot is in */
	uint64_t ntwins;
};

/* Step 1: the file records, each mended where the mirrors differ, become
 * file objects (not hashed yet); the free records listed. */
static int recover_records(struct cache *c, struct rstate *rs, char *err,
			   size_t errlen)
{
	struct meta *m = &c->meta;
	uint32_t r;
	int bad;

	for (r = 0; r < m->nfiles; r++) {
		struct meta_file mf;
		struct cfile *f;

		if (!meta_get_file(m, r, &mf, &bad)) {
			char why[320];

			meta_file_why(m, r, why, sizeof(why));
			snprintf(err, errlen,
				 "metadata file record %u is damaged in both "
				 "mirrors (%s)",
				 r, why);
			return -EUCLEAN;
		}
		rs->bad += bad;
		if (mf.seq >= rs->maxseq)
			rs->maxseq = mf.seq + 1;
		if (bad ||
		    mirrors_differ(m,
				   m->files_off + (uint64_t)r * META_FILE_SIZE,
				   META_FILE_SIZE)) {
			if (mf.flags & MF_USED) {
				meta_put_file(m, r, &mf);
			} else {
				memset(&mf, 0, sizeof(mf));
				meta_put_file(m, r, &mf);
			}
			rs->fixed++;
		}
		if (!(mf.flags & MF_USED)) {
			c->free_recs[c->nfree_recs++] = r;
			continue;
		}
		if (mf.size > c->max_file_size) {
			/* the cache refuses such writes: destage could never
			 * write these blocks, and flush would wait for ever */
			snprintf(err, errlen,
				 "metadata file record %u (inode %llu): size "
				 "%llu is past the largest file the backing "
				 "file system holds (%llu)",
				 r, (unsigned long long)mf.ino,
				 (unsigned long long)mf.size,
				 (unsigned long long)c->max_file_size);
			return -EUCLEAN;
		}
		f = file_new();
		if (!f) {
			return -ENOMEM;
		}
		f->rec = r + 1;
		f->ino = mf.ino;
		f->size = f->psize = mf.size;
		file_bsize_found(f, mf.bk_size);
		f->bk_mtime_ns = mf.bk_mtime_ns;
		f->bk_busy = !!(mf.flags & MF_BK_BUSY);
		/* deleted while open, and then the crash: its data goes */
		f->unlinked = !!(mf.flags & MF_UNLINKED);
		if (mf.flags & MF_PINNED) {
			/* before its slots settle: they go on the pinned list */
			f->pinned = 1;
			list_add_tail(&c->pinned_files, &f->plink);
		}
		f->bk_ctime_ns = mf.bk_ctime_ns;
		f->hbytes = mf.handle_bytes;
		f->htype = mf.handle_type;
		memcpy(f->handle, mf.handle, mf.handle_bytes);
		memcpy(f->stamp, mf.stamp, sizeof(f->stamp));
		if (mf.path_len && !(f->path = strdup(mf.path))) {
			free(f);
			return -ENOMEM;
		}
		c->recs[r] = f;
	}
	/* free records are handed out lowest first */
	for (r = 0; r < c->nfree_recs / 2; r++) {
		uint32_t t = c->free_recs[r];

		c->free_recs[r] = c->free_recs[c->nfree_recs - 1 - r];
		c->free_recs[c->nfree_recs - 1 - r] = t;
	}
	return 0;
}

/* Step 2: every slot entry, mended where the mirrors differ, onto its file
 * (valid and dirty pages, the block map) or free; second copies kept aside
 * for step 3.  Two slots for one block refuse the mount. */
static int recover_slots(struct cache *c, struct rstate *rs, char *err,
			 size_t errlen)
{
	struct meta *m = &c->meta;
	uint64_t i;
	uint32_t r;
	int bad;

	for (i = 0; i < c->nslots; i++) {
		struct cslot *s = &c->slots[i];
		struct meta_slot ms;
		struct cfile *f;

		if (!meta_get_slot(m, i, &ms, &bad)) {
			/* both copies torn: the slot's data cannot be trusted
			 */
			char why[320];

			meta_slot_why(m, i, why, sizeof(why));
			log_msg(LOG_ERR,
				"recovery: slot %llu damaged in both mirrors "
				"(%s); dropped",
				(unsigned long long)i, why);
			memset(&ms, 0, sizeof(ms));
			bad = 1;
		}
		rs->bad += bad;
		if (ms.seq >= rs->maxseq)
			rs->maxseq = ms.seq + 1;
		if (ms.file && (ms.flags & SLOT_F_TWIN)) {
			/* linked to its slot once every slot is in */
			if (bad ||
			    mirrors_differ(m, m->slots_off + i * m->slot_size,
					   m->slot_size)) {
				meta_put_slot(m, i, &ms);
				rs->fixed++;
			}
			rs->twins[rs->ntwins].idx = i;
			rs->twins[rs->ntwins++].ms = ms;
			continue;
		}
		f = ms.file && ms.file <= m->nfiles ? c->recs[ms.file - 1]
						    : NULL;
		if (ms.file && (!f || !bm_any(ms.valid))) {
			/* no owner, or nothing valid: the slot is free */
			memset(&ms, 0, sizeof(ms));
			f = NULL;
			bad = 1;
		}
		if (bad || mirrors_differ(m, m->slots_off + i * m->slot_size,
					  m->slot_size)) {
			meta_put_slot(m, i, &ms);
			rs->fixed++;
		}
		if (!f) {
			slot_settle(c, s);
			continue;
		}
		s->file = ms.file;
		s->blk = ms.blk;
		pb_put(c, slot_valid(c, s), ms.valid);
		pb_put(c, slot_dirty(c, s), ms.dirty);
		/* dirty implies valid */
		for (r = 0; r < c->pbytes; r++)
			slot_valid(c, s)[r] |= slot_dirty(c, s)[r];
		s->persisted = 1;
		pb_copy(c, slot_pvalid(c, s), slot_valid(c, s));
		if (slot_find(c, s->file, s->blk)) {
			/* two slots for one block cannot come from our writes
			 */
			snprintf(err, errlen,
				 "metadata maps block %llu of file record %u "
				 "twice (slots %llu and %llu)",
				 (unsigned long long)s->blk, s->file - 1,
				 (unsigned long long)(slot_find(c, s->file,
								s->blk) -
						      c->slots),
				 (unsigned long long)i);
			return -EUCLEAN;
		}
		slot_hash_add(c, s);
		list_add_tail(&f->slots, &s->flink);
		f->nslots++;
		pages_valid(c, s, (int64_t)(pb_count(c, slot_valid(c, s))));
		if (pb_any(c, slot_dirty(c, s))) {
			pages_dirty(c, s,
				    (int64_t)(pb_count(c, slot_dirty(c, s))));
			file_mark_dirty(c, f, s);
		}
		s->state = SLOT_FRESH;
		slot_settle(c, s);
	}
	return 0;
}

/* Step 3: a second copy joins its slot if the slot is dirty and has none;
 * else it is not needed, and freed. */
static void recover_twins(struct cache *c, struct rstate *rs)
{
	struct meta *m = &c->meta;
	uint64_t i;

	for (i = 0; i < rs->ntwins; i++) {
		struct cslot *t = &c->slots[rs->twins[i].idx];
		struct cslot *p =
			slot_find(c, rs->twins[i].ms.file, rs->twins[i].ms.blk);

		if (p && !p->twin && pb_any(c, slot_dirty(c, p))) {
			t->file = rs->twins[i].ms.file;
			t->blk = rs->twins[i].ms.blk;
			pb_put(c, slot_valid(c, t), rs->twins[i].ms.valid);
			pb_put(c, slot_dirty(c, t), rs->twins[i].ms.dirty);
			t->is_twin = 1;
			t->persisted = 1;
			t->state = SLOT_FRESH;
			p->twin = rs->twins[i].idx + 1;
			c->ntwins++;
		} else {
			/* its slot is clean or gone: the copy is not needed */
			struct meta_slot z;

			memset(&z, 0, sizeof(z));
			meta_put_slot(m, rs->twins[i].idx, &z);
			slot_settle(c, t);
		}
	}
}

/* Step 4: each file's backing file opened and checked against its record
 * (f->rw held: the pin and wgen rules hold at mount too), the objects
 * hashed, and descriptors nobody uses closed. */
static void recover_backing(struct cache *c)
{
	struct meta *m = &c->meta;
	uint32_t r;

	for (r = 0; r < m->nfiles; r++) {
		struct cfile *f = c->recs[r];

		if (!f)
			continue;
		if (!f->unlinked) {
			/* alone, but the pin rule (map.c) and the drops'
			 * f->wgen rule (coherence.c) hold at mount too */
			frw_wrlock(f);
			recover_file_open(c, f);
			frw_unlock(f);
		}
		log_msg(LOG_DEBUG,
			"recovery: record %u inode %llu size %llu backing %llu "
			"slots %llu dirty %llu%s",
			r, (unsigned long long)f->ino,
			(unsigned long long)f->size,
			(unsigned long long)f->bsize,
			(unsigned long long)f->nslots,
			(unsigned long long)f->ndirty,
			f->unlinked ? " dropped" : "");
		file_hash_add(c, f);
		f->refs = 1;
		file_put_locked(c, f);
	}
	/* files wait for their next open or destage without a descriptor
	 * (see cache_file_put) */
	for (r = 0; r < c->meta.nfiles; r++) {
		struct cfile *f = c->recs[r];

		if (f && !f->refs && f->fd >= 0) {
			close(f->fd);
			f->fd = -1;
		}
	}
}

int recover_load(struct cache *c, char *err, size_t errlen)
{
	struct meta *m = &c->meta;
	struct rstate rs = { 0 };
	uint32_t r;
	int ret;

	rs.twins = calloc(c->nslots ? c->nslots : 1, sizeof(*rs.twins));
	if (!rs.twins)
		return -ENOMEM;
	/*
	 * What recovery rewrites must be newer than every copy on the media:
	 * a crash between its write of one mirror and of the other must not
	 * let the older copy win.
	 */
	m->seq = meta_next_seq(m);
	ret = recover_records(c, &rs, err, errlen);
	if (!ret)
		ret = recover_slots(c, &rs, err, errlen);
	if (ret)
		goto err_files;
	recover_twins(c, &rs);
	free(rs.twins);
	rs.twins = NULL;
	if (rs.maxseq > m->seq)
		m->seq = rs.maxseq;
	c->meta_repaired = rs.fixed;
	if (rs.fixed)
		log_msg(LOG_NOTICE,
			"recovery: %llu metadata records differed between the "
			"mirrors (%llu damaged copies); both mirrors rewritten "
			"to agree",
			(unsigned long long)rs.fixed,
			(unsigned long long)rs.bad);
	ret = ident_store_check(c, err, errlen);
	if (ret)
		goto err_files;
	recover_backing(c);
	return 0;
err_files:
	/* refused before any file was hashed: cache_free would not see them */
	for (r = 0; r < m->nfiles; r++) {
		if (c->recs[r])
			free(c->recs[r]->path);
		free(c->recs[r]);
		c->recs[r] = NULL;
	}
	free(rs.twins);
	return ret;
}

/*
 * The largest file the backing file system can hold, found once on an unnamed
 * temporary file, so that a write the backing store could never take is
 * refused at once instead of staying dirty in the cache for ever.
 */
static uint64_t probe_max_file_size(int dirfd)
{
	uint64_t lo = 0, hi = INT64_MAX;
	int fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

	if (fd < 0)
		return INT64_MAX; /* no O_TMPFILE: the backing store will say */
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo + 1) / 2;

		if (ftruncate(fd, mid))
			hi = mid - 1;
		else
			lo = mid;
	}
	close(fd);
	return lo;
}

void cache_slot_init(struct cache *c, uint64_t i)
{
	srw_init(&c->slots[i].rw);
	c->slots[i].link.prev = c->slots[i].link.next = i;
	list_init(&c->slots[i].flink);
	c->slots[i].state = SLOT_FRESH;
}

static int cache_alloc(struct cache *c)
{
	uint64_t i, hsize = 1;

	/* for room: pages past nslots stay untouched until a grow uses them */
	c->slots = calloc(c->meta.layout.room, sizeof(*c->slots));
	c->pbytes = (c->ppb + 7) / 8;
	c->pbits = calloc(c->meta.layout.room * SB_NBITS, c->pbytes);
	/* one bucket a slot or more: chains of one or two on average */
	while (hsize < c->nslots)
		hsize <<= 1;
	c->shash = calloc(hsize, sizeof(*c->shash));
	c->smask = hsize - 1;
	for (hsize = 1; hsize < c->meta.nfiles * 2ull; hsize <<= 1)
		;
	c->fhash = calloc(hsize, sizeof(*c->fhash));
	c->fmask = hsize - 1;
	c->recs = calloc(c->meta.nfiles, sizeof(*c->recs));
	c->free_recs = calloc(c->meta.nfiles, sizeof(*c->free_recs));
	c->freeing_recs = calloc(c->meta.nfiles, sizeof(*c->freeing_recs));
	if (!c->slots || !c->pbits || !c->shash || !c->fhash || !c->recs ||
	    !c->free_recs || !c->freeing_recs)
		return -ENOMEM;
	for (i = 0; i < NVC_MAX_DEVS; i++)
		pthread_mutex_init(&c->dsync[i].lock, NULL);
	for (i = 0; i < c->nslots; i++)
		cache_slot_init(c, i);
	for (i = 0; i < SL_NHEADS; i++)
		slot_list_init(c, i);
	list_init(&c->pinned_files);
	list_init(&c->dirty_files);
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->freeq_lock, NULL);
	pthread_mutex_init(&c->rate_lock, NULL);
	pthread_mutex_init(&c->stats_lock, NULL);
	pthread_cond_init(&c->space_cond, NULL);
	pthread_cond_init(&c->around_cond, NULL);
	pthread_cond_init(&c->destage_cond, NULL);
	pthread_cond_init(&c->flush_cond, NULL);
	return 0;
}

static void cache_free(struct cache *c)
{
	uint64_t i;

	if (c->fhash) {
		for (i = 0; i <= c->fmask; i++) {
			struct cfile *f = c->fhash[i], *n;

			for (; f; f = n) {
				n = f->hnext;
				bks_detach(c, f);
				if (f->fd >= 0)
					close(f->fd);
				free(f->path);
				free(f);
			}
		}
	}
	if (c->slots)
		for (i = 0; i < c->nslots; i++)
			assert(!srw_held(&c->slots[i].rw));
	for (i = 0; i < (uint64_t)c->ndevs; i++)
		if (c->devs[i]) {
			dev_set_observer(c->devs[i], NULL, NULL, 0);
			dev_set_nolock(c->devs[i], NULL);
		}
	bks_pool_free(c);
	stat_store_free(&c->stats);
	free(c->stats_base);
	free(c->slots);
	free(c->pbits);
	free(c->shash);
	free(c->fhash);
	free(c->recs);
	free(c->free_recs);
	free(c->freeing_recs);
	for (int d = 0; d < c->ndevs; d++)
		if (c->own_devs || (c->made_devs >> d & 1))
			dev_close(c->devs[d]);
	if (c->own_devs) {
		pm_unmap(&c->meta.r[0]);
		pm_unmap(&c->meta.r[1]);
	}
	for (i = 0; i < NVC_MAX_DEVS; i++)
		free(c->grown_names[i]);
	free(c->root);
	free(c);
}

/*
 * A device lost at mount is fenced off: marked failed, and every I/O to it
 * fails at once without touching it, so that whatever it holds (nothing, or
 * another disk's bytes) is never read as cache data: clean pages come from
 * the backing file, dirty ones from their second copies.
 */
static void dev_fence(struct cache *c, int d, int state)
{
	c->dev_failed[d] = state;
	dev_faults(c->devs[d])->fail_reads = -ENODEV;
	dev_faults(c->devs[d])->fail_writes = -ENODEV;
}

/* The checks of a readable superblock sb of dev, listed at index d. */
static int sb_matches(struct cache *c, const struct sb_disk *sb,
		      struct dev *dev, int d, char *err, size_t errlen)
{
	uint64_t per = member_slots(c, d);
	uint32_t sbn = layout_sb_ndevs(&c->meta.layout, d);
	const char *p = dev_path(dev);

	if (memcmp(sb->set_uuid, c->meta.set_uuid, 16)) {
		snprintf(err, errlen,
			 "%s belongs to another cache than the metadata "
			 "mirrors; check cache.devices and "
			 "cache.metadata",
			 p);
		return -EINVAL;
	}
	if (sb->dev_index != (uint32_t)d || sb->ndevs != sbn) {
		snprintf(err, errlen,
			 "%s was formatted as device %u of %u, but "
			 "cache.devices lists it as %d of %d (of %u)",
			 p, sb->dev_index + 1, sb->ndevs, d + 1, c->ndevs, sbn);
		return -EINVAL;
	}
	if (sb->block_size != c->bs) {
		snprintf(err, errlen,
			 "%s was formatted with block size %u, but "
			 "cache.block_size is %u",
			 p, sb->block_size, c->bs);
		return -EINVAL;
	}
	if (sb->slots_per_dev != per) {
		snprintf(err, errlen,
			 "%s: superblock slots_per_dev %llu, but the "
			 "metadata gives member %d %llu slots",
			 p, (unsigned long long)sb->slots_per_dev, d + 1,
			 (unsigned long long)per);
		return -EINVAL;
	}
	/* sb_check: per * bs + SB_DATA_OFF fits dev_size, no wrap */
	if (dev_size(dev) < SB_DATA_OFF + per * c->bs) {
		snprintf(err, errlen,
			 "%s is smaller than when it was formatted", p);
		return -EINVAL;
	}
	return 0;
}

int cache_sb_fits(struct cache *c, struct dev *dev, int d, char *err,
		  size_t errlen)
{
	struct sb_disk sb;
	char why[400];
	int ret = sb_read_why(dev, &sb, why, sizeof(why));

	if (ret == -ENODATA) {
		snprintf(err, errlen,
			 "%s has no nvcachefs superblock (blank or "
			 "overwritten?)",
			 dev_path(dev));
		return -EINVAL;
	}
	if (ret) {
		snprintf(err, errlen, "%s: no valid superblock (%s)",
			 dev_path(dev), why);
		return -EINVAL;
	}
	return sb_matches(c, &sb, dev, d, err, errlen);
}

/* Every member's superblock against the headers; missing: the member
 * (index + 1) found missing, whose superblock is not read; detached: no
 * device was opened (stand-ins). */
static int check_superblocks(struct cache *c, int missing, int detached,
			     char *err, size_t errlen)
{
	uint8_t removed[NVC_MAX_DEVS];
	struct sb_disk sb;
	char why[400];
	int d, ret, repaired, degraded = missing;

	meta_removed(&c->meta, removed);

	/* listed past the members the header has: check_geometry says so */
	for (d = 0; d < c->ndevs && d < (int)c->meta.ndevs; d++) {
		const char *p = dev_path(c->devs[d]);

		if (detached) {
			dev_fence(c, d, STAT_DEV_DETACHED);
			continue;
		}
		if (removed[d]) {
			/* never used again (replace.c): whatever is there */
			dev_fence(c, d, STAT_DEV_REMOVED);
			c->removed_slots += member_slots(c, d);
			continue;
		}
		if (d + 1 == degraded) {
			dev_fence(c, d, STAT_DEV_MISSING);
			continue;
		}
		ret = sb_read_why(c->devs[d], &sb, why, sizeof(why));
		if (ret && c->cfg->dirty_copies > 1 && !degraded) {
			/* gone, unreadable, blank or overwritten: the second
			 * copies stand in for it */
			log_msg(LOG_CRIT,
				"%s: %s (%s): mounting degraded, from the "
				"second copies",
				p,
				ret == -ENODATA ? "no nvcachefs superblock "
						  "(blank, replaced or "
						  "overwritten?)"
						: "no valid superblock",
				why);
			degraded = d + 1;
			dev_fence(c, d, STAT_DEV_MISSING);
			continue;
		}
		if (ret == -ENODATA) {
			snprintf(err, errlen,
				 "%s has no nvcachefs superblock; run "
				 "nvcachectl format",
				 p);
			return -EINVAL;
		}
		if (ret) {
			snprintf(err, errlen, "%s: no valid superblock (%s)", p,
				 why);
			return ret;
		}
		ret = sb_matches(c, &sb, c->devs[d], d, err, errlen);
		if (ret)
			return ret;
		ret = sb_repair(c->devs[d], &sb, &repaired);
		if (repaired)
			log_msg(LOG_WARNING,
				"%s: %d damaged superblock cop%s rewritten "
				"from the good one%s",
				p, repaired, repaired > 1 ? "ies" : "y",
				ret ? " (failed)" : "");
	}
	return 0;
}

/* The mirrors' header against the configuration (the superblocks are
 * checked against both by check_superblocks). */
static int check_geometry(struct cache *c, char *err, size_t errlen)
{
	const struct cache_config *cfg = c->cfg;

	if (c->meta.block_size != c->bs) {
		snprintf(err, errlen,
			 "metadata mirrors (%s, %s): header block_size %u, but "
			 "cache.block_size is %u",
			 cfg->meta_paths[0], cfg->meta_paths[1],
			 c->meta.block_size, c->bs);
		return -EINVAL;
	}
	if (c->meta.ndevs != (uint32_t)c->ndevs) {
		snprintf(err, errlen,
			 "metadata mirrors (%s, %s): header ndevs %u, but "
			 "cache.devices lists %d",
			 cfg->meta_paths[0], cfg->meta_paths[1], c->meta.ndevs,
			 c->ndevs);
		return -EINVAL;
	}
	return 0;
}

/*
 * meta.rebuilt[] holds each mirror's enum stat_mirror_state (meta_attach sets
 * 1 for a rebuilt one), which the snapshot reports.  A mirror that is missing
 * was given to meta_attach as a stand-in in memory, which it filled from the
 * good one: from here on it is neither read nor written, and the good one's
 * header calls it stale (as for a mirror that failed while mounted), so that
 * when the device is back its old copy is rebuilt whole from the good one,
 * never merged record by record with it.  (meta_attach's rebuild of the
 * stand-in keeps that mark if it was there; it is set here otherwise.)
 */
_Static_assert(STAT_MIRROR_REBUILT == 1, "meta_attach sets rebuilt[] to 1");

static int mirrors_missing(struct meta *m)
{
	int i;

	for (i = 0; i < 2; i++) {
		if (!m->r[i].missing)
			continue;
		assert(m->have[!i] && !m->r[!i].missing);
		m->have[i] = 0;
		m->rebuilt[i] = STAT_MIRROR_MISSING;
		return meta_mark_stale(m, i);
	}
	return 0;
}

int cache_open_devs(struct cache_config *cfg, struct dev **devs, int ndev,
		    struct pm_region mirrors[2], int backing_fd,
		    struct cache **out, char *err, size_t errlen)
{
	return recover_open(cfg, devs, ndev, mirrors, backing_fd, 0, 0, out,
			    err, errlen);
}

int recover_open(struct cache_config *cfg, struct dev **devs, int ndev,
		 struct pm_region mirrors[2], int backing_fd, int missing,
		 int detached, struct cache **out, char *err, size_t errlen)
{
	struct cache *c = calloc(1, sizeof(*c));
	int ret, d;

	if (errlen)
		err[0] = 0;
	if (!c) {
		snprintf(err, errlen, "cannot open the cache: %s",
			 strerror(ENOMEM));
		return -ENOMEM;
	}
	c->cfg = cfg;
	c->check_backing = file_check_backing;
	c->ndevs = ndev;
	for (d = 0; d < ndev; d++)
		c->devs[d] = devs[d];
	c->backing_fd = backing_fd;
	c->bs = cfg->block_size;
	c->ppb = c->bs / NVC_PAGE;
	c->mount_ns = c->reset_ns = now_ns();
	ret = stat_store_init(&c->stats, cfg->stats_latency);
	if (ret)
		goto err_free;
	stats_attach_devs(c);
	dev_set_poll(cfg->io_poll_us * 1000);
	ret = meta_attach_named(&c->meta, mirrors,
				(const char *const *)cfg->meta_paths, err,
				errlen);
	if (ret)
		goto err_free;
	c->meta.nolock = &c->lock;
	c->nslots = c->meta.nslots;
	ret = mirrors_missing(&c->meta);
	if (ret) {
		snprintf(err, errlen,
			 "cannot mark the missing metadata mirror stale in the "
			 "other: %s",
			 strerror(-ret));
		goto err_free;
	}
	for (d = 0; d < 2; d++)
		if (c->meta.rebuilt[d] == STAT_MIRROR_REBUILT)
			log_msg(LOG_WARNING,
				"metadata mirror %d was not valid (%s); "
				"rebuilt from mirror %d",
				d, strerror(-c->meta.bad_reason[d]), !d);
	ret = check_superblocks(c, missing, detached, err, errlen);
	if (!ret)
		ret = check_geometry(c, err, errlen);
	if (ret)
		goto err_free;
	if (c->meta.layout.room > UINT32_MAX - SL_NHEADS) {
		/* slot ids are 32 bits (engine.h) */
		snprintf(err, errlen,
			 "room for %llu slots: a cache has fewer than 2^32 - "
			 "%d; use a larger cache.block_size",
			 (unsigned long long)c->meta.layout.room, SL_NHEADS);
		ret = -EFBIG;
		goto err_free;
	}
	ret = cache_alloc(c);
	if (ret)
		goto err_free;
	c->max_file_size = probe_max_file_size(backing_fd);
	{
		struct stat st;

		cache_may_block(c);
		c->backing_dev = fstat(backing_fd, &st) ? 0 : st.st_dev;
	}
	ret = ident_setup(c);
	if (ret) {
		snprintf(err, errlen,
			 "backing directory %s: cannot tell how to find its "
			 "files again: %s",
			 cfg->backing_path ? cfg->backing_path : "", strerror(-ret));
		goto err_free;
	}
	ret = recover_load(c, err, errlen);
	if (ret)
		goto err_free;
	if (c->meta.layout.nstripe < (uint32_t)c->ndevs) {
		/* grown members' slots come after the stripe's: the free list
		 * in slot order would use them last (grow.c) */
		pthread_mutex_lock(&c->lock);
		grow_interleave_locked(c);
		cache_unlock(c);
	}
	c->last_io = now_ms();
	/* from here on other threads reach c: the lock rules hold (core.h) */
	__atomic_store_n(&c->shared, 1, __ATOMIC_RELEASE);
	ret = destage_start(c);
	if (ret) {
		snprintf(err, errlen, "cannot start destage threads: %s",
			 strerror(-ret));
		goto err_free;
	}
	pin_reload_tails(c);
	log_msg(LOG_INFO,
		"cache open: %llu slots of %u KiB on %d devices, %llu dirty "
		"slots recovered",
		(unsigned long long)c->nslots, c->bs / 1024, c->ndevs,
		(unsigned long long)c->ndirty_slots);
	*out = c;
	return 0;
err_free:
	/* every refusal says why, also where only an errno came back */
	if (!err[0])
		snprintf(err, errlen, "cannot open the cache: %s",
			 strerror(-ret));
	c->own_devs = 0;
	cache_free(c);
	return ret;
}

int cache_close(struct cache *c, int flush)
{
	int ret = 0, d;

	uint64_t i;

	if (flush)
		ret = cache_flush(c, NULL, NULL);
	destage_stop(c);
	devlife_resume_join(c); /* it stops with the destagers */
	bks_stop(c);
	freeq_flush(c); /* no entry left mapping a freed slot */
	/* remember how every backing file looked, for the check at the next
	 * mount */
	for (i = 0; i <= c->fmask; i++) {
		struct cfile *f;

		for (f = c->fhash[i]; f; f = f->hnext)
			if (f->rec && f->fd >= 0)
				file_note_backing(c, f);
	}
	for (d = 0; d < c->ndevs; d++)
		if (!c->dev_failed[d] && dev_flush(c->devs[d]))
			ret = -EIO;
	cache_free(c);
	return ret;
}

void cache_abandon(struct cache *c)
{
	destage_stop(c);
	devlife_resume_join(c);
	bks_stop(c);
	cache_free(c);
}
