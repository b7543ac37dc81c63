"""A backing store that stops answering hangs only the requests that need it (issue 25: c->lock is never held
across backing I/O)."""
import os
import subprocess
import threading

from conftest import CTL, MiB


def test_stalled_store_hangs_only_its_requests(make_cache, tmp_path):
    gate = tmp_path / "stall"
    c = make_cache()
    c.format()
    # debug builds: the daemon's opens of backing files by handle wait while the gate file exists
    c.mount(wrapper=("env", f"NVC_TEST_STALL=open:{gate}"))
    a, b = os.urandom(MiB), os.urandom(MiB)
    for name, data in (("a", a), ("b", b)):
        with open(c.path(name), "wb") as f:
            f.write(data)
    c.flush()
    with open(c.path("b"), "rb") as f:
        assert f.read() == b
    # "a" is idle (closed, cached, no descriptor): its unlink opens it by handle, and the store stalls there
    gate.touch()
    t = threading.Thread(target=os.unlink, args=(c.path("a"),))
    try:
        t.start()
        t.join(0.5)
        assert t.is_alive(), "the stall hook did not stall the unlink"
        # other requests: the statistics, and an open and a read of another cached file
        for cmd in ([CTL, "stats", c.mnt], ["dd", "if=" + c.path("b"), "iflag=direct", "bs=1M", "status=none"]):
            try:
                r = subprocess.run(cmd, capture_output=True, timeout=10)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{cmd[0]} hung behind the stalled unlink\n" + c.log_text()[-2000:])
            assert r.returncode == 0, r.stderr
        assert r.stdout == b
    finally:
        gate.unlink()
        t.join(20)
    assert not t.is_alive()
    assert not os.path.exists(c.path("a")) and not os.path.exists(os.path.join(c.backing, "a"))
    assert c.unmount() == 0
