"""Fenchel-Young losses: values against closed forms / torch / the reference package, gradient = p - y."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from nmt.sparse import (
    CrossEntropyLoss,
    Entmax15Loss,
    EntmaxBisectLoss,
    SparsemaxLoss,
    cross_entropy_loss,
    entmax15,
    entmax15_loss,
    entmax_bisect,
    entmax_bisect_loss,
    softmax,
    sparsemax,
    sparsemax_loss,
)

F64 = torch.float64

LOSSES = {
    "softmax": (cross_entropy_loss, softmax, 1.0),
    "sparsemax": (sparsemax_loss, sparsemax, 2.0),
    "entmax15": (entmax15_loss, entmax15, 1.5),
    "bisect13": (lambda *a, **k: entmax_bisect_loss(*a, alpha=1.3, **k),
                 lambda x: entmax_bisect(x, 1.3), 1.3),
}


def omega(p: torch.Tensor, alpha: float) -> torch.Tensor:
    """Tsallis / Shannon negentropy, written out independently of the library."""
    if alpha == 1.0:
        return torch.where(p > 0, p * p.clamp(min=1e-300).log(), 0).sum(-1)
    return (p.pow(alpha).sum(-1) - 1) / (alpha * (alpha - 1))


def fy_definition(x, y, mapping, alpha):
    """L = <x, p> - Omega(p) - <x, y> + Omega(y), finite scores only."""
    p = mapping(x)
    return (x * p).sum(-1) - omega(p, alpha) - (x * y).sum(-1) + omega(y, alpha)


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("n", [5, 600])
def test_value_matches_definition(name, n):
    loss_fn, mapping, alpha = LOSSES[name]
    x = torch.randn(4, n, dtype=F64) * 3
    t = torch.randint(0, n, (4,))
    y = F.one_hot(t, n).to(F64)
    assert torch.allclose(loss_fn(x, t, reduction="none"), fy_definition(x, y, mapping, alpha), atol=1e-9)
    # distribution targets and label smoothing
    d = torch.softmax(torch.randn(4, n, dtype=F64), -1)
    assert torch.allclose(loss_fn(x, d, reduction="none"), fy_definition(x, d, mapping, alpha), atol=1e-9)
    ys = 0.9 * y + 0.1 / n
    assert torch.allclose(loss_fn(x, t, reduction="none", label_smoothing=0.1),
                          fy_definition(x, ys, mapping, alpha), atol=1e-9)


@pytest.mark.parametrize("name", list(LOSSES))
def test_gradient_is_mapping_minus_target(name):
    loss_fn, mapping, _ = LOSSES[name]
    x = (torch.randn(6, 300, dtype=F64) * 2).requires_grad_()
    t = torch.randint(0, 300, (6,))
    loss_fn(x, t, reduction="sum").backward()
    expected = mapping(x.detach()) - F.one_hot(t, 300).to(F64)
    assert torch.allclose(x.grad, expected, atol=1e-9)


@pytest.mark.parametrize("name", list(LOSSES))
def test_gradcheck(name):
    loss_fn = LOSSES[name][0]
    x = (torch.randn(3, 6, dtype=F64) * 2).requires_grad_()
    t = torch.tensor([0, 3, 5])
    assert torch.autograd.gradcheck(lambda s: loss_fn(s, t, reduction="none"), (x,), eps=1e-7, atol=1e-6)
    d = torch.softmax(torch.randn(3, 6, dtype=F64), -1)
    assert torch.autograd.gradcheck(lambda s: loss_fn(s, d, label_smoothing=0.2), (x,), eps=1e-7, atol=1e-6)


def test_cross_entropy_matches_torch():
    """torch's smoothed cross-entropy is H(y, p); the Fenchel-Young loss is KL(y || p) = H(y, p) - H(y)."""
    x = torch.randn(5, 7, 11, dtype=F64)
    t = torch.randint(0, 11, (5, 7))
    t[0, 0] = -100
    n_valid = (t != -100).sum()
    for eps in (0.0, 0.15):
        ys = torch.tensor([1 - eps + eps / 11] + [eps / 11] * 10, dtype=F64)
        entropy = -(ys * ys.log()).sum() if eps > 0 else 0.0
        for red in ("mean", "sum", "none"):
            ours = cross_entropy_loss(x, t, reduction=red, label_smoothing=eps)
            ref = F.cross_entropy(x.reshape(-1, 11), t.reshape(-1), reduction=red, label_smoothing=eps)
            if red == "none":
                ours, ref = ours.reshape(-1), torch.where(t.reshape(-1) == -100, 0, ref - entropy)
            else:
                ref = ref - entropy * (1 if red == "mean" else n_valid)
            assert torch.allclose(ours, ref, atol=1e-12)


