"""Issue 25, findings 9-12 (found by xfstests generic/451, 615, 423, 467), through the real mount: what a
buffered read sees after an asynchronous O_DIRECT write, st_blocks of data only in the cache, ctime of a
write, and a second open of an unlinked file with dirty data."""
import ctypes
import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


@pytest.fixture(scope="module")
def aio_dio_cycle(tmp_path_factory):
    """The C check of generic/451 (aio_dio_cycle.c), built with liburing (a build dependency)."""
    exe = str(tmp_path_factory.mktemp("aio") / "aio_dio_cycle")
    subprocess.run(["cc", "-O1", "-o", exe, os.path.join(HERE, "aio_dio_cycle.c"), "-luring", "-lpthread"],
                   check=True)
    return exe


@pytest.fixture
def fresh_attrs(make_cache):
    """A mounted cache whose kernel caches no attributes: every stat asks the daemon."""
    c = make_cache(extra={"fuse.attr_timeout": "0"})
    c.format()
    c.mount()
    yield c
    if c.proc:
        c.unmount()


@pytest.fixture
def store_without_fallocate(tmp_path):
    """A 24 MiB ext4 file system without extents as the store: it has no fallocate, so a write claims no store
    space (fs/claim.c) and its data is only in the cache until destage, as for a writer with
    CAP_SYS_RESOURCE (set up before the cache, torn down after it)."""
    img = tmp_path / "store.img"
    with open(img, "wb") as f:
        f.truncate(24 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^extent,^64bit", str(img)], check=True)
    mnt = tmp_path / "store"
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    yield str(mnt)
    if subprocess.run(["umount", str(mnt)], check=False).returncode:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_buffered_read_sees_a_completed_async_direct_write(cache, aio_dio_cycle):
    """generic/451: buffered readers fill the page cache while an io_uring O_DIRECT write rewrites the file;
    once the write has completed, a buffered read must return its bytes, not the page cache's old ones: through
    a descriptor open all along (the daemon drops the range before it answers the write), and through a new
    one, also when no buffered descriptor stayed open over the write (the open drops the page cache)."""
    for name, args in (("f", ["3"]), ("g", ["2", "closed"])):
        r = subprocess.run([aio_dio_cycle, cache.path(name)] + args, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"stale data after an async direct write ({args}): {r.stdout} {r.stderr}"


def test_st_blocks_count_data_only_in_the_cache(store_without_fallocate, make_cache, tmp_path):
    """generic/615: a file whose data is only in the cache must not show st_blocks 0 (tar --sparse, cp
    --sparse=auto and backup tools take that for a hole and copy zeros); st_blocks * 512 covers the data
    before destage and after it."""
    cache = make_cache(extra={"backing.path": store_without_fallocate, "fuse.attr_timeout": "0"})
    cache.format()
    cache.mount()
    data = os.urandom(MiB)
    p = cache.path("f")
    with open(p, "wb") as f:
        f.write(data)
    st = os.stat(p)
    assert st.st_blocks >= MiB // 512, f"st_blocks {st.st_blocks} for 1 MiB in the cache"
    assert st.st_blocks <= MiB // 512 + 64, f"st_blocks {st.st_blocks}: more than the file's size"
    # tar --sparse archives a file of 0 blocks as one hole
    arch, out = str(tmp_path / "a.tar"), tmp_path / "x"
    out.mkdir()
    subprocess.run(["tar", "--sparse", "-C", cache.mnt, "-cf", arch, "f"], check=True)
    subprocess.run(["tar", "-C", str(out), "-xf", arch], check=True)
    with open(out / "f", "rb") as f:
        assert f.read() == data, "tar --sparse copied the cached data as a hole"
    subprocess.run(["cp", "--sparse=auto", p, str(tmp_path / "c")], check=True)
    with open(tmp_path / "c", "rb") as f:
        assert f.read() == data
    cache.flush()
    assert os.stat(os.path.join(cache.backing, "f")).st_blocks >= MiB // 512
    assert os.stat(p).st_blocks >= MiB // 512, "st_blocks after destage"
    cache.unmount()


def test_a_write_moves_ctime_and_destage_does_not(fresh_attrs):
    """generic/423: a write changes mtime and ctime together (POSIX), and destage, long after, with no user
    operation, must not make ctime jump."""
    cache = fresh_attrs
    import time
    p = cache.path("f")
    with open(p, "wb") as f:
        f.write(b"a" * 4096)
    cache.flush()
    before = os.stat(p)
    time.sleep(0.05)
    with open(p, "r+b") as f:
        f.write(b"b" * 4096)
    st = os.stat(p)
    assert st.st_mtime_ns > before.st_mtime_ns
    assert st.st_ctime_ns >= st.st_mtime_ns, f"ctime {st.st_ctime_ns} before mtime {st.st_mtime_ns} after a write"
    time.sleep(0.05)
    cache.flush()
    assert os.stat(os.path.join(cache.backing, "f")).st_ctime_ns > st.st_ctime_ns, \
        "the store's ctime did not move at destage: the test cannot tell"
    after = os.stat(p)
    assert (after.st_mtime_ns, after.st_ctime_ns) == (st.st_mtime_ns, st.st_ctime_ns), \
        "destage moved the times the mount shows"
    # a change of metadata through the mount still moves ctime, past the write's
    time.sleep(0.05)
    os.chmod(p, 0o600)
    assert os.stat(p).st_ctime_ns > st.st_ctime_ns, "chmod after destage did not move ctime"


class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * 128)]


def test_a_second_open_of_an_unlinked_open_file_sees_its_dirty_data(fresh_attrs):
    """generic/467: a file with dirty data, still open, loses its last name; opened again by handle
    (name_to_handle_at before the unlink, open_by_handle_at on the mount) or through /proc/self/fd/N, it must
    show the size and the data the open descriptor sees, not the store's empty file."""
    cache = fresh_attrs
    libc = ctypes.CDLL(None, use_errno=True)
    data = os.urandom(256 * 1024)
    p = cache.path("f")
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    mfd = os.open(cache.mnt, os.O_RDONLY | os.O_DIRECTORY)
    again = []
    try:
        assert os.write(fd, data) == len(data)
        fh, mnt_id = FileHandle(), ctypes.c_int()
        fh.handle_bytes = 128
        assert libc.name_to_handle_at(-100, p.encode(), ctypes.byref(fh), ctypes.byref(mnt_id), 0) == 0, \
            os.strerror(ctypes.get_errno())
        assert os.stat(os.path.join(cache.backing, "f")).st_size == 0, "destaged already: the test cannot tell"
        os.unlink(p)
        again = [os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)]
        h = libc.open_by_handle_at(mfd, ctypes.byref(fh), os.O_RDONLY)
        assert h >= 0, "open_by_handle_at: " + os.strerror(ctypes.get_errno())
        again.append(h)
        for how, g in zip(("/proc/self/fd", "by handle"), again):
            assert os.fstat(g).st_size == len(data), f"an open {how} of the unlinked file: size"
            assert os.pread(g, len(data) + 1, 0) == data, f"an open {how} of the unlinked file: data"
        assert os.pread(fd, len(data) + 1, 0) == data
    finally:
        for g in again:
            os.close(g)
        os.close(mfd)
        os.close(fd)
