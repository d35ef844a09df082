"""An LSTM's training run over a padded CPU batch in oneDNN's fused RNN, its padding made inert.

torch runs a packed sequence on the CPU step by step (a product per time step, layer and
direction, each with its autograd node), while a padded batch takes oneDNN's fused RNN, forward
and backward, but would let the padding into the states. Here the padding is made inert: every
layer reads one more input feature, 1 at padded positions and 0 elsewhere, whose weight is
``+BIG`` on the forget gate's rows, ``-BIG`` on the input gate's and 0 on the others. At a padded
position the forget gate is then exactly 1 and the input gate exactly 0 in float32 (sigmoid of
+-1e30), so the cell state passes through unchanged, and every gate's gradient there is exactly
0 (the sigmoid's derivative is 0 on both sides). The forward direction's states after a row's end
are never read: its final h is gathered at the row's last position, its final c is the frozen
one. The backward direction meets the padding first, from the zero initial state: c stays 0, so
h = o tanh(0) = 0, and the row starts from zeros at its own last token, as in the packed run. One
fused call per layer (both directions), dropout between layers as ``nn.LSTM`` applies it.

The same construction serves a compiled step with ``training.compile_encoder`` (:func:`traceable`,
any device): traced from the source mask, the encoder then belongs to the step's graph instead of
running packed between graphs.

The same function as the packed run up to rounding (float32: outputs ~1e-7, gradients ~1e-6
relative; tests compare both, with and without biases, 1-3 layers, uni- and bidirectional).
Measured (2-layer bi-LSTM, 128 units per direction, batch 64, 2 threads, Intel Xeon): forward and
backward 43 -> 31 ms at 16 positions (lengths 8-16 and 1), 91 -> 61 ms at 30. oneDNN builds its
kernels once per (length, batch) shape and keeps them. No host synchronisation beyond reading the
host-held lengths.
"""
from __future__ import annotations

import sys
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from nmt.models.padded_lstm import cpu_float32_lstm

BIG = 1e30
"""The padding feature's weight on the forget (+) and input (-) gates: any pre-activation of a
trained LSTM is negligible beside it, so the gates are exactly 1 and 0 at padded positions."""


def servable(rnn: nn.Module, x: Tensor) -> bool:
    """Whether :func:`inert_padding_lstm` runs ``rnn`` on ``x``:
    :func:`~nmt.models.padded_lstm.cpu_float32_lstm`, oneDNN built in and enabled."""
    return (cpu_float32_lstm(rnn, x) and torch.backends.mkldnn.is_available()
            and torch.backends.mkldnn.enabled)


def traceable(rnn: nn.Module, x: Tensor) -> bool:
    """Whether a compiled step runs ``rnn`` by :func:`inert_padding_lstm` from the source mask
    (``valid``), one graph with the rest of the step (no packing between graphs): a batch-first
    ``nn.LSTM`` without projections while ``torch.compile`` traces with dynamo's ``allow_rnn`` on
    (``training.compile_encoder``), not in float16 (whose range cannot hold :data:`BIG`: a padding
    weight of inf would make 0 * inf = NaN at real positions)."""
    return (isinstance(rnn, nn.LSTM) and rnn.batch_first and rnn.proj_size == 0
            and torch.compiler.is_compiling() and _dynamo_traces_rnns() and x.dtype != torch.float16
            and all(p.dtype != torch.float16 for p in rnn.parameters())
            and not (torch.is_autocast_enabled(x.device.type)
                     and torch.get_autocast_dtype(x.device.type) == torch.float16))


def _dynamo_traces_rnns() -> bool:
    """dynamo's ``allow_rnn`` (read only while it traces, when it is imported)."""
    dynamo = sys.modules.get("torch._dynamo")
    return dynamo is not None and bool(dynamo.config.allow_rnn)


def inert_padding_lstm(rnn: nn.LSTM, x: Tensor, lengths: Optional[Tensor],
                       dropout: Optional[Callable[[Tensor], Tensor]] = None,
                       valid: Optional[Tensor] = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """``rnn`` over the padded batch ``x`` (B, L, I) with true lengths ``lengths`` (B,) (a host
    long tensor, each in [1, L]) as its packed run computes it, differentiable (where
    :func:`servable`; in a compiled step where :func:`traceable`). ``dropout``: applied to each
    layer's outputs but the last (``nn.LSTM``'s inter-layer dropout, e.g. an ``nn.Dropout`` module
    in training mode); None: none. ``valid``: instead of ``lengths``, the lengths' mask (B, L)
    bool on ``x``'s device (True at the real positions, a prefix of each row): no host tensor.

    Returns the outputs (B, L, D*H), exactly zero beyond each length, and the final states
    (h_n, c_n), each (layers * D, B, H) in torch's layout (D = 2 for a bidirectional LSTM).
    """
    batch, width = x.shape[:2]
    hidden, directions = rnn.hidden_size, 2 if rnn.bidirectional else 1
    if valid is None:
        valid = torch.arange(width)[None, :] < lengths[:, None]  # (B, L)
    else:
        lengths = valid.sum(dim=1)
    padding = (~valid).to(x.dtype).unsqueeze(-1)  # (B, L, 1) the inert-padding feature
    column = x.new_zeros(4 * hidden, 1)
    column[:hidden] = -BIG  # input gate -> 0
    column[hidden:2 * hidden] = BIG  # forget gate -> 1
    last = (lengths - 1).view(batch, 1, 1).expand(batch, 1, hidden)
    zeros = x.new_zeros(directions, batch, hidden)
    h_n, c_n = [], []
    inputs = x
    for layer in range(rnn.num_layers):
        if layer > 0 and dropout is not None:
            inputs = dropout(inputs)
        params = []  # per direction [w_ih | column], w_hh (and b_ih, b_hh with biases)
        for weights in rnn.all_weights[layer * directions:(layer + 1) * directions]:
            params += [torch.cat([weights[0], column], dim=1), *weights[1:]]
        # train=True keeps oneDNN's workspace for the backward pass (no dropout inside the call)
        out, h, c = torch._VF.lstm(torch.cat([inputs, padding], dim=-1), (zeros, zeros), params, rnn.bias, 1,
                                   0.0, torch.is_grad_enabled(), rnn.bidirectional, True)
        # (directions, B, H): torch <= 2.11's traced decomposition returns (directions, 1, B, H)
        # (pytorch #151200, fixed since), which stacks wrongly or mixes rows in the bridge
        h, c = h.reshape(directions, -1, rnn.hidden_size), c.reshape(directions, -1, rnn.hidden_size)
        h_n.append(out[:, :, :hidden].gather(1, last)[:, 0])  # forward: at each row's last token
        c_n.append(c[0])  # forward: frozen since each row's last token
        if directions == 2:  # backward: ends at position 0, the padding was inert
            h_n.append(h[1])
            c_n.append(c[1])
        inputs = out
    return inputs * valid.unsqueeze(-1).to(x.dtype), (torch.stack(h_n), torch.stack(c_n))


__all__ = ["BIG", "inert_padding_lstm", "servable", "traceable"]
