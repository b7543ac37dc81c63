"""Statistics through the real mount: known workloads, and figures that must add up in every output format."""
import grp
import json
import mmap
import os
import re
import shutil
import socket
import subprocess
import threading


from conftest import CTL, MiB, sh

BS = 64 * 1024


def direct_read(path, chunk=BS):
    """Read a whole file with O_DIRECT, chunk bytes per request, so that every read reaches the daemon."""
    buf = mmap.mmap(-1, chunk)
    out = bytearray()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        size = os.fstat(fd).st_size
        # up to the size, not to a short read: an O_DIRECT read at the end reaches the daemon too
        # (FOPEN_DIRECT_IO), and would be one request more
        while len(out) < size:
            n = os.readv(fd, [buf])
            out += buf[:n]
            if n < chunk:
                break
    finally:
        os.close(fd)
    return bytes(out)


def lat(st, name):
    return st["latency"][name]


def check_hist(h):
    """A histogram that is consistent in itself."""
    assert sum(h["hiccups"].values()) == h["count"], h
    if h["count"]:
        assert 0 < h["p50_us"] <= h["p90_us"] <= h["p99_us"] <= h["p99.9_us"] <= h["max_us"], h
        assert h["mean_us"] <= h["max_us"], h


def test_hit_ratio_and_bytes_add_up(make_cache):
    c = make_cache()
    data = os.urandom(4 * MiB)
    with open(os.path.join(c.backing, "f"), "wb") as f:      # on the backing store only
        f.write(data)
    c.format()
    c.mount()
    nreq = len(data) // BS

    assert direct_read(c.path("f")) == data                  # first pass: all misses
    st = c.stats()
    assert st["read_ops"] == nreq and st["read_miss_ops"] == nreq, st
    assert st["read_hit_ops"] == 0 and st["read_partial_ops"] == 0
    assert st["read_bytes"] == len(data) and st["read_miss_bytes"] == len(data) and st["read_hit_bytes"] == 0
    assert st["backing_read_bytes"] == len(data)
    assert st["fill_bytes"] == len(data)                     # kept for next time
    assert st["used_bytes"] == len(data)

    assert direct_read(c.path("f")) == data                  # second pass: all hits
    st = c.stats_json()["total"]
    k = st["counters"]
    assert k["read_ops"] == 2 * nreq and k["read_hit_ops"] == nreq and k["read_miss_ops"] == nreq
    assert k["read_hit_bytes"] == len(data) and k["read_miss_bytes"] == len(data)
    assert k["read_hit_bytes"] + k["read_miss_bytes"] == k["read_bytes"]
    assert k["backing_read_bytes"] == len(data)              # nothing more from backing
    assert st["derived"]["read_hit_ratio_ops"] == 0.5
    assert st["derived"]["read_hit_ratio_bytes"] == 0.5
    # the devices served exactly the hits, and hold exactly what is cached
    assert sum(d["counters"]["hit_bytes"] for d in st["devices"]) == len(data)
    assert sum(d["gauges"]["used_bytes"] for d in st["devices"]) == st["gauges"]["used_bytes"]
    text = c.ctl("stats", c.mnt).stdout
    assert "hit ratio 50.0% of operations, 50.0% of bytes" in text, text
    assert "4.0 MiB from cache + 4.0 MiB from backing = 8.0 MiB" in text, text


def test_dirty_rises_with_writes_and_falls_to_zero_after_flush(cache):
    c = cache
    payload = os.urandom(8 * MiB)
    with open(c.path("w"), "wb") as f:
        f.write(payload[:3 * MiB])
        f.flush()
        os.fsync(f.fileno())
        st1 = c.stats()
        f.write(payload[3 * MiB:])
        f.flush()
        os.fsync(f.fileno())
    st2 = c.stats()
    assert st1["dirty_bytes"] == 3 * MiB and st2["dirty_bytes"] == 8 * MiB, (st1, st2)
    assert st2["write_bytes"] == 8 * MiB and st2["destaged_bytes"] == 0
    assert sum(d["gauges"]["dirty_bytes"] for d in st2["devices"]) == 8 * MiB
    assert st2["dirty_slots"] == 8 * MiB // BS
    assert c.flush().stdout == ""                            # not a terminal: quiet
    st3 = c.stats()
    assert st3["dirty_bytes"] == 0 and st3["dirty_slots"] == 0
    assert st3["destaged_bytes"] == 8 * MiB
    assert st3["backing_write_bytes"] == 8 * MiB
    assert all(d["gauges"]["dirty_bytes"] == 0 for d in st3["devices"])
    assert lat(st3, "destage")["count"] >= 1 and lat(st3, "backing_fsync")["count"] >= 1
    with open(os.path.join(c.backing, "w"), "rb") as f:
        assert f.read() == payload
    text = c.ctl("stats", c.mnt).stdout
    assert re.search(r"^dirty +0 B \(0\.0%\)", text, re.M), text


