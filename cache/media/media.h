/* cache/media: on-media formats — device superblocks and the mirrored metadata. */
#ifndef NVC_MEDIA_H
#define NVC_MEDIA_H

#include <pthread.h>
#include <stdint.h>

#include "../base/base.h"

/*
 * Every cache device starts with a superblock (4 KiB, copied at 4 KiB and at
 * 8 KiB so that one torn write cannot lose it); data slots start at
 * SB_DATA_OFF.  Where a global slot lives is the layout (struct meta_layout):
 * the members a cache was formatted with share slots round robin, slot s on
 * member s % nstripe at its slot s / nstripe, so consecutive slots spread
 * over them; a member added later (nvcachectl add past the formatted places:
 * a grow) holds a run of consecutive slots after them.
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
/* 3: the layout fields (stripe_devs, room, grown); a version 2 header has
 * them zero and means every member in the stripe, no room.  (The probe
 * field took a reserved word that every version wrote zero, read nowhere,
 * and kept as it was: 0 means "not recorded", so it needed no new
 * version, and older binaries still mount a cache that records it.) */
#define META_VERSION 3
#define META_VERSION_V2 2
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
	/* written by every mount (cache_note_tokens) and recorded in the
	 * metadata header (meta_hdr.tokens): a copy of the device taken
	 * before the last mount carries an older one; 0: none yet */
	uint64_t token;
	uint8_t reserved[4096 - 112];
	uint64_t csum;
};

/* a name in the header (meta_hdr.names), its NUL included */
#define META_NAME_LEN 128u

/*
 * A device or file by what it is, not what it is called: the UUID written to
 * it (a superblock's dev_uuid; for a mirror place, its claim header's), its
 * st_rdev (a block device) or st_dev and st_ino (a regular file), and its
 * size in bytes.  All zero: none recorded.
 */
struct meta_ident {
	uint8_t uuid[16];
	uint64_t rdev;
	uint64_t dev;
	uint64_t ino;
	uint64_t size;
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
	/* what the backing store's identity probe found (ident.c), for the
	 * mounts whose probe fails: META_PROBE_NS (the namespace of the
	 * identity stamps' attribute) with META_PROBE_HANDLES and
	 * META_PROBE_COARSE; 0: not recorded (every header before this field
	 * was defined has it 0; see META_VERSION) */
	uint32_t probe;
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
	/* the layout (meta_layout_of): members below stripe_devs share the
	 * slots [0, nslots - the grown ones) round robin; member k from
	 * stripe_devs on, added by a grow, holds the grown[k] slots after
	 * those of the members before it */
	uint32_t stripe_devs;
	uint32_t reserved5;
	/* slot entries the mirror has room for (nslots or more): a grow takes
	 * from it; total_len covers it */
	uint64_t room;
	uint64_t grown[NVC_MAX_DEVS];
	/* the header's generation: one more at every write of it, the same in
	 * both mirrors once both are written; the valid, not stale header of
	 * the larger one is the current one (meta_current).  0: written before
	 * headers had generations (the field was reserved, zero) */
	uint64_t gen;
	/* where member k (below ndevs) was last found: a name it opened
	 * under (NUL-terminated, empty: none recorded) and its st_rdev (0: a
	 * regular file); candidates at the next mount beside cache.devices
	 * (members.c), never trusted without its superblock's UUID */
	char names[NVC_MAX_DEVS][META_NAME_LEN];
	uint64_t rdevs[NVC_MAX_DEVS];
	/* the identity of a replace's new device (replacing) and of a
	 * mirror replace's new place (mirror_replacing), recorded before
	 * anything is copied onto it; all zero: none recorded */
	struct meta_ident replace_id;
	struct meta_ident mirror_id;
	/* member k's superblock token as the last mount wrote it (0: not
	 * checked, as for a member added since), and the one being written
	 * (0: none): a member's device is one whose token is either */
	uint64_t tokens[NVC_MAX_DEVS];
	uint64_t tokens_next[NVC_MAX_DEVS];
	uint8_t reserved[4096 - 136 - NVC_MAX_DEVS * 17 - 2 * 264 - 16 -
			 NVC_MAX_DEVS * 8 - 8 -
			 NVC_MAX_DEVS * (META_NAME_LEN + 8) -
			 2 * sizeof(struct meta_ident) - NVC_MAX_DEVS * 16];
	uint64_t csum;
};

