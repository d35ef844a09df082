"""An LSTM cell's element-wise update for CPU inference in one native pass (``_lstm_cell.c``).

:func:`~nmt.models.lstm_gates.cell_update` takes one sigmoid and five element-wise operations
over the gates; in the middle of a decoding step each costs more than its arithmetic (its
dispatch, its code and data cold after the step's products): measured in greedy decoding of
test_2016_flickr (Intel Xeon, 2 threads) 60-70 us per call at (64, 4 x 256) and (2 x 64, 4 x 128),
some 640 calls in the encoder and 470 in the decoder. :func:`lstm_cell` makes the whole update
in one pass, with its own vectorised ``exp`` (within 2 ulp; outputs ~1e-7 from torch's), on
float32 CPU tensors; the torch operations stay the reference and serve every other case.

The library is built on first use like the mappings' (:func:`nmt.sparse._native.build`: the
system's C compiler, ``$NMT_CACHE_DIR``, atomic writes; ``NMT_NATIVE=0`` or no compiler: the torch
operations run). No device is involved; rows split over torch's threads from
:data:`THREADS_MIN_NUMEL` entries.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from nmt.sparse import _native

SOURCE = Path(__file__).with_name("_lstm_cell.c")
THREADS_MIN_NUMEL = 1 << 14
"""Cells of at least this many units (rows x hidden) split their rows over torch's threads."""

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURE = [_P, _P, _I64, _I64, _I64, _P, _I64, _I64, _I64, _P, _I64, _P, _I64, _INT]

_LIBRARY = _native.NativeLibrary((SOURCE,), "lstm_cell", {"nmt_lstm_cell_f32": (_SIGNATURE, None)}, "LSTM cell")
build, load, library, _state = _LIBRARY.build, _LIBRARY.load, _LIBRARY.library, _LIBRARY.state
"""The library's :class:`~nmt.sparse._native.NativeLibrary` methods: ``build(directory, defines)``,
``load(path)``, ``library()`` (built on first use; None when disabled or where it cannot be built)."""


def _rows(t: Tensor, width: int) -> int:
    """The row stride of ``t`` viewed as rows of ``width`` contiguous entries, or -1 where it has no such view."""
    if t.size(-1) != width:
        return -1
    if t.is_contiguous():
        return width
    if t.stride(-1) != 1:
        return -1
    if t.dim() == 2:
        return t.stride(0)
    stride = t.stride(-2)
    for d in range(t.dim() - 3, -1, -1):  # outer dims must nest as one run of rows
        if t.stride(d) != stride * t.size(d + 1) and t.size(d) > 1:
            return -1
    return stride


def _blocks(add: Tensor, rows: int) -> Optional[tuple[int, int, int]]:
    """``(block, outer, inner)`` locating row r of ``add`` (..., 4H) at (r // block) * outer +
    (r % block) * inner entries (2 or 3 dims, last one contiguous), or None."""
    if add.stride(-1) != 1:
        return None
    if add.dim() == 2:
        return rows, 0, add.stride(0)
    if add.dim() == 3:
        return add.size(1), add.stride(0), add.stride(1)
    return None


def lstm_cell(gates: Tensor, c: Tensor, c_out: Tensor, h_out: Tensor, add: Optional[Tensor] = None) -> bool:
    """Write the new cell and hidden states of ``gates`` (..., 4H) in sigmoid form (contiguous; plus
    ``add`` of the same shape where given, e.g. a strided time step of input products) and ``c``
    (..., H) into ``c_out`` and ``h_out`` (..., H); ``c`` and the outputs may be strided by rows
    (each row's H entries contiguous, e.g. one layer of a (N, layers, H) state). float32 CPU
    tensors, no gradient. Returns False (nothing written) where the library is unavailable or the
    layouts do not fit; the caller then runs the torch operations."""
    hidden = c.size(-1)
    f32 = torch.float32
    if (gates.dtype != f32 or c.dtype != f32 or c_out.dtype != f32 or h_out.dtype != f32
            or gates.device.type != "cpu" or not gates.is_contiguous() or gates.size(-1) != 4 * hidden):
        return False
    lib = library()
    size = gates.numel() // 4  # rows x hidden
    rows = size // hidden if hidden else 0
    c_rows, c_out_rows, h_out_rows = _rows(c, hidden), _rows(c_out, hidden), _rows(h_out, hidden)
    if (lib is None or min(c_rows, c_out_rows, h_out_rows) < 0 or c.numel() != size or c_out.numel() != size
            or h_out.numel() != size):
        return False
    blocks = (1, 0, 0)
    if add is not None:
        found = _blocks(add, rows) if add.dtype == torch.float32 and add.shape == gates.shape else None
        if found is None:
            return False
        blocks = found
    if rows:
        threads = torch.get_num_threads() if size >= THREADS_MIN_NUMEL else 1
        lib.nmt_lstm_cell_f32(gates.data_ptr(), None if add is None else add.data_ptr(), *blocks, c.data_ptr(),
                              c_rows, rows, hidden, c_out.data_ptr(), c_out_rows, h_out.data_ptr(), h_out_rows,
                              threads)
    return True


__all__ = ["SOURCE", "THREADS_MIN_NUMEL", "build", "library", "lstm_cell", "load"]
