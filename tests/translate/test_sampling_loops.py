"""Sampling's two loops, its tempered distribution's cost, and samples without a hypothesis.

* The dynamic loop (stopped samples leave the batch; the CPU default) draws bit for bit the
  samples (tokens, lengths; scores and records to rounding: the model's products on fewer rows
  may round otherwise, 2e-16 seen in float64) of the static loop (fixed shapes, stopped samples masked; the accelerator loop), on
  every kind of model (an LSTM with shared encoder output, a Transformer, toy models with tiled
  state), with temperature, truncation, length ratios, blocking, attention and support records;
  the model's step really runs on fewer rows (a wrapper counts them), and a step makes one host
  sync (``SyncAudit``).
* Temperature with a softmax output maps once per step (a counting wrapper of the model's
  mapping), and the tempered scores equal ``log softmax(z / T)`` up to a per-row constant;
  a sparse output maps twice (the documented reason: its ``T = 1`` support is needed).
* A sample without a hypothesis keeps its place: on a table model where the first token decides
  whether any token of nonzero probability follows (before ``min_length``), entry j of every
  sentence's n-best list is sample j of the raw search result, and the first N' entries for
  N samples equal the N' samples drawn with ``n_best = N'`` (a sample does not depend on N).
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from nmt.data.field import Field
from nmt.data.tokenizers import CharTokenizer, SpaceTokenizer
from nmt.translate.sample_distribution import softmax_output, tempered_step
from nmt.translate.sampling import sample_search
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import Specials
from nmt.translate.translator import Translator
from nmt.utils.sync_audit import SyncAudit
from test_sampling import SPECIAL, SRC_V, forward_logits, tiny_model
from toy_decoders import MarkovDecoder, TinyAttentionRNN, random_sources, tiny_transformer

LOOP_CASES = [
    ("lstm-entmax15", lambda: tiny_model("entmax15", seed=8, scale=2.0), SRC_V,
     dict(n_best=4, max_length=12, seed=5, temperature=1.3)),
    ("lstm-entmax15-block", lambda: tiny_model("entmax15", seed=8, scale=2.0), SRC_V,
     dict(n_best=1, max_length=12, seed=5, block_ngram_repeat=2, return_support=True, return_attention=True)),
    ("lstm-softmax-ratio", lambda: tiny_model("softmax", seed=8), SRC_V,
     dict(n_best=3, max_length=20, seed=5, max_length_ratio=1.5, max_length_offset=1, sample_topp=0.9)),
    ("gru-sparsemax-min", lambda: TinyAttentionRNN(mapping="sparsemax", seed=3, scale=4.0), 13,
     dict(n_best=5, max_length=15, min_length=2, sample_topk=3, max_length_ratio=1.0, max_length_offset=2)),
    ("markov-support", lambda: MarkovDecoder(mapping="sparsemax", seed=0), 9,
     dict(n_best=6, max_length=15, return_support=True, return_attention=True)),
    ("transformer", lambda: tiny_transformer(), 9, dict(n_best=3, max_length=15, return_attention=True,
                                                          temperature=0.8, block_ngram_repeat=1)),
]


class RowCounter:
    """Wraps a model's ``step_with_scores`` (where it has one: its ``step`` calls it) or ``step`` to
    record the rows of every decoder step."""

    def __init__(self, model: nn.Module) -> None:
        self.rows: list[int] = []
        name = "step_with_scores" if hasattr(model, "step_with_scores") else "step"
        setattr(model, name, self._wrap(getattr(model, name)))

    def _wrap(self, inner):
        def counted(tokens, *args, **kwargs):
            self.rows.append(tokens.size(0))
            return inner(tokens, *args, **kwargs)
        return counted


@pytest.mark.parametrize("label,make,src_vocab,fields", LOOP_CASES, ids=[c[0] for c in LOOP_CASES])
def test_the_dynamic_loop_draws_the_static_loops_samples(label, make, src_vocab, fields):
    src, lengths = random_sources(9, src_vocab, 6, seed=4)
    results, rows = {}, {}
    for mode in ("static", "dynamic"):
        model = make()
        counter = RowCounter(model)
        results[mode] = sample_search(model, src, lengths, SPECIAL, SearchOptions(sample=True, mode=mode, **fields))
        rows[mode] = counter.rows
    static, dynamic = results["static"], results["dynamic"]
    steps = dynamic.steps
    # the static loop may run idle steps up to its next stop-flag read: nothing is drawn there
    assert static.steps >= steps and bool((static.tokens[:, :, steps:] == PAD_ID).all())
    assert torch.equal(static.tokens[:, :, :steps], dynamic.tokens)
    for name in ("lengths", "complete", "exact", "reason", "scores", "ranking_scores",
                 "attention", "support_size", "support_tokens", "support_probs"):
        a, b = getattr(static, name), getattr(dynamic, name)
        assert (a is None) == (b is None), name
        if a is None:
            continue
        if a.dim() > 2:  # per step: the static loop's idle steps hold nothing
            assert not bool(a[:, :, steps:].any()), name
            a = a[:, :, :steps]
        if a.is_floating_point():  # the model's step on fewer rows may round its products otherwise
            torch.testing.assert_close(a, b, rtol=1e-12 if a.dtype == torch.float64 else 1e-5, atol=0, msg=name)
        else:
            assert torch.equal(a, b), name
    assert int(dynamic.lengths.gt(0).sum()) > 0
    total = src.size(0) * fields["n_best"]
    assert rows["static"][1:] == [total] * (len(rows["static"]) - 1)  # masked rows keep being computed
    assert rows["dynamic"][0] == src.size(0) and max(rows["dynamic"][1:]) <= total  # BOS once per sentence
    # each step runs at least the samples that draw there (those longer than the step), and the
    # row count never grows: stopped rows leave in buckets (beam_search.bucket_size)
    drawn_lengths = dynamic.lengths.flatten().tolist()
    for t, stepped in enumerate(rows["dynamic"][1:], start=1):
        assert stepped >= sum(length > t for length in drawn_lengths), (t, stepped)
    assert rows["dynamic"][1:] == sorted(rows["dynamic"][1:], reverse=True)
    assert rows["dynamic"][-1] < total


PAD_ID = SPECIAL.pad


def test_auto_mode_samples_with_the_dynamic_loop_on_the_cpu():
    model = TinyAttentionRNN(mapping="entmax15", seed=7)
    src, lengths = random_sources(6, 13, 6, seed=8)
    options = SearchOptions(sample=True, n_best=3, max_length=12)
    assert options.resolved_mode("cpu") == "dynamic" and options.resolved_mode("cuda") == "static"
    counter = RowCounter(model)
    auto = sample_search(model, src, lengths, SPECIAL, options)
    assert min(counter.rows) < 18  # rows left the batch
    with SyncAudit() as audit:
        dynamic = sample_search(model, src, lengths, SPECIAL, options.updated(mode="dynamic"))
    assert torch.equal(auto.tokens, dynamic.tokens)
    assert set(audit.counts) <= {"Tensor.tolist"}, audit.report()
    assert audit.total <= dynamic.steps, audit.report()  # one read a step (none at the last)


def test_beam_search_options_reach_sampling_dynamic_mode():
    """``mode="dynamic"`` is accepted with ``sample`` (it used to be refused)."""
    options = SearchOptions(sample=True, mode="dynamic")
    assert options.mode == "dynamic"


class MappingCounter:
    """Counts the calls of a model's output mapping (``model.generator.log_probs``, which
    ``step_with_scores`` and ``tempered_step`` both reach)."""

    def __init__(self, model: nn.Module) -> None:
        self.calls = 0
        inner = model.generator.log_probs

        def counted(logits: Tensor) -> Tensor:
            self.calls += 1
            return inner(logits)

        model.generator.log_probs = counted


@pytest.mark.parametrize("mapping,per_step", [("softmax", 1), ("entmax15", 2), ("sparsemax", 2)])
def test_softmax_temperature_maps_once_per_step(mapping, per_step):
    model = tiny_model(mapping, seed=2)
    assert softmax_output(model) == (mapping == "softmax")
    src, length = torch.tensor([[3, 7, 4]]), torch.tensor([3])
    encoder_out, state = model.encode(src, length)
    counter = MappingCounter(model)
    with torch.no_grad():
        log_probs, tempered, _, _ = tempered_step(model, torch.tensor([1]), state, encoder_out, 0.6, False)
    assert counter.calls == per_step
    z = torch.from_numpy(forward_logits(model, src, length, ()))
    want = torch.log_softmax(z / 0.6, -1) if mapping == "softmax" else None
    if want is not None:  # log softmax(z / T) up to a per-row constant: the same after renormalising
        torch.testing.assert_close(torch.log_softmax(tempered[0].double(), -1), want, atol=2e-6, rtol=0)
        torch.testing.assert_close(log_probs[0].double(), torch.log_softmax(z, -1), atol=2e-6, rtol=0)
    # a whole search: one mapping a step for softmax, two for a sparse output
    model = tiny_model(mapping, seed=2)
    counter = MappingCounter(model)
    result = sample_search(model, src, length, SPECIAL, SearchOptions(sample=True, n_best=2, temperature=0.6,
                                                                      max_length=8, mode="static"))
    assert counter.calls == per_step * result.steps


def test_softmax_tempered_rows_with_nan_or_inf_stay_unknown():
    """``z / T - max`` keeps the mapping's NaN rows: a NaN or ``+inf`` score makes the whole row
    NaN (log_softmax's rows then are NaN too), so such a row draws nothing."""
    from nmt.translate.sample_distribution import sampling_log_probs

    z = torch.tensor([[0.0, 1.0, float("nan")], [0.0, float("inf"), 1.0], [0.0, 1.0, float("-inf")]])
    scaled = z / 0.5
    shifted = scaled - scaled.amax(-1, keepdim=True)
    reference = torch.log_softmax(scaled, -1)
    for r in range(3):
        assert torch.equal(torch.isfinite(sampling_log_probs(shifted[r:r + 1], 0, 1.0)),
                           torch.isfinite(sampling_log_probs(reference[r:r + 1], 0, 1.0))), r


# ---- samples without a hypothesis keep their place ---------------------------------------------------

def table_fields() -> tuple[Field, Field]:
    """Source words a..e; target characters a, b, c (ids: pad 0, unk 1, bos 2, eos 3, a 4, b 5, c 6)."""
    return Field.build(SpaceTokenizer(), ["a b c d e"]), Field.build(CharTokenizer(), ["abc"])


class TransitionModel(nn.Module):
    """Next-token probabilities a table of the previous token (the source is ignored): after BOS,
    ``a`` or ``b`` (1/2 each); after ``a`` only EOS; after ``b``, ``c`` or EOS (1/2 each); after ``c``
    only EOS. With ``min_length=2`` a sample that starts with ``a`` has no token of nonzero
    probability at its second step (EOS is forbidden there): it has no hypothesis; one that starts
    with ``b`` is ``bc`` EOS, log-probability log(1/4)."""

    def __init__(self, bos: int = 2, eos: int = 3, a: int = 4, b: int = 5, c: int = 6, vocab: int = 7) -> None:
        super().__init__()
        table = torch.zeros(vocab, vocab, dtype=torch.float64)
        table[:, eos] = 1.0
        table[bos] = 0.0
        table[bos, a] = table[bos, b] = 0.5
        table[b] = 0.0
        table[b, c] = table[b, eos] = 0.5
        self.register_buffer("log_table", torch.log(table))

    def encode(self, src: Tensor, src_lengths: Tensor):
        return {"src": src}, {"steps": torch.zeros(src.size(0), dtype=torch.long, device=src.device)}

    def step(self, tokens: Tensor, state, encoder_out):
        attention = torch.full((tokens.size(0), encoder_out["src"].size(1)), 1.0 / encoder_out["src"].size(1),
                               dtype=torch.float64)
        return self.log_table[tokens], attention, {"steps": state["steps"] + 1}


TABLE_SPECIAL = Specials(2, 3, 0)
TABLE_LINES = ["a b", "c", "d e a", "b", "e d c b", "a a", "c d"]


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_a_sample_without_hypothesis_keeps_its_place(mode):
    src_field, tgt_field = table_fields()
    model = TransitionModel()
    n = 4
    kw = dict(sample=True, min_length=2, max_length=6, seed=13, mode=mode)
    translations = Translator(model, src_field, tgt_field, n_best=n, batch_size=3, **kw).translate(TABLE_LINES)
    # the raw samples, positional: sample j of sentence k is row (k, j)
    batch = [src_field.encode(line) for line in TABLE_LINES]
    width = max(len(ids) for ids in batch)
    src = torch.tensor([ids + [0] * (width - len(ids)) for ids in batch])
    raw = sample_search(model, src, torch.tensor([len(ids) for ids in batch]), TABLE_SPECIAL,
                        SearchOptions(n_best=n, **kw))
    missing_at = set()
    for k, t in enumerate(translations):
        assert len(t.hypotheses) == n and len(t.nbest) == n
        for j, hypothesis in enumerate(t.nbest):
            length = int(raw.lengths[k, j])
            if length == 0:
                missing_at.add(j)
                assert hypothesis.missing and hypothesis.text == "" and hypothesis.score == -math.inf
                assert hypothesis.tokens == []
            else:
                assert not hypothesis.missing
                assert hypothesis.text == "bc" and hypothesis.score == pytest.approx(math.log(0.25))
                assert raw.tokens[k, j, :length].tolist() == [5, 6, 3]
    assert missing_at - {n - 1}, "some sample other than the last must be missing for the test to bite"
    assert any(not h.missing for t in translations for h in t.nbest)
    # sample j does not depend on the number of samples: the first 2 of 4 are the 2 of n_best=2
    two = Translator(model, src_field, tgt_field, n_best=2, batch_size=3, **kw).translate(TABLE_LINES)
    assert [[(h.text, h.missing) for h in t.nbest] for t in two] == \
        [[(h.text, h.missing) for h in t.nbest[:2]] for t in translations]
    record = translations[0].report()
    assert [("missing" in h) for h in record["nbest"]] == [h.missing for h in translations[0].nbest]
