"""Coverage attention (model.attention.coverage) and the coverage loss (training.coverage_loss): the
scores are those of keys k_j + w c_j (computed from that definition by hand), c the attention of the
steps before; decoding step by step (beam-shaped rows too) equals the teacher-forced pass, in eval and
in training mode (the LSTM's fused loop) and for the GRU; the coverage changes the attention from the
second step on; the state's coverage is the attention summed; the packed CPU step steps aside; the loss
against loops, its gradient by finite differences, 0 for an attention that never returns; no host sync;
one compiled graph; a Transformer with coverage is a one-line error."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from nmt.models import build_model
from nmt.models.errors import ModelConfigError
from nmt.models.seq2seq import length_mask
from nmt.sparse import get_loss, get_mapping
from nmt.train.coverage_loss import coverage_loss
from nmt.train.update import loss_forward
from nmt.utils.sync_audit import SyncAudit
from tiny_models import SRC_VOCAB, TGT_VOCAB, model_cfg, random_batch, transformer_cfg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

CASES = [("general", "lstm", "sparsemax"), ("dot", "lstm", "entmax15"), ("mlp", "lstm", "softmax"),
         ("general", "gru", "entmax15"), ("mlp", "gru", "sparsemax")]


def coverage_model(score: str, rnn: str, mapping: str, seed: int = 0, dtype=torch.float64):
    torch.manual_seed(seed)
    cfg = model_cfg(attention={"score": score, "mapping": mapping, "coverage": True},
                    decoder={"type": rnn, **({"hidden_size": 8} if score == "dot" else {})})
    model = build_model(cfg, SRC_VOCAB, TGT_VOCAB).to(dtype)
    with torch.no_grad():  # spread the scores: sparse mappings then have zeros, the coverage a visible effect
        for p in model.parameters():
            p.mul_(10)
    return model


def by_hand(attention, query, memory, mask, coverage):
    """One step's probabilities from the definition: keys k_j + w c_j, then the score and the mapping."""
    keys = attention.keys(memory) + coverage.unsqueeze(-1) * attention.coverage_weight  # (B, L, K)
    if attention.score == "mlp":
        scores = attention.v(torch.tanh(attention.query_proj(query).unsqueeze(1) + keys)).squeeze(-1)
    else:
        scores = torch.einsum("bk,blk->bl", query, keys)
    return attention.mapping(scores, dim=-1, mask=mask)


@pytest.mark.parametrize("score,rnn,mapping", CASES)
def test_the_scores_are_those_of_keys_holding_the_coverage(score, rnn, mapping):
    model = coverage_model(score, rnn, mapping)
    attention = model.decoder.attention
    torch.manual_seed(1)
    memory = torch.randn(3, 6, model.encoder.hidden_size, dtype=torch.float64) * 0.05
    mask = length_mask(torch.tensor([6, 4, 2]), 6, memory.device)
    query = torch.randn(3, model.decoder.hidden_size, dtype=torch.float64)
    coverage = torch.rand(3, 6, dtype=torch.float64) * 2 * mask
    _, probs = attention(query, memory, mask, coverage=coverage)
    torch.testing.assert_close(probs, by_hand(attention, query, memory, mask, coverage), rtol=1e-12, atol=1e-12)
    _, plain = attention(query, memory, mask, coverage=torch.zeros_like(coverage))
    assert not torch.allclose(probs, plain)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("score,rnn,mapping", CASES)
