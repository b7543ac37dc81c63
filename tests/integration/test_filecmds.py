"""The per-file commands through the real mount: warm, pin/unpin, evict, status, flush MNT PATH."""
import json
import os
import socket
import time

from conftest import MiB
from test_policy import wait_for
from test_stats import direct_read

BS = 64 * 1024


def backing_file(c, name, data):
    """A file written on the backing store only (nothing of it cached)."""
    path = os.path.join(c.backing, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def mount_write(c, name, data, off=0):
    fd = os.open(c.path(name), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, off)
    finally:
        os.close(fd)


def status(c, *paths, recursive=False):
    args = ["status", *paths, "--json"] + (["-r"] if recursive else [])
    return json.loads(c.ctl(*args).stdout)


def one(c, name):
    (f,) = status(c, c.path(name))["files"]
    assert f["path"] == c.path(name)
    return f


def reads(c):
    st = c.stats()
    return st["read_hit_ops"], st["read_miss_ops"], st["read_partial_ops"], st["read_hit_bytes"]


def all_hits(c, name, data):
    """Read name with O_DIRECT: the bytes are data, and every read was a hit."""
    h0, m0, p0, b0 = reads(c)
    assert direct_read(c.path(name), BS) == data
    h1, m1, p1, b1 = reads(c)
    assert (m1 - m0, p1 - p0) == (0, 0), (h1 - h0, m1 - m0, p1 - p0)
    assert b1 - b0 == len(data)


def test_warm_then_all_hits(make_cache):
    # a sequential cutoff far below the file: reads alone would keep little of it
    c = make_cache(extra={"cache.sequential_cutoff": "256K"})
    data = os.urandom(16 * MiB)
    backing_file(c, "d/big", data)
    small = os.urandom(100 * 1024 + 7)
    backing_file(c, "d/sub/small", small)
    c.format()
    c.mount()
    assert one(c, "d/big")["cached_bytes"] == 0
    r = c.ctl("warm", c.path("d"), "-r")
    assert "warmed 2 files" in r.stdout, r.stdout
    assert one(c, "d/big")["cached_bytes"] == len(data)
    assert one(c, "d/sub/small")["cached_bytes"] == len(small)
    all_hits(c, "d/big", data)
    all_hits(c, "d/sub/small", small)


def test_warm_refuses_more_than_fits(make_cache):
    c = make_cache(dev_size=16 * MiB)
    data = os.urandom(48 * MiB)
    backing_file(c, "huge", data)
    c.format()
    c.mount()
    r = c.ctl("warm", c.path("huge"), check=False)
    assert r.returncode != 0
    assert "need 48.0 MiB" in r.stderr and "available" in r.stderr and "--partial" in r.stderr, r.stderr
    assert one(c, "huge")["cached_bytes"] == 0
    r = c.ctl("warm", c.path("huge"), "--partial")
    got = one(c, "huge")["cached_bytes"]
    cap = c.stats()["nslots"] * BS
    assert 0 < got <= cap, (got, cap)
    assert direct_read(c.path("huge"), MiB) == data


def test_pin_survives_working_set_remount_and_kill(make_cache):
    # ~30 MiB of cache, every miss kept: a working set of 96 MiB goes through it three times over
    c = make_cache(dev_size=16 * MiB, extra={"cache.sequential_cutoff": "0"})
    pinned = os.urandom(4 * MiB + 123)
    backing_file(c, "keep", pinned)
    others = [os.urandom(32 * MiB) for _ in range(3)]
    for i, d in enumerate(others):
        backing_file(c, f"ws/{i}", d)
    c.format()
    c.mount()
    r = c.ctl("pin", c.path("keep"))
    assert "pinned 1 file" in r.stdout, r.stdout
    f = one(c, "keep")
    assert f["pinned"] and f["cached_bytes"] == len(pinned), f

    def working_set():
        for i, d in enumerate(others):
            assert direct_read(c.path(f"ws/{i}"), MiB) == d
        assert c.stats()["evictions"] > 0

    working_set()
    f = one(c, "keep")
    assert f["pinned"] and f["cached_bytes"] == len(pinned), f
    all_hits(c, "keep", pinned)

    for restart in (c.unmount, c.kill9):
        restart()
        c.mount()
        f = one(c, "keep")
        assert f["pinned"] and f["cached_bytes"] == len(pinned), (restart.__name__, f)
        working_set()
        all_hits(c, "keep", pinned)

    # unpinned, it is evicted like the rest
    c.ctl("unpin", c.path("keep"))
    assert not one(c, "keep")["pinned"]
    working_set()
    assert one(c, "keep")["cached_bytes"] < len(pinned)


def test_a_pinned_file_written_through_the_mount_stays_pinned(make_cache):
    """Writes to a pinned file (over its data and past its end) keep it pinned: after destage its blocks, old
    and new, outlast a working set twice the cache and are all hits; deleted, it gives its space back."""
    c = make_cache(dev_size=16 * MiB, extra={"cache.sequential_cutoff": "0"})
    data = bytearray(os.urandom(4 * MiB))
    backing_file(c, "keep", bytes(data))
    others = [os.urandom(32 * MiB) for _ in range(2)]
    for i, d in enumerate(others):
        backing_file(c, f"ws/{i}", d)
    c.format()
    c.mount()
    c.ctl("pin", c.path("keep"))
    new = os.urandom(MiB)
    mount_write(c, "keep", new, off=MiB)
    data[MiB:2 * MiB] = new
    tail = os.urandom(MiB + 77)
    mount_write(c, "keep", tail, off=len(data))
    data += tail
    f = one(c, "keep")
    assert f["pinned"] and f["dirty_bytes"] > 0 and f["size"] == len(data), f
    c.ctl("flush", c.mnt, c.path("keep"))
    f = one(c, "keep")
    assert f["pinned"] and f["dirty_bytes"] == 0 and f["backing_up_to_date"], f
    for i, d in enumerate(others):
        assert direct_read(c.path(f"ws/{i}"), MiB) == d
    assert c.stats()["evictions"] > 0
    f = one(c, "keep")
    assert f["pinned"] and f["cached_bytes"] == len(data), f
    all_hits(c, "keep", bytes(data))
    with open(os.path.join(c.backing, "keep"), "rb") as b:
        assert b.read() == bytes(data)
    used = c.stats()["used_bytes"]
    os.unlink(c.path("keep"))
    assert wait_for(lambda: c.stats()["used_bytes"] <= used - len(data) + BS), (used, c.stats()["used_bytes"])


def test_pinned_data_read_after_a_change_elsewhere_survives_a_remount(make_cache):
    """A pinned file changed behind the cache loses its clean data at the next open (§4.7); what the reads after
    it bring back is kept as pinned data, and a remount and a kill -9 still find it (not only what pin loaded)."""
    c = make_cache(extra={"cache.sequential_cutoff": "0"})
    old = os.urandom(4 * MiB)
    backing_file(c, "p", old)
    c.format()
    c.mount()
    c.ctl("pin", c.path("p"))
    assert one(c, "p")["cached_bytes"] == len(old)
    new = os.urandom(4 * MiB)
    time.sleep(0.01)
    backing_file(c, "p", new)                     # another node's change
    assert direct_read(c.path("p"), MiB) == new   # the open drops the old data; the misses keep the new
    f = one(c, "p")
    assert f["pinned"] and f["cached_bytes"] == len(new), f
    for restart in (c.unmount, c.kill9):
        restart()
        c.mount()
        f = one(c, "p")
        assert f["pinned"] and f["cached_bytes"] == len(new), (restart.__name__, f)
        all_hits(c, "p", new)


def test_pin_past_max_pinned_is_refused(make_cache):
    c = make_cache(dev_size=16 * MiB, extra={"cache.max_pinned": "20"})
    a, b = os.urandom(4 * MiB), os.urandom(4 * MiB)
    backing_file(c, "a", a)
    backing_file(c, "b", b)
    c.format()
    c.mount()
    c.ctl("pin", c.path("a"))
    r = c.ctl("pin", c.path("b"), check=False)
    assert r.returncode != 0
    assert "not pinned" in r.stderr and "cache.max_pinned" in r.stderr, r.stderr
    assert not one(c, "b")["pinned"] and one(c, "a")["pinned"]
    # a pinned file deleted gives its pin back
    os.unlink(c.path("a"))
    c.ctl("pin", c.path("b"))
    assert one(c, "b")["pinned"]


def test_evict_drops_clean_data(cache):
    c = cache
    data = bytearray(os.urandom(8 * MiB))
    backing_file(c, "e", bytes(data))
    c.ctl("warm", c.path("e"))
    assert one(c, "e")["cached_bytes"] == len(data)
    w = os.urandom(BS)
    mount_write(c, "e", w, 3 * BS)                # one block dirty (destage held off)
    data[3 * BS:4 * BS] = w
    used0 = c.stats()["used_bytes"]
    r = c.ctl("evict", c.path("e"))
    assert "evicted 1 file" in r.stdout, r.stdout
    f = one(c, "e")
    assert (f["cached_bytes"], f["dirty_bytes"]) == (BS, BS), f
    assert c.stats()["used_bytes"] == used0 - (len(data) - BS)
    assert direct_read(c.path("e"), MiB) == bytes(data)
    c.ctl("evict", c.path("e"), "--flush")
    f = one(c, "e")
    assert (f["cached_bytes"], f["dirty_bytes"], f["backing_up_to_date"]) == (0, 0, True), f
    with open(os.path.join(c.backing, "e"), "rb") as b:
        assert b.read() == bytes(data)
    # pinned: evict says so and keeps it
    c.ctl("pin", c.path("e"))
    r = c.ctl("evict", c.path("e"), check=False)
    assert r.returncode != 0 and "unpin it first" in r.stderr, r.stderr
    assert one(c, "e")["cached_bytes"] == len(data)
    # evict --flush of a pinned file does nothing at all: its dirty data is not destaged either
    w = os.urandom(BS)
    mount_write(c, "e", w, 5 * BS)
    data[5 * BS:6 * BS] = w
    r = c.ctl("evict", c.path("e"), "--flush", check=False)
    assert r.returncode != 0 and "unpin it first" in r.stderr, r.stderr
    f = one(c, "e")
    assert (f["cached_bytes"], f["dirty_bytes"], f["pinned"]) == (len(data), BS, True), f
    assert direct_read(c.path("e"), MiB) == bytes(data)


def test_status_figures_are_what_was_written(cache):
    c = cache
    a = os.urandom(MiB + 1000)
    os.makedirs(c.path("dir"))
    mount_write(c, "dir/a", a)
    b = os.urandom(3 * MiB)
    backing_file(c, "dir/b", b)
    assert direct_read(c.path("dir/b"), BS) == b   # cached by the reads
    fa = one(c, "dir/a")
    assert fa["size"] == len(a) and fa["dirty_bytes"] == len(a) and fa["cached_bytes"] == len(a), fa
    assert not fa["backing_up_to_date"] and not fa["pinned"] and fa["oldest_dirty_age_s"] > 0
    assert fa["policy"] == "-"
    fb = one(c, "dir/b")
    assert (fb["size"], fb["cached_bytes"], fb["dirty_bytes"]) == (len(b), len(b), 0), fb
    assert fb["backing_up_to_date"]
    s = status(c, c.path("dir"), recursive=True)
    assert s["totals"]["files"] == 2
    assert s["totals"]["cached_bytes"] == len(a) + len(b)
    assert s["totals"]["dirty_bytes"] == len(a)
    assert [f["path"] for f in s["top_cached"]] == [c.path("dir/b"), c.path("dir/a")]
    assert [f["path"] for f in s["top_dirty"]] == [c.path("dir/a")]
    text = c.ctl("status", c.path("dir"), "-r").stdout
    assert "2 files" in text and "top files by dirty bytes" in text and c.path("dir/a") in text, text
    text = c.ctl("status", c.path("dir/a")).stdout
    assert "PATH" in text and c.path("dir/a") in text, text


def test_flush_one_file_leaves_others_dirty(cache):
    c = cache
    a, b = os.urandom(2 * MiB), os.urandom(2 * MiB)
    mount_write(c, "a", a)
    mount_write(c, "b", b)
    assert one(c, "a")["dirty_bytes"] == len(a) and one(c, "b")["dirty_bytes"] == len(b)
    r = c.ctl("flush", c.mnt, c.path("a"))
    assert "flush: done, 1 file" in r.stdout, r.stdout
    fa, fb = one(c, "a"), one(c, "b")
    assert fa["dirty_bytes"] == 0 and fa["backing_up_to_date"], fa
    assert fb["dirty_bytes"] == len(b) and not fb["backing_up_to_date"], fb
    with open(os.path.join(c.backing, "a"), "rb") as f:
        assert f.read() == a
    assert os.path.getsize(os.path.join(c.backing, "b")) < len(b)   # still only in the cache
    c.flush()                                                        # plain flush: everything
    assert one(c, "b")["dirty_bytes"] == 0


def test_bad_paths_are_clear_errors(cache, tmp_path):
    c = cache
    outside = tmp_path / "outside"
    outside.write_bytes(b"x")
    r = c.ctl("status", str(outside), check=False)
    assert r.returncode != 0 and "is not on an nvcachefs mount" in r.stderr, r.stderr
    r = c.ctl("warm", c.path("missing"), check=False)
    assert r.returncode != 0 and "missing: No such file or directory" in r.stderr, r.stderr
    os.makedirs(c.path("d"))
    r = c.ctl("status", c.path("d"), check=False)
    assert r.returncode != 0 and "is a directory (use -r)" in r.stderr, r.stderr
    r = c.ctl("flush", "/tmp", c.path("d"), "-r", check=False)
    assert r.returncode != 0 and "is not the mount of the PATHs" in r.stderr, r.stderr


def test_warm_stops_when_the_client_goes(cache):
    """Ctrl-C on nvcachectl closes its socket: the daemon stops warming at the next chunk."""
    c = cache
    size = 200 * MiB
    with open(os.path.join(c.backing, "w"), "wb") as f:
        for _ in range(size // (8 * MiB)):
            f.write(os.urandom(8 * MiB))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(c.ctl_socket())
        s.sendall(b"warm 5 1 0\nw\0")
    # the request stands alone, nobody reads the answer: the warm stops (waited for 10 s at most)
    for _ in range(200):
        if "warm stopped: the client went away" in c.log_text():
            break
        time.sleep(0.05)
    assert "warm stopped: the client went away" in c.log_text(), c.log_text()[-2000:]
    assert one(c, "w")["cached_bytes"] < size
