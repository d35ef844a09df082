"""The fused training LSTM with inert padding against torch's packed run (an independent
implementation): outputs, final states and every gradient."""
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.models import encoder as encoder_module
from nmt.models import inert_padding_lstm as inert_module
from nmt.models.encoder import RNNEncoder
from nmt.models.inert_padding_lstm import inert_padding_lstm, servable

LENGTHS = [[7, 2, 7, 4, 2, 1], [5], [3, 3, 3], [9, 8, 6, 6, 5, 3, 3, 2, 1, 9]]


def packed_run(rnn: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor):
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, (h, c) = rnn(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
    return out, h, c


def flat_inert_run(rnn: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor):
    out, (h, c) = inert_padding_lstm(rnn, x, lengths)
    return out, h, c


def outputs_and_gradients(run, rnn, x, lengths):
    """The run's (outputs, h_n, c_n) and the gradients of a fixed random projection of all three
    with respect to the input and every parameter."""
    x = x.detach().requires_grad_()
    values = run(rnn, x, lengths)
    weights = [torch.randn(v.shape, generator=torch.Generator().manual_seed(i)) for i, v in enumerate(values)]
    total = sum((v * w).sum() for v, w in zip(values, weights))
    grads = torch.autograd.grad(total, [x, *rnn.parameters()])
    return [v.detach() for v in values], grads


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_inert_padding_equals_the_packed_run_with_gradients(bidirectional, layers, bias):
    torch.manual_seed(layers * 10 + bidirectional * 2 + bias)
    rnn = nn.LSTM(6, 5, num_layers=layers, bidirectional=bidirectional, bias=bias, batch_first=True)
    for lengths in LENGTHS:
        lengths_t = torch.tensor(lengths)
        x = torch.randn(len(lengths), max(lengths) + 1, 6) * 2  # a column of padding beyond the longest
        assert servable(rnn, x)
        (out, h, c), grads = outputs_and_gradients(flat_inert_run, rnn, x, lengths_t)
        (ref_out, ref_h, ref_c), ref_grads = outputs_and_gradients(packed_run, rnn, x, lengths_t)
        torch.testing.assert_close(out, ref_out, rtol=0, atol=2e-6)
        torch.testing.assert_close(h, ref_h, rtol=0, atol=2e-6)
        torch.testing.assert_close(c, ref_c, rtol=0, atol=4e-6)
        assert torch.all(out[torch.arange(x.size(1))[None, :] >= lengths_t[:, None]] == 0)
        for g, ref in zip(grads, ref_grads):
            torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_the_mask_route_equals_the_lengths_route(bidirectional):
    """``valid`` (the lengths' mask, what a compiled step passes) gives the outputs, final states
    and gradients of the host lengths, bit for bit."""
    torch.manual_seed(3)
    rnn = nn.LSTM(6, 5, num_layers=2, bidirectional=bidirectional, batch_first=True)
    for lengths in LENGTHS:
        lengths_t = torch.tensor(lengths)
        x = torch.randn(len(lengths), max(lengths) + 1, 6)
        valid = torch.arange(x.size(1))[None, :] < lengths_t[:, None]
        by_mask = outputs_and_gradients(lambda r, v, _: tuple(
            [(out := inert_padding_lstm(r, v, None, valid=valid))[0], *out[1]]), rnn, x, lengths_t)
        by_lengths = outputs_and_gradients(flat_inert_run, rnn, x, lengths_t)
        for a, b in zip(by_mask[0] + list(by_mask[1]), by_lengths[0] + list(by_lengths[1])):
            assert torch.equal(a, b)


def test_dropout_between_layers_only():
    """With a dropout that zeroes everything, the second layer reads zeros: its outputs are those
    of a 1-layer LSTM with its weights on a zero input, while the first layer's final states are
    those of a 1-layer LSTM with the first layer's weights on the input."""
    torch.manual_seed(7)
    rnn = nn.LSTM(4, 3, num_layers=2, batch_first=True)
    x, lengths = torch.randn(3, 5, 4), torch.tensor([5, 2, 4])

    def one_layer(layer: int, input_size: int) -> nn.LSTM:
        single = nn.LSTM(input_size, 3, batch_first=True)
        with torch.no_grad():
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(single, f"{name}_l0").copy_(getattr(rnn, f"{name}_l{layer}"))
        return single

    with torch.no_grad():
        out, (h, c) = inert_padding_lstm(rnn, x, lengths, dropout=torch.zeros_like)
        ref_out, ref_h, ref_c = packed_run(one_layer(1, 3), torch.zeros(3, 5, 3), lengths)
        _, first_h, first_c = packed_run(one_layer(0, 4), x, lengths)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=2e-6)
    torch.testing.assert_close(h[1], ref_h[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(c[1], ref_c[0], rtol=0, atol=4e-6)
    torch.testing.assert_close(h[0], first_h[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(c[0], first_c[0], rtol=0, atol=4e-6)


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch's note when the flags are set
def test_servable_conditions():
    rnn = nn.LSTM(4, 3, batch_first=True)
    x = torch.randn(2, 3, 4)
    assert servable(rnn, x)
    assert not servable(rnn, x.double())
    assert not servable(nn.GRU(4, 3, batch_first=True), x)
    assert not servable(nn.LSTM(4, 3, batch_first=False), x)
    assert not servable(nn.LSTM(4, 3, batch_first=True, proj_size=2), x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not servable(rnn, x)
    with torch.backends.mkldnn.flags(enabled=False):
        assert not servable(rnn, x)


def test_the_training_encoder_takes_it_and_names_bad_lengths(monkeypatch):
    """RNNEncoder with gradients on the CPU runs inert_padding_lstm (dropout between layers in
    training mode), equal to the packed run (CPU_RUNS off); a bad length is a clear error."""
    torch.manual_seed(8)
    encoder = RNNEncoder("lstm", 6, 8, layers=2, bidirectional=True, dropout=0.0)
    calls = []
    run = inert_module.inert_padding_lstm
    monkeypatch.setattr(inert_module, "inert_padding_lstm", lambda *a: calls.append(a[3]) or run(*a))
    emb = torch.randn(4, 5, 6, requires_grad=True)
    lengths = torch.tensor([5, 2, 4, 1])
    memory, states = encoder(emb, lengths)
    assert len(calls) == 1 and calls[0] is encoder.layer_dropout  # training mode: dropout passed
    grads = torch.autograd.grad(memory.sum() + states[1].sum(), [emb, *encoder.parameters()])
    monkeypatch.setattr(encoder_module, "CPU_RUNS", False)
    memory2, states2 = encoder(emb, lengths)
    grads2 = torch.autograd.grad(memory2.sum() + states2[1].sum(), [emb, *encoder.parameters()])
    monkeypatch.setattr(encoder_module, "CPU_RUNS", True)
    assert len(calls) == 1
    torch.testing.assert_close(memory, memory2, rtol=0, atol=2e-6)
    for a, b in zip(states, states2):
        torch.testing.assert_close(a, b, rtol=0, atol=4e-6)
    for a, b in zip(grads, grads2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="every source sentence needs at least one token"):
        encoder(emb, torch.tensor([5, 0, 4, 1]))
    with pytest.raises(ValueError, match="exceeds the padded source length"):
        encoder(emb, torch.tensor([6, 2, 4, 1]))


# ---- row groups: the rows run in groups of similar lengths, each padded to its own longest -----------

def _plan_cost(groups, lengths):
    return sum(r.numel() * w + inert_module.CALL_COST for r, w in groups) if groups else \
        len(lengths) * max(lengths) + inert_module.CALL_COST


def _cheapest_by_brute_force(lengths, max_groups):
    """The cheapest cost over every way of cutting the rows, sorted by length, at multiples of
    GROUP_ROWS into at most ``max_groups`` groups (each group padded to its longest row)."""
    import itertools

    ordered, rows = sorted(lengths, reverse=True), len(lengths)
    cuts = range(inert_module.GROUP_ROWS, rows, inert_module.GROUP_ROWS)
    costs = []
    for count in range(max_groups):
        for chosen in itertools.combinations(cuts, count):
            bounds = [0, *chosen, rows]
            costs.append(sum((b - a) * ordered[a] + inert_module.CALL_COST for a, b in zip(bounds, bounds[1:])))
    return min(costs)


@pytest.mark.parametrize("call_cost", [0, 64, 500])
def test_row_groups_is_the_cheapest_plan(monkeypatch, call_cost):
    """``row_groups`` against a brute force over every cut: the same cost, every row once, widths
    the groups' longest lengths, longest group first; one group (None) where nothing is cheaper."""
    import random

    monkeypatch.setattr(inert_module, "CALL_COST", call_cost)
    rng = random.Random(call_cost)
    for _ in range(150):
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 70))]
        max_groups = rng.randint(1, 4)
        groups = inert_module.row_groups(torch.tensor(lengths), max_groups)
        assert _plan_cost(groups, lengths) == _cheapest_by_brute_force(lengths, max_groups)
        if groups is not None:
            assert 2 <= len(groups) <= max_groups
            assert sorted(torch.cat([r for r, _ in groups]).tolist()) == list(range(len(lengths)))
            assert [w for _, w in groups] == sorted((w for _, w in groups), reverse=True)
            for rows, width in groups:
                assert width == max(lengths[i] for i in rows.tolist())
                assert rows.numel() % inert_module.GROUP_ROWS == 0 or rows is groups[-1][0]
    # no padding, a batch of one, a batch of GROUP_ROWS rows: one call
    assert inert_module.row_groups(torch.full((64,), 9)) is None
    assert inert_module.row_groups(torch.tensor([5])) is None
    assert inert_module.row_groups(torch.arange(1, inert_module.GROUP_ROWS + 1) * 10) is None


def _grouping_cases():
    g = torch.Generator().manual_seed(11)
    ragged = torch.randint(1, 13, (27,), generator=g)
    ragged[3] = 14  # one long row
    return [ragged.tolist(), [14] * 9 + [2] * 9, [6] * 17, [9]]  # ragged, two lengths, no padding, one row


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_row_groups_equal_the_packed_run_in_float64(monkeypatch, bidirectional, layers, bias):
    """In float64 (torch's own LSTM kernel runs each call), the grouped run equals torch's packed
    run (an independent implementation) to rounding: outputs, exact zeros beyond each length,
    final states and every gradient, on ragged batches, a batch without padding and a batch of
    one; and equals the one-call run with the same dropout masks between layers (the library's
    Dropout, one seed)."""
    from nmt.models.dropout import Dropout

    monkeypatch.setattr(inert_module, "CALL_COST", 0)  # group wherever it saves a time step
    torch.manual_seed(layers * 10 + bidirectional * 2 + bias)
    rnn = nn.LSTM(6, 5, num_layers=layers, bidirectional=bidirectional, bias=bias, batch_first=True).double()
    for lengths in _grouping_cases():
        lengths_t = torch.tensor(lengths)
        grouped = inert_module.row_groups(lengths_t, 3)
        assert (grouped is not None) == (len(set(lengths)) > 1)
        x = torch.randn(len(lengths), max(lengths) + 1, 6, dtype=torch.float64) * 2
        run = lambda r, v, n: flat_inert_run_groups(r, v, n, 3, None)  # noqa: E731
        (out, h, c), grads = outputs_and_gradients(run, rnn, x, lengths_t)
        (ref_out, ref_h, ref_c), ref_grads = outputs_and_gradients(packed_run, rnn, x, lengths_t)
        for a, b in zip((out, h, c, *grads), (ref_out, ref_h, ref_c, *ref_grads)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        assert torch.all(out[torch.arange(x.size(1))[None, :] >= lengths_t[:, None]] == 0)
        dropout = Dropout(0.4)
        with_masks = []
        for max_groups in (1, 3):
            torch.manual_seed(5)
            with_masks.append(outputs_and_gradients(
                lambda r, v, n: flat_inert_run_groups(r, v, n, max_groups, dropout), rnn, x, lengths_t))
        for a, b in zip(with_masks[0][0] + list(with_masks[0][1]), with_masks[1][0] + list(with_masks[1][1])):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def flat_inert_run_groups(rnn, x, lengths, max_groups, dropout):
    out, (h, c) = inert_padding_lstm(rnn, x, lengths, dropout, max_groups=max_groups)
    return out, h, c


def test_row_groups_in_float32_equal_the_packed_run(monkeypatch):
    """The training path itself (float32, oneDNN's fused calls, the library's cost model) on a
    ragged batch that it splits: equal to torch's packed run within float32 rounding."""
    torch.manual_seed(4)
    rnn = nn.LSTM(6, 5, num_layers=2, bidirectional=True, batch_first=True)
    lengths = torch.tensor([30] * 8 + [4] * 16 + [2] * 8)
    assert servable(rnn, torch.zeros(1, 1, 6)) and inert_module.row_groups(lengths) is not None
    x = torch.randn(32, 31, 6)
    (out, h, c), grads = outputs_and_gradients(flat_inert_run, rnn, x, lengths)
    (ref_out, ref_h, ref_c), ref_grads = outputs_and_gradients(packed_run, rnn, x, lengths)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=2e-6)
    torch.testing.assert_close(h, ref_h, rtol=0, atol=2e-6)
    torch.testing.assert_close(c, ref_c, rtol=0, atol=4e-6)
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mapping,params", [
    ("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax_bisect", {"alpha": 1.3}),
    ("fusedmax", {}), ("oscarmax", {}),
])
def test_a_training_pass_with_row_groups_equals_one_call(monkeypatch, mapping, params):
    """A float32 Seq2Seq training pass (dropout on, every attention mapping, sparse and structured)
    whose encoder runs in row groups gives the logits, attention and every parameter gradient of
    the one-call encoder (``MAX_GROUPS = 1``) under the same seed, to float32 rounding."""
    from nmt.models import build_model
    from tests.models.tiny_models import PAD, SRC_VOCAB, TGT_VOCAB, model_cfg, random_batch, sharpen_attention

    model = build_model(model_cfg(encoder={"dropout": 0.3}, embeddings={"dropout": 0.2},
                                  attention={"mapping": mapping, "params": params}),
                        SRC_VOCAB, TGT_VOCAB, PAD)
    sharpen_attention(model)
    model.train()
    lengths = [12, 3, 5, 2, 12, 4, 1, 3, 11, 2, 2, 4, 3, 5, 1, 2, 3, 2]
    src, src_lengths, tgt_in = random_batch(batch=len(lengths), src_len=12, tgt_len=6, lengths=lengths, seed=3)
    assert inert_module.row_groups(src_lengths) is not None
    results = []
    for max_groups in (1, inert_module.MAX_GROUPS):
        monkeypatch.setattr(inert_module, "MAX_GROUPS", max_groups)
        model.zero_grad(set_to_none=True)
        torch.manual_seed(9)
        logits, attention = model(src, src_lengths, tgt_in)
        (logits.square().mean() + attention.mean()).backward()
        results.append((logits.detach(), attention.detach(),
                        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (logits, attention, grads), (ref_logits, ref_attention, ref_grads) = results[1], results[0]
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(attention, ref_attention, rtol=0, atol=1e-5)
    assert grads.keys() == ref_grads.keys() and any(n.startswith("encoder") for n in grads)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5, msg=name)
