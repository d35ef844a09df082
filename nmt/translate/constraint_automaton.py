"""Lexical constraints as automata over target tokens (built on the host, once per sentence).

A sentence's constraints are phrases, each a non-empty run of target token ids, and a mode:

* ``"unordered"`` (the default): the output holds every phrase as a contiguous run of tokens, in
  any order; occurrences may overlap (phrases ``a b`` and ``b c`` are both in ``a b c``), and a
  phrase given k times must occur at least k times (the phrases are a multiset, as fairseq's and
  Sockeye's constraints): its occurrences are the positions where a run equal to it starts,
  overlapping ones included (``a a`` given twice is met by ``a a a``, ``a`` given twice by ``a b a``);
* ``"ordered"``: the output holds the phrases in the given order, each occurrence starting after
  the previous one ends (no overlap); a phrase given twice must occur twice.

Either is a deterministic automaton whose states are the search's per-hypothesis constraint
state: ``ordered`` is the phrases' Knuth-Morris-Pratt automata one after the other (state: the
next phrase and how many of its tokens end the hypothesis; the earliest end of each phrase is
the best place to start looking for the next, so following it is exact); ``unordered`` is an
Aho-Corasick trie of the distinct phrases (state: the longest suffix of the hypothesis that is a
proper prefix of some phrase not met yet) times each phrase's occurrences so far, capped at the times
it is given (a phrase given once: met or not, the set of phrases met). Once every phrase is met the
state is one absorbing accepting state; the automaton is then minimized (Moore), so a one-token
phrase given k times has k + 1 states, an L-token phrase given k times at most k L + 1 (exactly
that for every phrase the tests try). Only the phrases' tokens move the automaton somewhere
particular: every other token does the same as any other (the trie's root), so a state's
transitions are one column per distinct phrase token plus one "other" column.

:func:`build_automaton` gives an :class:`Automaton` (state 0 the start), :func:`batch_tables` the
padded ``(B, Q, A + 1)`` transition, ``(B, A)`` token and ``(B, Q)`` distance tensors of a batch
(:mod:`nmt.translate.constraint_search` walks them on the device). The distance of a state is the
fewest tokens that reach acceptance from it (0: every constraint met): EOS is allowed only at
distance 0, a candidate that could not reach acceptance within the sentence's length limit is
dropped, and the beam's banks are the distances (dynamic beam allocation).
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import Tensor

from nmt.models.protocol import InputTooLong
from nmt.utils.device import host_to_device

CONSTRAINT_MODES = ("unordered", "ordered")
DEFAULT_MODE = "unordered"
MAX_STATES = 4096
"""The most automaton states a sentence's constraints may have (unordered: trie nodes times the
phrases' capped counts; a few phrases of a few tokens need tens)."""


class ConstraintError(InputTooLong):
    """Input ``index``'s constraints cannot be searched for (an empty phrase, a word the target
    vocabulary lacks, too many states, more tokens than ``max_length``); ``problem`` is the reason
    without the input's number, and ``nmt-translate`` names the constraints file's line with it
    (``side`` is ``"constraints"``)."""

    def __init__(self, index: int, problem: str) -> None:  # noqa: D107 (the class says it)
        self.index, self.side, self.problem = index, "constraints", problem
        ValueError.__init__(self, f"input {index + 1}: {problem}")


@dataclass(frozen=True)
class Automaton:
    """One sentence's constraint automaton: ``tokens`` the A distinct phrase tokens (sorted);
    ``table[q][a]`` the state after token ``tokens[a]`` from state q, ``table[q][A]`` after any
    other token; ``dist[q]`` the fewest tokens from q to an accepting state (0: accepting).
    State 0 is the start. ``phrases``: the phrases it was built from (as given; for the search's
    check of special tokens, :func:`check_phrase_tokens`)."""

    tokens: tuple[int, ...]
    table: tuple[tuple[int, ...], ...]
    dist: tuple[int, ...]
    phrases: tuple[tuple[int, ...], ...] = ()

    @property
    def states(self) -> int:
        """Q, the number of states."""
        return len(self.table)

    def run(self, ids: Sequence[int]) -> int:
        """The state after reading ``ids`` from the start."""
        column = {tok: a for a, tok in enumerate(self.tokens)}
        state = 0
        for tok in ids:
            state = self.table[state][column.get(tok, len(self.tokens))]
        return state

    def accepts(self, ids: Sequence[int]) -> bool:
        """Whether ``ids`` meet the constraints."""
        return self.dist[self.run(ids)] == 0


