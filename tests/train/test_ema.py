"""``training.ema``: the moving average of the weights against the closed form of the recorded
parameter trajectory (float64), skipped updates, validation and checkpoints on the average,
resume equality, two processes (Gloo), compile.

The independent truth throughout: ``ema_k = d^k theta_0 + sum_{i=1..k} (1 - d) d^(k-i) theta_i``
(and its generalisation with start_step / every / warmup, a product of decays) evaluated in
float64 from the parameters recorded after every applied update; for skips, a run whose data
order lacks the skipped batches; for resume and compile, the uninterrupted / eager run.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import sys
from pathlib import Path

import pytest
import torch

from nmt.config import ConfigError, resolve_config
from nmt.train.checkpoint import load_checkpoint
from nmt.train.ema import WeightAverage
from nmt.train.model_release import average_checkpoints, released
from nmt.train.trainer import Trainer
from nmt.train.validation import teacher_forced_statistics
from nmt.translate.loading import load_model

sys.path.insert(0, str(Path(__file__).parent))
from test_fp16_overflow import NO_DROPOUT, fp32_arithmetic, leave_out  # noqa: E402
from tiny_task import assert_same_run, interrupt_at, tiny_config, write_task  # noqa: E402

FIXED_LR = {"min_lr": 1e-3}  # the plateau schedule never decays: validating another model changes no lr


def make_trainer(data, save_dir, ema: dict | None, no_dropout: bool = False, **training) -> Trainer:
    config = tiny_config(data, save_dir, device="cpu", **training)
    if ema is not None:
        config["training"]["ema"] = ema
    if no_dropout:
        for section, values in NO_DROPOUT.items():
            config["model"][section] = values
    return Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")


def parameters64(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().to(torch.float64, copy=True) for p in module.parameters()]


def train_recording(trainer: Trainer, step_hook=None) -> list[list[torch.Tensor]]:
    """Train; the parameters before the first update and after every applied one (float64)."""
    trajectory = [parameters64(trainer.model)]

    def hook(step):
        assert step == trainer.progress.step
        trajectory.append(parameters64(trainer.model))
        if step_hook is not None:
            step_hook(step)

    trainer.train(step_hook=hook)
    return trajectory


def plain_closed_form(trajectory: list[list[torch.Tensor]], d: float) -> list[torch.Tensor]:
    """d^k theta_0 + sum_{i=1..k} (1 - d) d^(k-i) theta_i."""
    k = len(trajectory) - 1
    return [d ** k * trajectory[0][j] + sum((1 - d) * d ** (k - i) * trajectory[i][j] for i in range(1, k + 1))
            for j in range(len(trajectory[0]))]


def closed_form(trajectory: list[list[torch.Tensor]], d: float, start_step: int = 0, every: int = 1,
                warmup: bool = False) -> list[torch.Tensor]:
    """The average after the last update of ``trajectory`` in general: the parameters at
    s = min(start_step, k) weighted by the product of all decays, those at each averaging step
    t_j (t > s, t % every == 0) by (1 - d_j) times the product of the later decays."""
    k = len(trajectory) - 1
    s = min(start_step, k)
    steps = [t for t in range(s + 1, k + 1) if t % every == 0]
    decays = [min(d, (1 + n) / (10 + n)) if warmup else d for n in range(len(steps))]
    out = []
    for j in range(len(trajectory[0])):
        value = math.prod(decays) * trajectory[s][j]
        for m, t in enumerate(steps):
            value = value + (1 - decays[m]) * math.prod(decays[m + 1:]) * trajectory[t][j]
        out.append(value)
    return out


def assert_average(average: list[torch.Tensor], reference: list[torch.Tensor], atol: float = 2e-6) -> None:
    assert len(average) == len(reference)
    for a, r in zip(average, reference):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), r, rtol=0, atol=atol)


# ---------------------------------------------------------------- the average itself
class _Mixed(torch.nn.Module):
    """A float32 and a float16 parameter, one buffer."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(7, 3))
        self.h = torch.nn.Parameter(torch.randn(5).half())
        self.register_buffer("counts", torch.arange(4))


@pytest.mark.parametrize("options", [{}, {"start_step": 3}, {"every": 3}, {"warmup": True},
                                     {"start_step": 2, "every": 2, "warmup": True}])
