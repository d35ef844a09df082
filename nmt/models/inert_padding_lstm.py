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

Rows in groups (:func:`row_groups`, host lengths only, so the CPU training run; the compiled
``valid`` route is one call as before): batches sorted by target length (``training.pool_sort:
target``) carry 1.56 source positions per real token on Multi30k, and one call computes every one
of them. The rows, sorted by length, are cut (at multiples of 8 rows) into at most
:data:`MAX_GROUPS` groups where the cost model (time steps, padding included, plus
:data:`CALL_COST` a call) says so; each group is one fused call per layer over its rows' first
``width`` positions (1.21 time steps per real token instead of 1.56 over a Multi30k epoch). The
same function: a row's recurrence is its own, and the backward direction of a row meets the same
inert padding from zero states whether the batch is padded to its group's width or the whole
batch's. Measured (shared machine, process CPU, one thread, the harness's Multi30k LSTM): the
encoder's forward+backward 49.7 -> 44.5 ms a batch (unpadded: 34.9), a training update 2-5%
faster under ``pool_sort: target``; ``target_source`` batches rarely split (43 of 454).
"""
from __future__ import annotations

import sys
from typing import Callable, Optional

import numpy as np
import torch
from torch import Tensor, nn

from nmt.models.padded_lstm import cpu_float32_lstm

BIG = 1e30
"""The padding feature's weight on the forget (+) and input (-) gates: any pre-activation of a
trained LSTM is negligible beside it, so the gates are exactly 1 and 0 at padded positions."""

MAX_GROUPS = 2
"""At most this many fused calls per layer, each over a group of rows of similar length
(:func:`row_groups`); 1: one call over the padded batch."""

GROUP_ROWS = 8
"""A group's rows are a multiple of this (the last group's the rest)."""

CALL_COST = 64
"""The cost model's price of one more call per layer, in time steps of one row (its weights'
reorders and the fixed work of a call forward and backward; measured about 2 ms on one thread,
where a row's time step costs about 0.03 ms, 2-layer bi-LSTM of 2 x 128, AMD EPYC)."""


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


def row_groups(lengths: Tensor, max_groups: int | None = None) -> list[tuple[Tensor, int]] | None:
    """The batch's rows split into at most ``max_groups`` (default :data:`MAX_GROUPS`) groups of
    consecutive rows in descending length order, each run by :func:`inert_padding_lstm` as a
    batch of its own padded to its longest row, where that is cheaper by the cost model: a group
    of n rows and width w costs n w time steps (its padding included) plus :data:`CALL_COST`;
    groups hold multiples of :data:`GROUP_ROWS` rows (the last one the rest), so that oneDNN meets
    few batch shapes. lengths: (B,) host long tensor. Returns ``[(rows (n,) long indices into the
    batch, width), ...]``, longest group first, or None where one group (the batch as it is) is
    cheapest. Host work on the host lengths only: no device is involved."""
    max_groups = MAX_GROUPS if max_groups is None else max_groups
    batch = lengths.numel()
    if max_groups < 2 or batch <= GROUP_ROWS:
        return None
    order = torch.sort(lengths, descending=True, stable=True).indices
    by_length = lengths.index_select(0, order).numpy()  # a host tensor: no device
    starts = np.arange(0, batch, GROUP_ROWS)  # where a group may start
    widths = by_length[starts].astype(np.float64)
    ends = np.append(starts[1:], batch)  # (S,) where a group may end
    # cost[i, j]: a group of the rows starts[i]:ends[j] (j >= i), inf where it would end before it starts
    cost = np.where(ends[None, :] > starts[:, None], (ends[None, :] - starts[:, None]) * widths[:, None], np.inf)
    cost += CALL_COST
    best = cost[:, -1].copy()  # (S,): the cheapest cost of the rows from starts[i] on, in one group
    nexts = [np.full(starts.size, -1)]  # [k][i]: in at most k + 1 groups from starts[i], the next group's
    # start index, or -1: the plan of at most k groups
    for _ in range(max_groups - 1):
        split = cost[:, :-1] + best[None, 1:]  # a group of starts[i]:ends[j], then the rest from j + 1
        j = split.argmin(axis=1)
        better = split[np.arange(starts.size), j] < best
        best = np.where(better, split[np.arange(starts.size), j], best)
        nexts.append(np.where(better, j + 1, -1))
    bounds, i = [0], 0
    for k in range(max_groups - 1, 0, -1):  # the cheapest plan from row 0 in at most k + 1 groups
        if nexts[k][i] >= 0:  # a group up to the next start, the rest in at most k groups
            i = int(nexts[k][i])
            bounds.append(int(starts[i]))
    if len(bounds) == 1:
        return None
    bounds.append(batch)
    return [(order[a:b], int(by_length[a])) for a, b in zip(bounds[:-1], bounds[1:])]


