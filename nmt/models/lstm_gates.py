"""An LSTM's gates in the form CPU inference computes them: one sigmoid over all four.

torch orders an LSTM's gate rows (i, f, g, o) and takes tanh of g. On the CPU a sigmoid over the
whole (N, 4H) gate block is one fast pass, while tanh of its strided g columns takes a slow loop
(or a copy first). With the rows reordered (i, f, o, g) and the g rows doubled (exactly: a power of
two), tanh(g) = 2 sigmoid(2g) - 1, and the cell update needs four element-wise operations after
the sigmoid: c' = f c - i + 2 i sigmoid(2g), h' = o tanh(c'). The same function as torch's cell up
to rounding (float32 differences ~1e-7 per step). Used by the padded encoder
(:mod:`nmt.models.padded_lstm`) and the decoder's packed cells (:mod:`nmt.models.decoder`).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from nmt.models.native_lstm_cell import lstm_cell
from nmt.utils import packed_linear


def sigmoid_form(weight: Tensor, bias: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """Gate rows (4H, ...) of ``weight`` and ``bias`` in torch's order (i, f, g, o) -> new tensors
    in the order (i, f, o, g) with the g rows doubled (no gradient)."""
    hidden = weight.size(0) // 4
    order = torch.cat([torch.arange(0, 2 * hidden), torch.arange(3 * hidden, 4 * hidden),
                       torch.arange(2 * hidden, 3 * hidden)]).to(weight.device)
    scale = torch.ones(4 * hidden, dtype=weight.dtype, device=weight.device)
    scale[3 * hidden:] = 2.0
    with torch.no_grad():
        w = weight.detach()[order] * scale.view(-1, *([1] * (weight.dim() - 1)))
        b = None if bias is None else bias.detach()[order] * scale
    return w, b


def cell_sigmoid_form(cell: nn.LSTMCell) -> tuple[Tensor, Optional[Tensor]]:
    """An ``nn.LSTMCell``'s ``[W_ih | W_hh]`` (its input is ``[x; h]``) and ``b_ih + b_hh`` (None
    without biases) in :func:`sigmoid_form`, detached."""
    bias = None if cell.bias_ih is None else cell.bias_ih.detach() + cell.bias_hh.detach()
    return sigmoid_form(torch.cat([cell.weight_ih.detach(), cell.weight_hh.detach()], dim=1), bias)


def packed_sigmoid_form(cell: nn.LSTMCell) -> tuple[packed_linear.FrozenWeight, Optional[Tensor]]:
    """:func:`cell_sigmoid_form` with the weight prepared for a frozen region's products
    (:class:`nmt.utils.packed_linear.FrozenWeight`): what the decoder's packed cells take."""
    weight, bias = cell_sigmoid_form(cell)
    return packed_linear.FrozenWeight(weight), bias


def cell_update(gates: Tensor, c: Tensor, c_out: Optional[Tensor] = None,
                h_out: Optional[Tensor] = None, add: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """The new (h, c) from pre-activation ``gates`` (..., 4H) in :func:`sigmoid_form`'s order
    (which may be overwritten), plus ``add`` (same shape) where given, and the cell ``c`` (..., H);
    written into ``c_out`` / ``h_out`` where given (same shape as ``c``), else new tensors. Without
    gradients, float32 CPU tensors take one native pass (:func:`nmt.models.native_lstm_cell.lstm_cell`,
    ~1e-7 from the torch operations below) where its library is built."""
    if not (torch.is_grad_enabled() and (gates.requires_grad or c.requires_grad)) \
            and not torch.compiler.is_compiling() and gates.device.type == "cpu":
        new_c = torch.empty_like(c, memory_format=torch.contiguous_format) if c_out is None else c_out
        new_h = torch.empty_like(c, memory_format=torch.contiguous_format) if h_out is None else h_out
        if lstm_cell(gates, c, new_c, new_h, add):
            return new_h, new_c
    if add is not None:
        gates.add_(add)
    hidden = c.size(-1)
    gates.sigmoid_()
    in_gate, forget_gate = gates[..., :hidden], gates[..., hidden:2 * hidden]
    out_gate, cell_gate = gates[..., 2 * hidden:3 * hidden], gates[..., 3 * hidden:]
    # c' = f c + i tanh(g) = f c - i + 2 i sigmoid(2g)
    c_new = torch.mul(forget_gate, c).sub_(in_gate)
    c_new = torch.addcmul(c_new, in_gate, cell_gate, value=2.0, out=c_out) if c_out is not None \
        else c_new.addcmul_(in_gate, cell_gate, value=2.0)
    tanh_c = torch.tanh(c_new)
    h_new = torch.mul(out_gate, tanh_c, out=h_out) if h_out is not None else tanh_c.mul_(out_gate)
    return h_new, c_new


__all__ = ["cell_sigmoid_form", "cell_update", "packed_sigmoid_form", "sigmoid_form"]
