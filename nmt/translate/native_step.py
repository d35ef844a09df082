"""A beam search step's bookkeeping after its candidates, in one native call (``_step_update.c``).

Once the native pass has read a step's log-probabilities (:func:`nmt.sparse._native.step_candidates`:
the best candidates and the support statistics), :func:`~nmt.translate.search_step.select_step`
still turns them into parents and tokens, records the certificate's violations, keeps the best
finished hypotheses and decides which sentences may stop: some forty operations on (R,) and
(R, K) tensors, each costing its dispatch rather than its arithmetic, and more in the middle of a
decoding step, whose weights have just streamed through the caches (measured on greedy
test_2016_flickr, Intel Xeon, 2 threads: ``select_step`` 77 -> 41 ms over its 235 steps, the native
candidates pass included).
:func:`step_update` makes the same computation row by row in C: the same values in the same
type, bit for bit (the tests run both on random steps with every option). CPU tensors only;
the torch code stays the reference and serves every other case.

The library is built on first use like the mappings' (:func:`nmt.sparse._native.build`: the
system's C compiler, ``$NMT_CACHE_DIR``, atomic writes; ``NMT_NATIVE=0`` or no compiler: None,
the torch code runs). No device is involved.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from nmt.sparse import _native

SOURCE = Path(__file__).with_name("_step_update.c")
MAX_BEST = 256
"""``n_best + beam_size`` may not exceed this (``NMT_MAX_BEST`` in the C file)."""

_FUNCTIONS = {torch.float32: "nmt_step_update_f32", torch.float64: "nmt_step_update_f64"}
_P, _I64, _INT, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
_SIGNATURE = [_I64, _I64, _I64, _I64, _I64, _I64, _I64, _INT, _D, _D, _I64, _I64, *([_P] * 17)]

_LIBRARY = _native.NativeLibrary((SOURCE,), "step_update",
                                {name: (_SIGNATURE, ctypes.c_int) for name in _FUNCTIONS.values()},
                                "search step", openmp=False)
build, load, library, _state = _LIBRARY.build, _LIBRARY.load, _LIBRARY.library, _LIBRARY.state
"""The library's :class:`~nmt.sparse._native.NativeLibrary` methods (one thread, no OpenMP):
``build(directory)``, ``load(path)``, ``library()`` (built on first use; None when disabled or where
it cannot be built)."""


class StepUpdate(NamedTuple):
    """What :func:`step_update` returns (R rows, K = beam size)."""

    score: Tensor  # (R, K) the kept candidates' scores (finished ones included)
    live: Tensor  # (R, K) the same, -inf where the token is EOS: the live prefixes
    parent: Tensor  # (R, K) long slot extended
    token: Tensor  # (R, K) long token appended
    exact: Tensor  # (R,) bool certificate after the step
    reason: Tensor  # (R,) long first violation
    best_finished: Tensor  # (R, n_best) ranking scores of the best finished hypotheses, descending
    top_finished: Tensor  # (R,) bool
    done: Tensor  # (R,) bool the sentence may stop


def step_update(top_scores: Tensor, top_index: Tensor, prev_scores: Tensor, unknown: Tensor, exact: Tensor,
                reason: Tensor, best_finished: Tensor, top_finished: Tensor, *, beam_size: int, vocab: int,
                eos: int, certify: bool, penalty: float, bound_penalty: float, nonfinite_code: int,
                pruned_code: int) -> Optional[StepUpdate]:
    """The step's bookkeeping (see ``_step_update.c`` for the definition) from its candidates
    ``top_scores, top_index: (R, W)`` (W = beam_size, or beam_size + 1 with a certificate), the
    scores of the prefixes before it ``prev_scores: (R, S)``, their slots' ``unknown: (R, S)`` bool
    (NaN or ``+inf`` log-probabilities) and the rows' ``exact``, ``reason``, ``best_finished``
    (R, n_best) and ``top_finished``; ``penalty``: the length penalty of a hypothesis finishing
    at this step, ``bound_penalty``: that of the longest. CPU tensors, float32/64 scores. New
    tensors (the inputs are not written); None where the library is unavailable or the sizes are
    out of its range (W < K, W > K + 1, n_best + K > :data:`MAX_BEST`)."""
    lib = library()
    dtype = top_scores.dtype
    rows, width = top_scores.shape
    slots = prev_scores.size(1)
    n_best = best_finished.size(1)
    if (lib is None or dtype not in _FUNCTIONS or prev_scores.dtype != dtype or best_finished.dtype != dtype
            or not beam_size <= width <= beam_size + 1 or n_best + beam_size > MAX_BEST
            or not unknown.dtype == exact.dtype == top_finished.dtype == torch.bool):  # bools are read as bytes
        return None
    floats = torch.empty(2, rows, beam_size, dtype=dtype)
    longs = torch.empty(2, rows, beam_size, dtype=torch.long)
    flags = torch.empty(3, rows, dtype=torch.bool)
    new_reason = torch.empty(rows, dtype=torch.long)
    new_best = torch.empty(rows, n_best, dtype=dtype)
    inputs = [t.contiguous() for t in (prev_scores, unknown, top_scores, top_index, exact, reason, best_finished,
                                        top_finished)]
    block = rows * beam_size  # entries of one (R, K) output
    f, i, b = floats.data_ptr(), longs.data_ptr(), flags.data_ptr()
    status = getattr(lib, _FUNCTIONS[dtype])(
        rows, slots, beam_size, width, n_best, vocab, eos, int(certify), float(penalty), float(bound_penalty),
        nonfinite_code, pruned_code, *(t.data_ptr() for t in inputs), f, f + block * floats.element_size(),
        i, i + block * 8, b, new_reason.data_ptr(), new_best.data_ptr(), b + rows, b + 2 * rows)
    if status != 0:
        return None
    score, live = floats.unbind(0)
    parent, token = longs.unbind(0)
    new_exact, new_top, done = flags.unbind(0)
    return StepUpdate(score, live, parent, token, new_exact, new_reason, new_best, new_top, done)


__all__ = ["MAX_BEST", "SOURCE", "StepUpdate", "build", "library", "load", "step_update"]