/* meta_hdr.probe: the stamps' attribute namespace (in META_PROBE_NS) ... */
#define META_NS_TRUSTED 1u /* trusted.nvcachefs.id */
#define META_NS_USER 2u /* user.nvcachefs.id */
#define META_NS_NONE 3u /* the store keeps neither: no stamps */
#define META_PROBE_NS 0xffu
/* ... handles proven stable, and times kept in whole seconds */
#define META_PROBE_HANDLES 0x100u
#define META_PROBE_COARSE 0x200u

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

/*
 * Where each global slot lives, from a valid header.  Members below nstripe
 * share [0, stripe_slots) round robin; member k from nstripe on holds
 * count[k] slots from base[k], in member order, up to nslots.  room: the
 * slot entries the mirrors have room for.  A grow (replace.c) fills base and
 * count of the new member before anyone can be given one of its slots; the
 * stripe never changes.
 */
struct meta_layout {
	uint32_t nstripe;
	uint64_t room, stripe_slots;
	uint64_t base[NVC_MAX_DEVS], count[NVC_MAX_DEVS];
};

void meta_layout_of(const struct meta_hdr *h, struct meta_layout *l);

/* The member global slot s lives on. */
static inline int layout_member(const struct meta_layout *l, uint64_t s)
{
	int k;

	if (s < l->stripe_slots)
		return (int)(s % l->nstripe);
	for (k = (int)l->nstripe;
	     k + 1 < NVC_MAX_DEVS && l->count[k + 1] &&
	     s >= l->base[k] + l->count[k];
	     k++)
		;
	return k;
}

/* Global slot s's index on its member (its offset: SB_DATA_OFF + index *
 * block size). */
static inline uint64_t layout_index(const struct meta_layout *l, uint64_t s)
{
	if (s < l->stripe_slots)
		return s / l->nstripe;
	return s - l->base[layout_member(l, s)];
}

/* Member k's slot j (j < count[k]) as a global slot. */
static inline uint64_t layout_slot(const struct meta_layout *l, int k,
				   uint64_t j)
{
	if ((uint32_t)k < l->nstripe)
		return j * l->nstripe + k;
	return l->base[k] + j;
}

/* The ndevs a superblock of member k says: the stripe's width for a
 * member of it, k + 1 for a grown one (the members when it was added). */
static inline uint32_t layout_sb_ndevs(const struct meta_layout *l, int k)
{
	return (uint32_t)k < l->nstripe ? l->nstripe : (uint32_t)k + 1;
}

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
	struct meta_layout layout; /* as attached; meta_grow changes it */
	uint64_t seq; /* next sequence number (atomic) */
	uint8_t set_uuid[16];
	/* held for reading by every access to r[] while mounted, for writing
	 * while a mirror is swapped for a new one (meta_replace) */
	pthread_rwlock_t swap;
	/* never held across a persist (cache/core/core.h: c->lock; asserted) */
	pthread_mutex_t *nolock;
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

/* "8-4-4-4-12" hex (dashes optional) into out; 0 or -EINVAL. */
int members_parse_uuid(const char *s, uint8_t out[16]);
/* Which of the ncand devices (NULL entries skipped) is which member of h
 * (members.c): devs[k] for each member found (NULL: not found, or removed),
 * kof[i] candidate i's member index, -1 none, -2 a former member, -3 the
 * new device of the replace under way, -4 an old copy of a member (its
 * token is not the one the last mount wrote).  0, or
 * -EINVAL with err naming a copied device or a misplaced superblock. */
int members_pick(const struct meta_hdr *h, struct dev **cand, int ncand,
		 struct dev **devs, int *kof, char *err, size_t errlen);
/* The members of h opened by identity from cache.devices' names, the names h
 * recorded and extra (members.c); removed members and up to allow_missing
 * missing members (*missing: the first one's index + 1) get fenced
 * stand-ins.  0, or -errno with err set and nothing left open. */
