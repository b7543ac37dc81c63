"""Issue 25, findings 9-12 (found by xfstests generic/451, 615, 423, 467), through the real mount: what a
buffered read sees after an asynchronous O_DIRECT write, st_blocks of data only in the cache, ctime of a
write, and a second open of an unlinked file with dirty data."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


@pytest.fixture(scope="module")
def aio_dio_cycle(tmp_path_factory):
    """The C check of generic/451 (aio_dio_cycle.c), built with libaio."""
    if not os.path.exists("/usr/include/libaio.h"):
        pytest.skip("libaio headers not installed")
    exe = str(tmp_path_factory.mktemp("aio") / "aio_dio_cycle")
    subprocess.run(["cc", "-O1", "-o", exe, os.path.join(HERE, "aio_dio_cycle.c"), "-laio", "-lpthread"],
                   check=True)
    return exe


def test_buffered_read_sees_a_completed_async_direct_write(cache, aio_dio_cycle):
    """generic/451: buffered readers fill the page cache while a libaio O_DIRECT write rewrites the file;
    once the write has completed, a buffered read must return its bytes, not the page cache's old ones."""
    r = subprocess.run([aio_dio_cycle, cache.path("f"), "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"stale data after an async direct write: {r.stdout} {r.stderr}"
