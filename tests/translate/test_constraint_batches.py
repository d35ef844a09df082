"""The Translator's constraints: every input checked before any is decoded, automata built per batch.

Truths: the tables each batch's search gets are recomputed here from that batch's phrases alone
(``batch_tables`` of ``build_automaton``), the builds are counted between the searches, and the
Translator's cheap up-front check (no automaton where the phrases one after the other fit) is
compared with the full check (build the automaton, compare its distances with ``max_length``) on
random phrase sets, with the state limit lowered so that it bites.
"""
from __future__ import annotations

import random

import pytest
import torch

import nmt
import nmt.translate.constraint_automaton as automaton_module
import nmt.translate.translator as translator_module
from nmt.translate.constraint_automaton import ConstraintError, batch_tables, build_automaton, explored_states_bound
from nmt.translate.translator import Translator


def recording(monkeypatch):
    """(builds, searches): every ``build_automaton`` call of the Translator (its phrases), and per
    search the number of builds made before it, its source rows (token ids) and the tables it got."""
    builds: list = []
    searches: list = []
    real_build, real_search = translator_module.build_automaton, translator_module.beam_search

    def build(phrases, mode="unordered", index=0, **kwargs):
        builds.append(tuple(tuple(p) for p in phrases))
        return real_build(phrases, mode, index, **kwargs)

    def search(model, src, src_lengths, *args, constraints=None, **kwargs):
        rows = [src[b, : int(n)].tolist() for b, n in enumerate(src_lengths.tolist())]
        searches.append((len(builds), rows, constraints))
        return real_search(model, src, src_lengths, *args, constraints=constraints, **kwargs)

    monkeypatch.setattr(translator_module, "build_automaton", build)
    monkeypatch.setattr(translator_module, "beam_search", search)
    return builds, searches


def test_automata_are_built_per_batch_after_every_input_is_checked(checkpoint, monkeypatch):
    """Batches of 2: no automaton before the first search (the phrases fit cheaply), each search
    preceded by the builds of its own batch's distinct phrase lists only, its tables those of its
    batch (recomputed here), a batch without phrases searched without tables, and the outputs
    meet the phrases (a plain count)."""
    m = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8)
    lines = ["a b c", "c a", "b", "a a b", "c b a", "b c", "a"]
    sets = [["b"], ["b"], [], [], ["a", "a"], ["c"], ["b"]]
    translator = Translator(m.decoder, m.src_field, m.tgt_field, m.options, batch_size=2)
    builds, searches = recording(monkeypatch)
    out = translator.translate(lines, constraints=sets)
    ids = [tuple(tuple(m.tgt_field.encode(p)) for p in phrases) for phrases in sets]
    index = {tuple(m.src_field.encode(line)): i for i, line in enumerate(lines)}
    assert len(searches) == 4 and sum(1 for *_, tables in searches if tables is not None) >= 2
    done, searched = 0, []
    for before, rows, tables in searches:
        batch = [index[tuple(r)] for r in rows]  # the batch's inputs, in its row order
        searched += batch
        new = builds[done:before]
        done = before
        if not any(ids[i] for i in batch):
            assert tables is None and new == []
            continue
        assert tables.phrases == tuple(ids[i] for i in batch)
        assert sorted(new) == sorted({ids[i] for i in batch})  # once per distinct list of the batch, nothing else
        want = batch_tables([build_automaton(ids[i], "unordered") for i in batch])
        for name in ("table", "tokens", "dist"):
            assert torch.equal(getattr(tables, name), getattr(want, name)), name
    assert done == len(builds) and sorted(searched) == list(range(len(lines)))
    for t, phrases in zip(out, sets):
        for (text, _), cut in zip(t.hypotheses, t.cut):
            assert cut or all(text.count(p) >= phrases.count(p) for p in phrases), (text, phrases)


@pytest.mark.parametrize("bad,message", [
    (["a" * 9], r"^input 7: the constraints need at least 9 tokens, more than max_length 8$"),
    (["x"], r"^input 7: constraint phrase 1 'x' holds a word the target vocabulary lacks"),
    ([""], r"^input 7: constraint phrase 1 '' has no token$"),
])
def test_a_bad_last_input_is_refused_before_any_search(checkpoint, monkeypatch, bad, message):
    """The last of 7 inputs (the fourth batch) is bad: the error names it and no batch was searched
    (nothing to write before the error)."""
    m = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8)
    translator = Translator(m.decoder, m.src_field, m.tgt_field, m.options, batch_size=2)
    builds, searches = recording(monkeypatch)
    with pytest.raises(ConstraintError, match=message):
        translator.translate(["a b c", "c a", "b", "a a b", "c b a", "b c", "a"],
                             constraints=[["b"], ["c"], [], ["a", "a"], ["b"], [], bad])
    assert searches == []


