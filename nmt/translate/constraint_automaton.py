"""Lexical constraints as automata over target tokens (built on the host, once per sentence).

A sentence's constraints are phrases, each a non-empty run of target token ids, and a mode:

* ``"unordered"`` (the default): the output holds every phrase as a contiguous run of tokens, in
  any order; occurrences may overlap (phrases ``a b`` and ``b c`` are both in ``a b c``), and a
  phrase given twice is asked for once (the phrases are a set);
* ``"ordered"``: the output holds the phrases in the given order, each occurrence starting after
  the previous one ends (no overlap); a phrase given twice must occur twice.

Either is a deterministic automaton whose states are the search's per-hypothesis constraint
state: ``ordered`` is the phrases' Knuth-Morris-Pratt automata one after the other (state: the
next phrase and how many of its tokens end the hypothesis; the earliest end of each phrase is
the best place to start looking for the next, so following it is exact); ``unordered`` is an
Aho-Corasick trie of the phrases (state: the longest suffix of the hypothesis that is a proper
prefix of some phrase not met yet) times the set of phrases already met. Once every phrase is met the state is one
absorbing accepting state. Only the phrases' tokens move the automaton somewhere particular:
every other token does the same as any other (the trie's root), so a state's transitions are
one column per distinct phrase token plus one "other" column.

:func:`build_automaton` gives an :class:`Automaton` (state 0 the start), :func:`batch_tables` the
padded ``(B, Q, A + 1)`` transition, ``(B, A)`` token and ``(B, Q)`` distance tensors of a batch
(:mod:`nmt.translate.constraint_search` walks them on the device). The distance of a state is the
fewest tokens that reach acceptance from it (0: every constraint met): EOS is allowed only at
distance 0, a candidate that could not reach acceptance within the sentence's length limit is
dropped, and the beam's banks are the distances (dynamic beam allocation).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from nmt.models.protocol import InputTooLong
from nmt.utils.device import host_to_device

CONSTRAINT_MODES = ("unordered", "ordered")
DEFAULT_MODE = "unordered"
MAX_STATES = 4096
"""The most automaton states a sentence's constraints may have (unordered: trie nodes times the
subsets of phrases met; a few phrases of a few tokens need tens)."""


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
    State 0 is the start."""

    tokens: tuple[int, ...]
    table: tuple[tuple[int, ...], ...]
    dist: tuple[int, ...]

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


def build_automaton(phrases: Sequence[Sequence[int]], mode: str = DEFAULT_MODE, index: int = 0) -> Automaton:
    """The automaton of ``phrases`` (token-id lists) in ``mode`` (:data:`CONSTRAINT_MODES`);
    :data:`FREE` for no phrase. ``index``: the input's 0-based number, for errors
    (:class:`ConstraintError`: an empty phrase, more than :data:`MAX_STATES` states)."""
    if mode not in CONSTRAINT_MODES:
        raise ValueError(f"constraints mode must be one of {', '.join(CONSTRAINT_MODES)}, got {mode!r}")
    cleaned = [tuple(int(t) for t in p) for p in phrases]
    for n, phrase in enumerate(cleaned):
        if not phrase:
            raise ConstraintError(index, f"constraint phrase {n + 1} has no token")
    if not cleaned:
        return FREE
    tokens = tuple(sorted({t for p in cleaned for t in p}))
    if mode == "ordered":
        step, start, accept = _ordered(cleaned)
    else:
        step, start, accept = _unordered(list(dict.fromkeys(cleaned)))
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
    return Automaton(tokens, tuple(tuple(r) for r in rows), _distances(rows, accepting))


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


def _unordered(phrases: list[tuple[int, ...]]):
    """(step, start, accept) of the unordered automaton: state ``(node, met)``, node the longest
    suffix of the hypothesis that is a proper prefix of a phrase not met yet, met the frozenset of
    phrase numbers already held; every state with all phrases met is the one accepting state ``"done"``."""
    # only a proper prefix of a phrase not yet met can still grow into an occurrence that matters:
    # any longer suffix behaves as its longest such suffix, so the node is that suffix (else n
    # one-token phrases would have about n 2^(n-1) states, not the 2^n sets of phrases met)
    prefixes = [{p[:n] for n in range(len(p))} for p in phrases]
    everything = frozenset(range(len(phrases)))

    def step(state, tok):
        if state == "done":
            return state
        node, met = state
        seen = node + (tok,) if tok is not None else ()
        # every unmet phrase ending here is a suffix of seen: its part before this token was a proper
        # prefix of it ending the hypothesis, so a suffix of node (the longest such)
        met = met | {k for k, p in enumerate(phrases) if len(p) <= len(seen) and seen[len(seen) - len(p):] == p}
        unmet = [prefixes[k] for k in range(len(phrases)) if k not in met]
        for n in range(len(seen), -1, -1):  # the longest suffix of seen that can still grow (the root at worst)
            if any(seen[len(seen) - n:] in starts for starts in unmet):
                node = seen[len(seen) - n:]
                break
        return "done" if met == everything else (node, frozenset(met))

    return step, ((), frozenset()), lambda state: state == "done"


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
    columns repeat the "other" column (never read: their token is -1)."""

    table: Tensor
    tokens: Tensor
    dist: Tensor

    def to(self, device: torch.device | str) -> "ConstraintTables":
        """The tables on ``device`` (from the host through pinned memory: no sync)."""
        if self.table.device == torch.device(device):
            return self
        return ConstraintTables(*(host_to_device(x, device) for x in (self.table, self.tokens, self.dist)))

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
    return ConstraintTables(table, tokens, dist)


def holds_phrase(ids: Sequence[int], phrase: Sequence[int]) -> bool:
    """Whether ``phrase`` is a contiguous run of ``ids`` (a plain scan; reports and tests)."""
    n = len(phrase)
    return any(tuple(ids[i: i + n]) == tuple(phrase) for i in range(len(ids) - n + 1))


def phrases_met(ids: Sequence[int], phrases: Sequence[Sequence[int]], mode: str) -> list[bool]:
    """Per phrase, whether ``ids`` meet it: unordered, whether it occurs; ordered, whether it and
    every phrase before it occur in order without overlap (a plain left-to-right scan)."""
    if mode != "ordered":
        return [holds_phrase(ids, p) for p in phrases]
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
           "ConstraintTables", "batch_tables", "build_automaton", "holds_phrase", "phrases_met"]
