"""Coverage penalties of beam search (``-coverage_penalty wu|summary -beta B -stepwise_penalty``).

Independent truths:

* the penalty functions against closed-form values written out by hand;
* the bound the early stop uses, against random coverages grown by random attention;
* certified search against brute force: every output of nonzero probability of tiny decoders whose
  attention depends on the prefix (sparse attention included) is enumerated depth-first, its
  coverage summed in float64 from the decoder's attention at each of its steps, its penalty and
  ranking computed with ``math`` (not ``nmt``'s functions); the certified first hypothesis must
  be the argmax, for both loops, beams 1/2/4/8, every length penalty, both kinds, stepwise on and
  off; every returned hypothesis's ranking must equal its recomputed value;
* the coverage of the chosen output against a teacher-forced recomputation of its attention
  (the attention ``-report_align`` reads, returned with ``return_attention``);
* the torch step against the native selection (the fused native / Triton step is not used with a
  penalty), sync audit, ``torch.compile(fullgraph=True)``;
* ``nmt-translate`` end to end on a tiny trained model (the report's penalties against the
  attention of the Python API), and the one-line errors.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

import nmt
import nmt.translate.search_step as step_module
from nmt.cli import translate as translate_cli
from nmt.translate.beam_search import beam_search
from nmt.translate.coverage_penalty import coverage_penalty, penalty_bound, start_coverage
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import RowState, Specials, select_step
from nmt.translate.static_search import static_step
from nmt.utils.sync_audit import SyncAudit
from test_certificate_bruteforce import found_hypotheses, predicted_certificate
from tiny_runs import reversal_rnn_config, train_run, write_reversal
from toy_decoders import (BOS, EOS, PAD, AttendingMarkovDecoder, enumerate_support, random_sources,
                          tiny_transformer)

MAX_LENGTH = 6
N_SOURCES = 8
EPS = 1e-6
MODES = [dict(mode="dynamic"), dict(mode="static", stop_every=3)]
MODE_IDS = ["dynamic", "static"]


# --- the penalties: closed forms ------------------------------------------------------------------

def reference_penalty(kind: str, coverage: list[float], beta: float, eps: float = EPS) -> float:
    """The penalty of a coverage over the real source tokens, by its definition (float64, math)."""
    if kind == "wu":
        return beta * math.fsum(math.log(min(max(c, eps), 1.0)) for c in coverage)
    return -beta * (math.fsum(max(c, 1.0) for c in coverage) - len(coverage))


def test_penalties_equal_their_closed_forms():
    cov = torch.tensor([[0.5, 1.0, 2.0, 0.0], [0.25, 0.25, 3.5, 1.5]], dtype=torch.float64)
    wu = coverage_penalty("wu", cov, 0.2, 1e-6)
    assert wu[0].item() == pytest.approx(0.2 * (math.log(0.5) + 0 + 0 + math.log(1e-6)), abs=1e-12)
    assert wu[1].item() == pytest.approx(0.2 * 2 * math.log(0.25), abs=1e-12)
    summary = coverage_penalty("summary", cov, 0.2)
    assert summary[0].item() == pytest.approx(-0.2 * ((1 + 1 + 2 + 1) - 4), abs=1e-12)
    assert summary[1].item() == pytest.approx(-0.2 * ((1 + 1 + 3.5 + 1.5) - 4), abs=1e-12)
    assert torch.equal(coverage_penalty("none", cov, 0.0), torch.zeros(2, dtype=torch.float64))
    # a coverage of exactly 1 everywhere costs nothing; the floor keeps wu finite on exact zeros
    assert coverage_penalty("wu", torch.ones(3), 1.0).item() == 0.0
    assert coverage_penalty("summary", torch.ones(3), 1.0).item() == 0.0
    assert math.isfinite(coverage_penalty("wu", torch.zeros(5, dtype=torch.float64), 1.0).item())
    assert coverage_penalty("wu", torch.zeros(5, dtype=torch.float64), 0.5, 1e-3).item() == pytest.approx(
        0.5 * 5 * math.log(1e-3))


def test_padding_positions_start_covered_and_cost_nothing():
    lengths = torch.tensor([3, 1, 4])
    start = start_coverage(lengths, 4)
    assert start.shape == (3, 1, 4)
    assert start[:, 0].tolist() == [[0, 0, 0, 1], [0, 1, 1, 1], [0, 0, 0, 0]]
    g = torch.Generator().manual_seed(0)
    attention = torch.rand(3, 4, generator=g, dtype=torch.float64) * (torch.arange(4) < lengths.unsqueeze(1))
    coverage = start[:, 0].double() + 2.5 * attention
    for kind in ("wu", "summary"):
        got = coverage_penalty(kind, coverage, 0.7)
        for b, n in enumerate(lengths.tolist()):
            assert got[b].item() == pytest.approx(reference_penalty(kind, coverage[b, :n].tolist(), 0.7), abs=1e-12)


@pytest.mark.parametrize("kind", ["wu", "summary"])
def test_the_bound_holds_for_every_extension(kind):
    """``penalty_bound`` of a coverage bounds the penalty of that coverage plus any nonnegative
    attention (random coverages, sparse ones included)."""
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        coverage = torch.rand(6, generator=g, dtype=torch.float64) * 2 * (torch.rand(6, generator=g) < 0.7)
        bound = penalty_bound(kind, coverage_penalty(kind, coverage, 0.4))
        for _ in range(5):
            grown = coverage + torch.rand(6, generator=g, dtype=torch.float64) * (torch.rand(6, generator=g) < 0.5)
            assert coverage_penalty(kind, grown, 0.4).item() <= bound.item() + 1e-12
    assert penalty_bound("wu", torch.tensor(-3.0)).item() == 0.0


# --- brute force ------------------------------------------------------------------------------------

def enumerate_with_coverage(model, src, length, max_length: int, min_length: int = 0) -> dict:
    """Every output of nonzero probability -> (log-probability, coverage of the real source tokens),
    depth-first, the coverage summed in float64 from the attention of each of its steps."""
    n = int(length)
    with torch.no_grad():
        encoder_out, state = model.encode(src.view(1, -1), length.view(1))
        out: dict = {}

        def visit(prefix, logprob, coverage, state):
            t = len(prefix)
            prev = torch.tensor([prefix[-1] if prefix else BOS])
            log_probs, attention, new_state = model.step(prev, state, encoder_out)
            step_cov = [c + a for c, a in zip(coverage, attention[0, :n].double().tolist())]
            for tok, lp in enumerate(log_probs[0].tolist()):
                if lp == -math.inf:
                    continue
                if tok == EOS:
                    if t >= min_length:
                        out[tuple(prefix + [EOS])] = (logprob + lp, step_cov)
                elif t < max_length:
                    visit(prefix + [tok], logprob + lp, step_cov, new_state)

        visit([], 0.0, [0.0] * n, state)
    return out


def reference_rank(seq, logprob: float, coverage: list[float], length_penalty: str, kind: str, beta: float) -> float:
    n = len(seq)
    lp = {"none": 1.0, "average": float(n), "gnmt": ((5.0 + n) / 6.0) ** 0.6}[length_penalty]
    return logprob / lp + reference_penalty(kind, coverage, beta)


COVERAGE_MODELS = {  # name -> AttendingMarkovDecoder keywords
    "sparse": dict(mapping="sparsemax", attention="sparsemax", scale=1.0, eos_bonus=0.8, att_scale=2.0),
    "entmax": dict(mapping="entmax15", attention="entmax15", scale=2.0, eos_bonus=1.5, att_scale=1.5),
    "dense-attention": dict(mapping="sparsemax", attention="softmax", scale=1.0, eos_bonus=0.6, att_scale=1.0),
}
COVERAGE_CASES = [  # (model, seed, length penalty, beta)
    ("sparse", 0, "none", 1.0),
    ("sparse", 1, "average", 0.5),
    ("entmax", 2, "gnmt", 0.8),
    ("dense-attention", 3, "none", 2.0),
]
_ENUM: dict = {}


def coverage_model(name: str, seed: int):
    model = AttendingMarkovDecoder(vocab=7, seed=seed, **COVERAGE_MODELS[name])
    src, lengths = random_sources(N_SOURCES, 9, 5, seed=seed + 11)
    return model, src, lengths


def enumerations(name: str, seed: int, model, src, lengths):
    key = (name, seed)
    if key not in _ENUM:
        _ENUM[key] = [(enumerate_with_coverage(model, src[b], lengths[b], MAX_LENGTH),
                       enumerate_support(model, src[b], lengths[b], MAX_LENGTH)) for b in range(N_SOURCES)]
    return _ENUM[key]


def check_sentence(result, names, b, outputs, support, frontier, cut, beam_size, lp, kind, beta) -> bool:
    """Sentence b against the brute force; returns whether it was certified."""
    exact, reason = predicted_certificate(frontier, cut, beam_size, support, MAX_LENGTH)
    assert bool(result.exact[b]) == exact and names[b] == reason
    ranks = {seq: reference_rank(seq, lp_, cov, lp, kind, beta) for seq, (lp_, cov) in outputs.items()}
    found = found_hypotheses(result, b)
    for i in range(result.tokens.size(1)):  # every complete hypothesis: its own exact ranking
        if not result.complete[b, i]:
            continue
        seq = tuple(result.tokens[b, i, : int(result.lengths[b, i])].tolist())
        assert float(result.scores[b, i]) == pytest.approx(outputs[seq][0], abs=1e-9)
        assert float(result.coverage_penalty[b, i]) == pytest.approx(
            reference_penalty(kind, outputs[seq][1], beta), abs=1e-9)
        assert float(result.ranking_scores[b, i]) == pytest.approx(ranks[seq], abs=1e-9)
    if exact:
        assert set(found) == set(outputs)
        best = max(ranks.values())
        assert float(result.ranking_scores[b, 0]) == pytest.approx(best, abs=1e-9)
        first = tuple(result.tokens[b, 0, : int(result.lengths[b, 0])].tolist())
        assert ranks[first] == pytest.approx(best, abs=1e-9)
    return exact


@pytest.mark.parametrize("stepwise", [False, True], ids=["final", "stepwise"])
@pytest.mark.parametrize("kind", ["wu", "summary"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("name,seed,lp,beta", COVERAGE_CASES)
def test_certified_first_hypothesis_is_the_penalised_argmax(name, seed, lp, beta, mode, kind, stepwise):
    model, src, lengths = coverage_model(name, seed)
    enums = enumerations(name, seed, model, src, lengths)
    certified = changed = 0
    for beam_size in (1, 2, 4, 8):
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, n_best=200,
                             max_length=MAX_LENGTH, length_penalty=lp, coverage_penalty=kind, beta=beta,
                             stepwise_penalty=stepwise, **mode)
        names = result.reason_names()
        for b, (outputs, (support, frontier, cut)) in enumerate(enums):
            assert set(outputs) == set(support)
            if check_sentence(result, names, b, outputs, support, frontier, cut, beam_size, lp, kind, beta):
                certified += 1
                plain = max(outputs, key=lambda s: reference_rank(s, outputs[s][0], outputs[s][1], lp, kind, 0.0))
                penalised = tuple(result.tokens[b, 0, : int(result.lengths[b, 0])].tolist())
                changed += plain != penalised
    assert certified > 0  # not vacuous: certified sentences occur ...
    if name != "dense-attention" or kind == "wu":
        assert changed > 0  # ... and the penalty changes some of their argmaxes


@pytest.mark.parametrize("kind", ["wu", "summary"])
def test_stepwise_changes_what_the_beam_keeps(kind):
    """With pruning, the stepwise penalty keeps other prefixes: some outputs differ from the final-only
    penalty's (both still ranked by the same exact function, checked above)."""
    differ = 0
    for name, seed, lp, beta in COVERAGE_CASES:
        model, src, lengths = coverage_model(name, seed)
        kw = dict(bos=BOS, eos=EOS, beam_size=2, n_best=1, max_length=MAX_LENGTH, length_penalty=lp,
                  coverage_penalty=kind, beta=beta)
        final = beam_search(model, src, lengths, **kw)
        stepwise = beam_search(model, src, lengths, stepwise_penalty=True, **kw)
        differ += int((final.tokens[:, 0] != stepwise.tokens[:, 0]).any(-1).sum()) if \
            final.tokens.shape == stepwise.tokens.shape else 1
    assert differ > 0


