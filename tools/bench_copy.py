#!/usr/bin/env python
"""What copying source tokens buys: morphological inflection trained without and with ``model.output.copy``.

Trains the morphology recipe's CPU config (``recipes/morphology/configs/cpu_ATTENTION_OUTPUT.yaml``:
2-layer bi-LSTM encoder of 2 x 128, 1 decoder layer of 256, embeddings 128, dropout 0.3, Adam 1e-3
halved when the validation loss stalls) on a prepared setting (``recipes/morphology/prepare.py``'s
``train`` / ``valid`` / ``dev`` ``.src`` ``.tgt`` ``.lang``) for ``--steps`` updates of 64 pairs, one
thread, validating greedy exact match every ``--valid-every`` updates, once plain and once copying for
each seed; decodes the full dev set from each run's ``best.pt`` with beam 5 (certified) and scores
it the shared task's way (``recipes/morphology/evaluate.py``: macro accuracy and Levenshtein over
languages, certified and single-hypothesis shares). Prints one row per run, the mean over seeds,
and each run's training speed (median target tokens/s of its log lines) and decoding speed
(sentences/s, translation only) with the copying runs' ratio to the plain ones of the same seed,
measured in this invocation (run it on an idle machine for the speed columns to mean anything).

    python tools/bench_copy.py --data data/morphology/low --steps 2000 --seeds 1 2
    python tools/bench_copy.py --data DIR --steps 5 --dev-lines 20 --quiet        # smoke run

``--multi30k DIR`` (instead of ``--data``) compares the same way on word-level translation: Multi30k
de -> en (``train`` / ``val`` / ``test_2016_flickr`` ``.de`` ``.en``), the word-token LSTM of
``bench_source_noise`` (min_freq 2: rare words are ``<unk>``, which a copying model copies from their
source position), test_2016_flickr with beam 5: BLEU without and with ``replace_unk`` (each ``<unk>``
output replaced by the most attended source word), the ``<unk>`` outputs per 100 words and the
certified share.

    python tools/bench_copy.py --multi30k path/to/multi30k --steps 2000
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "recipes" / "morphology"))
sys.path.insert(0, str(ROOT / "tools"))

from bench_source_noise import best_texts, certified_percent, parsed_with_run_options, test_set  # noqa: E402
from bench_source_noise import config as multi30k_config  # noqa: E402  (the word LSTM of --multi30k)
from nmt.config import resolve_config  # noqa: E402
from nmt.utils.io import atomic_write_text  # noqa: E402


def run_config(data: Path, mappings: str, save_dir: Path, steps: int, valid_every: int, seed: int,
               copy: bool) -> dict:
    """The recipe's ``cpu_<mappings>.yaml`` on ``data``'s files, ``steps`` updates without a time
    budget, ``seed``, ``model.output.copy`` = ``copy``, in ``save_dir``."""
    cfg = yaml.safe_load((ROOT / "recipes" / "morphology" / "configs" / f"cpu_{mappings}.yaml").read_text(
        encoding="utf-8"))
    cfg["data"]["train"] = {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}
    cfg["data"]["valid"] = {"src": str(data / "valid.src"), "tgt": str(data / "valid.tgt")}
    cfg["model"]["output"]["copy"] = copy
    cfg["training"].update(save_dir=str(save_dir), max_steps=steps, max_minutes=None, seed=seed,
                           valid_every=valid_every, log_every=max(1, min(100, steps // 4)), tensorboard=False,
                           device="cpu", threads=1, progress=False, keep_last=1)
    return cfg


def runs(seeds: list[int]):
    """``(seed, copy, name)`` of each run: the plain one, then the copying one, for every seed."""
    for seed in seeds:
        for copy in (False, True):
            yield seed, copy, f"{'copy' if copy else 'plain'}-{seed}"


def timed_translations(model, sources: list[str]) -> tuple[list, float]:
    """``model.translate(sources, beam_size=5)`` and its sentences per second (translation only)."""
    start = time.perf_counter()
    translations = model.translate(sources, beam_size=5)
    return translations, len(sources) / (time.perf_counter() - start)


def training_speed(save_dir: Path) -> float | None:
    """The median ``tokens_per_sec`` of a run's logged training windows (None: none logged)."""
    speeds = []
    for line in (save_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("tokens_per_sec"):
            speeds.append(float(record["tokens_per_sec"]))
    return statistics.median(speeds) if speeds else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--data", help="a prepared morphology setting: train / valid / dev .src .tgt .lang")
    where.add_argument("--multi30k", help="Multi30k's train / val / test_2016_flickr .de / .en (translation)")
    p.add_argument("--mappings", default="entmax15_entmax15",
                   help="the recipe config's ATTENTION_OUTPUT, e.g. softmax_softmax (default entmax15_entmax15)")
    p.add_argument("--steps", type=int, default=2000, help="updates of 64 pairs per run (default 2000)")
    p.add_argument("--valid-every", type=int, default=250, help="greedy exact match on valid every N updates")
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--dev-lines", type=int, default=None, help="decode only the first N dev (test) lines")
    args = parsed_with_run_options(p, argv)
    import torch

    import nmt
    from evaluate import evaluate
    from nmt.train.trainer import Trainer

    torch.set_num_threads(1)
    if args.multi30k:
        return translation(args)
    data = Path(args.data)

    def lines(name: str) -> list[str]:
        return (data / name).read_text(encoding="utf-8").splitlines()[:args.dev_lines]

    sources, golds, langs = lines("dev.src"), lines("dev.tgt"), lines("dev.lang")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed, copy, name in runs(args.seeds):
            save_dir = Path(tmp) / name
            cfg = resolve_config(run_config(data, args.mappings, save_dir, args.steps, args.valid_every, seed, copy),
                                 f"{name}.yaml")
            Trainer(cfg, f"{name}.yaml").train()
            translations, speed = timed_translations(nmt.load(save_dir / "best.pt", device="cpu"), sources)
            hyps = best_texts(translations)
            reports = [{"certified": bool(t.certified), "n_nonzero": t.n_nonzero} for t in translations]
            scores = evaluate(hyps, golds, langs, reports)["macro"]
            rows.append({"run": name, "copy": copy, "seed": seed, **scores,
                         "train_tokens_per_sec": training_speed(save_dir), "decode_sentences_per_sec": speed})
    print(f"{data}: cpu_{args.mappings}, {args.steps} updates, seeds {args.seeds}; dev {len(sources)} lines, "
          f"beam 5 (macro over languages)")
    print(f"{'run':<10} {'accuracy':>8} {'levensht':>8} {'certified':>9} {'single':>7} {'train tok/s':>11} "
          f"{'dec sent/s':>10}")
    for r in rows:
        print(f"{r['run']:<10} {r['accuracy']:>8.2f} {r['levenshtein']:>8.2f} {r['certified']:>9.2f} "
              f"{r['single']:>7.2f} {r['train_tokens_per_sec'] or 0:>11.0f} {r['decode_sentences_per_sec']:>10.1f}")
    for copy in (False, True):
        mine = [r for r in rows if r["copy"] == copy]
        print(f"{'copy' if copy else 'plain':<10} {statistics.mean(r['accuracy'] for r in mine):>8.2f} "
              f"{statistics.mean(r['levenshtein'] for r in mine):>8.2f} "
              f"{statistics.mean(r['certified'] for r in mine):>9.2f} "
              f"{statistics.mean(r['single'] for r in mine):>7.2f}  (mean over seeds)")
    speed_ratios(rows, args.seeds)
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(rows, indent=1) + "\n")
    return 0


