#!/usr/bin/env python3
"""Evaluate translations with sacrebleu (BLEU, chrF) and summarise nmt-translate's certificates.

The hypotheses are the detokenized lines written by ``nmt-translate -output`` (one per source
line, i.e. ``-n_best 1``), the references the raw target file (e.g. Multi30k's
``test_2016_flickr.en``); BLEU and chrF are sacrebleu's corpus scores with its defaults (13a
tokenization). With ``--report`` (the JSON lines of ``nmt-translate -report``) it adds, over
the non-empty input lines: the share of sentences whose beam search was certified (every
sequence of nonzero probability found; read from ``certified``, or from ``exact``, its name in
reports of nmt 0.1.0 and earlier), the
share certified with a single hypothesis (``n_nonzero == 1``, as nmt-translate's own summary counts it),
the mean ``n_nonzero``, and, when the report was written with ``-support``, the mean output
support size per decoding step.

Usage: python recipes/translation/evaluate.py --hyp test.hyp --ref data/multi30k/test_2016_flickr.en \
           [--report test.report.jsonl] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EMPTY_INPUT = "empty_input"


class EvaluationError(ValueError):
    """A one-line problem with an input file (its message names the file)."""


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, without their newlines."""
    if not path.is_file():
        raise EvaluationError(f"{path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    except UnicodeDecodeError as e:
        raise EvaluationError(f"{path}: not UTF-8 text ({e.reason})") from None


def read_report(path: Path) -> list[dict]:
    """The records of an ``nmt-translate -report`` file, in sentence order."""
    records = []
    for n, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            record["id"], record["n_nonzero"], _certified(record)
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise EvaluationError(f"{path}:{n}: not an nmt-translate report record ({e})") from None
        records.append(record)
    records.sort(key=lambda r: r["id"])
    return records


def scores(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """sacrebleu corpus BLEU and chrF (0-100) of detokenized hypotheses against one reference each."""
    import sacrebleu

    return {"bleu": float(sacrebleu.corpus_bleu(hyps, [refs]).score),
            "chrf": float(sacrebleu.corpus_chrf(hyps, [refs]).score)}


def _certified(record: dict) -> bool:
    """The certificate of a report record (``exact``: its name in nmt 0.1.0 reports and earlier)."""
    return bool(record["certified"] if "certified" in record else record["exact"])


def certificate_stats(reports: list[dict]) -> dict[str, float | int | None]:
    """% certified, % single hypothesis, mean n_nonzero (and mean output support) over decoded sentences."""
    decoded = [r for r in reports if r.get("reason") != EMPTY_INPUT]
    n = max(len(decoded), 1)
    sizes = [step["size"] for r in decoded for step in (r.get("support") or [])]
    return {
        "sentences": len(decoded),
        "certified": 100.0 * sum(_certified(r) for r in decoded) / n,
        "single": 100.0 * sum(_certified(r) and r["n_nonzero"] == 1 for r in decoded) / n,
        "mean_n_nonzero": sum(r["n_nonzero"] for r in decoded) / n,
        "mean_support": sum(sizes) / len(sizes) if sizes else None,
    }


def evaluate(hyp: Path, ref: Path, report: Path | None = None) -> dict:
    """Scores of ``hyp`` against ``ref`` (and certificate statistics from ``report``)."""
    hyps, refs = read_lines(hyp), read_lines(ref)
    if len(hyps) != len(refs):
        raise EvaluationError(f"{hyp} has {len(hyps)} lines but {ref} has {len(refs)}")
    result: dict = {"sentences": len(hyps), **scores(hyps, refs)}
    if report is not None:
        records = read_report(report)
        if len(records) != len(hyps):
            raise EvaluationError(f"{report} has {len(records)} records but {hyp} has {len(hyps)} lines")
        result["certificates"] = certificate_stats(records)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hyp", type=Path, required=True, help="detokenized hypotheses (nmt-translate -output)")
    parser.add_argument("--ref", type=Path, required=True, help="raw reference translations, one per line")
    parser.add_argument("--report", type=Path, default=None, help="nmt-translate -report JSON lines")
    parser.add_argument("--json", type=Path, default=None, help="write the result as JSON")
    args = parser.parse_args(argv)
    try:
        result = evaluate(args.hyp, args.ref, args.report)
    except (OSError, ValueError) as e:
        print(f"evaluate: error: {e}", file=sys.stderr)
        return 1
    line = f"{result['sentences']} sentences: BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f}"
    c = result.get("certificates")
    if c is not None:
        support = "n/a (no -support)" if c["mean_support"] is None else f"{c['mean_support']:.2f}"
        line += (f"; certified {c['certified']:.1f}%, single hypothesis {c['single']:.1f}%, "
                 f"mean n_nonzero {c['mean_n_nonzero']:.2f}, mean output support {support}")
    print(line)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
