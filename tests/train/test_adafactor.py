"""Adafactor (nmt.train.adafactor) and the optimizers of training.optimizer.name.

Independent truths: torch.optim.Adafactor (for the settings it has: relative step capped by lr,
parameter scaling, no first moments, clip threshold 1), and the paper's algorithm written here in
float64 numpy with the row and column *sums* of its statement (R 1_m, 1_n^T C, V = R C / 1_n^T R)
for the settings torch lacks (first moments, a fixed step, no parameter scaling, clipping below 1,
another decay rate). The state of an n x m matrix is n + m numbers; a step reads nothing back to the
host (SyncAudit) and compiles into one graph; a state dict round trip continues bit-equal; the
trainer trains with it, resumes bit-equal and carries its state with init_optimizer; AdamW decays
decoupled from the gradient; SGD takes Nesterov momentum; the config errors name the key."""
from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest
import torch

from nmt.config import ConfigError, resolve_config
from nmt.train.adafactor import Adafactor
from nmt.train.optimizers import build_optimizer
from nmt.train.trainer import Trainer
from nmt.utils.sync_audit import SyncAudit
from tiny_task import assert_resumes_exactly, tiny_config, write_task

SHAPES = [(5,), (4, 6), (2, 3, 5), (1, 7)]
"""A vector (unfactored), matrices (factored over both dimensions) and a batch of matrices (the
leading dimension kept: factored over the last two)."""


def parameters(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in SHAPES]


def gradients(params: list[torch.Tensor], t: int) -> list[torch.Tensor]:
    """The gradient of a smooth loss that changes with ``t`` (rows and columns of different scales,
    so the factored estimate is not trivially uniform)."""
    out = []
    for i, p in enumerate(params):
        weights = torch.linspace(0.5, 3.0, p.numel(), device=p.device).view(p.shape) * (1 + 0.3 * math.sin(t + i))
        out.append(torch.cos(p.detach() * weights + t) * weights)
    return out


def run(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: int, start: int = 0) -> None:
    for t in range(start, start + steps):
        for p, g in zip(params, gradients(params, t)):
            p.grad = g
        optimizer.step()


def test_equals_torch_adafactor_where_torch_has_the_settings():
    ours, theirs = parameters(), parameters()
    run(Adafactor(ours, lr=0.01, weight_decay=0.1), ours, 25)
    run(torch.optim.Adafactor(theirs, lr=0.01, eps=(1e-30, 1e-3), weight_decay=0.1), theirs, 25)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(ours, parameters()))  # they moved


def paper_adafactor(x: np.ndarray, grads: list[np.ndarray], lrs: list[float], relative_step: bool,
                    scale_parameter: bool, beta1: float | None, decay_rate: float, clip_threshold: float,
                    eps1: float, eps2: float, weight_decay: float) -> np.ndarray:
    """Shazeer & Stern's algorithms 4 / 5 in float64, loops over the matrices of a batch, the
    factored statistics as sums: R_t = b R_{t-1} + (1 - b) (G^2 + eps1) 1_m, C_t = b C_{t-1} +
    (1 - b) 1_n^T (G^2 + eps1), V_t = R_t C_t / (1_n^T R_t)."""
    x = x.astype(np.float64).copy()
    matrices = x.reshape((-1,) + x.shape[-2:]) if x.ndim >= 2 else None
    if matrices is not None:
        rows = np.zeros(matrices.shape[:2])
        cols = np.zeros((matrices.shape[0], matrices.shape[2]))
    else:
        second = np.zeros_like(x)
    first = np.zeros_like(x)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        g = g.astype(np.float64)
        b2 = 1.0 - t ** decay_rate
        rho = min(lr, 1.0 / math.sqrt(t)) if relative_step else lr
        alpha = max(eps2, math.sqrt(np.mean(x ** 2))) * rho if scale_parameter else rho
        square = g ** 2 + eps1
        if matrices is not None:
            sq = square.reshape(rows.shape[0], rows.shape[1], cols.shape[1])
            gm = g.reshape(sq.shape)
            u = np.empty_like(gm)
            for k in range(sq.shape[0]):
                rows[k] = b2 * rows[k] + (1 - b2) * sq[k].sum(axis=1)
                cols[k] = b2 * cols[k] + (1 - b2) * sq[k].sum(axis=0)
                v = np.outer(rows[k], cols[k]) / rows[k].sum()
                u[k] = gm[k] / np.sqrt(v)
            u = u.reshape(x.shape)
        else:
            second = b2 * second + (1 - b2) * square
            u = g / np.sqrt(second)
        u = u / max(1.0, math.sqrt(np.mean(u ** 2)) / clip_threshold)
        if beta1 is not None:
            first = beta1 * first + (1 - beta1) * u
            u = first
        x = x * (1 - lr * weight_decay) - alpha * u
    return x