FREE = Automaton((), ((0,),), (0,))
"""The automaton of a sentence without constraints: one accepting state."""


def build_automaton(phrases: Sequence[Sequence[int]], mode: str = DEFAULT_MODE, index: int = 0,
                    reserved: Mapping[int, str] | None = None) -> Automaton:
    """The automaton of ``phrases`` (token-id lists) in ``mode`` (:data:`CONSTRAINT_MODES`);
    :data:`FREE` for no phrase. ``index``: the input's 0-based number, for errors
    (:class:`ConstraintError`: an empty phrase, a token of ``reserved`` (id -> name, e.g. the
    vocabulary's ``<bos>``, ``<eos>``, ``<pad>``: :func:`check_phrase_tokens`), more than
    :data:`MAX_STATES` states). ``beam_search`` checks the phrases against its own special ids
    again (the automaton keeps them)."""
    check_mode(mode)
    cleaned = [tuple(int(t) for t in p) for p in phrases]
    for n, phrase in enumerate(cleaned):
        if not phrase:
            raise ConstraintError(index, f"constraint phrase {n + 1} has no token")
    if reserved:
        check_phrase_tokens(cleaned, reserved, index)
    if not cleaned:
        return FREE
    tokens = tuple(sorted({t for p in cleaned for t in p}))
    if mode == "ordered":
        step, start, accept = _ordered(cleaned)
    else:
        wanted = Counter(cleaned)  # a phrase given k times: k occurrences (first-given order)
        step, start, accept = _unordered(list(wanted), list(wanted.values()))
    # number the states reachable from the start (breadth first), the start 0
    number = {start: 0}
    order = [start]
    rows: list[list[int]] = []
    queue = deque([start])
    while queue:
        state = queue.popleft()
        row = []
        for tok in tokens + (None,):
            nxt = step(state, tok)
            if nxt not in number:
                if len(number) >= MAX_STATES:
                    raise ConstraintError(index, f"the constraints' automaton has more than {MAX_STATES} states "
                                                 "(fewer or shorter phrases, or -constraints_mode ordered)")
                number[nxt] = len(number)
                order.append(nxt)
                queue.append(nxt)
            row.append(number[nxt])
        rows.append(row)
    rows, accepting = _minimized(rows, [accept(s) for s in order])
    return Automaton(tokens, tuple(tuple(r) for r in rows), _distances(rows, accepting), tuple(cleaned))


def check_phrase_tokens(phrases: Sequence[Sequence[int]], reserved: Mapping[int, str], index: int = 0) -> None:
    """:class:`ConstraintError` naming input ``index`` (0-based) and the first phrase of ``phrases``
    (token-id lists) that holds a token of ``reserved`` (id -> name): the search's ``<bos>``,
    ``<eos>`` and ``<pad>``, which no output holds as text (EOS ends an output before its tokens are
    matched; BOS and padding are control symbols, dropped from the output text). ``<unk>`` is not
    reserved: an output may hold it (a phrase holding it is met by generating it; with
    ``ban_unk_token`` never, so no output meets it)."""
    for n, phrase in enumerate(phrases):
        for tok in phrase:
            if int(tok) in reserved:
                raise ConstraintError(index, f"constraint phrase {n + 1} {[int(t) for t in phrase]} holds "
                                             f"{reserved[int(tok)]} (id {int(tok)}), which no output holds "
                                             "(EOS ends it; BOS and padding are no text)")


def check_mode(mode: str) -> None:
    """ValueError unless ``mode`` is one of :data:`CONSTRAINT_MODES`."""
    if mode not in CONSTRAINT_MODES:
        raise ValueError(f"constraints mode must be one of {', '.join(CONSTRAINT_MODES)}, got {mode!r}")


def explored_states_bound(phrases: Sequence[Sequence[int]], mode: str) -> int:
    """An upper bound on the states :func:`build_automaton` numbers before minimizing (the count it
    refuses above :data:`MAX_STATES`), from the phrases alone: ordered, one per phrase token plus
    the accepting one (exact); unordered, the trie's nodes (the distinct phrases' distinct proper
    prefixes) times the tuples of capped counts short of all met, plus the accepting one. At most
    :data:`MAX_STATES` means the automaton cannot be refused for its size (a cheap check before
    building it)."""
    cleaned = [tuple(int(t) for t in p) for p in phrases]
    if mode == "ordered":
        return sum(len(p) for p in cleaned) + 1
    wanted = Counter(cleaned)
    nodes = len({p[:n] for p in wanted for n in range(len(p))})
    counts = 1
    for k in wanted.values():
        counts *= k + 1
    return nodes * (counts - 1) + 1


