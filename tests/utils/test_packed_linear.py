"""The packed oneDNN linear path for CPU inference: equal to F.linear up to rounding, used only
without gradients on float32 CPU tensors, and rebuilt whenever a weight changes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nmt.utils import packed_linear

needs_onednn = pytest.mark.skipif(not packed_linear._BUILT, reason="torch without oneDNN (or NMT_ONEDNN=0)")


@needs_onednn
@pytest.mark.parametrize("shape", [(5, 16), (3, 4, 16), (0, 16), (64, 16)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("min_rows", [1, 10, 10**9])  # oneDNN always, by the rows, MKL always
def test_equals_functional_linear(shape, with_bias, min_rows, monkeypatch):
    monkeypatch.setattr(packed_linear, "DECODE_MIN_ROWS", min_rows)
    monkeypatch.setattr(packed_linear, "DECODE_MIN_MACS", 0)  # the rows alone decide
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(37, 16, generator=g)
    b = torch.randn(37, generator=g) if with_bias else None
    with torch.no_grad(), packed_linear.frozen_weights():
        got = packed_linear.linear(x, w, b)
        assert packed_linear.usable(x, w, b)
    assert not packed_linear.usable(x, w, b) and not packed_linear._CACHE  # outside a region: plain
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert got.layout == torch.strided and got.shape == (*shape[:-1], 37)


def test_gradients_float64_and_autocast_take_the_plain_path():
    lin = nn.Linear(8, 5)
    x = torch.randn(3, 8)
    y = packed_linear.linear(x, lin.weight, lin.bias)  # the weight needs a gradient
    assert y.grad_fn is not None
    y.sum().backward()
    assert lin.weight.grad is not None
    x64, w64 = torch.randn(3, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    with torch.no_grad(), packed_linear.frozen_weights():
        assert not packed_linear.usable(x64, w64)
        assert torch.equal(packed_linear.linear(x64, w64), F.linear(x64, w64))  # bit for bit: F.linear
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not packed_linear.usable(x, lin.weight)


@needs_onednn
def test_rebuilt_after_in_place_updates_and_loads_and_dropped_after_the_region():
    lin = nn.Linear(8, 5)
    x = torch.randn(4, 8)
    with torch.no_grad(), packed_linear.frozen_weights():
        first = packed_linear.linear(x, lin.weight, lin.bias)
        lin.weight.mul_(2)  # in place: a new version
        torch.testing.assert_close(packed_linear.linear(x, lin.weight, lin.bias), lin(x), rtol=1e-5, atol=1e-5)
        other = nn.Linear(8, 5)
        lin.load_state_dict(other.state_dict())
        torch.testing.assert_close(packed_linear.linear(x, lin.weight, lin.bias), other(x), rtol=1e-5, atol=1e-5)
    assert not packed_linear._CACHE
    # a fused optimiser updates in place without a new version: the next region packs afresh
    opt = torch.optim.Adam(lin.parameters(), lr=0.5, fused=True)
    lin(x).pow(2).sum().backward()
    opt.step()
    with torch.no_grad(), packed_linear.frozen_weights():
        after = packed_linear.linear(x, lin.weight, lin.bias)
    torch.testing.assert_close(after, F.linear(x, lin.weight, lin.bias).detach(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, first)


@needs_onednn
def test_cache_entry_leaves_with_its_weight():
    w = torch.randn(5, 8)
    with torch.no_grad(), packed_linear.frozen_weights():
        packed_linear.linear(torch.randn(2, 8), w)
        key = id(w)
        assert key in packed_linear._CACHE
        del w
        assert key not in packed_linear._CACHE and key not in packed_linear._WATCHED


@needs_onednn
def test_packed_lstm_cell_equals_lstm_cell():
    from nmt.models.decoder import StackedCells
    torch.manual_seed(2)
    cells = StackedCells("lstm", 12, 9, layers=2).eval()
    x = torch.randn(5, 12)
    layers = [(torch.randn(5, 9), torch.randn(5, 9)) for _ in range(2)]
    with torch.no_grad(), packed_linear.frozen_weights():
        out, new = cells(x, layers)
    # the reference: the cells themselves, one layer after the other (grad on: the plain path)
    ref_x, ref = x, []
    for cell, state in zip(cells.cells, layers):
        h, c = cell(ref_x, state)
        ref.append((h, c))
        ref_x = h
    torch.testing.assert_close(out, ref_x.detach(), rtol=1e-5, atol=1e-6)
    for (h, c), (rh, rc) in zip(new, ref):
        torch.testing.assert_close(h, rh.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c, rc.detach(), rtol=1e-5, atol=1e-6)



@needs_onednn
def test_packed_linear_function_gradients(monkeypatch):
    monkeypatch.setattr(packed_linear, "TRAIN_PACKING", True)  # whatever this processor's default
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 5, 16, generator=g, requires_grad=True)
    w = torch.randn(packed_linear.TRAIN_MIN_NUMEL // 16, 16, generator=g, requires_grad=True)
    b = torch.randn(w.shape[0], generator=g, requires_grad=True)
    up = torch.randn(3, 5, w.shape[0], generator=g)
    y = packed_linear.train_linear(x, w, b)
    assert "PackedLinear" in type(y.grad_fn.next_functions[0][0]).__name__  # rows in, then a view
    got = torch.autograd.grad(y, (x, w, b), up)
    want = torch.autograd.grad(F.linear(x, w, b), (x, w, b), up)
    for a, c in zip(got, want):  # sums of up to 16,384 float32 terms in another order
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-6 * c.abs().max().item())


@needs_onednn
def test_packed_linear_output_may_be_modified_in_place(monkeypatch):
    """The training product's output takes in-place operations (the Transformer feed-forward's
    in-place ReLU): autograd forbids them on a view made inside a custom Function, and oneDNN's
    output for a 3-D input is such a view unless the Function sees rows. Gradients equal the plain
    path's (``F.linear`` then an out-of-place ReLU)."""
    monkeypatch.setattr(packed_linear, "TRAIN_PACKING", True)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 4, 64, generator=g, requires_grad=True)
    w = torch.randn(packed_linear.TRAIN_MIN_NUMEL // 64, 64, generator=g, requires_grad=True)
    b = torch.randn(w.shape[0], generator=g, requires_grad=True)
    up = torch.randn(2, 3, 4, w.shape[0], generator=g)
    y = torch.relu_(packed_linear.train_linear(x, w, b))
    got = torch.autograd.grad(y, (x, w, b), up)
    want = torch.autograd.grad(torch.relu(F.linear(x, w, b)), (x, w, b), up)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-6 * c.abs().max().item())


