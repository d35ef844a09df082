#!/usr/bin/env python
"""Host work of the eager GPU training update, counted on the CPU: softmax against 1.5-entmax.

The eager GPU step of the Multi30k LSTM is bound by its host (the kernels are a few ms of a
30-50 ms step on an H200): what it costs is what the host does to issue it. This runs the eager
training update of ``tools/bench_train.py`` (``nmt.train.update.update`` with the model, loss and
optimizer built from ``configs/multi30k_lstm.yaml``, batches of 64 sentences) on the **CUDA route,
on the CPU**: the mappings and losses take the Triton path they take on CUDA (``impl="auto"``
resolved as off the CPU, the index losses' fused kernels), through Triton's real launch path with
``tools/bench_launch.py``'s stand-in driver (kernels compiled for an H100, sm_90, by Triton's
compiler; the final C launch replaced by a counter). Unless ``--cpu-model``, the model's own code
takes its CUDA branches where the CPU can run them: the decoder's fused LSTM cell
(``aten::_thnn_fused_lstm_cell``, a CUDA-only operator, given a CPU kernel written here), dropout
as one ``native_dropout`` operator (CUDA's fused dropout), the native C paths off
(``NMT_NATIVE=0``, ``NMT_ONEDNN=0``). The LSTM encoder stays the CPU's (cuDNN's one operator per
run has no CPU stand-in; its operations are the same in every row).

Per update and per setting (softmax / softmax, entmax15 / entmax15, and the mixed rows), in one
process, with ratios to softmax / softmax measured in the same run:

* **torch ops**: operators dispatched below autograd (a ``TorchDispatchMode``), backward included;
* **py calls**: Python function calls (``sys.setprofile``'s call events; the CPU kernels that
  stand in for CUDA ones are not counted), and ``c calls`` (calls of built-in functions);
* **launches**: Triton launches that reached the stand-in launcher, per kernel, and ``jit runs``:
  launches that took Triton's own ``JITFunction.run`` (a launch-cache miss) instead of nmt's cache;
* **syncs**: host synchronisations (``nmt.utils.host_syncs``; on this route every one would be
  a real sync on a GPU);
* **host ms** / **cpu ms**: wall and thread CPU time of an update, each the minimum over
  ``--rounds`` rounds in which the settings alternate (each round: ``--batches`` updates).

Then, for every setting against softmax / softmax, where its *extra* work comes from: Python
calls by function and torch operations by site (the innermost nmt function that issued a
forward operation; a backward operation by the autograd node that ran it), largest differences
first, and the totals by layer (nmt.sparse, nmt.models, nmt.train, triton, torch, other).

What it does not measure: the launcher's C code and the CUDA driver (``cuLaunchKernel``, the
pointer checks), the kernels' GPU time, CUDA's caching allocator and the CUDA ops' own host cost
(a CUDA operator's host time is several times a CPU one's), cuDNN's encoder, autograd's device
thread (on CUDA the backward runs there, on the CPU on the calling thread), the batch's copy to
the device. Counts are machine-independent; times are this machine's (contended machines: prefer
counts and ``cpu ms`` with ``--threads 1``).

``--root PATH`` imports nmt from another checkout (e.g. an older commit in a git worktree):
this file's own helpers only use APIs that exist there too, so one tool compares commits::

    python tools/bench_host.py --threads 1                       # this checkout
    python tools/bench_host.py --threads 1 --root /tmp/old       # another checkout, same counts
    python tools/bench_host.py --quick --json host.json          # smoke run: 2 batches, 1 round

Needs Triton with its NVIDIA backend (no GPU). Tiny model dimensions by default (``--size``), so
that the arithmetic is negligible and the host's work shows; ``--real`` uses the config's sizes
and a vocabulary of 8000 (the same batch shapes, the counts about the same; the times then hold
the CPU's arithmetic)."""
from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

THIS_FILE = os.path.abspath(__file__)
TOOL_ROOT = Path(THIS_FILE).resolve().parents[1]
PAD, BOS, EOS = 0, 2, 3
MAPPING_KERNELS = ("_forward_kernel", "_backward_kernel")
"""The mapping kernels of nmt.sparse._triton (the index losses' are _ce_*_kernel and _finish_kernel;
the 1.5-entmax loss uses _forward_kernel too)."""

