"""tools/bench/dfsbench.py: suite.py --dfs — nvcachefs over GlusterFS, MooseFS and CephFS against each store alone, the FUSE floor and the raw DIMM, a two-node MPI-IO checkpoint and the metadata rate."""
import json
import multiprocessing
import os
import shutil
import struct
import subprocess
import sys
import time

from suite import CTL, MiB, ROOT, Bench, sh

sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import dfs  # noqa: E402  the distributed-store fixtures of the integration tests

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = {"gluster": "GlusterFS", "moosefs": "MooseFS", "ceph": "CephFS"}
BLK = 4096
PER_NODE = 4  # checkpoint processes per node; two nodes


def block(rank, off):
    """The 4 KiB block that rank writes at file offset off (as ckpt_mpi.c writes it)."""
    return struct.pack("<QQ", rank, off) + bytes([(31 * rank + off // BLK) & 0xFF]) * (BLK - 16)


def expected(sizes):
    """The checkpoint file: each rank's blocks at their offsets."""
    out, off = bytearray(), 0
    for r, size in enumerate(sizes):
        for b in range(0, size, BLK):
            out += block(r, off + b)
        off += size
    return bytes(out)


def plain_rank(rank, path, off, size, create, barrier, q):
    """One checkpoint process without MPI: open (rank 0 creates first), write its block, fsync, close."""
    buf = b"".join(block(rank, off + b) for b in range(0, size, BLK))
    if create:
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    barrier.wait()
    t0 = time.time()
    fd = os.open(path, os.O_WRONLY)
    t_open = time.time() - t0
    barrier.wait()
    t0 = time.time()
    n = os.pwrite(fd, buf, off)
    t_write = time.time() - t0
    os.fsync(fd)
    t_sync = time.time() - t0
    os.close(fd)
    q.put((rank, n, t_open, t_write, t_sync, time.time() - t0 - t_sync))


class DfsBench(Bench):
    """The --dfs run: every target of one run measured with the same workloads."""

    def __init__(self, quick, out, kinds, before=None, mpi=True):
        super().__init__(quick, out)
        self.kinds = kinds
        self.before = before          # a build directory: its daemon's creates are measured too
        self.mpi = mpi
        self.secs = 2 if quick else 5
        self.ws = (64 if quick else 256) * MiB
        self.dimm = (256 if quick else 1024) * MiB
        self.nfiles = 500 if quick else 2000
        self.stores = {}
        self.nvc = {}                 # target -> its mount (nvcachefs targets)
        self.ckpt = []                # checkpoint rows
        self.ckpt_tool = None
        self.store_secs = {}

    # ------------------------------------------------------------ targets
    def setup(self):
        os.makedirs(self.dir)
        self.backing = os.path.join(self.dir, "backing")
        os.makedirs(self.backing)
        self.raw_dimms = [self.loop(f"raw{i}", self.dimm) for i in range(2)]
        self.targets = {"raw": self.raw_dimms[0]}  # "raw": fio and prepare take it as a block device
        try:
            self.targets["FUSE floor (bindfs)"] = self.mount_bindfs()
        except Exception as e:
            self.targets["FUSE floor (bindfs)"] = None
            self.notes.append(f"bindfs could not run: {e}")
        self.targets["local disk"] = os.path.join(self.backing, "plain")
        os.makedirs(self.targets["local disk"])
        self.add_nvc("nvcachefs/local", "nvl", None)
        if self.before:
            self.add_nvc("nvcachefs-before/local", "nvlb", None, build=self.before)
        for kind in self.kinds:
            t0 = time.time()
            store = dfs.STORES[kind]().start()
            self.stores[kind] = store
            self.store_secs[kind] = time.time() - t0
            self.targets[NAMES[kind]] = store.subdir("alone")[0]
            self.add_nvc(f"nvcachefs/{NAMES[kind]}", f"nv-{kind}", store.subdir("nvc")[0])
            if self.before:
                self.add_nvc(f"nvcachefs-before/{NAMES[kind]}", f"nvb-{kind}", store.subdir("nvcb")[0],
                             build=self.before)
        self.build_ckpt()

    def add_nvc(self, target, name, backing, build=None):
        devs = [self.loop(f"{name}-{i}", self.dimm) for i in range(2)]
        self.targets[target] = self.mount_nvc(name, devs, name, backing=backing, build=build)
        self.nvc[target] = self.targets[target]

    def build_ckpt(self):
        """ckpt_mpi with Debian's mpich, or plain processes when it is not installed."""
        if not self.mpi:
            self.notes.append("checkpoint: plain processes (--no-mpi)")
            return
        missing = [b for b in ("mpicc", "mpirun") if not shutil.which(b)]
        if missing:
            self.notes.append(f"checkpoint: plain processes ({', '.join(missing)} not installed: "
                              "apt-get install mpich libmpich-dev)")
            return
        exe = os.path.join(self.dir, "ckpt_mpi")
        sh("mpicc", "-O2", "-Wall", "-o", exe, os.path.join(HERE, "ckpt_mpi.c"))
        self.ckpt_tool = exe

    def stop_stores(self):
        for s in self.stores.values():
            s.stop()
        self.stores = {}

    def cleanup(self):
        try:
            super().cleanup()
        finally:
            self.stop_stores()

    # ------------------------------------------------------------ workloads
    def flush(self, target):
        if target in self.nvc:
            sh(CTL, "flush", self.nvc[target], timeout=600)

    def flush_all(self):
        for x in self.nvc:
            self.flush(x)

    def run(self):
        common = ["--time_based", f"--runtime={self.secs}", "--direct=1", "--ioengine=psync"]
        fio_targets = [x for x in self.targets if not x.startswith("nvcachefs-before")]
        for x in fio_targets:
            self.prepare(x, self.ws)
            where = self.targets[x]
            if where and x != "raw":  # a second read: nvcachefs' cache is warm, whatever it destaged
                sh("dd", f"if={os.path.join(where, 'data')}", "of=/dev/null", "bs=1M", "iflag=direct",
                   check=False)
        self.flush_all()
        jobs = [
            ("4K randread QD1 (warm)", ["--rw=randread", "--bs=4k"], "data"),
            ("1M seqread (warm)", ["--rw=read", "--bs=1M"], "data"),
            ("4K write + fdatasync QD1", ["--rw=write", "--bs=4k", "--fdatasync=1"], "log"),
            ("1M seqwrite", ["--rw=write", "--bs=1M"], "seq"),
        ]
        for name, args, file in jobs:
            for x in self.targets:
                if x not in fio_targets:
                    self.results[(name, x)] = {"skip": "creates only"}
                    continue
                self.results[(name, x)] = self.fio(x, name, common + args, self.ws, file=file)
                self.flush(x)  # destage of one cell's writes does not run into the next
            print(f"  {name}: done", flush=True)
        self.metadata_dfs()
        for kind in self.kinds:
            self.checkpoint_dfs(kind)

    def metadata_dfs(self):
        """Create (4 KiB each), stat and unlink small files in one directory, every target in turn, twice;
        the better round of each counts (the machine is shared)."""
        name = "metadata"
        for x, where in self.targets.items():
            if x == "raw":
                self.results[(name, x)] = {"skip": "a block device has no files"}
                continue
            if where is None:
                self.results[(name, x)] = {"skip": "not mounted (see notes)"}
                continue
        for rnd in range(2):
            for x, where in self.targets.items():
                if x == "raw" or where is None:
                    continue
                try:
                    r = self.md_one(os.path.join(where, f"md{rnd}"), self.nfiles)
                except OSError as e:
                    self.results[(name, x)] = {"skip": f"failed: {e.strerror}"}
                    continue
                self.flush(x)
                old = self.results.get((name, x), {})
                self.results[(name, x)] = {k: max(v, old.get(k, 0)) for k, v in r.items()}
        print("  metadata: done", flush=True)

    # ------------------------------------------------------------ checkpoint
    def run_ckpt(self, paths, sizes, mode):
        """One checkpoint ("mpi" or "plain" processes); the slowest process's times (s)."""
        if mode == "mpi":
            # "ufs:": ROMIO's generic driver, without a statfs of the path before rank 0 creates the file
            # (node 2 would cache that the name is absent for fuse.attr_timeout; see the report's notes)
            r = sh("mpirun", "-np", str(len(sizes)), self.ckpt_tool, str(PER_NODE),
                   ",".join(str(s // 1024) for s in sizes), *("ufs:" + p for p in paths), timeout=600)
            return json.loads(r.stdout.strip().splitlines()[-1])
        barrier, q = multiprocessing.Barrier(len(sizes)), multiprocessing.Queue()
        procs, off = [], 0
        for r, size in enumerate(sizes):
            p = multiprocessing.Process(target=plain_rank, args=(r, paths[r // PER_NODE], off, size, r == 0,
                                                                 barrier, q))
            p.start()
            procs.append(p)
            off += size
        res = [q.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        if any(n != sizes[r] for r, n, *_ in res):
            raise RuntimeError("a checkpoint process wrote short")
        return {"open_s": max(x[2] for x in res), "write_s": max(x[3] for x in res),
                "ack_s": max(x[4] for x in res), "close_s": max(x[5] for x in res), "bytes": sum(sizes),
                "procs": len(sizes)}

    def verify(self, path, want):
        """Byte for byte: None, or where the file first differs."""
        with open(path, "rb") as f:
            got = f.read()
        if got == want:
            return None
        n = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
        return f"differs at byte {n} (size {len(got)}, want {len(want)})"

    def conflicts(self, mnt):
        st = json.loads(sh(CTL, "stats", mnt, "--json").stdout)["total"]["counters"]
        return st.get("conflicts", 0)

    def checkpoint_dfs(self, kind):
        """N processes on two nodes write one shared file at disjoint offsets, then each node flushes.
        Node 1 is a cache over client mount 1, node 2 a cache over client mount 2, of one directory."""
        store = self.stores[kind]
        d1, d2 = store.subdir("ckpt-nvc")
        a1, a2 = store.subdir("ckpt-alone")
        nodes = []
        for n, d in enumerate((d1, d2)):
            devs = [self.loop(f"ck{n}-{kind}-{i}", self.dimm) for i in range(2)]
            nodes.append(self.mount_nvc(f"ck{n + 1}-{kind}", devs, "x", backing=d))
        procs = 2 * PER_NODE
        rounds = [("1 MiB each", [1 * MiB] * procs), ("2 MiB each", [2 * MiB] * procs),
                  ("4 MiB each", [4 * MiB] * procs), ("1-4 MiB mixed", [(1 + r % 4) * MiB for r in range(procs)])]
        modes = ["mpi", "plain"] if self.ckpt_tool else ["plain"]
        for mode, (label, sizes) in [(m, r) for m in modes for r in rounds]:
            fname = f"ckpt-{mode}-" + label.split()[0]
            want = expected(sizes)
            row = {"store": NAMES[kind], "sizes": label, "procs": procs, "bytes": sum(sizes),
                   "how": "MPI-IO" if mode == "mpi" else "plain"}
            # the store alone: fsync returned, the store holds it
            r = self.run_ckpt([os.path.join(a1, fname), os.path.join(a2, fname)], sizes, mode)
            row.update(alone_open=r["open_s"], alone_ack=r["ack_s"], alone_close=r["close_s"])
            row["alone_ok"] = self.verify(os.path.join(a2, fname), want) or \
                self.verify(os.path.join(a1, fname), want) or "yes"
            # nvcachefs on both nodes: acknowledged from the caches, then each node flushes
            before = [self.conflicts(m) for m in nodes]
            r = self.run_ckpt([os.path.join(m, fname) for m in nodes], sizes, mode)
            t0 = time.time()
            flushes = [subprocess.Popen([CTL, "flush", m], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True) for m in nodes]
            errs = [p.communicate(timeout=600)[1] for p in flushes]
            row["nvc_flush"] = time.time() - t0
            row.update(nvc_open=r["open_s"], nvc_ack=r["ack_s"], nvc_close=r["close_s"])
            # from the start of the writes: acknowledged, closed, then both nodes' flushes done (the flushes
            # start once mpirun has returned; its exit is not counted)
            row["nvc_store"] = r["ack_s"] + r["close_s"] + row["nvc_flush"]
            row["flush_rc"] = [p.returncode for p in flushes]
            if any(row["flush_rc"]):
                self.notes.append(f"checkpoint {kind} {label}: flush failed: {' '.join(errs)[:200]}")
            row["nvc_ok"] = self.verify(os.path.join(d1, fname), want) or \
                self.verify(os.path.join(d2, fname), want) or "yes"
            row["conflicts"] = [self.conflicts(m) - b for m, b in zip(nodes, before)]
            self.ckpt.append(row)
        print(f"  checkpoint {kind}: done", flush=True)

    # ------------------------------------------------------------ report
    def val(self, wl, x, key):
        r = self.results.get((wl, x), {})
        return None if not r or "skip" in r else r.get(key)

    @staticmethod
    def num(v, key):
        if v is None:
            return "-"
        return f"{v / 1e6:.1f}" if key == "bw" else f"{v:.0f}"

    @staticmethod
    def rat(a, b):
        return f"{a / b:.2f}x" if a and b else "-"

    def rows(self):
        """(label, workload, key) of the tables: fio workloads, then the metadata rates."""
        return [("4K write + fdatasync QD1, IOPS", "4K write + fdatasync QD1", "iops"),
                ("4K randread QD1 (warm), IOPS", "4K randread QD1 (warm)", "iops"),
                ("1M seqread (warm), MB/s", "1M seqread (warm)", "bw"),
                ("1M seqwrite, MB/s", "1M seqwrite", "bw"),
                ("creates/s (4 KiB files)", "metadata", "create"),
                ("stat/s", "metadata", "stat"),
                ("unlinks/s", "metadata", "unlink")]

    def report(self, started):
        os.makedirs(self.out, exist_ok=True)
        md = []
        w = md.append
        w(f"# nvcachefs over distributed stores ({'quick' if self.quick else 'full'})\n")
        w(f"Run {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}, {time.time() - started:.0f} s, "
          f"`tools/bench/suite.py --dfs {','.join(self.kinds)}{' --quick' if self.quick else ''}`. "
          f"fio {self.secs} s per cell, direct I/O, QD1 (psync); working set {self.ws // MiB} MiB, written, then "
          f"read twice through each target before the reads (nvcachefs' cache is warm; every cache flushed "
          f"before each cell); {self.nfiles} files per metadata round, best of two rounds. nvcachefs: two "
          f"{self.dimm // MiB} MiB emulated DIMMs each (loop devices over /dev/shm, direct I/O), default "
          f"configuration. Stores: dfs.py's fixtures (two hosts in network namespaces on this machine; "
          f"GlusterFS 2-brick distribute volume, MooseFS master + 2 chunkservers, goal 2, client caches off "
          f"as the fixtures set them; CephFS mon + mgr + MDS and one BlueStore OSD, pools of size 1, ceph-fuse "
          f"with its default options). FUSE floor: bindfs over the local disk. Taken on a shared 2-core "
          f"machine with other jobs running: single cells move by 2x between runs; read the ratios.\n")
        for n in self.notes:
            w(f"- {n}")
        w("")
        floor, raw = "FUSE floor (bindfs)", "raw"
        for kind in self.kinds:
            st, nv = NAMES[kind], f"nvcachefs/{NAMES[kind]}"
            w(f"## nvcachefs over {st}\n")
            w(f"| workload | {st} alone | nvcachefs over {st} | vs {st} alone | raw DIMM | vs raw | FUSE floor "
              f"(bindfs) | vs FUSE floor |")
            w("|---|---|---|---|---|---|---|---|")
            for label, wl, key in self.rows():
                a, b, r, f = (self.val(wl, x, key) for x in (st, nv, raw, floor))
                w(f"| {label} | {self.num(a, key)} | {self.num(b, key)} | {self.rat(b, a)} | {self.num(r, key)} | "
                  f"{self.rat(b, r)} | {self.num(f, key)} | {self.rat(b, f)} |")
            w("")
        w("## Every target\n")
        xs = list(self.targets)
        w("| workload | " + " | ".join(xs) + " |")
        w("|---|" + "---|" * len(xs))
        for label, wl, key in self.rows():
            w(f"| {label} | " + " | ".join(self.num(self.val(wl, x, key), key) for x in xs) + " |")
        w("")
        if self.ckpt:
            w("## HPC checkpoint: one shared file, two nodes\n")
            how = ("MPI-IO (Debian's mpich, `tools/bench/ckpt_mpi.c`: `MPI_File_open` of `ufs:PATH` on each "
                   "node's path, `MPI_File_write_at` at disjoint offsets, `MPI_File_sync`, `MPI_File_close`), and "
                   "again with plain processes (open, pwrite, fsync, close; Python), because MPICH's processes "
                   "busy-poll: 8 of them on 2 cores leave little CPU to the file systems and dominate the MPI "
                   "times") if self.ckpt_tool else "plain processes (open, pwrite at disjoint offsets, fsync, close)"
            w(f"{2 * PER_NODE} processes, {PER_NODE} per node, with {how}. Node 1 writes through nvcachefs over "
              f"client mount 1, node 2 through its own nvcachefs over client mount 2, of the same directory; "
              f"then both nodes run `nvcachectl flush` at once. Times are the slowest process's, from a barrier "
              f"once all have the file open (the collective open is shown apart: 8 MPI processes busy-polling on "
              f"2 cores make it slow and noisy). Acknowledged: every write and the fsync (`MPI_File_sync`) have "
              f"returned; for the store alone the store then holds the checkpoint. nvcachefs on the store: "
              f"acknowledged, closed, and both nodes' flushes returned. The file is then read through both "
              f"client mounts and compared byte for byte with what the processes wrote. Conflicts: the "
              f"`conflicts` counter of node 1 / node 2 during the round (`backing.on_conflict = overwrite`).\n")
            w("| store | processes | per process | MiB | store alone: open s | acknowledged = on the store, s "
              "| nvcachefs: open s | acknowledged, s | on the store, s (flush s) | ack: store alone / nvcachefs "
              "| on the store: store alone / nvcachefs | verified (alone / nvcachefs) | conflicts |")
            w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in self.ckpt:
                w(f"| {r['store']} | {r['how']} | {r['sizes']} | {r['bytes'] // MiB} | {r['alone_open']:.3f} | "
                  f"{r['alone_ack']:.3f} | {r['nvc_open']:.3f} | {r['nvc_ack']:.3f} | {r['nvc_store']:.3f} "
                  f"({r['nvc_flush']:.3f}) | {r['alone_ack'] / r['nvc_ack']:.2f}x | "
                  f"{r['alone_ack'] / r['nvc_store']:.2f}x | {r['alone_ok']} / {r['nvc_ok']} | "
                  f"{r['conflicts'][0]} / {r['conflicts'][1]} |")
            w("")
        if self.before:
            w("## Creates before and after\n")
            w(f"`nvcachefs-before`: the daemon of `{self.before}`, in the same run.\n")
            w("| backing | store alone creates/s | before | after | before vs store | after vs store |")
            w("|---|---|---|---|---|---|")
            for st in ["local"] + [NAMES[k] for k in self.kinds]:
                alone = self.val("metadata", "local disk" if st == "local" else st, "create")
                b = self.val("metadata", f"nvcachefs-before/{st}", "create")
                a = self.val("metadata", f"nvcachefs/{st}", "create")
                w(f"| {st} | {self.num(alone, 'create')} | {self.num(b, 'create')} | {self.num(a, 'create')} | "
                  f"{self.rat(b, alone)} | {self.rat(a, alone)} |")
            w("")
        w("Store start-up: " + ", ".join(f"{NAMES[k]} {s:.1f} s" for k, s in self.store_secs.items()) + ".")
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(md) + "\n")
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump({"results": {f"{k[0]} | {k[1]}": v for k, v in self.results.items()},
                       "checkpoint": self.ckpt}, f, indent=1)
        self.plot()

    def plot(self):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        rows = self.rows()
        fig, axes = plt.subplots(len(rows), 1, figsize=(10, 2.4 * len(rows)))
        for ax, (label, wl, key) in zip(axes, rows):
            xs = [x for x in self.targets if self.val(wl, x, key)]
            ys = [self.val(wl, x, key) / (1e6 if key == "bw" else 1) for x in xs]
            ax.barh(xs, ys, color=["#c44" if x.startswith("nvcachefs/") else "#888" for x in xs])
            ax.set_title(label, fontsize=9)
            ax.tick_params(labelsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(self.out, "dfs.png"), dpi=90)
        plt.close(fig)
