"""Data-parallel training (2 processes, Gloo, CPU) against one process: same parameters.

N processes with batch B take the same global batches as one process with batch N x B, each
rank its part, the loss normalised by the global token count: the parameters after K steps
agree up to float32 summation order (DDP sums gradients in another order; tolerance below).
A 2-process run stopped by SIGTERM on one rank stops on both, and resumes to the parameters
of an uninterrupted 2-process run exactly (every rank restores its own RNG states); a NaN loss
on one rank is skipped, or stops the run, on both.
"""
import numpy as np
import pytest
import torch

from nmt.train.checkpoint import load_checkpoint
from nmt.train.distributed import init_distributed, loss_normalizer, shard_batch
from nmt.train.trainer import Trainer
from nmt.config import resolve_config
from ddp_workers import gloo_config
from tiny_task import write_task


_config = gloo_config


def _weights(path):
    return load_checkpoint(path)["model"]


def test_shard_batch_splits_and_pads_with_a_zero_weight_example():
    parts = [shard_batch([5, 6, 7, 8, 9], r, 2) for r in range(2)]
    assert [p.tolist() for p, _ in parts] == [[5, 6, 7], [8, 9]] and all(real for _, real in parts)
    part, real = shard_batch([4], 1, 2)
    assert part.tolist() == [4] and not real
    assert loss_normalizer(120, 2) == 60.0


