"""ContinuousAttention: against a per-sentence numpy/scipy reference, gradcheck, padding."""
from __future__ import annotations

import copy
import inspect
import math

import numpy as np
import pytest
import torch
from entmax import entmax15  # reference package, tests only
from scipy import integrate

from nmt.models.continuous_attention import ContinuousAttention

F64 = torch.float64
SMALL = {"num_basis_mu": 4, "basis_sigma": [0.05, 0.3]}


def batch(lengths: list[int], T: int = 2, D: int = 3, dtype=F64, sparse: bool = True, seed: int = 0):
    """(p (B, T, L) with exact zeros, values (B, L, D), mask (B, L)) with garbage on padding."""
    g = torch.Generator().manual_seed(seed)
    B, L = len(lengths), max(lengths)
    mask = torch.arange(L)[None] < torch.tensor(lengths)[:, None]
    scores = 3 * torch.randn(B, T, L, generator=g, dtype=dtype)
    scores = scores.masked_fill(~mask[:, None], -math.inf)
    p = entmax15(scores, dim=-1) if sparse else torch.softmax(scores, -1)
    values = torch.randn(B, L, D, generator=g, dtype=dtype)
    return p, values, mask


def reference_context(p: np.ndarray, values: np.ndarray, length: int, alpha: float, num_basis_mu: int,
                      basis_sigma: list[float], ridge: float, floor: float) -> np.ndarray:
    """One sentence, from the definitions: p (T, n), values (n, D) -> (T, D)."""
    t = np.arange(1, length + 1) / length
    centres = np.linspace(0, 1, num_basis_mu)
    basis = [(b, s) for s in basis_sigma for b in centres]
    psi = lambda x, b, s: math.exp(-0.5 * ((x - b) / s) ** 2) / (s * math.sqrt(2 * math.pi))  # noqa: E731
    F = np.array([[psi(x, b, s) for x in t] for b, s in basis])                      # (N, n)
    G = F.T @ np.linalg.inv(F @ F.T + ridge * np.eye(len(basis)))                     # (n, N)
    out = []
    for row in p:
        mu = row @ t
        var = max(row @ (t - mu) ** 2, floor)
        if alpha == 1.0:
            sd = math.sqrt(var)
            dens, lo, hi = (lambda x: math.exp(-0.5 * ((x - mu) / sd) ** 2) / (sd * math.sqrt(2 * math.pi)),
                            mu - 40 * sd, mu + 40 * sd)
        else:   # truncated parabola with variance var: half-width a = sqrt(5 var), p = 3 (a^2 - s^2) / (4 a^3)
            a = math.sqrt(5 * var)
            dens, lo, hi = (lambda x: 3 * max(a * a - (x - mu) ** 2, 0.0) / (4 * a ** 3)), mu - a, mu + a
        r = np.array([integrate.quad(lambda x: dens(x) * psi(x, b, s), lo, hi, points=[mu], limit=200,
                                     epsabs=1e-13, epsrel=1e-12)[0] for b, s in basis])
        out.append(values.T @ (G @ r))
    return np.stack(out)


