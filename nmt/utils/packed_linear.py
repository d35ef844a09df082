"""Linear layers for CPU inference through oneDNN with weights packed once (or MKL, by the rows).

``torch.nn.functional.linear`` on the CPU calls MKL's ``sgemm``, which repacks the weight at every
call and, on AMD processors, runs its AVX2 kernels. oneDNN's inner-product primitive takes a
weight reordered once into its blocked layout and uses the processor's widest vectors. Measured
on the project's 2-core AMD EPYC machines (float32, 2 threads; ``tools/bench_translate.py``):
the decoder's products take 0.55-0.65x the time, e.g. (64, 256) x (256, 3963) 1.12 -> 0.70 ms and
(900, 256) x (256, 3963) 20 -> 11.8 ms.

:func:`linear` (and the decoder's LSTM cells, through :func:`frozen_cached`) use it inside
:func:`frozen_weights` (a region where the caller promises the weights do not change: a search, a
validation pass) when nothing needs a gradient, the input is a float32 CPU tensor, oneDNN is
built in, ``torch.compile`` is not tracing and CPU autocast is off; otherwise they are
``F.linear``. Results equal ``F.linear`` up to rounding (a different summation order: relative
differences around 1e-6 in float32). The packed
weights (one extra copy of each) live while the outermost region lasts; a weight that changes in
place inside it is repacked when its version moves (``load_state_dict`` and the plain optimisers
bump it; the fused ones do not, hence the region). They never enter a ``state_dict``.
``NMT_ONEDNN=0`` turns the path off. No host synchronisation (CPU only).

Training packs its weights once per forward pass (:func:`trainable`, :class:`PackedLinearFunction`,
the recurrent step products) where that pays: on the AMD machines above, and not on Intel
processors, where MKL runs its own widest kernels and the packing (twice per weight and step)
costs more than it saves: the LSTM of ``configs/multi30k_lstm.yaml`` trained at 6,263 target
tokens/s without the packing and 5,776 with it on an Intel Xeon (AVX-512, 2 threads).
``NMT_ONEDNN_TRAIN=1`` / ``0`` overrides the choice (:data:`TRAIN_PACKING`). Decoding prepares its
weights once per search (:class:`FrozenWeight`) and sends to oneDNN the products of at least
:data:`DECODE_MIN_ROWS` rows: all of them on AMD processors, from 256 rows on Intel's, where
oneDNN's kernel creation for each new number of rows costs more than it saves below that
(``NMT_ONEDNN_MIN_ROWS`` overrides); and on any processor only products of at least
:data:`DECODE_MIN_MACS` multiply-adds (below that oneDNN's per-call cost exceeds MKL's).
"""
from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.utils.int8_linear import Int8Weight, int8_active

_CACHE: dict[int, dict[str, tuple[tuple, Any]]] = {}
"""id(first weight) -> {tag: (signature, value)} (:func:`frozen_cached`); entries leave with their weight."""
_WATCHED: set[int] = set()
"""ids of the weights with a finalizer that forgets them."""


def _forget(key: int) -> None:
    _CACHE.pop(key, None)
    _WATCHED.discard(key)


def _onednn_built() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and os.environ.get("NMT_ONEDNN", "1") != "0")


_BUILT = _onednn_built()
_REGION = threading.local()


def cpu_vendor() -> str:
    """The processor's vendor string (``GenuineIntel``, ``AuthenticAMD``, ...) from
    ``/proc/cpuinfo``; "" where it cannot be read (not Linux, not x86)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _train_packing(environ: Optional[Mapping[str, str]] = None, vendor: Optional[str] = None) -> bool:
    """Whether training packs weights for oneDNN: ``NMT_ONEDNN_TRAIN`` ("0" no, anything else
    yes) where set in ``environ`` (default ``os.environ``), else on every processor but Intel's
    (``vendor``, default :func:`cpu_vendor`; see the module docstring)."""
    environ = os.environ if environ is None else environ
    if "NMT_ONEDNN_TRAIN" in environ:
        return environ["NMT_ONEDNN_TRAIN"] != "0"
    return (cpu_vendor() if vendor is None else vendor) != "GenuineIntel"


TRAIN_PACKING = _train_packing()
"""Training's products pack their weights for oneDNN (:func:`trainable`); decided once per process."""

INTEL_MIN_ROWS = 256
""":data:`DECODE_MIN_ROWS` on Intel processors (see :class:`FrozenWeight`)."""


