"""Dropout whose CPU masks are not drawn by ``bernoulli_``.

On the CPU ``torch.nn.functional.dropout`` draws its mask with ``bernoulli_``, which costs about
three times a ``torch.rand`` of the same size (measured on 2 threads: 155 vs 49 us at (64, 256),
2.2 vs 0.76 ms at (64, 14, 256)); a training step of the Multi30k LSTM makes about 40 such draws.
:class:`Dropout` on float32 CPU tensors makes mask and product in one native pass with a
counter-based generator seeded from torch's (:mod:`nmt.models.native_dropout`: 20-60x faster than
``torch.rand`` and the three passes after it). Where that library is not built (or for other
dtypes) it keeps an entry where a ``torch.rand`` draw in [0, 1) is at least ``p``. Both are the
same Bernoulli(1 - p) mask in distribution (up to 2^-32, resp. float32's 2^-24, resolution of
``p``), scaled by ``1 / (1 - p)`` as usual, and deterministic under ``torch.manual_seed`` (not the
same masks: the two draw differently). Elsewhere (CUDA, ``torch.compile``), and in eval mode, it is
``nn.Dropout``. No host synchronisation on any device (the native seed is a CPU draw, on CPU
tensors only).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .native_dropout import dropout as native_dropout


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same arguments and state) with the faster CPU masks described above."""

    def forward(self, x: Tensor) -> Tensor:
        if (not self.training or self.p == 0 or self.p == 1 or x.device.type != "cpu"
                or torch.compiler.is_compiling()):
            return super().forward(x)
        out = native_dropout(x, self.p)
        if out is not None:
            return out
        keep = torch.rand(x.shape, device=x.device) >= self.p  # float32 draws for any x dtype
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))


class WordDropout(nn.Module):
    """Whole-word dropout on embedded tokens (Sennrich et al. 2016, Nematus' ``dropout_source`` /
    ``dropout_target``, Marian's ``--dropout-src`` / ``--dropout-trg``): in training each token's
    vector is zeroed with probability ``p`` (all its dimensions alike: the word is gone, its
    position stays), the others scaled by ``1 / (1 - p)``; the identity in eval mode and at 0.

    x: (..., D) vectors, one per token; the same shape back. The mask is one ``torch.rand`` draw of
    x's shape without its last dimension, on x's device (torch's generator: seeded, saved and
    restored with it); no host synchronisation, one compiled graph.
    """

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"word dropout must be in [0, 1), got {p}")
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.rand(x.shape[:-1], device=x.device) >= self.p
        return x * keep.unsqueeze(-1).to(x.dtype).mul_(1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"


def word_dropouts(emb_cfg: dict) -> tuple[float, float]:
    """``(src_word_dropout, tgt_word_dropout)`` of a ``model.embeddings`` section (0 where absent:
    a checkpoint written before the options)."""
    return float(emb_cfg.get("src_word_dropout", 0.0)), float(emb_cfg.get("tgt_word_dropout", 0.0))


def applied(dropout: nn.Dropout, x: Tensor) -> Tensor:
    """``dropout(x)``; ``x`` itself, without the module call, where the dropout is the identity
    (eval mode or ``p == 0``: what ``nn.Dropout`` returns there). A Transformer decoding step
    passes about 20 dropouts (inputs, residuals, attention weights, feed-forward activations),
    each module call some microseconds of Python on the CPU. x: any shape; the same shape back."""
    return dropout(x) if dropout.training and dropout.p > 0 else x


__all__ = ["Dropout", "WordDropout", "applied", "word_dropouts"]
