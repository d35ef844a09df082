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


class LogFileHandler(logging.FileHandler):
    """The log file. A write that fails with an OSError (a full disk) is reported once, as one
    warning on the console, and the file is given up for the rest of the process, instead of
    ``logging``'s traceback on stderr for every record that follows."""

    def __init__(self, filename: str | Path, encoding: str | None = None) -> None:
        super().__init__(filename, encoding=encoding)
        self.failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if self.failed:
            return
        if not isinstance(error, OSError):  # e.g. a bad format string: logging's own report
            super().handleError(record)
            return
        self.failed = True
        stream, self.stream = self.stream, None  # given up: close() has nothing left to flush
        try:
            if stream is not None:
                stream.close()
        except OSError:  # the unwritten rest of its buffer
            pass
        reason = error.strerror or str(error)
        logging.getLogger("nmt").warning("%s: %s; this log file is not written any more",  # the console only now
                                         self.baseFilename, reason[:1].lower() + reason[1:])


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
        file_handler = LogFileHandler(log_file, encoding="utf-8")
        file_handler.setLevel(logging.INFO)
        handlers.append(file_handler)
    for handler in handlers:
        handler.setFormatter(logging.Formatter(FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
        handler._nmt_handler = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    return root


__all__ = ["setup_logging", "TqdmHandler", "LogFileHandler"]
