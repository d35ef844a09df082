"""A cheap content fingerprint of a (possibly multi-GB) file, and what differs between two.

``fingerprint(path)`` reads at most ``2 * EDGE + SAMPLES * BLOCK`` bytes (about 2.1 MiB) however
large the file: its size, a hash of its first and of its last MiB, and a hash of ``SAMPLES``
blocks at evenly spaced offsets in between. That catches what happens to a training corpus
between a killed run and its resume: another corpus (first MiB), appended or removed lines and
re-tokenization (size, last MiB), and most in-place edits of the same size (sampled blocks); a
file of at most 2 MiB is hashed whole. An edit of the same size that falls outside every hashed
byte goes unseen: the price of not reading the whole corpus.

The modification time is recorded (for the message) but never compared: a copy of the same data
onto another machine, or a ``touch``, changes it without changing a byte.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any

FINGERPRINT_VERSION = 1
EDGE = 1 << 20  # bytes hashed at each end
SAMPLES = 16  # blocks sampled between the two ends
BLOCK = 4096


def _digest(handle, offset: int, length: int) -> str:
    handle.seek(offset)
    return hashlib.sha256(handle.read(length)).hexdigest()[:32]


def fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """``{"version", "size", "mtime_ns", "head", "tail", "sample"}`` of ``path`` (OSError when unreadable)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        mtime_ns = os.fstat(handle.fileno()).st_mtime_ns
        head = _digest(handle, 0, EDGE)
        tail = _digest(handle, max(size - EDGE, 0), EDGE)
        sample = hashlib.sha256()
        middle = size - 2 * EDGE  # bytes neither end covers
        if 0 < middle <= SAMPLES * BLOCK:  # hashed whole
            handle.seek(EDGE)
            sample.update(handle.read(middle))
        elif middle > 0:
            for i in range(SAMPLES):  # the first and the last block of the middle, and evenly between
                handle.seek(EDGE + (middle - BLOCK) * i // (SAMPLES - 1))
                sample.update(handle.read(BLOCK))
    return {"version": FINGERPRINT_VERSION, "size": size, "mtime_ns": mtime_ns, "head": head, "tail": tail,
            "sample": sample.hexdigest()[:32]}


def describe_change(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """What differs between two fingerprints of a file, in words (None: no difference seen).

    e.g. ``size 1200 -> 1350 bytes``, ``same size, other content in its first MiB``."""
    if old.get("version") != new.get("version"):
        return None  # another way of fingerprinting: nothing to compare
    if old["size"] != new["size"]:
        return f"size {old['size']} -> {new['size']} bytes"
    places = [where for key, where in (("head", "first MiB"), ("sample", "middle (sampled blocks)"),
                                       ("tail", "last MiB")) if old[key] != new[key]]
    if not places:
        return None
    return f"same size ({new['size']} bytes), other content in its {' and '.join(places)}"


__all__ = ["FINGERPRINT_VERSION", "describe_change", "fingerprint"]
