"""Hostile clients of the control socket (issue 24, finding 8): a request over the size limit is told why, not
"Broken pipe"; parsing is linear in the number of arguments; a member of stats.readers cannot exhaust the
daemon (clients capped, a request has a total deadline); detach and attach read no argument they were not
sent; a client that stops reading is dropped instead of stalling its command."""
import grp
import os
import select
import socket
import subprocess
import time

import pytest

from conftest import CTL

NOBODY = 65534
PROTO = 5


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def nobody(code, *args, stdin=None):
    """python3 -c code as nobody (group nogroup, no others): a stats.readers member when the cache names it."""
    return subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                             "/usr/bin/python3", "-c", code, *args],
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p, timeout, input=None):
    try:
        out, err = p.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"still running after {timeout} s: {out} {err}")
    assert p.returncode == 0, err
    return out


def answer(s, timeout=30):
    """Everything the daemon sends until it closes."""
    s.settimeout(timeout)
    out = b""
    while True:
        try:
            b = s.recv(65536)
        except ConnectionResetError:
            return out.decode(errors="replace")
        if not b:
            return out.decode(errors="replace")
        out += b


def raw(c, req):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(c.ctl_socket())
        s.sendall(req)
        return answer(s)


@pytest.fixture
def readers_cache(make_cache):
    """A mount others reach, whose statistics the group of nobody (gid 65534) may read."""
    c = make_cache(public=True, extra={"stats.readers": grp.getgrgid(NOBODY).gr_name})
    c.format()
    c.mount()
    os.chmod(c.mnt, 0o755)
    yield c
    if c.proc:
        c.unmount()


# ---- a: a request over the size limit ----

