"""N-gram repeat blocking (``block_ngram_repeat``) against independent truths.

* The mask: :func:`blocked_tokens` equals a Python definition (the n-grams of each hypothesis as a
  set) on random histories, grown and right-aligned; no host sync; one compiled graph.
* The certificate keeps its meaning: on toy models whose whole output space is enumerated by brute
  force with the constraint (``enumerate_support(block=N)``: only prefixes without a repeated
  N-gram), for N = 1, 2, 3, both loops, beam sizes 1 (greedy), 2, 4, 8, the native and the torch
  candidate selection, with the native bookkeeping on and off and every length penalty: the
  certificate is the one the constrained enumeration predicts, a certified sentence's hypotheses are
  exactly the constrained support (``n_nonzero``, ``mass``), its first is the constrained argmax, and
  no output (complete or cut) holds a repeated N-gram.
* N = 0 changes nothing and runs none of the blocking code.
* Sampling draws only blocked-valid outputs, from the per-step blocked distribution renormalised,
  checked against the exact distribution computed by brute force (as test_sampling.py does).
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

import nmt.translate.ngram_block as ngram_module
import nmt.translate.sampling as sampling_module
import nmt.translate.search_step as step_module
from nmt.translate.beam_search import beam_search
from nmt.translate.ngram_block import block_repeats, blocked_tokens, extend_history, start_history
from nmt.translate.sampling import sample_search
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import RowState, Specials, select_step
from nmt.translate.static_search import static_step
from nmt.utils.sync_audit import SyncAudit
from test_certificate_bruteforce import CASES, MAX_LENGTH, N_SOURCES, check_against_enumeration, model_and_sources
from test_sampling import SPECIAL, V, assert_fits, drawn, forward_logits, reference_mapping, tiny_model, truncate
from test_static_search import assert_same_result
from toy_decoders import BOS, EOS, PAD, MarkovDecoder, TinyAttentionRNN, enumerate_support, random_sources
from toy_decoders import repeats_ngram, tiny_transformer

MODES = [dict(mode="dynamic"), dict(mode="static", stop_every=3)]
MODE_IDS = ["dynamic", "static"]


# --- the mask --------------------------------------------------------------------------------------

def python_blocked(tokens: list[int], n: int, vocab: int) -> set[int]:
    """The tokens v for which ``tokens + [v]`` ends with an n-gram that ``tokens`` already holds."""
    if len(tokens) < n:
        return set()
    grams = {tuple(tokens[i: i + n]) for i in range(len(tokens) - n + 1)}
    tail = tuple(tokens[len(tokens) - n + 1:]) if n > 1 else ()
    return {v for v in range(vocab) if tail + (v,) in grams}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["grown", "right-aligned"])
def test_blocked_tokens_equal_the_python_definition(n, layout):
    g = torch.Generator().manual_seed(n)
    vocab, rows, width = 5, 300, 9
    lengths = torch.randint(0, width + 1, (rows,), generator=g)
    tokens = torch.randint(0, 3, (rows, width), generator=g)  # 3 token ids: many repeats
    if layout == "grown":  # every hypothesis of one length (the dynamic loop's history)
        lengths.fill_(width)
    history = torch.where(torch.arange(width) >= width - lengths.unsqueeze(1), tokens, -1)  # (R, W)
    got = blocked_tokens(history, n, vocab)
    hits = 0
    for r in range(rows):
        own = history[r, width - int(lengths[r]):].tolist()
        want = python_blocked(own, n, vocab)
        assert {v for v in range(vocab) if got[r, v]} == want, (own, n)
        hits += bool(want)
    assert hits > rows // 20  # not vacuous
    bias = block_repeats(torch.zeros(20, 15, vocab), history.view(20, 15, width), n, t=width)  # any leading shape
    assert torch.equal(bias.view(rows, vocab) == -math.inf, got) and bool((bias[~got.view(20, 15, vocab)] == 0).all())


def test_history_extension_follows_parents_and_keeps_its_width():
    history = torch.tensor([[[-1, 3], [4, 5]]])  # (1, 2, 2): slot 0 = "3", slot 1 = "4 5"
    parent, token = torch.tensor([[1, 1, 0]]), torch.tensor([[6, 7, 8]])
    grown = extend_history(history, parent, token, capacity=5)
    assert grown.tolist() == [[[4, 5, 6], [4, 5, 7], [-1, 3, 8]]]
    fixed = extend_history(history, parent, token, capacity=2)
    assert fixed.tolist() == [[[5, 6], [5, 7], [3, 8]]]
    assert extend_history(torch.tensor([[-1, 2]]), None, torch.tensor([9]), 2).tolist() == [[2, 9]]


def test_nan_and_inf_scores_stay_unknown_where_blocked():
    """A blocked NaN or +inf log-probability stays non-finite-and-not--inf (NaN): the certificate
    still sees the unknown row; a blocked finite one becomes -inf; -inf stays."""
    history = start_history(1, None, 3, "cpu")
    history[0] = torch.tensor([3, 4, 3])  # n = 2: "3 4" seen, the last token 3: 4 is blocked
    for value in (math.nan, math.inf, -0.5, -math.inf):
        log_probs = torch.full((1, 6), -2.0)
        log_probs[0, 4] = value
        out = block_repeats(log_probs, history, 2, t=3)
        want = math.nan if not math.isfinite(value) and value != -math.inf else -math.inf
        assert (math.isnan(out[0, 4]) if math.isnan(want) else out[0, 4] == want), value
        assert torch.equal(out[0, [0, 1, 2, 3, 5]], log_probs[0, [0, 1, 2, 3, 5]])
    assert block_repeats(log_probs, history, 2, t=1) is log_probs  # nothing can repeat before step n
    assert block_repeats(log_probs, history, 0, t=3) is log_probs


def test_the_mask_makes_no_host_sync_and_compiles_as_one_graph():
    g = torch.Generator().manual_seed(0)
    history = torch.where(torch.rand(6, 4, 8, generator=g) < 0.2, -1, torch.randint(3, 6, (6, 4, 8), generator=g))
    log_probs = torch.log_softmax(torch.randn(6, 4, 7, generator=g), -1)
    parent, token = torch.randint(0, 4, (6, 4), generator=g), torch.randint(3, 7, (6, 4), generator=g)

    def step(log_probs, history, parent, token):
        return block_repeats(log_probs, history, 2, t=5), extend_history(history, parent, token, 8)

    with SyncAudit() as audit:
        eager = step(log_probs, history, parent, token)
    assert audit.total == 0, audit.report()
    compiled = torch.compile(step, fullgraph=True, dynamic=False, backend="aot_eager")(log_probs, history, parent,
                                                                                        token)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])


# --- the certificate against brute force ----------------------------------------------------------

_ENUMERATIONS: dict = {}


def constrained_enumeration(mapping: str, seed: int, b: int, min_length: int, block: int):
    key = (mapping, seed, b, min_length, block)
    if key not in _ENUMERATIONS:
        model, src, lengths = model_and_sources(mapping, seed)
        _ENUMERATIONS[key] = enumerate_support(model, src[b], lengths[b], MAX_LENGTH, min_length, block=block)
    return _ENUMERATIONS[key]


def check_blocked_search(mapping, seed, penalty, min_length, block, **search):
    """Every toy source, beam sizes 1, 2, 4, 8, against the constrained brute force; returns what
    was seen: certified sentences, and sentences whose certified argmax the blocking changed."""
    model, src, lengths = model_and_sources(mapping, seed)
    seen = Counter()
    for beam_size in (1, 2, 4, 8):
        kw = dict(bos=BOS, eos=EOS, beam_size=beam_size, n_best=200, max_length=MAX_LENGTH, min_length=min_length,
                  length_penalty=penalty, **search)
        result = beam_search(model, src, lengths, block_ngram_repeat=block, **kw)
        names = result.reason_names()
        for b in range(N_SOURCES):
            support, frontier, cut = constrained_enumeration(mapping, seed, b, min_length, block)
            check_against_enumeration(result, names, b, support, frontier, cut, beam_size, penalty)
            for i in range(result.tokens.size(1)):  # every n-best entry, complete or cut
                n = int(result.lengths[b, i])
                assert not repeats_ngram(result.tokens[b, i, :n].tolist(), block)
            if bool(result.exact[b]):
                seen["certified"] += 1
                free, _, _ = constrained_enumeration(mapping, seed, b, min_length, 0)
                if set(free) != set(support):
                    seen["constrained"] += 1  # the blocking removed outputs of nonzero probability
    return seen


@pytest.mark.parametrize("block", [1, 2, 3])
@pytest.mark.parametrize("selection", ["native", "torch"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("mapping,seed,penalty,min_length", CASES)
def test_certified_search_is_exact_for_the_constrained_problem(mapping, seed, penalty, min_length, mode, selection,
                                                               block, monkeypatch):
    """"native": the CPU's one-pass candidates and native bookkeeping (``_step_update.c``), where
    built; "torch": torch's candidates and bookkeeping (the accelerators' reference, compiled steps)."""
    calls = []
    if selection == "torch":
        monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
        monkeypatch.setattr(step_module, "step_update", lambda *args, **kwargs: None)
    else:
        native = step_module.step_update

        def counted(*args, **kwargs):
            update = native(*args, **kwargs)
            calls.append(update is not None)
            return update

        monkeypatch.setattr(step_module, "step_update", counted)
    check_blocked_search(mapping, seed, penalty, min_length, block, **mode)
    assert any(calls) == (selection == "native")  # the native bookkeeping served (not where k > V at t = 0)


@pytest.mark.parametrize("block", [1, 2, 3])
def test_the_constraint_bites_in_certified_sentences(block):
    """Not vacuous: over the cases, certified sentences whose constrained support is smaller than
    the model's (the blocking removed outputs of nonzero probability)."""
    seen = Counter()
    for mapping, seed, penalty, min_length in CASES:
        seen.update(check_blocked_search(mapping, seed, penalty, min_length, block, mode="dynamic"))
    assert seen["certified"] >= 10 and seen["constrained"] >= 3, seen


