"""Per-sentence length limits (``SearchOptions.max_length_ratio``): each sentence stops at
``floor(ratio * source tokens) + offset`` target tokens, within [min_length, max_length].

Independent truths: the brute-force enumeration of every sequence of nonzero probability under
that sentence's own limit (certificates, reasons, hypotheses), and the same sentence searched
alone with ``max_length`` set to its limit (every field of the result, the cut hypotheses that
come back without EOS included), in the dynamic and the static loop; the static step stays
sync-free and compiles as one graph with the limits.
"""
from __future__ import annotations

import math

import pytest
import torch

import nmt.translate.search_step as step_module
import nmt.translate.static_search as static_search
from nmt.translate.beam_search import beam_search
from nmt.translate.length_penalty import length_penalty
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import RowState, Specials, select_step
from nmt.translate.static_search import static_step
from test_certificate_bruteforce import check_against_enumeration
from toy_decoders import BOS, EOS, PAD, MarkovDecoder, TinyAttentionRNN, enumerate_support, random_sources, \
    tiny_transformer

MODES = [dict(mode="dynamic"), dict(mode="static", stop_every=3)]
MODE_IDS = ["dynamic", "static"]


def own_limits(lengths: torch.Tensor, ratio: float, offset: int, min_length: int, max_length: int) -> list[int]:
    """The rule, computed in Python: int(ratio * n) + offset, clamped."""
    return [min(max(int(ratio * n) + offset, min_length), max_length) for n in lengths.tolist()]


@pytest.mark.parametrize("ratio,offset,min_length,max_length,expected", [
    (1.25, 5, 0, 100, [6, 7, 8, 10, 11, 17, 105]),
    (0.5, 0, 2, 4, [2, 2, 2, 2, 2, 4, 4]),
    (2.0, 1, 0, 9, [3, 5, 7, 9, 9, 9, 9]),
])
def test_length_limits_follow_the_rule(ratio, offset, min_length, max_length, expected):
    lengths = torch.tensor([1, 2, 3, 4, 5, 10, 80])
    limits = SearchOptions(max_length_ratio=ratio, max_length_offset=offset, min_length=min_length,
                           max_length=max_length).length_limits(lengths)
    expected = [min(x, max_length) for x in expected]
    assert limits.dtype == torch.long and limits.tolist() == expected
    assert limits.tolist() == own_limits(lengths, ratio, offset, min_length, max_length)
    assert SearchOptions().length_limits(lengths) is None  # ratio 0: max_length alone


@pytest.mark.parametrize("overrides,message", [
    (dict(max_length_ratio=-1.0), r"^max_length_ratio must be a finite number >= 0, got -1.0$"),
    (dict(max_length_ratio=math.nan), r"^max_length_ratio must be a finite number >= 0, got nan$"),
    (dict(max_length_ratio=True), r"^max_length_ratio must be a finite number >= 0, got True$"),
    (dict(max_length_offset=-2), r"^max_length_offset must be >= 0, got -2$"),
    (dict(max_length_offset=1.5), r"^max_length_offset must be an integer, got 1.5$"),
])
def test_bad_limits_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        SearchOptions(**overrides)


BRUTE_CASES = [  # (model, ratio, offset, min_length, penalty); sources of 1..5 tokens, MAX_LENGTH 6
    (lambda: MarkovDecoder(vocab=7, mapping="sparsemax", seed=3, eos_bonus=0.15), 0.5, 1, 0, "none"),
    (lambda: MarkovDecoder(vocab=7, mapping="entmax15", seed=4, scale=2.0, eos_bonus=0.3), 1.0, 0, 1, "average"),
    (lambda: MarkovDecoder(vocab=7, mapping="sparsemax", seed=1, eos_bonus=0.8), 0.75, 2, 0, "gnmt"),
    (lambda: tiny_transformer(output="sparsemax", attention="entmax15", eos_bias=0.0, seed=1), 0.5, 2, 0, "none"),
]
MAX_LENGTH = 6


