"""TensorBoard writer for training: scalars, histograms and attention heatmaps (single and grids)."""
from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np

logger = logging.getLogger(__name__)


@contextmanager
def _naming(log_dir: Path) -> Iterator[None]:
    """Re-raise an OSError of TensorBoard's writer (a full disk) naming ``log_dir``: its errors
    come from a background thread's ``write`` and name no file."""
    try:
        yield
    except OSError as exc:
        if exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, exc.filename or str(log_dir)) from None


def _quiet_writer_thread() -> None:
    """Wrap ``threading.excepthook`` (once) so that it prints no traceback for TensorBoard's writer
    thread dying of an OSError (a full disk): the writer keeps that exception and raises it again
    in the thread that writes next, where :func:`_naming` makes it one line naming the directory."""
    previous = threading.excepthook
    if getattr(previous, "_nmt_quiet_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(args.exc_type, OSError):
            return
        previous(args)

    hook._nmt_quiet_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class TensorBoardWriter:
    """Thin wrapper over ``torch.utils.tensorboard.SummaryWriter`` writing to ``log_dir``.

    ``enabled=False`` makes every call a no-op (same code path for runs without TensorBoard).
    """

    def __init__(self, log_dir: str | Path, enabled: bool = True, purge_step: int | None = None) -> None:
        self.writer = None
        self.log_dir = Path(log_dir)
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_writer_thread()
            with _naming(self.log_dir):
                self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def scalars(self, prefix: str, values: Mapping[str, float | None], step: int) -> None:
        """Write each finite number of ``values`` as ``prefix/name``."""
        if self.writer is None:
            return
        with _naming(self.log_dir):
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value):
                    self.writer.add_scalar(f"{prefix}/{name}", value, step)

    def attention(self, tag: str, matrix: np.ndarray, src_tokens: Sequence[str], tgt_tokens: Sequence[str],
                  step: int, title: str | None = None) -> None:
        """Attention heatmap (T, L): source tokens on x, target tokens on y (exact zeros hatched)."""
        if self.writer is None:
            return
        try:
            from nmt.utils.heatmap import plot_attention
        except ImportError:
            logger.debug("nmt.utils.heatmap not available; no attention heatmaps")
            return
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        figure = plot_attention(matrix, list(src_tokens), list(tgt_tokens), title=title)
        with _naming(self.log_dir):
            self.writer.add_figure(tag, figure, step, close=True)
        plt.close(figure)

    def attention_grid(self, tag: str, grid: np.ndarray, src_tokens: Sequence[str], tgt_tokens: Sequence[str],
                       step: int, title: str | None = None) -> None:
        """A grid of heatmaps (R, C, T, L), e.g. every layer (rows) and head (columns) of a cross-attention."""
        if self.writer is None:
            return
        import matplotlib

        matplotlib.use("Agg", force=False)
        from nmt.utils.heatmap import plot_attention_grid

        figure = plot_attention_grid(grid, list(src_tokens), list(tgt_tokens), title=title)
        with _naming(self.log_dir):
            self.writer.add_figure(tag, figure, step, close=True)

    def histogram(self, tag: str, values: np.ndarray, step: int) -> None:
        """A histogram of ``values`` (any shape)."""
        if self.writer is not None:
            with _naming(self.log_dir):
                self.writer.add_histogram(tag, np.asarray(values, dtype=np.float64).ravel(), step)

    def flush(self) -> None:
        if self.writer is not None:
            with _naming(self.log_dir):
                self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            writer, self.writer = self.writer, None
            with _naming(self.log_dir):
                writer.close()


__all__ = ["TensorBoardWriter"]
