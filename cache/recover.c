/* cache: opening a cache — superblock checks, rebuilding the map from the
 * mirrors, closing. */
#define _GNU_SOURCE
#include "engine.h"

#include <assert.h>
#include <errno.h>
#include <sys/random.h>
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

	if (fstat(f->fd, &st))
		return;
	f->dev = st.st_dev;
	f->bsize = st.st_size;
	mt = st.st_mtim.tv_sec * 1000000000ull + st.st_mtim.tv_nsec;
	if (f->bk_busy) {
		/* the cache itself was changing it when it stopped */
		mt = f->bk_mtime_ns;
		f->bk_busy = 0;
	}
	if (mt == f->bk_mtime_ns && (uint64_t)st.st_size != f->size) {
		if (ftruncate(f->fd, f->size) || fsync(f->fd))
			log_msg(LOG_ERR,
				"recovery: cannot truncate backing file (inode "
				"%llu) to %llu: %s",
				(unsigned long long)f->ino,
				(unsigned long long)f->size, strerror(errno));
		else
			f->bsize = f->size;
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

int recover_load(struct cache *c, char *err, size_t errlen)
{
	struct meta *m = &c->meta;
	uint64_t i, maxseq = 0, fixed = 0, bad_total = 0, ntwins = 0;
	struct {
		uint64_t idx;
		struct meta_slot ms;
	} *twins = calloc(c->nslots, sizeof(*twins));
	uint32_t r;
	int bad, ret;

	if (!twins)
		return -ENOMEM;
	/*
	 * What recovery rewrites must be newer than every copy on the media:
	 * a crash between its write of one mirror and of the other must not
	 * let the older copy win.
	 */
	m->seq = meta_next_seq(m);
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
			ret = -EUCLEAN;
			goto err_files;
		}
		bad_total += bad;
		if (mf.seq >= maxseq)
			maxseq = mf.seq + 1;
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
			fixed++;
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
			ret = -EUCLEAN;
			goto err_files;
		}
		f = file_new();
		if (!f) {
			ret = -ENOMEM;
			goto err_files;
		}
		f->rec = r + 1;
		f->ino = mf.ino;
		f->size = f->psize = mf.size;
		f->bsize = mf.bk_size;
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
			ret = -ENOMEM;
			goto err_files;
		}
		c->recs[r] = f;
	}
	/* free records are handed out lowest first */
	for (r = 0; r < c->nfree_recs / 2; r++) {
		uint32_t t = c->free_recs[r];

		c->free_recs[r] = c->free_recs[c->nfree_recs - 1 - r];
		c->free_recs[c->nfree_recs - 1 - r] = t;
	}

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
		bad_total += bad;
		if (ms.seq >= maxseq)
			maxseq = ms.seq + 1;
		if (ms.file && (ms.flags & SLOT_F_TWIN)) {
			/* linked to its slot once every slot is in */
			if (bad ||
			    mirrors_differ(m, m->slots_off + i * m->slot_size,
					   m->slot_size)) {
				meta_put_slot(m, i, &ms);
				fixed++;
			}
			twins[ntwins].idx = i;
			twins[ntwins++].ms = ms;
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
			fixed++;
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
			ret = -EUCLEAN;
			goto err_files;
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
	for (i = 0; i < ntwins; i++) {
		struct cslot *t = &c->slots[twins[i].idx];
		struct cslot *p =
			slot_find(c, twins[i].ms.file, twins[i].ms.blk);

		if (p && !p->twin && pb_any(c, slot_dirty(c, p))) {
			t->file = twins[i].ms.file;
			t->blk = twins[i].ms.blk;
			pb_put(c, slot_valid(c, t), twins[i].ms.valid);
			pb_put(c, slot_dirty(c, t), twins[i].ms.dirty);
			t->is_twin = 1;
			t->persisted = 1;
			t->state = SLOT_FRESH;
			p->twin = twins[i].idx + 1;
			c->ntwins++;
		} else {
			/* its slot is clean or gone: the copy is not needed */
			struct meta_slot z;

			memset(&z, 0, sizeof(z));
			meta_put_slot(m, twins[i].idx, &z);
			slot_settle(c, t);
		}
	}
	free(twins);
	twins = NULL;
	if (maxseq > m->seq)
		m->seq = maxseq;
	c->meta_repaired = fixed;
	if (fixed)
		log_msg(LOG_NOTICE,
			"recovery: %llu metadata records differed between the "
			"mirrors (%llu damaged copies); both mirrors rewritten "
			"to agree",
			(unsigned long long)fixed,
			(unsigned long long)bad_total);

	ret = ident_store_check(c, err, errlen);
	if (ret)
		goto err_files;
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
	return 0;
err_files:
	/* refused before any file was hashed: cache_free would not see them */
	for (r = 0; r < m->nfiles; r++) {
		if (c->recs[r])
			free(c->recs[r]->path);
		free(c->recs[r]);
		c->recs[r] = NULL;
	}
	free(twins);
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

/* the device (index + 1) cache_open found missing; its superblock is not read */
static int degraded_dev;
/* cache_open found the headers saying detached: no device was opened */
static int open_detached;

static int check_superblocks(struct cache *c, char *err, size_t errlen)
{
	uint8_t removed[NVC_MAX_DEVS];
	struct sb_disk sb;
	char why[400];
	int d, ret, repaired, degraded = degraded_dev;

	meta_removed(&c->meta, removed);

	/* listed past the members the header has: check_geometry says so */
	for (d = 0; d < c->ndevs && d < (int)c->meta.ndevs; d++) {
		const char *p = dev_path(c->devs[d]);

		if (open_detached) {
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
	ret = check_superblocks(c, err, errlen);
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

/* A damaged or lost mirror, made anew at len bytes to be rebuilt. */
static int mirror_recreate(struct cache_config *cfg, int i, const char *why,
			   uint64_t len, struct pm_region *r)
{
	log_msg(LOG_WARNING,
		"metadata mirror %s is damaged or lost (%s); rebuilding it "
		"from %s",
		cfg->meta_paths[i], why, cfg->meta_paths[!i]);
	return pm_map(cfg->meta_paths[i], len, 1, r);
}

/*
 * A mirror on a device that is not there is not made anew (a file in its
 * place under /dev would live in RAM): the cache runs on the other mirror
 * alone, and a stand-in in memory takes the missing one's place for
 * meta_attach.  When the device is back, the next mount brings it up to
 * date record by record.
 */
static int mirror_stand_in(struct cache_config *cfg, int i, uint64_t len,
			   struct pm_region *r)
{
	int ret;

	log_msg(LOG_CRIT,
		"metadata mirror %s is missing (no such device): mounting "
		"degraded, the metadata on %s alone",
		cfg->meta_paths[i], cfg->meta_paths[!i]);
	ret = pm_mem_create(len, r);
	if (!ret)
		r->missing = 1;
	return ret;
}

/*
 * The listed devices: opened (one gone is a stand-in with two dirty copies,
 * *missing its index + 1), or all stand-ins when the cache is detached
 * (detach.c: the devices may be gone or in other use).  0, or -errno with
 * err set and nothing left open.
 */
static int open_devs(struct cache_config *cfg, int detached, int removed,
		     struct dev **devs, int *missing, char *err, size_t errlen)
{
	int i, ret = 0;

	for (i = 0; i < cfg->ndevs && !ret; i++) {
		if (detached) {
			ret = dev_missing_create(cfg->dev_paths[i], UINT64_MAX,
						 &devs[i]);
			continue;
		}
		/* a spare place (replace.c, add) names no device */
		ret = cfg_is_spare(cfg->dev_paths[i]) && removed
			      ? -ENOENT
			      : dev_open(cfg->dev_paths[i], &devs[i]);
		if (ret && ret != -EBUSY && removed) {
			/* a removed member's name or a spare place: its
			 * device may be gone (check_superblocks says which
			 * member is removed) */
			removed--;
			if (!cfg_is_spare(cfg->dev_paths[i]))
				log_msg(LOG_INFO,
					"%s: cannot open it (%s): taken for a "
					"removed member",
					cfg->dev_paths[i], strerror(-ret));
			ret = dev_missing_create(cfg->dev_paths[i], UINT64_MAX,
						 &devs[i]);
			continue;
		}
		if (ret && ret != -EBUSY && cfg->dirty_copies > 1 &&
		    !*missing) {
			/* with two dirty copies, one device may be gone */
			log_msg(LOG_CRIT,
				"%s: cannot open cache device (%s): mounting "
				"degraded, from the second copies",
				cfg->dev_paths[i], strerror(-ret));
			ret = dev_missing_create(cfg->dev_paths[i], UINT64_MAX,
						 &devs[i]);
			*missing = i + 1;
		}
		if (ret)
			snprintf(err, errlen,
				 "%s: cannot open cache device: %s",
				 cfg->dev_paths[i],
				 ret == -EBUSY ? "in use (mounted, or by "
						 "another nvcachefs)"
					       : strerror(-ret));
	}
	if (ret)
		for (i = 0; i < cfg->ndevs; i++)
			if (devs[i]) {
				dev_close(devs[i]);
				devs[i] = NULL;
			}
	return ret;
}

void cache_note_member_names(struct cache *c)
{
	char names[NVC_MAX_DEVS][META_NAME_LEN], name[META_NAME_LEN];
	uint64_t rdevs[NVC_MAX_DEVS], rdev;
	uint8_t removed[NVC_MAX_DEVS];
	int d;

	const struct meta_hdr *h = meta_hdr_of(&c->meta);

	if (!h || !members_recorded(h))
		return;
	meta_member_names(&c->meta, names, rdevs);
	meta_removed(&c->meta, removed);
	for (d = 0; d < c->ndevs; d++) {
		if (removed[d] ||
		    __atomic_load_n(&c->dev_failed[d], __ATOMIC_ACQUIRE) ||
		    members_stable_name(dev_path(c->devs[d]), name,
					sizeof(name), &rdev))
			continue;
		if (!strcmp(name, names[d]) && rdev == rdevs[d])
			continue;
		if (meta_set_member_name(&c->meta, d, name, rdev))
			log_msg(LOG_WARNING,
				"cannot record where member %d was found", d + 1);
	}
}

/*
 * Tokens.  Every mount writes a new random token into each working
 * member's superblock and records it in the header (meta_hdr.tokens), so
 * that a block-for-block copy of a member taken before it (a dd backup)
 * is told from the member itself when the member is gone and the copy is
 * the only device with its UUID (members_pick refuses it).  The header
 * first records the tokens being written (tokens_next), then the devices
 * get them, then the header takes them as the members': a crash anywhere
 * leaves every member's superblock with one of the two the header accepts.
 * A member missing at this mount keeps its old token, in the header and on
 * its device, and is taken again when it is back.
 */
void cache_note_tokens(struct cache *c)
{
	const struct meta_hdr *h = meta_hdr_of(&c->meta);
	uint64_t tok[NVC_MAX_DEVS] = { 0 }, done[NVC_MAX_DEVS] = { 0 };
	uint8_t removed[NVC_MAX_DEVS];
	struct sb_disk sb;
	int d, any = 0, left = 0;

	if (!h || !members_recorded(h))
		return;
	meta_removed(&c->meta, removed);
	for (d = 0; d < c->ndevs; d++) {
		if (removed[d] ||
		    __atomic_load_n(&c->dev_failed[d], __ATOMIC_ACQUIRE))
			continue;
		while (!tok[d])
			if (getrandom(&tok[d], sizeof(tok[d]), 0) !=
			    sizeof(tok[d]))
				return;
		any = 1;
	}
	if (!any || meta_set_tokens(&c->meta, tok, 1))
		return;
	for (d = 0; d < c->ndevs; d++) {
		if (!tok[d])
			continue;
		if (sb_read(c->devs[d], &sb)) {
			left++;
			continue;
		}
		sb.token = tok[d];
		if (sb_write(c->devs[d], &sb))
			left++;
		else
			done[d] = tok[d];
	}
	if (left)
		log_msg(LOG_WARNING,
			"%d cache device%s kept the token of the last mount "
			"(cannot write its superblock)",
			left, left > 1 ? "s" : "");
	if (meta_set_tokens(&c->meta, done, 0))
		log_msg(LOG_WARNING, "cannot record the devices' new tokens");
}

/* A detached cache's members as fenced stand-ins, named where each was
 * last found. */
static int standins(const struct cache_config *cfg, const struct meta_hdr *h,
		    struct dev **devs)
{
	uint32_t k;
	int ret = 0;

	for (k = 0; k < h->ndevs && !ret; k++)
		ret = dev_missing_create(h->names[k][0]		  ? h->names[k]
					 : k < (uint32_t)cfg->ndevs ? cfg->dev_paths[k]
								  : "(member)",
					 UINT64_MAX, &devs[k]);
	return ret;
}

int cache_open(struct cache_config *cfg, int backing_fd, struct cache **out,
	       char *err, size_t errlen)
{
	struct dev *devs[NVC_MAX_DEVS] = { 0 };
	struct pm_region mirrors[2] = { { .lock_fd = -1 }, { .lock_fd = -1 } };
	uint64_t total[2] = { 0, 0 };
	char why[2][256] = { "", "" };
	const struct meta_hdr *h;
	int i, ret, mret[2], missing = 0, detached = 0, removed = 0, cur, ndevs;

	/*
	 * A mirror that is missing, truncated or damaged is recreated at the
	 * good one's size here and rebuilt from it by meta_attach; a device
	 * that is not there (-ENODEV) stays missing.
	 */
	for (i = 0; i < 2; i++) {
		mret[i] = pm_map_err(cfg->meta_paths[i], 0, 0, &mirrors[i],
				     why[i], sizeof(why[i]));
		if (mret[i] == -ELOOP || mret[i] == -EPERM) {
			/* a link or a stranger's file: never rebuilt over */
			snprintf(err, errlen, "%s", why[i]);
			if (!why[i][0])
				snprintf(err, errlen, "%s: %s",
					 cfg->meta_paths[i],
					 strerror(-mret[i]));
			ret = mret[i];
			goto err_close;
		}
		if (mret[i] == -EBUSY) {
			snprintf(err, errlen,
				 "%s: cannot map metadata mirror: in use by "
				 "another nvcachefs",
				 cfg->meta_paths[i]);
			ret = -EBUSY;
			goto err_close;
		}
		if (mret[i]) {
			if (!why[i][0])
				snprintf(why[i], sizeof(why[i]), "%s",
					 strerror(-mret[i]));
		} else {
			mret[i] =
				meta_hdr_why(mirrors[i].addr, mirrors[i].len,
					     &total[i], why[i], sizeof(why[i]));
		}
		if (!mret[i]) {
			mret[i] = pm_load(&mirrors[i], total[i]);
			if (mret[i])
				snprintf(why[i], sizeof(why[i]),
					 "cannot read it: %s",
					 strerror(-mret[i]));
		}
	}
	if (mret[0] && mret[1]) {
		snprintf(err, errlen,
			 "neither metadata mirror (%s, %s) holds a valid "
			 "nvcachefs header (%s / %s); run nvcachectl format",
			 cfg->meta_paths[0], cfg->meta_paths[1], why[0],
			 why[1]);
		ret = -ENODATA;
		goto err_close;
	}
	for (i = 0; i < 2; i++) {
		if (!mret[i])
			continue;
		pm_unmap(&mirrors[i]);
		ret = mret[i] == -ENODEV
			      ? mirror_stand_in(cfg, i, total[!i], &mirrors[i])
			      : mirror_recreate(cfg, i, why[i], total[!i],
						&mirrors[i]);
		if (ret) {
			snprintf(err, errlen,
				 "%s: cannot recreate metadata mirror: %s",
				 cfg->meta_paths[i], strerror(-ret));
			goto err_close;
		}
		/* whatever is left of it is not trusted: meta_attach copies it
		 * whole */
		memset(mirrors[i].addr, 0, META_HDR_SIZE);
	}
	/* the current header (meta_current) says what the mount opens */
	{
		const struct meta_hdr *hh[2] = { mirrors[0].addr,
						 mirrors[1].addr };
		int valid[2] = { !mret[0], !mret[1] };

		cur = meta_current(hh, valid);
		if (cur == -EUCLEAN) {
			snprintf(err, errlen,
				 "each metadata mirror says the other failed; "
				 "the cache cannot tell which one is current");
			ret = -EUCLEAN;
			goto err_close;
		}
		h = hh[cur];
	}
	/* detached (detach.c), or a detach under way: resumed once mounted */
	detached = h->detached == 1;
	ndevs = cfg->ndevs;
	if (detached || !members_recorded(h)) {
		for (i = 0; i < NVC_MAX_DEVS; i++)
			removed += h->removed[i];
		if (detached && members_recorded(h))
			ret = standins(cfg, h, devs);
		else
			ret = open_devs(cfg, detached, removed, devs, &missing,
					err, errlen);
		if (detached && members_recorded(h))
			ndevs = (int)h->ndevs;
	} else {
		/* devices by identity, whatever their names (members.c) */
		ret = members_open(cfg, h, NULL, 0, cfg->dirty_copies > 1,
				   devs, &missing, err, errlen);
		ndevs = (int)h->ndevs;
	}
	if (ret)
		goto err_close;
	degraded_dev = missing;
	open_detached = detached;
	ret = cache_open_devs(cfg, devs, ndevs, mirrors, backing_fd, out, err,
			      errlen);
	degraded_dev = 0;
	open_detached = 0;
	if (ret)
		goto err_close;
	if (!detached) {
		cache_note_member_names(*out);
		cache_note_tokens(*out);
	}
	if (detached)
		detach_at_mount(*out);
	else if (devlife_resume_start(*out))
		log_msg(LOG_ERR,
			"cannot resume the replace, remove or detach under "
			"way: run it again");
	(*out)->own_devs = 1;
	return 0;
err_close:
	for (i = 0; i < 2; i++)
		pm_unmap(&mirrors[i]);
	for (i = 0; i < NVC_MAX_DEVS; i++)
		dev_close(devs[i]);
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
