/* cache: on-media formats — device superblocks and the mirrored metadata. */
#ifndef NVC_META_H
#define NVC_META_H

#include <pthread.h>
#include <stdint.h>

#include "cache.h"

/*
 * Every cache device starts with a superblock (4 KiB, copied at 4 KiB and at
 * 8 KiB so that one torn write cannot lose it); data slots start at
 * SB_DATA_OFF.  Global slot s lives on device s % ndevs at slot s / ndevs, so
 * consecutive slots spread over all devices.
 *
 * Each metadata mirror is one file (or region) laid out as
 *
 *	[ meta_hdr, 4 KiB ][ file records ][ slot entries ]
 *
 * File records say which backing file a slot belongs to (by file handle,
 * which carries the inode's generation, or by path relative to the backing
 * directory; either way checked against the identity stamp the cache put in
 * the file's extended attributes: ident.c), and the file's size as the
 * mount shows it.  Slot entries map a cache slot
 * to (file, block) with a validity and a dirty bitmap of 4 KiB pages.  Every
 * record carries a sequence number and an xxh64 checksum; the two mirrors are
 * written one after the other, each persisted before the next is touched, so
 * that at every instant at least one holds a complete, valid record, and the
 * newer valid one wins at mount.
 */

#define SB_MAGIC 0x31454843414356ull /* "NVCACHE1" little end first */
#define SB_VERSION 1
#define SB_COPIES 2
#define SB_DATA_OFF (1024 * 1024ull)

#define META_MAGIC 0x3141544d4356ull /* "NVCMTA1" */
#define META_VERSION 2
#define META_HDR_SIZE 4096u
#define META_FILE_SIZE 1024u
#define META_HANDLE_MAX 128u
#define META_STAMP_LEN 16u
/* a path as a file record keeps it, its NUL included */
#define META_PATH_MAX 760u
#define META_MAX_WORDS 4 /* 1 MiB / 4 KiB pages / 64 bits */

struct sb_disk {
	uint64_t magic;
	uint32_t version;
	uint32_t sb_size;
	uint8_t set_uuid[16];
	uint32_t dev_index;
	uint32_t ndevs;
	uint32_t block_size;
	uint32_t reserved0;
	uint64_t dev_size;
	uint64_t data_off;
	uint64_t slots_per_dev;
	uint64_t format_time;
	/* this device's identity in the set (members.c); all zero: formatted
	 * before members were recorded */
	uint8_t dev_uuid[16];
	uint8_t reserved[4096 - 104];
	uint64_t csum;
};

struct meta_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t hdr_size;
	uint8_t set_uuid[16];
	uint32_t mirror;
	uint32_t block_size;
	uint64_t nslots;
	uint32_t nfiles;
	uint32_t slot_size;
	uint32_t file_size;
	uint32_t ndevs;
	uint64_t files_off;
	uint64_t slots_off;
	uint64_t total_len;
	uint64_t format_time;
	uint32_t failed; /* bit k: mirror k failed while mounted; stale */
	uint32_t reserved1;
	/* the identity stamp of the backing directory the cache was last
	 * mounted on (ident.c); all zero: none yet */
	uint8_t store_stamp[16];
	/* member k's device UUID (its superblock's dev_uuid), for k below
	 * ndevs, the rest zero; all zero: not recorded (members.c) */
	uint8_t members[NVC_MAX_DEVS][16];
	/* 1: detached by nvcachectl detach: the mount opens no cache device
	 * and serves everything from the backing store (detach.c);
	 * META_DETACHING: a detach under way, which the next mount resumes */
	uint32_t detached;
	/* a remove under way (replace.c): member + 1 (0: none); the next mount
	 * resumes it */
	uint32_t removing;
	/* removed[k]: 1 once member k was removed (nvcachectl remove): its
	 * slots are never used again, its device never opened (replace.c) */
	uint8_t removed[NVC_MAX_DEVS];
	/* a replace under way (replace.c): member + 1 (0: none) and the new
	 * device's path, NUL-terminated; the next mount resumes it */
	uint32_t replacing;
	uint32_t reserved3;
	char replace_path[256];
	/* a mirror replace under way (mirror.c): mirror + 1 (0: none) and the
	 * new place's path, NUL-terminated; the next mount resumes it */
	uint32_t mirror_replacing;
	uint32_t reserved4;
	char mirror_path[256];
	uint8_t reserved[4096 - 136 - NVC_MAX_DEVS * 17 - 2 * 264];
	uint64_t csum;
};

/* flags of a file record */
#define MF_USED 1u
/* the cache was changing the backing file (destage, truncate): after a crash
 * its mtime says nothing about changes behind the cache's back, and the
 * record is the truth */
