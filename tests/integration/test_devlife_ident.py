"""Device changes need no configuration edit: members are found by the UUIDs in their superblocks, the names
the metadata recorded where each was last found and the names cache.devices lists are only candidates, and the
current metadata header is the one meta_current picks (a header written while mirror 0 was away wins)."""
import contextlib
import os

from blobs import read_all, write_all
from conftest import CTL, MiB, renumber, sh


def loop_of(img):
    """The loop device an image is attached to now."""
    out = sh("losetup", "-j", img).stdout.strip()
    assert out, img
    return out.split(":")[0]


def paths_of(c):
    return [d["path"] for d in c.stats()["devices"]]


def test_replace_add_remove_detach_attach_with_names_changing(make_cache):
    """replace, add, remove, detach and attach, with the loop devices renumbered between the steps and
    cache.devices never edited (it names the two devices of the format): every mount finds the members by
    identity, every byte is there, and nothing is asked of the configuration."""
    c = make_cache(ndevs=5, extra={"destage.on_unmount": "keep"})
    conf = {**c.keys, "cache.devices": f"{c.loops[0]}, {c.loops[1]}"}
    c.write_conf(conf)
    img = c.images
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(2 * MiB + i * 4097) for i in range(4)}
    write_all(c, blobs)

    r = c.ctl("replace", c.mnt, loop_of(img[1]), loop_of(img[2]))
    assert "replaced by" in r.stdout, r.stdout
    assert c.unmount() == 0
    renumber(c)
    c.mount()                                        # members: images 0 and 2, under new names
    assert paths_of(c) == [loop_of(img[0]), loop_of(img[2])], (paths_of(c), c.log_text()[-2000:])
    read_all(c, blobs)
    assert "cache.devices is out of date" in c.log_text()
    r = sh(CTL, "devices", "-c", c.conf)             # mounted: where the daemon found them
    assert r.stdout == f"devices = {loop_of(img[0])}, {loop_of(img[2])}\n", r.stdout

    r = c.ctl("add", c.mnt, loop_of(img[3]))         # a third member (a grow)
    more = {f"g{i}": os.urandom(MiB + i) for i in range(3)}
    write_all(c, more)
    blobs.update(more)
    c.kill9()                                        # dirty data on three members
    renumber(c)
    c.mount()
    assert paths_of(c) == [loop_of(img[0]), loop_of(img[2]), loop_of(img[3])], c.log_text()[-2000:]
    read_all(c, blobs)

    c.ctl("remove", c.mnt, loop_of(img[2]))
    c.ctl("detach", c.mnt)
    assert c.unmount() == 0
    renumber(c)
    c.mount()                                        # detached: no device opened
    assert c.stats()["detached"] == 1
    read_all(c, blobs)
    renumber(c)                                      # the devices move while it is detached
    c.ctl("attach", c.mnt)
    st = c.stats()
    assert st["detached"] == 0
    assert [(d["path"], d["state"]) for d in st["devices"]][0] == (loop_of(img[0]), "ok"), st["devices"]
    assert [(d["path"], d["state"]) for d in st["devices"]][2] == (loop_of(img[3]), "ok"), st["devices"]
    assert st["devices"][1]["state"] == "removed", st["devices"]
    write_all(c, {"after": b"x" * 12345})
    blobs["after"] = b"x" * 12345
    read_all(c, blobs)
    assert c.unmount() == 0
    renumber(c)
    c.mount()
    read_all(c, blobs)
    c.flush()
    for n, b in blobs.items():
        with open(os.path.join(c.backing, n), "rb") as f:
            assert f.read() == b, n
    assert c.unmount() == 0
    r = sh(CTL, "check", "-c", c.conf, check=False)
    assert r.returncode == 0 and "no problems found" in r.stdout, r.stdout + r.stderr
    assert open(c.conf).read().count(f"{c.loops[0]}, {c.loops[1]}") == 1   # never edited
    renumber(c)
    r = sh(CTL, "devices", "-c", c.conf)             # unmounted: found as a mount finds them
    assert r.stdout == f"devices = {loop_of(img[0])}, spare, {loop_of(img[3])}\n", r.stdout


@contextlib.contextmanager
def mirror0_on_a_link(c, devices):
    """Mirror 0 on the last loop device, named by a link in /dev that can be taken away; the cache cleaned up
    and the link removed at the end."""
    link = f"/dev/{c.tag}-m0"
    os.symlink(c.loops[-1], link)
    c.write_conf({**c.keys, "cache.devices": ", ".join(devices), "cache.metadata": f"{link}, {c.meta[1]}"})
    try:
        yield link
    finally:
        c.cleanup()
        if os.path.lexists(link):
            os.unlink(link)