TRANSFORMER_COVERAGE = [  # (output, attention, eos bias, seed, length penalty, kind, stepwise)
    ("sparsemax", "entmax15", 1.0, 0, "none", "wu", False),
    ("entmax15", "sparsemax", 1.5, 2, "average", "summary", True),
    ("entmax15", "softmax", 1.5, 1, "gnmt", "wu", True),
]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("output,attention,eos_bias,seed,lp,kind,stepwise", TRANSFORMER_COVERAGE)
def test_certified_transformer_outputs_are_the_penalised_argmax(output, attention, eos_bias, seed, lp, kind,
                                                                stepwise, mode):
    """nmt's Transformer (kv caches; its search attention is the last layer's cross-attention averaged
    over the heads, as ``-report_align``'s), against the brute force."""
    model = tiny_transformer(output=output, attention=attention, eos_bias=eos_bias, seed=seed)
    src, lengths = random_sources(N_SOURCES, 9, 5, seed=seed + 7)
    enums = [(enumerate_with_coverage(model, src[b], lengths[b], MAX_LENGTH),
              enumerate_support(model, src[b], lengths[b], MAX_LENGTH)) for b in range(N_SOURCES)]
    certified = 0
    for beam_size in (1, 2, 4):
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, n_best=200,
                             max_length=MAX_LENGTH, length_penalty=lp, coverage_penalty=kind, beta=0.6,
                             stepwise_penalty=stepwise, **mode)
        names = result.reason_names()
        for b, (outputs, (support, frontier, cut)) in enumerate(enums):
            certified += check_sentence(result, names, b, outputs, support, frontier, cut, beam_size, lp, kind, 0.6)
    assert certified > 0



