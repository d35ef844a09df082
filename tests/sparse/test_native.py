"""The native sorted threshold (``nmt/sparse/_sorted_threshold.c`` through ``nmt.sparse._native``):
the same bits as the NumPy solve (itself checked against the torch path and by enumeration in
test_sparsemax.py) on every kind of row and layout; the build (atomic, cached,
the umask's file mode) and the fallback where no library can be had."""
from __future__ import annotations

import os
import stat

import pytest
import torch

from nmt.sparse import _native
from nmt.sparse._threshold import _numpy_sorted_shifted_threshold, prefer_sort, sorted_shifted_threshold

needs_library = pytest.mark.skipif(_native.library() is None, reason="no C compiler: the NumPy path serves")


def _rows(n_rows: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Scores of every kind: broad, peaked and near-uniform rows, ties, large offsets, tiny
    differences, -inf entries, rows of only -inf, NaN, +inf, only NaN, NaN with -inf."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.05, 0.3, 1.0, 4.0, 30.0]).repeat(n_rows // 5 + 1)[:n_rows, None]
    x = (torch.randn(n_rows, n, generator=g, dtype=torch.float64) * scale).to(dtype)
    x[0, 0] = float("nan")
    x[1] = float("-inf")
    x[2, n // 2] = float("inf")
    x[3] = float("nan")
    x[4] = float("-inf")
    x[4, -1] = float("nan")
    if n > 3:
        x[5, ::2] = x[5, 0]                      # ties at the top
        x[6] = x[6] * 1e-3 + 1e4                 # a large offset
        x[7, 1:] = float("-inf")                 # one finite entry
        x[8] = x[8, 0]                           # all equal
        x[9] = x[9] * 1e-30                      # differences far below one ulp of the bound
        x[10, : n // 2] = float("-inf")
    return x


def _assert_same_bits(got, want):
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.isnan(), b.isnan())
        assert torch.equal(a.nan_to_num(0.0, 1e300, -1e300), b.nan_to_num(0.0, 1e300, -1e300))
        assert torch.equal(torch.signbit(a) & ~a.isnan(), torch.signbit(b) & ~b.isnan())  # -0.0 too


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("q,scale", [(1.0, 1.0), (2.0, 0.5), (2.0, 0.3), (1.0, 2.0)])
@pytest.mark.parametrize("n", [1, 2, 7, 16, 50, 300])
def test_native_equals_the_numpy_solve_bit_for_bit(n, q, scale, dtype):
    x = _rows(40, n, dtype, seed=n)
    got = _native.native_sorted_shifted_threshold(x, q, scale)
    want = tuple(torch.from_numpy(a) for a in _numpy_sorted_shifted_threshold(x.numpy(), q, scale))
    _assert_same_bits(got, want)


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("q,scale", [(1.0, 1.0), (2.0, 0.5)])
def test_rows_split_over_threads_give_the_same_bits(monkeypatch, dtype, q, scale):
    """A large batch of attention rows split over two threads (each with its scratch, rows split
    inside vector groups too: 203 rows) solves to the bits of one thread."""
    x = _rows(203, 50, dtype, seed=3)
    one = _native.native_sorted_shifted_threshold(x, q, scale)
    monkeypatch.setattr(_native, "NEWTON_SPLIT_MIN_NUMEL", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert _native._threads(x.numel()) == 2
        two = _native.native_sorted_shifted_threshold(x, q, scale)
    finally:
        torch.set_num_threads(threads)
    _assert_same_bits(two, one)


@pytest.fixture(scope="module")
def rows_only_library(native_variant):
    """The library built without its vector path (every row solved by itself)."""
    if _native._compiler() is None:
        pytest.skip("no C compiler")
    return native_variant("NMT_ROWS_ONLY")


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 3, 8, 16, 20, 33, 50, 64, 65, 130])
def test_vector_groups_equal_the_rows_and_numpy_bit_for_bit(n, dtype, native_build, rows_only_library):
    """Rows side by side (groups of 16 / 8 / 4 in the vector paths of each build) against each row
    by itself and the NumPy solve: special rows scattered among the groups (a group holding one is
    solved in smaller groups, then row by row), remainders of every size, broad rows whose
    candidates overflow the network (n > 64)."""
    x = _rows(203, n, dtype, seed=100 + n)
    x = x[torch.randperm(203, generator=torch.Generator().manual_seed(n))]
    for q, scale in [(1.0, 1.0), (2.0, 0.5), (2.0, 0.3), (1.0, 2.0)]:
        got = _native.solve(native_build, x, q, scale)
        rows = _native.solve(rows_only_library, x, q, scale)
        want = tuple(torch.from_numpy(a) for a in _numpy_sorted_shifted_threshold(x.numpy(), q, scale))
        _assert_same_bits(got, want)
        _assert_same_bits(rows, want)


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_zero_maximum_keeps_the_sign_of_the_rows_first_zero(dtype, native_build, rows_only_library):
    """Rows whose maximum is 0 held as both -0.0 and 0.0, in every order and position: the vector
    groups (four running maxima) return the first zero's sign, as the row-by-row solve does."""
    n = 16
    x = torch.full((64, n), -1.0, dtype=dtype) - torch.rand(64, n, generator=torch.Generator().manual_seed(0),
                                                             dtype=dtype)
    for r in range(64):
        i, j = r % n, (r * 7 + 3) % n
        if i == j:
            j = (j + 1) % n
        x[r, i], x[r, j] = (-0.0, 0.0) if r % 2 else (0.0, -0.0)
    for q, scale in [(1.0, 1.0), (2.0, 0.5)]:
        got = _native.solve(native_build, x, q, scale)
        rows = _native.solve(rows_only_library, x, q, scale)
        _assert_same_bits(got, rows)
        first = torch.stack([x[r, int((x[r] == 0).nonzero()[0])] for r in range(64)])
        assert torch.equal(torch.signbit(got[1][:, 0]), torch.signbit(first))


@needs_library
def test_strided_input_is_read_through_a_contiguous_copy():
    x = _rows(103, 24, torch.float32, seed=3)
    for z in (x.t().contiguous().t(), x[:, ::2]):
        got = _native.native_sorted_shifted_threshold(z, 2.0, 0.5)
        want = tuple(torch.from_numpy(a) for a in _numpy_sorted_shifted_threshold(z.numpy(), 2.0, 0.5))
        _assert_same_bits(got, want)


@needs_library
def test_sorted_shifted_threshold_takes_the_native_path(monkeypatch):
    """The front door hands eligible CPU inputs to the native loop, and the mapping's output equals
    the torch path's support (its own bit-level test is above)."""
    calls = []
    real = _native.native_sorted_shifted_threshold

    def counting(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr("nmt.sparse._threshold.native_sorted_shifted_threshold", counting)
    x = torch.randn(320, 50)  # above the NumPy solve's size: NumPy sort + torch finish without it
    tau, zmax = sorted_shifted_threshold(x, 2.0, 0.5)
    assert calls == [(320, 50)]
    sorted_shifted_threshold(torch.randn(3840, 16), 2.0, 0.5)  # rows up to 64 entries: any size
    assert calls == [(320, 50), (3840, 16)]
    sorted_shifted_threshold(torch.randn(200, 100), 2.0, 0.5)  # longer rows above 16,384 entries
    assert len(calls) == 2
    assert prefer_sort(20480, 20) and prefer_sort(5120, 32)  # the native sort beats pruned Newton
    assert prefer_sort(4096, 50) and prefer_sort(5120, 64)  # up to the native solve's rows of any size
    assert not prefer_sort(5120, 65)
    tau_t, zmax_t = sorted_shifted_threshold(x, 2.0, 0.5, host=False)
    assert torch.equal(zmax, zmax_t)
    assert torch.equal(0.5 * (x - zmax) > tau, 0.5 * (x - zmax) > tau_t)
    torch.testing.assert_close(tau, tau_t, rtol=0, atol=4e-7)


def test_disabled_or_unbuildable_means_the_numpy_path(monkeypatch):
    """``NMT_NATIVE=0``, or no compiler: no library (decided once, logged once at INFO), and the
    thresholds still come (from NumPy)."""
    x = torch.randn(64, 20)
    want = sorted_shifted_threshold(x, 1.0, 1.0, host=False)
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setenv("NMT_NATIVE", "0")
    assert _native.library() is None and _native.native_sorted_shifted_threshold(x, 1.0, 1.0) is None
    assert prefer_sort(1000, 16) and not prefer_sort(20480, 20)  # NumPy's sort: not at this size
    got = sorted_shifted_threshold(x, 1.0, 1.0)
    assert torch.equal(got[1], want[1]) and torch.equal(x - got[1] > got[0], x - want[1] > want[0])

    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.delenv("NMT_NATIVE")
    monkeypatch.setattr(_native, "_compiler", lambda: None)
    messages = []
    monkeypatch.setattr(_native.logger, "info", lambda msg, *args: messages.append(msg % args))
    assert _native.library() is None
    assert _native.library() is None
    assert len(messages) == 1 and "no C compiler" in messages[0]
    assert sorted_shifted_threshold(x, 1.0, 1.0)[1].shape == (64, 1)


@pytest.mark.skipif(_native._compiler() is None, reason="no C compiler")
def test_build_is_atomic_cached_and_follows_the_umask(tmp_path, monkeypatch):
    old = os.umask(0o027)
    try:
        path = _native.build(tmp_path / "cache")
    finally:
        os.umask(old)
    assert path.is_file() and path.parent == tmp_path / "cache"
    assert stat.S_IMODE(path.stat().st_mode) & 0o777 == 0o750  # rwx for the owner, r-x for the group
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left
    mtime = path.stat().st_mtime_ns
    assert _native.build(tmp_path / "cache") == path and path.stat().st_mtime_ns == mtime  # cached
    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert _native.cache_dir() == tmp_path / "elsewhere"
    lib = __import__("ctypes").CDLL(str(path))  # loads, exports both entry points
    assert lib.nmt_sorted_threshold_f32 and lib.nmt_sorted_threshold_f64


def test_a_failing_compiler_leaves_nothing_behind(tmp_path, monkeypatch):
    """A compiler that fails: the error propagates from build() (library() logs it and serves
    None), and no partial file stays in the cache directory."""
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'cc: broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(_native, "_compiler", lambda: str(fake))
    with pytest.raises(Exception):
        _native.build(tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "cache"))
    assert _native.library() is None


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 7, 16, 50, 130])
def test_native_mapping_equals_the_torch_forward_bit_for_bit(n, dtype):
    """``sorted_probs``: sparsemax ``[(x - zmax) - tau]_+`` and 1.5-entmax ``r = [(x/2 - zmax/2) - tau]_+``,
    ``p = r^2``, the operations of SparsemaxFunction / Entmax15Function's torch forward on the native
    threshold: the same values, NaN rows NaN, rows without a finite entry zero."""
    x = _rows(43, n, dtype, seed=7 * n)
    for q, scale in [(1.0, 1.0), (2.0, 0.5)]:
        tau, zmax = _native.native_sorted_shifted_threshold(x, q, scale)
        p, r = _native.sorted_probs(x, q, root=True)
        if q == 1.0:
            want_p, want_r = torch.sub(x, zmax).sub_(tau).clamp_(min=0), None
        else:
            want_r = torch.add(-0.5 * zmax, x, alpha=0.5).sub_(tau).clamp_(min=0)
            want_p = want_r * want_r
        for got, want in ((p, want_p), (r, want_r)):
            if want is None:
                assert got is None
                continue
            assert got.dtype == dtype and got.shape == x.shape
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))
        assert _native.sorted_probs(x, q, root=False)[1] is None


