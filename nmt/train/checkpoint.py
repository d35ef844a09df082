"""The run directory's checkpoint policy: ``last.pt``, ``best.pt``, ``step_N.pt``, keep-last rotation,
the kept best ``best_step_N.pt`` (``training.keep_best``; their ranking and repair live in
:mod:`nmt.train.keep_best`), and which of them a resume starts from.

Resume (:func:`find_resume_checkpoint`) takes the newest checkpoint that loads: ``last.pt``
(every save writes it first), else, when it is missing or damaged (truncated by a full disk, a
half-finished copy, unpicklable, missing payload keys), the ``step_N.pt`` files from the newest
down (a kept ``best_step_N.pt`` after the ``step_N.pt`` of its step), with ``best.pt`` tried at the place of the step it holds (so it serves when it is newer than
every loadable step file, e.g. with ``keep_last: 0``, and is the last resort otherwise). A file
that is not damaged but refused (another format version, a released model) stops the search with
its error: an older checkpoint would silently drop the newer state. When files exist but none
loads, the error names each; a run never starts from scratch over existing checkpoints.

The damaged files a resume passed over are then renamed aside (:func:`set_aside_damaged`:
``NAME.damaged``), so that nothing is lost and they take no further part: the keep-last rotation
would count a damaged ``step_N.pt`` newer than the resumed step among the newest and delete good
files in its place, ``nmt-average -last`` would pick it, and ``best.pt`` would name garbage.

The file format itself (payload keys, format version, atomic save, checked
``weights_only`` load) lives in :mod:`nmt.utils.checkpoint_file`, shared with decoding; its
names are re-exported here for training code.
"""
from __future__ import annotations

import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from nmt.utils.checkpoint_file import (FORMAT_VERSION, PAYLOAD_KEYS, CheckpointError, DamagedCheckpointError,
                                       load_checkpoint, save_checkpoint)
from nmt.utils.exception_text import first_line
from nmt.utils.io import atomic_open, stale_temporary, temporary_owner
from nmt.utils.zip_crc import zip_crc_problem

_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")
_KEPT_FILE = re.compile(r"^best_step_(\d+)\.pt$")


def step_checkpoints(save_dir: str | os.PathLike) -> list[Path]:
    """``step_N.pt`` files in ``save_dir``, oldest (smallest N) first."""
    found = []
    for entry in Path(save_dir).glob("step_*.pt"):
        match = _STEP_FILE.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return [p for _, p in sorted(found)]


def kept_best_path(save_dir: str | os.PathLike, step: int) -> Path:
    """The kept-best file of ``step`` in ``save_dir`` (``best_step_<step>.pt``, ``training.keep_best``)."""
    return Path(save_dir) / f"best_step_{step}.pt"


def kept_best_checkpoints(save_dir: str | os.PathLike) -> dict[int, Path]:
    """The kept-best files ``best_step_N.pt`` of ``save_dir``: step N -> path, smallest N first."""
    found = {}
    for entry in Path(save_dir).glob("best_step_*.pt"):
        match = _KEPT_FILE.match(entry.name)
        if match:
            found[int(match.group(1))] = entry
    return dict(sorted(found.items()))


def save_run_checkpoint(save_dir: str | os.PathLike, payload: dict[str, Any], keep_last: int,
                        is_best: bool = False, step_file: bool = True,
                        kept_steps: Sequence[int] | None = None) -> None:
    """Save ``last.pt`` (and ``step_N.pt``, ``best.pt``, ``best_step_N.pt``) in ``save_dir``; keep the
    newest ``keep_last`` step files and, with ``kept_steps``, the kept-best files of those steps only.

    The payload is serialized once; the other names are hard links / copies of it written
    atomically too. With ``kept_steps`` (``training.keep_best``: the steps of the kept set after
    this save's validation, recorded in the payload) holding the payload's step, ``best_step_N.pt``
    is written first and ``last.pt``, whose record names it, after: a record never names a file
    not yet written; the files the set dropped are deleted last, once ``last.pt`` no longer names
    them (a crash in between leaves a file no record names, deleted on resume:
    :func:`nmt.train.keep_best.restore_kept`). ``kept_steps`` None: kept-best files are left alone.
    ``last.pt`` comes before ``best.pt``: after a crash before ``best.pt`` is replaced, ``last.pt``
    records (early-stopping state) that it is the best, and :func:`repair_best` restores the pair on
    resume.
    """
    save_dir = Path(save_dir)
    last = save_dir / "last.pt"
    kept = kept_best_path(save_dir, payload["step"])
    if kept_steps is not None and payload["step"] in kept_steps and not kept.exists():
        save_checkpoint(kept, payload)
        _atomic_copy(kept, last)
    else:
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
    if kept_steps is not None:
        for step, old in kept_best_checkpoints(save_dir).items():
            if step not in kept_steps:
                old.unlink(missing_ok=True)