@pytest.mark.parametrize("kind,done", [("summary", True), ("wu", False), ("none", False)])
def test_the_stop_bound_adds_the_penalty_bound(kind, done):
    """One uncertified row by hand: its 1-best finished hypothesis ranks -2.0; its one live prefix has
    log-probability -0.6 after the step and coverage [2.1, 1.35, 0.55] (summary penalty -1.45 with
    beta 1). Every extension ranks at most -0.6 + 0 under wu (still above -2.0: search on) and at most
    -0.6 - 1.45 = -2.05 under summary (the penalty only falls as coverage grows: the row may stop)."""
    options = SearchOptions(beam_size=2, n_best=1, max_length=10, coverage_penalty=kind,
                            beta=0.0 if kind == "none" else 1.0, certify=False)
    coverage = torch.tensor([[[1.2, 1.3, 0.5], [1.0, 1.0, 1.0]]], dtype=torch.float64)
    rows = RowState(torch.tensor([[-0.5, -math.inf]], dtype=torch.float64), torch.zeros(1, dtype=torch.bool),
                    torch.full((1,), 3), torch.tensor([[-2.0]], dtype=torch.float64), torch.zeros(1, dtype=torch.bool),
                    coverage=None if kind == "none" else coverage)
    log_probs = torch.full((2, 7), -math.inf, dtype=torch.float64)
    log_probs[0, 3] = -0.1  # the one candidate: not EOS, so OpenNMT's "best candidate finished" rule is off
    attention = torch.tensor([[0.9, 0.05, 0.05], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    step = select_step(log_probs, attention, rows, 2, options, Specials(BOS, EOS, PAD))
    assert float(step.rows.scores[0, 0]) == pytest.approx(-0.6)
    if kind == "summary":
        assert float(step.record["coverage_penalty"][0, 0]) == pytest.approx(-1.45)
    assert bool(step.done[0]) is done

# --- the attention the penalty uses ------------------------------------------------------------------

def teacher_forced_coverage(model, src, length, tokens: list[int]) -> list[float]:
    """The coverage of the real source tokens summed over the steps that produce ``tokens`` (the
    model fed BOS and the tokens one by one)."""
    n = int(length)
    with torch.no_grad():
        encoder_out, state = model.encode(src.view(1, -1), length.view(1))
        coverage = [0.0] * n
        prev = BOS
        for tok in tokens:
            _, attention, state = model.step(torch.tensor([prev]), state, encoder_out)
            coverage = [c + a for c, a in zip(coverage, attention[0, :n].double().tolist())]
            prev = tok
    return coverage


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("kind", ["wu", "summary"])
def test_the_penalised_attention_is_the_reported_attention(kind, mode):
    """The coverage behind each hypothesis's penalty equals the sum of the attention the search
    returns for it (``return_attention``, what ``-report_align`` aligns with) and the teacher-forced
    recomputation; complete hypotheses and those cut by max_length alike."""
    model = tiny_transformer(output="entmax15", attention="entmax15", eos_bias=0.0, seed=4)
    src, lengths = random_sources(6, 9, 5, seed=21)
    result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=3, n_best=3, max_length=3,
                         coverage_penalty=kind, beta=0.5, stepwise_penalty=kind == "summary",
                         return_attention=True, **mode)
    seen_cut = False
    for b in range(6):
        n = int(lengths[b])
        for i in range(3):
            length = int(result.lengths[b, i])
            if length == 0:
                continue
            tokens = result.tokens[b, i, :length].tolist()
            forced = teacher_forced_coverage(model, src[b], lengths[b], tokens)
            returned = result.attention[b, i, :length, :n].double().sum(0).tolist()
            assert returned == pytest.approx(forced, abs=1e-9)
            assert float(result.coverage_penalty[b, i]) == pytest.approx(reference_penalty(kind, forced, 0.5), abs=1e-9)
            seen_cut |= not bool(result.complete[b, i])
    assert seen_cut  # hypotheses cut by max_length are ranked by their prefix's coverage


# --- routing, host syncs, one graph ----------------------------------------------------------------------

@pytest.mark.parametrize("stepwise", [False, True])
def test_a_penalty_routes_to_the_torch_step_with_the_same_results(stepwise, monkeypatch):
    """The native / Triton fused step (``step_update``) knows no per-hypothesis ranking term: with a
    penalty it is never called, and the result equals the torch selection's (native candidates off)."""
    model, src, lengths = coverage_model("sparse", 1)
    kw = dict(bos=BOS, eos=EOS, beam_size=3, n_best=4, max_length=MAX_LENGTH, coverage_penalty="wu", beta=0.5,
              stepwise_penalty=stepwise, length_penalty="average")
    calls = []
    real = step_module.step_update
    monkeypatch.setattr(step_module, "step_update", lambda *a, **k: calls.append(1) or real(*a, **k))
    routed = beam_search(model, src, lengths, **kw)
    assert not calls
    beam_search(model, src, lengths, **{**kw, "coverage_penalty": "none", "beta": 0.0, "stepwise_penalty": False})
    assert calls  # the fused step does serve searches without a penalty here
    monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
    torch_only = beam_search(model, src, lengths, **kw)
    for name in ("tokens", "lengths", "scores", "ranking_scores", "coverage_penalty", "exact", "reason", "n_nonzero"):
        assert torch.equal(getattr(routed, name), getattr(torch_only, name)), name


@pytest.mark.parametrize("kind,stepwise", [("wu", False), ("summary", True)])
def test_static_steps_with_a_penalty_make_no_host_sync(kind, stepwise):
    model = AttendingMarkovDecoder(vocab=7, seed=2, **COVERAGE_MODELS["entmax"])
    src, lengths = random_sources(6, 9, 5, seed=8)
    options = SearchOptions(beam_size=4, n_best=2, max_length=5, length_penalty="gnmt", coverage_penalty=kind,
                            beta=0.4, stepwise_penalty=stepwise)
    special = Specials(BOS, EOS, PAD)
    with torch.no_grad():
        encoder_out, state = model.encode(src, lengths)
        rows = RowState.start(6, options.n_best, options.certify, src.device,
                              coverage=start_coverage(lengths, src.size(1)))
        stopped = torch.zeros(6, dtype=torch.bool)
        tokens = torch.full((6,), BOS)
        for t in range(options.max_length + 1):
            with SyncAudit() as audit:
                record, tokens, state, rows, stopped, _ = static_step(model, tokens, state, encoder_out, rows,
                                                                      stopped, t, options, special)
            assert audit.total == 0, f"step {t}: {audit.report()}"
            assert record["coverage_penalty"].shape == (6, 4)
            if t < options.max_length:
                assert rows.coverage.shape == (6, 4, src.size(1))
            if t == 0:
                encoder_out = {k: v.repeat_interleave(4, dim=0) for k, v in encoder_out.items()}


@pytest.mark.parametrize("stop_every", [1, 4])
def test_the_static_search_with_a_penalty_syncs_only_for_its_stop_flags(stop_every):
    """The whole static search: at most one host sync per ``stop_every`` steps and one at the end, as
    without a penalty; the same outputs as the dynamic loop."""
    model = AttendingMarkovDecoder(vocab=7, seed=2, **COVERAGE_MODELS["entmax"])
    src, lengths = random_sources(6, 9, 5, seed=8)
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=3, n_best=2, max_length=8, coverage_penalty="wu", beta=0.5,
              stepwise_penalty=True, length_penalty="average")
    with SyncAudit() as audit:
        static = beam_search(model, src, lengths, mode="static", stop_every=stop_every, **kw)
    assert set(audit.counts) <= {"Tensor.__bool__", "Tensor.__int__"}, audit.report()
    assert audit.total <= math.ceil(static.steps / stop_every) + 1, audit.report()
    dynamic = beam_search(model, src, lengths, mode="dynamic", **kw)
    for name in ("tokens", "lengths", "exact", "reason", "n_nonzero"):
        assert torch.equal(getattr(static, name), getattr(dynamic, name)), name
    torch.testing.assert_close(static.ranking_scores, dynamic.ranking_scores)
    torch.testing.assert_close(static.coverage_penalty, dynamic.coverage_penalty)


