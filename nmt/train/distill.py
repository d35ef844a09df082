"""Word-level knowledge distillation (``training.distill``; Hinton et al. 2015, Kim & Rush 2016).

At every target position the student's loss also pulls its output distribution toward a
teacher's. nmt's output losses are Fenchel-Young losses ``L(z; y) = Omega*(z) - <z, y> + Omega(y)``
(:mod:`nmt.sparse.losses`), which take a distribution on the simplex as the target, so the
distillation loss of the student's scores ``z`` at the teacher's distribution ``q`` is the
student's own loss at ``q``::

    loss(z) = (1 - w) L(z; y_gold) + w L(z; q),     grad_z loss = p*(z) - ((1 - w) y_gold + w q)

``p*`` the student's output mapping, ``y_gold`` the reference token (label-smoothed when
``training.label_smoothing`` > 0: smoothing applies to the reference part only) and ``q`` the
teacher's own output mapping (softmax, sparsemax, entmax... from the registry) of its scores
divided by ``temperature``, on the same source and teacher-forced target prefix.

The value is this *mixture of losses*. The loss at the mixed target ``(1 - w) y_gold + w q``
has the same gradient (``Omega*(z) - <z, y>`` is linear in ``y``; the two differ by
``(1 - w) Omega(y_gold) + w Omega(q) - Omega(mix) >= 0``, constant in ``z``), but its value mixes
the two parts; the mixture keeps each part readable: with a softmax student it is
``(1 - w) CE(y) + w KL(q || p)``, the classic KD objective without the constant entropy of
``q``. It costs one more mapping of the student's scores (the reference part keeps the fused
index-target kernels), small next to the teacher's forward pass.

Requirements (one-line ConfigError naming ``training.distill.teacher``): the teacher is an nmt
checkpoint (training, averaged or released; a run directory means its ``best.pt``), its
source and target vocabularies equal this run's token for token (the student's batches are fed
to it as they are; a different tokenizer with equal vocabularies is only a warning), and its
learned positions (a Transformer teacher) hold the training pairs' lengths. The teacher is
loaded once per process, on the run's device, in eval mode, without gradients, and runs under
the same autocast as the student. Under data parallelism each rank holds its own copy.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

from nmt.config import ConfigError
from nmt.data.field import Field
from nmt.models.protocol import position_limits
from nmt.models.seq2seq import length_mask
from nmt.sparse import get_mapping
from nmt.train.coverage_loss import coverage_loss
from nmt.train.init_from import init_checkpoint_path
from nmt.translate.loading import load_model
from nmt.utils.checkpoint_file import CheckpointError
from nmt.utils.exception_text import first_line
from nmt.utils.file_fingerprint import describe_change, fingerprint
from nmt.utils.precision import float32_if_half

logger = logging.getLogger(__name__)

KEY = "training.distill.teacher"


@dataclass
class Teacher:
    """A loaded teacher: its model (eval mode, frozen, on the run's device), its output mapping
    ``q = mapping(scores / temperature)`` and the mixing ``weight``."""

    model: nn.Module
    mapping: Callable[..., Tensor]
    mapping_name: str
    weight: float
    temperature: float
    path: Path
    step: int
    file: dict | None = None  # its fingerprint (nmt.utils.file_fingerprint) when loaded; saved in checkpoints

    def record(self) -> dict:
        """What a checkpoint keeps of the teacher (``trainer.teacher``): its path, step and file
        fingerprint, compared on resume by :func:`teacher_change`."""
        return {"path": str(self.path), "step": self.step, "file": self.file}

    def describe(self) -> str:
        """One log line: the file, its step, mapping, weight and temperature."""
        return (f"distillation: teacher {self.path} (step {self.step}, output {self.mapping_name}, "
                f"temperature {self.temperature:g}), weight {self.weight:g}: train loss = "
                f"{1 - self.weight:g} x loss at the reference + {self.weight:g} x loss at the teacher's "
                "distribution (validation: the plain loss)")


def check_distill(config: dict, source: str) -> None:
    """The checks of ``training.distill`` that need no loading: the student does not copy
    (``model.output.copy``), the teacher file exists (a file, or a run directory with ``best.pt``).
    ConfigError naming the key; nothing written."""
    value = config["training"]["distill"]["teacher"]
    if value is not None:
        if config["model"]["output"].get("copy", False):
            raise ConfigError(source, "model.output.copy", f"a student that copies source tokens cannot distil "
                              f"({KEY}.teacher is set): the teacher's distribution is over the vocabulary alone")
        init_checkpoint_path(value, source, KEY)


def token_list_difference(mine: list[str], theirs: list[str]) -> str | None:
    """Where two vocabularies' token lists first differ, in words (None: equal): ``"id 7 is 'x'
    there, 'y' here (40 vs 41 tokens)"``."""
    if mine == theirs:
        return None
    sizes = f"{len(theirs)} vs {len(mine)} tokens"
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return f"id {i} is {b!r} there, {a!r} here ({sizes})"
    return f"{sizes}; the first {min(len(mine), len(theirs))} agree"


def load_teacher(config: dict, source: str, src_field: Field, tgt_field: Field,
                 device: torch.device) -> Teacher | None:
    """The teacher of ``training.distill`` on ``device`` (None: no teacher set), checked against
    this run's fields (``src_field``, ``tgt_field``) and data lengths. ConfigError naming
    ``source`` and :data:`KEY` when the file is missing, not a loadable nmt checkpoint, its
    vocabularies differ (which side and where), or its learned positions are too few."""
    cfg = config["training"]["distill"]
    if cfg["teacher"] is None:
        return None
    path = init_checkpoint_path(cfg["teacher"], source, KEY)
    try:
        loaded = load_model(path, device)
    except (CheckpointError, OSError, ValueError) as exc:
        raise ConfigError(source, KEY, first_line(exc)) from None
    for side, mine, theirs in (("source", src_field, loaded.src_field), ("target", tgt_field, loaded.tgt_field)):
        problem = token_list_difference(mine.vocab.itos, theirs.vocab.itos)
        if problem is not None:
            raise ConfigError(source, KEY, f"{path}: its {side} vocabulary differs from this run's ({problem}); "
                              "the teacher reads the student's token ids: train the student with the teacher's "
                              "vocabularies (data.<side>.vocab_file: the teacher run's vocab.src / vocab.tgt)")
    for side, mine, theirs in (("source", src_field, loaded.src_field), ("target", tgt_field, loaded.tgt_field)):
        problem = mine.tokenizer.difference(theirs.tokenizer)
        if problem is not None:
            logger.warning("%s: %s's %s tokenizer differs from this run's (%s); the vocabularies are equal, so "
                           "distillation goes on, but the teacher sees segmentations it was not trained on",
                           KEY, path, side, problem)
    src_limit, tgt_limit = position_limits(loaded.model)
    data = config["data"]
    if src_limit is not None and data["src"]["max_length"] > src_limit:
        raise ConfigError(source, KEY, f"{path}: its learned positions hold {src_limit} source tokens, "
                          f"data.src.max_length is {data['src']['max_length']}; lower it to {src_limit}")
    if tgt_limit is not None and data["tgt"]["max_length"] + 1 > tgt_limit:
        raise ConfigError(source, KEY, f"{path}: its learned positions hold {tgt_limit} decoder inputs (BOS + "
                          f"tokens), data.tgt.max_length is {data['tgt']['max_length']}; lower it to {tgt_limit - 1}")
    model = loaded.model
    for p in model.parameters():
        p.requires_grad_(False)
    output = loaded.config["model"]["output"]
    try:
        mapping = get_mapping(output["mapping"], **output["params"])
    except ValueError as exc:
        raise ConfigError(source, KEY, f"{path}: its output mapping: {first_line(exc)}") from None
    try:
        file = fingerprint(path)
    except OSError:  # read a moment ago; gone since: nothing to compare on a later resume
        file = None
    return Teacher(model.eval(), mapping, output["mapping"], float(cfg["weight"]), float(cfg["temperature"]),
                   path, loaded.step, file)


def teacher_change(saved: dict | None, teacher: Teacher | None) -> str | None:
    """What changed in the teacher's file since a checkpoint was written (``saved``: its
    ``trainer.teacher``, see :meth:`Teacher.record`), in words, or None: no teacher then or now,
    another path (the changed setting is logged as such), or nothing seen to differ. A teacher
    run directory's ``best.pt`` rewritten by that run's later training is the usual case:
    ``runs/t/best.pt now holds step 3000 (step 2000 when the checkpoint was written; size ...)``."""
    if saved is None or teacher is None or saved.get("path") != str(teacher.path):
        return None
    what = (describe_change(saved["file"], teacher.file)
            if saved.get("file") is not None and teacher.file is not None else None)
    if what is None and saved.get("step") == teacher.step:
        return None
    steps = (f"step {teacher.step} (step {saved.get('step')} when the checkpoint was written)"
             if saved.get("step") != teacher.step else f"step {teacher.step} as before")
    return f"{teacher.path} now holds {steps}" + (f"; {what}" if what is not None else "")


def teacher_distribution(teacher: nn.Module, mapping: Callable[..., Tensor], temperature: float, src: Tensor,
                         src_lengths: Tensor, tgt_in: Tensor, src_mask: Tensor | None = None) -> Tensor:
    """The teacher's output distribution ``q = mapping(scores / temperature)`` (B, T, V), float32,
    without gradient, at the teacher-forced prefixes ``tgt_in`` (B, T) of ``src`` (B, L). The
    teacher's forward runs under the caller's autocast; the mapping in float32 outside it. A teacher
    that copies source tokens (``model.output.copy``) gives its tokens' marginal distribution."""
    with torch.no_grad():
        scores, _ = teacher(src, src_lengths, tgt_in, src_mask=src_mask)
        with torch.autocast(scores.device.type, enabled=False):
            scores = scores.float()
            if temperature != 1.0:
                scores = scores / temperature
            if getattr(teacher, "copies", False):  # a copying teacher: its tokens' marginal distribution
                mask = length_mask(src_lengths, src.size(1), src.device) if src_mask is None else src_mask
                return teacher.output_probs(scores, src, mask)
            return mapping(scores, dim=-1)


def distill_loss(loss_fn: Callable, scores: Tensor, target: Tensor, q: Tensor, weight: float, ignore_index: int,
                 label_smoothing: float = 0.0) -> Tensor:
    """Summed word-level distillation loss (0-d): ``(1 - weight) L(z; y) + weight L(z; q)`` over
    the rows whose ``target`` is not ``ignore_index``, ``L = loss_fn`` the student's
    Fenchel-Young loss. scores: (N, V) the student's; target: (N,) class indices; q: (N, V) the
    teacher's distributions; ``label_smoothing`` smooths the reference part only. Its gradient
    is ``p*(z) - ((1 - weight) y + weight q)`` on those rows, 0 elsewhere (see the module
    docstring). No host synchronisation beyond ``loss_fn``'s."""
    toward = loss_fn(scores, q, reduction="none")  # (N,): the loss at the teacher's distribution
    toward = torch.where(target != ignore_index, toward, 0).sum()
    if weight == 1.0:  # the reference part has weight 0 (an infinite one would make 0 x inf = NaN)
        return toward
    gold = loss_fn(scores, target, ignore_index=ignore_index, reduction="sum", label_smoothing=label_smoothing)
    return (1.0 - weight) * gold + weight * toward


def distill_loss_forward(model: nn.Module, loss_fn: Callable, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                         tgt_out: Tensor, pad_index: int, label_smoothing: float, src_mask: Tensor | None,
                         teacher: nn.Module, mapping: Callable[..., Tensor], weight: float,
                         temperature: float, coverage_weight: float = 0.0) -> Tensor:
    """:func:`nmt.train.update.loss_forward` with distillation: the teacher's ``q`` (B, T, V), the
    student's teacher-forced scores, and :func:`distill_loss` summed (0-d, float32 or wider), plus
    ``coverage_weight`` times the student's coverage loss (``training.coverage_loss``)."""
    q = teacher_distribution(teacher, mapping, temperature, src, src_lengths, tgt_in, src_mask)
    logits, attention = model(src, src_lengths, tgt_in, src_mask=src_mask)
    loss = summed_distill_loss(loss_fn, logits, tgt_out, q, weight, pad_index, label_smoothing)
    if coverage_weight > 0:
        loss = loss + coverage_weight * coverage_loss(attention, tgt_out, pad_index)
    return loss


def summed_distill_loss(loss_fn: Callable, logits: Tensor, tgt_out: Tensor, q: Tensor, weight: float,
                        pad_index: int, label_smoothing: float) -> Tensor:
    """:func:`distill_loss` of the teacher-forced ``logits`` (B, T, V) at ``tgt_out`` (B, T) and the
    teacher's ``q`` (B, T, V); half logits summed in float32 (0-d)."""
    logits = float32_if_half(logits)
    n_classes = logits.size(-1)
    return distill_loss(loss_fn, logits.reshape(-1, n_classes), tgt_out.reshape(-1), q.reshape(-1, n_classes),
                        weight, pad_index, label_smoothing)


class DistillForward:
    """A :data:`nmt.train.update.LossForward` that distills from ``teacher``: what the trainer
    passes to :func:`nmt.train.update.update` with ``training.distill``. ``compile``: a wrapper
    such as :func:`nmt.train.compile.compile_for_device`'s, applied to
    :func:`distill_loss_forward` (teacher and student in one graph)."""

    def __init__(self, teacher: Teacher, compile: Callable[[Callable], Callable] | None = None,
                 coverage_weight: float = 0.0) -> None:
        self.teacher = teacher
        self.coverage_weight = coverage_weight  # training.coverage_loss
        self.fn = distill_loss_forward if compile is None else compile(distill_loss_forward)

    def __call__(self, model: nn.Module, loss_fn: Callable, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                 tgt_out: Tensor, pad_index: int, label_smoothing: float, src_mask: Tensor | None = None) -> Tensor:
        t = self.teacher
        return self.fn(model, loss_fn, src, src_lengths, tgt_in, tgt_out, pad_index, label_smoothing, src_mask,
                       t.model, t.mapping, t.weight, t.temperature, self.coverage_weight)


__all__ = ["DistillForward", "KEY", "Teacher", "check_distill", "teacher_change", "distill_loss", "distill_loss_forward",
           "summed_distill_loss",
           "load_teacher", "teacher_distribution", "token_list_difference"]
