"""Faults through the real mount: damaged or lost metadata mirrors, a backing store that fills up."""
import os
import random
import struct
import subprocess

import pytest

from conftest import CTL, MiB, sh


def dirty_cache(make_cache, **kw):
    c = make_cache(extra={"destage.on_unmount": "keep"}, **kw)
    c.format()
    c.mount()
    blobs = {}
    for i in range(4):
        blobs[f"f{i}"] = os.urandom(random.randrange(1, 3 * MiB))
        with open(c.path(f"f{i}"), "wb") as f:
            f.write(blobs[f"f{i}"])
    assert c.unmount() == 0
    for n in blobs:
        assert os.path.getsize(os.path.join(c.backing, n)) == 0   # all of it only in the cache
    return c, blobs


def damage(path, kind):
    size = os.path.getsize(path)
    if kind == "zeroed":
        with open(path, "r+b") as f:
            f.write(b"\0" * size)
    elif kind == "truncated":
        os.truncate(path, size // 3)
    elif kind == "emptied":
        os.truncate(path, 0)
    elif kind == "deleted":
        os.unlink(path)
    elif kind == "bitflips":
        rng = random.Random(5)
        with open(path, "r+b") as f:
            for _ in range(200):
                off = rng.randrange(4096, size)
                f.seek(off)
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
    elif kind == "header":
        with open(path, "r+b") as f:
            f.seek(40)
            f.write(b"\xff\xff")


@pytest.mark.parametrize("mirror", [0, 1])
@pytest.mark.parametrize("kind", ["zeroed", "truncated", "emptied", "deleted", "bitflips", "header"])
def test_lost_or_damaged_mirror_loses_nothing(make_cache, kind, mirror):
    c, blobs = dirty_cache(make_cache)
    damage(c.meta[mirror], kind)
    c.mount()
    for n, b in blobs.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == b, n
    st = c.stats()
    log = c.log_text()
    if kind == "bitflips":
        assert st["meta_repaired"] > 0 and "differed between the mirrors" in log
    else:
        assert st["mirrors"][mirror] == {"index": mirror, "path": c.meta[mirror], "state": "rebuilt"}, st["mirrors"]
        assert "rebuilding it from" in log
    c.flush()
    for n, b in blobs.items():
        with open(os.path.join(c.backing, n), "rb") as f:
            assert f.read() == b
    assert c.unmount() == 0
    # the mirrors agree again, record for record (the room past the slot entries in use is never read: a grow
    # zeroes what it takes of it first)
    a, b = (open(p, "rb").read() for p in c.meta)
    nslots, = struct.unpack_from("<Q", a, 40)
    slot_size, = struct.unpack_from("<I", a, 52)
    slots_off, = struct.unpack_from("<Q", a, 72)
    end = slots_off + nslots * slot_size
    assert len(a) == len(b) and a[4096:end] == b[4096:end]


def test_both_mirrors_lost_is_refused(make_cache):
    c, _ = dirty_cache(make_cache)
    for p in c.meta:
        damage(p, "zeroed")
    c.mount(check=False)
    assert c.proc.wait(timeout=30) != 0
    assert "neither metadata mirror" in c.log_text()


@pytest.fixture
def small_backing(tmp_path):
    """A 24 MiB ext4 file system as the backing store, to run out of space. Without extents, so without
    fallocate: destage is what finds it full (a store with fallocate refuses a writer without
    CAP_SYS_RESOURCE when the write is accepted, fs/claim.c; test_hostile.py)."""
    img = tmp_path / "backing.img"
    with open(img, "wb") as f:
        f.truncate(24 * MiB)
    sh("mkfs.ext4", "-q", "-F", "-O", "^extent,^64bit", str(img))
    mnt = tmp_path / "small"
    mnt.mkdir()
    sh("mount", "-o", "loop", str(img), str(mnt))
    yield str(mnt)
    # a daemon still serving it (a test that failed) keeps it busy: detached lazily, its loop device freed once
    # the daemon is gone
    if subprocess.run(["umount", str(mnt)], check=False).returncode:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_backing_store_full_keeps_data_dirty_and_retries(small_backing, make_cache):
    c = make_cache(extra={"backing.path": small_backing})
    c.format()
    c.mount()
    big = os.urandom(30 * MiB)
    with open(c.path("big"), "wb") as f:
        f.write(big)
    small = os.urandom(MiB)
    with open(c.path("small"), "wb") as f:
        f.write(small)
    r = c.ctl("flush", c.mnt, check=False)
    assert r.returncode != 0 and "No space left on device" in r.stderr, r.stderr
    st = c.stats()
    assert st["destage_errors"] > 0 and st["dirty_bytes"] > 0
    assert "destage of inode" in c.log_text() and "stays dirty" in c.log_text()
    with open(c.path("big"), "rb") as f:       # nothing lost, nothing stale
        assert f.read() == big
    # make room: the dirty data goes out on the next try
    os.truncate(c.path("big"), 10 * MiB)
    c.flush()
    assert c.stats()["dirty_bytes"] == 0
    with open(os.path.join(small_backing, "big"), "rb") as f:
        assert f.read() == big[:10 * MiB]
    with open(os.path.join(small_backing, "small"), "rb") as f:
        assert f.read() == small
    assert c.unmount() == 0


def check(c):
    return subprocess.run([CTL, "check", "-c", c.conf], capture_output=True, text=True, timeout=120)


def test_check_reports_and_mount_repairs(make_cache):
    c, blobs = dirty_cache(make_cache)
    r = check(c)
    assert r.returncode == 0 and "no problems found" in r.stdout, r.stdout + r.stderr
    assert "4 files" in r.stdout and "dirty" in r.stdout
    damage(c.meta[1], "bitflips")
    r = check(c)
    assert r.returncode == 1, r.stdout
    assert "mirror 1: slot" in r.stdout and "checksum mismatch" in r.stdout
    assert "the cache is not consistent" in r.stderr
    c.mount()
    r = check(c)
    assert r.returncode != 0 and "in use: unmount the cache first" in r.stderr
    for n, b in blobs.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == b
    assert c.unmount() == 0
    r = check(c)
    assert r.returncode == 0 and "no problems found" in r.stdout, r.stdout
    # a superblock copy overwritten
    with open(c.loops[0], "r+b") as f:
        f.seek(4096 + 100)
        f.write(b"garbage")
    r = check(c)
    assert r.returncode == 1 and f"{c.loops[0]}: superblock copy 1 checksum mismatch" in r.stdout
    assert f"{c.loops[0]}: 1 of 2 copies good" in r.stdout
    c.mount()   # the second copy still identifies the device, and repairs the first
    for n, b in blobs.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == b
    assert "1 damaged superblock copy rewritten" in c.log_text()
    c.unmount()
    r = check(c)
    assert r.returncode == 0 and f"{c.loops[0]}: 2 of 2 copies good" in r.stdout, r.stdout


def drop_page_cache():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def test_cache_device_disappears_under_the_mount(make_cache):
    import errno
    c = make_cache(dev_size=64 * MiB)
    c.format()
    c.mount()
    clean = os.urandom(4 * MiB)
    with open(c.path("clean"), "wb") as f:
        f.write(clean)
    c.flush()
    dirty = os.urandom(2 * MiB)
    with open(c.path("dirty"), "wb") as f:
        f.write(dirty)
    # the second DIMM goes away: its device shrinks to nothing
    os.truncate(c.images[1], 0)
    sh("losetup", "-c", c.loops[1])
    drop_page_cache()
    with open(c.path("clean"), "rb") as f:     # clean data: from the backing store
        assert f.read() == clean
    good = bad = 0
    fd = os.open(c.path("dirty"), os.O_RDONLY)
    for off in range(0, len(dirty), 64 * 1024):
        drop_page_cache()
        try:
            assert os.pread(fd, 64 * 1024, off) == dirty[off:off + 64 * 1024]
            good += 1
        except OSError as e:
            assert e.errno == errno.EIO    # never older bytes in their place
            bad += 1
    os.close(fd)
    assert good > 0 and bad > 0
    after = os.urandom(3 * MiB)                  # writing goes on
    with open(c.path("after"), "wb") as f:
        f.write(after)
    drop_page_cache()
    with open(c.path("after"), "rb") as f:
        assert f.read() == after
    st = c.stats()
    assert st["devices"][1]["path"] == c.loops[1] and st["devices"][1]["state"] == "failed", st["devices"]
    assert st["devices"][0]["path"] == c.loops[0] and st["devices"][0]["state"] == "ok", st["devices"]
    assert f"cache device {c.loops[1]} failed" in c.log_text()
    r = c.ctl("flush", c.mnt, check=False)
    assert r.returncode != 0 and "Input/output error" in r.stderr
    assert c.unmount() == 0
    assert "are on a failed cache device and cannot be destaged" in c.log_text()
    with open(os.path.join(c.backing, "after"), "rb") as f:
        assert f.read() == after
    with open(os.path.join(c.backing, "clean"), "rb") as f:
        assert f.read() == clean


def test_metadata_mirror_on_a_block_device(make_cache):
    c = make_cache(ndevs=3, extra={"destage.on_unmount": "keep"})
    keys = dict(c.keys)
    keys["cache.devices"] = ", ".join(c.loops[:2])
    keys["cache.metadata"] = c.loops[2] + ", " + c.meta[1]
    c.write_conf(keys)
    c.format()
    c.mount()
    blobs = {f"b{i}": os.urandom(random.randrange(1, 2 * MiB)) for i in range(3)}
    for n, b in blobs.items():
        with open(c.path(n), "wb") as f:
            f.write(b)
    c.kill9()
    c.mount()
    for n, b in blobs.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == b
    assert c.unmount() == 0
    r = check(c)
    assert r.returncode == 0 and "no problems found" in r.stdout, r.stdout
    with open(c.loops[2], "r+b") as f:         # the block-device mirror is wiped
        f.write(b"\0" * MiB)
    c.mount()
    assert f"metadata mirror {c.loops[2]} is damaged or lost" in c.log_text()
    for n, b in blobs.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == b
    assert c.unmount() == 0
    r = check(c)
    assert r.returncode == 0 and "no problems found" in r.stdout, r.stdout


def test_two_dirty_copies_lose_nothing_with_a_device(make_cache):
    c = make_cache(dev_size=64 * MiB, extra={"cache.dirty_copies": "2"})
    c.format()
    c.mount()
    blobs = {f"d{i}": os.urandom(random.randrange(MiB, 3 * MiB)) for i in range(4)}
    for n, b in blobs.items():
        with open(c.path(n), "wb") as f:
            f.write(b)
    st = c.stats()
    assert st["dirty_slots"] > 0 and st["used_slots"] >= 2 * st["dirty_slots"]
    os.truncate(c.images[0], 0)                  # the first DIMM goes away
    sh("losetup", "-c", c.loops[0])
    drop_page_cache()
    for n, b in blobs.items():                   # every dirty byte, from the copies
        with open(c.path(n), "rb") as f:
            assert f.read() == b, n
    more = os.urandom(2 * MiB)                   # degraded, still taking writes
    with open(c.path("more"), "wb") as f:
        f.write(more)
    blobs["more"] = more
    c.flush()                                    # destaged from the surviving copies
    st = c.stats()
    assert st["dirty_bytes"] == 0
    assert st["devices"][0]["path"] == c.loops[0] and st["devices"][0]["state"] == "failed", st["devices"]
    assert c.unmount() == 0
    for n, b in blobs.items():
        with open(os.path.join(c.backing, n), "rb") as f:
            assert f.read() == b, n


@pytest.mark.parametrize("how", ["gone", "blank", "garbage"])
def test_two_dirty_copies_mount_degraded_without_a_device(make_cache, how):
    c = make_cache(dev_size=64 * MiB, extra={"cache.dirty_copies": "2", "destage.on_unmount": "keep"})
    c.format()
    c.mount()
    # a clean file too, destaged and still cached: its blocks on the lost DIMM must
    # come from the backing store
    clean = os.urandom(2 * MiB)
    with open(c.path("clean"), "wb") as f:
        f.write(clean)
    c.flush()
    blobs = {f"m{i}": os.urandom(random.randrange(MiB, 3 * MiB)) for i in range(3)}
    for n, b in blobs.items():
        with open(c.path(n), "wb") as f:
            f.write(b)
    blobs["clean"] = clean
    assert c.unmount() == 0                      # all of it dirty, only in the cache
    if how == "gone":
        sh("losetup", "-d", c.loops[1])          # a DIMM is gone for good
    else:                                        # replaced by a blank one, or overwritten
        # (first copies, and so the clean blocks, are spread over both DIMMs)
        with open(c.images[0], "r+b") as f:
            size = os.path.getsize(c.images[0])
            for off in range(0, size, MiB):
                f.write(b"\0" * MiB if how == "blank" else os.urandom(MiB))
    c.mount()
    assert "mounting degraded" in c.log_text()
    for n, b in blobs.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == b, n
    c.flush()
    assert c.unmount() == 0
    for n, b in blobs.items():
        with open(os.path.join(c.backing, n), "rb") as f:
            assert f.read() == b, n