def mixed_workload(c):
    os.mkdir(c.path("d"))
    for i in range(20):
        with open(c.path("d", f"f{i}"), "wb") as f:
            f.write(os.urandom(10000 + i))
            if i % 3 == 0:
                # an overwrite of pages the map already claims is a plain write, which fsync
                # must flush (first writes are FUA and need no flush)
                f.seek(0)
                f.write(os.urandom(4096))
                f.flush()
                os.fsync(f.fileno())
    os.listdir(c.path("d"))
    for i in range(20):
        os.stat(c.path("d", f"f{i}"))
        direct_read(c.path("d", f"f{i}"), chunk=8192)
    os.rename(c.path("d", "f0"), c.path("d", "g0"))
    os.unlink(c.path("d", "f1"))


def test_latency_counts_equal_operation_counts(cache):
    c = cache
    mixed_workload(c)
    st = c.stats()
    assert st["read_ops"] > 0 and st["write_ops"] > 0 and st["fsync_ops"] > 0 and st["meta_ops"] > 0
    assert lat(st, "read")["count"] == st["read_ops"]
    assert lat(st, "write")["count"] == st["write_ops"]
    # fsync and metadata are counted where they are timed, so compare with what the workload did:
    # 7 fsyncs; 20 creates, 20 stats, 20 opens, a mkdir, a listdir, a rename and an unlink at least
    assert lat(st, "fsync")["count"] == st["fsync_ops"] >= 7
    assert lat(st, "meta")["count"] == st["meta_ops"] >= 20 + 20 + 20 + 4
    for h in st["latency"].values():
        check_hist(h)
    for d in st["devices"]:
        k = d["counters"]
        assert d["latency"]["read"]["count"] == k["read_ops"]
        assert d["latency"]["write"]["count"] == k["write_ops"]
        assert d["latency"]["flush"]["count"] == k["flush_ops"]
        for h in d["latency"].values():
            check_hist(h)
    # fsync after the overwrites flushed the devices that took them
    assert sum(d["counters"]["flush_ops"] for d in st["devices"]) > 0
    text = c.ctl("stats", c.mnt).stdout
    for row in ("read", "write", "fsync", "meta", "dev0_read", "dev1_write"):
        assert re.search(rf"^{row} +\d+ ", text, re.M), text


class Writer(threading.Thread):
    """Writes and reads through the mount until stopped, so intervals have something in them."""

    def __init__(self, c):
        super().__init__(daemon=True)
        self.c, self.stop = c, threading.Event()

    def run(self):
        i = 0
        while not self.stop.is_set():
            with open(self.c.path("busy"), "wb") as f:
                f.write(os.urandom(64 * 1024))
            direct_read(self.c.path("busy"), chunk=4096)
            i += 1


def test_interval_differences_add_up_to_totals(cache):
    c = cache
    w = Writer(c)
    w.start()
    try:
        r = c.ctl("stats", c.mnt, "-i", "0.3", "--count", "5", "--json")
        t = c.ctl("stats", c.mnt, "-i", "0.3", "--count", "4")
    finally:
        w.stop.set()
        w.join()
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 5
    assert sum(x["interval"]["counters"]["write_ops"] for x in lines) > 0
    for prev, cur in zip(lines, lines[1:]):
        for k, v in cur["interval"]["counters"].items():
            assert cur["total"]["counters"][k] - prev["total"]["counters"][k] == v, k
        for k, h in cur["interval"]["latency"].items():
            assert cur["total"]["latency"][k]["count"] - prev["total"]["latency"][k]["count"] == h["count"], k
        for d, dv in enumerate(cur["interval"]["devices"]):
            for k, v in dv["counters"].items():
                assert cur["total"]["devices"][d]["counters"][k] - prev["total"]["devices"][d]["counters"][k] == v
        assert 0.25 < cur["interval_seconds"] < 5
    # the text form: interval reads and writes, then running totals
    rows = t.stdout.splitlines()
    assert rows[0].split()[:3] == ["time", "reads", "hit%"]
    rows = [x.split() for x in rows[1:]]
    assert len(rows) == 4
    bar = rows[0].index("|")
    for prev, cur in zip(rows, rows[1:]):
        assert int(cur[bar + 1]) - int(prev[bar + 1]) == int(cur[1])       # reads
        assert int(cur[bar + 3]) - int(prev[bar + 3]) == int(cur[4])       # writes


