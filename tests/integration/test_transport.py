"""fuse.transport (fs/loop.c, fs/uring.c): FUSE over io_uring where the kernel offers it, /dev/fuse otherwise,
and which one serves is logged; requests through the ring are answered byte for byte as through /dev/fuse, from
the workers and from the pool threads alike."""
import contextlib
import os
import re
import threading

import pytest

from conftest import ENABLE_URING, MiB

pytestmark = pytest.mark.skipif(not os.path.exists(ENABLE_URING), reason="this kernel has no FUSE over io_uring")


@contextlib.contextmanager
def enable_uring(on):
    with open(ENABLE_URING) as f:
        was = f.read().strip()
    with open(ENABLE_URING, "w") as f:
        f.write("Y" if on else "N")
    try:
        yield
    finally:
        with open(ENABLE_URING, "w") as f:
            f.write(was)


def granted(c):
    lines = [ln for ln in c.log_text().splitlines() if "fuse requests:" in ln]
    assert lines, c.log_text()[-2000:]
    return lines[-1].split("granted", 1)[1].split()


def test_uring_serves_reads_writes_and_metadata(make_cache):
    """With the kernel offering it, fuse.transport = uring serves every request through the rings: buffered and
    O_DIRECT writes of many sizes from several threads at once (replies from io_uring completions on the workers),
    creates, renames and stats meanwhile (run by the pool while the workers hold requests in flight: their
    replies are committed by the owning worker), all read back byte for byte, through the mount and on the store
    after a flush."""
    c = make_cache(extra={"fuse.transport": "uring"})
    c.format()
    with enable_uring(True):
        c.mount()
        d = c.path("d")
        os.mkdir(d)
        want, errors = {}, []

        def writer(i):
            try:
                p = os.path.join(d, f"w{i}")
                data = bytearray(os.urandom(3 * MiB + 12345))
                fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
                off = 0
                for n in (1, 4095, 4096, 65536, MiB, 200000):  # sizes across the payload's pages
                    os.pwrite(fd, data[off:off + n], off)
                    off += n
                os.pwrite(fd, data[off:], off)
                os.close(fd)
                want[p] = bytes(data)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

        def meta():
            try:
                for k in range(200):
                    p = os.path.join(d, f"m{k}")
                    with open(p, "wb") as f:
                        f.write(b"%d" % k)
                    os.rename(p, p + ".r")
                    os.stat(p + ".r")
                    want[p + ".r"] = b"%d" % k
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        ts = [threading.Thread(target=writer, args=(i,)) for i in range(4)] + [threading.Thread(target=meta)]
        for t in ts:
            t.start()
        # O_DIRECT at queue depth > 1 meanwhile: the workers' asynchronous path
        buf = bytearray(os.urandom(8 * MiB))
        dp = os.path.join(d, "direct")
        fd = os.open(dp, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
        import mmap
        m = mmap.mmap(-1, 8 * MiB)
        m.write(bytes(buf))
        assert os.pwritev(fd, [m], 0) == 8 * MiB
        m.seek(0)
        m.write(b"\0" * 8 * MiB)
        assert os.preadv(fd, [m], 0) == 8 * MiB
        assert m[:] == bytes(buf), "an O_DIRECT read through the ring is not what was written"
        os.close(fd)
        want[dp] = bytes(buf)
        for t in ts:
            t.join()
        assert not errors, errors
        for p, data in want.items():
            with open(p, "rb") as f:
                assert f.read() == data, p
        c.flush()
        for p, data in want.items():
            with open(os.path.join(c.backing, "d", os.path.basename(p)), "rb") as f:
                assert f.read() == data, p
        c.unmount()
    assert "FUSE transport: io_uring" in c.log_text(), c.log_text()[-2000:]
    assert "OVER_IO_URING" in granted(c)


def test_uring_asked_for_but_not_offered_stops_the_daemon(make_cache):
    """fuse.transport = uring on a kernel not offering it (enable_uring off) is an error the log explains, not
    a silent /dev/fuse."""
    c = make_cache(extra={"fuse.transport": "uring"})
    c.format()
    with enable_uring(False):
        c.mount(check=False)
        if c.proc.poll() is None:
            try:
                os.listdir(c.mnt)  # the INIT reply is out: the daemon sees it was not offered
            except OSError:
                pass
        c.proc.wait(timeout=30)
    assert c.proc.returncode != 0
    assert re.search(r"fuse\.transport = uring: the kernel does not offer", c.log_text()), c.log_text()[-2000:]


def test_auto_says_which_transport_serves(make_cache):
    """fuse.transport = auto: /dev/fuse where the kernel does not offer io_uring, io_uring where it does; the log
    says which."""
    for on, said in ((False, "FUSE transport: /dev/fuse (the kernel does not offer io_uring)"),
                     (True, "FUSE transport: io_uring")):
        c = make_cache(extra={"fuse.transport": "auto"})
        c.format()
        with enable_uring(on):
            c.mount()
            with open(c.path("f"), "wb") as f:
                f.write(b"x" * 5000)
            with open(c.path("f"), "rb") as f:
                assert f.read() == b"x" * 5000
            c.unmount()
        assert said in c.log_text(), c.log_text()[-2000:]
        assert ("OVER_IO_URING" in granted(c)) == on
