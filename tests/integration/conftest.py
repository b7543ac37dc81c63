"""Integration fixtures: real loop-device DIMMs, pmem-file mirrors, a backing directory on disk, the real daemon."""
import os
import signal
import subprocess
import time
import uuid

import pytest

from dfs import CTL_TIMEOUT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NVC_BUILD", os.path.join(ROOT, "build"))
DAEMON = os.path.join(BUILD, "fs", "nvcachefs")
CTL = os.path.join(BUILD, "tools", "nvcachectl")
MiB = 1 << 20
# fuse.transport of every daemon the tests start (uring, dev; unset: the daemon's default)
TRANSPORT = os.environ.get("NVC_TRANSPORT", "")
ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"


def sh(*args, check=True, **kw):
    return subprocess.run(list(args), check=check, capture_output=True, text=True, **kw)


def use_devices(c, *paths):
    """cache.devices names these from now on."""
    c.keys = dict(c.keys, **{"cache.devices": ", ".join(paths)})
    c.write_conf()


def renumber(c):
    """Every loop device let go and attached again, the images rotated one name on: each name now holds
    another image (between boots, device names change so)."""
    for lo in c.loops:
        sh("losetup", "-d", lo)
    for lo, img in zip(c.loops, c.images[1:] + c.images[:1]):
        sh("losetup", "--direct-io=on", lo, img)


def wait_log(c, text, secs=60):
    """Until the daemon's log says text (at most secs)."""
    deadline = time.time() + secs
    while text not in c.log_text() and time.time() < deadline:
        time.sleep(0.05)
    assert text in c.log_text(), c.log_text()[-3000:]


def mounted(path):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


@pytest.fixture(scope="session", autouse=True)
def stale_sockets():
    """A daemon killed with -9 leaves its control socket in /run/nvcachefs (a mount at the same place takes it
    over); the tests mount at fresh places, so the ones they leave are removed: made in this session, and no
    daemon answers."""
    import socket
    start = time.time() - 1
    yield
    d = "/run/nvcachefs"
    for name in os.listdir(d) if os.path.isdir(d) else ():
        path = os.path.join(d, name)
        try:
            if not name.endswith(".sock") or os.stat(path).st_mtime < start:
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)
        except OSError:
            pass


@pytest.fixture(scope="session", autouse=True)
def fuse_transport():
    """NVC_TRANSPORT=uring: FUSE over io_uring for this run (the module parameter on, then as it was)."""
    if TRANSPORT != "uring":
        yield
        return
    if not os.path.exists(ENABLE_URING):
        pytest.exit("NVC_TRANSPORT=uring: this kernel has no FUSE over io_uring", returncode=4)
    with open(ENABLE_URING) as f:
        was = f.read().strip()
    with open(ENABLE_URING, "w") as f:
        f.write("Y")
    yield
    with open(ENABLE_URING, "w") as f:
        f.write(was)


