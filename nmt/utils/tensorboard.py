"""TensorBoard writer for training: scalars, histograms and attention heatmaps (single and grids)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

logger = logging.getLogger(__name__)


class TensorBoardWriter:
    """Thin wrapper over ``torch.utils.tensorboard.SummaryWriter`` writing to ``log_dir``.

    ``enabled=False`` makes every call a no-op (same code path for runs without TensorBoard).
    """

    def __init__(self, log_dir: str | Path, enabled: bool = True, purge_step: int | None = None) -> None:
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def scalars(self, prefix: str, values: Mapping[str, float | None], step: int) -> None:
        """Write each finite number of ``values`` as ``prefix/name``."""
        if self.writer is None:
            return
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

        self.writer.add_figure(tag, plot_attention_grid(grid, list(src_tokens), list(tgt_tokens), title=title), step,
                               close=True)

    def histogram(self, tag: str, values: np.ndarray, step: int) -> None:
        """A histogram of ``values`` (any shape)."""
        if self.writer is not None:
            self.writer.add_histogram(tag, np.asarray(values, dtype=np.float64).ravel(), step)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


__all__ = ["TensorBoardWriter"]
