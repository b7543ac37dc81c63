"""tools/grafana/nvcachefs.json: a valid dashboard whose every query names metrics and labels that the real
nvcachectl stats --prometheus prints, so that a rename breaks this test and not the dashboard."""
import json
import os
import re

from conftest import MiB, ROOT

DASHBOARD = os.path.join(ROOT, "tools", "grafana", "nvcachefs.json")
SELECTOR = re.compile(r"\b(nvcachefs_[a-zA-Z0-9_]+)(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def load():
    with open(DASHBOARD) as f:
        return json.load(f)


def exprs(dash):
    """(where, expr, legendFormat) of every query: the panels' targets and the template variables'."""
    for p in dash["panels"]:
        for t in p["targets"]:
            yield p["title"], t["expr"], t.get("legendFormat", "")
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            yield "variable " + v["name"], v["definition"], ""


def parse_exposition(text):
    """metric name -> list of label dicts, from the text exposition format."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? \S+$", line)
        assert m, line
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        samples.setdefault(m.group(1), []).append(labels)
    return samples


def problems(queries, samples):
    """What in the queries the exposition does not have: metric names, label names, label values."""
    out = []
    for where, expr, legend in queries:
        names = set()
        found = SELECTOR.findall(expr)
        if not found:
            out.append(f"{where}: no nvcachefs metric in {expr}")
        for metric, sel in found:
            if metric not in samples:
                out.append(f"{where}: {metric} is not in the output")
                continue
            have = samples[metric]
            names |= {k for s in have for k in s}
            for label, op, value in MATCHER.findall(sel or ""):
                values = {s[label] for s in have if label in s}
                if not values:
                    out.append(f"{where}: {metric} has no label {label}")
                elif "$" not in value and op in ("=", "=~"):
                    for alt in value.split("|") if op == "=~" else [value]:
                        if alt not in values:
                            out.append(f"{where}: {metric}{{{label}=\"{alt}\"}} is not in the output")
        for label in re.findall(r"by \(([^)]*)\)", expr) + re.findall(r"\{\{(\w+)\}\}", legend):
            for name in label.split(","):
                if name.strip() not in names:
                    out.append(f"{where}: no metric of it has the label {name.strip()}")
    return out


def test_dashboard_is_valid_grafana_json():
    dash = load()
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 30
    assert dash["title"] and dash["uid"]
    ds = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert len(ds) == 1 and ds[0]["name"] == "datasource" and ds[0]["query"] == "prometheus", ds
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["type"] in ("timeseries", "state-timeline", "stat", "gauge"), p["type"]
        assert p["title"] and set(p["gridPos"]) == {"h", "w", "x", "y"}
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["expr"] and t["datasource"]["uid"] == "${datasource}"
    titles = {p["title"] for p in dash["panels"]}
    for want in ("Read hit ratio", "IOPS by operation", "Bytes by operation", "Latency percentiles",
                 "Latency hiccup bands", "Dirty bytes and watermarks", "Destage rate", "Time to drain",
                 "Device state"):
        assert want in titles


def test_checker_finds_a_renamed_metric_or_label():
    samples = {"nvcachefs_dirty_bytes": [{"mountpoint": "/m"}],
               "nvcachefs_latency_seconds": [{"mountpoint": "/m", "op": "read", "quantile": "0.5"}]}
    assert not problems([("p", 'nvcachefs_latency_seconds{mountpoint=~"$m",op=~"read"}', "{{op}}")], samples)
    assert problems([("p", "nvcachefs_dirty_byte", "")], samples)
    assert problems([("p", 'nvcachefs_latency_seconds{op=~"read|writes"}', "")], samples)
    assert problems([("p", 'nvcachefs_latency_seconds{kind="read"}', "")], samples)
    assert problems([("p", "nvcachefs_dirty_bytes", "{{device}}")], samples)


def test_every_dashboard_query_exists_in_prometheus_output(cache):
    c = cache
    data = os.urandom(2 * MiB)
    with open(c.path("f"), "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    os.listdir(c.mnt)
    with open(c.path("f"), "rb") as f:
        assert f.read() == data
    c.flush()
    samples = parse_exposition(c.ctl("stats", c.mnt, "--prometheus").stdout)
    found = problems(list(exprs(load())), samples)
    assert not found, "\n".join(found)
