#!/usr/bin/env python
"""Benchmark the nmt.sparse mappings and losses (median milliseconds, float32, CPU threads = 2).

Prints, for forward and forward+backward, each mapping's time and its ratio to softmax
(losses: to cross-entropy) and, when the reference package ``entmax`` is installed, the
ratio to that package's fastest setting measured in the same run (sort or top-k k=100 for
sparsemax / entmax15, its default n_iter=50 for bisection).

    python tools/bench_sparse.py            # full: (320, 50) (64, 200) (1024, 8000) (256, 32000)
    python tools/bench_sparse.py --quick    # small shapes, few repetitions (smoke run)
"""
from __future__ import annotations

import argparse
import platform
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

ATTENTION = [(320, 50), (64, 200)]
OUTPUT = [(1024, 8000), (256, 32000)]

try:
    import entmax as ref
except ImportError:  # the comparison columns are left empty
    ref = None


def median_ms(fn: Callable[[], object], reps: int, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


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


def mapping_table(shape: tuple[int, int], reps: int) -> list[tuple[str, str, float, float, Optional[float]]]:
    x = torch.randn(*shape)
    g = torch.randn(*shape)
    n = shape[-1]
    ours = {
        "softmax": lambda s: torch.softmax(s, -1),
        "sparsemax": sparsemax,
        "entmax15": entmax15,
        "entmax_bisect(1.5)": lambda s: entmax_bisect(s, 1.5),
    }
    refs: dict[str, list[Callable]] = {}
    if ref is not None:
        top_k = n > 100  # the package's top-k setting only makes sense on long rows
        refs = {
            "sparsemax": [lambda s: ref.sparsemax(s, -1)] + ([lambda s: ref.sparsemax(s, -1, k=100)] if top_k else []),
            "entmax15": [lambda s: ref.entmax15(s, -1)] + ([lambda s: ref.entmax15(s, -1, k=100)] if top_k else []),
            "entmax_bisect(1.5)": [lambda s: ref.entmax_bisect(s, 1.5, -1, n_iter=50)],
        }
    rows = []
    for backward in (False, True):
        base = median_ms(mapping_runner(ours["softmax"], x, g, backward), reps)
        for name, f in ours.items():
            t = base if name == "softmax" else median_ms(mapping_runner(f, x, g, backward), reps)
            best = min((median_ms(mapping_runner(r, x, g, backward), reps) for r in refs.get(name, [])), default=None)
            rows.append((name, "fwd+bwd" if backward else "fwd", t, t / base, None if best is None else t / best))
    return rows


def loss_table(shape: tuple[int, int], reps: int) -> list[tuple[str, str, float, float, Optional[float]]]:
    x = torch.randn(*shape)
    t = torch.randint(0, shape[-1], shape[:1])
    n = shape[-1]
    ours = {
        "cross_entropy": cross_entropy_loss,
        "sparsemax_loss": sparsemax_loss,
        "entmax15_loss": entmax15_loss,
        "entmax_bisect_loss(1.5)": lambda s, y: entmax_bisect_loss(s, y, alpha=1.5),
    }
    refs: dict[str, list[Callable]] = {}
    if ref is not None:
        refs = {
            "sparsemax_loss": [ref.SparsemaxLoss()] + ([ref.SparsemaxLoss(k=100)] if n > 100 else []),
            "entmax15_loss": [ref.Entmax15Loss()] + ([ref.Entmax15Loss(k=100)] if n > 100 else []),
            "entmax_bisect_loss(1.5)": [ref.EntmaxBisectLoss(1.5, n_iter=50)],
        }
    rows = []
    for backward in (False, True):
        base = median_ms(loss_runner(F.cross_entropy, x, t, backward), reps)
        rows.append(("torch cross_entropy", "fwd+bwd" if backward else "fwd", base, 1.0, None))
        for name, f in ours.items():
            ms = median_ms(loss_runner(f, x, t, backward), reps)
            best = min((median_ms(loss_runner(r, x, t, backward), reps) for r in refs.get(name, [])), default=None)
            rows.append((name, "fwd+bwd" if backward else "fwd", ms, ms / base, None if best is None else ms / best))
    return rows


def print_table(title: str, rows, baseline: str) -> None:
    print(f"\n### {title}\n")
    print(f"| function | pass | median ms | x {baseline} | x entmax pkg (best) |")
    print("|---|---|---:|---:|---:|")
    for name, kind, ms, ratio, vs_ref in rows:
        r = "-" if vs_ref is None else f"{vs_ref:.2f}"
        print(f"| {name} | {kind} | {ms:.3f} | {ratio:.2f} | {r} |")


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes and 3 repetitions (smoke run)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per measurement")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    attention, output = (ATTENTION, [(64, 2000)]) if args.quick else (ATTENTION, OUTPUT)
    reps = args.reps or (3 if args.quick else 15)
    print(f"# nmt.sparse benchmark: torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"threads={torch.get_num_threads()}, float32, reps={reps}, "
          f"entmax package: {'yes' if ref is not None else 'not installed'}")
    for shape in attention + output:
        print_table(f"mappings {shape}", mapping_table(shape, reps), "softmax")
    for shape in output:
        print_table(f"losses {shape}", loss_table(shape, reps), "cross-entropy")


if __name__ == "__main__":
    main()
