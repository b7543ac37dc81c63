"""Backing-file identity through the real mount (issue 10): the identity stamp is the cache's own and
hidden from the mount; files found by path follow renames through the mount across kill -9; dirty data
of a file deleted behind the cache's back while it was down goes to .nvcachefs-lost+found/, counted in
the stats and listed by `nvcachectl check`."""
import errno
import os

import pytest

from conftest import MiB

LOST = ".nvcachefs-lost+found"


def lost_found(c):
    d = os.path.join(c.backing, LOST)
    if not os.path.isdir(d):
        return {}
    out = {}
    for n in os.listdir(d):
        with open(os.path.join(d, n), "rb") as f:
            out[n] = f.read()
    return out


def test_identity_stamp_is_hidden_from_the_mount(cache):
    with open(cache.path("a"), "wb") as f:
        f.write(os.urandom(64 * 1024))
        f.flush()
        os.fsync(f.fileno())
    names = os.listxattr(os.path.join(cache.backing, "a"))
    ours = [n for n in names if ".nvcachefs." in n]
    assert ours, names                                  # the backing file carries the stamp
    assert not [n for n in os.listxattr(cache.path("a")) if ".nvcachefs." in n]
    for n in ours:
        with pytest.raises(OSError) as e:
            os.getxattr(cache.path("a"), n)
        assert e.value.errno == errno.ENODATA
        with pytest.raises(OSError) as e:
            os.setxattr(cache.path("a"), n, b"x" * 16)
        assert e.value.errno == errno.EPERM
        with pytest.raises(OSError) as e:
            os.removexattr(cache.path("a"), n)
        assert e.value.errno == errno.EPERM
    os.setxattr(cache.path("a"), "user.other", b"kept")  # other attributes pass through
    assert os.getxattr(cache.path("a"), "user.other") == b"kept"
    assert "user.other" in os.listxattr(cache.path("a"))


@pytest.mark.parametrize("identity", ["path", "auto"])
def test_renamed_through_the_mount_survives_kill9(make_cache, identity):
    c = make_cache(extra={"backing.identity": identity, "destage.on_unmount": "keep"})
    c.format()
    c.mount()
    assert ("found by path" if identity == "path" else "found by file handle") in c.log_text()
    os.makedirs(c.path("d1", "sub"))
    data = os.urandom(3 * MiB + 123)
    with open(c.path("d1", "sub", "f"), "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    os.rename(c.path("d1"), c.path("d2"))
    os.rename(c.path("d2", "sub", "f"), c.path("d2", "sub", "g"))
    c.kill9()
    c.mount()
    c.flush()
    with open(os.path.join(c.backing, "d2", "sub", "g"), "rb") as f:
        assert f.read() == data
    assert lost_found(c) == {}
    assert c.unmount() == 0


def test_deleted_behind_the_cache_goes_to_lost_found(make_cache):
    c = make_cache(extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    data = os.urandom(2 * MiB + 5)
    with open(c.path("f"), "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    c.kill9()
    os.unlink(os.path.join(c.backing, "f"))          # behind the cache's back
    c.mount()
    assert "cannot be found" in c.log_text()
    got = lost_found(c)
    assert list(got.values()) == [data]
    st = c.stats()
    assert st["lost_found_files"] == 1
    assert st["lost_found_bytes"] == len(data)
    assert st["dirty_bytes"] == 0
    assert c.unmount() == 0
    r = c.ctl("check", "-c", c.conf)
    assert LOST in r.stdout and list(got)[0] in r.stdout, r.stdout


def test_a_store_not_mounted_is_refused_while_data_is_dirty(make_cache):
    """The store's mount point without the store (an empty directory): the cache refuses to mount instead of
    taking every file for lost; on the store again, the data is there."""
    c = make_cache(extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    data = os.urandom(MiB + 7)
    with open(c.path("f"), "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    c.kill9()
    os.rename(c.backing, c.backing + ".real")     # the store "unmounted"
    os.mkdir(c.backing)
    try:
        p = c.mount(check=False)
        assert p.wait(timeout=30) != 0
        assert "is not the store this cache holds dirty data for" in c.log_text()
        assert os.listdir(c.backing) == []          # nothing was put there
    finally:
        os.rmdir(c.backing)
        os.rename(c.backing + ".real", c.backing)
    c.mount()
    c.flush()
    with open(os.path.join(c.backing, "f"), "rb") as f:
        assert f.read() == data
    assert lost_found(c) == {}
    assert c.unmount() == 0


@pytest.mark.parametrize("identity", ["handle", "path"])
def test_file_unlinked_while_open_is_gone_after_kill9(make_cache, identity):
    """A file deleted through the mount while a process holds it open has no name left: after a kill -9 (the
    holder's close never reaching the daemon), its dirty data is dropped, not saved to lost+found as if the file
    had been lost; the other files keep every byte."""
    c = make_cache(extra={"destage.on_unmount": "keep", "backing.identity": identity})
    c.format()
    c.mount()
    keep = os.urandom(3 * MiB + 123)
    with open(c.path("keep"), "wb") as f:
        f.write(keep)
    f = open(c.path("doomed"), "wb")
    f.write(os.urandom(2 * MiB))
    f.flush()
    os.unlink(c.path("doomed"))                        # still open: the name goes, the file stays
    assert c.stats()["dirty_bytes"] >= 4 * MiB
    c.kill9()
    f.close()                                          # too late: the daemon is gone
    c.mount()
    assert lost_found(c) == {}, c.log_text()[-2000:]
    with open(c.path("keep"), "rb") as g:
        assert g.read() == keep
    assert not os.path.exists(c.path("doomed"))
    assert c.stats()["lost_found_files"] == 0
    c.flush()
    assert sorted(n for n in os.listdir(c.backing) if not n.startswith(".")) == ["keep"]
    assert c.unmount() == 0