SETTINGS = [
    {"relative_step": False, "scale_parameter": False, "beta1": 0.9, "decay_rate": -0.8, "clip_threshold": 1.0},
    {"relative_step": True, "scale_parameter": True, "beta1": 0.5, "decay_rate": -0.5, "clip_threshold": 0.3},
    {"relative_step": False, "scale_parameter": True, "beta1": None, "decay_rate": -1.0, "clip_threshold": 2.0,
     "weight_decay": 0.05},
    {"relative_step": True, "scale_parameter": False, "beta1": None, "decay_rate": -0.8, "clip_threshold": 1.0,
     "eps2": 0.5},
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_equals_the_papers_algorithm_in_float64(settings):
    settings = {"eps1": 1e-30, "eps2": 1e-3, "weight_decay": 0.0, **settings}
    params = parameters(1)
    start = [p.detach().numpy().copy() for p in params]
    lrs = [0.05 * (1 + (t % 3)) for t in range(12)]  # a schedule that moves (set per update, as the trainer does)
    optimizer = Adafactor(params, lr=lrs[0], **settings)
    history = [[] for _ in params]
    for t, lr in enumerate(lrs):
        for group in optimizer.param_groups:
            group["lr"] = lr
        for i, (p, g) in enumerate(zip(params, gradients(params, t))):
            p.grad = g
            history[i].append(g.numpy().copy())
        optimizer.step()
    for p, x0, grads in zip(params, start, history):
        expected = paper_adafactor(x0, grads, lrs, **settings)
        np.testing.assert_allclose(p.detach().numpy(), expected, rtol=2e-5, atol=2e-6)
        assert not np.allclose(expected, x0)


def test_the_second_moments_of_a_matrix_are_its_rows_and_columns():
    params = parameters()
    optimizer = Adafactor(params)
    run(optimizer, params, 2)
    sizes = [sum(v.numel() for v in optimizer.state[p].values()) for p in params]
    # the step counter (1), then n + m per matrix (a batch of k: k (n + m)), the vector's own size
    assert sizes == [1 + 5, 1 + 4 + 6, 1 + 2 * (3 + 5), 1 + 1 + 7]
    with_first = Adafactor(params, beta1=0.9)
    run(with_first, params, 1)
    assert [sum(v.numel() for v in with_first.state[p].values()) for p in params] == [
        s + p.numel() for s, p in zip(sizes, params)]


@pytest.mark.parametrize("settings", SETTINGS[:2])
def test_a_step_reads_nothing_back_to_the_host(settings):
    params = parameters()
    optimizer = Adafactor(params, weight_decay=0.01, **settings)
    run(optimizer, params, 1)  # the state exists: the audited step is a steady one
    for p, g in zip(params, gradients(params, 1)):
        p.grad = g
    with SyncAudit() as audit:
        optimizer.step()
    assert audit.total == 0, audit.report()


def test_a_step_compiles_into_one_graph():
    params, eager = parameters(), parameters()
    compiled_opt, eager_opt = Adafactor(params, beta1=0.9, weight_decay=0.01), Adafactor(eager, beta1=0.9,
                                                                                           weight_decay=0.01)
    run(compiled_opt, params, 1)
    run(eager_opt, eager, 1)
    torch._dynamo.reset()
    step = torch.compile(compiled_opt.step, fullgraph=True, backend="eager")  # a graph break is an error
    for t in range(1, 4):
        for (p, g), (q, h) in zip(zip(params, gradients(params, t)), zip(eager, gradients(eager, t))):
            p.grad, q.grad = g, h
        step()
        eager_opt.step()
    for a, b in zip(params, eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_state_dict_round_trip_continues_bit_equal():
    straight = parameters()
    optimizer = Adafactor(straight, beta1=0.9, weight_decay=0.01)
    run(optimizer, straight, 8)
    resumed = parameters()
    first = Adafactor(resumed, beta1=0.9, weight_decay=0.01)
    run(first, resumed, 5)
    saved = copy.deepcopy(first.state_dict())
    second = Adafactor(resumed, beta1=0.9, weight_decay=0.01)
    second.load_state_dict(saved)
    run(second, resumed, 3, start=5)
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)


def test_a_state_saved_without_first_moments_takes_them_from_zero():
    """``beta1`` set where the saved state has none (``training.init_optimizer`` from a run without
    them): the first moments start at zero, as in a fresh optimizer with the loaded second moments."""
    params = parameters()
    plain = Adafactor(params)
    run(plain, params, 3)
    saved = copy.deepcopy(plain.state_dict())
    loaded_params, fresh_params = parameters(), parameters()
    for a, b, p in zip(loaded_params, fresh_params, params):
        a.data.copy_(p.detach())
        b.data.copy_(p.detach())
    loaded = Adafactor(loaded_params, beta1=0.9)
    loaded.load_state_dict(copy.deepcopy(saved))  # (loading keeps the given tensors: one copy each)
    for group in loaded.param_groups:  # as training.init_optimizer keeps the config's settings
        group["beta1"] = 0.9
    run(loaded, loaded_params, 2, start=3)
    assert all("first" in loaded.state[p] for p in loaded_params)
    reference = Adafactor(fresh_params, beta1=0.9)  # the same second moments, first moments from zero
    reference.load_state_dict(copy.deepcopy(saved))
    for group in reference.param_groups:
        group["beta1"] = 0.9
    for p in fresh_params:
        reference.state[p]["first"] = torch.zeros_like(p)
    run(reference, fresh_params, 2, start=3)
    for a, b in zip(loaded_params, fresh_params):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bad, match", [({"lr": 0.0}, "lr"), ({"beta1": 1.0}, "beta1"),
                                        ({"decay_rate": 0.0}, "decay_rate"), ({"clip_threshold": 0.0}, "clip"),
                                        ({"eps1": 0.0}, "eps1"), ({"weight_decay": -1.0}, "weight_decay")])
