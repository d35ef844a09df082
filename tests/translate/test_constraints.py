"""Lexically constrained beam search (``beam_search(..., constraints=)``, ``nmt-translate -constraints``).

The independent truth is brute force: the toy decoders' whole support (``enumerate_support``), kept
to the outputs that meet the constraints by plain Python predicates written here (a substring scan;
for ``ordered``, an exhaustive search over every choice of occurrences, not the automaton's greedy
earliest match), and the prefixes that can still meet them within ``max_length`` by trying every
completion over the phrases' tokens. A certified sentence must have found exactly that support and
ranked its argmax first; the certificate's verdict (and its first reason) must be what the
enumeration predicts: pruned where a step had more than ``k`` feasible candidates, max_length where
a candidate of nonzero probability could not meet the constraints in time or a live hypothesis
was cut, no_hypothesis where no output meets them.
"""
from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from itertools import product

import pytest
import torch

import nmt.translate.search_step as step_module
from nmt.translate.beam_search import beam_search
from nmt.translate.constraint_automaton import (FREE, ConstraintError, batch_tables, build_automaton, holds_phrase,
                                                phrases_met)
from nmt.translate.constraint_search import ConstraintState, constrained_candidates
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import RowState, Specials, select_step
from nmt.translate.static_search import static_step
from nmt.utils.sync_audit import SyncAudit
from test_certificate_bruteforce import CASES, MAX_LENGTH, MODES, MODE_IDS, N_SOURCES, found_hypotheses, model_and_sources, rank
from test_static_search import trained_model  # noqa: F401 (a fixture)
from toy_decoders import BOS, EOS, PAD, TinyAttentionRNN, enumerate_support, random_sources, tiny_transformer

ORDINARY = (3, 4, 5, 6)  # the toy decoders' ordinary tokens (vocabulary 7)


# --- the independent definitions ------------------------------------------------------------------

def meets(tokens, phrases, mode: str, as_set: bool = False) -> bool:
    """Whether ``tokens`` meet ``phrases``: unordered, each phrase listed k times is a contiguous run
    at k or more start positions (overlapping ones counted); ordered, some choice of occurrences puts
    them in order, each after the previous one's end (every choice tried). ``as_set``: the old
    unordered rule (a phrase listed twice asked for once), to show the constraints' repeats bite."""
    tokens, phrases = tuple(tokens), [tuple(p) for p in phrases]

    def at(seq, phrase):
        n = len(phrase)
        return [i for i in range(len(seq) - n + 1) if seq[i:i + n] == phrase]

    if mode == "unordered":
        return all(len(at(tokens, p)) >= (1 if as_set else phrases.count(p)) for p in phrases)

    def rest(start: int, j: int) -> bool:
        if j == len(phrases):
            return True
        return any(rest(i + len(phrases[j]), j + 1) for i in at(tokens, phrases[j]) if i >= start)

    return rest(0, 0)


def predicates(phrases, mode: str, max_length: int, as_set: bool = False):
    """(accepts, feasible) for ``enumerate_support``: feasible(prefix) tries every completion of at
    most ``max_length - len(prefix)`` phrase tokens (a token of no phrase never helps: removing it
    from a completion keeps every occurrence that did not contain it)."""
    alphabet = sorted({t for p in phrases for t in p})

    def accepts(tokens) -> bool:
        return meets(tokens, phrases, mode, as_set)

    @lru_cache(maxsize=None)
    def feasible_tuple(prefix: tuple) -> bool:
        budget = max_length - len(prefix)
        return any(accepts(prefix + tail) for n in range(budget + 1) for tail in product(alphabet, repeat=n))

    return accepts, (lambda tokens: feasible_tuple(tuple(tokens)))


def constrained_enumeration(model, src, length, phrases, mode, max_length=MAX_LENGTH, min_length=0,
                            as_set: bool = False):
    """(support, frontier, cut, first dropped step or None) of the constrained problem."""
    accepts, feasible = predicates(phrases, mode, max_length, as_set)
    dropped: list[int] = []
    support, frontier, cut = enumerate_support(model, src, length, max_length, min_length, accepts=accepts,
                                               feasible=feasible, dropped=dropped)
    return support, frontier, cut, min(dropped) if dropped else None


def predicted(frontier, cut, dropped, beam_size, support, max_length=MAX_LENGTH):
    """The certificate of a search that loses nothing until its first violation: the earliest of a
    step with more than ``beam_size`` feasible candidates (pruned), a dropped candidate (max_length,
    recorded before the step's pruning) and a cut at the last step."""
    events = [(t, 1, "pruned") for t, n in enumerate(frontier[:max_length]) if n > beam_size]
    if dropped is not None:
        events.append((dropped, 0, "max_length"))
    if cut:
        events.append((max_length, 0, "max_length"))
    if events:
        return False, min(events)[2]
    if not support:
        return False, "no_hypothesis"
    return True, None