@pytest.mark.parametrize("kind,stepwise", [("wu", False), ("summary", True), ("wu", True)])
def test_a_search_step_with_a_penalty_compiles_as_one_graph(kind, stepwise):
    options = SearchOptions(beam_size=4, n_best=2, max_length=10, length_penalty="average", coverage_penalty=kind,
                            beta=0.3, stepwise_penalty=stepwise)
    special = Specials(BOS, EOS, PAD)
    g = torch.Generator().manual_seed(0)
    coverage = torch.rand(6, 4, 5, generator=g, dtype=torch.float64) * (torch.rand(6, 4, 5, generator=g) < 0.6)
    rows = RowState(torch.randn(6, 4, generator=g, dtype=torch.float64), torch.ones(6, dtype=torch.bool),
                    torch.zeros(6, dtype=torch.long), torch.full((6, 2), -5.0, dtype=torch.float64),
                    torch.zeros(6, dtype=torch.bool), coverage=coverage)
    log_probs = torch.log_softmax(torch.randn(24, 11, generator=g, dtype=torch.float64), -1)
    attention = torch.softmax(torch.randn(24, 5, generator=g, dtype=torch.float64), -1)
    compiled = torch.compile(select_step, fullgraph=True)(log_probs, attention, rows, 3, options, special)
    eager = select_step(log_probs, attention, rows, 3, options, special)
    for name in ("chosen", "parent", "done"):
        assert torch.equal(getattr(compiled, name), getattr(eager, name)), name
    assert torch.equal(compiled.rows.scores, eager.rows.scores)
    assert torch.allclose(compiled.rows.coverage, eager.rows.coverage)
    assert torch.allclose(compiled.record["coverage_penalty"], eager.record["coverage_penalty"])
    # the kept coverages: the parent's plus the parent row's attention
    expected = (coverage + attention.view(6, 4, 5)).gather(1, eager.parent.unsqueeze(-1).expand(-1, -1, 5))
    assert torch.allclose(eager.rows.coverage, expected)


