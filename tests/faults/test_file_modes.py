"""Files written atomically get the mode the umask gives (not mkstemp's 0600)."""
import os
import stat

import pytest

from nmt.train.checkpoint import save_run_checkpoint
from nmt.utils.io import atomic_write_text, current_umask


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002, 0o077])
def test_atomic_write_respects_the_umask(tmp_path, umask, mask):
    umask(mask)
    assert current_umask() == mask
    atomic_write_text(tmp_path / "out.txt", "x\n")
    with open(tmp_path / "plain.txt", "w") as handle:  # what open() gives: the independent truth
        handle.write("x\n")
    assert mode(tmp_path / "out.txt") == mode(tmp_path / "plain.txt") == 0o666 & ~mask


def test_checkpoints_of_a_run_are_0644_under_umask_022(tmp_path, umask):
    umask(0o022)
    save_run_checkpoint(tmp_path, {"step": 3, "model": {}}, keep_last=1, is_best=True, kept_steps=[3])
    for name in ("last.pt", "best.pt", "step_3.pt", "best_step_3.pt"):
        assert mode(tmp_path / name) == 0o644, name


def test_run_directory_and_translation_outputs_follow_the_umask(tmp_path, umask):
    from nmt.cli import translate as translate_cli
    from nmt.config import resolve_config
    from nmt.train.trainer import Trainer
    from tiny_task import tiny_config, write_task

    umask(0o027)
    data = write_task(tmp_path / "data")
    Trainer(resolve_config(tiny_config(data, tmp_path / "run", max_steps=4, keep_best=2), "t.yaml"), "t.yaml").train()
    out, report = tmp_path / "out" / "hyp.txt", tmp_path / "out" / "report.jsonl"
    assert translate_cli.main(["-model", str(tmp_path / "run" / "best.pt"), "-src", data["valid"]["src"],
                               "-output", str(out), "-report", str(report), "-quiet"]) == 0
    files = [p for p in (tmp_path / "run").iterdir() if p.is_file()] + [out, report]
    assert {p.name for p in files} >= {"last.pt", "best.pt", "step_4.pt", "best_step_4.pt", "config.yaml",
                                       "metrics.jsonl", "hyp.txt", "report.jsonl"}
    assert {p.name: oct(mode(p)) for p in files} == {p.name: oct(0o640) for p in files}
