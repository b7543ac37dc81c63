"""Many nodes, one store: two mounts (two caches, each with its own devices) over one backing directory.
Close-to-open after a flush, destage.on_close = flush, and conflicts with both policies."""
import errno
import os
import re
import subprocess

import pytest

from conftest import sh

KiB = 1 << 10


def two_nodes(make_cache, **keys):
    """Node 1 and node 2 over node 1's backing directory, both mounted."""
    extra = {k.replace("__", "."): v for k, v in keys.items()}
    n1 = make_cache(extra=dict(extra))
    n2 = make_cache(extra=dict(extra, **{"backing.path": n1.backing}))
    for n in (n1, n2):
        n.format()
        n.mount()
    return n1, n2


def put(node, name, data, offset=None):
    """Write through a node's mount and close; offset None: the whole file, truncated."""
    p = node.path(name)
    if offset is None:
        with open(p, "wb") as f:
            f.write(data)
    else:
        fd = os.open(p, os.O_WRONLY)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)


def get(node, name):
    with open(node.path(name), "rb") as f:
        return f.read()


def backing(node, name):
    with open(os.path.join(node.keys["backing.path"], name), "rb") as f:
        return f.read()


def unmount_all(*nodes):
    for n in nodes:
        assert n.unmount() == 0


def test_close_to_open_after_flush(make_cache):
    n1, n2 = two_nodes(make_cache)
    a, b, c = (os.urandom(256 * KiB) for _ in range(3))
    put(n1, "f", a)
    n1.flush()
    # node 2 caches the old contents: in its cache and in its kernel's page cache
    assert get(n2, "f") == a
    assert get(n2, "f") == a
    put(n1, "f", b)  # same size: only mtime and ctime tell
    n1.flush()
    assert get(n2, "f") == b
    assert n2.stats()["revalidate_drops"] == 1
    # and back, this time longer
    put(n2, "f", c + c)
    n2.flush()
    assert get(n1, "f") == c + c
    assert n1.stats()["revalidate_drops"] == 1
    # unchanged: nothing dropped, nothing counted
    assert get(n1, "f") == c + c
    assert n1.stats()["revalidate_drops"] == 1
    assert n1.stats()["conflicts"] == 0 and n2.stats()["conflicts"] == 0
    unmount_all(n2, n1)


def test_shorter_file_elsewhere(make_cache):
    n1, n2 = two_nodes(make_cache)
    a, b = os.urandom(512 * KiB), os.urandom(100 * KiB)
    put(n1, "f", a)
    n1.flush()
    assert get(n2, "f") == a
    put(n1, "f", b)
    n1.flush()
    assert os.stat(n2.path("f")).st_size in (len(a), len(b))  # attributes may be a second old
    assert get(n2, "f") == b
    with open(n2.path("f"), "rb") as f:
        assert os.fstat(f.fileno()).st_size == len(b)
    unmount_all(n2, n1)


def test_on_close_flush(make_cache):
    n1, n2 = two_nodes(make_cache, destage__on_close="flush")
    a, b = os.urandom(300 * KiB), os.urandom(300 * KiB)
    put(n1, "f", a)
    assert get(n2, "f") == a
    put(n1, "f", b)  # close waits for the store: no flush asked
    assert backing(n1, "f") == b
    assert get(n2, "f") == b
    assert n1.stats()["dirty_bytes"] == 0
    unmount_all(n2, n1)


def conflict(make_cache, policy):
    n1, n2 = two_nodes(make_cache, backing__on_conflict=policy)
    x, y, z = os.urandom(256 * KiB), os.urandom(64 * KiB), os.urandom(320 * KiB)
    put(n1, "f", x)
    n1.flush()
    assert get(n2, "f") == x  # node 2 caches it
    put(n2, "f", y, offset=0)  # node 2: dirty, not flushed
    put(n1, "f", z)  # node 1 rewrites it, longer, and flushes
    n1.flush()
    n2.flush()  # node 2's destage finds the conflict
    assert n2.stats()["conflicts"] == 1
    assert n1.stats()["conflicts"] == 0
    assert re.search(r"conflict \(destage\): \S+/f was changed elsewhere", n2.log_text())
    return n1, n2, x, y, z


def test_conflict_overwrite(make_cache):
    n1, n2, x, y, z = conflict(make_cache, "overwrite")
    want = y + z[len(y):]  # node 2's dirty pages over node 1's file, at its length
    assert backing(n1, "f") == want
    assert get(n2, "f") == want
    assert get(n1, "f") == want
    n2.flush()
    assert n2.stats()["conflicts"] == 1  # once
    unmount_all(n2, n1)


