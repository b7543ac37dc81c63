"""A random multi-file workload applied to the mount and to a plain reference directory alike."""
import mmap
import os
import random
import stat
import threading

KiB = 1024
MiB = 1 << 20


def tree(root):
    """name -> (kind, content or target) for every entry below root."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir", None)
            elif not stat.S_ISREG(st.st_mode):
                out[rel] = ("special", stat.S_IFMT(st.st_mode))
            else:
                with open(p, "rb") as f:
                    out[rel] = ("file", f.read(), st.st_size)
    return out


def assert_same_tree(a, b):
    ta, tb = tree(a), tree(b)
    assert sorted(ta) == sorted(tb), (sorted(set(ta) ^ set(tb)))[:10]
    for k in ta:
        if ta[k] != tb[k]:
            ka, kb = ta[k], tb[k]
            if ka[0] == "file" and kb[0] == "file":
                da, db = ka[1], kb[1]
                first = next((i for i in range(min(len(da), len(db))) if da[i] != db[i]), min(len(da), len(db)))
                raise AssertionError(f"{k}: sizes {len(da)} vs {len(db)}, first difference at byte {first}")
            raise AssertionError(f"{k}: {ka[0]} vs {kb[0]}")


class Worker:
    """Applies the same random operations to its own files under two roots."""

    def __init__(self, roots, wid, seed, max_size=4 * MiB, nfiles=4):
        self.roots = roots
        self.rng = random.Random(seed)
        self.names = [f"w{wid}-f{i}" for i in range(nfiles)]
        self.max_size = max_size
        self.wid = wid
        self.errors = []
        self.ops = 0

    def both(self, fn):
        return [fn(r) for r in self.roots]

    def step(self):
        rng = self.rng
        name = rng.choice(self.names)
        paths = [os.path.join(r, name) for r in self.roots]
        op = rng.random()
        exists = os.path.exists(paths[1])
        if not exists or op < 0.40:
            off = rng.randrange(0, self.max_size)
            n = rng.choice([1, 7, 512, 4096, 4096, 65536, rng.randrange(1, 300 * KiB)])
            data = rng.randbytes(n)
            for p in paths:
                fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    assert os.pwrite(fd, data, off) == n
                finally:
                    os.close(fd)
        elif op < 0.60:
            off = rng.randrange(0, self.max_size)
            n = rng.randrange(1, 400 * KiB)
            got = []
            for p in paths:
                with open(p, "rb") as f:
                    f.seek(off)
                    got.append(f.read(n))
            assert got[0] == got[1], f"{name}: read {n} at {off} differs"
        elif op < 0.67:
            size = rng.randrange(0, self.max_size)
            for p in paths:
                os.truncate(p, size)
        elif op < 0.74:
            data = rng.randbytes(rng.randrange(1, 20000))
            for p in paths:
                with open(p, "ab") as f:
                    f.write(data)
        elif op < 0.78:
            other = rng.choice(self.names)
            for r in self.roots:
                os.rename(os.path.join(r, name), os.path.join(r, other))
        elif op < 0.81:
            for p in paths:
                os.unlink(p)
        elif op < 0.85:
            for p in paths:
                fd = os.open(p, os.O_RDWR)
                os.fsync(fd)
                os.close(fd)
        elif op < 0.92:
            size = os.path.getsize(paths[1])
            if size > 0:
                off = rng.randrange(0, size)
                n = min(rng.randrange(1, 64 * KiB), size - off)
                data = rng.randbytes(n)
                for p in paths:
                    with open(p, "r+b") as f:
                        m = mmap.mmap(f.fileno(), size)
                        m[off:off + n] = data
                        m.flush()
                        m.close()
        else:
            s = [os.stat(p) for p in paths]
            assert s[0].st_size == s[1].st_size, f"{name}: size {s[0].st_size} vs {s[1].st_size}"
        self.ops += 1

    def run(self, steps):
        try:
            for _ in range(steps):
                self.step()
        except Exception as e:  # reported by the test
            self.errors.append(e)


def run_workload(mnt, ref, nthreads=4, steps=300, seed=1, **kw):
    workers = [Worker([mnt, ref], i, seed * 1000 + i, **kw) for i in range(nthreads)]
    threads = [threading.Thread(target=w.run, args=(steps,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in workers:
        if w.errors:
            raise w.errors[0]
    return sum(w.ops for w in workers)
