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

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


__all__ = ["Tokenizer"]
