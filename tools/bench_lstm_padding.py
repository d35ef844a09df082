#!/usr/bin/env python
"""What the source padding costs the LSTM's training step: process CPU time of the side-by-side
harness's LSTM (``tools/peer_bench/nmt_softmax.yaml``: 2-layer bi-LSTM encoder 2 x 128, 2-layer LSTM
decoder 256, general attention, input feeding, batches of 64 sentences, one length-sorted pool of
the whole corpus) on Multi30k's first batches, CPU only.

    python tools/bench_lstm_padding.py share --pool-sort target --mapping softmax
    python tools/bench_lstm_padding.py share --pool-sort target_source --mapping entmax15
    python tools/bench_lstm_padding.py ab --passes 12       # alternating passes: row groups vs one call per layer
    python tools/bench_lstm_padding.py step --passes 8      # min / median ms per step (base vs new checkouts)

``share`` times, on the same model (trained ``--warmup`` updates) and batches, passes alternating:

* the full update (forward, loss, backward, Adam, clipping) on each batch;
* forward and backward of the whole model (embeddings, encoder, attention keys, teacher-forced
  decoder, loss) on each batch as it is, and on the batch's *ideal*: the same targets, the same
  number of real source tokens (rounded up to a multiple of B) laid out as B sources of one length
  ``ceil(real / B)``, no padding; the difference is what the padding costs the step if nothing
  computed it (a bound: no packing reaches it, since a row's recurrence cannot be shared);
* the same for the source embeddings and encoder alone (forward and backward): the encoder's part of
  that cost; the rest (the attention keys' projection, the scores, the mapping and the context
  over padded keys) is the attention's part.

``ab`` runs the same model over the same batches, passes alternating between the training
encoder's row groups (:func:`nmt.models.inert_padding_lstm.row_groups`, the default) and one fused
call per layer over the padded batch (``MAX_GROUPS = 1``, the encoder before them), and reports both
minima and the median of the passes' ratios (one call / groups).

``--mapping`` sets both the attention and the output mapping (softmax, entmax15, ...). Process CPU
time (all threads of this process) so that figures taken on a shared machine mean something; on 2
cores a second busy process still slows torch, so compare only figures of one run.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import torch  # noqa: E402

from bench_cross_kv import (CONFIGS, EOS, PAD, batches, harness_arguments, harness_start, ms_per_step,  # noqa: E402
                            padded_share, sized, trainer)
from bench_cross_kv import config as harness_config  # noqa: E402
from nmt.train.update import loss_forward  # noqa: E402


def config(data_dir: Path, spm: Path, pool_sort: str, mapping: str) -> dict:
    """The harness's LSTM config with ``mapping`` as its attention and output mapping."""
    return harness_config(data_dir, spm, pool_sort, CONFIGS["lstm"],
                          (f"model.attention.mapping={mapping}", f"model.output.mapping={mapping}"))


