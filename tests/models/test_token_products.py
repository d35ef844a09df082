"""Input products per token (nmt.models.token_products) against the products per position, and
the runs that take them: the encoder's first layer (padded_lstm with a lookup)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from nmt.models import padded_lstm as padded_module
from nmt.models import token_products as token_products_module
from nmt.models.encoder import RNNEncoder
from nmt.models.padded_lstm import padded_lstm
from nmt.models.token_products import TokenProducts
from nmt.utils.packed_linear import frozen_weights


def test_products_per_token_equal_the_products_per_position():
    torch.manual_seed(0)
    table = torch.randn(11, 5)
    weights = [torch.randn(5, 7), torch.randn(5, 7)]
    biases = [torch.randn(7), None]
    products = TokenProducts(table, weights, biases)
    for ids in (torch.tensor([3, 3, 0, 9, 3]), torch.tensor([9, 1, 10, 0]), torch.tensor([[4, 4], [1, 3]])):
        products.ensure(ids)
        flat = ids.reshape(-1)
        for part, (weight, bias) in enumerate(zip(weights, biases)):
            expected = table[flat] @ weight + (0 if bias is None else bias)
            torch.testing.assert_close(products.gather(flat, part), expected, rtol=0, atol=1e-5)
            out = torch.empty(flat.numel(), 7)
            assert products.gather(flat, part, out=out) is out and torch.equal(out, products.gather(flat, part))
    assert products.known.tolist() == [i in (0, 1, 3, 4, 9, 10) for i in range(11)]


def test_a_token_is_computed_once():
    """Products are kept: a token seen before is not computed again (a changed table row shows it)."""
    torch.manual_seed(1)
    table = torch.randn(6, 3)
    weight = torch.randn(3, 4)
    products = TokenProducts(table, [weight], [None])
    products.ensure(torch.tensor([2, 5]))
    before = products.gather(torch.tensor([2]))
    table[2] += 1.0  # (a frozen region promises this never happens; here it marks the kept row)
    table[4] += 1.0
    products.ensure(torch.tensor([2, 4]))
    assert torch.equal(products.gather(torch.tensor([2])), before)
    torch.testing.assert_close(products.gather(torch.tensor([4]))[0], table[4] @ weight, rtol=0, atol=1e-5)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("layers", [1, 2])
def test_padded_lstm_with_a_lookup_equals_the_embedded_run(bidirectional, layers):
    """The first layer's products by token give the run of the embedded batch (up to rounding),
    padding included; in a frozen region the products serve every batch."""
    torch.manual_seed(2 + layers + 2 * bidirectional)
    rnn = nn.LSTM(6, 5, num_layers=layers, bidirectional=bidirectional, batch_first=True).eval()
    table = torch.randn(13, 6)
    table[0] = 0.0  # the padding row
    batches = [(torch.tensor([[3, 4, 3, 9], [7, 3, 0, 0], [12, 0, 0, 0]]), torch.tensor([4, 2, 1])),
               (torch.tensor([[5, 3, 3], [4, 4, 0]]), torch.tensor([3, 2]))]
    with torch.no_grad(), frozen_weights():
        for ids, lengths in batches:
            out, (h, c) = padded_lstm(rnn, table[ids], lengths, (ids, table))
            ref_out, (ref_h, ref_c) = padded_lstm(rnn, table[ids], lengths)
            torch.testing.assert_close(out, ref_out, rtol=0, atol=2e-6)
            torch.testing.assert_close(h, ref_h, rtol=0, atol=2e-6)
            torch.testing.assert_close(c, ref_c, rtol=0, atol=4e-6)
            beyond = torch.arange(ids.size(1))[None, :] >= lengths[:, None]
            assert torch.all(out[beyond] == 0)


def test_the_token_products_are_built_once_per_region_and_only_in_one(monkeypatch):
    torch.manual_seed(3)
    rnn = nn.LSTM(4, 3, num_layers=2, bidirectional=True, batch_first=True).eval()
    table = torch.randn(8, 4)
    builds = []
    real = token_products_module.TokenProducts
    monkeypatch.setattr(token_products_module, "TokenProducts", lambda *a: builds.append(1) or real(*a))
    ids, lengths = torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([3, 2])
    with torch.no_grad():
        with frozen_weights():
            padded_lstm(rnn, table[ids], lengths, (ids, table))
            padded_lstm(rnn, table[ids], lengths, (ids, table))
            assert len(builds) == 1
        out, _ = padded_lstm(rnn, table[ids], lengths, (ids, table))  # outside a region: per position
        assert len(builds) == 1
        ref, _ = padded_lstm(rnn, table[ids], lengths)
        assert torch.equal(out, ref)


def test_the_encoder_passes_the_lookup_to_its_cpu_run(monkeypatch):
    """RNNEncoder hands ``lookup`` to padded_lstm; the memory equals the embedded run's."""
    torch.manual_seed(4)
    encoder = RNNEncoder("lstm", 6, 8, layers=2, bidirectional=True).eval()
    table = torch.randn(10, 6)
    ids, lengths = torch.tensor([[1, 2, 2, 5], [3, 1, 0, 0]]), torch.tensor([4, 2])
    seen = []
    run = padded_module.padded_lstm
    monkeypatch.setattr(padded_module, "padded_lstm", lambda *a: seen.append(a[3]) or run(*a))
    with torch.no_grad():
        memory, states = encoder(table[ids], lengths, (ids, table))
        ref_memory, ref_states = encoder(table[ids], lengths)
    assert seen[0] is not None and seen[1] is None
    torch.testing.assert_close(memory, ref_memory, rtol=0, atol=2e-6)
    for a, b in zip(states, ref_states):
        torch.testing.assert_close(a, b, rtol=0, atol=4e-6)


def test_a_buffer_beyond_the_limit_keeps_the_products_per_position(monkeypatch):
    """Where the products' buffer would exceed MAX_BYTES, the run computes per position (the
    same outputs) and builds no TokenProducts."""
    token_products = token_products_module
    torch.manual_seed(5)
    rnn = nn.LSTM(4, 3, batch_first=True, bidirectional=True).eval()
    table = torch.randn(9, 4)
    ids, lengths = torch.tensor([[1, 2, 8], [4, 4, 0]]), torch.tensor([3, 2])
    assert token_products.fits(table, [12, 12])
    monkeypatch.setattr(token_products, "MAX_BYTES", 9 * 24 * 4 - 1)
    assert not token_products.fits(table, [12, 12])
    builds = []
    monkeypatch.setattr(token_products, "TokenProducts", lambda *a: builds.append(1))
    with torch.no_grad(), frozen_weights():
        out, _ = padded_lstm(rnn, table[ids], lengths, (ids, table))
        ref, _ = padded_lstm(rnn, table[ids], lengths)
    assert not builds and torch.equal(out, ref)
