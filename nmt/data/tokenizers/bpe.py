"""Byte-pair encoding with subword-nmt (Sennrich et al. 2016): learn merges, apply them.

Words are the whitespace-separated tokens of a line; every subword but the last of a word
carries the continuation marker ``separator`` ("@@"), so ``detokenize`` rejoins words exactly
(whitespace runs collapse to one space, as for the space tokenizer).
"""
from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe

from nmt.data.errors import DataError
from nmt.data.textfiles import read_lines, write_lines_atomic
from nmt.data.tokenizers.base import Tokenizer


def _check_codes(codes: str, origin: str) -> None:
    """Raise a one-line ``DataError`` unless ``codes`` is a subword-nmt codes text with merges."""
    lines = codes.rstrip("\n").split("\n")
    start = 1 if lines and lines[0].startswith("#version:") else 0
    if len(lines) <= start:
        raise DataError(f"{origin}: BPE codes hold no merge operation")
    for n, line in enumerate(lines[start:], start + 1):
        if len(line.strip("\r ").split(" ")) != 2:
            raise DataError(f"{origin}:{n}: BPE codes line must be two symbols, got {line!r}")


def _code_lines(codes: str | None) -> list[str] | None:
    """``codes`` as subword-nmt reads them: lines stripped of ``\\r``, newline and spaces, blank
    ones at the end dropped (a codes file and the same codes learned here compare equal)."""
    if codes is None:
        return None
    lines = [line.strip("\r\n ") for line in codes.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


class BPETokenizer(Tokenizer):
    """subword-nmt BPE.

    cfg keys: ``merges`` (number of merge operations to learn, default 8000),
    ``min_frequency`` (of a pair to be merged, default 2), ``separator`` (default "@@"),
    ``codes_file`` (optional: use these learned codes instead of training).
    """

    type_name = "bpe"

    def __init__(
        self,
        merges: int = 8000,
        min_frequency: int = 2,
        separator: str = "@@",
        codes_file: str | os.PathLike | None = None,
        codes: str | None = None,
    ) -> None:
        if not isinstance(merges, int) or merges < 1:
            raise DataError(f"tokenizer.merges: expected a positive integer, got {merges!r}")
        if not isinstance(min_frequency, int) or min_frequency < 1:
            raise DataError(
                f"tokenizer.min_frequency: expected a positive integer, got {min_frequency!r}"
            )
        if not isinstance(separator, str) or not separator or any(c.isspace() for c in separator):
            raise DataError("tokenizer.separator: expected a non-empty string without spaces")
        self.merges = merges
        self.min_frequency = min_frequency
        self.separator = separator
        self.codes: str | None = None
        self._bpe: BPE | None = None
        if codes is None and codes_file is not None:
            codes = "\n".join(read_lines(codes_file)) + "\n"
            self._set_codes(codes, str(codes_file))
        elif codes is not None:
            self._set_codes(codes, "tokenizer.codes")

    @property
    def needs_training(self) -> bool:  # type: ignore[override]
        return self.codes is None

    def _set_codes(self, codes: str, origin: str) -> None:
        _check_codes(codes, origin)
        self.codes = codes
        self._bpe = BPE(io.StringIO(codes), separator=self.separator)

    def train(self, lines: Iterable[str], work_dir: str | os.PathLike | None = None) -> None:
        """Learn ``merges`` merge operations from ``lines``; write ``work_dir/bpe.codes`` if given."""
        words = [" ".join(line.split()) for line in lines]
        out = io.StringIO()
        log = io.StringIO()
        try:
            with contextlib.redirect_stderr(log):  # subword-nmt's progress bar and messages
                learn_bpe(words, out, self.merges, min_frequency=self.min_frequency)
        except ValueError:  # no symbol pair at all (e.g. empty or one-character data)
            raise DataError("BPE training data has no pair of symbols to merge") from None
        codes = out.getvalue()
        self._set_codes(codes, "BPE training data")
        if work_dir is not None:
            write_lines_atomic(Path(work_dir) / "bpe.codes", codes.rstrip("\n").split("\n"))

    def tokenize(self, text: str) -> list[str]:
        if self._bpe is None:
            raise RuntimeError("BPE tokenizer has no codes: call train() or set codes_file")
        return self._bpe.segment_tokens(text.split())

    def detokenize(self, tokens: list[str]) -> str:
        sep, n = self.separator, len(self.separator)
        words: list[str] = []
        prefix = ""
        for t in tokens:
            if t.endswith(sep):
                prefix += t[:-n]
            else:
                words.append(prefix + t)
                prefix = ""
        if prefix:
            words.append(prefix)
        return " ".join(words)

    def word_ids(self, pieces: list[str]) -> list[int | None]:
        """A piece ending in ``separator`` continues into the next one: a word is a run of such
        pieces and the piece after them (or the end). A run whose text is empty (pieces that are
        the separator alone) makes no word of ``detokenize``'s: None."""
        n = len(self.separator)
        ids: list[int | None] = []
        word, start, surface = 0, 0, ""
        for k, t in enumerate(pieces):
            continues = t.endswith(self.separator)
            surface += t[:-n] if continues else t
            if not continues or k == len(pieces) - 1:  # the word ends here
                ids.extend([word if surface else None] * (k + 1 - start))
                word += bool(surface)
                start, surface = k + 1, ""
        return ids

    def noise_units(self, piece: str) -> tuple[bool, bool]:
        """A word is a run of pieces ending in ``separator`` and the piece after them (fairseq's
        noising with a BPE continuation marker): ``(True, piece ends with separator)``."""
        return True, piece.endswith(self.separator)

    def _difference(self, other: Tokenizer) -> str | None:
        """Separator and codes (line by line, as subword-nmt reads them); ``merges`` and
        ``min_frequency`` only shaped the learning of the codes."""
        assert isinstance(other, BPETokenizer)
        if self.separator != other.separator:
            return f"bpe separator: {self.separator!r} vs {other.separator!r}"
        a, b = _code_lines(self.codes), _code_lines(other.codes)
        if a == b:
            return None
        if a is None or b is None:
            return "bpe codes: learned in one only"
        if len(a) != len(b) and a[:1] == b[:1]:  # the same version line (or none)
            header = int(a[0].startswith("#version:"))
            return f"bpe codes: {len(a) - header} vs {len(b) - header} merges"
        n = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        return f"bpe codes line {n + 1}: {a[n]!r} vs {b[n]!r}"

    def state_dict(self) -> dict[str, Any]:
        return {
            "type": self.type_name,
            "merges": self.merges,
            "min_frequency": self.min_frequency,
            "separator": self.separator,
            "codes": self.codes,
        }

    def __repr__(self) -> str:
        n = None if self.codes is None else len(self.codes.rstrip("\n").split("\n")) - 1
        return f"BPETokenizer(merges={self.merges}, learned={n}, separator={self.separator!r})"


__all__ = ["BPETokenizer"]
