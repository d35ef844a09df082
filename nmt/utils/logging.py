"""Logging setup for the command-line tools: console plus a log file in the run directory."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(message)s"


class TqdmHandler(logging.StreamHandler):
    """Writes records through ``tqdm.write`` so they do not break an active progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


def setup_logging(log_file: str | Path | None = None, level: int = logging.INFO) -> logging.Logger:
    """Configure the ``nmt`` logger: stderr at ``level`` and, when given, ``log_file``
    (appended) at INFO whatever ``level`` is, so a quiet run still keeps its full record.

    Idempotent: handlers installed by a previous call are replaced.
    """
    root = logging.getLogger("nmt")
    root.setLevel(min(level, logging.INFO) if log_file is not None else level)
    root.propagate = False
    for handler in list(root.handlers):
        if getattr(handler, "_nmt_handler", False):
            root.removeHandler(handler)
            handler.close()
    console = TqdmHandler(sys.stderr)
    console.setLevel(level)
    handlers: list[logging.Handler] = [console]
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(log_file, encoding="utf-8")
        file_handler.setLevel(logging.INFO)
        handlers.append(file_handler)
    for handler in handlers:
        handler.setFormatter(logging.Formatter(FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
        handler._nmt_handler = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    return root


__all__ = ["setup_logging", "TqdmHandler"]
