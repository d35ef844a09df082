#!/usr/bin/env python
"""Benchmark fusedmax / oscarmax (median milliseconds, float32, CPU).

Two tables:

* mappings (softmax, fusedmax, oscarmax, oscarmax_exact): forward and forward+backward on
  attention-shaped rows ``(batch, n)`` with random lengths (padding masked), ratio to softmax on
  the same masked rows, and to ``torchsparseattn`` (row-by-row numpy/Cython reference) when that
  package is installed and runs;
* training step: one Adam step (forward, loss, backward, update) of a small attention model
  built with ``nmt.models.build_model``, attention mapping softmax vs fusedmax vs oscarmax.

    python tools/bench_structured.py            # (320, 50), (64, 200); train step B=64
    python tools/bench_structured.py --quick    # small shapes, few repetitions (smoke run)

Importable: :func:`mapping_rows` and :func:`train_step_rows` return the table rows as dicts.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
from typing import Callable, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sparse import mapping_runner, median_ms  # noqa: E402  (shared timing helpers)

from nmt.sparse.structured import fusedmax, oscarmax, oscarmax_exact  # noqa: E402
from nmt.utils.allocator import keep_freed_memory  # noqa: E402

ATTENTION = [(320, 50), (64, 200)]
LAM = {"fusedmax": 0.1, "oscarmax": 0.01, "oscarmax_exact": 0.01}

try:  # optional reference: builds only with an old Cython toolchain, autograd broken on torch 2
    import torchsparseattn as tsa
except Exception:  # noqa: BLE001 - any import failure just leaves the column empty
    tsa = None


def _masked_rows(shape: tuple[int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    lengths = torch.randint(1, shape[1] + 1, (shape[0],), generator=g)
    return x, lengths, torch.arange(shape[1]) < lengths[:, None]


def _reference(name: str, lam: float, lengths: torch.Tensor) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    """torchsparseattn's module for ``name`` (None when unavailable)."""
    if tsa is None or name not in ("fusedmax", "oscarmax"):
        return None
    module = tsa.Fusedmax(lam) if name == "fusedmax" else tsa.Oscarmax(lam)
    return lambda s: module(s, lengths)


def mapping_rows(shapes: list[tuple[int, int]] = ATTENTION, reps: int = 15, seed: int = 0) -> list[dict]:
    """Time softmax / fusedmax / oscarmax on masked rows. Returns one dict per (shape, map, pass):
    ``shape, function, pass, ms, x_softmax, x_torchsparseattn`` (None when not measured)."""
    rows = []
    for shape in shapes:
        x, lengths, mask = _masked_rows(shape, seed)
        maps = {
            "softmax": lambda s: torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1),
            "fusedmax": lambda s: fusedmax(s, LAM["fusedmax"], mask=mask),
            "oscarmax": lambda s: oscarmax(s, LAM["oscarmax"], mask=mask),
            "oscarmax_exact": lambda s: oscarmax_exact(s, LAM["oscarmax_exact"], mask=mask),
        }
        grad = torch.randn_like(x)
        for backward in (False, True):
            base = median_ms(mapping_runner(maps["softmax"], x, grad, backward), reps)
            for name, f in maps.items():
                ms = base if name == "softmax" else median_ms(mapping_runner(f, x, grad, backward), reps)
                vs_ref = None
                ref = _reference(name, LAM.get(name, 0.0), lengths)
                if ref is not None:
                    try:
                        vs_ref = ms / median_ms(mapping_runner(ref, x, grad, backward), max(1, reps // 5), warmup=1)
                    except Exception as e:  # noqa: BLE001 - report, do not abort the benchmark
                        print(f"torchsparseattn {name} failed: {type(e).__name__}: {e}".splitlines()[0])
                rows.append(dict(shape=shape, function=name, pass_="fwd+bwd" if backward else "fwd",
                                 ms=ms, x_softmax=ms / base, x_torchsparseattn=vs_ref))
    return rows


def _model_cfg(mapping: str) -> dict:
    params = {"lam": LAM[mapping]} if mapping in LAM else {}
    return {
        "embeddings": {"src_size": 64, "tgt_size": 64, "share": False, "tie_output": False, "dropout": 0.0},
        "encoder": {"type": "lstm", "layers": 1, "hidden_size": 128, "bidirectional": True, "dropout": 0.0},
        "decoder": {"type": "lstm", "layers": 1, "hidden_size": 128, "dropout": 0.0, "input_feeding": True,
                    "bridge": "linear"},
        "attention": {"score": "general", "mapping": mapping, "params": params, "continuous": None},
        "output": {"mapping": "softmax", "params": {}},
    }


def train_step_rows(batch: int = 64, src_len: int = 30, tgt_len: int = 20, vocab: int = 200, reps: int = 10,
                    seed: int = 0) -> list[dict]:
    """Median time of one training step per attention mapping. Returns dicts
    ``attention, ms, x_softmax``."""
    from nmt.models import build_model
    from nmt.sparse import get_loss

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, src_len), generator=g)
    src_lengths = torch.randint(src_len // 2, src_len + 1, (batch,), generator=g)
    src_lengths[0] = src_len
    src = src.masked_fill(torch.arange(src_len) >= src_lengths[:, None], 0)
    tgt = torch.randint(4, vocab, (batch, tgt_len + 1), generator=g)
    loss_fn = get_loss("softmax")
    rows, base = [], None
    for mapping in ("softmax", "fusedmax", "oscarmax"):
        torch.manual_seed(seed)
        model = build_model(_model_cfg(mapping), vocab, vocab, pad_index=0)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad()
            logits, _ = model(src, src_lengths, tgt[:, :-1])
            loss_fn(logits.reshape(-1, vocab), tgt[:, 1:].reshape(-1)).backward()
            opt.step()

        ms = median_ms(step, reps)
        base = base or ms
        rows.append(dict(attention=mapping, ms=ms, x_softmax=ms / base))
    return rows


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes and 3 repetitions (smoke run)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per measurement")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    ap.add_argument("--no-train", action="store_true", help="skip the training-step table")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    keep_freed_memory()  # as nmt-train / nmt-translate do: no page faults on per-call temporaries
    torch.set_num_threads(args.threads)
    reps = args.reps or (3 if args.quick else 15)
    shapes = [(32, 20), (8, 60)] if args.quick else ATTENTION
    print(f"# structured attention benchmark: torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, threads={torch.get_num_threads()}, float32, "
          f"reps={reps}, lam={LAM}, torchsparseattn: {'yes' if tsa is not None else 'not installed'}")
    print("\n| shape | function | pass | median ms | x softmax | x torchsparseattn |")
    print("|---|---|---|---:|---:|---:|")
    for r in mapping_rows(shapes, reps, args.seed):
        ref = "-" if r["x_torchsparseattn"] is None else f"{r['x_torchsparseattn']:.3f}"
        print(f"| {r['shape']} | {r['function']} | {r['pass_']} | {r['ms']:.3f} | {r['x_softmax']:.1f} | {ref} |")
    if not args.no_train:
        small = dict(batch=8, src_len=10, tgt_len=6, reps=reps) if args.quick else dict(reps=reps)
        print("\n| training step (attention) | median ms | x softmax |")
        print("|---|---:|---:|")
        for r in train_step_rows(seed=args.seed, **small):
            print(f"| {r['attention']} | {r['ms']:.2f} | {r['x_softmax']:.2f} |")


if __name__ == "__main__":
    main()
