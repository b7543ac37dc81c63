#!/usr/bin/python3
"""tools/bench/suite.py: nvcachefs against the raw DIMMs, the backing store and the peers, in one run; writes a Markdown report and PNG plots."""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid

import ceiling
import memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NVC_BUILD", os.path.join(ROOT, "build"))
DAEMON = os.path.join(BUILD, "fs", "nvcachefs")
CTL = os.path.join(BUILD, "tools", "nvcachectl")
FLOOR_BIN = os.path.join(BUILD, "tools", "bench", "fuse-floor")
MiB, GiB = 1 << 20, 1 << 30
PEERS = ("rclone", "mergerfs", "bindfs", "ext4-dimm")
FLOOR = ceiling.FLOOR
DAEMONS = {"nvcachefs": "nvc_proc", "nvcachefs-small": "nvcs_proc", FLOOR: "floor_proc",
           "nvcachefs-pt": "nvcpt_proc", "nvcachefs-nopt": "nvcnopt_proc"}
PT_CELLS = (("passthrough: bypass 1M seqread buffered", ["--ioengine=psync", "--direct=0"]),
            ("passthrough: bypass 1M seqread O_DIRECT", ["--ioengine=psync", "--direct=1"]),
            ("passthrough: bypass 1M seqread O_DIRECT QD8", ["--ioengine=libaio", "--iodepth=8", "--direct=1"]),
            # a writeback file read once as a stream before the rounds: passed through at its next opens
            ("passthrough: streamed 1M seqread buffered", ["--ioengine=psync", "--direct=0"]))
PT_TARGETS = ("pt-store", "nvcachefs-pt", "nvcachefs-nopt")
MEM_GIB = (1, 8, 64)
# the targets: (workload, ratio of nvcachefs_ratios, at least)
TARGETS = [("4K randread QD1 (cached)", "of ceiling", 0.8), ("4K randread QD32 (cached)", "of ceiling", 0.8),
           ("4K randread QD32 (cached)", "vs raw", 0.35), ("4K randwrite QD1", "of ceiling", 0.8),
           ("4K randwrite QD32", "of ceiling", 0.8), ("4K randwrite QD32", "vs raw", 0.4),
           ("4K write + fdatasync (log)", "of ceiling", 0.8), ("1M checkpoint write", "of ceiling", 0.8),
           ("1M seqread (uncached)", "vs backing", 0.9), ("destage", "vs backing", 0.9),
           ("Iometer File Server", "vs backing", 1.0), ("Iometer Web Server", "vs backing", 1.0),
           ("metadata", "vs best FUSE peer", 3.0)]
BANDS = ("<1ms", "1ms", "2-10ms", "11-50ms", "51-100ms", ">100ms")
# read amplification of uncached data: pattern -> (fio options, at most backing bytes / bytes asked)
AMP_PATTERNS = (("random", lambda f: ["--rw=randread", "--bs=4k", f"--io_size={f // 4}"], 1.5),
                ("strided", lambda f: ["--rw=read:60k", "--bs=4k", f"--io_size={f // 16}"], 1.5),
                ("interleaved", lambda f: ["--rw=read", "--bs=64k", "--numjobs=4", f"--size={f // 4}",
                                           f"--offset_increment={f // 4}"], 1.2),
                ("sequential", lambda f: ["--rw=read", "--bs=1M"], 1.2))
PHASES = ("workloads", "uncached_read", "read_amp", "btest", "checkpoint", "metadata", "bonnie", "destage",
          "destage_scattered", "resources", "mem_per_gib", "passthrough")


