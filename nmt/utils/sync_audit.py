"""Count the tensor operations that synchronise a CUDA device with the host, on any device.

On CUDA, reading a value back to Python (``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``),
copying to the host (``.cpu()``, ``.numpy()``, ``.to("cpu")``), comparing to a Python bool
(``torch.equal``, ``torch.allclose``) or building a tensor whose size depends on data (``nonzero``,
``masked_select``, ``unique``, ``bincount``, boolean-mask indexing) waits for the device. On the CPU these calls are free, so a test cannot see them by timing; this module wraps
them and counts the calls instead, which works on any device and proves the contract on CPU::

    with SyncAudit() as audit:
        loss = my_loss(scores, target)
        loss.backward()
    assert audit.total == 0, audit.report()

The wrappers are installed on ``torch.Tensor`` and ``torch`` for the duration of the ``with``
block only (not thread-safe: do not audit while other threads use torch). Calls made by torch's
own internals through the Python layer are counted too; calls from C++ (e.g. inside autograd
engine code) are not. ``torch.cuda.set_sync_debug_mode`` is the complementary check on a real GPU.
"""
from __future__ import annotations

import collections
import traceback
from typing import Any, Callable

import torch

# (owner, attribute) pairs that synchronise on CUDA.
_TENSOR_METHODS = ("item", "tolist", "numpy", "cpu", "nonzero", "masked_select", "unique",
                   "unique_consecutive", "__bool__", "__int__", "__float__", "__index__", "equal",
                   "allclose", "bincount")
_TORCH_FUNCTIONS = ("nonzero", "masked_select", "unique", "unique_consecutive", "argwhere", "is_nonzero",
                    "equal", "allclose", "bincount")


def _is_host_device(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, str):
        return device.split(":")[0] == "cpu"
    if isinstance(device, torch.device):
        return device.type == "cpu"
    return False


class SyncAudit:
    """Context manager counting host-synchronising tensor calls by name.

    Attributes: ``counts`` (a Counter name -> calls) and ``total``; ``report()`` gives one line per
    name with the first call site. ``torch.where`` with one argument is counted (it is ``nonzero``);
    ``Tensor.to`` counts only when it targets the CPU; ``Tensor.__getitem__`` counts when an index is
    a boolean tensor (a data-dependent size).
    """

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.sites: dict[str, str] = {}
        self._saved: list[tuple[Any, str, Any]] = []

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def report(self) -> str:
        return "; ".join(f"{name} x{n} (first at {self.sites[name]})" for name, n in sorted(self.counts.items()))

    def _hit(self, name: str) -> None:
        self.counts[name] += 1
        if name not in self.sites:
            frames = [f for f in traceback.extract_stack() if f.filename != __file__]
            where = frames[-1] if frames else None
            self.sites[name] = f"{where.filename}:{where.lineno}" if where else "?"

    def _wrap(self, owner: Any, attr: str, name: str, when: Callable[..., bool] | None = None) -> None:
        original = getattr(owner, attr, None)
        if original is None:
            return
        audit = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if when is None or when(*args, **kwargs):
                audit._hit(name)
            return original(*args, **kwargs)

        self._saved.append((owner, attr, original))
        setattr(owner, attr, wrapper)

    def __enter__(self) -> "SyncAudit":
        for attr in _TENSOR_METHODS:
            self._wrap(torch.Tensor, attr, f"Tensor.{attr}")
        for attr in _TORCH_FUNCTIONS:
            self._wrap(torch, attr, f"torch.{attr}")
        self._wrap(torch, "where", "torch.where(cond)", when=lambda *a, **k: len(a) + len(k) == 1)
        self._wrap(torch.Tensor, "to", "Tensor.to(cpu)", when=_targets_host)
        self._wrap(torch.Tensor, "__getitem__", "Tensor[bool mask]", when=_boolean_index)
        self._wrap(torch.Tensor, "__setitem__", "Tensor[bool mask] =", when=_boolean_index)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, original in reversed(self._saved):
            setattr(owner, attr, original)
        self._saved.clear()


def _targets_host(self: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
    if self.device.type == "cpu":
        return False  # already on the host: a no-op, not a transfer
    device = kwargs.get("device", args[0] if args else None)
    if isinstance(device, torch.Tensor):
        device = device.device
    return _is_host_device(device)


def _boolean_index(self: torch.Tensor, index: Any, *rest: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 0 for i in items)


def count_host_syncs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, SyncAudit]:
    """Run ``fn(*args, **kwargs)`` under a :class:`SyncAudit`; return ``(result, audit)``."""
    with SyncAudit() as audit:
        result = fn(*args, **kwargs)
    return result, audit
