"""Atomic file writes: a temporary file in the target's directory, then ``os.replace``.

A reader never sees a half-written file: either the old content or the new one. The file
gets the mode a plain ``open(path, "w")`` would give it (``0o666 & ~umask``, e.g. 0644 under
umask 022), not ``mkstemp``'s private 0600.
"""
from __future__ import annotations

import os
import stat
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where the OS tells (Linux ``/proc``).

    Elsewhere it is read by setting and restoring it under a lock (other threads creating
    files at that instant could see umask 077, never a wider one).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def default_file_mode() -> int:
    """``0o666 & ~umask``: the mode ``open(path, "w")`` gives a new file."""
    return 0o666 & ~current_umask()


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success it replaces ``path`` atomically.

    mode: "w" (text) or "wb" (binary). On an exception the temporary file is removed and
    ``path`` is left untouched; an OSError of the write (ENOSPC, EACCES, ...) is re-raised
    naming ``path`` (not the temporary file). The file's mode respects the umask (see the module docstring).
    A symlink stays a link (the file it names is replaced); an existing ``path`` that is neither
    a regular file nor a directory (a device such as ``/dev/null``, a named pipe) is written
    directly, since there is no file to replace.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', got {mode!r}")
    try:
        existing = os.stat(path)  # through symlinks (/dev/stdout -> /proc/self/fd/1 -> a pipe)
    except OSError:  # missing (or unreachable: the write below names the problem)
        existing = None
    if existing is not None and not (stat.S_ISREG(existing.st_mode) or stat.S_ISDIR(existing.st_mode)):
        # a device (/dev/null, /dev/stdout) or a named pipe: no file to replace, and renaming over
        # it would put a regular file in its place (or fail outside a writable directory)
        with open(path, mode, encoding=None if "b" in mode else encoding) as handle:
            yield handle
        return
    # through a symlink: replace the file it names (next to it), not the link
    target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as handle:
            os.fchmod(handle.fileno(), default_file_mode())
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename in (None, tmp):
            raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None  # name the file being written
        raise


def describe_os_error(exc: OSError) -> str:
    """One line ``PATH: problem`` for an OSError (its first line when it names no path)."""
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror[0].lower()}{exc.strerror[1:]}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_open(path, "w") as handle:
        handle.write(text)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_open(path, "wb") as handle:
        handle.write(data)


__all__ = ["current_umask", "default_file_mode", "atomic_open", "describe_os_error", "atomic_write_text", "atomic_write_bytes"]
