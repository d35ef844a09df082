"""glibc malloc tuning: in effect on Linux, off with NMT_MALLOC_TUNING=0."""
import os
import subprocess
import sys

import pytest

CODE = "from nmt.utils.allocator import keep_freed_memory as k; print(k(), k())"


def _run(**env):
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_tuning_is_on_by_default_and_can_be_switched_off():
    assert _run() == ["True", "True"]
    assert _run(NMT_MALLOC_TUNING="0") == ["False", "False"]


def test_freeze_and_thaw_live_objects():
    import gc

    from nmt.utils.allocator import freeze_live_objects, thaw_live_objects

    thaw_live_objects()
    assert gc.get_freeze_count() == 0
    freeze_live_objects()
    try:
        assert gc.get_freeze_count() > 1000  # the interpreter, torch and pytest are out of the scans
    finally:
        thaw_live_objects()
    assert gc.get_freeze_count() == 0


EFFECT = """
import ctypes, ctypes.util
from nmt.utils.allocator import keep_freed_memory, release_freed_memory
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
if not hasattr(libc, "mallinfo2"):
    print("no-mallinfo2")
    raise SystemExit
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def mmapped_blocks_of_a_large_malloc():
    before = libc.mallinfo2().hblks
    block = libc.malloc(1 << 26)
    grown = libc.mallinfo2().hblks - before
    libc.free(block)
    return grown
print(mmapped_blocks_of_a_large_malloc(), keep_freed_memory(), mmapped_blocks_of_a_large_malloc(),
      libc.mallinfo2().fordblks >= 1 << 26, release_freed_memory(), libc.mallinfo2().fordblks < 1 << 26)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_the_tuning_keeps_large_blocks_on_the_heap_until_released():
    """glibc's own count (``mallinfo2``): a 64 MiB ``malloc`` is one mmapped block before the tuning
    and none after it (served from the heap, whose freed 64 MiB stay there untrimmed), and
    ``release_freed_memory`` gives them back (``malloc_trim``)."""
    out = subprocess.run([sys.executable, "-c", EFFECT], capture_output=True, text=True, check=True).stdout.split()
    if out == ["no-mallinfo2"]:
        pytest.skip("glibc older than 2.33 (no mallinfo2)")
    assert out == ["1", "True", "0", "True", "True", "True"]
