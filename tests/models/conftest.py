"""Fixtures for the model tests (helpers live in tiny_models.py)."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from tiny_models import PAD, SRC_VOCAB, TGT_VOCAB, model_cfg

from nmt.models import Seq2Seq, build_model


@pytest.fixture
def make_model() -> Callable[..., Seq2Seq]:
    """``make_model(dtype=torch.float64, src_vocab=..., tgt_vocab=..., **sections)`` in eval mode."""

    def make(dtype: torch.dtype = torch.float64, src_vocab: int = SRC_VOCAB, tgt_vocab: int = TGT_VOCAB,
             **sections: dict[str, Any]) -> Seq2Seq:
        return build_model(model_cfg(**sections), src_vocab, tgt_vocab, PAD).to(dtype).eval()

    return make
