"""nvcachefs in front of real distributed stores (GlusterFS, MooseFS; dfs.py): data, the scenarios of issue 10
(wrong file, crash, stale handles, two nodes, conflicts, lost+found), byte for byte."""
import glob
import os
import time

import pytest

from dfs import CTL_TIMEOUT, drop_caches

MiB = 1 << 20
BLOCK = 64 * 1024  # the cache's default block size


def rand(n):
    return os.urandom(n)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data, off=None):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if off is None:
            os.ftruncate(fd, 0)
            off = 0
        os.pwrite(fd, data, off)
    finally:
        os.close(fd)


def node(make_cache, backing, **keys):
    """A cache node: its own loop devices and mirrors, its backing directory on one client mount."""
    extra = {"backing.path": backing}
    extra.update(keys)
    c = make_cache(extra=extra)
    c.ctl_timeout = CTL_TIMEOUT
    c.format()
    c.mount()
    return c


def no_data_dropped(c):
    log = c.log_text()
    for bad in ("is gone; dropping", "dropping its cached data"):
        assert bad not in log, log


def test_round_trip(store, make_cache):
    """Writes, overwrites, unaligned writes, truncates down and up, a hole; read back through the mount,
    flushed, then compared on the store through the other client."""
    d1, d2 = store.subdir()
    c = node(make_cache, d1)
    ref = bytearray(rand(3 * MiB + 123))
    p = c.path("f")
    write(p, bytes(ref))
    fd = os.open(p, os.O_RDWR)
    for off, n in [(0, 10), (4095, 3), (BLOCK - 1, 2), (MiB + 17, 300000), (len(ref) - 5, 5)]:
        b = rand(n)
        os.pwrite(fd, b, off)
        ref[off:off + n] = b
    os.ftruncate(fd, 2 * MiB + 1)
    del ref[2 * MiB + 1:]
    os.ftruncate(fd, 2 * MiB + 70000)  # up again: the cut bytes read as zeros
    ref += b"\0" * (70000 - 1)
    b = rand(5000)
    os.pwrite(fd, b, 4 * MiB)  # past the end: a hole before it
    ref += b"\0" * (4 * MiB - len(ref)) + b
    os.close(fd)
    small = rand(777)
    write(c.path("small"), small)
    assert read(p) == bytes(ref)
    c.flush()
    assert c.stats()["dirty_bytes"] == 0
    drop_caches()
    assert read(p) == bytes(ref)
    assert read(os.path.join(d2, "f")) == bytes(ref)
    assert read(os.path.join(d2, "small")) == small
    assert c.unmount() == 0
    assert read(os.path.join(d2, "f")) == bytes(ref)


def test_wrong_file(store, make_cache):
    """Issue 10, first scenario: 8 MiB written to A, caches dropped, 300 files created on the volume from the
    other client (and listed on node 1, which makes node 1's Gluster client allocate new inodes: a stale
    handle of A then names one of them), flush: A holds its data, no other file holds any of it."""
    d1, d2 = store.subdir()
    c = node(make_cache, d1)
    data = rand(8 * MiB)
    write(c.path("A"), data)
    drop_caches()
    os.mkdir(os.path.join(d2, "other"))
    small = {}
    for i in range(300):
        name = f"f{i:06d}"
        small[name] = rand(100 + i)
        write(os.path.join(d2, "other", name), small[name])
    for name in os.listdir(os.path.join(d1, "other")):  # `ls -l other` on node 1
        os.stat(os.path.join(d1, "other", name))
    r = c.flush()
    assert read(os.path.join(d2, "A")) == data, f"A on the store is not A's data; flush said: {r.stdout}"
    assert sorted(os.listdir(os.path.join(d2, "other"))) == sorted(small)
    for name, b in small.items():
        assert read(os.path.join(d2, "other", name)) == b, f"other/{name} changed"
    assert sorted(os.listdir(d2)) == ["A", "other"]


def test_crash_after_fsync(store, make_cache):
    """Issue 10, second scenario: write + fsync, kill -9, drop caches, mount again, flush: every byte is on
    the store, and the log never says it dropped data."""
    d1, d2 = store.subdir()
    c = node(make_cache, d1)
    data = rand(4 * MiB + 4321)
    fd = os.open(c.path("F"), os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, data, 0)
    os.fsync(fd)
    os.close(fd)
    c.kill9()
    drop_caches()
    c.mount()
    assert read(c.path("F")) == data
    c.flush()
    assert read(os.path.join(d2, "F")) == data
    assert c.unmount() == 0
    no_data_dropped(c)


