/* devices: persistent memory regions through libpmem, or plain memory for
 * tests. */
#define _GNU_SOURCE
#include "dev.h"

#include <errno.h>
#include <libpmem.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int pm_map(const char *path, size_t len, int create, struct pm_region *out)
{
	struct stat st;
	size_t mapped;
	void *addr;

	memset(out, 0, sizeof(*out));
	out->lock_fd = -1;
	if (!create) {
		if (stat(path, &st))
			return -errno;
		if (S_ISBLK(st.st_mode))
			return -ENOTSUP;
		if ((size_t)st.st_size < len)
			return -ENOSPC;
	}
	/* one process at a time may use a mirror */
	out->lock_fd =
		open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
	if (out->lock_fd < 0)
		return -errno;
	if (flock(out->lock_fd, LOCK_EX | LOCK_NB)) {
		int e = errno == EWOULDBLOCK ? -EBUSY : -errno;

		close(out->lock_fd);
		out->lock_fd = -1;
		return e;
	}
	addr = pmem_map_file(path, create ? len : 0,
			     create ? PMEM_FILE_CREATE : 0, 0600, &mapped,
			     &out->is_pmem);
	if (!addr || mapped < len) {
		int e = !addr ? (errno ? -errno : -EIO) : -ENOSPC;

		if (addr)
			pmem_unmap(addr, mapped);
		close(out->lock_fd);
		out->lock_fd = -1;
		return e;
	}
	out->addr = addr;
	out->len = mapped;
	return 0;
}

int pm_mem_create(size_t len, struct pm_region *out)
{
	memset(out, 0, sizeof(*out));
	out->addr = calloc(1, len);
	if (!out->addr)
		return -ENOMEM;
	out->len = len;
	out->is_mem = 1;
	out->lock_fd = -1;
	return 0;
}

int pm_persist(const struct pm_region *r, const void *addr, size_t len)
{
	if (r->is_mem) {
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

void pm_unmap(struct pm_region *r)
{
	if (r->lock_fd >= 0) {
		close(r->lock_fd);
		r->lock_fd = -1;
	}
	if (!r->addr)
		return;
	if (r->is_mem)
		free(r->addr);
	else
		pmem_unmap(r->addr, r->len);
	r->addr = NULL;
}
