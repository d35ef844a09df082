#!/usr/bin/env python
"""Benchmark data-parallel training: target tokens/s with 1, 2, ... processes (DDP, Gloo on CPU).

The sibling of ``tools/bench_train.py`` for ``torchrun`` training: the same Multi30k LSTM
model (configs/multi30k_lstm.yaml) on synthetic Multi30k-like batches (vocabulary 8000,
lengths 6-25 / 5-22). For each process count N, N processes of ``--threads`` torch threads
each join a process group (Gloo on CPU, NCCL with ``--device cuda``, one GPU per process)
and train with exactly the trainer's step: the global batch of N x batch_size sentences of a
seeded order split by rank (``nmt.train.distributed.shard_batch``), the loss over the global
token count, DDP gradient averaging, clipping, Adam. Throughput is the global target tokens
(with EOS) per second of wall time between two barriers, after ``--warmup`` untimed steps;
the ratio is to 1 process of the same run. On a machine with fewer free cores than
processes x threads the figure measures contention, not scaling: say the load with it.

    python tools/bench_ddp.py                       # 1 and 2 processes, 1 thread each
    python tools/bench_ddp.py --nproc 1 2 4 --steps 50 --json bench_ddp.json
    python tools/bench_ddp.py --device cuda --nproc 1 2   # one GPU per process
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from nmt.config import load_config  # noqa: E402
from nmt.utils.io import atomic_write_text  # noqa: E402

CONFIG = ROOT / "configs" / "multi30k_lstm.yaml"
PAD, BOS, EOS = 0, 2, 3


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    from id_lists import IdLists  # tools/ is on sys.path (this file's directory)
    import random

    from nmt.data.batching import collate, make_batch_order
    from nmt.models import build_model
    from nmt.sparse import get_loss
    from nmt.train.distributed import init_distributed, rank_device, shard_batch, wrap_model
    from nmt.train.optimizers import build_optimizer
    from nmt.train.update import update

    config = load_config(CONFIG, ["training.save_dir=unused"])
    device = torch.device(args.device)
    context = init_distributed(device.type)
    device = rank_device(context, device)
    batch_size = config["training"]["batch_size"]
    steps = args.warmup + args.steps
    rng = random.Random(0)  # the same synthetic corpus on every rank
    size = steps * batch_size * world
    vocab = 8000
    data = IdLists([[rng.randrange(4, vocab) for _ in range(rng.randint(6, 25))] for _ in range(size)],
                   [[rng.randrange(4, vocab) for _ in range(rng.randint(5, 22))] for _ in range(size)])
    order = make_batch_order(data, batch_size * world, "sentences", shuffle=True, seed=0)
    torch.manual_seed(config["training"]["seed"])
    model = build_model(config["model"], vocab, vocab, PAD).to(device)
    model.train()
    ddp = wrap_model(model, context)
    loss_fn = get_loss(config["model"]["output"]["mapping"], **config["model"]["output"]["params"])
    optimizer = build_optimizer(model.parameters(), config["training"]["optimizer"])
    clip = config["training"]["clip_grad_norm"]
    tokens = 0
    start = 0.0
    for k in range(steps):
        if k == args.warmup:
            context.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        part, real = shard_batch(order[k], context.rank, world)
        batch = collate(data, part, PAD, BOS, EOS).to(device)
        n_global = context.sum_ints([batch.n_tokens if real else 0])[0]
        scale = None if not context.enabled else (world / max(n_global, 1) if real else 0.0)
        update(ddp, loss_fn, optimizer, batch, PAD, clip, loss_scale=scale)
        if k >= args.warmup:
            tokens += n_global
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    context.barrier()
    seconds = time.perf_counter() - start
    if context.is_main:
        out.put((tokens, seconds))
    context.close()


def measure(world: int, args: argparse.Namespace) -> float:
    """Global target tokens per second of ``world`` processes."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    tokens, seconds = out.get(timeout=3600)
    for p in procs:
        p.join()
    return tokens / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2], help="process counts to run (default 1 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (one GPU per process)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here (atomically)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# bench_ddp: Multi30k LSTM (softmax/softmax as configured), synthetic batches of 64 sentences per "
          f"process, {args.warmup} warmup + {args.steps} timed steps, {args.threads} thread(s) per process, "
          f"device {args.device}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f} at start")
    print(f"{'processes':>9} {'tokens/s':>10} {'per process':>12} {'vs 1 process':>13}")
    results, baseline = [], None
    for world in args.nproc:
        speed = measure(world, args)
        baseline = baseline or speed
        results.append({"processes": world, "tokens_per_sec": speed, "ratio_to_first": speed / baseline})
        print(f"{world:>9} {speed:>10.0f} {speed / world:>12.0f} {speed / baseline:>12.2f}x", flush=True)
    if args.json is not None:
        atomic_write_text(args.json, json.dumps({"threads": args.threads, "steps": args.steps, "device": args.device,
                                                 "load_average": load, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