def check_sentence(result, names, b, enum, beam_size, penalty, phrases, mode, max_length=MAX_LENGTH,
                   tol: float = 1e-9) -> bool:
    """Sentence b against its constrained enumeration; returns whether it was certified."""
    support, frontier, cut, dropped = enum
    exact, reason = predicted(frontier, cut, dropped, beam_size, support, max_length)
    assert (bool(result.exact[b]), names[b]) == (exact, reason)
    found = found_hypotheses(result, b)
    for seq, logprob in found.items():
        assert seq in support and logprob == pytest.approx(support[seq], abs=tol)
    assert int(result.n_nonzero[b]) == len(found)
    assert float(result.mass[b]) == pytest.approx(math.fsum(math.exp(v) for v in found.values()), abs=tol)
    for i in range(result.tokens.size(1)):  # every output, complete or cut, meets the constraints
        n = int(result.lengths[b, i])
        if n:
            tokens = [t for t in result.tokens[b, i, :n].tolist() if t != EOS]
            assert meets(tokens, phrases, mode), (tokens, phrases, mode)
    if exact:
        assert set(found) == set(support)
        best = max(rank(s, v, penalty) for s, v in support.items())
        first = tuple(result.tokens[b, 0, : int(result.lengths[b, 0])].tolist())
        assert rank(first, support[first], penalty) == pytest.approx(best, abs=tol)
    if not support:  # no complete output (a live hypothesis cut at max_length that meets them may be returned)
        assert not bool(result.complete[b, 0]) and (int(result.lengths[b, 0]) == 0 or cut)
    return exact


def tables(constraint_sets, mode):
    return batch_tables([build_automaton(p, mode) for p in constraint_sets])


# --- constraint sets that exercise the automata ----------------------------------------------------

