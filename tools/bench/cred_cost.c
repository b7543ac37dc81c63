/* tools/bench/cred_cost.c: what acting as the caller costs a request — fs_cred_take and fs_cred_leave, timed. */
#define _GNU_SOURCE
#include "cred.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/*
 * Usage: cred-cost [N]. Prints, in ns per section (a caller other than
 * root, one supplementary group): the same caller's section again (the
 * thread lingers), a section followed by the daemon's own work (the
 * credentials go and come back), two callers in turn, a creating section
 * (its umask), and an fstatat, for scale.  Run as root.
 */

static double ns_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1e9 + (t.tv_nsec - t0->tv_nsec);
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 200000, i;
	gid_t g1[1] = { 65534 }, g2[1] = { 100 };
	struct fs_caller who = { .uid = 65534, .gid = 65534, .ngroups = 1,
				 .groups = g1 };
	struct timespec t0;
	struct stat st;

	if (geteuid() || fs_cred_setup()) {
		fprintf(stderr, "cred-cost: run as root\n");
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < n; i++) {
		if (fs_cred_take(&who))
			return 1;
		fs_cred_leave();
	}
	printf("a section, same caller again:      %6.0f ns\n", ns_since(&t0) / n);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < n; i++) {
		if (fs_cred_take(&who))
			return 1;
		fs_cred_leave();
		fs_cred_daemon();
	}
	printf("a section, then the daemon's work: %6.0f ns\n", ns_since(&t0) / n);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < n; i++) {
		who.uid = i & 1 ? 65534 : 1000;
		who.groups = i & 1 ? g1 : g2;
		if (fs_cred_take(&who))
			return 1;
		fs_cred_leave();
	}
	printf("a section, two callers in turn:    %6.0f ns\n", ns_since(&t0) / n);
	who.uid = 65534;
	who.groups = g1;
	who.umask = 022;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < n; i++) {
		if (fs_cred_take(&who))
			return 1;
		fs_cred_leave();
	}
	printf("a creating section (umask):        %6.0f ns\n", ns_since(&t0) / n);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < n; i++)
		fstatat(AT_FDCWD, "/tmp", &st, AT_SYMLINK_NOFOLLOW);
	printf("for scale, one fstatat:             %6.0f ns\n", ns_since(&t0) / n);
	return 0;
}
