#!/usr/bin/env python
"""The Transformer's cross-attention keys/values from the packed encoder rows: process CPU time of
a training step (forward, loss, backward, Adam) of the side-by-side harness's Transformer
(``tools/peer_bench/nmt_transformer.yaml``: 3+3 layers, d_model 256, batches of 64 sentences, one
length-sorted pool of the whole corpus) on Multi30k's first batches, CPU only.

Process CPU time (all threads of this process), so that figures taken on a shared machine mean
something; on 2 cores a second busy process still slows torch, so compare only figures of one run.

    python tools/bench_cross_kv.py padding             # padded share of the source positions per pool_sort
                                                       # (--model lstm: the LSTM harness config's batches)
    python tools/bench_cross_kv.py share               # the cross K/V projection's share of the step
    python tools/bench_cross_kv.py ab --passes 12      # alternating passes: packed rows vs padded memory
    python tools/bench_cross_kv.py step                # min / median ms per step (base vs new checkouts)

``--data-dir`` holds train.{de,en} and a validation pair (``val`` or ``test_2016_flickr``), ``--spm`` the
joint sentencepiece model of ``tools/peer_bench/spm.py`` (trained there if the file is missing).
``ab`` runs the same model over the same batches, passes alternating between the cross K/V projected
from the encoder's packed rows (the default on the CPU) and from the padded memory (the projection
before it), and reports both minima and the median of the passes' ratios (padded / packed).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from nmt.config import load_config  # noqa: E402
from nmt.data.batching import collate, make_batches  # noqa: E402
from nmt.models import build_model  # noqa: E402
from nmt.models.transformer.decoder import TransformerDecoder  # noqa: E402
from nmt.sparse import get_loss  # noqa: E402
from nmt.train.optimizers import build_optimizer  # noqa: E402
from nmt.train.update import update  # noqa: E402
from nmt.utils.allocator import keep_freed_memory  # noqa: E402

CONFIG = ROOT / "tools" / "peer_bench" / "nmt_transformer.yaml"
CONFIGS = {"transformer": CONFIG, "lstm": ROOT / "tools" / "peer_bench" / "nmt_softmax.yaml"}
"""The side-by-side harness's models by ``--model`` (``padding`` counts the batches of either)."""
PAD, BOS, EOS = 0, 2, 3


def config(data_dir: Path, spm: Path, pool_sort: str, base: Path = CONFIG, overrides: tuple[str, ...] = ()) -> dict:
    """The harness's config ``base`` (default: the Transformer's) on ``data_dir`` with
    ``training.pool_sort`` and the ``overrides`` (``key=value``) set."""
    valid = "val" if (data_dir / "val.de").exists() else "test_2016_flickr"
    return load_config(base, [*overrides,
        "training.save_dir=unused", f"training.pool_sort={pool_sort}",
        f"data.train.src={data_dir / 'train.de'}", f"data.train.tgt={data_dir / 'train.en'}",
        f"data.valid.src={data_dir / (valid + '.de')}", f"data.valid.tgt={data_dir / (valid + '.en')}",
        f"data.src.tokenizer.model_file={spm}", f"data.tgt.tokenizer.model_file={spm}"])


def batches(cfg: dict, n: int | None) -> tuple[list, int, int]:
    """The first ``n`` (None: all) training batches of the first epoch, and both vocabulary sizes."""
    from nmt.train.data_setup import load_training_data

    with tempfile.TemporaryDirectory() as work:
        data = load_training_data(cfg["data"], work)
    t = cfg["training"]
    order = make_batches(data.train, t["batch_size"], t["batch_type"], shuffle=True, seed=t["seed"], epoch=0,
                         bucket_size=t["bucket_size"], pool_sort=t["pool_sort"])
    chosen = order if n is None else order[:n]
    out = [collate(data.train, idx, PAD, BOS, EOS) for idx in chosen]
    return out, len(data.src_field.vocab), len(data.tgt_field.vocab)


def padded_share(batches_: list) -> float:
    """The share of the batches' source positions that are padding."""
    real = sum(int(b.src_lengths.sum()) for b in batches_)
    return 1.0 - real / sum(b.src.numel() for b in batches_)


def trainer(cfg: dict, src_vocab: int, tgt_vocab: int):
    """(model, step): a fresh model (seeded) and a full update on one batch."""
    torch.manual_seed(cfg["training"]["seed"])
    model = build_model(cfg["model"], src_vocab, tgt_vocab, PAD).train()
    loss_fn = get_loss(cfg["model"]["output"]["mapping"])
    optimizer = build_optimizer(model.parameters(), cfg["training"]["optimizer"])
    cpu = torch.device("cpu")
    return model, lambda b: update(model, loss_fn, optimizer, b.to(cpu, lengths_on_host=True), PAD,
                                   cfg["training"]["clip_grad_norm"])


def ms_per_step(step, timed: list) -> float:
    """Process CPU ms per step of one pass over ``timed``."""
    start = time.process_time()
    for b in timed:
        step(b)
    return 1000.0 * (time.process_time() - start) / len(timed)


