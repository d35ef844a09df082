#!/usr/bin/env python
"""Alignment quality of guided Transformers: the validation AER of causal against full-context alignment.

A synthetic task where the decoder cannot know which source word it translates next: each source is
3-7 distinct letters, its target the same letters upper-cased in a random order, and the reference
alignment says where each target letter came from. A causal alignment head (the usual decoder pass,
``model.transformer.full_context_alignment: false``) attending at target position ``t`` has seen only
the letters before ``t``, so at best it spreads over the source letters not yet used; the full-context
pass (``true``; Garg et al. 2019, OpenNMT-py's ``-full_context_alignment``) sees the output letter
itself. Each row trains the same Transformer (2 + 2 layers, d_model 32, 2 heads of 1.5-entmax
cross-attention, the last layer's first head supervised, guided alignment weight 1) with ``nmt-train``'s
trainer and prints the last validation's alignment error rate (``data.valid.align``), plain and
guided, with the training time. The data lives in a temporary directory.

    python tools/bench_alignment.py                     # 3,000 pairs, 3,000 steps, seed 0 (a few minutes)
    python tools/bench_alignment.py --seeds 0 1 2 --json bench_alignment.json
    python tools/bench_alignment.py --pairs 100 --steps 5 --quiet   # smoke run
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_source_noise import parsed_with_run_options  # noqa: E402
from nmt.config import resolve_config  # noqa: E402
from nmt.utils.io import atomic_write_text  # noqa: E402


def permutation_task(root: Path, n_train: int, n_valid: int, seed: int = 0) -> None:
    """``train`` / ``valid`` .src .tgt .align files of the shuffled-letters task under ``root``."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        src, tgt, align = [], [], []
        for _ in range(n):
            letters = rng.sample("abcdefgh", rng.randint(3, 7))
            order = list(range(len(letters)))
            rng.shuffle(order)
            src.append(" ".join(letters))
            tgt.append(" ".join(letters[i].upper() for i in order))
            align.append(" ".join(f"{i}-{j}" for j, i in enumerate(order)))
        for ext, lines in (("src", src), ("tgt", tgt), ("align", align)):
            (root / f"{split}.{ext}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def config(root: Path, name: str, weight: float, full_context: bool, steps: int, seed: int) -> dict:
    space = {"tokenizer": {"type": "space"}}
    return {"data": {"train": {"src": str(root / "train.src"), "tgt": str(root / "train.tgt"),
                               "align": str(root / "train.align")},
                     "valid": {"src": str(root / "valid.src"), "tgt": str(root / "valid.tgt"),
                               "align": str(root / "valid.align")},
                     "src": space, "tgt": space},
            "model": {"type": "transformer",
                      "transformer": {"encoder_layers": 2, "decoder_layers": 2, "d_model": 32, "heads": 2, "d_ff": 64,
                                      "dropout": 0.0, "attention_dropout": 0.0, "alignment_heads": 1,
                                      "full_context_alignment": full_context},
                      "embeddings": {"dropout": 0.0}, "attention": {"cross": {"mapping": "entmax15"}},
                      "output": {"mapping": "softmax"}},
            "training": {"save_dir": str(root / name), "batch_size": 16, "max_steps": steps, "valid_every": steps,
                         "log_every": steps, "keep_last": 1, "progress": False, "threads": 1, "seed": seed,
                         "tensorboard": False, "optimizer": {"name": "adam", "lr": 0.01},
                         "guided_alignment": {"weight": weight}},
            "validation": {"metric": "loss", "batch_size": 32, "max_length": 12, "n_heatmaps": 0}}


def run(root: Path, name: str, weight: float, full_context: bool, steps: int, seed: int) -> dict:
    from nmt.train.trainer import Trainer

    start = time.perf_counter()
    Trainer(resolve_config(config(root, name, weight, full_context, steps, seed), f"{name}.yaml"), f"{name}.yaml").train()
    last = json.loads((root / name / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    return {"alignment": "full context" if full_context else "causal", "weight": weight, "seed": seed,
            "aer": last["valid_aer"], "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=3000, help="training pairs (default 3000)")
    p.add_argument("--valid", type=int, default=100, help="validation pairs (default 100)")
    p.add_argument("--steps", type=int, default=3000, help="updates of 16 pairs per run (default 3000)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds (default 0)")
    args = parsed_with_run_options(p, argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        permutation_task(root, args.pairs, args.valid)
        for seed in args.seeds:
            for full_context in (False, True):
                for weight in (0.0, 1.0):
                    name = f"{'full' if full_context else 'causal'}_{weight:g}_{seed}"
                    rows.append(run(root, name, weight, full_context, args.steps, seed))
    print(f"shuffled letters: {args.pairs} training pairs, {args.steps} steps of 16 pairs; validation AER "
          f"({args.valid} pairs, every link sure)")
    print(f"{'alignment':<14} {'guided':>6} {'seed':>4} {'AER':>7} {'seconds':>8}")
    for r in rows:
        print(f"{r['alignment']:<14} {r['weight']:>6g} {r['seed']:>4} {r['aer']:>7.3f} {r['seconds']:>8.1f}")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