def test_replace_while_mirror0_is_away(make_cache):
    """A replace while metadata mirror 0 is missing is written into mirror 1 alone, which marks mirror 0
    stale; when mirror 0 comes back with its older header, the mount goes by mirror 1's (before, it ordered the
    devices by mirror 0's and refused the new member as a former one), rebuilds mirror 0, and check agrees."""
    c = make_cache(ndevs=4, extra={"destage.on_unmount": "keep"})
    with mirror0_on_a_link(c, c.loops[:2]) as link:
        c.format()
        c.mount()
        blobs = {f"f{i}": os.urandom(2 * MiB + i * 4097) for i in range(3)}
        write_all(c, blobs)
        assert c.unmount() == 0
        os.unlink(link)                              # mirror 0 is away
        c.mount()
        assert c.stats()["mirrors"][0]["state"] == "missing"
        c.ctl("replace", c.mnt, c.loops[1], c.loops[2])
        more = {"g": os.urandom(3 * MiB)}
        write_all(c, more)
        blobs.update(more)
        assert c.unmount() == 0
        os.symlink(c.loops[-1], link)                # back, with the header of before the replace
        c.write_conf({**c.keys, "cache.devices": f"{c.loops[0]}, {c.loops[2]}",
                      "cache.metadata": f"{link}, {c.meta[1]}"})   # as an administrator would have it
        c.mount()
        assert paths_of(c) == [c.loops[0], c.loops[2]], c.log_text()[-2000:]
        assert [m["state"] for m in c.stats()["mirrors"]] == ["rebuilt", "ok"]
        read_all(c, blobs)
        assert c.unmount() == 0
        r = sh(CTL, "check", "-c", c.conf, check=False)
        assert r.returncode == 0 and "no problems found" in r.stdout, r.stdout + r.stderr
        c.mount()
        assert [m["state"] for m in c.stats()["mirrors"]] == ["ok", "ok"]
        read_all(c, blobs)
        assert c.unmount() == 0


def test_stale_detached_mark_is_not_believed(make_cache):
    """Detached, then attached again while mirror 0 was away, with new dirty data: mirror 0 still says
    detached when it comes back, but it is stale; the mount attaches (before, either header saying detached
    was enough, and the dirty data was not served from the cache at all)."""
    c = make_cache(ndevs=3, extra={"destage.on_unmount": "keep"})
    with mirror0_on_a_link(c, c.loops[:2]) as link:
        c.format()
        c.mount()
        c.ctl("detach", c.mnt)
        assert c.unmount() == 0
        os.unlink(link)
        c.mount()
        c.ctl("attach", c.mnt)
        blobs = {f"f{i}": os.urandom(2 * MiB + i) for i in range(3)}
        write_all(c, blobs)
        assert c.stats()["dirty_bytes"] > 0
        assert c.unmount() == 0                      # dirty data kept on the devices
        os.symlink(c.loops[-1], link)
        c.mount()
        st = c.stats()
        assert st["detached"] == 0 and st["dirty_bytes"] > 0, (st["detached"], st["dirty_bytes"])
        read_all(c, blobs)
        assert c.unmount() == 0


def test_old_copy_of_a_gone_member_is_refused(make_cache):
    """A block-for-block copy of a member (a dd backup), taken before the last mount: when the member itself
    is gone, the copy is the only device with its UUID, and the scan finds it; the token every mount writes
    tells it from the member, and the mount is refused naming it (before: mounted on the copy, and served the
    bytes it held when it was copied)."""
    c = make_cache(extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    old = {"f": os.urandom(4 * MiB)}
    write_all(c, old)
    assert c.unmount() == 0
    copy = f"/dev/shm/{c.tag}-copy.img"
    sh("cp", "--sparse=always", c.images[1], copy)   # the backup
    c.images.append(copy)                            # removed by cleanup
    c.mount()                                        # a new token on each member
    new = {"f": os.urandom(4 * MiB)}
    write_all(c, new)
    assert c.unmount() == 0
    sh("losetup", "-d", c.loops[1])                  # member 2 is gone; its backup is on another device
    c.loops[1] = sh("losetup", "--find", "--show", "--direct-io=on", copy).stdout.strip()
    p = c.mount(check=False)
    assert p.wait(timeout=60) != 0
    log = c.log_text()
    assert f"{c.loops[1]} is an old copy of member 2 of 2" in log, log[-2000:]
    assert "not the one the last mount wrote" in log