def test_bad_arguments_are_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        Adafactor(parameters(), **bad)


def test_adamw_decays_decoupled_and_sgd_takes_nesterov():
    base = {"lr": 0.1, "betas": [0.9, 0.999], "eps": 1e-8, "momentum": 0.9, "weight_decay": 0.5}
    start = torch.tensor([2.0, -1.0])
    for name in ("adam", "adamw"):
        p = torch.nn.Parameter(start.clone())
        optimizer = build_optimizer([p], {**base, "name": name})
        p.grad = torch.zeros(2)
        optimizer.step()
        if name == "adamw":  # zero gradient: the weights only shrink, by lr x weight_decay
            torch.testing.assert_close(p.detach(), start * (1 - 0.1 * 0.5))
        else:  # L2 enters Adam's moments: its first step is lr x sign(the decay's gradient)
            torch.testing.assert_close(p.detach(), start - 0.1 * torch.sign(start), rtol=1e-6, atol=1e-6)
    p = torch.nn.Parameter(torch.tensor([1.0]))
    sgd = build_optimizer([p], {**base, "name": "sgd", "weight_decay": 0.0, "nesterov": True})
    for _ in range(2):
        p.grad = torch.tensor([1.0])
        sgd.step()
    # Nesterov: buffer b1 = 1, step g + 0.9 b1 = 1.9; b2 = 0.9 + 1 = 1.9, step 1 + 0.9 x 1.9 = 2.71
    torch.testing.assert_close(p.detach(), torch.tensor([1.0 - 0.1 * (1.9 + 2.71)]))


@pytest.fixture
def task(tmp_path):
    return write_task(tmp_path / "task", n_train=40)


