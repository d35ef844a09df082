"""Checkpoints: atomic save/load, errors naming the file, rotation; RNG capture/restore."""
import random

import numpy as np
import pytest
import torch

from nmt.train.checkpoint import (FORMAT_VERSION, PAYLOAD_KEYS, CheckpointError, load_checkpoint, save_checkpoint,
                                  save_run_checkpoint, step_checkpoints)
from nmt.train.rng import rng_state, seed_everything, set_rng_state


def payload(step: int = 1) -> dict:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": {"decay": 0.5},
            "step": step, "epoch": 0, "rng": rng_state(), "config": {"a": {"b": [1, 2]}},
            "src_field": {"tokenizer": {"type": "bpe", "codes": "a b\n"}, "vocab": {"itos": ["x"]}},
            "tgt_field": {"tokenizer": {"type": "sentencepiece", "model_proto": b"\x00\x01"}, "vocab": {}},
            "metrics": {"valid_loss": 1.5}, "trainer": {"progress": {"step": step}, "early_stopping": {}}}


def test_roundtrip(tmp_path):
    original = payload()
    save_checkpoint(tmp_path / "c.pt", original)
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert set(PAYLOAD_KEYS) <= set(loaded)
    assert loaded["format_version"] == FORMAT_VERSION
    for key, value in original["model"].items():
        assert torch.equal(loaded["model"][key], value)
    assert loaded["tgt_field"]["tokenizer"]["model_proto"] == b"\x00\x01"
    assert loaded["config"] == original["config"]
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_errors_name_the_file(tmp_path):
    with pytest.raises(CheckpointError, match=r"missing\.pt: no such checkpoint file"):
        load_checkpoint(tmp_path / "missing.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match=r"corrupt\.pt: not a readable nmt checkpoint") as info:
        load_checkpoint(corrupt)
    assert "\n" not in str(info.value)
    save_checkpoint(tmp_path / "trunc.pt", payload())
    data = (tmp_path / "trunc.pt").read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"trunc\.pt"):
        load_checkpoint(tmp_path / "trunc.pt")
    future = payload()
    save_checkpoint(tmp_path / "future.pt", {**future, "format_version": FORMAT_VERSION + 1})
    with pytest.raises(CheckpointError, match=r"future\.pt: checkpoint format version"):
        load_checkpoint(tmp_path / "future.pt")
    # a newer format names the nmt that wrote it; a version of another type is not shown as this one's
    save_checkpoint(tmp_path / "newer.pt", {**future, "format_version": FORMAT_VERSION + 1, "nmt_version": "9.0"})
    with pytest.raises(CheckpointError, match=rf"format version {FORMAT_VERSION + 1} \(written by nmt 9\.0\) is "
                                              rf"not supported \(this nmt reads version {FORMAT_VERSION}"):
        load_checkpoint(tmp_path / "newer.pt")
    save_checkpoint(tmp_path / "text.pt", {**future, "format_version": str(FORMAT_VERSION)})
    with pytest.raises(CheckpointError, match=rf"format version '{FORMAT_VERSION}' "):
        load_checkpoint(tmp_path / "text.pt")
    torch.save({"weights": torch.ones(2)}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match=r"foreign\.pt: not an nmt checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")


def test_a_training_checkpoint_without_what_resuming_reads_is_one_line(tmp_path):
    """Resuming reads the trainer state (progress, early stopping): a checkpoint without it was
    accepted by load_checkpoint and then failed in the trainer with a bare KeyError: 'trainer'."""
    incomplete = payload()
    del incomplete["trainer"]
    save_checkpoint(tmp_path / "old.pt", incomplete)
    with pytest.raises(CheckpointError, match=r"^\S*old\.pt: incomplete checkpoint, missing trainer$"):
        load_checkpoint(tmp_path / "old.pt")


def test_a_directory_or_a_text_file_is_named_for_what_it_is(tmp_path):
    """A run directory was 'no such checkpoint file'; a text file showed torch's unpickling advice."""
    with pytest.raises(CheckpointError, match=r"^\S+: is a directory, not a checkpoint file$"):
        load_checkpoint(tmp_path)
    run = tmp_path / "run"  # a run directory: the message names its best.pt
    run.mkdir()
    (run / "best.pt").write_bytes(b"")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(run)
    assert str(info.value) == f"{run}: is a directory, not a checkpoint file (name one of its checkpoints, e.g. {run}/best.pt)"
    for name, data in (("config.yaml", b"data:\n  train: {src: a}\n"), ("hello.pt", b"hello\n")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(tmp_path / name)
        assert str(info.value) == (f"{tmp_path / name}: not a readable nmt checkpoint (not a torch.save archive: "
                                   "another kind of file, or truncated)")
    save_checkpoint(tmp_path / "trunc.pt", payload())
    data = (tmp_path / "trunc.pt").read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"trunc\.pt: not a readable nmt checkpoint \(not a torch\.save archive"):
        load_checkpoint(tmp_path / "trunc.pt")


def test_rotation_keeps_last_k_and_best(tmp_path):
    for step in range(1, 6):
        save_run_checkpoint(tmp_path, payload(step), keep_last=2, is_best=step == 2)
    assert [p.name for p in step_checkpoints(tmp_path)] == ["step_4.pt", "step_5.pt"]
    assert load_checkpoint(tmp_path / "best.pt")["step"] == 2
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 5
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    save_run_checkpoint(tmp_path, payload(6), keep_last=0)
    assert step_checkpoints(tmp_path) == []


def test_rng_state_roundtrip(tmp_path):
    base = payload()
    seed_everything(3)
    torch.rand(5), random.random(), np.random.rand()
    save_checkpoint(tmp_path / "r.pt", {**base, "rng": rng_state()})
    expected = (torch.rand(5), random.random(), np.random.rand(3), np.random.randn())
    seed_everything(99)
    set_rng_state(load_checkpoint(tmp_path / "r.pt")["rng"])
    again = (torch.rand(5), random.random(), np.random.rand(3), np.random.randn())
    assert torch.equal(expected[0], again[0]) and expected[1] == again[1]
    assert np.array_equal(expected[2], again[2]) and expected[3] == again[3]


def test_format_module_is_shared_and_decoding_does_not_import_training():
    """One file format (nmt.utils.checkpoint_file) for training and decoding; translate -> train is forbidden."""
    import subprocess
    import sys

    import nmt.train.checkpoint as policy
    import nmt.utils.checkpoint_file as file_format

    assert policy.load_checkpoint is file_format.load_checkpoint
    assert policy.CheckpointError is file_format.CheckpointError
    code = ("import sys, nmt.translate, nmt.translate.loading, nmt.cli.translate, nmt.utils.checkpoint_file; "
            "bad = sorted(m for m in sys.modules if m.startswith('nmt.train')); "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    code = ("import sys, nmt.utils.checkpoint_file; "
            "print(sorted(m for m in sys.modules if m.startswith('nmt.') and not m.startswith('nmt.utils') "
            "and m != 'nmt._version'))")  # the version string is a leaf every part may read
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
