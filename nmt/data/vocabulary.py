"""Token <-> id vocabulary with the four special tokens at fixed ids."""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nmt.data.errors import DataError
from nmt.data.textfiles import read_lines, write_lines_atomic

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)


class Vocabulary:
    """Specials ``<pad>`` = 0, ``<unk>`` = 1, ``<bos>`` = 2, ``<eos>`` = 3, then ``tokens``.

    Unknown tokens look up to ``unk_index``. A data token spelled like a special is treated as
    unknown at build time (it never gets a second id); ``lookup`` gives a special's spelling its
    id, while ``Field.encode`` (text to ids) makes it unknown.

    ``counts`` (token -> count in the data it was built from, or in the vocabulary file it was
    read from; None when unknown, e.g. rebuilt from a checkpoint) is informative only: it is
    written to vocabulary files (:mod:`nmt.data.vocab_file`) and is no part of equality or of
    :meth:`state_dict`.
    """

    pad_index: int = 0
    unk_index: int = 1
    bos_index: int = 2
    eos_index: int = 3

    def __init__(self, tokens: Iterable[str] = (), counts: Mapping[str, int] | None = None) -> None:
        self.itos: list[str] = list(SPECIALS)
        self.stoi: dict[str, int] = {s: i for i, s in enumerate(SPECIALS)}
        for tok in tokens:
            if not isinstance(tok, str) or not tok:
                raise DataError(f"vocabulary: token must be a non-empty string, got {tok!r}")
            if tok in self.stoi:
                raise DataError(f"vocabulary: duplicate token {tok!r}")
            self.stoi[tok] = len(self.itos)
            self.itos.append(tok)
        self.counts: dict[str, int] | None = (None if counts is None
                                              else {t: int(counts[t]) for t in self.itos[len(SPECIALS):]})

    @classmethod
    def build(
        cls, token_lists: Iterable[Sequence[str]], min_freq: int = 1, max_size: int | None = None
    ) -> "Vocabulary":
        """Vocabulary of the tokens seen at least ``min_freq`` times, most frequent first.

        ``max_size`` caps the number of non-special tokens (None: no cap). Ties in frequency are
        broken by the token string, so the result does not depend on the order of the data.
        """
        if min_freq < 1:
            raise DataError(f"vocabulary.min_freq: expected >= 1, got {min_freq}")
        if max_size is not None and max_size < 0:
            raise DataError(f"vocabulary.max_size: expected >= 0 or null, got {max_size}")
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        for s in SPECIALS:
            counts.pop(s, None)
        counts.pop("", None)
        kept = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        if max_size is not None:
            kept = kept[:max_size]
        return cls(kept, counts)

    def extended(self, token_lists: Iterable[Sequence[str]], min_freq: int = 1,
                 max_size: int | None = None) -> "Vocabulary":
        """This vocabulary with the tokens of ``token_lists`` it lacks appended: those seen at least
        ``min_freq`` times, most frequent first (ties by the token string), up to ``max_size``
        non-special tokens in all (None: no cap; a vocabulary already that large gains none). Every
        token keeps its id. ``counts`` are the new data's (0 for a token it lacks)."""
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        new = sorted((t for t, c in counts.items() if c >= min_freq and t and t not in self.stoi),
                     key=lambda t: (-counts[t], t))
        if max_size is not None:
            new = new[: max(0, max_size - (len(self.itos) - len(SPECIALS)))]
        old = self.itos[len(SPECIALS):]
        return Vocabulary(old + new, {t: counts.get(t, 0) for t in old + new})

    def lookup(self, tokens: Iterable[str]) -> list[int]:
        """Ids of ``tokens`` (``unk_index`` for unknown ones)."""
        get, unk = self.stoi.get, self.unk_index
        return [get(t, unk) for t in tokens]

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """Token strings of ``ids`` (ints, or anything ``int()`` takes); an id outside the vocabulary
        raises ``IndexError``. One range test for all ids, then the lookups (decoding calls this
        three times per sentence)."""
        itos, n = self.itos, len(self.itos)
        ids = [int(i) for i in ids] if not isinstance(ids, list) or not all(type(i) is int for i in ids) else ids
        if ids and not (0 <= min(ids) and max(ids) < n):
            bad = next(i for i in ids if not 0 <= i < n)
            raise IndexError(f"vocabulary: id {bad} out of range [0, {n})")
        return [itos[i] for i in ids]

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos

    def __repr__(self) -> str:
        return f"Vocabulary(size={len(self)})"

    def state_dict(self) -> dict[str, Any]:
        """``{"itos": [...]}`` including the specials."""
        return {"itos": list(self.itos)}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> "Vocabulary":
        """Rebuild from ``state_dict()``; checks that the specials sit at their ids."""
        itos = state.get("itos") if isinstance(state, Mapping) else None
        if not isinstance(itos, list):
            raise DataError("vocabulary state: missing key 'itos' (a list of tokens)")
        if tuple(itos[: len(SPECIALS)]) != SPECIALS:
            raise DataError(
                f"vocabulary state: 'itos' must start with {', '.join(SPECIALS)}, got {itos[:4]}"
            )
        return cls(itos[len(SPECIALS):])

    def save(self, path: str | os.PathLike) -> None:
        """Write one token per line (specials first), atomically."""
        write_lines_atomic(path, self.itos)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocabulary":
        """Read a file written by ``save`` (one token per line, specials first)."""
        itos = read_lines(path)
        if tuple(itos[: len(SPECIALS)]) != SPECIALS:
            raise DataError(f"{path}:1: a vocabulary file must start with the lines {', '.join(SPECIALS)}")
        for n, tok in enumerate(itos, 1):
            if not tok:
                raise DataError(f"{path}:{n}: empty token")
        seen: dict[str, int] = {}
        for n, tok in enumerate(itos, 1):
            if tok in seen:
                raise DataError(f"{path}:{n}: duplicate token {tok!r} (first on line {seen[tok]})")
            seen[tok] = n
        return cls(itos[len(SPECIALS):])


__all__ = ["BOS", "EOS", "PAD", "SPECIALS", "UNK", "Vocabulary"]
