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
