"""Checkpoints: atomic save, checked load, and the run directory's rotation policy.

A checkpoint is a dict (see :data:`PAYLOAD_KEYS`) written with ``torch.save`` to a
temporary file in the target directory and moved into place with ``os.replace``, so a
crash never leaves a truncated ``last.pt``. Everything in it is tensors and plain Python
values, so it loads with ``weights_only=True`` (no arbitrary unpickling).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from nmt.utils.io import atomic_open

FORMAT_VERSION = 1
PAYLOAD_KEYS = ("format_version", "nmt_version", "model", "optimizer", "scheduler", "step", "epoch", "rng",
                "config", "src_field", "tgt_field", "metrics")
_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A one-line error naming the checkpoint file: missing, unreadable or another format."""


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (temp file in the same dir + os.replace).

    ``format_version`` and ``nmt_version`` are filled in when absent.
    """
    from nmt import __version__

    payload = {"format_version": FORMAT_VERSION, "nmt_version": __version__, **payload}
    with atomic_open(path, "wb") as handle:
        torch.save(payload, handle)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`.

    Raises CheckpointError (one line, names the file) when it is missing, corrupt, not an
    nmt checkpoint, or of another format version.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt / foreign files
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable nmt checkpoint ({type(exc).__name__}: {detail[:200]})") from None
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise CheckpointError(f"{path}: not an nmt checkpoint (no format_version)")
    if payload["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {payload['format_version']} "
                              f"is not supported (this nmt reads version {FORMAT_VERSION})")
    missing = [k for k in PAYLOAD_KEYS if k not in payload]
    if missing:
        raise CheckpointError(f"{path}: incomplete checkpoint, missing {', '.join(missing)}")
    return payload


def step_checkpoints(save_dir: str | os.PathLike) -> list[Path]:
    """``step_N.pt`` files in ``save_dir``, oldest (smallest N) first."""
    found = []
    for entry in Path(save_dir).glob("step_*.pt"):
        match = _STEP_FILE.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return [p for _, p in sorted(found)]


def save_run_checkpoint(save_dir: str | os.PathLike, payload: dict[str, Any], keep_last: int,
                        is_best: bool = False, step_file: bool = True) -> None:
    """Save ``last.pt`` (and ``step_N.pt``, ``best.pt``) in ``save_dir``; keep the newest ``keep_last`` step files.

    The payload is serialized once; the other names are hard links / copies of it written
    atomically too.
    """
    save_dir = Path(save_dir)
    last = save_dir / "last.pt"
    save_checkpoint(last, payload)
    targets = []
    if step_file and keep_last > 0:
        targets.append(save_dir / f"step_{payload['step']}.pt")
    if is_best:
        targets.append(save_dir / "best.pt")
    for target in targets:
        _atomic_copy(last, target)
    for old in step_checkpoints(save_dir)[: max(0, len(step_checkpoints(save_dir)) - keep_last)]:
        old.unlink(missing_ok=True)


def _atomic_copy(source: Path, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)  # same bytes, no second write; replaced atomically
    except OSError:
        with atomic_open(target, "wb") as handle, open(source, "rb") as src:
            while chunk := src.read(1 << 20):
                handle.write(chunk)
        return
    os.replace(tmp, target)


__all__ = ["FORMAT_VERSION", "PAYLOAD_KEYS", "CheckpointError", "save_checkpoint", "load_checkpoint",
           "save_run_checkpoint", "step_checkpoints"]
