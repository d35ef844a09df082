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


def test_exact_zeros_have_their_own_hatched_legend_entry_and_titles_say_what_is_shown(tmp_path):
    from nmt.utils.heatmap import attention_title

    matrix = np.array([[1e-6, 0.0], [0.5, 0.5]])  # a tiny weight is coloured, a zero is not
    title = attention_title(4, "decoding steps 1-2", teacher_forced=False, note="certified")
    figure = plot_attention(matrix, ["a", "b"], ["x", "<eos>"], path=tmp_path / "z.pdf", title=title)
    axes = figure.axes[0]
    legend = axes.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["exact zero"]
    hatched = [p for p in axes.patches if p.get_hatch()]
    assert len(hatched) == 1 and hatched[0].get_zorder() < axes.images[0].get_zorder()
    assert np.ma.getmaskarray(axes.images[0].get_array()).tolist() == [[False, True], [False, False]]
    assert axes.get_title().replace("\n", " ") == title
    assert title == "sentence 4, decoding steps 1-2, model's own output (best hypothesis), certified"
    assert "teacher-forced on the reference" in attention_title(0, "training step 7", teacher_forced=True)
    assert (tmp_path / "z.pdf").read_bytes()[:4] == b"%PDF"
    with pytest.raises(ValueError, match="png, pdf, svg"):
        plot_attention(matrix, ["a", "b"], ["x", "y"], path=tmp_path / "z.gif")
