"""nvcachectl detach and attach: the mount runs with no cache (every request to the backing store, the devices
closed so that they can be reused) while a workload runs, stays so across a remount and a kill -9, and takes the
devices back at attach, refusing ones that are not this cache's; data compared byte for byte throughout."""
import os

from conftest import MiB
from rwload import Workload, excl_free


def test_detach_and_attach_under_load(make_cache):
    c = make_cache(extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    w = Workload(c)
    w.start()
    w.wait_ops(200)
    assert c.stats()["dirty_bytes"] > 0
    r = c.ctl("detach", c.mnt)
    assert "detached" in r.stdout
    n_detach = w.ops
    w.wait_ops(n_detach + 300)                      # the workload goes on, through the store
    st = c.stats()
    assert st["detached"] == 1 and st["used_slots"] == 0 and st["dirty_bytes"] == 0, st
    assert [d["state"] for d in st["devices"]] == ["detached", "detached"]
    assert all(excl_free(lo) for lo in c.loops)     # the devices are let go
    w.finish()
    w.check(c.backing)                              # every byte is in the store itself
    w.check(c.mnt)

    assert c.unmount() == 0                         # a remount stays detached, opens no device
    c.mount()
    assert c.stats()["detached"] == 1
    assert all(excl_free(lo) for lo in c.loops)
    w.check(c.mnt)

    r = c.ctl("attach", c.mnt)
    assert "attached" in r.stdout
    assert not any(excl_free(lo) for lo in c.loops)
    w = Workload(c)
    w.start()
    w.wait_ops(300)
    w.finish()
    st = c.stats()
    assert st["detached"] == 0 and st["dirty_bytes"] > 0, st   # caching again
    assert [d["state"] for d in st["devices"]] == ["ok", "ok"]
    w.check(c.mnt)
    c.kill9()                                       # the attached cache's dirty data survives
    c.mount()
    w.check(c.mnt)
    c.flush()
    w.check(c.backing)
    assert c.unmount() == 0
    log = c.log_text()
    assert "detached: no cache; every request goes to the backing store" in log
    assert "attached: caching again on 2 devices" in log


def test_detached_survives_kill9_and_attach_checks_devices(make_cache):
    c = make_cache()
    c.format()
    c.mount()
    blob = os.urandom(3 * MiB)
    with open(c.path("x"), "wb") as f:
        f.write(blob)
    c.ctl("detach", c.mnt)
    r = c.ctl("detach", c.mnt, check=False)
    assert r.returncode != 0 and "already detached" in r.stderr
    c.kill9()
    c.mount()
    assert c.stats()["detached"] == 1
    with open(c.path("x"), "rb") as f:
        assert f.read() == blob
    # while detached the devices are free: one is wiped (reused elsewhere, say)
    with open(c.loops[1], "r+b") as f:
        f.write(b"\0" * MiB)
    r = c.ctl("attach", c.mnt, check=False)
    assert r.returncode != 0 and f"{c.loops[1]} has no nvcachefs superblock" in r.stderr, r.stderr
    st = c.stats()
    assert st["detached"] == 1 and all(excl_free(lo) for lo in c.loops)   # still detached, nothing held
    more = os.urandom(MiB)
    with open(c.path("y"), "wb") as f:
        f.write(more)
    with open(os.path.join(c.backing, "y"), "rb") as f:
        assert f.read() == more
    r = c.ctl("attach", c.mnt, check=False)
    assert r.returncode != 0
    assert c.unmount() == 0
    # the way back for a wiped device: format the cache (it holds nothing), mount
    c.format("--force")
    c.mount()
    assert c.stats()["detached"] == 0
    with open(c.path("x"), "rb") as f:
        assert f.read() == blob
    assert c.unmount() == 0


def test_detach_killed_midway_resumes(make_cache):
    """A kill -9 while a detach destages: the next mount has every byte, finishes the detach on its own (the
    devices let go, the state detached), and attach takes them back."""
    import subprocess
    import time
    from conftest import CTL
    c = make_cache(extra={"destage.on_unmount": "keep", "destage.max_rate": "16M"})
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(8 * MiB) for i in range(4)}   # 32 MiB dirty: 2 s of destage at 16M/s
    for n, b in blobs.items():
        with open(c.path(n), "wb") as f:
            f.write(b)
    p = subprocess.Popen([CTL, "detach", c.mnt], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.7)
    assert c.stats()["dirty_bytes"] > 0                # still destaging
    c.kill9()
    p.wait(timeout=30)
    assert p.returncode != 0
    c.mount()
    deadline = time.time() + 60
    while "detached: no cache" not in c.log_text() and time.time() < deadline:
        time.sleep(0.05)
    st = c.stats()
    assert st["detached"] == 1 and st["used_slots"] == 0, st
    assert "detach: resuming the detach cut short by the last stop" in c.log_text()
    assert all(excl_free(lo) for lo in c.loops)
    for n, b in blobs.items():
        with open(os.path.join(c.backing, n), "rb") as f:
            assert f.read() == b, n
        with open(c.path(n), "rb") as f:
            assert f.read() == b, n
    r = c.ctl("attach", c.mnt)
    assert "attached" in r.stdout
    assert c.unmount() == 0
    c.mount()
    assert c.stats()["detached"] == 0
    assert "resuming" not in c.log_text().split("attached")[-1]
    assert c.unmount() == 0