RUN_FILES = re.compile(r"^(last\.pt|best\.pt|step_\d+\.pt|best_step_\d+\.pt|config\.yaml|metrics\.jsonl|vocab\.src|"
                       r"vocab\.tgt)$")
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


@dataclass
class ResumePoint:
    """The checkpoint a resume starts from: its path, its loaded payload, and one line
    (``PATH: problem``) per newer checkpoint file that was passed over (missing ``last.pt``, damaged files)."""

    path: Path
    payload: dict[str, Any]
    passed_over: list[str] = field(default_factory=list)
    damaged: list[Path] = field(default_factory=list)  # the passed-over files that exist (damaged ones)

    @property
    def fallback(self) -> bool:
        """True when it is not ``last.pt`` (a newer file was missing or damaged)."""
        return self.path.name != "last.pt"


def resume_candidates(save_dir: str | os.PathLike) -> list[Path]:
    """The checkpoints of ``save_dir`` a resume may start from, newest first.

    ``last.pt`` first (named even when missing: the caller reports it), then the ``step_N.pt`` and
    kept-best ``best_step_N.pt`` by N from the newest (a step file before the kept file of its
    step), and ``best.pt`` after the files holding its step or a newer one (an unreadable
    ``best.pt``, whose step is unknown, comes last). Files absent are left out.
    """
    save_dir = Path(save_dir)
    steps = [(int(_STEP_FILE.match(p.name).group(1)), p) for p in step_checkpoints(save_dir)]
    steps += list(kept_best_checkpoints(save_dir).items())
    ordered = [p for _, p in sorted(steps, key=lambda sp: -sp[0])]  # stable: step_N.pt before best_step_N.pt
    best = save_dir / "best.pt"
    if best.is_file():
        best_step = checkpoint_step(best)
        at = (len(ordered) if best_step is None
              else sum(1 for n, _ in steps if n >= best_step))  # after the files of its step and newer
        ordered.insert(at, best)
    return [save_dir / "last.pt", *ordered]


def has_checkpoints(save_dir: str | os.PathLike) -> bool:
    """Whether ``save_dir`` holds any run checkpoint (``last.pt``, ``best.pt``, ``step_N.pt``,
    ``best_step_N.pt``), loadable or not."""
    save_dir = Path(save_dir)
    return ((save_dir / "last.pt").exists() or (save_dir / "best.pt").exists() or bool(step_checkpoints(save_dir))
            or bool(kept_best_checkpoints(save_dir)))


def find_resume_checkpoint(save_dir: str | os.PathLike, load=load_checkpoint) -> ResumePoint | None:
    """The newest checkpoint of ``save_dir`` that loads (see the module docstring), or None when
    ``save_dir`` holds no checkpoint at all (a new run).

    ``load(path)`` reads one file (default :func:`load_checkpoint`); a DamagedCheckpointError
    passes over the file (listed in :attr:`ResumePoint.passed_over`), any other CheckpointError is
    raised as it is. Raises CheckpointError (one line naming ``save_dir`` and each file with its
    problem) when checkpoints exist but none loads.
    """
    save_dir = Path(save_dir)
    if not has_checkpoints(save_dir):
        return None
    passed_over: list[str] = []
    damaged: list[Path] = []
    for path in resume_candidates(save_dir):
        if not path.exists():  # only last.pt is listed without existing
            passed_over.append(f"{path}: missing")
            continue
        try:
            return ResumePoint(path, load(path), passed_over, damaged)
        except DamagedCheckpointError as exc:
            passed_over.append(first_line(exc))
            damaged.append(path)
    problems = "; ".join(_relative(line, save_dir) for line in passed_over)
    raise CheckpointError(f"{save_dir}: no checkpoint there can be resumed from ({problems}); move the damaged "
                          "files away to start a new run there, or set another training.save_dir")


def _relative(line: str, save_dir: Path) -> str:
    prefix = f"{save_dir}{os.sep}"
    return line[len(prefix):] if line.startswith(prefix) else line


def set_aside_damaged(path: str | os.PathLike) -> Path:
    """Rename the damaged checkpoint ``path`` to ``NAME.damaged`` (``NAME.damaged.2``, ... when
    that name is taken: nothing is overwritten); returns the new path. It keeps its bytes, for a
    look or a repair by hand, and no longer matches the run's checkpoint names."""
    path = Path(path)
    target, n = path.with_name(f"{path.name}.damaged"), 1
    while target.exists() or target.is_symlink():
        n += 1
        target = path.with_name(f"{path.name}.damaged.{n}")
    os.rename(path, target)
    return target


