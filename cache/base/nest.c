/* cache: a mount point and a backing directory that nest are refused, by identity. */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include "base.h"

/* 1 if the resolved name inner is outer or below it, on a component boundary. */
static int name_below(const char *inner, const char *outer)
{
	size_t n = strlen(outer);

	if (strncmp(inner, outer, n))
		return 0;
	return outer[n - 1] == '/' || inner[n] == '/' || !inner[n];
}

static int same(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/*
 * 1 if a directory above directory fd, up to /, is top: walked by "..", as
 * the kernel resolves it (across mounts, so that a bind mount of top is
 * found whatever it is named), not by name; 0 if none is, or the walk stops.
 */
static int ancestor_is(int fd, const struct stat *top)
{
	struct stat st, up;
	int cur, next, depth, ret = 0;

	cur = openat(fd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (cur < 0 || fstat(cur, &st))
		goto out_close;
	for (depth = 0; depth < PATH_MAX / 2; depth++) {
		next = openat(cur, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (next < 0)
			break;
		close(cur);
		cur = next;
		if (fstat(cur, &up) || same(&up, &st))
			break; /* at / (or the root of a chroot) */
		if (same(&up, top)) {
			ret = 1;
			break;
		}
		st = up;
	}
out_close:
	if (cur >= 0)
		close(cur);
	return ret;
}

int cfg_check_nesting(const char *mnt, int backing_fd, const char *backing,
		      char *err, size_t errlen)
{
	char rm[PATH_MAX], rb[PATH_MAX];
	struct stat ms, bs;
	int mfd, ret = -EINVAL;

	if (!realpath(mnt, rm)) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", mnt, strerror(-ret));
		return ret;
	}
	if (!realpath(backing, rb)) {
		ret = -errno;
		snprintf(err, errlen, "backing.path %s: %s", backing,
			 strerror(-ret));
		return ret;
	}
	mfd = open(rm, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (mfd < 0 || fstat(mfd, &ms) || fstat(backing_fd, &bs)) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", rm, strerror(-ret));
		goto out_close;
	}
	if (same(&ms, &bs) || !strcmp(rm, rb))
		snprintf(err, errlen,
			 "the mount point cannot be the backing directory "
			 "(%s)",
			 rm);
	else if (name_below(rm, rb) || ancestor_is(mfd, &bs))
		snprintf(err, errlen,
			 "the mount point %s is inside the backing directory "
			 "%s: the mount would cover part of its own store; "
			 "mount it elsewhere",
			 rm, rb);
	else if (name_below(rb, rm) || ancestor_is(backing_fd, &ms))
		snprintf(err, errlen,
			 "the backing directory %s is inside the mount point "
			 "%s: the mount would hide its own store; mount it "
			 "elsewhere",
			 rb, rm);
	else
		ret = 0;
out_close:
	if (mfd >= 0)
		close(mfd);
	return ret;
}
