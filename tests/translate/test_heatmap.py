"""Attention heatmaps: exact zeros blank, labels, atomic save."""
from __future__ import annotations

import numpy as np
import pytest

from nmt.utils.heatmap import plot_attention


def test_zeros_are_blank_and_labels_follow_tokens(tmp_path):
    matrix = np.array([[0.7, 0.3, 0.0], [0.0, 0.0, 1.0]])
    path = tmp_path / "sub" / "att.png"
    figure = plot_attention(matrix, ["a", "b", "c"], ["x", "<eos>"], path=path)
    axes = figure.axes[0]
    image = axes.images[0].get_array()
    assert np.array_equal(np.ma.getmaskarray(image), matrix == 0.0)  # masked = drawn blank
    assert np.allclose(image.filled(0.0), matrix)
    assert [t.get_text() for t in axes.get_xticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["x", "<eos>"]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["att.png"]  # no temporary file left


def test_label_count_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 target and 3 source"):
        plot_attention(np.ones((2, 2)), ["a", "b", "c"], ["x", "y"])
