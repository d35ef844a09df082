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