def harness_arguments(parser: argparse.ArgumentParser, warmup: int, passes: int,
                      batches_help: str = "batches of one timed pass",
                      passes_help: str = "timed passes over them") -> None:
    """Adds the options every harness benchmark (this one, ``bench_lstm_padding``,
    ``bench_checkpointing``) takes: ``--data-dir``, ``--spm``, ``--warmup`` (default ``warmup``),
    ``--batches``, ``--passes`` (default ``passes``), ``--batch-size`` (None: the config's; see
    :func:`sized`) and ``--threads``; see :func:`harness_start`."""
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data" / "multi30k",
                        help="Multi30k train.{de,en} and val or test_2016_flickr (recipes/translation/prepare.py)")
    parser.add_argument("--spm", type=Path, default=ROOT / "data" / "spm8000.model",
                        help="joint sentencepiece model (tools/peer_bench/spm.py)")
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed updates first")
    parser.add_argument("--batches", type=int, default=10, help=batches_help)
    parser.add_argument("--passes", type=int, default=passes, help=passes_help)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="sentences per batch (default: the harness config's, 64)")
    parser.add_argument("--threads", type=int, default=2)


def sized(cfg: dict, args: argparse.Namespace) -> dict:
    """``cfg`` with ``training.batch_size`` set to ``--batch-size`` where that is given."""
    if args.batch_size is not None:
        cfg["training"]["batch_size"] = args.batch_size
    return cfg


def harness_start(args: argparse.Namespace, tool: str) -> None:
    """What a harness benchmark does with :func:`harness_arguments`' options first: ``--threads``
    torch threads, freed memory kept as nmt-train does, and an exit naming ``tool`` where the
    ``--spm`` model is missing."""
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as nmt-train does
    if not args.spm.exists():
        raise SystemExit(f"{tool}: no sentencepiece model at {args.spm} (tools/peer_bench/spm.py makes one)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("padding", "share", "ab", "step"))
    harness_arguments(parser, warmup=20, passes=8)
    parser.add_argument("--pool-sort", default="target", choices=("target", "target_source"))
    parser.add_argument("--model", default="transformer", choices=tuple(CONFIGS),
                        help="padding: whose batches to count (the LSTM's pool and batch size are its config's)")
    args = parser.parse_args(argv)
    harness_start(args, "bench_cross_kv")
    if args.mode == "padding":
        for pool_sort in ("target", "target_source"):
            all_batches, _, _ = batches(sized(config(args.data_dir, args.spm, pool_sort, CONFIGS[args.model]), args),
                                        None)
            share = padded_share(all_batches)
            per_batch = sorted(padded_share([b]) for b in all_batches)
            deciles = ", ".join(f"{per_batch[round(q * (len(per_batch) - 1))]:.1%}" for q in (0.1, 0.5, 0.9))
            print(f"pool_sort {pool_sort}: {len(all_batches)} batches, {share:.1%} of the source positions padded "
                  f"({share / (1 - share):.2f} per real token); per batch 10th / 50th / 90th percentile {deciles}")
        return 0
    cfg = sized(config(args.data_dir, args.spm, args.pool_sort), args)
    some, src_vocab, tgt_vocab = batches(cfg, args.warmup + args.batches)
    model, step = trainer(cfg, src_vocab, tgt_vocab)
    timed = some[args.warmup:]
    for b in some[:args.warmup]:
        step(b)
    head = f"pool_sort {args.pool_sort}, {padded_share(timed):.1%} of the timed batches' source positions padded"
    if args.mode == "step":
        passes = [ms_per_step(step, timed) for _ in range(args.passes)]
        print(json.dumps({"pool_sort": args.pool_sort, "ms_per_step_min": min(passes),
                          "ms_per_step_median": statistics.median(passes), "passes": passes}))
        return 0
    if args.mode == "ab":
        packed = TransformerDecoder.cross_keys_values
        kinds = {"packed": packed, "padded": lambda self, memory, rows=None: packed(self, memory)}
        times: dict[str, list[float]] = {"packed": [], "padded": []}
        try:
            for i in range(args.passes):
                for kind in (("packed", "padded") if i % 2 == 0 else ("padded", "packed")):
                    TransformerDecoder.cross_keys_values = kinds[kind]
                    times[kind].append(ms_per_step(step, timed))
        finally:
            TransformerDecoder.cross_keys_values = packed
        ratios = [a / b for a, b in zip(times["padded"], times["packed"])]
        print(f"{head}: ms per step (process CPU), min of {args.passes} passes: padded memory "
              f"{min(times['padded']):.1f}, packed rows {min(times['packed']):.1f} "
              f"({min(times['padded']) / min(times['packed']):.3f}x); median of the passes' ratios "
              f"{statistics.median(ratios):.3f}x")
        return 0
    # share: the step against the cross K/V projection alone (every decoder layer's keys and values,
    # forward and backward to the weights and the memory) on the padded memory's rows and on the real ones
    step_ms = min(ms_per_step(step, timed) for _ in range(args.passes))
    attentions = [layer.cross_attn for layer in model.decoder.layers]
    d_model = attentions[0].d_model

    def projections(rows: int) -> None:
        x = torch.randn(rows, d_model, requires_grad=True)
        outs = [proj(x) for a in attentions for proj in (a.k_proj, a.v_proj)]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    figures = {}
    for kind in ("padded", "real"):
        def run() -> None:
            for b in timed:
                projections(b.src.numel() if kind == "padded" else int(b.src_lengths.sum()))
        figures[kind] = min(ms_per_step(lambda _: run(), [None]) / len(timed) for _ in range(args.passes))
    print(f"{head}: step {step_ms:.1f} ms (process CPU, min of {args.passes} passes); cross K/V projections "
          f"on the padded memory {figures['padded']:.2f} ms ({figures['padded'] / step_ms:.1%}), on the real rows "
          f"{figures['real']:.2f} ms: the padding's {figures['padded'] - figures['real']:.2f} ms = "
          f"{(figures['padded'] - figures['real']) / step_ms:.1%} of the step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
