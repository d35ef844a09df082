"""Fine-tuning, fp16 overflow skips, the resume from a damaged last.pt and the token-id cache in
data-parallel training (2 processes, Gloo, CPU; the ranks of :class:`ddp_workers.RankPool`).

The truths they are held to: the parent checkpoint's own weights, fields and optimizer state; a
single-process run with the same global batch (up to the float32 summation order of DDP, the
tolerance of test_distributed); a single-process run whose data order lacks the overflowed
batches; the uninterrupted run's own checkpoint; an in-memory encoding of the data. What each
rank writes is recorded by a Python audit hook (``ddp_probes``): rank 1 writes nothing.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import queue as queue_module
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.config import resolve_config
from nmt.data.vocab_file import read_vocab_entries
from nmt.data.vocabulary import SPECIALS
from nmt.train.checkpoint import checkpoint_step, load_checkpoint
from nmt.train.trainer import Trainer
from ddp_probes import EmaProbe, FineTuneProbe, OverflowOnRank, ResumeProbe, ValidationProbe, build_id_cache
from ddp_workers import gloo_config
from tiny_task import tiny_config, write_task

RTOL, ATOL = 1e-5, 2e-6  # DDP sums gradients in another order than one process (test_distributed)


_config = gloo_config


def _train(config) -> Trainer:
    trainer = Trainer(resolve_config(config, "t"), "t")
    trainer.train()
    return trainer


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=RTOL, atol=ATOL, msg=name)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _optimizer_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].keys() == b[k].keys() and all(torch.equal(torch.as_tensor(a[k][n]), torch.as_tensor(b[k][n]))
                                           for n in a[k]) for k in a)


@pytest.mark.slow
def test_fine_tuning_in_two_processes_equals_one_process_and_only_rank_0_writes(tmp_path, ranks):
    """Every rank starts from the parent's weights (before DDP broadcasts rank 0's), fields and
    Adam state (which DDP never broadcasts); the child trained by 2 x 4 equals the one trained by
    1 x 8; rank 1 writes nothing anywhere, rank 0 only into the child's save_dir, whose vocab.src /
    vocab.tgt are the parent's vocabularies."""
    data = write_task(tmp_path / "data", n_train=24)
    parent = tmp_path / "parent"
    _train(_config(data, parent, 8, max_steps=4, valid_every=2))
    new = tmp_path / "new"  # letters the parent never saw (g, h: <unk>) and other frequencies
    new.mkdir()
    words = ["gab", "hhc", "fgd", "ab", "cgh", "dead", "hg", "beef", "gg", "fade", "ccc", "bad"] * 2
    (new / "train.src").write_text("".join(" ".join(w) + "\n" for w in words), encoding="utf-8")
    (new / "train.tgt").write_text("".join(w[::-1] + "\n" for w in words), encoding="utf-8")
    child_data = {"train": {"src": str(new / "train.src"), "tgt": str(new / "train.tgt")}, "valid": data["valid"]}

    def child(save_dir, batch_size):
        return _config(child_data, save_dir, batch_size, max_steps=4, valid_every=2, init_from=str(parent),
                       init_optimizer=True)

    _train(child(tmp_path / "one", 8))
    results = ranks.run(child(tmp_path / "two", 4), hooks=FineTuneProbe(str(tmp_path)))
    assert [r[2:4] for r in results] == [("max_steps", 4)] * 2
    best = load_checkpoint(parent / "best.pt")
    moved = max((best["model"][k] - load_checkpoint(tmp_path / "one" / "last.pt")["model"][k]).abs().max()
                for k in best["model"])
    assert moved > 1e-3  # the child's steps changed the weights: the equality below means something
    for rank, *_, probe in results:
        assert probe["step"] == 0
        assert _equal(probe["weights"], best["model"]), f"rank {rank} did not start from the parent's weights"
        assert probe["fields"] == (best["src_field"], best["tgt_field"]), rank
        parent_state = {k: dict(v) for k, v in best["optimizer"]["state"].items()}
        assert parent_state and _optimizer_equal(probe["optimizer"], parent_state), rank
    two = load_checkpoint(tmp_path / "two" / "last.pt")
    _close(two["model"], load_checkpoint(tmp_path / "one" / "last.pt")["model"])
    assert two["step"] == 4 and two["src_field"] == best["src_field"] and two["tgt_field"] == best["tgt_field"]
    assert all(_equal(probe["final"], two["model"]) for *_, probe in results)  # the ranks stayed equal
    # files: rank 1 none; rank 0 only in the child's save_dir (the parent and the data untouched)
    writes = {rank: probe["writes"] for rank, *_, probe in results}
    assert writes[1] == [], writes[1][:5]
    assert writes[0] and all(path.split(os.sep)[0] == "two" for _, *paths in writes[0] for path in paths), writes[0]
    renamed = {os.path.basename(entry[-1]) for entry in writes[0] if entry[0] == "os.rename"}
    assert {"last.pt", "vocab.src", "vocab.tgt", "config.yaml"} <= renamed  # atomic: a temporary renamed
    for side, field in (("src", best["src_field"]), ("tgt", best["tgt_field"])):
        tokens = [token for token, _, _ in read_vocab_entries(tmp_path / "two" / f"vocab.{side}")]
        assert tokens == field["vocab"]["itos"][len(SPECIALS):], side
        assert (tmp_path / "two" / f"vocab.{side}").read_bytes() == (tmp_path / "one" / f"vocab.{side}").read_bytes()
    assert not list((tmp_path / "two").glob(".*.tmp"))