def test_stepwise_selection_ranks_candidates_by_their_penalised_ranking():
    """One step by hand: the kept candidates are the best of log p / lp(t+1) + cp(parent's coverage
    after the step), their recorded scores the plain log-probabilities."""
    options = SearchOptions(beam_size=3, n_best=1, max_length=10, length_penalty="average", coverage_penalty="summary",
                            beta=2.0, stepwise_penalty=True, certify=False)
    g = torch.Generator().manual_seed(5)
    scores = -torch.rand(2, 3, generator=g, dtype=torch.float64) * 3
    coverage = torch.rand(2, 3, 4, generator=g, dtype=torch.float64) * 2
    rows = RowState(scores, torch.zeros(2, dtype=torch.bool), torch.full((2,), 3), torch.full((2, 1), -math.inf,
                    dtype=torch.float64), torch.zeros(2, dtype=torch.bool), coverage=coverage)
    log_probs = torch.log_softmax(torch.randn(6, 8, generator=g, dtype=torch.float64), -1)
    attention = torch.softmax(torch.randn(6, 4, generator=g, dtype=torch.float64), -1)
    step = select_step(log_probs, attention, rows, 4, options, Specials(BOS, EOS, PAD))
    for r in range(2):
        ranked = []
        for s in range(3):
            cov = (coverage[r, s] + attention[3 * r + s]).tolist()
            for v in range(8):
                logp = scores[r, s].item() + log_probs[3 * r + s, v].item()
                ranked.append((logp / 5 + reference_penalty("summary", cov, 2.0), s, v, logp))
        ranked.sort(reverse=True)
        for j, (_, s, v, logp) in enumerate(ranked[:3]):
            assert (int(step.parent[r, j]), int(step.chosen[r, j])) == (s, v)
            assert float(step.record["score"][r, j]) == pytest.approx(logp, abs=1e-12)