#define MF_BK_BUSY 2u
/* pinned (nvcachectl pin, filectl.c): its clean data is not evicted, and
 * the record stays while pinned, even with no slot */
#define MF_PINNED 4u
/* its backing file lost its last name while the cache held it open
 * (cache_file_unlinked): after a crash, before the last close dropped its
 * data, recovery drops it too, instead of saving it to lost+found as the
 * data of a file that cannot be found */
#define MF_UNLINKED 8u
/* every flag a file record may carry */
#define META_FILE_FLAGS (MF_USED | MF_BK_BUSY | MF_PINNED | MF_UNLINKED)
/* every flag a slot entry may carry (SLOT_F_TWIN, engine.h) */
#define META_SLOT_FLAGS 1u
/* sequence numbers count up from 0; a larger one is not ours */
#define META_SEQ_MAX (1ull << 62)
/* the largest file record count format writes (cache.max_files) */
#define META_MAX_FILES (1u << 24)

struct meta_file {
	uint64_t seq;
	uint64_t ino;
	uint64_t size; /* size as the mount shows it */
	uint64_t bk_mtime_ns; /* backing file as the cache last saw it */
	uint64_t bk_size;
	uint32_t handle_bytes;
	int32_t handle_type;
	uint32_t flags;
	uint32_t path_len; /* bytes of path, without its NUL */
	uint8_t handle[META_HANDLE_MAX];
	uint64_t bk_ctime_ns;
	uint8_t stamp[META_STAMP_LEN]; /* identity stamp; all zero: none */
	uint8_t reserved[48];
	char path[META_PATH_MAX]; /* relative to the backing directory */
	uint64_t csum;
};

/* Slot entries are variable in size (bitmap words); this is the in-memory view.
 */
struct meta_slot {
	uint64_t seq;
	uint32_t file; /* file record index + 1; 0: free */
	uint32_t flags;
	uint64_t blk;
	uint64_t valid[META_MAX_WORDS];
	uint64_t dirty[META_MAX_WORDS];
};

struct meta {
	struct pm_region r[2];
	int have[2]; /* mirror usable */
	int rebuilt[2]; /* was damaged or lost at mount, rebuilt from the other
			 */
	int bad_reason[2];
	int failed[2]; /* failed a write while mounted: no longer written */
	uint32_t words; /* bitmap words per slot entry */
	uint32_t slot_size;
	uint64_t nslots;
	uint32_t nfiles;
	uint64_t files_off, slots_off;
	uint32_t block_size; /* of the header, checked against the config */
	uint32_t ndevs;
	uint64_t seq; /* next sequence number (atomic) */
	uint8_t set_uuid[16];
	/* held for reading by every access to r[] while mounted, for writing
	 * while a mirror is swapped for a new one (meta_replace) */
	pthread_rwlock_t swap;
};

uint64_t meta_csum(const void *p, size_t len);
uint32_t meta_words(uint32_t block_size);
uint32_t meta_slot_size(uint32_t block_size);
uint64_t meta_total_len(uint64_t nslots, uint32_t nfiles, uint32_t block_size);

int sb_read(struct dev *d, struct sb_disk *out);
/* The same; on failure why says what is wrong with each copy. */
int sb_read_why(struct dev *d, struct sb_disk *out, char *why, size_t len);
/* 0 if the fields of a superblock (magic, checksum, version already good) are
 * sane; else -EUCLEAN and why names the field. */
int sb_check(const struct sb_disk *sb, char *why, size_t len);
int sb_write(struct dev *d, const struct sb_disk *sb);
int sb_repair(struct dev *d, const struct sb_disk *good, int *repaired);

/* members.c: the device set by identity. */
/* 1 if m[i] is zero or equals an earlier m[j]. */
int members_uuid_taken(uint8_t (*m)[16], int i);
/* u as 8-4-4-4-12 hex; returns buf. */
const char *members_uuid_str(const uint8_t u[16], char buf[37]);
/* 1 if the header records its members' UUIDs. */
int members_recorded(const struct meta_hdr *h);
/* Put the n listed devices in member order (by their superblocks' UUIDs);
 * *missing (listed index + 1 of a stand-in, or 0) follows its device.
 * 0, or -EINVAL with err naming a stale member or a copied device. */
int members_order(const struct meta_hdr *h, struct dev **devs, int n,
		  int *missing, char *err, size_t errlen);

/* 0 if addr holds a valid mirror header; *total_len is the mirror's size. */
int meta_hdr_check(const void *addr, size_t len, uint64_t *total_len);
/* The same; on failure why names the field that is wrong. */
int meta_hdr_why(const void *addr, size_t len, uint64_t *total_len, char *why,
		 size_t whylen);
