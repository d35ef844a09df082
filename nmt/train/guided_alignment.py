"""Guided alignment training (``training.guided_alignment``; Garg et al. 2019, "Jointly Learning to
Align and Translate with Transformer Models"; OpenNMT-py's ``-lambda_align``).

Reference word alignments (``data.train.align``, :mod:`nmt.data.word_alignments`) give each target
token a distribution ``q`` over the source tokens: uniform over those aligned to it. The attention
that reports alignments (``-report_align``: an RNN's one attention; a Transformer's
``model.transformer.alignment_layer`` / ``alignment_heads``) is pulled toward it by the attention
mapping's own Fenchel-Young loss at ``q``, per supervised head, on the scores ``s`` that mapping
took::

    loss = main loss + weight x sum over aligned target tokens, mean over heads, of FY(s; q)
    FY(s; q) = Omega*(s) - <s, q> + Omega(q),     grad_s FY = mapping(s) - q

(:mod:`nmt.sparse.losses`). For softmax heads ``FY = KL(q || p)``, OpenNMT-py's cross-entropy
``-sum q log p`` minus the constant entropy of ``q``: the same gradient. For sparse heads
(sparsemax, 1.5-entmax, alpha-entmax) the cross-entropy is infinite wherever ``p`` is zero and
``q`` is not; the Fenchel-Young loss stays finite, and its gradient ``p - q`` reaches the scores
of reference tokens outside the support too. Heads that learn their alpha (adaptively sparse
Transformers, ``alpha: learned``) take the loss at their current alphas
(:func:`nmt.sparse.tensor_alpha_loss.tensor_alpha_entmax_loss`), and its alpha-gradient
``dOmega(q)/dalpha - dOmega(p)/dalpha`` reaches them too. Each head gets its own loss: the mean of several
heads' probabilities (what OpenNMT-py supervises) is no mapping of any scores. Target tokens
without a reference (EOS, padding, unaligned words, pairs of a corpus without an alignment file)
add nothing. The sum is normalised as the main loss (``training.normalization``), so ``weight``
reads as in OpenNMT-py (whose ``lambda_align`` is 0.05 in its examples).

Host synchronisation: none added to the training step (the reference grids are built on the host
with the batch and travel with it; the losses are sync-free on accelerators).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch import Tensor, nn

from nmt.config import ConfigError
from nmt.data.corpora import training_corpora
from nmt.train.distill import Teacher, summed_distill_loss, teacher_distribution
from nmt.sparse import get_loss
from nmt.sparse.registry import LOSS_NAMES
from nmt.sparse.tensor_alpha_loss import tensor_alpha_entmax_loss
from nmt.train.update import output_target, summed_output_loss
from nmt.utils.exception_text import first_line
from nmt.utils.precision import float32_if_half

KEY = "training.guided_alignment.weight"


def guided_weight(config: dict) -> float:
    """The guided alignment weight of a resolved config (0: off; absent in older configs)."""
    return float((config["training"].get("guided_alignment") or {}).get("weight", 0.0))


def check_guided_alignment(config: dict, source: str) -> None:
    """The checks that need no model: a positive weight needs an ``align`` file on some corpus.
    ConfigError naming the key; nothing read."""
    if guided_weight(config) == 0.0:
        return
    data = config["data"]
    corpora = training_corpora(data["train"])
    if not any(c.align for c in corpora):
        raise ConfigError(source, KEY, "guided alignment needs reference alignments: set data.train.align (or "
                          "data.train[i].align) to a Pharaoh file, one line per training pair")


@dataclass
class GuidedAlignment:
    """The alignment loss of a model: ``loss`` the Fenchel-Young loss of its alignment heads' mapping
    (``mapping``, bound parameters), ``heads`` how many, ``weight`` its share of the training loss;
    ``learned_alpha``: the heads learn their alphas, and ``loss`` takes them (``alpha=``, one per
    row: :func:`nmt.sparse.tensor_alpha_loss.tensor_alpha_entmax_loss`) from the model's
    ``alignment_alpha()``."""

    weight: float
    loss: Callable[..., Tensor]
    mapping: str
    heads: int
    learned_alpha: bool = False

    def describe(self) -> str:
        """One log line."""
        heads = "its one head" if self.heads == 1 else f"{self.heads} heads, each on its own"
        mapping = f"{self.mapping} (learned alpha)" if self.learned_alpha else self.mapping
        return (f"guided alignment: weight {self.weight:g} x the {mapping} attention's Fenchel-Young loss at the "
                f"reference alignments ({heads})")


def guided_alignment(config: dict, source: str, model: nn.Module) -> GuidedAlignment | None:
    """The run's :class:`GuidedAlignment` (None: weight 0), from ``model.alignment_attention``.
    ConfigError naming :data:`KEY` for a model without one, a mapping without a Fenchel-Young loss
    (fusedmax, oscarmax); naming ``model.attention.coverage`` / ``training.coverage_loss`` where
    those are on too."""
    weight = guided_weight(config)
    if weight == 0.0:
        return None
    if config.get("model", {}).get("attention", {}).get("coverage", False):
        raise ConfigError(source, "model.attention.coverage", f"not with {KEY} (guided alignment trains the "
                          "attention's scores; the coverage needs its probabilities at every step)")
    if config.get("training", {}).get("coverage_loss", 0.0) > 0:
        raise ConfigError(source, "training.coverage_loss", f"not with {KEY}: both supervise the attention "
                          "(use one)")
    attention = getattr(model, "alignment_attention", None)
    if attention is None:
        raise ConfigError(source, KEY, f"{type(model).__name__} reports no alignment attention")
    if attention.mapping not in LOSS_NAMES:
        raise ConfigError(source, KEY, f"the alignment attention's mapping {attention.mapping} has no "
                          f"Fenchel-Young loss in nmt (guided alignment takes {', '.join(LOSS_NAMES)})")
    if attention.learned_alpha:
        if getattr(model, "alignment_alpha", None) is None:
            raise ConfigError(source, KEY, f"{type(model).__name__} learns its alignment heads' alpha but does not "
                              "report it (alignment_alpha)")
        n_iter = attention.params.get("n_iter")
        return GuidedAlignment(weight, partial(tensor_alpha_entmax_loss, n_iter=n_iter), attention.mapping,
                               attention.heads, learned_alpha=True)
    try:
        loss = get_loss(attention.mapping, **attention.params)
    except ValueError as exc:
        raise ConfigError(source, KEY, f"the alignment attention's loss: {first_line(exc)}") from None
    return GuidedAlignment(weight, loss, attention.mapping, attention.heads)


def alignment_loss(loss_fn: Callable[..., Tensor], scores: Tensor, reference: Tensor,
                   alpha: Tensor | None = None) -> Tensor:
    """Summed guided alignment loss (0-d, float32 or wider): over the target tokens with a
    reference, the mean over heads of ``loss_fn(s, q)`` (``loss_fn(s, q, alpha=a_h)`` with
    ``alpha``).

    scores: (B, H, T, L) the heads' scores before their mapping (``-inf`` on padding; a model's
    ``forward(..., alignment_scores=True)``); reference: (B, T, L) rows on the simplex, or zero
    rows (no reference: no loss, no gradient); alpha: (H,) the heads' learned alphas, or None.
    No host synchronisation (on accelerators)."""
    batch, heads, length, width = scores.shape
    has = reference.sum(-1) > 0  # (B, T)
    fallback = torch.zeros_like(reference)
    fallback[..., 0] = 1.0  # a valid target (position 0 is a real token) where the row is unused
    z = float32_if_half(scores)
    target = torch.where(has.unsqueeze(-1), reference, fallback).to(z.dtype)
    target = target.unsqueeze(1).expand(batch, heads, length, width)
    rows = {} if alpha is None else {"alpha": alpha.view(1, heads, 1, 1).expand(batch, heads, length, 1)
                                      .reshape(-1, 1)}
    per_row = loss_fn(z.reshape(-1, width), target.reshape(-1, width), reduction="none", **rows)
    per_row = per_row.view(batch, heads, length) * has.unsqueeze(1)
    return per_row.sum() / heads


def guided_loss_forward(model: nn.Module, loss_fn: Callable, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                        tgt_out: Tensor, pad_index: int, label_smoothing: float, src_mask: Tensor | None,
                        align: Tensor, align_loss: Callable, weight: float, learned_alpha: bool = False,
                        teacher: nn.Module | None = None, teacher_mapping: Callable[..., Tensor] | None = None,
                        distill_weight: float = 0.0, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """:func:`nmt.train.update.loss_forward` plus ``weight`` x :func:`alignment_loss` at ``align``
    (B, T, L), at the model's ``alignment_alpha()`` where ``learned_alpha``: returns ``(summed
    total loss, summed alignment loss detached)``, 0-d each. With a ``teacher`` (``training.distill``)
    the output part is :func:`nmt.train.distill.summed_distill_loss` at its distribution
    (:func:`nmt.train.distill.distill_loss_forward`'s, with ``teacher_mapping``, ``distill_weight``
    and ``temperature``)."""
    if teacher is not None:
        q = teacher_distribution(teacher, teacher_mapping, temperature, src, src_lengths, tgt_in, src_mask)
    logits, scores = model(src, src_lengths, tgt_in, src_mask=src_mask, alignment_scores=True)
    alpha = getattr(model, "module", model).alignment_alpha() if learned_alpha else None  # (DDP wraps the model)
    guide = alignment_loss(align_loss, scores, align, alpha)
    if teacher is None:
        output = summed_output_loss(loss_fn, logits, tgt_out, pad_index, label_smoothing,
                                    output_target(model, logits, tgt_out, src, src_lengths, src_mask))
    else:
        output = summed_distill_loss(loss_fn, logits, tgt_out, q, distill_weight, pad_index, label_smoothing)
    return output + weight * guide, guide.detach()


class GuidedForward:
    """A :data:`nmt.train.update.LossForward` with guided alignment: what the trainer passes to
    :func:`nmt.train.update.update`, which hands it each batch's reference grid (``align``; a batch
    without one is a batch of pairs without references: a zero grid). ``compile``: a wrapper such
    as :func:`nmt.train.compile.compile_for_device`'s, applied to :func:`guided_loss_forward`
    (with a ``teacher``, ``training.distill``: teacher, student and both losses in one graph).
    :meth:`take` returns the alignment losses summed since the last call (a device tensor)."""

    def __init__(self, guide: GuidedAlignment, compile: Callable[[Callable], Callable] | None = None,
                 teacher: Teacher | None = None) -> None:
        self.guide = guide
        self.teacher = teacher
        self.fn = guided_loss_forward if compile is None else compile(guided_loss_forward)
        self._sum: Tensor | None = None

    def __call__(self, model: nn.Module, loss_fn: Callable, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                 tgt_out: Tensor, pad_index: int, label_smoothing: float, src_mask: Tensor | None = None,
                 align: Tensor | None = None) -> Tensor:
        if align is None:
            align = torch.zeros(tgt_in.size(0), tgt_in.size(1), src.size(1), device=tgt_in.device)
        t = self.teacher
        distill = () if t is None else (t.model, t.mapping, t.weight, t.temperature)
        total, guide = self.fn(model, loss_fn, src, src_lengths, tgt_in, tgt_out, pad_index, label_smoothing,
                               src_mask, align, self.guide.loss, self.guide.weight, self.guide.learned_alpha, *distill)
        # a copy: under CUDA graphs the next replay overwrites the graph's output tensors
        self._sum = guide.clone() if self._sum is None else self._sum + guide
        return total

    def take(self) -> Tensor | None:
        """The summed alignment loss of the batches since the last call (None: none), and reset."""
        out, self._sum = self._sum, None
        return out


__all__ = ["GuidedAlignment", "GuidedForward", "KEY", "alignment_loss", "check_guided_alignment", "guided_alignment",
           "guided_loss_forward", "guided_weight"]
