/* cache/mngt: management on top: open and recovery, replace, rebuild, grow, remove, detach, warm and pin, check; what its files share (nothing above it but the interface, cache.h). */
#ifndef NVC_MNGT_H
#define NVC_MNGT_H

#include "../clean/clean.h"

/* filectl.c: pins and warms */
/* At open, after recovery: pinned files' partial last pages read again. */
void pin_reload_tails(struct cache *c);

/* rebuild.c: a member copied onto its successor */
/* Member k's blocks copied onto nd, which shadows it from now on (steps 1
 * to 3 of rebuild.c); 0, or -errno with err set (and the shadow gone). */
int rebuild_onto(struct cache *c, int k, struct dev *nd, cache_progress_fn fn,
		 void *arg, char *err, size_t errlen);
/* The rebuild over: old has no shadow, no member is shown rebuilding. */
void rebuild_end(struct cache *c, struct dev *old);
/* No I/O begun before a device swap is still under way (step 4). */
void rebuild_settle(struct cache *c);
/* Every dirty block without a second copy gets one (step 5); how many
 * could not (no room: destage takes them). */
uint64_t rebuild_twins(struct cache *c);

/* recover.c: the mount's recovery */
int recover_load(struct cache *c, char *err, size_t errlen);
/* cache_open_devs with what a mount by name found: missing, the
 * member (index + 1) found missing (a stand-in, its superblock not read);
 * detached, the headers say detached (every device a stand-in). */
int recover_open(struct cache_config *cfg, struct dev **devs, int ndev,
		 struct pm_region mirrors[2], int backing_fd, int missing,
		 int detached, struct cache **out, char *err, size_t errlen);
void file_check_backing(struct cache *c, struct cfile *f);
/* 0 if dev holds member d of this cache, fitting its geometry;
 * else -EINVAL with err naming what is wrong. */
int cache_sb_fits(struct cache *c, struct dev *dev, int d, char *err,
		  size_t errlen);
/* Slot i as a mount finds it before recovery: fresh, on no
 * list (a grow readies the slots it adds with it too). */
void cache_slot_init(struct cache *c, uint64_t i);

/* fpolicy.c: policies applied to files */
/* f becomes bypass: its dirty data destaged, its slots dropped. */
int file_to_bypass(struct cache *c, struct cfile *f);

/* replace.c: replace, remove and their resumption */
/* Resume at mount a replace, remove, detach or mirror replace
 * cut short (on a thread of its own, joined at close). */
int devlife_resume_start(struct cache *c);
void devlife_resume_join(struct cache *c);
/* Member k's superblock (count slots) on nd under uuid (NULL:
 * a new one), which members[k] takes; flushed.  0, or -errno with err
 * set. */
int member_sb_write(struct cache *c, int k, uint64_t count, struct dev *nd,
		    uint8_t members[NVC_MAX_DEVS][16], const uint8_t *uuid,
		    char *err, size_t errlen);
/* 1 if the headers record the members' UUIDs (a device-life
 * change needs them); else 0 with err saying to `what` offline. */
int devlife_identified(struct cache *c, const char *what, char *err,
		       size_t errlen);

/* mirror.c: replace-mirror and following a replaced mirror */
/* cache_replace_mirror; resumed: new_path was recorded by a
 * replace cut short, which may have left a file there. */
int mirror_replace(struct cache *c, const char *old, const char *new_path,
		   int resumed, char *err, size_t errlen);
/* Which valid header (0, 1) records a replace of mirror k, the newer if
 * both do; -1: none. */
int mirror_forward_of(const struct meta_hdr *const h[2], const int valid[2],
		      int k);
/* Mapped region s is the new place a mirror replace of mirror k recorded
 * (id, or a block device renumbered) in a header of generation gen, and
 * holds a valid header of set for mirror k, no older, and is not other:
 * the copy finished there (the essay in mirror.c). */
int mirror_successor_ok(const uint8_t set_uuid[16],
			const struct meta_ident *id, uint64_t gen, int k,
			const struct pm_region *other,
			const struct pm_region *s);
/* At a mount or a check, the places names[] mapped into m[] (mret[k] 0
 * where a valid header is loaded): one that a replace-mirror replaced is
 * given up for its successor (m[k], mret[k] and total[k] become the new
 * place's, and followed[k] its name, allocated), or marked stale in
 * mret/why when it may have missed writes.  0, or -errno with err set. */
int mirror_follow(const char *const names[2], struct pm_region m[2],
		  int mret[2], char why[2][256], uint64_t total[2],
		  char *followed[2], char *err, size_t errlen);
/* Tests (the crash harness): maps the place at path instead of pm_map_err,
 * into a region mirror_follow then owns. */
