"""The tokenizer interface shared by all tokenizer types."""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar


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


__all__ = ["Tokenizer"]
