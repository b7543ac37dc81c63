"""Data for the integration tests: files written through a mount, read back from it or from the backing store,
each compared byte for byte; and a digest of images, to show that a device was left alone."""
import hashlib
import os

MiB = 1 << 20


def write_all(c, blobs):
    for n, b in blobs.items():
        with open(c.path(n), "wb") as f:
            f.write(b)


def read_all(c, blobs):
    for n, b in blobs.items():
        with open(c.path(n), "rb") as f:
            assert f.read() == b, n


def in_store(c, blobs):
    for n, b in blobs.items():
        with open(os.path.join(c.backing, n), "rb") as f:
            assert f.read() == b, n


def digest(paths):
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for b in iter(lambda: f.read(4 * MiB), b""):
                h.update(b)
    return h.hexdigest()
