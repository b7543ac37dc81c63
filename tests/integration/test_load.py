"""Load through the real mount: 32 workers race writes, reads, truncates, renames and unlinks on a small cache held
at 100% dirty in front of a rate-capped destage, with a hang watchdog; then flush and compare every file byte for byte.

Each worker owns its files and does its operations on them in sequence, so its in-memory reference is exact while
all workers race inside the cache (shared slots, eviction, destage, waits for space). Readers re-read files that
their owner has closed and parked for them. Cases: space (the cache full of dirty data), small (4 KiB blocks, fewer
file records than open files), copies2 (dirty_copies = 2 on three devices). Knobs (environment):
  NVC_LOAD_SECONDS (35 for the space case, 40% of it for small, 50% for copies2; 600 by hand), NVC_LOAD_SEED, NVC_LOAD_WORKERS (32), NVC_LOAD_READERS (2),
  NVC_LOAD_RATE (4M), NVC_LOAD_NDEVS (2), NVC_LOAD_DEV_MB (32), NVC_LOAD_BS (64K), NVC_LOAD_COPIES (1),
  NVC_LOAD_MAX_SIZE_MB (2), NVC_LOAD_WATCHDOG (60 s without any completed operation),
  NVC_LOAD_OP_LIMIT (150 s for one operation), NVC_LOAD_FLUSH_EVERY (seconds between `nvcachectl flush` runs
  racing the workers; 0: none; space: 15, small: 4), NVC_LOAD_CONF ("section.key=value;..." extra config keys),
  NVC_LOAD_EVIDENCE (a directory that receives the report, the figures and the daemon log).
"""
import collections
import ctypes
import json
import mmap
import os
import queue
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest

from conftest import CTL, sh

KiB = 1024
MiB = 1 << 20


def env(name, default, conv=str):
    v = os.environ.get(name)
    return conv(v) if v not in (None, "") else default


SECONDS = env("NVC_LOAD_SECONDS", 35.0, float)
WORKERS = env("NVC_LOAD_WORKERS", 32, int)
READERS = env("NVC_LOAD_READERS", 2, int)
RATE = env("NVC_LOAD_RATE", "4M")
NDEVS = env("NVC_LOAD_NDEVS", 2, int)
DEV_MB = env("NVC_LOAD_DEV_MB", 32, int)
BS = env("NVC_LOAD_BS", "64K")
COPIES = env("NVC_LOAD_COPIES", 1, int)
MAX_SIZE = env("NVC_LOAD_MAX_SIZE_MB", 2, float)
WATCHDOG = env("NVC_LOAD_WATCHDOG", 60.0, float)
OP_LIMIT = env("NVC_LOAD_OP_LIMIT", 150.0, float)
EXTRA = env("NVC_LOAD_CONF", "")
EVIDENCE = env("NVC_LOAD_EVIDENCE", "")

NAMES_PER_WORKER = 4      # a worker's name pool; at most LIVE_PER_WORKER of them exist at once
DIRS = ("a", "b")
LIVE_PER_WORKER = 3
SLOW_WRITE = 0.100        # a write slower than this waited (for space, most likely)
MAGIC = b"NVCL"
STAMP = struct.Struct("<4sIIII")  # magic, file serial, write generation, file offset / 512, worker
UNIT = 512


LIBC = ctypes.CDLL(None, use_errno=True)
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2


class Failure(Exception):
    pass


# ------------------------------------------------------------------------------------------------- reference

class RefFile:
    """One incarnation of a file (an inode): its names (hard links), its exact expected content, the owner's
    descriptor."""

    def __init__(self, name, serial):
        self.names = [name]
        self.serial = serial
        self.data = bytearray()
        self.fd = None
        self.parked = None   # an Event while a reader has it

    @property
    def name(self):
        return self.names[0]

    def write(self, off, buf):
        if off > len(self.data):
            self.data.extend(bytes(off - len(self.data)))
        self.data[off:off + len(buf)] = buf

    def truncate(self, size):
        if size < len(self.data):
            del self.data[size:]
        else:
            self.data.extend(bytes(size - len(self.data)))


class Registry:
    """Which worker and name each file serial belonged to, for telling where misplaced bytes came from."""

    def __init__(self):
        self.lock = threading.Lock()
        self.serials = {}
        self.next = 1

    def new(self, wid, name):
        with self.lock:
            s = self.next
            self.next += 1
            self.serials[s] = (wid, name)
            return s

    def describe(self, serial):
        wid, name = self.serials.get(serial, (None, "?"))
        return f"serial {serial} (worker {wid}, created as {name})"


