"""The daemon's own files on the store against a hostile local user (issue 24, findings 2, 4 and 5; issue 25,
finding 6): a keep-both conflict copy whose predictable name is swapped for a symlink while it is written, a
.nvcachefs-lost+found made by the user first, and identity-probe names taken by the user before a mount. Each
case runs the user's side as nobody against an allow_other mount run as root."""
import errno
import glob
import os
import stat
import subprocess

import pytest

NOBODY = 65534
LOST = ".nvcachefs-lost+found"
KiB, MiB = 1 << 10, 1 << 20
SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def as_nobody(code, *args):
    return subprocess.Popen([*SETPRIV, "/usr/bin/python3", "-c", code, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_nobody(code, *args, timeout=60):
    p = as_nobody(code, *args)
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, (out, err)
    return out


def look(path):
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), stat.S_IFMT(st.st_mode)


# nobody swaps every conflict copy that appears in its directory for a symlink to a victim, as fast as it can
SWAPPER = """
import os, stat, sys, time
d, victims, secs = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3])
swapped, deadline = 0, time.time() + secs
while time.time() < deadline:
    for n in os.listdir(d):
        if ".nvcachefs-conflict-" not in n or n.endswith(".lnk"):
            continue
        p = os.path.join(d, n)
        try:
            if not stat.S_ISREG(os.lstat(p).st_mode):
                continue
            os.symlink(victims[swapped % len(victims)], p + ".lnk")
            os.rename(p + ".lnk", p)
            swapped += 1
        except OSError:
            pass
print(swapped)
"""

# nobody makes conflicts: dirty data through the mount, the backing file changed behind the cache's back, then
# an open through the mount (the revalidation finds the conflict: keep-both writes the copy)
CONFLICTER = """
import os, sys, time
f, bk, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
rounds, deadline = 0, time.time() + secs
while time.time() < deadline:
    with open(f, "wb") as o:
        o.write(os.urandom(2 << 20))
    with open(bk, "r+b") as o:
        o.seek(0, 2)
        o.write(b"elsewhere %d" % rounds)
    os.close(os.open(f, os.O_RDONLY))
    rounds += 1
print(rounds)
"""


@pytest.fixture
def keep_both(make_cache):
    c = make_cache(public=True, extra={"backing.on_conflict": "keep-both"})
    c.format()
    c.mount()
    yield c
    if c.proc:
        c.unmount()


def test_symlink_over_conflict_copy_changes_no_owner(keep_both):
    """Finding 2: while keep-both writes a conflict copy in the user's directory, the user renames a symlink
    over its (predictable) name, in a loop for a few seconds. No file outside the copy may change owner or mode
    (before: root chowned and chmodded the symlink's target by name); every copy is the daemon's, 0600."""
    c = keep_both
    os.mkdir(c.path("d"))
    os.chown(c.path("d"), NOBODY, NOBODY)
    d = os.path.join(c.backing, "d")
    victims = [os.path.join(c.tmp, "victim"), os.path.join(c.backing, "rootfile")]
    for v in victims:
        with open(v, "wb") as f:
            f.write(b"root's file")
        os.chmod(v, 0o600)
    before = {v: look(v) for v in victims}
    run_nobody("import os; open(%r, 'wb').close()" % c.path("d", "f"))
    secs = 4
    swapper = as_nobody(SWAPPER, d, ",".join(victims), str(secs + 1))
    try:
        rounds = run_nobody(CONFLICTER, c.path("d", "f"), os.path.join(d, "f"), str(secs))
    finally:
        swapped, err = swapper.communicate(timeout=60)
    assert swapper.returncode == 0, err
    assert int(rounds) >= 3
    assert c.stats()["conflicts"] >= 3
    assert {v: look(v) for v in victims} == before, f"{swapped.strip()} swaps"
    copies = [n for n in os.listdir(d) if ".nvcachefs-conflict-" in n and not n.endswith(".lnk")]
    assert copies
    for n in copies:
        uid, gid, mode, fmt = look(os.path.join(d, n))
        assert fmt == stat.S_IFLNK or (uid, gid, mode, fmt) == (0, 0, 0o600, stat.S_IFREG), (n, uid, oct(mode))
    assert c.unmount() == 0


@pytest.fixture
def shared_root(make_cache):
    """A cache whose store root every user may write (sticky, as /tmp), and that keeps dirty data across a
    kill -9."""
    c = make_cache(public=True, extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    os.chmod(c.backing, 0o1777)
    yield c
    if c.proc:
        c.unmount()


IMPOSTORS = {
    "dir": "os.mkdir(p, 0o777); os.chmod(p, 0o777); open(p + '/mine', 'w').write('x')",
    "file": "open(p, 'w').write('not a directory')",
    "symlink": "os.mkdir(q, 0o777); os.chmod(q, 0o777); os.symlink(q, p)",
}


@pytest.mark.parametrize("kind", list(IMPOSTORS))
def test_user_made_lost_found_is_not_used(shared_root, kind):
    """Finding 4: nobody makes .nvcachefs-lost+found first (a directory of its own, a file, a symlink to a
    directory of its own). Salvaged data must still land, and only in the daemon's own directory (root's,
    0700), which nobody can neither list nor delete anything from (before: nobody's directory was used as it was; a file
    or a symlink there made every salvage fail)."""
    c = shared_root
    data = os.urandom(MiB + 5)
    with open(c.path("f"), "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    c.kill9()
    p, q = os.path.join(c.backing, LOST), os.path.join(c.backing, "elsewhere")
    run_nobody("import os\np, q = %r, %r\n%s" % (p, q, IMPOSTORS[kind]))
    os.unlink(os.path.join(c.backing, "f"))          # behind the cache's back: its dirty data is lost
    c.mount()
    log = c.log_text()
    assert look(p) == (0, 0, 0o700, stat.S_IFDIR), log[-3000:]
    names = os.listdir(p)
    assert len(names) == 1, (names, log[-3000:])
    with open(os.path.join(p, names[0]), "rb") as f:
        assert f.read() == data
    assert look(os.path.join(p, names[0]))[:3] == (0, 0, 0o600)
    st = c.stats()
    assert st["lost_found_files"] == 1 and st["dirty_bytes"] == 0
    if kind == "symlink":
        assert os.listdir(q) == []                    # nothing went through the link
    # the impostor is set aside, whole
    aside = glob.glob(p + ".impostor-*")
    assert len(aside) == 1, os.listdir(c.backing)
    assert look(aside[0])[0] == NOBODY
    if kind == "dir":
        assert os.listdir(aside[0]) == ["mine"]
    out = run_nobody("""
import errno, os, sys
p, name = sys.argv[1], sys.argv[2]
got = []
for fn in (lambda: os.listdir(p), lambda: os.unlink(os.path.join(p, name)), lambda: os.rmdir(p),
           lambda: open(os.path.join(p, name), "rb")):
    try:
        fn()
        got.append(0)
    except OSError as e:
        got.append(e.errno)
print(got)
""", p, names[0])
    listed, unlinked, removed, opened = eval(out)
    assert (listed, unlinked, opened) == (errno.EACCES,) * 3 and removed, out
    assert os.listdir(p) == names
    assert c.unmount() == 0


def test_probe_names_taken_by_a_user(shared_root):
    """Finding 5 and issue 25, finding 6: before a remount nobody makes directories named
    .nvcachefs-probe.<pid> for the daemon's coming pid and a few guesses after it. No data may go to lost+found
    and the clean data must stay valid (before: the probe failed, the stamp attribute was taken for unknown,
    and every stamped file for not found: its dirty data went to lost+found, its clean data was dropped)."""
    c = shared_root
    dirty, clean = os.urandom(MiB + 3), os.urandom(2 * MiB)
    with open(c.path("clean"), "wb") as f:
        f.write(clean)
    c.flush()
    with open(c.path("dirty"), "wb") as f:
        f.write(dirty)
        os.fsync(f.fileno())
    used = c.stats()["used_bytes"]
    assert used >= len(dirty) + len(clean)
    c.kill9()
    # the daemon execs in the shell's place: its pid is the shell's
    taker = ('for i in 0 1 2 3 4 5 6 7; do %s mkdir "$0/.nvcachefs-probe.$(($$ + i))"; done; exec "$@"'
             % " ".join(SETPRIV))
    c.mount(wrapper=("sh", "-c", taker, c.backing))
    log = c.log_text()
    assert os.path.isdir(os.path.join(c.backing, f".nvcachefs-probe.{c.proc.pid}"))
    assert not os.path.exists(os.path.join(c.backing, LOST)), log[-3000:]
    st = c.stats()
    assert st["lost_found_files"] == 0, log[-3000:]
    assert st["used_bytes"] == used, log[-3000:]          # the clean data is still valid
    assert st["dirty_bytes"] >= len(dirty)
    before = st["read_hit_bytes"]
    with open(c.path("clean"), "rb") as f:
        assert f.read() == clean
    assert c.stats()["read_hit_bytes"] - before >= len(clean)   # served from the cache
    c.flush()
    with open(os.path.join(c.backing, "dirty"), "rb") as f:
        assert f.read() == dirty
    # the daemon's probe files are gone; nobody's directories are left alone
    left = sorted(n for n in os.listdir(c.backing) if n.startswith(".nvcachefs-probe"))
    assert len(left) == 8 and all(look(os.path.join(c.backing, n))[0] == NOBODY for n in left), left
    assert c.unmount() == 0
