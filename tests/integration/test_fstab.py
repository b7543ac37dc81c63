"""Mounting from /etc/fstab as README documents it: systemd-fstab-generator's mount unit, and mount(8) running it."""
import os
import shutil
import subprocess
import time

import pytest

from conftest import DAEMON, MiB, mounted, sh

GENERATOR = "/usr/lib/systemd/system-generators/systemd-fstab-generator"


def daemons_of(conf):
    """Pids of daemons started with this configuration file (the fstab route forks them off mount(8))."""
    pids = []
    for p in os.listdir("/proc"):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if conf.encode() in args and args[0].endswith(b"nvcachefs"):
            pids.append(int(p))
    return pids


def unit_keys(text):
    keys = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            keys.setdefault(k, []).append(v)
    return keys


@pytest.mark.skipif(not os.path.exists(GENERATOR) or not shutil.which("systemd-analyze"),
                    reason="systemd is not installed (tools/quickstart.sh installs it)")
def test_fstab_entry_generates_a_mount_unit_that_mounts(make_cache):
    c = make_cache(ndevs=1)
    c.format()
    dev = c.loops[0]
    opts = (f"allow_other,x-systemd.requires={dev},x-systemd.requires-mounts-for={c.backing},"
            "x-systemd.mount-timeout=15min")
    fstab = os.path.join(c.tmp, "fstab")
    with open(fstab, "w") as f:
        f.write(f"{c.conf} {c.mnt} fuse.nvcachefs {opts} 0 0\n")
    gen = os.path.join(c.tmp, "generator")
    os.mkdir(gen)
    env = dict(os.environ, SYSTEMD_FSTAB=fstab, SYSTEMD_PROC_CMDLINE="")
    subprocess.run([GENERATOR, gen, gen, gen], check=True, env=env)
    name = sh("systemd-escape", "--path", "--suffix=mount", c.mnt).stdout.strip()
    with open(os.path.join(gen, name)) as f:
        keys = unit_keys(f.read())
    devunit = sh("systemd-escape", "--path", "--suffix=device", dev).stdout.strip()
    assert keys["What"] == [c.conf] and keys["Where"] == [c.mnt] and keys["Type"] == ["fuse.nvcachefs"], keys
    assert devunit in keys["Requires"] and devunit in keys["After"], keys
    assert keys["RequiresMountsFor"] == [c.backing] and keys["TimeoutSec"] == ["15min"], keys
    r = sh("systemd-analyze", "verify", "--man=no", os.path.join(gen, name), check=False)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr

    # what systemd runs for the unit: mount(8), which runs mount.fuse3, which runs "nvcachefs CONFIG MOUNTPOINT
    # -o ..." found in mount(8)'s own PATH: the build's daemon is put there in a mount namespace of this test
    bindir = os.path.join(c.tmp, "bin")
    os.mkdir(bindir)
    shutil.copy(DAEMON, bindir)
    data = os.urandom(3 * MiB + 17)
    src = os.path.join(c.tmp, "data")
    with open(src, "wb") as f:
        f.write(data)
    script = (f"mount --bind {bindir} /usr/local/sbin && "
              f"mount {keys['What'][0]} {keys['Where'][0]} -t {keys['Type'][0]} -o {keys['Options'][0]} && "
              f"grep -q ' {c.mnt} fuse.nvcachefs ' /proc/mounts && cp {src} {c.mnt}/f && umount {c.mnt}")
    try:
        r = sh("unshare", "-m", "--propagation", "private", "sh", "-ec", script, check=False, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not mounted(c.mnt)  # it was in the namespace only
        # umount returns at once; the daemon destages and exits
        deadline = time.time() + 60
        while daemons_of(c.conf) and time.time() < deadline:
            time.sleep(0.1)
        assert not daemons_of(c.conf)
        with open(os.path.join(c.backing, "f"), "rb") as f:
            assert f.read() == data
    finally:
        for pid in daemons_of(c.conf):
            os.kill(pid, 9)


def test_fstab_entry_names_a_daemon_outside_the_path(make_cache):
    """mount.fuse3 runs the type of `fuse.nvcachefs` as a command found in mount(8)'s PATH only (systemd's:
    /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin): a daemon installed elsewhere (meson install with
    another prefix) is "not found". The type `fuse` with the source `DAEMON#CONFIG`, as README says, names the
    daemon by its path."""
    c = make_cache(ndevs=1)
    c.format()
    env = dict(os.environ, PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    if shutil.which("nvcachefs", path=env["PATH"]):
        pytest.skip("nvcachefs is installed in the standard PATH")
    data = os.urandom(MiB + 5)
    src = os.path.join(c.tmp, "data")
    with open(src, "wb") as f:
        f.write(data)
    script = (f"! mount {c.conf} {c.mnt} -t fuse.nvcachefs -o allow_other 2>{c.tmp}/err && "
              f"grep -q 'not found' {c.tmp}/err && "
              f"mount '{DAEMON}#{c.conf}' {c.mnt} -t fuse -o allow_other && "
              f"grep -q ' {c.mnt} fuse.nvcachefs ' /proc/mounts && cp {src} {c.mnt}/f && umount {c.mnt}")
    try:
        r = sh("unshare", "-m", "--propagation", "private", "sh", "-ec", script, check=False, timeout=60,
               env=env)
        assert r.returncode == 0, r.stdout + r.stderr + open(os.path.join(c.tmp, "err")).read()
        deadline = time.time() + 60
        while daemons_of(c.conf) and time.time() < deadline:
            time.sleep(0.1)
        assert not daemons_of(c.conf)
        with open(os.path.join(c.backing, "f"), "rb") as f:
            assert f.read() == data
    finally:
        for pid in daemons_of(c.conf):
            os.kill(pid, 9)
