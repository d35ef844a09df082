#!/usr/bin/env python3
"""Evaluate morphological inflection the way the CoNLL-SIGMORPHON 2018 shared task does.

Per language: exact-match accuracy (%) and mean Levenshtein distance between hypothesis and
gold form; then their macro average over languages. With ``--report`` (the JSON lines of
``nmt-translate -report``) it adds the share of sentences whose beam search was certified
(``certified``; ``exact`` in reports of nmt 0.1.0 and earlier) and the share with a single
nonzero-probability hypothesis.

Usage: python recipes/morphology/evaluate.py --hyp dev.hyp --gold data/morphology/medium/dev.tgt \
           --lang data/morphology/medium/dev.lang [--report dev.report.jsonl] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def levenshtein(a: str, b: str) -> int:
    """Edit distance with unit costs (insert, delete, substitute)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def read_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def evaluate(hyps: list[str], golds: list[str], langs: list[str], reports: list[dict] | None = None) -> dict:
    """Per-language and macro-averaged accuracy / Levenshtein (and certificate rates)."""
    if not (len(hyps) == len(golds) == len(langs)):
        raise ValueError(f"line counts differ: hyp {len(hyps)}, gold {len(golds)}, lang {len(langs)}")
    if reports is not None and len(reports) != len(hyps):
        raise ValueError(f"report has {len(reports)} lines, hypotheses {len(hyps)}")
    per = defaultdict(lambda: {"n": 0, "correct": 0, "distance": 0, "certified": 0, "single": 0})
    for i, (h, g, lang) in enumerate(zip(hyps, golds, langs)):
        row = per[lang]
        row["n"] += 1
        row["correct"] += h == g
        row["distance"] += levenshtein(h, g)
        if reports is not None:
            certified = bool(reports[i]["certified"] if "certified" in reports[i] else reports[i]["exact"])
            row["certified"] += certified
            row["single"] += certified and reports[i]["n_nonzero"] == 1
    languages = {}
    for lang, row in sorted(per.items()):
        entry = {"n": row["n"], "accuracy": 100.0 * row["correct"] / row["n"],
                 "levenshtein": row["distance"] / row["n"]}
        if reports is not None:
            entry["certified"] = 100.0 * row["certified"] / row["n"]
            entry["single"] = 100.0 * row["single"] / row["n"]
        languages[lang] = entry
    keys = ["accuracy", "levenshtein"] + (["certified", "single"] if reports is not None else [])
    macro = {k: sum(e[k] for e in languages.values()) / len(languages) for k in keys}
    return {"languages": languages, "macro": macro, "sentences": len(hyps)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hyp", type=Path, required=True)
    parser.add_argument("--gold", type=Path, required=True)
    parser.add_argument("--lang", type=Path, required=True)
    parser.add_argument("--report", type=Path, default=None, help="nmt-translate -report JSON lines")
    parser.add_argument("--json", type=Path, default=None, help="write the full result as JSON")
    parser.add_argument("--per-language", action="store_true", help="print one line per language")
    args = parser.parse_args(argv)
    try:
        reports = None
        if args.report is not None:
            reports = [json.loads(line) for line in read_lines(args.report) if line.strip()]
            reports.sort(key=lambda r: r["id"])
        result = evaluate(read_lines(args.hyp), read_lines(args.gold), read_lines(args.lang), reports)
    except (OSError, ValueError, KeyError) as e:
        print(f"evaluate: error: {e}", file=sys.stderr)
        return 1
    if args.per_language:
        for lang, e in result["languages"].items():
            print(f"{lang:28s} " + " ".join(f"{k} {v:.2f}" for k, v in e.items() if k != "n"))
    m = result["macro"]
    print(f"macro over {len(result['languages'])} languages ({result['sentences']} sentences): "
          + ", ".join(f"{k} {v:.2f}" for k, v in m.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
