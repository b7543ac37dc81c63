"""Issue 24: a local user gets nothing through the mount that the store would refuse them. Each test runs code as
nobody (setpriv --reuid=65534 --regid=65534 --clear-groups) through an allow_other mount run as root, and checks
the store's own answer: modes on an O_CREAT onto a file made behind the kernel's back, POSIX ACLs, trusted.*
names, root's reserved blocks (an ext4 on a loop device as the store), set-ID bits on fallocate,
the daemon's reserved names, and symlinks swapped under the daemon's by-name operations."""
import contextlib
import os
import stat
import subprocess
import time

import pytest

from conftest import MiB, sh

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def nobody(code, *args, timeout=120):
    """Run python code as nobody; its stdout (stripped), asserting it exited 0."""
    r = subprocess.run([*AS_NOBODY, "/usr/bin/python3", "-c", code, *args], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def errno_of(code, *args):
    """The errno name (or "ok") that code, run as nobody, ends with."""
    wrapped = ("import errno, os, sys\ntry:\n" + "".join("    " + line + "\n" for line in code.splitlines()) +
               "    print('ok')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n")
    return nobody(wrapped, *args)


def pub_dir(c, name="pub", mode=0o1777):
    d = os.path.join(c.backing, name)
    os.mkdir(d)
    os.chmod(d, mode)
    return d


@pytest.fixture
def neg_cache(make_cache):
    """A public cache whose kernel keeps negative entries (fuse.negative_timeout), as on a node whose store
    other nodes change."""
    c = make_cache(public=True, extra={"fuse.negative_timeout": "60s"})
    c.format()
    c.mount()
    yield c
    if c.proc:
        c.unmount()


def test_o_creat_onto_a_file_made_behind_the_kernel_checks_the_mode(neg_cache):
    """Finding 1: the kernel sends CREATE for an O_CREAT open of a name it holds as negative and then skips
    may_open (it believes it made the file); another node makes the name meanwhile. The open must be refused
    as the store would (EACCES), the file neither read, written nor truncated."""
    c = neg_cache
    pub = pub_dir(c)
    for name in ("readme", "writeme", "truncme"):
        # nobody looks first: the kernel keeps the name as negative for 60 s
        assert errno_of("os.stat(sys.argv[1])", c.path("pub", name)) == "ENOENT"
        with open(os.path.join(pub, name), "wb") as f:     # then root makes it, on the store
            f.write(b"root's secret")
        os.chmod(os.path.join(pub, name), 0o600)
    assert errno_of("fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDONLY, 0o644)\nprint(os.read(fd, 100))",
                    c.path("pub", "readme")) == "EACCES"
    assert errno_of("fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)\nos.write(fd, b'pwned')",
                    c.path("pub", "writeme")) == "EACCES"
    assert errno_of("os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)",
                    c.path("pub", "truncme")) == "EACCES"
    for name in ("readme", "writeme", "truncme"):            # (the mount holds the names as negative still)
        with open(os.path.join(pub, name), "rb") as f:
            assert f.read() == b"root's secret", name
    # a file nobody may write is opened so, through the same path
    with open(os.path.join(pub, "open"), "wb") as f:
        f.write(b"anyone's")
    os.chmod(os.path.join(pub, "open"), 0o666)
    assert errno_of("os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644))",
                    c.path("pub", "open")) == "ok"
    assert os.path.getsize(c.path("pub", "open")) == 0


def setfacl(*args):
    sh("setfacl", *args)


def test_acls_deny_the_owning_group_and_grant_a_named_user(public_cache):
    """Finding 3: an ACL that denies the owning group (g::---, whose mode bits show the mask) and one that
    grants a user named in it are enforced through the mount as on the store."""
    c = public_cache
    pub = pub_dir(c, mode=0o755)
    denied, granted = os.path.join(pub, "denied"), os.path.join(pub, "granted")
    for p in (denied, granted):
        with open(p, "wb") as f:
            f.write(b"data")
    os.chown(denied, 0, NOBODY)
    os.chmod(denied, 0o640)
    setfacl("-m", "g::---,u:12345:r,m::r", denied)        # the group class bits (the mask) say r
    os.chmod(granted, 0o600)
    setfacl("-m", f"u:{NOBODY}:r", granted)
    assert stat.S_IMODE(os.stat(denied).st_mode) & 0o040    # the mode alone would let the group read
    assert errno_of("open(sys.argv[1]).read()", os.path.join(pub, "denied")) == "EACCES"  # the store: refused
    assert errno_of("open(sys.argv[1]).read()", c.path("pub", "denied")) == "EACCES"
    assert errno_of("open(sys.argv[1]).read()", c.path("pub", "granted")) == "ok"
    assert errno_of("open(sys.argv[1], 'a').write('x')", c.path("pub", "granted")) == "EACCES"
    # an ACL set through the mount is the store's, and enforced at once
    setfacl("-m", f"u:{NOBODY}:rw", c.path("pub", "granted"))
    assert f"user:{NOBODY}:rw-" in sh("getfacl", "-n", granted).stdout
    assert errno_of("open(sys.argv[1], 'a').write('x')", c.path("pub", "granted")) == "ok"


def test_a_default_acl_is_inherited_by_a_file_made_through_the_mount(public_cache):
    """Finding 3: a parent's default ACL replaces the creator's umask: a file made through the mount under
    umask 022 gets the group write that the default ACL gives, as it would on the store."""
    c = public_cache
    d = pub_dir(c, "shared", 0o777)
    os.chown(d, NOBODY, NOBODY)
    setfacl("-d", "-m", "u::rwx,g::rwx,o::r-x,u:12345:rwx", d)
    nobody("import os, sys\nos.umask(0o022)\nos.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o666))\n"
           "os.mkdir(sys.argv[2], 0o777)", c.path("shared", "f"), c.path("shared", "sub"))
    ref = os.path.join(c.tmp, "ref")                            # the same on the store directly
    os.mkdir(ref)
    os.chmod(ref, 0o777)
    os.chown(ref, NOBODY, NOBODY)
    setfacl("-d", "-m", "u::rwx,g::rwx,o::r-x,u:12345:rwx", ref)
    nobody("import os, sys\nos.umask(0o022)\nos.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o666))\n"
           "os.mkdir(sys.argv[2], 0o777)", os.path.join(ref, "f"), os.path.join(ref, "sub"))
    for n in ("f", "sub"):
        got, want = os.stat(os.path.join(d, n)), os.stat(os.path.join(ref, n))
        assert oct(got.st_mode) == oct(want.st_mode), n
        assert (got.st_uid, got.st_gid) == (NOBODY, NOBODY)
        acl = lambda p: [ln for ln in sh("getfacl", "-n", "-p", p).stdout.splitlines() if not ln.startswith("#")]
        assert acl(os.path.join(d, n)) == acl(os.path.join(ref, n)), n
    assert stat.S_IMODE(os.stat(os.path.join(d, "f")).st_mode) & 0o020    # group write: umask 022 not applied


def test_trusted_names_are_not_listed_to_a_user(public_cache):
    """Finding 6: a user does not see trusted.* names (ext4 hides them without CAP_SYS_ADMIN), nor reads
    them; user.* names are listed as before."""
    c = public_cache
    pub = pub_dir(c)
    p = os.path.join(pub, "f")
    with open(p, "wb") as f:
        f.write(b"x")
    os.chown(p, NOBODY, NOBODY)
    os.setxattr(p, "trusted.secret", b"root only")
    os.setxattr(p, "user.visible", b"anyone")
    names = nobody("import os, sys\nprint(sorted(os.listxattr(sys.argv[1])))", c.path("pub", "f"))
    assert "user.visible" in names and "trusted" not in names, names
    assert errno_of("os.getxattr(sys.argv[1], 'trusted.secret')", c.path("pub", "f")) in ("EPERM", "ENODATA")
    assert "trusted.secret" in os.listxattr(c.path("pub", "f"))        # root still sees it


def test_fallocate_by_a_non_owner_kills_set_id_bits(public_cache):
    """Finding 9 (xfstests generic/683, generic/684): fallocate and a punched hole by a user other than the
    owner, without CAP_FSETID, clear the setuid and setgid (with group execute) bits, as a write does."""
    c = public_cache
    pub = pub_dir(c)
    for name, mode in (("alloc", 0), ("punch", 3)):            # 3: FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        p = os.path.join(pub, name)
        with open(p, "wb") as f:
            f.write(b"x" * 65536)
        os.chmod(p, 0o6777)
        nobody("import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
               "if libc.fallocate(fd, int(sys.argv[2]), ctypes.c_long(0), ctypes.c_long(8192)):\n"
               "    raise OSError(ctypes.get_errno(), 'fallocate')\n", c.path("pub", name), str(mode))
        assert stat.S_IMODE(os.stat(c.path("pub", name)).st_mode) == 0o777, name
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o777, name


RESERVED = [".nvcachefs-lost+found", ".nvcachefs-probe.1", ".nvcachefs-xchg",
            "f.nvcachefs-conflict-node1-20261201T000000Z"]


@pytest.mark.parametrize("user", ["nobody", "root"])
def test_the_daemons_names_cannot_be_made_renamed_or_linked(public_cache, user):
    """The daemon's own names (lost+found, probes, placeholders, conflict copies) are refused with EPERM when
    made, renamed to or from, or linked through the mount, by any user; nothing appears on the store."""
    c = public_cache
    pub = pub_dir(c)
    with open(os.path.join(pub, "mine"), "wb") as f:
        f.write(b"x")
    os.chown(os.path.join(pub, "mine"), NOBODY, NOBODY)
    code = """
import errno, os, sys
d, names = sys.argv[1], sys.argv[2:]
out = []
ops = [("creat", lambda p: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))),
       ("mkdir", lambda p: os.mkdir(p)), ("mknod", lambda p: os.mknod(p)), ("symlink", lambda p: os.symlink("x", p)),
       ("rename_to", lambda p: os.rename(os.path.join(d, "mine"), p)),
       ("link", lambda p: os.link(os.path.join(d, "mine"), p))]
for n in names:
    for op, fn in ops:
        try:
            fn(os.path.join(d, n))
            out.append(f"{op} {n}: made")
        except OSError as e:
            if e.errno != errno.EPERM:
                out.append(f"{op} {n}: {errno.errorcode[e.errno]}")
print(out)
"""
    args = [c.path("pub"), *RESERVED]
    if user == "nobody":
        out = nobody(code, *args)
    else:
        out = subprocess.run(["/usr/bin/python3", "-c", code, *args], capture_output=True, text=True,
                             check=True).stdout.strip()
    assert out == "[]", out
    assert sorted(os.listdir(pub)) == ["mine"]


SWAP_LOOP = """
import os, sys, time
d, victim, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
names = ["n%d" % i for i in range(8)]
end, swaps = time.time() + seconds, 0
while time.time() < end:
    for n in names:
        p = os.path.join(d, n)
        try:
            os.symlink(victim, p + ".tmp")
            os.rename(p + ".tmp", p)                  # the name is a link to the victim now
            swaps += 1
            os.unlink(p)
        except OSError:
            pass
print(swaps)
"""

OPS_LOOP = """
import errno, os, sys, time
d, seconds = sys.argv[1], float(sys.argv[2])
names = ["n%d" % i for i in range(8)]
end, ops = time.time() + seconds, 0
while time.time() < end:
    for n in names:
        p = os.path.join(d, n)
        for fn in (lambda: os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o6777)),
                   lambda: os.chmod(p, 0o6777), lambda: os.utime(p, (0, 0)),
                   lambda: os.setxattr(p, "user.x", b"y"), lambda: os.truncate(p, 0),
                   lambda: open(p, "a").write("pwned"), lambda: os.rename(p, p + ".r"),
                   lambda: os.mkdir(p, 0o777), lambda: os.rmdir(p), lambda: os.unlink(p)):
            try:
                fn()
                ops += 1
            except OSError:
                pass
print(ops)
"""


def test_a_symlink_swapped_under_every_by_name_operation_redirects_nothing(public_cache):
    """For a few seconds nobody swaps names for symlinks to a root-owned file outside the store, in the store
    directly, while nobody also creates, chmods, utimes, truncates, writes, renames and removes those names
    through the mount: the root-owned file keeps its owner, mode, times and bytes."""
    c = public_cache
    pub = pub_dir(c)
    victim = os.path.join(c.tmp, "victim")
    with open(victim, "wb") as f:
        f.write(b"root's file")
    os.chmod(victim, 0o644)
    os.utime(victim, (1000000000, 1000000000))
    before = os.stat(victim)
    swapper = subprocess.Popen([*AS_NOBODY, "/usr/bin/python3", "-c", SWAP_LOOP, pub, victim, "4"],
                               stdout=subprocess.PIPE, text=True)
    try:
        ops = nobody(OPS_LOOP, c.path("pub"), "4")
    finally:
        swaps, _ = swapper.communicate(timeout=60)
    assert int(swaps) > 100 and int(ops) > 100, (swaps, ops)
    after = os.stat(victim)
    assert (after.st_uid, after.st_gid, oct(after.st_mode), after.st_mtime) == \
        (before.st_uid, before.st_gid, oct(before.st_mode), before.st_mtime)
    with open(victim, "rb") as f:
        assert f.read() == b"root's file"
    assert "user.x" not in os.listxattr(victim)
    for n in os.listdir(pub):                                   # whatever is left is nobody's
        assert os.lstat(os.path.join(pub, n)).st_uid == NOBODY, n


# ---- quotas and reserved blocks: an ext4 store on a loop device ----

@contextlib.contextmanager
def ext4_store(tmp, size_mb, *mkfs_opts, mount_opts="defaults"):
    """An ext4 file system on a loop device mounted at tmp/store, with a world-writable sticky store/data."""
    img = f"/dev/shm/nvc-test-ext4-{os.getpid()}-{time.monotonic_ns()}.img"
    mnt = os.path.join(tmp, "store")
    os.makedirs(mnt)
    loop = None
    try:
        with open(img, "wb") as f:
            f.truncate(size_mb * MiB)
        sh("mkfs.ext4", "-q", "-F", *mkfs_opts, img)
        loop = sh("losetup", "--find", "--show", img).stdout.strip()
        sh("mount", "-o", mount_opts, loop, mnt)
        data = os.path.join(mnt, "data")
        os.mkdir(data)
        os.chmod(data, 0o1777)
        yield data
    finally:
        if os.path.ismount(mnt):
            sh("umount", mnt, check=False)
            if os.path.ismount(mnt):
                sh("umount", "-l", mnt, check=False)
        if loop:
            sh("losetup", "-d", loop, check=False)
        os.unlink(img) if os.path.exists(img) else None


WRITE_UNTIL_REFUSED = """
import errno, os, sys
path, total = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
done, err, buf = 0, "none", os.urandom(1 << 20)
while done < total:
    try:
        n = os.write(fd, buf[: min(len(buf), total - done)])
    except OSError as e:
        err = errno.errorcode[e.errno]
        break
    done += n
try:
    os.close(fd)
except OSError as e:
    err = err if err != "none" else "close " + errno.errorcode[e.errno]
print(done, err)
"""


def store_cache(make_cache, data, **extra):
    c = make_cache(public=True, extra={"backing.path": data, **extra})
    c.format()
    c.mount()
    return c


def acked_is_stored(c, name, acked):
    """Every byte acknowledged is on the store after an unmount (which destages all), and no destage failed."""
    assert c.unmount() == 0
    log = c.log_text()
    assert "destage" not in log.lower() or "failed" not in log.lower(), log
    assert os.path.getsize(os.path.join(c.backing, name)) == acked


def test_a_user_cannot_fill_the_blocks_kept_for_root(make_cache, tmp_path):
    """Finding 7: ext4 keeps a share of its blocks for root (here 40%); a user writing through the mount gets
    ENOSPC where the store would refuse it, not after filling root's reserve through root's destage. Every
    byte acknowledged is destaged. (Quotas take the same path, the claim as the caller without
    CAP_SYS_RESOURCE, but this kernel has no CONFIG_QUOTA: ext4 refuses to mount with quotas.)"""
    with ext4_store(str(tmp_path), 128, "-m", "40") as data:
        st = os.statvfs(data)
        user_free, reserved = st.f_bavail * st.f_frsize, (st.f_bfree - st.f_bavail) * st.f_frsize
        c = store_cache(make_cache, data)
        try:
            done, err = nobody(WRITE_UNTIL_REFUSED, c.path("f"), str(256 * MiB)).split()
            done = int(done)
            assert err == "ENOSPC", (done, err)
            assert done <= user_free, (done, user_free)
            acked_is_stored(c, "f", done)
            st = os.statvfs(data)
            assert st.f_bfree * st.f_frsize >= reserved - 4 * MiB, (st.f_bfree * st.f_frsize, reserved)
        finally:
            c.cleanup()


def test_a_user_cannot_remove_a_file_capability_but_a_write_kills_it(public_cache):
    """The daemon removes security.capability as itself when the kernel asks (a write by a caller without
    CAP_FSETID: file_remove_privs); a user's own removal is refused (CAP_SETFCAP), as on the store."""
    import struct
    c = public_cache
    pub = pub_dir(c)
    p = os.path.join(pub, "f")
    with open(p, "wb") as f:
        f.write(b"x" * 4096)
    os.chown(p, NOBODY, NOBODY)
    os.chmod(p, 0o755)
    os.setxattr(p, "security.capability", struct.pack("<IIIII", 0x02000001, 1 << 10, 0, 0, 0))
    assert errno_of("os.removexattr(sys.argv[1], 'security.capability')", c.path("pub", "f")) == "EPERM"
    assert os.getxattr(p, "security.capability")
    assert errno_of("fd = os.open(sys.argv[1], os.O_WRONLY)\nos.write(fd, b'y')", c.path("pub", "f")) == "ok"
    with pytest.raises(OSError):
        os.getxattr(p, "security.capability")


# ---- found by an outside review of acting as the caller ----

def fill_as_nobody(c, name="fill"):
    """Write through the mount as nobody until the store refuses (ENOSPC); the bytes it took."""
    done, err = nobody(WRITE_UNTIL_REFUSED, c.path(name), str(256 * MiB)).split()
    assert err == "ENOSPC", (done, err)
    return int(done)


PUNCH = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
os.truncate(sys.argv[1], 8 << 20)
# 3: FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, over the whole (sparse) file
if libc.fallocate(fd, 3, ctypes.c_long(0), ctypes.c_long(8 << 20)):
    import errno
    print(errno.errorcode[ctypes.get_errno()])
else:
    print("ok")
"""

MMAP_WRITE = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o644)
os.truncate(sys.argv[1], 8 << 20)
m = mmap.mmap(fd, 8 << 20)
m[:] = b"x" * (8 << 20)
try:
    m.flush()
    os.fsync(fd)
    print("ok")
except OSError as e:
    import errno
    print(errno.errorcode[e.errno])
"""


@pytest.mark.parametrize("how", ["punch", "mmap"])
def test_no_write_path_reaches_the_blocks_kept_for_root(make_cache, tmp_path, how):
    """A hole punched in a sparse file (written as zeros through the cache) and a shared mapping's pages (the
    kernel's writeback comes with no caller) are claimed as the writer too: with the user's share of the store
    full, they are refused, or fit; root's reserve stays free, and flush destages everything (no destage fails
    for want of space)."""
    with ext4_store(str(tmp_path), 128, "-m", "40") as data:
        st = os.statvfs(data)
        reserved = (st.f_bfree - st.f_bavail) * st.f_frsize
        c = store_cache(make_cache, data)
        try:
            fill_as_nobody(c)
            out = nobody(PUNCH if how == "punch" else MMAP_WRITE, c.path(how))
            assert out in ("ok", "ENOSPC", "EIO"), out
            r = c.ctl("flush", c.mnt, check=False)
            assert r.returncode == 0, r.stderr + c.log_text()[-2000:]
            st = os.statvfs(data)
            assert st.f_bfree * st.f_frsize >= reserved - 4 * MiB, (st.f_bfree * st.f_frsize, reserved, out)
        finally:
            c.unmount()
            c.cleanup()


def test_an_execute_only_program_runs_and_a_read_only_directory_lists(public_cache):
    """A program with mode 0711 runs through the mount, as on the store (the kernel opens it for exec, not
    for reading), and a directory nobody may read but not search (r--) lists its names."""
    c = public_cache
    pub = pub_dir(c, mode=0o755)
    prog = os.path.join(pub, "prog")
    sh("cp", "/bin/true", prog)
    os.chmod(prog, 0o711)
    r = subprocess.run([*AS_NOBODY, c.path("pub", "prog")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # exec'd by a process of nobody's with no capabilities (setpriv itself still holds root's while it execs):
    # its OPEN carries the exec flag and asks execute, not read, of the store (the mode changed just now, so
    # the daemon asks the store as the caller)
    os.chmod(prog, 0o711)
    r = subprocess.run([*AS_NOBODY, "/bin/sh", "-c", 'exec "$0"', c.path("pub", "prog")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    d = os.path.join(pub, "rdir")
    os.mkdir(d)
    for n in ("a", "b"):
        open(os.path.join(d, n), "w").close()
    os.chmod(d, 0o744)
    assert nobody("import os, sys\nprint(sorted(os.listdir(sys.argv[1])))", c.path("pub", "rdir")) == "['a', 'b']"
    assert errno_of("os.stat(os.path.join(sys.argv[1], 'a'))", c.path("pub", "rdir")) == "EACCES"


def test_a_callers_capabilities_count_not_its_uid(neg_cache):
    """The store sees the caller's capabilities: nobody given CAP_DAC_READ_SEARCH (a backup service) reads a
    root 0600 file through the mount as on the store, and uid 0 without capabilities (a container's root) may
    not open another user's 0600 file with O_CREAT on the path the kernel does not check (finding 1)."""
    c = neg_cache
    pub = pub_dir(c, mode=0o755)
    secret = os.path.join(pub, "secret")
    with open(secret, "w") as f:
        f.write("root's")
    os.chmod(secret, 0o600)
    capable = [*AS_NOBODY, "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    for p in (secret, c.path("pub", "secret")):
        r = subprocess.run([*capable, "cat", p], capture_output=True, text=True)
        assert (r.returncode, r.stdout) == (0, "root's"), (p, r.stderr)
    capless = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    code = ("import errno, os, sys\ntry:\n    os.write(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY | os.O_APPEND,"
            " 0o644), b'pwned')\n    print('ok')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n")
    r = subprocess.run([*capless, "/usr/bin/python3", "-c", "import os, sys\ntry:\n    os.stat(sys.argv[1])\n"
                        "except FileNotFoundError:\n    pass", c.path("pub", "u1000")], check=True)
    u1000 = os.path.join(pub, "u1000")
    with open(u1000, "w") as f:
        f.write("1000's")
    os.chown(u1000, 1000, 1000)
    os.chmod(u1000, 0o600)
    r = subprocess.run([*capless, "/usr/bin/python3", "-c", code, c.path("pub", "u1000")], capture_output=True,
                       text=True, check=True)
    assert r.stdout.strip() == "EACCES", r.stdout
    with open(u1000) as f:
        assert f.read() == "1000's"


def test_the_daemon_takes_its_own_groups_back(public_cache):
    """After serving a caller with supplementary groups, no daemon thread keeps them once it has gone idle
    (the idle hook is the daemon's own work): on a store where root is not privileged, the daemon's work
    would otherwise run with a user's groups."""
    c = public_cache
    pub = pub_dir(c)
    code = "import os, sys\nfor i in range(50):\n    open(os.path.join(sys.argv[1], 'g%d' % i), 'w').close()"
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--groups=4242,4243",
                    "/usr/bin/python3", "-c", code, c.path("pub")], check=True)
    assert os.stat(os.path.join(pub, "g0")).st_uid == NOBODY
    time.sleep(3)                                   # past the workers' idle time (1 s)
    seen = []
    for t in os.listdir(f"/proc/{c.proc.pid}/task"):
        try:
            with open(f"/proc/{c.proc.pid}/task/{t}/status") as f:
                groups = [ln for ln in f if ln.startswith("Groups:")][0].split()[1:]
        except (FileNotFoundError, IndexError):
            continue
        if "4242" in groups:
            seen.append(t)
    assert not seen, f"threads {seen} keep a caller's groups"


def test_search_permission_holds_for_names_the_kernel_has_cached(public_cache):
    """Why default_permissions stays: root has looked a name up (the kernel caches its dentry), inside a
    directory nobody may not search (0700); nobody may neither stat nor read it, though the file itself is
    0644. Without the kernel's check, a path walk over cached dentries reaches it without asking the daemon."""
    c = public_cache
    pub = pub_dir(c, mode=0o755)
    priv = os.path.join(pub, "private")
    os.mkdir(priv)
    with open(os.path.join(priv, "file"), "w") as f:
        f.write("root's")
    os.chmod(os.path.join(priv, "file"), 0o644)
    os.chmod(priv, 0o700)
    with open(c.path("pub", "private", "file")) as f:         # root: cached now
        assert f.read() == "root's"
    assert errno_of("os.stat(sys.argv[1])", c.path("pub", "private", "file")) == "EACCES"
    assert errno_of("open(sys.argv[1]).read()", c.path("pub", "private", "file")) == "EACCES"


def test_an_open_after_a_chmod_elsewhere_is_refused_within_attr_timeout(make_cache):
    """Another node took nobody's access away (chmod 600, chown, an ACL: here, behind the mount) while this
    kernel still caches the old attributes (fuse.attr_timeout 600 s): the kernel's own check lets nobody's open
    through, and the daemon, seeing a file changed within attr_timeout, asks the store as nobody, which refuses.
    Reads and writes, through the cache's path (writeback: no passthrough). An unchanged file opens as before."""
    c = make_cache(public=True, extra={"fuse.attr_timeout": "600s", "fuse.passthrough": "off"})
    c.format()
    c.mount()
    pub = pub_dir(c, mode=0o755)
    for name, mode, how in (("r", 0o644, os.O_RDONLY), ("w", 0o666, os.O_WRONLY), ("t", 0o6666,
                                                                                  os.O_WRONLY | os.O_TRUNC)):
        p = os.path.join(pub, name)
        with open(p, "wb") as f:
            f.write(b"x" * 4096)
        os.chmod(p, mode)
        m = c.path("pub", name)
        with open(m, "rb") as f:  # the kernel caches the open mode for 600 s
            f.read()
        os.stat(m)
        # allowed before (a truncate would drop the kernel's attributes: the check opens without it)
        assert errno_of("os.close(os.open(sys.argv[1], int(sys.argv[2])))", m, str(how & ~os.O_TRUNC)) == "ok"
        os.chmod(p, 0o600 | (mode & 0o6000))  # behind the mount: as another node would
        assert os.stat(m).st_mode & 0o7777 == mode  # what the kernel checks nobody's open against
        assert errno_of("os.close(os.open(sys.argv[1], int(sys.argv[2])))", m, str(how)) == "EACCES", name
        with open(p, "rb") as f:
            assert f.read() == b"x" * 4096, name  # nothing truncated by the refused open
        assert os.stat(p).st_mode & 0o7777 == 0o600 | (mode & 0o6000), name  # nor its set-ID bits killed
    with open(c.path("pub", "r"), "rb") as f:  # root: the store allows it
        assert f.read() == b"x" * 4096
