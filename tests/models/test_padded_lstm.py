"""The padded CPU-inference LSTM against torch's packed run (an independent implementation)."""
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.models import encoder as encoder_module
from nmt.models import padded_lstm as padded_module
from nmt.models.encoder import RNNEncoder
from nmt.models.padded_lstm import padded_lstm, servable
from nmt.utils.packed_linear import frozen_weights

LENGTHS = [[7, 2, 7, 4, 2, 1], [5], [3, 3, 3], [1, 1], [9, 8, 6, 6, 5, 3, 3, 2, 1, 9]]


def reference(rnn: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor):
    """torch's packed run: outputs zero beyond each length, final states at each length."""
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, (h, c) = rnn(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
    return out, h, c


@pytest.mark.parametrize("cell", ["native", "torch"])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_padded_lstm_equals_the_packed_run(monkeypatch, cell, bidirectional, layers, bias):
    """With the native cell update (where built) and with torch's operations (its fallback)."""
    from nmt.models import native_lstm_cell
    if cell == "torch":
        monkeypatch.setitem(native_lstm_cell._state, "lib", None)
    elif native_lstm_cell.library() is None:
        pytest.skip("native LSTM cell not built")
    torch.manual_seed(layers * 10 + bidirectional * 2 + bias)
    rnn = nn.LSTM(6, 5, num_layers=layers, bidirectional=bidirectional, bias=bias, batch_first=True,
                  dropout=0.3 if layers > 1 else 0.0).eval()
    for lengths in LENGTHS:
        lengths_t = torch.tensor(lengths)
        x = torch.randn(len(lengths), max(lengths) + 1, 6)  # one column of padding beyond the longest
        with torch.no_grad():
            assert servable(rnn, x)
            out, (h, c) = padded_lstm(rnn, x, lengths_t)
            ref_out, ref_h, ref_c = reference(rnn, x, lengths_t)
        torch.testing.assert_close(out, ref_out, rtol=0, atol=2e-6)
        torch.testing.assert_close(h, ref_h, rtol=0, atol=2e-6)
        torch.testing.assert_close(c, ref_c, rtol=0, atol=4e-6)
        beyond = torch.arange(x.size(1))[None, :] >= lengths_t[:, None]
        assert torch.all(out[beyond] == 0) and out.is_contiguous()


def test_padding_content_never_reaches_the_outputs():
    """Whatever the padded positions hold (huge values), the outputs and states are the same."""
    torch.manual_seed(3)
    rnn = nn.LSTM(4, 3, num_layers=2, bidirectional=True, batch_first=True).eval()
    lengths = torch.tensor([2, 5, 3])
    x = torch.randn(3, 6, 4)
    y = x.clone()
    y[torch.arange(6)[None, :] >= lengths[:, None]] = 1e4
    with torch.no_grad():
        a, (ha, ca) = padded_lstm(rnn, x, lengths)
        b, (hb, cb) = padded_lstm(rnn, y, lengths)
    assert torch.equal(a, b) and torch.equal(ha, hb) and torch.equal(ca, cb)


def test_servable_only_where_the_packed_run_is_the_same_function():
    rnn = nn.LSTM(4, 3, num_layers=2, batch_first=True, dropout=0.5)
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        assert not servable(rnn, x)  # training mode drops out between layers
        assert servable(rnn.eval(), x)
        assert not servable(rnn, x.double())
        assert not servable(nn.LSTM(4, 3, batch_first=False).eval(), x)
        assert not servable(nn.LSTM(4, 3, batch_first=True, proj_size=2).eval(), x)
        assert not servable(nn.GRU(4, 3, batch_first=True).eval(), x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not servable(rnn, x)
    assert not servable(rnn, x)  # gradients wanted for the weights
    one_layer = nn.LSTM(4, 3, batch_first=True)
    one_layer.dropout = 0.5  # (torch warns at construction) one layer: nothing to drop out between
    with torch.no_grad():
        assert servable(one_layer.train(), x)


def test_prepared_weights_are_kept_in_a_frozen_region_and_follow_changes(monkeypatch):
    torch.manual_seed(4)
    rnn = nn.LSTM(4, 3, num_layers=2, bidirectional=True, batch_first=True).eval()
    lengths = torch.tensor([3, 1, 4])
    x = torch.randn(3, 4, 4)
    builds = []
    prepare = padded_module._prepare
    monkeypatch.setattr(padded_module, "_prepare", lambda r: builds.append(1) or prepare(r))
    with torch.no_grad(), frozen_weights():
        padded_lstm(rnn, x, lengths)
        padded_lstm(rnn, x, lengths)
        assert len(builds) == 1
        rnn.weight_hh_l1_reverse.mul_(0.5)  # an in-place change moves the version: prepared again
        out, (h, c) = padded_lstm(rnn, x, lengths)
        assert len(builds) == 2
        ref_out, ref_h, ref_c = reference(rnn, x, lengths)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=2e-6)
    with torch.no_grad():
        padded_lstm(rnn, x, lengths)  # outside a region: prepared per call
    assert len(builds) == 3


def test_the_encoder_takes_the_padded_run_without_gradients_on_the_cpu(monkeypatch):
    """RNNEncoder (float32 LSTM, eval) runs padded_lstm without gradients, the packed run with
    them or with CPU_RUNS off; all three agree."""
    torch.manual_seed(5)
    encoder = RNNEncoder("lstm", 6, 8, layers=2, bidirectional=True, dropout=0.2).eval()
    calls = []
    run = padded_module.padded_lstm
    monkeypatch.setattr(padded_module, "padded_lstm", lambda *a: calls.append(1) or run(*a))
    emb = torch.randn(4, 5, 6)
    lengths = torch.tensor([5, 2, 4, 1])
    memory, states = encoder(emb, lengths)
    assert not calls
    with torch.no_grad():
        memory2, states2 = encoder(emb, lengths)
        assert len(calls) == 1
        monkeypatch.setattr(encoder_module, "CPU_RUNS", False)
        memory3, states3 = encoder(emb, lengths)
        assert len(calls) == 1
    torch.testing.assert_close(memory2, memory.detach(), rtol=0, atol=2e-6)
    torch.testing.assert_close(memory3, memory.detach(), rtol=0, atol=2e-6)
    for a, b in zip(states2, states):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=4e-6)