def archive_damage(path: str | os.PathLike) -> str | None:
    """Why the existing file ``path`` is not an intact ``torch.save`` archive whose step can be
    read (a record failing its CRC-32 check, a broken or cut archive), or None. Cheaper than a
    load: one CRC pass and the step read lazily. A file that cannot be read now (OSError) is not
    called damaged (None)."""
    return archive_check(path)[0]


def holds_step(path: str | os.PathLike, step: int) -> bool:
    """Whether ``path`` exists and is an intact checkpoint (:func:`archive_damage`) of ``step``."""
    if not Path(path).is_file():
        return False
    problem, found = archive_check(path)
    return problem is None and found == step


def archive_check(path: str | os.PathLike) -> tuple[str | None, int | None]:
    """``(archive_damage(path), the step it holds)`` from one CRC pass and one step read (the step
    None where the file is unreadable or damaged): for a caller that needs both, or needs the
    verdict more than once (a resume's ``best.pt``: see :func:`repair_best`'s ``holds``)."""
    try:
        if not zipfile.is_zipfile(path):
            return "not a torch.save archive (another kind of file, or truncated)", None
        problem = zip_crc_problem(path)
    except OSError:
        return None, None
    if problem is not None:
        return problem, None
    step = checkpoint_step(path)
    return ("its step cannot be read" if step is None else None), step


def best_check(best: str | os.PathLike, resumed: str | os.PathLike, resumed_step: int
               ) -> tuple[str | None, int | None]:
    """:func:`archive_check` of a resume's ``best`` file, without a CRC pass where it is the file
    ``resumed`` the resume just loaded (the same name, or a hard link of the same save): its bytes
    passed the load's check, and it holds ``resumed_step``."""
    try:
        same = os.path.samefile(best, resumed)
    except OSError:
        same = False
    return (None, resumed_step) if same else archive_check(best)


def repair_best(save_dir: str | os.PathLike, resumed_step: int, best_step: int,
                source: str | os.PathLike | None = None, holds: bool | None = None) -> Path | None:
    """Make ``best.pt`` hold ``best_step`` (the resumed checkpoint's early-stopping record) when it
    does not: a crash fell between writing ``last.pt`` and ``best.pt``, or ``best.pt`` is damaged
    or missing while the run resumed.

    ``best.pt`` holds ``best_step`` when it is intact (:func:`holds_step`: a flipped bit is not).
    ``save_run_checkpoint`` writes ``last.pt`` before ``best.pt``, so after a crash between the
    two the resumed file ``source`` (default ``last.pt``), whose record says best = ``best_step`` =
    ``resumed_step``, is the state ``best.pt`` should hold; an older best is copied from
    ``step_{best_step}.pt`` or ``best_step_{best_step}.pt`` when that file still holds it. ``holds``: whether ``best.pt`` holds
    ``best_step``, where the caller checked it already (None: checked here, one CRC pass). Returns
    the file copied over ``best.pt``, or None when nothing was (already right, no validation yet,
    no such file).
    """
    save_dir = Path(save_dir)
    if holds is None:
        holds = best_step >= 0 and holds_step(save_dir / "best.pt", best_step)
    if best_step < 0 or holds:
        return None
    if best_step == resumed_step:
        origin = Path(source) if source is not None else save_dir / "last.pt"
    else:  # its step file, or its kept-best file (training.keep_best)
        origin = next((o for o in (save_dir / f"step_{best_step}.pt", kept_best_path(save_dir, best_step))
                       if holds_step(o, best_step)), None)
        if origin is None:
            return None
    _atomic_copy(origin, save_dir / "best.pt")
    return origin


def restore_last(save_dir: str | os.PathLike, source: str | os.PathLike) -> None:
    """Make ``last.pt`` the checkpoint ``source`` a resume fell back to (a hard link where the
    filesystem allows, else a copy; atomic), so that the run directory is whole again before the
    next save: ``last.pt`` names the state training continues from."""
    _atomic_copy(Path(source), Path(save_dir) / "last.pt")


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


__all__ = ["FORMAT_VERSION", "PAYLOAD_KEYS", "CheckpointError", "DamagedCheckpointError", "save_checkpoint",
           "load_checkpoint", "save_run_checkpoint", "step_checkpoints", "RUN_FILES", "remove_stale_temporaries",
           "checkpoint_step", "kept_best_path", "kept_best_checkpoints", "ResumePoint", "resume_candidates", "has_checkpoints", "find_resume_checkpoint",
           "set_aside_damaged", "archive_damage", "archive_check", "best_check", "holds_step", "repair_best", "restore_last"]