def test_conflict_keep_both(make_cache):
    n1, n2, x, y, z = conflict(make_cache, "keep-both")
    assert backing(n1, "f") == z  # the file keeps node 1's version
    copies = [n for n in os.listdir(n1.backing) if n.startswith("f.nvcachefs-conflict-")]
    assert len(copies) == 1, os.listdir(n1.backing)
    assert re.fullmatch(r"f\.nvcachefs-conflict-" + re.escape(os.uname().nodename) + r"-\d{8}T\d{6}", copies[0])
    assert backing(n1, copies[0]) == y + x[len(y):]  # node 2's version: its pages over what it cached
    assert get(n2, "f") == z
    assert get(n1, "f") == z
    n2.flush()
    assert n2.stats()["conflicts"] == 1
    assert n2.stats()["dirty_bytes"] == 0
    unmount_all(n2, n1)


def test_attributes_at_open(make_cache):
    """The kernel's attributes of a file changed elsewhere go at the open, even within fuse.attr_timeout."""
    n1, n2 = two_nodes(make_cache, fuse__attr_timeout="60s")
    a, b = os.urandom(64 * KiB), os.urandom(200 * KiB)
    put(n1, "f", a)
    n1.flush()
    assert get(n2, "f") == a
    assert os.stat(n2.path("f")).st_size == len(a)  # cached by node 2's kernel for a minute
    put(n1, "f", b)
    n1.flush()
    fd = os.open(n2.path("f"), os.O_RDONLY)
    try:
        assert os.fstat(fd).st_size == len(b)
        assert os.pread(fd, len(b) + 1, 0) == b
    finally:
        os.close(fd)
    unmount_all(n2, n1)


def test_own_changes_through_the_mount(make_cache):
    """What a node does to a file through its own mount is not a change made elsewhere: no drop, no conflict."""
    n1, n2 = two_nodes(make_cache)
    a, b = os.urandom(128 * KiB), os.urandom(64 * KiB)
    put(n1, "f", a)
    n1.flush()
    assert get(n1, "f") == a
    os.chmod(n1.path("f"), 0o640)
    os.utime(n1.path("f"), (1000000000, 1000000000))
    os.setxattr(n1.path("f"), "user.k", b"v")
    os.link(n1.path("f"), n1.path("g"))
    os.unlink(n1.path("g"))
    os.rename(n1.path("f"), n1.path("h"))
    os.truncate(n1.path("h"), 100 * KiB)
    assert get(n1, "h") == a[:100 * KiB]
    put(n1, "h", b, offset=0)  # dirty
    os.chmod(n1.path("h"), 0o600)
    os.rename(n1.path("h"), n1.path("f"))
    n1.flush()
    want = b + a[len(b):100 * KiB]
    assert get(n1, "f") == want
    st = n1.stats()
    assert (st["revalidate_drops"], st["conflicts"]) == (0, 0)
    assert get(n2, "f") == want  # and the other node sees it all
    unmount_all(n2, n1)


def test_conflict_found_by_recovery(make_cache):
    """Node 2 dies with dirty data; node 1 rewrites the file; node 2's recovery finds the conflict."""
    n1, n2 = two_nodes(make_cache, backing__on_conflict="keep-both")
    x, y, z = os.urandom(128 * KiB), os.urandom(32 * KiB), os.urandom(96 * KiB)
    put(n1, "f", x)
    n1.flush()
    assert get(n2, "f") == x
    put(n2, "f", y, offset=0)  # acknowledged: survives the kill
    n2.kill9()
    put(n1, "f", z)
    n1.flush()
    n2.mount()
    assert n2.stats()["conflicts"] == 1
    assert "conflict (recovery)" in n2.log_text()
    copies = [n for n in os.listdir(n1.backing) if n.startswith("f.nvcachefs-conflict-")]
    assert len(copies) == 1
    assert backing(n1, copies[0])[:len(y)] == y
    assert get(n2, "f") == z
    unmount_all(n2, n1)


def test_stat_of_a_closed_file(make_cache):
    """stat of a file a node has clean data of, changed elsewhere: the store's size once the kernel asks again."""
    n1, n2 = two_nodes(make_cache, fuse__attr_timeout="0")
    a, b = os.urandom(64 * KiB), os.urandom(200 * KiB)
    put(n1, "f", a)
    n1.flush()
    assert get(n2, "f") == a  # node 2 holds clean data of it
    put(n1, "f", b)
    n1.flush()
    assert os.stat(n2.path("f")).st_size == len(b)
    assert get(n2, "f") == b
    unmount_all(n2, n1)


def test_attributes_at_first_open(make_cache):
    """A file node 2 has only looked at (no cached data, no cache object): its kernel's attributes go at the open."""
    n1, n2 = two_nodes(make_cache, fuse__attr_timeout="60s")
    a, b = os.urandom(64 * KiB), os.urandom(200 * KiB)
    put(n1, "f", a)
    n1.flush()
    assert os.stat(n2.path("f")).st_size == len(a)  # cached by node 2's kernel for a minute
    put(n1, "f", b)
    n1.flush()
    fd = os.open(n2.path("f"), os.O_RDONLY)
    try:
        assert os.fstat(fd).st_size == len(b)
        assert os.pread(fd, len(b) + 1, 0) == b
    finally:
        os.close(fd)
    unmount_all(n2, n1)