@needs_onednn
def test_frozen_weight_sends_few_rows_to_mkl_and_many_to_onednn(monkeypatch):
    """A FrozenWeight makes its oneDNN copy only when an input of DECODE_MIN_ROWS rows or more
    comes (rows counted over every dim but the last), its MKL copy only for fewer; both routes
    give F.linear up to rounding."""
    monkeypatch.setattr(packed_linear, "DECODE_MIN_ROWS", 6)
    monkeypatch.setattr(packed_linear, "DECODE_MIN_MACS", 0)
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(9, 4, generator=g), torch.randn(9, generator=g)
    frozen = packed_linear.FrozenWeight(w)
    for x in (torch.randn(5, 4, generator=g), torch.randn(1, 5, 4, generator=g)):  # 5 rows: MKL
        torch.testing.assert_close(frozen(x, b), F.linear(x, w, b), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(packed_linear.product(x, frozen), F.linear(x, w), rtol=1e-5, atol=1e-6)
    assert frozen._packed is None and frozen._transposed is not None
    x = torch.randn(2, 3, 4, generator=g)  # 6 rows: oneDNN
    many = packed_linear.FrozenWeight(w)
    torch.testing.assert_close(many(x, b), F.linear(x, w, b), rtol=1e-5, atol=1e-6)
    assert many._packed is not None and many._transposed is None  # one copy: the route it took
    assert many(x, b).shape == (2, 3, 9)


@needs_onednn
def test_frozen_weight_sends_small_products_to_mkl_on_any_processor(monkeypatch):
    """Below DECODE_MIN_MACS multiply-adds (rows x O x I) a product takes MKL even where every row
    count would take oneDNN (DECODE_MIN_ROWS 1, as on AMD processors): one row of a (256, 256)
    weight (65,536) stays on MKL, eight rows (2^19) and one row of a (3963, 256) output layer go to
    oneDNN; each equals F.linear up to rounding."""
    monkeypatch.setattr(packed_linear, "DECODE_MIN_ROWS", 1)
    g = torch.Generator().manual_seed(8)
    for (out, rows), route in (((256, 1), "mkl"), ((256, 8), "onednn"), ((3963, 1), "onednn")):
        w, b = torch.randn(out, 256, generator=g), torch.randn(out, generator=g)
        frozen = packed_linear.FrozenWeight(w)
        x = torch.randn(rows, 1, 256, generator=g)
        torch.testing.assert_close(frozen(x, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        assert (frozen._packed is None, frozen._transposed is None) == (route == "mkl", route == "onednn")


def test_decode_products_leave_onednn_for_few_rows_on_intel_processors_unless_told():
    """The default of DECODE_MIN_ROWS: INTEL_MIN_ROWS on Intel processors, 1 (oneDNN for every
    product) elsewhere; NMT_ONEDNN_MIN_ROWS decides where set, and anything but a positive integer
    there is an error naming it."""
    choose = packed_linear._decode_min_rows
    assert choose({}, "GenuineIntel") == packed_linear.INTEL_MIN_ROWS > 1
    assert choose({}, "AuthenticAMD") == 1 and choose({}, "") == 1
    assert choose({"NMT_ONEDNN_MIN_ROWS": "32"}, "GenuineIntel") == 32
    assert choose({"NMT_ONEDNN_MIN_ROWS": " 1 "}, "GenuineIntel") == 1
    for bad in ("0", "-3", "many", ""):
        with pytest.raises(ValueError, match=r"^NMT_ONEDNN_MIN_ROWS must be a positive integer, got "):
            choose({"NMT_ONEDNN_MIN_ROWS": bad}, "AuthenticAMD")
    assert packed_linear.DECODE_MIN_ROWS == choose()


def test_training_packs_except_on_intel_processors_unless_told():
    """The default of TRAIN_PACKING: off on Intel processors, on elsewhere (an unknown vendor
    included); NMT_ONEDNN_TRAIN=0 / 1 decides where set."""
    choose = packed_linear._train_packing
    assert not choose({}, "GenuineIntel")
    assert choose({}, "AuthenticAMD") and choose({}, "")
    assert choose({"NMT_ONEDNN_TRAIN": "1"}, "GenuineIntel")
    assert not choose({"NMT_ONEDNN_TRAIN": "0"}, "AuthenticAMD")
    assert packed_linear.TRAIN_PACKING == choose()
    assert isinstance(packed_linear.cpu_vendor(), str)


def test_no_packing_in_training_when_off(monkeypatch):
    """With TRAIN_PACKING off, training's products are plain F.linear (no PackedLinear node) and
    the recurrent weights are not packed; decoding's region path is unchanged."""
    from nmt.models.recurrent_product import RecurrentWeight

    monkeypatch.setattr(packed_linear, "TRAIN_PACKING", False)
    w = torch.randn(packed_linear.TRAIN_MIN_NUMEL // 16, 16, requires_grad=True)
    x = torch.randn(4, 16, requires_grad=True)
    y = packed_linear.train_linear(x, w)
    assert "PackedLinear" not in type(y.grad_fn).__name__
    assert RecurrentWeight(w).records.packed is None
    if packed_linear._BUILT:
        with torch.no_grad(), packed_linear.frozen_weights():
            assert packed_linear.usable(x, w)
