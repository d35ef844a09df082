"""``nmt-translate -mode score`` (or ``-score_output FILE``): score given references.

One JSON line per (source, reference) pair: its total and per-token log-probabilities under
the model (or ensemble), the token count, whether the model gives it probability exactly 0 and
where it first leaves the support (see ``nmt.translate.scorer.PairScore``). The summary line
(mean log-prob, % of references of probability 0) goes to stderr. ``-report_align`` adds the
reference's alignment from the teacher-forced attention (``"alignment"``, Pharaoh pairs).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from nmt.cli.translate_ranks import Ranks
from nmt.cli.translate_common import (
    PROG,
    align_options,
    check_word_level,
    name_input,
    no_attention,
    read_references,
    read_source,
    say,
    summary_suffix,
    write_lines,
)


def run_score(args: argparse.Namespace, start: float, ranks: Ranks | None = None) -> int:
    """Score ``args.tgt`` given ``args.src``; JSON lines to ``-score_output`` (else ``-output``);
    ``ranks``: this process's share under torchrun (:mod:`nmt.cli.translate_ranks`: rank 0 writes)."""
    ranks = Ranks() if ranks is None else ranks
    from nmt.translate.loading import load_models
    from nmt.translate.scorer import ScoreSummary, Scorer
    from nmt.utils.allocator import freeze_live_objects

    if not args.tgt:
        raise ValueError("-mode score needs the references: -tgt FILE")
    align = align_options(args)
    sources = read_source(args.src)
    references = read_references(args.tgt, len(sources), args.src)
    decoder, src_field, tgt_field, members = load_models(args.model, args.device)
    freeze_live_objects()  # the loaded objects are never garbage: keep full collections short
    startup = time.perf_counter() - start
    check_word_level(align, src_field, tgt_field)

    scorer = Scorer(decoder, src_field, tgt_field, batch_size=args.batch_size, device=args.device,
                    precision=args.precision, align=align, src_tag=args.src_tag)
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=ranks.share(len(sources)), unit="pair", file=sys.stderr, desc=PROG + ranks.label(),
                   leave=False, disable=None)
    try:
        scores = scorer.score(sources, references, progress=bar.update if bar is not None else None,
                              shard=ranks.shard)
    except ValueError as exc:  # a pair longer than learned positions hold: its file and line
        raise no_attention(name_input(exc, {"source": args.src, "target": args.tgt}), args) from None
    finally:
        if bar is not None:
            bar.close()
    scores, seconds = ranks.merged(scores, scorer.seconds)
    if not ranks.writes:
        return 0
    write_lines(args.score_output or args.output, [json.dumps(s.report(), ensure_ascii=False) for s in scores])
    summary = ScoreSummary.of(scores)
    line = summary.line()
    if not args.quiet:
        line += (summary_suffix(startup, seconds, len(sources), members, args.precision).replace("sentences/s", "pairs/s")
                 + ranks.suffix())
    say(line)  # the metric line of scoring: kept with -quiet
    return 0


__all__ = ["run_score"]