@pytest.mark.parametrize("alpha", [1.0, 2.0], ids=["gauss", "parabola"])
def test_matches_per_sentence_reference(alpha: float) -> None:
    lengths = [6, 1, 4, 9]
    p, values, mask = batch(lengths)
    p[2, 1] = 0.0
    p[2, 1, 3] = 1.0                                   # one-hot row: variance floor
    module = ContinuousAttention(alpha=alpha, ridge=0.05, variance_floor=1e-4, **SMALL)
    out = module(p, values, mask)
    assert out.shape == (4, 2, 3) and out.dtype == F64
    for b, n in enumerate(lengths):
        ref = reference_context(p[b, :, :n].numpy(), values[b, :n].numpy(), n, alpha, 4, [0.05, 0.3], 0.05, 1e-4)
        np.testing.assert_allclose(out[b].numpy(), ref, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("alpha", [1.0, 4 / 3, 1.5, 2.0], ids=["gauss", "triweight", "biweight", "parabola"])
def test_gradcheck_whole_module(alpha: float) -> None:
    p, values, mask = batch([5, 3, 4], T=2, D=2, sparse=False)
    module = ContinuousAttention(alpha=alpha, **SMALL)
    p.requires_grad_()
    values.requires_grad_()
    assert torch.autograd.gradcheck(lambda q, v: module(q, v, mask), (p, values), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("alpha", [1.0, 2.0], ids=["gauss", "parabola"])
def test_gradcheck_combined_attention_from_scores(alpha: float) -> None:
    """scores -> entmax15 (exact zeros) -> discrete context + continuous context."""
    lengths = [5, 3, 4]
    mask = torch.arange(5)[None] < torch.tensor(lengths)[:, None]
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 2, 5, generator=g, dtype=F64).requires_grad_()
    values = torch.randn(3, 5, 2, generator=g, dtype=F64).requires_grad_()
    module = ContinuousAttention(alpha=alpha, **SMALL)

    def combined(sc: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = entmax15(sc.masked_fill(~mask[:, None], -math.inf), dim=-1)
        return torch.bmm(p, v) + module(p, v, mask)

    assert torch.autograd.gradcheck(combined, (scores, values), eps=1e-6, atol=1e-5)


def test_paper_defaults_and_yaml_signature() -> None:
    module = ContinuousAttention()
    assert module.num_basis == 30 and module.alpha == 1.0 and module.beta == 0
    basis_mu, basis_sigma = module.basis()
    assert sorted(set(basis_sigma.tolist())) == [0.03, 0.1, 0.3]
    assert torch.allclose(basis_mu[:10], torch.linspace(0, 1, 10, dtype=F64))
    for param in inspect.signature(ContinuousAttention).parameters.values():
        assert isinstance(param.default, (int, float, str, list)), param.name
    assert list(module.parameters()) == [] and module.state_dict() == {}


@pytest.mark.parametrize("kwargs,key", [
    ({"alpha": 1.2}, "alpha"), ({"alpha": "entmax"}, "alpha"), ({"num_basis_mu": 0}, "num_basis_mu"),
    ({"basis_sigma": []}, "basis_sigma"), ({"basis_sigma": [0.1, -1.0]}, "basis_sigma"),
    ({"ridge": -1.0}, "ridge"), ({"ridge": 0}, "ridge"), ({"variance_floor": 0.0}, "variance_floor"),
])
def test_bad_configuration_names_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=rf"^{key}: "):  # the argument's name; the config layer adds the key
        ContinuousAttention(**kwargs)


def test_accepts_yaml_spellings_of_alpha() -> None:
    assert ContinuousAttention(alpha="4/3").beta == 3
    assert ContinuousAttention(alpha=1.3333).beta == 3
    assert ContinuousAttention(alpha=2).beta == 1


def test_padding_is_ignored_and_batching_is_transparent() -> None:
    lengths = [7, 2, 5]
    p, values, mask = batch(lengths, T=3)
    module = ContinuousAttention(alpha=2.0)
    out = module(p, values, mask)
    noisy_p, noisy_values = p.clone(), values.clone()
    noisy_p[~mask[:, None].expand_as(p)] = 0.3           # garbage on padding
    noisy_values[~mask] = 100.0
    assert torch.allclose(module(noisy_p, noisy_values, mask), out, atol=1e-12)
    for b, n in enumerate(lengths):                       # each sentence alone, unpadded
        alone = module(p[b:b + 1, :, :n], values[b:b + 1, :n], mask[b:b + 1, :n])
        assert torch.allclose(alone[0], out[b], atol=1e-12)


def test_single_query_shape_and_empty_sentence() -> None:
    p, values, mask = batch([4, 3], T=1)
    module = ContinuousAttention()
    both = module(p, values, mask)
    single = module(p[:, 0], values, mask)
    assert single.shape == (2, 3) and torch.allclose(single, both[:, 0])
    mask[1] = False
    p[1] = 0.0
    out = module(p[:, 0], values, mask)
    assert torch.isfinite(out).all() and (out[1] == 0).all()


def test_moments_use_own_length_and_floor() -> None:
    module = ContinuousAttention(variance_floor=1e-3)
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    p = torch.tensor([[[0.0, 0.0, 0.5, 0.5]], [[0.0, 1.0, 0.0, 0.0]]], dtype=F64)
    mu, var = module.moments(p, mask)
    assert torch.allclose(mu, torch.tensor([[0.875], [1.0]], dtype=F64))
    assert torch.allclose(var, torch.tensor([[0.125 ** 2], [1e-3]], dtype=F64))


def test_half_precision_is_upcast() -> None:
    p, values, mask = batch([5, 3], dtype=torch.float32)
    module = ContinuousAttention(alpha=2.0)
    out16 = module(p.half(), values.half(), mask)
    assert out16.dtype == torch.half
    ref = module(p.half().float(), values.half().float(), mask)
    assert torch.allclose(out16.float(), ref, rtol=2e-3, atol=2e-3)


def test_value_cache_grows_across_batches_and_survives_deepcopy() -> None:
    module = ContinuousAttention(alpha=1.0, **SMALL)
    small = batch([3, 2])
    module(*small)
    large = batch([40, 37], T=1)
    out = module(*large)
    clone = copy.deepcopy(module)
    assert torch.allclose(clone(*large), out)
    p, values, mask = large
    ref = reference_context(p[1, :, :37].numpy(), values[1, :37].numpy(), 37, 1.0, 4, [0.05, 0.3], 0.01, 1e-6)
    np.testing.assert_allclose(out[1].numpy(), ref, rtol=1e-7, atol=1e-8)


def test_combined_attention_in_a_model(make_model) -> None:
    """The models' global attention adds this context when ``attention.continuous`` is a dict."""
    g = torch.Generator().manual_seed(0)
    src_lengths = torch.tensor([6, 2, 4])
    src = torch.randint(4, 13, (3, 6), generator=g).masked_fill(torch.arange(6)[None] >= src_lengths[:, None], 0)
    tgt_in = torch.randint(4, 11, (3, 4), generator=g)
    tgt_in[:, 0] = 2                                              # BOS
    torch.manual_seed(0)
    plain = make_model(attention={"mapping": "entmax15"})
    torch.manual_seed(0)
    combined = make_model(attention={"mapping": "entmax15", "continuous": {"alpha": 2.0}})
    assert isinstance(combined.decoder.attention.continuous, ContinuousAttention)
    logits_plain, attn_plain = plain(src, src_lengths, tgt_in)
    logits, attn = combined(src, src_lengths, tgt_in)
    assert torch.isfinite(logits).all() and not torch.allclose(logits, logits_plain)
    assert torch.allclose(attn[:, 0], attn_plain[:, 0])        # first step: same query, same discrete attention
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in combined.parameters() if p.grad is not None)


