"""Bench: the cost of [policy] rules at open — opens through the mount with no rules vs 20 rules (none
matching the files, so every rule is tried). Alternating rounds in one mount; opens per second and the ratio."""
import os, sys, signal, time, tempfile, subprocess
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "integration"))
os.environ.setdefault("NVC_BUILD", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build"))
from conftest import Cache
from test_policy import with_rules

RULES = "".join(f"[policy p{i}]\nmatch = dir{i}/**\nmatch = *.ext{i}\npriority = low\n" for i in range(20))
N = 3000
tmp = tempfile.mkdtemp(prefix="nvc-pbench-")
c = Cache(tmp)
res = {"none": [], "20 rules": []}
try:
    c.write_conf()
    c.format()
    c.mount()
    os.makedirs(c.path("a/b/c"))
    names = [c.path("a/b/c", f"f{i}") for i in range(100)]
    for n in names:
        open(n, "wb").close()
    for rnd in range(3):
        for label, rules in (("none", ""), ("20 rules", RULES)):
            with_rules(c, rules)
            c.proc.send_signal(signal.SIGHUP)
            time.sleep(0.3)
            t0 = time.perf_counter()
            for i in range(N):
                fd = os.open(names[i % 100], os.O_RDONLY)
                os.close(fd)
            res[label].append(N / (time.perf_counter() - t0))
    for k, v in res.items():
        print(k, " ".join(f"{x:.0f}" for x in v), "opens/s")
    print("ratio 20 rules / none per round:", " ".join(f"{b / a:.2f}" for a, b in zip(res["none"], res["20 rules"])))
    c.unmount()
finally:
    c.cleanup()
    subprocess.run(["rm", "-rf", tmp])
