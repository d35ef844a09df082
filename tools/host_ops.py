#!/usr/bin/env python
"""Host work per front-door call of nmt's CUDA route, counted on the CPU: torch operators,
Python calls and Triton launches of each mapping and loss, next to softmax / ``F.cross_entropy``.

An eager GPU call is bound by the host's time to issue it, and on CUDA every torch operator
(allocation, view, cast, fill, autograd node's work...) costs the host several microseconds. This
counts, per call of each front door with ``impl="triton"`` (what ``"auto"`` picks on CUDA), through
Triton's real launch path with the stand-in CUDA driver of ``tools/stand_in_driver.py`` (kernels
compiled for an H100, sm_90; the final C launch replaced by a counter; CPU tensors taken as CUDA
ones):

* **fwd ops** / **bwd ops**: torch operators dispatched below autograd (a ``TorchDispatchMode``)
  by the forward (training mode: the inputs require a gradient) and by the backward
  (``torch.autograd.grad`` of the output with a given output gradient; a loss's with none: the
  implicit one);
* **py calls**: Python function calls of forward and backward (``sys.setprofile``'s call events),
  and **nmt calls**: those of nmt's own functions (independent of the torch and Triton versions);
* **api**: calls into torch's Python API, forward+backward (a ``TorchFunctionMode``: torch functions,
  tensor methods and attribute reads; a no-op ``contiguous()`` or ``.to()`` costs a crossing into
  C++ without dispatching an operator);
* **launches**: Triton launches that reached the stand-in launcher, forward and backward;
* **host us** (``--time``): forward+backward host microseconds per call, median of runs back to
  back (the CPU's operators, cheaper than CUDA's: indicative, and only on an idle machine).

The loss range check (``_check``) is one ``torch._assert_async`` as on CUDA (on the stand-in's
all-ones flag: the stubbed kernels write nothing). softmax and ``F.cross_entropy`` are counted
the same way on the CPU: their CPU operators are CUDA's here (``_softmax``, ``log_softmax`` and
``nll_loss`` forward and backward). Counts are deterministic; :func:`measure` returns them for the
tests (``tests/sparse/test_host_ops.py`` pins the front doors' at upper bounds).

Needs Triton with its NVIDIA backend (no GPU), in a process without ``TRITON_INTERPRET``::

    python tools/host_ops.py                  # the table, (64, 50) float32
    python tools/host_ops.py --time --json ops.json
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import nmt  # noqa: E402
from nmt.sparse import _triton, entmax15, entmax_bisect, losses, sparsemax  # noqa: E402
from nmt.sparse.entmax import entmax_bisect_above_one  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from op_counter import count_ops  # noqa: E402
from stand_in_driver import stand_in_active  # noqa: E402

NMT_DIR = os.path.dirname(os.path.abspath(nmt.__file__))


@dataclass
class Case:
    """One front door: ``make()`` builds fresh inputs (not counted) and returns ``(call, inputs,
    output gradient or None)``; the forward is ``call()``, the backward
    ``torch.autograd.grad(call(), inputs, gradient)``. ``versus``: the label of the torch call it
    is compared with."""
    label: str
    make: Callable[[], tuple[Callable[[], Tensor], tuple[Tensor, ...], Optional[Tensor]]]
    versus: str


@dataclass
class Counts:
    """Host work of one call of a :class:`Case` (see the module docstring)."""
    label: str
    versus: str
    fwd_ops: int
    bwd_ops: int
    fwd_calls: int
    bwd_calls: int
    fwd_nmt_calls: int
    bwd_nmt_calls: int
    fwd_launches: int
    bwd_launches: int
    fwd_op_names: dict
    bwd_op_names: dict
    fwd_api: int = 0
    bwd_api: int = 0
    host_us: Optional[float] = None
    fwd_functions: Optional[dict] = None
    bwd_functions: Optional[dict] = None

    @property
    def ops(self) -> int:
        return self.fwd_ops + self.bwd_ops

    @property
    def calls(self) -> int:
        return self.fwd_calls + self.bwd_calls


SOFTMAX, SOFTMAX_4D, CROSS_ENTROPY = "softmax", "softmax, 4-D scores", "F.cross_entropy"


def cases(rows: int = 64, cols: int = 50, heads: int = 4) -> list[Case]:
    """The front doors on ``(rows, cols)`` float32 scores (``rows`` a multiple of ``heads``): the
    mappings with an output gradient, the losses at class indices ("mean"). The learned alpha is
    one per head, ``(1, heads, 1, 1)`` against scores ``(B, heads, 1, cols)``, as
    :mod:`nmt.models.transformer.head_mapping` passes it (here a leaf: its own computation from
    the head's parameter is the model's, not the mapping's)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=g)
    grad = torch.randn(rows, cols, generator=g)
    target = torch.randint(0, cols, (rows,), generator=g)
    x4, alpha = x.view(rows // heads, heads, 1, cols), torch.full((1, heads, 1, 1), 1.4)

    def mapping(f: Callable[[Tensor], Tensor]) -> Callable[[], Any]:
        def make() -> Any:
            leaf = x.clone().requires_grad_()
            return (lambda: f(leaf)), (leaf,), grad
        return make

    def mapping4(f: Callable[[Tensor], Tensor]) -> Callable[[], Any]:
        def make() -> Any:
            leaf = x4.clone().requires_grad_()
            return (lambda: f(leaf)), (leaf,), grad.view(x4.shape)
        return make

    def learned(f: Callable[..., Tensor]) -> Callable[[], Any]:
        def make() -> Any:
            leaf, a = x4.clone().requires_grad_(), alpha.clone().requires_grad_()
            return (lambda: f(leaf, alpha=a, dim=-1, impl="triton")), (leaf, a), grad.view(x4.shape)
        return make

    def loss(f: Callable[[Tensor], Tensor]) -> Callable[[], Any]:
        def make() -> Any:
            leaf = x.clone().requires_grad_()
            return (lambda: f(leaf)), (leaf,), None
        return make

    return [
        Case(SOFTMAX, mapping(lambda t: F.softmax(t, -1)), SOFTMAX),
        Case(SOFTMAX_4D, mapping4(lambda t: F.softmax(t, -1)), SOFTMAX_4D),
        Case("sparsemax", mapping(lambda t: sparsemax(t, impl="triton")), SOFTMAX),
        Case("entmax15", mapping(lambda t: entmax15(t, impl="triton")), SOFTMAX),
        Case("entmax15, 4-D scores", mapping4(lambda t: entmax15(t, impl="triton")), SOFTMAX_4D),
        Case("entmax_bisect(alpha=1.5)", mapping(lambda t: entmax_bisect(t, 1.5, impl="triton")), SOFTMAX),
        Case("entmax_bisect(alpha=1.3)", mapping(lambda t: entmax_bisect(t, 1.3, impl="triton")), SOFTMAX),
        Case("entmax_bisect(learned alpha)", learned(entmax_bisect), SOFTMAX),
        Case("entmax_bisect_above_one(learned)", learned(entmax_bisect_above_one), SOFTMAX),
        Case(CROSS_ENTROPY, loss(lambda t: F.cross_entropy(t, target)), CROSS_ENTROPY),
        Case("cross_entropy_loss", loss(lambda t: losses.cross_entropy_loss(t, target, impl="triton")),
             CROSS_ENTROPY),
        Case("sparsemax_loss", loss(lambda t: losses.sparsemax_loss(t, target, impl="triton")), CROSS_ENTROPY),
        Case("entmax15_loss", loss(lambda t: losses.entmax15_loss(t, target, impl="triton")), CROSS_ENTROPY),
        Case("entmax_bisect_loss(alpha=1.3)",
             loss(lambda t: losses.entmax_bisect_loss(t, target, 1.3, impl="triton")), CROSS_ENTROPY),
    ]


@contextlib.contextmanager
def cuda_route() -> Iterator[list]:
    """The stand-in driver active for nmt's Triton route and the loss range check one
    ``_assert_async`` on a true flag (as on CUDA; the stubbed kernels write no flag). Yields a
    one-element list: the count of launches that reached the stand-in launcher."""
    launched = [0]
    true_flag = torch.ones((), dtype=torch.bool)

    def on_launch(name: str, args: tuple) -> None:
        launched[0] += 1

    def check(ok: Tensor, message: str) -> None:
        torch._assert_async(true_flag, message)

    saved = losses._check
    with stand_in_active(_triton, on_launch, "host_ops"):
        losses._check = check
        try:
            yield launched
        finally:
            losses._check = saved


def count_api(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()``'s result and its calls into torch's Python API (a ``TorchFunctionMode``: functions,
    tensor methods and attribute reads, no-op casts and ``contiguous`` included, each a crossing
    into torch's C++ binding), including those of torch's own Python code."""
    from torch.overrides import TorchFunctionMode

    calls = [0]

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls[0] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        out = fn()
    return out, calls[0]


def count_calls(fn: Callable[[], Any], by_function: Optional[collections.Counter] = None
                ) -> tuple[Any, int, int]:
    """``fn()``'s result, the Python function calls it made and those of nmt's own code (counted
    by ``file:function`` into ``by_function`` where given)."""
    calls = [0, 0]

    def profile(frame, event, arg) -> None:
        if event == "call":
            calls[0] += 1
            code = frame.f_code
            calls[1] += code.co_filename.startswith(NMT_DIR)
            if by_function is not None:
                by_function[f"{os.path.basename(code.co_filename)}:{code.co_name}"] += 1

    sys.setprofile(profile)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    if by_function is not None:
        by_function[f"{os.path.basename(fn.__code__.co_filename)}:{fn.__code__.co_name}"] -= 1
    return out, calls[0] - 1, calls[1]  # not the call of fn itself


def count_case(case: Case, launched: list, functions: bool = False) -> Counts:
    """:class:`Counts` of one call of ``case`` (after two uncounted calls: compilation, launch
    keys); ``functions``: with the Python calls by function (``fwd_functions``, ``bwd_functions``)."""
    for _ in range(2):
        call, inputs, grad = case.make()
        torch.autograd.grad(call(), inputs, grad)
    call, inputs, grad = case.make()
    before = launched[0]
    out, fwd_names = count_ops(call)
    fwd_launches = launched[0] - before
    before = launched[0]
    _, bwd_names = count_ops(lambda: torch.autograd.grad(out, inputs, grad))
    bwd_launches = launched[0] - before
    call, inputs, grad = case.make()
    out, fwd_api = count_api(call)
    _, bwd_api = count_api(lambda: torch.autograd.grad(out, inputs, grad))
    by_fwd = collections.Counter() if functions else None
    by_bwd = collections.Counter() if functions else None
    call, inputs, grad = case.make()
    out, fwd_calls, fwd_nmt = count_calls(call, by_fwd)
    _, bwd_calls, bwd_nmt = count_calls(lambda: torch.autograd.grad(out, inputs, grad), by_bwd)
    counts = Counts(case.label, case.versus, sum(fwd_names.values()), sum(bwd_names.values()), fwd_calls,
                    bwd_calls, fwd_nmt, bwd_nmt, fwd_launches, bwd_launches, dict(fwd_names), dict(bwd_names),
                    fwd_api, bwd_api)
    if functions:
        counts.fwd_functions, counts.bwd_functions = dict(+by_fwd), dict(+by_bwd)
    return counts


def host_microseconds(case: Case, calls: int, repeats: int) -> float:
    """Median host microseconds per forward+backward of ``case`` over ``repeats`` runs of ``calls``."""
    call, inputs, grad = case.make()

    def step() -> None:
        torch.autograd.grad(call(), inputs, grad)

    for _ in range(max(calls // 10, 10)):
        step()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        runs.append(1e6 * (time.perf_counter() - start) / calls)
    return statistics.median(runs)


def measure(rows: int = 64, cols: int = 50, timed: bool = False, calls: int = 500,
            repeats: int = 5, only: Optional[Sequence[str]] = None, functions: bool = False) -> list[Counts]:
    """:class:`Counts` of every case (``only``: those labels and their references), on the CUDA
    route with the stand-in driver; ``timed``: with host microseconds per forward+backward."""
    chosen = [c for c in cases(rows, cols) if only is None or c.label in only or
              any(c.label == o.versus for o in cases(rows, cols) if o.label in only)]
    with cuda_route() as launched:
        results = [count_case(case, launched, functions) for case in chosen]
        if timed:
            for case, counts in zip(chosen, results):
                counts.host_us = host_microseconds(case, calls, repeats)
    return results


def table(results: list[Counts]) -> str:
    """The counts as a text table, with ratios of the ops to the reference call's."""
    ref = {r.label: r for r in results}
    timed = any(r.host_us is not None for r in results)
    head = (f"{'call':<34} {'fwd ops':>7} {'bwd ops':>7} {'ops/ref':>7} {'py fwd':>6} {'py bwd':>6} "
            f"{'nmt fwd':>7} {'nmt bwd':>7} {'api':>5} {'launch':>6}" + (f" {'host us':>8} {'us/ref':>6}" if timed else ""))
    lines = [head]
    for r in results:
        base = ref.get(r.versus, r)
        line = (f"{r.label:<34} {r.fwd_ops:>7} {r.bwd_ops:>7} {r.ops / max(base.ops, 1):>6.2f}x "
                f"{r.fwd_calls:>6} {r.bwd_calls:>6} {r.fwd_nmt_calls:>7} {r.bwd_nmt_calls:>7} {r.fwd_api + r.bwd_api:>5} "
                f"{r.fwd_launches:>3}+{r.bwd_launches:<2}")
        if timed:
            line += f" {r.host_us:>8.1f} {r.host_us / base.host_us:>5.2f}x"
        lines.append(line)
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64, help="rows (a multiple of 4, the learned alpha's heads)")
    parser.add_argument("--cols", type=int, default=50, help="entries per row")
    parser.add_argument("--time", action="store_true", help="also host us per forward+backward (idle machine)")
    parser.add_argument("--calls", type=int, default=500, help="calls per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is reported")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--ops", action="store_true",
                        help="also list each call's operators by name and its Python calls by function")
    parser.add_argument("--json", type=Path, default=None, help="also write the counts here")
    args = parser.parse_args(argv)
    if args.rows % 4:
        raise SystemExit(f"host_ops: --rows must be a multiple of 4, got {args.rows}")
    torch.set_num_threads(args.threads)
    results = measure(args.rows, args.cols, args.time, args.calls, args.repeats, functions=args.ops)
    print(f"# host_ops: ({args.rows}, {args.cols}) float32, CUDA route on the CPU (stand-in sm_90 driver); "
          f"torch {torch.__version__}, triton {getattr(_triton._import_triton(), '__version__', '?')}")
    print(table(results))
    if args.ops:
        for r in results:
            print(f"\n{r.label}\n  fwd ops: {dict(sorted(r.fwd_op_names.items()))}\n"
                  f"  bwd ops: {dict(sorted(r.bwd_op_names.items()))}")
            for part, functions in (("fwd", r.fwd_functions), ("bwd", r.bwd_functions)):
                top = sorted(functions.items(), key=lambda kv: (-kv[1], kv[0]))
                print(f"  {part} calls: " + ", ".join(f"{name} {n}" for name, n in top))
    if args.json is not None:
        from nmt.utils.io import atomic_write_text
        atomic_write_text(args.json, json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
