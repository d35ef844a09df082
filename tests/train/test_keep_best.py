"""training.keep_best: the kept best_step_N.pt files against a brute-force top-N of metrics.jsonl,
over real tiny runs (both metric directions), a resume, crashes between a save's writes, and damage."""
import json
import logging
import math
import os
import random
import signal
from pathlib import Path

import pytest
import torch

import nmt.train.checkpoint as checkpoint_module
from nmt.config import ConfigError, resolve_config
from nmt.train.checkpoint import checkpoint_step, load_checkpoint
from nmt.train.early_stopping import EarlyStopping
from nmt.train.keep_best import KeptBest
from nmt.train.trainer import Trainer
from test_resume_fallback import flip_a_weight_bit
from tiny_task import tiny_config, write_task

# lr 0.1 makes the tiny task's validation figures go up and down, with ties (accuracy in steps of 1/28)
NOISY = {"max_steps": 24, "valid_every": 2, "optimizer": {"lr": 0.1}, "device": "cpu"}


@pytest.fixture
def task(tmp_path):
    return write_task(tmp_path / "data")


def make_trainer(task, save_dir, metric="loss", **training) -> Trainer:
    config = tiny_config(task, save_dir, **{**NOISY, **training})
    config["validation"]["metric"] = metric
    return Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")


def brute_force_top(save_dir: Path, metric: str, n: int) -> list[int]:
    """The steps of the n best validations metrics.jsonl records, by a plain sort: lower loss /
    higher accuracy first, ties by the earlier step (NaN left out)."""
    records = [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]
    pairs = [(r["step"], r[f"valid_{metric}"]) for r in records if not math.isnan(r[f"valid_{metric}"])]
    sign = 1 if metric == "loss" else -1
    return [step for step, _ in sorted(pairs, key=lambda sv: (sign * sv[1], sv[0]))[:n]]


def kept_files(save_dir: Path) -> list[int]:
    return sorted(int(p.name[len("best_step_"):-len(".pt")]) for p in save_dir.glob("best_step_*.pt"))


def assert_kept_is_top(save_dir: Path, metric: str, n: int) -> list[int]:
    """The files, the last.pt record and each file's own content agree with the brute-force top n."""
    top = brute_force_top(save_dir, metric, n)
    assert kept_files(save_dir) == sorted(top)
    record = load_checkpoint(save_dir / "last.pt")["trainer"]["keep_best"]
    assert record["metric"] == metric and [s for s, _ in record["entries"]] == top  # best first
    for step, value in record["entries"]:
        kept = load_checkpoint(save_dir / f"best_step_{step}.pt")
        assert kept["step"] == step and kept["metrics"]["step"] == step
        assert kept["metrics"][f"valid_{metric}"] == value
    return top


@pytest.mark.parametrize("higher", [False, True])
def test_the_ranking_is_a_brute_force_top_n_with_earlier_ties_first(higher):
    rng = random.Random(3)
    for trial in range(200):
        size = rng.randint(1, 5)
        stopper = EarlyStopping(higher)
        kept = KeptBest(size, "m", stopper.is_better, higher)
        seen = []
        for step in range(1, rng.randint(1, 15) + 1):
            value = rng.choice([rng.randint(0, 4) / 4, float("nan")]) if trial % 4 == 0 else rng.randint(0, 6) / 2
            kept.offer(step, value)
            seen.append((step, value))
            finite = [(s, v) for s, v in seen if not math.isnan(v)]
            expected = [s for s, _ in sorted(finite, key=lambda sv: (-sv[1] if higher else sv[1], sv[0]))[:size]]
            assert kept.steps == expected, (seen, size)
            # the head of the set is what best.pt holds (early stopping's rule)
            stopper.update(value, step)
            assert (kept.steps[:1] or [-1])[0] == stopper.best_step


@pytest.mark.parametrize("metric", ["loss", "accuracy"])
def test_a_run_keeps_the_n_best_validations_of_metrics_jsonl(task, tmp_path, metric):
    run = tmp_path / "run"
    summary = make_trainer(task, run, metric, keep_best=3).train()
    top = assert_kept_is_top(run, metric, 3)
    assert top[0] == summary.best_step == checkpoint_step(run / "best.pt")
    newest = sorted(int(p.name[5:-3]) for p in run.glob("step_*.pt"))
    assert sorted(top) != newest  # the noisy run's best are not simply its newest validations
    assert not list(run.glob(".*.tmp"))


def test_exact_match_ties_keep_the_earliest_steps(task, tmp_path):
    run = tmp_path / "run"
    make_trainer(task, run, "exact_match", keep_best=2).train()
    top = assert_kept_is_top(run, "exact_match", 2)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    if len({r["valid_exact_match"] for r in records}) == 1:  # all tied (the tiny task rarely gets a word right)
        assert top == [2, 4]