# --- errors --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields,message", [
    (dict(coverage_penalty="gnmt"), r"^coverage_penalty must be one of none, wu, summary, got 'gnmt'$"),
    (dict(coverage_penalty="wu", beta=-0.1), r"^beta must be a finite number >= 0, got -0.1$"),
    (dict(coverage_penalty="wu", beta=math.inf), r"^beta must be a finite number >= 0, got inf$"),
    (dict(beta=0.2), r"^beta applies to coverage_penalty wu or summary, got 0.2 with coverage_penalty none$"),
    (dict(stepwise_penalty=True), r"^stepwise_penalty applies to coverage_penalty wu or summary"),
    (dict(coverage_penalty="wu", coverage_epsilon=0.0), r"^coverage_epsilon must be in \(0, 1\], got 0.0$"),
    (dict(coverage_penalty="summary", coverage_epsilon=1e-3), r"^coverage_epsilon applies to coverage_penalty wu"),
    (dict(coverage_penalty="wu", beta=0.2, sample=True),
     r"^coverage_penalty must be none with sample=True \(samples are not ranked\), got 'wu'$"),
    (dict(coverage_penalty="wu", stepwise_penalty=1), r"^stepwise_penalty must be True or False, got 1$"),
])
def test_bad_options_are_one_line_errors_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        SearchOptions(**fields)


