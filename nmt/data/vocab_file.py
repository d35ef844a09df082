"""Vocabulary files: a vocabulary read from a file instead of built from the data, and written back.

The format is the one OpenNMT-py's ``onmt_build_vocab`` and fairseq's ``dict.txt`` use: UTF-8,
one token per line, optionally followed by spaces or tabs and a count (``token<TAB>count``,
``token count``; fairseq's trailing ``#fairseq:overwrite`` flag is accepted and ignored). The
separator is the last run of spaces / tabs before the count, so a token may itself hold a tab
(the ``char`` tokenizer keeps one as a token). Either every ordinary line has a count or none does.

Our specials (``<pad>``, ``<unk>``, ``<bos>``, ``<eos>``) found in the file keep their role (and
their fixed ids 0-3); missing ones are added. Every other line is a token, with the ids that
follow in file order. Other toolkits' specials (``<s>``, ``</s>``, ``<blank>``) are ordinary tokens.

Written files (:func:`write_vocab_file`) hold the tokens after the four specials, in id order
(line ``n`` is id ``n + 3``), with their counts when known (``token<TAB>count``).
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection

from nmt.data.errors import DataError
from nmt.data.textfiles import decode_line, read_lines, write_lines_atomic
from nmt.data.vocabulary import SPECIALS, Vocabulary

logger = logging.getLogger(__name__)

_COUNTED = re.compile(r"(.+?)[ \t]+(\d+)(?:[ \t]+#fairseq:overwrite)?[ \t]*")


def parse_vocab_line(line: str) -> tuple[str, int | None]:
    """``(token, count)`` of one line (count None when the line has none)."""
    match = _COUNTED.fullmatch(line)
    if match is None:
        return line, None
    return match.group(1), int(match.group(2))


def read_vocab_entries(path: str | os.PathLike) -> list[tuple[str, int | None, int]]:
    """``(token, count, line number)`` of every line of the vocabulary file ``path``, in order.

    Raises ``DataError`` ``FILE:LINE: problem`` for an empty token, a duplicate token (naming the
    line it first appeared on), or a file mixing lines with and without counts (specials may
    lack a count); ``FILE: problem`` when the file is missing, unreadable, not UTF-8 or empty.
    """
    entries: list[tuple[str, int | None, int]] = []
    seen: dict[str, int] = {}
    counted_line: int | None = None  # the first ordinary line with a count
    bare_line: int | None = None  # the first ordinary line without one
    for number, line in enumerate(read_lines(path), 1):
        token, count = parse_vocab_line(line)
        if not token:
            raise DataError(f"{path}:{number}: empty token (a vocabulary file holds one token per line)")
        if token in seen:
            raise DataError(f"{path}:{number}: duplicate token {token!r} (first on line {seen[token]})")
        seen[token] = number
        if token not in SPECIALS:
            if count is None:
                bare_line = bare_line or number
            else:
                counted_line = counted_line or number
            if counted_line is not None and bare_line is not None:
                other = counted_line if count is None else bare_line
                raise DataError(f"{path}:{number}: {'no count' if count is None else 'a count'} while line {other} "
                                f"has {'one' if count is None else 'none'}: give a count on every line or on none")
        entries.append((token, count, number))
    if not any(token not in SPECIALS for token, _, _ in entries):
        raise DataError(f"{path}: no tokens (an empty vocabulary file)")
    return entries


def read_vocab_file(path: str | os.PathLike, min_freq: int = 1, max_size: int | None = None,
                    key: str = "vocab_file", keep: Collection[str] = ()) -> Vocabulary:
    """The vocabulary of the file ``path`` (see the module docstring for the format).

    With counts, tokens counted fewer than ``min_freq`` times are dropped, and ``max_size``
    keeps the ``max_size`` most frequent of the rest (ties: the earlier line); without counts,
    ``min_freq`` > 1 is ignored with a warning (naming ``key``, e.g. ``data.src``) and
    ``max_size`` keeps the first ``max_size`` tokens. The tokens kept have the ids that follow
    the specials in file order. Tokens of ``keep`` (the source tags a config declares,
    :mod:`nmt.data.source_tags`) the file holds are kept whatever ``min_freq`` says, in their
    places, and take none of ``max_size``'s places: a run's ``vocab.src`` read back with that run's
    settings is its vocabulary. Errors: see :func:`read_vocab_entries`; a file that is not there
    (or not a file) is named with the setting that names it (``data.src.vocab_file: PATH: no such file``).
    """
    try:
        entries = [(t, c) for t, c, _ in read_vocab_entries(path) if t not in SPECIALS]
    except DataError as exc:
        if os.path.isfile(path):  # the file's own problem: its message names file and line
            raise
        raise DataError(f"{key}.vocab_file: {exc}") from None
    with_counts = entries[0][1] is not None
    keep = set(keep)
    ordinary = [i for i, (t, _) in enumerate(entries) if t not in keep]  # what min_freq / max_size choose from
    if with_counts:
        ordinary = [i for i in ordinary if entries[i][1] >= min_freq]
        if max_size is not None and len(ordinary) > max_size:
            ordinary = sorted(ordinary, key=lambda i: (-entries[i][1], i))[:max_size]
    else:
        if min_freq > 1:
            logger.warning("%s.min_freq=%d ignored: %s has no counts", key, min_freq, path)
        ordinary = ordinary[:max_size] if max_size is not None else ordinary
    chosen = set(ordinary)
    kept = [e for i, e in enumerate(entries) if i in chosen or e[0] in keep]
    dropped = len(entries) - len(kept)
    logger.info("%s.vocab_file %s: %d tokens%s", key, path, len(kept),
                f" ({dropped} of its {len(entries)} dropped by min_freq / max_size)" if dropped else "")
    return Vocabulary([t for t, _ in kept], dict(kept) if with_counts else None)


def write_vocab_file(path: str | os.PathLike, vocab: Vocabulary) -> None:
    """Write ``vocab``'s tokens after the specials, in id order, one per line with
    ``<TAB>count`` when ``vocab.counts`` is known; atomically (the umask's mode).

    :func:`read_vocab_file` reads it back to the same vocabulary (and counts): each line is
    checked by the reader's own rules (:func:`nmt.data.textfiles.decode_line`, then
    :func:`parse_vocab_line`). A token that would not read back as itself is a ``DataError``
    naming the file and the token, and nothing is written: one ending in spaces / tabs and digits
    when no count follows, one ending in a carriage return when no count follows (the reader
    drops it), a byte-order mark starting the first token (the reader drops it).
    """
    lines = []
    for number, token in enumerate(vocab.itos[len(SPECIALS):], 1):
        count = None if vocab.counts is None else vocab.counts[token]
        line = token if count is None else f"{token}\t{count}"
        if "\n" in token or parse_vocab_line(decode_line(line.encode("utf-8"), path, number)) != (token, count):
            raise DataError(f"{path}: token {token!r} cannot be written to a vocabulary file"
                            f"{' without counts' if count is None else ''} (it would not read back as itself)")
        lines.append(line)
    write_lines_atomic(path, lines)


__all__ = ["parse_vocab_line", "read_vocab_entries", "read_vocab_file", "write_vocab_file"]
