"""What alpha-entmax's long-row loop (``nmt/sparse/_power_threshold.c``, rows of more than 256
entries) does per row: the library built with ``NMT_POWER_COUNTS`` (a diagnostic build: counters
summed over rows, one thread) on normal scores of the given deviations, for the given alphas.
Prints per row: the bound's passes (over the segment maxima, and over the normal start's 256-entry
pseudo-row where a broad row takes it), the candidates after the bound,
the coarse (float) passes and their entries, the float Newton passes from the normal model's start
(``fine``), the float settling passes and the rows they settled (``settle``), the double passes of powers and their entries, and
the support's size; then the thousands of time stamp counter ticks a row spends in each phase (the
maximum, the bound, the candidates, the start (moments, series), the coarse steps, the Newton
loop, the output) on x86-64: the minimum over ``--reps`` calls of each phase's mean per row (a
shared machine's preemptions land in one phase of one call: compare within one run).

    python tools/power_counts.py --shapes 256x8000,64x32000 --alphas 1.25,1.3,1.7,1.9 --spreads 0.01,0.03,0.1,0.3,1
"""
import argparse
import ctypes
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nmt.sparse import _native  # noqa: E402
from nmt.utils.allocator import keep_freed_memory  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="256x8000,64x32000", help="comma-separated ROWSxCOLS")
    ap.add_argument("--alphas", default="1.25,1.3,1.7,1.9")
    ap.add_argument("--spreads", default="0.01,0.03,0.1,0.3,1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5, help="calls a setting; each phase's ticks: their minimum")
    ap.add_argument("--narrow", default="", choices=["", "NMT_NO_AVX512", "NMT_NO_AVX2"],
                    help="build without the 512-bit functions (a processor with AVX2 alone) or without "
                         "both wide widths (the compiler's vector extensions: SSE2, NEON)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lib = _native.load(_native.build(Path(tmp), defines=["NMT_POWER_COUNTS"] + [args.narrow] * bool(args.narrow)))
    counts = (ctypes.c_double * 18).in_dll(lib, "nmt_power_counts")
    _native._state["lib"] = lib
    _native._threads = lambda *a, **k: 1  # the counters are not atomic
    keep_freed_memory()  # (as bench_sparse: the outputs' pages are not faulted in again every call)
    torch.manual_seed(args.seed)
    eps = torch.finfo(torch.float32).eps
    for shape in args.shapes.split(","):
        rows, n = (int(v) for v in shape.split("x"))
        base = torch.randn(rows, n)
        print(f"({rows}, {n}), per row: bound passes | candidates | coarse passes, entries | fine | settle, settled | double passes, entries | support || kticks: max bound cand start coarse newton output")
        for alpha in (float(a) for a in args.alphas.split(",")):
            for spread in (float(s) for s in args.spreads.split(",")):
                _native.power_probs(base * spread, alpha - 1, 200, eps, False)  # (the allocator's first)
                ticks = None
                for _ in range(max(1, args.reps)):
                    for i in range(18):
                        counts[i] = 0.0
                    if _native.power_probs(base * spread, alpha - 1, 200, eps, False) is None or counts[0] == 0:
                        sys.exit("the diagnostic build does not serve here (no vector extensions)")
                    v = [counts[i] / counts[0] for i in range(18)]
                    own = [v[8]] + [v[8 + i] - v[7 + i] for i in range(1, 7)]  # each phase's own
                    ticks = own if ticks is None else [min(t, o) for t, o in zip(ticks, own)]
                print(f"  alpha {alpha:g} spread {spread:g}: {v[1]:.1f} | {v[2]:.0f} | {v[3]:.2f}, {v[4]:.0f} | {v[15]:.2f} | "
                      f"{v[16]:.2f}, {v[17]:.2f} | {v[5]:.2f}, {v[6]:.0f} | {v[7]:.0f} || " + " ".join(f"{t / 1e3:.1f}" for t in ticks))


if __name__ == "__main__":
    main()
