"""Writes around the cache past destage.write_around (issue 29), through the real mount: ordering against dirty
data, O_DIRECT, buffered and RWF_DSYNC writes of more than the cache, kill -9 while writes go around."""
import json
import mmap
import os
import random
import threading

from test_destage import wait_for

MiB = 1 << 20
BS = 64 * 1024  # cache.block_size's default
# two 8 MiB devices (256 blocks); destage starts at 30% and is slow, so that writes go around for seconds
EXTRA = {"destage.high_watermark": "30", "destage.low_watermark": "10", "destage.write_around": "30",
         "destage.max_rate": "2M"}


def aligned(data):
    """data in a page-aligned buffer (O_DIRECT)."""
    m = mmap.mmap(-1, max(len(data), 4096))
    m[:len(data)] = data
    return m


def around(c):
    return c.stats()["write_around_bytes"]


def dirty_of(c, name):
    (f,) = json.loads(c.ctl("status", c.path(name), "--json").stdout)["files"]
    return f["dirty_bytes"]


def pressure(c, fd, state):
    """Whole blocks of the filler file dirtied until writes go around (the stats gauge says so)."""
    rng = state.setdefault("rng", random.Random(29))
    for _ in range(400):
        if c.stats()["writing_around"]:
            return
        for _ in range(8):
            os.pwrite(fd, rng.randbytes(BS), state.setdefault("next", 0))
            state["next"] += BS
    raise AssertionError(f"writes never went around: {c.stats()}")


def test_write_around_keeps_order_with_dirty_data(make_cache):
    """Past destage.write_around, a write onto dirty data goes through the cache (never around it: the older
    dirty copy would later be destaged over it), a write onto clean cached data goes around and the clean copy
    is dropped (a read returns the new bytes), a write onto nothing cached goes around; the file reads back
    byte for byte, and after a flush the store holds exactly the same."""
    # one destager, busy with the filler (dirty first) while f's block stays dirty
    c = make_cache(dev_size=8 * MiB, extra=dict(EXTRA, **{"destage.threads": "1"}))
    c.format()
    c.mount()
    size = 4 * MiB
    ref = bytearray(os.urandom(size))
    with open(c.path("f"), "wb") as f:
        f.write(ref)
    c.flush()  # f is in the store, and no longer in the cache
    c.ctl("evict", c.path("f"))
    fd = os.open(c.path("f"), os.O_RDWR | os.O_DIRECT)
    filler = os.open(c.path("filler"), os.O_RDWR | os.O_CREAT, 0o644)
    state = {"next": 0}
    try:
        for _ in range(48):  # 19% of the blocks: below the high watermark
            os.pwrite(filler, os.urandom(BS), state["next"])
            state["next"] += BS
        # a pinned file's writes stay in the cache: D1 is made dirty there while writes go around, and the
        # destager is busy with the filler, dirty before it
        c.ctl("pin", c.path("f"))
        pressure(c, filler, state)
        a0 = around(c)
        d1 = os.urandom(BS)
        assert os.pwrite(fd, aligned(d1), 0) == BS
        ref[0:BS] = d1
        assert around(c) == a0
        c.ctl("unpin", c.path("f"))
        c.ctl("evict", c.path("f"))  # its clean blocks go, D1 stays
        # and a clean cached copy of block 8 (a read miss keeps it)
        assert os.pread(fd, BS, 8 * BS) == bytes(ref[8 * BS:9 * BS])
        pressure(c, filler, state)
        assert dirty_of(c, "f") == BS, "D1 was destaged before it could be overwritten"
        # D2 over D1's last page and the next block's first (not cached): dirty data in the range, so through
        # the cache; around it, the dirty D1 page would be read back, and destaged over D2 later
        a0 = around(c)
        d2 = os.urandom(8192)
        assert os.pwrite(fd, aligned(d2), BS - 4096) == 8192
        ref[BS - 4096:BS + 4096] = d2
        # D3 over all of D1's block and the next two: the same
        d3 = os.urandom(3 * BS)
        assert os.pwrite(fd, aligned(d3), 0) == 3 * BS
        ref[0:3 * BS] = d3
        assert around(c) == a0, "a write onto dirty data went around the cache"

        pressure(c, filler, state)
        # onto the clean cached copy of block 8: around, and the copy goes
        a0 = around(c)
        e = os.urandom(4096)
        assert os.pwrite(fd, aligned(e), 8 * BS + 4096) == 4096
        ref[8 * BS + 4096:8 * BS + 8192] = e
        assert around(c) == a0 + 4096
        assert os.pread(fd, BS, 8 * BS) == bytes(ref[8 * BS:9 * BS])
        # onto nothing cached (blocks 20, 21), then a write through the cache onto it is not overtaken either
        pressure(c, filler, state)
        a0 = around(c)
        g = os.urandom(2 * BS)
        assert os.pwrite(fd, aligned(g), 20 * BS) == 2 * BS
        ref[20 * BS:22 * BS] = g
        assert around(c) == a0 + 2 * BS
        assert os.pread(fd, 2 * BS, 20 * BS) == bytes(ref[20 * BS:22 * BS])
    finally:
        os.close(fd)
        os.close(filler)
    text = c.ctl("stats", c.mnt).stdout
    assert "written around the cache; writes with no dirty copy go" in text, text
    with open(c.path("f"), "rb") as f:
        assert f.read() == ref
    c.flush()
    with open(os.path.join(c.backing, "f"), "rb") as f:
        assert f.read() == ref, "the store does not hold the last write of every byte"
    assert c.unmount() == 0