def _decode_min_rows(environ: Optional[Mapping[str, str]] = None, vendor: Optional[str] = None) -> int:
    """The fewest rows for which a frozen region's product runs on oneDNN (:class:`FrozenWeight`):
    ``NMT_ONEDNN_MIN_ROWS`` (a positive integer) where set in ``environ`` (default ``os.environ``),
    else :data:`INTEL_MIN_ROWS` on Intel processors (``vendor``, default :func:`cpu_vendor`) and 1
    (always oneDNN) on the others. Any other value of the variable is a ValueError naming it."""
    environ = os.environ if environ is None else environ
    if "NMT_ONEDNN_MIN_ROWS" in environ:
        text = environ["NMT_ONEDNN_MIN_ROWS"]
        value = int(text) if text.strip().isdigit() else 0
        if value < 1:
            raise ValueError(f"NMT_ONEDNN_MIN_ROWS must be a positive integer, got {text!r}")
        return value
    return INTEL_MIN_ROWS if (cpu_vendor() if vendor is None else vendor) == "GenuineIntel" else 1


DECODE_MIN_ROWS = _decode_min_rows()
"""A frozen region's products (:class:`FrozenWeight`) of at least this many rows (and
:data:`DECODE_MIN_MACS` multiply-adds) run on oneDNN, smaller ones on MKL; decided once per process."""

DECODE_MIN_MACS = 1 << 19
"""A frozen region's products of fewer multiply-adds (rows x O x I) run on MKL on any processor:
oneDNN's inner product costs about 17-22 us a call whatever its size below that, MKL's ``addmm``
4 us for one row of (256, 256) and 10-13 us for one row of (768, 256), (1024, 256) or (256, 1024)
(AMD EPYC, 2 threads; the two are even near 2^18.5 multiply-adds, and oneDNN ahead from 2^19: one
row of a (3963, 256) output layer 44 against 56 us). A decoder's single-sentence tail steps are
made of such products."""


class FrozenWeight:
    """A weight ``W`` (O, I) for the products of a :func:`frozen_weights` region, called as
    ``frozen(x, bias)`` = ``x @ W^T (+ bias)`` for x (..., I): oneDNN's inner product on a copy
    packed when first needed, for inputs of at least :data:`DECODE_MIN_ROWS` rows; below that,
    MKL's ``addmm`` on a transposed copy (I, O), likewise made when first needed (so a weight
    holds one extra copy where one route serves it). Products of fewer than
    :data:`DECODE_MIN_MACS` multiply-adds take MKL on any processor.

    oneDNN creates a primitive for every new number of rows: on an Intel Xeon (AVX-512, 2 threads)
    0.7-5 ms for a shape's first call and often as much again for its second, at the decoder's
    (256, 3963) and (512, 1024) weights; a decoding loop's shrinking batches meet a dozen row
    counts per weight. Once created, oneDNN is 6-22% faster from 32 rows, while MKL, which
    creates nothing, is as fast or up to 26% faster at 1-16 rows. On AMD processors oneDNN
    takes 0.55-0.65x MKL's time at every number of rows (hence 1 there) once a product reaches
    :data:`DECODE_MIN_MACS` multiply-adds; below that its per-call cost makes MKL faster.
    Results equal ``F.linear`` up to rounding on either path. Inside an
    :func:`nmt.utils.int8_linear.int8_products` region (``-precision int8``) every product is
    int8 instead (:class:`~nmt.utils.int8_linear.Int8Weight`, quantized when first needed: within
    its stated error of ``F.linear``). No autograd, no host
    synchronisation."""

    __slots__ = ("_weight", "_packed", "_transposed", "_row_macs", "_int8")

    def __init__(self, weight: Tensor) -> None:
        self._weight = weight.detach()
        self._packed: Optional[Tensor] = None  # oneDNN's layout
        self._transposed: Optional[Tensor] = None  # (I, O): MKL's sgemm without a transpose
        self._row_macs = weight.numel()  # multiply-adds per row of input
        self._int8: Optional[Int8Weight] = None  # made when first needed in an int8 region

    def __call__(self, x: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        if int8_active():  # -precision int8: every product in int8, faster at every size measured
            if self._int8 is None:
                self._int8 = Int8Weight(self._weight)
            return self._int8(x, bias)
        width = x.shape[-1]
        rows = x.numel() // width if width else 0
        if rows >= DECODE_MIN_ROWS and rows * self._row_macs >= DECODE_MIN_MACS:
            if self._packed is None:
                self._packed = pack(self._weight)
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, bias, "none", [], "")
        if self._transposed is None:
            self._transposed = self._weight.t().contiguous()
        x2 = x.reshape(-1, width)
        out = torch.mm(x2, self._transposed) if bias is None else torch.addmm(bias, x2, self._transposed)
        return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])