def sh(*a, check=True, **kw):
    r = subprocess.run(list(a), capture_output=True, text=True, **kw)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(a)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def ensure_build():
    """Build what the suite runs (the daemon, nvcachectl, the FUSE floor): meson setup when the build directory
    has none, then ninja, which does nothing when it is up to date."""
    if not os.path.exists(os.path.join(BUILD, "build.ninja")):
        print(f"suite.py: meson setup {BUILD}", flush=True)
        r = subprocess.run(["meson", "setup", BUILD], cwd=ROOT, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"suite.py: meson setup {BUILD} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    targets = [os.path.relpath(x, BUILD) for x in (DAEMON, CTL, FLOOR_BIN)]
    r = subprocess.run(["ninja", "-C", BUILD] + targets, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"suite.py: ninja -C {BUILD} failed:\n{r.stdout[-3000:]}{r.stderr[-2000:]}")


def nvc_threads():
    """fuse.threads by default, as nvcachefs --help gives it: the floor runs as many."""
    m = re.search(r"fuse\.threads\s.*\[default: (\d+)\]", sh(DAEMON, "--help").stdout)
    return int(m.group(1)) if m else 16


def cpu_ticks(proc):
    """utime + stime of a process (all its threads, also those that ended), in clock ticks."""
    with open(f"/proc/{proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def mounted(p):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == p for line in f)


def wait_mounted(p, proc=None, timeout=30):
    t = time.time()
    while time.time() - t < timeout:
        if mounted(p):
            return time.time() - t
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.01)
    raise RuntimeError(f"{p} did not mount")


def band(ns):
    """btest's bands in whole milliseconds: <1ms 1ms 2-10ms 11-50ms 51-100ms >100ms."""
    ms = ns // 1000000
    return 0 if ms < 1 else 1 if ms < 2 else 2 if ms <= 10 else 3 if ms <= 50 else 4 if ms <= 100 else 5


def bands(vals):
    out = [0] * 6
    for v in vals:
        out[band(v)] += 1
    return out


# the write workloads that run past the small cache: the fio cells and the checkpoint
WRITES = ("4K randwrite QD1", "4K randwrite QD32", "4K write + fdatasync (log)", "Iometer File Server",
          "1M checkpoint write")


SCATTERED = "destage of scattered 4K pages"


ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"


class Transport:
    """fuse.transport of nvcachefs and the floor for one run (uring, dev; None: the daemons' default, auto).
    uring turns the fuse module's enable_uring on for the run and puts it back as it was."""

    def __init__(self, name):
        self.name, self.was = name, None

    def __enter__(self):
        if self.name == "uring":
            if not os.path.exists(ENABLE_URING):
                sys.exit("suite.py: --transport uring: this kernel has no FUSE over io_uring")
            with open(ENABLE_URING) as f:
                self.was = f.read().strip()
            with open(ENABLE_URING, "w") as f:
                f.write("Y")
        return self

    def __exit__(self, *exc):
        if self.was is not None:
            with open(ENABLE_URING, "w") as f:
                f.write(self.was)


TRANSPORT = None  # --transport


class Bench:
    def __init__(self, quick, out, only=None, writes=False):
        self.quick = quick
        self.writes = writes
        self.only = ("workloads", "checkpoint", "destage_scattered") if writes else only or PHASES
        self.secs = 2 if quick else 8
        self.ws = (256 if quick else 1024) * MiB          # working set of the random and read workloads
        self.dimm = (512 if quick else 2048) * MiB        # each of the two emulated DIMMs
        self.small = (64 if quick else 256) * MiB         # each DIMM of the small cache (destage under load)
        self.out = out
        self.tag = "nvc-bench-" + uuid.uuid4().hex[:6]
        self.dir = f"/var/tmp/{self.tag}"
        self.loops, self.images, self.procs, self.mounts = [], [], [], []
        self.results = {}        # (workload, target) -> dict or {"skip": reason}
        self.lat = {}            # target -> sorted latencies (ns) of 4K randread QD1
        self.notes = []
        self.rss = {}
        self.mem = []
        self.floor_threads = None

    # ------------------------------------------------------------ devices
    def loop(self, name, size, allocate=False):
        """A loop device over a /dev/shm image; allocate: an emulated DIMM, its memory allocated now.  A sparse image
        allocates a page at its first write (about 0.25 ms per MiB here), a cost no DIMM has: it fell on whichever
        target wrote a place first (nvcachefs's fresh slots in the checkpoint, not the raw DIMM written before)."""
        img = f"/dev/shm/{self.tag}-{name}.img"
        with open(img, "wb") as f:
            f.truncate(size)
            if allocate:
                os.posix_fallocate(f.fileno(), 0, size)
        self.images.append(img)
        for k in range(10):
            # another job on the machine may take or still hold the free device losetup found: try again
            r = sh("losetup", "--find", "--show", "--direct-io=on", img, check=k == 9)
            if not r.returncode:
                break
            time.sleep(0.5)
        dev = r.stdout.strip()
        self.loops.append(dev)
        return dev

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for m in reversed(self.mounts):
            if mounted(m):
                sh("umount", m, check=False)
                if mounted(m):
                    sh("umount", "-l", m, check=False)
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        for lo in self.loops:
            sh("losetup", "-d", lo, check=False)
        for f in self.images:
            if os.path.exists(f):
                os.unlink(f)
        for f in os.listdir("/dev/shm"):
            if f.startswith(self.tag):
                if os.path.isdir("/dev/shm/" + f):       # the passthrough phase's tmpfs store
                    shutil.rmtree("/dev/shm/" + f, ignore_errors=True)
                else:
                    os.unlink("/dev/shm/" + f)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------ targets
    def setup(self):
        os.makedirs(self.dir)
        self.backing = os.path.join(self.dir, "backing")
        os.makedirs(self.backing)
        self.dimms = [self.loop(f"dimm{i}", self.dimm, True) for i in range(2)]
        self.small_dimms = [self.loop(f"small{i}", self.small, True) for i in range(2)]
        # the physical limit: DIMMs of the same kind that nothing else uses
        self.raw_dimms = [self.loop(f"raw{i}", self.dimm, True) for i in range(2)]
        self.targets = {"raw": self.raw_dimms[0], "backing": os.path.join(self.backing, "plain")}
        os.makedirs(self.targets["backing"])
        self.targets["nvcachefs"] = self.mount_nvc("nvc", self.dimms, "nvcachefs")
        self.targets["nvcachefs-small"] = self.mount_nvc("nvcs", self.small_dimms, "small")
        if self.writes:
            del self.targets["raw"]
            return
        self.targets[FLOOR] = self.mount_floor()
        for peer in PEERS:
            try:
                self.targets[peer] = getattr(self, "mount_" + peer.replace("-", "_"))()
            except Exception as e:                       # shown in the report, never left out
                self.targets[peer] = None
                self.notes.append(f"{peer} could not run: {e}")

    def conf(self, name, devs, sub, extra="", backing=None):
        """A configuration; the backing directory is sub in the local backing dir, or backing."""
        backing = backing or os.path.join(self.backing, sub)
        os.makedirs(backing, exist_ok=True)
        path = os.path.join(self.dir, name + ".conf")
        with open(path, "w") as f:
            f.write(f"[cache]\ndevices = {', '.join(devs)}\n"
                    f"metadata = /dev/shm/{self.tag}-{name}-m0, /dev/shm/{self.tag}-{name}-m1\n"
                    f"[backing]\npath = {backing}\n"
                    + (f"[fuse]\ntransport = {TRANSPORT}\n" if TRANSPORT else "") + extra)
        return path

    def mount_nvc(self, name, devs, sub, extra="", backing=None, build=None):
        """Format and mount a cache; build: another build directory's daemon and nvcachectl."""
        daemon, ctl = (os.path.join(build, "fs", "nvcachefs"), os.path.join(build, "tools", "nvcachectl")) \
            if build else (DAEMON, CTL)
        conf = self.conf(name, devs, sub, extra, backing)
        sh(ctl, "format", "-c", conf, "--force")
        mnt = os.path.join(self.dir, name)
        os.makedirs(mnt, exist_ok=True)
        t0 = time.time()
        p = subprocess.Popen([daemon, "-f", "-c", conf, mnt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        self.mounts.append(mnt)
        wait_mounted(mnt, p)
        self.results[("mount time", name)] = {"secs": time.time() - t0}
        setattr(self, name + "_proc", p)
        setattr(self, name + "_conf", conf)
        return mnt

    def mount_floor(self):
        """The FUSE floor (tools/bench/floor.c): RAM reads, dropped writes, nvcachefs's loop and options."""
        m = os.path.join(self.dir, "floor")
        os.makedirs(m)
        self.floor_threads = nvc_threads()
        p = subprocess.Popen([FLOOR_BIN, "-f", "-t", str(self.floor_threads)]
                             + (["-T", TRANSPORT] if TRANSPORT else []) + [m], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.procs.append(p)
        self.mounts.append(m)
        wait_mounted(m, p)
        self.floor_proc = p
        return m

    def peer_dir(self, name):
        d = os.path.join(self.backing, name)
        os.makedirs(d, exist_ok=True)
        m = os.path.join(self.dir, "mnt-" + name)
        os.makedirs(m, exist_ok=True)
        return d, m

    def mount_rclone(self):
        if not shutil.which("rclone"):
            raise RuntimeError("rclone is not installed")
        d, m = self.peer_dir("rclone")
        dev = self.loop("rclone-cache", 2 * self.dimm)   # the same capacity as nvcachefs' two DIMMs
        sh("mkfs.ext4", "-q", "-F", dev)
        cache = os.path.join(self.dir, "rclone-cache")
        os.makedirs(cache)
        sh("mount", dev, cache)
        self.mounts.append(cache)
        p = subprocess.Popen(["rclone", "mount", d, m, "--vfs-cache-mode", "full", "--cache-dir", cache,
                              "--vfs-cache-max-size", str(2 * self.dimm * 9 // 10), "--config", "/dev/null"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        self.mounts.append(m)
        wait_mounted(m, p)
        return m

    def mount_mergerfs(self):
        if not shutil.which("mergerfs"):
            raise RuntimeError("mergerfs is not installed")
        d, m = self.peer_dir("mergerfs")
        sh("mergerfs", "-o", "allow_other,use_ino,cache.files=partial,dropcacheonclose=true", d, m)
        self.mounts.append(m)
        return m

    def mount_bindfs(self):
        if not shutil.which("bindfs"):
            raise RuntimeError("bindfs is not installed")
        d, m = self.peer_dir("bindfs")
        sh("bindfs", d, m)
        self.mounts.append(m)
        return m

    def mount_ext4_dimm(self):
        dev = self.loop("ext4", 2 * self.dimm)
        sh("mkfs.ext4", "-q", "-F", dev)
        m = os.path.join(self.dir, "ext4-dimm")
        os.makedirs(m)
        sh("mount", dev, m)
        self.mounts.append(m)
        return m

    # ------------------------------------------------------------ fio
    def fio(self, target, wl, args, size, lat_log=False, file="data", files=None):
        """One fio run; args are global options, shared by one job per file (default: the target's file)."""
        where = self.targets[target]
        if where is None:
            return {"skip": "not mounted (see notes)"}
        if files is None:
            files = [where if target == "raw" else os.path.join(where, file)]
        log = os.path.join(self.dir, "lat")
        cmd = ["fio", "--output-format=json", f"--size={size}", "--group_reporting"] + args
        if lat_log:
            cmd += [f"--write_lat_log={log}", "--log_avg_msec=0", "--per_job_logs=1"]
        for k, f in enumerate(files):
            cmd += [f"--name=j{k}", f"--filename={f}"]
        proc = getattr(self, DAEMONS[target], None) if target in DAEMONS else None
        ticks = cpu_ticks(proc) if proc else 0
        pace0 = self.pace_counters(target)
        r = sh(*cmd, check=False)
        ticks = cpu_ticks(proc) - ticks if proc else 0
        pace1 = self.pace_counters(target)
        if r.returncode:
            if target == "mergerfs" and "Invalid argument" in r.stderr:
                return {"skip": "O_DIRECT fails with EINVAL: mergerfs 2.33 (Debian 12) hands the backing file "
                                "an unaligned buffer (trapexit/mergerfs#950, fixed upstream by #1209)"}
            return {"skip": "fio failed: " + (r.stderr.strip().splitlines() or ["?"])[-1][:120]}
        j = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
        res = {"iops": 0, "bw": 0, "ops": 0, "bytes": 0}
        lat = None
        for d in ("read", "write"):
            x = j[d]
            if not x["io_bytes"]:
                continue
            res["iops"] += x["iops"]
            res["bw"] += x["bw_bytes"]
            res["ops"] += x["total_ios"]
            res["bytes"] += x["io_bytes"]
            c = x["clat_ns"]
            if lat is None or c["N"] > lat["N"]:
                lat = c
        if proc and res["ops"]:
            # the daemon's CPU across the cell, per request fio made and per GiB it moved
            res["cpu_s"] = ticks / os.sysconf("SC_CLK_TCK")
            res["cpu_us_per_op"] = res["cpu_s"] * 1e6 / res["ops"]
            res["cpu_s_per_gib"] = res["cpu_s"] / (res["bytes"] / GiB)
        if pace0 and pace1:
            res.update({k: pace1[k] - pace0[k] for k in pace1})
        if j["sync"]["lat_ns"]["N"]:
            res["sync_p99_us"] = j["sync"]["lat_ns"]["percentile"]["99.000000"] / 1e3
        if lat:
            p = lat.get("percentile", {})
            res.update(p50=p.get("50.000000", 0) / 1e3, p99=p.get("99.000000", 0) / 1e3,
                       p999=p.get("99.900000", 0) / 1e3, max=lat["max"] / 1e3)
        if lat_log:
            vals = self.lat_logs()
            res["bands"] = bands(vals)
            res["_lat"] = vals
        return res

    def pace_counters(self, target):
        """The small cache's writer pacing counters, or None (another target, or a daemon without them)."""
        if target != "nvcachefs-small":
            return None
        r = sh(CTL, "stats", self.targets[target], "--json", check=False)
        try:
            t = json.loads(r.stdout)["total"]
            c = {k: t["counters"][k] for k in ("throttled_ops", "space_wait_ops")}
            # written around the cache past destage.write_around (0 from a daemon without it)
            c["around_bytes"] = t["counters"].get("write_around_bytes", 0)
            c["held_us"] = t["latency"]["pace"]["mean_us"] * t["latency"]["pace"]["count"]
            return c
        except (ValueError, KeyError):
            return None

    def lat_logs(self):
        """Every completion latency (ns) in fio's latency logs, sorted; the logs are removed."""
        vals = []
        for f in os.listdir(self.dir):
            if f.startswith("lat_"):
                if f.startswith("lat_clat.") and f.endswith(".log"):
                    with open(os.path.join(self.dir, f)) as fh:
                        vals += [int(line.split(",")[1]) for line in fh if line.strip()]
                os.unlink(os.path.join(self.dir, f))
        vals.sort()
        return vals

    def drop_caches(self):
        sh("sync")
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")

    def prepare(self, target, size, file="data"):
        """Write the working set, then read it once, so that it is cached where the target caches."""
        where = self.targets[target]
        if where is None or target == "raw":
            return
        path = os.path.join(where, file)
        sh("fio", "--name=p", f"--filename={path}", f"--size={size}", "--rw=write", "--bs=1M", "--direct=1",
           "--ioengine=psync", check=False)
        sh("dd", f"if={path}", "of=/dev/null", "bs=1M", "iflag=direct", check=False)

    # ------------------------------------------------------------ workloads
    def run(self):
        t = self.targets
        all_t = list(t)
        cached = [x for x in all_t if x != "nvcachefs-small"]
        common = ["--time_based", f"--runtime={self.secs}", "--direct=1"]
        qd1 = ["--ioengine=psync"]
        qd32 = ["--ioengine=libaio", "--iodepth=32"]
        ws = self.ws
        for x in cached if "workloads" in self.only else ():
            self.prepare(x, ws)
        jobs = [
            ("4K randread QD1 (cached)", cached, qd1 + ["--rw=randread", "--bs=4k"], True),
            ("4K randread QD32 (cached)", cached, qd32 + ["--rw=randread", "--bs=4k"], False),
            ("4K randwrite QD1", all_t, qd1 + ["--rw=randwrite", "--bs=4k"], False),
            ("4K randwrite QD32", all_t, qd32 + ["--rw=randwrite", "--bs=4k"], False),
            ("4K write + fdatasync (log)", all_t, qd1 + ["--rw=write", "--bs=4k", "--fdatasync=1"], False),
            ("1M seqread (cached)", cached, qd1 + ["--rw=read", "--bs=1M"], False),
            ("Iometer File Server", all_t,
             ["--ioengine=libaio", "--iodepth=16", "--rw=randrw", "--rwmixread=80", "--percentage_random=75",
              "--bssplit=512/10:1k/5:2k/5:4k/60:8k/2:16k/4:32k/4:64k/10"], False),
            ("Iometer Web Server", cached,
             ["--ioengine=libaio", "--iodepth=16", "--rw=randread",
              "--bssplit=512/22:1k/15:2k/8:4k/23:8k/15:16k/2:32k/6:64k/7:128k/1:512k/1"], False),
        ]
        if self.writes:
            jobs = [j for j in jobs if j[0] in WRITES]
        for name, targets, args, lat in jobs if "workloads" in self.only else ():
            for x in all_t:
                if x not in targets:
                    self.results[(name, x)] = {"skip": "not this workload (the small cache is for writes)"}
                    continue
                r = self.fio(x, name, common + args, ws, lat_log=lat)
                if "_lat" in r:
                    self.lat[x] = r.pop("_lat")
                self.results[(name, x)] = r
            print(f"  {name}: done", flush=True)
        # a phase that fails (a daemon killed, a tool missing) is named in the report; the others still run
        for phase in (getattr(self, n) for n in PHASES[1:] if n in self.only):
            try:
                phase()
            except Exception as e:
                self.notes.append(f"{phase.__name__} failed: {e}")
                print(f"  {phase.__name__}: FAILED: {e}", flush=True)

    def uncached_read(self):
        name = "1M seqread (uncached)"
        size = self.ws
        for x, where in self.targets.items():
            if x == "nvcachefs-small":
                self.results[(name, x)] = {"skip": "not this workload"}
                continue
            if x == FLOOR:
                self.results[(name, x)] = {"skip": "RAM is no cold store: the ceiling here is the backing store"}
                continue
            if where is None:
                self.results[(name, x)] = {"skip": "not mounted (see notes)"}
                continue
            if x == "raw":
                self.drop_caches()
                self.results[(name, x)] = self.fio(x, name, ["--rw=read", "--bs=1M", "--direct=1"], size)
                continue
            # a file the target has never seen: written behind it, on its own store
            store = {"nvcachefs": os.path.join(self.backing, "nvcachefs"), "backing": where,
                     "ext4-dimm": where}.get(x, os.path.join(self.backing, x))
            with open(os.path.join(store, "cold"), "wb") as f:
                for _ in range(size // MiB):
                    f.write(os.urandom(MiB))
            self.drop_caches()
            self.results[(name, x)] = self.fio(x, name, ["--rw=read", "--bs=1M", "--direct=1"], size, file="cold")
        print("  uncached read: done", flush=True)

    def passthrough(self):
        """Sequential reads of a cold bypass file (policy mode = bypass) through nvcachefs with
        fuse.passthrough = auto and = off, each on its own cache and store directory, against the store itself;
        on the backing store's disk (the kernel's caches dropped before each cell) and on a tmpfs store (faster
        than FUSE: the transport's own cost shows)."""
        rules = ("passthrough = {}\n[policy streams]\nmatch = st-*\nmode = writeback\n"
                 "[policy all]\nmatch = **\nmode = bypass\n")
        size = 4 * self.ws
        block = os.urandom(MiB)
        for kind in ("disk", "tmpfs"):
            base = self.backing if kind == "disk" else f"/dev/shm/{self.tag}-pt"
            if kind == "tmpfs":
                # three files in RAM beside the DIMM images: at most 1 GiB each, and only with room to spare
                size = min(size, GiB)
                with open("/proc/meminfo") as f:
                    avail = int(re.search(r"MemAvailable:\s+(\d+) kB", f.read()).group(1)) * 1024
                if avail < 3 * size + 4 * GiB:
                    self.notes.append(f"passthrough on tmpfs skipped: {avail // MiB} MiB available, "
                                      f"{(3 * size + 4 * GiB) // MiB} MiB wanted")
                    break
            stores = {"pt-store": os.path.join(base, "plain-pt")}
            mounts = []
            for name, mode in (("pt", "auto"), ("nopt", "off")):
                devs = [self.loop(f"{name}{kind}{i}", 64 * MiB, True) for i in range(2)]
                stores["nvcachefs-" + name] = os.path.join(base, name + kind)
                self.targets["nvcachefs-" + name] = self.mount_nvc(
                    name + kind, devs, None, ("[fuse]\n" if not TRANSPORT else "") + rules.format(mode),
                    backing=stores["nvcachefs-" + name])
                setattr(self, f"nvc{name}_proc", getattr(self, f"{name}{kind}_proc"))
                mounts.append(self.targets["nvcachefs-" + name])
            os.makedirs(stores["pt-store"], exist_ok=True)
            self.targets["pt-store"] = stores["pt-store"]
            for x, store in stores.items():
                for fn in ("cold-pt", "st-cold"):
                    with open(os.path.join(store, fn), "wb") as f:
                        for k in range(size // MiB):
                            f.write(block[k % 4096:] + block[:k % 4096])
            for m in mounts:  # the stream the cache learns from, through the mount
                sh("dd", f"if={os.path.join(m, 'st-cold')}", "of=/dev/null", "bs=1M", "status=none")
            # three rounds, the targets' order rotated each round; each cell the median round
            for cell, args in PT_CELLS:
                name = f"{cell} ({kind})"
                fn = "st-cold" if "streamed" in cell else "cold-pt"
                runs = {x: [] for x in PT_TARGETS}
                for k in range(3):
                    for x in PT_TARGETS[k:] + PT_TARGETS[:k]:
                        self.drop_caches()
                        runs[x].append(self.fio(x, name, args + ["--rw=read", "--bs=1M"], size, file=fn))
                for x, rs in runs.items():
                    ok = sorted((r for r in rs if r.get("bw")), key=lambda r: r["bw"])
                    r = dict(ok[len(ok) // 2]) if ok else rs[0]
                    r["rounds_bw"] = [x_.get("bw", 0) for x_ in rs]
                    self.results[(name, x)] = r
            for x in PT_TARGETS:
                del self.targets[x]
            for m in mounts:
                sh("umount", m, check=False)
            if kind == "tmpfs":
                shutil.rmtree(base, ignore_errors=True)
        print("  passthrough: done", flush=True)

    def pt_md(self):
        """The passthrough section: MB/s, the ratios to the store and to passthrough off, daemon CPU."""
        cells = [f"{c} ({k})" for k in ("disk", "tmpfs") for c, _ in PT_CELLS]
        if not any((wl, "nvcachefs-pt") in self.results for wl in cells):
            return []
        md = ["## FUSE passthrough\n",
              f"A cold {4 * self.ws // MiB} MiB file (on tmpfs at most 1024 MiB) under a `mode = bypass` policy, read sequentially in 1 MiB "
              "reads (the streamed cell: a writeback file read once through the mount before the rounds, so "
              "that the cache took it for a stream past `cache.sequential_cutoff`): nvcachefs with `fuse.passthrough = auto` (the kernel reads the store itself), with "
              "`fuse.passthrough = off` (every read a FUSE READ the daemon serves from the store), and the store "
              "itself, in the same run; on the backing store's disk (the kernel's caches dropped before each cell) "
              "and on tmpfs (a store faster than FUSE). Three rounds, the targets' order rotated; each figure the "
              "median round (all rounds in results.json, `rounds_bw`). Daemon CPU: its user and system time over "
              "the median cell.\n",
              "| cell | store MB/s | passthrough MB/s | off MB/s | passthrough vs store | off vs store | "
              "passthrough vs off | daemon CPU s (passthrough / off) |", "|---|---|---|---|---|---|---|---|"]
        for wl in cells:
            b, p, o = (self.results.get((wl, x), {}) for x in PT_TARGETS)
            if not (b.get("bw") and p.get("bw") and o.get("bw")):
                md.append(f"| {wl} | {b.get('skip', '')} | {p.get('skip', '')} | {o.get('skip', '')} | | | | |")
                continue
            md.append(f"| {wl[len('passthrough: '):]} | {b['bw'] / 1e6:.0f} | {p['bw'] / 1e6:.0f} | "
                      f"{o['bw'] / 1e6:.0f} | {p['bw'] / b['bw']:.2f}x | {o['bw'] / b['bw']:.2f}x | "
                      f"{p['bw'] / o['bw']:.2f}x | {p.get('cpu_s', 0):.2f} / {o.get('cpu_s', 0):.2f} |")
        md.append("")
        return md

    def nvc_counters(self):
        j = json.loads(sh(CTL, "stats", self.targets["nvcachefs"], "--json").stdout)
        return j["total"]["counters"]

    def read_amp(self):
        """Read amplification of uncached data: bytes nvcachefs read from the backing store over the
        bytes fio asked, for random, strided, interleaved and sequential reads, O_DIRECT and buffered, each of a
        file written behind the cache; the same fio job on the backing store itself for the MB/s ratio."""
        size = self.ws // 4
        for pattern, opts, _ in AMP_PATTERNS:
            for direct in (1, 0):
                name = f"read amplification: {pattern} {'direct' if direct else 'buffered'}"
                for x in ("nvcachefs", "backing"):
                    where = self.targets.get(x)
                    if where is None:
                        self.results[(name, x)] = {"skip": "not mounted (see notes)"}
                        continue
                    store = self.store_of(x) if x == "nvcachefs" else where
                    fname = f"amp-{pattern}-{direct}"
                    with open(os.path.join(store, fname), "wb") as f:
                        for _ in range(size // MiB):
                            f.write(os.urandom(MiB))
                    self.drop_caches()
                    before = self.nvc_counters() if x == "nvcachefs" else None
                    r = self.fio(x, name, ["--ioengine=psync", f"--direct={direct}"] + opts(size), size, file=fname)
                    if x == "nvcachefs" and "skip" not in r:
                        after = self.nvc_counters()
                        r["backing_bytes"] = after["backing_read_bytes"] - before["backing_read_bytes"]
                        r["fuse_bytes"] = after["read_bytes"] - before["read_bytes"]
                        r["amplification"] = r["backing_bytes"] / r["bytes"] if r["bytes"] else None
                    self.results[(name, x)] = r
        print("  read amplification: done", flush=True)

    def amp_md(self):
        """The read amplification section: backing bytes over bytes asked, and MB/s against the backing store."""
        md = ["## Read amplification of uncached data\n",
              "Each cell reads a file of " f"{self.ws // 4 // MiB} MiB written behind the cache (the kernel's caches "
              "dropped first): random 4 KiB reads of a quarter of it; 4 KiB of every 64 KiB (strided); four jobs, each "
              "its own quarter in 64 KiB reads (interleaved); 1 MiB reads of all of it (sequential). Asked: the bytes "
              "fio read; FUSE: the bytes the kernel asked nvcachefs for (`read_bytes`: buffered, its readahead "
              "too); backing: nvcachefs's `backing_read_bytes` over the cell; amplification = backing / asked "
              "(target: at most 1.5x random and strided, 1.2x interleaved and sequential). MB/s vs backing: the same "
              "fio job on the backing store itself, in the same run.\n",
              "| pattern | asked MiB | FUSE MiB | backing MiB | amplification | target | met | nvcachefs MB/s | "
              "backing MB/s | vs backing |", "|---|---|---|---|---|---|---|---|---|---|"]
        for pattern, _, most in AMP_PATTERNS:
            for direct in (1, 0):
                name = f"read amplification: {pattern} {'direct' if direct else 'buffered'}"
                r, b = self.results.get((name, "nvcachefs"), {}), self.results.get((name, "backing"), {})
                label = f"{pattern}, {'O_DIRECT' if direct else 'buffered'}"
                if "amplification" not in r or r["amplification"] is None:
                    md.append(f"| {label} | {r.get('skip', '-')} | | | | | | | | |")
                    continue
                a = r["amplification"]
                vs = f"{r['bw'] / b['bw']:.2f}x" if b.get("bw") else "-"
                md.append(f"| {label} | {r['bytes'] / MiB:.1f} | {r['fuse_bytes'] / MiB:.1f} | "
                          f"{r['backing_bytes'] / MiB:.1f} | {a:.2f}x | "
                          f"≤ {most:.1f}x | {'yes' if a <= most else 'NO'} | {r['bw'] / 1e6:.1f} | "
                          f"{b.get('bw', 0) / 1e6:.1f} | {vs} |")
        md.append("")
        return md

    def btest(self):
        """One thread per device, 4 KiB random reads and writes, every latency counted in btest's bands."""
        name = "btest 4K, one thread per device"
        common = ["--time_based", f"--runtime={self.secs}", "--direct=1", "--ioengine=psync", "--rw=randrw",
                  "--bs=4k", "--numjobs=2"]
        for x in self.targets:
            if x == "nvcachefs-small":
                self.results[(name, x)] = {"skip": "not this workload"}
                continue
            if x == "raw":
                # each job its own DIMM
                r = self.fio(x, name, common[:-1], 256 * MiB, lat_log=True, files=self.raw_dimms)
                r.pop("_lat", None)
            else:
                r = self.fio(x, name, common, 64 * MiB, lat_log=True, file="btest")
                r.pop("_lat", None)
            self.results[(name, x)] = r
        print("  btest: done", flush=True)

    def store_of(self, x):
        return {"nvcachefs": os.path.join(self.backing, "nvcachefs"),
                "nvcachefs-small": os.path.join(self.backing, "small")}.get(x, os.path.join(self.backing, x))

    def checkpoint(self):
        """1 MiB sequential writes of a checkpoint several times the small cache's high watermark, and the time
        until the backing store holds all of it."""
        name = "1M checkpoint write"
        size = 3 * (2 * self.small * 80 // 100)
        size -= size % MiB
        for x, where in self.targets.items():
            if where is None:
                self.results[(name, x)] = {"skip": "not mounted (see notes)"}
                continue
            t0 = time.time()
            r = self.fio(x, name, ["--rw=write", "--bs=1M", "--direct=1", "--ioengine=psync"], size, file="ckpt")
            if "skip" in r:
                self.results[(name, x)] = r
                continue
            t1 = time.time()
            if x in ("nvcachefs", "nvcachefs-small"):
                sh(CTL, "flush", where)
            elif x == "raw":
                sh("blockdev", "--flushbufs", where)
            elif x == "rclone":
                # rclone uploads a closed file from its cache after --vfs-write-back (5 s)
                dst = os.path.join(self.store_of(x), "ckpt")
                deadline = time.time() + 600
                while time.time() < deadline:
                    if os.path.exists(dst) and os.path.getsize(dst) == size:
                        break
                    time.sleep(0.1)
            sh("sync")
            r["write_secs"] = t1 - t0
            r["durable_secs"] = time.time() - t0
            r["bytes"] = size
            self.results[(name, x)] = r
        print("  checkpoint: done", flush=True)

    def metadata(self):
        """mdtest-like: create, stat and unlink N small files, one directory."""
        name = "metadata"
        n = 3000 if self.quick else 100000
        for x, where in self.targets.items():
            if x == "raw":
                self.results[(name, x)] = {"skip": "a block device has no files"}
                continue
            if where is None or x == "nvcachefs-small":
                self.results[(name, x)] = {"skip": "not mounted (see notes)" if where is None else "not this workload"}
                continue
            try:
                # the backing disk's ext4 has no journal: it skips inodes freed in the last ~30 s when it hands
                # out new ones, so each target's unlinks would slow the next one's creates (sync + drop evens it)
                self.drop_caches()
                self.results[(name, x)] = self.md_one(where, n)
            except OSError as e:
                self.results[(name, x)] = {"skip": f"failed: {e.strerror} after some files"}
        print("  metadata: done", flush=True)

    def md_one(self, where, n):
        """Create (with 4 KiB of data), stat and unlink n small files in one directory; operations per second."""
        d = os.path.join(where, "md")
        os.makedirs(d, exist_ok=True)
        names = [os.path.join(d, f"f{i:06d}") for i in range(n)]
        res = {"files": n}
        t0 = time.time()
        small = b"x" * 4096
        for p in names:
            fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
            os.write(fd, small)
            os.close(fd)
        res["create"] = n / (time.time() - t0)
        t0 = time.time()
        for p in names:
            os.stat(p)
        res["stat"] = n / (time.time() - t0)
        t0 = time.time()
        for p in names:
            os.unlink(p)
        res["unlink"] = n / (time.time() - t0)
        res["iops"] = res["create"]
        return res

    def bonnie(self):
        name = "bonnie++"
        for x, where in self.targets.items():
            # room for bonnie++'s files: the earlier workloads' files go
            if where and x != "raw":
                for f in ("data", "cold", "ckpt", "btest"):
                    if os.path.exists(os.path.join(where, f)):
                        os.unlink(os.path.join(where, f))
            if self.quick:
                self.results[(name, x)] = {"skip": "skipped by --quick (minutes per target)"}
                continue
            if x == "raw" or where is None or x in ("nvcachefs-small", FLOOR):
                self.results[(name, x)] = {"skip": "a block device has no files" if x == "raw" else "not run"}
                continue
            r = sh("bonnie++", "-q", "-d", where, "-s", "1024", "-r", "512", "-n", "4", "-u", "root", "-f",
                   check=False)
            if r.returncode:
                self.results[(name, x)] = {"skip": "bonnie++ failed: " + r.stderr.strip()[:100]}
                continue
            f = r.stdout.strip().splitlines()[-1].split(",")
            # CSV (format 1.98): 11 block output K/s, 13 rewrite K/s, 17 block input K/s, 19 random seeks/s
            # "+++++": too fast for bonnie++ to time, shown as "-"
            num = lambda v, k=1: float(v) * k if re.fullmatch(r"[0-9.]+", v or "") else None
            self.results[(name, x)] = {"bw": num(f[11], 1024), "rewrite": num(f[13], 1024),
                                       "read": num(f[17], 1024), "iops": num(f[19])}
        print("  bonnie++: done", flush=True)

    def destage(self):
        """Sustained destage bandwidth against the backing store's own sequential write bandwidth."""
        mnt = self.targets["nvcachefs"]
        size = min(self.dimm, (512 if self.quick else 2048) * MiB)
        sh(CTL, "flush", mnt)
        # the earlier phases' writeback (bonnie++'s gigabytes in the full run) done before either side is timed
        self.drop_caches()
        # nothing leaves the cache while it is written: watermark, age and idle destage out of the way
        path = os.path.join(mnt, "destage")
        self.no_destage()
        sh("fio", "--name=d", f"--filename={path}", f"--size={size}", "--rw=write", "--bs=1M", "--direct=1")
        t0 = time.time()
        sh(CTL, "flush", mnt)
        secs = time.time() - t0
        own = self.fio("backing", "seqwrite", ["--rw=write", "--bs=1M", "--direct=1", "--ioengine=psync"], size,
                       file="seq")
        self.results[("destage", "nvcachefs")] = {"bw": size / secs, "bytes": size, "secs": secs}
        self.results[("destage", "backing")] = {"bw": own.get("bw", 0), "note": "its own 1M sequential write"}
        print("  destage: done", flush=True)

    def no_destage(self):
        """Nothing leaves the large cache while it is written: watermark, age and idle destage out of the way."""
        if getattr(self, "destage_off", False):
            return
        with open(self.nvc_conf, "a") as f:
            f.write("[destage]\nhigh_watermark = 100\nlow_watermark = 99\nmax_dirty_age = 0\nidle_after = 0\n")
        os.kill(self.nvc_proc.pid, 1)                  # SIGHUP: reload
        time.sleep(0.5)
        self.destage_off = True

    def destage_scattered(self):
        """Destage of scattered dirty pages: 4K random writes at QD32 into the large cache with destage
        held off, then the flush timed, against the backing store's own 4K random writes at QD32 of as many
        bytes (same offsets' distribution, no page twice)."""
        mnt = self.targets["nvcachefs"]
        size, io = 256 * MiB, 64 * MiB
        sh(CTL, "flush", mnt)
        self.no_destage()
        path = os.path.join(mnt, "scattered")
        args = ["--rw=randwrite", "--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=32", f"--io_size={io}"]
        sh("fio", "--name=s", f"--filename={path}", f"--size={size}", *args)
        t0 = time.time()
        sh(CTL, "flush", mnt)
        secs = time.time() - t0
        own = self.fio("backing", "scattered", args, size, file="scattered")
        self.results[("destage of scattered 4K pages", "nvcachefs")] = {"bw": io / secs, "bytes": io, "secs": secs}
        self.results[("destage of scattered 4K pages", "backing")] = {
            "bw": own.get("bw", 0), "note": "its own 4K random write, QD32"}
        print("  destage_scattered: done", flush=True)

    def resources(self):
        p = self.nvc_proc
        with open(f"/proc/{p.pid}/status") as f:
            hwm = int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024
        with open(f"/proc/{p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        st = json.loads(sh(CTL, "stats", self.targets["nvcachefs"], "--json").stdout)["total"]
        k = st["counters"]
        moved = k["read_bytes"] + k["write_bytes"] + k["destaged_bytes"]
        cap = st["gauges"]["capacity_bytes"]
        self.rss = {"peak_rss": hwm, "cache": cap, "rss_per_gib": hwm / (cap / GiB), "cpu": cpu, "moved": moved,
                    "cpu_per_gib": cpu / (moved / GiB) if moved else 0}
        # after the workloads, without the mirrors' mapped pages (see tools/bench/memory.py)
        now = memory.status_kb(p.pid)
        mirrors = memory.mapped_rss(p.pid, [f"/dev/shm/{self.tag}-nvc-m{i}" for i in range(2)])
        self.rss.update(rss_now=now["VmRSS"], mirrors_mapped=mirrors, own_now=now["VmRSS"] - mirrors)
        # recovery: kill -9 with dirty data, then mount again
        mnt = self.targets["nvcachefs"]
        sh("fio", "--name=r", f"--filename={os.path.join(mnt, 'dirty')}", "--size=256M", "--rw=write", "--bs=1M",
           "--direct=1")
        p.kill()
        p.wait()
        sh("umount", "-l", mnt, check=False)
        t0 = time.time()
        log = open(os.path.join(self.dir, "recovery.log"), "w")
        q = subprocess.Popen([DAEMON, "-f", "-c", self.nvc_conf, mnt], stdout=log, stderr=log)
        self.procs.append(q)
        try:
            wait_mounted(mnt, q, timeout=120)
        except RuntimeError:
            with open(log.name) as f:
                self.notes.append("recovery mount failed: " + f.read()[-300:].replace("\n", " "))
            self.rss["recovery_secs"], self.rss["dirty_recovered"] = float("nan"), 0
            return
        self.rss["recovery_secs"] = time.time() - t0
        self.rss["dirty_recovered"] = json.loads(sh(CTL, "stats", mnt, "--json").stdout)["total"]["gauges"][
            "dirty_bytes"]

    def mem_per_gib(self):
        """The daemon's own DRAM after mount for caches of MEM_GIB GiB (tools/bench/memory.py)."""
        self.mem = []
        for g in MEM_GIB:
            try:
                self.mem.append(memory.measure(self, g, DAEMON, CTL, wait_mounted, sh))
            except Exception as e:                       # shown in the report
                self.mem.append({"gib": g, "skip": f"failed: {e}"[:200]})
        print("  memory: done", flush=True)

    # ------------------------------------------------------------ report
    def fmt(self, r, key):
        v = r.get(key)
        if v is None:
            return "-"
        if key in ("bw", "read", "rewrite"):
            return f"{v / 1e6:.1f}"
        if key in ("iops", "create", "stat", "unlink"):
            return f"{v:.0f}"
        return f"{v:.1f}"

    def ratio(self, wl, x, key, lower_better):
        def val(t):
            r = self.results.get((wl, t), {})
            return r.get(key) if r and "skip" not in r else None
        mine = val(x)
        if not mine:
            return "-", "-", "-"
        out = []
        peers = [v for v in (val(p) for p in PEERS) if v]
        best = (min(peers) if lower_better else max(peers)) if peers else None
        for ref in (val("raw"), val("backing"), best):
            out.append(f"{mine / ref:.2f}x" if ref else "-")
        return tuple(out)

    def report(self, started):
        os.makedirs(self.out, exist_ok=True)
        md = []
        w = md.append
        w(f"# nvcachefs benchmark ({'quick' if self.quick else 'full'})\n")
        w(f"Run {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}, {time.time() - started:.0f} s; "
          f"fio {self.secs} s per cell; working set {self.ws // MiB} MiB; nvcachefs: two {self.dimm // MiB} MiB "
          f"emulated DIMMs (loop devices over /dev/shm, direct I/O), small cache two {self.small // MiB} MiB; "
          f"backing store: a directory on the machine's disk. Ratios: this figure over raw, over backing, over "
          f"the best peer (rclone, mergerfs, bindfs, ext4 on a DIMM) of the same run; for latency lower is better. "
          f"Of ceiling: this figure over the ceiling of the workload (see Ceiling), 1.00 = at the ceiling. "
          f"fuse-floor: the suite's FUSE floor daemon, {self.floor_threads} threads like nvcachefs. "
          f"FUSE transport of both: {TRANSPORT or 'the default (auto)'}.\n")
        for n in self.notes:
            w(f"- {n}")
        w("")
        workloads = []
        for (wl, _x) in self.results:
            if wl not in workloads and wl not in ("mount time",):
                workloads.append(wl)
        ratios = self.ratios()
        w("## Summary: nvcachefs (default configuration)\n")
        w("| workload | MB/s | IOPS | p99 us | MB/s vs raw | vs backing | vs best peer (which) | of ceiling |")
        w("|---|---|---|---|---|---|---|---|")
        for wl in workloads:
            r = self.results.get((wl, "nvcachefs"), {})
            if not r or "skip" in r or "bw" not in r or wl in ("metadata", "destage", "bonnie++",
                                                                      SCATTERED):
                continue
            peers = [(self.results[(wl, p)]["bw"], p) for p in PEERS
                     if "bw" in self.results.get((wl, p), {})]
            best = max(peers) if peers else None
            ra = self.results.get((wl, "raw"), {}).get("bw")
            rb = self.results.get((wl, "backing"), {}).get("bw")
            oc = ratios.get(wl, {}).get("of ceiling")
            oc = f"{oc:.2f}" if oc is not None else "-"
            w(f"| {wl} | {r['bw'] / 1e6:.1f} | {r.get('iops', 0):.0f} | {self.fmt(r, 'p99')} | "
              f"{r['bw'] / ra:.2f}x | {r['bw'] / rb:.2f}x | "
              + (f"{r['bw'] / best[0]:.2f}x ({best[1]}) | {oc} |" if best else f"- | {oc} |")
              if ra and rb else f"| {wl} | {r['bw'] / 1e6:.1f} | | | | | | |")
        md_ = self.results.get(("metadata", "nvcachefs"), {})
        if "create" in md_:
            mb = self.results.get(("metadata", "backing"), {}).get("create")
            fp = ratios.get("metadata", {}).get("vs best FUSE peer")
            w(f"| metadata create/s | | {md_['create']:.0f} | | | "
              f"{md_['create'] / mb:.2f}x | " + (f"{fp:.2f}x (best FUSE peer) | |" if fp else "| |") if mb else "")
        d, b = self.results.get(("destage", "nvcachefs"), {}), self.results.get(("destage", "backing"), {})
        if d.get("bw") and b.get("bw"):
            w(f"| destage (vs backing's own 1M write) | {d['bw'] / 1e6:.1f} | | | | {d['bw'] / b['bw']:.2f}x | | "
              f"{d['bw'] / b['bw']:.2f} |")
        w("")
        md += self.amp_md()
        md += self.past_md()
        md += self.pt_md()
        workloads = [wl for wl in workloads if not wl.startswith(("read amplification", "passthrough:"))]
        md += ceiling.ceiling_md(self.results, [wl for wl in workloads if wl != SCATTERED])
        md += ceiling.targets_md(ratios, TARGETS, "Targets (this run)")
        for wl in workloads:
            rows = [(x, self.results[(wl, x)]) for x in self.targets if (wl, x) in self.results]
            if not rows:
                continue
            w(f"## {wl}\n")
            if wl == "metadata":
                w("| target | files | create/s | stat/s | unlink/s | create vs backing | vs best peer |")
                w("|---|---|---|---|---|---|---|")
                for x, r in rows:
                    if "skip" in r:
                        w(f"| {x} | {r['skip']} | | | | | |")
                        continue
                    _, b, p = self.ratio(wl, x, "create", False)
                    w(f"| {x} | {r['files']} | {self.fmt(r, 'create')} | {self.fmt(r, 'stat')} | "
                      f"{self.fmt(r, 'unlink')} | {b} | {p} |")
            elif wl == "bonnie++":
                w("| target | block write MB/s | rewrite MB/s | block read MB/s | seeks/s |")
                w("|---|---|---|---|---|")
                for x, r in rows:
                    if "skip" in r:
                        w(f"| {x} | {r['skip']} | | | |")
                        continue
                    w(f"| {x} | {self.fmt(r, 'bw')} | {self.fmt(r, 'rewrite')} | {self.fmt(r, 'read')} | "
                      f"{self.fmt(r, 'iops')} |")
            elif wl == "destage of scattered 4K pages":
                d, b = self.results[(wl, "nvcachefs")], self.results[(wl, "backing")]
                w("| | MB/s | ratio |")
                w("|---|---|---|")
                w(f"| nvcachefs destage ({d['bytes'] // MiB} MiB of 4K pages in {d['secs']:.2f} s) | "
                  f"{d['bw'] / 1e6:.1f} | {d['bw'] / b['bw']:.2f}x of backing |" if b.get("bw")
                  else "| nvcachefs destage | - | - |")
                w(f"| backing store, its own 4K random write at QD32 | {b.get('bw', 0) / 1e6:.1f} | 1.00x |")
            elif wl == "destage":
                d, b = self.results[("destage", "nvcachefs")], self.results[("destage", "backing")]
                w("| | MB/s | ratio |")
                w("|---|---|---|")
                w(f"| nvcachefs destage ({d['bytes'] // MiB} MiB in {d['secs']:.1f} s) | {d['bw'] / 1e6:.1f} | "
                  f"{d['bw'] / b['bw']:.2f}x of backing |" if b.get("bw") else "| nvcachefs destage | - | - |")
                w(f"| backing store, its own 1M sequential write | {b.get('bw', 0) / 1e6:.1f} | 1.00x |")
            else:
                extra = wl == "1M checkpoint write"
                bands = wl.startswith("btest")
                ceil = ceiling.ceiling(self.results, wl)
                head = "| target | MB/s | IOPS | p50 us | p99 us | p99.9 us | max us | IOPS vs raw | vs backing | " \
                       "vs best peer | p99 vs raw | vs backing | vs best peer | of ceiling |"
                if extra:
                    head += " written s | in backing s |"
                if bands:
                    head += " " + " | ".join(BANDS) + " |"
                w(head)
                w("|" + "---|" * (head.count("|") - 1))
                for x, r in rows:
                    if "skip" in r:
                        w(f"| {x} | {r['skip']} |" + " |" * (head.count("|") - 3))
                        continue
                    a = self.ratio(wl, x, "iops", False)
                    l = self.ratio(wl, x, "p99", True)
                    oc = ceiling.of_ceiling(self.results, wl, x, ceil)[0]
                    line = (f"| {x} | {self.fmt(r, 'bw')} | {self.fmt(r, 'iops')} | {self.fmt(r, 'p50')} | "
                            f"{self.fmt(r, 'p99')} | {self.fmt(r, 'p999')} | {self.fmt(r, 'max')} | "
                            f"{' | '.join(a)} | {' | '.join(l)} | " + (f"{oc:.2f} |" if oc is not None else "- |"))
                    if extra:
                        line += f" {r['write_secs']:.1f} | {r['durable_secs']:.1f} |"
                    if bands:
                        line += " " + " | ".join(str(v) for v in r.get("bands", [0] * 6)) + " |"
                    w(line)
                if ceil and "floor" in ceil:
                    fl = ceil["floor"]
                    w(f"\nFloor {fl['bw'] / 1e6:.1f} MB/s ({fl['bw_by']}); ceiling {ceil['bw'] / 1e6:.1f} MB/s"
                      + (f", p50 {ceil['p50']:.1f} us (floor p50 {fl['p50']:.1f} us, {fl['p50_by']})"
                         if "p50" in ceil else "") + ".")
                elif ceil:
                    w(f"\nCeiling: the backing store, {ceil['bw'] / 1e6:.1f} MB/s.")
            w("")
        r = self.rss
        if r:
            md += self.daemon_md(r)
        md += self.cpu_md(workloads)
        md += memory.report(self.mem) if self.mem else []
        w("Plots: `throughput.png` (throughput per workload and target), `latency_cdf.png` (4K random read "
          "QD1 latency CDF per target).")
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(md) + "\n")
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump(self.json(), f, indent=1)
        if self.lat:
            self.plots(workloads)

    def past_md(self):
        """Past the cache: the small cache's write workloads against the backing store, same run."""
        md = ["## Past the cache: nvcachefs-small against the backing store\n",
              "| workload | backing MB/s | nvcachefs-small MB/s | ratio | backing p99 / p99.9 us | "
              "small p99 / p99.9 us | p99.9 ratio | writes paced (held ms) | waited at full | written around MiB |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for wl in WRITES:
            s, b = self.results.get((wl, "nvcachefs-small"), {}), self.results.get((wl, "backing"), {})
            if not s.get("bw") or not b.get("bw"):
                continue
            md.append(f"| {wl} | {b['bw'] / 1e6:.1f} | {s['bw'] / 1e6:.1f} | {s['bw'] / b['bw']:.2f}x | "
                      f"{self.fmt(b, 'p99')} / {self.fmt(b, 'p999')} | {self.fmt(s, 'p99')} / {self.fmt(s, 'p999')} | "
                      + (f"{s['p999'] / b['p999']:.1f}x |" if b.get("p999") and s.get("p999") else "- |")
                      + (f" {s['throttled_ops']} ({s['held_us'] / 1000:.0f}) | {s['space_wait_ops']} |"
                         f" {s['around_bytes'] / MiB:.1f} |"
                         if "throttled_ops" in s else " - | - | - |"))
        d, b = self.results.get((SCATTERED, "nvcachefs"), {}), self.results.get((SCATTERED, "backing"), {})
        if d.get("bw") and b.get("bw"):
            md.append(f"\nDestage of scattered 4K pages (the large cache, destage held off, then a flush): "
                      f"{d['bw'] / 1e6:.1f} MB/s, {d['bw'] / b['bw']:.2f}x the backing store's own 4K random "
                      f"write at QD32 ({b['bw'] / 1e6:.1f} MB/s).")
        md.append("")
        return md if len(md) > 4 else []

    def daemon_md(self, r):
        md = []
        w = md.append
        w("## The daemon\n")
        w("| figure | value |")
        w("|---|---|")
        w(f"| peak RSS (with the mirrors' mapped pages) | {r['peak_rss'] / MiB:.1f} MiB for {r['cache'] / GiB:.2f} "
          f"GiB of cache: {r['rss_per_gib'] / MiB:.1f} MiB per GiB |")
        w(f"| RSS after the workloads | {r['rss_now'] / MiB:.1f} MiB, of which the mirrors' mapped pages "
          f"{r['mirrors_mapped'] / MiB:.1f} MiB: own {r['own_now'] / MiB:.1f} MiB |")
        w(f"| CPU | {r['cpu']:.1f} s for {r['moved'] / GiB:.2f} GiB read, written and destaged: "
          f"{r['cpu_per_gib']:.2f} s per GiB |")
        w(f"| mount time (empty cache) | {self.results[('mount time', 'nvc')]['secs'] * 1000:.0f} ms |")
        w(f"| recovery after kill -9 | {r['recovery_secs'] * 1000:.0f} ms to mount again, "
          f"{r['dirty_recovered'] / MiB:.0f} MiB dirty recovered |")
        w("")
        return md

    def ratios(self):
        return ceiling.nvc_ratios(self.results, PEERS)

    def json(self):
        """results.json: "workload | target" -> figures, "workload | ceiling" -> the ceiling and its floor,
        "ratios | nvcachefs" -> nvcachefs's ratios per workload (with "of ceiling"), "daemon | nvcachefs" and
        "memory | N GiB"."""
        out = {f"{k[0]} | {k[1]}": v for k, v in self.results.items()}
        for wl in dict.fromkeys(k[0] for k in self.results):
            c = ceiling.ceiling(self.results, wl)
            if c:
                out[f"{wl} | ceiling"] = c
        out["ratios | nvcachefs"] = self.ratios()
        out["daemon | nvcachefs"] = self.rss
        for m in self.mem:
            out[f"memory | {m['gib']} GiB"] = m
        return out

    def cpu_md(self, workloads):
        """The daemons' CPU (utime + stime across each cell) per request fio made and per GiB it moved."""
        who = [x for x in ("nvcachefs", FLOOR) if self.targets.get(x)]
        md = ["## CPU of the daemons per operation and per GiB\n",
              "utime + stime of the daemon process (/proc/PID/stat, all threads) across the fio cell, over the "
              "requests fio completed and over the bytes it moved. The floor's figure is what FUSE's request "
              "loop alone costs the daemon.\n",
              "| workload | " + " | ".join(f"{x} CPU s | us per op | s per GiB" for x in who) + " |",
              "|---|" + "---|---|---|" * len(who)]
        for wl in workloads:
            rs = [self.results.get((wl, x), {}) for x in who]
            if not any("cpu_s" in r for r in rs):
                continue
            md.append(f"| {wl} | " + " | ".join(
                f"{r['cpu_s']:.2f} | {r['cpu_us_per_op']:.1f} | {r['cpu_s_per_gib']:.2f}" if "cpu_s" in r
                else "- | - | -" for r in rs) + " |")
        md.append("")
        return md

    def plots(self, workloads):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        wls = [wl for wl in workloads if wl not in ("metadata", "bonnie++", "destage")]
        fig, axes = plt.subplots(len(wls), 1, figsize=(10, 2.6 * len(wls)))
        for ax, wl in zip(axes, wls):
            xs = [x for x in self.targets if "skip" not in self.results.get((wl, x), {"skip": 1})]
            ys = [self.results[(wl, x)]["bw"] / 1e6 for x in xs]
            ax.barh(xs, ys, color=["#c44" if x.startswith("nvcachefs") else "#888" for x in xs])
            ax.set_title(wl, fontsize=9)
            ax.set_xlabel("MB/s", fontsize=8)
            ax.tick_params(labelsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(self.out, "throughput.png"), dpi=90)
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(8, 5))
        for x, vals in self.lat.items():
            if not vals:
                continue
            n = len(vals)
            step = max(1, n // 2000)
            pts = vals[::step]
            ax.plot([v / 1e3 for v in pts], [i * step / n for i in range(len(pts))], label=x)
        ax.set_xscale("log")
        ax.set_xlabel("latency, us (log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("4K random read, QD1, cached data")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        fig.savefig(os.path.join(self.out, "latency_cdf.png"), dpi=90)
        plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short runs and a small working set: under 5 minutes")
    ap.add_argument("--out", help="results folder (default results/DATE-quick|full)")
    ap.add_argument("--dfs", metavar="STORES", help="instead: nvcachefs over distributed stores "
                    "(gluster,moosefs,cephfs) against each store alone, the FUSE floor and the raw DIMM; an MPI-IO "
                    "checkpoint on two nodes; metadata rates (tools/bench/dfsbench.py)")
    ap.add_argument("--before", metavar="BUILD", help="with --dfs: also measure the creates of this build "
                    "directory's daemon")
    ap.add_argument("--no-mpi", action="store_true", help="with --dfs: the checkpoint by plain processes")
    ap.add_argument("--only", metavar="PHASES", help="only these phases, comma-separated: " + ", ".join(PHASES)
                    + " (workloads: the fio cells of cached data)")
    ap.add_argument("--writes", action="store_true", help="only the write workloads and the checkpoint, on the "
                    "backing store and both caches (past the small cache)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N", help="the whole measurement N times, each with "
                    "its own setup (OUT/runK/); OUT/report.md gives the median of each ratio and every run's")
    ap.add_argument("--transport", choices=("uring", "dev"), help="fuse.transport of nvcachefs and of the FUSE "
                    "floor alike (uring: enable_uring on for the run, then as it was; default: the daemons' auto)")
    a = ap.parse_args()
    global TRANSPORT
    TRANSPORT = a.transport
    if os.geteuid():
        sys.exit("suite.py: run as root (loop devices, mounts)")
    if a.repeat < 1 or (a.repeat > 1 and a.dfs):
        sys.exit("suite.py: --repeat takes N >= 1, without --dfs")
    ensure_build()
    kind = "-quick" if a.quick else "-full"
    out = a.out or os.path.join(ROOT, "results", time.strftime("%Y%m%d-%H%M%S") + ("-dfs" if a.dfs else "") + kind)
    if a.dfs:
        from dfsbench import DfsBench
        kinds = [{"cephfs": "ceph"}.get(k, k) for k in a.dfs.split(",")]
        if any(k not in ("gluster", "moosefs", "ceph") for k in kinds):
            sys.exit("suite.py: --dfs takes gluster, moosefs, cephfs, or several of them comma-separated")
        b = DfsBench(a.quick, out, kinds, before=a.before and os.path.abspath(a.before), mpi=not a.no_mpi)
    else:
        only = a.only.split(",") if a.only else None
        if only and any(p not in PHASES for p in only):
            sys.exit("suite.py: --only takes " + ", ".join(PHASES))
        b = Bench(a.quick, out, only, a.writes)
    # a kill still tears down the mounts and loop devices
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("suite.py: terminated"))
    started = time.time()
    with Transport(a.transport):
        if a.repeat > 1:
            repeat(a, out, started)
            return
        try:
            b.setup()
            b.run()
            b.report(started)
        finally:
            b.cleanup()
    print(f"report: {os.path.join(out, 'report.md')} ({time.time() - started:.0f} s)")


def cpu_medians_md(runs):
    """The daemons' CPU per operation and per GiB: the median of the runs."""
    md = [f"## CPU per operation and per GiB (median of {len(runs)} runs)\n",
          "| workload | nvcachefs us per op | s per GiB | fuse-floor us per op | s per GiB |", "|---|---|---|---|---|"]
    for wl in dict.fromkeys(k[0] for k in runs[0].results):
        cells = []
        for x in ("nvcachefs", FLOOR):
            for key, fmt in (("cpu_us_per_op", "{:.1f}"), ("cpu_s_per_gib", "{:.2f}")):
                vs = [b.results.get((wl, x), {}).get(key) for b in runs]
                vs = [v for v in vs if v is not None]
                cells.append(fmt.format(statistics.median(vs)) if vs else "-")
        if any(c != "-" for c in cells):
            md.append(f"| {wl} | " + " | ".join(cells) + " |")
    md.append("")
    return md


def past_medians_md(runs):
    """Past the cache: the median over the runs of the small cache's ratio to the backing store, and of
    its p99.9 over the backing store's, with every run's."""
    md = [f"## Past the cache: nvcachefs-small against the backing store (median of {len(runs)} runs)\n",
          "| workload | MB/s ratio (each run) | p99.9 ratio (each run) |", "|---|---|---|"]
    for wl in WRITES:
        bw, tail = [], []
        for b in runs:
            s, k = b.results.get((wl, "nvcachefs-small"), {}), b.results.get((wl, "backing"), {})
            if s.get("bw") and k.get("bw"):
                bw.append(s["bw"] / k["bw"])
            if s.get("p999") and k.get("p999"):
                tail.append(s["p999"] / k["p999"])
        if bw:
            md.append(f"| {wl} | {statistics.median(bw):.2f}x ({', '.join(f'{v:.2f}' for v in bw)}) | "
                      + (f"{statistics.median(tail):.1f}x ({', '.join(f'{v:.1f}' for v in tail)}) |" if tail
                         else "- |"))
    sc = [b.results[(SCATTERED, "nvcachefs")]["bw"] / b.results[(SCATTERED, "backing")]["bw"] for b in runs
          if b.results.get((SCATTERED, "nvcachefs"), {}).get("bw") and b.results.get((SCATTERED, "backing"), {}).get("bw")]
    if sc:
        md.append(f"| {SCATTERED} (large cache, flush) vs the store's 4K random write QD32 | "
                  f"{statistics.median(sc):.2f}x ({', '.join(f'{v:.2f}' for v in sc)}) | - |")
    md.append("")
    return md if len(md) > 3 else []


def repeat(a, out, started):
    """The whole measurement a.repeat times, each its own setup and report in OUT/runK; OUT/report.md and
    OUT/results.json: the median of each nvcachefs ratio over the runs, with every run's figure."""
    runs, times = [], []
    for k in range(1, a.repeat + 1):
        print(f"run {k} of {a.repeat}", flush=True)
        t0 = time.time()
        b = Bench(a.quick, os.path.join(out, f"run{k}"), a.only and a.only.split(","), a.writes)
        try:
            b.setup()
            b.run()
            b.report(t0)
        finally:
            b.cleanup()
        runs.append(b)
        times.append(time.time() - t0)
    med = ceiling.medians([b.ratios() for b in runs])
    md = [f"# nvcachefs benchmark: median of {a.repeat} {'quick' if a.quick else 'full'} runs\n",
          f"Run {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}, {time.time() - started:.0f} s ("
          + ", ".join(f"{t:.0f} s" for t in times) + " per run). Each run sets up, measures every workload "
          "(targets alternated within each workload) and tears down; its own report is in `runK/report.md`. "
          "Ratios are nvcachefs's MB/s (metadata: creates/s) over the same run's reference; of ceiling: over the "
          "workload's ceiling (see a run's Ceiling section).\n"]
    md += ceiling.targets_md(med, TARGETS, f"Targets (median of {a.repeat} runs)")
    md += ceiling.medians_md(med, a.repeat)
    md += cpu_medians_md(runs)
    md += past_medians_md(runs)
    mem = runs[-1].mem
    md += memory.report(mem)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"median": {wl: {n: m for n, (m, _) in row.items()} for wl, row in med.items()},
                   "runs": [b.json() for b in runs], "secs": times}, f, indent=1)
    print(f"report: {os.path.join(out, 'report.md')} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