def ideal(batch):
    """``batch`` with its sources replaced by B unpadded sources of one length ``ceil(real / B)``
    holding its real source tokens in order (the last row's tail repeats tokens): the same
    targets, the same real source positions (up to B - 1 more), no padding."""
    rows, real = batch.src.size(0), int(batch.src_lengths.sum())
    width = math.ceil(real / rows)
    valid = torch.arange(batch.src.size(1))[None, :] < batch.src_lengths[:, None]
    tokens = batch.src[valid]  # (real,) row by row
    tokens = torch.cat([tokens, tokens[: rows * width - real]]).view(rows, width)
    return dataclasses.replace(batch, src=tokens, src_lengths=torch.full((rows,), width))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("share", "ab", "step"))
    harness_arguments(parser, warmup=20, passes=7)
    parser.add_argument("--pool-sort", default="target", choices=("target", "target_source"))
    parser.add_argument("--mapping", default="softmax", help="attention and output mapping")
    parser.add_argument("--max-groups", type=int, default=None,
                        help="the training encoder's row groups per layer (inert_padding_lstm.MAX_GROUPS; 1: one "
                             "call over the padded batch, the encoder before them); default: the library's")
    args = parser.parse_args(argv)
    if args.max_groups is not None:
        from nmt.models import inert_padding_lstm

        inert_padding_lstm.MAX_GROUPS = args.max_groups
    harness_start(args, "bench_lstm_padding")
    cfg = sized(config(args.data_dir, args.spm, args.pool_sort, args.mapping), args)
    some, src_vocab, tgt_vocab = batches(cfg, args.warmup + args.batches)
    model, step = trainer(cfg, src_vocab, tgt_vocab)
    timed = some[args.warmup:]
    for b in some[:args.warmup]:
        step(b)
    head = (f"pool_sort {args.pool_sort}, {args.mapping}, {args.threads} thread(s): "
            f"{padded_share(timed):.1%} of the timed batches' source positions padded")
    if args.mode == "step":
        passes = [ms_per_step(step, timed) for _ in range(args.passes)]
        print(json.dumps({"pool_sort": args.pool_sort, "mapping": args.mapping, "threads": args.threads,
                          "ms_per_step_min": min(passes), "ms_per_step_median": statistics.median(passes),
                          "passes": passes}))
        return 0
    if args.mode == "ab":
        from nmt.models import inert_padding_lstm

        default = inert_padding_lstm.MAX_GROUPS
        times: dict[int, list[float]] = {1: [], default: []}
        try:
            for i in range(args.passes):
                for groups in ((default, 1) if i % 2 == 0 else (1, default)):
                    inert_padding_lstm.MAX_GROUPS = groups
                    times[groups].append(ms_per_step(step, timed))
        finally:
            inert_padding_lstm.MAX_GROUPS = default
        ratios = [a / b for a, b in zip(times[1], times[default])]
        print(f"{head}: ms per update (process CPU), min of {args.passes} alternating passes: one call per layer "
              f"{min(times[1]):.1f}, row groups (at most {default}) {min(times[default]):.1f} "
              f"({min(times[1]) / min(times[default]):.3f}x); median of the passes' ratios "
              f"{statistics.median(ratios):.3f}x")
        return 0
    from nmt.sparse import get_loss

    loss_fn = get_loss(cfg["model"]["output"]["mapping"])

    def whole(b) -> None:  # forward and backward of the model and loss (no optimizer)
        loss_forward(model, loss_fn, b.src, b.src_lengths, b.tgt_in, b.tgt_out, PAD, 0.0).backward()

    def encoder(b) -> None:  # forward and backward of the source embeddings and the encoder
        memory, final = model.encoder(model.src_embeddings(b.src), b.src_lengths)
        torch.autograd.backward([memory, *final], [torch.ones_like(memory), *(torch.ones_like(s) for s in final)])

    ideals = [ideal(b) for b in timed]
    kinds = {"step": (step, timed), "whole padded": (whole, timed), "whole ideal": (whole, ideals),
             "encoder padded": (encoder, timed), "encoder ideal": (encoder, ideals)}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    names = list(kinds)
    for i in range(args.passes):
        for name in (names if i % 2 == 0 else names[::-1]):
            fn, data = kinds[name]
            times[name].append(ms_per_step(fn, data))
    model.zero_grad(set_to_none=True)
    m = {k: min(v) for k, v in times.items()}
    total = m["whole padded"] - m["whole ideal"]
    enc = m["encoder padded"] - m["encoder ideal"]
    print(f"{head}; ms per step (process CPU, min of {args.passes} alternating passes of {len(timed)} batches): "
          f"update {m['step']:.1f}; model forward+backward {m['whole padded']:.1f} padded, {m['whole ideal']:.1f} "
          f"unpadded: the padding's {total:.1f} ms = {total / m['step']:.1%} of the update; of it the encoder "
          f"{enc:.1f} ms ({m['encoder padded']:.1f} padded, {m['encoder ideal']:.1f} unpadded) = "
          f"{enc / m['step']:.1%}, the attention {total - enc:.1f} ms = {(total - enc) / m['step']:.1%}")
    print(json.dumps({"pool_sort": args.pool_sort, "mapping": args.mapping, "threads": args.threads,
                      "padded_share": padded_share(timed), "min_ms": m, "passes": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
