"""The kernel protocol features negotiated through libfuse's custom io (fs/proto.c), proven with the daemon's
request counters (logged at unmount): no GETXATTR per write (FUSE_HANDLE_KILLPRIV_V2), setuid and setgid killed
by the daemon where the kernel asks, parallel O_DIRECT writes to one file, and coherence of direct and cached
opens of one file."""
import mmap
import os
import re
import stat
import threading

import pytest


NOBODY, NOGROUP = 65534, 65534


def counters(c):
    """The request counters the daemon logged at its last unmount."""
    lines = [ln for ln in c.log_text().splitlines() if "fuse requests:" in ln]
    assert lines, c.log_text()[-2000:]
    line = lines[-1]
    ops = {k: int(v) for k, v in re.findall(r" ([A-Z_]+|op\d+) (\d+)", line.split(";")[0])}
    cap = int(re.search(r"GETXATTR security.capability (\d+)", line).group(1))
    inflight = int(re.search(r"at most (-?\d+) WRITEs in flight", line).group(1))
    granted = line.split("granted", 1)[1].split()
    return ops, cap, inflight, granted


def as_user(fn, uid=NOBODY, gid=NOGROUP):
    """Run fn() in a forked child with the given ids and no capabilities; its exception text, or None."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        err = b""
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            fn()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            err = repr(e).encode() or b"error"
        os.write(w, err)
        os._exit(0)
    os.close(w)
    err = os.read(r, 4096)
    os.close(r)
    os.waitpid(pid, 0)
    return err.decode() or None


def write_some(path, flags=0, off=0):
    def fn():
        buf = mmap.mmap(-1, 4096)
        buf.write(b"u" * 4096)
        fd = os.open(path, os.O_WRONLY | flags)
        try:
            assert os.pwrite(fd, buf, off) == 4096
        finally:
            os.close(fd)
    return fn


def setuid_file(c, name, mode=0o6775, size=64 * 1024):
    """A file of nobody's with the given mode (setuid, setgid, group-executable by default)."""
    p = c.path(name)
    with open(p, "wb") as f:
        f.write(os.urandom(size))
    os.chown(p, NOBODY, NOGROUP)
    os.chmod(p, mode)
    assert stat.S_IMODE(os.stat(p).st_mode) == mode
    return p


def modes(c, name):
    """The file's mode as the store has it and as the mount shows it."""
    return (stat.S_IMODE(os.stat(os.path.join(c.backing, name)).st_mode),
            stat.S_IMODE(os.stat(c.path(name)).st_mode))


def test_writes_ask_no_getxattr_each(cache):
    """Without FUSE_HANDLE_KILLPRIV_V2 every write through the mount brought a GETXATTR of
    security.capability, a round trip under the kernel's inode lock: 100 writes, 100 GETXATTRs."""
    p = cache.path("f")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    for i in range(100):
        os.pwrite(fd, b"x" * 4096, i * 4096)
    os.close(fd)
    cache.unmount()
    ops, cap, _, granted = counters(cache)
    assert ops.get("WRITE") == 100, ops
    assert cap <= 1, (cap, ops)
    assert "KILLPRIV_V2" in granted, granted


# O_DIRECT opens go the kernel's direct write path (FOPEN_DIRECT_IO), which leaves the kill to the daemon even
# without FUSE_HANDLE_KILLPRIV_V2; buffered ones go the cached path, which leaves it to the daemon with it
OPENS = pytest.mark.parametrize("flags", [0, os.O_DIRECT], ids=["buffered", "odirect"])


@OPENS
def test_unprivileged_write_kills_setuid_and_group_exec_setgid(public_cache, flags):
    c = public_cache
    p = setuid_file(c, "f")
    assert as_user(write_some(p, flags)) is None
    assert modes(c, "f") == (0o775, 0o775)


@OPENS
def test_unprivileged_write_keeps_setgid_without_group_exec(public_cache, flags):
    """Without group execute, setgid marks mandatory locking and stays (the kernel's rule for FUSE)."""
    c = public_cache
    p = setuid_file(c, "f", mode=0o6765)
    assert as_user(write_some(p, flags)) is None
    assert modes(c, "f") == (0o2765, 0o2765)