def test_the_constraint_changes_certified_argmaxes():
    """Not vacuous: for some certified sentences the constrained argmax is not the model's argmax."""
    changed = 0
    for mapping, seed, penalty, min_length in CASES:
        model, src, lengths = model_and_sources(mapping, seed)
        kw = dict(bos=BOS, eos=EOS, beam_size=8, n_best=1, max_length=MAX_LENGTH, min_length=min_length,
                  length_penalty=penalty)
        free, blocked = beam_search(model, src, lengths, **kw), beam_search(model, src, lengths, block_ngram_repeat=2,
                                                                            **kw)
        both = free.exact & blocked.exact
        changed += int(((free.tokens[:, 0, :min(free.steps, blocked.steps)]
                         != blocked.tokens[:, 0, :min(free.steps, blocked.steps)]).any(1) & both).sum())
    assert changed >= 3


@pytest.mark.parametrize("block", [1, 2])
@pytest.mark.parametrize("case", range(4))
def test_static_equals_dynamic_with_blocking_on_models_with_state(case, block):
    """Models whose state is reordered by the beam (a GRU, a Transformer's kv caches) and greedy:
    the static loop gives the dynamic loop's results with blocking, and no output repeats."""
    make, options = [
        (lambda: TinyAttentionRNN(mapping="sparsemax", seed=2), dict(beam_size=3, n_best=5, return_support=True)),
        (lambda: TinyAttentionRNN(mapping="softmax", seed=1), dict(beam_size=1, length_penalty="average")),
        (lambda: tiny_transformer(output="entmax15", attention="softmax", eos_bias=-1.0, seed=1),
         dict(beam_size=4, n_best=3, return_attention=True)),
        (lambda: tiny_transformer(output="sparsemax", attention="entmax15", eos_bias=-1.0, seed=2),
         dict(beam_size=2, n_best=2, max_length_ratio=1.5, max_length_offset=2)),
    ][case]
    model = make()
    src, lengths = random_sources(7, 9, 6, seed=case)
    kw = dict(bos=BOS, eos=EOS, pad=PAD, max_length=10, block_ngram_repeat=block, **options)
    dynamic = beam_search(model, src, lengths, mode="dynamic", **kw)
    static = beam_search(model, src, lengths, mode="static", stop_every=2, **kw)
    assert_same_result(static, dynamic)
    free = beam_search(model, src, lengths, mode="dynamic", **{**kw, "block_ngram_repeat": 0})
    assert not torch.equal(free.tokens, dynamic.tokens) or free.steps != dynamic.steps  # it bites
    for b in range(7):
        for i in range(dynamic.tokens.size(1)):
            assert not repeats_ngram(dynamic.tokens[b, i, :int(dynamic.lengths[b, i])].tolist(), block)