def test_change_seen_only_in_ctime(make_cache):
    """Node 1 rewrites the file at the same size and puts its mtime back (as rsync -t or cp -p would): only the
    ctime tells. Node 2's kernel must not keep its page cache of the file (the kernel itself compares only mtime
    and size)."""
    n1, n2 = two_nodes(make_cache)
    a, b = os.urandom(256 * KiB), os.urandom(256 * KiB)
    put(n1, "f", a)
    n1.flush()
    st = os.stat(os.path.join(n1.backing, "f"))
    assert get(n2, "f") == a
    assert get(n2, "f") == a  # from node 2's kernel page cache
    put(n1, "f", b)
    n1.flush()
    os.utime(n1.path("f"), ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.stat(os.path.join(n1.backing, "f"))
    assert (now.st_size, now.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert get(n2, "f") == b
    unmount_all(n2, n1)


@pytest.fixture
def small_store(tmp_path):
    """A 24 MiB ext4 file system as the shared store, to run out of space (set up before the caches, so that it
    is torn down after them). Without extents: it has no fallocate, so a write is not refused when it is
    accepted for want of space (a claim, fs/claim.c) and destage is what finds the store full, as on a store
    without fallocate, or for a writer with CAP_SYS_RESOURCE (test_hostile.py has the claims)."""
    img = tmp_path / "store.img"
    with open(img, "wb") as f:
        f.truncate(24 << 20)
    sh("mkfs.ext4", "-q", "-F", "-O", "^extent,^64bit", str(img))
    mnt = tmp_path / "store"
    mnt.mkdir()
    sh("mount", "-o", "loop", str(img), str(mnt))
    yield str(mnt)
    if subprocess.run(["umount", str(mnt)], check=False).returncode:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_on_close_flush_error_goes_to_close(small_store, make_cache):
    """With on_close = flush, a destage that fails (the store is full) is close's error; the data stays dirty,
    readable, and goes out once there is room."""
    n = make_cache(extra={"backing.path": small_store, "destage.on_close": "flush"})
    n.format()
    n.mount()
    big = os.urandom(30 << 20)
    f = open(n.path("big"), "wb")
    f.write(big)
    with pytest.raises(OSError) as e:
        f.close()
    assert e.value.errno == errno.ENOSPC
    assert n.stats()["dirty_bytes"] > 0
    assert get(n, "big") == big  # a reader's close does not wait for the store
    os.truncate(n.path("big"), 10 << 20)
    put(n, "big", big[:10 << 20], offset=0)  # room now: this close takes it all to the store
    assert n.stats()["dirty_bytes"] == 0
    with open(os.path.join(small_store, "big"), "rb") as g:
        assert g.read() == big[:10 << 20]
    assert n.unmount() == 0


def test_a_name_made_on_another_node_is_seen_at_once(make_cache):
    """Node 2 looks a name up before node 1 makes it (MPI-IO's ranks stat a shared file before rank 0
    creates it): node 2's next open finds it at once, not after fuse.attr_timeout (10 s here)."""
    n1, n2 = two_nodes(make_cache, fuse__attr_timeout="10s")
    data = os.urandom(64 * KiB)
    assert not os.path.exists(n2.path("g"))
    put(n1, "g", data)
    n1.flush()
    assert get(n2, "g") == data
    unmount_all(n1, n2)


def test_times_set_after_a_change_elsewhere(make_cache):
    """Node 1 rewrites two files at the same size; node 2 then sets their times through its mount (utimensat
    by name). The change stays node 1's (issue 25, finding 5: with the times set only the size was compared, and
    node 2 took node 1's change for its own): node 2's next open serves node 1's bytes, and its dirty data over the
    change is a conflict, found and counted."""
    n1, n2 = two_nodes(make_cache, destage__idle_after="60min", destage__max_dirty_age="60min")
    a, b, y = os.urandom(256 * KiB), os.urandom(256 * KiB), os.urandom(64 * KiB)
    for name in ("f", "g"):
        put(n1, name, a)
    n1.flush()
    assert get(n2, "f") == a and get(n2, "g") == a  # node 2 caches both
    put(n2, "g", y, offset=0)  # node 2: dirty, not flushed
    for name in ("f", "g"):
        put(n1, name, b)  # same size: only the times tell
    n1.flush()
    for name in ("f", "g"):  # by name, no open (GNU touch opens the file first: that open would find it)
        os.utime(n2.path(name), (1000000000, 1000000000))
    assert get(n2, "f") == b
    n2.flush()
    assert n2.stats()["conflicts"] == 1
    assert re.search(r"conflict \((open|destage)\): \S+/g was changed elsewhere", n2.log_text())
    assert backing(n1, "g") == y + b[len(y):]  # overwrite: node 2's dirty pages over node 1's file
    assert get(n2, "g") == y + b[len(y):]
    assert get(n1, "g") == y + b[len(y):]
    unmount_all(n2, n1)