def test_a_killed_and_resumed_run_keeps_the_same_set(task, tmp_path):
    straight = tmp_path / "straight"
    make_trainer(task, straight, "accuracy", keep_best=3).train()

    def kill_at_11(step):  # between validations
        if step == 11:
            os.kill(os.getpid(), signal.SIGINT)

    resumed = tmp_path / "resumed"
    first = make_trainer(task, resumed, "accuracy", keep_best=3)
    assert first.train(step_hook=kill_at_11).stopped_by == "SIGINT"
    assert_kept_is_top(resumed, "accuracy", 3)  # the set of the first 5 validations
    second = make_trainer(task, resumed, "accuracy", keep_best=3)
    assert second.kept.steps == brute_force_top(resumed, "accuracy", 3)
    second.train()
    assert assert_kept_is_top(resumed, "accuracy", 3) == assert_kept_is_top(straight, "accuracy", 3)


class Crash(Exception):
    pass


@pytest.mark.parametrize("where", ["after the kept file", "after last.pt"])
def test_a_crash_mid_save_loses_no_kept_best_and_leaves_no_dangling_record(task, tmp_path, monkeypatch, where):
    """A power cut between a save's writes: the kept file written, last.pt not yet (its record is
    the old one); or last.pt written, the dropped file not yet deleted. The record never names a
    missing file, the resume deletes what it does not name, and the finished run keeps the top N."""
    run = tmp_path / "run"
    real_copy = checkpoint_module._atomic_copy
    straight = tmp_path / "straight"
    make_trainer(task, straight, "loss", keep_best=2).train()
    steps = [json.loads(line)["step"] for line in (straight / "metrics.jsonl").read_text().splitlines()]
    # a validation that enters the set after it is full, so the save also drops a kept file
    entering = next(s for s in steps[2:] if s in brute_force_top_upto(straight, "loss", 2, s))

    def crash(source, target):
        if where == "after the kept file" and target.name == "last.pt" and source.name == f"best_step_{entering}.pt":
            raise Crash("power cut before last.pt")
        if where == "after last.pt" and target.name == f"step_{entering}.pt":
            raise Crash("power cut before the dropped kept file is deleted")
        real_copy(source, target)

    monkeypatch.setattr(checkpoint_module, "_atomic_copy", crash)
    with pytest.raises(Crash):
        make_trainer(task, run, "loss", keep_best=2).train()
    monkeypatch.setattr(checkpoint_module, "_atomic_copy", real_copy)
    record = load_checkpoint(run / "last.pt")["trainer"]["keep_best"]["entries"]
    assert all((run / f"best_step_{s}.pt").is_file() for s, _ in record)  # nothing named is missing
    assert len(kept_files(run)) == 3  # the crash left one file beyond the record
    resumed = make_trainer(task, run, "loss", keep_best=2)
    assert kept_files(run) == sorted(s for s, _ in record) == sorted(resumed.kept.steps)
    resumed.train()
    assert assert_kept_is_top(run, "loss", 2) == brute_force_top(straight, "loss", 2)


def brute_force_top_upto(save_dir: Path, metric: str, n: int, step: int) -> list[int]:
    """brute_force_top over the validations up to ``step``."""
    records = [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]
    pairs = [(r["step"], r[f"valid_{metric}"]) for r in records if r["step"] <= step]
    sign = 1 if metric == "loss" else -1
    return [s for s, _ in sorted(pairs, key=lambda sv: (sign * sv[1], sv[0]))[:n]]


