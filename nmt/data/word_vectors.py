"""Pretrained word vectors from text files: GloVe, and word2vec / fastText text (an ``N D`` header).

A file holds one vector a line, ``token v1 ... vD`` separated by spaces (or tabs). A first line of
exactly two non-negative integers is a word2vec header, ``N D`` (N vectors of D values); without
one the first line's field count gives D (its token must hold no whitespace). A token may hold
spaces (GloVe 840B has a few): a line's last D fields are its values, the rest its token, unless
that rest ends in a number (then the line has more than D values: an error). ``.gz`` files are
read through gzip. UTF-8; a leading byte-order mark is ignored; blank lines are skipped.

:func:`read_word_vectors` streams the file and keeps only the rows of the tokens it is asked for
(such files run to gigabytes): every line's field count is checked, the values of kept rows are
parsed (a non-number or a non-finite value is an error naming file and line); the values of other
rows are never converted. A token listed twice keeps its first vector (as gensim does); the later
lines of kept tokens are reported in :attr:`WordVectors.duplicates`. Knows nothing of models.
"""
from __future__ import annotations

import gzip
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Collection, Iterator

import numpy as np
import torch

from nmt.data.errors import DataError

_NUMBER = re.compile(rb"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_SPACE = re.compile(rb"\s")
_BOM = b"\xef\xbb\xbf"
_BINARY_HINT = (" (a binary word2vec file? nmt reads the text format: convert it, e.g. with gensim's "
                "KeyedVectors.save_word2vec_format(path, binary=False))")


class VectorDimensionError(DataError):
    """The file's vectors have another dimension than the one asked for: ``dim`` (the file's) and
    ``expected``; the message is one line naming the file."""

    def __init__(self, path: str, dim: int, expected: int) -> None:
        self.path, self.dim, self.expected = path, dim, expected
        super().__init__(f"{path} holds {dim}-dimensional vectors, {expected} expected")


@dataclass
class WordVectors:
    """The vectors of the asked-for tokens found in one file.

    path: the file; dim: D, its vectors' dimension; tokens: the tokens found, in file order;
    vectors: (len(tokens), D) float32, row i the vector of tokens[i] (each value parsed as a Python
    float, then rounded to float32); lines: the vectors the file holds (all tokens); header: whether
    it began with a word2vec ``N D`` line; duplicates: ``(token, line)`` of every later line of a
    found token (ignored: the first vector wins).
    """

    path: str
    dim: int
    tokens: list[str]
    vectors: torch.Tensor
    lines: int
    header: bool
    duplicates: list[tuple[str, int]] = field(default_factory=list)


def _open(path: str) -> IO[bytes]:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _header(first: bytes) -> tuple[int, int] | None:
    """``(N, D)`` when ``first`` (stripped) is a word2vec header line, else None."""
    fields = first.split()
    if len(fields) == 2 and all(f.isdigit() for f in fields):
        return int(fields[0]), int(fields[1])
    return None


def _malformed(path: str, number: int, line: bytes, problem: str) -> DataError:
    try:
        line.decode("utf-8")
        hint = ""
    except UnicodeDecodeError:
        hint = _BINARY_HINT
    return DataError(f"{path}:{number}: {problem}{hint}")


def _vector_lines(handle: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """(line number, stripped line) of each non-blank line, a leading byte-order mark dropped."""
    for number, raw in enumerate(handle, start=1):
        line = (raw[len(_BOM):] if number == 1 and raw.startswith(_BOM) else raw).strip()
        if line:
            yield number, line


def _dimension(path: str, number: int, line: bytes) -> tuple[int, tuple[int, int] | None]:
    """D from the file's first non-blank line (number ``number``): ``(D, (N, D))`` for a word2vec
    header (line 1 only), else ``(D, None)`` with D its fields less the token."""
    header = _header(line) if number == 1 else None
    if header is not None:
        if header[1] < 1:
            raise DataError(f"{path}:1: the word2vec header 'N D' gives dimension {header[1]}; at least 1")
        return header[1], header
    width = len(line.split()) - 1
    if width < 1:
        raise _malformed(path, number, line, "a token followed by its values expected, found one field")
    return width, None


def _read_error(path: str, exc: OSError | EOFError) -> DataError:
    return DataError(f"{path}: cannot read ({exc.strerror or exc})" if isinstance(exc, OSError)
                     else f"{path}: cannot read ({exc})")


def vectors_dimension(path: str | os.PathLike) -> int:
    """D, the dimension of the vectors file ``path``, from its word2vec header or its first vector
    line (the rest is not read). DataError (one line naming the file) as :func:`read_word_vectors`."""
    path = str(path)
    if not Path(path).is_file():
        raise DataError(f"{path}: no such file")
    try:
        with _open(path) as handle:
            for number, line in _vector_lines(handle):
                return _dimension(path, number, line)[0]
    except (OSError, EOFError) as exc:
        raise _read_error(path, exc) from None
    raise DataError(f"{path}: no vectors in the file")


def read_word_vectors(path: str | os.PathLike, wanted: Collection[str], dim: int | None = None) -> WordVectors:
    """Stream the vectors file ``path`` and return the vectors of the tokens in ``wanted``.

    dim: the dimension the caller needs; another one raises :class:`VectorDimensionError` as soon
    as the file's is known (its header or first line), before the rest is read.
    Raises :class:`DataError` (one line naming the file, and the line where there is one) for a
    missing or unreadable file, an empty file, a header ``N D`` that the file does not keep (D < 1,
    or another number of vectors than N), a line without D values after its token, a value that
    is not a finite number in a kept row.
    """
    path = str(path)
    if not Path(path).is_file():
        raise DataError(f"{path}: no such file")
    lookup = {token.encode("utf-8"): token for token in wanted}
    found: dict[str, int] = {}  # token -> its row of table
    table: np.ndarray | None = None  # (len(lookup), D) float32 once D is known; its first len(found) rows kept
    duplicates: list[tuple[str, int]] = []
    width: int | None = None  # D
    header: tuple[int, int] | None = None
    vectors = 0
    try:
        with _open(path) as handle:
            for number, line in _vector_lines(handle):
                if width is None:  # the header, or the first vector line of a GloVe file, gives D
                    width, header = _dimension(path, number, line)
                    if dim is not None and width != dim:
                        raise VectorDimensionError(path, width, dim)
                    table = np.empty((len(lookup), width), dtype=np.float32)
                    if header is not None:
                        continue
                parts = line.rsplit(None, width)
                if len(parts) != width + 1:
                    raise _malformed(path, number, line, f"{width} values expected after the token, found "
                                     f"{len(parts) - 1}")
                token_bytes = parts[0]
                if _SPACE.search(token_bytes) and _NUMBER.fullmatch(token_bytes.split()[-1]):
                    raise _malformed(path, number, line, f"{width} values expected after the token, found more")
                vectors += 1
                token = lookup.get(token_bytes)
                if token is None:
                    continue
                if token in found:
                    duplicates.append((token, number))
                    continue
                values = []
                for text in parts[1:]:
                    try:
                        value = float(text)
                    except ValueError:
                        raise _malformed(path, number, line, f"{text.decode('utf-8', 'replace')!r} is not a "
                                         "number") from None
                    if not math.isfinite(value):
                        raise DataError(f"{path}:{number}: {text.decode('utf-8', 'replace')!r} is not a finite "
                                        "number")
                    values.append(value)
                table[len(found)] = values  # each double rounded to the nearest float32
                found[token] = len(found)
    except (OSError, EOFError) as exc:  # unreadable, or a damaged .gz
        raise _read_error(path, exc) from None
    if width is None:
        raise DataError(f"{path}: no vectors in the file")
    if header is not None and header[0] != vectors:
        raise DataError(f"{path}: the word2vec header announces {header[0]} vectors, the file holds {vectors}")
    rows = torch.from_numpy(table[:len(found)].copy()) if table is not None else torch.zeros(0, width)
    return WordVectors(path, width, list(found), rows, vectors, header is not None, duplicates)


__all__ = ["VectorDimensionError", "WordVectors", "read_word_vectors", "vectors_dimension"]
