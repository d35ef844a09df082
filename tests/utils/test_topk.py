"""blocked_topk against torch.topk: the same values in the same order, indices of equal values."""
from __future__ import annotations

import pytest
import torch

from nmt.utils.sync_audit import SyncAudit
from nmt.utils.topk import blocked_topk


def check_against_topk(x: torch.Tensor, k: int, block: int) -> None:
    values, index = blocked_topk(x, k, block)
    expected = x.topk(k, dim=1).values
    assert values.shape == index.shape == (x.size(0), k)
    assert index.dtype == torch.long
    assert torch.equal(values, expected)
    assert torch.equal(x.gather(1, index), values)  # each index holds its value
    finite = values > float("-inf")  # entries of nonzero value: distinct positions
    for r in range(x.size(0)):
        chosen = index[r][finite[r]].tolist()
        assert len(set(chosen)) == len(chosen)


@pytest.mark.parametrize("n", [64, 100, 127, 128, 129, 1000, 3963])
@pytest.mark.parametrize("k", [1, 2, 6])
@pytest.mark.parametrize("block", [4, 7, 64])
def test_equals_topk_on_random_rows(n, k, block):
    g = torch.Generator().manual_seed(n * 31 + k * 7 + block)
    x = torch.randn(5, n, generator=g, dtype=torch.float64)
    check_against_topk(x, k, block)


def test_ties_infinities_and_short_rows():
    g = torch.Generator().manual_seed(0)
    rounded = torch.randint(0, 4, (6, 300), generator=g).double()  # many ties
    check_against_topk(rounded, 5, 8)
    sparse = torch.full((4, 300), float("-inf"))
    sparse[0, 299] = -1.0  # the only finite entry, in the shorter last block
    sparse[1, [0, 150]] = torch.tensor([-3.0, -2.0])
    sparse[2, 7] = float("inf")
    check_against_topk(sparse, 4, 8)  # fewer finite entries than k: the rest is -inf
    assert blocked_topk(sparse, 4, 8)[1][0, 0] == 299
    check_against_topk(torch.randn(3, 10), 3, 64)  # too short for blocks: torch.topk itself


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtypes_and_a_non_contiguous_input(dtype):
    x = torch.randn(400, 6).to(dtype).t()  # (6, 400), strided
    check_against_topk(x, 3, 16)


def test_no_host_sync_and_one_compiled_graph():
    x = torch.randn(4, 500)
    with SyncAudit() as audit:
        blocked_topk(x, 3, 16)
    assert audit.total == 0, audit.report()
    compiled = torch.compile(blocked_topk, fullgraph=True)(x, 3, 16)
    assert torch.equal(compiled[0], x.topk(3, dim=1).values)
