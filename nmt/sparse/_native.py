"""The native sorted threshold (``_sorted_threshold.c``): built on first use, called through ctypes.

Attention-sized inputs are bound by per-operation overhead: the NumPy solve of
:func:`nmt.sparse._threshold._numpy_sorted_shifted_threshold` makes some twenty array operations,
the C loop one pass per row that sorts only the entries that can be in the support. Same
arithmetic, same bits (tested against the NumPy and torch paths).

The library is compiled once per source version with the system's C compiler (``$CC``, else
``cc`` or ``gcc``; ``-O2 -ffp-contract=off``, no other dependency) into
``$NMT_CACHE_DIR`` (default ``$XDG_CACHE_HOME/nmt`` or ``~/.cache/nmt``), written atomically
(a temporary name, then a rename; the file mode follows the umask) so that concurrent processes
(data-parallel ranks) may build it at once. Without a compiler, or with ``NMT_NATIVE=0``, nothing
is built and :func:`native_sorted_shifted_threshold` returns None: the callers keep the NumPy path.
A failed build is logged once (INFO) and not retried in that process.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("_sorted_threshold.c")
CFLAGS = ("-O2", "-shared", "-fPIC", "-ffp-contract=off", "-std=c99")
"""Compiler flags: no contraction of products and sums into FMAs (the other paths round each
operation), no fast-math."""

_FUNCTIONS = {torch.float32: "nmt_sorted_threshold_f32", torch.float64: "nmt_sorted_threshold_f64"}
_ARGTYPES = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_double,
             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

logger = logging.getLogger(__name__)
_state: dict[str, object] = {}  # "lib": the loaded CDLL or None once decided


def enabled() -> bool:
    """Whether the native path may be used (``NMT_NATIVE`` unset or not "0")."""
    return os.environ.get("NMT_NATIVE", "1") != "0"


def cache_dir() -> Path:
    """Where built libraries are kept: ``$NMT_CACHE_DIR``, else ``$XDG_CACHE_HOME/nmt``, else
    ``~/.cache/nmt``."""
    if os.environ.get("NMT_CACHE_DIR"):
        return Path(os.environ["NMT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nmt"


def _compiler() -> Optional[str]:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build(directory: Optional[Path] = None) -> Path:
    """Compile the library into ``directory`` (default :func:`cache_dir`) unless a build of this
    source with this compiler is there; returns its path. Raises OSError / CalledProcessError /
    RuntimeError (no compiler) on failure."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C compiler found ($CC, cc, gcc)")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, compiler.encode(), " ".join(CFLAGS).encode(),
                                     platform.machine().encode()])).hexdigest()[:16]
    directory = Path(directory) if directory is not None else cache_dir()
    target = directory / f"sorted_threshold-{key}.so"
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{target.name}.{os.getpid()}.partial"
    try:
        subprocess.run([compiler, *CFLAGS, "-o", str(partial), str(SOURCE), "-lm"], check=True,
                       capture_output=True, timeout=120)
        os.replace(partial, target)  # atomic: another process may have renamed its own build there
    finally:
        partial.unlink(missing_ok=True)
    return target


def library() -> Optional[ctypes.CDLL]:
    """The loaded library, building it on first use; None when disabled or where it cannot be
    built or loaded (decided once per process)."""
    if "lib" in _state:
        return _state["lib"]  # type: ignore[return-value]
    lib = None
    if enabled():
        try:
            lib = ctypes.CDLL(str(build()))
            for name in _FUNCTIONS.values():
                getattr(lib, name).argtypes = _ARGTYPES
                getattr(lib, name).restype = None
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            logger.info("native sorted threshold unavailable (the NumPy path is used): %s %s", exc,
                        detail.decode(errors="replace")[:200])
            lib = None
    _state["lib"] = lib
    return lib


def native_sorted_shifted_threshold(z: Tensor, q: float, scale: float) -> Optional[tuple[Tensor, Tensor]]:
    """``(tau_rel, zmax)``, each ``(R, 1)`` of ``z``'s dtype, for the rows ``z: (R, n)`` (CPU,
    float32 or float64, any strides; detached), exactly as
    :func:`nmt.sparse._threshold._numpy_sorted_shifted_threshold` computes them; None when the
    library is unavailable. Reads ``z`` on the host (a CPU tensor: no device involved), one thread."""
    lib = library()
    if lib is None or q not in (1.0, 2.0) or z.dtype not in _FUNCTIONS:
        return None
    rows, n = z.shape
    z = z.contiguous()
    # separate storages: the results may leave a custom operator, whose outputs must not alias
    tau, zmax = torch.empty(rows, 1, dtype=z.dtype), torch.empty(rows, 1, dtype=z.dtype)
    scratch = torch.empty(2 * n, dtype=z.dtype)
    getattr(lib, _FUNCTIONS[z.dtype])(z.data_ptr(), rows, n, int(q), float(scale), tau.data_ptr(),
                                      zmax.data_ptr(), scratch.data_ptr())
    return tau, zmax


__all__ = ["CFLAGS", "SOURCE", "build", "cache_dir", "enabled", "library", "native_sorted_shifted_threshold"]
