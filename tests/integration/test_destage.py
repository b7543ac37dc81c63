"""Destage policy through the real mount: watermarks, age, idle time, rate cap, large sequential writes."""
import os
import re
import shutil
import subprocess
import time

import pytest

MiB = 1 << 20


def wait_for(fn, timeout=30, step=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(step)
    return fn()


def write_files(root, n, size, prefix="f"):
    blobs = {}
    for i in range(n):
        b = os.urandom(size)
        with open(os.path.join(root, f"{prefix}{i}"), "wb") as f:
            f.write(b)
        blobs[f"{prefix}{i}"] = b
    return blobs


def pct(st):
    return 100.0 * st["dirty_slots"] / st["nslots"]


def test_watermarks(make_cache):
    c = make_cache(dev_size=16 * MiB + MiB // 2, extra={"destage.high_watermark": "50", "destage.low_watermark": "20"})
    c.format()
    c.mount()
    # 1 MiB files: destage works a file at a time, so it can stop near the low mark
    blobs = write_files(c.mnt, 12, MiB)
    time.sleep(1.5)
    st = c.stats()
    assert 30 <= pct(st) < 50 and st["destaged_bytes"] == 0, st   # below high: nothing moves
    blobs.update(write_files(c.mnt, 3, MiB, "g"))                  # 48%: still below
    time.sleep(1.0)
    assert c.stats()["destaged_bytes"] == 0
    # the file that crosses the high watermark is the last write: a write after the drain has reached the low
    # mark would leave more dirty (the drain takes ten file passes, this write's rest a millisecond)
    blobs["h"] = os.urandom(MiB)
    fd = os.open(c.path("h"), os.O_WRONLY | os.O_CREAT, 0o644)
    assert os.write(fd, blobs["h"]) == MiB
    os.close(fd)
    assert wait_for(lambda: c.stats()["destaged_bytes"] > 0 and pct(c.stats()) <= 20 and not c.stats()["destaging"])
    time.sleep(1.0)
    st = c.stats()
    assert 10 <= pct(st) <= 20, st                                 # ... and stops at the low one
    for name, b in blobs.items():
        with open(c.path(name), "rb") as f:
            assert f.read() == b
    assert c.unmount() == 0
    for name, b in blobs.items():
        with open(os.path.join(c.backing, name), "rb") as f:
            assert f.read() == b


@pytest.mark.parametrize("key", ["destage.max_dirty_age", "destage.idle_after"])
def test_age_and_idle_destage(make_cache, key):
    c = make_cache(extra={key: "500ms"})
    c.format()
    c.mount()
    blobs = write_files(c.mnt, 2, 3 * MiB)
    assert c.stats()["dirty_bytes"] > 0
    assert wait_for(lambda: c.stats()["dirty_bytes"] == 0, timeout=20)
    for name, b in blobs.items():
        with open(os.path.join(c.backing, name), "rb") as f:
            assert f.read() == b
    c.unmount()


def test_rate_cap(make_cache):
    c = make_cache(extra={"destage.max_rate": "4M"})
    c.format()
    c.mount()
    write_files(c.mnt, 1, 12 * MiB)
    t = time.time()
    c.flush()
    took = time.time() - t
    # 12 MiB at 4 MiB/s: the first MiB goes at once, the rest is paced
    assert took >= 2.5, took
    c.unmount()


@pytest.mark.skipif(not shutil.which("strace"), reason="strace is installed by tools/quickstart.sh")
def test_contiguous_dirty_blocks_go_out_as_large_writes(make_cache):
    c = make_cache()
    c.format()
    c.mount()
    with open(c.path("seq"), "wb") as f:
        for _ in range(16):
            f.write(os.urandom(MiB))
    log = os.path.join(c.tmp, "strace.log")
    tr = subprocess.Popen(["strace", "-f", "-e", "trace=pwrite64,fdatasync", "-o", log, "-p", str(c.proc.pid)])
    time.sleep(0.5)
    c.flush()
    tr.terminate()
    tr.wait()
    # two writers in flight: a call may show as "<unfinished ...>" and "<... pwrite64 resumed>) = N"
    sizes = [int(m.group(1)) for m in re.finditer(r"pwrite64(?:\(.*| resumed>.*)\)\s+= (\d+)$", open(log).read(),
                                                  re.M)]
    big = [s for s in sizes if s >= 512 * 1024]
    assert sum(sizes) >= 16 * MiB and len(big) >= 15, sizes
    assert "fdatasync" in open(log).read()
    c.unmount()


def random_writes(path, size, total, seed, sizes=(4096, 16384, 65536)):
    """Random page-aligned writes of total bytes into a file of size; returns what the file must hold."""
    import random
    rng = random.Random(seed)
    ref = bytearray(size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, size)
        done = 0
        while done < total:
            n = rng.choice(sizes)
            off = rng.randrange(0, size - n) // 4096 * 4096
            d = rng.randbytes(n)
            assert os.pwrite(fd, d, off) == n
            ref[off:off + n] = d
            done += n
    finally:
        os.close(fd)
    return bytes(ref)


def test_writers_paced_past_the_high_watermark(make_cache):
    """Writing three times the cache in scattered pages: writers are slowed between the high watermark and full
    (the counters say so, the stats text too), and the file is byte-identical through the mount and, after a
    flush, in the backing store (scattered pages destaged as many short runs of one pass)."""
    c = make_cache(dev_size=8 * MiB, extra={"destage.high_watermark": "40", "destage.low_watermark": "20",
                                            "destage.max_rate": "16M"})
    c.format()
    c.mount()
    ref = random_writes(c.path("scat"), 24 * MiB, 48 * MiB, 29)
    st, held = c.stats(), c.stats_json()["total"]["latency"]["pace"]
    assert st["throttled_ops"] > 0 and held["count"] == st["throttled_ops"] and held["max_us"] > 0, (st, held)
    text = c.ctl("stats", c.mnt).stdout
    assert re.search(r"writers (not )?slowed now.*: \d+ writes held .* in all \(p99 .*\) past the high watermark, "
                     r"\d+ waited", text), text
    with open(c.path("scat"), "rb") as f:
        assert f.read() == ref
    c.flush()
    with open(os.path.join(c.backing, "scat"), "rb") as f:
        assert f.read() == ref
    assert c.unmount() == 0


def test_no_pacing_when_off(make_cache):
    """destage.pace_writers = 0: the same writes are never held (only the wait at full remains)."""
    c = make_cache(dev_size=8 * MiB, extra={"destage.high_watermark": "40", "destage.low_watermark": "20",
                                            "destage.max_rate": "16M", "destage.pace_writers": "0"})
    c.format()
    c.mount()
    ref = random_writes(c.path("scat"), 24 * MiB, 24 * MiB, 30)
    assert c.stats()["throttled_ops"] == 0
    c.flush()
    with open(os.path.join(c.backing, "scat"), "rb") as f:
        assert f.read() == ref
    assert c.unmount() == 0


def test_kill9_while_writers_are_paced(make_cache):
    """kill -9 while writers are being slowed past the high watermark: after a remount every acknowledged write
    is there, and after a flush the backing store holds exactly that."""
    import threading
    from test_kill import Model, writer
    c = make_cache(dev_size=8 * MiB, extra={"destage.high_watermark": "30", "destage.low_watermark": "10",
                                            "destage.max_rate": "8M"})
    c.format()
    c.mount()
    model, stop = Model(), threading.Event()
    ts = [threading.Thread(target=writer, args=(c.mnt, model, w, stop, 2900 + w)) for w in range(4)]
    for t in ts:
        t.start()
    paced = wait_for(lambda: c.stats()["throttled_ops"] >= 50, timeout=60)
    c.kill9()
    stop.set()
    for t in ts:
        t.join()
    assert paced, "writers were never paced"
    c.mount()
    for n in model.data:
        with open(c.path(n), "rb") as f:
            model.check(n, f.read())
        with open(c.path(n), "rb") as f:
            model.data[n] = bytearray(f.read())
    c.flush()
    for n in model.data:
        with open(os.path.join(c.backing, n), "rb") as f:
            assert f.read() == model.data[n], n
    assert c.unmount() == 0
    assert model.acked > 0
