#!/usr/bin/env python
"""What coverage buys: translation trained plain, with coverage attention, and with the coverage loss.

Trains the word-token LSTM of ``bench_source_noise`` (1 bi-LSTM encoder layer of 2 x 128, 1 decoder
layer of 256, embeddings 128, 1.5-entmax attention and output, min_freq 2) on Multi30k de -> en
(``train`` / ``val`` / ``test_2016_flickr`` ``.de`` ``.en``) for ``--steps`` updates of 64 sentences,
one thread, once per ``--runs`` entry: ``plain``; ``coverage`` (``model.attention.coverage`` and
``training.coverage_loss`` at ``--weight``, See et al. 2017's pair); ``attention`` (coverage attention
alone); ``loss`` (the coverage loss alone). Then translates test_2016_flickr with beam 5 and prints per run: BLEU (sacrebleu), the share
of outputs that hold some word bigram twice (repetition, what coverage targets), the output / reference
length ratio in words, the certified share, and the training speed (median target tokens/s) with its
ratio to the plain run of this invocation (run it on an idle machine for that column to mean anything).

    python tools/bench_coverage.py --data path/to/multi30k --steps 2000
    python tools/bench_coverage.py --data DIR --steps 5 --test-lines 20 --quiet      # smoke run

``--late N`` adds See et al.'s schedule: the ``attention`` run (trained as above, ``--steps`` updates,
no loss) goes on for N more updates from its last checkpoint (``training.init_from`` with
``init_optimizer``) twice: ``continued`` without the loss and ``late loss`` with it at ``--weight``,
so the loss's effect is read against the same extra updates.

    python tools/bench_coverage.py --data path/to/multi30k --steps 2000 --runs plain attention --late 500 --weight 0.1
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_copy import training_speed  # noqa: E402  (the median tokens/s of a run's log)
from bench_source_noise import best_texts, certified_percent, parsed_with_run_options, test_set  # noqa: E402
from bench_source_noise import config as multi30k_config  # noqa: E402  (the same model and training)
from nmt.config import resolve_config  # noqa: E402
from nmt.utils.io import atomic_write_text  # noqa: E402

RUNS = ("plain", "coverage", "attention", "loss")


def repeats_a_bigram(line: str) -> bool:
    """Whether ``line``'s words hold some bigram twice."""
    words = line.split()
    bigrams = list(zip(words, words[1:]))
    return len(bigrams) != len(set(bigrams))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="Multi30k's train / val / test_2016_flickr .de / .en")
    p.add_argument("--steps", type=int, default=2000, help="updates of 64 sentences per run (default 2000)")
    p.add_argument("--runs", nargs="+", default=["plain", "coverage", "loss"], choices=RUNS)
    p.add_argument("--weight", type=float, default=1.0, help="training.coverage_loss of the coverage runs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--test-lines", type=int, default=None, help="translate only the first N test lines")
    p.add_argument("--late", type=int, default=0, help="N: continue the attention run N updates without and "
                                                         "with the loss (see the module docstring)")
    args = parsed_with_run_options(p, argv)
    import sacrebleu
    import torch

    import nmt
    from nmt.train.trainer import Trainer

    torch.set_num_threads(1)
    data = Path(args.data)
    sources, references = test_set(data, "de", "en", args.test_lines)
    reference_words = sum(len(r.split()) for r in references)
    rows = []

    def train(name: str, save_dir: Path, steps: int, coverage: bool, weight: float, parent: Path | None = None):
        cfg = multi30k_config(data, "de", "en", save_dir, None, steps, args.seed)
        cfg["model"]["attention"]["coverage"] = coverage
        cfg["training"].update(threads=1, coverage_loss=weight)
        if parent is not None:  # a later phase: the parent's weights and Adam state, a fresh step count
            cfg["training"].update(init_from=str(parent / "last.pt"), init_optimizer=True)
        Trainer(resolve_config(cfg, f"{name}.yaml"), f"{name}.yaml").train()

    def evaluate(name: str, save_dir: Path) -> None:
        model = nmt.load(save_dir / "last.pt", device="cpu")
        translations = model.translate(sources, beam_size=5)
        outputs = best_texts(translations)
        rows.append({"run": name, "bleu": sacrebleu.corpus_bleu(outputs, [references]).score,
                     "repeating_percent": 100.0 * sum(map(repeats_a_bigram, outputs)) / len(outputs),
                     "length_ratio": sum(len(o.split()) for o in outputs) / max(reference_words, 1),
                     "certified": certified_percent(translations),
                     "train_tokens_per_sec": training_speed(save_dir)})

    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs:
            train(name, Path(tmp) / name, args.steps, name in ("coverage", "attention"),
                  args.weight if name in ("coverage", "loss") else 0.0)
            evaluate(name, Path(tmp) / name)
        if args.late:
            base = Path(tmp) / "attention"
            if "attention" not in args.runs:
                train("attention", base, args.steps, True, 0.0)
            for name, weight in (("continued", 0.0), ("late loss", args.weight)):
                train(name, Path(tmp) / name, args.late, True, weight, parent=base)
                evaluate(name, Path(tmp) / name)
    plain = next((r for r in rows if r["run"] == "plain"), None)
    print(f"{data}: de->en, word LSTM, 1.5-entmax attention and output, {args.steps} updates, seed {args.seed}, "
          f"coverage_loss {args.weight:g}{f', late phases of {args.late} updates' if args.late else ''}; "
          f"test_2016_flickr ({len(sources)} lines), beam 5")
    print(f"{'run':<10} {'BLEU':>6} {'repeating %':>11} {'len ratio':>9} {'certified':>9} {'train tok/s':>11} "
          f"{'x plain':>7}")
    for r in rows:
        ratio = (r["train_tokens_per_sec"] / plain["train_tokens_per_sec"]
                 if plain and plain["train_tokens_per_sec"] and r["train_tokens_per_sec"] else float("nan"))
        print(f"{r['run']:<10} {r['bleu']:>6.2f} {r['repeating_percent']:>11.2f} {r['length_ratio']:>9.3f} "
              f"{r['certified']:>9.2f} {r['train_tokens_per_sec'] or 0:>11.0f} {ratio:>7.2f}")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
