"""Benchmark: the cost of re-encoding the training pairs every epoch with subword sampling.

Learns a joint sentencepiece unigram model and joint BPE codes (``--pieces``, default 8000) on
the training pairs, then times, per sampler setting, the deterministic encoding once and
``ResampledPairs.for_epoch`` for ``--epochs`` epochs (the first fills the per-word caches).

    python tools/bench_subword_sampling.py                       # data/multi30k/train.{de,en}
    python tools/bench_subword_sampling.py --quick               # a synthetic corpus, a smoke run

Importable: ``rows = bench_subword_sampling.run(...)`` returns a list of dicts.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import time
from pathlib import Path

from nmt.data.dataset import ParallelDataset, read_parallel
from nmt.train.data_setup import resampled_pairs
from nmt.data.field import Field
from nmt.data.tokenizers import build_tokenizer

SETTINGS = (
    ("sentencepiece", {"alpha": 0.1, "nbest": -1, "dropout": 0.0}),
    ("sentencepiece", {"alpha": 0.1, "nbest": 64, "dropout": 0.0}),
    ("bpe", {"alpha": None, "nbest": -1, "dropout": 0.1}),
)


def synthetic_pairs(n: int = 2000, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    syllables = ["ka", "ro", "mi", "sel", "tan", "bu", "ler", "st", "ei", "ung", "pa", "do"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(800)]
    line = lambda: " ".join(rng.choice(words) for _ in range(rng.randint(3, 15)))
    return [(line(), line()) for _ in range(n)]


def corpus_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the corpus options of the subword benchmarks (this one and ``bench_sampled_vocabulary``):
    ``--src``, ``--tgt``, ``--pieces``, ``--quick`` and ``--json``; see :func:`corpus`."""
    parser.add_argument("--src", default="data/multi30k/train.de")
    parser.add_argument("--tgt", default="data/multi30k/train.en")
    parser.add_argument("--pieces", type=int, default=8000, help="sentencepiece vocabulary size and BPE merges")
    parser.add_argument("--quick", action="store_true", help="a synthetic corpus of 2,000 pairs, 300 pieces")
    parser.add_argument("--json", help="also write the rows to this file")


def corpus(args: argparse.Namespace) -> tuple[list[tuple[str, str]], int]:
    """``(pairs, pieces)`` of :func:`corpus_arguments`' options: with ``--quick`` the synthetic
    pairs and 300 pieces, else the pairs of ``--src`` / ``--tgt`` and ``--pieces``."""
    if args.quick:
        return synthetic_pairs(), 300
    return read_parallel(args.src, args.tgt), args.pieces


def trained_tokenizer(kind: str, pieces: int, lines: list[str]):
    """A ``kind`` tokenizer (``sentencepiece``: ``pieces`` its vocabulary size; ``bpe``: its merges)
    trained on ``lines``, the trainer's log swallowed."""
    tokenizer = build_tokenizer({"type": kind, ("vocab_size" if kind == "sentencepiece" else "merges"): pieces})
    with contextlib.redirect_stderr(io.StringIO()):
        tokenizer.train(lines)
    return tokenizer


def shown_settings(settings: dict) -> dict:
    """A sampler setting as a row prints it: the keys left at None or 0.0 dropped, but ``alpha``."""
    return {k: v for k, v in settings.items() if v not in (None, 0.0) or k == "alpha"}


def write_rows(path: str | None, pairs: list, rows: list[dict]) -> None:
    """``{"pairs": len(pairs), "rows": rows}`` as JSON to ``path`` (``--json``; None: nothing)."""
    if path:
        Path(path).write_text(json.dumps({"pairs": len(pairs), "rows": rows}, indent=1), encoding="utf-8")


def run(pairs: list[tuple[str, str]], pieces: int = 8000, epochs: int = 4) -> list[dict]:
    """One row per setting: ``tokenizer``, ``settings``, ``deterministic_s``, ``epoch_s`` (a list),
    and the last epoch's data line ``summary``."""
    lines = [s for s, _ in pairs] + [t for _, t in pairs]
    tokenizers = {kind: trained_tokenizer(kind, pieces, lines) for kind in ("sentencepiece", "bpe")}
    rows = []
    for kind, settings in SETTINGS:
        tok = tokenizers[kind]
        src, tgt = Field.build(tok, (s for s, _ in pairs)), Field.build(tok, (t for _, t in pairs))
        start = time.perf_counter()
        ParallelDataset(pairs, src, tgt, 100, 100)
        deterministic = time.perf_counter() - start
        side = {"subword_sampling": settings, "max_length": 100}
        data = resampled_pairs(pairs, src, tgt, {"src": side, "tgt": side})
        times = []
        for epoch in range(epochs):
            start = time.perf_counter()
            dataset = data.for_epoch(1, epoch)
            times.append(time.perf_counter() - start)
        rows.append({"tokenizer": kind, "settings": settings, "deterministic_s": deterministic, "epoch_s": times,
                     "summary": dataset.summary()})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus_arguments(parser)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args(argv)
    pairs, pieces = corpus(args)
    rows = run(pairs, pieces, args.epochs)
    print(f"{len(pairs)} pairs, both sides sampled; seconds per epoch (the first fills the caches)")
    for row in rows:
        print(f"{row['tokenizer']:>13} {shown_settings(row['settings'])}: deterministic encoding {row['deterministic_s']:.2f}s; "
              f"epochs {', '.join(f'{t:.2f}' for t in row['epoch_s'])}s; last: {row['summary']}")
    write_rows(args.json, pairs, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