def test_average_equals_the_closed_form_of_a_random_trajectory(options):
    """Random parameter trajectories (a float16 parameter included: its average is float32, far
    finer than float16's 1e-3 steps); the average after each update equals the float64 closed form."""
    torch.manual_seed(0)
    model = _Mixed()
    ema = WeightAverage(model, 0.8, **options)
    assert [a.dtype for a in ema.average] == [torch.float32, torch.float32]
    trajectory = [parameters64(model)]
    for step in range(1, 13):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p, dtype=torch.float32).to(p.dtype))
        trajectory.append(parameters64(model))
        ema.update(step)
        assert_average(ema.average, closed_form(trajectory, 0.8, **options))
        if not options:
            assert_average(ema.average, plain_closed_form(trajectory, 0.8))
    assert ema.averaged_updates == len([t for t in range(options.get("start_step", 0) + 1, 13)
                                        if t % options.get("every", 1) == 0])


def test_swapped_holds_the_average_and_restores_the_weights_bit_for_bit():
    torch.manual_seed(1)
    model = _Mixed()
    ema = WeightAverage(model, 0.5)
    with torch.no_grad():
        model.a.add_(1.0 / 3.0)
        model.h.mul_(1.7)
    ema.update(1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pointers = [p.data_ptr() for p in model.parameters()]
    with ema.swapped():
        assert torch.equal(model.a, ema.average[0]) and torch.equal(model.h, ema.average[1].half())
        assert [p.data_ptr() for p in model.parameters()] == pointers  # in place: the same tensors
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(RuntimeError, match="boom"), ema.swapped():
        raise RuntimeError("boom")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    state = ema.model_state(model)
    assert torch.equal(state["a"], ema.average[0]) and state["h"].dtype == torch.float16
    assert torch.equal(state["counts"], model.counts)  # buffers: the model's own


def test_tied_weights_are_one_average_and_every_name_of_them_holds_it():
    model = torch.nn.Module()
    model.emb = torch.nn.Embedding(4, 3)
    model.out = torch.nn.Linear(3, 4, bias=False)
    model.out.weight = model.emb.weight
    ema = WeightAverage(model, 0.5)
    assert ema.names == ["emb.weight"]
    with torch.no_grad():
        model.emb.weight.add_(2.0)
    ema.update(1)
    state = ema.model_state(model)
    assert state["emb.weight"] is state["out.weight"] and torch.equal(state["out.weight"], ema.average[0])


@pytest.mark.parametrize("key, value, expected", [
    ("decay", 1.0, "training.ema.decay: must be in [0, 1), got 1.0"),
    ("decay", -0.1, "training.ema.decay: must be in [0, 1)"),
    ("every", 0, "training.ema.every: must be >= 1"),
    ("start_step", -1, "training.ema.start_step: must be >= 0"),
    ("decy", 0.9, "training.ema.decy: unknown key 'decy' (did you mean 'decay'?)"),
])
def test_bad_ema_settings_are_one_line_errors(tiny_task, tmp_path, key, value, expected):
    config = tiny_config(tiny_task, tmp_path / "run", ema={key: value})
    with pytest.raises(ConfigError) as error:
        resolve_config(config, "tiny.yaml")
    assert expected in str(error.value) and "\n" not in str(error.value) and "tiny.yaml" in str(error.value)


# ---------------------------------------------------------------- in training
def test_training_average_equals_the_closed_form_and_validation_checkpoints_use_it(tiny_task, tmp_path):
    """A tiny run with decay 0.7 (dropout on): the average equals the closed form of the recorded
    trajectory; training itself is that of a run without the average (validation swapped the
    weights back bit for bit); each validation loss is the loss of a model holding the closed-form
    average of its step; best.pt's model is the average (raw_model: the trained weights), and what
    nmt-translate, nmt-release and nmt-average read from it too."""
    trainer = make_trainer(tiny_task, tmp_path / "ema", {"decay": 0.7}, lr_schedule=FIXED_LR)
    trajectory = train_recording(trainer)
    assert len(trajectory) == 13
    reference = plain_closed_form(trajectory, 0.7)
    assert_average(trainer.ema.average, reference)
    assert max((a.double() - t).abs().max() for a, t in zip(trainer.ema.average, trajectory[-1])) > 1e-3

    plain = make_trainer(tiny_task, tmp_path / "plain", None, lr_schedule=FIXED_LR)
    plain.train()
    for (name, a), (_, b) in zip(trainer.model.state_dict().items(), plain.model.state_dict().items()):
        assert torch.equal(a, b), name

    records = [json.loads(line) for line in (tmp_path / "ema" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8, 12]
    held = copy.deepcopy(trainer.model).eval()
    for record in records:
        with torch.no_grad():
            for p, value in zip(held.parameters(), plain_closed_form(trajectory[:record["step"] + 1], 0.7)):
                p.copy_(value)
        stats = teacher_forced_statistics(held, trainer.data.valid, trainer.loss_fn, 4, trainer.device, False)
        assert record["valid_loss"] == pytest.approx(stats["loss"], rel=1e-5), record["step"]

    best_step = min(records, key=lambda r: r["valid_loss"])["step"]
    best = load_checkpoint(tmp_path / "ema" / "best.pt")
    assert best["step"] == best_step and best["weights"] == "ema"
    names = [n for n, _ in trainer.model.named_parameters()]
    for name, value, raw in zip(names, plain_closed_form(trajectory[:best_step + 1], 0.7), trajectory[best_step]):
        torch.testing.assert_close(best["model"][name].double(), value, rtol=0, atol=2e-6)
        assert torch.equal(best["raw_model"][name], raw.float()), name
    loaded = load_model(tmp_path / "ema" / "best.pt").model  # nmt-translate
    for name, p in loaded.named_parameters():
        assert torch.equal(p, best["model"][name]), name
    for payload in (released(best, "best.pt"), average_checkpoints([tmp_path / "ema" / "best.pt"])):
        assert payload["weights"] == "ema" and "raw_model" not in payload
        assert all(torch.equal(payload["model"][k], best["model"][k]) for k in best["model"])
    assert "weights" not in average_checkpoints([tmp_path / "ema" / "best.pt", tmp_path / "plain" / "best.pt"])
    last = load_checkpoint(tmp_path / "ema" / "last.pt")
    assert last["ema"]["averaged_updates"] == 12 and last["ema"]["decay"] == 0.7
    assert all(torch.equal(last["raw_model"][k], v) for k, v in trainer.model.state_dict().items())


def test_start_step_every_and_warmup_in_training(tiny_task, tmp_path):
    options = {"decay": 0.9, "start_step": 3, "every": 2, "warmup": True}
    trainer = make_trainer(tiny_task, tmp_path / "run", options)
    trajectory = train_recording(trainer)
    assert_average(trainer.ema.average, closed_form(trajectory, 0.9, 3, 2, True))
    assert trainer.ema.averaged_updates == len([4, 6, 8, 10, 12])


def _nonfinite_at(trainer: Trainer, bad: set) -> None:
    """A NaN training loss on the batches at the data positions ``bad`` (epoch, batch_in_epoch)."""
    loss_fn = trainer.loss_fn

    def loss(*args, **kwargs):
        value = loss_fn(*args, **kwargs)
        at = (trainer.progress.epoch, trainer.progress.batch_in_epoch)
        return value * math.nan if trainer.model.training and at in bad else value

    trainer.loss_fn = loss


@pytest.mark.parametrize("reason", ["overflow", "nonfinite"])
def test_skipped_updates_do_not_advance_the_average(tmp_path, monkeypatch, reason):
    """3 updates dropped (fp16 gradient overflows, or NaN losses with nonfinite: skip): the average
    equals that of a run whose data order lacks those batches, bit for bit, and the closed form of
    the applied updates' trajectory."""
    data = write_task(tmp_path / "data")
    bad = {(0, 1), (0, 2), (1, 4)}  # 5 batches per epoch
    settings = ({"precision": "fp16"} if reason == "overflow" else {"nonfinite": "skip"})
    hit = make_trainer(data, tmp_path / "hit", {"decay": 0.6}, no_dropout=True, **settings)
    if reason == "overflow":
        fp32_arithmetic(hit)
        next(hit.model.parameters()).register_hook(
            lambda g: g * math.inf if (hit.progress.epoch, hit.progress.batch_in_epoch) in bad else g)
    else:
        _nonfinite_at(hit, bad)
    trajectory = train_recording(hit)
    dropped = hit.overflows.total if reason == "overflow" else hit.skipped_updates
    assert dropped == 3 and hit.progress.step == 12 and hit.ema.averaged_updates == 12
    assert_average(hit.ema.average, plain_closed_form(trajectory, 0.6))
    reference = make_trainer(data, tmp_path / "reference", {"decay": 0.6}, no_dropout=True, **settings)
    if reason == "overflow":
        fp32_arithmetic(reference)
    leave_out(monkeypatch, bad)
    reference.train()
    for a, b in zip(hit.ema.average, reference.ema.average):
        assert torch.equal(a, b)


def test_interrupted_and_resumed_equals_uninterrupted(tiny_task, tmp_path):
    """SIGINT at step 7 (between validations, mid-epoch), resumed: trained weights, the average,
    its count and the validation records equal those of an uninterrupted run, bit for bit."""
    ema = {"decay": 0.8, "warmup": True}
    straight = make_trainer(tiny_task, tmp_path / "straight", ema)
    straight.train()

    first = make_trainer(tiny_task, tmp_path / "resumed", ema)
    assert first.train(step_hook=interrupt_at(7)).step == 7
    second = make_trainer(tiny_task, tmp_path / "resumed", ema)
    assert second.progress.step == 7 and second.ema.averaged_updates == 7
    assert second.train().step == 12
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")
    for a, b in zip(straight.ema.average, second.ema.average):
        assert torch.equal(a, b)
    assert straight.ema.averaged_updates == second.ema.averaged_updates == 12


def test_switching_the_average_on_and_off_at_a_resume(tiny_task, tmp_path, caplog, monkeypatch):
    """A run without an average resumed with one: a warning, the average starts from the weights of
    the resumed step (the closed form from there). A run with one resumed with decay 0: a warning,
    training goes on from the trained weights (raw_model), and the checkpoints hold those."""
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # off after a CLI test's setup_logging
    monkeypatch.setattr(logging.getLogger("nmt"), "handlers", [])  # theirs may hold a closed stream
    make_trainer(tiny_task, tmp_path / "on", None, max_steps=4).train()
    with caplog.at_level(logging.WARNING, logger="nmt.train.trainer"):
        resumed = make_trainer(tiny_task, tmp_path / "on", {"decay": 0.5}, max_steps=8)
    assert "holds no moving average of the weights: training.ema starts it from the weights of step 4" in caplog.text
    trajectory = train_recording(resumed)
    assert len(trajectory) == 5
    assert_average(resumed.ema.average, plain_closed_form(trajectory, 0.5))

    make_trainer(tiny_task, tmp_path / "off", {"decay": 0.5}, max_steps=4).train()
    saved = load_checkpoint(tmp_path / "off" / "last.pt")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nmt.train.trainer"):
        resumed = make_trainer(tiny_task, tmp_path / "off", {"decay": 0.0}, max_steps=8)
    assert "holds a moving average of the weights, training.ema.decay is 0 now" in caplog.text
    assert resumed.ema is None
    assert all(torch.equal(v, saved["raw_model"][k]) for k, v in resumed.model.state_dict().items())
    resumed.train()
    last = load_checkpoint(tmp_path / "off" / "last.pt")
    assert {"weights", "raw_model", "ema"}.isdisjoint(last)
    assert all(torch.equal(v, last["model"][k]) for k, v in resumed.model.state_dict().items())


def test_compiled_training_with_the_average_equals_eager(tmp_path, monkeypatch):
    """``training.compile: true`` (backend aot_eager, as the compile tests: inductor's C++ code
    generation takes minutes on a loaded 2-core machine) with the average: the average, the trained
    weights and the validation losses (compiled statistics on the swapped-in average) equal the
    eager run's (float32: rtol 1e-5, atol 2e-6, the DDP tests' tolerance); and validating the
    swapped-in average compiles no graph that the same compiled run without the average does not
    (dynamo's unique_graphs, each run after a reset; four validations: the swap's in-place copies
    bump the parameters' versions, on which a traced frozen_cached lookup once guarded, recompiling
    at every validation from the third on). Every run pads its batches to length 8
    (``training.pad_to_multiple``; no word is longer): one compiled shape, so later validations replay
    the graph traced at the first on another average, and no batch's new length recompiles (that took
    40% of this test's time; the compile tests cover new shapes)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import nmt.train.trainer as trainer_module

    data = write_task(tmp_path / "data", n_train=24, n_valid=4)
    eager = make_trainer(data, tmp_path / "eager", {"decay": 0.7}, no_dropout=True, max_steps=8, valid_every=2,
                         pad_to_multiple=8)
    eager.train()
    real_loss, real_any = trainer_module.compile_loss_forward, trainer_module.compile_for_device
    monkeypatch.setattr(trainer_module, "compile_loss_forward",
                        lambda device, **kw: real_loss(device, backend="aot_eager", **kw))
    monkeypatch.setattr(trainer_module, "compile_for_device",
                        lambda fn, device, **kw: real_any(fn, device, backend="aot_eager", **kw))
    graphs = {}
    for name, ema in (("plain", None), ("compiled", {"decay": 0.7})):
        torch._dynamo.reset()
        before = int(counters["stats"]["unique_graphs"])
        trainer = make_trainer(data, tmp_path / name, ema, no_dropout=True, max_steps=8, valid_every=2, compile=True,
                               pad_to_multiple=8)
        assert trainer.loss_forward is not eager.loss_forward
        trainer.train()
        graphs[name] = int(counters["stats"]["unique_graphs"]) - before
    torch._dynamo.reset()
    compiled = trainer
    assert graphs["plain"] > 0 and graphs["compiled"] == graphs["plain"], graphs
    for a, b in zip(compiled.ema.average, eager.ema.average):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-6)
    for a, b in zip(compiled.model.parameters(), eager.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-6)
    read = lambda d: [json.loads(line)["valid_loss"] for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
    assert len(read("compiled")) == 4 and read("compiled") == pytest.approx(read("eager"), rel=1e-5)


def test_fine_tuning_from_a_run_with_the_average_starts_from_the_average(tiny_task, tmp_path):
    """training.init_from reads a checkpoint's model: with training.ema that is the average (best.pt's
    and last.pt's alike), not the trained weights."""
    parent = make_trainer(tiny_task, tmp_path / "parent", {"decay": 0.7}, max_steps=4)
    parent.train()
    last = load_checkpoint(tmp_path / "parent" / "last.pt")
    child = make_trainer(tiny_task, tmp_path / "child", None, max_steps=4, init_from=str(tmp_path / "parent" / "last.pt"))
    averaged = dict(zip(parent.ema.names, parent.ema.average))
    for name, p in child.model.named_parameters():
        assert torch.equal(p, averaged[name]) and torch.equal(p, last["model"][name]), name
    assert any(not torch.equal(last["raw_model"][n], a) for n, a in averaged.items())
    child.lock.release()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_average_equals_eager_and_the_swap_records_no_graph(tmp_path, count_calls):
    """On CUDA ``training.compile: true`` is mode reduce-overhead (CUDA graphs, the trainer's
    validation statistics too). With the average: (1) it equals the float64 closed form of the
    compiled run's own recorded trajectory, and the eager CUDA run's average within float32
    rounding of 8 steps apart (inductor's kernels are not eager's); (2) validating the swapped-in
    average records no CUDA graph and compiles no dynamo graph that the same compiled run without
    the average does not: the swap copies into the parameter tensors, so the graphs' static
    inputs keep their addresses (a swap that replaced them would re-record every graph it runs).
    Counted as the CUDA-graph tree manager's recordings (CUDAGraphTreeManager.record_function, one
    per capture, first ones and re-recordings alike) and dynamo's unique_graphs, each run after a
    dynamo reset; both runs see the same batches, so the counts match unless the swap adds some."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees

    from nmt.train.compile import compiler_problem

    problem = compiler_problem("cuda")
    if problem is not None:
        pytest.skip(problem)
    data = write_task(tmp_path / "data", n_train=24, n_valid=4)

    def cuda_trainer(name: str, decay: float, compile: bool) -> Trainer:
        config = tiny_config(data, tmp_path / name, device="cuda", max_steps=8, valid_every=2, compile=compile,
                             pad_to_multiple=4, lr_schedule=FIXED_LR)
        config["training"]["ema"] = {"decay": decay}
        for section, values in NO_DROPOUT.items():
            config["model"][section] = values
        return Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")

    recordings = count_calls(cudagraph_trees.CUDAGraphTreeManager, "record_function")
    counts = {}
    for name, decay in (("plain", 0.0), ("ema", 0.7)):
        torch._dynamo.reset()
        before, graphs = len(recordings), int(counters["stats"]["unique_graphs"])
        trainer = cuda_trainer(name, decay, compile=True)
        assert trainer.device.type == "cuda" and trainer.loss_forward is not trainer_loss_forward()
        trajectory = train_recording(trainer)
        torch.cuda.synchronize()
        counts[name] = (len(recordings) - before, int(counters["stats"]["unique_graphs"]) - graphs)
        if name == "ema":
            compiled, compiled_trajectory = trainer, trajectory
    assert counts["plain"][0] > 0, "no CUDA graph was recorded: the compiled step did not use CUDA graphs"
    assert counts["ema"] == counts["plain"], counts  # (recordings, dynamo graphs): the swap added none
    assert len(compiled_trajectory) == 9
    reference = plain_closed_form([[p.cpu() for p in ps] for ps in compiled_trajectory], 0.7)
    assert_average([a.cpu() for a in compiled.ema.average], reference)
    torch._dynamo.reset()
    eager = cuda_trainer("eager", 0.7, compile=False)
    eager.train()
    for a, b in zip(compiled.ema.average, eager.ema.average):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    read = lambda d: [json.loads(line)["valid_loss"] for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
    assert len(read("ema")) == 4 and read("ema") == pytest.approx(read("eager"), rel=1e-4)
    assert read("ema") != read("plain")  # validation ran on the average, not on the trained weights


def trainer_loss_forward():
    """The eager ``loss_forward`` (a compiled trainer's is another function)."""
    from nmt.train.update import loss_forward

    return loss_forward
