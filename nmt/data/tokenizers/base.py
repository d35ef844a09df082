"""The tokenizer interface shared by all tokenizer types."""
from __future__ import annotations

import bisect
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

_WORD = re.compile(r"\S+")


class Tokenizer(ABC):
    """Turns a line of text into tokens and back.

    A tokenizer's ``state_dict()`` is self-contained (learned BPE codes or the sentencepiece
    model are embedded), so a checkpoint rebuilds exactly the same tokenizer with
    ``nmt.data.tokenizers.tokenizer_from_state_dict``.
    """

    type_name: ClassVar[str]
    needs_training: bool = False

    @abstractmethod
    def tokenize(self, text: str) -> list[str]:
        """Split one line into tokens."""

    @abstractmethod
    def detokenize(self, tokens: list[str]) -> str:
        """Join tokens back into one line of text."""

    def word_ids(self, pieces: list[str]) -> list[int | None]:
        """The word of each piece: ``ids[k]`` is the index, in ``detokenize(pieces).split()``, of
        the word piece ``k`` is part of, or None for a piece that is part of no word (a space
        token). The pieces of word ``w`` (in order) detokenize to that word alone. Alignments at
        the word level group pieces with this (``nmt.translate.alignment``). A tokenizer that
        cannot say raises NotImplementedError."""
        raise NotImplementedError(f"the {self.type_name} tokenizer does not group its pieces into words")

    def noise_units(self, piece: str) -> tuple[bool, bool]:
        """How noise on training sources (``nmt.data.source_noise``) groups pieces into the units it
        deletes, blanks and moves, from one piece alone: ``(starts, carries)``, whether ``piece``
        starts a unit (else it continues the one before) and whether it carries its unit on into the
        next piece. Here every piece is a unit of its own: ``(True, False)``."""
        return True, False

    def train(self, lines: Iterable[str], work_dir: str | os.PathLike | None = None) -> None:
        """Learn the tokenizer's model from ``lines`` (no-op for rule-based tokenizers)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """A plain-data dict holding ``type`` and everything needed to rebuild this tokenizer."""

    def difference(self, other: "Tokenizer") -> str | None:
        """How ``other`` tokenizes or detokenizes text otherwise than this tokenizer (a short phrase
        such as ``"bpe codes: 120 vs 100 merges"``), or None when the two agree on every text.

        Compared is the content that decides it (learned BPE codes, a sentencepiece model's pieces
        and rules), not where it was read from nor the settings only training reads (``merges``,
        ``vocab_size``): identical models at different paths agree. Ensembles and checkpoint
        averaging refuse members that differ here.
        """
        if type(other) is not type(self):
            return f"tokenizer type: {self.type_name} vs {other.type_name}"
        return self._difference(other)

    def _difference(self, other: "Tokenizer") -> str | None:
        """``difference`` for two tokenizers of this type: here any key of their states."""
        a, b = self.state_dict(), other.state_dict()
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return f"{self.type_name} {key}: {a.get(key)!r} vs {b.get(key)!r}"
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def words_of_spans(text: str, spans: Sequence[tuple[int, int]], blank_to_next: bool = False) -> list[int | None]:
    """Word indices (in ``text.split()``) of pieces whose surfaces are the character ranges
    ``spans`` ([begin, end) of ``text``): the first word a span overlaps; None for a span of
    whitespace only (or empty), unless ``blank_to_next`` and a word begins exactly where it ends
    (a sentencepiece word-start marker piece decoded to a space: part of the word it starts)."""
    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    starts = [b for b, _ in words]
    ends = [e for _, e in words]
    ids: list[int | None] = []
    for begin, end in spans:
        w = bisect.bisect_right(ends, begin)  # the first word ending after the span begins
        if w < len(words) and starts[w] < end:
            ids.append(w)
        elif blank_to_next and w < len(words) and starts[w] == end:
            ids.append(w)
        else:
            ids.append(None)
    return ids


__all__ = ["Tokenizer", "words_of_spans"]
