#!/usr/bin/env python
"""Benchmark training throughput: target tokens/second per attention / output mapping.

The model is the Multi30k LSTM of configs/multi30k_lstm.yaml, i.e. the OpenNMT-py peer
setting of issue 3: 2-layer bi-LSTM encoder (128 units per direction), 2-layer LSTM decoder
of 256 with general global attention and input feeding, embeddings 256, dropout 0.3, joint
sentencepiece vocabulary of 8000, batches of 64 sentences, Adam 1e-3, gradient norm 5,
2 threads. Every setting trains on the same batches from the same initial seed; the
throughput is target tokens (with EOS) per second of full update (forward, Fenchel-Young
loss, backward, clipping, Adam step; the batch's move to the device included, as in the trainer),
and each ratio is to softmax/softmax of the same run, model and step kind ("vs softmax": compiled rows
against the compiled softmax/softmax row, eager against eager; "vs eager": a compiled row
against its own eager row).

Every setting first trains ``--warmup`` untimed steps (default 100) from its initialisation:
right after initialisation the scores are nearly uniform, so sparse mappings have full
support and run their slowest path; after a few dozen updates their supports are small, as in
any real training run. ``--quick`` times the first steps and is a smoke run only.

Settings: softmax/softmax; output sparsemax, entmax15, entmax_bisect(1.5) with softmax
attention; attention sparsemax, entmax15, entmax_bisect(1.5) (and fusedmax when registered)
with softmax output; entmax15/entmax15 (Peters et al. 2019). With ``--transformer``, also the
Transformer of recipes/translation/configs/multi30k_transformer_*.yaml (3+3 layers, d_model 256,
4 heads) on the same batches: softmax, entmax15 and learned-alpha entmax attention with softmax
output, each ratio to the Transformer's own softmax / softmax row (issue 18 goal: entmax15
attention >= 0.8x the Transformer's softmax attention). Goals: entmax15 output
>= 0.85x softmax, entmax_bisect output >= 0.7x, entmax15 attention >= 0.9x. Against OpenNMT-py
this benchmark says nothing: a peer figure from another run or machine is no comparison; the
side-by-side harness (both toolkits in one session on one idle machine) measures that.

    python tools/bench_train.py                      # Multi30k de-en (--data-dir, default data/multi30k)
    python tools/bench_train.py --quick              # synthetic Multi30k-like batches, few steps
    python tools/bench_train.py --quick --batch-size 8 --threads 1   # a quicker smoke run
    python tools/bench_train.py --steps 200 --repeats 3 --json bench_train.json
    python tools/bench_train.py --transformer --only "softmax / softmax" "transformer: softmax / softmax"
    python tools/bench_train.py --device cuda --compile --only "entmax15 / entmax15"   # GPU section

Before timing, every setting runs one untimed step per distinct batch shape (compiling each
shape once: "warm-up s", start-up rather than steady-state time). Every row also gives ms per
step and host syncs per step (SyncAudit's count on the CPU, CUDA's
sync debug mode on CUDA); ``--compile`` adds training.compile rows (torch.compile of forward and
loss, lengths padded to ``--pad_to_multiple``); ``--precision bf16|fp16`` autocasts.
``--guided-alignment W`` adds a guided alignment row after each row (``training.guided_alignment``
of weight W; a Transformer's penultimate layer's first head supervised, as Garg et al.) against
a diagonal reference built on the host with every batch, as the trainer builds the real one: its
cost, printed as the ratio to the plain row of the same setting and step;
``--full-context-alignment`` makes the Transformer's guided rows align from the pass without the
future mask (``model.transformer.full_context_alignment``: a second pass up to that layer).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from nmt.utils.allocator import freeze_live_objects, keep_freed_memory, thaw_live_objects  # noqa: E402
from nmt.data.batching import collate, make_batches  # noqa: E402
from nmt.models import build_model  # noqa: E402
from nmt.sparse import get_loss  # noqa: E402
from nmt.train.optimizers import build_optimizer  # noqa: E402
from nmt.train.compile import compile_for_device, compile_loss_forward, pad_to_multiple  # noqa: E402
from nmt.train.guided_alignment import GuidedAlignment, GuidedForward  # noqa: E402
from nmt.train.precision import TrainPrecision  # noqa: E402
from nmt.train.update import loss_forward, update  # noqa: E402
from nmt.utils.host_syncs import host_sync_sites_on  # noqa: E402
from nmt.config import load_config, registered_mappings  # noqa: E402
from nmt.utils.io import atomic_write_text  # noqa: E402
from nmt.utils.device import make_current  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from id_lists import IdLists  # noqa: E402

CONFIG = ROOT / "configs" / "multi30k_lstm.yaml"
TRANSFORMER_CONFIG = ROOT / "recipes" / "translation" / "configs" / "multi30k_transformer_softmax.yaml"
PAD, BOS, EOS = 0, 2, 3
BISECT = ("entmax_bisect", {"alpha": 1.5})


def settings() -> list[tuple[str, tuple[str, dict], tuple[str, dict]]]:
    """(label, (attention mapping, params), (output mapping, params)); softmax/softmax first."""
    soft = ("softmax", {})
    out = [("softmax / softmax", soft, soft)]
    for name, params in (("sparsemax", {}), ("entmax15", {}), BISECT):
        out.append((f"softmax / {name}", soft, (name, params)))
    attention = [("sparsemax", {}), ("entmax15", {}), BISECT]
    if "fusedmax" in registered_mappings():
        attention.append(("fusedmax", {}))
    for name, params in attention:
        out.append((f"{name} / softmax", (name, params), soft))
    out.append(("entmax15 / entmax15", ("entmax15", {}), ("entmax15", {})))
    return out


def transformer_settings() -> list[tuple[str, tuple[str, dict], tuple[str, dict]]]:
    """The Transformer rows: softmax, entmax15 and learned-alpha attention, softmax output."""
    soft = ("softmax", {})
    return [(f"transformer: {label} / softmax", attention, soft) for label, attention in
            (("softmax", soft), ("entmax15", ("entmax15", {})),
             ("adaptive", ("entmax_bisect", {"alpha": "learned"})))]


BASELINES = ("softmax / softmax", "transformer: softmax / softmax")
"""Each model's softmax / softmax row: the baseline of its ratios, run whenever a row of that model is."""


