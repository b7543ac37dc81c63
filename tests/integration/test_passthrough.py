"""FUSE passthrough (fuse.passthrough, issue 28): bypass and writearound files the cache holds nothing of are
served by the kernel from the backing file. Byte-for-byte against the store, proof from the daemon's request
counters that no READ or WRITE reached it, the switch between passthrough and the cache's path never stale,
mmap, and nobody refused what the store refuses them."""
import mmap
import os
import re
import subprocess
import time

import pytest

from conftest import MiB

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

RULES = """
[policy pt]
match = pt/**
mode = bypass
[policy wa]
match = wa/**
mode = writearound
"""


def pt_cache(make_cache, passthrough="auto", public=False, **keys):
    extra = {"fuse.passthrough": passthrough, **keys}
    c = make_cache(extra=extra, public=public)
    c.write_conf()
    with open(c.conf, "a") as f:
        f.write(RULES)
    c.format()
    for d in ("pt", "wa", "cached"):
        os.mkdir(os.path.join(c.backing, d))
        os.chmod(os.path.join(c.backing, d), 0o755)
    c.mount()
    return c


def counters(c):
    """Unmount; the daemon's FUSE request counts and its passthrough line, from its log."""
    assert c.unmount() == 0
    log = c.log_text()
    req = [ln for ln in log.splitlines() if "fuse requests:" in ln][-1]
    pt = [ln for ln in log.splitlines() if "passthrough: " in ln and "opens" in ln][-1]
    counts = {k: int(v) for k, v in re.findall(r" ([A-Z_]+) (\d+)", req.split(";")[0])}
    m = re.search(r"passthrough: (\w+); opens (\d+) passthrough, (\d+) cache", pt)
    return counts, {"state": m.group(1), "kernel": int(m.group(2)), "cache": int(m.group(3))}, log


def granted(c):
    """Skip where this kernel or this daemon cannot have passthrough at all."""
    if not os.path.exists("/sys/module/fuse") or os.geteuid() != 0:
        pytest.skip("needs root and the fuse module")


def store(c, rel):
    with open(os.path.join(c.backing, rel), "rb") as f:
        return f.read()


def test_bypass_read_write_through_passthrough(make_cache):
    c = pt_cache(make_cache)
    granted(c)
    data = os.urandom(8 * MiB + 123)
    p = c.path("pt", "a.bin")
    with open(p, "wb") as f:
        f.write(data)
    assert store(c, "pt/a.bin") == data
    with open(p, "rb") as f:
        assert f.read() == data
    # rewrite the middle through an O_RDWR open, read back through another
    patch = os.urandom(MiB)
    fd = os.open(p, os.O_RDWR)
    os.pwrite(fd, patch, 3 * MiB + 7)
    os.fsync(fd)  # the store's file fsynced (its data is in the store's page cache, not on a cache device)
    os.close(fd)
    want = data[:3 * MiB + 7] + patch + data[4 * MiB + 7:]
    assert store(c, "pt/a.bin") == want
    with open(p, "rb") as f:
        assert f.read() == want
    # a write-only open of a writearound file with nothing cached goes the same way
    wa = c.path("wa", "b.bin")
    with open(wa, "wb") as f:
        f.write(data[:MiB])
    assert store(c, "wa/b.bin") == data[:MiB]
    counts, pt, log = counters(c)
    assert pt["state"] == "on", log[-3000:]
    assert pt["kernel"] >= 5 and pt["cache"] == 0, pt
    # the proof: not one READ or WRITE reached the daemon
    assert counts.get("READ", 0) == 0 and counts.get("WRITE", 0) == 0, counts


def test_passthrough_off_serves_through_the_daemon(make_cache):
    """The counter check above can fail: with fuse.passthrough = off the same file's I/O is READs and WRITEs."""
    c = pt_cache(make_cache, passthrough="off")
    data = os.urandom(2 * MiB)
    p = c.path("pt", "a.bin")
    with open(p, "wb") as f:
        f.write(data)
    with open(p, "rb") as f:
        assert f.read() == data
    counts, pt, _ = counters(c)
    assert pt["kernel"] == 0
    assert counts.get("READ", 0) > 0 and counts.get("WRITE", 0) > 0, counts


