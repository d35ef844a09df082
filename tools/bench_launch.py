"""Host time per call of nmt's Triton route, layer by layer: what a host-bound GPU step pays.

The eager GPU training step is bound by the host (BENCHMARKS.md, *GPU*): what counts there is how
long the host takes to issue a call, not the kernel's time. This prints host microseconds per call,
next to torch's own operation, for each layer of nmt's route to the kernels:

* the Triton launch as nmt issues it (``_triton._launch_forward``: the 1.5-entmax forward kernel),
  and the same with its nine tensors handed to Triton's launcher as tensors rather than as data
  pointers (each then costs the launcher a ``data_ptr()`` call and a driver query on a GPU; the
  stand-in driver runs no launcher, so the two rows differ on a GPU only),
* the wrapper (``_triton.entmax15_forward``: checks, output allocation, the launch),
* the front door ``entmax15(x)`` without gradient, and forward+backward with one; alpha-entmax with
  a learnable alpha per row (an adaptive head), forward and both gradients,
* the losses, forward+backward: ``cross_entropy_loss`` and ``entmax15_loss`` against
  ``F.cross_entropy``;
* two diagnostics of the backward, which autograd runs on a device thread on CUDA: the Triton
  launch issued from another Python thread, and the backward alone (a retained graph's backward,
  again and again) of softmax and 1.5-entmax.

``--device cuda``: the calls are issued back to back and timed without a synchronisation inside the
loop (``host us``); ``wall us`` adds the wait for the GPU at the end (equal when the host is the
bottleneck, as with these small shapes). ``--device cpu`` (no GPU needed): the same calls through
Triton's real launch path with a stand-in CUDA driver, the kernels compiled for an H100 (sm_90) by
Triton's compiler and the final C launch replaced by nothing, so the Python side of each launch
(argument binding, specialization key, cache lookup) is timed; the torch operations around it run
on the CPU, whose small operations cost less host time than CUDA's. Needs Triton with its NVIDIA
backend. Medians of ``--repeats`` runs of ``--calls`` calls; measure on an idle machine.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nmt.sparse import _triton, entmax15, losses  # noqa: E402
from nmt.sparse.entmax import entmax_bisect_above_one  # noqa: E402
from nmt.sparse._triton_launch import mode as _launch_mode  # noqa: E402
from nmt.utils.device import make_current  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stand_in_driver import stand_in_active  # noqa: E402


@contextlib.contextmanager
def stand_in_driver() -> Iterator[list]:
    """Triton's active driver replaced by a CUDA stand-in for an H100: kernels compile for sm_90,
    loading a binary and launching do nothing; nmt's route accepts CPU tensors as if on CUDA and
    its loss range check is skipped (the stubbed kernels write nothing). Yields a list: the count
    of launches that reached the stand-in launcher, then the last launch's arguments (a tuple)."""
    launched: list = [0, None]

    def on_launch(name: str, args: tuple) -> None:
        launched[0] += 1
        launched[1] = args

    check = losses._check
    with stand_in_active(_triton, on_launch, "bench_launch"):
        losses._check = lambda ok, message: None
        try:
            yield launched
        finally:
            losses._check = check


