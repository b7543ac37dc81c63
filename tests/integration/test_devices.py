"""Cache devices by identity: loop devices renumbered between mounts are taken by their UUIDs (the listed names
hold other members now), and a device of another cache or a copy of a member is refused, naming it."""
import os
import shutil
import subprocess
import time

from blobs import digest, read_all, write_all
from conftest import CTL, MiB, renumber, sh, use_devices, wait_log
from rwload import Workload, excl_free


def every_byte_then_clean(c, w, blobs, check=True):
    """Every byte in the mount, then in the store after a flush; then unmounted, check finds nothing wrong."""
    read_all(c, blobs)
    w.check(c.mnt)
    c.flush()
    w.check(c.backing)
    read_all(c, blobs)
    assert c.unmount() == 0
    if check:
        r = sh(CTL, "check", "-c", c.conf, check=False)
        assert r.returncode == 0, r.stdout + r.stderr


def test_renumbered_devices_are_taken_by_identity(make_cache):
    c = make_cache(ndevs=3, extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(3 * MiB + i * 4099) for i in range(6)}
    write_all(c, blobs)
    assert c.unmount() == 0                         # all of it dirty, only on the devices

    renumber(c)
    r = sh(CTL, "check", "-c", c.conf, check=False)
    assert r.returncode == 0, r.stdout + r.stderr   # check takes them in member order too

    c.mount()
    read_all(c, blobs)
    log = c.log_text()
    for i, lo in enumerate(c.loops):
        # listed i-th, the name holds image i+1: member i+2 (1-based), the last one member 1
        member = (i + 1) % 3 + 1
        assert f"{lo} is member {member} of 3 of this cache (last found at {c.loops[member - 1]})" in log, log
    c.flush()
    for n, b in blobs.items():
        with open(os.path.join(c.backing, n), "rb") as f:
            assert f.read() == b, n
    assert c.unmount() == 0


def test_device_of_another_cache_is_left_alone(make_cache):
    """cache.devices naming another cache's member: it is only read, never taken or written; the cache's own
    member is found where the metadata says it was last found, and the other cache still mounts."""
    a = make_cache()
    b = make_cache(extra={"destage.on_unmount": "keep"})
    a.format()
    b.format()
    b.mount()
    blob = os.urandom(3 * MiB)
    write_all(b, {"x": blob})
    assert b.unmount() == 0                          # dirty, on b's devices only
    theirs = digest(b.images + b.meta)
    use_devices(a, a.loops[0], b.loops[1])
    a.mount()
    assert [d["path"] for d in a.stats()["devices"]] == a.loops, a.stats()["devices"]
    assert a.unmount() == 0
    log = a.log_text()
    assert f"cache.devices: {b.loops[1]} holds no member of this cache" in log, log
    assert digest(b.images + b.meta) == theirs
    b.mount()
    read_all(b, {"x": blob})
    assert b.unmount() == 0


def test_copy_of_a_member_is_refused(make_cache, tmp_path):
    c = make_cache()
    c.format()
    c.mount()
    write_all(c, {"x": os.urandom(MiB)})
    assert c.unmount() == 0
    # a copy of member 1 (dd of a failing disk, say) listed in place of member 2
    img = f"/dev/shm/{c.tag}-copy.img"
    shutil.copyfile(c.images[0], img)
    c.images.append(img)                            # removed by cleanup
    lo = sh("losetup", "--find", "--show", "--direct-io=on", img).stdout.strip()
    c.loops.append(lo)
    use_devices(c, c.loops[0], lo)
    p = c.mount(check=False)
    assert p.wait(timeout=30) != 0
    log = c.log_text()
    assert f"{c.loops[0]} and {lo} both carry the identity of member 1" in log, log
    r = sh(CTL, "check", "-c", c.conf, check=False)
    assert r.returncode != 0 and "both carry the identity of member 1" in r.stdout + r.stderr, r.stdout


