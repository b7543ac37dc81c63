"""Issue 24, finding 10: the places a local user can prepare for the daemon. A symlink (or a file of another
user) planted where a new metadata mirror is to be made is refused, its target untouched; a mount point inside
the backing directory, or a backing directory inside the mount point, is refused at startup, however named."""
import os
import subprocess
import time

from conftest import DAEMON, sh

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


def mounted(path):
    """A FUSE mount at path (not the bind mount a test made there)."""
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path and line.split()[2].startswith("fuse") for line in f)


def try_mount(c, mnt_arg):
    """The daemon started on mnt_arg: its exit status if it refused, None if it mounted (then it is stopped
    and the mount removed again)."""
    real = os.path.realpath(mnt_arg)
    with open(c.log, "a") as logf:
        p = subprocess.Popen([DAEMON, "-f", "-c", c.conf, mnt_arg], stdout=logf, stderr=logf)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and p.poll() is None and not mounted(real):
            time.sleep(0.02)
        if mounted(real):
            return None
        return p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if mounted(real):
            sh("fusermount3", "-uz", real, check=False)


def refused(c, mnt_arg, why):
    log0 = len(c.log_text()) if os.path.exists(c.log) else 0
    rc = try_mount(c, mnt_arg)
    log = c.log_text()[log0:]
    assert rc is not None, f"mounted on {mnt_arg}: " + log
    assert rc != 0 and why in log, log
    assert len(log.strip().splitlines()) == 1, log


def with_backing(c, path):
    keys = dict(c.keys)
    keys["backing.path"] = str(path)
    c.write_conf(keys)


def test_mount_point_inside_backing_refused(make_cache, tmp_path):
    c = make_cache()
    c.format()
    back = os.path.realpath(c.backing)
    sub = os.path.join(c.backing, "sub", "deeper")
    os.makedirs(sub)
    refused(c, os.path.join(c.backing, "sub"), f"the mount point {back}/sub is inside the backing directory "
                                                f"{back}")
    refused(c, sub, f"the mount point {back}/sub/deeper is inside the backing directory {back}")
    # through a symlinked mount point path
    link = tmp_path / "to-backing"
    os.symlink(c.backing, link)
    refused(c, str(link / "sub"), f"the mount point {back}/sub is inside the backing directory {back}")
    refused(c, str(link), "the mount point cannot be the backing directory")
    # through a symlinked backing.path
    with_backing(c, link)
    refused(c, os.path.join(c.backing, "sub"), f"the mount point {back}/sub is inside the backing directory")
    # a name that only starts like the backing directory's is not inside it
    with_backing(c, c.backing)
    c.mnt = c.backing + "-mnt"
    os.makedirs(c.mnt)
    c.mount()
    assert c.unmount() == 0


def test_mount_point_inside_bind_mounted_backing_refused(make_cache, tmp_path):
    """The same directory by another path (a bind mount): no string comparison sees it, the identity of the
    mount point's ancestors does."""
    c = make_cache()
    c.format()
    os.makedirs(os.path.join(c.backing, "sub"))
    bind = tmp_path / "bind"
    bind.mkdir()
    sh("mount", "--bind", c.backing, str(bind))
    try:
        refused(c, str(bind / "sub"), f"the mount point {bind}/sub is inside the backing directory")
        refused(c, str(bind), "the mount point cannot be the backing directory")
        # the other way round: the backing directory named through the bind mount, inside the mount point
        c.mnt = os.path.join(c.backing, "sub")
        with_backing(c, bind)
        refused(c, c.mnt, f"the mount point {c.mnt} is inside the backing directory")
    finally:
        sh("umount", "-l", str(bind), check=False)


def test_backing_inside_mount_point_refused(make_cache, tmp_path):
    c = make_cache()
    c.format()
    mnt = os.path.realpath(c.mnt)
    inner = os.path.join(c.mnt, "inner", "backing")
    os.makedirs(inner)
    with_backing(c, inner)
    refused(c, c.mnt, f"the backing directory {mnt}/inner/backing is inside the mount point {mnt}")
    # named through a symlink
    link = tmp_path / "to-inner"
    os.symlink(os.path.join(c.mnt, "inner"), link)
    with_backing(c, link / "backing")
    refused(c, c.mnt, f"the backing directory {mnt}/inner/backing is inside the mount point {mnt}")
    # the mount point named through a symlink
    mlink = tmp_path / "to-mnt"
    os.symlink(c.mnt, mlink)
    refused(c, str(mlink), f"the backing directory {mnt}/inner/backing is inside the mount point {mnt}")
