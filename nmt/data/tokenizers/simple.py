"""Rule-based tokenizers: characters (morphology) and whitespace-separated tokens."""
from __future__ import annotations

from typing import Any

from nmt.data.errors import DataError
from nmt.data.tokenizers.base import Tokenizer

SPACE_SYMBOL = "\u2581"  # "▁", as in sentencepiece


class CharTokenizer(Tokenizer):
    """One token per character; a space becomes the visible token ``space_symbol`` ("▁").

    ``detokenize(tokenize(s)) == s`` for every string ``s``: a literal ``space_symbol``
    character in the text is escaped as the two-character token ``space_symbol * 2``.
    """

    type_name = "char"

    def __init__(self, space_symbol: str = SPACE_SYMBOL) -> None:
        if not isinstance(space_symbol, str) or len(space_symbol) != 1 or space_symbol.isspace():
            raise DataError(
                f"tokenizer.space_symbol: expected one visible character, got {space_symbol!r}"
            )
        self.space_symbol = space_symbol
        self._escaped = space_symbol * 2

    def tokenize(self, text: str) -> list[str]:
        sym, esc = self.space_symbol, self._escaped
        return [sym if c == " " else esc if c == sym else c for c in text]

    def detokenize(self, tokens: list[str]) -> str:
        sym, esc = self.space_symbol, self._escaped
        return "".join(" " if t == sym else sym if t == esc else t for t in tokens)

    def word_ids(self, pieces: list[str]) -> list[int | None]:
        """Words are runs of characters between spaces: the space token (and any whitespace
        character) belongs to no word (None), every other token to the word it is in."""
        ids: list[int | None] = []
        word, inside = -1, False
        for t in pieces:
            if t == self.space_symbol or t.isspace():
                ids.append(None)
                inside = False
            else:
                word += not inside
                inside = True
                ids.append(word)
        return ids

    def state_dict(self) -> dict[str, Any]:
        return {"type": self.type_name, "space_symbol": self.space_symbol}

    def __repr__(self) -> str:
        return f"CharTokenizer(space_symbol={self.space_symbol!r})"


class SpaceTokenizer(Tokenizer):
    """Tokens are the whitespace-separated words of the line (pre-tokenized text)."""

    type_name = "space"

    def tokenize(self, text: str) -> list[str]:
        return text.split()

    def detokenize(self, tokens: list[str]) -> str:
        return " ".join(tokens)

    def word_ids(self, pieces: list[str]) -> list[int | None]:
        """One word per token."""
        return list(range(len(pieces)))

    def state_dict(self) -> dict[str, Any]:
        return {"type": self.type_name}


__all__ = ["SPACE_SYMBOL", "CharTokenizer", "SpaceTokenizer"]
