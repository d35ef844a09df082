"""The native dropout mask (``nmt/models/_dropout_mask.c``): the keep bits equal an independent
SplitMix64 written here in Python, on every vector path and any split over threads; the masks pass
statistical checks (rate, neighbours, the words of one output, 8-entry patterns, seeds); the
backward replays the forward's mask; torch's generator governs the seeds."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nmt.models import native_dropout
from nmt.models.dropout import Dropout
from nmt.sparse import _native

needs_library = pytest.mark.skipif(native_dropout.library() is None, reason="native dropout library not built")

MASK64 = (1 << 64) - 1


def splitmix_words(seed: int, n: int) -> np.ndarray:
    """The 32-bit words u(0 .. n) of the mask of ``seed``: SplitMix64's output function at
    ``seed + k * 0x9E3779B97F4A7C15`` for pair k, its low word for entry 2k, its high word for
    2k + 1 (Steele, Lea & Flood 2014), in Python integers: the independent truth."""
    words = []
    for k in range((n + 1) // 2):
        z = (seed + k * 0x9E3779B97F4A7C15) & MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        z ^= z >> 31
        words += [z & 0xFFFFFFFF, z >> 32]
    return np.array(words[:n], dtype=np.uint64)


@pytest.fixture(scope="module", params=["default", "NMT_NO_AVX512", "NMT_NO_AVX2", "NMT_ROWS_ONLY"])
def library_path(request, tmp_path_factory):
    """The library as built for this machine, then without its 512-bit functions, without its 256-
    and 512-bit ones and without vectors (pair by pair)."""
    if native_dropout.library() is None:
        pytest.skip("native dropout library not built")
    if request.param == "default":
        return native_dropout.library()
    return native_dropout.load(native_dropout.build(tmp_path_factory.mktemp(request.param), defines=[request.param]))


@pytest.mark.parametrize("n", [1, 2, 3, 15, 16, 17, 31, 1001])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_keep_bits_equal_splitmix64_on_every_path(library_path, monkeypatch, n, p):
    monkeypatch.setitem(native_dropout._state, "lib", library_path)
    seed = 0xDEADBEEF12345678 + n * 0x1000000000000000  # above 2^63 for most n: the sign bit
    x = torch.randn(n)
    out = native_dropout.masked(x, native_dropout.seed_tensor(seed), p, 2.0)
    keep = splitmix_words(seed, n) >= native_dropout.threshold(p)
    assert torch.equal(out != 0, torch.from_numpy(keep) & (x != 0))
    assert torch.equal(out[torch.from_numpy(keep)], x[torch.from_numpy(keep)] * 2.0)


@needs_library
def test_threads_and_in_place_give_the_same_bits(monkeypatch):
    x = torch.randn(10_007)
    seed = native_dropout.seed_tensor(42)
    one = native_dropout.masked(x, seed, 0.3, 1 / 0.7)
    monkeypatch.setattr(native_dropout, "THREADS_MIN_NUMEL", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = native_dropout.masked(x, seed, 0.3, 1 / 0.7)
        same = x.clone()
        native_dropout.masked(same, seed, 0.3, 1 / 0.7, out=same)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two) and torch.equal(one, same)


@needs_library
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_masks_pass_statistical_checks(p):
    """Fixed seeds (no flakiness): the keep rate within five standard deviations; pairs of
    neighbours (the two words of one output, and across outputs), entries 8 apart (the lanes) and
    two seeds' masks as often both kept as independence says; at p = 0.5 the 256 patterns of eight
    consecutive entries uniform by a chi-square test."""
    n = 1 << 20
    keep = native_dropout.masked(torch.ones(n), native_dropout.seed_tensor(7), p, 1.0) != 0
    rate, q = keep.double().mean().item(), 1 - p
    assert abs(rate - q) < 5 * math.sqrt(p * q / n)
    k = keep.double()
    for a, b in ((k[0::2], k[1::2]), (k[1:-1:2], k[2::2]), (k[:-8], k[8:]),
                 (k, (native_dropout.masked(torch.ones(n), native_dropout.seed_tensor(8), p, 1.0) != 0).double())):
        both = (a * b).mean().item()
        assert abs(both - q * q) < 5 * math.sqrt(q * q * (1 - q * q) / a.numel()), both
    if p == 0.5:
        bits = keep.view(-1, 8).long() * (2 ** torch.arange(8))
        counts = torch.bincount(bits.sum(dim=1), minlength=256).double()
        expected = counts.sum() / 256
        chi2 = (((counts - expected) ** 2) / expected).sum().item()
        assert chi2 < 255 + 6 * math.sqrt(2 * 255)  # 255 degrees of freedom: mean 255, sd 22.6


@needs_library
def test_backward_replays_the_mask_and_torch_seeds_it():
    p = 0.25
    drop = Dropout(p).train()
    x = torch.randn(300, 70, requires_grad=True)
    torch.manual_seed(3)
    y = drop(x)
    g = torch.randn(300, 70)
    y.backward(g)
    kept = y != 0
    assert torch.equal(x.grad, torch.where(kept, g * (1 / (1 - p)), 0.0))
    assert torch.equal(y, torch.where(kept, x * (1 / (1 - p)), 0.0))
    torch.manual_seed(3)
    assert torch.equal(drop(x), y)  # torch's generator sets the seed
    state = torch.get_rng_state()
    first = drop(x)
    torch.set_rng_state(state)  # a checkpoint's RNG state: the same next mask
    assert torch.equal(drop(x), first) and not torch.equal(first, y)
    with torch.random.fork_rng():
        drop(x)
    assert not torch.equal(drop(x), first)  # fork_rng left the outer stream where it was


@needs_library
def test_dropped_entries_are_zero_and_other_inputs_take_torch():
    x = torch.full((4, 1000), float("nan"))
    out = native_dropout.masked(x, native_dropout.seed_tensor(-5), 0.5, 2.0)
    assert bool((out == 0).any()) and bool(out[out == out].eq(0).all())
    assert native_dropout.dropout(torch.randn(3, 3).double(), 0.5) is None
    assert native_dropout.dropout(torch.randn(3, 3, dtype=torch.bfloat16), 0.5) is None
    assert native_dropout.dropout(torch.randn(3, 3), 0.5) is not None
    assert native_dropout.threshold(0.5) == 2 ** 31 and native_dropout.threshold(1e-12) == 0
    assert _native.enabled() or native_dropout.library() is None


@needs_library
def test_no_host_read_forward_or_backward():
    """The seed stays a tensor (the C code reads it): no synchronising tensor method is called."""
    from nmt.utils.sync_audit import SyncAudit

    drop = Dropout(0.3).train()
    x = torch.randn(64, 300, requires_grad=True)
    with SyncAudit() as audit:
        drop(x).sum().backward()
    assert audit.total == 0, audit.report()


@needs_library
def test_double_backward_goes_through_the_same_mask():
    """The op is linear in x for its seed: the gradient of a function of the gradient (a gradient
    penalty) flows through the replayed mask, as through ``x * mask``."""
    drop = Dropout(0.4).train()
    x = torch.randn(50, 40, requires_grad=True)
    w = torch.randn(50, 40, requires_grad=True)
    y = drop(x)
    kept = (y != 0).float() / 0.6
    (gx,) = torch.autograd.grad((y * w).sum(), x, create_graph=True)
    assert torch.allclose(gx, w * kept)
    (gw,) = torch.autograd.grad((gx ** 2).sum(), w)
    assert torch.allclose(gw, 2 * w * kept * kept)
