"""The native support statistics of log-probability rows (``nmt/sparse/_row_stats.c`` through
``nmt.sparse._native.row_stats``): equal to the torch passes they replace in the search step, on
every vector path (256-bit AVX2 where the processor has it, 128-bit, none)."""
import pytest
import torch

from nmt.sparse import _native

needs_library = pytest.mark.skipif(not _native.available(), reason="native library not built")
NEG_INF = float("-inf")


def reference(lp: torch.Tensor, offsets: torch.Tensor, slots: int, block: int):
    """The torch passes (independent of the C code): a float count of the finite entries, the row
    maximum's NaN / +inf test, and the block maxima of the candidates with nan_to_num."""
    support = torch.nansum(torch.mul(lp, 0).add_(1), dim=-1).to(torch.int32)
    row_max = lp.amax(dim=-1)
    unknown = row_max.isnan() | (row_max == float("inf"))
    cand = torch.add(offsets[:, None], lp).nan_to_num_(nan=NEG_INF, posinf=NEG_INF, neginf=NEG_INF)
    cand = cand.reshape(lp.shape[0] // slots, -1)
    width = cand.shape[1]
    n_blocks = -(-width // block)
    padded = torch.cat([cand, cand.new_full((cand.shape[0], n_blocks * block - width), NEG_INF)], dim=1)
    return support, unknown, padded.view(cand.shape[0], n_blocks, block).amax(dim=-1)


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
    return lp, offsets


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("groups,slots,v,block", [(7, 1, 100, 64), (5, 5, 3963, 64), (3, 3, 130, 32),
                                                  (2, 2, 7, 64), (4, 5, 8000, 64), (3, 4, 9, 4)])
def test_row_stats_equal_the_torch_passes(native_build, monkeypatch, dtype, groups, slots, v, block):
    monkeypatch.setitem(_native._state, "lib", native_build)
    lp, offsets = special_rows(groups, slots, v, dtype, seed=v + slots)
    got = _native.row_stats(lp, offsets, slots, block)
    want = reference(lp, offsets, slots, block)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


@needs_library
def test_row_stats_refuse_other_dtypes():
    assert _native.row_stats(torch.zeros(2, 5, dtype=torch.float16), torch.zeros(2, dtype=torch.float16), 1, 4) is None
