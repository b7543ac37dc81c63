"""Real distributed stores as test fixtures: a two-host GlusterFS volume, a MooseFS cluster and a CephFS cluster,
each in network namespaces on this machine, with two client mounts (two "nodes") that the tests see in the root
namespace.

Layout (one store): a client namespace holds a bridge (10.213.N.1/24); each host is a network namespace with
a veth pair to that bridge (10.213.N.11, .12). Servers run inside the host namespaces; the client mounts are
made with `nsenter --net=<client ns>` so that the client daemons talk over the bridge while the mount itself
lands in the root mount namespace. Every process lives in one of the store's namespaces, so teardown finds all
of them by PID (`ip netns pids`) and stops them, then removes mounts, namespaces and the temp dir. Teardown
also runs when start-up fails half way.
"""
import atexit
import glob
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

MiB = 1 << 20
CTL_TIMEOUT = 120  # seconds an nvcachectl command over a store may take: a flush that never ends fails the
                   # test instead of hanging the run

GLUSTER_PORT = 24007
MFS_CS_PORT = 9420
MFS_CLIENT_PORT = 9421


def run(*args, check=True, timeout=60, **kw):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: rc={r.returncode}\n{r.stdout}{r.stderr}")
    return r


def drop_caches():
    """Drop the kernel's page, dentry and inode caches (what a long-running node eventually does)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def mounted(path):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


def wait_for(what, cond, timeout, logs=lambda: "", interval=0.1):
    """Poll cond() until it returns something true; on timeout fail with the daemons' logs."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - the last error goes into the message
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last})\n{logs()}")


def tail(path, n=60):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"({e})"


TMP = "/tmp"


def sweep_orphans():
    """Remove what stores of dead test runs left (a run killed with SIGKILL runs no teardown): each store's
    temp dir names its namespaces (by tag) and holds the PID of the process that started it."""
    for kind in STORES:
        for tmp in glob.glob(os.path.join(TMP, f"nvc-{kind}-*")):
            try:
                with open(os.path.join(tmp, "owner")) as f:
                    owner = int(f.read())
            except (OSError, ValueError):
                continue
            if os.path.exists(f"/proc/{owner}"):
                continue
            ns = Namespaces(os.path.basename(tmp).split("-")[2], 2)
            ns.created = [n for n in [ns.client] + ns.hosts if os.path.exists(f"/run/netns/{n}")]
            for m in ("c1", "c2"):
                if mounted(os.path.join(tmp, m)):
                    run("umount", "-l", os.path.join(tmp, m), check=False)
            ns.kill_all()
            ns.delete()
            shutil.rmtree(tmp, ignore_errors=True)


