"""An exclusive lock on a directory: one writer (e.g. one training run) at a time.

The lock is ``DIR/.lock``, held with ``fcntl.flock`` and holding ``pid host`` of its owner
for the error message. The kernel drops a flock when its owner dies (kill -9 included), so
a lock file left by a dead process is stale by construction and simply taken over; where
flock is unavailable (no ``fcntl``, or a filesystem that refuses it: :data:`NO_FLOCK_ERRNOS`),
the recorded pid is checked instead (same host only).
Acquiring never blocks: a held lock raises :class:`DirectoryLockedError` at once.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path

from nmt.utils.io import pid_alive

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"
NO_FLOCK_ERRNOS = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)
"""What ``flock`` raises on a filesystem that does not support it: the recorded pid is checked instead."""


class DirectoryLockedError(RuntimeError):
    """Another live process holds the directory's lock; one line naming the lock file and its owner."""


class DirectoryLock:
    """``with DirectoryLock(path):`` or :meth:`acquire` / :meth:`release`.

    directory: created if missing (and removed again on release when still empty). ``what`` names the activity in the error
    (e.g. "training run").
    """

    def __init__(self, directory: str | os.PathLike, what: str = "process") -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self.what = what
        self._fd: int | None = None
        self._created: list[Path] = []  # directories acquire() created, deepest first

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "DirectoryLock":
        """Take the lock or raise DirectoryLockedError (never blocks)."""
        if self._fd is not None:
            return self
        if self.directory.exists() and not self.directory.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", str(self.directory))
        self._created = [d for d in (self.directory, *self.directory.parents) if not d.exists()]
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                previous = _read_owner(fd)
                if not _try_lock(fd, previous):
                    raise DirectoryLockedError(
                        f"{self.path}: {self.directory} is in use by another {self.what} "
                        f"({_describe(previous)}); wait for it to end or use another directory")
                # (the directory existed: we never remove what another run created)
                try:  # the file may have been unlinked by a releasing owner between open and lock
                    same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same = False
            except BaseException:
                os.close(fd)
                raise
            if same:
                break
            os.close(fd)
        if previous is not None and previous[0] != os.getpid():
            logger.info("%s: took over a stale lock (%s)", self.path, _describe(previous))
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        except OSError as exc:  # a full disk: name the lock file (the write's error names none)
            os.close(fd)
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent); directories that acquire()
        created and that are still empty are removed too (a refused or failed start leaves nothing)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # drops the flock
            self._fd = None
        for directory in self._created:
            try:
                directory.rmdir()
            except OSError:  # not empty (the run wrote something), or gone
                break
        self._created = []

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # an abandoned owner object must not keep the directory locked
        try:
            self.release()
        except Exception:
            pass


def _read_owner(fd: int) -> tuple[int, str] | None:
    try:
        fields = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
        return int(fields[0]), fields[1] if len(fields) > 1 else "?"
    except (OSError, ValueError, IndexError):
        return None


def _try_lock(fd: int, owner: tuple[int, str] | None) -> bool:
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            if exc.errno not in NO_FLOCK_ERRNOS:
                raise
            # a filesystem without flock (Lustre mounted noflock, some FUSE / SMB mounts): the pid check
    if owner is None or owner[1] != socket.gethostname():
        return owner is None
    return not pid_alive(owner[0])


def _describe(owner: tuple[int, str] | None) -> str:
    return "owner unknown" if owner is None else f"pid {owner[0]} on {owner[1]}"


__all__ = ["LOCK_NAME", "NO_FLOCK_ERRNOS", "DirectoryLock", "DirectoryLockedError"]