/* Attach to two mapped mirrors; checks headers against each other and
 * rebuilds a damaged mirror from the good one. */
int meta_attach(struct meta *m, struct pm_region r[2], char *err, size_t len);
int meta_attach_ro(struct meta *m, struct pm_region r[2], char *err,
		   size_t len);
/* The same, naming the mirrors (paths) in messages; names may be NULL. */
int meta_attach_named(struct meta *m, struct pm_region r[2],
		      const char *const names[2], char *err, size_t len);
int meta_attach_ro_named(struct meta *m, struct pm_region r[2],
			 const char *const names[2], char *err, size_t len);
void meta_init_hdr(struct meta_hdr *h, const uint8_t uuid[16], uint32_t mirror,
		   uint32_t block_size, uint64_t nslots, uint32_t nfiles,
		   uint32_t ndevs);

/* Read the newest valid copy; returns 1 if found valid, 0 if none. */
int meta_get_slot(struct meta *m, uint64_t i, struct meta_slot *out, int *bad);
int meta_get_file(struct meta *m, uint32_t i, struct meta_file *out, int *bad);
/* Why each mirror's copy of a record was refused (empty if it was not). */
void meta_slot_why(struct meta *m, uint64_t i, char *why, size_t len);
void meta_file_why(struct meta *m, uint32_t i, char *why, size_t len);
/*
 * Write both mirrors in order, each persisted before the next.  A mirror that
 * fails a write is dropped (logged, never written again) and the other
 * mirror's header records that it is stale, so that the next mount rebuilds it
 * instead of trusting its older records.  0 when a mirror holds the record;
 * -EIO when none does (then the media may hold the old or the new record).
 */
int meta_put_slot(struct meta *m, uint64_t i, struct meta_slot *s);
/* adjacent entries persisted as one record by meta_put_slots, at most */
#define SLOTS_RUN_MAX 64
void meta_put_slots(struct meta *m, const uint64_t *idx, struct meta_slot *s,
		    int n, int *res);
int meta_slot_same(struct meta *m, uint64_t i, const struct meta_slot *s);
int meta_put_file(struct meta *m, uint32_t i, struct meta_file *f);
/* One past the highest sequence number of any valid record in either mirror:
 * what recovery must start from before it rewrites anything. */
uint64_t meta_next_seq(struct meta *m);
/* The backing directory's stamp as the headers say (zero: none yet), and
 * setting it in every mirror that takes writes. */
void meta_store_stamp(struct meta *m, uint8_t out[16]);
int meta_set_store_stamp(struct meta *m, const uint8_t stamp[16]);
/* Write the detached state into each usable mirror's header in turn. */
int meta_set_detached(struct meta *m, uint32_t detached);
/* Mirror k becomes the region nr, a copy of the other mirror (which must be
 * usable); the region it had is returned in old, to be unmapped.  0, or
 * -errno with nothing changed. */
int meta_replace(struct meta *m, int k, struct pm_region *nr,
		 struct pm_region *old);
/* The member table of the first usable header (all zero: none). */
void meta_members(struct meta *m, uint8_t out[NVC_MAX_DEVS][16]);
/* Write the member table into each usable mirror's header in turn. */
int meta_set_members(struct meta *m, uint8_t members[NVC_MAX_DEVS][16]);
/* The replace under way (member + 1, 0: none; the new device's path in
 * path[256]), and its writing (path NULL with 0). */
uint32_t meta_replacing(struct meta *m, char path[256]);
int meta_set_replacing(struct meta *m, uint32_t member1, const char *path);
/* The mirror replace under way (mirror + 1, 0: none; the new place in
 * path[256]), and its writing (path NULL with 0). */
uint32_t meta_mirror_replacing(struct meta *m, char path[256]);
int meta_set_mirror_replacing(struct meta *m, uint32_t mirror1,
			      const char *path);
/* The remove under way (member + 1, 0: none), and its writing. */
uint32_t meta_removing(struct meta *m);
int meta_set_removing(struct meta *m, uint32_t member1);
/* The detached field (0, 1, META_DETACHING), and its writing. */
#define META_DETACHING 2u
uint32_t meta_detach_state(struct meta *m);
/* The removed flags of the first usable header, and their writing. */
void meta_removed(struct meta *m, uint8_t out[NVC_MAX_DEVS]);
int meta_set_removed(struct meta *m, const uint8_t removed[NVC_MAX_DEVS]);
/* 1 if a file record may hold path (len bytes): see meta.c. */
int meta_path_ok(const char *path, uint32_t len);
/* 1 while a mirror still takes writes. */
int meta_writable(struct meta *m);

#endif
