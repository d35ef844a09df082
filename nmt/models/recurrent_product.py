"""A weight used at every step of a recurrence, whose gradient is one product after the last step.

Plain autograd computes, at every step t of a recurrence ``y_t = x_t W^T``, the weight's share
``g_t^T x_t`` (a (out, B) x (B, in) product: its inner size is only the batch) and adds it to
the weight's gradient: T thin products and T full-size additions. The gradient is the same
single product of the stacked steps, ``dW = [g_1; ...; g_T]^T [x_1; ...; x_T]`` (inner size
T * B), which is what :class:`RecurrentWeight` computes: each step's backward only records
``(x_t, g_t)`` and gives the input gradient ``g_t W``; the weight's node, which autograd runs
after every step that used it, makes the one product.

Exact: the same sums as plain autograd up to the order of the additions. On float32 CPU tensors
the step products (forward and input gradient) run through oneDNN with the weight packed once per
pass where training packs (:data:`nmt.utils.packed_linear.TRAIN_PACKING`: on AMD processors MKL's
sgemm is slower on these products; on Intel's it is faster than packing twice per step). No host
synchronisation. Meant for eager training; under ``torch.compile`` or autocast the caller uses
plain products (:func:`deferred_enabled`).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nmt.utils import packed_linear


class _Records:
    """The (x_t, g_t) pairs of one forward pass, filled during backward."""

    def __init__(self, packed: Tensor | None = None) -> None:
        self.inputs: list[Tensor] = []
        self.grads: list[Tensor] = []
        self.packed = packed  # the weight packed for oneDNN (nmt.utils.packed_linear), or None
        self.packed_t: Tensor | None = None  # its transpose, packed at the first backward step


class _WeightNode(torch.autograd.Function):
    """An alias of the weight whose backward makes the weight gradient of all steps at once."""

    @staticmethod
    def forward(ctx: Any, weight: Tensor, records: _Records) -> Tensor:
        ctx.set_materialize_grads(False)  # the steps pass no gradient here: None, not zeros
        ctx.records = records
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None) -> tuple[Tensor | None, None]:
        records = ctx.records
        if not records.grads:
            return grad, None
        steps = records.grads[0].dim() - 2  # the steps' axis: 0 for (B, out), 1 for (N, S, out)
        g = torch.cat(records.grads, dim=steps)  # (T*B, out) or (N, T*S, out)
        x = torch.cat(records.inputs, dim=steps)  # (T*B, in) or (N, T*S, in)
        records.inputs, records.grads = [], []  # a second backward (retain_graph) records anew
        dw = g.t().mm(x) if steps == 0 else torch.bmm(g.transpose(1, 2), x)
        return (dw if grad is None else dw + grad), None


class _StepProduct(torch.autograd.Function):
    """x_t W^T whose backward gives the input gradient and records (x_t, g_t) for the weight."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, records: _Records, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.records = records
        if records.packed is not None:
            y = packed_linear.product(x, records.packed)
            return y if bias is None else y.add_(bias)
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        x, weight = ctx.saved_tensors
        records = ctx.records
        if ctx.needs_input_grad[1]:
            records.inputs.append(x)
            records.grads.append(grad)
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        if records.packed is not None:
            if records.packed_t is None:  # W^T packed once, at the first step's backward
                records.packed_t = packed_linear.pack(weight.t())
            return packed_linear.product(grad, records.packed_t), None, None, None
        return (grad.mm(weight) if weight.dim() == 2 else torch.bmm(grad, weight)), None, None, None


def _product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x W^T (+ bias)``: (B, in) x (out, in) -> (B, out), or batched (N, S, in) x (N, out, in)
    -> (N, S, out); ``bias`` broadcasts to the result (one ``addmm`` / ``baddbmm``)."""
    if weight.dim() == 2:
        return x.mm(weight.t()) if bias is None else torch.addmm(bias, x, weight.t())
    return torch.bmm(x, weight.transpose(1, 2)) if bias is None else torch.baddbmm(bias, x, weight.transpose(1, 2))


class RecurrentWeight:
    """A weight (out, in) shared by the steps of one forward pass, or a batch of them (N, out, in).

    ``product(x)`` is ``x @ weight.T`` for x (B, in) -> (B, out), or per batch entry
    ``torch.bmm(x, weight.transpose(1, 2))`` for x (N, S, in) -> (N, S, out): e.g. attention's
    source-side operands, the keys (N, L, K) of the scores ``q K^T`` and the transposed memory
    (N, H, L) of the contexts ``p M``, which every decoder step multiplies; their gradient is then
    one ``bmm`` over all steps instead of an outer product and an addition per step. Create one
    per forward pass (it holds that pass's records); when neither the weight nor ``x`` needs a
    gradient it is a plain product (the packed oneDNN product records no autograd: a frozen weight,
    ``training.freeze``, whose input needs a gradient takes the step product, which gives it).
    """

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight
        # float32 on the CPU: the step products through oneDNN with the weight packed once per pass
        packed = packed_linear.pack(weight) if weight.dim() == 2 and packed_linear.trainable(weight) else None
        self.records = _Records(packed)
        self.alias = _WeightNode.apply(weight, self.records) if weight.requires_grad else weight

    def product(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """``x @ weight.T`` (batched: ``torch.bmm(x, weight.transpose(1, 2))``), plus ``bias``
        (no gradient; broadcast to the result) in the same product where given."""
        if not self.weight.requires_grad and not (x.requires_grad and torch.is_grad_enabled()):
            if self.records.packed is not None:
                y = packed_linear.product(x, self.records.packed)
                return y if bias is None else y.add_(bias)
            return _product(x, self.weight, bias)
        return _StepProduct.apply(x, self.alias, self.records, bias)


def deferred_enabled(x: Tensor) -> bool:
    """True when the deferred weight gradient applies: gradients on, no autocast, not compiling."""
    return (torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and not torch.is_autocast_enabled(x.device.type))


__all__ = ["RecurrentWeight", "deferred_enabled"]
