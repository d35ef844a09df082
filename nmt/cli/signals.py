"""SIGINT / SIGTERM for the commands that write their files at the end (``nmt-translate``,
``nmt-average``, ``nmt-release``).

Python turns SIGINT into KeyboardInterrupt but lets SIGTERM (a plain ``kill``) end the process at
once, so an atomic write in progress would leave its temporary file behind. Inside
:func:`stop_on_signals` both raise :class:`Terminated`: the write removes its temporary file and
the command exits with 128 + the signal number. (SIGKILL cannot be caught; its temporary file is
removed by the next command's first write into that directory:
:func:`nmt.utils.io.remove_stale_temporaries_in`.)
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


class Terminated(BaseException):
    """SIGINT or SIGTERM arrived; ``signum`` is its number. A BaseException, like KeyboardInterrupt."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, frame: object) -> None:
    raise Terminated(signum)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """While active, SIGINT and SIGTERM raise :class:`Terminated` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["Terminated", "stop_on_signals"]