PROM_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
PROM_LABELS = r'\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(?:,|(?=\})))*\}'
PROM_SAMPLE = re.compile(rf"^({PROM_NAME})({PROM_LABELS})? (\S+)$")


def parse_prometheus(text):
    """A strict reader of the text exposition format: every sample belongs to a declared family of
    the right type, names and labels are well formed, values are numbers, and no series repeats."""
    types, helps, series, values = {}, {}, set(), {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_ = line[7:].partition(" ")
            assert re.fullmatch(PROM_NAME, name) and help_ and name not in helps, line
            helps[name] = help_
        elif line.startswith("# TYPE "):
            name, _, typ = line[7:].partition(" ")
            assert typ in ("counter", "gauge", "summary", "histogram", "untyped"), line
            assert name not in types, "family declared twice: " + line
            types[name] = typ
        else:
            m = PROM_SAMPLE.match(line)
            assert m, "malformed sample: " + line
            name, labels, value = m.group(1), m.group(2) or "", m.group(3)
            family = name
            for suffix in ("_sum", "_count"):
                if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "summary":
                    family = name[: -len(suffix)]
            assert family in types, "sample before its TYPE: " + line
            if types[family] == "counter":
                assert name.endswith("_total"), line
            if types[family] == "summary" and family == name:
                assert 'quantile="' in labels, line
            float(value)
            assert (name, labels) not in series, "repeated series: " + line
            series.add((name, labels))
            values[(name, labels)] = float(value)
    assert set(types) == set(helps)
    return types, values


def test_json_and_prometheus_carry_the_same_figures(cache):
    c = cache
    mixed_workload(c)
    c.flush()
    js = c.stats_json()                                       # parses
    prom = c.ctl("stats", c.mnt, "--prometheus").stdout
    js2 = c.stats_json()
    types, values = parse_prometheus(prom)
    m = f'{{mountpoint="{c.mnt}"}}'
    for k, v in js["total"]["counters"].items():
        assert types[f"nvcachefs_{k}_total"] == "counter"
        assert js["total"]["counters"][k] <= values[(f"nvcachefs_{k}_total", m)] <= js2["total"]["counters"][k], k
    assert values[("nvcachefs_dirty_bytes", m)] == 0
    assert values[("nvcachefs_capacity_bytes", m)] == js["total"]["gauges"]["capacity_bytes"]
    assert types["nvcachefs_latency_seconds"] == "summary"
    assert types["nvcachefs_destage_rate_bytes_per_second"] == "gauge"
    n = values[("nvcachefs_latency_seconds_count", f'{{mountpoint="{c.mnt}",op="write"}}')]
    assert n == js["total"]["latency"]["write"]["count"] > 0
    for i, lo in enumerate(c.loops):
        key = ("nvcachefs_device_write_bytes_total", f'{{mountpoint="{c.mnt}",device="{lo}"}}')
        assert values[key] >= js["total"]["devices"][i]["counters"]["write_bytes"] > 0
    promtool = shutil.which("promtool")
    if promtool:                                            # installed by .ci/run; the parser above runs anyway
        r = subprocess.run([promtool, "check", "metrics"], input=prom, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def test_reset_starts_counters_again(cache):
    c = cache
    mixed_workload(c)
    with open(c.path("dirty"), "wb") as f:
        f.write(os.urandom(MiB))
    before = c.stats()
    assert before["write_ops"] > 0 and lat(before, "write")["max_us"] > 0
    assert c.ctl("stats", c.mnt, "--reset").returncode == 0
    after = c.stats()
    assert after["read_ops"] == after["write_ops"] == after["fsync_ops"] == 0
    assert after["meta_ops"] <= 2                               # nvcachectl looks up the mount point
    assert lat(after, "write")["count"] == 0 and lat(after, "write")["max_us"] == 0
    assert after["dirty_bytes"] == before["dirty_bytes"] >= MiB     # gauges are not counters
    assert after["since_reset"] <= after["uptime"]
    direct_read(c.path("dirty"))
    assert c.stats()["read_bytes"] == MiB


def test_stats_latency_off_still_counts(make_cache):
    c = make_cache(extra={"stats.latency": "off"})
    c.format()
    c.mount()
    mixed_workload(c)
    js = c.stats_json()
    assert js["latency_measured"] is False and "latency" not in js["total"]
    assert js["total"]["counters"]["write_ops"] > 0
    assert "not measured (stats.latency = off)" in c.ctl("stats", c.mnt).stdout
    c.unmount()


def ctl_raw(c, line):
    path = c.ctl_socket()
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(line)
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                return out.decode()
            out += b


def test_an_older_or_newer_client_is_told_it_does_not_match(cache):
    for line in (b"stats\n", b"stats 1\n", b"stats 99\n", b"flush 1\n"):
        ans = ctl_raw(cache, line)
        assert ans.startswith("error version mismatch") and "nvcachectl that came with the daemon" in ans, ans
    assert ctl_raw(cache, b"version\n").startswith("nvcachefs ")


def as_nobody(*args):
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *args],
                          capture_output=True, text=True)


