"""The native LSTM cell update (nmt.models.native_lstm_cell) against torch's operations on the
sigmoid form, on every vector path of its library (the same bits everywhere), and its use by
cell_update."""
from __future__ import annotations

import pytest
import torch

from nmt.models import native_lstm_cell
from nmt.models.lstm_gates import cell_update
from nmt.sparse import _native

needs_library = pytest.mark.skipif(native_lstm_cell.library() is None, reason="native LSTM cell not built")


def _torch_cell(gates: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The update in float64 from the definition: i, f, o, s = sigmoid(gates); c' = f c + i (2 s - 1);
    h' = o tanh(c')."""
    hidden = c.size(-1)
    i, f, o, s = torch.sigmoid(gates.double()).split(hidden, dim=-1)
    c_new = f * c.double() + i * (2 * s - 1)
    return o * torch.tanh(c_new), c_new


def _inputs(rows: int, hidden: int, scale: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 4 * hidden, generator=g) * scale, torch.randn(rows, hidden, generator=g) * 3


@needs_library
@pytest.mark.parametrize("rows,hidden", [(1, 1), (3, 17), (7, 5), (64, 256), (130, 128)])
@pytest.mark.parametrize("scale", [0.5, 4.0, 120.0])  # 120: exp's clamped arguments, saturated gates
def test_the_cell_is_the_definition_to_float32_rounding(rows, hidden, scale):
    gates, c = _inputs(rows, hidden, scale, seed=rows + hidden)
    c_out, h_out = torch.empty(rows, hidden), torch.empty(rows, hidden)
    assert native_lstm_cell.lstm_cell(gates, c, c_out, h_out)
    h_ref, c_ref = _torch_cell(gates, c)
    torch.testing.assert_close(c_out.double(), c_ref, rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(h_out.double(), h_ref, rtol=1e-6, atol=1e-6)


@needs_library
def test_strided_states_and_threads_give_the_same_bits(monkeypatch):
    """One layer of a (N, layers, H) state read and written in place of contiguous tensors, on one
    thread and on several: the same bits."""
    gates, c = _inputs(64, 96, 3.0, seed=1)
    c_out, h_out = torch.empty(64, 96), torch.empty(64, 96)
    monkeypatch.setattr(native_lstm_cell, "THREADS_MIN_NUMEL", 1 << 40)
    assert native_lstm_cell.lstm_cell(gates, c, c_out, h_out)
    state_c, new_c, new_h = torch.zeros(64, 3, 96), torch.zeros(64, 3, 96), torch.zeros(64, 3, 96)
    state_c[:, 1] = c
    monkeypatch.setattr(native_lstm_cell, "THREADS_MIN_NUMEL", 1)
    assert native_lstm_cell.lstm_cell(gates, state_c[:, 1], new_c[:, 1], new_h[:, 1])
    assert torch.equal(new_c[:, 1], c_out) and torch.equal(new_h[:, 1], h_out)
    assert not new_c[:, 0].any() and not new_h[:, 2].any()  # the other layers untouched


@pytest.fixture(scope="module", params=["NMT_NO_AVX512", "NMT_NO_AVX2", "NMT_ROWS_ONLY"])
def narrower_library(request, tmp_path_factory):
    """The library built without its 512-bit functions, without its 256- and 512-bit ones and
    without vectors (one entry at a time)."""
    if _native._compiler() is None:
        pytest.skip("no C compiler")
    path = native_lstm_cell.build(tmp_path_factory.mktemp(request.param), defines=[request.param])
    return native_lstm_cell.load(path)


@needs_library
@pytest.mark.parametrize("rows,hidden", [(5, 3), (9, 21), (33, 64)])
def test_every_vector_path_gives_the_same_bits(narrower_library, monkeypatch, rows, hidden):
    gates, c = _inputs(rows, hidden, 6.0, seed=hidden)
    wide = (torch.empty(rows, hidden), torch.empty(rows, hidden))
    assert native_lstm_cell.lstm_cell(gates, c, *wide)
    monkeypatch.setitem(native_lstm_cell._state, "lib", narrower_library)
    narrow = (torch.empty(rows, hidden), torch.empty(rows, hidden))
    assert native_lstm_cell.lstm_cell(gates, c, *narrow)
    assert torch.equal(wide[0], narrow[0]) and torch.equal(wide[1], narrow[1])


@needs_library
def test_layouts_it_does_not_hold_are_declined():
    gates, c = _inputs(4, 8, 1.0, seed=3)
    out = (torch.empty(4, 8), torch.empty(4, 8))
    assert not native_lstm_cell.lstm_cell(gates.t().contiguous().t(), c, *out)  # strided gates
    assert not native_lstm_cell.lstm_cell(gates.double(), c.double(), out[0].double(), out[1].double())
    assert not native_lstm_cell.lstm_cell(gates, c, torch.empty(4, 16)[:, ::2], out[1])  # strided entries
    assert not native_lstm_cell.lstm_cell(gates[:, :16], c, *out)  # not 4 x hidden


def test_cell_update_takes_the_native_pass_without_gradients_only(count_calls):
    """cell_update equals the definition either way; with gradients wanted it keeps torch's
    operations."""
    gates, c = _inputs(6, 10, 2.0, seed=4)
    import nmt.models.lstm_gates as lstm_gates
    calls = count_calls(lstm_gates, "lstm_cell")
    with torch.no_grad():
        h, c_new = cell_update(gates.clone(), c)
    h_ref, c_ref = _torch_cell(gates, c)
    torch.testing.assert_close(h.double(), h_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(c_new.double(), c_ref, rtol=1e-6, atol=2e-6)
    assert calls == [True]
    h, _ = cell_update(gates.clone().requires_grad_().clone(), c)  # a non-leaf: its sigmoid is taken in place
    assert calls == [True] and h.requires_grad
    torch.testing.assert_close(h.detach().double(), h_ref, rtol=1e-6, atol=1e-6)


@needs_library
def test_an_added_strided_time_step_is_part_of_the_gates(narrower_library, monkeypatch):
    """``add``: one time step (2, B, 4H) of a (2, T, B, 4H) buffer of input products, as the padded
    encoder passes it; the same as adding it to the gates first, on every vector path."""
    g = torch.Generator().manual_seed(12)
    batch, hidden = 9, 21
    buffer = torch.randn(2, 5, batch, 4 * hidden, generator=g) * 3
    add = buffer[:, 3]  # (2, B, 4H), blocks of B rows 5 B apart
    gates = torch.randn(2, batch, 4 * hidden, generator=g) * 3
    c = torch.randn(2, batch, hidden, generator=g)
    summed = [torch.empty(2, batch, hidden), torch.empty(2, batch, hidden)]
    assert native_lstm_cell.lstm_cell(gates + add, c, *summed)
    h_ref, c_ref = _torch_cell(gates + add, c)
    torch.testing.assert_close(summed[1].double(), h_ref, rtol=1e-6, atol=1e-6)
    outs = []
    for lib in (native_lstm_cell.library(), narrower_library):
        monkeypatch.setitem(native_lstm_cell._state, "lib", lib)
        out = [torch.empty(2, batch, hidden), torch.empty(2, batch, hidden)]
        assert native_lstm_cell.lstm_cell(gates, c, *out, add=add)
        outs.append(out)
    for out in outs:  # one rounding of the sum, as in gates + add: the same bits
        assert torch.equal(out[0], summed[0]) and torch.equal(out[1], summed[1])
    with torch.no_grad():
        h, c_new = cell_update(gates.clone(), c, add=add)
    assert torch.equal(h, summed[1]) and torch.equal(c_new, summed[0])