def selected_runs(every: list, only: list[str] | None) -> list:
    """The rows of ``every`` that ``--only`` names (all without it), with the softmax / softmax
    row of each model among them (the LSTM's always: the first row, the run's reference), so
    that every "vs softmax" is to its own model's softmax row. Order as in ``every``."""
    if only is None:
        return list(every)
    transformer = any(label.startswith("transformer:") for label in only)
    base = {BASELINES[0]} | ({BASELINES[1]} if transformer else set())
    return [s for s in every if s[0] in only or s[0] in base]


def multi30k_batches(config: dict, n: int, work: Path):
    """The first ``n`` training batches of Multi30k (joint sentencepiece 8000, seeded order)."""
    from nmt.train.data_setup import load_training_data

    data = load_training_data(config["data"], work)
    order = make_batches(data.train, config["training"]["batch_size"], config["training"]["batch_type"],
                         shuffle=True, seed=config["training"]["seed"], epoch=0,
                         bucket_size=config["training"]["bucket_size"], pool_sort=config["training"]["pool_sort"])
    vocab = data.tgt_field.vocab
    assert (vocab.pad_index, vocab.bos_index, vocab.eos_index) == (PAD, BOS, EOS)
    batches = [collate(data.train, idx, PAD, BOS, EOS) for idx in order[:n]]
    return batches, len(data.src_field.vocab), len(vocab)


def synthetic_batches(n: int, batch_size: int = 64, vocab: int = 8000, seed: int = 0):
    """Multi30k-like random batches: lengths 6-25 (source) and 5-22 (target), vocabulary 8000."""
    rng = random.Random(seed)
    size = n * batch_size
    src = [[rng.randrange(4, vocab) for _ in range(rng.randint(6, 25))] for _ in range(size)]
    tgt = [[rng.randrange(4, vocab) for _ in range(rng.randint(5, 22))] for _ in range(size)]
    data = IdLists(src, tgt)
    order = make_batches(data, batch_size, "sentences", shuffle=True, seed=seed)
    return [collate(data, idx, PAD, BOS, EOS) for idx in order[:n]], vocab, vocab