def test_cross_entropy_fast_path_equals_the_generic_function():
    """Index targets without smoothing take a log_softmax path; it must agree with the generic
    Fenchel-Young function on values and gradients, -inf scores, dead rows and ignored rows included."""
    from nmt.sparse.losses import Shannon, _CrossEntropyFunction, _FenchelYoungFunction

    torch.manual_seed(0)
    x = torch.randn(9, 13, dtype=F64)
    x[1, 4:] = float("-inf")
    x[2] = float("-inf")  # a dead row
    t = torch.randint(0, 4, (9,))
    t[3] = 12
    x[3, 12] = float("-inf")  # an impossible target
    valid = torch.ones(9, dtype=torch.bool)
    valid[5] = False
    g = torch.rand(9, dtype=F64)
    for eps in (0.0, 0.1, 1.0):  # label smoothing has its own closed form in the fast path
        results = []
        for fn, args in ((_CrossEntropyFunction.apply, (t, valid, eps)),
                         (_FenchelYoungFunction.apply, (Shannon(), t, None, valid, eps, "auto"))):
            z = x.clone().requires_grad_()
            loss = fn(z, *args)
            (loss * g).sum().backward()
            results.append((loss.detach(), z.grad))
        (l1, g1), (l2, g2) = results
        assert torch.equal(torch.isinf(l1), torch.isinf(l2)) and l1[3] == float("inf") and l1[5] == 0
        assert torch.allclose(l1[~torch.isinf(l1)], l2[~torch.isinf(l2)], atol=1e-12)
        assert torch.allclose(g1, g2, atol=1e-12) and g1[2, t[2]] == (eps - 1) * g[2] and not g1[5].any()