def test_too_large_request_is_told_so_by_nvcachectl(cache):
    """nvcachectl status with more than CTL_REQ_MAX (1 MiB) of paths gets the daemon's message, not EPIPE."""
    name = "n" * 250
    open(cache.path(name), "w").close()
    r = subprocess.run([CTL, "status", *([cache.path(name)] * 4500)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "request too large" in r.stderr and "Broken pipe" not in r.stderr, r.stderr
    assert "dirty" in cache.ctl("stats", cache.mnt).stdout


def test_too_large_request_from_a_reader_is_answered(readers_cache):
    """A reader sending far more than it may (2 MiB of arguments; 4 KiB is a reader's limit) finishes its writes and
    reads the daemon's answer: the daemon answers, then reads and drops the rest (for a while) before it closes."""
    code = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
    s.sendall(b"stats 5 100000 0\\n" + (b"a" * 20 + b"\\0") * 100000)
    print("sent", end=" ")
except OSError as e:
    print("send:", e, end=" ")
s.settimeout(20)
out = b""
try:
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
except OSError as e:
    print("recv:", e, end=" ")
print("answer:", out.decode(errors="replace"))
"""
    out = finish(nobody(code, readers_cache.ctl_socket()), 60)
    assert out.startswith("sent answer: error request too large (more than 4096 bytes)"), out


# ---- b: parsing linear in the number of arguments ----

def test_parsing_many_arguments_is_linear(cache):
    """500000 empty arguments, sent in small pieces as fast as the daemon takes them: parsing rescans no
    argument it has seen, so the daemon spends well under a second on it."""
    pid = cache.proc.pid
    n = 500000
    req = f"version {PROTO} {n} 0\n".encode() + b"\0" * n
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(cache.ctl_socket())
        t0, c0 = time.time(), cpu_seconds(pid)
        for i in range(0, len(req), 200):
            s.sendall(req[i:i + 200])
            time.sleep(0.0002)
        ans = answer(s)
        used, took = cpu_seconds(pid) - c0, time.time() - t0
    print(f"daemon CPU for {n} arguments: {used:.2f} s (sent in {took:.1f} s)")
    assert ans.startswith("nvcachefs "), ans
    assert used < 0.15, f"the daemon spent {used:.2f} s of CPU parsing {n} arguments"


# ---- c: a stats.readers member cannot exhaust the daemon ----

HOLD = """
import socket, sys, time
n = int(sys.argv[2])
socks, refused = [], 0
for _ in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    socks.append(s)
time.sleep(0.5)
for s in socks:
    s.setblocking(False)
    try:
        if b"too many clients" in s.recv(1000):
            refused += 1
    except BlockingIOError:
        pass
print(refused, flush=True)
sys.stdin.read()
"""


def test_reader_cannot_hold_unbounded_clients(readers_cache):
    """64 idle connections from a reader: the daemon starts a bounded number of client threads, tells the rest
    it has too many clients, and still answers its owner."""
    c = readers_cache
    pid = c.proc.pid
    before = threads(pid)
    p = nobody(HOLD, c.ctl_socket(), "64", stdin=subprocess.PIPE)
    try:
        refused = int(p.stdout.readline() or -1)
        during = threads(pid)
        r = c.ctl("stats", c.mnt, check=False)
    finally:
        finish(p, 30, input="")
    print(f"threads {before} -> {during}, {refused} of 64 refused")
    assert during - before <= 8, f"{during - before} client threads for one reader (8 at most)"
    assert refused >= 48, f"{refused} of 64 told 'too many clients'"
    assert r.returncode == 0 and "dirty" in r.stdout, r.stderr


def test_refused_nvcachectl_says_why(readers_cache):
    """nvcachectl refused (the readers' places held), its request written only after the daemon has answered
    and closed (strace delays its sendto): it reads the answer after its write fails, and says why."""
    c = readers_cache
    p = nobody(HOLD, c.ctl_socket(), "16", stdin=subprocess.PIPE)
    try:
        assert int(p.stdout.readline() or -1) == 8
        late = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                               "strace", "-f", "-o", "/dev/null", "-e", "trace=sendto",
                               "-e", "inject=sendto:delay_enter=300000", CTL, "stats", c.mnt],
                              capture_output=True, text=True, timeout=30)
    finally:
        finish(p, 30, input="")
    assert late.returncode != 0 and "too many clients" in late.stderr, late.stderr


TRICKLE = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
t0 = time.time()
req = b"stats 5 1 0\\n" + b"a" * 1000
for i in range(len(req)):
    try:
        s.send(req[i:i + 1])
    except OSError:
        break
    r, _, _ = select.select([s], [], [], 1)
    if r:
        break
    if time.time() - t0 > 20:
        break
print(f"{time.time() - t0:.1f}", s.recv(1000).decode(errors="replace"))
""".replace("import socket", "import select, socket")


def test_trickling_reader_is_dropped(readers_cache):
    """A request sent one byte a second (each within the per-read timeout) is cut off at a total deadline."""
    c = readers_cache
    out = finish(nobody(TRICKLE, c.ctl_socket()), 60).split(" ", 1)
    print(f"trickling client dropped after {out[0]} s: {out[1]!r}")
    assert float(out[0]) < 12, f"a trickling client was still served after {out[0]} s"
    assert "dirty" in c.ctl("stats", c.mnt).stdout


# ---- d: detach and attach read no argument past the array ----

GUARD = r"""
/* calloc(1, 8) (an argument array for no argument) with a marker behind it: a read past the array
 * finds a pointer to "OVERREAD" instead of the zero glibc's chunk slack happens to hold */
#include <stddef.h>
#include <string.h>
void *__libc_calloc(size_t n, size_t size);
static const char marker[] = "OVERREAD";
void *calloc(size_t n, size_t size)
{
	void *p;

	if (n != 1 || size != sizeof(void *))
		return __libc_calloc(n, size);
	p = __libc_calloc(1, 2 * sizeof(void *));
	if (p)
		((const char **)p)[1] = marker;
	return p;
}
"""


def test_detach_and_attach_read_no_argument_past_the_array(make_cache, tmp_path):
    src, lib = tmp_path / "guard.c", tmp_path / "guard.so"
    src.write_text(GUARD)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
    c = make_cache()
    c.format()
    c.mount(wrapper=("env", f"LD_PRELOAD={lib}"))
    assert raw(c, f"detach {PROTO} 0 0\n".encode()).endswith("ok\n")
    assert raw(c, f"attach {PROTO} 0 0\n".encode()).endswith("ok\n")
    assert c.unmount() == 0
    log = c.log_text()
    assert "detach requested" in log and "attach requested" in log, log
    assert "OVERREAD" not in log, [x for x in log.splitlines() if "OVERREAD" in x]


# ---- e: a client that stops reading ----

def test_client_that_stops_reading_is_dropped(cache):
    """status of 3000 files, never read: the answer fills the socket; the daemon drops the client after a total
    send deadline instead of waiting out a send timeout per line, and goes on serving."""
    c = cache
    d = os.path.join(c.backing, "many")
    os.mkdir(d)
    for i in range(3000):
        open(os.path.join(d, f"f{i:05}"), "w").close()
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(c.ctl_socket())
        s.sendall(f"status {PROTO} 1 1\nmany\0".encode())
        t0 = time.time()
        p = select.poll()
        p.register(s, select.POLLHUP)
        hup = p.poll(25000)
        took = time.time() - t0
    print(f"non-reading client dropped after {took:.1f} s" if hup else "never dropped")
    assert hup and took < 15, f"a client that reads nothing was still connected after {took:.1f} s"
    assert "dirty" in c.ctl("stats", c.mnt).stdout
    assert "not reading" in c.log_text()
