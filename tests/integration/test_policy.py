"""Policies by path through the real mount: each file in its policy's mode (stats and byte-for-byte compares),
a bypass file never in the cache, destage_after per file, eviction priority, SIGHUP reload, bad rules refused
with FILE:LINE."""
import json
import mmap
import os
import signal
import subprocess
import time

import pytest

from conftest import CTL, DAEMON, MiB
from test_stats import direct_read

BS = 64 * 1024


def direct_write(fd, data, off=0, chunk=MiB):
    """data (a multiple of 4K) at off through fd opened with O_DIRECT: every write reaches the daemon."""
    buf = mmap.mmap(-1, chunk)
    done = 0
    while done < len(data):
        part = data[done:done + chunk]
        buf[:len(part)] = part
        assert os.pwritev(fd, [memoryview(buf)[:len(part)]], off + done) == len(part)
        done += len(part)


def open_direct(path):
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)


def backing(c, name):
    with open(os.path.join(c.backing, name), "rb") as f:
        return f.read()


def with_rules(c, rules):
    """The cache's configuration file, with [policy] sections after its keys."""
    c.write_conf()
    with open(c.conf, "a") as f:
        f.write(rules)


def wait_for(cond, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


MODES = """
[policy scratch]
match = scratch/**
mode = bypass
[policy wt]
match = *.wt
mode = writethrough
[policy wa]
match = *.wa
mode = writearound
"""


def test_each_file_in_its_mode(make_cache):
    # the cache's own path for each mode, counted in its stats (passthrough: test_passthrough.py)
    c = make_cache(extra={"fuse.passthrough": "off"})
    with_rules(c, MODES)
    c.format()
    c.mount()
    os.mkdir(c.path("scratch"))
    data = {n: os.urandom(MiB) for n in ("a.wt", "b.wa", "c.wb", "scratch/d")}

    # writethrough: in the backing file before close, and cached clean
    fd = open_direct(c.path("a.wt"))
    direct_write(fd, data["a.wt"])
    assert backing(c, "a.wt") == data["a.wt"]
    st = c.stats()
    assert st["dirty_bytes"] == 0 and st["used_bytes"] == MiB
    os.close(fd)

    # writearound: in the backing file, not cached
    fd = open_direct(c.path("b.wa"))
    direct_write(fd, data["b.wa"])
    assert backing(c, "b.wa") == data["b.wa"]
    st2 = c.stats()
    assert st2["used_bytes"] == MiB and st2["dirty_bytes"] == 0
    assert st2["bypass_ops"] > st["bypass_ops"]
    os.close(fd)

    # writeback (no policy): dirty in the cache, not in the backing file
    fd = open_direct(c.path("c.wb"))
    direct_write(fd, data["c.wb"])
    os.close(fd)
    st3 = c.stats()
    assert st3["dirty_bytes"] == MiB and st3["used_bytes"] == 2 * MiB
    assert backing(c, "c.wb") != data["c.wb"]

    # bypass: reads and writes never occupy a slot; the data is the backing file's
    before = c.stats()
    fd = open_direct(c.path("scratch/d"))
    direct_write(fd, data["scratch/d"])
    for i in range(4):
        new = os.urandom(BS)
        direct_write(fd, new, off=i * 3 * BS)
        d = bytearray(data["scratch/d"])
        d[i * 3 * BS:(i + 1) * 3 * BS - 2 * BS] = new
        data["scratch/d"] = bytes(d)
        assert direct_read(c.path("scratch/d")) == data["scratch/d"]
        assert backing(c, "scratch/d") == data["scratch/d"]
    os.close(fd)
    after = c.stats()
    for k in ("used_bytes", "used_slots", "dirty_bytes", "dirty_slots"):
        assert after[k] == before[k], (k, before[k], after[k])
    assert after["fill_bytes"] == before["fill_bytes"]
    assert after["read_bypass_bytes"] - before["read_bypass_bytes"] == 4 * MiB
    assert after["backing_write_bytes"] - before["backing_write_bytes"] == MiB + 4 * BS

    # nvcachectl status names the policy each file got at its open
    st = json.loads(c.ctl("status", *[c.path(n) for n in data], "--json").stdout)
    got = {os.path.relpath(f["path"], c.mnt): f["policy"] for f in st["files"]}
    assert got == {"a.wt": "wt", "b.wa": "wa", "c.wb": "-", "scratch/d": "scratch"}, got

    # the rest reads back byte for byte, through the mount and after the flush in the store
    for n in ("a.wt", "b.wa", "c.wb"):
        assert direct_read(c.path(n)) == data[n]
    c.flush()
    for n, b in data.items():
        assert backing(c, n) == b
    assert c.unmount() == 0


def test_a_cached_file_that_becomes_bypass_is_destaged_and_dropped(make_cache):
    c = make_cache()
    c.format()
    c.mount()
    os.mkdir(c.path("scratch"))
    data = os.urandom(2 * MiB)
    fd = open_direct(c.path("scratch/f"))
    direct_write(fd, data)
    os.close(fd)
    assert c.stats()["dirty_bytes"] == 2 * MiB
    with_rules(c, MODES)
    c.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "reload: policies: 0 rules -> 3" in c.log_text())
    assert direct_read(c.path("scratch/f")) == data  # the open makes it bypass
    st = c.stats()
    assert st["dirty_bytes"] == 0 and st["used_bytes"] == 0, st
    assert backing(c, "scratch/f") == data
    assert c.unmount() == 0


