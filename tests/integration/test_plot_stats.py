"""tools/plot-stats on real nvcachectl stats -i --json output of a workload that crosses the high watermark.

NVC_PLOT_SECONDS (default 8) sets the workload's length; NVC_PLOT_PNG keeps the picture (README's is made with
NVC_PLOT_SECONDS=45 NVC_PLOT_PNG=tools/grafana/nvcachefs.png)."""
import json
import os
import signal
import subprocess
import time

from conftest import CTL, MiB, ROOT
from test_stats import direct_read

PLOT = os.path.join(ROOT, "tools", "plot-stats")
DASHBOARD = os.path.join(ROOT, "tools", "grafana", "nvcachefs.json")


def workload(c, seconds, names):
    """Reads (hits and misses, O_DIRECT so that each reaches the daemon), writes with some fsyncs, stats; then
    writes faster than the capped destage, past the high watermark; then reads only, while destage drains.
    Returns what each file must hold."""
    files, i = {}, 0
    for n in range(8):                                        # on the backing store only: the first reads miss
        with open(os.path.join(c.backing, f"r{n}"), "wb") as f:
            f.write(os.urandom(MiB))
    end = time.time() + seconds
    phase2, phase3 = time.time() + 0.2 * seconds, time.time() + 0.65 * seconds
    while time.time() < end:
        now = time.time()
        direct_read(c.path(f"r{i % 8}"))
        os.stat(c.path(f"r{(i + 3) % 8}"))
        if now < phase3:
            name = f"w{i % names}"
            files[name] = os.urandom(MiB)
            with open(c.path(name), "wb") as f:
                f.write(files[name])
                if i % 4 == 0:
                    os.fsync(f.fileno())
        time.sleep(0.25 if now < phase2 else 0.05 if now < phase3 else 0.1)
        i += 1
    return files


def test_plot_stats_draws_every_panel_from_real_output(make_cache, tmp_path):
    seconds = float(os.environ.get("NVC_PLOT_SECONDS", "8"))
    png = os.environ.get("NVC_PLOT_PNG") or str(tmp_path / "stats.png")
    k = max(1, int(seconds // 16))                            # a longer run: a larger cache, more files
    c = make_cache(ndevs=2, dev_size=32 * MiB * k,
                   extra={"destage.high_watermark": "40", "destage.low_watermark": "10", "destage.max_rate": "6M"})
    c.format()
    c.mount()
    out = tmp_path / "stats.jsonl"
    with open(out, "w") as f:
        stats = subprocess.Popen([CTL, "stats", c.mnt, "-i", "0.5", "--json"], stdout=f)
    try:
        files = workload(c, seconds, 48 * k)
        deadline = time.time() + max(10, seconds)             # the drain to the low watermark
        while time.time() < deadline and (c.stats()["destaging"] or c.stats()["dirty_bytes"] == 0):
            time.sleep(0.5)
        time.sleep(1.5)
    finally:
        stats.send_signal(signal.SIGINT)
        stats.wait(timeout=10)
    with open(out) as f:                                      # from standard input, as in a pipe
        r = subprocess.run([PLOT, "-o", png, "--summary"], stdin=f, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(DASHBOARD) as f:
        titles = [p["title"] for p in json.load(f)["panels"]]
    assert list(summary["panels"]) == titles                  # the dashboard's panels, in its order
    assert summary["snapshots"] >= seconds * 2 - 2
    empty = [t for t, n in summary["panels"].items() if not n]
    assert not empty, summary
    snaps = [json.loads(line) for line in open(out)]
    assert max(s["total"]["gauges"]["dirty_bytes"] for s in snaps) > snaps[0]["total"]["gauges"]["high_watermark_bytes"]
    assert sum(s["interval"]["counters"]["destaged_bytes"] for s in snaps) > 0
    c.flush()
    for name, data in files.items():
        with open(os.path.join(c.backing, name), "rb") as f:
            assert f.read() == data, name


def test_plot_stats_refuses_input_without_intervals(tmp_path):
    bad = tmp_path / "one.json"
    bad.write_text('{"mountpoint": "/m", "total": {}}\n')
    r = subprocess.run([PLOT, str(bad), "-o", str(tmp_path / "x.png")], capture_output=True, text=True)
    assert r.returncode != 0 and "fewer than two interval snapshots" in r.stderr
    assert not (tmp_path / "x.png").exists()
