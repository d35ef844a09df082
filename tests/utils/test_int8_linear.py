"""int8 products (nmt.utils.int8_linear) against independent truths: the stated arithmetic written
out in float64 / int64, the integer product against int64 matrix products (extreme values
included), the error bound against the exact float64 product, a row's result independent of its
batch, and the switch that routes decoding's products (FrozenWeight) to them."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.utils.int8_linear import Int8Weight, int8_active, int8_products
from nmt.utils.packed_linear import FrozenWeight, frozen_weights
from nmt.utils.precision import INFERENCE_PRECISIONS, PRECISIONS, check_inference_device, check_precision
from nmt.utils.sync_audit import SyncAudit


def by_hand(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The module docstring's formula in float64 with int64 sums, written independently."""
    w = weight.double()
    s = w.abs().max(dim=1).values / 127
    q_w = torch.round(w / torch.where(s > 0, s, 1.0)[:, None]).long()
    rows = x.double().reshape(-1, x.shape[-1])
    a = rows.abs().max(dim=1).values / 127
    q_x = torch.round(rows / torch.where(a > 0, a, 1.0)[:, None]).long()
    y = (q_x @ q_w.t()).double() * a[:, None] * s[None, :]
    if bias is not None:
        y = y + bias.double()
    return y.view(*x.shape[:-1], weight.shape[0])


@pytest.mark.parametrize("shape,out,with_bias", [((5, 16), 7, True), ((3, 4, 33), 50, False), ((1, 256), 300, True)])
def test_the_product_is_the_stated_arithmetic(shape, out, with_bias):
    g = torch.Generator().manual_seed(sum(shape) + out)
    weight = torch.randn(out, shape[-1], generator=g) * 0.3
    weight[0] = 0.0  # an all-zero weight row: its outputs are the bias
    x = torch.randn(*shape, generator=g) * 2
    x.view(-1, shape[-1])[0] = 0.0  # a zero input row: the bias
    bias = torch.randn(out, generator=g) if with_bias else None
    got = Int8Weight(weight)(x, bias)
    assert got.shape == (*shape[:-1], out) and got.dtype == torch.float32
    want = by_hand(x, weight, bias)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5), (got.double() - want).abs().max()


@pytest.mark.parametrize("m,k,n", [(1, 256, 300), (7, 17, 5), (64, 512, 96)])
def test_the_integer_product_is_exact_even_at_the_extremes(m, k, n):
    """``torch._int_mm`` (int32 accumulation) equals int64 arithmetic, with every value at +-127 (the
    largest pairwise sums a kernel could saturate) and with random values."""
    g = torch.Generator().manual_seed(m + k + n)
    extreme_a = torch.full((m, k), 127, dtype=torch.int8)
    extreme_a[:, ::2] = -127
    extreme_b = torch.full((k, n), 127, dtype=torch.int8)
    extreme_b[::2] = -127
    random_a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    random_b = torch.randint(-127, 128, (k, n), generator=g, dtype=torch.int8)
    for a, b in ((extreme_a, extreme_b), (extreme_a, -extreme_b), (random_a, random_b)):
        assert torch.equal(torch._int_mm(a, b).long(), a.long() @ b.long())
        assert torch.equal(torch._int_mm(a, b.t().contiguous().t()).long(), a.long() @ b.long())  # a transposed view


def test_the_error_is_within_the_bound():
    """|y - (x W^T + b)| <= s_o / 2 * sum |a q_n| + a_n / 2 * sum |W_o| (+ float32 rounding) against
    the exact float64 product, and the bound is not loose by orders of magnitude."""
    g = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(200, 128, generator=g) * 0.1, torch.randn(200, generator=g)
    x = torch.randn(40, 128, generator=g) * torch.linspace(0.01, 10, 40)[:, None]  # rows of very different scales
    got = Int8Weight(weight)(x, bias).double()
    exact = x.double() @ weight.double().t() + bias.double()
    s = weight.double().abs().max(dim=1).values / 127
    a = x.double().abs().max(dim=1).values / 127
    dequantized = torch.round(x.double() / a[:, None]) * a[:, None]
    bound = s[None, :] / 2 * dequantized.abs().sum(1, keepdim=True) + a[:, None] / 2 * weight.double().abs().sum(1)[None, :]
    error = (got - exact).abs()
    assert bool((error <= bound + 1e-5 * exact.abs() + 1e-6).all())
    assert float((error / bound).max()) > 0.02  # a real error, not an fp32 product by mistake


def test_a_row_does_not_depend_on_its_batch():
    """Each row is quantized alone: bit-equal results alone, in a batch, and among rows of other scales."""
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(64, 32, generator=g)
    int8 = Int8Weight(weight)
    x = torch.randn(9, 32, generator=g)
    x[3] *= 100.0
    batch = int8(x)
    for i in range(9):
        assert torch.equal(int8(x[i:i + 1].clone()), batch[i:i + 1])
    assert torch.equal(int8(x[5:]), batch[5:])


def test_empty_inputs_and_no_host_sync():
    int8 = Int8Weight(torch.randn(6, 4))
    bias = torch.randn(6)
    assert torch.equal(int8(torch.zeros(0, 4), bias), torch.zeros(0, 6))
    assert int8(torch.zeros(2, 0, 4)).shape == (2, 0, 6)
    x = torch.randn(3, 4)
    with SyncAudit() as audit:
        int8(x, bias)
    assert audit.total == 0, audit.report()


def test_frozen_weights_take_the_int8_path_only_in_an_int8_region():
    g = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(300, 64, generator=g), torch.randn(300, generator=g)
    x = torch.randn(10, 64, generator=g)
    frozen = FrozenWeight(weight)
    with frozen_weights():
        plain = frozen(x, bias)
        assert not int8_active()
        with int8_products():
            assert int8_active()
            with int8_products():  # nested
                assert torch.equal(frozen(x, bias), Int8Weight(weight)(x, bias))
            assert int8_active()
        assert not int8_active()
        assert torch.equal(frozen(x, bias), plain)
    assert torch.allclose(plain, F.linear(x, weight, bias), atol=1e-4)
    assert not torch.allclose(Int8Weight(weight)(x, bias), plain, atol=1e-4)  # int8 really differs


def test_int8_is_an_inference_precision_for_the_cpu_only():
    assert "int8" in INFERENCE_PRECISIONS and "int8" not in PRECISIONS
    assert check_precision("int8", inference=True) == "int8"
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16, got 'int8'"):
        check_precision("int8")  # training
    check_inference_device("int8", "cpu")
    check_inference_device("bf16", "cuda:0")
    with pytest.raises(ValueError, match="precision int8 runs on the CPU only .* not on cuda:0; use -device cpu"):
        check_inference_device("int8", "cuda:0")


def test_a_row_with_a_nan_or_an_infinity_gives_a_nan_row_and_leaves_the_others():
    """A non-finite input never turns into finite int8 values: its row's outputs are NaN (as the
    certificate's NaN handling expects of a broken row), the other rows are what they are alone."""
    int8 = Int8Weight(torch.randn(5, 3))
    x = torch.tensor([[1.0, float("nan"), 2.0], [1.0, float("inf"), 0.0], [1.0, 2.0, 3.0]])
    out = int8(x)
    assert bool(out[:2].isnan().all()) and torch.equal(out[2:], int8(x[2:]))
