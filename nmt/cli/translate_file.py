"""``nmt-translate`` on a whole input file: translate, then write every output atomically."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from nmt.cli.translate_ranks import Ranks
from nmt.cli.translate_common import (
    PROG,
    align_options,
    check_word_level,
    no_attention,
    fit_positions,
    lines_per_sentence,
    name_input,
    output_lines,
    print_metrics,
    phrase_table,
    read_constraints,
    read_prefixes,
    read_references,
    read_source,
    report_line,
    say,
    search_options,
    summary_suffix,
    write_heatmap,
    write_lines,
)


def run_file(args: argparse.Namespace, start: float, ranks: Ranks | None = None) -> int:
    """Translate ``args.src`` (a file, or all of stdin when not streaming) as ``args`` say;
    ``ranks``: this process's share under torchrun (:mod:`nmt.cli.translate_ranks`: rank 0 writes)."""
    ranks = Ranks() if ranks is None else ranks
    from nmt.translate.loading import load_models
    from nmt.translate.translator import TranslationSummary, Translator
    from nmt.utils.allocator import freeze_live_objects

    options = search_options(args)
    align = align_options(args)
    lines = read_source(args.src)
    references = read_references(args.tgt, len(lines), args.src) if args.tgt else None
    prefixes = read_prefixes(args.tgt_prefix, len(lines), args.src)
    constraints = read_constraints(args.constraints, len(lines), args.src)
    table = phrase_table(args)
    decoder, src_field, tgt_field, members = load_models(args.model, args.device)
    freeze_live_objects()  # the loaded objects are never garbage: keep full collections short
    startup = time.perf_counter() - start
    options = fit_positions(options, decoder)
    check_word_level(align, src_field, tgt_field)

    translator = Translator(decoder, src_field, tgt_field, options, batch_size=args.batch_size,
                            batch_type=args.batch_type, device=args.device, precision=args.precision,
                            align=align, replace_unk=args.replace_unk, phrase_table=table, src_tag=args.src_tag)
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=ranks.share(len(lines)), unit="sent", file=sys.stderr, desc=PROG + ranks.label(),
                   leave=False, disable=None)
    try:
        translations = translator.translate(lines, progress=bar.update if bar is not None else None,
                                            prefixes=prefixes, constraints=constraints,
                                            constraints_mode=args.constraints_mode, shard=ranks.shard)
    except ValueError as exc:  # a source longer than learned positions hold (a prefix than -max_length): its file and line
        raise no_attention(name_input(exc, {"source": args.src, "prefix": args.tgt_prefix,
                                            "constraints": args.constraints}), args) from None
    finally:
        if bar is not None:
            bar.close()
    translations, search_seconds = ranks.merged(translations, translator.search_seconds)
    if not ranks.writes:
        return 0
    write_lines(args.output, [line for t in translations
                              for line in output_lines(t, lines_per_sentence(args), args.with_score,
                                                                   args.report_align)])
    if args.report:
        from nmt.utils.io import atomic_open

        with atomic_open(args.report, "w") as handle:
            for t in translations:
                handle.write(report_line(t))
    if args.attention:
        width = len(str(max(len(translations) - 1, 0)))
        for t in translations:
            write_heatmap(Path(args.attention), t, width, args.attention_format)

    if not args.quiet:
        summary = TranslationSummary.of(translations)
        say(summary.line() + summary_suffix(startup, search_seconds, len(lines), members, args.precision)
            + ranks.suffix())
    if references is not None:
        print_metrics([t.text for t in translations], references)
    return 0


__all__ = ["run_file"]