@pytest.mark.parametrize("selection", ["native", "torch"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("case", range(len(BRUTE_CASES)))
def test_certificates_under_own_limits_match_enumeration(case, mode, selection, monkeypatch):
    """Every sentence against the brute force under its own limit: the same certificate and
    reason ("max_length" where a live prefix with a non-EOS continuation was cut at the sentence's
    limit), the same hypotheses and probabilities."""
    if selection == "torch":
        monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
    make, ratio, offset, min_length, penalty = BRUTE_CASES[case]
    model = make()
    src, lengths = random_sources(10, 9, 5, seed=case + 11)
    limits = own_limits(lengths, ratio, offset, min_length, MAX_LENGTH)
    assert len(set(limits)) > 1  # sentences of one batch end at different steps
    enumerations = [enumerate_support(model, src[b], lengths[b], limits[b], min_length) for b in range(10)]
    reasons = set()
    for beam_size in (1, 2, 4, 8):
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, n_best=200,
                             max_length=MAX_LENGTH, min_length=min_length, length_penalty=penalty,
                             max_length_ratio=ratio, max_length_offset=offset, **mode)
        names = result.reason_names()
        reasons.update(names)
        for b, (support, frontier, cut) in enumerate(enumerations):
            check_against_enumeration(result, names, b, support, frontier, cut, beam_size, penalty,
                                      max_length=limits[b])
    assert "max_length" in reasons  # the limits do cut


SAME_AS_ALONE = [  # (model, search options)
    (lambda: MarkovDecoder(vocab=7, mapping="entmax15", seed=3, eos_bonus=0.1),
     dict(beam_size=3, n_best=5, length_penalty="average", max_length_ratio=0.5, max_length_offset=2)),
    (lambda: TinyAttentionRNN(mapping="entmax15", seed=3, scale=1.0),
     dict(beam_size=1, max_length_ratio=1.0, max_length_offset=1, return_attention=True)),
    (lambda: TinyAttentionRNN(mapping="softmax", seed=1),
     dict(beam_size=4, n_best=3, length_penalty="gnmt", max_length_ratio=0.8, max_length_offset=1,
          min_length=2, return_support=True)),
    (lambda: tiny_transformer(output="entmax15", attention="softmax", eos_bias=-1.0, seed=2),
     dict(beam_size=2, n_best=4, max_length_ratio=1.5, max_length_offset=0, certify=False)),
]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("case", range(len(SAME_AS_ALONE)))
def test_a_batch_gives_each_sentence_what_it_gets_alone_with_its_limit(case, mode):
    """Searched in one batch with the ratio, every sentence gets exactly what a search of that
    sentence alone with ``max_length`` = its limit gives: hypotheses (the cut ones, returned
    without EOS, included), scores, ranking, certificate, support statistics, attention."""
    make, options = SAME_AS_ALONE[case]
    model = make()
    src, lengths = random_sources(9, 9, 6, seed=case + 3)
    batch = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, max_length=12, **options, **mode)
    limits = SearchOptions(max_length=12, **options).length_limits(lengths).tolist()
    alone_options = {k: v for k, v in options.items() if not k.startswith("max_length_")}
    cut_back = 0
    for b in range(src.size(0)):
        n = int(lengths[b])
        alone = beam_search(model, src[b:b + 1, :n], lengths[b:b + 1], bos=BOS, eos=EOS, pad=PAD,
                            max_length=limits[b], **alone_options, **mode)
        steps = alone.tokens.size(2)
        assert batch.tokens.size(2) >= steps
        assert torch.equal(batch.tokens[b, :, :steps], alone.tokens[0])
        assert bool((batch.tokens[b, :, steps:] == PAD).all())
        for name in ("lengths", "complete", "exact", "reason", "n_nonzero"):
            assert torch.equal(getattr(batch, name)[b], getattr(alone, name)[0]), (b, name)
        for name in ("scores", "ranking_scores", "mass"):
            torch.testing.assert_close(getattr(batch, name)[b], getattr(alone, name)[0], rtol=1e-6, atol=1e-6)
        for name in ("attention", "support_size", "support_probs"):
            x, y = getattr(batch, name), getattr(alone, name)
            if x is not None:
                x = x[b, :, :steps]
                if name == "attention":
                    x = x[..., :n]
                torch.testing.assert_close(x, y[0], rtol=1e-6, atol=1e-6)
        cut = ~batch.complete[b] & (batch.lengths[b] > 0)  # returned without EOS: limit tokens, ranked as such
        assert bool((batch.lengths[b][cut] == limits[b]).all())
        penalty = length_penalty(options.get("length_penalty", "none"), limits[b], 0.6)
        torch.testing.assert_close(batch.ranking_scores[b][cut], batch.scores[b][cut] / penalty)
        cut_back += int(cut.sum())
    if case == 0:
        assert cut_back > 0  # hypotheses cut by their sentence's limit came back without EOS


def test_the_ratio_ends_looping_sentences_early():
    """A model that rarely emits EOS runs to ``max_length`` without a ratio; with one, the batch
    ends at the longest limit (dynamic loop: ``steps`` = that limit + 1)."""
    model = MarkovDecoder(vocab=7, mapping="sparsemax", seed=3, eos_bonus=0.0)
    src, lengths = random_sources(6, 9, 5, seed=2)
    free = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=2, max_length=40, mode="dynamic")
    limited = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=2, max_length=40, mode="dynamic",
                          max_length_ratio=1.0, max_length_offset=1)
    limits = (lengths + 1).tolist()
    assert free.steps == 41
    assert limited.steps == max(limits) + 1
    assert (limited.lengths[:, 0] <= torch.tensor(limits) + 1).all()