def test_write_around_random_4k_direct_buffered_dsync(make_cache):
    """4K random writes of three times the cache into files laid out first: O_DIRECT into one, buffered into
    another, RWF_DSYNC into a third; some go around the cache, every file reads back byte for byte through the
    mount, again after a remount, and the store holds the same after a flush."""
    c = make_cache(dev_size=8 * MiB, extra=EXTRA)
    c.format()
    c.mount()
    size, total = 16 * MiB, 48 * MiB
    rng = random.Random(2929)
    refs, fds = {}, {}
    for name, flags in (("direct", os.O_DIRECT), ("buffered", 0), ("dsync", 0)):
        refs[name] = bytearray(rng.randbytes(size))
        with open(c.path(name), "wb") as f:
            f.write(refs[name])
        fds[name] = os.open(c.path(name), os.O_RDWR | flags)
    try:
        done = 0
        while done < total:
            name = rng.choice(list(fds))
            off = rng.randrange(0, size // 4096) * 4096
            d = rng.randbytes(4096)
            if name == "direct":
                n = os.pwrite(fds[name], aligned(d), off)
            elif name == "dsync":
                n = os.pwritev(fds[name], [d], off, os.RWF_DSYNC)
            else:
                n = os.pwrite(fds[name], d, off)
            assert n == 4096
            refs[name][off:off + 4096] = d
            done += 4096
        os.fsync(fds["buffered"])
    finally:
        for fd in fds.values():
            os.close(fd)
    st = c.stats()
    assert st["write_around_bytes"] > 0, st
    for name, ref in refs.items():
        with open(c.path(name), "rb") as f:
            assert f.read() == ref, name
    assert c.unmount() == 0
    c.mount()
    for name, ref in refs.items():
        with open(c.path(name), "rb") as f:
            assert f.read() == ref, name
    c.flush()
    for name, ref in refs.items():
        with open(os.path.join(c.backing, name), "rb") as f:
            assert f.read() == ref, name
    assert c.unmount() == 0


def test_kill9_while_writes_go_around(make_cache):
    """kill -9 while writes go around the cache (and others are paced into it): after a remount every
    acknowledged write is there, and after a flush the store holds exactly that."""
    from test_kill import Model, writer
    c = make_cache(dev_size=8 * MiB, extra=EXTRA)
    c.format()
    c.mount()
    model, stop = Model(), threading.Event()
    ts = [threading.Thread(target=writer, args=(c.mnt, model, w, stop, 2929 + w)) for w in range(4)]
    for t in ts:
        t.start()
    went = wait_for(lambda: c.stats()["write_around_bytes"] >= 2 * MiB, timeout=90)
    c.kill9()
    stop.set()
    for t in ts:
        t.join()
    assert went, "writes never went around the cache"
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
