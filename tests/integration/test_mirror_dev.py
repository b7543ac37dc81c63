"""A metadata mirror on a block device that goes away: it stays missing (no file is created in its place
under /dev), the cache mounts degraded on the other mirror, loses nothing, says so in the log and the stats,
and takes the device back when it returns."""
import os
import random

from conftest import CTL, MiB, sh


def read_all(c, blobs):
    for n, b in blobs.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == b, n


def write_all(c, blobs):
    for n, b in blobs.items():
        with open(c.path(n), "wb") as f:
            f.write(b)


def test_missing_block_device_mirror_stays_missing(make_cache):
    c = make_cache(ndevs=3, extra={"destage.on_unmount": "keep"})
    # the mirror is named by a link in /dev, as /dev/disk/by-id names a disk: when the device goes, the
    # name goes with it (the loop device's own node would stay, and be handed to someone else)
    link = f"/dev/{c.tag}-mirror0"
    os.symlink(c.loops[2], link)
    try:
        keys = dict(c.keys)
        keys["cache.devices"] = ", ".join(c.loops[:2])
        keys["cache.metadata"] = link + ", " + c.meta[1]
        c.write_conf(keys)
        c.format()
        c.mount()
        blobs = {f"b{i}": os.urandom(random.randrange(1, 2 * MiB)) for i in range(3)}
        write_all(c, blobs)
        assert c.unmount() == 0                     # all of it dirty, only in the cache

        os.unlink(link)                             # the device is gone
        sh("losetup", "-d", c.loops[2])
        c.loops.pop(2)                              # detached: not ours to clean up
        c.mount()
        assert not os.path.lexists(link), "a file was created where the device was"
        log = c.log_text()
        assert f"metadata mirror {link} is missing" in log and "mounting degraded" in log, log
        read_all(c, blobs)
        st = c.stats()
        assert st["mirrors"][0] == {"index": 0, "path": link, "state": "missing"}, st["mirrors"]
        assert st["mirrors"][1] == {"index": 1, "path": c.meta[1], "state": "ok"}, st["mirrors"]
        text = c.ctl("stats", c.mnt).stdout
        assert f"mirror 0   {link}  MISSING" in text, text
        prom = c.ctl("stats", c.mnt, "--prometheus").stdout
        assert (f'nvcachefs_mirror_state{{mountpoint="{c.mnt}",mirror="0",path="{link}",state="missing"}} 1'
                in prom), prom
        assert (f'nvcachefs_mirror_state{{mountpoint="{c.mnt}",mirror="1",path="{c.meta[1]}",state="ok"}} 1'
                in prom), prom
        # degraded, it goes on: new files, a file removed, one rewritten
        more = {f"m{i}": os.urandom(random.randrange(1, MiB)) for i in range(2)}
        write_all(c, more)
        os.unlink(c.path("b0"))
        del blobs["b0"]
        blobs["b1"] = os.urandom(MiB // 2)
        write_all(c, {"b1": blobs["b1"]})
        blobs.update(more)
        read_all(c, blobs)
        assert c.unmount() == 0
        assert not os.path.lexists(link)

        c.mount()                                   # still missing: the same again, from one mirror
        assert not os.path.lexists(link)
        read_all(c, blobs)
        assert c.stats()["mirrors"][0]["state"] == "missing"
        assert c.unmount() == 0

        # the device comes back, perhaps as another loop device: the good mirror's header calls its old copy
        # stale, so it is rebuilt whole from the good one
        back = sh("losetup", "--find", "--show", "--direct-io=on", c.images[2]).stdout.strip()
        c.loops.append(back)
        os.symlink(back, link)
        c.mount()
        read_all(c, blobs)
        st = c.stats()
        assert [m["state"] for m in st["mirrors"]] == ["rebuilt", "ok"], st["mirrors"]
        assert "metadata mirror 0 was not valid (Stale file handle); rebuilt from mirror 1" in c.log_text()
        assert c.unmount() == 0
        c.mount()                                   # whole again: nothing to rebuild
        assert [m["state"] for m in c.stats()["mirrors"]] == ["ok", "ok"]
        read_all(c, blobs)
        assert c.unmount() == 0
        r = sh(CTL, "check", "-c", c.conf, check=False)
        assert r.returncode == 0 and "no problems found" in r.stdout, r.stdout + r.stderr
        c.mount()
        read_all(c, blobs)
        c.flush()
        assert c.unmount() == 0
        for n, b in blobs.items():
            with open(os.path.join(c.backing, n), "rb") as f:
                assert f.read() == b, n
        assert not os.path.exists(os.path.join(c.backing, "b0"))
    finally:
        c.cleanup()
        if os.path.lexists(link):                   # the link, or the file made in its place
            os.unlink(link)


def test_pmem_file_mirror_is_still_recreated(make_cache):
    """A mirror that is a file (not under /dev) and is lost is recreated and rebuilt, as before."""
    c = make_cache(extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    blobs = {f"p{i}": os.urandom(random.randrange(1, MiB)) for i in range(2)}
    write_all(c, blobs)
    assert c.unmount() == 0
    os.unlink(c.meta[0])
    c.mount()
    assert os.path.isfile(c.meta[0])
    read_all(c, blobs)
    assert c.stats()["mirrors"][0]["state"] == "rebuilt"
    assert c.unmount() == 0
