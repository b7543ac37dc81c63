"""tools/bench/memory.py: the daemon's own DRAM after mount, per GiB of cache, for caches of several sizes.

Each cache is two sparse emulated DIMMs (loop devices over sparse /dev/shm files, direct I/O) with its metadata
mirrors in /dev/shm, formatted, mounted, measured once the mount answers, and taken down again. The mirrors are
mapped files (pmem in production): their resident pages are not the daemon's own DRAM. The daemon's own is its
VmRSS less the resident pages of the mirror mappings, summed from /proc/PID/smaps (the lines of the mappings
whose path is a mirror file); /proc/PID/status's RssShmem, which counts the same pages, is kept as a check.
"""
import json
import os
import re
import subprocess
import time

GiB, MiB = 1 << 30, 1 << 20


def status_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        text = f.read()
    return {k: int(re.search(rf"^{k}:\s+(\d+) kB", text, re.M).group(1)) * 1024
            for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}


def mapped_rss(pid, paths):
    """Resident bytes of the mappings of the given files."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                inside = len(head) >= 6 and head[5] in paths
            elif inside and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


def measure(b, gib, daemon, ctl, wait_mounted, sh):
    """Mount a cache of gib GiB (two DIMMs of gib/2) on bench b, measure, take it down; a result dict."""
    name = f"mem{gib}"
    loops0, images0 = len(b.loops), len(b.images)
    devs = [b.loop(f"{name}-d{i}", gib * GiB // 2) for i in range(2)]
    conf = b.conf(name, devs, name)
    mirrors = [f"/dev/shm/{b.tag}-{name}-m{i}" for i in range(2)]
    mnt = os.path.join(b.dir, name)
    os.makedirs(mnt, exist_ok=True)
    p = None
    try:
        sh(ctl, "format", "-c", conf, "--force")
        p = subprocess.Popen([daemon, "-f", "-c", conf, mnt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_mounted(mnt, p)
        os.stat(mnt)                      # the mount answers
        time.sleep(0.5)                   # the threads started after mount are up
        st = status_kb(p.pid)
        mir = mapped_rss(p.pid, mirrors)
        cap = json.loads(sh(ctl, "stats", mnt, "--json").stdout)["total"]["gauges"]["capacity_bytes"]
        own = st["VmRSS"] - mir
        return {"gib": gib, "capacity": cap, "rss": st["VmRSS"], "anon": st["RssAnon"], "file": st["RssFile"],
                "shmem": st["RssShmem"], "mirrors_mapped": mir,
                "mirror_size": sum(os.path.getsize(m) for m in mirrors), "own": own,
                "own_per_gib": own / (cap / GiB)}
    finally:
        if p is not None:
            sh("umount", mnt, check=False)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for lo in b.loops[loops0:]:
            sh("losetup", "-d", lo, check=False)
        for f in b.images[images0:] + mirrors:
            if os.path.exists(f):
                os.unlink(f)
        del b.loops[loops0:], b.images[images0:]


def marginal(rows):
    """Set each measured row's "marginal": own bytes per extra GiB of cache since the previous measured row (the
    per-slot cost, without the fixed part that own_per_gib spreads over small caches); None on the first."""
    prev = None
    for r in rows:
        if "skip" in r:
            continue
        r["marginal"] = ((r["own"] - prev["own"]) / ((r["capacity"] - prev["capacity"]) / GiB)
                         if prev and r["capacity"] > prev["capacity"] else None)
        prev = r
    return rows


def report(rows):
    """Markdown lines."""
    marginal(rows)
    md = ["## Memory: the daemon's own DRAM after mount\n",
          "Two sparse emulated DIMMs per cache, default block size, mirrors in /dev/shm. Own = VmRSS less the "
          "resident pages of the two mirror mappings (summed from /proc/PID/smaps; RssShmem, the same pages, shown "
          "as a check): anonymous memory (the daemon's heap, tables, stacks) plus the file-backed pages of its "
          "program and shared libraries (about 4 MiB, shared with every other process that maps them). Marginal: "
          "own MiB per extra GiB of cache since the row above, the per-slot cost without the fixed part. "
          "Target: at most 2 MiB per GiB.\n",
          "| cache | VmRSS MiB | mirrors mapped MiB (RssShmem) | own MiB (anon + file) | own MiB per GiB "
          "| anon MiB per GiB | marginal MiB per extra GiB |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "skip" in r:
            md.append(f"| {r['gib']} GiB | {r['skip']} | | | | | |")
            continue
        gib = r["capacity"] / GiB
        m = "" if r["marginal"] is None else f"{r['marginal'] / MiB:.2f}"
        md.append(f"| {gib:.2f} GiB | {r['rss'] / MiB:.1f} | {r['mirrors_mapped'] / MiB:.1f} "
                  f"({r['shmem'] / MiB:.1f}) | {r['own'] / MiB:.1f} ({r['anon'] / MiB:.1f} + {r['file'] / MiB:.1f}) "
                  f"| {r['own_per_gib'] / MiB:.2f} | {r['anon'] / MiB / gib:.2f} | {m} |")
    md.append("")
    return md
