"""A faster launch for nmt's Triton kernels: Triton's own compiled kernel, found by a cheaper key.

``kernel[grid](*args, **kwargs)`` on a ``triton.jit`` function spends most of a launch's host
time before the launch: binding the arguments, specialising each one, building the cache key as a
string, checking the globals (about 9.5 of 11 us a launch with Triton 3.9; the compiled kernel's
launcher takes about 1.5, plus its work per pointer argument on a GPU). An eager GPU step that
calls the mappings at every decoder step is host-bound, and pays that at every launch.
:class:`CachedLaunch` keeps, per key of its own, the kernel Triton chose at the first launch of
that key and launches it as Triton does.

**The key** holds, per positional argument, what Triton specialises on (the device, a tensor's
dtype and whether its data pointer is 16-byte aligned; an int's width, its divisibility by 16
and whether it is 1; the type of a float or a bool), and the keyword arguments (constexprs and
compile options) as given. That is at least as fine as Triton's specialisation, so two calls
with one key get the same compiled kernel from Triton as well; the tests check it call by call
(``NMT_TRITON_LAUNCH_CACHE=verify``, below) over every kernel variant the wrappers launch.

**The launch** passes the launcher what ``JITFunction.run`` passes it (Triton >= 3.3): the grid,
the current stream, the kernel's function and packed metadata, the launch metadata and the
launch hooks (profilers keep working), and every bound argument: the call's positional
arguments, then the tail the binder adds (constexprs and defaults), learnt from Triton's binder
at the first launch of the key. Where that cannot be learnt (another Triton's layout, a failing
binder) the key keeps Triton's own path. Two things differ, for the same effect: a CUDA tensor
is passed as its data pointer, an int, which the launcher takes as the pointer itself (given a
tensor it calls ``data_ptr()`` and asks the driver whether the device can reach the memory, at
every launch; here the key holds every tensor's device index, and each key's first launch goes
through Triton's own path with those checks); and launch hooks that are an empty chain (Triton
3.6 and 3.9 keep one where none is set) are passed as None, with no launch metadata built for them.

Not redone per launch, unlike ``JITFunction.run``: the pre-run hooks (nmt's kernels have none)
and the check that the globals a kernel read have not changed (nmt's read none). The debug and
instrumentation knobs are read when a key is first launched.

``NMT_TRITON_LAUNCH_CACHE``: ``1`` (default) on, ``0`` off (every launch through Triton's
``kernel[grid]``), ``verify``: on, and every launch also asks Triton which kernel it would
choose and what it would pass, and raises if that differs (for tests; slower than either).

**The device.** Triton launches on the *current* CUDA device, whatever device the tensors are
on: a kernel given tensors on ``cuda:1`` while the current device is ``cuda:0`` fails ("Pointer
argument cannot be accessed from Triton") or reads another GPU's memory. Every launch here
(cached or not, and :class:`DeviceLaunch` where the cache is unavailable) runs on the device of
its first tensor argument, entering it for the launch where it is not the current one (torch's
device guard; nothing else changes), so ``-device cuda:1`` and ``training.device: cuda:1`` work
like any torch operation.

Nothing here synchronises with the host (data pointers, dtypes and Python values only).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

_I32 = (-(1 << 31), 1 << 31)
_U64 = 1 << 63


def _arg_key(a: Any) -> Any:
    """What Triton specialises a positional argument on (or finer)."""
    if isinstance(a, Tensor):
        return a.dtype, a.data_ptr() & 15 == 0
    if isinstance(a, bool):
        return "u1"
    if isinstance(a, int):
        width = "i32" if _I32[0] <= a < _I32[1] else ("u64" if a >= _U64 else "i64")
        return width, a & 15 == 0, a == 1
    if isinstance(a, float):
        return "fp32"
    if a is None:
        return None
    raise TypeError(f"no launch key for an argument of type {type(a).__name__}")


def launch_key(device: int, args: tuple, kwargs: dict) -> tuple:
    """The cache key of a launch: the device, the keyword arguments as given, and per positional
    argument :func:`_arg_key`'s information, inlined for the common types (a tensor: its dtype,
    whether it is aligned and its device index, -1 off CUDA; an int: divisible by 16, equal to 1,
    in the int32 range, at least 2**63; a float: its type). Raises TypeError for an argument of an unknown type."""
    return keyed_launch(device, args, kwargs)[0]


def keyed_launch(device: int, args: tuple, kwargs: dict) -> Tuple[tuple, tuple]:
    """``(launch_key(...), values)``: ``values`` are ``args`` with every CUDA tensor replaced by
    its data pointer, an int, which Triton's launcher takes as the pointer itself. A tensor costs
    it a ``data_ptr()`` call and a driver query (``cuPointerGetAttribute``, its check that the
    memory is the device's) at every launch; the key, which holds each tensor's device index,
    leaves that check to the key's first launch, through Triton's own path. Tensors off CUDA stay
    tensors (Triton checks them at every launch). Raises TypeError as :func:`launch_key`."""
    key = [device, *kwargs.items()]
    values: list = []
    push, keep = key.append, values.append
    last = part = value = None
    for a in args:
        if type(a) is Tensor:
            if a is not last:  # a tensor passed again at once (the kernels' unused outputs): as read
                last, pointer, index = a, a.data_ptr(), a.get_device()
                part, value = (a.dtype, not pointer & 15, index), (pointer if index >= 0 else a)
            push(part)
            keep(value)
            continue
        if type(a) is int:
            push((a & 15 == 0, a == 1, _I32[0] <= a < _I32[1], a >= _U64))
        elif type(a) is float:  # (inlined: a call per float argument is host time)
            push("fp32")
        else:
            push(_arg_key(a))
        keep(a)
    return tuple(key), tuple(values)


def launch_device(args: tuple) -> Optional[int]:
    """The CUDA device a launch belongs on: that of its first tensor argument (None where that
    tensor is not on a CUDA device, or there is none). Reads the tensor's device only."""
    for a in args:
        if isinstance(a, Tensor):
            index = a.get_device()
            return index if index >= 0 else None
    return None


def on_device(index: int) -> Any:
    """The context in which ``index`` is the current CUDA device (torch's device guard)."""
    return torch.cuda.device(index)


def current_device() -> int:
    """torch's current CUDA device."""
    return torch.cuda.current_device()


def launch_on_device(launch: Callable[..., Any], args: tuple, kwargs: dict,
                     current: Optional[Callable[[], int]] = None) -> Any:
    """``launch(*args, **kwargs)`` on the device of its tensors (:func:`launch_device`), entered
    for the call where it is not the current device (``current()``, default
    :func:`current_device`; asked only for CUDA tensors)."""
    wanted = launch_device(args)
    if wanted is not None and wanted != (current or current_device)():
        with on_device(wanted):
            return launch(*args, **kwargs)
    return launch(*args, **kwargs)


class DeviceLaunch:
    """``DeviceLaunch(jit_function)[grid](*args, **kwargs)``: Triton's own launch, on the device of
    the tensors (see the module's docstring); for a Triton without :class:`CachedLaunch`."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __getitem__(self, grid: tuple) -> Callable[..., Any]:
        return lambda *args, **kwargs: launch_on_device(self.fn[grid], args, kwargs)


_MODES = {"1": "1", "on": "1", "true": "1", "yes": "1", "": "1",
          "0": "0", "off": "0", "false": "0", "no": "0", "verify": "verify"}


def mode() -> str:
    """``NMT_TRITON_LAUNCH_CACHE``: "1" (default; also on / true / yes), "0" (off / false / no) or
    "verify". Any other value raises ValueError naming the variable."""
    value = os.environ.get("NMT_TRITON_LAUNCH_CACHE", "1")
    if value.strip().lower() not in _MODES:
        raise ValueError(f"NMT_TRITON_LAUNCH_CACHE must be 1, 0 or verify (or on / off), got {value!r}")
    return _MODES[value.strip().lower()]


def _hook(hook: Any) -> Any:
    """A launch hook as the launcher needs it: None where there is none to call (Triton 3.6 and 3.9
    keep an empty chain of hooks, ``HookChain``, which the launcher would call for nothing, and
    whose launch metadata would be built for nothing), else the hook itself."""
    return None if hook is None or getattr(hook, "calls", True) == [] else hook


class CachedLaunch:
    """``CachedLaunch(jit_function)[grid](*args, **kwargs)`` launches as
    ``jit_function[grid](*args, **kwargs)`` does (see the module's docstring). ``grid``: a tuple
    of 1-3 ints. ``kwargs``: constexprs and options, in one order per call site (another order
    is another key, not an error)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self._cache: Dict[tuple, Optional[Tuple[Any, tuple]]] = {}
        from triton import knobs  # Triton >= 3.3 (the launcher layout below); else ImportError
        from triton.runtime.driver import driver
        self._knobs, self._driver = knobs.runtime, driver
        self._mode = mode()
        self.pointers = True  # CUDA tensors to the launcher as pointers (False: as tensors, for A/B timing)

    def __getitem__(self, grid: tuple) -> Callable[..., Any]:
        if self._mode == "0":
            return DeviceLaunch(self.fn)[grid]
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid: tuple, args: tuple, kwargs: dict) -> Any:
        """Launch on the device of the tensors (entered where it is not the current one) and its
        current stream; returns the compiled kernel."""
        active = self._driver.active
        device = active.get_current_device()
        wanted = launch_device(args)
        if wanted is not None and wanted != device:
            with on_device(wanted):
                return self._launch(active, wanted, grid, args, kwargs)
        return self._launch(active, device, grid, args, kwargs)

    def _launch(self, active: Any, device: int, grid: tuple, args: tuple, kwargs: dict) -> Any:
        """The launch on ``device``, the current device."""
        try:
            key, pointers = keyed_launch(device, args, kwargs)
        except TypeError:  # an argument of a type the key does not know: Triton's path
            return self.fn[grid](*args, **kwargs)
        entry = self._cache.get(key, False)
        if entry is False:  # the key's first launch: Triton's own path, then learn from it
            kernel = self.fn[grid](*args, **kwargs)
            self._cache[key] = self._learn(device, kernel, args, kwargs)
            return kernel
        if entry is None:  # not learnable: Triton's path
            return self.fn[grid](*args, **kwargs)
        kernel, tail = entry
        if self._mode == "verify":
            self._verify(device, kernel, tail, args, kwargs)
        stream = active.get_current_stream(device)
        values = (pointers if self.pointers else args) + tail
        grid_1 = grid[1] if len(grid) > 1 else 1
        grid_2 = grid[2] if len(grid) > 2 else 1
        knobs = self._knobs
        enter, leave = _hook(knobs.launch_enter_hook), _hook(knobs.launch_exit_hook)
        # Triton's launch metadata is for the enter hook alone (None without one): not built then
        metadata = None if enter is None else kernel.launch_metadata(grid, stream, *(args + tail))
        kernel.run(grid[0], grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, metadata, enter,
                   leave, *values)
        return kernel

    def _bound(self, device: int, args: tuple, kwargs: dict) -> tuple:
        """Triton's binder on the call: (bound values, its specialisation, its options)."""
        binder = self.fn.device_caches[device][-1]
        bound, specialization, options = binder(*args, **kwargs)
        return tuple(bound.values()), specialization, options

    def _learn(self, device: int, kernel: Any, args: tuple, kwargs: dict) -> Optional[Tuple[Any, tuple]]:
        """(kernel, the bound arguments' tail) where the binder's values start with ``args``
        themselves and the kernel is initialised; None otherwise."""
        try:
            values, _, _ = self._bound(device, args, kwargs)
            if len(values) < len(args) or any(v is not a for v, a in zip(values, args)):
                return None
            if kernel is None or kernel.function is None or not callable(kernel.run):
                return None
            return kernel, values[len(args):]
        except Exception:  # another Triton's internals: keep its own path for this key
            return None

    def _verify(self, device: int, kernel: Any, tail: tuple, args: tuple, kwargs: dict) -> None:
        """Raise unless Triton would launch ``kernel`` with ``args + tail`` for this call."""
        chosen = self.fn.run(*args, grid=(1,), warmup=True, **kwargs)  # Triton's choice, no launch
        values, _, _ = self._bound(device, args, kwargs)
        passed = keyed_launch(device, args, kwargs)[1] + tail  # CUDA tensors by their pointers
        if chosen is not kernel or len(values) != len(passed) or \
                any(v is not a and not (type(v) is type(a) and v == a) and
                    not (type(v) is Tensor and type(a) is int and v.is_cuda and v.data_ptr() == a)
                    for v, a in zip(values, passed)):
            raise AssertionError(f"CachedLaunch({getattr(self.fn, '__name__', self.fn)}): Triton would launch "
                                 f"{getattr(chosen, 'hash', chosen)} with {len(values)} arguments; the "
                                 f"cache has {getattr(kernel, 'hash', kernel)} with {len(args) + len(tail)}")


__all__ = ["CachedLaunch", "DeviceLaunch", "keyed_launch", "launch_device", "launch_key", "launch_on_device",
           "mode", "current_device", "on_device"]