@contextlib.contextmanager
def frozen_weights() -> Iterator[None]:
    """A region in which the packed path may serve the linear layers: the caller promises that no
    weight changes inside it (decoding, validation). Nestable; the outermost exit drops the
    packed weights."""
    depth = getattr(_REGION, "depth", 0)
    _REGION.depth = depth + 1
    try:
        yield
    finally:
        _REGION.depth = depth
        if depth == 0:
            _CACHE.clear()


def in_frozen_region() -> bool:
    """Whether a :func:`frozen_weights` region is open (its :func:`frozen_cached` values persist)."""
    return bool(getattr(_REGION, "depth", 0))


def _servable(*tensors: Optional[Tensor]) -> bool:
    """Whether oneDNN's products may serve these tensors at all: oneDNN built in, every given
    tensor float32 on the CPU, ``torch.compile`` not tracing, CPU autocast off."""
    return (_BUILT and all(t is None or (t.device.type == "cpu" and t.dtype == torch.float32) for t in tensors)
            and not torch.compiler.is_compiling() and not torch.is_autocast_enabled("cpu"))


def trainable(*tensors: Optional[Tensor]) -> bool:
    """Whether training packs these tensors' products for oneDNN (:data:`TRAIN_PACKING` and
    oneDNN may serve them). Training callers pack once per forward pass (:func:`pack`,
    :func:`product`, :class:`PackedLinearFunction`)."""
    return TRAIN_PACKING and _servable(*tensors)


def _frozen_unrecorded(x: Tensor, *params: Optional[Tensor]) -> bool:
    """Whether a :func:`frozen_weights` region is open and autograd records nothing of ``x`` and
    these weights/biases (no gradient enabled, or none of them needs one)."""
    if not in_frozen_region():
        return False
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, *params)))


def usable(x: Tensor, *params: Optional[Tensor]) -> bool:
    """Whether the cached packed path serves ``x`` with these weights/biases: inside a
    :func:`frozen_weights` region, nothing needing a gradient, and oneDNN may serve them."""
    return _frozen_unrecorded(x, *params) and _servable(x, *params)