class Cache:
    """One cache: loop devices over /dev/shm files, two mirror files, a backing dir, a mount point."""

    def __init__(self, tmp, ndevs=2, dev_size=128 * MiB, extra=None, public=False):
        self.tmp = str(tmp)
        self.tag = "nvc-test-" + uuid.uuid4().hex[:8]
        if public:
            # other users must reach the mount and the backing store
            self.tmp = os.path.join("/tmp", self.tag)
            os.makedirs(self.tmp, mode=0o755)
            os.chmod(self.tmp, 0o755)
        self.public = public
        # a backing.path in extra (a directory on a distributed store, say) replaces the local one
        self.backing = (extra or {}).get("backing.path", os.path.join(self.tmp, "backing"))
        self.mnt = os.path.join(self.tmp, "mnt")
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        self.images, self.loops = [], []
        self.meta = [f"/dev/shm/{self.tag}-meta{i}" for i in range(2)]
        self.proc = None
        self.log = os.path.join(self.tmp, "daemon.log")
        self.ctl_timeout = None  # seconds nvcachectl may take (None: no limit)
        for i in range(ndevs):
            img = f"/dev/shm/{self.tag}-dimm{i}.img"
            with open(img, "wb") as f:
                f.truncate(dev_size)
            self.images.append(img)
            self.loops.append(sh("losetup", "--find", "--show", "--direct-io=on", img).stdout.strip())
        self.keys = {
            "cache.devices": ", ".join(self.loops),
            "cache.metadata": ", ".join(self.meta),
            "backing.path": self.backing,
            "destage.idle_after": "0",
            "destage.max_dirty_age": "0",
        }
        if TRANSPORT:
            self.keys["fuse.transport"] = TRANSPORT
        self.keys.update(extra or {})
        self.conf = os.path.join(self.tmp, "nvcachefs.conf")
        self.write_conf()

    def write_conf(self, keys=None):
        keys = keys or self.keys
        sections = {}
        for k, v in keys.items():
            s, name = k.split(".", 1)
            sections.setdefault(s, []).append(f"{name} = {v}")
        with open(self.conf, "w") as f:
            for s, lines in sections.items():
                f.write(f"[{s}]\n" + "\n".join(lines) + "\n")

    def format(self, *extra, check=True):
        r = sh(CTL, "format", "-c", self.conf, *extra, check=False)
        if check:
            assert r.returncode == 0, r.stderr
        return r

    def mount(self, *opts, check=True, wrapper=()):
        cmd = [*wrapper, DAEMON, "-f", "-c", self.conf, "-o", "allow_other"]
        for o in opts:
            cmd += ["-o", o]
        cmd.append(self.mnt)
        logf = open(self.log, "a")
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=logf)
        deadline = time.time() + 20
        while time.time() < deadline:
            if mounted(self.mnt):
                return self.proc
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        if check:
            raise AssertionError("mount failed: " + open(self.log).read())
        return self.proc

    def unmount(self, timeout=120):
        if mounted(self.mnt):
            sh("fusermount3", "-u", self.mnt)
        if self.proc:
            rc = self.proc.wait(timeout=timeout)
            self.proc = None
            return rc
        return None

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None
        sh("fusermount3", "-uz", self.mnt, check=False)
        deadline = time.time() + 10
        while mounted(self.mnt) and time.time() < deadline:
            time.sleep(0.05)

    def ctl(self, *args, check=True):
        try:
            r = sh(CTL, *args, check=False, timeout=self.ctl_timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"nvcachectl {' '.join(args)}: no answer in {self.ctl_timeout} s\n"
                                 + self.log_text()[-4000:])
        if check:
            assert r.returncode == 0, r.stderr
        return r

    def stats_json(self):
        import json
        return json.loads(self.ctl("stats", self.mnt, "--json").stdout)

    def stats(self):
        """Counters and gauges in one flat dict, plus devices, mirrors and latency."""
        t = self.stats_json()["total"]
        st = dict(t["counters"])
        st.update(t["gauges"])
        st["nslots"] = st["slots"]
        st["devices"] = t["devices"]
        st["mirrors"] = t["mirrors"]
        st["latency"] = t.get("latency", {})
        return st

    def ctl_socket(self):
        """The daemon's control socket: the listening Unix socket among its descriptors (it appears a moment
        after the mount does)."""
        deadline = time.time() + 5
        while True:
            path = self._ctl_socket()
            if path or time.time() > deadline:
                assert path, "no control socket"
                return path
            time.sleep(0.02)

    def _ctl_socket(self):
        inodes = set()
        fd_dir = f"/proc/{self.proc.pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                t = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if t.startswith("socket:["):
                inodes.add(t[8:-1])
        with open("/proc/net/unix") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if len(parts) >= 8 and parts[6] in inodes and parts[7].startswith("/run/nvcachefs/"):
                    return parts[7]
        return None

    def flush(self):
        return self.ctl("flush", self.mnt)

    def path(self, *p):
        return os.path.join(self.mnt, *p)

    def log_text(self):
        with open(self.log) as f:
            return f.read()

    def cleanup(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if mounted(self.mnt):
            sh("fusermount3", "-uz", self.mnt, check=False)
        if os.environ.get("NVC_KEEP"):
            return
        for lo in self.loops:
            sh("losetup", "-d", lo, check=False)
        for f in self.images + self.meta:
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass
        if self.public:
            import shutil
            shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def make_cache(tmp_path):
    made = []

    def make(**kw):
        c = Cache(tmp_path / f"c{len(made)}", **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.cleanup()


def _start_store(kind):
    import shutil
    from dfs import STORES
    need = {"gluster": ["glusterd", "glusterfs"], "moosefs": ["mfsmaster", "mfschunkserver", "mfsmount"],
            "ceph": ["ceph-mon", "ceph-mgr", "ceph-osd", "ceph-mds", "ceph-fuse", "ceph"]}[kind]
    missing = [b for b in need if not shutil.which(b)]
    if missing:
        pytest.skip(f"{kind}: {', '.join(missing)} not installed (tools/quickstart.sh installs them)")
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        # pytest dies on SIGTERM without running finalizers: the store's servers, mounts and namespaces
        # would stay; as an interrupt, the finalizers run
        signal.signal(signal.SIGTERM, _sigterm)
    return STORES[kind]().start()


def _sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


@pytest.fixture(scope="module")
def gluster_store():
    """A two-host GlusterFS volume with two client mounts (dfs.py), once per test module."""
    s = _start_store("gluster")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def moosefs_store():
    """A MooseFS cluster with two client mounts (dfs.py), once per test module."""
    s = _start_store("moosefs")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def ceph_store():
    """A CephFS cluster (mon, mgr, MDS, one OSD) with two ceph-fuse mounts (dfs.py), once per test module."""
    s = _start_store("ceph")
    yield s
    s.stop()


DFS_KINDS = ["gluster", "moosefs", "ceph"]


@pytest.fixture(params=DFS_KINDS)
def store(request):
    """Each distributed store in turn (each started once per module)."""
    return request.getfixturevalue(request.param + "_store")


@pytest.fixture
def cache(make_cache, request):
    """A formatted, mounted cache. Parametrized indirectly with "gluster", "moosefs" or "ceph", its backing
    directory is a fresh directory on that store's client mount 1 instead of a local one."""
    kind = getattr(request, "param", "local")
    extra = None
    if kind != "local":
        extra = {"backing.path": request.getfixturevalue(kind + "_store").subdir()[0]}
    c = make_cache(extra=extra)
    if kind != "local":
        c.ctl_timeout = CTL_TIMEOUT
    c.format()
    c.mount()
    yield c
    if c.proc:
        c.unmount()


@pytest.fixture
def public_cache(make_cache):
    """A cache other users can reach (the mount and the backing store)."""
    c = make_cache(public=True)
    c.format()
    c.mount()
    yield c
    if c.proc:
        c.unmount()