def most_common_shapes(batches: list, n: int, k: int, multiple: int) -> list:
    """The first ``n`` of ``batches`` whose lengths, padded to ``multiple``, are among the ``k``
    most frequent padded shapes (order kept): few shapes, so that a compiled run's start-up
    (one compilation or CUDA-graph capture per shape) stays short."""
    def key(b):
        return tuple(-(-d // multiple) * multiple for d in (b.src.shape[1], b.tgt_in.shape[1]))
    counts: dict = {}
    for b in batches:
        counts[key(b)] = counts.get(key(b), 0) + 1
    keep = set(sorted(counts, key=counts.get, reverse=True)[:k])
    chosen = [b for b in batches if key(b) in keep][:n]
    if len(chosen) < n:
        raise SystemExit(f"bench_train: --max-shapes {k}: only {len(chosen)} of the {n} batches needed")
    return chosen


def diagonal_reference(batch) -> torch.Tensor:
    """(B, T, L) a diagonal reference alignment of the host ``batch``: target token t of a pair of
    m tokens and n source tokens aligned to source token round(t (n - 1) / (m - 1)) (the cost of
    guided alignment does not depend on which tokens are aligned)."""
    b, t_width, s_width = batch.tgt_in.size(0), batch.tgt_in.size(1), batch.src.size(1)
    n, m = batch.src_lengths.view(-1, 1), (batch.tgt_lengths - 1).view(-1, 1)
    t = torch.arange(t_width).view(1, -1)
    s = torch.round(t * (n - 1) / (m - 1).clamp(min=1)).long().clamp(0, s_width - 1)
    grid = torch.zeros(b, t_width, s_width)
    return grid.scatter_(2, s.unsqueeze(-1), (t < m).float().unsqueeze(-1))


def to_device(batch, device: torch.device):
    """The batch on ``device`` with its source lengths left on the host, as the trainer does."""
    return batch.to(device, lengths_on_host=True)


def measure(config: dict, attention, output, batches, src_vocab: int, tgt_vocab: int, warmup: int,
            device: torch.device = torch.device("cpu"), compiled: bool = False, precision: str = "fp32",
            pad_to: int = 1, model_section: dict | None = None, backend: str = "inductor",
            profile: int = 0, encoder_in_graph: bool = False, guided: float = 0.0,
            full_context: bool = False) -> dict:
    """Full updates over ``batches`` (after ``warmup`` untimed ones) on ``device``: target tokens
    per second, ms per step, and host syncs of one extra step (SyncAudit on the CPU,
    CUDA's sync debug mode on CUDA). ``compiled``: torch.compile of forward+loss (with
    ``pad_to``: lengths padded to a multiple, few shapes; ``backend``: torch.compile's backend);
    ``model_section``: another model. ``first_step_seconds``: the first update (a compiled run's
    compilation), which is always taken (one extra untimed step when ``warmup`` is 0).
    ``graphs_compiled``: the graphs dynamo compiled for this row (a compiled row starts from a
    reset: its own graphs, not an earlier row's). ``profile``: also where the counted step's host
    syncs are (``sync_sites``) and, after timing, :func:`profile_steps` over that many steps
    (``profile``). ``encoder_in_graph``: compiled with
    ``training.compile_encoder`` (an LSTM encoder inside the graph). ``guided`` > 0: training with
    guided alignment of that weight (:func:`diagonal_reference`; a Transformer's penultimate
    layer's first head; ``full_context``: from the pass without the future mask,
    ``model.transformer.full_context_alignment``)."""
    model_cfg = json.loads(json.dumps(model_section or config["model"]))
    if guided and "transformer" in model_cfg:
        layers = model_cfg["transformer"]["decoder_layers"]
        model_cfg["transformer"].update(alignment_layer=-2 if layers > 1 else -1, alignment_heads=1,
                                        full_context_alignment=full_context)
    model_cfg["attention"].update(mapping=attention[0], params=attention[1])
    model_cfg["output"].update(mapping=output[0], params=output[1])
    torch.manual_seed(config["training"]["seed"])
    model = build_model(model_cfg, src_vocab, tgt_vocab, PAD).to(device)
    model.train()
    loss_fn = get_loss(output[0], **output[1])
    optimizer = build_optimizer(model.parameters(), config["training"]["optimizer"])
    clip = config["training"]["clip_grad_norm"]
    if compiled:
        # this row's own graphs: dynamo inlines nn modules (parameters are graph inputs, guarded by
        # their properties, not by the model's identity), so a later row's model would run the graphs
        # compiled for an earlier row's wherever they agree (the encoder's and the bridge's), and on
        # CUDA the CUDA-graph trees would first try, at every step, the earlier model's recording
        # (logged as re-recording, "static input data pointer changed", under TORCH_LOGS=cudagraphs:
        # 72 times in the H200's run of 2026-11-27). The reset also frees the earlier graphs' memory.
        torch._dynamo.reset()
    graphs_before = _graphs_compiled()
    forward = compile_loss_forward(device, backend=backend, encoder_in_graph=encoder_in_graph) if compiled \
        else loss_forward
    if guided:
        heads = model.alignment_attention
        forward = GuidedForward(GuidedAlignment(guided, get_loss(heads.mapping, **heads.params), heads.mapping,
                                                heads.heads),
                                (lambda fn: compile_for_device(fn, device, backend, encoder_in_graph)) if compiled
                                else None)
    train = TrainPrecision(precision, device)
    batches = [pad_to_multiple(b, pad_to if compiled else 1, PAD) for b in batches]

    def step(batch, phases: PhaseTimer | None = None):
        # the host batch moved to the device inside the step, as the trainer does
        if guided:  # the reference built on the host with the batch, as the trainer builds it
            batch = dataclasses.replace(batch, align=diagonal_reference(batch))
        if phases is None:
            return update(model, loss_fn, optimizer, to_device(batch, device), PAD, clip, precision=train,
                          forward=forward)
        moved = phases.run("batch to device", to_device, batch, device)
        return update(model, loss_fn, optimizer, moved, PAD, clip, precision=phases.precision(train),
                      forward=phases.wrap("forward + loss", forward))

    skips = cudagraph_skips()
    start = time.perf_counter()
    step(batches[0])
    _synchronize(device)
    first_step = time.perf_counter() - start
    for batch in batches[1:warmup]:
        step(batch)
    # one untimed step per distinct batch shape of the timed steps: a compiled step compiles
    # (or captures) each shape once, which is start-up, not steady-state, time
    shapes = {(tuple(b.src.shape), tuple(b.tgt_in.shape)): b for b in batches[warmup:]}
    start = time.perf_counter()
    for batch in shapes.values():
        step(batch)
    _synchronize(device)
    shape_warmup = time.perf_counter() - start
    graphs = _graphs_compiled() - graphs_before  # (before the sync count: on the CPU its wrappers compile too)
    _, sites = host_sync_sites_on(device, lambda: step(batches[0]))
    syncs = sum(sites.values())
    _synchronize(device)
    tokens = 0
    start = time.perf_counter()
    for batch in batches[warmup:]:
        _, n, _ = step(batch)
        tokens += n
    _synchronize(device)
    seconds = time.perf_counter() - start
    timed = max(len(batches) - warmup, 1)
    figures = {"tokens_per_sec": tokens / seconds, "ms_per_step": 1000.0 * seconds / timed, "syncs_per_step": syncs,
               "shapes": len(shapes), "shape_warmup_seconds": shape_warmup, "first_step_seconds": first_step,
               "cudagraph_skips": cudagraph_skips() - skips, "graphs_compiled": graphs}
    if profile:
        figures["sync_sites"] = dict(sites.most_common())
        try:  # the timing above stands even where the profiler fails (e.g. with CUDA graphs)
            figures["profile"] = profile_steps(device, step, batches[warmup:][:profile])
        except Exception as exc:  # noqa: BLE001 - reported in the output, not fatal
            figures["profile"] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        # on CUDA with the backward on the calling thread: cProfile then sees the backward's Python
        figures["python"] = python_profile(device, step, batches[warmup:][:profile],
                                           caller_backward=device.type == "cuda")
        figures["phases"] = phase_profile(device, step, batches[warmup:][:profile])
        if device.type == "cuda":  # the A/B of autograd's device thread (no such thread on the CPU)
            figures["phases_caller_backward"] = phase_profile(device, step, batches[warmup:][:profile],
                                                              caller_backward=True)
    return figures


class PhaseTimer:
    """Wall time of a step's phases, the device synchronised at every boundary so that each
    phase's time is its own (on a host-bound step, the host's). A phase is a call wrapped by
    :meth:`run` / :meth:`wrap`, or a :class:`~nmt.train.precision.TrainPrecision` method
    (backward, clip, optimizer step) of the proxy :meth:`precision` returns."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kwargs):
        _synchronize(self.device)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _synchronize(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def wrap(self, name: str, fn):
        return lambda *args, **kwargs: self.run(name, fn, *args, **kwargs)

    def precision(self, train: TrainPrecision):
        timer = self

        class Timed:  # the timed methods as instance attributes; everything else is train's
            def __init__(self) -> None:
                self.backward = timer.wrap("backward", train.backward)
                self.clip = timer.wrap("clip", train.clip)
                self.step = timer.wrap("optimizer step", train.step)

            def __getattr__(self, name: str):
                return getattr(train, name)
        return Timed()


def phase_profile(device: torch.device, step, batches: list, caller_backward: bool = False) -> dict:
    """``step(batch, phases)`` over ``batches`` with a :class:`PhaseTimer`: ms per step of each
    phase (batch to device, forward + loss, backward, clip, optimizer step) and of the rest
    (the source mask, zero_grad, Python between the phases), and the synchronised step's total.
    Tells which phase a step's time over another's is in (on CUDA the backward runs on
    autograd's device thread, which cProfile does not see). ``caller_backward``: autograd's
    multithreading off (``torch.autograd.set_multithreading_enabled(False)``), so that the
    backward runs on the calling thread: the A/B of the device thread, whose Python nodes (the
    mappings' and losses' backward) each take the GIL there."""
    n = max(len(batches), 1)
    timer = PhaseTimer(device)
    _synchronize(device)
    start = time.perf_counter()
    with torch.autograd.set_multithreading_enabled(not caller_backward):
        for batch in batches:
            step(batch, timer)
        _synchronize(device)
    total = 1000.0 * (time.perf_counter() - start) / n
    ms = {name: 1000.0 * s / n for name, s in timer.seconds.items()}
    ms["rest"] = max(total - sum(ms.values()), 0.0)
    return {"ms_per_step": ms, "total_ms_per_step": total}


def profile_steps(device: torch.device, step, batches: list) -> dict:
    """``step`` over ``batches`` under ``torch.profiler``. On CUDA: GPU kernels per step, the
    kernels' time per step (ms; with the step's wall time, how busy the GPU is) and the kernels
    taking most of it; on the CPU: the operators with the most self time per step."""
    from torch.profiler import ProfilerActivity, profile

    on_cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    _synchronize(device)
    with profile(activities=activities) as prof, labelled_triton_launches():
        for batch in batches:
            step(batch)
        _synchronize(device)
    n = max(len(batches), 1)
    kernels, host = [], []  # (ms per step, calls per step, name), GPU kernels and host operators
    for e in prof.key_averages():
        if "cuda" in str(getattr(e, "device_type", "")).lower():
            us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
            kernels.append((us / n / 1000.0, e.count / n, e.key))
        else:
            host.append((e.self_cpu_time_total / n / 1000.0, e.count / n, e.key))
    rows = sorted(kernels if on_cuda else host, reverse=True)
    ours = [r for r in rows if NMT_KERNELS.match(r[2])]  # nmt.sparse's Triton kernels (CUDA only)
    figures = {"device_ms_per_step": sum(r[0] for r in rows), "calls_per_step": sum(r[1] for r in rows),
               "top": _top(rows, 10),
               "nmt_kernels": {"ms_per_step": sum(r[0] for r in ours), "calls_per_step": sum(r[1] for r in ours)},
               "what": "GPU kernels" if on_cuda else "CPU operators (self time)"}
    if on_cuda:  # where the host's time goes (a host-bound step: launches, graph replays, Python)
        figures["host_top"] = _top(sorted(host, reverse=True), 12)
        figures["host_ms_per_step"] = sum(r[0] for r in host)
    return figures


def python_profile(device: torch.device, step, batches: list, k: int = 12, caller_backward: bool = False) -> dict:
    """``step`` over ``batches`` under ``cProfile``: the Python functions (and the C functions they
    call: torch operators, launches) with the most own time per step, to find host time that no
    operator accounts for (a host-bound step: Python in nmt, Triton's launcher, autograd). cProfile
    slows small functions down, so the figures rank rather than measure. ``caller_backward``: the
    backward on the calling thread (see :func:`phase_profile`), where cProfile sees it."""
    import cProfile
    import pstats

    n = max(len(batches), 1)
    _synchronize(device)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    with torch.autograd.set_multithreading_enabled(not caller_backward):
        profiler.enable()
        for batch in batches:
            step(batch)
        _synchronize(device)
        profiler.disable()
    wall = time.perf_counter() - start
    rows = []
    for (file, line, func), (_, calls, own, _, _) in pstats.Stats(profiler).stats.items():
        where = file.split("site-packages/")[-1].replace(str(ROOT) + "/", "")
        rows.append((1000.0 * own / n, calls / n, f"{where}:{line}({func})"))
    rows.sort(reverse=True)
    return {"ms_per_step": 1000.0 * wall / n, "top": _top(rows, k), "caller_backward": caller_backward}


def _top(rows: list, k: int) -> list[dict]:
    """The first ``k`` of sorted (ms per step, calls per step, name) rows, as the JSON holds them."""
    return [{"ms_per_step": ms, "calls_per_step": c, "name": name[:90]} for ms, c, name in rows[:k]]


@contextlib.contextmanager
def labelled_triton_launches():
    """While profiling: each launch of nmt's Triton kernels (eager steps; a compiled step calls
    them inside its graphs) inside a ``record_function("nmt triton launch: <kernel>")``, so
    that the host's time in Triton's launcher shows among the host operators."""
    try:
        from nmt.sparse import _triton
    except ImportError:
        yield
        return
    original = _triton._kernels

    class Labelled:
        def __init__(self, name: str, kernel) -> None:
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            launch = self.kernel[grid]

            def run(*args, **kwargs):
                with torch.profiler.record_function(f"nmt triton launch: {self.name}"):
                    return launch(*args, **kwargs)
            return run

    def kernels(x=None):  # the signature of _triton._kernels (the tensor picks the flavour)
        k = original(x)
        return type("Kernels", (), {name: Labelled(name, getattr(k, name))
                                    for name in _triton.KERNEL_NAMES})()

    _triton._kernels = kernels
    try:
        yield
    finally:
        _triton._kernels = original


def cudagraph_skips() -> int:
    """How many times inductor has declined CUDA graphs for a graph in this process (its
    counter; the reasons are logged with ``TORCH_LOGS=cudagraphs``); 0 before dynamo is used."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters
    return int(counters["inductor"]["cudagraph_skips"])


NMT_KERNELS = re.compile(r"_((ce_)?(forward|backward)|finish)_kernel\b")
"""Names of the Triton kernels of :mod:`nmt.sparse._triton` (the mappings, their backward, the
losses, the index losses' reduction)."""


def _graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process (its ``unique_graphs`` counter; 0 before dynamo
    is used)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def print_profile(figures: dict, ms_per_step: float) -> None:
    """The ``--profile`` lines under a row: host sync sites, then the profile's summary."""
    for site, n in figures["sync_sites"].items():
        print(f"    host sync x{n}: {site}")
    prof = figures["profile"]
    if "error" in prof:
        print(f"    profile failed: {prof['error']}")
        return
    print(f"    profile: {prof['what']}: {prof['calls_per_step']:.0f} per step, {prof['device_ms_per_step']:.2f} ms "
          f"per step ({prof['device_ms_per_step'] / ms_per_step:.0%} of the timed step's {ms_per_step:.1f} ms)")
    if prof["nmt_kernels"]["calls_per_step"]:
        print(f"    nmt's Triton kernels: {prof['nmt_kernels']['calls_per_step']:.0f} per step, "
              f"{prof['nmt_kernels']['ms_per_step']:.3f} ms per step")
    for row in prof["top"]:
        print(f"      {row['ms_per_step']:7.3f} ms {row['calls_per_step']:6.1f}x  {row['name']}")
    if "host_top" in prof:
        print(f"    host: operators' self CPU time {prof['host_ms_per_step']:.2f} ms per step (profiled); the most:")
        for row in prof["host_top"]:
            print(f"      {row['ms_per_step']:7.3f} ms {row['calls_per_step']:6.1f}x  {row['name']}")
    for key, what in (("phases", ""), ("phases_caller_backward", ", backward on the calling thread")):
        phases = figures.get(key)
        if phases:
            print(f"    phases (synchronised at each boundary{what}; {phases['total_ms_per_step']:.1f} ms a step "
                  "there): " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in phases["ms_per_step"].items()))
    python = figures.get("python")
    if python:
        where = ", backward on the calling thread" if python.get("caller_backward") else ""
        print(f"    python: own time per step under cProfile{where} ({python['ms_per_step']:.1f} ms a step there); "
              "the most:")
        for row in python["top"]:
            print(f"      {row['ms_per_step']:7.3f} ms {row['calls_per_step']:6.1f}x  {row['name']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="synthetic batches, 1 warmup + 3 timed steps")
    parser.add_argument("--data", choices=("multi30k", "synthetic"), default=None,
                        help="batches (default: multi30k, synthetic with --quick)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per setting (default 100; quick 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per setting (default 100; quick 1)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per setting, in rounds over all settings (each round runs every row "
                             "once, so a drift of the machine or the order of the rows weighs on all "
                             "alike); the median is reported, each row printed in the last round")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (peer setting: 2)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                        help="sentences per batch (default: the config's, 64, the peer setting); smaller "
                             "batches make a quicker smoke run, their figures no peer comparison")
    parser.add_argument("--only", nargs="+", default=None, help="labels to run, e.g. 'softmax / entmax15'")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here (atomically)")
    parser.add_argument("--transformer", action="store_true",
                        help="also the Multi30k Transformer recipe's model (ratios to its own softmax / softmax)")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data" / "multi30k",
                        help="Multi30k train/val .de/.en (recipes/translation/prepare.py multi30k writes them)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--compile", action="store_true", help="also time training.compile (torch.compile)")
    parser.add_argument("--compile-encoder", action="store_true",
                        help="the compiled rows with training.compile_encoder (an LSTM encoder inside the graph)")
    parser.add_argument("--backend", default="inductor",
                        help="torch.compile backend of the compiled rows (default inductor, what training.compile "
                             "uses; aot_eager: capture and autograd without code generation)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--guided-alignment", type=float, default=0.0, metavar="W",
                        help="also time each row with guided alignment of weight W (its cost)")
    parser.add_argument("--full-context-alignment", action="store_true",
                        help="the Transformer's guided rows align from the pass without the future mask "
                             "(model.transformer.full_context_alignment)")
    parser.add_argument("--pad_to_multiple", type=int, default=8, help="length bucket of the compiled runs")
    parser.add_argument("--max-shapes", type=int, default=None,
                        help="only batches of the K most frequent shapes (lengths padded to --pad_to_multiple), "
                             "for every setting: compiled runs then compile K shapes")
    parser.add_argument("--profile", type=int, default=0, metavar="K",
                        help="after every row was timed, a second pass building each row again: where one "
                             "step's host syncs are, K steps under "
                             "torch.profiler (CUDA: kernels per step, their ms per step, the top kernels, the "
                             "host's operators), K more under cProfile (the Python functions' own time) and K "
                             "more with the phases timed (forward, backward, clip, optimizer step); on CUDA "
                             "K more phases with the backward on the calling thread instead of autograd's "
                             "device thread (cProfile too runs the backward there)")
    parser.add_argument("--load", default=None, help="label printed with the figures, e.g. 'idle' or "
                        "'loaded: 8 jobs on 2 cores' (figures under load are not speed claims)")
    args = parser.parse_args(argv)
    keep_freed_memory()  # as nmt-train / nmt-translate do
    steps = args.steps if args.steps is not None else (3 if args.quick else 100)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 100)
    source = args.data or ("synthetic" if args.quick else "multi30k")
    device = torch.device(args.device)
    make_current(device)  # CUDA events and synchronisation below take the current device's
    torch.set_num_threads(args.threads)
    config = load_config(CONFIG, ["training.save_dir=unused"] + [
        f"data.{split}.{side}={args.data_dir / f'{name}.{lang}'}"
        for split, name in (("train", "train"), ("valid", "val")) for side, lang in (("src", "de"), ("tgt", "en"))]
        + ([f"training.batch_size={args.batch_size}"] if args.batch_size is not None else []))

    wanted = warmup + steps
    drawn = wanted if args.max_shapes is None else 12 * wanted  # filtered below
    if source == "multi30k":
        with tempfile.TemporaryDirectory() as work:
            batches, src_vocab, tgt_vocab = multi30k_batches(config, drawn, Path(work))
    else:
        batches, src_vocab, tgt_vocab = synthetic_batches(drawn, config["training"]["batch_size"])
    if args.max_shapes is not None:
        batches = [pad_to_multiple(b, args.pad_to_multiple, PAD)
                   for b in most_common_shapes(batches, wanted, args.max_shapes, args.pad_to_multiple)]
    transformer_model = None
    every = settings()
    if args.transformer:
        transformer_model = load_config(TRANSFORMER_CONFIG, ["training.save_dir=unused"])["model"]
        every += transformer_settings()
    runs = selected_runs(every, args.only)
    modes = ["eager", "compiled"] if args.compile else ["eager"]
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"# bench_train: {source} batches of {config['training']['batch_size']} sentences, vocab "
          f"{src_vocab}/{tgt_vocab}, {warmup} warmup + {steps} timed steps, device {device} ({machine}), "
          f"{args.threads} threads, precision {args.precision}, torch {torch.__version__}"
          + (f"; the {args.max_shapes} most frequent shapes only" if args.max_shapes else "")
          + (f"; load: {args.load}" if args.load else "")
          + ("; compiled with training.compile_encoder" if args.compile and args.compile_encoder else ""))
    print(f"{'attention / output':<34} {'step':<9} {'tokens/s':>10} {'ms/step':>8} {'syncs/step':>10} "
          f"{'vs softmax':>10} {'vs eager':>8} {'shapes':>6} {'warm-up s':>9} {'first step s':>12}")
    freeze_live_objects()  # as nmt-train does once loaded: full collections skip torch's and the data's objects
    try:
        results = []
        baselines: dict = {}  # per model and step kind: its softmax / softmax row (the first of them)
        jobs = [(label, attention, output, mode) for label, attention, output in runs for mode in modes]
        if args.guided_alignment:  # each row followed by its guided row
            jobs = [job for plain in jobs for job in (plain, (plain[0] + " + guided", *plain[1:]))]
        measured: dict = {job[0::3]: [] for job in jobs}  # (label, mode): one figure per round
        eager_speeds: dict = {}
        for round_ in range(args.repeats):
            for label, attention, output, mode in jobs:
                section = transformer_model if label.startswith("transformer:") else None
                model_kind = "lstm" if section is None else "transformer"
                guided = args.guided_alignment if label.endswith(" + guided") else 0.0
                measured[label, mode].append(  # timed without profiling (see the profile pass below)
                    measure(config, attention, output, batches, src_vocab, tgt_vocab, warmup, device,
                            mode == "compiled", args.precision, args.pad_to_multiple, section, args.backend,
                            0, args.compile_encoder, guided, args.full_context_alignment))
                if round_ < args.repeats - 1:
                    continue
                figures = measured[label, mode]
                speed = statistics.median(f["tokens_per_sec"] for f in figures)
                ms = statistics.median(f["ms_per_step"] for f in figures)
                syncs = figures[0]["syncs_per_step"]
                shapes, warm = figures[0]["shapes"], statistics.median(f["shape_warmup_seconds"] for f in figures)
                first = statistics.median(f["first_step_seconds"] for f in figures)
                baseline = baselines.setdefault((model_kind, mode), speed)  # compiled against compiled softmax
                eager_speed = eager_speeds.setdefault(label, speed)  # the setting's first (eager) row
                results.append({"setting": label, "attention": attention[0], "output": output[0], "step": mode,
                                "tokens_per_sec": speed, "ms_per_step": ms, "syncs_per_step": syncs,
                                "ratio_to_softmax": speed / baseline, "ratio_to_eager": speed / eager_speed,
                                "shapes": shapes, "shape_warmup_seconds": warm, "first_step_seconds": first,
                                "backend": args.backend if mode == "compiled" else None,
                                "encoder_in_graph": mode == "compiled" and args.compile_encoder})
                print(f"{label:<34} {mode:<9} {speed:>10.0f} {ms:>8.1f} {syncs:>10d} {speed / baseline:>9.2f}x "
                      f"{speed / eager_speed:>7.2f}x {shapes:>6d} {warm:>9.1f} {first:>12.1f}", flush=True)
                if guided:  # its cost: against the plain row of the same setting and step
                    plain = next(r for r in results if r["setting"] == label[:-len(" + guided")] and r["step"] == mode)
                    results[-1]["ratio_to_plain"] = speed / plain["tokens_per_sec"]
                    print(f"    guided alignment (weight {guided:g}): {speed / plain['tokens_per_sec']:.2f}x the "
                          "plain row's tokens/s")
                if figures[0]["cudagraph_skips"]:
                    print(f"    inductor declined CUDA graphs {figures[0]['cudagraph_skips']} times in this run "
                          f"(reasons: TORCH_LOGS=cudagraphs)")
                results[-1]["cudagraph_skips"] = figures[0]["cudagraph_skips"]
                if mode == "compiled":  # per step: one graph per piece between graph breaks (and per shape)
                    results[-1]["graphs_compiled"] = figures[0]["graphs_compiled"]
                    print(f"    {figures[0]['graphs_compiled']} graphs compiled for this row")
        if args.profile:
            # a second pass, after every row was timed: a torch.profiler session leaves CUPTI
            # subscribed on CUDA (pytorch#144455: later work 10-20% slower), so a row profiled
            # right after its timing slowed every row timed after it (the H200's 1.5-entmax rows,
            # 2026-11-27); each row is built (and compiled) again here, its timing not reported
            print("# profiles (a second pass, after every row was timed)")
            for (label, attention, output, mode), row in zip(jobs, results):
                section = transformer_model if label.startswith("transformer:") else None
                profiled = measure(config, attention, output, batches, src_vocab, tgt_vocab, warmup, device,
                                   mode == "compiled", args.precision, args.pad_to_multiple, section,
                                   args.backend, args.profile, args.compile_encoder,
                                   args.guided_alignment if label.endswith(" + guided") else 0.0,
                                   args.full_context_alignment)
                print(f"{label} ({mode}):")
                print_profile(profiled, row["ms_per_step"])
                row.update(sync_sites=profiled["sync_sites"], profile=profiled["profile"],
                           python=profiled["python"], phases=profiled["phases"],
                           phases_caller_backward=profiled.get("phases_caller_backward"))
    finally:
        thaw_live_objects()
    if args.json is not None:
        atomic_write_text(args.json, json.dumps({"data": source, "steps": steps, "warmup": warmup,
                                                 "batch_size": config["training"]["batch_size"],
                                                 "threads": args.threads,
                                                 "device": str(device), "precision": args.precision,
                                                 "load": args.load,
                                                 "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