def test_mmap_through_passthrough(make_cache):
    c = pt_cache(make_cache)
    granted(c)
    data = bytearray(os.urandom(4 * MiB))
    p = c.path("pt", "m.bin")
    with open(p, "wb") as f:
        f.write(data)
    fd = os.open(p, os.O_RDWR)
    m = mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    assert m[:] == bytes(data)
    m[MiB:MiB + 4096] = b"\xa5" * 4096
    data[MiB:MiB + 4096] = b"\xa5" * 4096
    m.flush()
    # a write through the descriptor shows in the map at once: one page cache, the store's
    os.pwrite(fd, b"\x5a" * 100, 2 * MiB)
    data[2 * MiB:2 * MiB + 100] = b"\x5a" * 100
    assert m[2 * MiB:2 * MiB + 100] == b"\x5a" * 100
    m.close()
    os.close(fd)
    assert store(c, "pt/m.bin") == bytes(data)
    counts, pt, _ = counters(c)
    assert pt["kernel"] >= 2 and pt["cache"] == 0, pt
    assert counts.get("READ", 0) == 0 and counts.get("WRITE", 0) == 0, counts


def test_writearound_reads_stay_cached(make_cache):
    """A writearound file's reads are kept in the cache (PRODUCT.md §4.2): only write-only opens of files it holds
    nothing of pass through."""
    c = pt_cache(make_cache)
    granted(c)
    data = os.urandom(2 * MiB)
    with open(os.path.join(c.backing, "wa", "r.bin"), "wb") as f:  # behind the mount
        f.write(data)
    p = c.path("wa", "r.bin")
    before = c.stats()["used_bytes"]
    with open(p, "rb") as f:
        assert f.read() == data
    assert c.stats()["used_bytes"] >= before + 2 * MiB
    with open(p, "r+b") as f:  # cached now: the cache's path, even write-only
        f.write(b"w" * 4096)
    with open(c.path("wa", "new.bin"), "wb") as f:  # nothing cached: passthrough
        f.write(data)
    assert store(c, "wa/new.bin") == data and store(c, "wa/r.bin") == b"w" * 4096 + data[4096:]
    counts, pt, _ = counters(c)
    assert pt["kernel"] == 1 and pt["cache"] == 2, pt
    assert counts.get("READ", 0) > 0 and counts.get("WRITE", 0) > 0, counts


def warm_when_released(c, p, secs=10):
    """nvcachectl warm p, retried while it is refused for a passthrough open whose RELEASE (asynchronous after
    close(2)) has not reached the daemon yet."""
    deadline = time.time() + secs
    while True:
        r = c.ctl("warm", p, check=False)
        if r.returncode == 0 or time.time() > deadline:
            assert r.returncode == 0, (r.stdout, r.stderr)
            return
        assert "passthrough" in r.stdout + r.stderr, (r.stdout, r.stderr)
        time.sleep(0.02)


