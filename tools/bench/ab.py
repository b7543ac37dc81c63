#!/usr/bin/python3
"""tools/bench/ab.py: two builds of nvcachefs in one run, their cells interleaved round by round, against the raw DIMM of the same run.

  tools/bench/ab.py BEFORE_BUILD [--after BUILD] [--rounds N] [--secs S]

Both daemons are mounted at once, each on two emulated DIMMs of its own (the
suite's loop devices over /dev/shm), over one backing directory; every round
runs each cell on the raw DIMM, then A (BEFORE_BUILD), then B (the current
build), so that the machine's drift falls on both alike.  The table gives
each figure's median over the rounds, B over A, and each over the raw DIMM
of its own round; the daemon's CPU per request comes from /proc.  A change
that should change nothing (a refactor) shows B/A within the rounds' spread.
"""
import argparse
import os
import statistics
import sys
import time

import suite

CELLS = (
    ("4K randread QD1 (cached)", ["--ioengine=psync", "--rw=randread", "--bs=4k"]),
    ("4K randread QD32 (cached)", ["--ioengine=libaio", "--iodepth=32", "--rw=randread", "--bs=4k"]),
    ("4K randwrite QD1", ["--ioengine=psync", "--rw=randwrite", "--bs=4k"]),
    ("4K randwrite QD32", ["--ioengine=libaio", "--iodepth=32", "--rw=randwrite", "--bs=4k"]),
    ("Iometer File Server", ["--ioengine=libaio", "--iodepth=16", "--rw=randrw", "--rwmixread=80",
                             "--percentage_random=75", "--bssplit=512/10:1k/5:2k/5:4k/60:8k/2:16k/4:32k/4:64k/10"]),
)


def med(v):
    return statistics.median(v) if v else float("nan")


def spread(v):
    return (max(v) - min(v)) / med(v) if v and med(v) else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", help="the build directory of A (meson), e.g. a worktree's build/")
    ap.add_argument("--after", default=suite.BUILD, help="the build directory of B (default: this tree's)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--secs", type=int, default=3, help="fio seconds per cell")
    a = ap.parse_args()
    if os.geteuid():
        sys.exit("ab.py: run as root (loop devices, mounts)")
    for d in (a.before, a.after):
        if not os.access(os.path.join(d, "fs", "nvcachefs"), os.X_OK):
            sys.exit(f"ab.py: no daemon in {d}/fs/nvcachefs")
    suite.ensure_build()
    b = suite.Bench(True, "/tmp", only=())
    suite.DAEMONS.update({"A": "a_proc", "B": "b_proc"})
    fig = {}  # (cell, target) -> {"bw": [...], "p50": [...], "cpu": [...], "vs_raw": [...]}
    t0 = time.time()
    try:
        os.makedirs(b.dir)
        b.backing = os.path.join(b.dir, "backing")
        os.makedirs(b.backing)
        raw = b.loop("raw", b.dimm, True)
        b.targets = {"raw": raw,
                     "A": b.mount_nvc("a", [b.loop(f"a{i}", b.dimm, True) for i in range(2)], "a", build=a.before),
                     "B": b.mount_nvc("b", [b.loop(f"b{i}", b.dimm, True) for i in range(2)], "b", build=a.after)}
        for x in ("A", "B"):
            b.prepare(x, b.ws)
        common = ["--time_based", f"--runtime={a.secs}", "--direct=1"]
        for k in range(a.rounds):
            for name, args in CELLS:
                rawbw = None
                for x in ("raw", "A", "B"):
                    r = b.fio(x, name, common + args, b.ws)
                    if "skip" in r:
                        sys.exit(f"ab.py: {name} on {x}: {r['skip']}")
                    f = fig.setdefault((name, x), {"bw": [], "p50": [], "cpu": [], "vs_raw": []})
                    f["bw"].append(r["bw"] / 1e6)
                    f["p50"].append(r.get("p50", 0))
                    if "cpu_us_per_op" in r:
                        f["cpu"].append(r["cpu_us_per_op"])
                    if x == "raw":
                        rawbw = r["bw"]
                    else:
                        f["vs_raw"].append(r["bw"] / rawbw)
            print(f"  round {k + 1} of {a.rounds}: done", flush=True)
    finally:
        b.cleanup()
    print(f"\nA: {a.before}\nB: {a.after}\n{a.rounds} rounds of {a.secs} s per cell, {time.time() - t0:.0f} s in all; "
          "medians over the rounds (spread: (max - min) / median)\n")
    print("| workload | raw MB/s | A MB/s | B MB/s | B/A | A vs raw | B vs raw | A p50 us | B p50 us "
          "| A CPU us/req | B CPU us/req | spread A / B |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, _ in CELLS:
        r, fa, fb = fig[(name, "raw")], fig[(name, "A")], fig[(name, "B")]
        print(f"| {name} | {med(r['bw']):.1f} | {med(fa['bw']):.1f} | {med(fb['bw']):.1f} "
              f"| {med(fb['bw']) / med(fa['bw']):.2f} | {med(fa['vs_raw']):.2f}x | {med(fb['vs_raw']):.2f}x "
              f"| {med(fa['p50']):.1f} | {med(fb['p50']):.1f} | {med(fa['cpu']):.1f} | {med(fb['cpu']):.1f} "
              f"| {spread(fa['bw']):.2f} / {spread(fb['bw']):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
