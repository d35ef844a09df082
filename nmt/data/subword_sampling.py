"""Subword regularization: random segmentations of training lines, reproducible from a seed.

Two samplers, one per learned tokenizer, drawing from a ``random.Random`` they are given (never
from a random state shared with other code); :func:`epoch_random` seeds one per side and epoch
from ``(training seed, epoch)``:

* :class:`SentencePieceSampler`: unigram sampling (Kudo 2018) as sentencepiece defines it for
  ``enable_sampling`` with ``alpha`` and ``nbest_size``: a segmentation with probability
  proportional to ``exp(alpha * score)`` among all segmentations (``nbest: -1``; sampled here per
  word: the distribution factorizes over words) or among the ``nbest`` best ones (here of each
  word). It is computed here from the model's pieces and scores, because sentencepiece's own
  sampler cannot be seeded per call: its ``std::mt19937`` is thread-local and seeded from the
  global seed (``sentencepiece.set_random_generator_seed``) when a thread first samples
  (``GetRandomGenerator`` in sentencepiece's unigram_model.cc / util.cc), so a later reseed does
  not reach it; with sentencepiece 0.2 two processes reseeding alike before every line still
  sampled different segmentations.
* :class:`BPEDropoutSampler`: BPE-dropout (Provilkov et al. 2020) with the distribution of
  subword-nmt's ``BPE.segment_tokens(tokens, dropout=p)`` (at every merge step each adjacent pair
  survives with probability ``1 - p``; the surviving pair of lowest merge rank is merged at its
  surviving positions; the word stops when no pair survives). subword-nmt draws from Python's
  global ``random``; here each word is a Markov chain over its partial segmentations whose
  transition tables are computed once per state and cached (a short word's distribution over
  its final segmentations is computed once whole), and a step costs one uniform draw.

Both cache per word type what they draw from, so that an epoch of Multi30k costs about a
uniform draw and a list extension per word; with ``encode`` (a field's ``encode_tokens``) the
cached segmentations are held as token ids, and ``sample`` returns ids.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Mapping
from random import Random
from typing import Any, Protocol

import numpy as np

from nmt.data.errors import DataError
from nmt.data.tokenizers import BPETokenizer, SentencePieceTokenizer, Tokenizer

SIDE_STREAMS = {"src": 0, "tgt": 1}
"""The stream of each side in :func:`epoch_random` (the two sides draw independently)."""
_SALT = 0x5B5A  # keeps these streams apart from the batch order's generator seeded with (seed, epoch)

Encode = Callable[[list[str]], list]
"""Tokens -> what a sampler returns for them (a field's ``encode_tokens``: ids), token by token."""


class SubwordSampler(Protocol):
    """Random segmentations: ``sample(text, rng)`` draws one of ``text`` from ``rng`` (a
    ``random.Random``): the same text and generator state give the same result in any process.
    Tokens (or their ids with ``encode``); ``tokenizer.detokenize`` of the tokens gives the text
    back as the tokenizer's deterministic tokens do. ``ids``: whether it returns ids."""

    tokenizer: Tokenizer
    ids: bool

    def sample(self, text: str, rng: Random) -> list: ...

    def describe(self) -> str: ...


def sampling_enabled(settings: Mapping[str, Any]) -> bool:
    """Whether a side's ``subword_sampling`` section asks for sampling (``alpha`` set or
    ``dropout`` > 0); off by default."""
    return settings.get("alpha") is not None or float(settings.get("dropout") or 0.0) > 0.0


def sampling_problem(settings: Mapping[str, Any], tokenizer_cfg: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(key under subword_sampling, problem)`` when ``settings`` cannot apply to the tokenizer
    configured by ``tokenizer_cfg``; None when they can (or sampling is off)."""
    if not sampling_enabled(settings):
        return None
    kind = tokenizer_cfg.get("type")
    alpha, dropout = settings.get("alpha"), float(settings.get("dropout") or 0.0)
    if kind not in ("bpe", "sentencepiece"):
        key = "alpha" if alpha is not None else "dropout"
        return key, f"subword sampling needs a bpe or sentencepiece tokenizer, not {kind!r} (its segmentation is fixed)"
    if kind == "bpe" and alpha is not None:
        return "alpha", "is sentencepiece's smoothing; a bpe tokenizer samples with subword_sampling.dropout"
    if kind == "sentencepiece":
        if dropout > 0:
            return "dropout", ("is subword-nmt's BPE-dropout; a sentencepiece tokenizer samples with "
                               "subword_sampling.alpha")
        model_type = tokenizer_cfg.get("model_type", "unigram")
        if tokenizer_cfg.get("model_file") is None and model_type != "unigram":
            return "alpha", (f"sampling needs a sentencepiece unigram model, not model_type {model_type!r} "
                             "(BPE-dropout: the bpe tokenizer's subword_sampling.dropout)")
    return None


def epoch_random(seed: int, epoch: int, side: str) -> Random:
    """The generator ``side`` (``"src"``/``"tgt"``) samples the training lines of ``epoch`` from,
    in line order: seeded with a function of ``(seed, epoch, side)`` only."""
    words = np.random.SeedSequence([int(seed), int(epoch), _SALT, SIDE_STREAMS[side]]).generate_state(2, np.uint64)
    return Random(int(words[0]) << 64 | int(words[1]))


def _identity(tokens: list[str]) -> list:
    return tokens


MAX_ENUMERATED_SEGMENTATIONS = 256
"""A word with at most this many segmentations into the model's pieces gets them all listed with
their probabilities once (each occurrence then costs one draw); a word with more is sampled
backwards through its lattice (one draw per piece)."""


class _Choices:
    """A categorical over token lists: ``cum`` (cumulative probabilities, the last 1) and
    ``tokens`` (one more entry than ``cum``, the last repeated: ``tokens[bisect_right(cum, u)]``
    is the draw of a uniform ``u`` in [0, 1) whatever the rounding of ``cum[-1]``)."""

    __slots__ = ("cum", "tokens")

    def __init__(self, weights: list[float], tokens: list[list]) -> None:
        total, cum = 0.0, []
        for w in weights:
            total += w
            cum.append(total)
        self.cum = [c / total for c in cum]
        self.tokens = tokens + tokens[-1:]


class _Lattice:
    """Backward sampling through a word's lattice (forward-filtering backward-sampling): for every
    end position ``j``, ``cum[j]`` (cumulative probabilities of the pieces ending there, given that
    a piece ends there) and ``steps[j]`` (each such piece's start and text)."""

    __slots__ = ("cum", "steps", "n")

    def __init__(self, cum: list[list[float]], steps: list[list[tuple[int, Any]]], n: int) -> None:
        self.cum, self.steps, self.n = cum, steps, n

    def draw(self, draw: Callable[[], float]) -> list:
        out = []
        j = self.n
        while j > 0:
            cum = self.cum[j]
            k = bisect_right(cum, draw() * cum[-1])
            j, piece = self.steps[j][min(k, len(cum) - 1)]
            out.append(piece)
        out.reverse()
        return out


MAX_CACHED_LINES = 2_000_000
"""The lines whose 'segments apart' test :class:`SentencePieceSampler` keeps; emptied past this (a
corpus streamed with ``data.id_cache`` need not be held as text here)."""
MAX_NBEST = 512
"""The largest ``nbest`` sentencepiece's ``nbest_encode`` accepts (its ``kMaxNBestSize``)."""


class SentencePieceSampler:
    """Sampling of a sentencepiece unigram model (Kudo 2018), implemented here on the model's
    pieces and scores (sentencepiece's own sampler cannot be seeded reproducibly: see the module
    docstring).

    A line is sampled word by word (a piece never crosses a word boundary): each whitespace-
    separated word gets a segmentation of its normalized form (as sentencepiece writes it, ``▁``
    first) drawn with probability proportional to ``exp(alpha * score)`` (score: the sum of its
    pieces' log probabilities) among all its segmentations (``nbest: -1``: sentencepiece's
    ``nbest_size=-1`` distribution, which factorizes over words) or among its ``nbest`` best ones
    (sentencepiece ranks the n-best of the whole line; here of each word, so that every word of a
    line may vary). ``nbest: 1`` is the deterministic segmentation. A word holding a character the
    model has no piece for, and a line whose words sentencepiece would not segment apart (other
    normalization rules), keep their deterministic segmentation.
    """

    def __init__(self, tokenizer: SentencePieceTokenizer, alpha: float, nbest: int = -1,
                 encode: Encode | None = None) -> None:
        if tokenizer.needs_training:
            raise DataError("subword_sampling: the sentencepiece tokenizer has no model yet")
        if not (nbest == -1 or 1 <= nbest <= MAX_NBEST):
            raise DataError(f"subword_sampling.nbest: expected -1 (all segmentations) or 1 to {MAX_NBEST} "
                            f"(sentencepiece's n-best limit), got {nbest}")
        if alpha is None or not 0 <= alpha < math.inf:
            raise DataError(f"subword_sampling.alpha: expected a finite number >= 0, got {alpha!r}")
        model_type = _sentencepiece_model_type(tokenizer)
        if model_type != "unigram":
            raise DataError(f"subword_sampling.alpha: sampling needs a sentencepiece unigram model, not a "
                            f"{model_type} model (BPE-dropout: the bpe tokenizer's subword_sampling.dropout)")
        self.tokenizer = tokenizer
        self.alpha, self.nbest = float(alpha), int(nbest)
        self.ids = encode is not None
        self._encode = encode or _identity
        self._sp = sp = tokenizer._processor()
        self._scores = {sp.id_to_piece(i): sp.get_score(i) for i in range(sp.get_piece_size())
                        if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i))}
        self._longest = max((len(p) for p in self._scores), default=1)
        self._words: dict[str, _Choices | _Lattice | list] = {}  # word -> what its segmentation is drawn from
        self._lines: dict[str, bool] = {}  # line -> whether its words segment apart as the whole line does

    def describe(self) -> str:
        return f"sentencepiece sampling (alpha {self.alpha:g}, nbest {self.nbest})"

    def sample(self, text: str, rng: Random) -> list:
        """The pieces (or ids) of one segmentation of ``text`` drawn from ``rng``."""
        words = text.split()
        apart = self._lines.get(text)
        if apart is None:
            if len(self._lines) >= MAX_CACHED_LINES:  # a pure cache: emptying it changes no result
                self._lines.clear()
            apart = self._lines[text] = self._segments_apart(text, words)
        if not apart:
            return self._encode(self._sp.encode(text, out_type=str))
        draw = rng.random
        cached = self._words
        out: list = []
        for word in words:
            choices = cached.get(word)
            if choices is None:
                choices = cached[word] = self._word(word)
            kind = type(choices)
            if kind is _Choices:
                out.extend(choices.tokens[bisect_right(choices.cum, draw())])
            elif kind is list:  # one segmentation
                out.extend(choices)
            else:
                out.extend(choices.draw(draw))
        return out

    def _segments_apart(self, text: str, words: list[str]) -> bool:
        pieces: list[str] = []
        for word in words:
            pieces.extend(self._sp.encode(word, out_type=str))
        return pieces == self._sp.encode(text, out_type=str)

    def _word(self, word: str) -> _Choices | _Lattice | list:
        best = self._sp.encode(word, out_type=str)
        text = "".join(best)
        scores, n = self._scores, len(text)
        if any(c not in scores for c in text) or not all(p in scores for p in best):
            return self._encode(best)  # a character without a piece of its own (<unk>): kept
        if self.nbest == 1:
            return self._encode(best)
        if self.nbest > 1:
            candidates = [list(c) for c in self._sp.nbest_encode(word, out_type=str, nbest_size=self.nbest)]
            candidates = [c for c in candidates if "".join(c) == text and all(p in scores for p in c)] or [best]
            return self._choices([(c, sum(scores[p] for p in c)) for c in candidates])
        # the lattice: the pieces ending at each position, log forward sums, numbers of segmentations
        alpha = self.alpha
        ending: list[list[tuple[int, str]]] = [[] for _ in range(n + 1)]
        forward = [0.0] + [-math.inf] * n
        counts = [1] + [0] * n
        for j in range(1, n + 1):
            for i in range(max(0, j - self._longest), j):
                piece = text[i:j]
                if counts[i] and piece in scores:
                    ending[j].append((i, piece))
                    counts[j] += counts[i]
            forward[j] = _logsumexp([forward[i] + alpha * scores[p] for i, p in ending[j]])
        if counts[n] <= MAX_ENUMERATED_SEGMENTATIONS:
            listed: list[tuple[list[str], float]] = []

            def walk(j: int, tail: list[str], score: float) -> None:
                if j == 0:
                    listed.append((tail[::-1], score))
                    return
                for i, piece in ending[j]:
                    walk(i, tail + [piece], score + scores[piece])
            walk(n, [], 0.0)
            return self._choices(listed)
        cum: list[list[float]] = [[] for _ in range(n + 1)]
        for j in range(1, n + 1):
            total = 0.0
            for i, piece in ending[j]:
                total += math.exp(forward[i] + alpha * scores[piece] - forward[j])
                cum[j].append(total)
        steps = [[(i, self._encode([piece])[0]) for i, piece in pieces] for pieces in ending]
        return _Lattice(cum, steps, n)

    def _choices(self, scored: list[tuple[list[str], float]]) -> _Choices | list:
        """The categorical ``exp(alpha * score)`` over ``scored`` (token list, score) pairs."""
        if len(scored) == 1:
            return self._encode(scored[0][0])
        top = max(score for _, score in scored)
        return _Choices([math.exp(self.alpha * (score - top)) for _, score in scored],
                        [self._encode(tokens) for tokens, _ in scored])


def _logsumexp(values: list[float]) -> float:
    top = max(values, default=-math.inf)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


class _State:
    """One partial segmentation of a word in the BPE-dropout chain: ``pieces`` (the symbols, the
    last ending in ``</w>``), and once expanded ``cum`` (cumulative probabilities of the outcomes),
    ``nexts`` (the next state's pieces per outcome, replaced by its ``_State`` once visited),
    or ``ranked`` (for a state simulated step by step: its pairs by merge rank with positions)."""

    __slots__ = ("pieces", "cum", "nexts", "ranked", "final")

    def __init__(self, pieces: tuple[str, ...]) -> None:
        self.pieces = pieces
        self.cum: list[float] | None = None
        self.nexts: list[Any] | None = None
        self.ranked: list[tuple[tuple[str, str], list[int]]] | None = None
        self.final: list[str] | None = None


MAX_EXACT_CHARACTERS = 10
"""A word of at most this many characters gets the exact distribution over its final
segmentations once (a dynamic programme over its chain), so that each of its occurrences costs one
draw; a longer word walks its chain (one draw per merge step)."""
MAX_CACHED_STATES = 400_000
"""The chain states kept (about 0.5 kB each); the cache is emptied when it grows past this."""
MAX_ENUMERATED_POSITIONS = 8
"""A pair occurring at more positions of a word state than this (runs such as ``========``) is
not expanded into its 2^positions outcomes: that state's step is simulated draw by draw."""


def _merge(pieces: tuple[str, ...], pair: tuple[str, str], positions: list[int]) -> tuple[str, ...]:
    """subword-nmt's merge of ``pair`` at ``positions`` (ascending; an overlapping one is skipped)."""
    out: list[str] = []
    i = 0
    joined = pair[0] + pair[1]
    for j in positions:
        if j < i:
            continue
        out.extend(pieces[i:j])
        out.append(joined)
        i = j + 2
    out.extend(pieces[i:])
    return tuple(out)


class BPEDropoutSampler:
    """BPE-dropout over a BPE tokenizer's codes with probability ``dropout`` in [0, 1) (see the
    module docstring); ``dropout`` 0 gives the deterministic segmentation."""

    def __init__(self, tokenizer: BPETokenizer, dropout: float, encode: Encode | None = None) -> None:
        if tokenizer.needs_training:
            raise DataError("subword_sampling: the bpe tokenizer has no codes yet")
        if not 0.0 <= dropout < 1.0:
            raise DataError(f"subword_sampling.dropout: must be in [0, 1), got {dropout!r}")
        self.tokenizer = tokenizer
        self.dropout = float(dropout)
        self.ids = encode is not None
        self._encode = encode or _identity
        bpe = tokenizer._bpe
        if bpe.version not in ((0, 1), (0, 2)):
            raise DataError(f"subword_sampling: bpe codes version {bpe.version} not supported")
        self._codes: dict[tuple[str, str], int] = bpe.bpe_codes
        self._version = bpe.version
        self._separator = tokenizer.separator
        self._words: dict[str, _State | _Choices | list] = {}  # word -> its first state, finals or one segmentation
        self._states: dict[tuple[str, ...], _State] = {}

    def describe(self) -> str:
        return f"BPE-dropout {self.dropout:g}"

    def sample(self, text: str, rng: Random) -> list:
        """The tokens (with separators, as ``BPETokenizer.tokenize``; or their ids) of one
        segmentation of ``text`` drawn from ``rng``."""
        draw = rng.random
        out: list = []
        for word in text.split():
            start = self._words.get(word)
            if start is None:
                start = self._words[word] = self._start(word)
            kind = type(start)
            if kind is _Choices:
                out.extend(start.tokens[bisect_right(start.cum, draw())])
            elif kind is list:  # one segmentation
                out.extend(start)
            else:
                out.extend(self._walk(start, draw))
        return out

    def _start(self, word: str) -> _State | _Choices | list:
        if len(word) == 1:
            return self._encode([word])
        if len(self._states) > MAX_CACHED_STATES:  # a pure cache: emptying it changes no result
            self._states.clear()
            self._words = {w: start for w, start in self._words.items() if not isinstance(start, _State)}
        if self._version == (0, 1):
            pieces = tuple(word) + ("</w>",)
        else:
            pieces = tuple(word[:-1]) + (word[-1] + "</w>",)
        if len(word) <= MAX_EXACT_CHARACTERS:
            return self._finals(pieces)
        return self._state(pieces)

    def _state(self, pieces: tuple[str, ...]) -> _State:
        state = self._states.get(pieces)
        if state is None:
            state = self._states[pieces] = _State(pieces)
            self._expand(state)
        return state

    def _finals(self, pieces: tuple[str, ...]) -> _Choices | list:
        """The distribution over the final segmentations of the chain started at ``pieces``: the
        probability of every state, pushed along the chain in order of fewer pieces (a merge
        removes at least one), its stop probability going to its final tokens. The states are
        not kept."""
        mass: dict[tuple[str, ...], float] = {pieces: 1.0}
        weights: list[float] = []
        tokens: list[list] = []
        while mass:
            longest = max(len(state) for state in mass)
            for state in [s for s in mass if len(s) == longest]:
                prob = mass.pop(state)
                node = _State(state)
                self._expand(node)
                if node.ranked is not None:  # not reached from a word this short; walk it instead
                    return self._state(pieces)  # type: ignore[return-value]
                moved = 0.0
                if node.cum is not None:
                    before = 0.0
                    for c, nxt in zip(node.cum, node.nexts):
                        mass[nxt] = mass.get(nxt, 0.0) + prob * (c - before)
                        before = c
                    moved = before
                stop = prob * (1.0 - moved)
                if stop > 0.0:
                    weights.append(stop)
                    tokens.append(node.final)
        return tokens[0] if len(tokens) == 1 else _Choices(weights, tokens)

    def _expand(self, state: _State) -> None:
        """The outcomes of one merge step from ``state`` and their probabilities."""
        pieces, codes, p = state.pieces, self._codes, self.dropout
        positions: dict[tuple[str, str], list[int]] = {}
        for i in range(len(pieces) - 1):
            pair = (pieces[i], pieces[i + 1])
            if pair in codes:
                positions.setdefault(pair, []).append(i)
        if not positions:
            state.final = self._tokens(pieces)
            return
        ranked = sorted(positions.items(), key=lambda item: codes[item[0]])
        if any(len(where) > MAX_ENUMERATED_POSITIONS for _, where in ranked):
            state.ranked = ranked
            state.final = self._tokens(pieces)  # where the chain stops when every pair is dropped
            return
        q = 1.0 - p
        none_before = 1.0  # probability that every pair of lower rank was dropped at all its positions
        cum: list[float] = []
        nexts: list[Any] = []
        total = 0.0
        for pair, where in ranked:
            m = len(where)
            for mask in range(1, 1 << m):
                kept = [where[k] for k in range(m) if mask >> k & 1]
                prob = none_before * q ** len(kept) * p ** (m - len(kept))
                if prob > 0.0:
                    total += prob
                    cum.append(total)
                    nexts.append(_merge(pieces, pair, kept))
            none_before *= p ** m
            if none_before == 0.0:
                break
        state.cum, state.nexts = cum, nexts
        state.final = self._tokens(pieces)  # the outcome 'every pair dropped' (probability none_before)

    def _walk(self, state: _State, draw: Callable[[], float]) -> list:
        """Run the chain from ``state`` to its end; the final tokens."""
        p = self.dropout
        while True:
            if state.ranked is not None:  # simulated: each position survives with probability 1 - p
                step = None
                for pair, where in state.ranked:
                    kept = [i for i in where if draw() > p]
                    if kept:
                        step = _merge(state.pieces, pair, kept)
                        break
                if step is None:
                    return state.final
                state = self._state(step)
                continue
            cum = state.cum
            if cum is None:
                return state.final
            k = bisect_right(cum, draw())
            if k == len(cum):  # every pair dropped
                return state.final
            nxt = state.nexts[k]
            if not isinstance(nxt, _State):
                nxt = state.nexts[k] = self._state(nxt)
            state = nxt

    def _tokens(self, pieces: tuple[str, ...]) -> list[str]:
        """Final pieces as ``BPETokenizer.tokenize`` writes them: ``</w>`` dropped, the
        separator on every piece but the last."""
        word = list(pieces)
        if word[-1] == "</w>":
            word = word[:-1]
        elif word[-1].endswith("</w>"):
            word[-1] = word[-1][:-4]
        sep = self._separator
        return self._encode([w + sep for w in word[:-1]] + [word[-1]])


def build_sampler(tokenizer: Tokenizer, settings: Mapping[str, Any],
                  encode: Encode | None = None) -> SubwordSampler | None:
    """The sampler a side's ``subword_sampling`` section asks for over ``tokenizer`` (trained),
    returning ``encode(tokens)`` (tokens when None); None when sampling is off. DataError (one
    line naming the key) when they do not fit."""
    if not sampling_enabled(settings):
        return None
    problem = sampling_problem(settings, tokenizer.state_dict())
    if problem is not None:
        raise DataError(f"subword_sampling.{problem[0]}: {problem[1]}")
    if isinstance(tokenizer, BPETokenizer):
        return BPEDropoutSampler(tokenizer, float(settings["dropout"]), encode)
    assert isinstance(tokenizer, SentencePieceTokenizer)
    return SentencePieceSampler(tokenizer, float(settings["alpha"]), int(settings.get("nbest", -1)), encode)


def _sentencepiece_model_type(tokenizer: SentencePieceTokenizer) -> str:
    """The trained model's type (a ``model_file`` may hold another than the config's ``model_type``)."""
    try:
        from sentencepiece import sentencepiece_model_pb2
        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(tokenizer.model_proto)
        return type(model.trainer_spec).ModelType.Name(model.trainer_spec.model_type).lower()
    except Exception:  # protobuf unavailable: the configured type
        return tokenizer.model_type


__all__ = ["BPEDropoutSampler", "SentencePieceSampler", "SubwordSampler", "build_sampler", "epoch_random", "sampling_enabled", "sampling_problem"]
