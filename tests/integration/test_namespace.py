"""Namespace operations pass through to the backing directory; permissions are enforced; new files belong to the caller."""
import ctypes
import os
import stat
import subprocess

from workload import assert_same_tree

libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


def renameat2(a, b, flags):
    if libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def both(roots, fn):
    """Run fn on each root; both must succeed or fail with the same errno."""
    res = []
    for r in roots:
        try:
            res.append(("ok", fn(r)))
        except OSError as e:
            res.append(("err", e.errno))
    assert res[0] == res[1], res
    return res[0]


def test_namespace_matches_plain_directory(cache, tmp_path):
    ref = str(tmp_path / "ref")
    os.mkdir(ref)
    roots = [cache.mnt, ref]
    j = os.path.join
    both(roots, lambda r: os.makedirs(j(r, "a/b/c")))
    both(roots, lambda r: open(j(r, "a/f1"), "wb").write(b"one" * 1000))
    both(roots, lambda r: open(j(r, "a/f2"), "wb").write(b"two" * 333))
    both(roots, lambda r: os.symlink("f1", j(r, "a/lnk")))
    both(roots, lambda r: os.readlink(j(r, "a/lnk")))
    both(roots, lambda r: os.link(j(r, "a/f1"), j(r, "a/b/hard")))
    both(roots, lambda r: os.stat(j(r, "a/f1")).st_nlink)
    both(roots, lambda r: os.mkfifo(j(r, "a/fifo")))
    both(roots, lambda r: renameat2(j(r, "a/f1"), j(r, "a/f2"), RENAME_NOREPLACE))
    both(roots, lambda r: renameat2(j(r, "a/f1"), j(r, "a/f2"), RENAME_EXCHANGE))
    both(roots, lambda r: open(j(r, "a/f1"), "rb").read())
    both(roots, lambda r: os.rename(j(r, "a/f2"), j(r, "a/b/c/moved")))
    both(roots, lambda r: os.rename(j(r, "a/b/c"), j(r, "c2")))
    both(roots, lambda r: os.rmdir(j(r, "a")))   # ENOTEMPTY on both
    both(roots, lambda r: os.open(j(r, "a/f1"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    both(roots, lambda r: os.chmod(j(r, "a/f1"), 0o640))
    both(roots, lambda r: stat.S_IMODE(os.stat(j(r, "a/f1")).st_mode))
    both(roots, lambda r: os.utime(j(r, "a/f1"), ns=(1_000_000_000, 2_000_000_123)))
    both(roots, lambda r: os.stat(j(r, "a/f1")).st_mtime_ns)
    both(roots, lambda r: os.setxattr(j(r, "a/f1"), "user.k", b"v"))
    both(roots, lambda r: os.getxattr(j(r, "a/f1"), "user.k"))
    both(roots, lambda r: sorted(os.listxattr(j(r, "a/f1"))))
    both(roots, lambda r: os.removexattr(j(r, "a/f1"), "user.k"))
    both(roots, lambda r: os.getxattr(j(r, "a/f1"), "user.k"))
    both(roots, lambda r: os.chown(j(r, "a/f1"), 1234, 5678))
    both(roots, lambda r: (os.stat(j(r, "a/f1")).st_uid, os.stat(j(r, "a/f1")).st_gid))
    for k in range(300):
        both(roots, lambda r: open(j(r, "c2", f"n{k}"), "w").write(str(k)))
    both(roots, lambda r: sorted(os.listdir(j(r, "c2"))))
    both(roots, lambda r: os.unlink(j(r, "c2", "n7")))
    both(roots, lambda r: os.rmdir(j(r, "a/b")))
    fd = [os.open(j(r, "a/app"), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644) for r in roots]
    for i in range(50):
        for f in fd:
            os.write(f, b"x" * (i * 37 % 500 + 1))
    for f in fd:
        os.close(f)
    both(roots, lambda r: open(j(r, "a/app"), "rb").read())
    both(roots, lambda r: open(j(r, "a/app"), "wb").write(b"truncated by O_TRUNC"))
    both(roots, lambda r: open(j(r, "a/app"), "rb").read())
    both(roots, lambda r: os.truncate(j(r, "a/app"), 4))
    both(roots, lambda r: os.path.getsize(j(r, "a/app")))
    fd = os.open(cache.path("a/fa"), os.O_CREAT | os.O_RDWR, 0o644)
    os.posix_fallocate(fd, 0, 1 << 20)
    assert os.fstat(fd).st_size == 1 << 20
    os.pwrite(fd, b"data", 100)
    os.fsync(fd)
    os.close(fd)
    ofd = os.open(j(ref, "a/fa"), os.O_CREAT | os.O_RDWR, 0o644)
    os.posix_fallocate(ofd, 0, 1 << 20)
    os.pwrite(ofd, b"data", 100)
    os.close(ofd)
    assert_same_tree(cache.mnt, ref)
    sv = os.statvfs(cache.mnt)
    assert sv.f_blocks == os.statvfs(cache.backing).f_blocks
    cache.flush()
    assert_same_tree(cache.backing, ref)


def as_user(uid, code):
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           "/usr/bin/python3", "-c", code], capture_output=True, text=True, timeout=30)


def test_permissions_enforced_and_owner_is_caller(public_cache):
    c = public_cache
    secret = c.path("secret")
    with open(secret, "wb") as f:
        f.write(b"root only")
    os.chmod(secret, 0o600)
    os.mkdir(c.path("pub"), 0o1777)
    os.chmod(c.path("pub"), 0o1777)
    os.mkdir(c.path("sgid"), 0o2777)
    os.chmod(c.path("sgid"), 0o2777)
    os.chown(c.path("sgid"), 0, 4242)
    nobody = 65534
    r = as_user(nobody, f"open({secret!r}).read()")
    assert r.returncode != 0 and "PermissionError" in r.stderr
    r = as_user(nobody, f"open({c.path('new')!r}, 'w')")
    assert r.returncode != 0 and "PermissionError" in r.stderr
    r = as_user(nobody, f"import os; open({c.path('pub', 'mine')!r}, 'w').write('hi'); os.mkdir({c.path('pub', 'd')!r}); "
                        f"open({c.path('sgid', 'g')!r}, 'w').write('g')")
    assert r.returncode == 0, r.stderr
    st = os.stat(os.path.join(c.backing, "pub", "mine"))
    assert (st.st_uid, st.st_gid) == (nobody, nobody)
    st = os.stat(os.path.join(c.backing, "pub", "d"))
    assert (st.st_uid, st.st_gid) == (nobody, nobody)
    st = os.stat(os.path.join(c.backing, "sgid", "g"))
    assert (st.st_uid, st.st_gid) == (nobody, 4242)
    r = as_user(nobody, f"import os; os.chown({c.path('pub', 'mine')!r}, 0, 0)")
    assert r.returncode != 0 and "PermissionError" in r.stderr
    r = as_user(nobody, f"import os; os.truncate({secret!r}, 0)")
    assert r.returncode != 0
    with open(secret, "rb") as f:
        assert f.read() == b"root only"


def test_closed_cached_files_hold_no_descriptor(make_cache):
    """A file that nobody has open and that has nothing dirty keeps its cached data but not a descriptor:
    under a limit of 1024 descriptors, 2000 cached small files must not make the daemon fail with EMFILE."""
    c = make_cache()
    c.format()
    c.mount(wrapper=("prlimit", "--nofile=1024:1024"))
    d = c.path("many")
    os.mkdir(d)
    for batch in range(5):
        for i in range(batch * 400, batch * 400 + 400):
            with open(os.path.join(d, f"f{i}"), "wb") as f:
                f.write(b"%d" % i)
        c.flush()                                # clean: nothing holds them
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")                       # the kernel forgets the inodes it looked up
    assert c.stats()["used_bytes"] >= 2000 * 4096  # still cached
    for i in range(0, 2000, 7):                  # and read back right, reopened
        with open(os.path.join(d, f"f{i}"), "rb") as f:
            assert f.read() == b"%d" % i
    nfds = len(os.listdir(f"/proc/{c.proc.pid}/fd"))
    assert nfds < 400, nfds
    os.unlink(os.path.join(d, "f7"))             # an idle file's data goes with it
    assert not os.path.exists(os.path.join(d, "f7"))
    assert c.unmount() == 0
    assert len(os.listdir(os.path.join(c.backing, "many"))) == 1999


def test_many_looked_up_files_need_no_descriptor_each(make_cache):
    """The kernel may hold any number of inodes: under a limit of 1024 descriptors, 3000 files looked up at
    once (and kept by the kernel) must all work, their attributes, links, xattrs and data."""
    c = make_cache()
    c.format()
    c.mount(wrapper=("prlimit", "--nofile=1024:1024"))
    d = c.path("many")
    os.mkdir(d)
    for i in range(3000):
        with open(os.path.join(d, f"f{i}"), "wb") as f:
            f.write(b"%d" % i)
    held = [os.open(os.path.join(d, f"f{i}"), os.O_PATH) for i in range(0, 3000, 3)]   # pinned in the kernel
    try:
        for i in range(3000):
            assert os.stat(os.path.join(d, f"f{i}")).st_size == len(b"%d" % i)
        os.link(os.path.join(d, "f5"), os.path.join(d, "hard"))
        os.setxattr(os.path.join(d, "f6"), "user.x", b"y")
        assert os.getxattr(os.path.join(d, "f6"), "user.x") == b"y"
        os.chmod(os.path.join(d, "f7"), 0o640)
        assert stat.S_IMODE(os.stat(os.path.join(d, "f7")).st_mode) == 0o640
        with open(os.path.join(d, "hard"), "rb") as f:
            assert f.read() == b"5"
    finally:
        for fd in held:
            os.close(fd)
    assert len(os.listdir(d)) == 3001
    assert c.unmount() == 0
