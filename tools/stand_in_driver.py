"""Triton's CUDA driver replaced by a stand-in for an H100, for timing and counting nmt's CUDA
route on a machine without a GPU (``bench_launch.py --device cpu``, ``bench_host.py``).

:func:`stand_in` builds the driver object: kernels compile for sm_90 with Triton's real compiler
(its NVIDIA backend), loading a binary and launching do nothing but call ``on_launch(name, args)``.
Imports triton only (not nmt), so a tool measuring another checkout can use it."""
from __future__ import annotations

from typing import Any, Callable


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
