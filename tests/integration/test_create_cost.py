"""What a create through the mount asks of the backing store (issue 10: creates over GlusterFS were half as
fast as on the store alone; on a distributed store every call on a backing file is a round trip)."""
import os
import re

import pytest

from test_hardening_fs import strace

N = 20
TRACED = "trace=fchownat,fchown,openat,open,fgetxattr,fsetxattr,newfstatat,statx"


def created(cache, d):
    data = {}
    for i in range(N):
        p = os.path.join(d, f"f{i:03d}")
        data[p] = os.urandom(4096)
        with open(p, "xb") as f:
            f.write(data[p])
    return data


@pytest.mark.parametrize("cache", ["local", "gluster", "moosefs", "ceph"], indirect=True)
def test_create_by_the_daemons_user_asks_only_what_it_must(cache):
    """A file created by the daemon's own user (root here) is already the caller's: no chown. The
    descriptor that made it serves its writes: it is not reopened. It cannot carry an identity stamp yet:
    the stamp is set without being looked for first."""
    d = cache.path("d")
    os.mkdir(d)
    out = os.path.join(cache.tmp, "create.strace")
    with strace(cache.proc.pid, out, "-e", TRACED):
        data = created(cache, d)
    with open(out) as f:
        lines = f.read().splitlines()
    creates = [ln for ln in lines if re.search(r'openat\(\d+, "f\d{3}", [^)]*O_CREAT', ln)]
    chowns = [ln for ln in lines if "chown" in ln]
    stamp_reads = [ln for ln in lines if "fgetxattr(" in ln and "nvcachefs.id" in ln]
    stamp_sets = [ln for ln in lines if "fsetxattr(" in ln and "nvcachefs.id" in ln]
    reopens = [ln for ln in lines if re.search(r'open(at)?\([^,]*"/proc/self/fd/\d+", O_(RDWR|WRONLY)', ln)]
    assert len(creates) == N, "\n".join(lines[:40])
    assert not chowns, "a new file of the daemon's own user was chowned:\n" + "\n".join(chowns[:5])
    assert not reopens, "a new file was opened again for writing:\n" + "\n".join(reopens[:5])
    assert not stamp_reads, "the identity stamp of a new file was looked for:\n" + "\n".join(stamp_reads[:5])
    assert len(stamp_sets) == N, "\n".join(lines[:40])
    # and the files are as written, with their creator as owner, through the mount and on the store
    cache.flush()
    for p, want in data.items():
        st = os.stat(p)
        assert (st.st_uid, st.st_gid, st.st_size) == (0, 0, len(want))
        with open(p, "rb") as f:
            assert f.read() == want
        with open(os.path.join(cache.backing, "d", os.path.basename(p)), "rb") as f:
            assert f.read() == want
