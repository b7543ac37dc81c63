"""Devices known by identity before anything is written to them: add, replace and replace-mirror refuse another
cache's member or mirror and any other name of a member; a replace resumed at mount writes only onto the device it
began on; members are named by any name (a symbolic link, UUID=); an unmount stops a running replace, which resumes
at the next mount."""
import os
import subprocess
import time

from blobs import in_store, read_all, write_all
from conftest import CTL, MiB, sh, use_devices, wait_log


def member_uuid(path):
    """The dev_uuid of the superblock at 4 KiB (cache/media/media.h struct sb_disk: at byte 80)."""
    with open(path, "rb") as f:
        f.seek(4096 + 80)
        u = f.read(16).hex()
    return f"{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:]}"


def refused(c, why, *args):
    r = c.ctl(*args, check=False)
    assert r.returncode != 0 and why in r.stderr, (args, r.stdout, r.stderr)


def test_another_caches_member_and_mirror_are_refused(make_cache):
    """B, unmounted, holds 8 MiB of dirty data; A refuses B's member (add, replace) and B's mirror (add,
    replace-mirror onto B's mirror device is no place either); B then mounts with every byte."""
    b = make_cache(extra={"destage.on_unmount": "keep"})
    b.format()
    b.mount()
    blobs = {f"f{i}": os.urandom(2 * MiB + i * 4097) for i in range(4)}
    write_all(b, blobs)
    assert b.unmount() == 0
    a = make_cache(extra={"cache.max_capacity": "1G"})
    a.format()
    a.mount()
    refused(a, "of another nvcachefs cache", "add", a.mnt, b.loops[1])
    refused(a, "of another nvcachefs cache", "replace", a.mnt, a.loops[1], b.loops[0])
    refused(a, "holds a metadata mirror of nvcachefs cache", "add", a.mnt, b.meta[0])
    assert [d["state"] for d in a.stats()["devices"]] == ["ok", "ok"]
    assert a.unmount() == 0
    b.mount()
    read_all(b, blobs)
    b.flush()
    in_store(b, blobs)
    assert b.unmount() == 0


def test_other_names_of_a_member_file_are_refused(make_cache):
    """Members are regular files: a hard link to one, a symbolic link to one, and a loop device over one are
    the same file, refused by add and replace whatever they are called."""
    c = make_cache(extra={"cache.max_capacity": "1G"})
    files = [os.path.join(c.tmp, f"dev{i}") for i in range(2)]
    for f in files:
        with open(f, "wb") as fh:
            fh.truncate(128 * MiB)
    use_devices(c, *files)
    c.format()
    c.mount()
    blobs = {"x": os.urandom(3 * MiB)}
    write_all(c, blobs)
    link = os.path.join(c.tmp, "hardlink")
    os.link(files[1], link)
    sym = os.path.join(c.tmp, "symlink")
    os.symlink(files[0], sym)
    lo = sh("losetup", "--find", "--show", "--direct-io=on", files[1]).stdout.strip()
    c.loops.append(lo)                              # detached by cleanup
    refused(c, "is a device of this cache (member 2", "add", c.mnt, link)
    refused(c, "is a device of this cache (member 1", "add", c.mnt, sym)
    refused(c, "is a device of this cache (member 2", "add", c.mnt, lo)
    refused(c, "is a device of this cache (member 2", "replace", c.mnt, files[0], link)
    refused(c, "is a metadata mirror of this cache", "add", c.mnt, c.meta[1])
    st = c.stats()
    assert [d["state"] for d in st["devices"]] == ["ok", "ok"], st["devices"]
    read_all(c, blobs)
    assert c.unmount() == 0


def unmount_during(c, p):
    """An unmount while nvcachectl (p) runs a device command: the daemon's exit status, how long the unmount
    took, and what the client printed."""
    t0 = time.time()
    sh("fusermount3", "-u", c.mnt)
    rc = c.proc.wait(timeout=60)
    took = time.time() - t0
    c.proc = None
    out, err = p.communicate(timeout=30)
    return rc, took, out, err