def test_flush_after_drop_caches(store, make_cache):
    """Issue 10, third scenario: write, drop caches (nothing unmounted), flush succeeds and the store holds
    the data."""
    d1, d2 = store.subdir()
    c = node(make_cache, d1)
    data = {f"f{i}": rand(300000 + i) for i in range(5)}
    for name, b in data.items():
        write(c.path(name), b)
    drop_caches()
    r = c.ctl("flush", c.mnt, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert c.stats()["dirty_bytes"] == 0
    for name, b in data.items():
        assert read(os.path.join(d2, name)) == b
    no_data_dropped(c)


def test_two_nodes_close_to_open(store, make_cache):
    """Issue 10, fourth scenario: node 1 writes and flushes, node 2 reads it; node 2 (F cached) overwrites part
    and flushes; node 1 (F's old data cached, clean, in its cache and the kernel's page cache) reads node 2's
    data at its next open."""
    d1, d2 = store.subdir()
    n1 = node(make_cache, d1)
    n2 = node(make_cache, d2)
    v1 = rand(2 * MiB)
    write(n1.path("F"), v1)
    n1.flush()
    assert read(n1.path("F")) == v1  # node 1 keeps it cached, clean
    assert read(n2.path("F")) == v1
    v2 = bytearray(v1)
    patch = rand(300000)
    write(n2.path("F"), patch, off=BLOCK + 100)
    v2[BLOCK + 100:BLOCK + 100 + len(patch)] = patch
    assert read(n2.path("F")) == bytes(v2)
    n2.flush()
    assert read(n1.path("F")) == bytes(v2), "node 1 serves its stale copy after node 2's flush"
    # and the size changes too
    tail = rand(100000)
    write(n2.path("F"), tail, off=len(v2))
    n2.flush()
    assert read(n1.path("F")) == bytes(v2) + tail


def test_two_nodes_change_in_the_same_second(store, make_cache):
    """Node 2 changes F (same size) and flushes within the same second as node 1's flush of F: on a store
    with whole-second timestamps (MooseFS) size, mtime and ctime are all as node 1 last saw them, yet node 1's
    next open must read node 2's data. The steps start at the beginning of a second (a wait, not an
    assertion) and are repeated until they fit in one second."""
    d1, d2 = store.subdir()
    n1 = node(make_cache, d1)
    n2 = node(make_cache, d2)
    for attempt in range(5):
        name = f"F{attempt}"
        v1 = rand(300000)
        time.sleep(1 - time.time() % 1 + 0.01)
        t0 = time.time()
        write(n1.path(name), v1)
        n1.flush()
        assert read(n1.path(name)) == v1  # node 1 keeps it cached, clean
        v2 = bytearray(v1)
        patch = rand(5000)
        write(n2.path(name), patch, off=1000)
        v2[1000:1000 + len(patch)] = patch
        n2.flush()
        if int(time.time()) == int(t0):
            break
    assert read(os.path.join(d1, name)) == bytes(v2)
    assert read(n1.path(name)) == bytes(v2), "node 1 serves its stale copy after node 2's flush"


def test_two_nodes_on_close_flush(store, make_cache):
    """destage.on_close = flush: node 1 writes and closes, with no nvcachectl flush; node 2's next open reads
    the data (and node 2 had the old version cached)."""
    d1, d2 = store.subdir()
    n1 = node(make_cache, d1, **{"destage.on_close": "flush"})
    n2 = node(make_cache, d2, **{"destage.on_close": "flush"})
    old = rand(500000)
    write(n1.path("G"), old)
    assert read(n2.path("G")) == old
    new = rand(700000)
    write(n1.path("G"), new)  # closed here: close returns when the store holds it
    assert read(os.path.join(d2, "G")) == new, "close returned before the store held the data"
    assert read(n2.path("G")) == new


@pytest.mark.parametrize("policy", ["keep-both", "overwrite"])
def test_conflict(store, make_cache, policy):
    """Node 1 has dirty data in F; node 2 overwrites F and flushes; node 1 flushes: a conflict, counted, and
    resolved by backing.on_conflict. The steps start at the beginning of a second (a wait, not an assertion)."""
    d1, d2 = store.subdir()
    n1 = node(make_cache, d1, **{"backing.on_conflict": policy})
    n2 = node(make_cache, d2, **{"backing.on_conflict": policy})
    # all within one second, as it mostly is anyway: the hard case on a store with whole-second times
    time.sleep(1 - time.time() % 1 + 0.01)
    base = rand(1 * MiB)
    write(os.path.join(d2, "F"), base)
    assert read(n1.path("F")) == base
    if store.kind == "moosefs":
        # whole seconds: node 1's look at F (which its identity stamp just changed) proves something once
        # the second of that change is over; until then an open drops node 1's clean data, so it reads F
        # again after it
        time.sleep(1 - time.time() % 1 + 0.01)
        assert read(n1.path("F")) == base
    assert read(n2.path("F")) == base
    # node 1: whole blocks 2 and 5, dirty
    v1 = bytearray(base)
    mine = {2 * BLOCK: rand(BLOCK), 5 * BLOCK: rand(BLOCK)}
    for off, b in mine.items():
        write(n1.path("F"), b, off=off)
        v1[off:off + len(b)] = b
    if store.kind == "moosefs":
        # MooseFS keeps whole seconds: a same-size change in the second of node 1's last look at F cannot
        # be told from none (README, "Stores with whole-second times"); the conflict is found from the
        # next second on
        time.sleep(1 - time.time() % 1 + 0.01)
    # node 2: bytes across block 2 and beyond, flushed
    v2 = bytearray(base)
    theirs = rand(3 * BLOCK)
    write(n2.path("F"), theirs, off=BLOCK + 1000)
    v2[BLOCK + 1000:BLOCK + 1000 + len(theirs)] = theirs
    n2.flush()
    assert read(os.path.join(d1, "F")) == bytes(v2)
    n1.flush()
    names = sorted(os.listdir(d2))
    conflicts = glob.glob(os.path.join(d2, "F.nvcachefs-conflict-*"))
    if policy == "keep-both":
        assert read(os.path.join(d2, "F")) == bytes(v2), "node 2's flushed version was overwritten"
        assert len(conflicts) == 1, names
        assert read(conflicts[0]) == bytes(v1), "the conflict file does not hold node 1's version"
    else:
        exp = bytearray(v2)
        for off, b in mine.items():
            exp[off:off + len(b)] = b
        assert read(os.path.join(d2, "F")) == bytes(exp)
        assert conflicts == [], names
    assert n1.stats()["conflicts"] == 1
    assert "conflict" in n1.log_text()


def test_lost_found(store, make_cache):
    """Node 1 has dirty data in F; on the store F is renamed away and a different file made at its path;
    node 1 is killed, caches dropped, mounted again, flushed: F is untouched and node 1's data is in
    .nvcachefs-lost+found/, counted, and listed by nvcachectl check."""
    d1, d2 = store.subdir()
    n1 = node(make_cache, d1)
    mine = rand(600000)
    fd = os.open(n1.path("F"), os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, mine, 0)
    os.fsync(fd)
    os.close(fd)
    os.mkdir(os.path.join(d2, "elsewhere"))
    os.rename(os.path.join(d2, "F"), os.path.join(d2, "elsewhere", "moved"))
    theirs = rand(50000)
    write(os.path.join(d2, "F"), theirs)
    n1.kill9()
    drop_caches()
    n1.mount()
    n1.flush()
    assert read(os.path.join(d2, "F")) == theirs, "the new file at F's path got node 1's data"
    lf = os.path.join(d2, ".nvcachefs-lost+found")
    assert os.path.isdir(lf), f"no lost+found; store holds {os.listdir(d2)}\n{n1.log_text()}"
    found = [os.path.join(dp, f) for dp, _, fs in os.walk(lf) for f in fs]
    assert any(read(f) == mine for f in found), f"node 1's data is in none of {found}"
    assert n1.stats()["lost_found_files"] >= 1
    assert n1.unmount() == 0
    r = n1.ctl("check", "-c", n1.conf, check=False)
    assert "lost+found" in r.stdout + r.stderr, r.stdout + r.stderr


def test_same_node_reader_sees_the_flush(store, make_cache):
    """A program on the cache's own node reads the backing files through the same client mount, buffered:
    after `nvcachectl flush` it reads the flushed bytes, not what the store's client cached before (ceph-fuse
    does not drop its object cache for an O_DIRECT write through itself). Whole blocks, a partial last page,
    and a file the reader had cached whole."""
    d1, _ = store.subdir()
    old = {"F": rand(2 * MiB), "G": rand(3 * BLOCK + 1234)}
    for name, b in old.items():
        write(os.path.join(d1, name), b)
    c = node(make_cache, d1)
    for name, b in old.items():
        assert read(os.path.join(d1, name)) == b  # the store's client caches it
        assert read(c.path(name)) == b
    new = {name: bytearray(b) for name, b in old.items()}
    for name, off, n in [("F", BLOCK, 3 * BLOCK), ("F", MiB + 4096, 5000), ("G", 0, len(old["G"]))]:
        b = rand(n)
        write(c.path(name), b, off=off)
        new[name][off:off + n] = b
    c.flush()
    assert c.stats()["dirty_bytes"] == 0
    for name, b in new.items():
        got = read(os.path.join(d1, name))
        if got != bytes(b):
            first = next((i for i in range(min(len(b), len(got))) if got[i] != b[i]), min(len(b), len(got)))
            raise AssertionError(f"{name} through the cache's own client after the flush: size {len(got)} (want "
                                 f"{len(b)}), first difference at byte {first} (the old bytes there: "
                                 f"{got[first:first + 8] == old[name][first:first + 8]})")
