"""The data path through the real mount, compared byte for byte with a plain directory."""
import mmap
import os
import threading

import pytest

from workload import MiB, assert_same_tree, run_workload

# these run three times: over a local backing directory, and over GlusterFS and MooseFS (dfs.py, conftest)
ON_STORES = pytest.mark.parametrize("cache", ["local", "gluster", "moosefs", "ceph"], indirect=True)


@ON_STORES
def test_random_workload_then_flush_and_unmount(cache, tmp_path):
    ref = tmp_path / "ref"
    ref.mkdir()
    ops = run_workload(cache.mnt, str(ref), nthreads=4, steps=250)
    assert ops == 1000
    assert_same_tree(cache.mnt, ref)
    st = cache.stats()
    assert st["write_ops"] > 0 and st["read_ops"] > 0
    cache.flush()
    assert cache.stats()["dirty_bytes"] == 0
    assert_same_tree(cache.backing, ref)
    assert cache.unmount() == 0
    assert_same_tree(cache.backing, ref)
    cache.mount()
    assert_same_tree(cache.mnt, ref)


@ON_STORES
def test_unaligned_small_writes_do_not_lose_neighbours(cache):
    p = cache.path("f")
    base = os.urandom(3 * 65536 + 100)
    with open(p, "wb") as f:
        f.write(base)
    cache.flush()
    cache.unmount()
    cache.mount()  # nothing cached now: every small write lands in an uncached block
    exp = bytearray(base)
    fd = os.open(p, os.O_RDWR)
    for off, data in [(5, b"abc"), (4095, b"xy"), (65536 * 2 + 7, b"z" * 9000), (len(base) - 1, b"END")]:
        os.pwrite(fd, data, off)
        exp[off:off + len(data)] = data
    os.close(fd)
    with open(p, "rb") as f:
        assert f.read() == bytes(exp)
    cache.flush()
    with open(os.path.join(cache.backing, "f"), "rb") as f:
        assert f.read() == bytes(exp)


@ON_STORES
def test_sparse_holes_and_truncate(cache):
    p = cache.path("sparse")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"tail", 10 * MiB + 3)
    assert os.fstat(fd).st_size == 10 * MiB + 7
    assert os.pread(fd, 4096, 5 * MiB) == b"\0" * 4096
    os.pwrite(fd, b"A" * 10000, 100)
    os.ftruncate(fd, 5000)          # down into the dirty block
    os.ftruncate(fd, 3 * MiB)       # and up again: the cut bytes must read as zeros
    data = os.pread(fd, 3 * MiB, 0)
    assert data[:100] == b"\0" * 100
    assert data[100:5000] == b"A" * 4900
    assert data[5000:] == b"\0" * (3 * MiB - 5000)
    os.close(fd)
    cache.flush()
    with open(os.path.join(cache.backing, "sparse"), "rb") as f:
        assert f.read() == data


# not over GlusterFS: its client itself answers fchmod and fsetxattr on an open, unlinked file with ESTALE
@pytest.mark.parametrize("cache", ["local", "moosefs", "ceph"], indirect=True)
def test_unlink_open_file_and_hard_links(cache):
    a, b = cache.path("a"), cache.path("b")
    with open(a, "wb") as f:
        f.write(b"1" * 100000)
    os.link(a, b)
    with open(b, "r+b") as f:
        f.write(b"2" * 10)
    with open(a, "rb") as f:
        assert f.read(12) == b"2" * 10 + b"11"
    fd = os.open(a, os.O_RDWR)
    os.unlink(a)
    os.unlink(b)
    os.pwrite(fd, b"still here", 0)
    assert os.pread(fd, 10, 0) == b"still here"
    # attributes, times, mode and xattrs of the open, unlinked file
    assert os.fstat(fd).st_size == 100000 and os.fstat(fd).st_nlink == 0
    os.fchmod(fd, 0o600)
    os.ftruncate(fd, 50)
    assert os.fstat(fd).st_mode & 0o777 == 0o600 and os.fstat(fd).st_size == 50
    os.setxattr(fd, "user.k", b"v")
    assert os.getxattr(fd, "user.k") == b"v"
    os.close(fd)
    assert os.listdir(cache.mnt) == []
    cache.flush()
    assert cache.stats()["dirty_bytes"] == 0
    assert os.listdir(cache.backing) == []


