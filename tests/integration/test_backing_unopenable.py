"""A backing file that cannot be opened by its handle at mount (EPERM here: the daemon runs without
CAP_DAC_READ_SEARCH) keeps its dirty data: an open through the mount serves the cached bytes, not the
stale backing file's, and flush destages it; unopened, flush fails with an error instead of hanging
(issue 9, defect 3)."""
import os
import subprocess
import time

from conftest import CTL, MiB, sh

# root without the capability that open_by_handle_at needs
NO_DAC_READ_SEARCH = ("setpriv", "--inh-caps=-dac_read_search", "--bounding-set=-dac_read_search", "--")


def dirty_file(make_cache):
    c = make_cache(extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    old = os.urandom(MiB)
    with open(os.path.join(c.backing, "a"), "wb") as f:
        f.write(old)                          # the backing file's bytes
    new = os.urandom(MiB + 4096)
    with open(c.path("a"), "r+b") as f:
        f.write(new)                          # acknowledged, dirty in the cache only
    assert c.unmount() == 0
    with open(os.path.join(c.backing, "a"), "rb") as f:
        assert f.read() == old
    return c, new


def test_open_after_mount_serves_the_dirty_data_and_flush_destages_it(make_cache):
    c, new = dirty_file(make_cache)
    c.mount(wrapper=NO_DAC_READ_SEARCH)
    assert "cannot open backing file" in c.log_text()
    with open(c.path("a"), "rb") as f:
        assert f.read() == new
        assert os.fstat(f.fileno()).st_size == len(new)
        # open, the file has a descriptor (an idle one would need its handle again)
        r = sh(CTL, "flush", c.mnt, check=False, timeout=60)
        assert r.returncode == 0, r.stderr
    with open(os.path.join(c.backing, "a"), "rb") as f:
        assert f.read() == new
    assert c.unmount() == 0


def test_flush_of_an_unopenable_file_fails_instead_of_hanging(make_cache):
    c, new = dirty_file(make_cache)
    c.mount(wrapper=NO_DAC_READ_SEARCH)
    t0 = time.time()
    try:
        r = sh(CTL, "flush", c.mnt, check=False, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("flush still waiting after 60 s")
    assert r.returncode != 0
    assert r.stderr.strip()
    assert time.time() - t0 < 60
    assert c.unmount(timeout=60) is not None      # exits, keeping the data dirty
    # mounted again with the capability, the data is there and destages
    c.mount()
    with open(c.path("a"), "rb") as f:
        assert f.read() == new
    c.flush()
    with open(os.path.join(c.backing, "a"), "rb") as f:
        assert f.read() == new
    assert c.unmount() == 0
