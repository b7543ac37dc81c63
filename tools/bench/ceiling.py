"""tools/bench/ceiling.py: the FUSE floor and the ceiling of each workload, and the median of several runs.

The floor of a workload is the fastest FUSE daemon of the same run on it: the suite's own floor daemon
(tools/bench/floor.c, reads from RAM, writes dropped, served as nvcachefs serves FUSE) or the best FUSE peer
(mergerfs, bindfs, rclone). The ceiling is what a daemon adding one device I/O to every FUSE request could reach
on this machine: for throughput 1 / (1/raw + 1/floor), for latency raw p50 + floor p50 (workloads with one
request in flight per job only: at QD32 the p50 is queueing). For uncached reads and
destage the data must come from or go to the backing store: there the ceiling is the backing store itself
(for destage, its own 1M O_DIRECT sequential write).
"""
import statistics

FLOOR = "fuse-floor"
FUSE_PEERS = ("mergerfs", "bindfs", "rclone")
BACKING_BOUND = {"1M seqread (uncached)": "backing", "destage": "backing"}
NO_CEILING = {"metadata", "bonnie++", "mount time"}


def good(results, wl, t, key):
    r = results.get((wl, t))
    if not r or "skip" in r:
        return None
    v = r.get(key)
    return v if v else None


def deep_queue(wl):
    """Workloads with many requests in flight: their p50 is queueing, not a latency the sum bounds."""
    return "QD32" in wl or wl.startswith("Iometer")


def floor_of(results, wl):
    """{"bw", "bw_by", "p50", "p50_by"}: the fastest FUSE daemon's throughput and its lowest p50, on wl."""
    out = {}
    bws = [(good(results, wl, t, "bw"), t) for t in (FLOOR,) + FUSE_PEERS]
    bws = [x for x in bws if x[0]]
    if bws:
        out["bw"], out["bw_by"] = max(bws)
    p50s = [(good(results, wl, t, "p50"), t) for t in (FLOOR,) + FUSE_PEERS]
    p50s = [x for x in p50s if x[0]]
    if p50s:
        out["p50"], out["p50_by"] = min(p50s)
    return out


def ceiling(results, wl):
    """The ceiling of wl: {"kind", "bw", "p50"?, "raw_bw"?, "raw_p50"?, "floor": floor_of}, or None."""
    if wl in NO_CEILING:
        return None
    if wl in BACKING_BOUND:
        bw = good(results, wl, "backing", "bw")
        return {"kind": "backing store", "bw": bw} if bw else None
    raw_bw, floor = good(results, wl, "raw", "bw"), floor_of(results, wl)
    if not raw_bw or "bw" not in floor:
        return None
    c = {"kind": "1/(1/raw + 1/floor)", "bw": 1 / (1 / raw_bw + 1 / floor["bw"]), "raw_bw": raw_bw,
         "floor": floor}
    raw_p50 = good(results, wl, "raw", "p50")
    if raw_p50 and "p50" in floor and not deep_queue(wl):
        c["raw_p50"] = raw_p50
        c["p50"] = raw_p50 + floor["p50"]
    return c


def of_ceiling(results, wl, t, c=None):
    """(throughput fraction, p50 fraction) of t against the ceiling of wl; None where there is none."""
    c = c or ceiling(results, wl)
    if not c:
        return None, None
    bw, p50 = good(results, wl, t, "bw"), good(results, wl, t, "p50")
    return (bw / c["bw"] if bw else None,
            c["p50"] / p50 if p50 and "p50" in c else None)


def nvc_ratios(results, peers):
    """Per workload, nvcachefs's ratios of one run: {wl: {"vs raw", "vs backing", "vs best peer", "of ceiling",
    "p50 of ceiling", "vs best FUSE peer"}} (throughput ratios; metadata by creates per second)."""
    out = {}
    wls = []
    for (wl, _t) in results:
        if wl not in wls and wl not in ("mount time", "bonnie++"):
            wls.append(wl)
    for wl in wls:
        key = "create" if wl == "metadata" else "bw"
        mine = good(results, wl, "nvcachefs", key)
        if not mine:
            continue
        row = {}
        for name, refs in (("vs raw", ["raw"]), ("vs backing", ["backing"]), ("vs best peer", list(peers)),
                           ("vs best FUSE peer", list(FUSE_PEERS)), ("vs fuse-floor", [FLOOR])):
            vals = [v for v in (good(results, wl, t, key) for t in refs) if v]
            if vals:
                row[name] = mine / max(vals)
        bw, p50 = of_ceiling(results, wl, "nvcachefs")
        if bw is not None:
            row["of ceiling"] = bw
        if p50 is not None:
            row["p50 of ceiling"] = p50
        out[wl] = row
    return out


