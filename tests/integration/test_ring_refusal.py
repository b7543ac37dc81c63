"""Issue 25, finding 16: a worker's io_uring that refuses submissions (the kernel short of memory, a full
queue) is not the cache device failing. Every other submission of every worker's ring is refused
(NVC_TEST_RING_FAULTS, devices/aring.c): the devices stay "ok", writes and fsync succeed, the bytes read back
are the bytes written, and the daemon still stops on SIGTERM (its workers' stop polls are armed again after a
refused submission)."""
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import MiB, mounted


def workload(c, blobs):
    for i in range(4):
        name = f"f{i}"
        blobs[name] = bytearray(os.urandom(2 * MiB))
        with open(c.path(name), "wb") as f:
            f.write(blobs[name])
    # rewrites of cached blocks and reads of cached pages: the workers' asynchronous path
    for rnd in range(3):
        for name, b in blobs.items():
            fd = os.open(c.path(name), os.O_RDWR)
            try:
                for k in range(16):
                    off = ((k * 7 + rnd * 3) % 512) * 4096
                    piece = os.urandom(4096)
                    assert os.pwrite(fd, piece, off) == 4096
                    b[off:off + 4096] = piece
                    assert os.pread(fd, 4096, off) == piece
                os.fsync(fd)
            finally:
                os.close(fd)


@pytest.mark.parametrize("first", [0, 1])
def test_ring_refusals_are_not_device_errors(make_cache, first):
    c = make_cache()
    c.format()
    c.mount(wrapper=("env", f"NVC_TEST_RING_FAULTS={-12},2,{first}"))
    blobs, failed = {}, []

    def run():
        try:
            workload(c, blobs)
        except BaseException as e:  # noqa: B902 (reported below)
            failed.append(e)

    # a worker whose polls were lost serves nothing: the workload would wait for ever
    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    if t.is_alive():
        c.kill9()
        t.join()
        raise AssertionError("the mount stopped answering: " + c.log_text()[-2000:])
    if failed:
        raise failed[0]
    try:
        st = c.stats()
        assert [d["state"] for d in st["devices"]] == ["ok", "ok"], (st["devices"], c.log_text()[-2000:])
        assert st["ring_refusals"] > 0, "no device request met a refused submission: the test cannot tell"
        for name, b in blobs.items():
            with open(c.path(name), "rb") as f:
                assert f.read() == bytes(b), name
    finally:
        proc, c.proc = c.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError("the daemon did not stop on SIGTERM: " + c.log_text()[-2000:])
    assert proc.returncode == 0, c.log_text()[-2000:]
    deadline = time.time() + 5
    while mounted(c.mnt) and time.time() < deadline:
        time.sleep(0.05)
    assert not mounted(c.mnt)