def make_data(rng, serial, gen, wid, off, n):
    """Random bytes with a stamp at every 512-aligned file offset they cover."""
    buf = bytearray(rng.randbytes(n))
    p = (off + UNIT - 1) // UNIT * UNIT
    while p + STAMP.size <= off + n:
        STAMP.pack_into(buf, p - off, MAGIC, serial, gen, p // UNIT, wid)
        p += UNIT
    return buf


def diagnose(reg, name, serial, base, want, got):
    """What differs between want and got (both starting at file offset base), and whose bytes are there."""
    n = min(len(want), len(got))
    if len(want) != len(got):
        head = f"{name}: length {len(got)} read, {len(want)} expected at offset {base}"
    else:
        head = f"{name}: content differs at offset {base}+"
    ranges, i = [], 0
    while i < n and len(ranges) < 6:
        if want[i] != got[i]:
            j = i
            while j < n and want[j] != got[j]:
                j += 1
            ranges.append((i, j))
            i = j
        else:
            i += 1
    lines = [head, f"  file serial {serial}; differing ranges (relative): {ranges}"]
    for a, _ in ranges[:3]:
        u = (base + a) // UNIT * UNIT - base
        if u < 0:
            u += UNIT
        if u + STAMP.size > n:
            continue
        for what, b in (("expected", want), ("found", got)):
            m, s, g, o, w = STAMP.unpack_from(b, u)
            if m == MAGIC:
                lines.append(f"  at file offset {base + u}: {what} stamp of {reg.describe(s)} write gen {g} "
                             f"for file offset {o * UNIT}")
            elif not any(b[u:u + STAMP.size]):
                lines.append(f"  at file offset {base + u}: {what} zeros")
            else:
                lines.append(f"  at file offset {base + u}: {what} unstamped bytes {bytes(b[u:u + 16]).hex()}")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------- workers

class Shared:
    """What workers, readers, the watchdog and the test share."""

    def __init__(self, root, seed):
        self.root = root
        self.seed = seed
        self.stop = threading.Event()
        self.reg = Registry()
        self.errors = []
        self.err_lock = threading.Lock()
        self.progress = None
        self.parked = queue.Queue()
        self.odirect = True
        self.punch = True

    def fail(self, who, msg):
        with self.err_lock:
            self.errors.append(f"[{who} at {time.strftime('%H:%M:%S')}] {msg}")
        self.stop.set()


class Progress:
    """A small file both this process and the monitor map: when an operation last completed, and each actor's
    operation in flight (start time, description).  Plain stores into memory: no system call, no GIL-bound wait."""

    HEAD = struct.Struct("<Q")
    REC = struct.Struct("<Q120s")

    def __init__(self, path, nactors, create=True):
        size = self.HEAD.size + nactors * self.REC.size
        if create:
            with open(path, "wb") as fh:
                fh.truncate(size)
        self.fd = os.open(path, os.O_RDWR)
        self.m = mmap.mmap(self.fd, size)
        self.n = nactors
        if create:
            self.done()

    def done(self):
        self.HEAD.pack_into(self.m, 0, time.monotonic_ns())

    def set(self, i, t_ns, desc=""):
        self.REC.pack_into(self.m, self.HEAD.size + i * self.REC.size, t_ns, desc.encode()[:120])

    def last_done(self):
        return self.HEAD.unpack_from(self.m, 0)[0]

    def busy(self):
        out = []
        for i in range(self.n):
            t, d = self.REC.unpack_from(self.m, self.HEAD.size + i * self.REC.size)
            if t:
                out.append((t, d.rstrip(b"\0").decode(errors="replace")))
        return out


class Actor(threading.Thread):
    """A thread that counts its operations and says what it is doing, for the monitor."""

    def __init__(self, sh_, label, slot):
        super().__init__(name=label, daemon=True)
        self.sh = sh_
        self.label = label
        self.slot = slot
        self.ops = collections.Counter()
        self.bytes_written = 0
        self.bytes_read = 0
        self.stack = []          # (description, start time) of the operations in progress, outermost first
        self.log = collections.deque(maxlen=40)
        self.write_lat = []

    def begin(self, desc):
        t = time.monotonic_ns()
        if not self.stack:
            self.sh.progress.set(self.slot, t, f"{self.label}: {desc}")
        self.stack.append((desc, t))

    def end(self, kind):
        desc, t0 = self.stack.pop()
        t = time.monotonic_ns()
        if not self.stack:
            self.sh.progress.set(self.slot, 0)
        self.sh.progress.done()
        self.ops[kind] += 1
        self.log.append(f"{desc} {(t - t0) / 1e6:.1f} ms")
        return (t - t0) / 1e9

    def run(self):
        try:
            self.body()
        except Failure as e:
            self.sh.fail(self.label, str(e))
        except OSError as e:
            desc = self.stack[-1][0] if self.stack else "?"
            self.sh.fail(self.label, f"{desc}: {e!r}\n  recent: " + "\n          ".join(self.log))
        except Exception as e:  # a bug in the test itself still fails the test
            import traceback
            self.sh.fail(self.label, "".join(traceback.format_exception(e)))


class Worker(Actor):
    """Random operations, in sequence, on files only this worker touches."""

    def __init__(self, sh_, wid, deadline):
        super().__init__(sh_, f"w{wid:02d}", wid)
        self.wid = wid
        self.rng = random.Random(sh_.seed * 1000 + wid)
        self.deadline = deadline
        # names in two directories shared by all workers: renames and links also cross directories
        self.names = [f"{DIRS[k % len(DIRS)]}/w{wid:02d}-{k}" for k in range(NAMES_PER_WORKER)]
        self.files = {}           # name -> RefFile
        self.gen = 0
        self.max_size = int(MAX_SIZE * MiB)

    # ---------------------------------------------------------------- helpers
    def path(self, name):
        return os.path.join(self.sh.root, name)

    def fd(self, f):
        if f.fd is None:
            self.begin(f"open {f.name}")
            f.fd = os.open(self.path(f.name), os.O_RDWR)
            self.end("open")
        return f.fd

    def close(self, f):
        if f.fd is not None:
            self.begin(f"close {f.name}")
            os.close(f.fd)
            f.fd = None
            self.end("close")

    def usable(self):
        """The files (each inode once) not handed to a reader."""
        return list({id(f): f for f in self.files.values() if f.parked is None or f.parked.is_set()}.values())

    def verify_range(self, f, off, n, what):
        got = os.pread(self.fd(f), n, off)
        exp = bytes(f.data[off:off + n])
        if got != exp:
            raise Failure(f"{what}: " + diagnose(self.sh.reg, f.name, f.serial, off, exp, got))
        self.bytes_read += len(got)

    def new_data(self, f, off, n):
        self.gen += 1
        return make_data(self.rng, f.serial, self.gen, self.wid, off, n)

    def timed_write(self, desc, fn, n):
        self.begin(desc)
        t0 = time.monotonic()
        r = fn()
        lat = time.monotonic() - t0
        self.end("write")
        if r != n:
            raise Failure(f"{desc}: short write {r} of {n}")
        self.write_lat.append(lat)
        self.bytes_written += n

    def pick_size(self):
        rng = self.rng
        k = rng.random()
        if k < 0.25:
            return rng.randrange(1, 4096), False
        if k < 0.55:
            return 4096 * rng.randrange(1, 17), True
        if k < 0.80:
            return rng.randrange(4096, 256 * KiB), False
        return rng.randrange(256 * KiB, MiB + 1), rng.random() < 0.5

    # ---------------------------------------------------------------- operations
    def op_create(self):
        free = [n for n in self.names if n not in self.files]
        name = self.rng.choice(free)
        f = RefFile(name, self.sh.reg.new(self.wid, name))
        self.begin(f"create {name}")
        f.fd = os.open(self.path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self.end("create")
        self.files[name] = f
        if self.rng.random() < 0.7:
            n, _ = self.pick_size()
            data = self.new_data(f, 0, n)
            self.timed_write(f"write {name} {n}@0 (new)", lambda: os.pwrite(f.fd, data, 0), n)
            f.write(0, data)

    def op_write(self, f):
        n, aligned = self.pick_size()
        off = self.rng.randrange(0, self.max_size)
        if aligned:
            off &= ~4095
        data = self.new_data(f, off, n)
        fd = self.fd(f)
        self.timed_write(f"pwrite {f.name} {n}@{off} gen {self.gen}", lambda: os.pwrite(fd, data, off), n)
        f.write(off, data)

    def op_append(self, f):
        n, _ = self.pick_size()
        off = len(f.data)
        data = self.new_data(f, off, n)
        self.begin(f"open-append {f.name}")
        fd = os.open(self.path(f.name), os.O_WRONLY | os.O_APPEND)
        self.end("open")
        try:
            self.timed_write(f"append {f.name} {n}@{off} gen {self.gen}", lambda: os.write(fd, data), n)
        finally:
            os.close(fd)
        f.write(off, data)

    def op_direct(self, f):
        n = 4096 * self.rng.randrange(1, 65)
        off = self.rng.randrange(0, self.max_size) & ~4095
        data = self.new_data(f, off, n)
        buf = mmap.mmap(-1, n)   # page aligned, as O_DIRECT wants
        buf[:] = data
        self.begin(f"open-direct {f.name}")
        fd = os.open(self.path(f.name), os.O_RDWR | os.O_DIRECT)
        self.end("open")
        try:
            self.timed_write(f"direct pwrite {f.name} {n}@{off} gen {self.gen}", lambda: os.pwrite(fd, buf, off), n)
            f.write(off, data)
            # read back through the same O_DIRECT descriptor
            self.begin(f"direct pread {f.name} {n}@{off}")
            got = os.preadv(fd, [buf], off)
            self.end("read")
            if bytes(buf[:got]) != bytes(f.data[off:off + n]):
                raise Failure("O_DIRECT read: " + diagnose(self.sh.reg, f.name, f.serial, off,
                                                           bytes(f.data[off:off + n]), bytes(buf[:got])))
            self.bytes_read += got
        finally:
            os.close(fd)
            buf.close()

    def op_read(self, f):
        size = len(f.data)
        off = self.rng.randrange(0, size + 4096)
        n = self.rng.choice([1, 100, 4096, 65536, self.rng.randrange(1, MiB)])
        fresh = self.rng.random() < 0.2
        if fresh:
            self.close(f)
        self.begin(f"pread {f.name} {n}@{off} (size {size})")
        self.verify_range(f, off, n, "read")
        self.end("read")

    def op_full(self, f):
        self.begin(f"read-all {f.name} (size {len(f.data)})")
        self.verify_range(f, 0, len(f.data) + 1, "full read")
        self.end("read")

    def op_stat(self, f):
        self.begin(f"fstat {f.name}")
        st = os.fstat(self.fd(f))
        self.end("stat")
        if st.st_size != len(f.data) or st.st_nlink != len(f.names):
            raise Failure(f"fstat {f.name} (serial {f.serial}): size {st.st_size}, links {st.st_nlink}, "
                          f"expected {len(f.data)}, {len(f.names)} {f.names}")
        self.begin(f"stat {f.name}")
        st = os.stat(self.path(f.name))
        self.end("stat")
        if st.st_size != len(f.data):
            raise Failure(f"stat {f.name} (serial {f.serial}): size {st.st_size}, expected {len(f.data)}")

    def op_truncate(self, f):
        rng = self.rng
        k = rng.random()
        size = 0 if k < 0.1 else rng.randrange(0, self.max_size + MiB)
        if k < 0.1:
            self.close(f)
            self.begin(f"open O_TRUNC {f.name}")
            f.fd = os.open(self.path(f.name), os.O_RDWR | os.O_TRUNC)
        elif k < 0.5:
            self.begin(f"truncate(path) {f.name} {len(f.data)}->{size}")
            os.truncate(self.path(f.name), size)
        else:
            self.begin(f"ftruncate {f.name} {len(f.data)}->{size}")
            os.ftruncate(self.fd(f), size)
        self.end("truncate")
        f.truncate(size)

    def op_rename(self, f):
        src = self.rng.choice(f.names)
        choices = [n for n in self.names if n != src and
                   (n not in self.files or self.files[n].parked is None or self.files[n].parked.is_set())]
        if not choices:
            return self.op_write(f)
        dst = self.rng.choice(choices)
        victim = self.files.get(dst)
        kind = "rename" if victim is None else "rename_link" if victim is f else "rename_over"
        if victim is not None and victim is not f and victim.names == [dst]:
            self.close(victim)
        self.begin(f"rename {src} -> {dst}" + {"rename": "", "rename_link": " (a link of the same file)",
                                               "rename_over": " (replacing)"}[kind])
        os.rename(self.path(src), self.path(dst))
        self.end(kind)
        if victim is f:
            return  # POSIX: two links of one file, rename does nothing
        if victim is not None:
            victim.names.remove(dst)
        f.names[f.names.index(src)] = dst
        del self.files[src]
        self.files[dst] = f

    def op_link(self, f):
        free = [n for n in self.names if n not in self.files]
        if not free:
            return self.op_write(f)
        dst = self.rng.choice(free)
        self.begin(f"link {f.name} -> {dst}")
        os.link(self.path(f.name), self.path(dst))
        self.end("link")
        f.names.append(dst)
        self.files[dst] = f

    def op_unlink(self, f):
        name = self.rng.choice(f.names)
        if len(f.names) > 1:
            self.begin(f"unlink {name} (one of {f.names})")
            os.unlink(self.path(name))
            self.end("unlink_link")
            f.names.remove(name)
            del self.files[name]
            return
        keep_fd = f.fd is not None and self.rng.random() < 0.3
        if not keep_fd:
            self.close(f)
        self.begin(f"unlink {name}")
        os.unlink(self.path(name))
        self.end("unlink")
        del self.files[name]
        if keep_fd:
            # the open, unlinked file still takes writes and reads
            n, _ = self.pick_size()
            off = self.rng.randrange(0, self.max_size)
            data = self.new_data(f, off, n)
            self.timed_write(f"pwrite unlinked {name} {n}@{off}", lambda: os.pwrite(f.fd, data, off), n)
            f.write(off, data)
            self.begin(f"pread unlinked {name} {n}@{off}")
            self.verify_range(f, off, n, "read of an unlinked file")
            self.end("read")
            self.close(f)
        if self.rng.random() < 0.5:
            self.op_create()

    def op_fallocate(self, f):
        """posix_fallocate (may grow the file), or punch a hole (zeros inside the file, size kept)."""
        off = self.rng.randrange(0, self.max_size)
        n = self.rng.choice([4096, 65536, self.rng.randrange(1, MiB)])
        fd = self.fd(f)
        if self.rng.random() < 0.5 or not self.sh.punch:
            self.begin(f"posix_fallocate {f.name} {n}@{off} (size {len(f.data)})")
            os.posix_fallocate(fd, off, n)
            self.end("fallocate")
            if off + n > len(f.data):
                f.truncate(off + n)
            return
        self.begin(f"punch hole {f.name} {n}@{off} (size {len(f.data)})")
        if LIBC.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, ctypes.c_long(off), ctypes.c_long(n)):
            e = ctypes.get_errno()
            raise OSError(e, f"fallocate(PUNCH_HOLE): {os.strerror(e)}")
        self.end("punch_hole")
        end = min(off + n, len(f.data))
        if off < end:
            f.data[off:end] = bytes(end - off)

    def op_dsync(self, f):
        """A write through an O_DSYNC descriptor: durable when acknowledged."""
        n, _ = self.pick_size()
        off = self.rng.randrange(0, self.max_size)
        data = self.new_data(f, off, n)
        self.begin(f"open O_DSYNC {f.name}")
        fd = os.open(self.path(f.name), os.O_WRONLY | os.O_DSYNC)
        self.end("open")
        try:
            self.timed_write(f"O_DSYNC pwrite {f.name} {n}@{off} gen {self.gen}", lambda: os.pwrite(fd, data, off), n)
        finally:
            os.close(fd)
        f.write(off, data)

    def op_fsync(self, f):
        fd = self.fd(f)
        if self.rng.random() < 0.5:
            self.begin(f"fsync {f.name}")
            os.fsync(fd)
        else:
            self.begin(f"fdatasync {f.name}")
            os.fdatasync(fd)
        self.end("fsync")

    def op_reopen(self, f):
        self.close(f)
        self.fd(f)

    def op_park(self, f):
        """Close the file and hand it to a reader; leave it alone until the reader is done."""
        self.close(f)
        f.parked = threading.Event()
        self.sh.parked.put((f.name, f.serial, bytes(f.data), f.parked))
        self.ops["park"] += 1

    OPS = [("write", 32), ("append", 5), ("direct", 3), ("dsync", 2), ("read", 18), ("full", 2), ("stat", 4),
           ("truncate", 7), ("fallocate", 3), ("rename", 5), ("link", 2), ("unlink", 4), ("fsync", 4),
           ("reopen", 4), ("park", 2)]

    def body(self):
        names = [n for n, _ in self.OPS]
        weights = [w for _, w in self.OPS]
        if not self.sh.odirect:
            weights[names.index("direct")] = 0
        if READERS == 0:
            weights[names.index("park")] = 0
        for _ in range(2):
            self.op_create()
        while not self.sh.stop.is_set() and time.monotonic() < self.deadline:
            if len(self.files) < LIVE_PER_WORKER and (not self.files or self.rng.random() < 0.1):
                self.op_create()
                continue
            files = self.usable()
            if not files:
                time.sleep(0.01)
                continue
            f = self.rng.choice(files)
            op = self.rng.choices(names, weights)[0]
            getattr(self, "op_" + op)(f)
        # hand back: wait for parked files, close every descriptor
        for f in list(self.files.values()):
            while f.parked is not None and not f.parked.wait(0.5):
                if self.sh.stop.is_set() and self.sh.errors:
                    return
            self.close(f)


class Reader(Actor):
    """Re-reads files their owners have closed and parked, in random pieces, against the owner's snapshot."""

    def __init__(self, sh_, rid, workers):
        super().__init__(sh_, f"r{rid}", len(workers) + rid)
        self.rng = random.Random(sh_.seed * 1000 + 500 + rid)
        self.workers = workers

    def body(self):
        while True:
            try:
                name, serial, want, done = self.sh.parked.get(timeout=0.2)
            except queue.Empty:
                if self.sh.stop.is_set() or not any(w.is_alive() for w in self.workers):
                    return
                continue
            try:
                self.begin(f"reader open {name}")
                fd = os.open(os.path.join(self.sh.root, name), os.O_RDONLY)
                self.end("open")
                try:
                    self.begin(f"reader fstat {name}")
                    size = os.fstat(fd).st_size
                    self.end("stat")
                    if size != len(want):
                        raise Failure(f"reader: {name} (serial {serial}) size {size}, expected {len(want)}")
                    off = 0
                    while off <= len(want):
                        n = self.rng.choice([4096, 65536, 131072, self.rng.randrange(1, MiB)])
                        self.begin(f"reader pread {name} {n}@{off}")
                        got = os.pread(fd, n, off)
                        self.end("read")
                        if got != want[off:off + n]:
                            raise Failure("reader: " + diagnose(self.sh.reg, name, serial, off,
                                                                want[off:off + n], got))
                        self.bytes_read += len(got)
                        if not got:
                            break
                        off += len(got)
                finally:
                    os.close(fd)
            finally:
                done.set()


# ------------------------------------------------------------------------------------------------- watchdog

def daemon_stacks(pid):
    out = []
    if shutil.which("gdb"):
        try:
            r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"],
                               capture_output=True, text=True, timeout=120)
            out.append("== gdb thread apply all bt\n" + r.stdout + r.stderr[-2000:])
        except subprocess.TimeoutExpired:
            out.append("== gdb timed out")
    else:
        out.append("== gdb is not installed; kernel stacks only")
    out.append("== /proc/PID/task/*: comm, wchan, kernel stack")
    try:
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            d = f"/proc/{pid}/task/{tid}"
            parts = []
            for k in ("comm", "wchan", "stack"):
                try:
                    with open(f"{d}/{k}") as fh:
                        parts.append(fh.read().strip())
                except OSError as e:
                    parts.append(f"({k}: {e.strerror})")
            out.append(f"-- tid {tid} {parts[0]} wchan={parts[1]}\n{parts[2]}")
    except OSError as e:
        out.append(f"(no /proc/{pid}: {e})")
    return "\n".join(out)