SETTINGS = {
    "softmax / softmax": ("softmax", "softmax"),
    "entmax15 / entmax15": ("entmax15", "entmax15"),
    "entmax15 / softmax": ("entmax15", "softmax"),
    "softmax / entmax15": ("softmax", "entmax15"),
}
BASELINE = "softmax / softmax"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=TOOL_ROOT,
                        help="checkout whose nmt is imported (default: this file's)")
    parser.add_argument("--rows", nargs="+", default=list(SETTINGS), choices=list(SETTINGS),
                        help="settings (attention / output); softmax / softmax is always run first")
    parser.add_argument("--batches", type=int, default=8, help="batches per round (one update each)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds, settings alternating")
    parser.add_argument("--warmup", type=int, default=2, help="untimed passes over the batches first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--size", type=int, default=16, help="embeddings and hidden sizes (default 16)")
    parser.add_argument("--vocab", type=int, default=64, help="source and target vocabulary (default 64)")
    parser.add_argument("--real", action="store_true",
                        help="the config's sizes (256) and a vocabulary of 8000 instead of --size / --vocab")
    parser.add_argument("--cpu-model", action="store_true",
                        help="the model's CPU paths (native cell and dropout, oneDNN) instead of its CUDA branches")
    parser.add_argument("--top", type=int, default=12, help="rows of each breakdown")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 batches, 1 round, 1 warm-up pass")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument("--against", type=Path, default=None,
                        help="a --json report of another checkout: each setting's counts against it, and "
                             "where they differ (by function and by operator site)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.rounds, args.warmup = 2, 1, 1
    if BASELINE in args.rows:
        args.rows.remove(BASELINE)
    args.rows.insert(0, BASELINE)
    return args


def prepare_imports(args: argparse.Namespace) -> None:
    """Environment and import path before nmt (and torch's natives) are imported."""
    os.environ.pop("TRITON_INTERPRET", None)  # the compiled kernels' library, not the interpreter's
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    if not args.cpu_model:
        os.environ["NMT_NATIVE"] = "0"
        os.environ["NMT_ONEDNN"] = "0"
    root = str(args.root.resolve())
    if "nmt" in sys.modules and not sys.modules["nmt"].__file__.startswith(root):
        raise SystemExit(f"bench_host: nmt already imported from {sys.modules['nmt'].__file__}, not {root}")
    sys.path.insert(0, root)


# ----------------------------------------------------------------------------------------------
# The CUDA route on the CPU
# ----------------------------------------------------------------------------------------------

@contextlib.contextmanager
def cuda_route(launches: collections.Counter, cpu_model: bool) -> Iterator[None]:
    """Triton's driver replaced by a stand-in for an H100 (``stand_in_driver.stand_in_active``:
    kernels compile for sm_90, loading and launching do nothing; each launch counted in
    ``launches`` by kernel name); the mappings and losses resolve ``impl="auto"`` as off the CPU;
    the loss's range check one ``_assert_async`` on a true flag (the stubbed kernels write
    nothing); unless ``cpu_model``, the model's CUDA branches (:func:`model_as_on_cuda`)."""
    import torch
    from nmt.sparse import _dispatch, _triton, losses

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from stand_in_driver import stand_in_active

    original_resolve = _dispatch.resolve_impl
    true_flag = torch.ones((), dtype=torch.bool)

    def resolve_impl(impl: str, x, triton_ok: bool = True) -> str:  # "auto" as off the CPU
        if impl == "auto":
            return ("triton" if triton_ok and x.dtype != torch.float64 and _dispatch.triton_available(x)
                    else "static")
        return original_resolve(impl, x, triton_ok)

    def cross_entropy_uses_kernel(z, impl: str) -> bool:  # as losses._cross_entropy_uses_kernel off the CPU
        return impl in ("auto", "triton") and z.dtype != torch.float64 and _dispatch.triton_available(z)

    def check(ok, message: str) -> None:  # one operator, as on CUDA; the stubbed kernels wrote no flag
        torch._assert_async(true_flag, message)

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    try:
        with stand_in_active(_triton, lambda name, args: launches.update((name,)), "bench_host"):
            for module in [m for name, m in list(sys.modules.items())
                           if name.startswith("nmt.sparse") and m is not None]:
                if getattr(module, "resolve_impl", None) is original_resolve:
                    patch(module, "resolve_impl", resolve_impl)
            patch(losses, "_cross_entropy_uses_kernel", cross_entropy_uses_kernel)
            patch(losses, "_check", check)
            with contextlib.ExitStack() as stack:
                if not cpu_model:
                    stack.enter_context(model_as_on_cuda(patch))
                yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


