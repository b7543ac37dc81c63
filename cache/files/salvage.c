/* cache: salvage — a file's cached data written to a new file, when it cannot
 * go where it belongs (lost+found, a conflict copy). */
#define _GNU_SOURCE
#include "files_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

/*
 * Dirty data is never dropped because its file cannot be found or was
 * changed by another node: it is written to a new file first, and only once
 * that file and its directory are durable may the cache forget the data.  A
 * salvaged copy holds every page the cache has of the file (dirty and
 * clean), at the cache's size; what the cache does not hold comes from srcfd
 * (the file's current backing copy, for a conflict) or is a hole.
 */

#define SALVAGE_BUF (1024 * 1024u)

static int write_all(int fd, const char *buf, size_t len, uint64_t off)
{
	while (len) {
		ssize_t n = pwrite(fd, buf, len, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		buf += n;
		len -= n;
		off += n;
	}
	return 0;
}

/* The bytes of srcfd below size, where the cache holds nothing else. */
static int salvage_base(int srcfd, int dfd, uint64_t size, char *buf)
{
	uint64_t off = 0;
	int ret;

	while (off < size) {
		size_t want = size - off < SALVAGE_BUF ? size - off : SALVAGE_BUF;
		ssize_t n = pread(srcfd, buf, want, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (!n)
			break;
		ret = write_all(dfd, buf, n, off);
		if (ret)
			return ret;
		off += n;
	}
	return 0;
}

/*
 * Pages [p0, p1) of s, whose device failed, from its twin: the twin holds
 * the dirty pages; a clean page is the old file's and is not saved (zeros).
 */
static int salvage_twin(struct cache *c, struct cslot *s, char *buf,
			uint32_t p0, uint32_t p1)
{
	uint32_t p;
	int ret;

	for (p = p0; p < p1; p++) {
		char *at = buf + (uint64_t)(p - p0) * NVC_PAGE;

		if (!pb_test(slot_dirty(c, s), p)) {
			memset(at, 0, NVC_PAGE);
			continue;
		}
		ret = twin_read(c, s, at, p, p + 1);
		if (ret)
			return ret;
	}
	return 0;
}

/*
 * The valid pages of one slot (s->rw held), from its device or, for pages
 * its failed device lost, from its twin.  Pages that no copy gives back are
 * an error: the caller must not forget data it could not save.
 */
static int salvage_slot(struct cache *c, struct cslot *s, int dfd, char *buf,
			uint64_t size, uint64_t *dirty_bytes)
{
	uint32_t p = 0, p0;
	int ret;

	while (p < c->ppb) {
		uint64_t off, len;

		if (!pb_test(slot_valid(c, s), p)) {
			p++;
			continue;
		}
		for (p0 = p; p < c->ppb && pb_test(slot_valid(c, s), p); p++)
			;
		off = s->blk * c->bs + (uint64_t)p0 * NVC_PAGE;
		if (off >= size)
			break;
		len = (uint64_t)(p - p0) * NVC_PAGE;
		ret = dev_read(slot_dev(c, slot_idx(c, s)), buf, len,
			       slot_off(c, slot_idx(c, s)) + p0 * NVC_PAGE);
		if (ret)
			ret = salvage_twin(c, s, buf, p0, p);
		if (ret)
			return ret;
		if (off + len > size)
			len = size - off;
		ret = write_all(dfd, buf, len, off);
		if (ret)
			return ret;
	}
	for (p = 0; p < c->ppb; p++) {
		uint64_t off = s->blk * c->bs + (uint64_t)p * NVC_PAGE;

		if (pb_test(slot_dirty(c, s), p) && off < size)
			*dirty_bytes += size - off < NVC_PAGE ? size - off
							      : NVC_PAGE;
	}
	return 0;
}

/* The slots of f, pinned, so that none is evicted while it is copied. */
static struct cslot **salvage_pin(struct cache *c, struct cfile *f,
				  uint64_t *n)
{
	struct cslot **v;
	struct list *l;

	pthread_mutex_lock(&c->lock);
	v = calloc(f->nslots ? f->nslots : 1, sizeof(*v));
	*n = 0;
	for (l = f->slots.next; v && l != &f->slots; l = l->next) {
		struct cslot *s = list_entry(l, struct cslot, flink);

		slot_pin_locked(c, f, s);
		v[(*n)++] = s;
	}
	cache_unlock(c);
	return v;
}

int salvage_copy(struct cache *c, struct cfile *f, int srcfd, int dirfd,
		 const char *name, uint64_t *dirty_bytes)
{
	struct cslot **v;
	uint64_t i, n = 0, size;
	char *buf;
	int dfd, ret = 0;

	*dirty_bytes = 0;
	cache_may_block(c);
	dfd = openat(dirfd, name,
		     O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		     0600);
	if (dfd < 0)
		return -errno;
	buf = dev_alloc_buf(SALVAGE_BUF);
	v = salvage_pin(c, f, &n);
	if (!buf || !v) {
		ret = -ENOMEM;
		goto out_unpin;
	}
	pthread_mutex_lock(&c->lock);
	size = f->size;
	cache_unlock(c);
	if (srcfd >= 0)
		ret = salvage_base(srcfd, dfd, size, buf);
	for (i = 0; i < n && !ret; i++) {
		srw_rdlock(&v[i]->rw);
		ret = salvage_slot(c, v[i], dfd, buf, size, dirty_bytes);
		srw_unlock(&v[i]->rw);
	}
	cache_may_block(c);
	if (!ret && ftruncate(dfd, size))
		ret = -errno;
	cache_may_block(c);
	if (!ret && (fsync(dfd) || fsync(dirfd)))
		ret = -errno;
out_unpin:
	pthread_mutex_lock(&c->lock);
	for (i = 0; v && i < n; i++)
		slot_unpin_locked(c, f, v[i]);
	cache_unlock(c);
	free(v);
	free(buf);
	if (ret)
		salvage_unlink_own(dirfd, name, dfd);
	close(dfd);
	return ret;
}

void salvage_unlink_own(int dirfd, const char *name, int fd)
{
	struct stat st, at;

	if (!fstat(fd, &st) &&
	    !fstatat(dirfd, name, &at, AT_SYMLINK_NOFOLLOW) &&
	    st.st_dev == at.st_dev && st.st_ino == at.st_ino)
		unlinkat(dirfd, name, 0);
}

void salvage_drop(struct cache *c, struct cfile *f)
{
	pthread_mutex_lock(&c->lock);
	while (!list_empty(&f->slots)) {
		struct cslot *s =
			list_entry(f->slots.next, struct cslot, flink);

		slot_drop_locked(c, s);
	}
	space_freed_locked(c);
	cache_unlock(c);
}

/* A name for f's data in lost+found: its last path component (or its inode
 * number), the time, and a sequence number when that is taken. */
static void lost_name(struct cfile *f, int k, char *out, size_t len)
{
	const char *base = f->path ? strrchr(f->path, '/') : NULL;
	char when[32];
	struct tm tm;
	time_t t = time(NULL);

	base = base ? base + 1 : f->path;
	gmtime_r(&t, &tm);
	strftime(when, sizeof(when), "%Y%m%dT%H%M%SZ", &tm);
	if (base && strlen(base) < 160)
		snprintf(out, len, "%s.ino%llu.%s%s%.0d", base,
			 (unsigned long long)f->ino, when, k ? "." : "", k);
	else
		snprintf(out, len, "ino%llu.%s%s%.0d",
			 (unsigned long long)f->ino, when, k ? "." : "", k);
}

/*
 * .nvcachefs-lost+found is the daemon's own directory: made by it, mode
 * 0700, and used only as long as it is that.  Anyone who may write the
 * store's root may make the name first (a directory they own, to read and
 * delete everyone's salvaged data; a file or a symlink, to make every
 * salvage fail), so it is opened beneath the backing directory without
 * following links and checked with fstat: a directory, the daemon's, mode
 * 0700.  Anything else is set aside, renamed (which follows no link) to
 * .nvcachefs-lost+found.impostor-N, logged, and the directory made anew.
 */
#define LOST_TRIES 4
#define IMPOSTOR_MAX 1000

static int lost_dir_ok(struct cache *c, const struct stat *st)
{
	return S_ISDIR(st->st_mode) && st->st_uid == c->own_uid &&
	       (st->st_mode & 07777) == 0700;
}

/* The name is not the daemon's directory (what: why): renamed away. */
static int lost_set_aside(struct cache *c, const char *what)
{
	char aside[64];
	int k;

	for (k = 1; k <= IMPOSTOR_MAX; k++) {
		snprintf(aside, sizeof(aside), "%s.impostor-%d", LOST_FOUND_DIR,
			 k);
		if (!renameat2(c->backing_fd, LOST_FOUND_DIR, c->backing_fd,
			       aside, RENAME_NOREPLACE)) {
			log_msg(LOG_WARNING,
				"%s/%s is %s, not the daemon's own directory: "
				"set aside as %s; salvaged data goes to a new "
				"%s",
				c->root, LOST_FOUND_DIR, what, aside,
				LOST_FOUND_DIR);
			cache_may_block(c);
			return fsync(c->backing_fd) ? -errno : 0;
		}
		if (errno == ENOENT)
			return 0; /* gone meanwhile */
		if (errno != EEXIST)
			break;
	}
	log_msg(LOG_ERR,
		"%s/%s is %s, not the daemon's own directory, and cannot be "
		"set aside (%s): nothing is salvaged there; remove it",
		c->root, LOST_FOUND_DIR, what, strerror(errno));
	return -EEXIST;
}

/* lost+found opened, the daemon's own (made if need be): fd, or -errno. */
static int lost_dir_open(struct cache *c)
{
	char what[96];
	struct stat st;
	int k, fd, ret;

	for (k = 0; k < LOST_TRIES; k++) {
		cache_may_block(c);
		if (mkdirat(c->backing_fd, LOST_FOUND_DIR, 0700) &&
		    errno != EEXIST)
			return -errno;
		fd = ident_open_beneath(c->backing_fd, LOST_FOUND_DIR,
					O_RDONLY | O_DIRECTORY, 0);
		if (fd >= 0) {
			cache_may_block(c);
			if (fstat(fd, &st)) {
				ret = -errno;
				close(fd);
				return ret;
			}
			if (lost_dir_ok(c, &st))
				return fd;
			close(fd);
			snprintf(what, sizeof(what),
				 "a directory of uid %u, mode %04o",
				 (unsigned)st.st_uid,
				 (unsigned)(st.st_mode & 07777));
		} else if (fd == -ELOOP || fd == -ENOTDIR) {
			/* O_DIRECTORY finds a symlink no directory either */
			cache_may_block(c);
			if (fstatat(c->backing_fd, LOST_FOUND_DIR, &st,
				    AT_SYMLINK_NOFOLLOW))
				continue; /* removed meanwhile */
			snprintf(what, sizeof(what), "%s of uid %u",
				 S_ISLNK(st.st_mode) ? "a symbolic link"
						     : "a file",
				 (unsigned)st.st_uid);
		} else if (fd == -ENOENT) {
			continue; /* removed meanwhile */
		} else {
			return fd;
		}
		ret = lost_set_aside(c, what);
		if (ret)
			return ret;
	}
	log_msg(LOG_ERR,
		"%s/%s: made again by someone else %d times: nothing is "
		"salvaged there now",
		c->root, LOST_FOUND_DIR, LOST_TRIES);
	return -EAGAIN;
}

/*
 * The backing file of f cannot be found (deleted or renamed behind the
 * cache's back, or a stale identity): its dirty data goes to
 * .nvcachefs-lost+found/ in the backing directory, and then the cache
 * forgets the file.  A file with no dirty data is just forgotten.  f->rw held
 * for writing, or recovery alone.  On failure the data stays in the cache.
 */
int salvage_lost(struct cache *c, struct cfile *f)
{
	char name[256];
	uint64_t dirty = 0;
	int dirfd, k, ret;

	if (!f->ndirty) {
		salvage_drop(c, f);
		return 0;
	}
	dirfd = lost_dir_open(c);
	ret = dirfd < 0 ? dirfd : -EEXIST;
	/* everything in it is made O_CREAT | O_EXCL | O_NOFOLLOW through its
	 * descriptor (salvage_copy) */
	for (k = 0; dirfd >= 0 && ret == -EEXIST && k < 1000; k++) {
		lost_name(f, k, name, sizeof(name));
		ret = salvage_copy(c, f, -1, dirfd, name, &dirty);
	}
	cache_may_block(c);
	if (!ret && fsync(c->backing_fd))
		ret = -errno;
	if (dirfd >= 0)
		close(dirfd);
	if (ret) {
		log_msg(LOG_ERR,
			"cannot save the dirty data of %s (inode %llu) in %s: "
			"%s; it stays in the cache",
			f->path ? f->path : "a file", (unsigned long long)f->ino,
			LOST_FOUND_DIR, strerror(-ret));
		return ret;
	}
	log_msg(LOG_WARNING,
		"backing file %s (inode %llu) cannot be found: its %llu dirty "
		"bytes are in %s/%s",
		f->path ? f->path : "(no path)", (unsigned long long)f->ino,
		(unsigned long long)dirty, LOST_FOUND_DIR, name);
	CNT_ADD(c, lost_found_files, 1);
	CNT_ADD(c, lost_found_bytes, dirty);
	salvage_drop(c, f);
	return 0;
}
