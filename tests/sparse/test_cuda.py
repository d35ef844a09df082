"""Every mapping and loss on CUDA against the CPU, and real host syncs counted on the GPU.

Skipped without CUDA. The CPU result (the default ``impl``, itself checked against independent
truths in the other modules) is the reference; on the GPU both ``impl="auto"`` and
``impl="static"`` are checked: values, exact zeros at the same places (float64, where rounding
cannot move an entry across the threshold), gradients, half-precision inputs, masks, rows with
nothing kept, tensor and learnable alpha. ``torch.cuda.set_sync_debug_mode("error")`` turns any
host synchronisation into an error around the static path (forward and backward).
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from nmt.sparse import (
    cross_entropy_loss,
    entmax15,
    entmax15_loss,
    entmax_bisect,
    entmax_bisect_loss,
    softmax,
    sparsemax,
    sparsemax_loss,
)
from nmt.sparse.structured import fusedmax, oscarmax

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

F64 = torch.float64
IMPLS = ("auto", "static")


def _alpha_rows(x: torch.Tensor) -> torch.Tensor:
    """One alpha per row, (R, 1), in [1.2, 1.8] (deterministic)."""
    return torch.linspace(1.2, 1.8, x.shape[0], dtype=x.dtype, device=x.device)[:, None]


# name -> f(x, mask, impl); impl=None: the mapping has no impl choice (softmax)
MAPPINGS = {
    "softmax": lambda x, mask, impl: softmax(x, mask=mask),
    "sparsemax": lambda x, mask, impl: sparsemax(x, mask=mask, impl=impl),
    "entmax15": lambda x, mask, impl: entmax15(x, mask=mask, impl=impl),
    "bisect_float13": lambda x, mask, impl: entmax_bisect(x, 1.3, mask=mask, impl=impl),
    "bisect_float2": lambda x, mask, impl: entmax_bisect(x, 2.0, mask=mask, impl=impl),
    "bisect_tensor": lambda x, mask, impl: entmax_bisect(x, _alpha_rows(x), mask=mask, impl=impl),
    "fusedmax": lambda x, mask, impl: fusedmax(x, lam=0.2, mask=mask, impl=impl),
    "oscarmax": lambda x, mask, impl: oscarmax(x, lam=0.05, mask=mask, impl=impl),
}

LOSSES = {
    "cross_entropy": cross_entropy_loss,
    "sparsemax": sparsemax_loss,
    "entmax15": entmax15_loss,
    "bisect13": lambda *a, **k: entmax_bisect_loss(*a, alpha=1.3, **k),
}


def _inputs(n: int, dtype=torch.float32, seed: int = 0):
    """Scores (12, n), a mask keeping ~80% (row 2 keeps nothing, row 0 everything), a gradient."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(12, n, generator=g, dtype=F64) * 3).to(dtype)
    mask = torch.rand(12, n, generator=g) > 0.2
    mask[0] = True
    mask[2] = False
    grad = torch.randn(12, n, generator=g, dtype=F64).to(dtype)
    return x, mask, grad


def _run(fn, x, mask, grad, impl):
    """Forward + backward on ``x``'s device: (p, dL/dx) with L = <p, grad>, on the CPU."""
    x = x.clone().requires_grad_()
    p = fn(x, mask, impl)
    (p * grad).sum().backward()
    return p.detach().cpu(), x.grad.cpu()