class Monitor:
    """The watchdog and the statistics sampler, in a process of their own started before any file on the mount is
    open: a hung daemon can stop every thread of the test (a page fault holds the GIL; a fork or exec closes the
    inherited descriptors, and each close is a FUSE request), never the monitor.  Every half second it samples
    `nvcachectl stats --json`; when no operation completes for WATCHDOG seconds, one runs longer than OP_LIMIT, the
    test asks for it ("dump REASON"), or the whole run outlives its deadline, it writes hang-report.txt (operations
    in flight, the daemon's statistics and thread stacks) and kills the daemon, so that every caller blocked on the
    mount gets an error and the test can end and clean up."""

    def __init__(self, cache, progress_path, nactors, deadline_s, flush_every):
        self.report = os.path.join(cache.tmp, "hang-report.txt")
        self.samples = os.path.join(cache.tmp, "samples.jsonl")
        self.flushes = os.path.join(cache.tmp, "flushes.jsonl")
        args = [cache.mnt, str(cache.proc.pid), progress_path, str(nactors), self.report, self.samples,
                str(WATCHDOG), str(OP_LIMIT), str(deadline_s), str(flush_every), self.flushes]
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "monitor", *args],
                                     stdin=subprocess.PIPE, text=True, start_new_session=True)

    def send(self, line):
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def pause(self, timeout=600):
        """Stop the racing flushes, and wait for one under way to end (a kill -9 must not cut it off)."""
        self.send("pause")
        deadline = time.time() + timeout
        while not os.path.exists(self.flushes + ".paused") and time.time() < deadline and self.proc.poll() is None:
            time.sleep(0.1)

    def dump(self, reason, timeout=300):
        self.send("dump " + reason)
        deadline = time.time() + timeout
        while not os.path.exists(self.report) and time.time() < deadline and self.proc.poll() is None:
            time.sleep(0.2)

    def hang(self):
        if os.path.exists(self.report):
            with open(self.report) as fh:
                return fh.read()
        return None

    def stop(self):
        self.send("stop")
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    @staticmethod
    def _lines(path):
        out = []
        if os.path.exists(path):
            with open(path) as fh:
                out = [json.loads(line) for line in fh if line.strip()]
        return out

    def read_samples(self):
        return self._lines(self.samples)

    def read_flushes(self):
        return self._lines(self.flushes)


