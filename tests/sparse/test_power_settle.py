"""The float settling pass of alpha-entmax's long rows (``LONG_SETTLE`` in
``nmt/sparse/_power_threshold.c``, the AVX-512 and the AVX2 functions, each tested where the
processor has it): where the loop's start is meant to lie
within the tolerance of the root (the moments' series; the float Halley step), one pass of float
powers with an error bound decides that the double loop would take no step, and its powers serve
the output. Checked here against independent truths: its powers against float64's within the bound
the C code assumes (``POWER_SETTLE_POW_ERR``); rows of every kind the starts serve (and rows made to
sit near the support's edge or the bound's limit) against the build without the pass
(``NMT_POWER_NO_SETTLE``: the double loop alone), whose threshold must come out bit for bit and
whose outputs within the float powers' error, and against the float64 bisection."""
import ctypes
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.sparse import _native
from tests.sparse.test_power_fine_step import ALPHAS_ABOVE, FLOAT_PASS_BUILDS, fine_step_rows, float_pass_width
from tests.sparse.test_power_series_start import bisection, check_rows, counted_power_probs, strained_rows

SOURCE = Path(_native.__file__).with_name("_power_threshold.c")
U = 2.0 ** -24


def pow_err(e: float) -> float:
    """``POWER_SETTLE_POW_ERR(e)``: the relative error the C code assumes of a settling power, in
    units of 2^-24 (read back from the source below, so the two cannot drift apart)."""
    return 4.0 + 0.5 * e


def test_the_bound_in_the_source_is_the_one_tested():
    text = SOURCE.read_text()
    assert re.search(r"#define POWER_SETTLE_POW_ERR\(e\) \(4\.0 \+ 0\.5 \* \(e\)\)", text)


@pytest.fixture(scope="module", params=FLOAT_PASS_BUILDS)
def settle_pow(native_variant, request):
    """``pow(d (N,) float32, e) -> (N,) float32`` by the diagnostic build's ``nmt_settle_pow_f32``:
    ``SETTLE_POW512`` in the full build, ``SETTLE_POW256`` in the build without the AVX-512
    functions; skips without a compiler or where the processor lacks that width's instructions."""
    if not _native.available():
        pytest.skip("native library not built")
    width = float_pass_width(request.param)
    lib = native_variant("NMT_POWER_COUNTS", request.param)
    if not hasattr(lib, "nmt_settle_pow_f32") or width == 0:
        pytest.skip("no AVX-512 / AVX2 functions here")
    fn = lib.nmt_settle_pow_f32
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p]

    def run(d: np.ndarray, e: float) -> np.ndarray:
        d = np.ascontiguousarray(d, dtype=np.float32)
        pad = (-d.size) % 16
        d = np.concatenate([d, np.ones(pad, np.float32)])
        out = np.empty_like(d)
        assert fn(d.ctypes.data, d.size, e, out.ctypes.data) == width
        return out[: d.size - pad]

    return run


def _hard_arguments(seed: int) -> np.ndarray:
    """float32 d in (0, 1]: log-uniform over 2^-60 .. 1, uniform over (0, 1], the mantissas at and
    next to the tables' sixteen boundaries (1 + i/16) and centres at many exponents, powers of two
    and their neighbours, 1 and the largest float below it."""
    rng = np.random.default_rng(seed)
    parts = [np.exp2(-rng.uniform(0, 60, 200_000)), rng.uniform(0, 1, 100_000)]
    mant = np.concatenate([1 + np.arange(17) / 16, 1 + (2 * np.arange(16) + 1) / 32])
    scale = np.exp2(-np.arange(0, 40, dtype=np.float64))
    edge = (mant[:, None] * scale[None, :]).ravel().astype(np.float32)
    parts += [edge, np.nextafter(edge, np.float32(0)), np.nextafter(edge, np.float32(2))]
    d = np.concatenate([p.astype(np.float32) for p in parts])
    return d[(d > 0) & (d <= 1)]


@pytest.mark.parametrize("e", [0.1, 0.25, 2 / 3, 1.0, 1.2222222222222223, 1 / 0.35 - 1, 2.3333333333333335, 3.0,
                               1 / 0.22 - 1, 5.666666666666667, 7.333333333333333, 8.0])
