/* fs: the store's space for a write, claimed as its caller when the write is
 * accepted (quotas and reserved blocks apply now, never at destage). */
#ifndef NVC_FS_CLAIM_H
#define NVC_FS_CLAIM_H

#include "cred.h"
#include "fs.h"

/*
 * Claim [off, off + len) of in's backing file (cf's) for who; 0, or the
 * store's refusal (-EDQUOT, -ENOSPC, ...).  *wfd is the handle's descriptor
 * for claims (-1 until its first), closed with the handle.
 */
int fs_claim(struct fs *fs, const struct fs_caller *who, struct fs_inode *in,
	     struct cfile *cf, int *wfd, uint64_t off, uint64_t len);

/* The file lost store space (truncated, a hole punched, changed on the
 * store): what was claimed is claimed again. */
void fs_claims_drop(struct fs_inode *in);

/* The inode goes: its claims with it. */
void fs_claims_free(struct fs_inode *in);

#endif
