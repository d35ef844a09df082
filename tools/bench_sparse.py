#!/usr/bin/env python
"""Benchmark the nmt.sparse mappings and losses: median ms, ratios measured in the same run, host syncs.

For each shape and dtype, forward and forward+backward: each mapping's time, its ratio to
softmax (losses: to ``torch.nn.functional.cross_entropy``), the ratio to the reference package
``entmax``'s fastest setting when it is installed (sort or top-k k=100 for sparsemax / entmax15,
its default ``n_iter=50`` bisection for entmax_bisect), and the host synchronisations per call
(CPU: :class:`nmt.utils.sync_audit.SyncAudit` counts the calls that would synchronise on an
accelerator; CUDA: ``torch.cuda.set_sync_debug_mode`` counts the real ones). CUDA times come from
CUDA events.

    python tools/bench_sparse.py --device cpu            # (320, 50) (4096, 50) (1024, 8000) (256, 32000) (4096, 32000)
    python tools/bench_sparse.py --device cuda --impl static
    python tools/bench_sparse.py --device cuda --impl triton --vs static   # kernels vs static path
    python tools/bench_sparse.py --device cuda --graphs  # CUDA-graph replays: the kernels alone
    python tools/bench_sparse.py --quick                 # small shapes, few repetitions (smoke run)
    python tools/bench_sparse.py --shapes 1024x8000,256x32000 --dtypes float32 --no-losses
    python tools/bench_sparse.py --cpu-width avx2        # as on a processor with AVX2 but no AVX-512

``--cpu-width avx2`` / ``generic`` time this machine as a narrower x86-64 processor: nmt's native
library built without its AVX-512 functions (or without AVX2's too: the compiler's vector extensions,
what SSE2 and NEON machines run) and torch's own kernels held to the same width
(``ATEN_CPU_CAPABILITY``, set by re-running the script), so both sides of every ratio are those of
that processor.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import statistics
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from nmt.sparse import (
    cross_entropy_loss,
    entmax15,
    entmax15_loss,
    entmax_bisect,
    entmax_bisect_loss,
    sparsemax,
    sparsemax_loss,
)
from nmt.utils.allocator import keep_freed_memory
from nmt.utils.device import make_current
from nmt.utils.host_syncs import count_host_syncs_on

SHAPES = [(320, 50), (4096, 50), (1024, 8000), (256, 32000), (4096, 32000)]
QUICK_SHAPES = [(320, 50), (64, 2000)]
HEADS = 8
"""Heads of the ``entmax_bisect(alpha/head)`` row: one learnable alpha for each eighth of the rows."""
LOSS_MIN_WIDTH = 1000
"""Loss tables are printed for the output-layer shapes (rows at least this long)."""

try:
    import entmax as ref
except ImportError:  # the comparison columns are left empty
    ref = None


def default_reps(shape: tuple[int, int], device: torch.device, quick: bool) -> int:
    """Timed repetitions: 7 to 15 on the CPU (fewer for larger shapes; with 4, single slow calls
    moved the medians of (1024, 8000) by 50% between runs of the same code), 50 on CUDA (each call
    is well under a few ms there, and a median of 3 CUDA timings was seen to be off by 4x)."""
    if quick:
        return 3
    if device.type == "cuda":
        return 50
    return max(7, min(15, int(4e7 // (shape[0] * shape[1]))))


class Timer:
    """Median (or minimum) time of a callable in milliseconds (CUDA events on a CUDA device)."""

    def __init__(self, device: torch.device, reps: int, warmup: int = 2, stat: str = "median",
                 clock: str = "wall") -> None:
        self.device, self.reps, self.warmup = device, reps, warmup
        self.stat = statistics.median if stat == "median" else min
        # "cpu": CPU time of the process (all its threads), insensitive to other processes' load
        self.now = time.process_time if clock == "cpu" else time.perf_counter

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            for _ in range(self.reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            return self.stat(times)
        for _ in range(self.reps):
            start = self.now()
            fn()
            times.append(1e3 * (self.now() - start))
        return self.stat(times)


def median_ms(fn: Callable[[], object], reps: int, warmup: int = 2) -> float:
    """Median wall-clock milliseconds of ``fn`` on the CPU over ``reps`` calls after ``warmup``
    (the timing helper of ``bench_structured`` and ``bench_continuous``)."""
    return Timer(torch.device("cpu"), reps, warmup=warmup)(fn)


class GraphTimer(Timer):
    """Time of a CUDA-graph replay of the callable (captured once after warm-up on a side stream):
    its kernels alone, without the host's Python and launches, as a step compiled with
    ``mode="reduce-overhead"`` replays them. The callable must not synchronise (nmt's mappings
    and losses do not)."""

    def __call__(self, fn: Callable[[], object]) -> float:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(max(self.warmup, 3)):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return super().__call__(graph.replay)


def host_syncs(fn: Callable[[], object], device: torch.device) -> int:
    """Host synchronisations of one call of ``fn`` (see the module docstring)."""
    if device.type == "cuda":
        fn()  # warm: lazy initialisations are not the call's syncs
        torch.cuda.synchronize(device)
    return count_host_syncs_on(device, fn)[1]


def mapping_runner(f: Callable, x: torch.Tensor, g: torch.Tensor, backward: bool) -> Callable[[], object]:
    if not backward:
        def run():
            with torch.no_grad():
                return f(x)
        return run
    xg = x.clone().requires_grad_()

    def run_fb():
        xg.grad = None
        f(xg).backward(g)
    return run_fb


def loss_runner(f: Callable, x: torch.Tensor, t: torch.Tensor, backward: bool) -> Callable[[], object]:
    xg = x.clone().requires_grad_(backward)

    def run():
        if backward:
            xg.grad = None
            f(xg, t).backward()
        else:
            with torch.no_grad():
                f(xg, t)
    return run


def _safe(timer: Timer, fn: Callable[[], object]) -> Optional[float]:
    """Time ``fn`` or None if it fails (e.g. the reference package on a dtype it does not take)."""
    try:
        return timer(fn)
    except (RuntimeError, TypeError, ValueError):
        return None


Row = tuple[str, str, float, float, Optional[float], int]


def mapping_table(shape: tuple[int, int], dtype: torch.dtype, device: torch.device, impl: str,
                  timer: Timer, vs: Optional[str] = None, package: bool = True, spread: float = 1.0) -> list[Row]:
    x = (torch.randn(*shape, device=device) * spread).to(dtype)
    g = torch.randn(*shape, device=device).to(dtype)
    n = shape[-1]
    kw = {} if impl == "auto" else {"impl": impl}  # (auto: also runs against versions without impl)
    # one alpha a row in [1.1, 1.6], learnable (the backward takes alpha's gradient too): rows in
    # random order, the blocks' worst case; and one a head of 8 spread evenly over the same range (an
    # adaptively sparse Transformer's heads: each head's rows together, alpha broadcast to them)
    alpha = (1.1 + 0.5 * torch.rand(shape[0], 1, device=device)).requires_grad_()
    heads = HEADS if shape[0] % HEADS == 0 else 1
    alpha_h = torch.linspace(1.1, 1.6, heads, device=device).view(heads, 1, 1).requires_grad_()
    ours = {
        "softmax": lambda s: torch.softmax(s, -1),
        "sparsemax": lambda s: sparsemax(s, **kw),
        "entmax15": lambda s: entmax15(s, **kw),
        "entmax_bisect(1.5)": lambda s: entmax_bisect(s, 1.5, **kw),
        "entmax_bisect(1.3)": lambda s: entmax_bisect(s, 1.3, **kw),  # any alpha: no closed form
        "entmax_bisect(alpha/row)": lambda s: entmax_bisect(s, alpha, **kw),
        "entmax_bisect(alpha/head)": lambda s: entmax_bisect(s.view(heads, -1, n), alpha_h, **kw).view(s.shape),
    }
    if vs is not None:  # the same mappings with another impl, measured in the same run
        ours.update({f"sparsemax [{vs}]": lambda s: sparsemax(s, impl=vs),
                     f"entmax15 [{vs}]": lambda s: entmax15(s, impl=vs),
                     f"entmax_bisect(1.5) [{vs}]": lambda s: entmax_bisect(s, 1.5, impl=vs)})
    refs: dict[str, list[Callable]] = {}
    if package and ref is not None and not isinstance(timer, GraphTimer):  # (the package may synchronise)
        top_k = n > 100  # the package's top-k setting only makes sense on long rows
        refs = {
            "sparsemax": [lambda s: ref.sparsemax(s, -1)] + ([lambda s: ref.sparsemax(s, -1, k=100)] if top_k else []),
            "entmax15": [lambda s: ref.entmax15(s, -1)] + ([lambda s: ref.entmax15(s, -1, k=100)] if top_k else []),
            "entmax_bisect(1.5)": [lambda s: ref.entmax_bisect(s, 1.5, -1, n_iter=50)],
            "entmax_bisect(1.3)": [lambda s: ref.entmax_bisect(s, 1.3, -1, n_iter=50)],
            "entmax_bisect(alpha/row)": [lambda s: ref.entmax_bisect(s, alpha, -1, n_iter=50)],
            "entmax_bisect(alpha/head)": [lambda s: ref.entmax_bisect(s.view(heads, -1, n), alpha_h, -1,
                                                                      n_iter=50).view(s.shape)],
        }
    rows = []
    if device.type == "cpu":  # the allocator's first outputs of a new size are page-faulted in: not the first row's
        for _ in range(5):
            mapping_runner(ours["softmax"], x, g, True)()
    for backward in (False, True):
        kind = "fwd+bwd" if backward else "fwd"
        base = timer(mapping_runner(ours["softmax"], x, g, backward))
        for name, f in ours.items():
            run = mapping_runner(f, x, g, backward)
            t = base if name == "softmax" else timer(run)
            ref_times = [_safe(timer, mapping_runner(r, x, g, backward)) for r in refs.get(name.split(" [")[0], [])]
            best = min((r for r in ref_times if r is not None), default=None)
            rows.append((name, kind, t, t / base, None if best is None else t / best, host_syncs(run, device)))
    return rows


def loss_table(shape: tuple[int, int], device: torch.device, timer: Timer, impl: str = "auto",
               package: bool = True, spread: float = 1.0) -> list[Row]:
    x = torch.randn(*shape, device=device) * spread
    t = torch.randint(0, shape[-1], shape[:1], device=device)
    n = shape[-1]
    kw = {} if impl == "auto" else {"impl": impl}  # (auto: also runs against versions without impl)
    ours = {
        "cross_entropy": lambda s, y: cross_entropy_loss(s, y, **kw),
        "sparsemax_loss": lambda s, y: sparsemax_loss(s, y, **kw),
        "entmax15_loss": lambda s, y: entmax15_loss(s, y, **kw),
        "entmax_bisect_loss(1.5)": lambda s, y: entmax_bisect_loss(s, y, alpha=1.5, **kw),
        "entmax_bisect_loss(1.3)": lambda s, y: entmax_bisect_loss(s, y, alpha=1.3, **kw),
    }
    refs: dict[str, list[Callable]] = {}
    if package and ref is not None and not isinstance(timer, GraphTimer):
        refs = {
            "sparsemax_loss": [ref.SparsemaxLoss()] + ([ref.SparsemaxLoss(k=100)] if n > 100 else []),
            "entmax15_loss": [ref.Entmax15Loss()] + ([ref.Entmax15Loss(k=100)] if n > 100 else []),
            "entmax_bisect_loss(1.5)": [ref.EntmaxBisectLoss(1.5, n_iter=50)],
            "entmax_bisect_loss(1.3)": [ref.EntmaxBisectLoss(1.3, n_iter=50)],
        }
    rows = []
    for backward in (False, True):
        kind = "fwd+bwd" if backward else "fwd"
        base_run = loss_runner(F.cross_entropy, x, t, backward)
        base = timer(base_run)
        rows.append(("torch cross_entropy", kind, base, 1.0, None, host_syncs(base_run, device)))
        for name, f in ours.items():
            run = loss_runner(f, x, t, backward)
            ms = timer(run)
            ref_times = [_safe(timer, loss_runner(r, x, t, backward)) for r in refs.get(name, [])]
            best = min((r for r in ref_times if r is not None), default=None)
            rows.append((name, kind, ms, ms / base, None if best is None else ms / best, host_syncs(run, device)))
    return rows


def print_table(title: str, rows: list[Row], baseline: str, stat: str = "median") -> None:
    print(f"\n### {title}\n")
    print(f"| function | pass | {stat} ms | x {baseline} | x entmax pkg (best) | host syncs / call |")
    print("|---|---|---:|---:|---:|---:|")
    for name, kind, ms, ratio, vs_ref, syncs in rows:
        r = "-" if vs_ref is None else f"{vs_ref:.2f}"
        print(f"| {name} | {kind} | {ms:.3f} | {ratio:.2f} | {r} | {syncs} |")


def _shape(text: str) -> tuple[int, int]:
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is ROWSxCOLS, e.g. 1024x8000; got {text!r}") from None
    return rows, cols


CPU_WIDTHS = {"native": ("", ""), "avx2": ("avx2", "NMT_NO_AVX512"), "generic": ("default", "NMT_NO_AVX2")}
"""``--cpu-width``: torch's ``ATEN_CPU_CAPABILITY`` and the native library's build flag for each."""


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    ap.add_argument("--vs", default=None, choices=["auto", "pruned", "static", "triton"],
                    help="also time the exact mappings with this impl in the same run (rows marked [impl]), "
                         "e.g. --impl triton --vs static")
    ap.add_argument("--impl", default="auto", choices=["auto", "pruned", "static", "triton"],
                    help="algorithm of the exact mappings (default auto: pruned on CPU, static/triton on CUDA)")
    ap.add_argument("--quick", action="store_true", help="small shapes, float32, 3 repetitions (smoke run)")
    ap.add_argument("--shapes", type=lambda s: [_shape(v) for v in s.split(",")], default=None,
                    help="comma-separated ROWSxCOLS (default: the five shapes of the issue)")
    ap.add_argument("--dtypes", default=None, help="comma-separated, default float32,bfloat16")
    ap.add_argument("--no-losses", action="store_true", help="skip the loss tables")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions (default: CPU by size, 3 to 15; CUDA 50)")
    ap.add_argument("--stat", default="median", choices=["median", "min"],
                    help="statistic over the repetitions (min: steadier on a shared, loaded machine)")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="CPU device: wall time, or the process's CPU time (cpu: steadier under other load; "
                         "with --threads 1 it equals the wall time of an idle machine)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spread", type=float, default=1.0,
                    help="standard deviation of the scores (default 1; e.g. 0.1-0.3: broad rows, as output "
                         "layers early in training, most entries near the maximum)")
    ap.add_argument("--graphs", action="store_true",
                    help="CUDA: time CUDA-graph replays (the kernels alone, as a compiled step with "
                         "mode='reduce-overhead' runs them) instead of eager calls; no entmax-package column")
    ap.add_argument("--no-package", action="store_true",
                    help="leave out the entmax package's columns (its CPU bisection takes minutes a call at "
                         "(4096, 32000))")
    ap.add_argument("--no-malloc-tuning", action="store_true",
                    help="leave glibc's malloc as it is (default: tuned as nmt-train / nmt-translate tune it)")
    ap.add_argument("--cpu-width", default="native", choices=list(CPU_WIDTHS),
                    help="CPU device: time as a processor with AVX2 but no AVX-512 (avx2) or with neither "
                         "(generic: the compiler's vector extensions, as SSE2 / NEON machines): nmt's native "
                         "library and torch's kernels both held to that width (default native)")
    args = ap.parse_args(argv)
    if args.cpu_width != "native":
        capability, define = CPU_WIDTHS[args.cpu_width]
        if args.device != "cpu":
            ap.error("--cpu-width needs --device cpu")
        if os.environ.get("ATEN_CPU_CAPABILITY") != capability:  # torch reads it when it loads: run again
            os.execve(sys.executable, [sys.executable, *sys.argv],
                      {**os.environ, "ATEN_CPU_CAPABILITY": capability})
        from nmt.sparse import _native
        _native._state["lib"] = _native.load(_native.build(defines=[define]))  # (cached by its defines)
    tuned = False if args.no_malloc_tuning else keep_freed_memory()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available")
    make_current(device)  # CUDA events, graphs and streams below take the current device's
    if args.graphs and device.type != "cuda":
        ap.error("--graphs needs --device cuda (CUDA graphs)")
    timer_class = GraphTimer if args.graphs else Timer
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    dtypes = [getattr(torch, d) for d in (args.dtypes or ("float32" if args.quick else "float32,bfloat16")).split(",")]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    print(f"# nmt.sparse benchmark: torch {torch.__version__}, {device} ({where}), threads={torch.get_num_threads()}, "
          f"impl={args.impl}, scores N(0, {args.spread:g}^2), {args.stat} of reps, {'CUDA-graph replays' if args.graphs else 'eager calls'}, {args.clock} clock, CPU width {args.cpu_width}, malloc tuned: {'yes' if tuned else 'no'}, entmax package: {'left out' if args.no_package else 'yes' if ref is not None else 'not installed'}")
    for shape in shapes:
        reps = args.reps or default_reps(shape, device, args.quick)
        timer = timer_class(device, reps, warmup=5 if device.type == "cuda" else 2, stat=args.stat, clock=args.clock)
        for dtype in dtypes:
            rows = mapping_table(shape, dtype, device, args.impl, timer, args.vs, not args.no_package, args.spread)
            print_table(f"mappings {shape} {str(dtype).replace('torch.', '')}, reps={reps}", rows, "softmax", args.stat)
    if not args.no_losses:
        for shape in shapes:
            if shape[1] >= LOSS_MIN_WIDTH:
                reps = args.reps or default_reps(shape, device, args.quick)
                timer = timer_class(device, reps, warmup=5 if device.type == "cuda" else 2, stat=args.stat,
                                    clock=args.clock)
                print_table(f"losses {shape} float32, reps={reps}",
                            loss_table(shape, device, timer, args.impl, not args.no_package, args.spread),
                            "cross-entropy", args.stat)


if __name__ == "__main__":
    main()
