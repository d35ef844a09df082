"""Released models: checkpoint averaging and dropping the training state.

A *released model* is a checkpoint of ``kind: "model"`` holding only what translation
needs: weights, both fields (tokenizers + vocabularies), the resolved config, the step and
the metrics of its source. No optimizer, schedule, RNG or data position, so it is smaller,
and ``nmt-translate`` loads it like any checkpoint (``load_checkpoint(training=False)``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch

from nmt.data.field import field_difference
from nmt.train.checkpoint import CheckpointError, load_checkpoint, step_checkpoints
from nmt.translate.loading import checkpoint_fields


def released(checkpoint: dict[str, Any], source: str | os.PathLike | Sequence[str | os.PathLike]) -> dict[str, Any]:
    """The released-model payload of a loaded checkpoint (a training one or a released one)."""
    sources = [str(source)] if isinstance(source, (str, os.PathLike)) else [str(s) for s in source]
    return {"kind": "model", "model": checkpoint["model"], "config": checkpoint["config"],
            "src_field": checkpoint["src_field"], "tgt_field": checkpoint["tgt_field"],
            "step": int(checkpoint.get("step", 0)), "metrics": dict(checkpoint.get("metrics", {})),
            "released_from": sources,
            **({"weights": checkpoint["weights"]} if "weights" in checkpoint else {})}  # "ema": training.ema's average


def _first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    """Dotted path of the first difference of two nested dicts/values (None when equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{prefix}.{key}" if prefix else str(key)
            if key not in a or key not in b:
                return where
            found = _first_difference(a[key], b[key], where)
            if found is not None:
                return found
        return None
    return None if a == b else (prefix or "<value>")


def _architecture(section: Any) -> Any:
    """A model config without its dropout rates (``dropout``, ``*_dropout``): regularisation
    during training, no part of the architecture or of what the weights compute at inference."""
    if not isinstance(section, dict):
        return section
    return {key: _architecture(value) for key, value in section.items()
            if not (isinstance(key, str) and (key == "dropout" or key.endswith("_dropout")))}


def check_compatible(paths: Sequence[Path], checkpoints: Sequence[dict[str, Any]]) -> None:
    """CheckpointError (one line, naming the file) unless all share architecture, tokenizers,
    vocabularies and weights' shapes.

    Dropout rates may differ (models trained with other regularisation average too); tokenizers
    are compared by what they do (:func:`nmt.data.field.field_difference`), so the same BPE codes
    or sentencepiece model read from another path (or learned with another ``merges`` setting)
    average.
    """
    first, first_path = checkpoints[0], paths[0]
    first_fields = checkpoint_fields(first_path, first)
    for path, other in zip(paths[1:], checkpoints[1:]):
        differing = _first_difference(_architecture(first["config"]["model"]),
                                      _architecture(other["config"]["model"]), "model")
        if differing is not None:
            raise CheckpointError(f"{path}: another architecture than {first_path} ({differing} differs)")
        problem = field_difference(*first_fields, *checkpoint_fields(path, other), str(path), str(first_path))
        if problem is not None:
            raise CheckpointError(problem)
        a, b = first["model"], other["model"]
        if set(a) != set(b):
            name = sorted(set(a) ^ set(b))[0]
            raise CheckpointError(f"{path}: weight {name!r} is in one of it and {first_path} only")
        for name, tensor in a.items():
            if tensor.shape != b[name].shape or tensor.dtype != b[name].dtype:
                raise CheckpointError(f"{path}: weight {name!r} is {tuple(b[name].shape)} {b[name].dtype}, "
                                      f"{tuple(tensor.shape)} {tensor.dtype} in {first_path}")


def average_state_dicts(state_dicts: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of floating-point weights (accumulated in float64, cast back).

    Non-floating entries (e.g. integer buffers) must be equal in all and are copied.
    """
    out: dict[str, torch.Tensor] = {}
    for name, first in state_dicts[0].items():
        if torch.is_floating_point(first):
            total = torch.zeros(first.shape, dtype=torch.float64)
            for sd in state_dicts:
                total += sd[name].to(torch.float64)
            out[name] = (total / len(state_dicts)).to(first.dtype)
        else:
            if any(not torch.equal(first, sd[name]) for sd in state_dicts[1:]):
                raise CheckpointError(f"weight {name!r}: a non-floating entry differs between checkpoints")
            out[name] = first.clone()
    return out


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict[str, Any]:
    """A released model whose weights are the mean of the given checkpoints' weights.

    Config, fields and step come from the last file (the newest, for ``-last N``).
    """
    if not paths:
        raise CheckpointError("no checkpoint to average")
    paths = [Path(p) for p in paths]
    checkpoints = [load_checkpoint(p, training=False) for p in paths]
    check_compatible(paths, checkpoints)
    payload = released(checkpoints[-1], paths)
    payload["model"] = average_state_dicts([c["model"] for c in checkpoints])
    if any(c.get("weights") != payload.get("weights") for c in checkpoints):  # a mean of averages and others
        payload.pop("weights", None)
    payload["averaged"] = len(paths)
    return payload


def last_step_checkpoints(save_dir: str | os.PathLike, n: int) -> list[Path]:
    """The newest ``n`` ``step_N.pt`` files of a run directory, oldest first; one-line errors."""
    save_dir = Path(save_dir)
    if n < 1:
        raise CheckpointError(f"-last must be >= 1, got {n}")
    if not save_dir.is_dir():
        raise CheckpointError(f"{save_dir}: no such run directory")
    found = step_checkpoints(save_dir)
    if len(found) < n:
        raise CheckpointError(f"{save_dir}: {len(found)} step checkpoint(s), {n} asked; "
                              "keep more with training.keep_last")
    return found[-n:]


__all__ = ["released", "check_compatible", "average_state_dicts", "average_checkpoints", "last_step_checkpoints"]
