"""A backing file that cannot be opened at mount (here: immutable, so opening it for writing gives EPERM)
keeps its dirty data: an open through the mount serves the cached bytes, not the stale backing file's, and
flush destages it once it can be written; until then flush fails with an error instead of hanging (issue 9,
defect 3).  A daemon that may not open by file handle (no CAP_DAC_READ_SEARCH) finds files by path
(issue 10)."""
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


def immutable(c, on):
    sh("chattr", "+i" if on else "-i", os.path.join(c.backing, "a"))


def test_open_after_mount_serves_the_dirty_data_and_flush_destages_it(make_cache):
    c, new = dirty_file(make_cache)
    immutable(c, True)
    try:
        c.mount()
        assert "cannot open backing file" in c.log_text()
        with open(c.path("a"), "rb") as f:
            assert f.read() == new
            assert os.fstat(f.fileno()).st_size == len(new)
    finally:
        immutable(c, False)
    r = sh(CTL, "flush", c.mnt, check=False, timeout=60)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(c.backing, "a"), "rb") as f:
        assert f.read() == new
    assert c.unmount() == 0


def test_flush_of_an_unopenable_file_fails_instead_of_hanging(make_cache):
    c, new = dirty_file(make_cache)
    immutable(c, True)
    try:
        c.mount()
        t0 = time.time()
        try:
            r = sh(CTL, "flush", c.mnt, check=False, timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("flush still waiting after 60 s")
        assert r.returncode != 0
        assert r.stderr.strip()
        assert time.time() - t0 < 60
        assert c.unmount(timeout=60) is not None      # exits, keeping the data dirty
    finally:
        immutable(c, False)
    # mounted again, the data is there and destages
    c.mount()
    with open(c.path("a"), "rb") as f:
        assert f.read() == new
    c.flush()
    with open(os.path.join(c.backing, "a"), "rb") as f:
        assert f.read() == new
    assert c.unmount() == 0


def test_without_handles_files_are_found_by_path(make_cache):
    c, new = dirty_file(make_cache)
    c.mount(wrapper=NO_DAC_READ_SEARCH)
    assert "files are found by path" in c.log_text()
    r = sh(CTL, "flush", c.mnt, check=False, timeout=60)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(c.backing, "a"), "rb") as f:
        assert f.read() == new
    with open(c.path("a"), "rb") as f:
        assert f.read() == new
    assert c.unmount() == 0