@OPENS
def test_privileged_write_keeps_setuid(public_cache, flags):
    """A writer with CAP_FSETID (root here) keeps the bits, as on any file system."""
    c = public_cache
    p = setuid_file(c, "f")
    write_some(p, flags)()
    assert modes(c, "f") == (0o6775, 0o6775)


def test_unprivileged_truncate_kills_setuid(public_cache):
    c = public_cache
    p = setuid_file(c, "f")
    assert as_user(lambda: os.truncate(p, 100)) is None
    assert modes(c, "f") == (0o775, 0o775)
    assert os.stat(p).st_size == 100


def test_unprivileged_open_truncate_kills_setuid(public_cache):
    c = public_cache
    p = setuid_file(c, "f")
    assert as_user(lambda: os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))) is None
    assert modes(c, "f") == (0o775, 0o775)
    assert os.stat(p).st_size == 0


def test_unprivileged_create_of_own_setuid_file_keeps_it(public_cache):
    """O_CREAT | O_TRUNC making a new file truncates nothing: the mode asked for stays."""
    c = public_cache
    os.chmod(c.mnt, 0o777)
    p = c.path("new")
    assert as_user(lambda: os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o4755))) is None
    assert modes(c, "new") == (0o4755, 0o4755)


def test_chown_kills_setuid(public_cache):
    c = public_cache
    p = setuid_file(c, "f")
    os.chown(p, 0, 0)
    assert modes(c, "f")[0] & 0o4000 == 0
    assert modes(c, "f")[1] & 0o4000 == 0


@OPENS
def test_unprivileged_write_kills_file_capability(public_cache, flags):
    import struct
    c = public_cache
    p = setuid_file(c, "f", mode=0o775)
    os.setxattr(p, "security.capability", struct.pack("<IIIII", 0x02000001, 1 << 10, 0, 0, 0))
    assert os.getxattr(os.path.join(c.backing, "f"), "security.capability")
    assert as_user(write_some(p, flags)) is None
    for where in (c.backing, c.mnt):
        with pytest.raises(OSError) as e:
            os.getxattr(os.path.join(where, "f"), "security.capability")
        assert e.value.errno == 61  # ENODATA


def test_unprivileged_write_data_lands(public_cache):
    """The kill does not get in the way of the data (compared byte for byte, through the mount and after a
    flush on the store)."""
    c = public_cache
    p = setuid_file(c, "f", size=8192)
    with open(p, "rb") as f:
        exp = bytearray(f.read())
    assert as_user(write_some(p, 0, off=4096)) is None
    exp[4096:8192] = b"u" * 4096
    with open(p, "rb") as f:
        assert f.read() == bytes(exp)
    c.flush()
    with open(os.path.join(c.backing, "f"), "rb") as f:
        assert f.read() == bytes(exp)


def aligned(data):
    buf = mmap.mmap(-1, len(data))
    buf.write(data)
    return buf


