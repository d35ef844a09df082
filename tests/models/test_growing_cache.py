"""Growing key/value caches (:mod:`nmt.models.growing_cache`) and the Transformer's decoding with them.

Independent truths: ``torch.cat`` / ``index_select`` of the same tensors (bit-exact: both only copy);
the teacher-forced pass over each hypothesis's whole prefix, recomputed from scratch after random
reorderings by parent (float64, 1e-10), for every position kind and attention mapping.
"""
from __future__ import annotations

import pytest
import torch

from nmt.models.transformer import build_transformer
from nmt.models.growing_cache import MIN_CAPACITY, append, capacity_for, select_rows
from nmt.models.protocol import select_state, tile_state

from tiny_models import PAD, SRC_VOCAB, TGT_VOCAB, positions_cfg, random_batch, transformer_cfg


def _kv(rows: int, length: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, 2, length, 3, generator=torch.Generator().manual_seed(seed))


def test_capacity_is_the_next_power_of_two_from_the_minimum():
    assert [capacity_for(n) for n in (1, MIN_CAPACITY, MIN_CAPACITY + 1, 100, 128, 129, 1024)] == \
        [MIN_CAPACITY, MIN_CAPACITY, 2 * MIN_CAPACITY, 128, 128, 256, 1024]


def test_appends_equal_cat_and_write_in_place_until_the_buffer_is_full():
    cache, want = _kv(4, 0, 0), _kv(4, 0, 0)
    pointers = []
    for t in range(40):
        new = _kv(4, 1 + t % 3, t + 1)  # one to three positions at a time
        cache, want = append(cache, new), torch.cat([want, new], dim=2)
        assert torch.equal(cache, want)
        assert cache._base.size(2) == capacity_for(cache.size(2))
        pointers.append((cache.data_ptr(), cache._base.size(2)))
    # a new buffer exactly where a power of two was passed (16, 32, 64, 128 positions)
    moves = [a[0] != b[0] for a, b in zip(pointers, pointers[1:])]
    grows = [a[1] != b[1] for a, b in zip(pointers, pointers[1:])]
    assert moves == grows and sum(grows) == 3


def test_a_second_append_to_an_older_view_copies_and_leaves_the_first_intact():
    base = append(_kv(3, 0, 0), _kv(3, 5, 1))  # 5 of 16 positions
    first = append(base, _kv(3, 1, 2))
    second = append(base, _kv(3, 1, 3))  # from the same 5 positions: must not overwrite position 5
    assert torch.equal(first, torch.cat([base, _kv(3, 1, 2)], dim=2))
    assert torch.equal(second, torch.cat([base, _kv(3, 1, 3)], dim=2))
    assert first.data_ptr() == base.data_ptr() and second.data_ptr() != base.data_ptr()
    assert torch.equal(base, _kv(3, 5, 1))  # the older view still holds what it held


def test_reordering_gathers_the_prefix_into_a_buffer_with_the_same_room():
    cache = append(_kv(5, 0, 0), _kv(5, 7, 1))
    index = torch.tensor([4, 4, 0, 2, 1, 1])
    picked = select_rows(cache, index)
    assert torch.equal(picked, _kv(5, 7, 1).index_select(0, index))
    assert picked._base.shape == (6, 2, MIN_CAPACITY, 3)
    grown = append(picked, _kv(6, 1, 2))
    assert grown.data_ptr() == picked.data_ptr()  # written in place
    assert torch.equal(grown, torch.cat([_kv(5, 7, 1).index_select(0, index), _kv(6, 1, 2)], dim=2))
    # plain tensors and stale views: a plain index_select
    plain = _kv(5, 7, 1)
    assert torch.equal(select_rows(plain, index), plain.index_select(0, index))
    append(cache, _kv(5, 1, 3))  # the buffer moves on: cache is an older view of it now
    out = select_rows(cache, index)
    assert out._base is None and torch.equal(out, _kv(5, 7, 1).index_select(0, index))


def test_where_autograd_records_the_plain_cat_runs_and_gradients_flow():
    cache = append(_kv(2, 0, 0), _kv(2, 3, 1))
    new = _kv(2, 1, 2).requires_grad_()
    out = append(cache, new)
    assert out._base is None  # not written into the buffer
    out.sum().backward()
    assert torch.equal(new.grad, torch.ones_like(new))


def _make(positions: str, attention: str, seed: int):
    torch.manual_seed(seed)
    cfg = transformer_cfg(attention={"mapping": attention}, transformer=positions_cfg(positions))
    return build_transformer(cfg, SRC_VOCAB, TGT_VOCAB, PAD).double().eval()


@pytest.mark.parametrize("attention", ["softmax", "entmax15"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rotary", "relative", "alibi"])
def test_steps_across_reorderings_equal_the_recomputed_prefixes(positions, attention):
    """Beam-like decoding: 4 rows per sentence, every step's rows reordered by random parents
    (``select_state``, rows duplicated and dropped), a compaction dropping a sentence at step 9 and
    steps past two capacity doublings; each step's log-probabilities equal a teacher-forced pass over
    each row's whole token history, recomputed from scratch."""
    model = _make(positions, attention, seed=3)
    src, lengths, _ = random_batch(batch=3, src_len=6, seed=4)
    slots, steps = 4, 2 * MIN_CAPACITY + 3
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
        assert state["self.0.k"]._base is not None  # decoding ran on growing caches
        assert state["self.0.k"]._base.size(2) == capacity_for(steps)


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