class Namespaces:
    """A client network namespace with a bridge, and host namespaces wired to it by veth pairs."""

    def __init__(self, tag, nhosts):
        self.tag = tag
        self.net = random.randint(1, 254)
        self.client = f"nvc-{tag}-c"
        self.hosts = [f"nvc-{tag}-h{i + 1}" for i in range(nhosts)]
        self.created = []

    def addr(self, i):
        """Address of host i (0-based)."""
        return f"10.213.{self.net}.{11 + i}"

    def client_addr(self):
        return f"10.213.{self.net}.1"

    def create(self):
        for ns in [self.client] + self.hosts:
            run("ip", "netns", "add", ns)
            self.created.append(ns)
            run("ip", "-n", ns, "link", "set", "lo", "up")
        c = self.client
        run("ip", "-n", c, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", c, "addr", "add", f"{self.client_addr()}/24", "dev", "br0")
        run("ip", "-n", c, "link", "set", "br0", "up")
        for i, h in enumerate(self.hosts):
            port = f"vh{i + 1}"
            run("ip", "-n", c, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", h)
            run("ip", "-n", c, "link", "set", port, "master", "br0")
            run("ip", "-n", c, "link", "set", port, "up")
            run("ip", "-n", h, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            run("ip", "-n", h, "link", "set", "eth0", "up")

    def pids(self):
        out = []
        for ns in self.created:
            r = run("ip", "netns", "pids", ns, check=False)
            out += [int(p) for p in r.stdout.split()]
        return out

    def kill_all(self, grace=5):
        """Stop every process in the namespaces: SIGTERM, then SIGKILL after grace seconds."""
        pids = self.pids()
        for p in pids:
            try:
                os.kill(p, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + grace
        while self.pids() and time.time() < deadline:
            time.sleep(0.1)
        for p in self.pids():
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        while self.pids() and time.time() < deadline:
            time.sleep(0.1)

    def delete(self):
        for ns in reversed(self.created):
            run("ip", "netns", "delete", ns, check=False)
        self.created = []

    def nsenter_client(self):
        return ["nsenter", f"--net=/run/netns/{self.client}"]


class Store:
    """Common part: temp dir, namespaces, two client mounts, teardown, per-test subdirectories."""

    kind = "?"
    nhosts = 2
    grace = 5  # seconds between SIGTERM and SIGKILL at teardown

    def __init__(self):
        sweep_orphans()
        self.tag = uuid.uuid4().hex[:6]
        self.tmp = tempfile.mkdtemp(prefix=f"nvc-{self.kind}-{self.tag}-", dir=TMP)
        os.chmod(self.tmp, 0o755)
        with open(os.path.join(self.tmp, "owner"), "w") as f:
            f.write(f"{os.getpid()}\n")
        self.ns = Namespaces(self.tag, self.nhosts)
        self.mounts = [os.path.join(self.tmp, "c1"), os.path.join(self.tmp, "c2")]
        self.procs = []  # Popen objects of daemons started in the foreground
        self.clients = []  # the two client daemons among them
        self.start_seconds = None
        self._n = 0

    # -- what the tests use
    @property
    def c1(self):
        return self.mounts[0]

    @property
    def c2(self):
        return self.mounts[1]

    def subdir(self, name=None):
        """A fresh directory on the store; returns (path on client 1, path on client 2)."""
        self._n += 1
        name = name or f"t{self._n:03d}-{uuid.uuid4().hex[:6]}"
        os.mkdir(os.path.join(self.c1, name))
        p2 = os.path.join(self.c2, name)
        wait_for(f"{name} on client 2", lambda: os.path.isdir(p2), 10, self.logs)
        return os.path.join(self.c1, name), p2

    # -- life cycle
    def start(self):
        t0 = time.time()
        try:
            self.ns.create()
            self.start_servers()
            for m in self.mounts:
                os.mkdir(m)
            self.mount_clients()
            self.check_ready()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.time() - t0
        atexit.register(self.stop)  # in case the fixture's finalizer never runs
        return self

    def check_ready(self):
        """A file written and fsync'd through client 1 reads back through client 2 (the servers take
        writes: for MooseFS, chunkservers that have registered their space)."""
        data = os.urandom(200000)
        p1, p2 = (os.path.join(m, ".nvc-ready") for m in self.mounts)

        def round_trip():
            with open(p1, "wb") as f:
                f.write(data)
                os.fsync(f.fileno())
            with open(p2, "rb") as f:
                return f.read() == data
        wait_for("a write through client 1 to read back through client 2", round_trip, 30, self.logs,
                 interval=0.5)
        os.unlink(p1)

    def stop(self):
        """Best effort and idempotent: unmount, stop every process of the store by PID, remove the rest."""
        atexit.unregister(self.stop)
        for m in self.mounts:
            if mounted(m):
                r = run("umount", m, check=False)
                if r.returncode != 0:
                    run("umount", "-l", m, check=False)
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.time() + self.grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        self.procs = []
        self.ns.kill_all(self.grace)
        for m in self.mounts:  # a client killed before its unmount leaves a dead FUSE mount
            if mounted(m):
                run("umount", "-l", m, check=False)
        self.ns.delete()
        if not os.environ.get("NVC_KEEP"):
            shutil.rmtree(self.tmp, ignore_errors=True)

    def logs(self):
        return ""

    def remount_clients(self):
        """Unmount and mount both clients again (a client restart: every cached inode and handle goes)."""
        self.umount_clients()
        self.mount_clients()

    def umount_clients(self):
        for m in self.mounts:
            if mounted(m):
                run("umount", m)
        for p in self.clients:
            p.wait(timeout=20)
            self.procs.remove(p)
        self.clients = []


class Gluster(Store):
    """A two-host distribute volume (one brick per host; files spread over both hosts by name hash, so a
    directory's files live on different servers, as on a real cluster; no replication: nothing to heal).

    Each glusterd runs in its host's network namespace and in its own mount namespace, where private
    /var/lib/glusterd, /run and /var/log/glusterfs are bind-mounted from the temp dir; its bricks
    (glusterfsd) inherit both namespaces."""

    kind = "gluster"
    volume = "nvc"
    # Close-to-open across two client mounts. Gluster's client caches metadata and small-file contents
    # beyond close/open: md-cache (performance.stat-prefetch) keeps stat results, quick-read and io-cache
    # keep file contents, read-ahead keeps pages read ahead, open-behind fakes opens; none of them is
    # invalidated when another client writes. They are switched off so that what node 2 reads after node
    # 1's flush is the store's state, not a client cache of Gluster's own. write-behind stays on (the
    # default a user has): a flush that is complete must have fsync'd or closed its writes.
    volume_options = {
        "performance.stat-prefetch": "off",
        "performance.quick-read": "off",
        "performance.io-cache": "off",
        "performance.read-ahead": "off",
        "performance.open-behind": "off",
    }
    # The FUSE client's own caches: attributes, names and negative lookups are not kept by the kernel
    # (timeouts 0), so every stat and lookup asks the volume; fopen-keep-cache=off makes every open drop
    # the file's pages from the kernel's page cache (by default the client keeps them across opens and
    # node 2 reads its old pages after node 1 rewrote the file: seen here). The glusterfs client is run
    # directly: mount.glusterfs from 10.3 passes fopen-keep-cache=off on as "==off", which glusterfs
    # rejects ("unknown cache setting").
    client_options = ["--attribute-timeout=0", "--entry-timeout=0", "--negative-timeout=0",
                      "--fopen-keep-cache=off"]

    def host_dir(self, i, *p):
        return os.path.join(self.tmp, f"h{i + 1}", *p)

    def gluster(self, *args, host=0, check=True, timeout=60):
        """The gluster CLI inside host's namespaces (it talks to that host's glusterd over /run)."""
        pid = self.procs[host].pid
        r = run("nsenter", "-t", str(pid), "-m", "-n", "gluster", "--mode=script", *args,
                check=False, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"gluster {' '.join(args)}: rc={r.returncode}\n{r.stdout}{r.stderr}\n"
                                 + self.logs())
        return r

    def start_servers(self):
        for i, h in enumerate(self.ns.hosts):
            for d in ("lib", "run", "log", "brick"):
                os.makedirs(self.host_dir(i, d))
            shutil.copytree("/var/lib/glusterd/groups", self.host_dir(i, "lib", "groups"))
            script = (
                "set -e; "
                f"mount --bind {self.host_dir(i, 'lib')} /var/lib/glusterd; "
                f"mount --bind {self.host_dir(i, 'run')} /run; "
                f"mount --bind {self.host_dir(i, 'log')} /var/log/glusterfs; "
                "exec glusterd -N --log-level=INFO")
            logf = open(self.host_dir(i, "glusterd.out"), "w")
            p = subprocess.Popen(["ip", "netns", "exec", h, "unshare", "-m", "--propagation", "private",
                                  "sh", "-c", script], stdout=logf, stderr=logf)
            logf.close()
            self.procs.append(p)
        for i in range(len(self.ns.hosts)):
            wait_for(f"glusterd on host {i + 1}",
                     lambda i=i: self.procs[i].poll() is None
                     and self.gluster("pool", "list", host=i, check=False, timeout=10).returncode == 0
                     or self._dead(i), 30, self.logs, interval=0.3)
        self.gluster("peer", "probe", self.ns.addr(1))
        wait_for("peer in cluster",
                 lambda: "Peer in Cluster (Connected)" in self.gluster("peer", "status", check=False).stdout
                 and "Peer in Cluster (Connected)" in self.gluster("peer", "status", host=1,
                                                                   check=False).stdout,
                 30, self.logs, interval=0.3)
        bricks = [f"{self.ns.addr(i)}:{self.host_dir(i, 'brick')}" for i in range(len(self.ns.hosts))]
        # "force": the bricks are on the root file system, which glusterd refuses without it
        wait_for("volume create", lambda: self.gluster("volume", "create", self.volume, "transport", "tcp",
                                                       *bricks, "force", check=False).returncode == 0,
                 30, self.logs, interval=0.5)
        for k, v in self.volume_options.items():
            self.gluster("volume", "set", self.volume, k, v)
        self.gluster("volume", "start", self.volume)
        wait_for("bricks online", lambda: self.gluster("volume", "status", self.volume, "detail",
                                                       check=False).stdout.count("Online               : Y")
                 == len(self.ns.hosts), 30, self.logs, interval=0.3)

    def _dead(self, i):
        if self.procs[i].poll() is not None:
            raise AssertionError(f"glusterd on host {i + 1} exited rc={self.procs[i].returncode}\n"
                                 + self.logs())
        return False

    def mount_clients(self):
        self.clients = []
        for n, m in enumerate(self.mounts):
            # node 1 fetches the volume file from host 1, node 2 from host 2
            server = self.ns.addr(n % len(self.ns.hosts))
            log = os.path.join(self.tmp, f"client{n + 1}.log")
            p = subprocess.Popen([*self.ns.nsenter_client(), "glusterfs", "-N", "--process-name", "fuse",
                                  f"--volfile-server={server}", f"--volfile-id={self.volume}",
                                  *self.client_options, f"--log-file={log}", m],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(p)
            self.clients.append(p)

            def up(p=p, m=m):
                if p.poll() is not None:
                    raise AssertionError(f"glusterfs client for {m} exited rc={p.returncode}\n" + self.logs())
                return mounted(m) and os.statvfs(m)
            wait_for(f"client mount {m}", up, 20, self.logs)

    def logs(self):
        out = []
        for i in range(len(self.ns.hosts)):
            out.append(f"--- host {i + 1} glusterd.out\n" + tail(self.host_dir(i, "glusterd.out"), 20))
            out.append(f"--- host {i + 1} glusterd.log\n" + tail(self.host_dir(i, "log", "glusterd.log")))
            bl = self.host_dir(i, "log", "bricks")
            if os.path.isdir(bl):
                for f in os.listdir(bl):
                    out.append(f"--- host {i + 1} brick {f}\n" + tail(os.path.join(bl, f), 30))
        for n in range(len(self.mounts)):
            out.append(f"--- client {n + 1}\n" + tail(os.path.join(self.tmp, f"client{n + 1}.log"), 30))
        return "\n".join(out)


class MooseFS(Store):
    """mfsmaster and chunkserver 1 on host 1, chunkserver 2 on host 2 (default goal 2: every chunk on both);
    all in the foreground, each with its own config and data directory in the temp dir."""

    kind = "moosefs"
    # mfsmount's own caches, shortened so that what node 2 sees after node 1's flush is the master's state:
    # attributes (default 1 s) and directory entries (default 1 s) are not cached; file entries and
    # negative entries are not cached by default either (0). Data caching stays AUTO (the default, which
    # the master manages: a client's cache is invalidated when another client changes the file).
    mount_options = "mfsattrcacheto=0,mfsentrycacheto=0,mfsdirentrycacheto=0,mfsnegentrycacheto=0,mfsxattrcacheto=0"

    def host_dir(self, name, *p):
        return os.path.join(self.tmp, name, *p)

    def _cfg(self, name, text):
        path = self.host_dir(name, name + ".cfg")
        with open(path, "w") as f:
            f.write(text)
        return path

    def _spawn(self, ns, name, argv):
        logf = open(self.host_dir(name, "out.log"), "w")
        p = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=logf, stderr=logf)
        logf.close()
        p.nvc_name = name
        self.procs.append(p)
        return p

    def start_servers(self):
        master = self.ns.addr(0)
        os.makedirs(self.host_dir("master", "data"))
        shutil.copy("/var/lib/mfs/metadata.mfs.empty", self.host_dir("master", "data", "metadata.mfs"))
        exports = self.host_dir("master", "mfsexports.cfg")
        with open(exports, "w") as f:
            f.write("*\t/\trw,alldirs,maproot=0:0\n*\t.\trw\n")
        with open(self.host_dir("master", "mfstopology.cfg"), "w") as f:
            f.write("")
        cfg = self._cfg("master", f"""WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = {self.host_dir('master', 'data')}
EXPORTS_FILENAME = {exports}
TOPOLOGY_FILENAME = {self.host_dir('master', 'mfstopology.cfg')}
MATOCS_LISTEN_HOST = {master}
MATOCL_LISTEN_HOST = {master}
MATOML_LISTEN_HOST = {master}
NICE_LEVEL = 0
""")
        self._spawn(self.ns.hosts[0], "master", ["mfsmaster", "-f", "-c", cfg, "start"])
        wait_for("mfsmaster listening", lambda: self._listening(self.ns.hosts[0], MFS_CLIENT_PORT)
                 or self._dead(), 30, self.logs, interval=0.2)
        for i, ns in enumerate(self.ns.hosts):
            name = f"cs{i + 1}"
            os.makedirs(self.host_dir(name, "data"))
            os.makedirs(self.host_dir(name, "hdd"))
            hdd = self.host_dir(name, "mfshdd.cfg")
            with open(hdd, "w") as f:
                f.write(self.host_dir(name, "hdd") + "\n")
            cfg = self._cfg(name, f"""WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = {self.host_dir(name, 'data')}
HDD_CONF_FILENAME = {hdd}
MASTER_HOST = {master}
BIND_HOST = {self.ns.addr(i)}
CSSERV_LISTEN_HOST = {self.ns.addr(i)}
HDD_LEAVE_SPACE_DEFAULT = 256MiB
NICE_LEVEL = 0
""")
            self._spawn(ns, name, ["mfschunkserver", "-f", "-c", cfg, "start"])
        wait_for("chunkservers registered", lambda: self._chunkservers() >= len(self.ns.hosts) or self._dead(),
                 40, self.logs, interval=0.3)

    def _chunkservers(self):
        """Chunkservers connected to the master (established connections to its chunkserver port)."""
        r = run("ip", "netns", "exec", self.ns.hosts[0], "ss", "-Htn", "state", "established",
                f"sport = :{MFS_CS_PORT}", check=False)
        return len(r.stdout.splitlines())

    def _listening(self, ns, port):
        r = run("ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{port}", check=False)
        return bool(r.stdout.strip())

    def _dead(self):
        for p in self.procs:
            if p.poll() is not None:
                raise AssertionError(f"{p.nvc_name} exited rc={p.returncode}\n" + self.logs())
        return False

    def mount_clients(self):
        self.clients = []
        for n, m in enumerate(self.mounts):
            name = f"client{n + 1}"
            os.makedirs(self.host_dir(name), exist_ok=True)
            logf = open(self.host_dir(name, "out.log"), "a")
            p = subprocess.Popen([*self.ns.nsenter_client(), "mfsmount", "-f", "-H", self.ns.addr(0),
                                  "-o", self.mount_options, m], stdout=logf, stderr=logf)
            logf.close()
            p.nvc_name = name
            self.procs.append(p)
            self.clients.append(p)
            wait_for(f"client mount {m}", lambda m=m: (mounted(m) and os.statvfs(m)) or self._dead(), 30,
                     self.logs)

    def logs(self):
        out = []
        for name in ["master", "cs1", "cs2", "client1", "client2"]:
            out.append(f"--- {name}\n" + tail(self.host_dir(name, "out.log"), 40))
        return "\n".join(out)


class Ceph(Store):
    """A CephFS cluster: mon, mgr and MDS on host 1, one BlueStore OSD (on a sparse file in its directory) on
    host 2, pools of size 1; two ceph-fuse clients. One ceph.conf (passed with -c) puts every data, log,
    socket and pid file in the temp dir, and one keyring made before the mon's mkfs holds every key (no
    `auth get-or-create` round trips). The clients run with ceph-fuse's defaults: coherence between them
    comes from the MDS's capabilities, with no client option."""

    kind = "ceph"
    grace = 1  # OSDs and the MDS outlive SIGTERM by seconds: nothing of theirs is kept
    client_options = []

    def path(self, *p):
        return os.path.join(self.tmp, *p)

    def _write_conf(self):
        t = self.tmp
        mon = self.ns.addr(0)
        self.fsid = str(uuid.uuid4())
        self.conf = self.path("ceph.conf")
        with open(self.conf, "w") as f:
            f.write(f"""[global]
fsid = {self.fsid}
mon_host = [v2:{mon}:3300,v1:{mon}:6789]
public_network = 10.213.{self.ns.net}.0/24
ms_bind_ipv6 = false
keyring = {t}/keyring
run_dir = {t}/run
log_file = {t}/log/$name.$pid.log
admin_socket = {t}/run/$name.$pid.asok
pid_file = {t}/run/$name.pid
crash_dir = {t}/crash
mon_data = {t}/mon/$cluster-$id
osd_data = {t}/osd/$cluster-$id
mds_data = {t}/mds/$cluster-$id
mgr_data = {t}/mgr/$cluster-$id
exporter_sock_dir = {t}/run
auth_allow_insecure_global_id_reclaim = false
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
paxos_propose_interval = 0.1
mon_data_avail_warn = 2
mon_data_avail_crit = 1
osd_objectstore = bluestore
bluestore_block_create = true
bluestore_block_size = 4294967296
bluestore_fsck_on_mkfs = false
osd_memory_target = 1073741824
mgr_initial_modules = iostat
""")

    def ceph(self, *args, check=True, timeout=30):
        """The ceph CLI as client.admin, from the clients' namespace."""
        r = run(*self.ns.nsenter_client(), "ceph", "-c", self.conf, "--connect-timeout", "10", *args,
                check=False, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"ceph {' '.join(args)}: rc={r.returncode}\n{r.stdout}{r.stderr}\n"
                                 + self.logs())
        return r

    def _spawn(self, ns, name, argv):
        logf = open(self.path("log", f"{name}.out"), "w")
        p = subprocess.Popen(["ip", "netns", "exec", ns, *argv, "-c", self.conf], stdout=logf, stderr=logf)
        logf.close()
        p.nvc_name = name
        self.procs.append(p)
        return p

    def _dead(self):
        for p in self.procs:
            if p.poll() is not None:
                raise AssertionError(f"{p.nvc_name} exited rc={p.returncode}\n" + self.logs())
        return False

    def start_servers(self):
        for d in ("run", "log", "crash", "mon", "osd/ceph-0", "mds/ceph-a", "mgr/ceph-x"):
            os.makedirs(self.path(d))
        self._write_conf()
        h1, h2 = self.ns.hosts
        kr = self.path("keyring")
        caps = {"mon.": ["mon", "allow *"],
                "client.admin": ["mon", "allow *", "osd", "allow *", "mds", "allow *", "mgr", "allow *"],
                "mgr.x": ["mon", "allow profile mgr", "osd", "allow *", "mds", "allow *"],
                "mds.a": ["mon", "allow profile mds", "osd", "allow *", "mds", "allow", "mgr",
                          "allow profile mds"],
                "osd.0": ["mon", "allow profile osd", "mgr", "allow profile osd", "osd", "allow *"]}
        first = True
        for name, c in caps.items():
            argv = ["ceph-authtool", kr, "--gen-key", "-n", name]
            if first:
                argv.insert(1, "--create-keyring")
                first = False
            for i in range(0, len(c), 2):
                argv += ["--cap", c[i], c[i + 1]]
            run(*argv)
        mon = self.ns.addr(0)
        run("monmaptool", "--create", "--fsid", self.fsid, "--addv", "a", f"[v2:{mon}:3300,v1:{mon}:6789]",
            self.path("monmap"))
        # mkfs inside the host's namespace: else public_network matches none of its addresses
        run("ip", "netns", "exec", h1, "ceph-mon", "-c", self.conf, "--mkfs", "-i", "a", "--monmap",
            self.path("monmap"), "--keyring", kr)
        self.osd_uuid = str(uuid.uuid4())
        osd_mkfs = subprocess.Popen(["ip", "netns", "exec", h2, "ceph-osd", "-c", self.conf, "-i", "0", "--mkfs",
                                     "--osd-uuid", self.osd_uuid], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
        try:
            self._spawn(h1, "mon.a", ["ceph-mon", "-f", "-i", "a"])
            self._spawn(h1, "mgr.x", ["ceph-mgr", "-f", "-i", "x"])
            wait_for("mon quorum", lambda: self._dead() or self.ceph("mon", "stat", check=False,
                                                                    timeout=15).returncode == 0,
                     30, self.logs, interval=0.2)
            out, _ = osd_mkfs.communicate(timeout=60)
        finally:
            if osd_mkfs.poll() is None:
                osd_mkfs.kill()
                osd_mkfs.wait()
        if osd_mkfs.returncode != 0:
            raise AssertionError(f"ceph-osd --mkfs: rc={osd_mkfs.returncode}\n{out}\n" + self.logs())
        self.ceph("osd", "new", self.osd_uuid, "0")
        self._spawn(h2, "osd.0", ["ceph-osd", "-f", "-i", "0"])
        self.ceph("osd", "pool", "create", "cephfs_meta", "8")
        self.ceph("osd", "pool", "create", "cephfs_data", "8")
        self.ceph("fs", "new", "cephfs", "cephfs_meta", "cephfs_data")
        self._spawn(h1, "mds.a", ["ceph-mds", "-f", "-i", "a"])
        wait_for("OSD up", lambda: self._dead() or '"num_up_osds":1' in self.ceph(
            "osd", "stat", "--format", "json", check=False).stdout.replace(" ", ""), 40, self.logs, interval=0.3)
        wait_for("MDS active", lambda: self._dead() or "up:active" in self.ceph(
            "mds", "stat", check=False).stdout, 40, self.logs, interval=0.3)

    def mount_clients(self):
        self.clients = []
        for n, m in enumerate(self.mounts):
            name = f"client{n + 1}"
            logf = open(self.path("log", f"{name}.out"), "a")
            p = subprocess.Popen([*self.ns.nsenter_client(), "ceph-fuse", "-f", "-c", self.conf, "-n", "client.admin",
                                  *self.client_options, m], stdout=logf, stderr=logf)
            logf.close()
            p.nvc_name = name
            self.procs.append(p)
            self.clients.append(p)
            wait_for(f"client mount {m}", lambda m=m: (mounted(m) and os.statvfs(m)) or self._dead(), 30,
                     self.logs)

    def logs(self):
        out = []
        for f in sorted(glob.glob(self.path("log", "*"))):
            out.append(f"--- {os.path.basename(f)}\n" + tail(f, 25))
        return "\n".join(out)


STORES = {"gluster": Gluster, "moosefs": MooseFS, "ceph": Ceph}


def start_store(kind):
    return STORES[kind]().start()
