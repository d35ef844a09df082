"""Triton's CUDA driver replaced by a stand-in for an H100, for timing and counting nmt's CUDA
route on a machine without a GPU (``bench_launch.py --device cpu``, ``bench_host.py``).

:func:`stand_in` builds the driver object: kernels compile for sm_90 with Triton's real compiler
(its NVIDIA backend), loading a binary and launching do nothing but call ``on_launch(name, args)``;
:func:`stand_in_active` makes it the active driver for nmt's Triton route. Imports no nmt module
(the route's module is passed in), so a tool measuring another checkout can use it."""
from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, Iterator


def stand_in(on_launch: Callable[[str, tuple], None], device: Any) -> Any:
    """The stand-in driver (pass it to ``triton.runtime.driver.driver.set_active``): device 0,
    stream 0, target sm_90 with 132 multiprocessors and 227 KiB of shared memory; ``device``: what
    ``get_active_torch_device`` returns (the CPU); every launch calls ``on_launch(kernel name,
    launch arguments)``. Needs triton with its NVIDIA backend (the caller checks)."""
    from triton.backends.compiler import GPUTarget

    class Utils:
        def get_device_properties(self, device: int) -> dict:
            return {"max_shared_mem": 232448, "multiprocessor_count": 132}

        def load_binary(self, name, kernel, shared, device):  # module, function, registers, spills, threads
            return 1, 2, 64, 0, 1024

        def unload_module(self, module) -> None:
            pass

    class StandIn:
        utils = Utils()

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int) -> int:
            return 0

        def get_current_target(self) -> Any:
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self) -> Any:
            return device

        def is_active(self) -> bool:
            return True

        def launcher_cls(self, src, metadata):
            name = getattr(metadata, "name", None) or getattr(getattr(src, "fn", None), "__name__", "?")

            def launch(*args) -> None:
                on_launch(name, args)
            return launch

    return StandIn()


@contextlib.contextmanager
def stand_in_active(nmt_triton: Any, on_launch: Callable[[str, tuple], None], tool: str) -> Iterator[None]:
    """Inside: :func:`stand_in` is Triton's active driver for ``nmt_triton`` (the module
    ``nmt.sparse._triton`` of the checkout measured), whose kernels are jitted anew for its target
    and take CPU tensors as if on CUDA (``_runs_here`` true; ``_interpreted`` false where that
    checkout has it); after, the driver, the patched functions and the earlier kernels are back.
    SystemExit naming ``tool`` without triton, without its NVIDIA backend, or with triton imported
    for its interpreter (``TRITON_INTERPRET=1``)."""
    import torch

    if nmt_triton._import_triton() is None:
        raise SystemExit(f"{tool}: needs triton ({nmt_triton._IMPORT_ERROR})")
    from triton.backends import backends
    from triton.runtime.driver import driver

    if "nvidia" not in backends:
        raise SystemExit(f"{tool}: needs triton's NVIDIA backend (to compile for sm_90)")
    if nmt_triton._library_interpreted():
        raise SystemExit(f"{tool}: triton was imported for its interpreter (TRITON_INTERPRET=1): "
                         "run it in a process without it")
    previous = getattr(driver, "_active", None)  # None where no driver is active (no GPU)
    saved = {name: getattr(nmt_triton, name) for name in ("_runs_here", "_interpreted") if hasattr(nmt_triton, name)}
    driver.set_active(stand_in(on_launch, torch.device("cpu")))
    nmt_triton._runs_here = lambda x: True
    if "_interpreted" in saved:  # the compiled kernels for CPU tensors too
        nmt_triton._interpreted = lambda x=None: False
    kernels = dict(nmt_triton._KERNELS)
    nmt_triton._KERNELS.clear()  # jitted anew, for the stand-in's target
    try:
        yield
    finally:
        nmt_triton._KERNELS.clear()  # the stand-in's kernels unload through it: before it goes
        gc.collect()
        driver._active = previous
        for name, value in saved.items():
            setattr(nmt_triton, name, value)
        nmt_triton._KERNELS.update(kernels)
