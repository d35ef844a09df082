"""The checkpoint file format: one dict, written atomically, read back safely and checked.

A checkpoint is a dict holding :data:`PAYLOAD_KEYS` (``format_version`` = :data:`FORMAT_VERSION`,
``nmt_version``, model / optimizer / scheduler states, step, epoch, RNG states, resolved config,
source / target field states, metrics, the trainer's progress and early-stopping state). It is written with ``torch.save`` to a temporary file
in the target directory and moved into place with ``os.replace`` (``nmt.utils.io.atomic_open``),
so a crash never leaves a truncated file, and the file gets the umask's permissions.
Everything in it is tensors and plain Python values, so it loads with ``weights_only=True``
(no arbitrary unpickling). ``torch.load`` does not check the CRC-32s the archive holds (a flipped
bit inside tensor data loads as a silently changed weight), so :func:`load_checkpoint` verifies
them first (:mod:`nmt.utils.zip_crc`; one pass over the file) and :func:`save_checkpoint` always
writes them.

Training (``nmt.train``: where and when checkpoints are written) and decoding
(``nmt.translate.loading``: rebuilding a model) both use this module; it imports no domain
part of nmt.
"""
from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import torch

from nmt.utils.io import atomic_open
from nmt.utils.zip_crc import zip_crc_problem

FORMAT_VERSION = 1
PAYLOAD_KEYS = ("format_version", "nmt_version", "model", "optimizer", "scheduler", "step", "epoch", "rng",
                "config", "src_field", "tgt_field", "metrics", "trainer")
MODEL_KEYS = ("format_version", "nmt_version", "kind", "model", "config", "src_field", "tgt_field")
"""A released model (``kind: "model"``, written by ``nmt-release`` / ``nmt-average``): weights,
fields and config, what translation needs; training checkpoints have no ``kind`` (or ``"training"``)."""


class CheckpointError(RuntimeError):
    """A one-line error naming the checkpoint file: missing, unreadable or another format."""


class DamagedCheckpointError(CheckpointError):
    """The file is damaged: truncated, not a ``torch.save`` archive, a record failing its CRC-32
    check (a flipped bit), failing to unpickle, not an nmt checkpoint dict, or missing payload keys.
    A resume passes over such a file to an older
    checkpoint; the other CheckpointErrors (missing file, a directory, another format version, a
    released model) are not damage and are not passed over."""


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (temp file in the same dir + os.replace).

    ``format_version`` and ``nmt_version`` are filled in when absent.
    """
    from nmt._version import __version__

    payload = {"format_version": FORMAT_VERSION, "nmt_version": __version__, **payload}
    crc_was = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(True)  # load_checkpoint verifies them
    try:
        with atomic_open(path, "wb") as handle:
            torch.save(payload, handle)
    finally:
        torch.serialization.set_crc32_options(crc_was)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    training: bool = True) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (``weights_only=True``).

    training=True (resume) needs a training checkpoint; training=False (decoding, averaging)
    also accepts a released model (:data:`MODEL_KEYS`). Raises CheckpointError (one line,
    names the file) when it is missing, corrupt (a record failing its CRC-32 included), not an nmt
    checkpoint, of another format
    version, a released model where training state is needed, or lacks one of its keys; the
    subclass DamagedCheckpointError where the file itself is damaged (see there).
    """
    path = Path(path)
    if path.is_dir():  # a run directory: say which file to name (best.pt, or last.pt before a validation)
        held = next((path / name for name in ("best.pt", "last.pt") if (path / name).is_file()), None)
        hint = "" if held is None else f" (name one of its checkpoints, e.g. {held})"
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file{hint}")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:  # not readable (permissions) is not damage: is_zipfile would say False
        open(path, "rb").close()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if not zipfile.is_zipfile(path):  # torch.load's own error is unpickling advice, or "KeyError: 101"
        raise DamagedCheckpointError(f"{path}: not a readable nmt checkpoint (not a torch.save archive: another kind of file, "
                              "or truncated)")
    try:
        problem = zip_crc_problem(path)
    except (OSError, MemoryError) as exc:  # as for torch.load below: not damage
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise CheckpointError(f"{path}: cannot be read ({reason})") from None
    if problem is not None:
        raise DamagedCheckpointError(f"{path}: damaged: {problem} (a bit flip or a partial overwrite of the file)")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except (OSError, MemoryError) as exc:  # the file could not be read now (EIO, no memory): not damage, which
        # a resume would pass over to an older checkpoint and then replace last.pt with that one
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise CheckpointError(f"{path}: cannot be read ({reason})") from None
    except Exception as exc:  # torch raises many types for corrupt / foreign files
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DamagedCheckpointError(f"{path}: not a readable nmt checkpoint ({type(exc).__name__}: "
                                     f"{detail[:200]})") from None
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise DamagedCheckpointError(f"{path}: not an nmt checkpoint (no format_version)")
    version = payload["format_version"]
    if type(version) is not int or version != FORMAT_VERSION:  # noqa: E721 (True == 1, "1" printed as 1)
        writer = payload.get("nmt_version")
        by = f" (written by nmt {writer})" if isinstance(writer, str) else ""
        newer = "; a newer nmt wrote it" if type(version) is int and version > FORMAT_VERSION else ""
        raise CheckpointError(f"{path}: checkpoint format version {version!r}{by} "
                              f"is not supported (this nmt reads version {FORMAT_VERSION}{newer})")
    kind = payload.get("kind", "training")
    if kind not in ("training", "model"):
        raise CheckpointError(f"{path}: unknown checkpoint kind {kind!r}")
    if kind == "model" and training:
        raise CheckpointError(f"{path}: a released model (no optimizer state), not a training checkpoint")
    missing = [k for k in (PAYLOAD_KEYS if kind == "training" else MODEL_KEYS) if k not in payload]
    if missing:
        raise DamagedCheckpointError(f"{path}: incomplete checkpoint, missing {', '.join(missing)}")
    return payload


__all__ = ["FORMAT_VERSION", "PAYLOAD_KEYS", "MODEL_KEYS", "CheckpointError", "DamagedCheckpointError",
           "save_checkpoint", "load_checkpoint"]
