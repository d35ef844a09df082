"""Benchmark: ``<unk>`` in sampled training segmentations against ``subword_sampling.vocab_samples``.

Learns one joint tokenizer per sampler setting on both sides (``--pieces``: sentencepiece unigram
vocabulary size, BPE merges), as ``shared_tokenizer: true`` with a vocabulary per side (the
Multi30k recipes), then for each ``vocab_samples`` N times the vocabulary count
(:func:`nmt.train.data_setup.counted_vocabulary`: the deterministic segmentation plus the sampled
segmentations of epochs 0..N-1) and reports, for epochs 0..``--epochs``-1 of a run seeded with
``--seed``, the share of ``<unk>`` among the sampled source and target tokens (epochs below N are
0 by construction; later ones show what N leaves).

    python tools/bench_sampled_vocabulary.py --src data/multi30k/train.de --tgt data/multi30k/train.en
    python tools/bench_sampled_vocabulary.py --quick         # a synthetic corpus, a smoke run

Importable: ``rows = bench_sampled_vocabulary.run(...)`` returns a list of dicts.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from nmt.data.field import Field
from nmt.train.data_setup import counted_vocabulary, resampled_pairs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_subword_sampling import (corpus, corpus_arguments, shown_settings, trained_tokenizer,  # noqa: E402
                                    write_rows)  # the same corpus options and synthetic corpus for --quick

SETTINGS = (
    ("sentencepiece", {"alpha": 0.1, "nbest": -1, "dropout": 0.0}),
    ("bpe", {"alpha": None, "nbest": -1, "dropout": 0.1}),
)


def unk_share(dataset, side: str, unk: int) -> tuple[int, int]:
    """``(<unk> tokens, tokens)`` of one side of a :class:`~nmt.data.dataset.ParallelDataset`."""
    rows = dataset.src if side == "src" else dataset.tgt
    return sum(row.count(unk) for row in rows), sum(len(row) for row in rows)


def run(pairs: list[tuple[str, str]], pieces: int, samples: list[int], epochs: int, seed: int = 1234,
        max_length: int = 100) -> list[dict]:
    """One row per (setting, N): ``tokenizer``, ``settings``, ``vocab_samples``, ``vocab_s`` (seconds
    to count both vocabularies), ``types`` (source, target), ``unk`` (per epoch: ``[src unk, src
    tokens, tgt unk, tgt tokens]``) and ``epoch_s`` (seconds to segment each epoch)."""
    lines = [s for s, _ in pairs] + [t for _, t in pairs]
    src_lines, tgt_lines = [s for s, _ in pairs], [t for _, t in pairs]
    rows = []
    for kind, settings in SETTINGS:
        tokenizer = trained_tokenizer(kind, pieces, lines)
        for n in samples:
            side = {"subword_sampling": {**settings, "vocab_samples": n}, "max_length": max_length,
                    "min_freq": 1, "max_size": None, "vocab_file": None}
            data_cfg = {"src": side, "tgt": side, "shared_vocab": False}
            start = time.perf_counter()
            src = Field(tokenizer, counted_vocabulary(data_cfg, "src", tokenizer, (("src", src_lines),), seed))
            tgt = Field(tokenizer, counted_vocabulary(data_cfg, "tgt", tokenizer, (("tgt", tgt_lines),), seed))
            vocab_s = time.perf_counter() - start
            data = resampled_pairs(pairs, src, tgt, data_cfg)
            unk, times = [], []
            for epoch in range(epochs):
                start = time.perf_counter()
                dataset = data.for_epoch(seed, epoch)
                times.append(time.perf_counter() - start)
                unk.append([*unk_share(dataset, "src", src.vocab.unk_index),
                            *unk_share(dataset, "tgt", tgt.vocab.unk_index)])
            rows.append({"tokenizer": kind, "settings": settings, "vocab_samples": n, "vocab_s": vocab_s,
                         "types": [len(src.vocab), len(tgt.vocab)], "unk": unk, "epoch_s": times})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus_arguments(parser)
    parser.add_argument("--samples", default="0,1,3", help="comma-separated vocab_samples values")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    pairs, pieces = corpus(args)
    rows = run(pairs, pieces, [int(n) for n in args.samples.split(",")], args.epochs, args.seed)
    print(f"{len(pairs)} pairs, both sides sampled, a joint tokenizer and a vocabulary per side; <unk> share of "
          "the sampled source / target tokens per epoch")
    for row in rows:
        settings = shown_settings(row["settings"])
        shares = ", ".join(f"{100 * su / max(st, 1):.3f}/{100 * tu / max(tt, 1):.3f}%"
                           for su, st, tu, tt in row["unk"])
        print(f"{row['tokenizer']:>13} {settings} vocab_samples {row['vocab_samples']}: vocabularies "
              f"{row['types'][0]}/{row['types'][1]} types counted in {row['vocab_s']:.1f}s; epochs {shares}; "
              f"segmentation {', '.join(f'{t:.1f}' for t in row['epoch_s'])}s")
    write_rows(args.json, pairs, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
