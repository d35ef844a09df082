"""Model parts kept fixed during training (``training.freeze``; OpenNMT-py's ``-freeze_encoder`` /
``-freeze_decoder``): fine-tune a decoder on a new domain over a fixed encoder, or adapt the
encoder to a new source language under a fixed decoder.

A part is one of the encoder-decoder's top-level modules (:data:`nmt.models.encoder_decoder.PARTS`, the same names in the
LSTM and the Transformer). Its parameters get ``requires_grad`` False at every start of a run,
before the optimizer is built, so the optimizer never holds them (no update, no weight decay, no
moments; a frozen part's weights in every checkpoint are the ones it started from). A parameter
another part shares (``model.embeddings.share``: one table for both sides; ``tie_output``: the
target table is the output layer's weight) is frozen with the part that names it, and the log
says so.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from typing import Any

from torch import nn

from nmt.config import ConfigError
from nmt.models.encoder_decoder import PARTS

logger = logging.getLogger(__name__)

KEY = "training.freeze"


def freeze_parts(model: nn.Module, names: Sequence[str]) -> None:
    """Set ``requires_grad`` False on every parameter of the parts ``names`` of ``model`` (call
    before the optimizer is built); logs one line per part, naming the parameters of other parts it
    shares. A ValueError (one line) where nothing would be left to train."""
    if not names:
        return
    params = list(model.named_parameters(remove_duplicate=False))
    for part in names:
        own = list(getattr(model, part).parameters())
        for p in own:
            p.requires_grad_(False)
        ids = {id(p) for p in own}
        shared = sorted({n for n, q in params if id(q) in ids and not n.startswith(f"{part}.")})
        also = f"; shared with it, {', '.join(shared)} too" if shared else ""
        logger.info("%s: %s frozen (%d parameters)%s", KEY, part, sum(p.numel() for p in own), also)
    if all(not p.requires_grad for p in model.parameters()):
        raise ValueError(f"{', '.join(names)} hold every parameter of the model: nothing is left to train")


def check_init_optimizer(parent_config: dict[str, Any], config: dict[str, Any], source: str) -> None:
    """``training.init_optimizer`` carries the parent's per-parameter state, which holds none of its
    frozen parts': it needs the parent's ``training.freeze`` (in any order). A one-line ConfigError."""
    mine = list(config["training"]["freeze"])
    theirs = list((parent_config.get("training") or {}).get("freeze") or [])
    if sorted(mine) != sorted(theirs):
        raise ConfigError(source, KEY, f"{mine!r} in the config, {theirs!r} in the parent: training.init_optimizer "
                          "carries the optimizer state of the parent's trained parameters, so the frozen parts "
                          "must be the same (or set training.init_optimizer: false)")


__all__ = ["KEY", "check_init_optimizer", "freeze_parts"]
