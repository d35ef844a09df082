"""A search step's native reading of its log-probabilities (``nmt/sparse/_step_candidates.c``
through ``nmt.sparse._native.step_candidates``): support statistics and the best candidates, equal
to the torch passes they replace in the search step, on every vector path (512-bit AVX-512 and
256-bit AVX2 where the processor has them, 128-bit, none), on one thread and split over several."""
import pytest
import torch

from nmt.sparse import _native

needs_library = pytest.mark.skipif(not _native.available(), reason="native library not built")
NEG_INF = float("-inf")


def reference(lp: torch.Tensor, offsets: torch.Tensor, slots: int, width: int):
    """The torch passes (independent of the C code): a float count of the finite entries, the row
    maximum's NaN / +inf test, and the candidates with nan_to_num, ordered by a stable descending
    sort (equal values in index order)."""
    support = torch.nansum(torch.mul(lp, 0).add_(1), dim=-1).to(torch.int32)
    row_max = lp.amax(dim=-1)
    unknown = row_max.isnan() | (row_max == float("inf"))
    cand = torch.add(offsets[:, None], lp).nan_to_num_(nan=NEG_INF, posinf=NEG_INF, neginf=NEG_INF)
    cand = cand.reshape(lp.shape[0] // slots, -1)
    values, index = torch.sort(cand, dim=1, descending=True, stable=True)
    return support, unknown, values[:, :width], index[:, :width]


def special_rows(groups: int, slots: int, v: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(groups * slots, v, generator=g, dtype=dtype) * 4 - 3
    offsets = torch.randn(groups * slots, generator=g, dtype=dtype) - 5
    lp[:, ::5] = NEG_INF  # zeros of the mapping
    lp[0, v // 2] = float("nan")
    lp[-1, 0] = float("inf")
    lp[(1 % lp.shape[0]), :] = NEG_INF  # an all-zero row
    if lp.shape[0] > 2:
        offsets[2] = NEG_INF  # a dead slot (its +inf entries would give NaN)
        lp[2, 1] = float("inf")
    if lp.shape[0] > 3:
        lp[3, 3] = float("-inf")
        offsets[3] = -1e38 if dtype == torch.float32 else -1e307  # sums that overflow to -inf
        lp[3, 4] = -1e38 if dtype == torch.float32 else -1e307
    if lp.shape[0] > 4 and v > 40:  # equal candidates, late in the row: ties by index
        lp[4, 20:40] = lp[4, 7:27].amax() + 1
    return lp, offsets


def check(got, want):
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("groups,slots,v,width", [(7, 1, 100, 2), (5, 5, 3963, 6), (3, 3, 130, 4), (2, 2, 7, 5),
                                                  (4, 5, 8000, 11), (3, 4, 9, 36), (6, 1, 8000, 1), (9, 2, 61, 3)])
def test_step_candidates_equal_the_torch_passes(native_build, monkeypatch, dtype, groups, slots, v, width):
    monkeypatch.setitem(_native._state, "lib", native_build)
    lp, offsets = special_rows(groups, slots, v, dtype, seed=v + slots)
    check(_native.step_candidates(lp, offsets, slots, width), reference(lp, offsets, slots, width))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_step_candidates_split_over_threads(native_build, monkeypatch, dtype):
    """Groups split over three threads (more than the split's minimum size): the same results;
    sparse rows (most entries -inf) with fewer finite candidates than the width in some groups."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    monkeypatch.setattr(_native, "NEWTON_SPLIT_MIN_NUMEL", 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(7 * 3, 500, generator=g, dtype=dtype)
    lp[lp < 2.2] = NEG_INF  # about 1.4% finite: 7 per row
    lp[:3] = NEG_INF
    lp[0, 499] = -1.0  # a group with one finite candidate
    offsets = torch.randn(21, generator=g, dtype=dtype)
    check(_native.step_candidates(lp, offsets, 3, 30), reference(lp, offsets, 3, 30))


@needs_library
def test_step_candidates_refuse_other_dtypes_and_widths():
    lp, offsets = torch.zeros(2, 5), torch.zeros(2)
    assert _native.step_candidates(lp.half(), offsets.half(), 1, 2) is None
    assert _native.step_candidates(lp, offsets, 1, 6) is None  # more than a group's 5 candidates
    assert _native.step_candidates(lp, offsets, 1, 0) is None
    big = torch.zeros(1, 1000)
    assert _native.step_candidates(big, torch.zeros(1), 1, _native.MAX_CANDIDATES + 1) is None
    assert _native.step_candidates(big, torch.zeros(1), 1, _native.MAX_CANDIDATES) is not None