def test_renumbered_with_one_device_gone(make_cache):
    """dirty_copies = 2: member 1 is gone and the two others come back under each other's names; the mount
    is degraded, the stand-in takes member 1's place, and every byte is read back from the second copies."""
    c = make_cache(ndevs=3, extra={"cache.dirty_copies": "2", "destage.on_unmount": "keep"})
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(2 * MiB + i * 4097) for i in range(5)}
    write_all(c, blobs)
    assert c.unmount() == 0
    for lo in c.loops:
        sh("losetup", "-d", lo)
    sh("losetup", "--direct-io=on", c.loops[0], c.images[2])
    sh("losetup", "--direct-io=on", c.loops[2], c.images[1])
    # c.loops[1] stays unattached: member 1 (images[0]) is gone
    c.mount()
    read_all(c, blobs)
    log = c.log_text()
    # the unattached name has no superblock; member 1 is found nowhere: a stand-in, fenced (never read, and
    # not one error per read), named by its UUID since its last name holds member 3 now
    assert f"cache.devices: {c.loops[1]} holds no member of this cache (no nvcachefs superblock)" in log, log
    assert "member 1 of 3 (UUID " in log and f"last found at {c.loops[0]}) is not found: mounting degraded" in log
    assert "at offset" not in log, log
    assert f"{c.loops[0]} is member 3 of 3 of this cache (last found at {c.loops[2]})" in log, log
    assert f"{c.loops[2]} is member 2 of 3 of this cache (last found at {c.loops[1]})" in log, log
    devs = c.stats()["devices"]                 # in member order, under the names they have now
    gone = devs[0]["path"]
    assert gone.startswith("UUID=") and gone in log, (gone, log)
    assert [(d["path"], d["state"]) for d in devs] == \
        [(gone, "missing"), (c.loops[2], "ok"), (c.loops[0], "ok")], devs
    text = c.ctl("stats", c.mnt).stdout
    assert f"device 0   {gone}  MISSING: gone or not this cache's at mount" in text, text
    text = c.ctl("status", "-r", c.mnt).stdout      # status -r says it too, with the mirrors
    assert f"device 0   {gone}  MISSING" in text and f"device 2   {c.loops[0]}  ok" in text, text
    assert f"mirror 1   {c.meta[1]}  ok" in text, text
    assert c.unmount() == 0


def lose(c, i):
    """Device i goes away under the mount: its image emptied, the loop device told."""
    os.truncate(c.images[i], 0)
    sh("losetup", "-c", c.loops[i])


def two_copies_under_load(make_cache):
    """dirty_copies = 2 on members loops[0] and loops[1] (loops[2] is the spare), 8 MiB of files written and a
    workload running."""
    c = make_cache(ndevs=3, extra={"cache.dirty_copies": "2", "destage.on_unmount": "keep"})
    use_devices(c, *c.loops[:2])
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(2 * MiB + i * 4097) for i in range(4)}
    write_all(c, blobs)
    w = Workload(c)
    w.start()
    w.wait_ops(200)
    return c, blobs, w


def lose_member1_after_kill9(c, blobs, w):
    """After a replace of member 2 by loops[2]: kill -9, then member 1 is gone too; everything comes from member 2,
    the new one, and then from the backing store."""
    c.kill9()
    use_devices(c, c.loops[0], c.loops[2])
    sh("losetup", "-d", c.loops[0])
    c.mount()
    assert "mounting degraded, from the second copies" in c.log_text()
    every_byte_then_clean(c, w, blobs, check=False)    # member 1 is gone: check would say so


