"""A resume that changes ``validation.metric``: early stopping's best and patience (and so best.pt)
are rebuilt from metrics.jsonl for the new metric. Independent truths: a brute-force first best of
the records, and a straight run that used the new metric from its first step (the metric does not
change training, so both runs train the same weights)."""
import json
import logging
import math
import random

import pytest

from nmt.train.checkpoint import checkpoint_step
from nmt.train.early_stopping import EarlyStopping
from test_keep_best import make_trainer, task  # noqa: F401 (the fixture)


def first_best(values: list[tuple[int, float]], higher: bool) -> tuple[int, int]:
    """(step of the first best, validations after it) by a plain scan; NaN is never a best."""
    finite = [(s, v) for s, v in values if not math.isnan(v)]
    if not finite:
        return -1, len(values)
    best = max(v for _, v in finite) if higher else min(v for _, v in finite)
    index = next(i for i, (_, v) in enumerate(values) if v == best)
    return values[index][0], len(values) - index - 1


@pytest.mark.parametrize("higher", [False, True])
def test_replay_is_the_state_of_a_run_with_that_metric(higher):
    rng = random.Random(3)
    for _ in range(200):
        values = [(2 * (i + 1), rng.choice([0.1, 0.2, 0.3, math.nan, rng.random()])) for i in range(rng.randint(0, 9))]
        stopper = EarlyStopping(higher, patience=3)
        stopper.update(0.5 if higher else -5.0, 1)  # a state of another metric, replaced
        stopper.replay(values)
        step, after = first_best(values, higher)
        assert stopper.best_step == step
        assert stopper.bad_validations == after
        assert stopper.should_stop == (after >= 3)


def records(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_resume_with_another_metric_rebuilds_best_and_patience(task, tmp_path, caplog, monkeypatch):  # noqa: F811
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # off after a CLI test's setup_logging
    run, straight = tmp_path / "run", tmp_path / "straight"
    make_trainer(task, run, "loss", max_steps=12, keep_last=100).train()
    by_accuracy = [(r["step"], math.nan if r["valid_accuracy"] is None else r["valid_accuracy"]) for r in records(run)]
    expected_step, after = first_best(by_accuracy, higher=True)
    by_loss_step, _ = first_best([(r["step"], r["valid_loss"]) for r in records(run)], higher=False)
    assert expected_step != by_loss_step  # not vacuous: the two metrics pick different checkpoints
    with caplog.at_level("WARNING", logger="nmt"):
        resumed = make_trainer(task, run, "accuracy", max_steps=16, keep_last=100)
    assert resumed.stopper.best_step == expected_step and resumed.stopper.bad_validations == after
    assert checkpoint_step(run / "best.pt") == expected_step  # restored from step_N.pt of that step
    assert "validation.metric is now accuracy (loss ranked the checkpoints so far)" in caplog.text
    resumed.train()
    make_trainer(task, straight, "accuracy", max_steps=16, keep_last=100).train()
    assert [r["best"] for r in records(run)][6:] == [r["best"] for r in records(straight)][6:]
    assert checkpoint_step(run / "best.pt") == checkpoint_step(straight / "best.pt")
