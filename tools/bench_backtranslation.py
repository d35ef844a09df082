#!/usr/bin/env python
"""Back-translation with nmt's own tools: real pairs alone against real + back-translated pairs, plain,
tagged (``src_tag``) and noised (``data.train[i].noise``).

A simulated low-resource setting on one parallel corpus: its first ``--real`` pairs are the real
data, the target side of the rest the monolingual text. A reverse model (target -> source) trained
on the real pairs translates the monolingual text with beam 5 (``nmt.load(...).translate``); then
forward models train on the real pairs alone, on real + back-translated pairs, on them with a
``<BT>`` tag on the synthetic sources (Caswell et al. 2019), and on them with the synthetic sources
noised anew every epoch (Edunov et al. 2018: delete 0.1, blank 0.1, shuffle 3; the ``--noise`` JSON).
Every forward run trains the same model for the same updates; prints the corpus BLEU (sacrebleu) of
each on the test set (beam 5; the tagged model translates its real input untagged). The model: an
LSTM (1 bi-LSTM encoder layer of 2 x 128, 1 decoder layer of 256, embeddings 128, 1.5-entmax
attention and output), word tokens (``space``, min_freq 2), batches of 64 sentences, Adam 1e-3;
the runs live in a temporary directory.

    python tools/bench_backtranslation.py --data path/to/multi30k --real 10000 --steps 3000   # de -> en, tens of minutes
    python tools/bench_backtranslation.py --data path/to/multi30k --real 50 --mono 50 --steps 3 --test-lines 5 --quiet  # smoke

``--data`` holds Multi30k's file names: ``train``, ``val`` and ``test_2016_flickr`` ``.de`` / ``.en``.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_source_noise import best_texts, parsed_with_run_options, test_set  # noqa: E402
from bench_source_noise import word_lstm_config as config  # noqa: E402  (the same model and training)
from nmt.config import resolve_config  # noqa: E402
from nmt.utils.io import atomic_write_text  # noqa: E402

RUNS = ("real", "bt", "bt_tagged", "bt_noised")


def write_lines(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="directory of train / val / test_2016_flickr .SRC / .TGT files")
    p.add_argument("--src", default="de")
    p.add_argument("--tgt", default="en")
    p.add_argument("--real", type=int, default=10000, help="the first N training pairs are the real data")
    p.add_argument("--mono", type=int, default=None, help="monolingual target lines after them (default: the rest)")
    p.add_argument("--steps", type=int, default=3000, help="updates of 64 sentences of every forward run")
    p.add_argument("--reverse-steps", type=int, default=None, help="updates of the reverse model (default --steps)")
    p.add_argument("--noise", default='{"delete": 0.1, "blank": 0.1, "shuffle": 3}',
                   help="data.train[i].noise of the noised run's synthetic corpus (JSON)")
    p.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--test-lines", type=int, default=None, help="translate only the first N test lines")
    args = parsed_with_run_options(p, argv)
    import sacrebleu

    import nmt
    from nmt.train.trainer import Trainer

    data = Path(args.data)
    src_lines = (data / f"train.{args.src}").read_text(encoding="utf-8").splitlines()
    tgt_lines = (data / f"train.{args.tgt}").read_text(encoding="utf-8").splitlines()
    end = len(tgt_lines) if args.mono is None else args.real + args.mono
    mono = tgt_lines[args.real:end]
    tests, references = test_set(data, args.src, args.tgt, args.test_lines)
    valid = {"src": str(data / f"val.{args.src}"), "tgt": str(data / f"val.{args.tgt}")}
    noise = json.loads(args.noise)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        real = {"src": write_lines(root / "real.src", src_lines[:args.real]),
                "tgt": write_lines(root / "real.tgt", tgt_lines[:args.real]), "name": "real"}
        start = time.perf_counter()
        reverse = config([{"src": real["tgt"], "tgt": real["src"]}], {"src": valid["tgt"], "tgt": valid["src"]},
                         root / "reverse", args.reverse_steps or args.steps, args.seed)
        Trainer(resolve_config(reverse, "reverse.yaml"), "reverse.yaml").train()
        reverse_model = nmt.load(root / "reverse" / "last.pt", device="cpu")
        synthetic = best_texts(reverse_model.translate(mono, beam_size=5))
        back = {"src": write_lines(root / "bt.src", synthetic), "tgt": write_lines(root / "bt.tgt", mono),
                "name": "backtranslated"}
        reverse_bleu = sacrebleu.corpus_bleu(synthetic, [src_lines[args.real:end]]).score
        bt_seconds = time.perf_counter() - start
        corpora = {"real": [real], "bt": [real, back], "bt_tagged": [real, {**back, "src_tag": "<BT>"}],
                   "bt_noised": [real, {**back, "noise": noise}]}
        for name in args.runs:
            start = time.perf_counter()
            cfg = resolve_config(config(corpora[name], valid, root / name, args.steps, args.seed), f"{name}.yaml")
            Trainer(cfg, f"{name}.yaml").train()
            outputs = best_texts(nmt.load(root / name / "last.pt", device="cpu").translate(tests, beam_size=5))
            rows.append({"training": name, "bleu": sacrebleu.corpus_bleu(outputs, [references]).score,
                         "seconds": time.perf_counter() - start})
    print(f"{args.src}->{args.tgt}: {args.real} real pairs, {len(mono)} monolingual {args.tgt} lines back-translated "
          f"(reverse model: {args.reverse_steps or args.steps} updates, BLEU {reverse_bleu:.2f} against the held-out "
          f"{args.src} side, {bt_seconds:.0f} s with its translation); forward runs {args.steps} updates of 64 "
          f"sentences; test_2016_flickr ({len(tests)} lines), beam 5; noise {noise}")
    print(f"{'training':<10} {'BLEU':>6} {'seconds':>8}")
    for r in rows:
        print(f"{r['training']:<10} {r['bleu']:>6.2f} {r['seconds']:>8.1f}")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps({"reverse_bleu": reverse_bleu, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