def test_replace_failed_device_then_lose_the_other(make_cache):
    """dirty_copies = 2: member 2 fails under a workload and is replaced by a spare while the workload runs;
    then member 1 is lost too, after a kill -9, and nothing is lost."""
    c, blobs, w = two_copies_under_load(make_cache)
    # no request in flight while the device goes: between the image's truncation and the loop device
    # learning its new size, its reads return zeros without an error (a device that lies, which no cache
    # can tell from data); a failing device returns errors
    w.pause()
    lose(c, 1)
    w.resume()
    w.wait_ops(w.ops + 200)                          # served from the second copies meanwhile
    r = c.ctl("replace", c.mnt, c.loops[1], c.loops[2])
    assert f"device {c.loops[1]} replaced by {c.loops[2]}" in r.stdout, r.stdout
    w.wait_ops(w.ops + 400)                          # new dirty data: two copies again, one on the spare
    w.finish()
    st = c.stats()
    assert [(d["path"], d["state"]) for d in st["devices"]] == [(c.loops[0], "ok"), (c.loops[2], "ok")]
    assert st["devices"][1]["gauges"]["dirty_bytes"] > 0, st["devices"]
    read_all(c, blobs)
    lose_member1_after_kill9(c, blobs, w)
    log = c.log_text()
    assert f"replace: member 2 is now {c.loops[2]} (found by its UUID at the next mount; cache.devices need not " \
           f"change); {c.loops[1]} is a former member" in log, log


def test_replace_healthy_device_under_load_copies_it(make_cache):
    """dirty_copies = 2: a working member is replaced by a spare while a workload runs. Its blocks, dirty ones and
    second copies, are copied onto the spare, not destaged: the backing store has none of the dirty files after the
    replace. Then, after a kill -9, the *other* member is lost too, and every byte is there."""
    c, blobs, w = two_copies_under_load(make_cache)
    r = c.ctl("replace", c.mnt, c.loops[1], c.loops[2])
    assert f"device {c.loops[1]} replaced by {c.loops[2]}" in r.stdout, r.stdout
    w.wait_ops(w.ops + 200)
    w.finish()
    for n in blobs:                                  # copied, not destaged
        assert os.path.getsize(os.path.join(c.backing, n)) == 0, n
    st = c.stats()
    assert [(d["path"], d["state"]) for d in st["devices"]] == [(c.loops[0], "ok"), (c.loops[2], "ok")]
    assert st["devices"][1]["gauges"]["dirty_bytes"] >= sum(map(len, blobs.values())) // 2, st["devices"]
    lose_member1_after_kill9(c, blobs, w)


def test_replace_killed_midway_resumes(make_cache):
    """A kill -9 while the old device's blocks are copied onto the new one: the next mount (its configuration
    unchanged) has every byte and resumes the replace on its own, which finishes; the configuration still naming
    the old device mounts the new one, found by its UUID (the old one logged as a former member), and so does the
    configuration naming the new one."""
    c = make_cache(ndevs=3, extra={"destage.on_unmount": "keep", "cache.rebuild_max_rate": "16M"})
    use_devices(c, *c.loops[:2])
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(8 * MiB) for i in range(6)}
    write_all(c, blobs)                              # 24 MiB on member 2: 1.5 s of copying at 16M/s
    p = subprocess.Popen([CTL, "replace", c.mnt, c.loops[1], c.loops[2]], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 10
    while c.stats()["devices"][1]["state"] != "rebuilding" and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)
    st = c.stats()
    assert st["devices"][1]["state"] == "rebuilding", st["devices"]
    g = st["devices"][1]["gauges"]
    assert 0 < g["rebuild_left_bytes"] < g["rebuild_bytes"] <= 24 * MiB + 2 * MiB, g
    text = c.ctl("stats", c.mnt).stdout
    assert "REBUILDING onto its replacement (nvcachectl replace): " in text and "% copied" in text, text
    c.kill9()
    p.wait(timeout=30)
    assert p.returncode != 0
    c.mount()                                        # the configuration as it was
    read_all(c, blobs)
    wait_log(c, "replace: resuming the replace of member 2 (%s) by %s" % (c.loops[1], c.loops[2]))
    wait_log(c, f"replace: member 2 is now {c.loops[2]} (found by its UUID at the next mount; cache.devices need "
                f"not change); {c.loops[1]} is a former member")
    st = c.stats()
    assert [(d["path"], d["state"]) for d in st["devices"]] == [(c.loops[0], "ok"), (c.loops[2], "ok")]
    read_all(c, blobs)
    assert c.unmount() == 0
    c.mount()                                        # still naming the old device: members found by UUID
    assert [d["path"] for d in c.stats()["devices"]] == [c.loops[0], c.loops[2]], c.stats()["devices"]
    read_all(c, blobs)
    log = c.log_text()
    assert f"{c.loops[1]} is a former member of this cache (replaced or removed): not used" in log, log
    assert f"cache.devices is out of date: the members were found by their UUIDs; the line naming today's " \
           f"set is: devices = {c.loops[0]}, {c.loops[2]}" in log, log
    assert "resuming" not in log.split("former member of this cache")[-1]   # nothing left to resume
    assert c.unmount() == 0
    use_devices(c, c.loops[0], c.loops[2])
    c.mount()
    read_all(c, blobs)
    assert "out of date" not in c.log_text().split("cache open:")[-2], c.log_text()
    assert c.unmount() == 0