def host_microseconds(fn: Callable[[], object], calls: int, repeats: int,
                      device: torch.device) -> tuple[float, float]:
    """Median host and wall microseconds per call of ``fn`` over ``repeats`` runs of ``calls``
    calls issued back to back (a warm-up run first). Host: until the last call returned; wall:
    after waiting for the device too."""
    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(max(calls // 10, 10)):
        fn()
    synchronize()
    host, wall = [], []
    for _ in range(repeats):
        if isinstance(fn, in_thread):  # issued and timed in another thread
            start = time.perf_counter()
            issuing = fn.timed(calls)
            synchronize()
            done = time.perf_counter()
            host.append(1e6 * issuing / calls)
            wall.append(1e6 * (done - start) / calls)
            continue
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        issued = time.perf_counter()
        synchronize()
        done = time.perf_counter()
        host.append(1e6 * (issued - start) / calls)
        wall.append(1e6 * (done - start) / calls)
    return statistics.median(host), statistics.median(wall)


class in_thread:
    """``fn`` run from another Python thread (as autograd's device thread runs a backward on
    CUDA): :func:`host_microseconds` hands each timed run of calls over whole and times it in that
    thread, so the hand-over is not counted."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn

    def timed(self, calls: int) -> float:
        """Seconds for ``calls`` calls of ``fn`` issued back to back in a new thread (on the
        current CUDA device, if any)."""
        import threading

        device = torch.cuda.current_device() if torch.cuda.is_available() else None
        seconds: list[float] = []

        def work() -> None:
            if device is not None:
                torch.cuda.set_device(device)
            start = time.perf_counter()
            for _ in range(calls):
                self.fn()
            seconds.append(time.perf_counter() - start)

        thread = threading.Thread(target=work, name="bench_launch")
        thread.start()
        thread.join()
        return seconds[0]

    def __call__(self) -> None:
        self.fn()


def cases(rows: int, cols: int, device: torch.device) -> list[tuple[str, Callable[[], object], str]]:
    """(label, call, label of the torch call it is compared with) for every layer."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=g).to(device)
    xg = x.clone().requires_grad_()
    grad = torch.randn(rows, cols, generator=g).to(device)
    target = torch.randint(0, cols, (rows,), generator=g).to(device)
    y = torch.empty_like(x)

    def launch() -> None:
        _triton._launch_forward(x, y, x, y, y, y, y, y, y, 0, 0.0, _triton._ENTMAX15, False, 0)

    def launch_tensors() -> None:  # the launcher given tensors: per pointer data_ptr() and a driver query
        kernel = _triton._kernels(x).forward
        kernel.pointers = False
        try:
            launch()
        finally:
            kernel.pointers = True

    def no_grad(f: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return f()
        return run

    def backward(f: Callable[[Tensor], Tensor], *extra: Tensor, leaf: Tensor = xg) -> Callable[[], object]:
        return lambda: torch.autograd.grad(f(leaf), leaf, *extra)

    xhg, gradh = x.to(torch.bfloat16).requires_grad_(), grad.to(torch.bfloat16)

    def retained_backward(f: Callable[[Tensor], Tensor]) -> Callable[[], object]:
        y = f(xg)  # one graph, its backward run again and again: the backward's host time alone
        return lambda: torch.autograd.grad(y, xg, grad, retain_graph=True)

    # a learnable alpha per row (an adaptive head's): both gradients, the alpha's from the same kernel
    alpha = torch.full((rows, 1), 1.4, device=device, requires_grad=True)

    def learned_alpha() -> object:
        return torch.autograd.grad(entmax_bisect_above_one(xg, alpha, impl="triton"), (xg, alpha), grad)

    softmax = "softmax forward"
    return [
        (softmax, no_grad(lambda: F.softmax(x, -1)), softmax),
        ("Triton launch (1.5-entmax forward kernel)", launch, softmax),
        ("Triton launch, tensors to the launcher", launch_tensors, softmax),
        ("_triton.entmax15_forward (wrapper)", no_grad(lambda: _triton.entmax15_forward(x)), softmax),
        ("entmax15 forward (front door)", no_grad(lambda: entmax15(x, impl="triton")), softmax),
        ("Triton launch, from a second thread", in_thread(launch), softmax),
        ("softmax forward+backward", backward(lambda t: F.softmax(t, -1), grad), "softmax forward+backward"),
        ("softmax backward (retained graph)", retained_backward(lambda t: F.softmax(t, -1)),
         "softmax backward (retained graph)"),
        ("entmax15 backward (retained graph)", retained_backward(lambda t: entmax15(t, impl="triton")),
         "softmax backward (retained graph)"),
        ("entmax15 forward+backward", backward(lambda t: entmax15(t, impl="triton"), grad),
         "softmax forward+backward"),
        ("entmax_bisect, learned alpha, fwd+bwd", learned_alpha, "softmax forward+backward"),
        ("softmax forward+backward, bfloat16", backward(lambda t: F.softmax(t, -1), gradh, leaf=xhg),
         "softmax forward+backward, bfloat16"),
        ("entmax15 forward+backward, bfloat16", backward(lambda t: entmax15(t, impl="triton"), gradh, leaf=xhg),
         "softmax forward+backward, bfloat16"),
        ("F.cross_entropy forward+backward", backward(lambda t: F.cross_entropy(t, target)),
         "F.cross_entropy forward+backward"),
        ("cross_entropy_loss forward+backward",
         backward(lambda t: losses.cross_entropy_loss(t, target, impl="triton")), "F.cross_entropy forward+backward"),
        ("entmax15_loss forward+backward", backward(lambda t: losses.entmax15_loss(t, target, impl="triton")),
         "F.cross_entropy forward+backward"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda (real launches) or cpu (Triton's launch path with a stand-in driver)")
    parser.add_argument("--rows", type=int, default=64, help="rows of the input (default 64: a decoder step)")
    parser.add_argument("--cols", type=int, default=50, help="entries per row (default 50: a source sentence)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is reported")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="smoke run: 50 calls, 1 repeat")
    args = parser.parse_args(argv)
    calls, repeats = (50, 1) if args.quick else (args.calls, args.repeats)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    if device.type == "cuda":
        make_current(device)  # the launches (and the second thread's) without a device switch
        if not _triton.is_available(torch.empty(1, 1, device=device)):
            raise SystemExit("bench_launch: the Triton kernels do not run on this CUDA device (triton missing?)")
        driver = contextlib.nullcontext([0])
        where = f"{torch.cuda.get_device_name(device)}, real launches"
    elif device.type == "cpu":
        driver = stand_in_driver()
        where = "CPU, Triton's launch path with a stand-in sm_90 driver (launches do nothing)"
    else:
        raise SystemExit(f"bench_launch: --device must be cuda or cpu, got {args.device!r}")
    triton = _triton._import_triton()
    print(f"# bench_launch: ({args.rows}, {args.cols}) float32, {where}; torch {torch.__version__}, "
          f"triton {getattr(triton, '__version__', '?')}, {args.threads} threads; median of {repeats} x {calls} calls; "
          f"launch cache {({'0': 'off', '1': 'on'}).get(_launch_mode(), _launch_mode())} (NMT_TRITON_LAUNCH_CACHE)")
    print(f"{'call':<44} {'host us':>8} {'wall us':>8} {'vs torch':>9}")
    with driver as launched:
        reference: dict[str, float] = {}
        for label, fn, versus in cases(args.rows, args.cols, device):
            host, wall = host_microseconds(fn, calls, repeats, device)
            reference.setdefault(label, host)
            ratio = host / reference[versus] if versus in reference else float("nan")
            print(f"{label:<44} {host:>8.1f} {wall:>8.1f} {ratio:>8.2f}x", flush=True)
        if device.type == "cpu":
            print(f"# {launched[0]} launches reached the stand-in launcher")
    return 0


if __name__ == "__main__":
    sys.exit(main())
