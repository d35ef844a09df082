"""Numeric precision of model computations: names, dtypes and the autocast context.

``"fp32"`` runs everything in float32; ``"bf16"`` and ``"fp16"`` run the model under
``torch.autocast`` (matrix products in half precision, reductions and losses in float32; the
probability mappings compute half inputs in float32). fp16 needs loss scaling in training
(``torch.amp.GradScaler``); bf16 does not. bf16 autocast works on CPU too. Decoding and scoring also take ``"int8"``
(:data:`INFERENCE_PRECISIONS`; CPU only): the products of decoding's packed path
(:mod:`nmt.utils.packed_linear`) in dynamically quantized int8 (:mod:`nmt.utils.int8_linear`),
everything else in float32.

Decoding and scoring in ``"fp32"`` run under :func:`ieee_float32`: torch lets cuDNN's LSTM use
TF32 tensor cores for float32 by default (``torch.backends.cudnn.rnn.fp32_precision == "tf32"``,
a 10-bit mantissa in the products), which put sentence scores on an H200 up to 7e-3 from the CPU's
and changed 1-2 hypotheses in 1,000 (``tools/bench_translate.py --device cuda``, 2026-11-27); in
IEEE float32 a GPU decodes what the CPU decodes up to summation order. Training keeps torch's
default (its products' rounding is not part of a contract).
"""
from __future__ import annotations

import contextlib
from typing import ContextManager, Iterator

import torch
from torch import Tensor

PRECISIONS = ("fp32", "bf16", "fp16")
"""Training's precisions (``training.precision``)."""
INFERENCE_PRECISIONS = PRECISIONS + ("int8",)
"""Decoding's and scoring's (``nmt-translate -precision``): int8 on the CPU only."""
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def float32_if_half(x: Tensor) -> Tensor:
    """``x`` in float32 where it is float16 or bfloat16, else ``x`` itself (float32 and float64 as
    they are): what losses, mappings and sums over half-precision scores compute in."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def check_precision(name: str, inference: bool = False) -> str:
    """``name`` if it is one of ``PRECISIONS`` (with ``inference``: of ``INFERENCE_PRECISIONS``);
    ValueError naming the valid ones otherwise."""
    valid = INFERENCE_PRECISIONS if inference else PRECISIONS
    if name not in valid:
        raise ValueError(f"precision must be one of {', '.join(valid)}, got {name!r}")
    return name


def requested_device(name: str, device: str) -> str:
    """The device asked for at precision ``name``: ``device``, but the CPU for ``"auto"`` at int8
    (its products are CPU products; ``"auto"`` would pick CUDA where there is one)."""
    return "cpu" if name == "int8" and device == "auto" else device


def check_inference_device(name: str, device: torch.device | str) -> None:
    """ValueError where precision ``name`` cannot run on ``device``: int8 needs the CPU (its
    products are written for the CPU's int8 kernels) and a torch that has them."""
    if name != "int8":
        return
    if torch.device(device).type != "cpu":
        raise ValueError(f"precision int8 runs on the CPU only (int8 matrix products for CPUs), not on "
                         f"{torch.device(device)}; use -device cpu, or bf16 / fp16 on a GPU")
    from nmt.utils.int8_linear import available

    if not available():
        raise ValueError(f"precision int8 needs torch._int_mm, which this torch {torch.__version__} lacks")


def autocast_dtype(name: str) -> torch.dtype | None:
    """The autocast dtype of a precision name (None for fp32)."""
    return _DTYPES.get(check_precision(name, inference=True))


def autocast(device: torch.device | str, name: str) -> ContextManager:
    """``torch.autocast`` for ``device``'s type at precision ``name`` (a no-op context for fp32)."""
    dtype = autocast_dtype(name)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


@contextlib.contextmanager
def ieee_float32() -> Iterator[None]:
    """Inside: float32 products of cuDNN's RNNs and of CUDA matrix products in IEEE float32, not
    TF32 (``torch.backends.cudnn.rnn`` and ``torch.backends.cuda.matmul`` ``fp32_precision =
    "ieee"``; torch < 2.9: ``allow_tf32 = False`` of both); the settings before are restored on
    leaving, also on an exception. Global settings of the process (as torch keeps them): another
    thread's CUDA work meanwhile runs under them too. Off CUDA it changes only a CPU matrix product
    precision lowered by ``torch.set_float32_matmul_precision("high"/"medium")``: torch keeps one
    legacy setting for both, and a mixed state makes its checks raise. No host sync."""
    rnn, matmul = getattr(torch.backends.cudnn, "rnn", None), torch.backends.cuda.matmul
    if rnn is not None and hasattr(rnn, "fp32_precision"):
        before = rnn.fp32_precision, matmul.fp32_precision
        legacy = _legacy_matmul_precision()
        cpu_matmul = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)  # which the legacy setter sets too
        cpu_before = getattr(cpu_matmul, "fp32_precision", None)
        # torch checks at every CUDA float32 matrix product that the legacy setting (which
        # set_float32_matmul_precision / matmul.allow_tf32 make) agrees with fp32_precision: after
        # a user's set_float32_matmul_precision("high"), fp32_precision "ieee" alone made each
        # product raise ("mix of the legacy and new APIs"); "highest" sets both
        if legacy is not None:
            torch.set_float32_matmul_precision("highest")  # the CPU's matmul too (one setting for all)
        rnn.fp32_precision = matmul.fp32_precision = "ieee"
        try:
            yield
        finally:
            if legacy is not None:
                torch.set_float32_matmul_precision(legacy)  # sets fp32_precision too: restored after
                if cpu_before is not None:
                    cpu_matmul.fp32_precision = cpu_before  # exactly as before ("none", not "ieee")
            rnn.fp32_precision, matmul.fp32_precision = before
        return
    old = torch.backends.cudnn.allow_tf32, matmul.allow_tf32  # pragma: no cover - torch < 2.9
    torch.backends.cudnn.allow_tf32 = matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, matmul.allow_tf32 = old


def _legacy_matmul_precision() -> str | None:
    """``torch.get_float32_matmul_precision()``, or None where torch refuses to say (the user mixed
    the legacy and the new API already)."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return None


@contextlib.contextmanager
def _int8_inference() -> Iterator[None]:
    from nmt.utils.int8_linear import int8_products

    with ieee_float32(), int8_products():
        yield


def inference_precision(device: torch.device | str, name: str) -> ContextManager:
    """The context of decoding and scoring at precision ``name`` on ``device``: :func:`autocast`
    for "bf16" / "fp16", :func:`ieee_float32` for "fp32" (the CPU's results on a GPU), and for
    "int8" (CPU; :func:`check_inference_device`) int8 products in decoding's packed path."""
    if name == "int8":
        check_inference_device(name, device)
        return _int8_inference()
    if autocast_dtype(name) is None:
        return ieee_float32()
    return autocast(device, name)


__all__ = ["INFERENCE_PRECISIONS", "PRECISIONS", "check_inference_device", "requested_device", "autocast", "autocast_dtype", "check_precision", "float32_if_half", "ieee_float32", "inference_precision"]