def monitor_main(mnt, pid, progress_path, nactors, report, samples, watchdog, op_limit, deadline_s, flush_every,
                 flushes):
    pid, nactors = int(pid), int(nactors)
    watchdog, op_limit, deadline = float(watchdog), float(op_limit), time.monotonic() + float(deadline_s)
    prog = Progress(progress_path, nactors, create=False)
    cmds = queue.Queue()
    flushing = [0.0]   # when the flush in progress started
    quiet = threading.Event()

    def flusher():
        """`nvcachectl flush` racing the workers now and then."""
        while not quiet.wait(float(flush_every)):
            t0 = flushing[0] = time.monotonic()
            try:
                r = subprocess.run([CTL, "flush", mnt], capture_output=True, text=True, timeout=3 * op_limit)
                rc, err = r.returncode, r.stderr.strip()[-300:]
            except subprocess.TimeoutExpired:
                rc, err = None, "timed out"
            flushing[0] = 0.0
            with open(flushes, "a") as fh:
                fh.write(json.dumps({"seconds": round(time.monotonic() - t0, 2), "rc": rc, "stderr": err}) + "\n")

    flush_thread = threading.Thread(target=flusher, daemon=True)
    if float(flush_every) > 0:
        flush_thread.start()

    def stdin_reader():
        for line in sys.stdin:
            cmds.put(line.strip())
        cmds.put("stop")

    threading.Thread(target=stdin_reader, daemon=True).start()
    paused, strikes = False, 0
    with open(samples, "a") as out:
        while True:
            why = None
            try:
                cmd = cmds.get(timeout=0.5)
            except queue.Empty:
                cmd = ""
            if cmd == "stop":
                return
            if cmd == "pause":
                paused = True
                quiet.set()
                if flush_thread.is_alive():
                    flush_thread.join()   # the flush under way ends first
                open(flushes + ".paused", "w").close()
            elif cmd.startswith("dump "):
                why = cmd[5:]
            elif cmd.startswith("pid "):
                pid = int(cmd[4:])   # a new daemon after a remount
            try:
                r = subprocess.run([CTL, "stats", mnt, "--json"], capture_output=True, text=True, timeout=10)
                if r.returncode == 0:
                    t = json.loads(r.stdout)["total"]
                    out.write(json.dumps({"t": time.monotonic(), "dirty_percent": t["derived"]["dirty_percent"],
                                          **{k: t["gauges"][k] for k in ("dirty_slots", "used_slots", "slots")},
                                          "destaged_bytes": t["counters"]["destaged_bytes"]}) + "\n")
                    out.flush()
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic_ns()
            busy = prog.busy()
            stalled = None
            if not paused and busy and (now - prog.last_done()) / 1e9 > watchdog:
                stalled = f"no operation completed for {(now - prog.last_done()) / 1e9:.0f} s"
            for t, d in busy:
                if not paused and (now - t) / 1e9 > op_limit:
                    stalled = f"'{d}' in flight for {(now - t) / 1e9:.0f} s"
            # the progress words are read while the test writes them: believe a stall seen twice in a row
            if stalled and strikes:
                why = stalled
            strikes = 1 if stalled else 0
            if flushing[0] and time.monotonic() - flushing[0] > op_limit:
                why = f"an nvcachectl flush racing the workers runs for {time.monotonic() - flushing[0]:.0f} s"
            if time.monotonic() > deadline:
                why = f"the test still runs after {float(deadline_s):.0f} s (dead man's timer)"
            if why:
                break
    lines = [f"HANG: {why}", f"at {time.strftime('%Y-%m-%d %H:%M:%S')}", "", "== operations in flight"]
    now = time.monotonic_ns()
    lines += [f"{d} for {(now - t) / 1e9:.1f} s" for t, d in sorted(prog.busy())]
    lines.append("\n== daemon stats")
    try:
        r = subprocess.run([CTL, "stats", mnt, "--json"], capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            t = json.loads(r.stdout)["total"]
            lines.append(json.dumps({**t["counters"], **t["gauges"]}))
    except subprocess.TimeoutExpired:
        lines.append("(nvcachectl stats timed out)")
    lines.append("\n" + daemon_stacks(pid))
    with open(report + ".tmp", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    os.rename(report + ".tmp", report)
    os.kill(pid, signal.SIGKILL)


def read_all(path):
    with open(path, "rb") as fh:
        return fh.read()


def compare_tree(reg, root, expect, where):
    """expect: name -> RefFile.  Every name there, nothing else, every byte equal."""
    names = sorted(os.path.relpath(os.path.join(d, n), root) for d, _, files in os.walk(root) for n in files)
    missing = sorted(set(expect) - set(names))
    extra = sorted(set(names) - set(expect))
    bad = []
    for name in sorted(set(expect) & set(names)):
        got = read_all(os.path.join(root, name))
        f = expect[name]
        if got != f.data:
            bad.append(diagnose(reg, name, f.serial, 0, bytes(f.data), got))
    errs = []
    if missing:
        errs.append(f"{where}: missing {missing}")
    if extra:
        errs.append(f"{where}: unexpected {extra}")
    errs += [f"{where}: {b}" for b in bad[:8]]
    return errs


def save_evidence(cache, text, name):
    path = os.path.join(cache.tmp, name)
    with open(path, "w") as fh:
        fh.write(text)
    if EVIDENCE:
        os.makedirs(EVIDENCE, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        shutil.copy(path, os.path.join(EVIDENCE, f"{stamp}-{name}"))
        if os.path.exists(cache.log):
            shutil.copy(cache.log, os.path.join(EVIDENCE, f"{stamp}-daemon.log"))
    return path


# The cases: a cache full of dirty data (64 KiB blocks); the smallest geometry, 4 KiB blocks and fewer file records
# than open files (reads and writes of a file without a record go around the cache); two copies of each dirty block
# on three devices.  CI runs all three in their short form.
CASES = {
    # a cache full of dirty data: no write goes around it (destage.write_around 0)
    "space": dict(share=1.0, ndevs=NDEVS, flush_every=15, kill9=True, full=True,
                  keys={"destage.write_around": "0"}),
    # past the high watermark writes with no dirty data go around the cache, down to the low watermark
    "around": dict(share=0.4, ndevs=NDEVS, flush_every=15, kill9=True, full=False, keys={}),
    # files without a record write around the cache, racing flushes keep destage busy: not always full
    "small": dict(share=0.4, ndevs=NDEVS, flush_every=4, kill9=False, full=False,
                  keys={"cache.max_files": "64", "cache.block_size": "4K"}),
    "copies2": dict(share=0.5, ndevs=max(NDEVS, 3), flush_every=0, kill9=True, full=True,
                    keys={"cache.dirty_copies": "2", "destage.write_around": "0"}),
}


def config_keys(case="space"):
    keys = {
        "cache.block_size": BS,
        "cache.dirty_copies": str(COPIES),
        "destage.max_rate": RATE,
        "destage.high_watermark": "95",
        "destage.low_watermark": "90",
        "destage.threads": "2",
    }
    keys.update(CASES[case]["keys"])
    for kv in filter(None, EXTRA.split(";")):
        k, v = kv.split("=", 1)
        keys[k.strip()] = v.strip()
    return keys


def probe_odirect(root):
    p = os.path.join(root, ".odirect-probe")
    buf = mmap.mmap(-1, 4096)
    try:
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
        try:
            os.pwrite(fd, buf, 0)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        buf.close()
        if os.path.exists(p):
            os.unlink(p)


def figures(workers, readers, samples, st, elapsed, flush_s, seed, shd, case):
    ops = collections.Counter()
    for a in workers + readers:
        ops.update(a.ops)
    lat = sorted(x for w in workers for x in w.write_lat)
    slow = [x for x in lat if x > SLOW_WRITE]
    dirty = [x["dirty_percent"] for x in samples]                   # dirty bytes / capacity
    # dirty slots / slots; with two copies every dirty slot holds a second slot for its twin
    copies = int(config_keys(case)["cache.dirty_copies"])
    dslots = [min(100.0, 100.0 * x["dirty_slots"] * copies / x["slots"]) for x in samples]
    used = [100.0 * x["used_slots"] / x["slots"] for x in samples]
    c, g = st["counters"], st["gauges"]
    return {
        "case": case, "seed": seed, "seconds": round(elapsed, 1), "workers": len(workers), "readers": len(readers),
        "o_direct": shd.odirect,
        "config": {"devices": CASES[case]["ndevs"], "device_mib": DEV_MB, **config_keys(case)},
        "ops": dict(sorted(ops.items())), "ops_total": sum(ops.values()),
        "bytes_written": sum(w.bytes_written for w in workers),
        "bytes_read": sum(a.bytes_read for a in workers + readers),
        "writes": len(lat),
        "writes_over_100ms": len(slow),
        "seconds_in_writes_over_100ms": round(sum(slow), 1),
        "write_latency_ms": {"p50": round(1000 * lat[len(lat) // 2], 2) if lat else None,
                             "p99": round(1000 * lat[int(len(lat) * 0.99)], 1) if lat else None,
                             "max": round(1000 * lat[-1], 1) if lat else None},
        "dirty_slots_percent_max": round(max(dslots), 1) if dslots else None,
        "seconds_with_all_slots_dirty": sum(0.5 for d in dslots if d >= 100.0),
        "dirty_bytes_percent_max": max(dirty) if dirty else None,
        "used_slots_percent_max": round(max(used), 1) if used else None,
        "samples": len(dirty),
        "dirty_slots_percent_timeline": [round(d) for d in dslots[::4]],
        "flush_seconds": round(flush_s, 1),
        "daemon_after_load": {k: c[k] for k in ("write_ops", "write_bytes", "read_ops", "read_bytes", "destaged_bytes",
                                     "evictions", "destage_errors", "fsync_ops", "backing_write_bytes")}
        | {k: g[k] for k in ("slots", "dirty_slots", "used_slots", "capacity_bytes")},
        "losses": 0,
    }


@pytest.mark.parametrize("case", ["space", "around", "small", "copies2"])
def test_load_full_dirty_cache(make_cache, case):
    seed = env("NVC_LOAD_SEED", int(time.time()) % 100000, int)
    seconds = SECONDS * CASES[case]["share"]
    c = make_cache(ndevs=CASES[case]["ndevs"], dev_size=DEV_MB * MiB, extra=config_keys(case))
    c.format()
    # NVC_LOAD_GDB=1: the daemon runs under gdb, whose backtraces of a crash land in the daemon's log
    c.mount(wrapper=("gdb", "-q", "-batch", "-nx", "-ex", "run", "-ex", "bt", "-ex", "thread apply all bt",
                     "--args") if os.environ.get("NVC_LOAD_GDB") else ())
    root = c.path("load")
    os.mkdir(root)
    for d in DIRS:
        os.mkdir(os.path.join(root, d))
    shd = Shared(root, seed)
    shd.odirect = probe_odirect(root)
    knobs = {k: v for k, v in os.environ.items() if k.startswith("NVC_LOAD_") and k not in ("NVC_LOAD_SEED",)}
    knobs.setdefault("NVC_LOAD_SECONDS", f"{SECONDS:g}")
    repro = (" ".join(f"{k}='{v}'" for k, v in sorted(knobs.items())) +
             f" NVC_LOAD_SEED={seed} tools/load/run.sh -k {case}")
    print(f"\nload {case}: seed {seed}, {WORKERS} workers, {READERS} readers, {seconds:g} s, "
          f"O_DIRECT {shd.odirect}; tmp {c.tmp}")

    # the monitor starts before any file on the mount is open (it must not inherit one)
    flush_budget = max(180, 4 * NDEVS * DEV_MB)
    progress = os.path.join(c.tmp, "progress")
    shd.progress = Progress(progress, WORKERS + READERS)
    flush_every = env("NVC_LOAD_FLUSH_EVERY", CASES[case]["flush_every"], float)
    mon = Monitor(c, progress, WORKERS + READERS, seconds + WATCHDOG + OP_LIMIT + flush_budget + 300, flush_every)
    try:
        run_load(c, shd, mon, seed, repro, flush_budget, case, seconds)
    finally:
        mon.stop()


def run_load(c, shd, mon, seed, repro, flush_budget, case, seconds):
    root = shd.root
    t0 = time.monotonic()
    workers = [Worker(shd, i, t0 + seconds) for i in range(WORKERS)]
    readers = [Reader(shd, i, workers) for i in range(READERS)]
    for t in workers + readers:
        t.start()
    for t in workers + readers:
        t.join()   # the monitor ends every hang by killing the daemon, so these joins end
    elapsed = time.monotonic() - t0
    mon.pause()
    expect = {}
    for w in workers:
        expect.update(w.files)

    errs = []
    st_load = c.stats_json()["total"] if not mon.hang() and not shd.errors else None  # the load's own counters
    kill9 = env("NVC_LOAD_KILL9", CASES[case]["kill9"], lambda v: v not in ("0", "no"))
    if kill9 and not mon.hang() and not shd.errors:
        # every write acknowledged, nothing in flight: kill -9 must lose none of them (PRODUCT 4.4).  The
        # kernel sends a close's RELEASE after close() returns, so a file unlinked while open may still hold
        # dirty data in the cache at the kill: its record says it was unlinked (MF_UNLINKED), and recovery
        # drops that data rather than saving it to lost+found (test_identity covers it on its own)
        c.kill9()
        c.mount()
        mon.send(f"pid {c.proc.pid}")
        errs += compare_tree(shd.reg, root, expect, "mount after kill -9 and a new mount")

    flush_s = 0.0
    if not mon.hang() and not shd.errors:
        # every descriptor on the mount is closed now: this process may start others again
        t1 = time.monotonic()
        try:
            r = sh(CTL, "flush", c.mnt, check=False, timeout=flush_budget)
            if r.returncode != 0:
                shd.fail("flush", f"nvcachectl flush: rc {r.returncode}: {r.stderr.strip()}")
        except subprocess.TimeoutExpired:
            mon.dump(f"nvcachectl flush did not finish in {flush_budget} s")
        flush_s = time.monotonic() - t1

    hang = mon.hang()
    if hang:
        text = hang + "\n\n== errors the test saw (after the kill, most of them)\n" + "\n".join(shd.errors[:10])
        path = save_evidence(c, text, "hang-report.txt")
        pytest.fail(f"hang; report in {path}; repro: {repro}\n" + text[:8000])
    if shd.errors:
        msg = "\n".join(shd.errors[:10])
        rc = c.proc.poll() if c.proc else None
        if rc is not None:
            how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
            msg = f"the daemon died: {how}; its log ends:\n{c.log_text()[-3000:]}\n" + msg
        path = save_evidence(c, msg, "errors.txt")
        pytest.fail(f"{len(shd.errors)} error(s) (report {path}; repro: {repro}):\n{msg}")

    # every surviving file, through the mount and in the backing directory
    st = c.stats_json()["total"]
    if st["gauges"]["dirty_slots"] != 0:
        errs.append(f"after flush: {st['gauges']['dirty_slots']} dirty slots")
    errs += compare_tree(shd.reg, root, expect, "mount")
    errs += compare_tree(shd.reg, os.path.join(c.backing, "load"), expect, "backing")
    lost = os.path.join(c.backing, ".nvcachefs-lost+found")
    if os.path.isdir(lost) and os.listdir(lost):
        errs.append(f"lost+found holds {os.listdir(lost)}")
    fig = figures(workers, readers, mon.read_samples(), st_load, elapsed, flush_s, seed, shd, case)
    fl = mon.read_flushes()
    fig["flushes_during_load"] = {"count": len(fl), "max_seconds": max((x["seconds"] for x in fl), default=None),
                                  "failed": [x for x in fl if x["rc"] != 0][:5]}
    if fig["flushes_during_load"]["failed"]:
        errs.append(f"nvcachectl flush during the load failed: {fig['flushes_during_load']['failed']}")
    fig["kill9_and_remount_before_flush"] = bool(kill9)
    fig["daemon_at_the_end"] = {k: st["counters"][k] for k in ("destaged_bytes", "read_bytes", "evictions")} | {
        k: st["gauges"][k] for k in ("dirty_slots", "used_slots")}
    fig["files_compared"] = len(expect)
    fig["bytes_compared"] = sum(len(f.data) for f in expect.values())
    rc = c.unmount(timeout=180)
    if rc != 0:
        errs.append(f"daemon exit status {rc}")
    errs += compare_tree(shd.reg, os.path.join(c.backing, "load"), expect, "backing after unmount")
    fig["losses"] = len(errs)
    text = json.dumps(fig, indent=1)
    save_evidence(c, text, f"figures-{case}.json")
    print("load figures:\n" + text)
    assert not errs, f"repro: {repro}\n" + "\n".join(errs[:12])
    if CASES[case]["full"] and config_keys(case)["destage.max_rate"] not in ("0", "0M", "0K"):
        # the point of the test: writers faster than the rate cap fill the cache with dirty data
        assert fig["dirty_slots_percent_max"] is not None and fig["dirty_slots_percent_max"] >= 99, \
            f"the cache never got full of dirty data: {fig}"
    if case == "around" and st_load:
        assert st_load["counters"]["write_around_bytes"] > 0, f"no write went around the cache: {fig}"


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "monitor":
    monitor_main(*sys.argv[2:])