# --- N = 0 ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_zero_changes_nothing_and_runs_no_blocking_code(mode, monkeypatch):
    model = MarkovDecoder(vocab=7, mapping="entmax15", seed=4, scale=2.0, eos_bonus=0.3)
    src, lengths = random_sources(6, 9, 5, seed=3)
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=3, n_best=4, max_length=8, **mode)
    before = beam_search(model, src, lengths, **kw)

    def refused(*args, **kwargs):
        raise AssertionError("blocking code ran with block_ngram_repeat=0")

    for module, name in ((ngram_module, "repeat_followers"), (step_module, "extend_history"),
                         (step_module, "start_history"), (sampling_module, "extend_history"),
                         (sampling_module, "start_history")):
        monkeypatch.setattr(module, name, refused)
    after = beam_search(model, src, lengths, block_ngram_repeat=0, **kw)
    assert_same_result(after, before)
    samples = sample_search(model, src, lengths, SPECIAL, SearchOptions(sample=True, n_best=3, max_length=8))
    assert samples.lengths.gt(0).any()


def test_negative_values_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"^block_ngram_repeat must be >= 0 \(0: off\), got -1$"):
        SearchOptions(block_ngram_repeat=-1)
    with pytest.raises(ValueError, match=r"^block_ngram_repeat must be an integer, got 2.0$"):
        SearchOptions(block_ngram_repeat=2.0)


