#!/usr/bin/env python
"""``training.checkpoint_activations``: the activation memory it saves and the step time it costs, on
the side-by-side harness's Transformer (``tools/peer_bench/nmt_transformer.yaml``: 3+3 layers,
d_model 256, 4 heads, d_ff 1024, dropout on, batches of 64 sentences) on Multi30k's first batches, CPU.

    python tools/bench_checkpointing.py memory          # bytes held for the backward, peak of the step
    python tools/bench_checkpointing.py time --passes 8 # process CPU ms per update, alternating passes

``memory``: per batch, the forward (with the loss) and the backward run under ``torch.profiler``
with ``profile_memory``; its allocation events, in time order, give the bytes the forward leaves
allocated (what autograd holds for the backward, and the loss) and the step's peak of allocated bytes
over its start (forward, then backward with the forward's bytes still held); the mean over the
batches for each setting. ``time``: full updates (forward, loss, backward, Adam) over the same
batches, passes alternating between the two settings on two identical models, **process CPU time**
(all threads of this process: figures of a shared machine still mean something, but a second busy
process on 2 cores slows torch; compare only figures of one run); the minima and the median of the
passes' ratios. ``--batch-size`` scales the batches (sentences).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench_cross_kv import PAD, batches, config, harness_arguments, harness_start, sized, trainer  # noqa: E402
from nmt.models.transformer.checkpointing import set_activation_checkpointing  # noqa: E402
from nmt.sparse import get_loss  # noqa: E402
from nmt.train.update import loss_forward  # noqa: E402


def allocation_curve(prof) -> list[int]:
    """The running sum of a profile's allocation events (bytes allocated minus freed, CPU) in time order
    (kineto's raw ``[memory]`` events: the legacy ``events()`` fold most of them into their ops)."""
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    out, total = [], 0
    for _, delta in events:
        total += delta
        out.append(total)
    return out


def step_memory(model: torch.nn.Module, loss_fn, batch) -> tuple[int, int]:
    """(bytes the forward and loss leave allocated, the step's peak of allocated bytes over its start)
    of one forward + backward of ``batch`` (gradients cleared first)."""
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as forward:
        loss = loss_forward(model, loss_fn, batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, PAD, 0.0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as backward:
        loss.backward()
    ahead = allocation_curve(forward)
    held = ahead[-1] if ahead else 0
    peak = max([0, *ahead, *(held + b for b in allocation_curve(backward))])
    return held, peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("memory", "time"))
    harness_arguments(parser, warmup=5, passes=6, batches_help="batches measured (of one timed pass)",
                      passes_help="time: passes per setting")
    args = parser.parse_args(argv)
    harness_start(args, "bench_checkpointing")
    cfg = sized(config(args.data_dir, args.spm, "target"), args)
    some, src_vocab, tgt_vocab = batches(cfg, args.warmup + args.batches)
    measured = some[args.warmup:]
    tokens = sum(b.n_tokens for b in measured) / len(measured)
    print(f"{len(measured)} batches of {cfg['training']['batch_size']} sentences, {tokens:.0f} target tokens each on "
          f"average, {args.threads} threads")
    models = {}
    for checkpointed in (False, True):
        model, step = trainer(cfg, src_vocab, tgt_vocab)
        set_activation_checkpointing(model, checkpointed)
        for b in some[:args.warmup]:
            step(b)
        models[checkpointed] = (model, step)
    if args.mode == "memory":
        loss_fn = get_loss(cfg["model"]["output"]["mapping"])
        rows = {}
        for checkpointed, (model, _) in models.items():
            pairs = [step_memory(model, loss_fn, b) for b in measured]
            rows[checkpointed] = [statistics.mean(x) / 2 ** 20 for x in zip(*pairs)]
        for checkpointed, (held, peak) in rows.items():
            print(f"checkpoint_activations {str(checkpointed).lower():5}: held for the backward {held:7.1f} MiB, "
                  f"step peak {peak:7.1f} MiB")
        (h0, p0), (h1, p1) = rows[False], rows[True]
        print(f"saved: {1 - h1 / h0:.1%} of the held bytes, {1 - p1 / p0:.1%} of the peak")
        return 0
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.passes):
        for checkpointed, (_, step) in models.items():
            start = time.process_time()
            for b in measured:
                step(b)
            times[checkpointed].append(1000.0 * (time.process_time() - start) / len(measured))
    for checkpointed, ms in times.items():
        print(f"checkpoint_activations {str(checkpointed).lower():5}: min {min(ms):7.1f} ms, "
              f"median {statistics.median(ms):7.1f} ms per update (process CPU time)")
    ratios = [b / a for a, b in zip(times[False], times[True])]
    print(f"median of the passes' ratios (checkpointed / plain): {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
