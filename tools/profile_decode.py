#!/usr/bin/env python
"""Where a Transformer's CPU decoding time goes: ``nmt.load`` of a checkpoint, ``translate`` of a
source file (batches of 64 sentences, max_length 100, certificates on, as the side-by-side
harness decodes), one process.

    python tools/profile_decode.py timers  --model best.pt --src test.de --beam 5 --threads 2
    python tools/profile_decode.py profile --model best.pt --src test.de --beam 1 --threads 1

``timers``: process CPU time and wall time of the search's phases (``encode``; the model's ``step``:
decoder layers, output layer and log-probabilities; the search step's selection; the state
reordering; the history; the n-best collection), best of ``--reps`` translations by CPU time, without
a profiler (its per-operator cost would inflate the many small operators of a step).

``profile``: one translation under ``torch.profiler`` (CPU) with a label around every sub-layer
(self-attention projections, attention, cross-attention, feed-forward, layer norms, residuals, the
output layer and mapping, the search's bookkeeping): per label path its time (the main thread's wall
time, profiler overhead included), the time between the operators inside it (Python overhead), and its
largest operators. The labels are method wrappers installed by this script only.

A warm-up translation of the first 64 lines precedes the measured ones (oneDNN's weights are packed
in the measured one again: the frozen region is per ``translate`` call). Timings on a machine shared
with other processes mean little in absolute terms; compare shares within one run.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import importlib
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import nmt  # noqa: E402

TIMED = (  # (module, owner attribute or "", method, label) for the timers
    ("nmt.models.transformer.model", "TransformerSeq2Seq", "encode", "encode"),
    ("nmt.models.transformer.model", "TransformerSeq2Seq", "step_with_scores", "step"),
    ("nmt.translate.beam_search", "", "select_step", "search: select_step"),
    ("nmt.translate.beam_search", "", "select_state", "search: select_state (state reordering)"),
    ("nmt.translate.history", "SearchHistory", "append", "search: history.append"),
    ("nmt.translate.beam_search", "", "_collect", "search: n-best collection"),
    ("nmt.translate.translator", "Translator", "translate", "translate"),
)
LABELLED = TIMED[:-1] + (  # the profile's finer labels
    ("nmt.models.transformer.layers", "EncoderLayer", "forward", "layer"),
    ("nmt.models.transformer.layers", "DecoderLayer", "forward", "layer"),
    ("nmt.models.transformer.multihead_attention", "MultiHeadAttention", "_self_projections", "qkv_proj"),
    ("nmt.models.transformer.multihead_attention", "MultiHeadAttention", "attend", "attend"),
    ("nmt.models.transformer.multihead_attention", "MultiHeadAttention", "forward", "cross_attention"),
    ("nmt.models.transformer.multihead_attention", "MultiHeadAttention", "packed_keys_values", "cross_kv_proj"),
    ("nmt.models.transformer.decoder", "TransformerDecoder", "cross_keys_values", "cross_kv"),
    ("nmt.models.transformer.feed_forward", "FeedForward", "forward", "feed_forward"),
    ("nmt.models.transformer.layers", "_Residual", "inputs", "norm"),
    ("nmt.models.transformer.layers", "_Residual", "add", "residual"),
    ("nmt.models.generator", "Generator", "forward", "output_layer"),
    ("nmt.models.generator", "Generator", "log_probs", "output_mapping_log_probs"),
    ("nmt.translate.beam_search", "", "_search", "search"),
)


@contextlib.contextmanager
def _installed(targets: tuple, around: Callable[[str, Callable, tuple, dict], Any]) -> Iterator[None]:
    """Within the block, each target method is a wrapper calling ``around(label, original, args,
    kwargs)``; the originals come back on exit."""
    undo = []
    try:
        for module_name, owner_name, method, label in targets:
            module = importlib.import_module(module_name)
            owner = getattr(module, owner_name) if owner_name else module
            original = owner.__dict__[method] if owner_name else getattr(owner, method)

            def wrapper(*args: Any, _orig: Callable = getattr(owner, method), _label: str = label,
                        **kwargs: Any) -> Any:
                return around(_label, _orig, args, kwargs)

            functools.update_wrapper(wrapper, getattr(owner, method))
            setattr(owner, method, wrapper)
            undo.append((owner, method, original))
        yield
    finally:
        for owner, method, original in reversed(undo):
            setattr(owner, method, original)


def _load(args: argparse.Namespace) -> tuple[Any, list[str]]:
    lines = Path(args.src).read_text(encoding="utf-8").splitlines()
    search = {"beam_size": args.beam}
    if args.beam > 1:
        search["length_penalty"] = "average"
    model = nmt.load(args.model, device="cpu", batch_size=64, max_length=100, **search)
    return model, lines


def timers(args: argparse.Namespace) -> None:
    """Print per-phase process CPU and wall time, best of ``--reps`` translations."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])

    def around(label: str, original: Callable, a: tuple, k: dict) -> Any:
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            entry = totals[label]
            entry[0] += time.process_time() - cpu
            entry[1] += time.perf_counter() - wall
            entry[2] += 1

    model, lines = _load(args)
    best: dict[str, list[float]] | None = None
    with _installed(TIMED, around):
        model.translate(lines[:64])
        for _ in range(args.reps):
            totals.clear()
            model.translate(lines)
            snapshot = {key: list(value) for key, value in totals.items()}
            if best is None or snapshot["translate"][0] < best["translate"][0]:
                best = snapshot
    assert best is not None
    cpu, wall, _ = best["translate"]
    print(f"beam {args.beam}, {args.threads} thread(s): translate {cpu:.3f} s CPU, {wall:.3f} s wall "
          f"(best of {args.reps} by CPU time)")
    for label, (c, w, n) in sorted(best.items(), key=lambda item: -item[1][0]):
        print(f"  {label:42s} CPU {c:7.3f} s {100 * c / cpu:5.1f}%   wall {w:7.3f} s {100 * w / wall:5.1f}%   calls {n}")