def test_switch_never_stale(make_cache):
    """A writearound file written through passthrough, then on the cache's path once its blocks exist, and
    back; every open of a file with a passthrough open shares it (a reader too). Interleaved writes and reads
    from both kinds of open, each checked against the expected bytes and the store."""
    c = pt_cache(make_cache)
    granted(c)
    p = c.path("wa", "s.bin")
    want = bytearray(os.urandom(2 * MiB))
    with open(p, "wb") as f:  # passthrough: write-only, nothing cached
        f.write(want)

    def check(fd):
        assert os.pread(fd, len(want) + 10, 0) == bytes(want)

    # 1. passthrough open A (write-only); B (read-write) opened while A is open must share it; interleave
    a = os.open(p, os.O_WRONLY)
    b = os.open(p, os.O_RDWR)
    for i in range(20):
        off = (i * 97 * 1024) % (len(want) - 5000)
        chunk = os.urandom(4096 + i)
        os.pwrite(a if i % 2 else b, chunk, off)
        want[off:off + len(chunk)] = chunk
        check(b)
    os.close(a)
    os.close(b)
    assert store(c, "wa/s.bin") == bytes(want)
    # 2. warmed once the passthrough opens are released: the cache's path, which sees the passthrough writes
    warm_when_released(c, p)
    x = os.open(p, os.O_RDWR)
    check(x)
    y = os.open(p, os.O_WRONLY)  # the cache's path too: x is open there, and the cache holds the file
    for i in range(20):
        off = (i * 61 * 1024) % (len(want) - 5000)
        chunk = os.urandom(3000 + i)
        os.pwrite(x if i % 2 else y, chunk, off)
        want[off:off + len(chunk)] = chunk
        check(x)
    os.close(x)
    os.close(y)
    assert store(c, "wa/s.bin") == bytes(want)
    # 3. evicted: passthrough again after the cache's path wrote (once x and y are released: until then an open
    # stays on the cache's path, and a warm is not refused); a reader shares it; nothing stale
    deadline = time.time() + 10
    while True:
        c.ctl("evict", p)
        z = os.open(p, os.O_WRONLY)
        w = c.ctl("warm", p, check=False)
        if w.returncode != 0:
            break  # refused: z is a passthrough open
        os.close(z)
        assert time.time() < deadline, "the cache-path opens were never released"
        time.sleep(0.02)
    assert "passthrough" in (w.stdout + w.stderr), (w.stdout, w.stderr)
    r = os.open(p, os.O_RDONLY)
    check(r)
    os.pwrite(z, b"Z" * 5000, 1000)
    want[1000:6000] = b"Z" * 5000
    check(r)
    # a warm while it is open through passthrough is refused (it would fill the cache beside it)
    w = c.ctl("warm", p, check=False)
    assert w.returncode != 0 and "passthrough" in (w.stdout + w.stderr), (w.stdout, w.stderr)
    os.close(z)
    os.close(r)
    # 4. and the cache's path again: sees the passthrough write at once, then from the cache once warmed
    with open(p, "rb") as f:
        assert f.read() == bytes(want)
    warm_when_released(c, p)
    with open(p, "rb") as f:
        assert f.read() == bytes(want)
    assert store(c, "wa/s.bin") == bytes(want)
    counts, pt, log = counters(c)
    assert pt["kernel"] >= 4 and pt["cache"] >= 3, pt
    assert "Assertion" not in log


def test_open_during_passthrough_shares_it(make_cache):
    """A bypass file open through passthrough: a second open (O_DIRECT too) shares the backing, no EIO."""
    c = pt_cache(make_cache)
    granted(c)
    p = c.path("pt", "d.bin")
    data = os.urandom(MiB)
    with open(p, "wb") as f:
        f.write(data)
    a = os.open(p, os.O_RDONLY)
    d = os.open(p, os.O_RDWR | os.O_DIRECT)
    buf = mmap.mmap(-1, 65536)
    buf[:] = os.urandom(65536)
    assert os.pwritev(d, [buf], 0) == 65536
    assert os.pread(a, 65536, 0) == bytes(buf)
    os.close(d)
    os.close(a)
    assert store(c, "pt/d.bin") == bytes(buf) + data[65536:]
    counts, pt, _ = counters(c)
    assert pt["cache"] == 0 and counts.get("READ", 0) == 0 and counts.get("WRITE", 0) == 0, (counts, pt)