def test_only_the_owner_or_the_readers_group_reads_stats(make_cache):
    c = make_cache(public=True)
    c.format()
    c.mount()
    r = as_nobody(CTL, "stats", c.mnt)
    assert r.returncode != 0 and "permission denied" in r.stderr.lower(), r
    c.unmount()
    c.keys["stats.readers"] = "nogroup"
    c.write_conf()
    c.mount()
    r = as_nobody(CTL, "stats", c.mnt)
    assert r.returncode == 0 and "hit ratio" in r.stdout, r.stderr
    st = os.stat(c.ctl_socket())
    assert st.st_mode & 0o777 == 0o660 and st.st_gid == grp.getgrnam("nogroup").gr_gid
    for cmd in (["stats", c.mnt, "--reset"], ["flush", c.mnt]):
        r = as_nobody(CTL, *cmd)
        assert r.returncode != 0 and "only the daemon's owner" in r.stderr, r
    c.unmount()


def test_flush_shows_progress_on_a_terminal(make_cache):
    c = make_cache(extra={"destage.max_rate": "16M"})
    c.format()
    c.mount()
    with open(c.path("big"), "wb") as f:
        f.write(os.urandom(40 * MiB))
    r = subprocess.run(["script", "-qec", f"{CTL} flush {c.mnt}", "/dev/null"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"flush: [0-9.]+ MiB left, [0-9.]+ MiB/s, about \d+ s to go", r.stdout), r.stdout
    assert "flush: done, 40.0 MiB destaged" in r.stdout, r.stdout
    assert c.stats()["dirty_bytes"] == 0
    c.unmount()


def test_stats_right_after_mount_waits_for_the_socket(cache):
    """The kernel shows the mount a moment before the daemon listens: nvcachectl waits for it rather than
    saying that this is no nvcachefs mount (the socket is moved away and back to make the moment long)."""
    path = cache.ctl_socket()
    os.rename(path, path + ".away")
    try:
        p = subprocess.Popen([CTL, "stats", cache.mnt, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        threading.Event().wait(0.5)
    finally:
        os.rename(path + ".away", path)
    out, err = p.communicate(timeout=10)
    assert p.returncode == 0, err
    assert json.loads(out)["total"]["gauges"]["uptime"] >= 0
    # not a mount at all: told at once
    r = sh(CTL, "stats", "/tmp", check=False)
    assert r.returncode != 0 and "is not an nvcachefs mount" in r.stderr


def test_interval_after_a_reset_starts_from_zero(cache):
    c = cache
    mixed_workload(c)
    time_ = __import__("time")
    p = subprocess.Popen([CTL, "stats", c.mnt, "-i", "0.4", "--count", "4", "--json"], stdout=subprocess.PIPE,
                         text=True)
    time_.sleep(1.1)                      # the counters go back to zero between two intervals
    c.ctl("stats", c.mnt, "--reset")
    with open(c.path("after"), "wb") as f:
        f.write(b"z" * 8192)
    out, _ = p.communicate(timeout=20)
    lines = [json.loads(x) for x in out.splitlines()]
    assert len(lines) == 4
    for x in lines:
        for k, v in x["interval"]["counters"].items():
            assert 0 <= v <= x["total"]["counters"][k] or x["total"]["counters"][k] == 0 == v, (k, v)
