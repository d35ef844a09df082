"""The Transformer's incremental decoding across beam search's reorderings of its key/value caches.

Independent truth: the teacher-forced pass over each row's whole token history, recomputed from
scratch after random reorderings by parent and a row compaction (float64, 1e-10), for every position
kind and a dense and a sparse self-attention; and the members of an ensemble recomputed alone.
"""
from __future__ import annotations

import pytest
import torch

from nmt.models.protocol import select_state, tile_state
from nmt.models.transformer import build_transformer

from tiny_models import PAD, SRC_VOCAB, TGT_VOCAB, positions_cfg, random_batch, transformer_cfg

STEPS = 35
"""Steps of the reordering test: past the powers of two 16 and 32 of the cache length."""


def _make(positions: str, attention: str, seed: int):
    torch.manual_seed(seed)
    cfg = transformer_cfg(attention={"mapping": attention}, transformer=positions_cfg(positions))
    return build_transformer(cfg, SRC_VOCAB, TGT_VOCAB, PAD).double().eval()


@pytest.mark.parametrize("attention", ["softmax", "entmax15"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rotary", "relative", "alibi"])
def test_steps_across_reorderings_equal_the_recomputed_prefixes(positions, attention):
    """Beam-like decoding: 4 rows per sentence, every step's rows reordered by random parents
    (``select_state``, rows duplicated and dropped), a compaction dropping a sentence at step 9 and
    35 steps; each step's log-probabilities equal a teacher-forced pass over
    each row's whole token history, recomputed from scratch."""
    model = _make(positions, attention, seed=3)
    src, lengths, _ = random_batch(batch=3, src_len=6, seed=4)
    slots, steps = 4, STEPS
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        encoder_out, state = model.encode(src, lengths)
        state = tile_state(state, slots)
        encoder_out = tile_state(encoder_out, slots)
        sentence = torch.arange(3).repeat_interleave(slots)  # (N,) each row's source
        history = torch.full((3 * slots, 1), 2, dtype=torch.long)  # BOS
        for t in range(steps):
            log_probs, _, state = model.step(history[:, -1], state, encoder_out)
            logits, _ = model(src.index_select(0, sentence), lengths.index_select(0, sentence), history)
            want = model.log_probs(logits[:, -1])
            finite = torch.isfinite(want)
            assert torch.equal(torch.isfinite(log_probs), finite)
            assert (log_probs[finite] - want[finite]).abs().max() <= 1e-10, t
            rows = history.size(0)
            # parents within each sentence's rows, as beam search picks them
            parent = (torch.arange(rows) // slots) * slots + torch.randint(0, slots, (rows,), generator=g)
            if t == 9:  # the second sentence leaves the batch (row compaction)
                keep = (sentence != 1).nonzero().view(-1)
                parent = parent.index_select(0, keep)
                encoder_out = select_state(encoder_out, keep)
                sentence = sentence.index_select(0, keep)
            state = select_state(state, parent)
            token = torch.randint(4, TGT_VOCAB, (parent.size(0), 1), generator=g)
            history = torch.cat([history.index_select(0, parent), token], dim=1)
        assert state["self.0.k"].size(2) == steps


def test_an_ensemble_of_growing_caches_equals_its_members_recomputed():
    """Two members' caches under the ensemble's prefixed state, rows swapped after every step:
    each step is the log of the mean of the members' teacher-forced probabilities."""
    from nmt.translate.ensemble import Ensemble

    members = [_make("rotary", "softmax", seed=s) for s in (1, 2)]
    ensemble = Ensemble(members)
    src, lengths, tgt_in = random_batch(batch=2, src_len=5, tgt_len=20, seed=6)
    order, swap = torch.tensor([0, 1]), torch.tensor([1, 0])
    with torch.no_grad():
        encoder_out, state = ensemble.encode(src, lengths)
        for t in range(tgt_in.size(1)):
            log_probs, _, state = ensemble.step(tgt_in[order, t], state, encoder_out)
            probs = [m.log_probs(m(src[order], lengths[order], tgt_in[order, :t + 1])[0][:, -1]).exp()
                     for m in members]
            torch.testing.assert_close(log_probs, torch.stack(probs).mean(0).log(), rtol=0, atol=1e-10)
            state, encoder_out = select_state(state, swap), select_state(encoder_out, swap)
            order = order.index_select(0, swap)
