"""The sigmoid form of an LSTM cell against torch's LSTMCell (an independent implementation)."""
import pytest
import torch
from torch import nn

from nmt.models.lstm_gates import cell_update, sigmoid_form


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-6), (torch.float64, 1e-14)])
@pytest.mark.parametrize("bias", [True, False])
def test_cell_update_on_the_sigmoid_form_equals_lstm_cell(dtype, atol, bias):
    torch.manual_seed(2)
    cell = nn.LSTMCell(7, 5, bias=bias).to(dtype)
    x, h, c = torch.randn(9, 7, dtype=dtype) * 3, torch.randn(9, 5, dtype=dtype), torch.randn(9, 5, dtype=dtype) * 2
    with torch.no_grad():
        want_h, want_c = cell(x, (h, c))
        b = None if not bias else cell.bias_ih + cell.bias_hh
        w, b = sigmoid_form(torch.cat([cell.weight_ih, cell.weight_hh], 1), b)
        gates = torch.cat([x, h], 1) @ w.t() + (0 if b is None else b)
        got_h, got_c = cell_update(gates, c)
        c_out, h_out = torch.empty_like(c), torch.empty_like(h)
        gates = torch.cat([x, h], 1) @ w.t() + (0 if b is None else b)
        h2, c2 = cell_update(gates, c, c_out=c_out, h_out=h_out)
    torch.testing.assert_close(got_h, want_h, rtol=0, atol=atol)
    torch.testing.assert_close(got_c, want_c, rtol=0, atol=atol)
    assert h2.data_ptr() == h_out.data_ptr() and c2.data_ptr() == c_out.data_ptr()
    assert torch.equal(h2, got_h) and torch.equal(c2, got_c)


def test_sigmoid_form_reorders_and_doubles_only_the_cell_gate():
    w = torch.arange(8.0).view(8, 1)  # H = 2: rows i0 i1 f0 f1 g0 g1 o0 o1
    b = torch.arange(8.0)
    w2, b2 = sigmoid_form(w, b)
    assert w2.flatten().tolist() == [0, 1, 2, 3, 6, 7, 8, 10]
    assert b2.tolist() == [0, 1, 2, 3, 6, 7, 8, 10]
    assert sigmoid_form(w)[1] is None