def profile(args: argparse.Namespace) -> None:
    """Print the labelled profile: per label path its time, the time between its operators, its top operators."""
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    def around(label: str, original: Callable, a: tuple, k: dict) -> Any:
        with record_function("#" + label):
            return original(*a, **k)

    model, lines = _load(args)
    with _installed(LABELLED, around):
        model.translate(lines[:64])
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            model.translate(lines)
            wall = time.perf_counter() - start

    def path(event: Any) -> str:
        names, parent = [], event.cpu_parent
        while parent is not None:
            if parent.name.startswith("#"):
                names.append(parent.name[1:])
            parent = parent.cpu_parent
        return "/".join(reversed(names))

    spans: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    operators: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for event in prof.events():
        if event.name.startswith("#"):
            where = "/".join(p for p in (path(event), event.name[1:]) if p)
            inside = sum(child.cpu_time_total for child in event.cpu_children)
            entry = spans[where]
            entry[0] += event.cpu_time_total
            entry[1] += event.cpu_time_total - inside
            entry[2] += 1
        elif event.cpu_parent is None or event.cpu_parent.name.startswith("#"):
            operators[path(event)][event.name] += event.cpu_time_total
    print(f"beam {args.beam}, {args.threads} thread(s): translate {wall:.3f} s wall under the profiler")
    print(f"  {'label path':58s} {'ms':>9s} {'share':>6s} {'between ops':>12s} {'calls':>6s}  largest operators (ms)")
    for where in sorted(spans):
        total, between, calls = spans[where]
        top = ", ".join(f"{name.split('::')[-1]} {us / 1e3:.1f}" for name, us in operators[where].most_common(4))
        print(f"  {where:58s} {total / 1e3:9.1f} {100 * total / 1e6 / wall:5.1f}% {between / 1e3:12.1f} {calls:6d}  {top}")


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` (default ``sys.argv[1:]``) and print the timers or the profile."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("timers", "profile"))
    parser.add_argument("--model", required=True, help="a Transformer checkpoint (best.pt)")
    parser.add_argument("--src", required=True, help="source sentences, one a line")
    parser.add_argument("--beam", type=int, default=5, help="beam size (1: greedy)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3, help="timers: translations, the best kept")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    (timers if args.what == "timers" else profile)(args)


if __name__ == "__main__":
    main()
