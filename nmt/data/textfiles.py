"""Reading and atomically writing text files, one example per line.

Lines are split on ``\\n`` only (never on Unicode line separators such as U+2028, which
``str.splitlines`` would break on and which would silently misalign parallel files); a trailing
``\\r`` (Windows line ending) is removed, a leading UTF-8 byte-order mark is ignored.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from nmt.data.errors import DataError
from nmt.utils.io import atomic_write_bytes

PathLike = str | os.PathLike


def read_lines(path: PathLike) -> list[str]:
    """All lines of a UTF-8 text file without their line terminators.

    Raises ``DataError`` with a one-line message naming the file (and the line for bad bytes)
    when the file is missing, is a directory, cannot be read, or is not valid UTF-8.
    """
    path = Path(path)
    with _open_text_file(path) as handle:
        data = handle.read()
    return decode_lines(data, str(path))


def _open_text_file(path: Path):
    """``open(path, "rb")``; DataError naming the file when it is missing, a directory or unreadable."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a text file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None


def iter_lines(path: PathLike) -> Iterator[str]:
    """The lines of a UTF-8 file one at a time, with ``read_lines``' rules (split on ``\\n``
    only, a trailing ``\\r`` and a leading byte-order mark removed); DataError names file:line."""
    path = Path(path)
    with _open_text_file(path) as handle:
        for number, raw in enumerate(handle, 1):
            yield decode_line(raw, path, number)


def decode_line(raw: bytes, name: PathLike, number: int) -> str:
    """Line ``number`` (1-based) of ``name`` from its bytes, with ``read_lines``' rules: a ``\\n``
    then a ``\\r`` at the end and, on line 1, a byte-order mark removed. Bad UTF-8 raises
    ``DataError`` naming ``name``, the line and the byte's column (1-based, after a removed
    byte-order mark), as :func:`decode_lines` does for a whole file."""
    if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{name}:{number}: not valid UTF-8 (byte 0x{raw[e.start]:02x} "
                        f"at column {e.start + 1})") from None


def decode_lines(data: bytes, name: str) -> list[str]:
    """The lines of UTF-8 ``data`` (a file's or stdin's bytes) as :func:`read_lines` splits them.

    A leading byte-order mark is dropped; bad UTF-8 raises ``DataError`` naming ``name`` and the line.
    """
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - data.rfind(b"\n", 0, e.start)
        raise DataError(
            f"{name}:{line}: not valid UTF-8 (byte 0x{data[e.start]:02x} at column {column})"
        ) from None
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def write_bytes_atomic(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, then ``os.replace``)."""
    atomic_write_bytes(path, data)


def write_lines_atomic(path: PathLike, lines: Iterable[str]) -> None:
    """Write ``lines`` (without terminators) as a UTF-8 file, one per line, atomically."""
    lines = list(lines)
    for i, line in enumerate(lines, 1):
        if "\n" in line:
            raise DataError(f"{path}:{i}: line to write contains a newline character")
    write_bytes_atomic(path, "".join(line + "\n" for line in lines).encode("utf-8"))


__all__ = ["decode_line", "decode_lines", "iter_lines", "read_lines", "write_bytes_atomic", "write_lines_atomic"]
