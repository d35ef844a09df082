"""Gradient accumulation: N batches of B sentences per update == one batch of N*B (float64)."""
from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import pytest
import torch

from nmt.data.batching import collate
from nmt.models import build_model
from nmt.sparse import get_loss
from nmt.train.update import update

PAD, BOS, EOS = 0, 1, 2
EMB = {"src_size": 8, "tgt_size": 8, "share": False, "tie_output": False, "dropout": 0.0}
ATTENTION = {"score": "general", "mapping": "entmax15", "params": {}, "continuous": None,
             "encoder_self": {"mapping": None, "params": None}, "decoder_self": {"mapping": None, "params": None},
             "cross": {"mapping": "entmax_bisect", "params": {"alpha": "learned"}}}
MODELS = {
    "rnn": {"type": "rnn", "embeddings": EMB,
            "encoder": {"type": "lstm", "layers": 1, "hidden_size": 8, "bidirectional": True, "dropout": 0.0},
            "decoder": {"type": "lstm", "layers": 1, "hidden_size": 8, "dropout": 0.0, "input_feeding": True,
                        "bridge": "linear"},
            "attention": ATTENTION, "output": {"mapping": "entmax15", "params": {}}},
    "transformer": {"type": "transformer", "embeddings": EMB,
                    "transformer": {"encoder_layers": 1, "decoder_layers": 2, "d_model": 8, "heads": 2, "d_ff": 16,
                                    "norm": "pre", "positions": "sinusoidal", "max_positions": 64, "dropout": 0.0,
                                    "attention_dropout": 0.0, "activation_dropout": 0.0, "activation": "relu"},
                    "attention": ATTENTION, "output": {"mapping": "entmax15", "params": {}}},
}


def sentences(n: int, seed: int = 0) -> SimpleNamespace:
    rng = random.Random(seed)
    src = [[rng.randrange(3, 12) for _ in range(rng.randint(1, 7))] for _ in range(n)]
    tgt = [[rng.randrange(3, 10) for _ in range(rng.randint(1, 6))] for _ in range(n)]
    return SimpleNamespace(src=src, tgt=tgt)


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("optimizer_name", ["sgd", "momentum"])
def test_accumulated_batches_equal_one_big_batch(kind, optimizer_name):
    data = sentences(6)
    torch.manual_seed(0)
    model = build_model(MODELS[kind], 12, 10, PAD).double().train()
    twin = copy.deepcopy(model)
    loss_fn = get_loss("entmax15")

    def make_optimizer(m):  # (Adam would amplify round-off in gradients that are exactly 0 in theory,
        # such as those of the key biases under softmax-like mappings)
        return torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9 if optimizer_name == "momentum" else 0.0)

    big = collate(data, range(6), PAD, BOS, EOS)
    parts = [collate(data, group, PAD, BOS, EOS) for group in ([0, 1], [2, 3, 4], [5])]  # uneven, own padding
    assert sum(p.n_tokens for p in parts) == big.n_tokens
    opt_big, opt_parts = make_optimizer(model), make_optimizer(twin)
    for _ in range(2):
        loss_big, n_big, _ = update(model, loss_fn, opt_big, big, PAD, clip_grad_norm=1.0, label_smoothing=0.1)
        loss_parts, n_parts, _ = update(twin, loss_fn, opt_parts, parts, PAD, clip_grad_norm=1.0, label_smoothing=0.1)
        assert n_big == n_parts
        assert float(loss_parts) == pytest.approx(float(loss_big), rel=1e-12)
    for (name, a), (_, b) in zip(model.named_parameters(), twin.named_parameters()):
        assert (a - b).abs().max() <= 1e-12, name
    # not vacuous: the parameters moved
    fresh = build_model(MODELS[kind], 12, 10, PAD)
    assert any((a.double() - b).abs().max() > 1e-3
               for a, b in zip(fresh.parameters(), model.parameters()))


@pytest.mark.parametrize("kind", list(MODELS))
def test_sents_normalization_is_the_sum_over_sentences_over_their_number(kind):
    """normalization="sents": the update's gradient is sum_s grad(summed loss of sentence s) / B,
    the sentences taken one at a time (brute force), for one batch and for accumulated parts;
    "tokens" divides the same sum by the target tokens instead."""
    from nmt.train.update import loss_forward

    data = sentences(6, seed=3)
    torch.manual_seed(1)
    model = build_model(MODELS[kind], 12, 10, PAD).double().train()
    loss_fn = get_loss("entmax15")
    brute = [torch.zeros_like(p) for p in model.parameters()]
    for s in range(6):  # each sentence alone: its summed loss, its gradient
        one = collate(data, [s], PAD, BOS, EOS)
        twin = copy.deepcopy(model)
        loss_forward(twin, loss_fn, one.src, one.src_lengths, one.tgt_in, one.tgt_out, PAD, 0.0).backward()
        for acc, p in zip(brute, twin.parameters()):
            acc += p.grad if p.grad is not None else 0
    big = collate(data, range(6), PAD, BOS, EOS)
    parts = [collate(data, group, PAD, BOS, EOS) for group in ([0, 1], [2, 3, 4], [5])]
    for normalization, divisor in (("sents", 6), ("tokens", big.n_tokens)):
        for batch in (big, parts):
            twin = copy.deepcopy(model)
            before = [p.detach().clone() for p in twin.parameters()]
            update(twin, loss_fn, torch.optim.SGD(twin.parameters(), lr=1.0), batch, PAD, normalization=normalization)
            for (name, p), b, g in zip(twin.named_parameters(), before, brute):
                torch.testing.assert_close(b - p.detach(), g / divisor, rtol=1e-9, atol=1e-12, msg=name)
    assert max(g.abs().max() for g in brute) > 1e-3  # not vacuous
    with pytest.raises(ValueError, match="normalization: expected 'tokens' or 'sents'"):
        update(model, loss_fn, torch.optim.SGD(model.parameters(), lr=1.0), big, PAD, normalization="words")