# --- host syncs and one graph in the search --------------------------------------------------------

def test_static_steps_with_blocking_make_no_host_sync():
    model = TinyAttentionRNN(mapping="entmax15", seed=7)
    src, lengths = random_sources(6, 13, 6, seed=8)
    options = SearchOptions(beam_size=4, n_best=2, max_length=7, block_ngram_repeat=2, return_support=True)
    special = Specials(BOS, EOS, PAD)
    with torch.no_grad():
        encoder_out, state = model.encode(src, src_lengths=lengths)
        rows = RowState.start(6, options.n_best, options.certify, src.device, None, options.max_length)
        stopped = torch.zeros(6, dtype=torch.bool)
        tokens = torch.full((6,), BOS)
        for t in range(options.max_length + 1):
            with SyncAudit() as audit:
                _, tokens, state, rows, stopped, _ = static_step(model, tokens, state, encoder_out, rows, stopped, t,
                                                                 options, special)
            assert audit.total == 0, f"step {t}: {audit.report()}"
            assert rows.ngrams.shape == (6, 4, options.max_length)
            if t == 0:
                encoder_out = {k: v.repeat_interleave(4, dim=0) for k, v in encoder_out.items()}


def test_a_search_step_with_blocking_compiles_as_one_graph():
    options, special = SearchOptions(beam_size=3, n_best=2, max_length=10, block_ngram_repeat=2), Specials(BOS, EOS, PAD)
    g = torch.Generator().manual_seed(1)
    ngrams = torch.randint(3, 6, (5, 3, 10), generator=g)
    ngrams[:, :, :4] = -1
    rows = RowState(torch.randn(5, 3, generator=g, dtype=torch.float64), torch.ones(5, dtype=torch.bool),
                    torch.zeros(5, dtype=torch.long), torch.full((5, 2), -5.0, dtype=torch.float64),
                    torch.zeros(5, dtype=torch.bool), None, ngrams)
    log_probs = torch.log_softmax(torch.randn(15, 7, generator=g, dtype=torch.float64), -1)
    assert bool((block_repeats(log_probs.view(5, 3, 7), ngrams, 2, 6) == -math.inf).any())  # some are blocked
    compiled = torch.compile(select_step, fullgraph=True)(log_probs, None, rows, 6, options, special)
    eager = select_step(log_probs, None, rows, 6, options, special)
    for name in ("chosen", "parent", "done"):
        assert torch.equal(getattr(compiled, name), getattr(eager, name)), name
    assert torch.equal(compiled.rows.ngrams, eager.rows.ngrams) and torch.equal(compiled.rows.scores, eager.rows.scores)
    # no kept candidate repeats a bigram of its parent's history
    for r in range(5):
        for k in range(3):
            parent = int(eager.parent[r, k])
            own = [x for x in ngrams[r, parent].tolist() if x >= 0]
            if math.isfinite(float(eager.record["score"][r, k])):
                assert int(eager.chosen[r, k]) not in python_blocked(own, 2, 7)