@pytest.mark.parametrize("alpha", [1.0, 4 / 3, 1.5, 2.0], ids=["gauss", "triweight", "biweight", "parabola"])
def test_extreme_attention_is_finite_in_float32(alpha: float) -> None:
    """One-hot rows (variance floor), length-1 sentences, uniform rows; values and gradients finite."""
    lengths = torch.tensor([100, 1, 37, 100])
    mask = torch.arange(100)[None] < lengths[:, None]
    p = torch.zeros(4, 3, 100)
    p[0, 0, 99] = p[0, 1, 0] = p[1, :, 0] = p[3, 2, 50] = 1.0
    p[0, 2, :100] = 1 / 100
    p[2, :, :37] = torch.softmax(torch.randn(3, 37), -1)
    p[3, :2, :100] = entmax15(torch.randn(2, 100) * 10, dim=-1)
    p.requires_grad_()
    values = torch.randn(4, 100, 8, requires_grad=True)
    out = ContinuousAttention(alpha=alpha)(p, values, mask)
    out.square().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(p.grad).all() and torch.isfinite(values.grad).all()
    assert out.abs().max() < 1e3


@pytest.mark.parametrize("alpha", [1.0, 2.0], ids=["gauss", "parabola"])
def test_smooth_memory_is_reproduced(alpha: float) -> None:
    """With h_l = v(t_l) for a smooth v, the context is E_density[v] ~ E_p[v]: the value function
    reproduces constant (-> 1) and linear (-> mu) memories and a sine to 1e-3."""
    L = 40
    t = torch.arange(1, L + 1, dtype=F64) / L
    values = torch.stack([torch.ones(L, dtype=F64), t, torch.sin(3 * t)], -1)[None]
    mask = torch.ones(1, L, dtype=torch.bool)
    module = ContinuousAttention(alpha=alpha, ridge=1e-4)
    for centre in (0.3, 0.5, 0.8):
        p = torch.softmax(-((t - centre) ** 2) / 0.006, -1)[None, None]
        out = module(p, values, mask)[0, 0]
        expected = (p[0, 0, :, None] * values[0]).sum(0)
        assert torch.allclose(out, expected, atol=1e-3), (centre, out, expected)


@pytest.mark.parametrize("alpha", [1.0, 4 / 3, 2.0], ids=["gauss", "triweight", "parabola"])
def test_float32_matches_float64(alpha: float) -> None:
    p, values, mask = batch([30, 12, 25, 1], T=4, D=5)
    module = ContinuousAttention(alpha=alpha)
    p64, v64 = p.clone().requires_grad_(), values.clone().requires_grad_()
    p32, v32 = p.float().requires_grad_(), values.float().requires_grad_()
    out64, out32 = module(p64, v64, mask), module(p32, v32, mask)
    assert out32.dtype == torch.float32
    assert torch.allclose(out32.double(), out64, rtol=1e-4, atol=1e-4 * out64.abs().max().item())
    out64.sum().backward()
    out32.sum().backward()
    assert torch.allclose(p32.grad.double(), p64.grad, rtol=1e-3, atol=1e-3 * p64.grad.abs().max().item())
