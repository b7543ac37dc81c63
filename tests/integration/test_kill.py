"""kill -9 of the daemon mid-workload: after a remount every acknowledged write is there."""
import os
import random
import threading
import time

import pytest

from dfs import CTL_TIMEOUT, drop_caches

MiB = 1 << 20


class Model:
    """What the files must hold: acknowledged bytes exactly; bytes of a write that failed may be old or new."""

    def __init__(self):
        self.data = {}
        self.maybe = {}  # name -> list of (off, new bytes)
        self.lock = threading.Lock()
        self.acked = 0

    def apply(self, name, off, data):
        with self.lock:
            self.acked += bool(data)
            b = self.data.setdefault(name, bytearray())
            if len(b) < off + len(data):
                b.extend(b"\0" * (off + len(data) - len(b)))
            b[off:off + len(data)] = data

    def uncertain(self, name, off, data):
        with self.lock:
            self.maybe.setdefault(name, []).append((off, data))

    def check(self, name, got):
        exp = self.data.get(name, bytearray())
        alts = self.maybe.get(name, [])
        limit = max([len(exp)] + [o + len(d) for o, d in alts])
        assert len(exp) <= len(got) <= limit, f"{name}: size {len(got)}, expected {len(exp)}..{limit}"
        if got[:len(exp)] == exp:
            return
        for i in range(len(exp)):
            if got[i] != exp[i] and not any(o <= i < o + len(d) and d[i - o] == got[i] for o, d in alts):
                raise AssertionError(f"{name}: byte {i} is {got[i]}, acknowledged {exp[i]}")


def writer(mnt, model, wid, stop, seed):
    rng = random.Random(seed)
    names = [f"k{wid}-{i}" for i in range(3)]
    fds = {}
    try:
        for n in names:
            fds[n] = os.open(os.path.join(mnt, n), os.O_RDWR | os.O_CREAT, 0o644)
            model.apply(n, 0, b"")
        while not stop.is_set():
            n = rng.choice(names)
            off = rng.randrange(0, 6 * MiB)
            data = rng.randbytes(rng.choice([1, 100, 4096, 65536, rng.randrange(1, 200000)]))
            try:
                done = os.pwrite(fds[n], data, off)
            except OSError:
                model.uncertain(n, off, data)
                return
            # the kernel splits large writes: a kill between the pieces
            # acknowledges only the first ones (a short write)
            model.apply(n, off, data[:done])
            if done < len(data):
                model.uncertain(n, off + done, data[done:])
                return
    finally:
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass


# over a local backing directory, and over GlusterFS and MooseFS (dfs.py) with the kernel's caches dropped
# before each mount, so that the daemon finds its files on a store that has forgotten their handles
@pytest.mark.parametrize("copies,store", [("1", "local"), ("2", "local"), ("1", "gluster"), ("1", "moosefs"),
                                         ("1", "ceph")])
def test_kill9_rounds(make_cache, request, copies, store):
    extra = {"destage.idle_after": "50ms", "destage.high_watermark": "30", "destage.low_watermark": "10",
             "cache.dirty_copies": copies}
    if store != "local":
        extra["backing.path"] = request.getfixturevalue(store + "_store").subdir()[0]
    c = make_cache(dev_size=64 * MiB, extra=extra)
    if store != "local":
        c.ctl_timeout = CTL_TIMEOUT
    c.format()
    rounds = int(os.environ.get("NVC_KILL_ROUNDS", "6"))
    model = Model()
    rng = random.Random(7)
    for r in range(rounds):
        if store != "local":
            drop_caches()
        c.mount()
        for n in list(model.data):
            with open(c.path(n), "rb") as f:
                model.check(n, f.read())
        # what was acknowledged and checked becomes the new truth
        for n in list(model.data):
            with open(c.path(n), "rb") as f:
                model.data[n] = bytearray(f.read())
        model.maybe.clear()
        stop = threading.Event()
        ts = [threading.Thread(target=writer, args=(c.mnt, model, w, stop, r * 100 + w)) for w in range(4)]
        for t in ts:
            t.start()
        time.sleep(rng.uniform(0.2, 1.5))
        c.kill9()
        stop.set()
        for t in ts:
            t.join()
    c.mount()
    for n in model.data:
        with open(c.path(n), "rb") as f:
            model.check(n, f.read())
    # and the backing store gets exactly that after a flush
    for n in model.data:
        with open(c.path(n), "rb") as f:
            model.data[n] = bytearray(f.read())
    c.flush()
    for n in model.data:
        with open(os.path.join(c.backing, n), "rb") as f:
            assert f.read() == model.data[n]
    assert c.unmount() == 0
    print(f"\nkill -9 rounds: {rounds}, acknowledged writes checked: {model.acked}, lost: 0")


def test_keep_on_unmount_then_destage_after_remount(make_cache):
    c = make_cache(extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    d = os.urandom(3 * MiB + 5)
    with open(c.path("kept"), "wb") as f:
        f.write(d)
    assert c.unmount() == 0
    assert os.path.getsize(os.path.join(c.backing, "kept")) == 0   # still only in the cache
    c.mount()
    with open(c.path("kept"), "rb") as f:
        assert f.read() == d
    assert c.stats()["dirty_bytes"] > 0
    c.flush()
    with open(os.path.join(c.backing, "kept"), "rb") as f:
        assert f.read() == d
    c.unmount()


def test_kill9_right_after_small_creates(make_cache):
    """Small files created, written and closed, then kill -9 at once: after the remount every file is there
    with every byte, though the backing store never got the data. A file's record is persisted by its first
    write and again only when it changes: the release of a file just written finds the mirrors holding its
    record already (cache/files/file.c, file_record_held), and a record that did change (a second write that grows
    the file, a truncate) must still reach the mirrors before the write is acknowledged."""
    c = make_cache(extra={"destage.idle_after": "0", "destage.max_dirty_age": "0",
                          "destage.high_watermark": "100", "destage.low_watermark": "99"})
    c.format()
    c.mount()
    rng = random.Random(11)
    d = c.path("md")
    os.mkdir(d)
    want = {}
    for i in range(300):
        n = f"md/f{i:04d}"
        want[n] = rng.randbytes(rng.choice((1, 512, 4096, 4097, 12288)))
        fd = os.open(c.path(n), os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, want[n])
        os.close(fd)
    for i in range(0, 300, 3):
        # opened again: grows, or shrinks, each a change its record must carry
        n = f"md/f{i:04d}"
        if i % 2:
            with open(c.path(n), "r+b") as f:
                f.truncate(len(want[n]) // 2)
            want[n] = want[n][:len(want[n]) // 2]
        else:
            more = rng.randbytes(5000)
            with open(c.path(n), "ab") as f:
                f.write(more)
            want[n] += more
    c.kill9()
    # the data of the files written once never left the cache: only its records and map find it again
    once = [n for n in want if int(n[-4:]) % 3]
    assert all(os.path.getsize(os.path.join(c.backing, n)) == 0 for n in once)
    c.mount()
    for n, data in want.items():
        with open(c.path(n), "rb") as f:
            got = f.read()
        assert got == data, f"{n}: {len(got)} bytes after the remount, {len(data)} written"
    assert c.unmount() == 0
