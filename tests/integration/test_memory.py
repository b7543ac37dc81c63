"""The daemon's own DRAM (issue 11): the buffers a burst of large requests made are given back once the daemon
is idle (fs/loop.c, Idle), and what was written reads back byte for byte."""
import mmap
import os
import re
import threading
import time

MiB = 1 << 20


def rss_anon(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^RssAnon:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


def block(i, j):
    """1 MiB that says which thread and block it is."""
    return (b"%04d:%06d:" % (i, j)) * (MiB // 12) + b"\0" * (MiB % 12)


def burst(mnt, nthreads=8, nblocks=16):
    """nthreads threads each write then read back nblocks 1 MiB O_DIRECT blocks of their own file."""
    errors = []

    def run(i):
        buf = mmap.mmap(-1, MiB)
        path = os.path.join(mnt, f"big{i}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
            try:
                for j in range(nblocks):
                    buf[:] = block(i, j)
                    assert os.pwritev(fd, [buf], j * MiB) == MiB
                for j in range(nblocks):
                    buf[:] = b"\xff" * MiB
                    assert os.preadv(fd, [buf], j * MiB) == MiB
                    assert buf[:] == block(i, j), f"{path} block {j} reads back wrong"
            finally:
                os.close(fd)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_idle_daemon_gives_buffers_back(cache):
    pid = cache.proc.pid
    os.stat(cache.mnt)
    time.sleep(1.5)
    at_mount = rss_anon(pid)
    burst(cache.mnt)
    busy = rss_anon(pid)
    # idle for a second, each worker and pool thread frees its buffers and the allocator trims; what stays is
    # the allocator's arenas' tops (malloc_trim leaves them to the trim threshold) and the slots touched
    bound = at_mount + (busy - at_mount) // 2
    deadline, now = time.time() + 10, rss_anon(pid)
    while time.time() < deadline and now > bound:
        time.sleep(0.5)
        now = rss_anon(pid)
    print(f"anon: at mount {at_mount / MiB:.1f} MiB, after the burst {busy / MiB:.1f}, idle {now / MiB:.1f}")
    assert busy > at_mount + 4 * MiB, "the burst made no buffers: the test tests nothing"
    assert now <= bound, (
        f"idle daemon keeps {(now - at_mount) / MiB:.1f} MiB of the {(busy - at_mount) / MiB:.1f} MiB "
        f"the burst added")
    # and the data is still all there once the buffers are made again
    burst(cache.mnt, nthreads=2, nblocks=4)
