"""systemd readiness through a NOTIFY_SOCKET of the test's own: READY once the mount answers, STATUS, STOPPING."""
import os
import re
import signal
import socket
import struct
import subprocess
import time

from conftest import DAEMON, MiB


class NotifySocket:
    """What systemd does for Type=notify: a datagram socket, credentials on, the messages in arrival order."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.seen = []  # (time, sender pid, message)

    def recv(self, timeout):
        self.sock.settimeout(timeout)
        data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        pid = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("iII", payload[:12])[0]
        msg = data.decode()
        self.seen.append((time.time(), pid, msg))
        return pid, msg

    def until(self, pred, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            pid, msg = self.recv(deadline - time.time())
            if pred(msg):
                return pid, msg
        raise AssertionError(f"not seen in {timeout} s; seen: {[m for _, _, m in self.seen]}")

    def close(self):
        self.sock.close()
        os.unlink(self.path)


def mount_types(mnt):
    with open("/proc/mounts") as f:
        return [line.split()[2] for line in f if line.split()[1] == mnt]


def answered_while_stopped(pid, mnt):
    """With the daemon stopped at once: the kernel has the mount, and a stat of its root is answered from what
    the daemon already told the kernel (fuse.attr_timeout), so the daemon had answered before READY."""
    os.kill(pid, signal.SIGSTOP)
    try:
        if mount_types(mnt) != ["fuse.nvcachefs"]:
            return "not mounted"
        r = subprocess.run(["stat", "-c", "%d", mnt, os.path.dirname(mnt)], capture_output=True, text=True,
                           timeout=3)
        devs = r.stdout.split()
        if r.returncode or len(devs) != 2 or devs[0] == devs[1]:
            return "the mount point is not the mount: " + r.stdout + r.stderr
        return None
    except subprocess.TimeoutExpired:
        return "stat waits for the daemon: it had not answered"
    finally:
        os.kill(pid, signal.SIGCONT)


def test_ready_status_stopping_in_order(make_cache, monkeypatch):
    c = make_cache(extra={"fuse.attr_timeout": "60s"})  # answered_while_stopped: the root's attributes stay
    c.format()
    ns = NotifySocket(os.path.join(c.tmp, "notify.sock"))
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", ns.path)
        logf = open(c.log, "a")
        # started as the unit does, without waiting for /proc/mounts: READY must say when the mount is there
        c.proc = subprocess.Popen([DAEMON, "-f", "-c", c.conf, c.mnt], stdout=logf, stderr=logf)
        pid, msg = ns.until(lambda m: "READY=1" in m.split("\n"))
        why = answered_while_stopped(c.proc.pid, c.mnt)
        assert why is None, why
        assert os.listdir(c.mnt) == []
        assert pid == c.proc.pid                                   # the main process: NotifyAccess=main will do
        assert not [m for _, _, m in ns.seen[:-1] if "STATUS=" in m]  # nothing before READY

        data = os.urandom(8 * MiB)
        with open(c.path("f"), "wb") as f:
            f.write(data)
            os.fsync(f.fileno())
        # destage.idle_after and max_dirty_age are 0: the 8 MiB stay dirty
        _, msg = ns.until(lambda m: re.search(r"^STATUS=dirty 8\.0 MiB of ", m, re.M) is not None, timeout=10)
        assert re.search(r"destage [0-9.]+ [KMG]?i?B/s", msg), msg

        c.proc.send_signal(signal.SIGTERM)
        _, msg = ns.until(lambda m: "STOPPING=1" in m.split("\n"))
        assert "STATUS=stopping: unmounting, 8.0 MiB dirty to destage" in msg, msg
        _, msg = ns.until(lambda m: "0 B dirty left" in m)
        assert re.search(r"STATUS=stopping: flushing, 0 B dirty left, 8\.0 MiB destaged", msg), msg
        assert c.proc.wait(timeout=60) == 0
        c.proc = None
        with open(os.path.join(c.backing, "f"), "rb") as f:
            assert f.read() == data

        msgs = [m for _, _, m in ns.seen]
        print("notify messages, in order:\n" + "\n".join(repr(m) for m in msgs))
        assert all(p == pid for _, p, _ in ns.seen)
        kinds = []
        for m in msgs:
            for line in m.split("\n"):
                k = line.split("=", 1)[0]
                if k == "STATUS":
                    k += ":" + line.split("=", 1)[1].split(" ", 1)[0]
                if not kinds or kinds[-1] != k:
                    kinds.append(k)
        # READY, running STATUS (no other kind in between), STOPPING, then the flush's STATUS and extensions only
        assert kinds[0] == "READY" and kinds[1] == "STATUS:dirty", kinds
        stop = kinds.index("STOPPING")
        assert set(kinds[1:stop]) == {"STATUS:dirty"}, kinds
        assert set(kinds[stop + 1:]) <= {"STATUS:stopping:", "EXTEND_TIMEOUT_USEC"}, kinds
    finally:
        ns.close()


def test_without_notify_socket_nothing_is_sent(make_cache, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    c = make_cache()
    c.format()
    c.mount()
    with open(c.path("f"), "wb") as f:
        f.write(b"x" * 4096)
    assert c.unmount() == 0
    assert "told systemd" not in c.log_text()


def test_stop_keeping_dirty_data_says_so(make_cache, monkeypatch):
    c = make_cache(extra={"destage.on_unmount": "keep"})
    c.format()
    ns = NotifySocket(os.path.join(c.tmp, "notify.sock"))
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", ns.path)
        c.mount()
        ns.until(lambda m: m == "READY=1")
        with open(c.path("f"), "wb") as f:
            f.write(os.urandom(2 * MiB))
        ns.until(lambda m: m.startswith("STATUS=dirty 2.0 MiB"), timeout=10)
        assert c.unmount() == 0                                   # fusermount3 -u: the loop ends the same way
        _, msg = ns.until(lambda m: "STOPPING=1" in m.split("\n"))
        assert msg == "STOPPING=1\nSTATUS=stopping: unmounting, 2.0 MiB dirty kept in the cache (on_unmount keep)"
        ns.sock.setblocking(False)
        rest = []
        while True:
            try:
                rest.append(ns.sock.recv(4096))
            except BlockingIOError:
                break
        assert rest == []                                         # no flush, no progress
    finally:
        ns.close()
