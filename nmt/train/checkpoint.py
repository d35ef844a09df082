"""The run directory's checkpoint policy: ``last.pt``, ``best.pt``, ``step_N.pt``, keep-last rotation.

The file format itself (payload keys, format version, atomic save, checked
``weights_only`` load) lives in :mod:`nmt.utils.checkpoint_file`, shared with decoding; its
names are re-exported here for training code.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from nmt.utils.checkpoint_file import (FORMAT_VERSION, PAYLOAD_KEYS, CheckpointError, load_checkpoint,
                                       save_checkpoint)
from nmt.utils.io import atomic_open, stale_temporary, temporary_owner

_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


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
    atomically too. ``last.pt`` comes first: after a crash before ``best.pt`` is replaced,
    ``last.pt`` records (early-stopping state) that it is the best, and :func:`repair_best`
    restores the pair on resume.
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


RUN_FILES = re.compile(r"^(last\.pt|best\.pt|step_\d+\.pt|config\.yaml|metrics\.jsonl)$")
"""The files of ``save_dir`` that only the nmt-train run holding its lock writes."""


def remove_stale_temporaries(save_dir: str | os.PathLike) -> list[Path]:
    """Delete the temporary files of interrupted atomic writes (``.NAME.*.tmp``) in ``save_dir``.

    Call this only while holding the directory's lock (nmt-train takes it before): then no other
    run writes the run's own files (:data:`RUN_FILES`), so their temporaries are never valid,
    whoever left them (an older nmt's too, whose names carry no owner). Any other temporary (an
    ``nmt-average`` / ``nmt-translate`` output the user directs into ``save_dir``, whose writer
    may still run) is removed only when its writer was a process of this host that no longer
    runs (:func:`nmt.utils.io.stale_temporary`). Returns the removed paths.
    """
    removed = []
    for entry in Path(save_dir).glob(".*.tmp"):
        owner = temporary_owner(entry.name)
        target = owner[0] if owner is not None else entry.name[1:-len(".tmp")].rsplit(".", 1)[0]
        if not (RUN_FILES.match(target) or stale_temporary(entry.name)):
            continue
        if entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The ``step`` stored in a checkpoint file (None when missing or unreadable); loads lazily (mmap)."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # missing, torn or foreign: callers treat all as "not the expected step"
        return None
    return payload.get("step") if isinstance(payload, dict) else None


def repair_best(save_dir: str | os.PathLike, last_step: int, best_step: int) -> bool:
    """Make ``best.pt`` hold ``best_step`` when a crash left it behind ``last.pt``.

    ``save_run_checkpoint`` writes ``last.pt`` before ``best.pt``, so after a crash between the
    two, ``last.pt`` (whose early-stopping record says best = ``best_step`` = ``last_step``) is
    the state ``best.pt`` should hold: it is copied over. Returns True when it repaired.
    """
    save_dir = Path(save_dir)
    if best_step < 0 or best_step != last_step or checkpoint_step(save_dir / "best.pt") == best_step:
        return False
    _atomic_copy(save_dir / "last.pt", save_dir / "best.pt")
    return True


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
           "save_run_checkpoint", "step_checkpoints", "RUN_FILES", "remove_stale_temporaries", "checkpoint_step",
           "repair_best"]
