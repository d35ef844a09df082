"""Graceful SIGINT / SIGTERM: finish the current update, save, exit cleanly."""
from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

logger = logging.getLogger(__name__)


class GracefulInterrupt:
    """Context manager: while active, SIGINT/SIGTERM set :attr:`requested` instead of killing.

    A second SIGINT raises KeyboardInterrupt (force quit). Previous handlers are restored on
    exit. Outside the main thread (where handlers cannot be installed) it does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "GracefulInterrupt":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = name
        logger.warning("%s received: saving last.pt after the current update (SIGINT again to force quit)", name)


__all__ = ["GracefulInterrupt"]
