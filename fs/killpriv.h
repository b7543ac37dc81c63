/* fs: killing setuid, setgid and file capabilities of a backing file when the
 * kernel asks (FUSE_HANDLE_KILLPRIV_V2, direct writes). */
#ifndef NVC_FS_KILLPRIV_H
#define NVC_FS_KILLPRIV_H

#include "fs.h"

/* Drop in's backing file's S_ISUID, its S_ISGID if group-executable and its
 * security.capability, as the kernel would; the kernel's attributes of ino
 * then go.  0 or -errno. */
int fs_kill_privs(struct fs *fs, fuse_ino_t ino, struct fs_inode *in);
/* The same for a write through an open file, whose descriptor for this is
 * *kfd (-1 until the first call makes it; the caller closes it). */
int fs_kill_privs_fh(struct fs *fs, fuse_ino_t ino, struct fs_inode *in,
		     int *kfd);

#endif
