#!/usr/bin/env python
"""What source noise in training buys: BLEU on clean and on noised test sources, trained plain and noised.

Trains models of one config on the same parallel data with ``nmt-train``'s trainer, one plain and
one with ``data.train.noise`` (default: Edunov et al. 2018's ``delete 0.1, blank 0.1, shuffle 3``; with
``--runs ... word_dropout`` also one with whole-word dropout, ``model.embeddings.src_word_dropout`` and
``tgt_word_dropout``), then
translates the test set (beam 5) twice with each: its sources as they are, and its sources noised
with the same settings (a fixed seed; words of the ``space`` tokenizer, as training noises them).
Prints corpus BLEU (sacrebleu) of each run on both and each run's training time. The model: an LSTM
(1 bi-LSTM encoder layer of 2 x 128, 1 decoder layer of 256, embeddings 128, 1.5-entmax attention and
output), word tokens (``space``, min_freq 2), batches of 64 sentences, Adam 1e-3, no validation
decoding (the loss only); the runs live in a temporary directory.

    python tools/bench_source_noise.py --data path/to/multi30k --steps 2000     # de -> en, minutes
    python tools/bench_source_noise.py --data path/to/multi30k --steps 5 --test-lines 20 --quiet   # smoke run

``--data`` holds Multi30k's file names: ``train``, ``val`` and ``test_2016_flickr`` ``.de`` / ``.en``.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nmt.config import resolve_config  # noqa: E402
from nmt.utils.io import atomic_write_text  # noqa: E402


def word_lstm_config(train: dict | list[dict], valid: dict, save_dir: Path, steps: int, seed: int,
                     word_dropout: float = 0.0) -> dict:
    """The config of this benchmark's runs (and ``bench_backtranslation``'s): ``data.train`` and
    ``data.valid`` as given, word tokens (``space``, min_freq 2), the LSTM of the module docstring,
    ``steps`` updates of 64 sentences on the CPU, validated (loss only) once at the end."""
    words = {"tokenizer": {"type": "space"}, "min_freq": 2}
    return {"data": {"train": train, "valid": valid, "src": words, "tgt": words},
            "model": {"embeddings": {"src_size": 128, "tgt_size": 128, "dropout": 0.2,
                                     "src_word_dropout": word_dropout, "tgt_word_dropout": word_dropout},
                      "encoder": {"layers": 1, "hidden_size": 128, "dropout": 0.2},
                      "decoder": {"layers": 1, "hidden_size": 256, "dropout": 0.2},
                      "attention": {"mapping": "entmax15"}, "output": {"mapping": "entmax15"}},
            "training": {"save_dir": str(save_dir), "batch_size": 64, "max_steps": steps, "valid_every": steps,
                         "log_every": max(1, steps // 4), "keep_last": 1, "progress": False, "seed": seed,
                         "tensorboard": False, "device": "cpu", "optimizer": {"name": "adam", "lr": 0.001}},
            "validation": {"metric": "loss", "batch_size": 64, "n_heatmaps": 0}}


def config(data: Path, src: str, tgt: str, save_dir: Path, noise: dict | None, steps: int, seed: int,
           word_dropout: float = 0.0) -> dict:
    train = {"src": str(data / f"train.{src}"), "tgt": str(data / f"train.{tgt}")}
    if noise is not None:
        train["noise"] = noise
    valid = {"src": str(data / f"val.{src}"), "tgt": str(data / f"val.{tgt}")}
    return word_lstm_config(train, valid, save_dir, steps, seed, word_dropout)


def parsed_with_run_options(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``p``'s arguments with the training benchmarks' shared options: ``--json`` (also write the rows
    there) and ``--quiet`` (no training log lines: the ``nmt`` logger at WARNING from here on)."""
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--quiet", action="store_true", help="no training log lines")
    args = p.parse_args(argv)
    if args.quiet:
        logging.getLogger("nmt").setLevel(logging.WARNING)
    return args