BAD = {(0, 1), (0, 2), (1, 4)}  # global batch positions (epoch, batch_in_epoch); 5 batches of 8 per epoch


def _leave_out(monkeypatch, absent: set) -> None:
    """The trainer's batch order without the batches at the positions ``absent`` (as test_fp16_overflow)."""
    import nmt.train.trainer as trainer_module

    real = trainer_module.make_batch_order

    def without(dataset, *args, epoch, **kwargs):
        return [b for i, b in enumerate(real(dataset, *args, epoch=epoch, **kwargs)) if (epoch, i) not in absent]

    monkeypatch.setattr(trainer_module, "make_batch_order", without)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["gradient", "after_reduce"])
def test_an_fp16_overflow_on_rank_1_only_is_skipped_by_both_ranks(tmp_path, ranks, monkeypatch, where):
    """fp16 (GradScaler on the CPU; autocast off so that updates at halved scales are exactly
    proportional, as test_fp16_overflow does) with an overflow injected on rank 1 at three global
    batches: by a gradient hook before the all-reduce, or into the reduced gradient of rank 1 only
    (its scaler alone finds it). Both ranks skip those updates and end identical (weights, Adam
    state, loss scale 2^16 / 2^3, counts, step, schedule); last.pt holds the counts; weights and
    Adam state equal, to DDP's tolerance, a single-process run whose data order lacks those batches."""
    data = write_task(tmp_path / "data")
    settings = dict(precision="fp16", max_steps=12, valid_every=4, lr_schedule={"warmup_steps": 6})
    reference = Trainer(resolve_config(_config(data, tmp_path / "reference", 8, **settings), "t"), "t")
    reference.precision.autocast = contextlib.nullcontext
    with monkeypatch.context() as patch:
        _leave_out(patch, BAD)
        assert reference.train().step == 12
    assert reference.overflows.total == 0
    results = ranks.run(_config(data, tmp_path / "run", 4, **settings), hooks=OverflowOnRank(1, BAD, where))
    zero = _same_on_both_ranks(results, 12)
    assert zero["overflows"] == {"total": 3, "in_a_row": 0}
    assert zero["scale"] == 2.0 ** 16 / 2 ** 3  # GradScaler: halved per overflow, no growth within 2000 updates
    assert zero["schedule_steps"] == reference.schedule.step_count == 12 and zero["lr"] == reference.schedule.lr
    p = reference.progress  # 12 applied + 3 dropped of 5 per epoch = the reference's 12 of 3 + 4 + 5
    assert zero["progress"] == (12, 3, 0) == (p.step, p.epoch, p.batch_in_epoch)
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    assert last["step"] == 12 and last["trainer"]["overflow_skips"] == {"total": 3, "in_a_row": 0}
    assert last["grad_scaler"]["scale"] == 2.0 ** 13
    assert last["scheduler"] == load_checkpoint(tmp_path / "reference" / "last.pt")["scheduler"]
    assert _equal(last["model"], zero["weights"])
    _close(zero["weights"], reference.model.state_dict())
    ref_state = reference.optimizer.state_dict()["state"]
    for key, state in zero["optimizer"].items():
        _close({n: torch.as_tensor(v) for n, v in state.items()}, {n: torch.as_tensor(v) for n, v in ref_state[key].items()})


