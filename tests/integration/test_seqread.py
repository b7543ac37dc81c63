"""Sequential reads of uncached data (cache.sequential_cutoff, cache/admit.c): what they return while another
descriptor writes into the file, byte for byte; the bypass counted; revalidation at open still drops stale data."""
import mmap
import os
import random
import struct
import threading
import time

import pytest

MiB = 1 << 20
PAGE = 4096


def page(p, v):
    """Page p as version v wrote it: (p, v) repeated, so every page says what it is."""
    return struct.pack("<QQ", p, v) * (PAGE // 16)


def make_file(path, npages, v=0):
    with open(path, "wb") as f:
        for p0 in range(0, npages, 256):
            f.write(b"".join(page(p, v) for p in range(p0, min(p0 + 256, npages))))


def check_pages(buf, first, floor, allowed, where):
    """Every page of buf is whole, is the page it should be, and a version written to it no older than floor."""
    for i in range(len(buf) // PAGE):
        p = first + i
        d = buf[i * PAGE:(i + 1) * PAGE]
        q, v = struct.unpack_from("<QQ", d)
        assert q == p, f"{where}: page {p} holds page {q}'s data"
        assert d == page(q, v), f"{where}: page {p} is torn or garbage"
        assert v in allowed[p], f"{where}: page {p} holds version {v}, never written"
        assert v >= floor[p], f"{where}: page {p} holds version {v}, older than {floor[p]} written before the read"


@pytest.mark.parametrize("cutoff", ["4M", "0"])
def test_sequential_read_while_another_fd_writes(make_cache, cutoff):
    c = make_cache(extra={"cache.sequential_cutoff": cutoff})
    c.format()
    c.mount()
    npages = 40 * MiB // PAGE
    make_file(os.path.join(c.backing, "big"), npages)  # behind the cache: nothing of it cached
    allowed = [{0} for _ in range(npages)]
    committed = [0] * npages
    lock = threading.Lock()
    stop = threading.Event()
    errors = []

    def writer():
        try:
            fd = os.open(c.path("big"), os.O_RDWR | os.O_DIRECT)
            buf = mmap.mmap(-1, 16 * PAGE)
            rnd = random.Random(11)
            v = 0
            while not stop.is_set():
                v += 1
                n = rnd.randint(1, 16)
                p0 = rnd.randrange(npages - n)
                with lock:
                    for p in range(p0, p0 + n):
                        allowed[p].add(v)
                buf[:n * PAGE] = b"".join(page(p, v) for p in range(p0, p0 + n))
                assert os.pwritev(fd, [memoryview(buf)[:n * PAGE]], p0 * PAGE) == n * PAGE
                with lock:
                    for p in range(p0, p0 + n):
                        committed[p] = max(committed[p], v)
                time.sleep(0.0005)
            os.close(fd)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    try:
        fd = os.open(c.path("big"), os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, MiB)
        for rnd in range(3):
            for off in range(0, npages * PAGE, MiB):
                with lock:
                    floor = list(committed[off // PAGE:off // PAGE + MiB // PAGE])
                assert os.preadv(fd, [buf], off) == MiB
                with lock:
                    ok = [set(a) for a in allowed[off // PAGE:off // PAGE + MiB // PAGE]]
                check_pages(bytes(buf), off // PAGE, {off // PAGE + i: f for i, f in enumerate(floor)},
                            {off // PAGE + i: a for i, a in enumerate(ok)}, f"pass {rnd} at {off}")
        os.close(fd)
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    # quiet now: every page is its latest version, through O_DIRECT and through the page cache
    latest = [max(a) for a in allowed]
    for flags in (os.O_DIRECT, 0):
        fd = os.open(c.path("big"), os.O_RDONLY | flags)
        buf = mmap.mmap(-1, MiB)
        for off in range(0, npages * PAGE, MiB):
            assert os.preadv(fd, [buf], off) == MiB
            for i in range(MiB // PAGE):
                p = off // PAGE + i
                assert buf[i * PAGE:(i + 1) * PAGE] == page(p, latest[p]), f"page {p} after the writes"
        os.close(fd)
    st = c.stats()
    if cutoff == "0":
        assert st["read_bypass_bytes"] == 0
    else:
        assert st["read_bypass_bytes"] > 20 * MiB
        assert st["fill_bytes"] < st["read_miss_bytes"]
    assert st["dirty_bytes"] > 0  # the writes were served from the cache, not destaged
    c.flush()
    with open(os.path.join(c.backing, "big"), "rb") as f:
        for p in range(npages):
            assert f.read(PAGE) == page(p, latest[p]), f"backing page {p} after flush"
    assert c.unmount() == 0


def test_revalidation_drops_the_cached_head_of_a_stream(cache):
    """The head of a stream (below the cutoff) is kept; a change behind the cache still shows at the next open."""
    npages = 16 * MiB // PAGE
    path = os.path.join(cache.backing, "f")
    make_file(path, npages, 0)
    with open(cache.path("f"), "rb") as f:
        for p0 in range(0, npages, 256):
            assert f.read(MiB) == b"".join(page(p, 0) for p in range(p0, p0 + 256))
    st = cache.stats()
    assert st["fill_bytes"] == 4 * MiB and st["read_bypass_bytes"] == 12 * MiB
    time.sleep(0.01)
    make_file(path, npages, 1)  # another node rewrites it
    with open(cache.path("f"), "rb") as f:
        for p0 in range(0, npages, 256):
            assert f.read(MiB) == b"".join(page(p, 1) for p in range(p0, p0 + 256)), f"at page {p0}"
    assert cache.stats()["revalidate_drops"] >= 1