@contextlib.contextmanager
def _no_host_sync():
    """Any host synchronisation inside raises (CUDA's own detector)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("n", [50, 3000])
@pytest.mark.parametrize("name", list(MAPPINGS))
def test_mapping_on_cuda_matches_cpu(name, n):
    fn = MAPPINGS[name]
    if name in ("fusedmax", "oscarmax") and n > 500:
        n = 300  # O(n^2) funnel scan per row on the static path: attention-sized rows
    for dtype, atol in ((F64, 1e-10), (torch.float32, 1e-5)):
        x, mask, grad = _inputs(n, dtype)
        p_ref, g_ref = _run(fn, x, mask, grad, "auto")
        for impl in IMPLS:
            p, g = _run(fn, x.cuda(), mask.cuda(), grad.cuda(), impl)
            assert p.dtype == dtype
            assert torch.allclose(p, p_ref, atol=atol), (impl, dtype, (p - p_ref).abs().max())
            assert torch.allclose(g, g_ref, atol=10 * atol), (impl, dtype, (g - g_ref).abs().max())
            assert not p[~mask].any() and not p[2].any() and not g[2].any()  # masked / nothing kept
            assert torch.allclose(p[[0, 1, 3]].sum(-1), torch.ones(3, dtype=dtype), atol=10 * atol)
            if dtype == F64:
                assert torch.equal(p == 0, p_ref == 0), impl  # exact zeros at the same places


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(MAPPINGS))
def test_mapping_half_precision_on_cuda(name, dtype):
    """Half inputs are computed in float32 on both devices and returned in the input dtype."""
    fn = MAPPINGS[name]
    x, mask, grad = _inputs(64, dtype, seed=1)
    p_ref, g_ref = _run(fn, x, mask, grad, "auto")
    for impl in IMPLS:
        p, g = _run(fn, x.cuda(), mask.cuda(), grad.cuda(), impl)
        assert p.dtype == dtype and g.dtype == dtype
        assert torch.allclose(p.float(), p_ref.float(), atol=1e-2)
        assert torch.allclose(g.float(), g_ref.float(), atol=5e-2)
        assert not p[~mask].any() and not p[2].any()


def test_learnable_alpha_on_cuda_matches_cpu():
    """A learnable per-row alpha: gradients reach it identically on both devices."""
    x, mask, grad = _inputs(40, F64, seed=2)
    results = []
    for device in ("cpu", "cuda"):
        for impl in (("auto",) if device == "cpu" else IMPLS):
            alpha = torch.linspace(1.1, 1.9, 12, dtype=F64, device=device)[:, None].requires_grad_()
            xs = x.detach().clone().to(device).requires_grad_()  # a fresh leaf on each device
            p = entmax_bisect(xs, alpha, mask=mask.to(device), impl=impl)
            (p * grad.to(device)).sum().backward()
            results.append((p.detach().cpu(), xs.grad.cpu(), alpha.grad.cpu()))
    ref = results[0]
    for other in results[1:]:
        for a, b in zip(ref, other):
            assert torch.allclose(a, b, atol=1e-8)


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
def test_tensor_alpha_loss_on_cuda_matches_cpu_and_never_syncs(dtype):
    """The alpha-entmax loss at one learned alpha per row: loss, score and alpha gradients equal
    on both devices, no host sync on CUDA (``"auto"`` and ``"static"``), masked scores included."""
    from nmt.sparse.tensor_alpha_loss import tensor_alpha_entmax_loss

    g = torch.Generator().manual_seed(5)
    x = torch.randn(12, 40, generator=g, dtype=F64) * 3
    x[3, 20:] = float("-inf")
    dist = torch.softmax(torch.randn(12, 40, generator=g, dtype=F64), -1)
    dist[3, 20:] = 0
    dist = dist / dist.sum(-1, keepdim=True)
    results = []
    for device, impl in (("cpu", "auto"), ("cuda", "auto"), ("cuda", "static")):
        alpha = torch.linspace(1.01, 2.0, 12, dtype=F64 if dtype == F64 else torch.float32,
                               device=device)[:, None].requires_grad_()
        xs = x.detach().clone().to(dtype).to(device).requires_grad_()  # a fresh leaf on each device
        target = dist.to(dtype).to(device)  # copied before the detector (a host-to-device copy syncs)
        with _no_host_sync() if device == "cuda" else contextlib.nullcontext():
            loss = tensor_alpha_entmax_loss(xs, target, alpha, impl=impl, reduction="sum")
            loss.backward()
        results.append((loss.detach().float().cpu(), xs.grad.float().cpu(), alpha.grad.float().cpu()))
    atol = 1e-8 if dtype == F64 else 1e-3
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(b, a, rtol=atol, atol=atol)


def _loss_cases(n: int, dtype=torch.float32):
    """(scores, target, kwargs) triples: index targets with ignored rows, label smoothing,
    a distribution target, a masked vocabulary (-inf scores)."""
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(16, n, generator=g, dtype=F64) * 3).to(dtype)
    x[5, n // 2:] = float("-inf")
    t = torch.randint(0, n // 2, (16,), generator=g)
    t[::4] = -100
    dist = torch.softmax(torch.randn(16, n, generator=g, dtype=F64), -1)
    dist[5, n // 2:] = 0  # no target mass on the -inf scores (else the loss is inf)
    dist = (dist / dist.sum(-1, keepdim=True)).to(dtype)
    return x, [(t, {}), (t, {"label_smoothing": 0.1}), (t, {"reduction": "none"}), (dist, {})]


@pytest.mark.parametrize("n", [50, 3000])
@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_on_cuda_matches_cpu(name, n):
    loss_fn = LOSSES[name]
    for dtype, atol in ((F64, 1e-9), (torch.float32, 1e-4)):
        x, cases = _loss_cases(n, dtype)
        for target, kw in cases:
            xr = x.clone().requires_grad_()
            ref = loss_fn(xr, target, **kw)
            ref.sum().backward()
            for impl in IMPLS:
                xc = x.cuda().requires_grad_()
                loss = loss_fn(xc, target.cuda(), impl=impl, **kw)
                loss.sum().backward()
                assert loss.dtype == dtype
                assert torch.allclose(loss.detach().cpu(), ref.detach(), atol=atol, rtol=1e-5), (impl, kw)
                assert torch.allclose(xc.grad.cpu(), xr.grad, atol=atol), (impl, kw)
                assert not xc.grad[5, n // 2:].any()  # -inf scores: p = 0 and y = 0 there


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_half_precision_on_cuda(name, dtype):
    loss_fn = LOSSES[name]
    x, cases = _loss_cases(256, dtype)
    for target, kw in cases[:2]:
        xr = x.clone().requires_grad_()
        ref = loss_fn(xr, target, **kw)
        ref.backward()
        for impl in IMPLS:
            xc = x.cuda().requires_grad_()
            loss = loss_fn(xc, target.cuda(), impl=impl, **kw)
            loss.backward()
            assert loss.dtype == dtype and xc.grad.dtype == dtype
            assert torch.allclose(loss.float().cpu(), ref.float(), rtol=1e-2, atol=1e-2)
            assert torch.allclose(xc.grad.float().cpu(), xr.grad.float(), atol=1e-2)


@pytest.mark.parametrize("n", [50, 3000])
@pytest.mark.parametrize("impl", IMPLS)
def test_static_path_never_synchronises_on_cuda(n, impl):
    """Every mapping (forward + backward) and every loss with impl="static" and with impl="auto"
    (the Triton kernels where installed): zero host syncs."""
    x, mask, grad = _inputs(n, torch.float32)
    x, mask, grad = x.cuda(), mask.cuda(), grad.cuda()
    for name, fn in MAPPINGS.items():
        if name in ("fusedmax", "oscarmax") and (n > 500 or impl != "static"):
            continue  # their "auto" on CUDA is the static path already
        _run(fn, x, mask, grad, impl)  # warm-up: lazy initialisation may synchronise once
        xs = x.clone().requires_grad_()
        with _no_host_sync():
            (fn(xs, mask, impl) * grad).sum().backward()
    alpha = torch.full((12, 1), 1.4, device="cuda", requires_grad=True)  # learnable alpha
    with _no_host_sync():
        (entmax_bisect(x.clone().requires_grad_(), alpha, mask=mask, impl=impl) * grad).sum().backward()
    scores, cases = _loss_cases(n)
    scores = scores.cuda()
    for name, loss_fn in LOSSES.items():
        for target, kw in cases:
            target = target.cuda()
            loss_fn(scores.clone().requires_grad_(), target, impl=impl, **kw).sum().backward()  # warm-up
            xs = scores.clone().requires_grad_()
            with _no_host_sync():
                loss_fn(xs, target, impl=impl, **kw).sum().backward()