def chosen_constraints(model, src, lengths, min_length: int) -> list[list[tuple[int, ...]]]:
    """Per toy source, from its unconstrained support (so that the constraints bite but can be met),
    one of: none; a one-token phrase; a bigram; two overlapping bigrams (x y, y z); a phrase and a
    phrase it starts (x, x y); a repeated phrase (by the pick: x twice, a bigram twice, or x twice
    around another phrase); two one-token phrases in the order opposite to their first occurrence
    (ordered bites); a phrase too long for max_length (impossible)."""
    out = []
    for b in range(src.size(0)):
        support, _, _ = enumerate_support(model, src[b], lengths[b], MAX_LENGTH, min_length)
        ranked = [tuple(t for t in s if t != EOS) for s in sorted(support, key=support.get, reverse=True)]
        ranked = [s for s in ranked if s] or [(3, 4, 5)]
        pick = ranked[min(1 + b // 8, len(ranked) - 1)]
        longest = max(ranked[:6], key=len)
        x = pick[0]
        kind = b % 8
        if kind == 0:
            out.append([])
        elif kind == 1:
            out.append([(pick[-1],)])
        elif kind == 2:
            out.append([longest[:2]] if len(longest) >= 2 else [longest])
        elif kind == 3:
            out.append([longest[:2], longest[1:3]] if len(longest) >= 3 else [(x,), (x, x)])
        elif kind == 4:
            out.append([(x,), pick[:2] if len(pick) >= 2 else (x, x)])
        elif kind == 5:
            bigram = pick[:2] if len(pick) >= 2 else (x, x)
            out.append([[(x,), (x,)], [bigram, bigram], [(x,), (pick[-1],), (x,)]][(sum(pick) + len(ranked)) % 3])
        elif kind == 6:
            out.append([(longest[-1],), (longest[0],)])
        else:
            out.append([(x,) * (MAX_LENGTH + 1)])
    return out


_ENUMS: dict = {}


def enumerations(name, seed, min_length, mode):
    key = (name, seed, min_length, mode)
    if key not in _ENUMS:
        model, src, lengths = model_and_sources(name, seed)
        sets = chosen_constraints(model, src, lengths, min_length)
        _ENUMS[key] = sets, [constrained_enumeration(model, src[b], lengths[b], sets[b], mode, min_length=min_length)
                             for b in range(N_SOURCES)]
    return _ENUMS[key]


def check_constrained_search(name, seed, penalty, min_length, constraint_mode, **search) -> Counter:
    model, src, lengths = model_and_sources(name, seed)
    sets, enums = enumerations(name, seed, min_length, constraint_mode)
    seen: Counter = Counter()
    for beam_size in (1, 2, 4, 8):
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, n_best=200,
                             max_length=MAX_LENGTH, min_length=min_length, length_penalty=penalty,
                             constraints=tables(sets, constraint_mode), **search)
        names = result.reason_names()
        for b in range(N_SOURCES):
            certified = check_sentence(result, names, b, enums[b], beam_size, penalty, sets[b], constraint_mode)
            seen[names[b]] += 1
            if certified and sets[b]:
                seen["certified with constraints"] += 1
                free, _, _ = enumerate_support(model, src[b], lengths[b], MAX_LENGTH, min_length)
                if max(free, key=lambda s: rank(s, free[s], penalty)) not in enums[b][0]:
                    seen["argmax excluded"] += 1
                if constraint_mode == "unordered" and len(set(sets[b])) < len(sets[b]):
                    seen["certified with a repeated phrase"] += 1
                    once, _, _, _ = constrained_enumeration(model, src[b], lengths[b], sets[b], "unordered",
                                                            min_length=min_length, as_set=True)
                    if max(once, key=lambda s: rank(s, once[s], penalty)) not in enums[b][0]:
                        seen["repeat excludes the set's argmax"] += 1
    return seen


@pytest.mark.parametrize("constraint_mode", ["unordered", "ordered"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("name,seed,penalty,min_length", CASES)
def test_certified_search_is_exact_for_the_constrained_problem(name, seed, penalty, min_length, mode, constraint_mode):
    check_constrained_search(name, seed, penalty, min_length, constraint_mode, **mode)


def test_the_constraints_bite():
    """Not vacuous: certified constrained sentences whose unconstrained argmax the constraints exclude,
    sentences with no output that meets them, and every reason of the certificate."""
    seen: Counter = Counter()
    for name, seed, penalty, min_length in CASES:
        for constraint_mode in ("unordered", "ordered"):
            seen.update(check_constrained_search(name, seed, penalty, min_length, constraint_mode, mode="dynamic"))
    assert seen["certified with constraints"] >= 20 and seen["argmax excluded"] >= 10, seen
    assert seen["no_hypothesis"] > 0 and seen["pruned"] > 0 and seen["max_length"] > 0, seen
    # a phrase given twice asks for two occurrences: certified sentences whose first hypothesis under
    # the old rule (the phrases a set) has too few of them
    assert seen["certified with a repeated phrase"] >= 5 and seen["repeat excludes the set's argmax"] >= 3, seen


# --- the automata against the definitions ----------------------------------------------------------

PHRASE_SETS = [
    [(3,)], [(3, 4)], [(3, 4), (4, 5)], [(3, 3)], [(3,), (3, 4)], [(3, 4), (3,)], [(3,), (3,)], [(4, 3), (3, 4)],
    [(3, 4, 3)], [(3, 3, 4)], [(4,), (3,)], [(3, 4), (4, 3), (5,)], [(3, 4, 5), (4,)], [(5, 5), (5,), (5, 5, 5)],
    # repeated phrases: self-overlapping ones (a a twice: a a a meets it), around others, three times
    [(3, 3), (3, 3)], [(3, 4), (4,), (3, 4)], [(3,), (3,), (3,)], [(3, 4, 3), (3, 4, 3)], [(3,), (3, 4), (3,)],
    [(4, 3), (3, 4), (4, 3)], [(5, 5), (5,), (5, 5), (5,)],
]


@pytest.mark.parametrize("mode", ["unordered", "ordered"])
@pytest.mark.parametrize("phrases", PHRASE_SETS, ids=str)
def test_the_automaton_accepts_what_the_definition_does(phrases, mode):
    """Every sequence of up to 6 tokens over 3, 4, 5 and another token (6): the automaton accepts it
    iff the definition does, and each state's distance is the shortest completion of any sequence
    leading to it (tried over every completion); overlaps, prefixes of other phrases, repeats."""
    automaton = build_automaton(phrases, mode)
    _, feasible = predicates(phrases, mode, 6)
    alphabet = (3, 4, 5, 6)
    for n in range(7):
        for seq in product(alphabet, repeat=n):
            assert automaton.accepts(seq) == meets(seq, phrases, mode), seq
            state = automaton.run(seq)
            if n <= 3:  # the distance: the fewest tokens that complete it (every completion tried)
                need = next(d for d in range(20) if predicates(phrases, mode, n + d)[1](seq))
                assert automaton.dist[state] == need, (seq, automaton.dist[state], need)
            met = phrases_met(seq, phrases, mode)
            assert (met[-1] if mode == "ordered" else all(met)) == meets(seq, phrases, mode), seq
            if mode == "unordered":  # entry j: at least as many occurrences as entries 0..j of its phrase
                assert met == [meets(seq, [p] * phrases[: j + 1].count(p), mode) for j, p in enumerate(phrases)], seq
    assert all(holds_phrase(list(p), p) for p in phrases)


def test_the_automata_are_small_and_bad_phrases_are_refused():
    assert build_automaton([], "ordered") is FREE and FREE.accepts([]) and FREE.states == 1
    assert build_automaton([(3, 4), (5,)], "ordered").states == 4  # (0,0) (0,1) (1,0) done
    with pytest.raises(ConstraintError, match=r"^input 3: constraint phrase 2 has no token$"):
        build_automaton([(3,), ()], "unordered", index=2)
    with pytest.raises(ValueError, match="constraints mode must be one of unordered, ordered, got 'any'"):
        build_automaton([(3,)], "any")
    with pytest.raises(ConstraintError, match="more than 4096 states"):
        build_automaton([(t, t + 1) for t in range(3, 30, 2)], "unordered")


def moore_classes(automaton) -> int:
    """The number of Myhill-Nerode classes of ``automaton``'s states: Moore's partition refinement
    (accepting or not, then by the classes of the successors) until it is stable."""
    cls = [int(d == 0) for d in automaton.dist]
    while True:
        signature = [(cls[q], tuple(cls[n] for n in row)) for q, row in enumerate(automaton.table)]
        numbered = {sig: i for i, sig in enumerate(dict.fromkeys(signature))}
        new = [numbered[sig] for sig in signature]
        if len(set(new)) == len(set(cls)):
            return len(set(new))
        cls = new


@pytest.mark.parametrize("phrases", PHRASE_SETS + [
    [(3,), (4,), (5,)], [(3, 4), (4, 5), (5, 3)], [(3, 3), (3,), (4, 3, 4)], [(3, 4, 5), (4,), (5, 5)]], ids=str)
def test_the_unordered_automaton_is_minimal(phrases):
    """No two states of the unordered automaton accept the same continuations (Moore's refinement
    finds as many classes as states), so the state limit refuses only constraints that need that
    many states: n one-token phrases 2^n (the sets met), n phrases of 3 tokens of their own
    (n + 1) 2^n (with u unmet: a node 0, 1 or 2 tokens into one of them)."""
    automaton = build_automaton(phrases, "unordered")
    assert moore_classes(automaton) == automaton.states
    for n in (3, 10, 12):
        assert build_automaton([(t,) for t in range(10, 10 + n)], "unordered").states == 2 ** n
    for n in (2, 4, 8):
        assert build_automaton([(10 + 3 * i, 11 + 3 * i, 12 + 3 * i) for i in range(n)], "unordered").states == \
            (n + 1) * 2 ** n


@pytest.mark.parametrize("phrase", [(3,), (3, 4), (3, 3), (3, 4, 3), (3, 3, 4), (3, 4, 5, 3)], ids=str)
def test_a_phrase_given_k_times_needs_k_occurrences_and_k_length_plus_one_states(phrase):
    """One phrase of L tokens given k times: the minimal automaton (no two states equivalent) has
    k L + 1 states, accepts a sequence iff it holds k or more occurrences of the phrase (overlapping
    ones counted, every sequence of up to 7 tokens), and its start needs the shortest such sequence
    (searched by brute force over the phrase's tokens)."""
    alphabet = sorted(set(phrase)) + [6]
    for k in (1, 2, 3):
        automaton = build_automaton([phrase] * k, "unordered")
        assert automaton.states == k * len(phrase) + 1 and moore_classes(automaton) == automaton.states
        for n in range(8):
            for seq in product(alphabet, repeat=n):
                count = sum(seq[i:i + len(phrase)] == phrase for i in range(n - len(phrase) + 1))
                assert automaton.accepts(seq) == (count >= k), (seq, k)
        shortest = next(n for n in range(20) for seq in product(alphabet[:-1], repeat=n)
                        if sum(seq[i:i + len(phrase)] == phrase for i in range(n - len(phrase) + 1)) >= k)
        assert automaton.dist[0] == shortest
    assert build_automaton([(3, 3)] * 2, "unordered").accepts((3, 3, 3))  # overlapping occurrences count
    assert phrases_met((3, 5, 3), [(3,), (4,), (3,), (3,)], "unordered") == [True, False, True, False]


# --- other models, penalties, ensembles ------------------------------------------------------------

TRANSFORMERS = {
    "transformer": dict(output="entmax15", attention="entmax15", eos_bias=2.0, seed=2),
    "transformer-sparsemax": dict(output="sparsemax", attention="softmax", eos_bias=1.0, seed=0),
}


@pytest.mark.parametrize("constraint_mode", ["unordered", "ordered"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("name", ["transformer", "transformer-sparsemax", "lstm"])
def test_transformers_and_lstms_against_brute_force(name, mode, constraint_mode, trained_model):
    """nmt's Transformer (kv caches reordered by the beam) and LSTM (the copy-task model of the static
    search's tests, 1.5-entmax attention and output) against the constrained brute force."""
    if name == "lstm":
        from test_static_search import TRAINED_VOCAB

        model, vocab = trained_model, TRAINED_VOCAB
    else:
        model, vocab = tiny_transformer(**TRANSFORMERS[name]), 7
    src, lengths = random_sources(N_SOURCES, vocab, 5, seed=9)
    sets = chosen_constraints(model, src, lengths, 0)
    enums = [constrained_enumeration(model, src[b], lengths[b], sets[b], constraint_mode) for b in range(N_SOURCES)]
    certified = 0
    for beam_size in (1, 2, 4):
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, beam_size=beam_size, n_best=200,
                             max_length=MAX_LENGTH, length_penalty="average",
                             constraints=tables(sets, constraint_mode), **mode)
        names = result.reason_names()
        for b in range(N_SOURCES):
            certified += check_sentence(result, names, b, enums[b], beam_size, "average", sets[b], constraint_mode,
                                        tol=3e-5 if name == "lstm" else 1e-9)  # the LSTM: float32 (~1e-6 relative)
    assert certified > 0 or name == "lstm"  # the LSTM's outputs are not sparse enough to certify with k <= 4


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_a_dense_output_is_never_certified_but_meets_the_constraints(mode):
    model = TinyAttentionRNN(vocab=11, mapping="softmax", seed=1)
    src, lengths = random_sources(5, 13, 6, seed=2)
    sets = [[(4,)], [(5, 6)], [(7,), (8, 9)], [], [(3, 3)]]
    for constraint_mode in ("unordered", "ordered"):
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=3, n_best=3, max_length=8,
                             constraints=tables(sets, constraint_mode), **mode)
        assert result.reason_names() == ["pruned"] * 5
        for b in range(5):
            assert bool(result.complete[b, 0])  # a dense model gives every constrained output nonzero probability
            for i in range(3):
                n = int(result.lengths[b, i])
                assert meets([t for t in result.tokens[b, i, :n].tolist() if t != EOS], sets[b], constraint_mode)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_an_ensemble_against_brute_force(mode):
    from nmt.translate.ensemble import Ensemble
    from toy_decoders import MarkovDecoder

    model = Ensemble([MarkovDecoder(vocab=7, mapping="sparsemax", scale=1.0, eos_bonus=1.2, seed=s) for s in (2, 3)])
    src, lengths = random_sources(N_SOURCES, 9, 5, seed=4)
    sets = chosen_constraints(model, src, lengths, 0)
    certified = 0
    for constraint_mode in ("unordered", "ordered"):
        enums = [constrained_enumeration(model, src[b], lengths[b], sets[b], constraint_mode) for b in range(N_SOURCES)]
        for beam_size in (1, 2, 4, 8):
            result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, n_best=200,
                                 max_length=MAX_LENGTH, constraints=tables(sets, constraint_mode), **mode)
            names = result.reason_names()
            for b in range(N_SOURCES):
                certified += check_sentence(result, names, b, enums[b], beam_size, "none", sets[b], constraint_mode)
    assert certified > 0


@pytest.mark.parametrize("stepwise", [False, True], ids=["final", "stepwise"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_with_a_coverage_penalty_the_certified_first_is_the_penalised_constrained_argmax(mode, stepwise):
    from test_coverage_penalty import coverage_model, enumerate_with_coverage, reference_rank

    certified = 0
    for name, seed, lp, beta in (("sparse", 0, "none", 1.0), ("entmax", 2, "gnmt", 0.8)):
        model, src, lengths = coverage_model(name, seed)
        sets = chosen_constraints(model, src, lengths, 0)
        for constraint_mode in ("unordered", "ordered"):
            enums = [constrained_enumeration(model, src[b], lengths[b], sets[b], constraint_mode)
                     for b in range(N_SOURCES)]
            outputs = [enumerate_with_coverage(model, src[b], lengths[b], MAX_LENGTH) for b in range(N_SOURCES)]
            for beam_size in (1, 2, 4, 8):
                result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, n_best=200,
                                     max_length=MAX_LENGTH, length_penalty=lp, coverage_penalty="wu", beta=beta,
                                     stepwise_penalty=stepwise, constraints=tables(sets, constraint_mode), **mode)
                names = result.reason_names()
                for b in range(N_SOURCES):
                    support, frontier, cut, dropped = enums[b]
                    exact, reason = predicted(frontier, cut, dropped, beam_size, support)
                    assert (bool(result.exact[b]), names[b]) == (exact, reason)
                    if exact:
                        certified += 1
                        ranks = {s: reference_rank(s, *outputs[b][s], lp, "wu", beta) for s in support}
                        first = tuple(result.tokens[b, 0, : int(result.lengths[b, 0])].tolist())
                        assert ranks[first] == pytest.approx(max(ranks.values()), abs=1e-9)
                        assert float(result.ranking_scores[b, 0]) == pytest.approx(max(ranks.values()), abs=1e-9)
    assert certified > 0


# --- without constraints nothing changes; the selection itself --------------------------------------

@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_sentences_without_phrases_search_as_without_constraints(mode, monkeypatch):
    """Automata of no phrase (one accepting state): every candidate is in bank 0, so the allocation is
    the plain top k; the same n-best lists (up to the order of candidates of equal score, which the
    two selections break differently), scores and certificates as no constraints at all (the torch
    selection both times)."""
    monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
    monkeypatch.setattr(step_module, "step_update", lambda *args, **kwargs: None)
    for name, seed, penalty, min_length in CASES[::2]:
        model, src, lengths = model_and_sources(name, seed)
        for beam_size in (1, 3, 8):
            kw = dict(bos=BOS, eos=EOS, beam_size=beam_size, n_best=5, max_length=MAX_LENGTH, min_length=min_length,
                      length_penalty=penalty, **mode)
            plain = beam_search(model, src, lengths, **kw)
            free = beam_search(model, src, lengths, constraints=tables([[]] * N_SOURCES, "unordered"), **kw)
            for field in ("scores", "ranking_scores", "exact", "reason", "n_nonzero", "lengths"):
                assert torch.equal(getattr(plain, field), getattr(free, field)), field
            assert torch.allclose(plain.mass, free.mass, rtol=1e-12, atol=0) and plain.steps == free.steps
            for b in range(N_SOURCES):  # a pruned sentence may keep another of candidates of equal score
                if not bool(plain.exact[b]):
                    continue

                def entries(r):
                    return sorted((float(r.scores[b, i]), r.tokens[b, i].tolist()) for i in range(5))
                assert entries(plain) == entries(free)


def reference_allocation(scores, banks, k):
    """Round robin over the banks (lower bank first), each bank by descending score: the kept indices."""
    live = [i for i in range(len(scores)) if scores[i] > -math.inf]
    by_bank: dict = {}
    for i in sorted(live, key=lambda i: (-scores[i], i)):
        by_bank.setdefault(banks[i], []).append(i)
    kept = []
    for rank_ in range(len(live)):
        for bank in sorted(by_bank):
            if rank_ < len(by_bank[bank]) and len(kept) < k:
                kept.append(by_bank[bank][rank_])
    return sorted(kept, key=lambda i: (-scores[i], i))


def test_the_allocation_is_round_robin_over_the_banks_and_pruned_counts_every_candidate():
    """One step of 3 rows x 2 slots x 7 tokens against a Python round robin over every candidate (the
    pool's shortcut, the k + 1 best of the other tokens, must not change what is kept)."""
    g = torch.Generator().manual_seed(0)
    automata = [build_automaton([(3, 4), (5,)], "unordered"), build_automaton([(4, 4, 4)], "ordered"), FREE]
    tab = batch_tables(automata)
    state = torch.tensor([[1, 0], [2, 1], [0, 0]])
    state = torch.minimum(state, torch.tensor([[a.states - 1] for a in automata]))
    constraints = ConstraintState(tab.table, tab.tokens, tab.dist, state)
    for trial in range(30):
        cand = torch.randn(3, 2, 7, generator=g, dtype=torch.float64)
        cand = cand.masked_fill(torch.rand(3, 2, 7, generator=g) < 0.5, -math.inf)
        for k in (1, 2, 3, 5):
            kept = constrained_candidates(cand, constraints, 0, None, 10, k, EOS)
            for r, automaton in enumerate(automata):
                scores, banks, states = [], [], []
                for s in range(2):
                    q = int(state[r, s])
                    for v in range(7):
                        col = automaton.tokens.index(v) if v in automaton.tokens else len(automaton.tokens)
                        nxt = automaton.table[q][col]
                        scores.append(float(cand[r, s, v]))
                        banks.append(0 if v == EOS else automaton.dist[nxt])
                        states.append(nxt)
                want = reference_allocation(scores, banks, k)
                got = [int(i) for i, sc in zip(kept.index[r], kept.scores[r]) if sc > -math.inf]
                assert got == want, (trial, k, r)
                assert [int(x) for x, sc in zip(kept.state[r], kept.scores[r]) if sc > -math.inf] == \
                       [states[i] for i in want]
                assert bool(kept.pruned[r]) == (sum(x > -math.inf for x in scores) > k)


# --- host syncs, one graph, refusals ---------------------------------------------------------------

def test_static_steps_with_constraints_make_no_host_sync():
    model = TinyAttentionRNN(mapping="entmax15", seed=7)
    src, lengths = random_sources(6, 13, 6, seed=8)
    options = SearchOptions(beam_size=4, n_best=2, max_length=7, return_support=True)
    special = Specials(BOS, EOS, PAD)
    tabs = tables([[(4, 5)], [], [(6,), (6, 7)], [(7,)], [(3, 4), (4, 5)], [(3,)]], "unordered")
    with torch.no_grad():
        encoder_out, state = model.encode(src, src_lengths=lengths)
        rows = RowState.start(6, options.n_best, options.certify, src.device, constraints=tabs)
        stopped = torch.zeros(6, dtype=torch.bool)
        tokens = torch.full((6,), BOS)
        for t in range(options.max_length + 1):
            with SyncAudit() as audit:
                record, tokens, state, rows, stopped, _ = static_step(model, tokens, state, encoder_out, rows, stopped,
                                                                      t, options, special)
            assert audit.total == 0, f"step {t}: {audit.report()}"
            if t == 0:
                encoder_out = {k: v.repeat_interleave(4, dim=0) for k, v in encoder_out.items()}


@pytest.mark.parametrize("t", [1, 9])
def test_a_search_step_with_constraints_compiles_as_one_graph(t):
    options, special = SearchOptions(beam_size=3, n_best=2, max_length=10), Specials(BOS, EOS, PAD)
    g = torch.Generator().manual_seed(1)
    tabs = tables([[(3, 4)], [], [(5, 6), (6,)], [(4,), (4, 4)], [(3, 3)]], "ordered")
    rows = RowState.start(5, 2, True, "cpu", constraints=tabs)
    rows = RowState(torch.randn(5, 3, generator=g, dtype=torch.float64), rows.exact, rows.reason,
                    torch.full((5, 2), -5.0, dtype=torch.float64), rows.top_finished,
                    constraints=rows.constraints.advanced(torch.tensor([[1, 0, 0], [0, 0, 0], [1, 2, 0],
                                                                        [1, 0, 2], [1, 1, 0]])))
    log_probs = torch.log_softmax(torch.randn(15, 7, generator=g, dtype=torch.float64), -1)
    compiled = torch.compile(select_step, fullgraph=True)(log_probs, None, rows, t, options, special)
    eager = select_step(log_probs, None, rows, t, options, special)
    for name in ("chosen", "parent", "done"):
        assert torch.equal(getattr(compiled, name), getattr(eager, name)), name
    assert torch.equal(compiled.rows.constraints.state, eager.rows.constraints.state)
    assert torch.equal(compiled.rows.exact, eager.rows.exact) and torch.equal(compiled.rows.reason, eager.rows.reason)


def test_sampling_with_constraints_is_refused():
    model, src, lengths = model_and_sources("sparsemax", 0)
    with pytest.raises(ValueError, match="^lexical constraints apply to beam search, not to sampling"):
        beam_search(model, src, lengths, bos=BOS, eos=EOS, sample=True, constraints=tables([[(3,)]] * N_SOURCES,
                                                                                             "unordered"))
    with pytest.raises(ValueError, match=r"one automaton per sentence \(8\)"):
        beam_search(model, src, lengths, bos=BOS, eos=EOS, constraints=tables([[(3,)]] * 3, "unordered"))


@pytest.mark.parametrize("ratio", [0.0, 1.0])
@pytest.mark.parametrize("stop_every", [1, 4])
def test_the_static_search_with_constraints_syncs_only_for_its_stop_flags(stop_every, ratio):
    """The whole static search with constraints (and per-sentence limits, raised to what the phrases
    need): at most one host sync per ``stop_every`` steps and one at the end; the same outputs as
    the dynamic loop."""
    model, src, lengths = model_and_sources("entmax15", 0)
    sets = chosen_constraints(model, src, lengths, 0)
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=3, n_best=2, max_length=8, length_penalty="average",
              max_length_ratio=ratio, constraints=tables(sets, "unordered"))
    with SyncAudit() as audit:
        static = beam_search(model, src, lengths, mode="static", stop_every=stop_every, **kw)
    assert set(audit.counts) <= {"Tensor.__bool__", "Tensor.__int__", "Tensor.tolist"}, audit.report()
    assert audit.total <= math.ceil(static.steps / stop_every) + 1 + (ratio > 0), audit.report()
    dynamic = beam_search(model, src, lengths, mode="dynamic", **kw)
    for name in ("tokens", "lengths", "exact", "reason", "n_nonzero", "scores"):
        assert torch.equal(getattr(static, name), getattr(dynamic, name)), name


def test_the_cli_spells_the_modes_as_the_automata_do():
    from nmt.cli import translate as translate_cli
    from nmt.translate.constraint_automaton import CONSTRAINT_MODES, DEFAULT_MODE

    assert translate_cli.CONSTRAINT_MODES == CONSTRAINT_MODES and translate_cli.DEFAULT_MODE == DEFAULT_MODE


@pytest.mark.parametrize("constraint_mode", ["unordered", "ordered"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_constraints_with_a_prefix_and_blocking_against_brute_force(mode, constraint_mode):
    """Constraints together with forced prefixes and n-gram blocking (each a ban of its own, applied
    before the candidates are chosen): the brute force of the outputs that start with the prefix,
    repeat no bigram and meet the constraints."""
    from test_target_prefix import chosen_prefixes
    from nmt.translate.target_prefix import prefix_tensor

    certified = 0
    for name, seed, penalty, min_length in CASES:
        model, src, lengths = model_and_sources(name, seed)
        sets = chosen_constraints(model, src, lengths, min_length)
        prefixes = chosen_prefixes(name, seed, min_length)
        enums = []
        for b in range(N_SOURCES):
            accepts, feasible = predicates(sets[b], constraint_mode, MAX_LENGTH)
            dropped: list[int] = []
            support, frontier, cut = enumerate_support(model, src[b], lengths[b], MAX_LENGTH, min_length, block=2,
                                                       prefix=prefixes[b], accepts=accepts, feasible=feasible,
                                                       dropped=dropped)
            enums.append((support, frontier, cut, min(dropped) if dropped else None))
        for beam_size in (1, 2, 4, 8):
            result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, n_best=200,
                                 max_length=MAX_LENGTH, min_length=min_length, length_penalty=penalty,
                                 block_ngram_repeat=2, prefix=prefix_tensor(prefixes),
                                 constraints=tables(sets, constraint_mode), **mode)
            names = result.reason_names()
            for b in range(N_SOURCES):
                exact = check_sentence(result, names, b, enums[b], beam_size, penalty, sets[b], constraint_mode)
                certified += exact and bool(sets[b]) and bool(prefixes[b])
    assert certified > 0  # sentences with a prefix and constraints among them


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", range(2))
def test_cuda_static_search_with_constraints_equals_the_cpu(case):
    """On CUDA (the static loop, ``mode: auto`` there; the torch step with constraints) constraints
    given on the host, as nmt-translate passes them, give the CPU's dynamic loop's outputs, scores and
    certificates (float64 toy models: the devices agree to rounding)."""
    import copy

    from test_static_search import assert_same_result

    make = [lambda: TinyAttentionRNN(mapping="entmax15", seed=2).double(),
            lambda: tiny_transformer(output="sparsemax", attention="entmax15", eos_bias=1.0, seed=2)][case]
    cpu_model = make()
    cuda_model = copy.deepcopy(cpu_model).to("cuda")
    src, lengths = random_sources(6, 9, 6, seed=case)
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=3, n_best=3, max_length=8, max_length_ratio=1.0)
    sets = chosen_constraints(cpu_model, src, lengths, 0)
    for constraint_mode in ("unordered", "ordered"):
        kw["constraints"] = tables(sets, constraint_mode)
        cpu = beam_search(cpu_model, src, lengths, mode="dynamic", **kw)
        cuda = beam_search(cuda_model, src.cuda(), lengths, mode="auto", **kw)
        assert_same_result(cpu, type(cpu)(**{f: (v.cpu() if isinstance(v, torch.Tensor) else v)
                                              for f, v in vars(cuda).items()}))


@pytest.mark.parametrize("constraint_mode", ["unordered", "ordered"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_a_ratio_limit_leaves_room_for_the_constraints_after_the_prefix(mode, constraint_mode):
    """With ``max_length_ratio`` (every sentence's own limit 0 here) and a forced prefix, a sentence's
    limit is raised to the fewest tokens of an output that starts with its prefix and meets its
    constraints (found here by trying every completion over the phrases' tokens), not to the
    prefix's length or the phrases' alone: the search equals one whose ``max_length`` is that
    number (outputs, scores and certificate)."""
    from test_target_prefix import chosen_prefixes
    from nmt.translate.target_prefix import prefix_tensor

    raised = 0
    for name, seed, penalty, min_length in CASES[:2]:
        model, src, lengths = model_and_sources(name, seed)
        prefixes = chosen_prefixes(name, seed, min_length)
        sets = [[(t,) for t in ORDINARY if t not in p][:1] + ([(p[-1], ORDINARY[0])] if p else []) for p in prefixes]
        need = []
        for b in range(N_SOURCES):
            alphabet = sorted({t for p in sets[b] for t in p})
            need.append(max(min_length, next(n for n in range(len(prefixes[b]), MAX_LENGTH + 1)
                                             if any(meets(prefixes[b] + tail, sets[b], constraint_mode)
                                                    for tail in product(alphabet, repeat=n - len(prefixes[b]))))))
            raised += need[b] > max(len(prefixes[b]), build_automaton(sets[b], constraint_mode).dist[0], min_length)
        common = dict(bos=BOS, eos=EOS, n_best=4, min_length=min_length, length_penalty=penalty, **mode)
        for beam_size in (1, 4):
            result = beam_search(model, src, lengths, beam_size=beam_size, max_length=MAX_LENGTH, max_length_ratio=0.01,
                                 max_length_offset=0, prefix=prefix_tensor(prefixes),
                                 constraints=tables(sets, constraint_mode), **common)
            for b in range(N_SOURCES):
                alone = beam_search(model, src[b:b + 1], lengths[b:b + 1], beam_size=beam_size, max_length=need[b],
                                    prefix=prefix_tensor(prefixes[b:b + 1]),
                                    constraints=tables(sets[b:b + 1], constraint_mode), **common)
                got = [(result.tokens[b, i, :n].tolist(), float(result.scores[b, i])) for i, n in
                       enumerate(result.lengths[b].tolist()) if n]
                want = [(alone.tokens[0, i, :n].tolist(), float(alone.scores[0, i])) for i, n in
                        enumerate(alone.lengths[0].tolist()) if n]
                assert got == want, (b, prefixes[b], sets[b], need[b])
                assert (bool(result.exact[b]), int(result.reason[b])) == (bool(alone.exact[0]), int(alone.reason[0]))
    assert raised > 0  # sentences whose prefix does not hold their phrases


# --- special tokens in phrases ---------------------------------------------------------------------

def test_phrases_holding_bos_eos_or_pad_are_refused_naming_the_input_and_phrase():
    """``beam_search`` refuses a phrase holding its BOS, EOS or PAD id (no output holds one as text)
    with a ConstraintError naming the sentence and the phrase, before any step; the ids are the
    search's own (another EOS id refuses another phrase); ``build_automaton(reserved=)`` says the
    same."""
    from nmt.translate.beam_search import check_constraints

    model, src, lengths = model_and_sources("sparsemax", 0)
    for tok, name in ((EOS, "<eos>"), (BOS, "<bos>"), (PAD, "<pad>")):
        sets = [[(3,)]] * N_SOURCES
        sets[5] = [(4,), (3, tok)]
        message = rf"^input 6: constraint phrase 2 \[3, {tok}\] holds {name} \(id {tok}\), which no output holds"
        for constraint_mode in ("unordered", "ordered"):
            with pytest.raises(ConstraintError, match=message):
                beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, constraints=tables(sets, constraint_mode))
        with pytest.raises(ConstraintError, match=message):
            build_automaton(sets[5], "unordered", index=5, reserved={PAD: "<pad>", BOS: "<bos>", EOS: "<eos>"})
    fine = tables([[(3, 6)], [(6,), (6,)]], "unordered")
    check_constraints(fine, 2, SearchOptions(), Specials(BOS, EOS, PAD))
    with pytest.raises(ConstraintError, match=r"^input 1: constraint phrase 1 \[3, 6\] holds <eos> \(id 6\)"):
        check_constraints(fine, 2, SearchOptions(), Specials(BOS, 6, PAD))
    assert fine.to("cpu").phrases == ((((3, 6),), ((6,), (6,))))


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_an_unk_phrase_is_met_by_generating_unk_and_by_nothing_with_ban_unk_token(mode):
    """``<unk>`` is not refused (an output may hold it): with 3 as the unknown-word id, phrases
    holding it are searched for as any phrase (the brute force with 3 allowed), and with
    ``ban_unk_token`` no output meets them (the brute force with 3 banned; certificates as it
    predicts)."""
    unk = 3
    model, src, lengths = model_and_sources("sparsemax", 0)
    sets = [[(unk,)], [(unk, 4)], [(4,), (unk,)], [], [(unk,), (unk,)], [(4,)], [(unk, unk)], [(5,)]]
    seen: Counter = Counter()
    for ban in (False, True):
        enums = []
        for b in range(N_SOURCES):
            accepts, feasible = predicates(sets[b], "unordered", MAX_LENGTH)
            dropped: list[int] = []
            support, frontier, cut = enumerate_support(model, src[b], lengths[b], MAX_LENGTH,
                                                       banned=unk if ban else None, accepts=accepts,
                                                       feasible=feasible, dropped=dropped)
            enums.append((support, frontier, cut, min(dropped) if dropped else None))
        for beam_size in (2, 8):
            result = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, unk=unk, ban_unk_token=ban,
                                 beam_size=beam_size, n_best=200, max_length=MAX_LENGTH,
                                 constraints=tables(sets, "unordered"), **mode)
            names = result.reason_names()
            for b in range(N_SOURCES):
                certified = check_sentence(result, names, b, enums[b], beam_size, "none", sets[b], "unordered")
                holds_unk = any(unk in p for p in sets[b])
                if ban and holds_unk:
                    assert not enums[b][0] and not bool(result.complete[b, 0])
                seen[(ban, holds_unk, certified)] += 1
    assert seen[(False, True, True)] > 0, seen  # certified outputs that hold <unk> as asked
