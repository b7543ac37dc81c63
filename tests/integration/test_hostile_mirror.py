"""Issue 24, finding 10: the places a local user can prepare for the daemon. A symlink (or a file of another
user) planted where a new metadata mirror is to be made is refused, its target untouched."""
import os


VICTIM = b"the victim's own bytes\n" * 100


def victim(tmp_path, name="victim"):
    p = tmp_path / name
    p.write_bytes(VICTIM)
    return p


def untouched(p):
    st = os.lstat(p)
    return st.st_size == len(VICTIM) and p.read_bytes() == VICTIM


def plant(link, target):
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(str(target), link)


def test_format_refuses_symlinked_mirror(make_cache, tmp_path):
    c = make_cache()
    v = victim(tmp_path)
    plant(c.meta[1], v)                             # removed by cleanup (the link, not its target)
    r = c.format(check=False)
    assert r.returncode != 0 and f"{c.meta[1]} is a symbolic link" in r.stderr, r.stderr
    assert untouched(v)
    assert not os.path.exists(c.meta[0]), "format made a mirror before refusing"
    r = c.format("--force", check=False)            # --force overwrites a cache, never follows a link
    assert r.returncode != 0 and f"{c.meta[1]} is a symbolic link" in r.stderr, r.stderr
    assert untouched(v)
    # a dangling link: nothing is created where it points
    gone = tmp_path / "not-there"
    plant(c.meta[1], gone)
    r = c.format(check=False)
    assert r.returncode != 0 and f"{c.meta[1]} is a symbolic link" in r.stderr, r.stderr
    assert not os.path.lexists(gone)
    # the first mirror too
    os.unlink(c.meta[1])
    plant(c.meta[0], v)
    r = c.format(check=False)
    assert r.returncode != 0 and f"{c.meta[0]} is a symbolic link" in r.stderr, r.stderr
    assert untouched(v)
    os.unlink(c.meta[0])
    c.format()                                      # the places themselves are fine
    assert os.path.getsize(c.meta[1]) > len(VICTIM)


def test_mount_refuses_symlinked_mirror(make_cache, tmp_path):
    """A mirror lost and a link put in its place: the mount does not rebuild the mirror over the link's
    target, it refuses, naming why."""
    c = make_cache()
    c.format()
    v = victim(tmp_path)
    os.unlink(c.meta[1])
    plant(c.meta[1], v)
    c.mount(check=False)
    rc = c.proc.wait(timeout=30)
    c.proc = None
    log = c.log_text()
    assert rc != 0 and f"{c.meta[1]} is a symbolic link" in log, log
    assert untouched(v)


def test_format_refuses_mirror_file_of_another_user(make_cache):
    c = make_cache()
    with open(c.meta[1], "wb") as f:
        f.write(VICTIM)
    os.chown(c.meta[1], 65534, 65534)
    for force in ((), ("--force",)):
        r = c.format(*force, check=False)
        assert r.returncode != 0 and f"{c.meta[1]}: owned by uid 65534" in r.stderr, r.stderr
        with open(c.meta[1], "rb") as f:
            assert f.read() == VICTIM


def test_replace_mirror_refuses_symlink(make_cache, tmp_path):
    c = make_cache()
    c.format()
    c.mount()
    new = f"/dev/shm/{c.tag}-meta1-new"
    c.meta.append(new)                              # removed by cleanup
    v = victim(tmp_path)
    gone = tmp_path / "not-there"
    for target in (v, gone):
        plant(new, target)
        r = c.ctl("replace-mirror", c.mnt, c.meta[1], new, check=False)
        assert r.returncode != 0 and f"{new} is a symbolic link" in r.stderr, (target, r.stderr)
        assert os.path.islink(new)
    assert untouched(v)
    assert not os.path.lexists(gone)
    # a file of another user is not taken either
    os.unlink(new)
    with open(new, "wb") as f:
        f.write(VICTIM)
    os.chown(new, 65534, 65534)
    r = c.ctl("replace-mirror", c.mnt, c.meta[1], new, check=False)
    assert r.returncode != 0 and new in r.stderr, r.stderr
    with open(new, "rb") as f:
        assert f.read() == VICTIM
    os.unlink(new)
    assert [m["state"] for m in c.stats()["mirrors"]] == ["ok", "ok"]
    c.ctl("replace-mirror", c.mnt, c.meta[1], new)  # the place itself is fine
    assert [m["path"] for m in c.stats()["mirrors"]] == [c.meta[0], new]
    assert c.unmount() == 0
