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


def finish(p, timeout):
    try:
        out, err = p.communicate(timeout=timeout)
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