def test_direct_writes_to_one_file_run_in_parallel(cache):
    """O_DIRECT writes inside the file to one file reach the daemon side by side
    (FOPEN_PARALLEL_DIRECT_WRITES): the kernel's inode lock no longer takes them one at a time."""
    p = cache.path("f")
    nthreads, per, bs = 4, 300, 4096
    size = nthreads * per * bs
    with open(p, "wb") as f:
        f.truncate(size)
    exp = bytearray(size)
    pats = [os.urandom(bs) for _ in range(nthreads)]
    errors = []
    fd = os.open(p, os.O_RDWR | os.O_DIRECT)

    def writer(t):
        try:
            buf = aligned(pats[t])
            for i in range(per):
                off = (i * nthreads + t) * bs
                assert os.pwrite(fd, buf, off) == bs
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ths = [threading.Thread(target=writer, args=(t,)) for t in range(nthreads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    os.close(fd)
    assert not errors, errors
    for t in range(nthreads):
        for i in range(per):
            off = (i * nthreads + t) * bs
            exp[off:off + bs] = pats[t]
    with open(p, "rb") as f:
        assert f.read() == bytes(exp)
    cache.unmount()
    ops, _, inflight, granted = counters(cache)
    assert ops.get("WRITE", 0) >= nthreads * per, ops
    assert inflight > 1, (inflight, ops)
    assert "DIRECT_IO_ALLOW_MMAP" in granted, granted
    cache.mount()
    with open(p, "rb") as f:
        assert f.read() == bytes(exp)


def test_direct_and_cached_opens_of_one_file_agree(cache):
    """A buffered and an O_DIRECT descriptor of one file see each other's writes at once, both ways."""
    p = cache.path("f")
    exp = bytearray(os.urandom(64 * 1024))
    with open(p, "wb") as f:
        f.write(exp)
    bfd = os.open(p, os.O_RDWR)
    dfd = os.open(p, os.O_RDWR | os.O_DIRECT)
    try:
        assert os.pread(bfd, len(exp), 0) == bytes(exp)  # the page cache holds the file now
        for i in range(8):
            data = os.urandom(4096)
            off = i * 8192
            if i % 2:
                os.pwrite(bfd, data, off)
            else:
                assert os.pwrite(dfd, aligned(data), off) == 4096
            exp[off:off + 4096] = data
            assert os.pread(bfd, len(exp), 0) == bytes(exp)
            rbuf = mmap.mmap(-1, len(exp))
            assert os.preadv(dfd, [rbuf], 0) == len(exp)
            assert rbuf[:] == bytes(exp)
        # past the end: a direct write that extends the file, seen by the buffered reader
        tail = os.urandom(4096)
        assert os.pwrite(dfd, aligned(tail), len(exp)) == 4096
        exp += tail
        assert os.fstat(bfd).st_size == len(exp)
        assert os.pread(bfd, len(exp) + 10, 0) == bytes(exp)
    finally:
        os.close(bfd)
        os.close(dfd)
    cache.flush()
    with open(os.path.join(cache.backing, "f"), "rb") as f:
        assert f.read() == bytes(exp)


def test_shared_map_of_a_direct_open(cache):
    """MAP_SHARED of an O_DIRECT descriptor still works (FUSE_DIRECT_IO_ALLOW_MMAP), and the map and direct
    writes see each other."""
    p = cache.path("f")
    exp = bytearray(os.urandom(32 * 1024))
    with open(p, "wb") as f:
        f.write(exp)
    fd = os.open(p, os.O_RDWR | os.O_DIRECT)
    try:
        m = mmap.mmap(fd, len(exp), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        assert m[:] == bytes(exp)
        m[100:200] = b"m" * 100
        exp[100:200] = b"m" * 100
        m.flush()
        rbuf = mmap.mmap(-1, len(exp))
        assert os.preadv(fd, [rbuf], 0) == len(exp)
        assert rbuf[:] == bytes(exp)
        data = os.urandom(4096)
        assert os.pwrite(fd, aligned(data), 8192) == 4096
        exp[8192:12288] = data
        assert m[:] == bytes(exp)
        m.close()
    finally:
        os.close(fd)
    with open(p, "rb") as f:
        assert f.read() == bytes(exp)


@OPENS
def test_bits_and_capability_set_after_a_write_are_killed_by_the_next(public_cache, flags):
    """The daemon remembers files it found without a capability (fs/killpriv.c) until their ctime moves: a
    capability or setuid bit set after one write is gone after the next."""
    import struct
    c = public_cache
    p = setuid_file(c, "f", mode=0o775)
    for _ in range(3):
        assert as_user(write_some(p, flags)) is None
    os.setxattr(p, "security.capability", struct.pack("<IIIII", 0x02000001, 1 << 10, 0, 0, 0))
    assert as_user(write_some(p, flags)) is None
    with pytest.raises(OSError) as e:
        os.getxattr(os.path.join(c.backing, "f"), "security.capability")
    assert e.value.errno == 61  # ENODATA
    os.chmod(p, 0o4775)
    assert as_user(write_some(p, flags)) is None
    assert modes(c, "f") == (0o775, 0o775)
