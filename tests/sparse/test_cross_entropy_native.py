"""Cross-entropy's native CPU passes (``nmt/sparse/_cross_entropy.c`` through
``nmt.sparse._native.xent_backward`` / ``xent_smoothing``): the float32 gradient ``(p - y) g`` in one
pass and the label smoothing's per-row statistics, on every vector path, against the float64 torch
path of the same loss (dead, NaN and partly -inf rows, impossible and ignored targets, smoothing,
reductions), and over threads."""
import pytest
import torch

from nmt.sparse import _native
from nmt.sparse.losses import _CrossEntropyFunction, cross_entropy_loss

F64 = torch.float64


def hard_rows(rows: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 scores ``(rows, n)`` (spread 3) with a partly -inf row, a dead row (all -inf), a NaN
    row and a +inf row, class indices with an impossible target (score -inf), and a validity mask."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * 3
    t = torch.randint(0, n, (rows,), generator=g)
    valid = torch.rand(rows, generator=g) > 0.2
    if n > 2 and rows > 5:
        x[1, n // 2:] = float("-inf")
        t[1] = 0
        x[2] = float("-inf")
        x[3, n // 3] = float("nan")
        x[4, 0] = float("inf")
        x[5, t[5]] = float("-inf")  # an impossible target
        valid[1:6] = True
    return x, t, valid


@pytest.mark.parametrize("n", [1, 5, 17, 64, 1000])
def test_native_gradient_matches_the_float64_torch_path(native_build, monkeypatch, n):
    """float32 rows through the native backward (the smoothing statistics too) give the float64
    torch path's loss and gradient within float32 rounding, on every vector path (without vectors:
    the torch passes), for smoothing 0, 0.1 and 1 and any incoming gradient; ignored rows get zeros."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    x, t, valid = hard_rows(37, n, seed=n)
    w = torch.rand(37, dtype=F64)
    for eps in (0.0, 0.1, 1.0):
        z32, z64 = x.clone().requires_grad_(), x.double().requires_grad_()
        l32 = _CrossEntropyFunction.apply(z32, t, valid, eps)
        l64 = _CrossEntropyFunction.apply(z64, t, valid, eps)
        (l32 * w.float()).sum().backward()
        (l64 * w).sum().backward()
        assert torch.equal(l32.isnan(), l64.isnan()) and torch.equal(l32.isinf(), l64.isinf())
        fin = l64.isfinite()
        torch.testing.assert_close(l32.double()[fin], l64[fin], rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(z32.grad.double(), z64.grad, rtol=0, atol=2e-7)
        assert not z32.grad[~valid].any() and bool(z32.grad.isfinite().all())


def test_the_native_calls_serve_float32_cpu_rows_only(monkeypatch):
    """The native passes take float32 CPU rows (the loss then calls them), and decline float64,
    3-D tensors and a missing library (the torch path then runs)."""
    if not _native.available():
        pytest.skip("native library not built")
    x, t, valid = hard_rows(9, 40, seed=1)
    logp = torch.log_softmax(x, dim=-1)
    g = torch.rand(9)
    a = torch.full((9,), 0.1 / 40)
    assert _native.xent_backward(logp, None, t, None, 0.0, g) is not None
    assert _native.xent_smoothing(x, logp) is not None
    assert _native.xent_backward(logp.double(), None, t, None, 0.0, g.double()) is None
    assert _native.xent_smoothing(x.double(), logp.double()) is None
    assert _native.xent_backward(logp[None], None, t, a, 0.1, g) is None
    with pytest.raises(ValueError, match="do not fit"):
        _native.xent_backward(logp, (x > 0)[:, :5], t, a, 0.1, g)
    calls = []
    real = _native.xent_backward
    monkeypatch.setattr("nmt.sparse.losses.xent_backward", lambda *args: calls.append(1) or real(*args))
    xs = x.clone().requires_grad_()
    cross_entropy_loss(xs, t, label_smoothing=0.1).backward()
    assert calls == [1]
    monkeypatch.setitem(_native._state, "lib", None)
    assert _native.xent_backward(logp, None, t, None, 0.0, g) is None and _native.xent_smoothing(x, logp) is None


def test_smoothing_statistics_are_the_finite_count_and_log_sum(native_build, monkeypatch):
    """m = the number of scores above -inf (+inf counts, NaN does not), s = the sum of logp over
    them, in double, and the mask of them: against torch's comparison and float64 sums, every vector
    path (lengths around the vector widths)."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    for n in (1, 3, 4, 15, 16, 17, 33, 5000):
        x, _, _ = hard_rows(11, n, seed=3 * n)
        logp = torch.log_softmax(x, dim=-1)
        found = _native.xent_smoothing(x, logp)
        if native_build is None or found is None:
            continue
        m, s, mask = found
        finite = x > float("-inf")
        assert torch.equal(mask, finite) and torch.equal(m, finite.sum(dim=-1).float())
        want = torch.where(finite, logp.double(), 0.0).sum(dim=-1)
        assert torch.equal(s.isnan(), want.isnan())
        ok = ~want.isnan()
        torch.testing.assert_close(s.double()[ok], want[ok], rtol=1e-6, atol=1e-6)


def test_rows_split_over_two_threads_give_the_same_gradient(monkeypatch):
    """A call large enough to split its rows over torch's threads gives the one-thread result bit
    for bit (backward and smoothing statistics)."""
    if not _native.available():
        pytest.skip("native library not built")
    x, t, valid = hard_rows(64, (_native.POWER_SPLIT_MIN_NUMEL // 64) + 7, seed=5)
    logp = torch.log_softmax(x, dim=-1)
    g = torch.where(valid, torch.rand(64), 0)
    a = torch.full((64,), 0.01)
    out = {}
    for threads in (1, 2):
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
        out[threads] = (_native.xent_backward(logp, x > float("-inf"), t, a, 0.1, g), *_native.xent_smoothing(x, logp))
    assert all(torch.equal(u.nan_to_num(7.0), v.nan_to_num(7.0)) for u, v in zip(out[1], out[2]))


def test_the_native_probabilities_are_within_an_ulp_of_exp(native_build, monkeypatch):
    """p = exp(logp) of the native backward (the argument reduced with ln 2 in two parts) within
    1.5 float32 ulps of the float64 exp over logp in [-20, 0] (1.4 measured: a relative 1.67e-7), on
    every vector path; -inf gives exactly 0 and NaN rows 0."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    logp = torch.linspace(-20.0, 0.0, 400_003).reshape(1, -1)
    g = torch.ones(1)
    t = torch.zeros(1, dtype=torch.int64)
    out = _native.xent_backward(logp, None, t, None, 0.0, g)
    if native_build is None or out is None:
        return
    want = logp.double().exp()
    err = ((out.double() - want).abs() / want)[:, 1:]  # (the target's entry is p - 1)
    assert float(err.max()) < 1.5 * 2.0 ** -23, float(err.max())
    special = torch.tensor([[float("-inf"), -200.0, 0.0]])
    p = _native.xent_backward(special, None, torch.tensor([2]), None, 0.0, g)
    assert p[0, 0] == 0 and p[0, 1] == 0 and p[0, 2] == 0  # (1 - 1 at the target)
    nan = _native.xent_backward(torch.full((1, 19), float("nan")), None, t, None, 0.0, g)
    assert torch.equal(nan, torch.zeros(1, 19).index_fill_(1, t, -1.0))


def test_second_order_graphs_and_in_place_scores_keep_torchs_behaviour():
    """With create_graph the backward takes torch's operations (its result is itself differentiable
    in the incoming gradient); with label smoothing the forward saves the finite classes' mask, not
    the scores, so scores changed in place after the forward do not break the backward."""
    x, t, valid = hard_rows(9, 40, seed=2)
    x = x.nan_to_num(0.0, posinf=0.0)
    z = x.clone().requires_grad_()
    w = torch.rand(9, requires_grad=True)
    loss = (cross_entropy_loss(z, t, reduction="none", label_smoothing=0.1) * w).sum()
    (gz,) = torch.autograd.grad(loss, z, create_graph=True)
    assert gz.requires_grad
    gz.sum().backward()  # reaches w
    assert w.grad is not None and bool(w.grad.isfinite().all())
    y = x.clone().requires_grad_()
    scores = y * 1.0
    loss = cross_entropy_loss(scores, t, label_smoothing=0.1)
    with torch.no_grad():
        scores.add_(1.0)
    loss.backward()
    assert bool(y.grad.isfinite().all())