def test_a_model_without_attention_is_a_clear_error():
    class NoAttention(AttendingMarkovDecoder):
        def step(self, tokens, state, encoder_out):
            log_probs, _, state = super().step(tokens, state, encoder_out)
            return log_probs, None, state

    model = NoAttention(vocab=7, seed=0, **COVERAGE_MODELS["sparse"])
    src, lengths = random_sources(2, 9, 5, seed=0)
    with pytest.raises(ValueError, match="returns no source attention"):
        beam_search(model, src, lengths, bos=BOS, eos=EOS, coverage_penalty="wu", beta=0.2)


def test_report_settings_name_the_penalty():
    assert SearchOptions().report_settings() is None
    assert SearchOptions(coverage_penalty="summary", beta=0.2).report_settings() == {
        "coverage_penalty": "summary", "beta": 0.2, "stepwise_penalty": False}
    assert SearchOptions(coverage_penalty="wu", beta=1, stepwise_penalty=True).report_settings() == {
        "coverage_penalty": "wu", "beta": 1.0, "stepwise_penalty": True, "coverage_epsilon": 1e-6}


# --- nmt-translate end to end ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> dict:
    """A tiny RNN (sparsemax attention, entmax15 output) trained by nmt-train to reverse letters."""
    root = tmp_path_factory.mktemp("coverage_cli")
    write_reversal(root, 160, 8, spaced_target=True)
    train_run(reversal_rnn_config(root, "space", "space", 60), root / "config.yaml")
    inputs = ["a b c", "d e", "f a b d", "c c e", "b"]
    (root / "input.txt").write_text("".join(line + "\n" for line in inputs), encoding="utf-8")
    return {"root": root, "model": str(root / "run" / "best.pt"), "inputs": inputs}


def run(args: list[str], capsys) -> tuple[int, str, str]:
    code = translate_cli.main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("kind,stepwise", [("wu", False), ("summary", True)])