@ON_STORES
def test_rename_with_dirty_data(cache):
    d = os.urandom(300000)
    with open(cache.path("x"), "wb") as f:
        f.write(d)
    os.mkdir(cache.path("dir"))
    os.rename(cache.path("x"), cache.path("dir", "y"))
    with open(cache.path("dir", "y"), "rb") as f:
        assert f.read() == d
    cache.flush()
    with open(os.path.join(cache.backing, "dir", "y"), "rb") as f:
        assert f.read() == d


@ON_STORES
def test_shared_writable_mmap(cache):
    p = cache.path("m")
    with open(p, "wb") as f:
        f.truncate(1 * MiB)
    with open(p, "r+b") as f:
        m = mmap.mmap(f.fileno(), 1 * MiB)
        m[4096:8192] = b"m" * 4096
        m[-3:] = b"end"
        m.flush()
        m.close()
    cache.unmount()   # the kernel page cache is gone; data must come from the cache
    cache.mount()
    with open(p, "rb") as f:
        data = f.read()
    assert data[4096:8192] == b"m" * 4096 and data[-3:] == b"end" and data[:4096] == b"\0" * 4096


def test_many_threads_one_file(cache):
    p = cache.path("shared")
    chunk = 192 * 1024
    n = 16
    with open(p, "wb"):
        pass
    blobs = [os.urandom(chunk) for _ in range(n)]

    def writer(i):
        fd = os.open(p, os.O_WRONLY)
        for k in range(0, chunk, 12288):
            os.pwrite(fd, blobs[i][k:k + 12288], i * chunk + k)
        os.close(fd)

    ts = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    with open(p, "rb") as f:
        assert f.read() == b"".join(blobs)


@pytest.mark.parametrize("copies", ["1", "2"])
def test_cache_much_smaller_than_data(make_cache, tmp_path, copies):
    c = make_cache(dev_size=12 * MiB, extra={"destage.high_watermark": "60", "destage.low_watermark": "20",
                                             "cache.dirty_copies": copies})
    c.format()
    c.mount()
    ref = tmp_path / f"ref{copies}"
    ref.mkdir()
    # about 20 MiB of cache, far more data written through it
    for i in range(6):
        blob = os.urandom(16 * MiB)
        for root in (c.mnt, str(ref)):
            with open(os.path.join(root, f"big{i}"), "wb") as f:
                for k in range(0, len(blob), MiB):
                    f.write(blob[k:k + MiB])
    run_workload(c.mnt, str(ref), nthreads=3, steps=150, max_size=8 * MiB)
    assert_same_tree(c.mnt, ref)
    st = c.stats()
    assert st["evictions"] > 0 and st["destaged_bytes"] > 0
    assert c.unmount() == 0
    assert_same_tree(c.backing, ref)


def test_hostile_offsets_refused_and_nothing_stuck(cache):
    import errno
    p = cache.path("h")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"keep", 0)
    for off in (1 << 50, (1 << 62) + 5):
        try:
            os.pwrite(fd, b"x" * 4096, off)
            raise AssertionError(f"write at {off} accepted")
        except OSError as e:
            assert e.errno == errno.EFBIG, e
    try:
        os.ftruncate(fd, 1 << 50)
        raise AssertionError("truncate accepted")
    except OSError as e:
        assert e.errno == errno.EFBIG
    assert os.pread(fd, 100, 1 << 40) == b""
    assert os.fstat(fd).st_size == 4
    os.close(fd)
    cache.flush()   # nothing un-destageable is left dirty
    assert cache.stats()["dirty_bytes"] == 0
    with open(os.path.join(cache.backing, "h"), "rb") as f:
        assert f.read() == b"keep"


def test_writethrough_and_writearound(make_cache):
    for mode in ("writethrough", "writearound"):
        # the cache's own writearound path, counted in its stats (passthrough: test_passthrough.py)
        c = make_cache(extra={"cache.mode": mode, "fuse.passthrough": "off"})
        c.format()
        c.mount()
        d = os.urandom(3 * MiB + 77)
        with open(c.path("f"), "wb") as f:
            f.write(d)
        st = c.stats()
        assert st["dirty_bytes"] == 0
        with open(os.path.join(c.backing, "f"), "rb") as f:
            assert f.read() == d        # the backing store has it before any destage
        with open(c.path("f"), "rb") as f:
            assert f.read() == d
        st = c.stats()
        if mode == "writearound":
            assert st["bypass_ops"] > 0
        else:
            assert st["read_hit_bytes"] > 0 and st["bypass_ops"] == 0
        assert c.unmount() == 0
        with open(os.path.join(c.backing, "f"), "rb") as f:
            assert f.read() == d
