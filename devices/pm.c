/* devices: persistent memory regions through libpmem, block devices through io_uring, or memory for tests. */
#define _GNU_SOURCE
#include "dev_int.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <libpmem.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * A metadata mirror on a block device (no DAX) is kept as a page-aligned copy
 * in RAM; persisting a range writes the 4 KiB pages that hold it with FUA
 * through io_uring, so it is on the media when pm_persist returns.  The device
 * is opened exclusively, which is also its lock; it is opened through fd (the
 * device pm_open_place found), never by its name again.
 */
static int pm_map_blk(const char *path, int fd, size_t len, int create,
		      struct pm_region *out)
{
	char self[32];
	size_t size;
	int ret;

	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	ret = dev_open(self, &out->bdev);
	if (ret)
		return ret;
	free(out->bdev->path); /* named as configured, not by the descriptor */
	out->bdev->path = strdup(path);
	if (!out->bdev->path) {
		ret = -ENOMEM;
		goto err_close;
	}
	size = dev_size(out->bdev) & ~(size_t)(DEV_ALIGN - 1);
	if (len > size) {
		ret = -ENOSPC;
		goto err_close;
	}
	out->len = create ? len : size;
	out->addr = mmap(NULL, out->len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (out->addr == MAP_FAILED) {
		out->addr = NULL;
		ret = -ENOMEM;
		goto err_close;
	}
	if (create) {
		out->loaded = out->len; /* to be written whole by the caller */
		return 0;
	}
	ret = pm_load(out, DEV_ALIGN);
	if (ret)
		goto err_unmap;
	return 0;
err_unmap:
	munmap(out->addr, out->len);
	out->addr = NULL;
err_close:
	dev_close(out->bdev);
	out->bdev = NULL;
	return ret;
}

int pm_load(struct pm_region *r, size_t len)
{
	if (!r->bdev || len <= r->loaded)
		return 0;
	if (len > r->len)
		return -ENOSPC;
	len = (len + DEV_ALIGN - 1) & ~(size_t)(DEV_ALIGN - 1);
	while (r->loaded < len) {
		size_t n = len - r->loaded > (1u << 20) ? (1u << 20)
							: len - r->loaded;
		int ret = dev_read(r->bdev, (char *)r->addr + r->loaded, n,
				   r->loaded);

		if (ret)
			return ret;
		r->loaded += n;
	}
	return 0;
}

/*
 * 1 if path, or else the nearest directory above it that exists, is on the
 * file system /dev is on (devtmpfs, or a container's tmpfs): a file there
 * lives in RAM, and a name there that is not a device is a device gone.
 */
static int on_dev_fs(const char *path)
{
	struct stat dev, st;
	char p[PATH_MAX];

	if (stat("/dev", &dev) || strlen(path) >= sizeof(p) - 1)
		return 0;
	strcpy(p, path);
	while (stat(p, &st)) {
		char *slash = strrchr(p, '/');

		if (!strcmp(p, ".") || !strcmp(p, "/"))
			return 0;
		if (!slash)
			strcpy(p, ".");
		else if (slash == p)
			slash[1] = '\0';
		else
			*slash = '\0';
	}
	return st.st_dev == dev.st_dev;
}

static void place_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void place_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* Remove path if it still names the file (dev, ino): not one put there since. */
static void unlink_if_same(const char *path, dev_t dev, ino_t ino)
{
	struct stat st;

	if (!lstat(path, &st) && st.st_dev == dev && st.st_ino == ino)
		unlink(path);
}

int pm_reopen(int fd, int flags)
{
	char self[32];
	int nfd;

	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	nfd = open(self, flags | O_CLOEXEC);
	return nfd < 0 ? -errno : nfd;
}

/* A link on /dev's own file system (udev's names: root's alone) to a block
 * or character device is followed, once, to an O_PATH descriptor. */
static int follow_dev_link(const char *path, int lfd, struct stat *st,
			   char *err, size_t errlen)
{
	struct stat dev;
	int fd;

	if (fstat(lfd, st) || stat("/dev", &dev) || st->st_dev != dev.st_dev ||
	    st->st_uid != 0)
		goto refuse;
	fd = open(path, O_PATH | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? -ENODEV : -errno; /* a device gone */
	if (!fstat(fd, st) && (S_ISBLK(st->st_mode) || S_ISCHR(st->st_mode)))
		return fd;
	close(fd);
refuse:
	place_err(err, errlen,
		  "%s is a symbolic link; a metadata mirror is named by its "
		  "own path, not through a link (refusing to follow it)",
		  path);
	return -ELOOP;
}

/* The descriptor's file may be a mirror: 0, or -errno said in err. */
static int place_ok(const char *path, const struct stat *st, int create,
		    int created, char *err, size_t errlen)
{
	struct stat dev;

	if (S_ISBLK(st->st_mode) || S_ISCHR(st->st_mode)) {
		if (st->st_uid == geteuid() || st->st_uid == 0)
			return 0;
	} else if (!S_ISREG(st->st_mode)) {
		place_err(err, errlen, "%s: not a regular file or block device",
			  path);
		return -EINVAL;
	} else if (!stat("/dev", &dev) && st->st_dev == dev.st_dev) {
		return -ENODEV; /* a file in RAM where a device was */
	} else if (create == PM_NEW && !created) {
		place_err(err, errlen,
			  "%s exists; a new mirror goes to a file that does "
			  "not exist yet, or to a block device",
			  path);
		return -EEXIST;
	} else if (st->st_uid == geteuid()) {
		return 0;
	}
	place_err(err, errlen,
		  "%s: owned by uid %u, not by the daemon's user (uid %u); "
		  "refusing to use it as a metadata mirror",
		  path, (unsigned)st->st_uid, (unsigned)geteuid());
	return -EPERM;
}

int pm_open_place(const char *path, int create, struct stat *st, int *created,
		  char *err, size_t errlen)
{
	int fd, tries, ret;

	*created = 0;
	memset(st, 0, sizeof(*st));
	for (tries = 0; tries < 8; tries++) {
		fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0)
			break;
		if (errno != ENOENT)
			return -errno;
		/* a device gone, or nothing: no file is made under /dev */
		if (on_dev_fs(path))
			return -ENODEV;
		if (!create)
			return -ENOENT;
		fd = open(path,
			  O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			  0600);
		if (fd >= 0) {
			*created = 1;
			break;
		}
		if (errno != EEXIST)
			return -errno;
		/* made by someone else a moment ago: judged as found */
	}
	if (fd < 0)
		return -EAGAIN;
	if (fstat(fd, st)) {
		ret = -errno;
		goto err_close;
	}
	if (S_ISLNK(st->st_mode)) {
		ret = follow_dev_link(path, fd, st, err, errlen);
		close(fd);
		if (ret < 0)
			return ret;
		fd = ret;
	}
	ret = place_ok(path, st, create, *created, err, errlen);
	if (ret)
		goto err_close;
	return fd;
err_close:
	close(fd);
	if (*created)
		unlink_if_same(path, st->st_dev, st->st_ino);
	*created = 0;
	return ret;
}

void pm_unlink_created(const struct pm_region *r, const char *path)
{
	if (r->created)
		unlink_if_same(path, r->created_dev, r->created_ino);
}

int pm_map_err(const char *path, size_t len, int create, struct pm_region *out,
	       char *err, size_t errlen)
{
	char self[32];
	struct stat st;
	size_t mapped;
	void *addr;
	int fd, ret, tries;

	memset(out, 0, sizeof(*out));
	out->lock_fd = -1;
	fd = pm_open_place(path, create, &st, &out->created, err, errlen);
	if (fd < 0)
		return fd;
	out->created_dev = st.st_dev;
	out->created_ino = st.st_ino;
	if (S_ISBLK(st.st_mode)) {
		ret = pm_map_blk(path, fd, len, create, out);
		goto out_close;
	}
	if (!create && (size_t)st.st_size < len) {
		ret = -ENOSPC;
		goto out_close;
	}
	/*
	 * One process at a time may use a mirror.  A daemon whose mount was
	 * just taken away (umount returns before the daemon has seen it,
	 * destaged and exited) still holds it: a mount right after an umount,
	 * as xfstests' generic/366 does 64 times, found it busy.  As for the
	 * devices (dev.c), "busy" is retried for up to 3 s before it is
	 * believed.
	 */
	out->lock_fd = pm_reopen(fd, O_RDWR);
	if (out->lock_fd < 0) {
		ret = out->lock_fd;
		goto out_close;
	}
	tries = 0;
	while (flock(out->lock_fd, LOCK_EX | LOCK_NB)) {
		if (errno != EWOULDBLOCK || !dev_busy_wait(&tries)) {
			ret = errno == EWOULDBLOCK ? -EBUSY : -errno;
			goto err_lock;
		}
	}
	/* libpmem maps the file through the descriptor, never by its name */
	snprintf(self, sizeof(self), "/proc/self/fd/%d", out->lock_fd);
	addr = pmem_map_file(self, create ? len : 0,
			     create ? PMEM_FILE_CREATE : 0, 0600, &mapped,
			     &out->is_pmem);
	if (!addr || mapped < len) {
		ret = !addr ? (errno ? -errno : -EIO) : -ENOSPC;
		if (addr)
			pmem_unmap(addr, mapped);
		goto err_lock;
	}
	out->addr = addr;
	out->len = mapped;
	ret = 0;
	goto out_close;
err_lock:
	close(out->lock_fd);
	out->lock_fd = -1;
out_close:
	close(fd);
	if (ret) {
		pm_unlink_created(out, path);
		out->created = 0;
	}
	return ret;
}

int pm_map(const char *path, size_t len, int create, struct pm_region *out)
{
	return pm_map_err(path, len, create, out, NULL, 0);
}

int pm_mem_create(size_t len, struct pm_region *out)
{
	memset(out, 0, sizeof(*out));
	out->addr = calloc(1, len);
	out->faults = calloc(1, sizeof(*out->faults));
	if (!out->addr || !out->faults) {
		free(out->addr);
		free(out->faults);
		return -ENOMEM;
	}
	out->len = len;
	out->is_mem = 1;
	out->lock_fd = -1;
	return 0;
}

/*
 * Block-device mirrors: one write per page at a time.
 *
 * A block-device mirror is a RAM copy written back by whole 4 KiB pages, and
 * records of different slots or files share a page (64 slot entries fit in
 * one).  Two threads persisting neighbouring records each snapshot the same
 * page; were their FUA writes in flight at once, the device could apply them
 * in either order, and the one holding the older snapshot landing last would
 * take the other thread's record back in time after its pm_persist had
 * returned, on this mirror and then, the same way, on the other: a persisted
 * record stale on both mirrors.  Writing only a record's 512-byte sectors does
 * not help, since records share sectors too.  So the invariant is:
 *
 *	at most one write of a given page of a mirror is in flight, and the
 *	page's lock is taken before its content is read for the write.
 *
 * Then the writes of a page land in the order their snapshots were taken, and
 * each snapshot holds every record whose persist returned before it (its
 * bytes were copied into the RAM page before that persist began).  Pages are
 * locked through a small table of mutexes keyed by (region, page), taken in
 * ascending order, all of them for a range of as many pages as the table
 * holds; a thread holds only the locks of one pm_persist call.
 */
#define PM_PAGE_LOCKS 64

static struct pm_page_lock {
	pthread_mutex_t m;
	pthread_t owner; /* for the debug check that the writer holds it */
	int held;
} page_locks[PM_PAGE_LOCKS];
static pthread_once_t page_locks_once = PTHREAD_ONCE_INIT;

static void page_locks_init(void)
{
	int i;

	for (i = 0; i < PM_PAGE_LOCKS; i++)
		pthread_mutex_init(&page_locks[i].m, NULL);
}

static unsigned page_lock_of(const struct pm_region *r, size_t page)
{
	return ((uintptr_t)r->addr / DEV_ALIGN + page) % PM_PAGE_LOCKS;
}

/* The locks of pages [p0, p1) of r, as a mask of page_locks. */
static uint64_t page_lock_mask(const struct pm_region *r, size_t p0, size_t p1)
{
	uint64_t mask = 0;

	if (p1 - p0 >= PM_PAGE_LOCKS)
		return ~0ull;
	for (; p0 < p1; p0++)
		mask |= 1ull << page_lock_of(r, p0);
	return mask;
}

static void page_locks_take(uint64_t mask)
{
	int i;

	pthread_once(&page_locks_once, page_locks_init);
	for (i = 0; i < PM_PAGE_LOCKS; i++) {
		if (!(mask >> i & 1))
			continue;
		pthread_mutex_lock(&page_locks[i].m);
		page_locks[i].owner = pthread_self();
		page_locks[i].held = 1;
	}
}

static void page_locks_drop(uint64_t mask)
{
	int i;

	for (i = PM_PAGE_LOCKS - 1; i >= 0; i--) {
		if (!(mask >> i & 1))
			continue;
		page_locks[i].held = 0;
		pthread_mutex_unlock(&page_locks[i].m);
	}
}

static void page_locks_assert(const struct pm_region *r, size_t start,
			      size_t end)
{
#ifndef NDEBUG
	for (; start < end; start += DEV_ALIGN) {
		struct pm_page_lock *l =
			&page_locks[page_lock_of(r, start / DEV_ALIGN)];

		assert(l->held && pthread_equal(l->owner, pthread_self()));
	}
#else
	(void)r;
	(void)start;
	(void)end;
#endif
}

void (*pm_test_page_write)(const struct pm_region *r, size_t off);

/* Write pages [start, end) of the RAM copy: FUA writes, or, for a recording
 * region, a logged start and completion of each page's write. */
static int pm_write_pages(const struct pm_region *r, size_t start, size_t end)
{
	while (start < end) {
		size_t n = end - start > (1u << 20) ? (1u << 20) : end - start;
		struct dev_io io = { .dev = r->bdev,
				     .op = DEV_WRITE,
				     .buf = (char *)r->addr + start,
				     .off = start,
				     .len = n,
				     .fua = 1 };
		int ret;

		page_locks_assert(r, start, start + n);
		if (r->rec_blk && pm_test_page_write)
			pm_test_page_write(r, start);
		if (r->rec_blk) {
			size_t b = rec_log_add(
				r->rec, REC_PM_PAGE_BEGIN, r->rec_id, start,
				(char *)r->addr + start, DEV_ALIGN, 1);

			sched_yield(); /* let other page writes overlap it */
			rec_log_add(r->rec, REC_PM_PAGE_END, r->rec_id, b, NULL,
				    0, 1);
			start += DEV_ALIGN;
			continue;
		}
		ret = dev_io_run(&io, 1);
		if (ret)
			return ret;
		start += n;
	}
	return 0;
}

static int pm_persist_pages(const struct pm_region *r, const void *addr,
			    size_t len)
{
	size_t off = (const char *)addr - (const char *)r->addr;
	size_t start = off & ~(size_t)(DEV_ALIGN - 1);
	size_t end = (off + len + DEV_ALIGN - 1) & ~(size_t)(DEV_ALIGN - 1);
	uint64_t mask = page_lock_mask(r, start / DEV_ALIGN, end / DEV_ALIGN);
	int ret;

	page_locks_take(mask);
	ret = pm_write_pages(r, start, end);
	page_locks_drop(mask);
	if (!ret && r->rec_blk)
		rec_log_add(r->rec, REC_PM_PERSIST, r->rec_id, off, addr, len,
			    1);
	return ret;
}

int pm_persist(const struct pm_region *r, const void *addr, size_t len)
{
	if (r->bdev || r->rec_blk)
		return pm_persist_pages(r, addr, len);
	if (r->is_mem) {
		if (r->faults->fail_write)
			return r->faults->fail_write;
		if (r->rec)
			rec_log_add(r->rec, REC_PM_PERSIST, r->rec_id,
				    (const char *)addr - (const char *)r->addr,
				    addr, len, 0);
		return 0;
	}
	if (r->is_pmem) {
		pmem_persist(addr, len);
		return 0;
	}
	return pmem_msync(addr, len) ? -errno : 0;
}

int pm_write(const struct pm_region *r, size_t off, const void *src,
	     size_t len)
{
	if (off > r->len || len > r->len - off)
		return -EINVAL;
	if (r->is_mem && r->faults->fail_write)
		return r->faults->fail_write;
	memcpy((char *)r->addr + off, src, len);
	return pm_persist(r, (char *)r->addr + off, len);
}

void pm_unmap(struct pm_region *r)
{
	if (r->lock_fd >= 0) {
		close(r->lock_fd);
		r->lock_fd = -1;
	}
	if (!r->addr)
		return;
	if (r->bdev) {
		munmap(r->addr, r->len);
		dev_close(r->bdev);
		r->bdev = NULL;
		r->addr = NULL;
		return;
	}
	if (r->is_mem) {
		free(r->addr);
		free(r->faults);
		r->faults = NULL;
	}
	else
		pmem_unmap(r->addr, r->len);
	r->addr = NULL;
}
