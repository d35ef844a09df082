"""Attention heatmaps: source tokens on x, target tokens on y, exact zeros hatched.

Sparse mappings (sparsemax, entmax, fusedmax, oscarmax) give exact zeros; drawing them as
white hatched cells with their own legend entry ("exact zero"), rather than the darkest colour
of the scale (which belongs to tiny nonzero values), makes the sparsity pattern and fused
groups visible. ``attention_title`` says what a heatmap shows: which sentence, which step and
whether the target rows are the reference (teacher forcing) or the model's own output.
matplotlib is imported here only, lazily by callers; figures are built without pyplot, so no
global figure state leaks and no display is needed.
"""
from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Sequence

import numpy as np

FORMATS = ("png", "pdf", "svg")
"""File formats heatmaps are written in."""
ZERO_HATCH = "////"
ZERO_HATCH_COLOR = "0.65"


def plot_attention(
    matrix: np.ndarray,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    path: str | os.PathLike | None = None,
    title: str | None = None,
    fmt: str | None = None,
):
    """Heatmap of ``matrix`` (T, L): row t = attention while producing ``tgt_tokens[t]``.

    ``src_tokens`` label the L columns, ``tgt_tokens`` the T rows (ValueError if the counts do
    not match). Cells equal to 0 are white and hatched (legend entry "exact zero"); values are
    drawn on a fixed [0, 1] scale. When ``path`` is given the figure is also saved there
    atomically in format ``fmt`` (png, pdf or svg; default: from the suffix). Returns the
    ``matplotlib.figure.Figure``.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"plot_attention: expected a (T, L) matrix, got shape {matrix.shape}")
    rows, cols = matrix.shape
    if len(tgt_tokens) != rows or len(src_tokens) != cols:
        raise ValueError(
            f"plot_attention: matrix is {rows}x{cols} but got {len(tgt_tokens)} target and "
            f"{len(src_tokens)} source tokens"
        )
    width = min(3.0 + 0.35 * cols, 40.0)
    height = min(2.0 + 0.3 * rows, 40.0)
    figure = Figure(figsize=(width, height), dpi=100)
    axes = figure.add_subplot(1, 1, 1)
    masked = np.ma.masked_where(matrix == 0.0, matrix)
    image = axes.imshow(masked, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest",
                        zorder=1)
    # masked (zero) cells are transparent: the hatched background shows through them only
    axes.add_patch(Rectangle((-0.5, -0.5), cols, rows, facecolor="white", edgecolor=ZERO_HATCH_COLOR,
                             hatch=ZERO_HATCH, linewidth=0.0, zorder=0))
    axes.legend(handles=[Patch(facecolor="white", edgecolor=ZERO_HATCH_COLOR, hatch=ZERO_HATCH,
                               label="exact zero")],
                loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize="small", frameon=False)
    axes.set_xticks(range(cols))
    axes.set_xticklabels(list(src_tokens), rotation=90)
    axes.set_yticks(range(rows))
    axes.set_yticklabels(list(tgt_tokens))
    axes.set_xlabel("source")
    axes.set_ylabel("target")
    if title:  # wrapped to the figure's width
        axes.set_title(textwrap.fill(title, width=max(30, int(11 * width))), fontsize="small", pad=22)
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    figure.tight_layout()
    if path is not None:
        _save_atomic(figure, Path(path), fmt)
    return figure


def plot_attention_grid(
    grid: np.ndarray,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    path: str | os.PathLike | None = None,
    row_label: str = "layer",
    column_label: str = "head",
    title: str | None = None,
):
    """A grid of heatmaps: ``grid`` (R, C, T, L), one panel per (row, column), e.g. per layer
    (rows) and head (columns) of a Transformer's cross-attention. Panels as in
    :func:`plot_attention` (exact zeros hatched, one legend entry for them, a fixed [0, 1] scale,
    target tokens labelling the first column, source tokens the last row), ``title`` above them
    all. Saved atomically to ``path`` when given.
    Returns the ``matplotlib.figure.Figure``.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    grid = np.asarray(grid, dtype=np.float64)
    if grid.ndim != 4:
        raise ValueError(f"plot_attention_grid: expected an (R, C, T, L) array, got shape {grid.shape}")
    n_rows, n_cols, rows, cols = grid.shape
    if len(tgt_tokens) != rows or len(src_tokens) != cols:
        raise ValueError(
            f"plot_attention_grid: panels are {rows}x{cols} but got {len(tgt_tokens)} target and "
            f"{len(src_tokens)} source tokens"
        )
    width = min(1.5 + n_cols * (1.0 + 0.25 * cols), 60.0)
    height = min(1.0 + n_rows * (1.0 + 0.22 * rows), 60.0)
    figure = Figure(figsize=(width, height), dpi=100)
    axes = figure.subplots(n_rows, n_cols, squeeze=False)
    image = None
    for r in range(n_rows):
        for c in range(n_cols):
            ax = axes[r][c]
            masked = np.ma.masked_where(grid[r, c] == 0.0, grid[r, c])
            image = ax.imshow(masked, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest",
                              zorder=1)
            ax.add_patch(Rectangle((-0.5, -0.5), cols, rows, facecolor="white", edgecolor=ZERO_HATCH_COLOR,
                                   hatch=ZERO_HATCH, linewidth=0.0, zorder=0))  # shows through zero cells
            ax.set_xticks(range(cols))
            ax.set_xticklabels(list(src_tokens) if r == n_rows - 1 else [], rotation=90, fontsize=6)
            ax.set_yticks(range(rows))
            ax.set_yticklabels(list(tgt_tokens) if c == 0 else [], fontsize=6)
            ax.set_title(f"{row_label} {r} {column_label} {c}", fontsize=7)
    if image is not None:
        figure.colorbar(image, ax=axes, fraction=0.02, pad=0.02)
    figure.legend(handles=[Patch(facecolor="white", edgecolor=ZERO_HATCH_COLOR, hatch=ZERO_HATCH,
                                 label="exact zero")], loc="upper left", fontsize="small", frameon=False)
    if title:
        figure.suptitle(title, fontsize="small")
    if path is not None:
        _save_atomic(figure, Path(path))
    return figure


def attention_title(sentence: int, step: str, teacher_forced: bool, note: str | None = None) -> str:
    """Title of a heatmap: ``sentence`` index, ``step`` (e.g. "decoding steps 1-7" or "training
    step 1200"), whether the rows are the reference (teacher-forced) or the model's own output,
    and an optional ``note`` (e.g. the certificate)."""
    rows = "teacher-forced on the reference" if teacher_forced else "model's own output (best hypothesis)"
    parts = [f"sentence {sentence}", step, rows] + ([note] if note else [])
    return ", ".join(parts)


def _save_atomic(figure, path: Path, fmt: str | None = None) -> None:
    """figure.savefig into a temporary file next to ``path``, then os.replace."""
    from nmt.utils.io import atomic_open

    fmt = fmt or path.suffix.lstrip(".").lower() or "png"
    if fmt not in FORMATS:
        raise ValueError(f"heatmap format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    with atomic_open(path, "wb") as handle:
        figure.savefig(handle, format=fmt)


__all__ = ["FORMATS", "attention_title", "plot_attention", "plot_attention_grid"]