@needs_library
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-13)])
def test_native_backward_equals_the_torch_backward(dtype, tol):
    """``support_backward``: ``J^T g`` of 1.5-entmax (from ``r = sqrt(p)``) and sparsemax (from ``p``)
    equal the torch backward passes (sums in another order: to rounding), NaN rows NaN, rows
    without support zero (sparsemax: NaN rows too, as torch's ``sign`` of NaN is 0)."""
    from nmt.sparse.entmax import _entmax_backward
    from nmt.sparse.sparsemax import sparsemax_backward
    x = _rows(61, 23, dtype, seed=5)
    g = torch.randn(61, 23, dtype=dtype, generator=torch.Generator().manual_seed(6))
    p15, r = _native.sorted_probs(x, 2.0, root=True)
    p2, _ = _native.sorted_probs(x, 1.0, root=False)
    for got, want in ((_native.support_backward(r, g, indicator=False), _entmax_backward(r, g)),
                      (_native.support_backward(p2, g, indicator=True), sparsemax_backward(p2, g))):
        assert torch.equal(got.isnan(), want.isnan())
        torch.testing.assert_close(got.nan_to_num(0.0), want.nan_to_num(0.0), rtol=tol, atol=tol)
        assert torch.equal(got[1], torch.zeros(23, dtype=dtype))  # a row of only -inf