def test_a_damaged_or_missing_kept_file_is_restored_or_dropped_on_resume(task, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # off after a CLI test's setup_logging
    caplog.set_level(logging.WARNING, logger="nmt")
    run = tmp_path / "run"
    make_trainer(task, run, "accuracy", keep_best=3, max_steps=12, keep_last=12).train()
    top = brute_force_top(run, "accuracy", 3)
    damaged, missing = run / f"best_step_{top[0]}.pt", run / f"best_step_{top[1]}.pt"
    # a flipped bit inside a tensor record (the CRC check finds it; the file's middle byte may fall in
    # a record header's alignment padding, which no CRC covers), written as a file of its own (the
    # save hard-linked it to step_N.pt / best.pt)
    flip_a_weight_bit(damaged)
    missing.unlink()
    (run / "best_step_99.pt").write_bytes((run / "last.pt").read_bytes())  # a file no record names
    resumed = make_trainer(task, run, "accuracy", keep_best=3, max_steps=12, keep_last=12)
    assert resumed.kept.steps == top  # step_N.pt (keep_last 12) still held both steps
    assert kept_files(run) == sorted(top)
    assert (run / f"best_step_{top[0]}.pt.damaged").is_file()
    resumed.lock.release()
    for step in top:  # the restored files hold their step's weights (those of step_N.pt)
        restored, original = (load_checkpoint(run / f"{name}_{step}.pt")["model"] for name in ("best_step", "step"))
        assert restored.keys() == original.keys()
        assert all(torch.equal(restored[k], original[k]) for k in original)
    # with no step file left to restore from, a lost file leaves the set (a warning names it)
    (run / f"best_step_{top[2]}.pt").unlink()
    (run / f"step_{top[2]}.pt").unlink()
    if checkpoint_step(run / "best.pt") == top[2]:
        (run / "best.pt").unlink()
    again = make_trainer(task, run, "accuracy", keep_best=3, max_steps=12, keep_last=12)
    again.lock.release()
    assert again.kept.steps == top[:2] and kept_files(run) == sorted(top[:2])
    assert f"best_step_{top[2]}.pt: missing or damaged" in caplog.text


def test_a_smaller_keep_best_on_resume_drops_the_worst(task, tmp_path):
    run = tmp_path / "run"
    make_trainer(task, run, "loss", keep_best=4, max_steps=12).train()
    top = brute_force_top(run, "loss", 4)
    resumed = make_trainer(task, run, "loss", keep_best=2, max_steps=16)
    assert resumed.kept.steps == top[:2] and kept_files(run) == sorted(top[:2])
    resumed.train()
    assert_kept_is_top(run, "loss", 2)


def test_a_changed_metric_ranks_the_kept_files_again(task, tmp_path):
    run = tmp_path / "run"
    make_trainer(task, run, "loss", keep_best=4, max_steps=12).train()
    kept_by_loss = kept_files(run)
    values = {s: load_checkpoint(run / f"best_step_{s}.pt")["metrics"]["valid_accuracy"] for s in kept_by_loss}
    resumed = make_trainer(task, run, "accuracy", keep_best=2, max_steps=12)
    resumed.lock.release()
    expected = [s for s, _ in sorted(values.items(), key=lambda sv: (-sv[1], sv[0]))[:2]]
    assert resumed.kept.steps == expected and kept_files(run) == sorted(expected)


def test_keep_best_off_writes_and_removes_no_kept_file(task, tmp_path):
    run = tmp_path / "run"
    make_trainer(task, run, "loss", max_steps=8).train()
    assert kept_files(run) == []
    assert load_checkpoint(run / "last.pt")["trainer"]["keep_best"]["entries"] == []
    (run / "best_step_2.pt").write_bytes((run / "step_8.pt").read_bytes())  # an earlier setting's file
    make_trainer(task, run, "loss", max_steps=12).train()
    assert kept_files(run) == [2]


def test_a_negative_keep_best_is_a_config_error(task, tmp_path):
    with pytest.raises(ConfigError, match=r"tiny\.yaml.*training\.keep_best"):
        make_trainer(task, tmp_path / "run", keep_best=-1)


@pytest.mark.parametrize("metric", ["loss", "accuracy"])
def test_a_resume_that_falls_back_keeps_the_set_of_its_checkpoint(task, tmp_path, metric):
    """last.pt and the newest step_N.pt torn: the resume takes the newest checkpoint that loads, a
    kept best_step_N.pt of that step among them; the files of validations after it leave, and the
    finished run keeps the same set as one never interrupted."""
    straight = tmp_path / "straight"
    make_trainer(task, straight, metric, keep_best=2, max_steps=16, keep_last=1).train()
    run = tmp_path / "run"
    make_trainer(task, run, metric, keep_best=2, max_steps=12, keep_last=1).train()
    kept_at_12 = kept_files(run)
    for name in ("last.pt", "step_12.pt"):
        (run / name).unlink()
        (run / name).write_bytes(b"torn")
    (run / "best.pt").unlink()  # (else a best.pt of step 12 would serve first)
    resumed = make_trainer(task, run, metric, keep_best=2, max_steps=16, keep_last=1)
    # step 12 kept: its best_step_12.pt; else the newest kept file (step_10.pt is gone: keep_last 1)
    expected_step = 12 if 12 in kept_at_12 else max(kept_at_12)
    assert resumed.progress.step == expected_step and resumed.resume_path.name == f"best_step_{expected_step}.pt"
    assert resumed.kept.steps == brute_force_top_upto(straight, metric, 2, expected_step)
    assert kept_files(run) == sorted(resumed.kept.steps)
    assert checkpoint_step(run / "best.pt") == resumed.kept.steps[0]  # best.pt restored from its kept file
    resumed.train()
    assert assert_kept_is_top(run, metric, 2) == brute_force_top(straight, metric, 2)


def test_temporaries_of_kept_files_are_removed_on_start(task, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".best_step_4.pt.x1y2z3.tmp").write_bytes(b"half a checkpoint")  # a save killed mid-way
    make_trainer(task, run, "loss", keep_best=2, max_steps=4).train()
    assert not list(run.glob(".*.tmp")) and kept_files(run) == [2, 4]


def test_repair_best_takes_the_kept_file_of_the_best_step(tmp_path):
    from nmt.train.checkpoint import repair_best, save_checkpoint

    save_checkpoint(tmp_path / "best_step_4.pt", {"step": 4, "tag": "kept"})
    save_checkpoint(tmp_path / "best.pt", {"step": 2})  # stale
    assert repair_best(tmp_path, resumed_step=8, best_step=4) == tmp_path / "best_step_4.pt"
    assert torch.load(tmp_path / "best.pt", weights_only=True)["tag"] == "kept"
