"""Flushing subnormal floats for CPU training: on in a fresh process (its workers too), off with
NMT_FLUSH_DENORMAL=0, and nmt-train leaves the calling thread as it found it."""
import os
import platform
import subprocess
import sys

import pytest
import torch

from nmt.utils.denormals import flush_denormals, restore_denormals

needs_x86 = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="FTZ/DAZ are x86 modes")

SNIPPET = """
import torch
from nmt.utils.denormals import flush_denormals
on = flush_denormals()
torch.set_num_threads(2)
tiny = torch.full((64, 512), 1e-39)  # created under DAZ/FTZ: flushed where the modes are on
product = torch.full((64, 512), 1e-10) @ torch.full((512, 64), 1e-10)  # normal values: unchanged
print(on, bool(tiny[0, 0] == 0), bool((torch.full((4,), 1e-30) * 1e-10)[0] == 0), bool(product.abs().max() > 0))
"""


def run(env_value):
    env = dict(os.environ)
    env.pop("NMT_FLUSH_DENORMAL", None)
    if env_value is not None:
        env["NMT_FLUSH_DENORMAL"] = env_value
    out = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, env=env, check=True)
    return out.stdout.split()


@needs_x86
def test_fresh_process_flushes_and_the_switch_turns_it_off():
    on, tiny_zero, product_zero, normal_kept = run(None)
    assert on == "True" and tiny_zero == "True" and product_zero == "True" and normal_kept == "True"
    on, tiny_zero, product_zero, _ = run("0")
    assert on == "False" and tiny_zero == "False" and product_zero == "False"


@needs_x86
def test_restore_turns_the_mode_off_on_this_thread():
    was = bool(torch.tensor(1e-39) != 0)
    assert was, "the test process itself must not flush"
    if flush_denormals():
        assert bool(torch.tensor(1e-30) * 1e-10 == 0)
    restore_denormals()
    assert bool(torch.tensor(1e-30) * 1e-10 != 0)


@needs_x86
def test_nmt_train_leaves_the_mode_as_it_found_it():
    from nmt.cli.train import main

    with pytest.raises(SystemExit):
        main(["-config"])  # argparse: missing value
    assert main(["-config", "/nonexistent/config.yaml"]) == 2
    assert bool(torch.tensor(1e-30) * 1e-10 != 0)