def test_cli_reports_each_outputs_penalty(tiny_model, kind, stepwise, capsys, tmp_path):
    report = tmp_path / "report.jsonl"
    args = ["-model", tiny_model["model"], "-src", str(tiny_model["root"] / "input.txt"), "-output", "-",
            "-beam_size", "3", "-n_best", "2", "-max_length", "8", "-threads", "1", "-quiet",
            "-coverage_penalty", kind, "-beta", "0.4", "-report", str(report), "-report_align"]
    if stepwise:
        args.append("-stepwise_penalty")
    code, out, err = run(args, capsys)
    assert code == 0, err
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(tiny_model["inputs"])
    model = nmt.load(tiny_model["model"], device="cpu")
    api = model.translate(tiny_model["inputs"], beam_size=3, n_best=2, max_length=8, coverage_penalty=kind,
                          beta=0.4, stepwise_penalty=stepwise, return_attention=True)
    for record, translation, line in zip(records, api, out.splitlines()[::2]):  # -n_best 2: two lines each
        assert record["decoding"]["coverage_penalty"] == kind and record["decoding"]["beta"] == 0.4
        assert record["decoding"]["stepwise_penalty"] is stepwise
        assert all(entry["coverage_penalty"] <= 0 for entry in record["nbest"])
        assert record["nbest"][0]["text"] == translation.text == line.split(" ||| ")[0]
        # the best output's penalty from the attention the API returns (its steps x source tokens)
        coverage = translation.attention.astype("float64").sum(0).tolist()
        assert record["nbest"][0]["coverage_penalty"] == pytest.approx(reference_penalty(kind, coverage, 0.4),
                                                                       abs=1e-5)
        assert [h.coverage_penalty for h in translation.nbest] == pytest.approx(
            [entry["coverage_penalty"] for entry in record["nbest"]], abs=1e-6)
        # n-best order: log-probability (no length penalty) + penalty, descending
        ranking = [entry["logprob"] + entry["coverage_penalty"] for entry in record["nbest"]]
        assert ranking == sorted(ranking, reverse=True)


@pytest.mark.parametrize("flags,message", [
    (["-beta", "0.3"], "-beta applies to coverage_penalty wu or summary"),
    (["-stepwise_penalty"], "-stepwise_penalty applies to coverage_penalty wu or summary"),
    (["-coverage_penalty", "wu", "-beta", "-1"], "-beta must be a finite number >= 0, got -1.0"),
    (["-coverage_penalty", "wu", "-beta", "nan"], "-beta must be a finite number, got nan"),
    (["-coverage_penalty", "summary", "-beta", "0.2", "-sample"], "-coverage_penalty summary does not apply to -sample"),
    (["-coverage_penalty", "wu", "-mode", "score", "-tgt", "REF"],
     "-coverage_penalty applies to translation, not to scoring (-mode score)"),
])
def test_cli_errors_are_one_line(tiny_model, flags, message, capsys):
    root = tiny_model["root"]
    flags = [str(root / "valid.tgt") if f == "REF" else f for f in flags]
    code, out, err = run(["-model", tiny_model["model"], "-src", str(root / "input.txt"), "-output", "-",
                          "-quiet", *flags], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("kind", ["wu", "summary"])
def test_an_ensemble_is_penalised_by_its_members_mean_attention(kind, mode):
    """An ensemble's coverage is the mean of its members' coverages (its attention is their mean):
    each complete hypothesis's penalty against each member's own teacher-forced coverage, averaged."""
    from nmt.translate.ensemble import Ensemble

    members = [AttendingMarkovDecoder(vocab=7, seed=s, **COVERAGE_MODELS["entmax"]) for s in (4, 5)]
    src, lengths = random_sources(4, 9, 5, seed=6)
    result = beam_search(Ensemble(members), src, lengths, bos=BOS, eos=EOS, beam_size=4, n_best=4,
                         max_length=MAX_LENGTH, coverage_penalty=kind, beta=0.7, **mode)
    checked = 0
    for b in range(src.size(0)):
        for i in range(result.tokens.size(1)):
            if not result.complete[b, i]:
                continue
            tokens = result.tokens[b, i, : int(result.lengths[b, i])].tolist()
            each = [teacher_forced_coverage(m, src[b], lengths[b], tokens) for m in members]
            mean = [math.fsum(c) / len(c) for c in zip(*each)]
            assert float(result.coverage_penalty[b, i]) == pytest.approx(reference_penalty(kind, mean, 0.7), abs=1e-9)
            checked += 1
    assert checked >= src.size(0)
