"""Group averaging: the Jacobian-vector product shared by the structured proximal operators.

The proxes of 1-d total variation and of OSCAR are piecewise linear; where they are
differentiable their Jacobian is block diagonal with one block ``s s^T / |G|`` per group ``G``
of tied outputs (``s`` = 1 for fused TV groups, ``s = sign`` for OSCAR). Applying it never needs
the n x n matrix: sum the (signed) gradient per group, divide by the group size, broadcast back.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ._native import group_average as native_group_average


def group_average(grad: Tensor, groups: Tensor, member: Tensor, n_groups: int) -> Tensor:
    """Average ``grad`` within groups.

    grad: (B, n); groups: (B, n) long ids in ``[0, n_groups)``; member: (B, n) bool, the
    entries that belong to a group (others get 0 and do not count).
    Returns (B, n): entry i holds the mean of ``grad`` over the members sharing its group id.
    On the CPU in eager mode one native call where the library is built (sums in double);
    elsewhere scatter-adds and a gather, no host sync.
    """
    if grad.device.type == "cpu" and grad.dim() == 2 and not torch.compiler.is_compiling():
        found = native_group_average(grad, groups, member, n_groups)
        if found is not None:  # (None: no native library, or another dtype)
            return found
    g = torch.where(member, grad, torch.zeros_like(grad))
    shape = (grad.shape[0], n_groups)
    sums = grad.new_zeros(shape).scatter_add_(1, groups, g)
    counts = grad.new_zeros(shape).scatter_add_(1, groups, member.to(grad.dtype))
    mean = (sums / counts.clamp(min=1)).gather(1, groups)
    return torch.where(member, mean, torch.zeros_like(mean))