def test_replace_refuses_bad_new_devices(make_cache):
    c = make_cache(ndevs=4)
    use_devices(c, *c.loops[:2])
    c.format()
    c.mount()
    small = f"/dev/shm/{c.tag}-small.img"
    with open(small, "wb") as f:
        f.truncate(4 * MiB)
    c.images.append(small)
    lo_small = sh("losetup", "--find", "--show", small).stdout.strip()
    c.loops.append(lo_small)
    sh("mkfs.ext4", "-q", "-F", c.loops[3])
    cases = [
        (c.loops[1], c.loops[0], "is a device of this cache"),
        (c.loops[1], c.meta[0], "is a metadata mirror of this cache"),
        (c.loops[1], c.loops[3], f"{c.loops[3]} holds a ext4 signature"),
        (c.loops[1], lo_small, "is too small"),
        (c.loops[2], c.loops[3], "is not a device of this cache"),
    ]
    for old, new, why in cases:
        r = c.ctl("replace", c.mnt, old, new, check=False)
        assert r.returncode != 0 and why in r.stderr, (old, new, r.stderr)
    assert [d["state"] for d in c.stats()["devices"]] == ["ok", "ok"]
    assert c.unmount() == 0


def test_remove_under_load_then_pull_it(make_cache):
    """A device removed while a workload runs: emptied, never used again, let go (it can be pulled); after a
    kill -9 it is gone and the mount, with the same configuration, has every byte."""
    c = make_cache(ndevs=3, extra={"destage.on_unmount": "keep"})
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(3 * MiB + i * 4097) for i in range(4)}
    write_all(c, blobs)
    cap = c.stats()["capacity_bytes"]
    w = Workload(c)
    w.start()
    w.wait_ops(200)
    r = c.ctl("remove", c.mnt, c.loops[2])
    assert f"device {c.loops[2]} removed" in r.stdout, r.stdout
    w.wait_ops(w.ops + 400)
    w.finish()
    st = c.stats()
    assert [(d["path"], d["state"]) for d in st["devices"]][2] == (c.loops[2], "removed"), st["devices"]
    assert st["devices"][2]["gauges"]["used_bytes"] == 0
    assert st["capacity_bytes"] == cap * 2 // 3, (st["capacity_bytes"], cap)
    assert excl_free(c.loops[2])
    r = c.ctl("remove", c.mnt, c.loops[2], check=False)
    assert r.returncode != 0 and "any more (removed)" in r.stderr
    read_all(c, blobs)
    c.kill9()
    sh("losetup", "-d", c.loops[2])                  # pulled
    c.mount()                                        # cache.devices unchanged
    st = c.stats()
    assert [d["state"] for d in st["devices"]] == ["ok", "ok", "removed"], st["devices"]
    assert st["capacity_bytes"] == cap * 2 // 3
    read_all(c, blobs)
    w.check(c.mnt)
    c.flush()
    w.check(c.backing)
    assert c.unmount() == 0
    r = sh(CTL, "check", "-c", c.conf, check=False)
    assert r.returncode == 0 and "member 3: removed" in r.stdout, r.stdout + r.stderr