@pytest.mark.slow
def test_an_fp16_overflow_on_rank_1_only_with_real_fp16_autocast(tmp_path, ranks):
    """The same with float16 autocast on (the CPU's): no single-process reference to compare
    with (updates at other scales round differently), but both ranks skip the same updates and end
    bit-identical, and the counts, scale and data position agree with each other in closed form
    (any overflow the fp16 arithmetic adds of its own is counted too)."""
    data = write_task(tmp_path / "data")
    config = _config(data, tmp_path / "run", 4, precision="fp16", max_steps=12, valid_every=4)
    zero = _same_on_both_ranks(ranks.run(config, hooks=OverflowOnRank(1, BAD, "after_reduce", fp32_arithmetic=False)), 12)
    k = zero["overflows"]["total"]
    assert k >= 3 and zero["scale"] == 2.0 ** (16 - k) and zero["schedule_steps"] == 12
    step, epoch, batch = zero["progress"]
    assert step == 12 and epoch * 5 + batch == 12 + k
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    assert last["trainer"]["overflow_skips"]["total"] == k and last["grad_scaler"]["scale"] == zero["scale"]
    assert _equal(last["model"], zero["weights"])


@pytest.mark.slow
def test_the_moving_average_in_two_processes_equals_one_process_and_only_rank_0_writes(tmp_path, ranks):
    """training.ema with 2 x 4: both ranks hold the same average (bit for bit: their weights are
    equal) as the single-process 1 x 8 run's, up to DDP's summation order; rank 1 writes nothing;
    last.pt's model is that average, raw_model the trained weights."""
    data = write_task(tmp_path / "data", n_train=24)
    ema = {"decay": 0.8}
    one = _train(_config(data, tmp_path / "one", 8, max_steps=6, valid_every=3, ema=ema))
    results = ranks.run(_config(data, tmp_path / "two", 4, max_steps=6, valid_every=3, ema=ema),
                        hooks=EmaProbe(str(tmp_path)))
    assert [r[2:4] for r in results] == [("max_steps", 6)] * 2
    (_, _, _, _, _, zero), (_, _, _, _, _, first) = results
    assert _equal(zero["average"], first["average"]) and _equal(zero["final"], first["final"])
    assert zero["averaged_updates"] == first["averaged_updates"] == one.ema.averaged_updates == 6
    reference = dict(zip(one.ema.names, one.ema.average))
    _close(zero["average"], reference)
    assert max((reference[k] - one.model.state_dict()[k]).abs().max() for k in reference) > 1e-4  # not the weights
    assert first["writes"] == [] and zero["writes"]
    last = load_checkpoint(tmp_path / "two" / "last.pt")
    assert _equal({k: last["model"][k] for k in zero["average"]}, zero["average"])
    assert _equal(last["raw_model"], zero["final"])


