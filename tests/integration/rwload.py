"""Random reads and writes to a few files on a thread, checked against a reference as they go."""
import os
import random
import threading
import time

MiB = 1 << 20


def excl_free(dev):
    """True if nobody holds dev open exclusively (the daemon does while it uses it)."""
    try:
        fd = os.open(dev, os.O_RDONLY | os.O_EXCL)
    except OSError:
        return False
    os.close(fd)
    return True


class Workload:
    """Random writes (and reads checked against a reference) to a few files until stopped."""

    def __init__(self, c, nfiles=4, size=4 * MiB):
        self.c, self.size = c, size
        self.names = [f"w{i}" for i in range(nfiles)]
        self.ref = {n: bytearray(os.urandom(size)) for n in self.names}
        for n in self.names:
            with open(c.path(n), "wb") as f:
                f.write(self.ref[n])
        self.stop = threading.Event()
        self.gate = threading.Lock()                # held for each operation; pause() takes it
        self.errors, self.ops = [], 0
        self.t = threading.Thread(target=self.run)

    def run(self):
        rnd = random.Random(7)
        fds = {n: os.open(self.c.path(n), os.O_RDWR) for n in self.names}
        try:
            while not self.stop.is_set():
                n = rnd.choice(self.names)
                off = rnd.randrange(0, self.size - 65536) & ~511
                ln = rnd.choice((512, 4096, 5000, 65536))
                with self.gate:
                    if rnd.random() < 0.6:
                        b = os.urandom(ln)
                        os.pwrite(fds[n], b, off)
                        self.ref[n][off:off + ln] = b
                    else:
                        got = os.pread(fds[n], ln, off)
                        if got != bytes(self.ref[n][off:off + ln]):
                            self.errors.append(f"{n} at {off}+{ln}: read differs")
                    self.ops += 1
        except OSError as e:
            self.errors.append(repr(e))
        finally:
            for fd in fds.values():
                os.close(fd)

    def start(self):
        self.t.start()

    def pause(self):
        """No operation under way until resume()."""
        self.gate.acquire()

    def resume(self):
        self.gate.release()

    def wait_ops(self, n):
        deadline = time.time() + 60
        while self.ops < n and not self.errors and time.time() < deadline:
            time.sleep(0.01)
        assert self.ops >= n, (self.ops, self.errors[:5])

    def finish(self):
        self.stop.set()
        self.t.join(timeout=60)
        assert not self.errors, self.errors[:5]

    def check(self, where):
        for n in self.names:
            with open(os.path.join(where, n), "rb") as f:
                assert f.read() == bytes(self.ref[n]), n
