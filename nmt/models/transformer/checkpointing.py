"""Activation checkpointing of the Transformer's layers (``training.checkpoint_activations``).

With it on, each encoder and decoder layer of a training forward pass (grad enabled, teacher
forcing) runs under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: autograd keeps
the layer's inputs and outputs, not the activations inside it (the attention probabilities,
projections, the feed-forward's hidden layer, the dropout masks), and the backward pass reruns the
layer's forward to rebuild them. It costs about one more forward pass per step and saves most of
the activation memory (BENCHMARKS.md). A layer is the unit (fairseq's ``--checkpoint-activations``):
checkpointing sub-layers (OpenNMT-py's ``ffn`` / ``mha``) keeps the residual stream once more per
sub-layer and saves less.

The recomputation is the same computation: ``checkpoint`` restores torch's CPU RNG state (and the
state of the layer's device) before it reruns the layer, so the dropout masks, nmt's native CPU
ones included (their seed is a draw of torch's generator, :mod:`nmt.models.native_dropout`), are
redrawn identically, and it reruns under the autocast state of the forward; the sparse mappings are
deterministic, so the recomputed supports are the forward's. The loss and gradients equal those
without checkpointing (tests/models/test_activation_checkpointing.py). No host synchronisation
is added. Decoding (no grad, or caches) never checkpoints.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def run_layer(layer: Callable[..., Any], enabled: bool, *args: Any) -> Any:
    """``layer(*args)``, under non-reentrant activation checkpointing where ``enabled`` and autograd
    records (``torch.is_grad_enabled()``); returns what the layer returns."""
    if enabled and torch.is_grad_enabled():
        return checkpoint(layer, *args, use_reentrant=False, preserve_rng_state=True)
    return layer(*args)


def set_activation_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Switch checkpointing of every Transformer encoder / decoder layer of ``model`` on or off:
    the ``checkpoint_activations`` attribute of its layer stacks (the modules that have one:
    ``TransformerEncoder`` and ``TransformerDecoder``, which import :func:`run_layer` from here;
    not part of the state dict). Raises ValueError when ``enabled`` and ``model`` has no such stack."""
    stacks = [m for m in model.modules() if hasattr(m, "checkpoint_activations")]
    if enabled and not stacks:
        raise ValueError("activation checkpointing needs a Transformer (model.type: transformer)")
    for stack in stacks:
        stack.checkpoint_activations = enabled


__all__ = ["run_layer", "set_activation_checkpointing"]