# --- sampling --------------------------------------------------------------------------------------

def blocked_outcomes(model, src, length, mapping, *, max_length, block=0, k=0, p=1.0, prefix=(), banned=None):
    """Every outcome of blocked sampling -> its probability: at each step the model's distribution
    with the tokens that would repeat an n-gram set to 0 (and, below the length of a forced
    ``prefix``, every token but the prefix's; and the ``banned`` token), renormalised, then top-k /
    top-p."""
    out: dict[tuple[int, ...], float] = {}

    def walk(seq: tuple[int, ...], prob: float) -> None:
        q = reference_mapping(forward_logits(model, src, length, seq), mapping, {})
        if len(seq) == max_length:  # only EOS may follow
            out[seq + (EOS,) if q[EOS] > 0 else seq] = prob
            return
        for v in range(V):
            if (repeats_ngram(list(seq) + [v], block) or (len(seq) < len(prefix) and v != prefix[len(seq)])
                    or v == banned):
                q[v] = 0.0
        if not q.any():  # nothing left: no outcome (a forced token of probability 0)
            return
        q = truncate(q, k, p)  # renormalised
        for v in range(V):
            if q[v] > 0:
                if v == EOS:
                    out[seq + (EOS,)] = prob * q[v]
                else:
                    walk(seq + (v,), prob * q[v])

    walk((), 1.0)
    return out


@pytest.mark.parametrize("mapping,block,max_length,fields", [
    ("softmax", 1, 3, {}),
    ("softmax", 2, 4, {}),
    ("entmax15", 2, 4, {}),
    ("softmax", 2, 4, dict(sample_topk=3)),
])
def test_blocked_samples_follow_the_renormalised_blocked_distribution(mapping, block, max_length, fields):
    model = tiny_model(mapping, seed=3, scale=1.0)
    src, length = torch.tensor([[3, 4, 5, 6]]), torch.tensor([4])
    exact = blocked_outcomes(model, src, length, mapping, max_length=max_length, block=block,
                             k=fields.get("sample_topk", 0))
    assert abs(sum(exact.values()) - 1) < 1e-9 and len(exact) > 8
    n = 20000
    options = SearchOptions(sample=True, n_best=n, max_length=max_length, seed=5, block_ngram_repeat=block, **fields)
    counts = Counter(outcome for outcome, _ in drawn(sample_search(model, src, length, SPECIAL, options)))
    assert not any(repeats_ngram(list(o), block) for o in counts)
    assert set(counts) <= {o for o, prob in exact.items() if prob > 0}, set(counts) - set(exact)
    assert_fits(counts, exact, n)
    unblocked = Counter(o for o, _ in drawn(sample_search(model, src, length, SPECIAL, options.updated(
        block_ngram_repeat=0))))
    assert any(repeats_ngram(list(o), block) for o in unblocked)  # the model itself repeats


def test_sampling_with_blocking_makes_no_host_sync_in_a_step():
    model = TinyAttentionRNN(mapping="entmax15", seed=7)
    src, lengths = random_sources(5, 13, 6, seed=8)
    with SyncAudit() as audit:
        r = sample_search(model, src, lengths, SPECIAL, SearchOptions(sample=True, n_best=3, max_length=12,
                                                                      stop_every=3, block_ngram_repeat=1,
                                                                      mode="static"))  # auto: dynamic on the CPU
    assert set(audit.counts) <= {"Tensor.__bool__"} and audit.total <= math.ceil(r.steps / 3), audit.report()
    for b in range(5):
        for s in range(3):
            assert not repeats_ngram(r.tokens[b, s, :int(r.lengths[b, s])].tolist(), 1)


def test_the_host_side_definition():
    assert repeats_ngram([3, 4, 3], 1) and not repeats_ngram([3, 4, 3], 2)
    assert repeats_ngram([3, 4, 3, 4], 2) and not repeats_ngram([3, 4, 5, 3, 4, 6], 3)
    assert np.all([not repeats_ngram([], n) for n in (1, 2, 3)])