_LIBRARY: list = []  # the CPU kernels registered for CUDA-only operators (kept for the process)
EMULATED: set = set()
"""Code objects of the CPU kernels above (a CUDA kernel's work on a GPU): not counted as Python calls."""


def _register_fused_cell() -> None:
    """CPU kernels for ``aten::_thnn_fused_lstm_cell`` and its backward (CUDA-only operators), so
    that the decoder's CUDA branch runs here: one operator forward, one backward, as on CUDA."""
    if _LIBRARY:
        return
    import torch

    def forward(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
        with torch._C._DisableTorchDispatch():
            gates = input_gates + hidden_gates
            if input_bias is not None:
                gates = gates + input_bias + hidden_bias
            i, f, g, o = gates.chunk(4, 1)
            i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
            cy = f * cx + i * g
            hy = o * cy.tanh()
            return hy, cy, torch.cat([i, f, g, o], 1)

    def backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
        with torch._C._DisableTorchDispatch():
            i, f, g, o = workspace.chunk(4, 1)
            tanh_cy = cy.tanh()
            gcy = torch.zeros_like(cy) if grad_cy is None else grad_cy.clone()
            go = torch.zeros_like(cy)
            if grad_hy is not None:
                gcy = gcy + grad_hy * o * (1 - tanh_cy * tanh_cy)
                go = grad_hy * tanh_cy
            grad_gates = torch.cat([gcy * g * i * (1 - i), gcy * cx * f * (1 - f), gcy * i * (1 - g * g),
                                    go * o * (1 - o)], 1)
            grad_bias = grad_gates.sum(0) if has_bias else torch.empty(0)
            return grad_gates, gcy * f, grad_bias

    EMULATED.update((forward.__code__, backward.__code__))
    library = torch.library.Library("aten", "IMPL")
    library.impl("_thnn_fused_lstm_cell", forward, "CPU")
    library.impl("_thnn_fused_lstm_cell_backward_impl", backward, "CPU")
    _LIBRARY.append(library)


def _native_dropout(self, x):
    """nmt's Dropout as CUDA runs it: ``nn.Dropout``'s one fused operator (``native_dropout``)
    in training, the input itself otherwise."""
    import torch
    if not self.training or self.p == 0:
        return x
    return torch.native_dropout(x, self.p, True)[0]


@contextlib.contextmanager
def model_as_on_cuda(patch: Callable[[Any, str, Any], None]) -> Iterator[None]:
    """The model's CUDA branches where the CPU can run them (see the module docstring)."""
    from nmt.models import decoder, dropout, inert_padding_lstm

    if hasattr(inert_padding_lstm, "MAX_GROUPS"):  # the CPU encoder's row groups read the host lengths
        # (a numpy copy, free on a GPU machine, where that encoder never runs): one call, as before them
        patch(inert_padding_lstm, "MAX_GROUPS", 1)
    if hasattr(decoder, "fused_cell_usable"):
        _register_fused_cell()
        import torch
        patch(decoder, "fused_cell_usable",
              lambda like, tensors: (not torch.compiler.is_compiling()
                                     and all(t.dtype == like.dtype for t in tensors)))
    patch(dropout.Dropout, "forward", _native_dropout)
    yield


# ----------------------------------------------------------------------------------------------
# Counting
# ----------------------------------------------------------------------------------------------

def _short(filename: str, nmt_dir: str) -> str:
    if filename == THIS_FILE:
        return "bench_host (stand-in)"
    if filename.startswith(nmt_dir):
        return "nmt/" + filename[len(nmt_dir):].lstrip("/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def _layer(filename: str, nmt_dir: str) -> str:
    if filename == THIS_FILE:
        return "stand-in"
    if filename.startswith(nmt_dir):
        part = filename[len(nmt_dir):].lstrip("/").split("/", 1)[0]
        return f"nmt.{part}" if not part.endswith(".py") else "nmt"
    for package in ("triton", "torch"):
        if f"/{package}/" in filename:
            return package
    return "other"


def count_ops(step: Callable[[], Any], nmt_dir: str) -> tuple[collections.Counter, collections.Counter]:
    """torch operators that ``step()`` dispatches: (by operator name, by site). A forward
    operator's site is the innermost nmt function on the stack; a backward one's the autograd
    node that runs it."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from op_counter import count_ops as count_dispatched

    by_site: collections.Counter = collections.Counter()
    current_node = torch._C._current_autograd_node

    def at_site(func: Any) -> None:
        node = current_node()
        if node is not None:
            by_site[f"backward: {node.name()}"] += 1
            return
        frame = sys._getframe(1)
        site = "other"
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith(nmt_dir):
                site = f"{_short(filename, nmt_dir)}:{frame.f_code.co_name}"
                break
            frame = frame.f_back
        by_site[site] += 1

    _, by_name = count_dispatched(step, at_site)
    return by_name, by_site


def count_calls(step: Callable[[], Any]) -> tuple[collections.Counter, int]:
    """Python function calls that ``step()`` makes, by code object, and the calls of built-in
    functions. The CPU kernels that stand in for CUDA ones (:data:`EMULATED`) are left out, with
    what they call."""
    calls: collections.Counter = collections.Counter()
    builtins = [0]
    skip = [0]

    def profile(frame, event, arg) -> None:
        if event == "call":
            code = frame.f_code
            if code in EMULATED:
                skip[0] += 1
            elif not skip[0]:
                calls[code] += 1
        elif event == "return":
            if frame.f_code in EMULATED:
                skip[0] -= 1
        elif event == "c_call" and not skip[0]:
            builtins[0] += 1

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return calls, builtins[0]


# ----------------------------------------------------------------------------------------------
# The runs
# ----------------------------------------------------------------------------------------------

def synthetic_batches(n: int, vocab: int, batch_size: int = 64, seed: int = 0) -> list:
    """Multi30k-like batches (as ``bench_train.synthetic_batches``): lengths 6-25 (source) and
    5-22 (target), ids drawn from ``vocab``; the lengths, hence the shapes, whatever ``vocab``."""
    import random

    from nmt.data.batching import collate, make_batches

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from id_lists import IdLists

    lengths, ids = random.Random(seed), random.Random(seed + 1)
    size = n * batch_size
    src = [[ids.randrange(4, vocab) for _ in range(lengths.randint(6, 25))] for _ in range(size)]
    tgt = [[ids.randrange(4, vocab) for _ in range(lengths.randint(5, 22))] for _ in range(size)]
    data = IdLists(src, tgt)
    order = make_batches(data, batch_size, "sentences", shuffle=True, seed=seed)
    return [collate(data, idx, PAD, BOS, EOS) for idx in order[:n]]


def build_row(config: dict, attention: str, output: str, vocab: int, size: int | None) -> Callable[[Any], Any]:
    """One setting's update, as ``bench_train.measure`` builds it (fp32, eager)."""
    import torch

    from nmt.models import build_model
    from nmt.sparse import get_loss
    from nmt.train.optimizers import build_optimizer
    from nmt.train.precision import TrainPrecision
    from nmt.train.update import loss_forward, update

    model_cfg = json.loads(json.dumps(config["model"]))
    model_cfg["attention"].update(mapping=attention, params={})
    model_cfg["output"].update(mapping=output, params={})
    if size is not None:
        model_cfg["embeddings"].update(src_size=size, tgt_size=size)
        model_cfg["encoder"].update(hidden_size=size)
        model_cfg["decoder"].update(hidden_size=size)
    torch.manual_seed(config["training"]["seed"])
    device = torch.device("cpu")
    model = build_model(model_cfg, vocab, vocab, PAD).to(device)
    model.train()
    loss_fn = get_loss(output)
    optimizer = build_optimizer(model.parameters(), config["training"]["optimizer"])
    clip = config["training"]["clip_grad_norm"]
    precision = TrainPrecision("fp32", device)

    def step(batch) -> Any:
        return update(model, loss_fn, optimizer, batch.to(device, lengths_on_host=True), PAD, clip,
                      precision=precision, forward=loss_forward)
    return step


def _commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def measure(args: argparse.Namespace) -> dict:
    import torch

    import nmt
    from nmt.config import load_config
    from nmt.sparse import _triton
    from nmt.utils.host_syncs import count_host_syncs_on

    torch.set_num_threads(args.threads)
    nmt_dir = os.path.dirname(os.path.abspath(nmt.__file__))
    root = Path(nmt_dir).parent
    config = load_config(root / "configs" / "multi30k_lstm.yaml", ["training.save_dir=unused"])
    vocab, size = (8000, None) if args.real else (args.vocab, args.size)
    batches = synthetic_batches(args.batches, vocab)
    launches: collections.Counter = collections.Counter()
    triton = _triton._import_triton()
    report: dict = {
        "root": str(root), "commit": _commit(root), "torch": torch.__version__,
        "triton": getattr(triton, "__version__", "?"), "threads": args.threads,
        "model": {"size": size or "config", "vocab": vocab, "batches": len(batches),
                  "batch_shapes": [[*b.src.shape, b.tgt_in.shape[1]] for b in batches],
                  "model_paths": "cpu" if args.cpu_model else "cuda branches"},
        "rounds": args.rounds, "rows": [],
    }
    with cuda_route(launches, args.cpu_model):
        steps = {label: build_row(config, *SETTINGS[label], vocab, size) for label in args.rows}

        def run(label: str) -> None:
            for batch in batches:
                steps[label](batch)

        for _ in range(args.warmup):  # the first compiles each kernel variant (Triton's disk cache after)
            for label in args.rows:
                run(label)
        n = len(batches)
        rows: dict[str, dict] = {}
        for label in args.rows:
            gc.collect()
            ops, sites = count_ops(lambda: run(label), nmt_dir)
            before = launches.copy()
            calls, builtins = count_calls(lambda: run(label))
            launched = launches - before
            _, syncs = count_host_syncs_on("cpu", lambda: run(label))
            rows[label] = {"ops": ops, "sites": sites, "calls": calls, "builtins": builtins,
                           "launched": launched, "syncs": syncs}
        host = {label: [] for label in args.rows}
        cpu = {label: [] for label in args.rows}
        for r in range(args.rounds):
            order = args.rows[r % len(args.rows):] + args.rows[:r % len(args.rows)]
            for label in order:
                gc.collect()
                wall, thread = time.perf_counter(), time.thread_time()
                run(label)
                host[label].append(1e3 * (time.perf_counter() - wall) / n)
                cpu[label].append(1e3 * (time.thread_time() - thread) / n)

    def names(counter: collections.Counter) -> collections.Counter:
        out: collections.Counter = collections.Counter()
        for code, k in counter.items():
            out[f"{_short(code.co_filename, nmt_dir)}:{getattr(code, 'co_qualname', code.co_name)}"] += k
        return out

    def layers(counter: collections.Counter) -> collections.Counter:
        out: collections.Counter = collections.Counter()
        for code, k in counter.items():
            out[_layer(code.co_filename, nmt_dir)] += k
        return out

    def per_update(counter: collections.Counter) -> dict:
        return {k: v / n for k, v in counter.most_common()}

    base = rows[BASELINE]
    for label in args.rows:
        row = rows[label]
        jit_runs = sum(k for code, k in row["calls"].items()
                       if code.co_name == "run" and code.co_filename.endswith(os.path.join("runtime", "jit.py")))
        entry = {
            "setting": label, "attention": SETTINGS[label][0], "output": SETTINGS[label][1],
            "torch_ops": sum(row["ops"].values()) / n, "python_calls": sum(row["calls"].values()) / n,
            "c_calls": row["builtins"] / n, "launches": sum(row["launched"].values()) / n,
            "launches_by_kernel": per_update(row["launched"]), "jit_runs": jit_runs / n,
            "host_syncs": row["syncs"] / n, "host_ms": min(host[label]), "cpu_ms": min(cpu[label]),
            "host_ms_rounds": host[label], "cpu_ms_rounds": cpu[label],
            "python_calls_by_layer": per_update(layers(row["calls"])),
            "torch_ops_by_name": per_update(row["ops"]),
            "torch_ops_by_site": per_update(row["sites"]),
            "python_calls_by_function": per_update(names(row["calls"])),
        }
        if label != BASELINE:
            calls = names(row["calls"])
            calls.subtract(names(base["calls"]))
            sites = collections.Counter(row["sites"])
            sites.subtract(base["sites"])
            ops = collections.Counter(row["ops"])
            ops.subtract(base["ops"])

            def largest(diff: collections.Counter) -> list:
                items = [(k, v / n) for k, v in diff.items() if v]
                items.sort(key=lambda kv: (-abs(kv[1]), kv[0]))
                return [[k, v] for k, v in items[:args.top]]
            entry["extra_vs_softmax"] = {"python_calls_by_function": largest(calls),
                                         "torch_ops_by_site": largest(sites),
                                         "torch_ops_by_name": largest(ops)}
        report["rows"].append(entry)
    return report


def print_report(report: dict, top: int) -> None:
    rows = report["rows"]
    base = rows[0]
    print(f"# bench_host: {report['root']} at {report['commit']}; torch {report['torch']}, triton "
          f"{report['triton']}, {report['threads']} thread(s); CUDA route on the CPU (stand-in sm_90 driver, "
          f"launches counted, not run); model {report['model']['model_paths']}, size {report['model']['size']}, "
          f"vocab {report['model']['vocab']}; per update, {report['model']['batches']} batches of "
          f"(B, S, T) {report['model']['batch_shapes']}; times: min of {report['rounds']} interleaved rounds")
    head = (f"{'attention / output':<22} {'torch ops':>9} {'py calls':>9} {'c calls':>8} {'launches':>8} "
            f"{'jit runs':>8} {'syncs':>5} {'host ms':>8} {'cpu ms':>7}  ratios to softmax: ops calls host cpu")
    print(head)
    for row in rows:
        print(f"{row['setting']:<22} {row['torch_ops']:>9.1f} {row['python_calls']:>9.1f} {row['c_calls']:>8.1f} "
              f"{row['launches']:>8.1f} {row['jit_runs']:>8.1f} {row['host_syncs']:>5.1f} {row['host_ms']:>8.2f} "
              f"{row['cpu_ms']:>7.2f}  {row['torch_ops'] / base['torch_ops']:.3f}x "
              f"{row['python_calls'] / base['python_calls']:.3f}x {row['host_ms'] / base['host_ms']:.3f}x "
              f"{row['cpu_ms'] / base['cpu_ms']:.3f}x")
    for row in rows:
        kernels = ", ".join(f"{k} {v:.1f}" for k, v in row["launches_by_kernel"].items()) or "none"
        layers = ", ".join(f"{k} {v:.0f}" for k, v in row["python_calls_by_layer"].items())
        print(f"  {row['setting']}: launches by kernel: {kernels}; python calls by layer: {layers}")
    for row in rows[1:]:
        extra = row["extra_vs_softmax"]
        print(f"# {row['setting']} minus softmax / softmax, per update "
              f"(torch ops {row['torch_ops'] - base['torch_ops']:+.1f}, "
              f"python calls {row['python_calls'] - base['python_calls']:+.1f}):")
        for title, key in (("python calls by function", "python_calls_by_function"),
                           ("torch ops by site", "torch_ops_by_site"), ("torch ops by operator", "torch_ops_by_name")):
            print(f"  {title}:")
            for name, delta in extra[key][:top]:
                print(f"    {delta:+8.1f}  {name}")


def _diff(now: dict, then: dict, top: int) -> list:
    keys = set(now) | set(then)
    items = [(k, now.get(k, 0.0) - then.get(k, 0.0)) for k in keys]
    items = [(k, d) for k, d in items if abs(d) > 1e-9]
    items.sort(key=lambda kv: (-abs(kv[1]), kv[0]))
    return items[:top]


def print_against(report: dict, other: dict, top: int) -> None:
    """Each setting of ``report`` against the same setting of ``other`` (another checkout's run)."""
    then = {row["setting"]: row for row in other["rows"]}
    print(f"# against {other['root']} at {other['commit']} (torch {other['torch']}, triton {other['triton']}), "
          f"per update: this run - that run")
    if other["model"]["batch_shapes"] != report["model"]["batch_shapes"]:
        print(f"#   other batches there ({other['model']['batch_shapes']}): the counts are not comparable")
    print(f"{'attention / output':<22} {'torch ops':>19} {'py calls':>19} {'c calls':>19} {'launches':>15} "
          f"{'cpu ms':>15}")
    pairs = [(row, then[row["setting"]]) for row in report["rows"] if row["setting"] in then]
    for row, old in pairs:
        cells = [f"{old[k]:.0f} -> {row[k]:.0f}" for k in ("torch_ops", "python_calls", "c_calls", "launches")]
        print(f"{row['setting']:<22} {cells[0]:>19} {cells[1]:>19} {cells[2]:>19} {cells[3]:>15} "
              f"{old['cpu_ms']:.2f} -> {row['cpu_ms']:.2f}")
    for row, old in pairs:
        print(f"# {row['setting']}: this run - that run")
        for title, key in (("python calls by function", "python_calls_by_function"),
                           ("torch ops by site", "torch_ops_by_site"), ("torch ops by operator", "torch_ops_by_name")):
            print(f"  {title}:")
            for name, delta in _diff(row[key], old[key], top):
                print(f"    {delta:+8.1f}  {name}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_imports(args)
    report = measure(args)
    print_report(report, args.top)
    if args.against is not None:
        print_against(report, json.loads(args.against.read_text()), args.top)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