def _minimized(rows: list[list[int]], accepting: list[bool]) -> tuple[list[list[int]], list[bool]]:
    """The minimal automaton of ``rows`` (state 0 the start): Moore's partition refinement (accepting
    or not, then by the classes of the successors) until stable, the classes numbered in the order
    of their first state (so the start stays 0). States of the unordered construction that accept
    the same continuations (e.g. progress into a phrase that another phrase's occurrence will have
    met anyway) become one."""
    cls = [int(a) for a in accepting]
    count = len(set(cls))
    while True:
        signature = [(cls[q], tuple(cls[n] for n in row)) for q, row in enumerate(rows)]
        numbered: dict = {}
        new = [numbered.setdefault(sig, len(numbered)) for sig in signature]
        if len(numbered) == count:
            break
        cls, count = new, len(numbered)
    first = {}
    for q, c in enumerate(new):
        first.setdefault(c, q)
    return [[new[n] for n in rows[q]] for q in first.values()], [accepting[q] for q in first.values()]


def _ordered(phrases: list[tuple[int, ...]]):
    """(step, start, accept) of the ordered automaton: state ``(j, i)``, phrase j next with its
    first i tokens ending the hypothesis; ``(m, 0)`` accepting and absorbing."""
    m = len(phrases)

    def step(state, tok):
        j, i = state
        if j == m:
            return state
        phrase = phrases[j]
        seen = phrase[:i] + (tok,)
        for n in range(min(len(seen), len(phrase)), 0, -1):  # the longest suffix of seen that starts the phrase
            if seen[len(seen) - n:] == phrase[:n]:
                return (j + 1, 0) if n == len(phrase) else (j, n)
        return (j, 0)

    return step, (0, 0), lambda state: state[0] == m


def _unordered(phrases: list[tuple[int, ...]], wanted: list[int]):
    """(step, start, accept) of the unordered automaton of the distinct ``phrases``, phrase k wanted
    ``wanted[k]`` times: state ``(node, counts)``, node the longest suffix of the hypothesis that is a
    proper prefix of a phrase not met yet, counts per phrase its occurrences so far capped at its
    wanted number (met: the count reached); every state with all phrases met is the one accepting
    state ``"done"``."""
    # only a proper prefix of a phrase not yet met can still grow into an occurrence that matters:
    # any longer suffix behaves as its longest such suffix, so the node is that suffix (else n
    # one-token phrases would have about n 2^(n-1) states, not the 2^n sets of phrases met)
    prefixes = [{p[:n] for n in range(len(p))} for p in phrases]
    everything = tuple(wanted)

    def step(state, tok):
        if state == "done":
            return state
        node, counts = state
        seen = node + (tok,) if tok is not None else ()
        # every occurrence of an unmet phrase ending here is a suffix of seen: its part before this
        # token was a proper prefix of it ending the hypothesis, so a suffix of node (the longest
        # such); one end position is one occurrence, overlapping ones included
        counts = tuple(c + (c < w and len(p) <= len(seen) and seen[len(seen) - len(p):] == p)
                       for c, w, p in zip(counts, wanted, phrases))
        unmet = [prefixes[k] for k in range(len(phrases)) if counts[k] < wanted[k]]
        for n in range(len(seen), -1, -1):  # the longest suffix of seen that can still grow (the root at worst)
            if any(seen[len(seen) - n:] in starts for starts in unmet):
                node = seen[len(seen) - n:]
                break
        return "done" if counts == everything else (node, counts)

    return step, ((), (0,) * len(phrases)), lambda state: state == "done"


def _distances(rows: list[list[int]], accepting: list[bool]) -> tuple[int, ...]:
    """Fewest transitions from each state to an accepting one (breadth first over the reversed
    edges; every state of these automata reaches acceptance: append the missing phrases)."""
    back: list[list[int]] = [[] for _ in rows]
    for q, row in enumerate(rows):
        for nxt in row:
            back[nxt].append(q)
    dist = [-1] * len(rows)
    queue = deque(q for q, ok in enumerate(accepting) if ok)
    for q in queue:
        dist[q] = 0
    while queue:
        q = queue.popleft()
        for p in back[q]:
            if dist[p] < 0:
                dist[p] = dist[q] + 1
                queue.append(p)
    assert min(dist) >= 0, "a constraint state that cannot reach acceptance"
    return tuple(dist)


