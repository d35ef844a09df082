"""Atomic file writes: a temporary file in the target's directory, then ``os.replace``.

A reader never sees a half-written file: either the old content or the new one. The file
gets the mode a plain ``open(path, "w")`` would give it (``0o666 & ~umask``, e.g. 0644 under
umask 022), not ``mkstemp``'s private 0600.

Temporary files are named ``.NAME.p<pid>h<host>.<random>.tmp`` (``<host>``: 8 hex digits of a
hash of the host name), so that a process killed mid-write (SIGKILL, a power cut: no chance to
remove it) leaves a file whose writer can be told dead later: a process's first atomic write
into a directory removes the temporaries there whose writer was a process of this host that no
longer runs (:func:`remove_stale_temporaries_in`; once per directory and process, since listing a
directory of many files, as ``-attention DIR`` writes, at every write made those writes
quadratic: 5,000 heatmaps took 7.9 s of listing). A temporary of a live process, of another host
(on a shared filesystem its pid cannot be checked) or without an owner in its name (written by
an older nmt) is left alone.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
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


def _host_tag(host: str | None = None) -> str:
    """8 hex digits naming ``host`` (default: this one) in temporary file names."""
    return hashlib.sha1((host or socket.gethostname()).encode("utf-8", "replace")).hexdigest()[:8]


_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.p(?P<pid>\d+)h(?P<host>[0-9a-f]{8})\.[A-Za-z0-9_]+\.tmp$")
_MAX_NAME_IN_TEMP = 200  # bytes of the NAME part of a temporary's name: with the rest it stays under 255 bytes


def _name_in_temp(target_name: str) -> str:
    """``target_name`` cut to at most :data:`_MAX_NAME_IN_TEMP` bytes as the filesystem stores it
    (whole characters: a name of 244 bytes in 122 accented letters fits 255, its temporary did not)."""
    cut = target_name[:_MAX_NAME_IN_TEMP]
    while len(os.fsencode(cut)) > _MAX_NAME_IN_TEMP:
        cut = cut[:-1]
    return cut


def temporary_owner(name: str) -> tuple[str, int, str] | None:
    """``(target name, pid, host tag)`` of a temporary file name written by :func:`atomic_open`
    (``.NAME.p<pid>h<host>.<random>.tmp``), or None for any other name (an older nmt's
    temporaries carry no owner). A long target name appears shortened (see :func:`_temp_prefix`)."""
    match = _TEMP_NAME.match(name)
    if match is None:
        return None
    return match.group("name"), int(match.group("pid")), match.group("host")


def _temp_prefix(target_name: str, pid: int | None = None) -> str:
    return f".{_name_in_temp(target_name)}.p{os.getpid() if pid is None else pid}h{_host_tag()}."


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a process of another user counts as running)."""
    if pid <= 0:
        return True  # never a writer's pid; ``kill(0 or -N)`` would signal groups
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:  # anything else: cannot tell, so not provably dead
        return True
    return True


def stale_temporary(name: str) -> bool:
    """True when ``name`` is an :func:`atomic_open` temporary whose writer was a process of this
    host that no longer runs: the write it belonged to can never finish."""
    owner = temporary_owner(name)
    return (owner is not None and owner[2] == _host_tag() and owner[1] != os.getpid()
            and not pid_alive(owner[1]))


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries that killed writes of ``path`` left next to it (see the module
    docstring: the writer a process of this host that no longer runs). Returns the removed paths;
    a directory that cannot be listed, or a file already gone, is passed over."""
    target = Path(path)
    return _remove_stale(target.parent, _name_in_temp(target.name))


def remove_stale_temporaries_in(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporaries in ``directory`` that killed writes of any file there left (their
    writer a process of this host that no longer runs). Returns the removed paths, as
    :func:`remove_stale_temporaries`."""
    return _remove_stale(Path(directory), None)


def _remove_stale(directory: Path, name: str | None) -> list[Path]:
    """The stale temporaries in ``directory`` of target ``name`` (None: of any target), removed."""
    stem = "." if name is None else f".{name}."
    removed: list[Path] = []
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(stem) and e.name.endswith(".tmp")]
    except OSError:
        return removed
    for entry in entries:
        owner = temporary_owner(entry.name)
        if owner is None or (name is not None and owner[0] != name) or not stale_temporary(entry.name):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
            elif entry.is_dir(follow_symlinks=False):  # an atomic_directory's
                shutil.rmtree(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            pass
    return removed


_SWEPT: set = set()
_SWEPT_LOCK = threading.Lock()


def _sweep_once(directory: Path) -> None:
    """:func:`remove_stale_temporaries_in` ``directory`` at this process's first atomic write there."""
    key = os.fspath(directory.resolve())
    with _SWEPT_LOCK:
        if key in _SWEPT:
            return
        _SWEPT.add(key)
    remove_stale_temporaries_in(directory)


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
    directly, since there is no file to replace. At this process's first write into a directory,
    the temporaries that killed earlier writes left there are removed (:func:`remove_stale_temporaries_in`).
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
    _sweep_once(target.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target.name), suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _naming(exc, path) from None
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
            raise _naming(exc, path) from None  # name the file being written
        raise


def _naming(exc: OSError, path: str | os.PathLike) -> OSError:
    """``exc`` (of a temporary's creation, write or rename) as the same error naming ``path``, the
    file or directory being written: same errno, hence the same subclass (``PermissionError``...)."""
    return OSError(exc.errno, exc.strerror, os.fspath(path))


def _fsync_path(path: str | os.PathLike, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary directory next to ``path`` to fill; on success it becomes ``path`` atomically.

    The temporary is named as :func:`atomic_open`'s files are (``.NAME.p<pid>h<host>.<random>.tmp``),
    so one that a killed writer left is removed by a later process's first atomic write there. On
    leaving the block, the regular files directly inside it and the directory itself are flushed
    to disk (fsync: a power cut cannot leave a renamed directory of torn files), its mode is set
    from the umask (``0o777 & ~umask``, not ``mkdtemp``'s 0700) and it is renamed to ``path``. The
    rename fails with an OSError (``path`` named) when ``path`` exists and is not an empty
    directory, e.g. when another process was faster. On any exception the temporary is removed.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_once(target.parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(target.name), suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise _naming(exc, path) from None
    try:
        # read the umask without setting it to 0: another thread's file made meanwhile would be world-writable
        os.chmod(tmp, 0o777 & ~current_umask())
        yield tmp
        for entry in os.scandir(tmp):
            if entry.is_file(follow_symlinks=False):
                _fsync_path(entry.path)
        _fsync_path(tmp, directory=True)
        try:
            os.rename(tmp, target)
        except OSError as exc:
            raise _naming(exc, path) from None
        _fsync_path(target.parent, directory=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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


__all__ = ["current_umask", "default_file_mode", "temporary_owner", "pid_alive", "stale_temporary",
           "remove_stale_temporaries", "remove_stale_temporaries_in", "atomic_open", "atomic_directory", "describe_os_error", "atomic_write_text", "atomic_write_bytes"]