int members_open(const struct cache_config *cfg, const struct meta_hdr *h,
		 const char *const *extra, int nextra, int allow_missing,
		 struct dev **devs, int *missing, char *err, size_t errlen);
/* The name to record for a device opened as name: a /dev/disk/by-id link
 * to the same block device if there is one, else name; *rdev its st_rdev
 * (0: not a block device).  0 or -errno (out is name then). */
int members_stable_name(const char *name, char *out, size_t len,
			uint64_t *rdev);
/* The cache.devices line naming today's set (a removed member: spare). */
void members_line(const struct meta_hdr *h, struct dev *const *devs,
		  char *out, size_t len);

/* 0 if addr holds a valid mirror header; *total_len is the mirror's size. */
int meta_hdr_check(const void *addr, size_t len, uint64_t *total_len);
/* The same; on failure why names the field that is wrong. */
int meta_hdr_why(const void *addr, size_t len, uint64_t *total_len, char *why,
		 size_t whylen);
/*
 * Which header is current: the one authority that mount, attach, resume,
 * check and the device commands use.  Of two headers (NULL or not valid:
 * valid[i] 0), one that the other's failed bits call stale is never current;
 * else the larger generation wins (a crash between the two persists of a
 * header write leaves mirror 0 one ahead: it is written first), and at equal
 * generations mirror 0 (the same header, or two written before headers had
 * generations, of which mirror 0 was written first).  The index of the
 * current header, -ENODATA if neither is valid, -EUCLEAN if each calls the
 * other stale.
 */
int meta_current(const struct meta_hdr *h[2], const int valid[2]);
/* Mirror i is marked stale in the other's header (a generation of its own);
 * the other must be usable.  0 or -errno. */
int meta_mark_stale(struct meta *m, int i);
/* The current header of an attached meta, or NULL if no mirror is usable. */
const struct meta_hdr *meta_hdr_of(struct meta *m);
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
/* room: slot entries to leave room for (nslots or more) */
void meta_init_hdr(struct meta_hdr *h, const uint8_t uuid[16], uint32_t mirror,
		   uint32_t block_size, uint64_t nslots, uint64_t room,
		   uint32_t nfiles, uint32_t ndevs);

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
/* The probe field as the headers say (0: not recorded), and its writing
 * into every mirror that takes writes. */
uint32_t meta_probe(struct meta *m);
int meta_set_probe(struct meta *m, uint32_t probe);
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
/*
 * A grow: member k (== ndevs), whose UUID is uuid, holds the next count
 * slots.  Their entries are zeroed (free) in each mirror, then each usable
 * header records the new member, mirror 0 first, each persisted before the
 * next is touched; m->layout follows.  0, or -errno (-ENOSPC: no room).
 */
int meta_grow(struct meta *m, int k, const uint8_t uuid[16], uint64_t count);
/* The tokens of the working members (tok[k] 0: leave member k's as it is):
 * first recorded as the ones being written (next 1), then, once they are on
 * the devices, as the members' (next 0), which clears the ones being
 * written. */
int meta_set_tokens(struct meta *m, const uint64_t tok[NVC_MAX_DEVS],
		    int next);
/* The names and st_rdevs members were last found at (meta_hdr.names), and
 * the recording of member k's (name NULL: none). */
void meta_member_names(struct meta *m, char names[NVC_MAX_DEVS][META_NAME_LEN],
		       uint64_t rdevs[NVC_MAX_DEVS]);
int meta_set_member_name(struct meta *m, int k, const char *name,
			 uint64_t rdev);
/* The recorded identity of a replace's new device and of a mirror replace's
 * new place (all zero: none), and their writing (id NULL: cleared). */
void meta_replace_id(struct meta *m, struct meta_ident *out);
int meta_set_replace_id(struct meta *m, const struct meta_ident *id);
void meta_mirror_id(struct meta *m, struct meta_ident *out);
int meta_set_mirror_id(struct meta *m, const struct meta_ident *id);
/* 1 if a file record may hold path (len bytes): see meta.c. */
int meta_path_ok(const char *path, uint32_t len);
/* 1 while a mirror still takes writes. */
int meta_writable(struct meta *m);

#endif