@needs_library
def test_small_mappings_take_one_native_call_each_way(monkeypatch):
    """Sparsemax and 1.5-entmax of small CPU inputs: one native call forward (threshold and output),
    one backward; their gradients pass gradcheck (float64, finite differences); larger inputs keep
    the torch operations around the native threshold, and their backward is the native pass for
    float32 rows (vectors, two threads), torch's for float64 ones."""
    from nmt.sparse import entmax15, sparsemax
    import sys
    calls = []

    def counting(name, real):
        def wrapped(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(sys.modules["nmt.sparse._threshold"], "sorted_probs",
                        counting("sorted_probs", _native.sorted_probs))
    for module in ("nmt.sparse.entmax", "nmt.sparse.sparsemax"):
        monkeypatch.setattr(sys.modules[module], "support_backward",
                            counting("support_backward", _native.support_backward))
    x = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    for f in (entmax15, sparsemax):
        calls.clear()
        assert torch.autograd.gradcheck(lambda v: f(v, dim=-1), (x,))
        assert "sorted_probs" in calls and "support_backward" in calls
    calls.clear()
    entmax15(torch.randn(400, 50, requires_grad=True)).sum().backward()  # above 16,384 entries
    assert calls == ["support_backward"]
    calls.clear()
    entmax15(torch.randn(400, 50, dtype=torch.float64, requires_grad=True)).sum().backward()
    assert calls == []


def test_a_library_missing_an_entry_point_means_the_numpy_path(monkeypatch):
    """A loaded library without one of the entry points (ctypes: AttributeError) is refused like a
    failed build: no library, and the thresholds still come."""
    def missing(path):
        raise AttributeError("undefined symbol: nmt_sorted_threshold_f32_probs")

    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setattr(_native, "load", missing)
    assert _native.library() is None and not _native.available()
    assert sorted_shifted_threshold(torch.randn(8, 5), 1.0, 1.0)[1].shape == (8, 1)