def test_destage_after_destages_the_matching_file_only(make_cache):
    c = make_cache()  # destage.max_dirty_age = 0: never by age, idle_after off
    with_rules(c, "[policy quick]\nmatch = quick/**\ndestage_after = 300ms\n")
    c.format()
    c.mount()
    os.mkdir(c.path("quick"))
    os.mkdir(c.path("slow"))
    a, b = os.urandom(2 * MiB), os.urandom(2 * MiB)
    for name, d in (("slow/f", b), ("quick/f", a)):
        fd = open_direct(c.path(name))
        direct_write(fd, d)
        os.close(fd)
    assert c.stats()["dirty_bytes"] == 4 * MiB
    assert wait_for(lambda: c.stats()["dirty_bytes"] == 2 * MiB)
    assert backing(c, "quick/f") == a
    assert backing(c, "slow/f") != b
    time.sleep(1)  # and it stays so: nothing else destages slow/f
    assert c.stats()["dirty_bytes"] == 2 * MiB
    assert c.unmount() == 0
    assert backing(c, "slow/f") == b  # destage.on_unmount = flush


def test_low_priority_is_evicted_first_high_last(make_cache):
    c = make_cache(dev_size=8 * MiB + MiB // 2, extra={"cache.sequential_cutoff": "0"})
    with_rules(c, "[policy lo]\nmatch = *.low\npriority = low\n"
               "[policy hi]\nmatch = *.high\npriority = high\n")
    c.format()
    c.mount()
    cap = c.stats()["capacity_bytes"]
    size = cap // 4 // BS * BS
    files = {"a.low": os.urandom(size), "b.high": os.urandom(size)}
    for i in range(6):  # the working set: 1.5 times the cache, normal priority
        files[f"w{i}"] = os.urandom(size)
    for n, d in files.items():
        with open(os.path.join(c.backing, n), "wb") as f:
            f.write(d)
    # high, then low, then the working set: the high file is the least recently used of all
    for n in ["b.high", "a.low"] + [f"w{i}" for i in range(6)]:
        assert direct_read(c.path(n)) == files[n]
    s0 = c.stats()
    assert direct_read(c.path("b.high")) == files["b.high"]
    s1 = c.stats()
    assert s1["read_miss_bytes"] - s0["read_miss_bytes"] == 0  # all hits
    assert s1["read_hit_bytes"] - s0["read_hit_bytes"] == size
    assert direct_read(c.path("a.low")) == files["a.low"]
    s2 = c.stats()
    assert s2["read_hit_bytes"] - s1["read_hit_bytes"] == 0  # all gone
    assert s2["read_miss_bytes"] - s1["read_miss_bytes"] == size
    assert c.unmount() == 0


def test_sighup_changes_the_rules_for_the_next_open(make_cache):
    c = make_cache()
    c.format()
    c.mount()
    held = open_direct(c.path("held.log"))  # opened before the reload: keeps writeback
    with_rules(c, "[policy logs]\nmatch = *.log\nmode = writearound\n")
    c.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "reload: policies: 0 rules -> 1" in c.log_text())
    d1, d2 = os.urandom(MiB), os.urandom(MiB)
    direct_write(held, d1)
    os.close(held)
    st = c.stats()
    assert st["dirty_bytes"] == MiB
    fd = open_direct(c.path("new.log"))
    direct_write(fd, d2)
    os.close(fd)
    st2 = c.stats()
    assert st2["dirty_bytes"] == MiB and st2["used_bytes"] == st["used_bytes"]
    assert backing(c, "new.log") == d2
    # a reload with the same rules changes nothing
    c.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "reload: no tunable changed" in c.log_text())
    assert c.unmount() == 0
    assert backing(c, "held.log") == d1


BAD = [
    ("[policy a]\nmatch = x\ncolour = red\n", ":3: unknown key 'colour' in [policy a]"),
    ("[policy a]\nmatch = tmp**\n", ":2: '**' must be a whole path component"),
    ("[policy a]\nmatch = x\nmode = sometimes\n", ":3: mode: 'sometimes' is not one of"),
    ("[policy a]\nmatch = x\n[policy a]\nmatch = y\n", ":3: a second [policy a]"),
    ("[policy a]\nmode = bypass\n", ":1: [policy a] has no match key"),
]


@pytest.mark.parametrize("bad,msg", BAD)
def test_bad_rule_refused_with_file_and_line(make_cache, bad, msg):
    c = make_cache()
    c.format()
    good = open(c.conf).read()
    with open(c.conf, "w") as f:  # the bad lines first, so their numbers are known
        f.write(bad + good)
    for cmd in ([DAEMON, "-f", "-c", c.conf, c.mnt], [CTL, "format", "-c", c.conf]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert r.returncode != 0
        assert c.conf + msg in r.stderr, r.stderr


def test_help_lists_the_policy_keys():
    r = subprocess.run([DAEMON, "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for k in ("policy.match", "policy.mode", "policy.destage_after", "policy.priority", "policy.pin", "bypass"):
        assert k in r.stdout, k
