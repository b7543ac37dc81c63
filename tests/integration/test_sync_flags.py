"""Issue 25, finding 1: a per-write sync flag (pwritev2 RWF_DSYNC / RWF_SYNC, as io_uring and libaio users
write) on an O_DIRECT handle, and any O_DIRECT write on a `-o sync` mount, is acknowledged only once it is
durable: the kernel sends no FSYNC for a direct-I/O file and puts the flag into the write's own flags, which
the daemon must read, not only the flags the file was opened with."""
import mmap
import os

import pytest


def flushes(c):
    return sum(d["counters"]["flush_ops"] for d in c.stats()["devices"])


def direct_write(path, flags, byte=b"d"):
    """One 4 KiB O_DIRECT pwritev2 with flags; the file's descriptor closed after."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    buf = mmap.mmap(-1, 4096)
    buf.write(byte * 4096)
    try:
        assert os.pwritev(fd, [buf], 0, flags) == 4096
    finally:
        os.close(fd)


# A page's first write is FUA (durable without a flush: the map does not claim the page yet); a rewrite of a
# page the map claims is a plain device write, which a sync flag must follow with a flush.
@pytest.mark.parametrize("flag", ["RWF_DSYNC", "RWF_SYNC"])
def test_per_write_sync_flag_on_a_direct_handle_flushes_the_device(cache, flag):
    for name in ("plain", "synced"):
        direct_write(cache.path(name), 0)
    before = flushes(cache)
    direct_write(cache.path("plain"), 0, b"p")
    plain = flushes(cache)
    direct_write(cache.path("synced"), getattr(os, flag), b"s")
    after = flushes(cache)
    assert plain == before, "a plain direct rewrite flushed the device: the test cannot tell"
    assert after > plain, f"a direct write with {flag} was acknowledged without a device flush"
    with open(cache.path("synced"), "rb") as f:
        assert f.read() == b"s" * 4096


def test_direct_write_on_a_sync_mount_flushes_the_device(make_cache):
    c = make_cache()
    c.format()
    c.mount("sync")
    try:
        direct_write(c.path("f"), 0)
        before = flushes(c)
        direct_write(c.path("f"), 0, b"r")
        assert flushes(c) > before, "a direct rewrite on a -o sync mount was acknowledged without a flush"
    finally:
        c.unmount()