extern int (*mirror_test_place)(const char *path, struct pm_region *out);

/* detach.c: detach and attach */
/* Device d becomes dev, in state state (stats.h); the old one is
 * returned, no longer used by anyone. */
struct dev *cache_dev_swap(struct cache *c, int d, struct dev *dev,
			   int state);
/* The headers said detached at mount: every file bypass. */
void detach_at_mount(struct cache *c);

/* grow.c: add and grow */
/* The fewest slots a grown member holds */
#define GROW_MIN_SLOTS 4
/* nd becomes member ndevs with slots of its own (devlife_lock
 * held).  0, or -errno with err set (nd is the caller's then). */
int grow_run(struct cache *c, struct dev *nd, char *err, size_t errlen);
/* The free list in stripe order, so that allocation spreads over
 * every member (c->lock held).  0, or -ENOMEM with it unchanged. */
int grow_interleave_locked(struct cache *c);

/*
 * devid.c: devices and places known by what they are, never by a name alone.
 * Nothing outside the data path writes to a device before one of these said
 * it may: a new one (devid_new_dev, devid_new_place) or the one a replace
 * cut short recorded (devid_prove_dev, devid_prove_place).
 */
/* The name cache.devices gives member d's listed place, or the
 * name a member grown since the mount was added by. */
const char *cache_listed_name(struct cache *c, int d);
/* 1 while a device-life command is to stop: the cache stops, or an unmount
 * began (cache_devlife_stop). */
int devlife_stopping(struct cache *c);
/* Member k by a name of it: "UUID=" its UUID, or any name (symbolic links
 * followed) of its open device (st_rdev; st_dev and st_ino of a file), or
 * the name it was opened or listed by; c->ndevs if none. */
int devid_member(struct cache *c, const char *name);
/* path may take a member place of min_slots slots (add, replace, grow): no
 * signature libblkid knows, no nvcachefs superblock of another cache or of
 * a member of this one, no mirror header, not the same device or file as a
 * member, a name of one, or a metadata mirror; opened (O_EXCL) into *out.
 * 0, or -errno with err set. */
int devid_new_dev(struct cache *c, const char *path, uint64_t min_slots,
		  struct dev **out, char *err, size_t errlen);
/* path may take a metadata mirror's place: nothing there (a new file), or a
 * block device passing the same checks.  0, or -errno with err set. */
int devid_new_place(struct cache *c, const char *path, char *err,
		    size_t errlen);
/* d's identity under uuid: st_rdev or st_dev and st_ino, its size. */
void devid_of(struct dev *d, const uint8_t uuid[16], struct meta_ident *id);
/* The device at path is the one id recorded (its superblock this cache's
 * under id->uuid, the same st_rdev or file, the same size, no other
 * signature in its superblock area), and still no member or mirror of this
 * cache, large enough for min_slots slots; opened into *out.  0, or
 * -errno with err saying what is there. */
int devid_prove_dev(struct cache *c, const char *path,
		    const struct meta_ident *id, uint64_t min_slots,
		    struct dev **out, char *err, size_t errlen);
/* The mirror place r (mapped, PM_NEW) claimed for this cache: a claim
 * header written at its start and persisted, and its identity in *id. */
int devid_claim_place(struct cache *c, struct pm_region *r,
		      struct meta_ident *id);
/* Region r (mapped) is the place id recorded: the same block device
 * (st_rdev) or file (st_dev, st_ino); 0 for an identity not recorded. */
int devid_place_is(const struct pm_region *r, const struct meta_ident *id);
/* ... and its first 4 KiB are zero or set's claim under id: a mirror
 * replace's copy never finished there. */
int devid_place_unfinished(const struct pm_region *r,
			   const uint8_t set_uuid[16],
			   const struct meta_ident *id);
/* The place at path is the one id recorded: the same block device or file,
 * the same size, and its first 4 KiB zero (a copy under way), our claim or
 * a mirror header of this cache.  0 (also when nothing is there: -ENOENT
 * in *gone), or -errno with err saying what is there. */
int devid_prove_place(struct cache *c, const char *path,
		      const struct meta_ident *id, int *gone, char *err,
		      size_t errlen);

/* mount.c: the mount */
/* Where each working member was found (its device's name, or a by-id link
 * to it), recorded in the headers where that changed: the next mount's and
 * attach's candidates (members.c).  recover.c; called at mount, and once
 * after a replace, an add, a grow or an attach has put its devices in use. */
void cache_note_member_names(struct cache *c);
/* A new token in each working member's superblock and in the headers
 * (recover.c, "Tokens"); at mount. */
void cache_note_tokens(struct cache *c);

#endif
