"""Sub-page O_DIRECT writes and reads racing in the same cache blocks through the real mount (the Iometer File
Server's shape: 512 B to 64 KiB at 512-byte offsets), compared byte for byte with a model, then after kill -9.

The daemon writes a cached page's sectors without reading the page first, and a request that finds its block
locked by one in flight waits on its worker for it (fs/aio.c "Busy"); both must keep every byte of the page.
Each thread owns the 512-byte sectors whose index modulo the thread count is its own, so all threads write
into the same blocks at once while the model stays exact.
"""
import mmap
import os
import random
import threading

KiB = 1024
SECTOR = 512
SIZE = 512 * KiB          # 8 cache blocks of 64 KiB
THREADS = 6
OPS = 400


def aligned(data):
    """A page-aligned copy of data, for O_DIRECT."""
    m = mmap.mmap(-1, max(len(data), mmap.PAGESIZE))
    m[:len(data)] = data
    return m


def read_all(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, SIZE)
    try:
        assert os.preadv(fd, [buf], 0) == SIZE
        return bytes(buf)
    finally:
        os.close(fd)
        buf.close()


def test_subpage_writes_race_in_one_block(cache):
    p = cache.path("f")
    model = bytearray(os.urandom(SIZE))
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
    buf = aligned(bytes(model))
    assert os.pwritev(fd, [buf], 0) == SIZE      # cached and dirty, as the benchmark prepares it
    os.close(fd)
    assert read_all(p) == bytes(model)
    errors = []

    def writer(t):
        rnd = random.Random(t)
        wfd = os.open(p, os.O_RDWR | os.O_DIRECT)
        try:
            for _ in range(OPS):
                # a run of this thread's sectors: every THREADS-th one, 1 to 8 of them, each written alone or
                # (1 in 4) read back to check that nothing else changed it
                first = rnd.randrange(SIZE // SECTOR // THREADS) * THREADS + t
                for k in range(rnd.randint(1, 8)):
                    s = first + k * THREADS
                    if s >= SIZE // SECTOR:
                        break
                    off = s * SECTOR
                    if rnd.random() < 0.25:
                        got = mmap.mmap(-1, mmap.PAGESIZE)
                        assert os.preadv(wfd, [memoryview(got)[:SECTOR]], off) == SECTOR
                        if got[:SECTOR] != model[off:off + SECTOR]:
                            errors.append(f"thread {t}: sector {s} read back wrong")
                        got.close()
                        continue
                    data = os.urandom(SECTOR)
                    w = aligned(data)
                    assert os.pwritev(wfd, [memoryview(w)[:SECTOR]], off) == SECTOR
                    w.close()
                    model[off:off + SECTOR] = data
        except Exception as e:       # reported by the main thread
            errors.append(f"thread {t}: {e!r}")
        finally:
            os.close(wfd)

    def reader():
        rnd = random.Random(99)
        rfd = os.open(p, os.O_RDONLY | os.O_DIRECT)
        got = mmap.mmap(-1, 64 * KiB)
        try:
            while not done.is_set():
                n = rnd.choice((SECTOR, 4 * KiB, 64 * KiB))
                off = rnd.randrange((SIZE - n) // SECTOR) * SECTOR
                assert os.preadv(rfd, [memoryview(got)[:n]], off) == n
        except Exception as e:
            errors.append(f"reader: {e!r}")
        finally:
            os.close(rfd)
            got.close()

    done = threading.Event()
    rd = [threading.Thread(target=reader) for _ in range(2)]
    ws = [threading.Thread(target=writer, args=(t,)) for t in range(THREADS)]
    for x in rd + ws:
        x.start()
    for x in ws:
        x.join()
    done.set()
    for x in rd:
        x.join()
    assert not errors, errors[:5]
    assert read_all(p) == bytes(model)
    # every acknowledged write survives kill -9
    cache.kill9()
    cache.mount()
    assert read_all(p) == bytes(model)
    cache.flush()
    with open(os.path.join(cache.backing, "f"), "rb") as f:
        assert f.read() == bytes(model)