def medians(runs):
    """The median over runs of each ratio in nvc_ratios' form, with the per-run values: {wl: {name: (median,
    [per run])}}."""
    out = {}
    for per in runs:
        for wl, row in per.items():
            for name, v in row.items():
                out.setdefault(wl, {}).setdefault(name, []).append(v)
    return {wl: {n: (statistics.median(vs), vs) for n, vs in row.items()} for wl, row in out.items()}


# ------------------------------------------------------------ report
def _f(v, fmt):
    return fmt.format(v) if v is not None else "-"


def ceiling_md(results, workloads):
    """The ceiling table: per workload the raw figure, the floor, the ceiling and nvcachefs against it."""
    md = ["## Ceiling: what a daemon adding one device I/O per FUSE request could reach\n",
          "Floor: the faster of `fuse-floor` (tools/bench/floor.c: reads from RAM, writes dropped; nvcachefs's "
          "request loop, thread count, INIT settings, open flags and mount options) and the best FUSE peer "
          "(mergerfs, bindfs, rclone) on the workload, in this run. Ceiling: 1/(1/raw + 1/floor) for throughput, "
          "raw p50 + floor p50 for latency; for uncached reads and destage the backing store itself (for "
          "destage its own 1M O_DIRECT sequential write). Of ceiling: nvcachefs's MB/s over the ceiling's; "
          "p50 of ceiling: the ceiling's p50 over nvcachefs's (both: 1.00 = at the ceiling).\n",
          "| workload | raw MB/s | floor MB/s (which) | ceiling MB/s | nvcachefs MB/s | of ceiling | raw p50 us | "
          "floor p50 us (which) | ceiling p50 us | nvcachefs p50 us | p50 of ceiling |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for wl in workloads:
        c = ceiling(results, wl)
        if not c:
            continue
        fl = c.get("floor", {})
        bw, p50 = of_ceiling(results, wl, "nvcachefs", c)
        nv = results.get((wl, "nvcachefs"), {})
        if c["kind"] == "backing store":
            md.append(f"| {wl} | | backing store | {c['bw'] / 1e6:.1f} | {_f(nv.get('bw') and nv['bw'] / 1e6, '{:.1f}')} | "
                      f"{_f(bw, '{:.2f}')} | | | | | |")
            continue
        # a floor slower than nvcachefs's own request path is a broken floor, not a low bar
        broken = " **below nvcachefs**" if nv.get("bw") and nv["bw"] > fl["bw"] else ""
        md.append(f"| {wl} | {c['raw_bw'] / 1e6:.1f} | {fl['bw'] / 1e6:.1f} ({fl['bw_by']}){broken} | {c['bw'] / 1e6:.1f} | "
                  f"{_f(nv.get('bw') and nv['bw'] / 1e6, '{:.1f}')} | {_f(bw, '{:.2f}')} | "
                  f"{_f(c.get('raw_p50'), '{:.1f}')} | "
                  + (f"{fl['p50']:.1f} ({fl['p50_by']})" if "p50" in fl else "-")
                  + f" | {_f(c.get('p50'), '{:.1f}')} | {_f(nv.get('p50'), '{:.1f}')} | {_f(p50, '{:.2f}')} |")
    md.append("")
    return md


def targets_md(rows, targets, title):
    """The targets against rows: {wl: {name: value or (median, [per run])}}."""
    md = [f"## {title}\n", "| workload | figure | target | value | met |", "|---|---|---|---|---|"]
    for wl, name, least in targets:
        v = rows.get(wl, {}).get(name)
        per = ""
        if isinstance(v, tuple):
            v, runs = v
            per = " (runs: " + ", ".join(f"{x:.2f}" for x in runs) + ")"
        md.append(f"| {wl} | {name} | ≥ {least:.2f} | " + (f"{v:.2f}{per} | {'yes' if v >= least else 'NO'} |"
                                                          if v is not None else "- | - |"))
    md.append("")
    return md


NAMES = ("vs raw", "vs backing", "vs best peer", "vs best FUSE peer", "vs fuse-floor", "of ceiling",
         "p50 of ceiling")


def medians_md(med, nruns):
    """Every ratio of nvcachefs: the median of the runs, and each run's figure."""
    md = [f"## nvcachefs: median of {nruns} runs (each run's figure in brackets)\n",
          "| workload | " + " | ".join(NAMES) + " |", "|---|" + "---|" * len(NAMES)]
    for wl, row in med.items():
        cells = []
        for n in NAMES:
            if n not in row:
                cells.append("-")
                continue
            m, runs = row[n]
            cells.append(f"{m:.2f} (" + ", ".join(f"{x:.2f}" for x in runs) + ")")
        md.append(f"| {wl} | " + " | ".join(cells) + " |")
    md.append("")
    return md