def make(data, save_dir, optimizer: dict, **training) -> Trainer:
    cfg = tiny_config(data, save_dir, device="cpu", optimizer=optimizer, **training)
    return Trainer(resolve_config(cfg, "c.yaml"), "c.yaml")


ADAFACTOR = {"name": "adafactor", "lr": 0.01, "adafactor": {"beta1": 0.9}}


@pytest.mark.parametrize("optimizer", [ADAFACTOR, {"name": "adamw", "weight_decay": 0.01}])
def test_a_killed_run_resumes_to_the_same_weights(task, tmp_path, optimizer):
    _, second = assert_resumes_exactly(lambda d: make(task, d, optimizer, max_steps=10), tmp_path)
    assert type(second.optimizer).__name__ == {"adafactor": "Adafactor", "adamw": "AdamW"}[optimizer["name"]]


def test_init_optimizer_carries_the_adafactor_state(task, tmp_path):
    parent = make(task, tmp_path / "parent", ADAFACTOR, max_steps=6)
    parent.train()
    child = make(task, tmp_path / "child", ADAFACTOR, max_steps=8, init_from=str(tmp_path / "parent"),
                 init_optimizer=True)
    for p, q in zip(parent.model.parameters(), child.model.parameters()):
        for key, value in parent.optimizer.state[p].items():
            assert torch.equal(child.optimizer.state[q][key], value), key
    assert child.train().step == 8
    with pytest.raises(ConfigError, match="training.optimizer.name: 'adam' in the config, 'adafactor'"):
        make(task, tmp_path / "child2", {"name": "adam"}, max_steps=8, init_from=str(tmp_path / "parent"),
             init_optimizer=True)


@pytest.mark.parametrize("optimizer, key", [
    ({"name": "sgd", "nesterov": True}, "training.optimizer.nesterov"),
    ({"name": "adafactor", "adafactor": {"decay_rate": 0.5}}, "training.optimizer.adafactor.decay_rate"),
    ({"name": "adafactor", "adafactor": {"beta": 0.9}}, "training.optimizer.adafactor.beta"),
    ({"name": "adagrad"}, "training.optimizer.name"),
    ({"name": "adam", "momentum": 0.9}, "training.optimizer.momentum: the adam optimizer does not read it (only sgd)"),
    ({"name": "adamw", "adafactor": {"beta1": 0.9}}, "training.optimizer.adafactor.beta1: the adamw optimizer"),
    ({"name": "adafactor", "betas": [0.9, 0.98]}, "training.optimizer.betas: the adafactor optimizer"),
])
def test_config_errors_name_the_key(task, tmp_path, optimizer, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        make(task, tmp_path / "run", optimizer, max_steps=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_equal_the_cpus_without_a_sync():
    cpu, gpu = parameters(), [torch.nn.Parameter(p.detach().cuda()) for p in parameters()]
    cpu_opt, gpu_opt = Adafactor(cpu, beta1=0.9, weight_decay=0.01), Adafactor(gpu, beta1=0.9, weight_decay=0.01)
    run(cpu_opt, cpu, 1)
    run(gpu_opt, gpu, 1)
    steps = []
    for t in range(1, 5):  # the CPU's gradients at each step, and their copies on the device
        for p, g in zip(cpu, gradients(cpu, t)):
            p.grad = g
        steps.append([g.cuda() for g in gradients(cpu, t)])
        cpu_opt.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for grads in steps:
            for q, h in zip(gpu, grads):
                q.grad = h
            gpu_opt.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for a, b in zip(cpu, gpu):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-5, atol=1e-6)


def test_a_step_on_the_meta_device_mixes_no_host_tensor():
    """The meta device stands in for CUDA (tests/models/test_device_stand_in.py): a host tensor of
    several entries in an operation with a device tensor raises there as on CUDA."""
    params = [torch.nn.Parameter(torch.empty(shape, device="meta")) for shape in SHAPES]
    optimizer = Adafactor(params, beta1=0.9, weight_decay=0.01)
    for _ in range(2):
        for p in params:
            p.grad = torch.empty_like(p)
        optimizer.step()
    assert all(v.device.type == "meta" for p in params for v in optimizer.state[p].values())