def test_the_settling_powers_err_within_the_bound_the_c_code_assumes(settle_pow, e):
    """Against float64's d^e (about 1e-16): relative error at most ``POWER_SETTLE_POW_ERR(e)`` units
    of 2^-24 wherever d^e is a normal float32 above the pass's cut (e log2 d >= -126: the pass gives
    0 below it, and within a unit of it either; off (0, 1] nothing is asked), and 0 for d <= 0."""
    d = _hard_arguments(seed=int(e * 1000))
    got = settle_pow(d, e).astype(np.float64)
    want = d.astype(np.float64) ** e
    y = e * np.log2(d.astype(np.float64))
    kept = y >= -125.0
    rel = np.abs(got[kept] / want[kept] - 1.0) / U
    assert rel.max() <= pow_err(e), (e, rel.max(), d[kept][rel.argmax()])
    assert (got[y < -127.0] == 0).all()
    zeros = settle_pow(np.array([0.0, -0.0, -1e-30, -1.0, float("-inf")] * 4, np.float32), e)
    assert (zeros == 0).all()


def test_the_avx2_powers_are_the_avx512_ones_bit_for_bit(native_variant):
    """``SETTLE_POW256`` (the AVX2 functions: exponent and mantissa from the bits, the tables by two
    permutations and a blend, 2^floor(n) built from its bits) computes ``SETTLE_POW512``'s operations:
    the same float for every normal d in (0, 1] and every e tried (0 for d <= 0); where the processor
    has AVX-512, against it."""
    if not _native.available():
        pytest.skip("native library not built")
    if float_pass_width("") != 512:
        pytest.skip("no AVX-512 functions here to compare with")
    runs = []
    for defines in (["NMT_POWER_COUNTS"], ["NMT_POWER_COUNTS", "NMT_NO_AVX512"]):
        fn = native_variant(*defines).nmt_settle_pow_f32
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p]
        runs.append(fn)
    d = np.concatenate([_hard_arguments(seed=7), np.float32([0.0, -0.0, -1e-30, -1.0, 2.0 ** -126])])
    d = np.concatenate([d, np.ones((-d.size) % 16, np.float32)])
    for e in (0.1, 0.25, 2 / 3, 1.0, 1 / 0.35 - 1, 3.0, 5.666666666666667, 8.0):
        out = [np.empty_like(d) for _ in runs]
        widths = [fn(d.ctypes.data, d.size, e, o.ctypes.data) for fn, o in zip(runs, out)]
        assert widths == [512, 256]
        assert np.array_equal(out[0].view(np.int32), out[1].view(np.int32)), e


@pytest.fixture(scope="module", params=FLOAT_PASS_BUILDS)
def builds(native_variant, request):
    """``(lib, without_settling, wide)``: the diagnostic build (counters on) with the AVX-512
    functions, or without them (the AVX2 ones'), the same build without the settling pass
    (``NMT_POWER_NO_SETTLE``: the double loop alone), and whether this processor runs that build's
    float passes (where not, the counts are left unchecked; the outputs still are)."""
    if not _native.available():
        pytest.skip("native library not built")
    return (native_variant("NMT_POWER_COUNTS", request.param),
            native_variant("NMT_POWER_COUNTS", "NMT_POWER_NO_SETTLE", request.param),
            float_pass_width(request.param) > 0)