@dataclass(frozen=True)
class ConstraintTables:
    """The automata of a batch of B sentences, padded, on one device (host tensors from
    :func:`batch_tables`): ``table`` (B, Q, A + 1) long, ``tokens`` (B, A) long (``-1`` after a
    row's own A), ``dist`` (B, Q) long. Padding states go to themselves at distance 0; padding token
    columns repeat the "other" column (never read: their token is -1). ``phrases``: per sentence,
    its phrases on the host (Python ints, from the automata), for ``beam_search``'s check of
    special tokens without reading the tensors; None for tables built by hand (not checked)."""

    table: Tensor
    tokens: Tensor
    dist: Tensor
    phrases: tuple[tuple[tuple[int, ...], ...], ...] | None = None

    def to(self, device: torch.device | str) -> "ConstraintTables":
        """The tables on ``device`` (from the host through pinned memory: no sync)."""
        if self.table.device == torch.device(device):
            return self
        return ConstraintTables(*(host_to_device(x, device) for x in (self.table, self.tokens, self.dist)),
                                phrases=self.phrases)

    @property
    def start_dist(self) -> Tensor:
        """(B,) long: the fewest tokens each sentence's outputs need to meet its constraints."""
        return self.dist[:, 0]


def batch_tables(automata: Sequence[Automaton]) -> ConstraintTables:
    """The padded host tensors of B automata (Q: the most states, A: the most phrase tokens)."""
    q_max = max(a.states for a in automata)
    a_max = max(len(a.tokens) for a in automata)
    batch = len(automata)
    table = torch.arange(q_max).view(1, q_max, 1).repeat(batch, 1, a_max + 1)  # padding: stay
    tokens = torch.full((batch, a_max), -1, dtype=torch.long)
    dist = torch.zeros(batch, q_max, dtype=torch.long)
    for b, automaton in enumerate(automata):
        a, q = len(automaton.tokens), automaton.states
        rows = torch.tensor(automaton.table, dtype=torch.long)  # (q, a + 1)
        table[b, :q, :a] = rows[:, :a]
        table[b, :q, a:] = rows[:, a:]  # the "other" column, repeated over the padding columns
        if a:
            tokens[b, :a] = torch.tensor(automaton.tokens, dtype=torch.long)
        dist[b, :q] = torch.tensor(automaton.dist, dtype=torch.long)
    return ConstraintTables(table, tokens, dist, tuple(a.phrases for a in automata))


def holds_phrase(ids: Sequence[int], phrase: Sequence[int]) -> bool:
    """Whether ``phrase`` is a contiguous run of ``ids`` (a plain scan; reports and tests)."""
    return occurrences(ids, phrase) > 0


def occurrences(ids: Sequence[int], phrase: Sequence[int]) -> int:
    """How many positions of ``ids`` start a run equal to ``phrase``, overlapping ones included
    (``a a`` occurs twice in ``a a a``; a plain scan; reports and tests)."""
    n, phrase = len(phrase), tuple(phrase)
    return sum(tuple(ids[i: i + n]) == phrase for i in range(len(ids) - n + 1))


def phrases_met(ids: Sequence[int], phrases: Sequence[Sequence[int]], mode: str) -> list[bool]:
    """Per phrase, whether ``ids`` meet it. Unordered: whether ``ids`` hold as many occurrences of it
    (:func:`occurrences`) as ``phrases`` list it up to and including this entry (a phrase listed
    once: whether it occurs; listed three times with two occurrences: true, true, false), so all
    are true exactly when the constraints are met. Ordered: whether it and every phrase before it
    occur in order without overlap (a plain left-to-right scan)."""
    if mode != "ordered":
        listed: Counter = Counter()
        out_: list[bool] = []
        for phrase in phrases:
            listed[tuple(phrase)] += 1
            out_.append(occurrences(ids, phrase) >= listed[tuple(phrase)])
        return out_
    out, pos = [], 0
    for phrase in phrases:
        n, found = len(phrase), -1
        for i in range(pos, len(ids) - n + 1):
            if tuple(ids[i: i + n]) == tuple(phrase):
                found = i
                break
        if found < 0:
            out.extend([False] * (len(phrases) - len(out)))
            break
        out.append(True)
        pos = found + n
    return out


__all__ = ["CONSTRAINT_MODES", "DEFAULT_MODE", "FREE", "MAX_STATES", "Automaton", "ConstraintError",
           "ConstraintTables", "batch_tables", "build_automaton", "check_mode", "check_phrase_tokens",
           "explored_states_bound", "holds_phrase", "occurrences", "phrases_met"]