def test_validation_is_shared_by_the_ranks_and_equals_one_processs(tmp_path, ranks):
    """With 2 ranks each validates every second batch (teacher-forced totals all-reduced, decoded
    hypotheses gathered by rank 0): rank 0's figures equal its own validation of the whole set
    alone (the float64 totals up to their summation order; hypotheses, exact match, BLEU and the
    certified share the same), rank 1 gets none; the run's metrics.jsonl holds rank 0's figures, and a
    monitored set (data.extra_valid) of the same files, shared alike, the same figures."""
    data = write_task(tmp_path / "data", n_train=24)
    config = _config(data, tmp_path / "run", 4, max_steps=6, valid_every=3)
    config["validation"].update(metric="exact_match", metrics=["exact_match", "bleu"], batch_size=2)
    config["data"]["extra_valid"] = [{"name": "again", **data["valid"]}]  # a monitored set: the same files
    results = ranks.run(config, hooks=ValidationProbe())
    assert [r[2:4] for r in results] == [("max_steps", 6)] * 2
    (_, _, _, _, _, zero), (_, _, _, _, _, first) = results
    assert first == {"shared": None}
    (shared, shared_hyps), (alone, alone_hyps) = zero["shared"], zero["alone"]
    assert shared_hyps == alone_hyps and len(shared_hyps) == len(Path(data["valid"]["src"]).read_text().splitlines())
    assert set(shared) == set(alone) >= {"loss", "accuracy", "exact_match", "bleu", "certified"}
    for key, value in alone.items():
        assert shared[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r["step"] == 6 and "valid_loss" in r][-1]
    assert last["valid_exact_match"] == pytest.approx(alone["exact_match"]) and last["valid_loss"] == pytest.approx(
        alone["loss"], rel=1e-9)
    for key in ("exact_match", "bleu", "certified", "loss", "accuracy"):  # the monitored set, shared alike
        assert last[f"valid_again_{key}"] == pytest.approx(last[f"valid_{key}"], rel=1e-12), key


def _same_on_both_ranks(results: list[tuple], steps: int) -> dict:
    """Rank 0's probe of an :class:`OverflowOnRank` job after checking that rank 1's is the same
    (counts, scale, schedule, lr, data position; weights and Adam state bit for bit)."""
    assert [r[2:4] for r in results] == [("max_steps", steps)] * 2
    (_, _, _, _, _, zero), (_, _, _, _, _, one) = results
    for key in ("overflows", "scale", "schedule_steps", "lr", "progress"):
        assert zero[key] == one[key], (key, zero[key], one[key])
    assert _equal(zero["weights"], one["weights"]) and _optimizer_equal(zero["optimizer"], one["optimizer"])
    return zero


def _flip_a_weight_bit_in_place(path) -> bytes:
    """Flip one bit inside the first tensor record of ``path`` in place (its hard links, the same
    save's step_N.pt / best.pt, see it too: the CRC-32 check fails); returns the new bytes."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if "/data/" in i.filename and i.file_size >= 16)
    with open(path, "r+b") as handle:
        handle.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", handle.read(4))
        offset = info.header_offset + 30 + name_length + extra_length + info.file_size // 2
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0x08]))
    return path.read_bytes()


@pytest.mark.slow
def test_a_two_process_resume_from_a_damaged_last_pt(tmp_path, ranks):
    """last.pt of a 2-process run (step 10) with a flipped bit (its CRC-32 fails), and step_10.pt
    with it: both ranks resume from step_8.pt, rank 0 alone renames each damaged file once
    (NAME.damaged, no NAME.damaged.2), and the resumed run (dropout on: every rank restores its own
    random streams) reaches the uninterrupted run's step-10 weights and Adam state on both ranks."""
    data = write_task(tmp_path / "data", n_train=36)
    run = tmp_path / "run"
    config = _config(data, run, 4, dropout=0.3, max_steps=10, valid_every=4)
    assert [r[2:4] for r in ranks.run(config)] == [("max_steps", 10)] * 2
    truth = load_checkpoint(run / "last.pt")
    assert truth["step"] == 10 and sorted(p.name for p in run.glob("step_*.pt")) == ["step_10.pt", "step_8.pt"]
    damaged = {"last.pt": _flip_a_weight_bit_in_place(run / "last.pt")}
    for name in ("step_10.pt", "best.pt"):  # the same save's: hard links of last.pt, or copies to damage too
        if os.path.samefile(run / name, run / "last.pt"):
            damaged[name] = damaged["last.pt"]
        elif checkpoint_step(run / name) == 10:
            damaged[name] = _flip_a_weight_bit_in_place(run / name)
    results = ranks.run(config, hooks=ResumeProbe(str(run)))
    assert [r[2:4] for r in results] == [("max_steps", 10)] * 2
    for rank, *_, probe in results:
        assert (probe["resume_path"], probe["step"]) == (str(run / "step_8.pt"), 8), rank
    writes = {rank: probe["writes"] for rank, *_, probe in results}
    assert writes[1] == [], writes[1][:5]
    renames = [entry[1:] for entry in writes[0] if entry[0] == "os.rename"]
    for name, content in damaged.items():  # each set aside once, by rank 0, bytes kept
        assert [src for src, dst in renames if dst.startswith(name + ".damaged")] == [name], (name, renames)
        assert (run / f"{name}.damaged").read_bytes() == content
    assert sorted(p.name for p in run.iterdir() if ".damaged" in p.name) == sorted(f"{n}.damaged" for n in damaged)
    (_, _, _, _, _, zero), (_, _, _, _, _, one) = results
    assert _equal(zero["final"], one["final"]) and _optimizer_equal(zero["optimizer"], one["optimizer"])
    assert _equal(zero["final"], truth["model"])  # exactly the uninterrupted run
    assert _optimizer_equal(zero["optimizer"], {k: dict(v) for k, v in truth["optimizer"]["state"].items()})
    resumed = load_checkpoint(run / "last.pt")
    assert resumed["step"] == 10 and _equal(resumed["model"], truth["model"])
    assert sorted(p.name for p in run.glob("step_*.pt")) == ["step_10.pt", "step_8.pt"]


