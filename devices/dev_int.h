/* devices: what dev.c shares with aring.c, inside the devices module only. */
#ifndef NVC_DEV_INT_H
#define NVC_DEV_INT_H

#include "dev.h"

enum dev_kind { DEV_KIND_URING, DEV_KIND_MEM };

struct dev {
	enum dev_kind kind;
	struct rec_log *rec;
	int rec_id;
	int fd;
	uint64_t size;
	uint32_t sector; /* the smallest I/O it takes (dev_sector) */
	char *path;
	unsigned char *mem;
	struct dev_faults faults;
	dev_observe_fn obs;
	void *obs_arg;
	int obs_timing;
	struct dev *shadow; /* takes a copy of each write and flush (atomic) */
	int shadow_errors; /* of those copies (atomic) */
	pthread_mutex_t *nolock; /* never held across its I/O (asserted) */
};

/* 0, or why io cannot be issued (out of range, an injected fault). */
int dev_io_check(const struct dev_io *io);
/* A device or mirror found busy (O_EXCL, flock) by a daemon that is going
 * away: 1 after waiting a little, while up to 3 s have gone (*tries from 0);
 * 0 when "busy" is to be believed. */
int dev_busy_wait(int *tries);
/* Carry out io on an in-memory device. */
void dev_io_mem(struct dev_io *io);
/* Do io from its byte done on synchronously, with plain system calls, as
 * durable as io asks (done 0: all of it; a flush: fdatasync); 0 or -errno,
 * the device's answer. */
int dev_io_finish(struct dev_io *io, uint32_t done);
/* io's result once a ring completed it with res (bytes or -errno): a
 * refusal or a short transfer finished synchronously (dev_io_finish). */
int dev_io_complete(struct dev_io *io, int res);
/* A ring refused a device request, which is done synchronously: counted. */
void dev_note_refusal(void);
uint64_t dev_mono_ns(void);
/* Tell the device's observer that io completed (t0: when it was issued). */
void dev_observe(const struct dev_io *io, uint64_t t0);
/* d's shadow, if io is a write or flush that has one. */
struct dev *dev_shadow_of(const struct dev_io *io);

#endif
