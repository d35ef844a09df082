"""``nn.Linear`` whose float32 CPU products run through oneDNN (:mod:`nmt.utils.packed_linear`)."""
from __future__ import annotations

from torch import Tensor, nn

from nmt.utils import packed_linear


class Linear(nn.Linear):
    """``nn.Linear`` (same arguments, parameters and state) computing ``x W^T + b`` with
    :func:`nmt.utils.packed_linear.train_linear`: on float32 CPU tensors oneDNN's product with
    the weight packed once per region (decoding, validation) or per call (training, where
    :data:`~nmt.utils.packed_linear.TRAIN_PACKING`: not on Intel processors), else
    ``F.linear``. Equal to ``nn.Linear`` up to rounding. x: (..., in) -> (..., out)."""

    def forward(self, x: Tensor) -> Tensor:
        return packed_linear.train_linear(x, self.weight, self.bias)


__all__ = ["Linear"]