def capped_replace(make_cache, rate):
    """Member 2 holds 24 MiB of dirty data; its replace by loops[2], capped at rate, is running."""
    c = make_cache(ndevs=4, extra={"destage.on_unmount": "keep", "cache.rebuild_max_rate": rate})
    use_devices(c, *c.loops[:2])
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(8 * MiB) for i in range(6)}
    write_all(c, blobs)
    p = subprocess.Popen([CTL, "replace", c.mnt, c.loops[1], c.loops[2]], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 10
    while c.stats()["devices"][1]["state"] != "rebuilding" and time.time() < deadline:
        time.sleep(0.02)
    assert c.stats()["devices"][1]["state"] == "rebuilding", c.log_text()[-2000:]
    time.sleep(0.3)
    return c, blobs, p


def test_resume_onto_a_new_file_system_is_refused(make_cache):
    """kill -9 in a capped replace, then a new ext4 on the device it was copying onto: the next mount writes
    nothing there (fsck finds the file system clean), says why, and keeps the replace recorded (said again at
    the mount after); a replace onto another new device then finishes it."""
    c, blobs, p = capped_replace(make_cache, "16M")
    c.kill9()
    p.wait(timeout=30)
    sh("mkfs.ext4", "-q", "-F", c.loops[2])
    c.mount()                                       # the configuration as it was
    wait_log(c, f"replace: the replace of member 2 ({c.loops[1]}) is not resumed, and nothing was written to "
                f"{c.loops[2]}")
    read_all(c, blobs)
    assert c.unmount() == 0
    r = sh("fsck.ext4", "-n", "-f", c.loops[2], check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    n = c.log_text().count("is not resumed")
    c.mount("cache.rebuild_max_rate=0")
    deadline = time.time() + 20
    while c.log_text().count("is not resumed") == n and time.time() < deadline:
        time.sleep(0.05)
    assert c.log_text().count("is not resumed") == n + 1   # still recorded
    c.ctl("replace", c.mnt, c.loops[1], c.loops[3])
    assert [d["path"] for d in c.stats()["devices"]] == [c.loops[0], c.loops[3]]
    read_all(c, blobs)
    assert c.unmount() == 0
    assert sh("fsck.ext4", "-n", "-f", c.loops[2], check=False).returncode == 0


def test_unmount_stops_a_capped_replace(make_cache):
    """An unmount during a replace capped at 2 MiB/s (12 s of copying) returns within seconds; the client is told
    the replace stopped and resumes; the next mount resumes it to the end; every byte is there."""
    c, blobs, p = capped_replace(make_cache, "2M")
    rc, took, out, err = unmount_during(c, p)
    assert rc == 0 and took < 8, (rc, took, c.log_text()[-2000:])
    assert "stopped by the unmount; it resumes at the next mount" in err, (out, err)
    c.mount("cache.rebuild_max_rate=0")
    wait_log(c, f"replace: resuming the replace of member 2 ({c.loops[1]}) by {c.loops[2]}")
    wait_log(c, f"replace: member 2 is now {c.loops[2]}")
    assert [d["path"] for d in c.stats()["devices"]] == [c.loops[0], c.loops[2]]
    read_all(c, blobs)
    c.flush()
    in_store(c, blobs)
    assert c.unmount() == 0


def test_members_named_by_links_and_uuid(make_cache):
    """cache.devices names the devices through DIR/by-id links: replace, remove and add take those names (and
    another member's UUID=), every byte kept."""
    c = make_cache(ndevs=4, extra={"destage.on_unmount": "keep"})
    byid = os.path.join(c.tmp, "by-id")
    os.makedirs(byid)
    names = [os.path.join(byid, f"dimm-{i + 1}") for i in range(4)]
    for n, lo in zip(names, c.loops):
        os.symlink(lo, n)
    use_devices(c, *names[:2])
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(2 * MiB + i * 4097) for i in range(4)}
    write_all(c, blobs)
    r = c.ctl("replace", c.mnt, names[1], names[2])
    assert f"device {names[1]} replaced by {names[2]}" in r.stdout, r.stdout
    read_all(c, blobs)
    c.ctl("remove", c.mnt, "UUID=" + member_uuid(c.loops[2]))
    assert [d["state"] for d in c.stats()["devices"]] == ["ok", "removed"]
    refused(c, "any more (removed)", "remove", c.mnt, names[2])
    c.ctl("add", c.mnt, names[3])
    st = c.stats()
    assert [(d["path"], d["state"]) for d in st["devices"]] == [(names[0], "ok"), (names[3], "ok")], st["devices"]
    more = {"g": os.urandom(4 * MiB)}
    write_all(c, more)
    blobs.update(more)
    read_all(c, blobs)
    c.ctl("remove", c.mnt, os.path.relpath(names[0]))   # a relative name of the link
    assert [d["state"] for d in c.stats()["devices"]] == ["removed", "ok"]
    read_all(c, blobs)
    assert c.unmount() == 0
    use_devices(c, names[0], names[3])
    c.mount()
    read_all(c, blobs)
    c.flush()
    in_store(c, blobs)
    assert c.unmount() == 0


def test_unmount_stops_a_capped_remove(make_cache):
    """An unmount during a remove whose destage is capped at 4 MiB/s (12 s of it) returns within seconds, the client
    told; the next mount resumes the remove to the end, every byte kept."""
    c = make_cache(ndevs=3, extra={"destage.on_unmount": "keep", "destage.max_rate": "4M"})
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(6 * MiB) for i in range(8)}
    write_all(c, blobs)
    p = subprocess.Popen([CTL, "remove", c.mnt, c.loops[2]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.time() + 10
    while c.stats()["devices"][2]["state"] != "draining" and time.time() < deadline:
        time.sleep(0.02)
    assert c.stats()["devices"][2]["state"] == "draining"
    time.sleep(0.3)
    rc, took, out, err = unmount_during(c, p)
    assert rc == 0 and took < 6, (rc, took, c.log_text()[-2000:])
    assert "stopped by the unmount; it resumes at the next mount" in err, (out, err)
    c.mount("destage.max_rate=0")
    wait_log(c, f"remove: resuming the remove of member 3 ({c.loops[2]})")
    wait_log(c, f"remove: member 3 ({c.loops[2]}) is removed")
    assert [d["state"] for d in c.stats()["devices"]] == ["ok", "ok", "removed"]
    read_all(c, blobs)
    c.flush()
    in_store(c, blobs)
    assert c.unmount() == 0
