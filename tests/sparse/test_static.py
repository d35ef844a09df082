"""The static (sync-free, fixed-shape) threshold path against the pruned path, closed forms and the
reference package; zero host synchronisations; torch.compile(fullgraph=True); the impl dispatch."""
import types

import pytest
import torch

from nmt.sparse import EntmaxBisect, entmax15, entmax_bisect, softmax, sparsemax
from nmt.sparse import _dispatch
from nmt.sparse._static import exact_threshold
from nmt.sparse._threshold import sort_threshold
from nmt.sparse.entmax import entmax15_threshold, entmax_threshold
from nmt.sparse.sparsemax import sparsemax_threshold
from nmt.utils.sync_audit import SyncAudit

F64 = torch.float64


def _rows(n: int, dtype=F64) -> torch.Tensor:
    """Random, tied, shifted, masked (-inf), all-masked, flat, near-uniform and peaked rows."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(10, n, generator=g, dtype=dtype) * 2
    x[0] = 0.0  # all tied
    x[1, : max(1, n // 2)] = 1.0  # half tied at the top
    x[2] += 1e3  # a large common offset
    x[3, ::3] = float("-inf")
    x[3, min(1, n - 1)] = 0.5
    x[4] = float("-inf")  # all masked
    x[5] *= 1e-3  # near-uniform
    x[6] *= 50.0  # peaked
    x[7] = torch.randint(-2, 3, (n,), generator=g).to(dtype)  # few distinct values
    return x


MAPS = {
    "sparsemax": lambda x, impl, **k: sparsemax(x, impl=impl, **k),
    "entmax15": lambda x, impl, **k: entmax15(x, impl=impl, **k),
    "bisect1.5": lambda x, impl, **k: entmax_bisect(x, 1.5, impl=impl, **k),
    "bisect2": lambda x, impl, **k: entmax_bisect(x, 2.0, impl=impl, **k),
    "bisect1.3": lambda x, impl, **k: entmax_bisect(x, 1.3, impl=impl, **k),
    "bisect2.5": lambda x, impl, **k: entmax_bisect(x, 2.5, impl=impl, **k),
}


@pytest.mark.parametrize("n", [1, 2, 7, 33, 300, 5000])
@pytest.mark.parametrize("q", [1.0, 2.0])
def test_static_threshold_equals_sort_closed_form(n, q):
    scale = 1.0 if q == 1 else 0.5
    x = _rows(n)
    fn = sparsemax_threshold if q == 1 else entmax15_threshold
    want = sort_threshold(x * scale, q)
    for impl in ("static", "pruned"):
        got = fn(x, impl=impl)
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        fin = torch.isfinite(want)
        assert torch.allclose(got[fin], want[fin], rtol=1e-14, atol=1e-12)


@pytest.mark.parametrize("n", [5, 40, 2000])
def test_exact_threshold_verifies_every_tested_row(n):
    """The fixed verified-Newton steps end verified (exact closed form) on every non-empty row."""
    x = _rows(n)[[0, 1, 2, 3, 5, 6, 7, 8, 9]]
    for q, scale in ((1.0, 1.0), (2.0, 0.5)):
        z = (x - x.amax(-1, keepdim=True)) * scale
        tau, ok = exact_threshold(z, q)
        assert ok.all()
        assert torch.allclose(tau, sort_threshold(z, q), rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", list(MAPS))
@pytest.mark.parametrize("n", [3, 50, 700])
def test_static_equals_pruned_and_reference(name, n, ref):
    x = _rows(n)
    p_static, p_pruned = MAPS[name](x, "static"), MAPS[name](x, "pruned")
    assert torch.allclose(p_static, p_pruned, rtol=0, atol=1e-12)
    assert torch.all(p_static[4] == 0) and torch.all(p_static[3, ::3] == 0)
    kept = torch.isfinite(x).any(-1)  # the package returns NaN on empty rows
    alpha = {"sparsemax": 2.0, "entmax15": 1.5}.get(name) or float(name[6:])
    want = ref.entmax_bisect(x[kept], alpha, dim=-1, n_iter=200) if alpha not in (1.5, 2.0) else (
        ref.sparsemax(x[kept], dim=-1) if alpha == 2 else ref.entmax15(x[kept], dim=-1))
    assert torch.allclose(p_static[kept], want, rtol=0, atol=1e-10)


def test_static_mask_and_dims():
    x = torch.randn(2, 5, 9, dtype=F64)
    mask = torch.rand(2, 5, 9) > 0.3
    mask[:, :, 0] = True
    mask[1, 2] = False
    for name, f in MAPS.items():
        p = f(x, "static", dim=1, mask=mask.transpose(1, 2).transpose(1, 2))
        assert torch.allclose(p, f(x, "pruned", dim=1, mask=mask), atol=1e-12), name
        assert torch.all(p[~mask] == 0)


def test_static_tensor_alpha_matches_per_row_floats():
    x = _rows(60)
    alpha = torch.tensor([1.0, 1.2, 1.5, 1.7, 2.0, 2.3, 2.5, 3.0, 4.0, 1.05], dtype=F64)[:, None]
    p = entmax_bisect(x, alpha, impl="static")
    for i in range(len(x)):
        want = entmax_bisect(x[i], float(alpha[i]), impl="pruned")
        assert torch.allclose(p[i], want, rtol=0, atol=1e-10), i
    assert torch.allclose(p, entmax_bisect(x, alpha, impl="pruned"), atol=1e-10)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "bisect1.3", "bisect2.5"])
def test_static_gradcheck(name):
    x = (torch.randn(3, 7, dtype=F64) * 2).requires_grad_()
    f = MAPS[name]
    assert torch.autograd.gradcheck(lambda t: f(t, "static"), (x,), eps=1e-7, atol=1e-6)


def test_static_gradcheck_tensor_alpha():
    x = (torch.randn(3, 6, dtype=F64) * 2).requires_grad_()
    a = torch.tensor([[1.3], [1.8], [2.4]], dtype=F64).requires_grad_()
    assert torch.autograd.gradcheck(lambda t, al: entmax_bisect(t, al, impl="static"), (x, a),
                                    eps=1e-7, atol=1e-6)


def _all_calls():
    """Every mapping, forward + backward, as (name, fn(x) -> loss) with the static path."""
    alpha_t = torch.tensor([[1.2], [1.5], [1.0], [2.5]])
    learn = EntmaxBisect(alpha=torch.nn.Parameter(torch.full((4, 1), 1.6)), impl="static")
    mask = torch.ones(4, 30, dtype=torch.bool)
    mask[1, 5:] = False
    mask[3] = False
    return {
        "softmax": lambda x: softmax(x, mask=mask),
        "sparsemax": lambda x: sparsemax(x, mask=mask, impl="static"),
        "entmax15": lambda x: entmax15(x, mask=mask, impl="static"),
        "bisect1.5": lambda x: entmax_bisect(x, 1.5, mask=mask, impl="static"),
        "bisect1.3": lambda x: entmax_bisect(x, 1.3, impl="static"),
        "bisect2.5": lambda x: entmax_bisect(x, 2.5, impl="static"),
        "bisect_tensor_alpha": lambda x: entmax_bisect(x, alpha_t, mask=mask, impl="static"),
        "bisect_learnable": lambda x: learn(x),
        "entmax15_bf16": lambda x: entmax15(x.bfloat16(), impl="static").float(),
    }


@pytest.mark.parametrize("name", list(_all_calls()))
def test_static_path_never_synchronises(name):
    f = _all_calls()[name]
    x = torch.randn(4, 30, requires_grad=True)
    g = torch.randn(4, 30)
    with SyncAudit() as audit:
        p = f(x)
        (p * g).sum().backward()
    assert audit.total == 0, audit.report()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_sync_audit_sees_the_pruned_path():
    """Control: the CPU algorithm does synchronise (its checked loop), so the audit is not blind."""
    with SyncAudit() as audit:
        entmax15(torch.randn(4, 3000), impl="pruned")
    assert audit.total > 0


def test_compile_fullgraph_static(monkeypatch):
    """Every mapping with impl="static" traces as one graph, forward and backward, and
    impl="auto" (on the CPU: the CPU algorithm, one custom operator of the graph) with them;
    compiled == eager. One compiled function holds them all, with 2 steps per solver: compiling
    unrolls the fixed loops, whose steps repeat the same ops, so fewer steps only make the graph
    (and this test) shorter."""
    from nmt.sparse import _static

    for table in (_static.EXACT_STEPS, _static.NORM_STEPS, _static.SAFE_STEPS):
        for dtype in list(table):
            monkeypatch.setitem(table, dtype, 2)
    torch._dynamo.reset()
    calls = _all_calls()
    calls["auto"] = lambda x: entmax15(x) + sparsemax(x)
    eager_calls = calls
    w = torch.randn(len(calls), 4, 30)

    def total(fns, x):
        return sum((fn(x) * w[i]).sum() for i, fn in enumerate(fns))

    compiled = torch.compile(lambda x: total(calls.values(), x), fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 30)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    le, lc = total(eager_calls.values(), xe), compiled(xc)
    assert torch.allclose(lc, le, atol=1e-5)
    le.backward()
    lc.backward()
    assert torch.allclose(xc.grad, xe.grad, atol=1e-5)
    torch._dynamo.reset()


def test_impl_errors():
    x = torch.randn(2, 5)
    with pytest.raises(ValueError, match="impl must be one of"):
        sparsemax(x, impl="fast")
    if not _dispatch.triton_available(x):
        with pytest.raises(ValueError, match="impl='triton' needs Triton"):
            entmax15(x, impl="triton")
    with pytest.raises(ValueError, match="alpha > 1"):
        entmax_threshold(x, 1.0)


def test_triton_dispatch_contract(monkeypatch):
    """When nmt.sparse._triton accepts a tensor, auto/triton call its kernels on ``(..., n)`` rows
    (the dim normalised last; the kernels take any leading shape, no view around a launch) and
    their backward on ``p`` and a gradient of its shape; a float alpha goes to the ``_scalar``
    kernels as a number; a fake module computing with the static path stands in for it."""
    calls = []

    def fwd(kind, fn):
        def run(x, *rest):
            assert x.dim() == 3 and x.shape[-1] == 3  # (2, 11, 3): dim=1 moved last, not flattened
            calls.append(kind)
            return fn(x.contiguous(), *rest)
        return run

    def bwd(p, g, alpha=None):
        assert p.shape == g.shape == (2, 11, 3) and p.is_contiguous()
        calls.append("backward")
        a = 2.0 if alpha is None else alpha
        s = torch.where(p > 0, torch.where(p > 0, p, 1) ** (2 - a), 0)
        return s * (g - (s * g).sum(-1, keepdim=True) / s.sum(-1, keepdim=True))

    def scalar(x, alpha):
        assert isinstance(alpha, float) and alpha == 1.7
        return entmax_bisect(x, alpha, impl="static")

    fake = types.SimpleNamespace(
        is_available=lambda x: True,
        sparsemax_forward=fwd("sparsemax", lambda x: sparsemax(x, impl="static")),
        entmax15_forward=fwd("entmax15", lambda x: entmax15(x, impl="static")),
        entmax_forward_scalar=fwd("entmax", scalar),
        sparsemax_backward=lambda p, g: bwd(p, g),
        entmax15_backward=lambda p, g: bwd(p, g, 1.5),
        entmax_backward_scalar=bwd,
    )
    monkeypatch.setattr(_dispatch, "_triton", fake)
    x = torch.randn(2, 3, 11, dtype=F64, requires_grad=True)
    g = torch.randn(2, 3, 11, dtype=F64)
    for name, f in (("sparsemax", lambda t: sparsemax(t, dim=1, impl="triton")),
                    ("entmax15", lambda t: entmax15(t, dim=1, impl="triton")),
                    ("entmax", lambda t: entmax_bisect(t, 1.7, dim=1, impl="triton"))):
        calls.clear()
        x.grad = None
        (f(x) * g).sum().backward()
        assert calls == [name, "backward"]
        xr = x.detach().clone().requires_grad_()
        want = {"sparsemax": sparsemax, "entmax15": entmax15}.get(name, lambda t, **k: entmax_bisect(t, 1.7, **k))
        (want(xr, dim=1, impl="static") * g).sum().backward()
        assert torch.allclose(x.grad, xr.grad, atol=1e-10)


@pytest.mark.parametrize("impl", ["pruned", "static"])
def test_entmax_threshold_front_door(impl):
    """entmax_threshold(x, alpha): p = [(alpha - 1) x - tau]_+^(1/(alpha-1)) sums to one and is
    alpha-entmax, for float and per-row tensor alpha; 1.5 and 2 agree with the exact front doors."""
    x = torch.randn(4, 300, dtype=F64) * 3 + 50
    for alpha in (1.3, 1.5, 2.0, 2.5):
        tau = entmax_threshold(x, alpha, impl=impl)
        p = ((alpha - 1) * x - tau).clamp(min=0) ** (1 / (alpha - 1))
        assert torch.allclose(p.sum(-1), torch.ones(4, dtype=F64), atol=1e-9)
        assert torch.allclose(p, entmax_bisect(x, alpha, impl="pruned"), atol=1e-9)
    assert torch.allclose(entmax_threshold(x, 1.5, impl=impl), entmax15_threshold(x, impl=impl), atol=1e-12)
    assert torch.allclose(entmax_threshold(x, 2.0, impl=impl), sparsemax_threshold(x, impl=impl), atol=1e-12)
    a = torch.tensor([[1.3], [1.5], [2.0], [2.5]], dtype=F64)
    tau = entmax_threshold(x, a, impl=impl)
    p = ((a - 1) * x - tau).clamp(min=0) ** (1 / (a - 1))
    assert torch.allclose(p, entmax_bisect(x, a, impl="pruned"), atol=1e-9)


@pytest.mark.parametrize("n", [50, 3000])
def test_learned_alphas_pruned_norm_newton_equals_static(n):
    """Per-row alphas all in (1, 2) (learned per head): the CPU path's norm Newton and the static
    (accelerator) path give the same probabilities (1e-10) with exact zeros at the same places, and
    the same gradients, masks and a row with nothing kept included (what the CUDA test checks)."""
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(12, n, generator=g, dtype=F64) * 3).requires_grad_()
    mask = torch.rand(12, n, generator=g) > 0.2
    mask[2] = False
    alpha = torch.linspace(1.2, 1.8, 12, dtype=F64)[:, None]
    grad = torch.randn(12, n, generator=g, dtype=F64)
    out = {}
    for impl in ("pruned", "static"):
        p = entmax_bisect(x, alpha, mask=mask, impl=impl)
        (gx,) = torch.autograd.grad(p, x, grad)
        out[impl] = (p.detach(), gx)
    (p, gp), (s, gs) = out["pruned"], out["static"]
    assert torch.allclose(p, s, atol=1e-10) and torch.equal(p == 0, s == 0)
    assert torch.allclose(gp, gs, atol=1e-9)
    assert not p[2].any()


def test_fresh_output_copies_only_while_compiling(monkeypatch):
    """The workaround for pytorch/pytorch#180642 (torch 2.11: wrong gradients under compile when a
    Function returns a tensor it changed in place): a copy while tracing, the tensor itself eagerly."""
    from nmt.sparse._common import fresh_output

    t = torch.randn(3)
    assert fresh_output(t) is t
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    copy = fresh_output(t)
    assert copy is not t and copy.data_ptr() != t.data_ptr() and torch.equal(copy, t)
