/* devices: persistent memory regions through libpmem, or plain memory for tests. */
#define _GNU_SOURCE
#include "dev.h"

#include <errno.h>
#include <libpmem.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int pm_map(const char *path, size_t len, int create, struct pm_region *out)
{
	struct stat st;
	size_t mapped;
	void *addr;

	memset(out, 0, sizeof(*out));
	if (!create) {
		if (stat(path, &st))
			return -errno;
		if (S_ISBLK(st.st_mode))
			return -ENOTSUP;
		if ((size_t)st.st_size < len)
			return -ENOSPC;
	}
	addr = pmem_map_file(path, create ? len : 0, create ? PMEM_FILE_CREATE : 0,
			     0600, &mapped, &out->is_pmem);
	if (!addr)
		return errno ? -errno : -EIO;
	if (mapped < len) {
		pmem_unmap(addr, mapped);
		return -ENOSPC;
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
	return 0;
}

int pm_persist(const struct pm_region *r, const void *addr, size_t len)
{
	if (r->is_mem)
		return 0;
	if (r->is_pmem) {
		pmem_persist(addr, len);
		return 0;
	}
	return pmem_msync(addr, len) ? -errno : 0;
}

void pm_unmap(struct pm_region *r)
{
	if (!r->addr)
		return;
	if (r->is_mem)
		free(r->addr);
	else
		pmem_unmap(r->addr, r->len);
	r->addr = NULL;
}