def test_reference_package(ref):
    x = torch.randn(6, 50, dtype=F64) * 2
    t = torch.randint(0, 50, (6,))
    assert torch.allclose(sparsemax_loss(x, t, reduction="none"), ref.SparsemaxLoss(reduction="none")(x, t))
    assert torch.allclose(entmax15_loss(x, t, reduction="none"), ref.Entmax15Loss(reduction="none")(x, t))
    assert torch.allclose(entmax_bisect_loss(x, t, alpha=1.7, reduction="none"),
                          ref.EntmaxBisectLoss(1.7, n_iter=200, reduction="none")(x, t), atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_long_broad_rows_match_reference(dtype, ref):
    """Output-layer rows (vocab 3963, not a multiple of the pruning block) as early in training:
    broad rows (full-row path) and peaked ones (pruned path) in one batch, -inf entries,
    ignored targets; value and gradient against the reference package."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3963, generator=g, dtype=dtype) * torch.tensor([0.02, 0.1, 0.3, 1, 3, 10, 0.05, 1],
                                                                      dtype=dtype)[:, None]
    x[6, 1::2] = float("-inf")
    t = torch.randint(0, 3963, (8,), generator=g)
    t[6] = 0
    t[7] = -100
    xr = x.detach().clone().requires_grad_()
    x = x.requires_grad_()
    loss = entmax15_loss(x, t, reduction="none")
    loss.sum().backward()
    keep = torch.arange(6)  # the reference has no -inf support: row 6 on its finite entries
    want = ref.Entmax15Loss(reduction="none")(xr[keep], t[keep])
    xf = xr.detach()[6, 0::2].clone().requires_grad_()
    want6 = ref.Entmax15Loss(reduction="none")(xf[None], t[6:7])
    (want.sum() + want6.sum()).backward()
    atol = 1e-10 if dtype == F64 else 2e-4
    assert torch.allclose(loss[keep], want, atol=atol) and torch.allclose(loss[6], want6[0], atol=atol)
    assert torch.allclose(x.grad[keep], xr.grad[keep], atol=atol)
    assert torch.allclose(x.grad[6, 0::2], xf.grad, atol=atol) and not x.grad[6, 1::2].any()
    assert loss[7] == 0 and not x.grad[7].any()
    bis = entmax_bisect_loss(x.detach(), t, alpha=1.5, reduction="none")
    assert torch.allclose(bis, loss.detach(), atol=atol)


@pytest.mark.parametrize("name", list(LOSSES))
def test_ignore_index_negative_and_masked_vocab(name):
    loss_fn = LOSSES[name][0]
    x = torch.randn(4, 8, dtype=F64)
    x[:, 5:] = float("-inf")  # masked vocabulary
    x = x.requires_grad_()
    t = torch.tensor([1, -1, 2, -1])
    loss = loss_fn(x, t, ignore_index=-1, reduction="none")
    assert torch.isfinite(loss).all() and torch.all(loss[[1, 3]] == 0)
    mean = loss_fn(x, t, ignore_index=-1, label_smoothing=0.1)
    mean.backward()
    assert torch.isfinite(mean) and torch.isfinite(x.grad).all()
    assert torch.all(x.grad[[1, 3]] == 0) and torch.all(x.grad[:, 5:] == 0)
    plain = loss_fn(x.detach()[[0, 2]], t[[0, 2]])
    assert torch.allclose(loss_fn(x.detach(), t, ignore_index=-1), plain)
    # all targets ignored -> 0, a target on a -inf class -> +inf, never NaN
    assert loss_fn(x, torch.full((4,), -1), ignore_index=-1).item() == 0
    assert loss_fn(x.detach(), torch.tensor([6, 0, 0, 0]), reduction="none")[0].item() == float("inf")


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "bisect13"])
def test_zero_loss_at_separation(name):
    loss_fn, mapping, _ = LOSSES[name]
    x = torch.tensor([[0.0, 5.0, -1.0], [2.0, 1.9, -3.0]], dtype=F64)
    loss = loss_fn(x, torch.tensor([1, 0]), reduction="none")
    assert loss[0].item() == pytest.approx(0.0, abs=1e-12)  # margin met: p = one-hot
    assert loss[1].item() > 0
    assert (loss_fn(torch.randn(50, 9, dtype=F64), torch.randint(0, 9, (50,)), reduction="none") >= -1e-12).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_half_precision(dtype):
    x = torch.randn(8, 400).to(dtype).requires_grad_()
    t = torch.randint(0, 400, (8,))
    loss = entmax15_loss(x, t)
    loss.backward()
    assert loss.dtype == dtype and x.grad.dtype == dtype
    assert torch.allclose(loss.double(), entmax15_loss(x.detach().double(), t), rtol=1e-2)


def test_modules_and_errors():
    x, t = torch.randn(3, 5), torch.tensor([0, 1, 2])
    assert torch.equal(SparsemaxLoss()(x, t), sparsemax_loss(x, t))
    assert torch.equal(Entmax15Loss(reduction="sum")(x, t), entmax15_loss(x, t, reduction="sum"))
    assert torch.allclose(EntmaxBisectLoss(alpha=1.0)(x, t), CrossEntropyLoss()(x, t))
    with pytest.raises(ValueError, match="reduction"):
        sparsemax_loss(x, t, reduction="avg")
    with pytest.raises(ValueError, match="out of range"):
        sparsemax_loss(x, torch.tensor([0, 1, 5]))
    with pytest.raises(ValueError, match="shape"):
        sparsemax_loss(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="label_smoothing"):
        sparsemax_loss(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="alpha"):
        entmax_bisect_loss(x, t, alpha=0.5)


@pytest.mark.parametrize("alpha, problem", [
    (torch.tensor(float("inf")), "needs a finite alpha >= 1 (1: cross-entropy), got inf"),
    (torch.tensor([float("nan")]), "needs a finite alpha >= 1 (1: cross-entropy), got nan"),
    (torch.tensor(0.5, requires_grad=True), "needs a finite alpha >= 1 (1: cross-entropy), got 0.5"),
    (torch.tensor([1.5, 2.0]), "takes one alpha (a float or a one-element tensor), got a tensor of shape (2,)"),
])
def test_a_tensor_alpha_is_checked_as_a_float_is(alpha, problem):
    """entmax_bisect_loss called directly with a tensor alpha: one value, finite, >= 1 (read on the
    host where the loss reads it anyway); per-row alphas are not a loss parameter."""
    x, t = torch.randn(3, 5), torch.tensor([0, 1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "converting a tensor with requires_grad" warning either
        with pytest.raises(ValueError) as error:
            entmax_bisect_loss(x, t, alpha=alpha)
        assert str(error.value) == "entmax_bisect_loss " + problem
        with pytest.raises(ValueError, match="entmax_bisect_loss takes one alpha"):
            EntmaxBisectLoss(alpha=torch.full((3, 1), 1.5))
        one = torch.tensor(1.25, requires_grad=True)
        assert torch.equal(entmax_bisect_loss(x, t, alpha=one), entmax_bisect_loss(x, t, alpha=1.25))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    x = torch.randn(16, 3000) * 3
    t = torch.randint(0, 3000, (16,))
    mask = torch.rand(16, 3000) > 0.1
    for name, (loss_fn, mapping, _) in LOSSES.items():
        assert torch.allclose(mapping(x.cuda()).cpu(), mapping(x), atol=1e-6), name
        assert torch.allclose(loss_fn(x.cuda(), t.cuda()).cpu(), loss_fn(x, t), atol=1e-4), name
    assert torch.equal(sparsemax(x.cuda(), mask=mask.cuda()).cpu() == 0, sparsemax(x, mask=mask) == 0)


# --- exact cases, non-negativity, refused targets (issue 17) ----------------------------------

ONE_HOT_CASES = {
    "softmax": (cross_entropy_loss, softmax, 1000.0),  # exp(-1000) underflows: p exactly one-hot
    "sparsemax": (sparsemax_loss, sparsemax, 5.0),
    "entmax15": (entmax15_loss, entmax15, 5.0),
    "bisect15": (lambda *a, **k: entmax_bisect_loss(*a, alpha=1.5, **k),
                 lambda x: entmax_bisect(x, 1.5), 5.0),
    "bisect13": (lambda *a, **k: entmax_bisect_loss(*a, alpha=1.3, **k),
                 lambda x: entmax_bisect(x, 1.3), 10.0),
}


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("offset", [0.0, 1234.5])
@pytest.mark.parametrize("n", [7, 300])
@pytest.mark.parametrize("name", list(ONE_HOT_CASES))
def test_one_hot_prediction_has_exactly_zero_loss(name, n, offset, dtype):
    """Scores where the target wins by a margin: the prediction is exactly one-hot on the target,
    so the loss is exactly 0 (not -2e-16 or +1e-7) whatever the offset of the row."""
    loss_fn, mapping, margin = ONE_HOT_CASES[name]
    g = torch.Generator().manual_seed(n)
    x = torch.randn(16, n, generator=g, dtype=F64) * 0.5
    t = torch.randint(0, n, (16,), generator=g)
    x[torch.arange(16), t] = x.max() + margin
    x = (x + offset).to(dtype)
    assert torch.equal(mapping(x), F.one_hot(t, n).to(dtype))  # the premise
    for impl in ("auto", "static"):
        loss = loss_fn(x, t, reduction="none", impl=impl)
        assert torch.equal(loss, torch.zeros_like(loss)), (impl, loss.abs().max())
        assert torch.equal(loss_fn(x, F.one_hot(t, n).to(dtype), reduction="none", impl=impl),
                           torch.zeros_like(loss))


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_loss_is_never_negative(name, dtype):
    """Near-separated rows (the loss is a rounding error away from 0): never below 0."""
    loss_fn = LOSSES[name][0]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(400, 20, generator=g, dtype=F64)
    t = torch.randint(0, 20, (400,), generator=g)
    x[torch.arange(400), t] = x.max(dim=-1).values + torch.rand(400, generator=g, dtype=F64) * 3
    x = (x * 10 ** torch.randint(-2, 3, (400, 1), generator=g)).to(dtype)
    for impl in ("auto", "static"):
        assert (loss_fn(x, t, reduction="none", impl=impl) >= 0).all()
        assert (loss_fn(x, t, reduction="none", label_smoothing=0.05, impl=impl) >= 0).all()


@pytest.mark.parametrize("name", list(LOSSES))
def test_distribution_target_off_the_simplex_is_refused(name):
    loss_fn = LOSSES[name][0]
    x = torch.randn(3, 5, dtype=F64)
    good = torch.softmax(torch.randn(3, 5, dtype=F64), -1)
    loss_fn(x, good)  # accepted
    loss_fn(x, good.float().double())  # rounding of a float32 distribution: accepted
    negative = good.clone()
    negative[1, :2] = torch.tensor([-0.5, good[1, 0] + good[1, 1] + 0.5])
    for bad in (negative, good * 5, good / 2, torch.full_like(good, float("nan"))):
        with pytest.raises(ValueError, match="simplex"):
            loss_fn(x, bad)
        with pytest.raises(ValueError, match="simplex"):
            loss_fn(x, bad, impl="static", label_smoothing=0.1)


@pytest.mark.parametrize("name", list(LOSSES))
def test_zero_width_inputs(name):
    loss_fn = LOSSES[name][0]
    with pytest.raises(ValueError, match="no classes"):
        loss_fn(torch.zeros(3, 0), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="no classes"):
        loss_fn(torch.zeros(3, 0), torch.zeros(3, 0))
    x = torch.zeros(0, 6, requires_grad=True)
    t = torch.zeros(0, dtype=torch.long)
    for impl in ("auto", "static"):
        assert loss_fn(x, t, reduction="none", impl=impl).shape == (0,)
        assert loss_fn(x, t, reduction="sum", impl=impl).item() == 0
        mean = loss_fn(x, t, impl=impl, label_smoothing=0.1)
        mean.backward()
        assert mean.item() == 0 and x.grad.shape == (0, 6)


def test_unknown_impl_is_refused():
    x, t = torch.randn(2, 5), torch.tensor([0, 1])
    for loss_fn in (cross_entropy_loss, sparsemax_loss, entmax15_loss, entmax_bisect_loss):
        with pytest.raises(ValueError, match="impl"):
            loss_fn(x, t, impl="fast")
    with pytest.raises(ValueError, match="impl"):
        SparsemaxLoss(impl="fast")


# --- the accelerator contract on the CPU: no host sync, fullgraph compile ---------------------

def _targets(n_rows: int, n: int, seed: int = 0):
    """Index targets with ignored rows (two ignore values), and a distribution target."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, n, (n_rows,), generator=g)
    t[::3] = -100
    dist = torch.softmax(torch.randn(n_rows, n, generator=g, dtype=F64) * 3, -1)
    dist = torch.where(dist < 0.05, 0, dist)
    return t, dist / dist.sum(-1, keepdim=True)


@pytest.mark.parametrize("n", [9, 300])
@pytest.mark.parametrize("name", list(LOSSES))
def test_static_path_never_synchronises(name, n):
    """Forward + backward of every loss with impl="static" (cross-entropy: any impl): zero calls
    that would wait for an accelerator, with index targets, ignore_index, label smoothing,
    distribution targets and a masked vocabulary, every reduction."""
    from nmt.utils.sync_audit import SyncAudit

    loss_fn = LOSSES[name][0]
    t, dist = _targets(12, n)
    x = torch.randn(12, n, dtype=F64) * 2
    x[2, n // 2:] = float("-inf")
    impls = ("auto", "static") if name == "softmax" else ("static",)
    for impl in impls:
        for target, kw in ((t, {}), (t, {"label_smoothing": 0.1}), (dist.double(), {}),
                           (dist.double(), {"label_smoothing": 0.2}), (t, {"reduction": "sum"}),
                           (t, {"reduction": "none"})):
            xs = x.clone().requires_grad_()
            with SyncAudit() as audit:
                loss_fn(xs, target, impl=impl, **kw).sum().backward()
            assert audit.total == 0, (impl, kw, audit.report())


@pytest.mark.parametrize("name", list(LOSSES))
def test_fullgraph_compile_matches_eager(name):
    """One compiled graph per loss: index targets with ignored rows and label smoothing (the
    threshold and the generic Fenchel-Young function), for cross-entropy also a distribution
    target (the generic function without smoothing); values and gradients equal eager. Graph
    capture (dynamo + AOT autograd, where a data-dependent shape or a host read would break the
    graph) is what is tested, not inductor's code generation (slow on a small CI machine)."""
    loss_fn = LOSSES[name][0]
    t, dist = _targets(6, 40, seed=1)
    x = torch.randn(6, 40) * 2
    x[1, 30:] = float("-inf")

    def total(s, idx, d):
        loss = loss_fn(s, idx, label_smoothing=0.1, impl="static", reduction="sum")
        return loss + loss_fn(s, d, impl="static") if name == "softmax" else loss

    compiled = torch.compile(total, fullgraph=True, dynamic=False, backend="aot_eager")
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    lc, le = compiled(xc, t, dist.float()), total(xe, t, dist.float())
    lc.backward()
    le.backward()
    assert torch.allclose(lc, le, rtol=1e-5, atol=1e-6)
    assert torch.allclose(xc.grad, xe.grad, atol=1e-6)


@pytest.mark.parametrize("name", list(LOSSES))
def test_static_gradcheck_and_gradient_is_mapping_minus_target(name):
    loss_fn, mapping, _ = LOSSES[name]
    x = (torch.randn(3, 40, dtype=F64) * 2).requires_grad_()
    t = torch.tensor([0, -100, 39])
    assert torch.autograd.gradcheck(lambda s: loss_fn(s, t, reduction="none", impl="static"), (x,),
                                    eps=1e-7, atol=1e-6)
    _, dist = _targets(3, 40, seed=2)
    loss_fn(x, dist, reduction="sum", impl="static", label_smoothing=0.1).backward()
    y = 0.9 * dist + 0.1 / 40
    assert torch.allclose(x.grad, mapping(x.detach()) - y, atol=1e-9)


@pytest.mark.parametrize("impl", ["auto", "static"])
def test_reference_package_static(ref, impl):
    x = torch.randn(6, 300, dtype=F64) * 2
    t = torch.randint(0, 300, (6,))
    assert torch.allclose(sparsemax_loss(x, t, reduction="none", impl=impl),
                          ref.SparsemaxLoss(reduction="none")(x, t))
    assert torch.allclose(entmax15_loss(x, t, reduction="none", impl=impl),
                          ref.Entmax15Loss(reduction="none")(x, t))
    assert torch.allclose(entmax_bisect_loss(x, t, alpha=1.3, reduction="none", impl=impl),
                          ref.EntmaxBisectLoss(1.3, n_iter=200, reduction="none")(x, t), atol=1e-9)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_bisect_loss_at_closed_form_alphas(ref, alpha):
    """entmax_bisect_loss at alpha 1.5 / 2 takes the exact closed forms: the same values and
    gradients as root finding (the generic Tsallis regulariser) and the reference package."""
    from nmt.sparse.losses import Tsallis, fenchel_young_loss

    x = (torch.randn(7, 40, dtype=F64) * 3).requires_grad_()
    t = torch.randint(0, 40, (7,))
    got = entmax_bisect_loss(x, t, alpha=alpha, reduction="none")
    (g_got,) = torch.autograd.grad(got.sum(), x)
    rooted = fenchel_young_loss(Tsallis(alpha), x, t, -100, "none", 0.0, "auto")
    (g_root,) = torch.autograd.grad(rooted.sum(), x)
    torch.testing.assert_close(got, rooted, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_got, g_root, rtol=0, atol=1e-12)
    want = ref.EntmaxBisectLoss(alpha, n_iter=200, reduction="none")(x.detach(), t)
    torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-10)
    assert type(EntmaxBisectLoss(alpha=alpha).reg).__name__ == ("TsallisEntmax15" if alpha == 1.5 else "TsallisSparsemax")


@pytest.mark.parametrize("ignore_index", [-100, -1, 3])
def test_cross_entropy_values_and_gradients_match_torch(ignore_index):
    """The torch path of cross-entropy (CPU, float64) equals F.cross_entropy up to the constant
    H(y) of a smoothed target: values for every reduction and gradients for any incoming gradient,
    ignored rows (several ignore values, one of them a class) included, to 1e-10."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 5, 13, generator=g, dtype=F64) * 3
    t = torch.randint(0, 13, (6, 5), generator=g)
    t[0, :2] = ignore_index
    t[4, 4] = ignore_index
    n_valid = (t != ignore_index).sum()
    for eps in (0.0, 0.1, 1.0):
        ys = torch.tensor([1 - eps + eps / 13] + [eps / 13] * 12, dtype=F64)
        entropy = -(ys * ys.log()).sum() if eps > 0 else 0.0
        for red in ("mean", "sum", "none"):
            xo, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
            ours = cross_entropy_loss(xo, t, ignore_index=ignore_index, reduction=red, label_smoothing=eps)
            ref = F.cross_entropy(xr.reshape(-1, 13), t.reshape(-1), ignore_index=ignore_index,
                                  reduction=red, label_smoothing=eps)
            if red == "none":
                ref = torch.where(t.reshape(-1) == ignore_index, 0, ref - entropy).reshape(6, 5)
            else:
                ref = ref - entropy * (1 if red == "mean" else n_valid)
            torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10)
            w = torch.rand(ours.shape, generator=g, dtype=F64)
            (ours * w).sum().backward()
            (ref * w).sum().backward()
            torch.testing.assert_close(xo.grad, xr.grad, rtol=0, atol=1e-10)


def test_cross_entropy_torch_path_nan_and_dead_rows():
    """Rows whose log_softmax is NaN (a NaN score; only -inf scores) get p = 0 in the gradient,
    with and without smoothing, as the generic Fenchel-Young function; the NaN row's loss is NaN,
    the dead row's inf; the evaluation forward (no grad) gives the same values."""
    from nmt.sparse.losses import Shannon, _CrossEntropyFunction, _FenchelYoungFunction

    x = torch.randn(5, 7, dtype=F64)
    x[1, 2] = float("nan")
    x[2] = float("-inf")
    x[3, 4:] = float("-inf")
    t = torch.tensor([0, 1, 3, 2, 6])
    valid = torch.tensor([True, True, True, True, False])
    for eps in (0.0, 0.2):
        res = []
        for fn, args in ((_CrossEntropyFunction.apply, (t, valid, eps)),
                         (_FenchelYoungFunction.apply, (Shannon(), t, None, valid, eps, "auto"))):
            z = x.clone().requires_grad_()
            loss = fn(z, *args)
            loss.sum().backward()
            res.append((loss.detach(), z.grad))
        (l1, g1), (l2, g2) = res
        assert l1[1].isnan() and l1[2] == float("inf") and l1[4] == 0
        assert torch.allclose(l1[[0, 3]], l2[[0, 3]], atol=1e-12)
        assert torch.allclose(g1, g2, atol=1e-12) and g1.isfinite().all() and not g1[4].any()
        assert torch.isclose(g1[1, 1], torch.tensor(eps - 1 - eps / 6, dtype=F64))  # 6 scores > -inf
        with torch.no_grad():
            l3 = _CrossEntropyFunction.apply(x, t, valid, eps)
        assert torch.equal(l3.isnan(), l1.isnan()) and torch.equal(l3[~l3.isnan()], l1[~l1.isnan()])


def test_cross_entropy_never_synchronises_any_impl():
    """Cross-entropy forward + backward, index and distribution targets, smoothing and every
    reduction: zero host-synchronising calls with each impl (the CPU: the torch path)."""
    from nmt.utils.sync_audit import SyncAudit

    t, dist = _targets(10, 30)
    x = torch.randn(10, 30, dtype=F64)
    x[3, 20:] = float("-inf")
    for impl in ("auto", "pruned", "static", "triton"):
        for target, kw in ((t, {}), (t, {"label_smoothing": 0.1}), (t, {"reduction": "none"}),
                           (dist, {}), (torch.where(t == -100, 5, t), {"reduction": "sum", "ignore_index": 5})):
            xs = x.clone().requires_grad_()
            with SyncAudit() as audit:
                cross_entropy_loss(xs, target, impl=impl, **kw).sum().backward()
            assert audit.total == 0, (impl, kw, audit.report())


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("alpha", [1.25, 1.3, 1.7])
def test_bisect_loss_at_the_candidates_equals_the_dense_loss(monkeypatch, count_calls, dtype, alpha):
    """Where every row is pruned (CPU), the alpha-entmax loss (float alpha, not 1.5 / 2) takes
    ``p`` and the conjugate from the pruning's candidates only: the same losses and gradients,
    within rounding, as over every entry, and the definition's value (independent); label
    smoothing and ignored rows too. The torch pruning is what float64 rows and machines without
    the native library take: float32 rows take it here with the fused native call off."""
    import nmt.sparse.entmax as E
    from nmt.sparse import losses
    from nmt.sparse.losses import Tsallis

    monkeypatch.setattr(losses, "power_probs", lambda *args, **kwargs: None)

    calls = count_calls(Tsallis, "_probs_conj_at")
    g = torch.Generator().manual_seed(7)
    n = 8000
    x = torch.randn(12, n, generator=g, dtype=dtype) * 4
    x[1] += 500.0
    x[2, 100:3000] = float("-inf")
    t = torch.randint(0, n, (12,), generator=g)
    t[2], t[5] = 50, -100
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-11, atol=1e-12)
    shares = (E.SPARSE_OUTPUT_SHARE, -1.0)  # -1: never sparse (the dense formula)
    for eps in (0.0, 0.1):
        results = []
        for share in shares:
            monkeypatch.setattr(E, "SPARSE_OUTPUT_SHARE", share)
            calls.clear()
            xs = x.clone().requires_grad_()
            loss = entmax_bisect_loss(xs, t, alpha=alpha, reduction="none", label_smoothing=eps)
            loss.sum().backward()
            results.append((loss.detach(), xs.grad))
            assert len(calls) == (1 if share > 0 else 0)
        (la, ga), (lb, gb) = results
        assert torch.allclose(la, lb, **tol) and torch.allclose(ga, gb, **tol)
        assert torch.equal(ga == 0, gb == 0)
        if eps == 0:
            keep = t != -100
            y = torch.zeros_like(x[keep]).scatter_(-1, t[keep, None], 1.0)
            fin = x[keep].isfinite()
            xd = torch.where(fin, x[keep], 0).double()
            p = entmax_bisect(x[keep].double(), alpha)
            definition = ((xd * p).sum(-1) - omega(p, alpha) - (xd * y.double()).sum(-1))
            assert torch.allclose(la[keep].double(), definition, rtol=1e-4 if dtype == torch.float32 else 1e-9,
                                  atol=1e-4 if dtype == torch.float32 else 1e-9)
