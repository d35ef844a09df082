"""data.extra_valid: monitored validation sets. Against independent truths: a set holding
data.valid's own files reports data.valid's figures exactly; a run with monitored sets writes the
records of a run without them (same weights, same figures, same best and lr) plus its sets' keys; a
killed run resumes to the same run; sets may be added at a resume; the errors name the key."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nmt.config import ConfigError, resolve_config
from nmt.data.errors import DataError
from nmt.train.trainer import Trainer
from tiny_task import TIMINGS, assert_resumes_exactly, interrupt_at, tiny_config, write_task


@pytest.fixture
def task(tmp_path):
    return write_task(tmp_path / "task", n_train=40)


def config(data, save_dir, extra=None, **training):
    cfg = tiny_config(data, save_dir, device="cpu", max_steps=8, valid_every=4, **training)
    cfg["validation"].update(metric="exact_match", metrics=["exact_match", "chrf"])
    if extra is not None:
        cfg["data"]["extra_valid"] = extra
    return cfg


def make(data, save_dir, extra=None, **training) -> Trainer:
    return Trainer(resolve_config(config(data, save_dir, extra, **training), "c.yaml"), "c.yaml")


def records(save_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS}
            for line in (save_dir / "metrics.jsonl").read_text().splitlines()]


def sets(data):
    return [{"name": "again", **data["valid"]}, {"name": "train", **data["train"]}]


def test_monitored_sets_report_and_change_nothing_else(task, tmp_path):
    make(task, tmp_path / "plain").train()
    make(task, tmp_path / "monitored", sets(task)).train()
    plain, monitored = records(tmp_path / "plain"), records(tmp_path / "monitored")
    validations = [r for r in monitored if "valid_loss" in r]
    assert len(validations) == 2
    for r in validations:
        own = {k[len("valid_"):]: v for k, v in r.items() if k.startswith("valid_") and "_again_" not in k
               and "_train_" not in k and not k.startswith(("valid_again", "valid_train"))}
        again = {k[len("valid_again_"):]: v for k, v in r.items() if k.startswith("valid_again_")}
        train = {k[len("valid_train_"):]: v for k, v in r.items() if k.startswith("valid_train_")}
        assert set(own) == set(again) == set(train) >= {"loss", "accuracy", "exact_match", "chrf", "certified"}
        assert again == own  # the same files: the same figures
        assert train != own
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith(("valid_again_", "valid_train_"))}
                        for r in rs]
    assert strip(monitored) == plain  # the same run: weights, best, lr


def test_a_killed_run_with_monitored_sets_resumes_exactly_and_sets_may_be_added(task, tmp_path):
    assert_resumes_exactly(lambda d: make(task, d, sets(task)), tmp_path, steps=8, kill_at=5)
    added = make(task, tmp_path / "added")  # a first session without sets
    assert added.train(step_hook=interrupt_at(5)).stopped_by == "SIGINT"
    later = make(task, tmp_path / "added", sets(task))
    assert later.resumed and later.train().step == 8
    last = records(tmp_path / "added")[-1]
    assert "valid_again_loss" in last and last["valid_again_loss"] == last["valid_loss"]


@pytest.mark.parametrize("extra, error, key", [
    (lambda d: [{"name": "a", **d["valid"]}, {"name": "a", **d["train"]}], ConfigError, "data.extra_valid[1].name"),
    (lambda d: [{"name": "valid", **d["valid"]}], ConfigError, "data.extra_valid[0].name"),
    (lambda d: [dict(d["valid"])], ConfigError, "data.extra_valid[0].name"),
    (lambda d: [{"name": "a", "src": d["valid"]["src"]}], ConfigError, "data.extra_valid[0].tgt"),
    (lambda d: [{"name": "a", "srcs": "x", **d["valid"]}], ConfigError, "data.extra_valid[0].srcs"),
    (lambda d: [{"name": "a", **d["valid"], "src_tag": "<2xx>"}], DataError, "data.extra_valid[0].src_tag"),
    (lambda d: [{"name": "a", "src": "missing.src", "tgt": d["valid"]["tgt"]}], DataError, "data.extra_valid[0].src"),
])
def test_errors_name_the_key(task, tmp_path, extra, error, key):
    with pytest.raises(error, match=re.escape(key)):
        make(task, tmp_path / "run", extra(task))
