"""model.transformer.full_context_alignment: the alignment layer's cross-attention from a second
teacher-forced pass whose self-attentions see the whole target (Garg et al. 2019; OpenNMT-py's
-full_context_alignment). Checked against what must hold of such a pass: the last real position
sees the same keys as in the causal pass (equal rows at alignment layer 0), earlier positions see
later tokens (they change with them, the causal rows do not), padding and batch mates change
nothing, the guided loss's scores are that pass's and reach the future tokens' embeddings, and the
translation (forward's logits, every decoding step) is the same as without the flag."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from nmt.config import resolve_config
from nmt.models import build_model
from nmt.sparse import get_mapping

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from test_precision_compile import PAD, VOCAB, copy_batch  # noqa: E402

BOS = 1


def transformer(full: bool, layer: int = 0, positions: str = "sinusoidal", cross: str = "entmax15", heads: int = 0):
    cfg = resolve_config({"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "a", "tgt": "b"}},
                          "training": {"save_dir": "unused", "max_steps": 1},
                          "model": {"type": "transformer",
                                    "transformer": {"encoder_layers": 1, "decoder_layers": 2, "d_model": 8, "heads": 2,
                                                    "d_ff": 16, "dropout": 0.0, "attention_dropout": 0.0,
                                                    "positions": positions, "alignment_layer": layer,
                                                    "alignment_heads": heads, "full_context_alignment": full},
                                    "embeddings": {"dropout": 0.0}, "attention": {"cross": {"mapping": cross}},
                                    "output": {"mapping": "softmax", "params": {}}}}, "t.yaml")
    torch.manual_seed(0)
    return build_model(cfg["model"], VOCAB, VOCAB, PAD).double().eval()


def real_rows(tgt_in: torch.Tensor) -> torch.Tensor:
    return tgt_in != PAD


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rotary", "alibi", "relative"])
def test_the_last_position_sees_what_the_causal_pass_sees_and_earlier_ones_see_the_future(positions):
    causal, full = transformer(False, positions=positions), transformer(True, positions=positions)
    b = copy_batch(2)
    with torch.no_grad():
        plain = causal.teacher_forced_alignment(b.src, b.src_lengths, b.tgt_in)
        torch.testing.assert_close(plain, causal(b.src, b.src_lengths, b.tgt_in)[1], rtol=0, atol=0)
        seen = full.teacher_forced_alignment(b.src, b.src_lengths, b.tgt_in)
        last = real_rows(b.tgt_in).sum(1) - 1
        rows = torch.arange(b.tgt_in.size(0))
        torch.testing.assert_close(seen[rows, last], plain[rows, last], rtol=1e-12, atol=1e-12)
        assert float((seen[:, 0] - plain[:, 0]).abs().max()) > 1e-3
        # a later token moves the full-context rows before it and no causal row before it
        changed = b.tgt_in.clone()
        changed[:, 3] = torch.where(changed[:, 3] == PAD, PAD, (changed[:, 3] - 2) % (VOCAB - 3) + 3)
        moved = full.teacher_forced_alignment(b.src, b.src_lengths, changed)
        unmoved = causal.teacher_forced_alignment(b.src, b.src_lengths, changed)
        torch.testing.assert_close(unmoved[:, :3], plain[:, :3], rtol=0, atol=0)
        longer = b.tgt_in[:, 3] != PAD  # the examples whose position 3 holds a token
        assert bool(longer.any()) and float((moved[longer, :3] - seen[longer, :3]).abs().amax(dim=(1, 2)).min()) > 1e-6


def test_padding_and_batch_mates_change_nothing():
    full = transformer(True, layer=1)
    b = copy_batch(3)
    wide = torch.cat([b.tgt_in, torch.full((b.tgt_in.size(0), 3), PAD)], dim=1)
    with torch.no_grad():
        batched = full.teacher_forced_alignment(b.src, b.src_lengths, wide)
        for i in range(b.tgt_in.size(0)):
            n, t = int(b.src_lengths[i]), int(real_rows(b.tgt_in[i]).sum())
            alone = full.teacher_forced_alignment(b.src[i:i + 1, :n], b.src_lengths[i:i + 1], b.tgt_in[i:i + 1, :t])
            torch.testing.assert_close(batched[i, :t, :n], alone[0], rtol=1e-12, atol=1e-12)
            assert not bool(batched[i, :t, n:].any())  # padded sources get nothing


@pytest.mark.parametrize("cross,heads", [("entmax15", 1), ("softmax", 0), ("sparsemax", 2)])
def test_the_guided_scores_are_the_full_context_pass_and_the_translation_is_unchanged(cross, heads):
    causal, full = transformer(False, layer=1, cross=cross, heads=heads), transformer(True, layer=1, cross=cross,
                                                                                      heads=heads)
    b = copy_batch(4)
    with torch.no_grad():
        logits, scores = full(b.src, b.src_lengths, b.tgt_in, alignment_scores=True)
        plain_logits, plain_attention = causal(b.src, b.src_lengths, b.tgt_in)
        torch.testing.assert_close(logits, plain_logits, rtol=0, atol=0)
        torch.testing.assert_close(full(b.src, b.src_lengths, b.tgt_in)[1], plain_attention, rtol=0, atol=0)
        assert scores.shape == (8, heads or 2) + plain_attention.shape[1:]
        probs = get_mapping(cross)(scores, dim=-1).mean(1)
        expected = full.teacher_forced_alignment(b.src, b.src_lengths, b.tgt_in)
        keep = real_rows(b.tgt_in)
        torch.testing.assert_close(probs[keep], expected[keep], rtol=1e-12, atol=1e-12)
        # every decoding step is the causal model's
        out_a, state_a = causal.encode(b.src, b.src_lengths)
        out_f, state_f = full.encode(b.src, b.src_lengths)
        for t in range(b.tgt_in.size(1)):
            lp_a, att_a, state_a = causal.step(b.tgt_in[:, t], state_a, out_a)
            lp_f, att_f, state_f = full.step(b.tgt_in[:, t], state_f, out_f)
            torch.testing.assert_close(lp_f, lp_a, rtol=0, atol=0)
            torch.testing.assert_close(att_f, att_a, rtol=0, atol=0)


def test_the_alignment_loss_reaches_the_future_tokens_embeddings():
    """The guided loss of target row 0 has a gradient in the embedding of the token at position 2 with
    full context (that row sees it), none without (the causal row 0 sees BOS alone)."""
    from nmt.sparse import get_loss
    from nmt.train.guided_alignment import alignment_loss

    b = copy_batch(5)
    ref = torch.zeros(b.tgt_in.size(0), b.tgt_in.size(1), b.src.size(1), dtype=torch.float64)
    ref[:, 0, 0] = 1.0  # row 0 only
    grads = {}
    for full in (False, True):
        m = transformer(full, layer=1).train()
        _, scores = m(b.src, b.src_lengths, b.tgt_in, alignment_scores=True)
        alignment_loss(get_loss("entmax15"), scores, ref).backward()
        grad = m.tgt_embeddings.lut.weight.grad
        grads[full] = grad[b.tgt_in[:, 2]].abs().sum()
    assert float(grads[False]) == 0.0 and float(grads[True]) > 1e-8, grads


def test_an_rnn_and_older_checkpoints_align_from_their_steps():
    """The key defaults to false (a checkpoint written before it loads as before); an RNN has no such pass."""
    from nmt.models.seq2seq import Seq2Seq

    assert transformer(False).full_context_alignment is False and Seq2Seq.full_context_alignment is False
    cfg = resolve_config({"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "a", "tgt": "b"}},
                          "training": {"save_dir": "unused", "max_steps": 1}, "model": {"type": "transformer"}}, "t.yaml")
    assert cfg["model"]["transformer"]["full_context_alignment"] is False
    old = dict(cfg["model"])
    old["transformer"] = {k: v for k, v in old["transformer"].items() if k != "full_context_alignment"}
    assert build_model(old, VOCAB, VOCAB, PAD).full_context_alignment is False


def test_activation_checkpointing_gives_the_same_full_context_gradients():
    """training.checkpoint_activations recomputes the full-context pass's layers in the backward: the
    same alignment loss gradients as without (float64)."""
    from nmt.models.transformer.checkpointing import set_activation_checkpointing
    from nmt.sparse import get_loss
    from nmt.train.guided_alignment import alignment_loss

    b = copy_batch(6)
    ref = torch.zeros(b.tgt_in.size(0), b.tgt_in.size(1), b.src.size(1), dtype=torch.float64)
    ref[:, :2, 0] = 1.0
    grads = []
    for checkpointed in (False, True):
        m = transformer(True, layer=1).train()
        set_activation_checkpointing(m, checkpointed)
        _, scores = m(b.src, b.src_lengths, b.tgt_in, alignment_scores=True)
        alignment_loss(get_loss("entmax15"), scores, ref).backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-12, atol=1e-14, msg=name)


@pytest.mark.parametrize("full", [False, True])
def test_repeated_targets_of_one_source_encode_it_once_with_the_same_result(full):
    """``repeats=n``: n consecutive targets per source (a search's n-best entries) give what the
    sources repeated n times give (float64, 1e-12)."""
    m = transformer(full, layer=1)
    b = copy_batch(7)
    n = 3
    g = torch.Generator().manual_seed(0)
    tgt_in = b.tgt_in.repeat_interleave(n, dim=0)
    tgt_in[:, 1:] = torch.where(tgt_in[:, 1:] == PAD, PAD, torch.randint(3, VOCAB, tgt_in[:, 1:].shape, generator=g))
    with torch.no_grad():
        once = m.teacher_forced_alignment(b.src, b.src_lengths, tgt_in, repeats=n)
        repeated = m.teacher_forced_alignment(b.src.repeat_interleave(n, dim=0), b.src_lengths.repeat_interleave(n, dim=0),
                                              tgt_in)
    torch.testing.assert_close(once, repeated, rtol=1e-12, atol=1e-12)


def test_the_validation_heatmaps_show_the_full_context_pass(tmp_path):
    """attention_matrices (TensorBoard's alignment heatmaps) of a full-context model: its
    teacher_forced_alignment, not the causal pass's attention."""
    from nmt.data.dataset import ParallelDataset
    from nmt.data.field import Field
    from nmt.data.tokenizers import SpaceTokenizer
    from nmt.train.validation import attention_matrices

    src_field = Field.build(SpaceTokenizer(), ["a b c d"])
    tgt_field = Field.build(SpaceTokenizer(), ["a b c d"])
    assert len(src_field.vocab) <= VOCAB and len(tgt_field.vocab) <= VOCAB and tgt_field.vocab.pad_index == PAD
    data = ParallelDataset([("a b c", "c b a"), ("d a", "a d c b")], src_field, tgt_field)
    full = transformer(True, layer=1)
    matrices = attention_matrices(full, data, [0, 1], torch.device("cpu"))
    for (matrix, _, tgt_tokens), k in zip(matrices, (0, 1)):
        s = torch.tensor([data.src[k]])
        t = torch.tensor([[tgt_field.vocab.bos_index] + data.tgt[k]])
        with torch.no_grad():
            expected = full.teacher_forced_alignment(s, torch.tensor([s.size(1)]), t)[0]
            causal = full(s, torch.tensor([s.size(1)]), t)[1][0]
        assert len(tgt_tokens) == t.size(1)
        torch.testing.assert_close(matrix, expected.float(), rtol=1e-6, atol=1e-7)
        assert float((matrix - causal.float()).abs().max()) > 1e-4
