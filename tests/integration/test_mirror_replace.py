"""nvcachectl replace-mirror: a metadata mirror (healthy, or failed while mounted) is rebuilt on a new file or
block device from the other one while a workload runs; after a kill -9 the cache mounts from the new mirror with
every byte; a mount whose configuration still names the old place finds the new one through it, and never
takes the old records for current; bad new places are refused, naming why."""
import os
import time
import subprocess

from conftest import CTL, MiB, mounted, sh
from rwload import Workload


def magic(path):
    with open(path, "rb") as f:
        return f.read(8)


def remount_with_mirrors(c, mirrors):
    keys = dict(c.keys)
    keys["cache.metadata"] = ", ".join(mirrors)
    c.keys = keys
    c.write_conf()
    c.mount()


def mirror_replaced_under_load(make_cache, suffix):
    """A mounted cache with a workload running, its mirror 1 replaced by a new file (removed by cleanup)."""
    c = make_cache(extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    w = Workload(c)
    w.start()
    w.wait_ops(200)
    new = f"/dev/shm/{c.tag}-meta1-{suffix}"
    c.meta.append(new)
    r = c.ctl("replace-mirror", c.mnt, c.meta[1], new)
    return c, w, new, r


def test_replace_healthy_mirror_under_load(make_cache):
    c, w, new, r = mirror_replaced_under_load(make_cache, "new")
    assert f"change cache.metadata in the configuration to name {new}" in r.stdout
    n = w.ops
    w.wait_ops(n + 300)                             # the records go to the new mirror now
    w.finish()
    mirrors = c.stats()["mirrors"]
    assert [(m["path"], m["state"]) for m in mirrors] == [(c.meta[0], "ok"), (new, "ok")], mirrors
    c.kill9()
    # The crash tore mirror 0's header, and cache.metadata still names the old mirror 1, which missed every
    # write since the copy: the mount finds the new one through the old one's header and rebuilds mirror 0
    # from it (the old place used to be wiped, and this mount refused: no valid header in the places named).
    with open(c.meta[0], "r+b") as f:
        f.write(os.urandom(4096))
    log0 = len(c.log_text())
    c.mount()
    w.check(c.mnt)
    log = c.log_text()[log0:]
    assert f"replace-mirror replaced it by {new}: using {new}" in log, log
    assert f"metadata mirror {c.meta[0]} is damaged or lost" in log and f"rebuilding it from {new}" in log, log
    assert c.unmount() == 0
    r = sh(CTL, "check", "-c", c.conf, check=False)    # the configuration still unchanged
    assert r.returncode == 0 and f"{c.meta[1]} was replaced by {new}" in r.stdout, r.stdout + r.stderr
    os.unlink(c.meta[0])                            # and mirror 0 goes: the new one alone has it all
    log0 = len(c.log_text())
    remount_with_mirrors(c, [c.meta[0], new])
    w.check(c.mnt)
    log = c.log_text()[log0:]
    assert f"metadata mirror {c.meta[0]} is damaged or lost" in log and f"rebuilding it from {new}" in log, log
    assert "replace-mirror replaced it" not in log, log
    assert c.unmount() == 0
    r = sh(CTL, "check", "-c", c.conf, check=False)
    assert r.returncode == 0 and "was replaced by" not in r.stdout, r.stdout + r.stderr


def test_replaced_mirror_whose_successor_is_gone(make_cache):
    """The new place of a finished replace-mirror is deleted and cache.metadata still names the old one, which
    may have missed writes since the copy: it is rebuilt from mirror 0, never trusted; with mirror 0 unusable
    too the mount is refused, saying why, rather than served from the old records."""
    c, w, new, _ = mirror_replaced_under_load(make_cache, "gone")
    w.wait_ops(w.ops + 300)                         # records the old place never sees
    w.finish()
    assert c.unmount() == 0
    os.unlink(new)
    with open(c.meta[0], "rb") as f:
        head = f.read(4096)
    with open(c.meta[0], "r+b") as f:
        f.write(os.urandom(4096))
    p = c.mount(check=False)
    assert p.wait(timeout=30) != 0 and not mounted(c.mnt)
    c.proc = None
    log = c.log_text()
    assert f"metadata mirror {c.meta[1]} records its replace by {new}, which is not there" in log, log[-3000:]
    with open(c.meta[0], "r+b") as f:
        f.write(head)
    log0 = len(c.log_text())
    c.mount()
    w.check(c.mnt)
    log = c.log_text()[log0:]
    assert f"metadata mirror {c.meta[1]} is damaged or lost (replaced by {new}, which is not there" in log, log
    assert f"rebuilding it from {c.meta[0]}" in log, log
    assert c.unmount() == 0
    r = sh(CTL, "check", "-c", c.conf, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def mirror1_on_a_block_device(c):
    """Two cache devices, mirror 1 on the third loop device; formatted and mounted."""
    keys = dict(c.keys)
    keys["cache.devices"] = ", ".join(c.loops[:2])
    keys["cache.metadata"] = f"{c.meta[0]}, {c.loops[2]}"
    c.keys = keys
    c.write_conf()
    c.format()
    c.mount()


def test_replace_failed_block_mirror(make_cache):
    c = make_cache(ndevs=4, extra={"destage.on_unmount": "keep"})
    mirror1_on_a_block_device(c)
    w = Workload(c)
    w.start()
    w.wait_ops(100)
    os.truncate(c.images[2], 0)                     # mirror 1's device goes away while mounted
    sh("losetup", "-c", c.loops[2])
    extra = os.urandom(3 * MiB)                     # new blocks: record writes, which fail there
    with open(c.path("extra"), "wb") as f:
        f.write(extra)
    w.wait_ops(w.ops + 200)                         # the cache goes on with mirror 0
    assert c.stats()["mirrors"][1]["state"] == "failed", c.stats()["mirrors"]
    # a new place that holds a file system is refused; an empty device is taken
    sh("mkfs.ext4", "-q", "-F", c.loops[3])
    r = c.ctl("replace-mirror", c.mnt, c.loops[2], c.loops[3], check=False)
    assert r.returncode != 0 and f"{c.loops[3]} holds a ext4 signature" in r.stderr, r.stderr
    sh("wipefs", "-q", "-a", c.loops[3])
    c.ctl("replace-mirror", c.mnt, c.loops[2], c.loops[3])
    w.wait_ops(w.ops + 200)
    w.finish()
    assert [m["state"] for m in c.stats()["mirrors"]] == ["ok", "ok"]
    c.kill9()
    remount_with_mirrors(c, [c.meta[0], c.loops[3]])
    w.check(c.mnt)
    with open(c.path("extra"), "rb") as f:
        assert f.read() == extra
    log = c.log_text()
    assert f"replace-mirror: mirror 1 is now {c.loops[3]}" in log and "rebuilding it" not in log, log
    assert c.unmount() == 0


def test_bad_new_places_are_refused(make_cache, tmp_path):
    c = make_cache()
    c.format()
    c.mount()
    exists = tmp_path / "exists"
    exists.write_bytes(b"x")
    cases = [
        (c.meta[1], str(exists), "exists; a new mirror goes to a file that does not exist yet"),
        (c.meta[1], c.meta[0], "is already a metadata mirror of this cache"),
        (c.meta[1], c.loops[0], "is a cache device of this cache"),
        ("/dev/shm/nothing-" + c.tag, "/dev/shm/x-" + c.tag, "is not a metadata mirror of this cache"),
    ]
    for old, new, why in cases:
        r = c.ctl("replace-mirror", c.mnt, old, new, check=False)
        assert r.returncode != 0 and why in r.stderr, (old, new, r.stderr)
    # a block device smaller than the mirror
    small = f"/dev/shm/{c.tag}-small.img"
    with open(small, "wb") as f:
        f.truncate(64 * 1024)
    c.images.append(small)
    lo = sh("losetup", "--find", "--show", small).stdout.strip()
    c.loops.append(lo)
    r = c.ctl("replace-mirror", c.mnt, c.meta[1], lo, check=False)
    assert r.returncode != 0 and "smaller than the mirror" in r.stderr, r.stderr
    assert [m["state"] for m in c.stats()["mirrors"]] == ["ok", "ok"]
    assert c.unmount() == 0


def test_replace_mirror_killed_midway_resumes(make_cache):
    """A kill -9 while a large mirror is copied: the next mount, its configuration unchanged, has every byte and
    finishes the replace on its own (onto the recorded place); then the old place leads to the new one."""
    c = make_cache(dev_size=1024 * MiB, extra={"destage.on_unmount": "keep", "cache.block_size": "4K",
                                                "cache.max_files": "524288"})
    c.format()
    assert os.path.getsize(c.meta[0]) > 400 * MiB       # a copy that takes a while
    c.mount()
    blobs = {f"f{i}": os.urandom(2 * MiB + i * 4097) for i in range(4)}
    for n, b in blobs.items():
        with open(c.path(n), "wb") as f:
            f.write(b)
    new = f"/dev/shm/{c.tag}-meta1new"
    c.images.append(new)                                  # cleaned up with the test
    log0 = len(c.log_text())
    p = subprocess.Popen([CTL, "replace-mirror", c.mnt, c.meta[1], new], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while "replace-mirror: rebuilding mirror 1" not in c.log_text()[log0:] and time.time() < deadline:
        time.sleep(0.001)
    c.kill9()                                             # in the copy
    p.wait(timeout=30)
    assert p.returncode != 0, p.stdout
    c.mount()                                             # the configuration as it was
    for n, b in blobs.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == b, n
    deadline = time.time() + 60
    while f"mirror 1 is now {new}" not in c.log_text() and time.time() < deadline:
        time.sleep(0.05)
    log = c.log_text()
    assert f"replace-mirror: resuming the replace of mirror 1 ({c.meta[1]}) by {new}" in log, log[-3000:]
    assert f"mirror 1 is now {new}" in log, log[-3000:]
    c.kill9()
    log0 = len(c.log_text())
    c.mount()                                             # unchanged still: the new place found through the old
    for n, b in blobs.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == b, n
    log = c.log_text()[log0:]
    assert f"replace-mirror replaced it by {new}: using {new}" in log and "resuming" not in log, log
    c.kill9()
    remount_with_mirrors(c, [c.meta[0], new])
    for n, b in blobs.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == b, n
    assert "resuming" not in c.log_text().split(f"mirror 1 is now {new}")[-1]
    assert c.unmount() == 0


def test_replaces_in_a_row_are_followed(make_cache):
    """replace-mirror A -> B, a mount on the unedited configuration (it finds B through A), then B -> C: B's
    header froze pointing to C. With mirror 0 torn, a mount still naming A follows A -> B -> C and has every
    fsynced byte (following one step took B's records, which missed everything written since, and the resume
    then rebuilt C from them)."""
    c = make_cache(extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    b = f"/dev/shm/{c.tag}-meta1-b"
    cc = f"/dev/shm/{c.tag}-meta1-c"
    c.meta += [b, cc]                               # removed by cleanup
    early = os.urandom(3 * MiB)
    with open(c.path("early"), "wb") as f:
        f.write(early)
        os.fsync(f.fileno())
    c.ctl("replace-mirror", c.mnt, c.meta[1], b)
    assert c.unmount() == 0
    log0 = len(c.log_text())
    c.mount()                                       # [m0, A]: B found through A
    assert f"replaced it by {b}: using {b}" in c.log_text()[log0:]
    c.ctl("replace-mirror", c.mnt, b, cc)           # the daemon knows mirror 1 as B now
    late = {f"late{i}": os.urandom(200 * 1024 + i) for i in range(6)}
    for n, data in late.items():
        with open(c.path(n), "wb") as f:
            f.write(data)
            os.fsync(f.fileno())
    with open(c.path("early"), "r+b") as f:
        f.truncate(1000)
        os.fsync(f.fileno())
    c.kill9()
    with open(c.meta[0], "r+b") as f:               # mirror 0 torn
        f.write(os.urandom(4096))
    ino_c = os.stat(cc).st_ino
    log0 = len(c.log_text())
    c.mount()                                       # still [m0, A]
    log = c.log_text()[log0:]
    assert f"replaced it by {b}: using {b}" in log and f"replaced it by {cc}: using {cc}" in log, log
    for n, data in late.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == data, n
    with open(c.path("early"), "rb") as f:
        assert f.read() == early[:1000]
    assert "resuming" not in log and os.stat(cc).st_ino == ino_c, log
    assert c.unmount() == 0
    r = sh(CTL, "check", "-c", c.conf, check=False)
    assert r.returncode == 0 and f"was replaced by {cc}" in r.stdout, r.stdout + r.stderr


def test_failed_mirror_replaced_then_back(make_cache):
    """Mirror 1 on a block device fails its writes (read-only) while mounted, is replaced by a file, and comes
    back writable with its old header: the replace wrote the pointer to it once it could, so a mount on the
    unedited configuration with mirror 0 torn follows it to the new mirror and has every fsynced byte (it
    used to take the old device's records, older than the failure)."""
    c = make_cache(ndevs=3, extra={"destage.on_unmount": "keep"})
    mirror1_on_a_block_device(c)
    sh("blockdev", "--setro", c.loops[2])
    try:
        data = {f"f{i}": os.urandom(300 * 1024 + i) for i in range(5)}
        for n, d in data.items():
            with open(c.path(n), "wb") as f:
                f.write(d)
                os.fsync(f.fileno())
        deadline = time.time() + 10
        while c.stats()["mirrors"][1]["state"] != "failed" and time.time() < deadline:
            time.sleep(0.05)
        assert c.stats()["mirrors"][1]["state"] == "failed", c.stats()["mirrors"]
    finally:
        sh("blockdev", "--setrw", c.loops[2])
    new = f"/dev/shm/{c.tag}-meta1-new"
    c.meta.append(new)
    c.ctl("replace-mirror", c.mnt, c.loops[2], new)
    more = {f"g{i}": os.urandom(100 * 1024 + i) for i in range(5)}
    for n, d in more.items():
        with open(c.path(n), "wb") as f:
            f.write(d)
            os.fsync(f.fileno())
    c.kill9()
    with open(c.meta[0], "r+b") as f:
        f.write(os.urandom(4096))
    log0 = len(c.log_text())
    c.mount()
    log = c.log_text()[log0:]
    assert f"replaced it by {new}: using {new}" in log, log
    for n, d in {**data, **more}.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == d, n
    # the old device, its header a pointer of this cache, is taken back as a new place (it was refused, and
    # wipefs cannot clear an nvcachefs header); then the configuration as it was names the current mirror
    c.ctl("replace-mirror", c.mnt, new, c.loops[2])
    assert c.unmount() == 0
    log0 = len(c.log_text())
    c.mount()
    for n, d in {**data, **more}.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == d, n
    assert "replaced it by" not in c.log_text()[log0:]
    assert c.unmount() == 0
