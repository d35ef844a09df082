"""Rebuild models and fields from checkpoints for translation."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from nmt.data.field import Field, field_difference
from nmt.models.protocol import StepDecoder
from nmt.utils.checkpoint_file import CheckpointError, load_checkpoint
from nmt.utils.exception_text import first_line, one_line
from nmt.utils.device import auto_device, device_name_problem, device_problem, indexed
from nmt.translate.ensemble import Ensemble


@dataclass
class LoadedModel:
    """A model in eval mode on its device, with the fields and config it was trained with."""

    model: torch.nn.Module
    src_field: Field
    tgt_field: Field
    config: dict[str, Any]
    step: int
    path: Path


def resolve_device(device: str | torch.device, what: str = "device") -> str:
    """The device to use, by an explicit name: ``"auto"`` is CUDA when available, else ``"cpu"``;
    ``"cuda"`` is the current CUDA device by its index (``"cuda:0"``), fixed here: a name without
    an index would mean, at each later use, the current device of the thread using it. ValueError
    (one line, naming the option ``what``) for a device this machine cannot allocate on."""
    problem = device_name_problem(device)
    if problem is not None:
        raise ValueError(f"{what} {device}: {problem}")
    name = auto_device(device)
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"{what} {name}: CUDA is not available on this machine")
    problem = device_problem(name)
    if problem is not None:
        raise ValueError(f"{what} {name}: not a usable device here (cpu, cuda or cuda:N); {problem}")
    return str(indexed(name))


def checkpoint_fields(path: Path, checkpoint: dict[str, Any]) -> tuple[Field, Field]:
    """The source and target fields of a loaded ``checkpoint``; ``CheckpointError`` naming ``path``
    where they cannot be rebuilt."""
    try:
        return Field.from_state_dict(checkpoint["src_field"]), Field.from_state_dict(checkpoint["tgt_field"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: cannot rebuild the vocabularies ({first_line(exc)})") from None


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> LoadedModel:
    """Load one checkpoint written by the trainer and rebuild its model for inference.

    Raises ``CheckpointError`` (one line naming the file) for a missing, corrupt or
    foreign-version file, or one whose fields, config or weights do not fit together.
    """
    from nmt.models import build_model

    path = Path(path)
    ckpt = load_checkpoint(path, map_location="cpu", training=False)
    src_field, tgt_field = checkpoint_fields(path, ckpt)
    try:
        model_cfg = ckpt["config"]["model"]
        model = build_model(model_cfg, len(src_field.vocab), len(tgt_field.vocab), tgt_field.vocab.pad_index)
        model.load_state_dict(ckpt["model"])
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: cannot rebuild the model ({one_line(exc)})") from None
    model.to(device).eval()
    return LoadedModel(model, src_field, tgt_field, ckpt["config"], int(ckpt.get("step", 0)), path)


def load_models(
    paths: Sequence[str | os.PathLike], device: str | torch.device = "cpu"
) -> tuple[StepDecoder, Field, Field, list[LoadedModel]]:
    """Load one or several checkpoints; several are decoded as an ``Ensemble``.

    Every member must use the same source and target tokenizers and vocabularies: the
    ensemble reads and writes text with the first member's fields (CheckpointError naming the
    first file that differs, the first file and what differs). Tokenizers are compared by what
    they do (:meth:`nmt.data.tokenizers.Tokenizer.difference`): the same BPE codes or
    sentencepiece model read from another path is the same tokenizer. Returns
    ``(decoder, src_field, tgt_field, members)``.
    """
    if not paths:
        raise ValueError("no checkpoint given")
    members = [load_model(p, device) for p in paths]
    first = members[0]
    for other in members[1:]:
        problem = field_difference(first.src_field, first.tgt_field, other.src_field, other.tgt_field,
                                   str(other.path), str(first.path))
        if problem is not None:
            raise CheckpointError(f"{problem}; an ensemble reads and writes text with one tokenizer "
                                  "and vocabulary per side, so its members need the same")
    decoder: StepDecoder = first.model if len(members) == 1 else Ensemble([m.model for m in members])
    return decoder, first.src_field, first.tgt_field, members


__all__ = ["LoadedModel", "checkpoint_fields", "load_model", "load_models", "resolve_device"]