def test_remove_killed_midway_resumes(make_cache):
    """A kill -9 while a remove destages: the next mount, its configuration unchanged, has every byte and finishes
    the remove on its own."""
    c = make_cache(ndevs=3, extra={"destage.on_unmount": "keep", "destage.max_rate": "16M"})
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(8 * MiB) for i in range(6)}
    write_all(c, blobs)                              # 48 MiB dirty: three seconds of destage at 16M/s
    p = subprocess.Popen([CTL, "remove", c.mnt, c.loops[2]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.time() + 10
    while c.stats()["devices"][2]["state"] != "draining" and time.time() < deadline:
        time.sleep(0.02)
    assert c.stats()["devices"][2]["state"] == "draining"
    time.sleep(0.5)
    c.kill9()
    p.wait(timeout=30)
    assert p.returncode != 0
    c.mount()
    read_all(c, blobs)
    wait_log(c, f"remove: resuming the remove of member 3 ({c.loops[2]})")
    wait_log(c, f"remove: member 3 ({c.loops[2]}) is removed")
    st = c.stats()
    assert [d["state"] for d in st["devices"]] == ["ok", "ok", "removed"], st["devices"]
    assert excl_free(c.loops[2])
    read_all(c, blobs)
    assert c.unmount() == 0
    c.mount()
    assert "resuming" not in c.log_text().split("is removed")[-1]
    read_all(c, blobs)
    assert c.unmount() == 0


def test_remove_refusals(make_cache):
    c = make_cache(extra={"cache.dirty_copies": "2"})
    c.format()
    c.mount()
    r = c.ctl("remove", c.mnt, c.loops[1], check=False)
    assert r.returncode != 0 and "dirty_copies = 2 needs two working devices besides it" in r.stderr, r.stderr
    r = c.ctl("remove", c.mnt, c.meta[0], check=False)
    assert r.returncode != 0 and "is not a device of this cache" in r.stderr, r.stderr
    assert [d["state"] for d in c.stats()["devices"]] == ["ok", "ok"]
    assert c.unmount() == 0


def test_add_into_a_spare_place_under_load(make_cache):
    """A cache formatted with a spare place (cache.devices entry "spare") grows: a device added while a workload
    runs is used at once (new data lands on it, the capacity grows by a third); with no free place left, the next
    add makes a new member; after a kill -9 the configuration naming them in their places mounts with every
    byte."""
    c = make_cache(ndevs=4, extra={"destage.on_unmount": "keep"})
    use_devices(c, c.loops[0], c.loops[1], "spare")
    c.format()
    r = sh(CTL, "check", "-c", c.conf, check=False)
    assert r.returncode == 0 and "member 3: removed" in r.stdout, r.stdout + r.stderr
    c.mount()
    st = c.stats()
    assert [(d["path"], d["state"]) for d in st["devices"]] == [(c.loops[0], "ok"), (c.loops[1], "ok"),
                                                                 ("spare", "removed")], st["devices"]
    cap = st["capacity_bytes"]
    blobs = {f"f{i}": os.urandom(3 * MiB + i * 4097) for i in range(4)}
    write_all(c, blobs)
    w = Workload(c)
    w.start()
    w.wait_ops(200)
    r = c.ctl("add", c.mnt, c.loops[2])
    assert f"device {c.loops[2]} added" in r.stdout, r.stdout
    more = {f"g{i}": os.urandom(2 * MiB) for i in range(6)}
    write_all(c, more)                               # new blocks go to all three devices
    w.wait_ops(w.ops + 300)
    w.finish()
    st = c.stats()
    assert [(d["path"], d["state"]) for d in st["devices"]][2] == (c.loops[2], "ok"), st["devices"]
    assert st["devices"][2]["gauges"]["dirty_bytes"] >= 2 * MiB, st["devices"]
    assert st["capacity_bytes"] == cap * 3 // 2, (st["capacity_bytes"], cap)
    c.ctl("add", c.mnt, c.loops[3])                 # no free place: a fourth member
    assert [d["path"] for d in c.stats()["devices"]] == c.loops, c.stats()["devices"]
    assert c.stats()["capacity_bytes"] == cap * 2
    blobs.update(more)
    read_all(c, blobs)
    c.kill9()
    use_devices(c, *c.loops)
    c.mount()
    assert [d["state"] for d in c.stats()["devices"]] == ["ok"] * 4
    every_byte_then_clean(c, w, blobs)


def test_add_into_a_removed_place(make_cache):
    """A removed device's place takes a new device; the cache keeps serving every byte; a mount still naming the
    removed device there takes the new one by its UUID and leaves the removed one alone."""
    c = make_cache(ndevs=4, extra={"destage.on_unmount": "keep"})
    use_devices(c, *c.loops[:3])
    c.format()
    c.mount()
    blobs = {f"f{i}": os.urandom(2 * MiB + i * 4097) for i in range(4)}
    write_all(c, blobs)
    c.ctl("remove", c.mnt, c.loops[1])
    r = c.ctl("add", c.mnt, c.loops[3])
    assert f"device {c.loops[3]} added" in r.stdout, r.stdout
    st = c.stats()
    assert [(d["path"], d["state"]) for d in st["devices"]] == [(c.loops[0], "ok"), (c.loops[3], "ok"),
                                                                 (c.loops[2], "ok")], st["devices"]
    more = {f"g{i}": os.urandom(2 * MiB) for i in range(3)}
    write_all(c, more)
    assert c.stats()["devices"][1]["gauges"]["dirty_bytes"] > 0
    blobs.update(more)
    read_all(c, blobs)
    c.kill9()
    c.mount()                                        # still naming the removed device: members found by UUID
    assert [d["path"] for d in c.stats()["devices"]] == [c.loops[0], c.loops[3], c.loops[2]]
    read_all(c, blobs)
    assert f"{c.loops[1]} is a former member of this cache" in c.log_text()
    assert c.unmount() == 0
    use_devices(c, c.loops[0], c.loops[3], c.loops[2])
    c.mount()
    read_all(c, blobs)
    assert c.unmount() == 0


def place_bytes(size, bs=64 * 1024):
    """What a device of size bytes gives the cache: its slots after the superblock area (1 MiB)."""
    return (size - MiB) // bs * bs


def test_grow_past_the_formatted_places_under_load(make_cache):
    """A cache formatted with two devices and no spare place grows while a workload runs: a third device of the same
    size, then a fourth one half again as large, each used at once (new data lands on both, the capacity grows by
    what each holds); after a kill -9 and the loop devices renumbered, the configuration still naming the first two
    (by their old names) mounts all four, found by their UUIDs, with every byte, and check is clean."""
    c = make_cache(ndevs=4, extra={"destage.on_unmount": "keep", "cache.max_capacity": "1G"})
    sh("truncate", "-s", str(192 * MiB), c.images[3])
    sh("losetup", "-c", c.loops[3])
    use_devices(c, c.loops[0], c.loops[1])
    c.format()
    c.mount()
    cap = c.stats()["capacity_bytes"]
    assert cap == 2 * place_bytes(128 * MiB), cap
    blobs = {f"f{i}": os.urandom(3 * MiB + i * 4097) for i in range(4)}
    write_all(c, blobs)
    w = Workload(c)
    w.start()
    w.wait_ops(200)
    for lo in c.loops[2:]:
        r = c.ctl("add", c.mnt, lo)
        assert f"device {lo} added" in r.stdout, r.stdout
    assert f"add: {c.loops[3]} is member 4, in use now with 191.0 MiB" in c.log_text()
    more = {f"g{i}": os.urandom(2 * MiB) for i in range(8)}
    write_all(c, more)                               # new blocks spread over all four devices
    w.wait_ops(w.ops + 300)
    w.finish()
    st = c.stats()
    assert [(d["path"], d["state"]) for d in st["devices"]] == [(lo, "ok") for lo in c.loops], st["devices"]
    assert st["capacity_bytes"] == cap + place_bytes(128 * MiB) + place_bytes(192 * MiB), (st["capacity_bytes"], cap)
    for d in st["devices"][2:]:
        assert d["gauges"]["dirty_bytes"] >= 2 * MiB, st["devices"]
    blobs.update(more)
    read_all(c, blobs)
    c.kill9()
    renumber(c)                                      # the configuration still names two devices, renumbered
    c.mount()
    assert [d["state"] for d in c.stats()["devices"]] == ["ok"] * 4
    assert c.stats()["capacity_bytes"] == cap + place_bytes(128 * MiB) + place_bytes(192 * MiB)
    every_byte_then_clean(c, w, blobs)


def test_grown_member_replaced_removed_and_its_place_taken(make_cache):
    """A grown member is detached and attached again (by the name it was added with), replaced (its blocks copied
    onto the new device) and removed (drained under the mount) like any other, every byte kept, and its place then
    takes a new device that is large enough for it; one smaller than its place is refused."""
    c = make_cache(ndevs=5, extra={"destage.on_unmount": "keep"})
    sh("truncate", "-s", str(64 * MiB), c.images[3])
    sh("losetup", "-c", c.loops[3])
    use_devices(c, c.loops[0], c.loops[1])
    c.format()
    c.mount()
    c.ctl("add", c.mnt, c.loops[2])
    c.ctl("detach", c.mnt)
    assert [d["state"] for d in c.stats()["devices"]] == ["detached"] * 3
    c.ctl("attach", c.mnt)
    assert [(d["path"], d["state"]) for d in c.stats()["devices"]] == [(lo, "ok") for lo in c.loops[:3]]
    blobs = {f"f{i}": os.urandom(4 * MiB + i * 4097) for i in range(6)}
    write_all(c, blobs)
    used = c.stats()["devices"][2]["gauges"]["used_bytes"]
    assert used > 0
    c.ctl("replace", c.mnt, c.loops[2], c.loops[4])
    st = c.stats()
    assert (st["devices"][2]["path"], st["devices"][2]["gauges"]["used_bytes"]) == (c.loops[4], used), st["devices"]
    assert st["dirty_bytes"] > 0                     # copied, not destaged
    read_all(c, blobs)
    c.ctl("remove", c.mnt, c.loops[4])
    assert c.stats()["devices"][2]["state"] == "removed"
    read_all(c, blobs)
    r = c.ctl("add", c.mnt, c.loops[3], check=False)  # 64 MiB: the place holds 127 MiB
    assert r.returncode != 0 and "too small" in r.stderr, r.stderr
    sh("truncate", "-s", str(128 * MiB), c.images[3])
    sh("losetup", "-c", c.loops[3])
    c.ctl("add", c.mnt, c.loops[3])
    more = {f"g{i}": os.urandom(2 * MiB) for i in range(6)}
    write_all(c, more)
    assert c.stats()["devices"][2]["gauges"]["dirty_bytes"] > 0
    blobs.update(more)
    c.kill9()
    use_devices(c, c.loops[0], c.loops[1], c.loops[3])
    c.mount()
    read_all(c, blobs)
    assert c.unmount() == 0


def test_grow_refused_without_room(make_cache):
    """cache.max_capacity at format sets how far the cache can grow: formatted with no room past its two devices, add
    is refused saying so, and the cache goes on as it was."""
    c = make_cache(ndevs=3, extra={"cache.max_capacity": "254M"})
    use_devices(c, c.loops[0], c.loops[1])
    c.format()
    c.mount()
    r = c.ctl("add", c.mnt, c.loops[2], check=False)
    assert r.returncode != 0 and "the metadata mirrors have no room for more slots" in r.stderr, r.stderr
    assert "cache.max_capacity" in r.stderr
    st = c.stats()
    assert len(st["devices"]) == 2 and st["capacity_bytes"] == 2 * place_bytes(128 * MiB)
    write_all(c, {"a": b"x" * MiB})
    read_all(c, {"a": b"x" * MiB})
    assert c.unmount() == 0