def test_steps_equal_the_teacher_forced_pass_and_carry_the_summed_attention(score, rnn, mapping, train):
    """Two slots per sentence (the encoder output kept once per sentence, as a search keeps it); the
    teacher-forced pass in training mode (dropout 0) is the LSTM's fused loop."""
    model = coverage_model(score, rnn, mapping)
    src, lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5, lengths=[7, 4, 2])
    model.train(train)
    with torch.no_grad():
        scores, attention = model(src, lengths, tgt_in)
    model.eval()
    with torch.no_grad():
        encoder_out, state = model.encode(src, lengths)
        assert torch.equal(state["coverage"], torch.zeros(3, 7, dtype=torch.float64))
        state = {k: v.repeat_interleave(2, dim=0) for k, v in state.items()}
        for t in range(5):
            log_probs, att, state = model.step(tgt_in[:, t].repeat_interleave(2), state, encoder_out)
            torch.testing.assert_close(att, attention[:, t].repeat_interleave(2, dim=0), rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(log_probs.exp(), model.generator.output_probs(scores[:, t], {})
                                       .repeat_interleave(2, dim=0), rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(state["coverage"], attention.sum(1).repeat_interleave(2, dim=0), rtol=1e-12,
                                   atol=1e-12)
        with torch.no_grad():
            model.decoder.attention.coverage_weight.zero_()
        _, without = model(src, lengths, tgt_in)
    torch.testing.assert_close(without[:, 0], attention[:, 0], rtol=1e-12, atol=1e-12)  # no coverage yet
    assert not torch.allclose(without[:, 1:], attention[:, 1:])


def test_the_packed_cpu_step_steps_aside(monkeypatch):
    import nmt.models.packed_decoder_step as packed
    from nmt.utils import packed_linear

    model = coverage_model("general", "lstm", "entmax15", dtype=torch.float32).eval()
    src, lengths, tgt_in = random_batch(batch=2, src_len=5, tgt_len=3, lengths=[5, 3])
    calls = []
    real = packed.packed_step
    monkeypatch.setattr(packed, "packed_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad(), packed_linear.frozen_weights():
        encoder_out, state = model.encode(src, lengths)
        _, _, state = model.step(tgt_in[:, 0], state, encoder_out)
    assert not calls and "coverage" in state


def loop_coverage_loss(attention, tgt_out, pad):
    total = 0.0
    B, T, L = attention.shape
    for b in range(B):
        for t in range(T):
            if int(tgt_out[b, t]) == pad:
                continue
            for j in range(L):
                before = sum(float(attention[b, s, j]) for s in range(t))
                total += min(float(attention[b, t, j]), before)
    return total


def test_the_coverage_loss_against_loops_its_gradient_and_zero_without_returns():
    torch.manual_seed(2)
    attention = torch.softmax(torch.randn(3, 5, 6, dtype=torch.float64) * 2, -1)
    tgt_out = torch.randint(4, 9, (3, 5))
    tgt_out[1, 3:] = 0
    assert float(coverage_loss(attention, tgt_out, 0)) == pytest.approx(loop_coverage_loss(attention, tgt_out, 0),
                                                                        rel=1e-12)
    x = attention.clone().requires_grad_(True)
    coverage_loss(x, tgt_out, 0).backward()
    h, numeric = 1e-7, torch.zeros_like(attention)
    for idx in [(0, 1, 2), (0, 4, 0), (1, 2, 5), (2, 0, 3), (2, 3, 3)]:
        up, down = attention.clone(), attention.clone()
        up[idx] += h
        down[idx] -= h
        numeric[idx] = (coverage_loss(up, tgt_out, 0) - coverage_loss(down, tgt_out, 0)) / (2 * h)
        assert float(x.grad[idx]) == pytest.approx(float(numeric[idx]), abs=1e-6)
    diagonal = torch.eye(5, 6, dtype=torch.float64).expand(2, 5, 6)  # every step a new position
    assert float(coverage_loss(diagonal, torch.full((2, 5), 5), 0)) == 0.0
    half = coverage_loss(attention.half(), tgt_out, 0)
    assert half.dtype == torch.float32


@pytest.mark.parametrize("score", ["general", "mlp"])
def test_the_training_loss_adds_the_weighted_coverage_loss_without_a_sync(score, monkeypatch):
    monkeypatch.setattr("nmt.models.encoder.CPU_RUNS", False)  # the accelerators' path of the LSTM encoder
    model = coverage_model(score, "lstm", "entmax15", dtype=torch.float32)
    model.decoder.attention.mapping = get_mapping("entmax15", impl="static")
    src, lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5)
    tgt_out = tgt_in.roll(-1, 1)
    mask = length_mask(lengths, src.size(1), src.device)
    fn = get_loss("softmax")
    model.train()
    loss_forward(model, fn, src, lengths, tgt_in, tgt_out, 0, 0.0, mask, 0.5)  # lazy set-ups
    with SyncAudit() as audit:
        total = loss_forward(model, fn, src, lengths, tgt_in, tgt_out, 0, 0.0, mask, 0.5)
        total.backward()
    assert audit.total == 0, audit.report()
    with torch.no_grad():
        plain = loss_forward(model, fn, src, lengths, tgt_in, tgt_out, 0, 0.0, mask)
        _, attention = model(src, lengths, tgt_in, src_mask=mask)
    torch.testing.assert_close(total.detach(), plain + 0.5 * coverage_loss(attention, tgt_out, 0), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("score", ["general", "mlp"])
def test_the_training_loss_gradient_by_finite_differences(score):
    """Loss with coverage attention and the coverage loss (training mode: the fused LSTM loop and its
    deferred products): autograd against central differences for the coverage weight, the combining
    layer and the attention's key projection (float64)."""
    model = coverage_model(score, "lstm", "entmax15").train()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.1)
    src, lengths, tgt_in = random_batch(batch=2, src_len=5, tgt_len=4, lengths=[5, 3], seed=3)
    tgt_out = tgt_in.roll(-1, 1)
    fn = get_loss("softmax")

    def loss() -> torch.Tensor:
        return loss_forward(model, fn, src, lengths, tgt_in, tgt_out, 0, 0.0, None, 0.7)

    model.zero_grad()
    loss().backward()
    attention = model.decoder.attention
    for weight in (attention.coverage_weight, model.decoder.combine.weight, attention.key_proj.weight):
        numeric = torch.zeros_like(weight)
        with torch.no_grad():
            for idx in torch.cartesian_prod(*[torch.arange(min(n, 3)) for n in weight.shape]).view(-1, weight.dim()):
                idx = tuple(idx.tolist())
                weight[idx] += 1e-6
                up = loss()
                weight[idx] -= 2e-6
                down = loss()
                weight[idx] += 1e-6
                numeric[idx] = (up - down) / 2e-6
        sampled = numeric != 0
        assert bool(sampled.any())
        torch.testing.assert_close(weight.grad[sampled], numeric[sampled], rtol=1e-4, atol=1e-8)


def test_one_compiled_graph_with_coverage_equal_to_eager():
    """The LSTM step with coverage attention and the coverage loss compiles to one graph (encoder in
    the graph) whose loss and gradients equal eager's (float64)."""
    from test_precision_compile import assert_compiled_equals_eager

    from nmt.train.compile import compile_for_device

    graphs: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm

    model = coverage_model("general", "lstm", "softmax").train()
    src, lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5)
    mask = length_mask(lengths, src.size(1), src.device)
    args = (model, get_loss("softmax"), src, lengths, tgt_in, tgt_in.roll(-1, 1), 0, 0.1, mask, 0.7)
    compiled = compile_for_device(loss_forward, "cpu", backend=counting, encoder_in_graph=True)
    assert_compiled_equals_eager(model, compiled, loss_forward, args)
    assert len(graphs) == 1, graphs


def test_a_transformer_with_coverage_is_a_one_line_error():
    with pytest.raises(ModelConfigError) as info:
        build_model(transformer_cfg(attention={"coverage": True}), SRC_VOCAB, TGT_VOCAB)
    assert info.value.key == "model.attention.coverage" and "\n" not in str(info.value)