def test_more_cuda_ranks_than_gpus_is_a_one_line_error(monkeypatch):
    """A second CUDA process on a one-GPU machine is refused before any process group is made."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"LOCAL_RANK=1 but this machine has 1 CUDA device\(s\).*training.device: cpu"):
        init_distributed("cuda")


@pytest.mark.slow
def test_two_processes_equal_one_process_with_twice_the_batch(tmp_path, ranks):
    data = write_task(tmp_path / "data", n_train=36)
    one = Trainer(resolve_config(_config(data, tmp_path / "one", 8, max_steps=6, valid_every=3), "t"), "t")
    one_summary = one.train()
    two = _config(data, tmp_path / "two", 4, max_steps=6, valid_every=3)
    two["data"]["id_cache"] = True  # the memory-mapped dataset, built by rank 0, read by rank 1
    results = ranks.run(two)
    assert [r[2:4] for r in results] == [("max_steps", 6)] * 2
    a, b = _weights(tmp_path / "one" / "last.pt"), _weights(tmp_path / "two" / "last.pt")
    moved = max((a[k] - load_checkpoint(tmp_path / "one" / "step_3.pt")["model"][k]).abs().max() for k in a)
    assert moved > 1e-3  # the steps changed the weights, so equality below means something
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=2e-6, msg=name)
    # only rank 0 wrote: one metrics line per validation, the same validation loss as one process
    import json
    lines = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [3, 6]
    assert np.allclose([r["valid_loss"] for r in lines], [r["valid_loss"] for r in ref], rtol=1e-5)
    assert np.allclose([r["train_loss"] for r in lines], [r["train_loss"] for r in ref], rtol=1e-5)
    assert one_summary.step == 6
    # a different number of processes resumes when the effective batch is the same: 2 x 4 -> 1 x 8
    for run in ("one", "two"):
        config = _config(data, tmp_path / run, 8, max_steps=8, valid_every=3)
        config["data"]["id_cache"] = run == "two"
        assert Trainer(resolve_config(config, "t"), "t").train().step == 8
    a, b = _weights(tmp_path / "one" / "last.pt"), _weights(tmp_path / "two" / "last.pt")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=2e-6, msg=name)
    config = _config(data, tmp_path / "two", 3, max_steps=9, valid_every=3)  # 2 x 3 != 8: refused
    config["data"]["id_cache"] = True
    with pytest.raises(AssertionError, match=r"training.batch_size: the run was trained with 1 process\(es\) x "
                       r"batch_size 8 = 8; 2 x 3 differs \(set training.batch_size to 4\)"):
        ranks.run(config)


@pytest.mark.slow
def test_accumulation_two_processes_equal_one_process(tmp_path, ranks):
    """2 processes x batch 3 x accumulate 2 == 1 process x batch 6 x accumulate 2 (no_sync on the first
    micro-batch; the loss over the tokens of all micro-batches of all ranks)."""
    data = write_task(tmp_path / "data", n_train=30)
    Trainer(resolve_config(_config(data, tmp_path / "one", 6, max_steps=4, valid_every=4, accumulate=2), "t"),
            "t").train()
    results = ranks.run(_config(data, tmp_path / "two", 3, max_steps=4, valid_every=4, accumulate=2))
    assert [r[2:4] for r in results] == [("max_steps", 4)] * 2 and results[0][4] == results[1][4]
    a, b = _weights(tmp_path / "one" / "last.pt"), _weights(tmp_path / "two" / "last.pt")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=2e-6, msg=name)


@pytest.mark.slow
def test_sents_normalization_two_processes_equal_one_process(tmp_path, ranks):
    """training.normalization: sents divides by the sentences of all micro-batches of all ranks: 2
    processes x batch 3 x accumulate 2 == 1 process x batch 6 x accumulate 2, through an epoch whose
    last global batch holds one sentence (rank 1 runs a stand-in of weight 0); not the tokens run."""
    data = write_task(tmp_path / "data", n_train=25)
    for name, normalization in (("one", "sents"), ("tokens", "tokens")):
        Trainer(resolve_config(_config(data, tmp_path / name, 6, max_steps=4, valid_every=4, accumulate=2,
                                       normalization=normalization), "t"), "t").train()
    results = ranks.run(_config(data, tmp_path / "two", 3, max_steps=4, valid_every=4, accumulate=2,
                                normalization="sents"))
    assert [r[2:4] for r in results] == [("max_steps", 4)] * 2
    a, b = _weights(tmp_path / "one" / "last.pt"), _weights(tmp_path / "two" / "last.pt")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=2e-6, msg=name)
    tokens = _weights(tmp_path / "tokens" / "last.pt")
    assert max((a[k] - tokens[k]).abs().max() for k in a) > 1e-4  # sents is another update


@pytest.mark.slow
def test_sigterm_on_one_rank_stops_both_and_resume_is_exact(tmp_path, ranks):
    data = write_task(tmp_path / "data", n_train=36)
    # dropout on: the resumed ranks must restore their own random streams
    full = ranks.run(_config(data, tmp_path / "full", 4, dropout=0.3, max_steps=10, valid_every=4))
    assert [r[2:4] for r in full] == [("max_steps", 10)] * 2
    cut = ranks.run(_config(data, tmp_path / "cut", 4, dropout=0.3, max_steps=10, valid_every=4), signal_at={1: 6})
    assert [r[2:4] for r in cut] == [("SIGTERM", 6)] * 2  # agreed: rank 0 stops at the same step
    assert load_checkpoint(tmp_path / "cut" / "last.pt")["step"] == 6
    resumed = ranks.run(_config(data, tmp_path / "cut", 4, dropout=0.3, max_steps=10, valid_every=4))
    assert [r[2:4] for r in resumed] == [("max_steps", 10)] * 2
    a, b = _weights(tmp_path / "full" / "last.pt"), _weights(tmp_path / "cut" / "last.pt")
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.slow
def test_a_nan_loss_on_one_rank_is_handled_by_all(tmp_path, ranks):
    data = write_task(tmp_path / "data", n_train=36)
    # skip: both ranks drop the same update and stay identical
    skip = ranks.run(_config(data, tmp_path / "skip", 4, max_steps=5, valid_every=5, nonfinite="skip"), nan_at={1: 3})
    assert [r[2:4] for r in skip] == [("max_steps", 5)] * 2
    assert np.isfinite(skip[0][4]) and skip[0][4] == skip[1][4]  # finite: no rank stepped on NaN gradients
    # stop: both ranks stop with the non-finite-loss error at the same step, nothing saved after it
    stop = ranks.run(_config(data, tmp_path / "stop", 4, max_steps=5, valid_every=2), nan_at={1: 3}, errors_ok=True)
    assert [r[1] for r in stop] == ["error", "error"]
    assert all("NonFiniteLossError" in r[2] and "step 3" in r[2] for r in stop), stop
    assert load_checkpoint(tmp_path / "stop" / "last.pt")["step"] == 2