def inert_padding_lstm(rnn: nn.LSTM, x: Tensor, lengths: Optional[Tensor],
                       dropout: Optional[Callable[[Tensor], Tensor]] = None,
                       valid: Optional[Tensor] = None,
                       max_groups: int | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """``rnn`` over the padded batch ``x`` (B, L, I) with true lengths ``lengths`` (B,) (a host
    long tensor, each in [1, L]) as its packed run computes it, differentiable (where
    :func:`servable`; in a compiled step where :func:`traceable`). ``dropout``: applied to each
    layer's outputs but the last (``nn.LSTM``'s inter-layer dropout, e.g. an ``nn.Dropout`` module
    in training mode); None: none. ``valid``: instead of ``lengths``, the lengths' mask (B, L)
    bool on ``x``'s device (True at the real positions, a prefix of each row): no host tensor.

    With host ``lengths`` the rows may run in groups of similar lengths (:func:`row_groups`, at
    most ``max_groups``, default :data:`MAX_GROUPS`; 1: one call over the batch), each call padded
    to its group's longest row only: the same function (each row's recurrence is its own), the
    same dropout masks (drawn over the whole (B, L, D) layout, as one call draws them).

    Returns the outputs (B, L, D*H), exactly zero beyond each length, and the final states
    (h_n, c_n), each (layers * D, B, H) in torch's layout (D = 2 for a bidirectional LSTM).
    """
    if valid is None:
        groups = row_groups(lengths, max_groups)
        if groups is not None:
            return _grouped(rnn, x, lengths, dropout, groups)
    batch, width = x.shape[:2]
    if valid is None:
        valid = torch.arange(width)[None, :] < lengths[:, None]  # (B, L)
    else:
        lengths = valid.sum(dim=1)
    outs, (h_n, c_n) = _layers(rnn, [x], [valid], [lengths], dropout, None)
    return outs[0] * valid.unsqueeze(-1).to(x.dtype), (h_n, c_n)


def _grouped(rnn: nn.LSTM, x: Tensor, lengths: Tensor, dropout: Optional[Callable[[Tensor], Tensor]],
             groups: list[tuple[Tensor, int]]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """:func:`inert_padding_lstm` of the host ``lengths``, one fused call per layer and group of
    rows (``groups``: :func:`row_groups`), each over its rows' first ``width`` positions. Between
    layers the dropout sees the (B, L, D) layout of the one-call run (the groups' outputs, zero
    beyond each group's width, in the batch's row order): the same masks."""
    batch, width = x.shape[:2]
    rows = torch.cat([r for r, _ in groups])
    inverse = torch.empty_like(rows)
    inverse[rows] = torch.arange(batch)  # host indices
    part_lengths = [lengths.index_select(0, r) for r, _ in groups]
    valids = [torch.arange(w)[None, :] < n[:, None] for (_, w), n in zip(groups, part_lengths)]
    parts = [x.index_select(0, r)[:, :w] for r, w in groups]

    def unsort(outs: list[Tensor]) -> Tensor:  # the groups' (n, w, D) -> (B, L, D), zero beyond each width
        return torch.cat([nn.functional.pad(o, (0, 0, 0, width - o.size(1))) for o in outs]).index_select(0, inverse)

    def regroup(full: Tensor) -> list[Tensor]:
        return [full.index_select(0, r)[:, :w] for r, w in groups]

    outs, (h_n, c_n) = _layers(rnn, parts, valids, part_lengths, dropout, (unsort, regroup))
    memory = unsort([o * v.unsqueeze(-1).to(o.dtype) for o, v in zip(outs, valids)])
    return memory, (h_n.index_select(1, inverse), c_n.index_select(1, inverse))


def _layers(rnn: nn.LSTM, parts: list[Tensor], valids: list[Tensor], lengths: list[Tensor],
            dropout: Optional[Callable[[Tensor], Tensor]],
            layout: Optional[tuple[Callable[[list[Tensor]], Tensor], Callable[[Tensor], list[Tensor]]]],
            ) -> tuple[list[Tensor], tuple[Tensor, Tensor]]:
    """The layers of ``rnn`` over the row groups ``parts`` (each (n, w, I), its mask ``valids``
    (n, w) and lengths (n,)), one fused call per layer and part. ``layout``: (unsort, regroup)
    between the parts and the batch's (B, L, D) layout, where the dropout between layers applies
    (None: one part, the batch itself). Returns the last layer's outputs per part (n, w, D*H),
    not masked, and the final states (h_n, c_n), each (layers * D, N, H) with the parts' rows
    one after the other."""
    first = parts[0]
    hidden, directions = rnn.hidden_size, 2 if rnn.bidirectional else 1
    paddings = [(~v).to(first.dtype).unsqueeze(-1) for v in valids]  # (n, w, 1) the inert-padding feature
    column = first.new_zeros(4 * hidden, 1)
    column[:hidden] = -BIG  # input gate -> 0
    column[hidden:2 * hidden] = BIG  # forget gate -> 1
    lasts = [(n - 1).view(-1, 1, 1).expand(-1, 1, hidden) for n in lengths]
    h_n, c_n = [], []
    inputs = parts
    for layer in range(rnn.num_layers):
        if layer > 0 and dropout is not None:
            inputs = [dropout(inputs[0])] if layout is None else layout[1](dropout(layout[0](inputs)))
        params = []  # per direction [w_ih | column], w_hh (and b_ih, b_hh with biases)
        for weights in rnn.all_weights[layer * directions:(layer + 1) * directions]:
            params += [torch.cat([weights[0], column], dim=1), *weights[1:]]
        outs, hs, cs = [], [], []
        for part, padding, last in zip(inputs, paddings, lasts):
            zeros = part.new_zeros(directions, part.size(0), hidden)
            # train=True keeps oneDNN's workspace for the backward pass (no dropout inside the call)
            out, h, c = torch._VF.lstm(torch.cat([part, padding], dim=-1), (zeros, zeros), params, rnn.bias, 1,
                                       0.0, torch.is_grad_enabled(), rnn.bidirectional, True)
            # (directions, n, H): torch <= 2.11's traced decomposition returns (directions, 1, n, H)
            # (pytorch #151200, fixed since), which stacks wrongly or mixes rows in the bridge
            h, c = h.reshape(directions, -1, hidden), c.reshape(directions, -1, hidden)
            outs.append(out)
            hs.append([out[:, :, :hidden].gather(1, last)[:, 0]] + ([h[1]] if directions == 2 else []))
            cs.append(list(c.unbind(0)))  # forward: frozen since each row's last token; backward: ends at 0
        for d in range(directions):
            h_n.append(torch.cat([h[d] for h in hs]) if len(hs) > 1 else hs[0][d])
            c_n.append(torch.cat([c[d] for c in cs]) if len(cs) > 1 else cs[0][d])
        inputs = outs
    return inputs, (torch.stack(h_n), torch.stack(c_n))


__all__ = ["BIG", "CALL_COST", "GROUP_ROWS", "MAX_GROUPS", "inert_padding_lstm", "row_groups", "servable",
           "traceable"]