def test_a_step_where_some_rows_end_compiles_as_one_graph():
    """``torch.compile(fullgraph=True)`` of the step with per-row limits (the sync audit of the
    static step with limits: test_static_search.py) gives the eager step's outcome."""
    options = SearchOptions(beam_size=4, n_best=2, max_length=8, return_support=True, min_length=1,
                            max_length_ratio=0.5, max_length_offset=1)
    special = Specials(BOS, EOS, PAD)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        log_probs = torch.log_softmax(torch.randn(24, 11, generator=g), -1)
        step_rows = RowState(torch.randn(6, 4, generator=g) - 2, torch.ones(6, dtype=torch.bool),
                             torch.zeros(6, dtype=torch.long), torch.full((6, 2), -math.inf),
                             torch.zeros(6, dtype=torch.bool), torch.tensor([3, 2, 3, 5, 3, 8]))
        attention = torch.rand(24, 5, generator=g)
        eager = select_step(log_probs, attention, step_rows, 3, options, special)
        compiled = torch.compile(select_step, fullgraph=True)(log_probs, attention, step_rows, 3, options, special)
    for name in ("parent", "chosen", "done", "truncated"):
        assert torch.equal(getattr(compiled, name), getattr(eager, name)), name
    ending = step_rows.limit == 3
    assert bool((eager.chosen[ending] == EOS).all()) and bool(eager.done[ending].all())
    assert not bool(eager.truncated[~ending].any())


def test_limits_of_host_lengths_follow_the_model_to_its_device():
    """nmt-translate keeps the source lengths on the host while the model runs on an accelerator:
    the limits (computed from those lengths) go to the search's device with the rest of its state.
    The meta device stands in for the accelerator (an operation mixing a host tensor of several
    entries with a tensor of another device raises there as on CUDA); the static step runs every
    step, the ones where rows end and the last included."""
    meta = torch.device("meta")
    model = tiny_transformer(output="softmax", attention="softmax", seed=1).to(meta)
    src, lengths = random_sources(6, 9, 6, seed=8)
    options = SearchOptions(beam_size=3, max_length=8, max_length_ratio=0.8, max_length_offset=1, mode="static")
    limits = options.length_limits(lengths)  # on the host, as the lengths
    assert limits.device.type == "cpu" and len(set(limits.tolist())) > 1
    rows = RowState.start(6, options.n_best, options.certify, meta, limits)
    assert {x.device for x in (rows.scores, rows.exact, rows.reason, rows.best_finished, rows.limit)} == {meta}
    with torch.no_grad():
        encoder_out, state = model.encode(src.to(meta), lengths)
        stopped = torch.zeros(6, dtype=torch.bool, device=meta)
        tokens = torch.full((6,), BOS, device=meta)
        for t in range(options.max_length + 1):
            _, tokens, state, rows, stopped, truncated = static_step(
                model, tokens, state, encoder_out, rows, stopped, t, options, Specials(BOS, EOS, PAD))
            assert truncated is not None and truncated.device == meta and tokens.device == meta


@pytest.mark.parametrize("case", range(len(SAME_AS_ALONE)))
def test_the_static_loop_tests_the_limits_only_where_they_fall(case, monkeypatch):
    """With host lengths the static loop knows the steps where some row's limit falls and tests
    the limits only there (elsewhere the native candidates may serve the step on the CPU); the
    same results as testing them at every step, as it does with lengths on a device."""
    make, options = SAME_AS_ALONE[case]
    model = make()
    src, lengths = random_sources(9, 9, 6, seed=case + 3)
    known = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, max_length=12, mode="static", **options)
    due = []
    real_step = static_search.static_step

    def every_step(*args, limit_due=True, **kwargs):
        due.append(limit_due)
        return real_step(*args, limit_due=True, **kwargs)

    monkeypatch.setattr(static_search, "static_step", every_step)
    tested = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, max_length=12, mode="static", **options)
    limits = set(SearchOptions(max_length=12, **options).length_limits(lengths).tolist())
    assert due == [t in limits for t in range(len(due))]
    assert not all(due)
    for name in ("tokens", "lengths", "complete", "exact", "reason", "n_nonzero", "steps"):
        x, y = getattr(known, name), getattr(tested, name)
        assert (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y), name
    for name in ("scores", "ranking_scores", "mass", "attention", "support_size"):
        x, y = getattr(known, name), getattr(tested, name)
        if x is not None:
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
