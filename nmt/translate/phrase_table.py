"""Phrase tables for ``<unk>`` replacement (``nmt-translate -replace_unk -phrase_table FILE``).

OpenNMT-py's ``-phrase_table``: a UTF-8 file of ``source|||target`` lines. Where ``-replace_unk``
replaces an ``<unk>`` output by the source token of highest attention at its step
(:func:`nmt.translate.alignment.replace_unknowns`), a source token found in the table gives its
target instead of itself. Keys are source tokens as the source tokenizer cuts the input (words
for the space tokenizer, pieces such as ``▁Haus`` for sentencepiece); a target is inserted as one
piece before detokenization. Spaces around ``|||`` are kept as written; a later line for the same
source token replaces an earlier one (as OpenNMT-py's dictionary does).
"""
from __future__ import annotations

from pathlib import Path

from nmt.data.errors import DataError
from nmt.data.textfiles import read_lines

SEPARATOR = "|||"


def read_phrase_table(path: str | Path) -> dict[str, str]:
    """The table of ``path`` (source token -> target text). DataError naming the file and line for
    a line without ``|||`` or with an empty source (blank lines are skipped)."""
    table: dict[str, str] = {}
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        if SEPARATOR not in line:
            raise DataError(f"{path}:{number}: a phrase table line is source{SEPARATOR}target, got {line[:60]!r}")
        source, target = line.split(SEPARATOR, 1)
        if not source:
            raise DataError(f"{path}:{number}: empty source before {SEPARATOR}")
        table[source] = target
    return table


__all__ = ["SEPARATOR", "read_phrase_table"]