def speed_ratios(rows: list[dict], seeds: list[int]) -> None:
    """Print each seed's copying / plain training and decoding speed ratio."""
    for seed in seeds:
        plain, copying = (next(r for r in rows if r["seed"] == seed and r["copy"] == c) for c in (False, True))
        train = (copying["train_tokens_per_sec"] / plain["train_tokens_per_sec"]
                 if plain["train_tokens_per_sec"] and copying["train_tokens_per_sec"] else float("nan"))
        decode = copying["decode_sentences_per_sec"] / plain["decode_sentences_per_sec"]
        print(f"seed {seed}: copying / plain speed: training {train:.2f}x, decoding {decode:.2f}x")


def translation(args: argparse.Namespace) -> int:
    """The ``--multi30k`` comparison (see the module docstring)."""
    import sacrebleu

    import nmt
    from nmt.train.trainer import Trainer

    data = Path(args.multi30k)
    sources, references = test_set(data, "de", "en", args.dev_lines)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed, copy, name in runs(args.seeds):
            save_dir = Path(tmp) / name
            cfg = multi30k_config(data, "de", "en", save_dir, None, args.steps, seed)
            cfg["model"]["output"]["copy"] = copy
            cfg["training"]["threads"] = 1
            Trainer(resolve_config(cfg, f"{name}.yaml"), f"{name}.yaml").train()
            model = nmt.load(save_dir / "last.pt", device="cpu")
            translations, speed = timed_translations(model, sources)
            outputs = best_texts(translations)
            replaced = best_texts(model.translate(sources, beam_size=5, replace_unk=True))
            words = sum(len(o.split()) for o in outputs)
            unks = sum(o.split().count("<unk>") for o in outputs)
            rows.append({"run": name, "copy": copy, "seed": seed,
                         "bleu": sacrebleu.corpus_bleu(outputs, [references]).score,
                         "bleu_replace_unk": sacrebleu.corpus_bleu(replaced, [references]).score,
                         "unk_per_100_words": 100.0 * unks / max(words, 1),
                         "certified": certified_percent(translations),
                         "train_tokens_per_sec": training_speed(save_dir), "decode_sentences_per_sec": speed})
    print(f"{data}: de->en, word LSTM, {args.steps} updates, seeds {args.seeds}; test_2016_flickr "
          f"({len(sources)} lines), beam 5")
    print(f"{'run':<10} {'BLEU':>6} {'+repl.unk':>9} {'unk/100w':>8} {'certified':>9} {'train tok/s':>11} "
          f"{'dec sent/s':>10}")
    for r in rows:
        print(f"{r['run']:<10} {r['bleu']:>6.2f} {r['bleu_replace_unk']:>9.2f} {r['unk_per_100_words']:>8.2f} "
              f"{r['certified']:>9.2f} {r['train_tokens_per_sec'] or 0:>11.0f} {r['decode_sentences_per_sec']:>10.1f}")
    speed_ratios(rows, args.seeds)
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