@pytest.mark.slow
def test_two_processes_building_the_same_id_cache_at_once(tmp_path):
    """Two processes load the same training data with data.id_cache at once (as two nmt-train
    jobs on one node), both builds held until both temporaries are filled: one rename wins, the
    other finds its cache in place; one cache directory remains, no temporary, mode from the
    umask; both processes read the same arrays, those of an in-memory encoding of the files."""
    from nmt.data.dataset import ParallelDataset, read_parallel
    from nmt.data.id_arrays import CACHE_DIRNAME, cache_key
    from nmt.train.data_setup import streamed_fields
    from nmt.utils.io import current_umask

    data = write_task(tmp_path / "data", n_train=300)
    data_cfg = resolve_config(tiny_config(data, tmp_path / "run"), "t")["data"]
    data_cfg["id_cache"] = True
    data_cfg["src"]["max_length"] = 4  # some pairs skipped: the line numbers matter too
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    timeout = 60.0
    procs = [ctx.Process(target=build_id_cache, args=(r, data_cfg, str(tmp_path / "work"), barrier, results, timeout),
                         daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    got, deadline = [], time.monotonic() + timeout + 60
    try:
        while len(got) < 2:
            try:
                got.append(results.get(timeout=0.5))
                continue
            except queue_module.Empty:
                pass
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            assert not dead, f"process {dead[0][0]} exited with code {dead[0][1]}"
            assert time.monotonic() < deadline, "no result from the cache builders"
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    got.sort(key=lambda r: r[0])
    errors = [r for r in got if r[1] != "ok"]
    assert not errors, f"process {errors[0][0]} failed: {errors[0][2]}\n{errors[0][3]}"
    assert sorted(r[2] for r in got) == [["lost"], ["won"]]  # both built and renamed; one was first
    fields = streamed_fields(data_cfg)
    key = cache_key(data["train"]["src"], data["train"]["tgt"], *fields, 4, data_cfg["tgt"]["max_length"])
    for _, _, _, listing, *_ in got:  # while both were filled: two temporaries of the key, no cache yet
        assert len(listing) == 2 and all(n.startswith(f".{key}.p") and n.endswith(".tmp") for n in listing), listing
    cache_root = tmp_path / "data" / CACHE_DIRNAME
    assert sorted(os.listdir(cache_root)) == [key]  # one directory, no temporaries left
    directory = cache_root / key
    assert directory.stat().st_mode & 0o777 == 0o777 & ~current_umask()
    (_, _, _, _, arrays0, src0, tgt0), (_, _, _, _, arrays1, src1, tgt1) = got
    assert arrays0.keys() == arrays1.keys()
    for name in arrays0:
        assert np.array_equal(arrays0[name], arrays1[name]), name
        assert np.array_equal(arrays0[name], np.load(directory / f"{name}.npy")), name
    reference = ParallelDataset(read_parallel(data["train"]["src"], data["train"]["tgt"]), *fields, 4,
                                data_cfg["tgt"]["max_length"])
    assert reference.skipped["too_long"] > 0 and len(reference) > 100
    assert src0 == src1 == reference.src and tgt0 == tgt1 == reference.tgt
    assert arrays0["line_numbers"].tolist() == reference.line_numbers