def test_too_many_states_is_refused_before_any_search(checkpoint, monkeypatch):
    """Every 3-letter word over a, b, c (27 phrases: far more than 4096 automaton states) on the
    last line: refused up front (the one case where the check builds an automaton), naming it."""
    m = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=200)
    translator = Translator(m.decoder, m.src_field, m.tgt_field, m.options, batch_size=1)
    words = [x + y + z for x in "abc" for y in "abc" for z in "abc"]
    builds, searches = recording(monkeypatch)
    with pytest.raises(ConstraintError, match=r"^input 3: the constraints' automaton has more than 4096 states"):
        translator.translate(["a b c", "c a", "b"], constraints=[["b"], [], words])
    assert searches == [] and builds == [tuple(tuple(m.tgt_field.encode(w)) for w in words)]


def full_check(phrases, mode, max_length, prefix):
    """The check the Translator made before (the automaton built for every input): its message, or
    None where the input is fine."""
    try:
        automaton = build_automaton(phrases, mode, 0)
    except ConstraintError as exc:
        return exc.problem
    if automaton.dist[0] > max_length:
        return f"the constraints need at least {automaton.dist[0]} tokens, more than max_length {max_length}"
    need = len(prefix) + automaton.dist[automaton.run(prefix)]
    if need > max_length:
        return f"the target prefix and the constraints need at least {need} tokens, more than max_length {max_length}"
    return None


@pytest.mark.parametrize("mode", ["unordered", "ordered"])
def test_the_cheap_check_refuses_exactly_what_the_automaton_does(mode, monkeypatch):
    """Random phrase sets (repeats, overlaps), prefixes and limits, with the state limit lowered to
    30: the Translator's check (no automaton where the phrases one after the other fit) raises
    exactly where, and with the message that, building the automaton and reading its distances
    gives; both outcomes occur, and so does the cheap path."""
    monkeypatch.setattr(automaton_module, "MAX_STATES", 30)
    monkeypatch.setattr(translator_module, "MAX_STATES", 30)
    rng = random.Random(0)
    seen = {"refused": 0, "fine": 0, "cheap": 0}
    for _ in range(600):
        phrases = [tuple(rng.choice((3, 4, 5)) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(0, 4))]
        if phrases and rng.random() < 0.4:
            phrases.append(rng.choice(phrases))  # a repeat
        prefix = [rng.choice((3, 4, 6)) for _ in range(rng.randint(0, 3))]
        max_length = rng.randint(len(prefix), 10)
        want = full_check(phrases, mode, max_length, prefix)
        try:
            Translator._check_fit(0, [list(p) for p in phrases], mode, max_length, prefix)
            got = None
        except ConstraintError as exc:
            got = exc.problem
        assert got == want, (phrases, prefix, max_length)
        seen["refused" if want else "fine"] += 1
        seen["cheap"] += len(prefix) + sum(map(len, phrases)) <= max_length and \
            explored_states_bound(phrases, mode) <= 30
    assert min(seen.values()) > 20, seen


@pytest.mark.parametrize("mode", ["unordered", "ordered"])
def test_the_state_bound_is_an_upper_bound(mode, monkeypatch):
    """``explored_states_bound``: with the state limit set to it, every automaton is built (the
    states it explores never exceed it); ordered, the bound is exact (one less is refused)."""
    rng = random.Random(1)
    for _ in range(300):
        phrases = [tuple(rng.choice((3, 4, 5)) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.4:
            phrases.append(rng.choice(phrases))
        bound = explored_states_bound(phrases, mode)
        monkeypatch.setattr(automaton_module, "MAX_STATES", bound)
        build_automaton(phrases, mode)
        if mode == "ordered":
            monkeypatch.setattr(automaton_module, "MAX_STATES", bound - 1)
            with pytest.raises(ConstraintError, match="more than"):
                build_automaton(phrases, mode)