def _edge_rows(n: int, alphas: torch.Tensor, seed: int) -> torch.Tensor:
    """Broad rows made to strain the bound: normal rows whose threshold's gap k^(-1/q) puts the
    predicted bound near the quarter of the tolerance the pass is taken at (n about 2,000-6,000 at
    alpha 1.3), with a tenth of their entries moved to within 1e-7 .. 1e-5 of the root's level (the
    support's edge inside the float powers' reach) or the whole row in the support by a hair."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(alphas), n, generator=g, dtype=torch.float64) * 0.01
    for i in range(len(alphas)):
        a = float(alphas[i]) - 1
        z = ((x[i] - x[i].max()) * a)[None]
        t = float(bisection(z, torch.tensor([1 / a], dtype=torch.float64))[0])
        level = float(x[i].max()) + t / a
        pick = torch.randperm(n, generator=g)[: n // 10]
        x[i, pick] = level + (10.0 ** -(5 + i % 3)) * (1 if i % 2 else -1)
    return x.float()


def _against_the_double_loop(lib, without_settling, x: torch.Tensor, alphas: torch.Tensor) -> tuple:
    """Rows ``x`` at ``alphas`` on the diagnostic build ``lib`` and on the build without the settling
    pass: the same threshold bit for bit, the same support, r equal, outputs within the float powers'
    error (40 units of 2^-24 relative, 1e-12 absolute), and the float64 bisection's (p to 1e-5
    relative); returns ``(p, r, tau, counts, counts without the pass)``."""
    found, counts = counted_power_probs(lib, x, alphas - 1)
    want, counts0 = counted_power_probs(without_settling, x, alphas - 1)
    (p, r, tau), (p0, r0, tau0) = found[:3], want[:3]
    assert torch.equal(tau, tau0), (tau - tau0).abs().max()
    assert torch.equal(p > 0, p0 > 0)
    assert torch.allclose(p.double(), p0.double(), rtol=40 * U, atol=1e-12), (p - p0).abs().max()
    assert torch.equal(r, r0)
    check_rows(x, alphas, p, r, tau, p_rtol=1e-5)
    return p, r, tau, counts, counts0


CASES = [("strained", 8000), ("strained", 32003), ("fine", 8000), ("fine", 32003), ("fine_above", 8000),
         ("fine_above", 32003), ("edge", 2500),
         ("edge", 4000), ("edge", 6000), ("normal", 8000), ("normal", 32000)]


@pytest.mark.parametrize("kind,n", CASES)
def test_settled_rows_keep_the_double_loops_threshold_bit_for_bit(builds, kind, n):
    """Rows of every kind the starts serve, at alphas 1.12-1.6 (and 1.55-1.8 on the misleading rows of
    ``fine_step_rows``: Newton's float step where q < 2): the build with the settling pass and
    the build without it (the double loop alone) give the same threshold bit for bit (a settled row
    is one where the double pass would have taken no step) and the same support; outputs within the
    float powers' error (40 units of 2^-24 relative, 1e-12 absolute); both against the float64
    bisection. Where the processor has AVX-512, the pass settles rows of every kind here (and the
    rows it tries and does not settle are few)."""
    lib, without_settling, wide = builds
    alphas = torch.tensor([1.12, 1.2, 1.25, 1.3, 1.35, 1.4, 1.45, 1.5, 1.3, 1.6] * 2, dtype=torch.float64)
    if kind == "strained":
        x = strained_rows(n, alphas, seed=n + 1)
    elif kind == "fine":
        x = fine_step_rows(n, alphas, seed=n + 2)
    elif kind == "fine_above":  # (q < 2: Newton's float step)
        alphas = torch.tensor(ALPHAS_ABOVE * 2, dtype=torch.float64)
        x = fine_step_rows(n, alphas, seed=n + 4)
    elif kind == "edge":
        alphas = torch.full((12,), 1.3, dtype=torch.float64)
        alphas[6:] = torch.tensor([1.25, 1.35, 1.4, 1.45, 1.28, 1.32], dtype=torch.float64)
        x = _edge_rows(n, alphas, seed=n + 3)
    else:
        g = torch.Generator().manual_seed(n)
        x = torch.randn(len(alphas), n, generator=g) * torch.tensor([0.01, 0.03, 0.1, 0.3] * 5)[:, None]
    counts, counts0 = _against_the_double_loop(lib, without_settling, x, alphas)[3:]
    assert counts0[16] == 0
    if wide:
        assert counts[17] >= (1 if kind == "fine_above" else 2), (kind, n, counts[16], counts[17])
        assert counts[16] - counts[17] <= 0.25 * counts[16] + 1, (counts[16], counts[17])
        assert counts[5] + counts[17] <= counts0[5], (counts[5], counts[17], counts0[5])


def _gate_admits(alpha: float, k: int) -> bool:
    """``POWER_SETTLE_PAYS`` at float32's tolerance (|tau| <= 1): the bound's units (11 + 1.5 e,
    ``POWER_SETTLE_ERR`` with chunks of 4) times 2^-24 times the gap k^(-1/q) over q, at most 0.4
    of 2^-23."""
    q = 1 / (alpha - 1)
    e = q - 1
    return (11 + 1.5 * e) * 2.0 ** -24 * k ** (-1 / q) / q <= 0.4 * 2.0 ** -23


def test_normal_rows_settle_where_the_gate_admits_them(builds):
    """Normal rows of deviation 0.01, 0.03 and 0.1 (every entry, or nearly, in the support: the
    series' and the float step's starts), alphas 1.12-1.5, 1,000 to 32,000 scores: the threshold of
    the double loop alone bit for bit on every row; where the processor has AVX-512, the rows the
    gate admits take the pass (all of them at the series' start), and it settles at least 95% of
    the rows it tries (the bound is not too wide to serve), none where the gate refuses them."""
    lib, without_settling, wide = builds
    tried = settled = 0
    for alpha in (1.12, 1.15, 1.2, 1.25, 1.3, 1.45, 1.5):
        for n in (1000, 2000, 8000, 32000):
            g = torch.Generator().manual_seed(n)
            x = torch.randn(8, n, generator=g) * torch.tensor([0.01, 0.03, 0.1, 0.01] * 2)[:, None]
            alphas = torch.full((8,), alpha, dtype=torch.float64)
            found, counts = counted_power_probs(lib, x, alphas - 1)
            want, counts0 = counted_power_probs(without_settling, x, alphas - 1)
            assert torch.equal(found[2], want[2]), (alpha, n)
            assert torch.allclose(found[0].double(), want[0].double(), rtol=40 * U, atol=1e-12), (alpha, n)
            if not wide:
                continue
            tried, settled = tried + counts[16], settled + counts[17]
            if not _gate_admits(alpha, n):
                assert counts[16] == 0, (alpha, n, counts[16])
            elif alpha <= 1.3:  # (rows wholly in the support start from the series at 0.01 and 0.03)
                assert counts[16] >= 6, (alpha, n, counts[16])
    if wide:
        assert tried >= 100 and settled >= 0.95 * tried, (tried, settled)


def test_rows_after_coarse_steps_take_a_float_step_and_settle(builds):
    """Rows whose bound leaves out part of the row (normal scores, alpha 1.3 at deviation 0.3, 1.45
    at 0.1, 1.25 at 0.3 with 32,000: a third to a half of the candidates in the support) take coarse
    float steps from the bound; after them (a lower bound some 1e-4 off the root) one float Halley
    step and the settling pass, where two double passes took a step and settled: the same threshold
    bit for bit as the build without the settling pass (whose double loop starts from the same float
    step), the same support, outputs within the float powers' error, and the float64 bisection's.
    Where the processor has AVX-512, every row takes coarse steps, then one float step, and settles
    (no double pass); alpha 1.7 (q < 2: d^(q - 2) unbounded at the support's edge) takes none."""
    lib, without_settling, wide = builds
    g = torch.Generator().manual_seed(29)
    for n, rows, alpha, spread in ((8000, 8, 1.3, 0.3), (8000, 8, 1.45, 0.1), (32000, 3, 1.25, 0.3),
                                   (32000, 3, 1.3, 0.3), (8000, 8, 1.7, 0.03)):
        x = torch.randn(rows, n, generator=g) * spread
        alphas = torch.full((rows,), alpha, dtype=torch.float64)
        p, r, tau, counts, counts0 = _against_the_double_loop(lib, without_settling, x, alphas)
        assert counts[7] < 0.6 * rows * n, (alpha, counts[7])  # (a cut support)
        if not wide:
            continue
        assert counts[3] >= rows, (alpha, counts[3])  # coarse passes
        if alpha > 1.5:
            assert counts[15] == counts[16] == 0, (alpha, counts[15], counts[16])
        else:
            assert counts[15] == rows and counts[16] == counts[17] == rows and counts[5] == 0, (alpha, counts)
            assert counts0[15] == rows and counts0[5] == rows, (alpha, counts0)  # one double pass


def test_rows_of_alpha_above_1_5_take_newtons_float_step_and_settle(builds):
    """Alphas 1.55 and 1.6 (q < 2: d^(q - 2) unbounded at the support's edge, so the float step is
    Newton's alone) on normal rows of deviation 0.01 (8,000 scores, 60-80% in the support: the normal
    model's start): one float step, then the settling pass settles every row (no double pass), the
    threshold bit for bit as the build without the pass (whose double loop starts from the same
    step), the same support, the float64 bisection's outputs. At deviation 0.03 with 32,000 scores
    (a quarter in the support or less: from the mean bound, coarse steps) the candidates below the
    mean bound are dropped before the first pass: fewer than 3 for each entry of the support (4.9
    and 3.9 before at 1.55 and 1.6), the same threshold and the bisection's outputs."""
    lib, without_settling, wide = builds
    g = torch.Generator().manual_seed(37)
    for n, rows, spread in ((8000, 8, 0.01), (32000, 3, 0.03)):
        for alpha in (1.55, 1.6):
            x = torch.randn(rows, n, generator=g) * spread
            alphas = torch.full((rows,), alpha, dtype=torch.float64)
            p, r, tau, counts, counts0 = _against_the_double_loop(lib, without_settling, x, alphas)
            if not wide:
                continue
            if spread == 0.01:
                assert counts[15] == counts[16] == counts[17] == rows and counts[5] == 0, (alpha, counts)
            else:
                assert counts[3] >= rows and counts[2] < 3 * counts[7], (alpha, counts[2], counts[7])


def _near_root_entry(x: torch.Tensor, alpha: float, log2_rq: float) -> float:
    """Moves the lowest entry of the float64 row ``x`` (in place) to the float32 just above the level
    where the rest's float64 root puts r^q = d^q at 2^log2_rq (the entry's own term too small to
    move the root; the row rounded to float32 first); returns the log2 of its d^q at the root then
    (checked: within 6 of the target, below -125)."""
    a = alpha - 1
    j = int(x.argmin())
    x.copy_(x.float().double())
    rest = x.clone()
    rest[j] = -float("inf")
    top = float(rest.max())
    t = float(bisection(((rest - top) * a)[None], torch.tensor([1 / a], dtype=torch.float64))[0])
    target = top + (t + 2.0 ** (log2_rq * a)) / a
    x[j] = float(torch.tensor(target, dtype=torch.float32))
    d = (float(x[j]) - top) * a - t
    assert d > 0 and log2_rq - 6.0 < math.log2(d) / a < -125.0, (d, log2_rq)
    return math.log2(d) / a


@pytest.mark.parametrize("alpha,n,log2_rq", [(1.2, 8000, -131.0), (1.12, 32000, -145.0)])
def test_rows_whose_smallest_outputs_leave_the_float_range_are_not_settled(builds, alpha, n, log2_rq):
    """A broad row (every entry in the support: the series' start, then the settling pass) whose
    lowest entry sits just above the root, its r^q = d^q near 2^-131 (alpha 1.2: d^(q - 1) a normal
    float, the product w d a float32 subnormal) or 2^-145 (alpha 1.12: d^(q - 1) itself below
    2^-126, where the float powers flush to 0): the pass leaves the row to the double loop (tried,
    not settled), whose output keeps that entry in the support as the float64 root has it (p > 0
    where r^q / sum r^q rounds to a float32 above 0); the threshold bit for bit as the build without
    the pass. The same row without that entry settles."""
    lib, without_settling, wide = builds
    g = torch.Generator().manual_seed(n)
    x = torch.randn(2, n, generator=g, dtype=torch.float64) * 0.01
    got = _near_root_entry(x[0], alpha, log2_rq)
    x = x.float()
    alphas = torch.full((2,), alpha, dtype=torch.float64)
    p, r, tau, counts, counts0 = _against_the_double_loop(lib, without_settling, x, alphas)
    j = int(x[0].argmin())
    assert got > -149.0 and bool(p[0, j] > 0), (got, float(p[0, j]))  # (a float32 subnormal)
    if wide:
        assert counts[16] == 2 and counts[17] == 1, (counts[16], counts[17])