def test_set(data: Path, src: str, tgt: str, lines: int | None = None) -> tuple[list[str], list[str]]:
    """test_2016_flickr's first ``lines`` source and reference lines (all of them for None)."""
    def read(lang: str) -> list[str]:
        return (data / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()[:lines]
    return read(src), read(tgt)


def best_texts(translations) -> list[str]:
    """Each ``nmt`` Translation's best hypothesis text ("" where it has none)."""
    return [t.hypotheses[0][0] if t.hypotheses else "" for t in translations]


def certified_percent(translations) -> float:
    """The share of ``translations`` whose search is certified, in percent."""
    return 100.0 * sum(bool(t.certified) for t in translations) / len(translations)


def noised_lines(lines: list[str], noise: dict, seed: int) -> list[str]:
    """``lines`` with each word deleted, blanked (``<unk>``) and moved as ``data.train.noise`` does
    (words: whitespace-separated tokens, as the ``space`` tokenizer's)."""
    import numpy as np

    from nmt.data.batching import collate
    from nmt.data.dataset import SourceDataset
    from nmt.data.field import Field
    from nmt.data.source_noise import NoiseSettings, SourceNoise
    from nmt.data.tokenizers import build_tokenizer

    field = Field.build(build_tokenizer({"type": "space"}), lines)
    data = SourceDataset(lines, field)
    data.line_numbers = list(range(1, len(lines) + 1))
    keep = [i for i, n in enumerate(data.src_lengths) if n > 0]
    out = list(lines)
    source_noise = SourceNoise([(NoiseSettings.from_config(noise), False)], [0, len(lines)], field, seed)
    for start in range(0, len(keep), 256):
        part = keep[start:start + 256]
        batch = source_noise.apply(collate(data, part, 0, 2, 3), data, 0)
        ids, lengths = batch.src.numpy(), batch.src_lengths.numpy()
        for row, i in enumerate(part):
            out[i] = " ".join(field.vocab.itos[t] for t in ids[row, :int(lengths[row])])
    assert np.all([len(x) > 0 for x, n in zip(out, data.src_lengths) if n > 0])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="directory of train / val / test_2016_flickr .SRC / .TGT files")
    p.add_argument("--src", default="de")
    p.add_argument("--tgt", default="en")
    p.add_argument("--steps", type=int, default=2000, help="updates of 64 sentences per run (default 2000)")
    p.add_argument("--noise", default='{"delete": 0.1, "blank": 0.1, "shuffle": 3}',
                   help="data.train.noise of the noised run and of the noised test sources (JSON)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", nargs="+", default=["plain", "noised"], choices=("plain", "noised", "word_dropout"),
                   help="which trainings: plain, noised (data.train.noise), word_dropout (model.embeddings."
                        "src_word_dropout and tgt_word_dropout at --word-dropout); default: plain noised")
    p.add_argument("--word-dropout", type=float, default=0.1, help="the word_dropout run's rate (default 0.1)")
    p.add_argument("--test-lines", type=int, default=None, help="translate only the first N test lines")
    args = parsed_with_run_options(p, argv)
    import sacrebleu

    import nmt
    from nmt.train.trainer import Trainer

    noise = json.loads(args.noise)
    data = Path(args.data)
    sources, references = test_set(data, args.src, args.tgt, args.test_lines)
    tests = {"clean": sources, "noised": noised_lines(sources, noise, seed=12345)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs:
            save_dir = Path(tmp) / name
            start = time.perf_counter()
            settings = noise if name == "noised" else None
            rate = args.word_dropout if name == "word_dropout" else 0.0
            cfg = resolve_config(config(data, args.src, args.tgt, save_dir, settings, args.steps, args.seed, rate),
                                 f"{name}.yaml")
            Trainer(cfg, f"{name}.yaml").train()
            seconds = time.perf_counter() - start
            model = nmt.load(save_dir / "last.pt", device="cpu")
            row = {"training": name, "seconds": seconds}
            for test, lines in tests.items():
                outputs = best_texts(model.translate(lines, beam_size=5))
                row[test] = sacrebleu.corpus_bleu(outputs, [references]).score
            rows.append(row)
    print(f"{args.src}->{args.tgt}: {args.steps} updates of 64 sentences; test_2016_flickr ({len(sources)} lines), "
          f"beam 5; noise {noise}")
    print(f"{'training':<12} {'BLEU clean':>10} {'BLEU noised':>11} {'train s':>8}")
    for r in rows:
        print(f"{r['training']:<12} {r['clean']:>10.2f} {r['noised']:>11.2f} {r['seconds']:>8.1f}")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
