"""Smoke runs of tools/bench_train.py (see test_bench_smoke.py): its rows, profiles, compiled rows
and guided rows run and report figures on the CPU; timing is never asserted."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_tools import load as _load  # noqa: E402


def test_bench_train_quick_with_profile(tmp_path, capsys):
    """``bench_train --quick --profile 1``: a row per setting with its speed, host syncs, CUDA-graph
    skips (0 off CUDA) and the profile's operator table, written to --json as well (one timed step
    of batches of 8 sentences on one thread: the figures' presence is checked, not their values)."""
    bench = _load("bench_train")
    out = tmp_path / "train.json"
    assert bench.main(["--quick", "--steps", "1", "--batch-size", "8", "--threads", "1",
                       "--only", "softmax / softmax", "entmax15 / entmax15", "--profile", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["steps"], report["batch_size"]) == (1, 8)
    results = report["results"]
    assert [r["setting"] for r in results] == ["softmax / softmax", "entmax15 / entmax15"]
    for row in results:
        assert row["tokens_per_sec"] > 0 and row["ms_per_step"] > 0 and row["cudagraph_skips"] == 0
        assert row["profile"]["calls_per_step"] > 0 and row["profile"]["top"]
        assert row["python"]["top"] and row["python"]["ms_per_step"] > 0  # cProfile's ranking
        phases = row["phases"]["ms_per_step"]  # every phase of update() reached, the rest what is left
        assert set(phases) == {"batch to device", "forward + loss", "backward", "clip", "optimizer step", "rest"}
        assert phases["forward + loss"] > 0 and phases["backward"] > 0
        assert sum(phases.values()) == pytest.approx(row["phases"]["total_ms_per_step"], rel=1e-6)
    printed = capsys.readouterr().out
    assert "profile: CPU operators (self time)" in printed and "python: own time per step" in printed
    assert "phases (synchronised at each boundary" in printed


def test_bench_train_repeats_run_in_rounds_over_the_rows(tmp_path, monkeypatch):
    """``--repeats 3`` runs every row once per round (softmax, 1.5-entmax, softmax, ...), so that a
    drift of the machine, or whatever the row before leaves behind, weighs on all rows alike;
    each row reports its median, ratios against the softmax row's median."""
    bench = _load("bench_train")
    calls, speeds = [], {("softmax",): iter([100.0, 300.0, 200.0]), ("entmax15",): iter([90.0, 50.0, 70.0])}

    def measure(config, attention, output, *args, **kwargs):
        calls.append(attention[0])
        speed = next(speeds[attention[0],])
        return {"tokens_per_sec": speed, "ms_per_step": 1000.0 / speed, "syncs_per_step": 0, "shapes": 1,
                "shape_warmup_seconds": 0.0, "first_step_seconds": 0.0, "cudagraph_skips": 0}

    monkeypatch.setattr(bench, "measure", measure)
    out = tmp_path / "train.json"
    assert bench.main(["--quick", "--repeats", "3", "--only", "softmax / softmax", "entmax15 / entmax15",
                       "--json", str(out)]) == 0
    assert calls == ["softmax", "entmax15"] * 3
    rows = json.loads(out.read_text())["results"]
    assert [(r["setting"], r["tokens_per_sec"]) for r in rows] == [("softmax / softmax", 200.0),
                                                                    ("entmax15 / entmax15", 70.0)]
    assert rows[1]["ratio_to_softmax"] == pytest.approx(0.35)


def test_phase_profile_runs_the_backward_on_the_calling_thread_when_asked():
    """The device thread's A/B: ``caller_backward`` turns autograd's multithreading off for the
    profiled steps (on CUDA the backward then runs on the calling thread) and back on after."""
    bench = _load("bench_train")
    seen = []

    def step(batch, timer):
        timer.run("backward", lambda: seen.append(torch._C._is_multithreading_enabled()))

    for caller in (False, True):
        phases = bench.phase_profile(torch.device("cpu"), step, [None, None], caller_backward=caller)
        assert set(phases["ms_per_step"]) == {"backward", "rest"}
    assert seen == [True, True, False, False] and torch._C._is_multithreading_enabled()


def test_profile_labels_triton_launches_with_the_kernels_signature():
    """``--profile`` on an eager CUDA row wraps ``nmt.sparse._triton._kernels`` to label each
    launch: the wrapper takes what the launch sites pass (the tensor that picks the flavour; an
    H200 run failed with "kernels() takes 0 positional arguments"), returns the same kernels
    wrapped, and restores the original. CPU rows never launch a Triton kernel, so the call is
    made here directly (building the jitted objects compiles nothing)."""
    pytest.importorskip("triton")
    import inspect

    from nmt.sparse import _triton

    bench = _load("bench_train")
    original = _triton._kernels
    with bench.labelled_triton_launches():
        wrapped = _triton._kernels
        assert wrapped is not original
        assert list(inspect.signature(wrapped).parameters) == list(inspect.signature(original).parameters)
        kernels = wrapped(torch.zeros(2, 3))
        for name in _triton.KERNEL_NAMES:
            assert getattr(kernels, name).kernel is getattr(original(torch.zeros(2, 3)), name)
    assert _triton._kernels is original


def test_bench_train_compiled_rows_compile_their_own_graphs():
    """Each compiled row starts from a dynamo reset: without it the second model ran the graphs
    compiled for the first wherever they agree (parameters are graph inputs, not guarded by the
    model's identity), and on CUDA the CUDA-graph trees tried the first model's recording at every
    step. Both rows compile the same graphs: one per piece between the LSTM encoder's graph breaks."""
    bench = _load("bench_train")
    config = bench.load_config(bench.CONFIG, ["training.save_dir=unused"])
    small = json.loads(json.dumps(config["model"]))
    small["embeddings"].update(src_size=8, tgt_size=8)
    small["encoder"].update(layers=1, hidden_size=8)
    small["decoder"].update(layers=1, hidden_size=8)
    batches, src_vocab, tgt_vocab = bench.synthetic_batches(200, batch_size=1, vocab=30)
    shape = min((b.src.shape, b.tgt_in.shape) for b in batches)  # short: a short decoder to trace
    batches = [b for b in batches if (b.src.shape, b.tgt_in.shape) == shape][:2]
    graphs = [bench.measure(config, (mapping, {}), (mapping, {}), batches, src_vocab, tgt_vocab, 1, compiled=True,
                            model_section=small, backend="aot_eager")["graphs_compiled"]
              for mapping in ("softmax", "entmax15")]
    assert graphs[0] == graphs[1] >= 5


def test_bench_train_ratios_are_to_each_models_own_softmax_row(monkeypatch, tmp_path):
    """A Transformer row's "vs softmax" is to the Transformer's softmax / softmax row, not the
    LSTM's (the first row of the run); a Transformer row asked for alone brings that row along."""
    bench = _load("bench_train")
    speeds = {"softmax": 100.0, "entmax15": 80.0}

    def measure(config, attention, output, batches, *args, **kwargs):
        transformer = args[7] is not None if len(args) > 7 else kwargs.get("model_section") is not None
        speed = speeds[attention[0]] * (0.5 if transformer else 1.0)
        return {"tokens_per_sec": speed, "ms_per_step": 1.0, "syncs_per_step": 0, "shapes": 1,
                "shape_warmup_seconds": 0.0, "first_step_seconds": 0.0, "cudagraph_skips": 0}

    monkeypatch.setattr(bench, "measure", measure)
    out = tmp_path / "train.json"
    assert bench.main(["--quick", "--transformer", "--only", "entmax15 / softmax", "transformer: entmax15 / softmax",
                       "--json", str(out)]) == 0
    ratios = {r["setting"]: r["ratio_to_softmax"] for r in json.loads(out.read_text())["results"]}
    assert ratios == {"softmax / softmax": 1.0, "entmax15 / softmax": 0.8,
                      "transformer: softmax / softmax": 1.0, "transformer: entmax15 / softmax": 0.8}


def test_bench_train_guided_rows_follow_their_plain_rows_with_the_cost_ratio(tmp_path, capsys):
    """``--guided-alignment 0.1``: each row followed by its guided row (a real step: the model returns
    its alignment scores, the diagonal reference of every batch goes with it), whose cost is the ratio
    to the plain row of the same setting; the reference is one diagonal source token per target
    token, from corner to corner."""
    bench = _load("bench_train")
    out = tmp_path / "train.json"
    assert bench.main(["--quick", "--steps", "1", "--batch-size", "8", "--threads", "1",
                       "--only", "softmax / softmax", "--guided-alignment", "0.1", "--json", str(out)]) == 0
    plain, guided = json.loads(out.read_text())["results"]
    assert (plain["setting"], guided["setting"]) == ("softmax / softmax", "softmax / softmax + guided")
    assert guided["ratio_to_plain"] == pytest.approx(guided["tokens_per_sec"] / plain["tokens_per_sec"])
    assert "ratio_to_plain" not in plain
    assert capsys.readouterr().out.count("guided alignment (weight 0.1): ") == 1
    batch = bench.synthetic_batches(1)[0][0]
    grid = bench.diagonal_reference(batch)
    m = batch.tgt_lengths - 1
    assert torch.equal(grid.sum(-1), (torch.arange(grid.size(1)) < m.view(-1, 1)).float())  # one source per token
    last = grid[torch.arange(len(m)), m - 1].argmax(-1)
    assert torch.equal(last, batch.src_lengths - 1) and bool((grid[:, 0, 0] == 1).all())  # corner to corner


def test_bench_train_full_context_guided_rows_build_the_full_context_model(tmp_path, monkeypatch):
    """``--transformer --guided-alignment W --full-context-alignment``: the Transformer's guided row
    trains a model that aligns from the pass without the future mask (and the plain row does not)."""
    bench = _load("bench_train")
    built = []
    real = bench.build_model

    def recording(cfg, *args, **kwargs):
        model = real(cfg, *args, **kwargs)
        built.append(getattr(model, "full_context_alignment", None))
        return model

    monkeypatch.setattr(bench, "build_model", recording)
    out = tmp_path / "train.json"
    assert bench.main(["--quick", "--steps", "1", "--batch-size", "8", "--threads", "1", "--transformer",
                       "--only", "transformer: softmax / softmax", "--guided-alignment", "0.1",
                       "--full-context-alignment", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["setting"] for r in rows][-2:] == ["transformer: softmax / softmax",
                                                 "transformer: softmax / softmax + guided"]
    assert built[-2:] == [False, True]