def nobody(code, *args):
    r = subprocess.run([*AS_NOBODY, "/usr/bin/python3", "-c", code, *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


OPEN_AS = """import errno, os, sys
try:
    fd = os.open(sys.argv[1], int(sys.argv[2]))
    print("ok", os.read(fd, 16).hex())
except OSError as e:
    print(errno.errorcode[e.errno])
"""


def test_hostile_user_refused_what_the_store_refuses(make_cache):
    """nobody cannot read a file the store would not let them read: not while root holds it open through
    passthrough (the open would share root's backing), nor once the store's mode changed behind the mount
    while root holds the file open through passthrough."""
    c = pt_cache(make_cache, public=True)
    granted(c)
    secret = c.path("pt", "secret")
    with open(secret, "wb") as f:
        f.write(b"s" * 4096)
    os.chmod(secret, 0o600)
    held = os.open(secret, os.O_RDWR)  # root's passthrough open: the backing nobody would share
    assert nobody(OPEN_AS, secret, str(os.O_RDONLY)) == "EACCES"
    os.close(held)
    # readable in the kernel's cached attributes, not in the store any more
    shared = c.path("pt", "shared")
    with open(shared, "wb") as f:
        f.write(b"p" * 4096)
    os.chmod(shared, 0o644)
    os.stat(shared)  # the kernel caches 0644 for attr_timeout
    held = os.open(shared, os.O_RDONLY)
    assert nobody(OPEN_AS, shared, str(os.O_RDONLY)).startswith("ok")
    os.chmod(os.path.join(c.backing, "pt", "shared"), 0o600)  # behind the mount's back
    assert nobody(OPEN_AS, shared, str(os.O_RDONLY)) == "EACCES"
    os.close(held)
    assert nobody(OPEN_AS, shared, str(os.O_RDONLY)) == "EACCES"
    counts, pt, _ = counters(c)
    assert pt["kernel"] >= 3


def test_hostile_user_refused_by_the_store_itself(make_cache):
    """The kernel's cached attributes still say 0644 (fuse.attr_timeout) when the store's mode became 0600
    behind the mount: the kernel lets nobody's open through, and only the daemon's open of the file as nobody,
    which passthrough makes before it hands the kernel a backing file, refuses it."""
    c = pt_cache(make_cache, public=True, **{"fuse.attr_timeout": "600s"})
    granted(c)
    p = c.path("pt", "f")
    with open(p, "wb") as f:
        f.write(b"x" * 4096)
    os.chmod(p, 0o644)
    for _ in range(2):  # opens that revalidate (and drop the kernel's attributes) before the change
        with open(p, "rb") as f:
            f.read()
    os.stat(p)
    os.chmod(os.path.join(c.backing, "pt", "f"), 0o600)
    assert os.stat(p).st_mode & 0o777 == 0o644  # what the kernel checks nobody's open against
    assert nobody(OPEN_AS, p, str(os.O_RDONLY)) == "EACCES"
    # root holding it open through passthrough changes nothing for nobody
    held = os.open(p, os.O_RDONLY)
    assert nobody(OPEN_AS, p, str(os.O_RDONLY)) == "EACCES"
    os.close(held)
    counts, pt, _ = counters(c)
    assert pt["kernel"] >= 3, pt


def test_switch_by_rename(make_cache):
    """An open whose policy says the cache's path while a passthrough open of the file exists is passthrough too
    (the kernel refuses anything else with EIO); an open whose policy says passthrough while a cache-path open
    exists is on the cache's path. Renames move a file between policies while it is open."""
    c = pt_cache(make_cache)
    granted(c)
    want = bytearray(os.urandom(MiB))
    # passthrough first, then a writeback-policy name: the second open shares the passthrough
    g = c.path("pt", "g.bin")
    with open(g, "wb") as f:
        f.write(want)
    a = os.open(g, os.O_RDWR)
    g2 = c.path("cached", "g.bin")
    os.rename(g, g2)
    b = os.open(g2, os.O_RDWR)
    for i in range(10):
        chunk = os.urandom(777 + i)
        off = i * 50000
        os.pwrite(b if i % 2 else a, chunk, off)
        want[off:off + len(chunk)] = chunk
        assert os.pread(a if i % 2 else b, len(want), 0) == bytes(want)
    os.close(a)
    os.close(b)
    # now on the cache's path (writeback): it reads the passthrough writes, and writes into the cache
    with open(g2, "r+b") as f:
        assert f.read() == bytes(want)
        f.seek(4096)
        f.write(b"W" * 8192)
        want[4096:12288] = b"W" * 8192
    # the cache's path first, then a bypass name: the second open stays on the cache's path with it
    x = os.open(g2, os.O_RDWR)
    g3 = c.path("pt", "g3.bin")
    os.rename(g2, g3)
    y = os.open(g3, os.O_RDWR)
    for i in range(10):
        chunk = os.urandom(555 + i)
        off = 3000 + i * 40000
        os.pwrite(y if i % 2 else x, chunk, off)
        want[off:off + len(chunk)] = chunk
        assert os.pread(x if i % 2 else y, len(want), 0) == bytes(want)
    os.close(x)
    os.close(y)
    # bypass now, nothing dirty (it became bypass at y's open): passthrough again, the same bytes
    with open(g3, "rb") as f:
        assert f.read() == bytes(want)
    assert store(c, "pt/g3.bin") == bytes(want)
    counts, pt, log = counters(c)
    # the create, a and b at least; an open right after a close may still follow the closed one's rule (its
    # RELEASE is asynchronous)
    assert pt["kernel"] >= 3 and pt["kernel"] + pt["cache"] == 7, pt


def test_refused_on_a_stacked_store(make_cache, tmp_path):
    """A store that is stacked already (overlayfs): the kernel refuses its backing files (ELOOP); logged once,
    every open through the cache, the data right."""
    ov = tmp_path / "ov"
    for d in ("lower", "upper", "work", "merged"):
        (ov / d).mkdir(parents=True)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={ov}/lower,upperdir={ov}/upper,workdir={ov}/work", str(ov / "merged")], check=True)
    try:
        c = make_cache(extra={"fuse.passthrough": "auto", "backing.path": str(ov / "merged")})
        c.write_conf()
        with open(c.conf, "a") as f:
            f.write(RULES)
        c.format()
        os.mkdir(os.path.join(c.backing, "pt"))
        c.mount()
        data = os.urandom(MiB + 5)
        for i in range(3):
            with open(c.path("pt", f"f{i}"), "wb") as f:
                f.write(data)
            with open(c.path("pt", f"f{i}"), "rb") as f:
                assert f.read() == data
            assert store(c, f"pt/f{i}") == data
        counts, pt, log = counters(c)
        assert log.count("the kernel refuses backing files") == 1, log[-3000:]
        assert "stacked" in log
        assert pt["state"] == "refused" and pt["kernel"] == 0, pt
        assert counts.get("READ", 0) > 0 and counts.get("WRITE", 0) > 0
    finally:
        c.cleanup()
        subprocess.run(["umount", str(ov / "merged")], check=False)


# --- streams: a file read as a stream past cache.sequential_cutoff is passed through at its next open ---

STREAM = 16 * MiB  # four times the default cutoff (4M)


def released(c, secs=20):
    """A close(2)'s RELEASE reaches the daemon asynchronously: an open right after it may still follow the closed
    open's rule. Wait until the daemon has released every handle (open_handles 0)."""
    deadline = time.time() + secs
    while c.stats()["open_handles"]:
        assert time.time() < deadline, "a RELEASE never came"
        time.sleep(0.01)


def stream_file(c, name, data):
    """data put in the store behind the mount (nothing cached), then read through the mount as one stream,
    compared byte for byte; the stats after."""
    with open(os.path.join(c.backing, "cached", name), "wb") as f:
        f.write(data)
    with open(c.path("cached", name), "rb") as f:
        assert f.read() == data
    released(c)
    return c.stats()


def read_served(c, p, want):
    """p read whole through a new open, compared with want: True if reads reached the cache (read_ops moved),
    False if the kernel served it from the store (passthrough). The kernel's page cache of the file is dropped
    first, so that an open on the cache's path sends its READs."""
    before = c.stats()["read_ops"]
    with open(p, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        assert f.read() == want
    released(c)
    return c.stats()["read_ops"] != before


def streams_line(log):
    m = re.findall(r"backings \d+ \((\d+) of streams\)", log)
    assert m, log[-3000:]
    return int(m[-1])


def test_stream_reopened_through_passthrough(make_cache):
    """The file's first stream goes through the cache (its head kept, the rest past the cutoff not); the next
    read-only open gives the head up and the kernel streams the file from the store: not one READ reaches the
    daemon, the bytes are the store's, and nothing is left in the cache."""
    c = pt_cache(make_cache, public=True)
    granted(c)
    data = os.urandom(STREAM)
    st = stream_file(c, "s.bin", data)
    assert st["read_bypass_bytes"] > 0 and st["used_bytes"] > 0, st
    p = c.path("cached", "s.bin")
    assert not read_served(c, p, data)
    st = c.stats()
    assert st["stream_drops"] == 1 and st["used_bytes"] == 0, st
    assert not read_served(c, p, data)  # and again, with nothing to drop
    # passthrough opens are made as the caller: the store's refusal is theirs
    os.chmod(os.path.join(c.backing, "cached"), 0o755)
    os.chmod(os.path.join(c.backing, "cached", "s.bin"), 0o644)
    assert nobody(OPEN_AS, p, str(os.O_RDONLY)) == "ok " + data[:16].hex()
    os.chmod(os.path.join(c.backing, "cached", "s.bin"), 0o600)
    os.stat(p)
    assert nobody(OPEN_AS, p, str(os.O_RDONLY)) == "EACCES"
    counts, pt, log = counters(c)
    assert streams_line(log) >= 2 and pt["kernel"] >= 2, (pt, log[-2000:])
    assert "Assertion" not in log


def test_stream_passthrough_never_stale(make_cache):
    """Across the switch from a streamed passthrough open to the cache's path and back: a writer opened beside a
    passthrough reader shares it (the reader sees its write at once), a later write on the cache's path is
    dirty in the cache, and the next read-only open (the file still last read as a stream) is not passed
    through: it reads the dirty bytes, not the store's older ones. Random reads of every open are compared with
    the expected bytes."""
    c = pt_cache(make_cache)
    granted(c)
    want = bytearray(os.urandom(STREAM))
    stream_file(c, "n.bin", bytes(want))
    p = c.path("cached", "n.bin")
    before = c.stats()["read_ops"]
    r = os.open(p, os.O_RDONLY)  # passthrough: streamed, nothing dirty
    w = os.open(p, os.O_RDWR)  # shares it (the kernel would refuse a cache-path open with EIO)
    for i in range(16):
        off = (i * 1_000_003) % (STREAM - 9000)
        chunk = os.urandom(4096 + i * 300)
        os.pwrite(w, chunk, off)
        want[off:off + len(chunk)] = chunk
        q = (i * 777_777) % (STREAM - 70000)
        assert os.pread(r, 65536, q) == bytes(want[q:q + 65536])
    # the writer's fsync: its writes are the store's (passthrough), so the store's file is fsynced, although the
    # file's mode is writeback (whose own fsync leaves the store alone: its data is on the cache devices)
    st = c.stats()
    assert st["passthrough_handles"] == 2 and st["open_handles"] == 2, st
    for k in range(2):  # the first may fsync for the file's own existence
        fsyncs = c.stats()["latency"]["backing_fsync"]["count"]
        os.pwrite(w, b"F" * 100, 7 * MiB + k)
        want[7 * MiB + k:7 * MiB + k + 100] = b"F" * 100
        os.fsync(w)
        assert c.stats()["latency"]["backing_fsync"]["count"] > fsyncs, k
    # the reader's fsync covers the writer's writes too (fsync is of the file)
    fsyncs = c.stats()["latency"]["backing_fsync"]["count"]
    os.pwrite(w, b"G" * 100, 9 * MiB)
    want[9 * MiB:9 * MiB + 100] = b"G" * 100
    os.fsync(r)
    assert c.stats()["latency"]["backing_fsync"]["count"] > fsyncs
    os.close(w)
    os.close(r)
    assert c.stats()["read_ops"] == before, "the streamed open was not passed through"
    assert store(c, "cached/n.bin") == bytes(want)
    released(c)
    # a write on the cache's path (not read-only: never taken as a stream): dirty in the cache, not in the store
    with open(p, "r+b") as f:
        f.seek(5 * MiB + 11)
        f.write(b"D" * 20000)
    want[5 * MiB + 11:5 * MiB + 20011] = b"D" * 20000
    assert store(c, "cached/n.bin") != bytes(want)
    assert c.stats()["dirty_bytes"] > 0
    released(c)
    # read whole on the cache's path (the write's open took it there): a stream past the cutoff again, with
    # dirty data in it; the next read-only open is not passed through: it returns the dirty bytes
    assert read_served(c, p, bytes(want))
    assert read_served(c, p, bytes(want))
    assert c.stats()["stream_drops"] == 1, c.stats()
    c.ctl("flush", c.mnt)
    assert store(c, "cached/n.bin") == bytes(want)
    counts, pt, log = counters(c)
    assert "Assertion" not in log


def test_warmed_file_read_as_stream_stays_cached(make_cache):
    """A file read as a stream, then warmed, is kept: its next opens stay on the cache's path (a stream that
    only hits is not taken for one) and keep every byte cached."""
    c = pt_cache(make_cache)
    granted(c)
    data = os.urandom(STREAM)
    stream_file(c, "w.bin", data)
    p = c.path("cached", "w.bin")
    c.ctl("warm", p)
    used = c.stats()["used_bytes"]
    assert used >= STREAM
    assert read_served(c, p, data)
    assert read_served(c, p, data)
    st = c.stats()
    assert st["stream_drops"] == 0 and st["used_bytes"] == used, st


def test_streamed_file_relearned_every_eighth_open(make_cache):
    """Passthrough opens send no reads, so the cache could never learn that a streamed file is now read at random:
    every 8th open taken as a stream goes through the cache instead. Read whole, the pattern is seven passthrough
    opens and one through the cache; a random reader on that open keeps the file in the cache from then on."""
    c = pt_cache(make_cache)
    granted(c)
    data = os.urandom(STREAM)
    stream_file(c, "r.bin", data)
    p = c.path("cached", "r.bin")
    served = [read_served(c, p, data) for _ in range(16)]
    assert served == ([False] * 7 + [True]) * 2, served
    # the 8th open of the next round reads at random: its reads are admitted, the hint is gone
    for _ in range(7):
        assert not read_served(c, p, data)
    fd = os.open(p, os.O_RDONLY)
    for i in range(64):
        off = (i * 2_654_435_761) % (STREAM - 4096) & ~4095
        assert os.pread(fd, 4096, off) == data[off:off + 4096]
    os.close(fd)
    released(c)
    assert read_served(c, p, data)  # the cache's path: read whole, it is a stream again
    assert not read_served(c, p, data)
    counts, pt, log = counters(c)
    assert streams_line(log) == 22, log[-2000:]


def test_stream_passthrough_writer_flushed_at_close(make_cache):
    """destage.on_close = flush: a writer that shares a stream's passthrough open has written the store's file
    itself, so its close fsyncs that file (for a writeback file the cache's own flush has nothing to destage)."""
    c = pt_cache(make_cache, **{"destage.on_close": "flush"})
    granted(c)
    want = bytearray(os.urandom(STREAM))
    stream_file(c, "c.bin", bytes(want))
    p = c.path("cached", "c.bin")
    r = os.open(p, os.O_RDONLY)  # passthrough: streamed, nothing dirty
    for k in range(2):  # the first close may fsync for the file's own existence
        w = os.open(p, os.O_RDWR)
        assert c.stats()["passthrough_handles"] == 2
        fsyncs = c.stats()["latency"]["backing_fsync"]["count"]
        os.pwrite(w, b"C" * 300, 3 * MiB + k)
        want[3 * MiB + k:3 * MiB + k + 300] = b"C" * 300
        os.close(w)
        assert c.stats()["latency"]["backing_fsync"]["count"] > fsyncs, k
        assert os.pread(r, 1000, 3 * MiB) == bytes(want[3 * MiB:3 * MiB + 1000])
    os.close(r)
    assert store(c, "cached/c.bin") == bytes(want)


def test_execute_only_program_in_a_bypass_file(make_cache):
    """An execve's open asks execute, not read: a 0711 program under a bypass policy, run by a process of
    nobody's without capabilities, runs (its open cannot be made as the caller for reading, so it takes the
    cache's path), also while root holds the file open through passthrough (then the store is asked for execute
    as the caller)."""
    import shutil
    c = pt_cache(make_cache, public=True)
    granted(c)
    prog = os.path.join(c.backing, "pt", "prog")
    shutil.copy("/bin/true", prog)
    os.chmod(prog, 0o711)
    run = [*AS_NOBODY, "/bin/sh", "-c", 'exec "$0"', c.path("pt", "prog")]
    r = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    released(c)
    held = os.open(c.path("pt", "prog"), os.O_RDONLY)  # root's passthrough open
    assert c.stats()["passthrough_handles"] == 1
    r = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    os.chmod(prog, 0o700)  # and refused when the store refuses execute
    os.stat(c.path("pt", "prog"))
    r = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    os.close(held)
