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
from toy_decoders import BOS, EOS, PAD, TinyAttentionRNN, enumerate_support, random_sources, tiny_transformer

ORDINARY = (3, 4, 5, 6)  # the toy decoders' ordinary tokens (vocabulary 7)


# --- the independent definitions ------------------------------------------------------------------

def meets(tokens, phrases, mode: str) -> bool:
    """Whether ``tokens`` meet ``phrases``: unordered, each is a contiguous run somewhere; ordered,
    some choice of occurrences puts them in order, each after the previous one's end (every choice
    tried)."""
    tokens, phrases = tuple(tokens), [tuple(p) for p in phrases]

    def at(seq, phrase):
        n = len(phrase)
        return [i for i in range(len(seq) - n + 1) if seq[i:i + n] == phrase]

    if mode == "unordered":
        return all(at(tokens, p) for p in phrases)

    def rest(start: int, j: int) -> bool:
        if j == len(phrases):
            return True
        return any(rest(i + len(phrases[j]), j + 1) for i in at(tokens, phrases[j]) if i >= start)

    return rest(0, 0)


def predicates(phrases, mode: str, max_length: int):
    """(accepts, feasible) for ``enumerate_support``: feasible(prefix) tries every completion of at
    most ``max_length - len(prefix)`` phrase tokens (a token of no phrase never helps: removing it
    from a completion keeps every occurrence that did not contain it)."""
    alphabet = sorted({t for p in phrases for t in p})

    def accepts(tokens) -> bool:
        return meets(tokens, phrases, mode)

    @lru_cache(maxsize=None)
    def feasible_tuple(prefix: tuple) -> bool:
        budget = max_length - len(prefix)
        return any(accepts(prefix + tail) for n in range(budget + 1) for tail in product(alphabet, repeat=n))

    return accepts, (lambda tokens: feasible_tuple(tuple(tokens)))


def constrained_enumeration(model, src, length, phrases, mode, max_length=MAX_LENGTH, min_length=0):
    """(support, frontier, cut, first dropped step or None) of the constrained problem."""
    accepts, feasible = predicates(phrases, mode, max_length)
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


def check_sentence(result, names, b, enum, beam_size, penalty, phrases, mode, max_length=MAX_LENGTH) -> bool:
    """Sentence b against its constrained enumeration; returns whether it was certified."""
    support, frontier, cut, dropped = enum
    exact, reason = predicted(frontier, cut, dropped, beam_size, support, max_length)
    assert (bool(result.exact[b]), names[b]) == (exact, reason)
    found = found_hypotheses(result, b)
    for seq, logprob in found.items():
        assert seq in support and logprob == pytest.approx(support[seq], abs=1e-9)
    assert int(result.n_nonzero[b]) == len(found)
    assert float(result.mass[b]) == pytest.approx(math.fsum(math.exp(v) for v in found.values()), abs=1e-9)
    for i in range(result.tokens.size(1)):  # every output, complete or cut, meets the constraints
        n = int(result.lengths[b, i])
        if n:
            tokens = [t for t in result.tokens[b, i, :n].tolist() if t != EOS]
            assert meets(tokens, phrases, mode), (tokens, phrases, mode)
    if exact:
        assert set(found) == set(support)
        best = max(rank(s, v, penalty) for s, v in support.items())
        first = tuple(result.tokens[b, 0, : int(result.lengths[b, 0])].tolist())
        assert rank(first, support[first], penalty) == pytest.approx(best, abs=1e-9)
    if not support:  # no complete output (a live hypothesis cut at max_length that meets them may be returned)
        assert not bool(result.complete[b, 0]) and (int(result.lengths[b, 0]) == 0 or cut)
    return exact


def tables(constraint_sets, mode):
    return batch_tables([build_automaton(p, mode) for p in constraint_sets])


# --- constraint sets that exercise the automata ----------------------------------------------------

def chosen_constraints(model, src, lengths, min_length: int) -> list[list[tuple[int, ...]]]:
    """Per toy source, from its unconstrained support (so that the constraints bite but can be met),
    one of: none; a one-token phrase; a bigram; two overlapping bigrams (x y, y z); a phrase and a
    phrase it starts (x, x y); a repeated phrase (x, x); two one-token phrases in the order opposite
    to their first occurrence (ordered bites); a phrase too long for max_length (impossible)."""
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
            out.append([(x,), (x,)])
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