def pack(weight: Tensor) -> Tensor:
    """``weight`` (O, I) reordered for oneDNN's products (an opaque tensor; no gradient)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


def product(x: Tensor, packed: "Tensor | FrozenWeight", bias: Optional[Tensor] = None) -> Tensor:
    """``x @ W^T (+ bias)`` for x (..., I) and ``packed = pack(W)`` (training's products) or a
    :class:`FrozenWeight` of W (a frozen region's): (..., O). No autograd."""
    if type(packed) is FrozenWeight:
        return packed(x, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinearFunction(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` for training through oneDNN: the forward and the input
    gradient ``g W`` are packed products (the weight packed once in each direction), the weight
    gradient ``g^T x`` and the bias gradient are plain (MKL's ``g^T x`` is the faster one here).
    Measured at (900, 256) x (256, 3963): forward 20 -> 12 ms, input gradient 13 -> 11 ms."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return product(x, pack(weight), None if bias is None else bias.detach())

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = product(grad, pack(weight.t()))
        g2 = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[1]:
            gw = g2.t().mm(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


TRAIN_MIN_NUMEL = 1 << 18
"""Smallest weight that :func:`train_linear` packs when training (it packs at every call): measured
fwd+bwd at 900 rows, (256, 1024) 1.34x faster, (1024, 256) 1.04x, (256, 256) 0.87x (slower)."""


def train_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear`` for any mode: the packed region path without gradients (:func:`linear`),
    :class:`PackedLinearFunction` with gradients where :func:`trainable` allows and the weight has
    at least ``TRAIN_MIN_NUMEL`` entries (over the rows of ``x``, its output an ordinary view that
    in-place operations may modify), else ``F.linear``."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        if weight.numel() >= TRAIN_MIN_NUMEL and trainable(x, weight):
            # the Function sees rows (N, I) -> (N, O) and the reshape stays outside it: oneDNN's
            # output for (..., I) is a view of its 2-D result, and a view made inside a custom
            # Function may not be modified in place (the feed-forward's in-place ReLU)
            out = PackedLinearFunction.apply(x.reshape(-1, x.size(-1)), weight, bias)
            return out.view(*x.shape[:-1], weight.size(0))
        return F.linear(x, weight, bias)
    return linear(x, weight, bias)


def _signature(tensors: Sequence[Optional[Tensor]]) -> tuple:
    """Each tensor's identity, storage address, in-place version and shape (``torch.Size`` is a
    tuple: compared as is, not copied); None for None. Built as a list comprehension, without the
    generator a ``tuple(...)`` of one would resume once per tensor."""
    return tuple([None if t is None else (id(t), t.data_ptr(), t._version, t.shape) for t in tensors])


Value = TypeVar("Value")


def frozen_cached(tag: str, tensors: Sequence[Optional[Tensor]], build: Callable[[], Value]) -> Value:
    """``build()``, a value derived from ``tensors`` (weights), computed once per version of them
    while the outermost :func:`frozen_weights` region lasts, kept under ``tag`` and the first
    tensor; outside a region computed at every call. While ``torch.compile`` traces, computed too
    (in the graph): a traced cache lookup would guard on the cached tensors' versions, which an
    in-place change between regions (``training.ema``'s swap at each validation) bumps, so every
    validation would recompile."""
    if not in_frozen_region() or torch.compiler.is_compiling():
        return build()
    key = id(tensors[0])
    sig = _signature(tensors)
    entries = _CACHE.get(key)
    if entries is None:
        entries = _CACHE[key] = {}
    else:
        hit = entries.get(tag)
        if hit is not None and hit[0] == sig:
            return hit[1]
    value = build()
    if key not in _WATCHED:  # a new weight: drop its entries when it is freed (ids are reused)
        _WATCHED.add(key)
        weakref.finalize(tensors[0], _forget, key)
    entries[tag] = (sig, value)
    return value


def _frozen(weight: Tensor, bias: Optional[Tensor]) -> tuple[FrozenWeight, Optional[Tensor]]:
    """``weight`` as a :class:`FrozenWeight` and ``bias`` detached, built once per version of them
    (in a region)."""
    return frozen_cached("linear", [weight, bias],
                         lambda: (FrozenWeight(weight), None if bias is None else bias.detach()))


def frozen_linear(tag: str, x: Tensor, params: Sequence[Tensor],
                  build: Callable[[], tuple[Tensor, Optional[Tensor]]]) -> Optional[Tensor]:
    """``x @ W^T (+ b)`` for a weight and bias ``(W, b) = build()`` derived from ``params`` (e.g.
    concatenated or rescaled weights), built once per version of ``params`` while the outermost
    :func:`frozen_weights` region lasts (under ``tag``); through a :class:`FrozenWeight` where
    oneDNN / MKL may serve it (float32 on the CPU), else ``F.linear`` (any device and dtype).
    Returns None where no frozen region serves ``x``: outside a region, under ``torch.compile``, or
    where autograd records (``x`` or a parameter needs a gradient). x: (..., I) -> (..., O)."""
    if torch.compiler.is_compiling() or not _frozen_unrecorded(x, *params):
        return None
    if _servable(x, *params):
        def packed() -> tuple[FrozenWeight, Optional[Tensor]]:
            weight, bias = build()
            return FrozenWeight(weight), bias

        frozen, bias = frozen_cached(tag + "/frozen", params, packed)
        return frozen(x, bias)
    weight, bias = frozen_cached(tag, params, build)
    return F.linear(x, weight, bias)


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight, bias)``: x (..., I), weight (O, I), bias (O,) -> (..., O); through a
    :class:`FrozenWeight` (oneDNN or MKL by the rows) where :func:`usable` allows."""
    if not usable(x, weight, bias):
        return F.linear(x, weight, bias)
    frozen, b = _frozen(weight, bias)
    return frozen(x, b)


__all__ = ["DECODE_MIN_MACS", "DECODE_MIN_ROWS", "FrozenWeight", "PackedLinearFunction", "TRAIN_PACKING", "cpu_vendor", "frozen_cached",
           "frozen_linear", "frozen_weights", "in_frozen_region", "linear", "pack", "product", "train_linear", "trainable", "usable"]
