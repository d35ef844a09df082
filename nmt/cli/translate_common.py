"""Pieces shared by the modes of ``nmt-translate`` (file, stream, score): reading, writing,
reports, heatmaps and the summary / metric lines. Heavy modules are imported when needed."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from nmt.utils.json_safe import json_safe

if TYPE_CHECKING:
    from nmt.translate.alignment import AlignOptions
    from nmt.translate.search_options import SearchOptions
    from nmt.translate.translator import Translation

PROG = "nmt-translate"
SEARCH_FLAGS = ("n_best", "max_length", "min_length", "max_length_ratio", "max_length_offset",
                "length_penalty", "length_alpha", "support_topk", "stop_every", "sample", "temperature",
                "sample_topk", "sample_topp", "block_ngram_repeat", "ban_unk_token", "coverage_penalty", "beta",
                "coverage_epsilon", "stepwise_penalty", "mbr")
"""Flags that are ``SearchOptions`` fields of the same name (defaults taken from it); ``-beam_size``
and ``-seed`` are too, with defaults that depend on ``-sample`` (see :func:`search_options`)."""


def say(message: str) -> None:
    """One line on stderr, prefixed with the program name."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def read_stdin() -> list[str]:
    """All of stdin as lines (UTF-8, a leading BOM dropped as for files; a bad byte is a
    DataError naming the line)."""
    from nmt.data.textfiles import decode_lines

    return decode_lines(sys.stdin.buffer.read(), "<stdin>")


def read_source(path: str) -> list[str]:
    """The lines of ``path`` (``-``: all of stdin)."""
    from nmt.data.textfiles import read_lines

    return read_stdin() if path == "-" else read_lines(path)


def read_lines_beside(path: str, expected: int | None, src: str, name: str, stdin: bool) -> list[str]:
    """The lines of ``path`` (with ``stdin``, ``-`` is all of stdin), one per source line; ValueError
    naming ``name`` (the flag) when their count differs from ``expected`` (the source's lines; None:
    a stream, checked as it goes)."""
    from nmt.data.textfiles import read_lines

    lines = read_source(path) if stdin else read_lines(path)
    if expected is not None and len(lines) != expected:
        raise ValueError(f"{name} {path} has {len(lines)} lines but {src} has {expected}")
    return lines


def read_references(path: str, expected: int | None, src: str) -> list[str]:
    """The reference lines of ``-tgt``; ValueError when their count differs from ``expected``."""
    return read_lines_beside(path, expected, src, "-tgt", stdin=False)


def phrase_table(args: argparse.Namespace) -> dict[str, str] | None:
    """The table of ``-phrase_table`` (None without it); a bad line is a DataError naming it."""
    if args.phrase_table is None:
        return None
    from nmt.translate.phrase_table import read_phrase_table

    return read_phrase_table(args.phrase_table)


def read_prefixes(path: str | None, expected: int | None, src: str) -> list[str] | None:
    """The lines of ``-tgt_prefix`` (``-``: all of stdin), None without it; ValueError when their
    count differs from ``expected``."""
    return None if path is None else read_lines_beside(path, expected, src, "-tgt_prefix", stdin=True)


def read_constraints(path: str | None, expected: int | None, src: str) -> list[list[str]] | None:
    """The phrases of each line of ``-constraints`` (TAB-separated; an empty line: none; ``-``: all of
    stdin), None without it; ValueError when the line count differs from ``expected``. An empty phrase
    (two TABs in a row, a TAB at an end) stays, for the translator to name its line."""
    if path is None:
        return None
    return [line.split("\t") if line else [] for line in read_lines_beside(path, expected, src, "-constraints",
                                                                          stdin=True)]


def search_options(args: argparse.Namespace) -> SearchOptions:
    """The ``SearchOptions`` the flags ask for; a bad value is a ValueError naming the flag.

    ``-beam_size`` left out is ``SearchOptions``' default, 1 with ``-sample`` (which draws ``-n_best``
    samples and refuses any other beam size); ``-seed`` is refused without ``-sample``."""
    from nmt.translate.search_options import SearchOptions

    beam_size, seed = getattr(args, "beam_size", None), getattr(args, "seed", None)
    if args.sample and beam_size not in (None, 1):
        raise ValueError(f"-beam_size {beam_size} does not apply to -sample, which draws -n_best independent "
                         "samples per sentence (fairseq's --beam N samples: use -n_best N)")
    if not args.sample and seed is not None:
        raise ValueError("-seed applies to -sample only (beam search is deterministic)")
    if not args.sample:  # the flags of sampling, named as flags (SearchOptions names its fields)
        for flag, value, off in (("-temperature", args.temperature, 1.0), ("-sample_topk", args.sample_topk, 0),
                                 ("-sample_topp", args.sample_topp, 1.0)):
            if value != off:
                raise ValueError(f"{flag} {value} applies to -sample only (add -sample to draw samples; "
                                 "beam search takes the most probable outputs)")
    elif args.length_penalty != "none":
        raise ValueError(f"-length_penalty {args.length_penalty} does not apply to -sample (samples are drawn, "
                         "not ranked); leave it out")
    elif args.coverage_penalty != "none":
        raise ValueError(f"-coverage_penalty {args.coverage_penalty} does not apply to -sample (samples are drawn, "
                         "not ranked); leave it out")
    defaults = SearchOptions()
    try:
        return SearchOptions(**{name: getattr(args, name) for name in SEARCH_FLAGS},
                             beam_size=(1 if args.sample else defaults.beam_size) if beam_size is None else beam_size,
                             seed=defaults.seed if seed is None else seed,
                             certify=not args.no_certify, return_support=args.support, mode=args.search_mode,
                             return_attention=args.attention is not None)
    except ValueError as exc:
        raise ValueError(f"-{exc}") from None  # every message starts with the field = flag name


def align_options(args: argparse.Namespace) -> AlignOptions | None:
    """The ``AlignOptions`` of ``-report_align`` (``-align_mode``, ``-align_level``,
    ``-align_threshold``), None without it; a bad value is a ValueError naming the flag."""
    if not args.report_align:
        return None
    from nmt.translate.alignment import AlignOptions

    try:
        return AlignOptions(mode=args.align_mode or "argmax", level=args.align_level or "word",
                            threshold=0.0 if args.align_threshold is None else args.align_threshold)
    except ValueError as exc:
        raise ValueError(f"-{exc}") from None  # every message starts with the field = flag name


def attention_flags(args: argparse.Namespace) -> str:
    """The flags of ``args`` that need the model's attention, e.g. ``-report_align``, for errors."""
    flags = [flag for flag, used in (("-report_align", args.report_align),
                                     ("-replace_unk", getattr(args, "replace_unk", False)),
                                     ("-attention", getattr(args, "attention", None) is not None)) if used]
    return "/".join(flags)


def check_word_level(align: AlignOptions | None, src_field: object, tgt_field: object) -> None:
    """ValueError naming ``-align_level word`` where a tokenizer cannot group its pieces into words."""
    if align is None or align.level != "word":
        return
    from nmt.translate.translator import check_word_ids

    try:
        for side, field_ in (("source", src_field), ("target", tgt_field)):
            check_word_ids(field_, side)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ValueError(f"-align_level word: {exc} (-align_level token)") from None


def no_attention(exc: Exception, args: argparse.Namespace) -> Exception:
    """A ``NoAttention`` as a one-line error naming the flags that needed the attention; any
    other exception unchanged."""
    from nmt.models.protocol import NoAttention

    if isinstance(exc, NoAttention):
        return ValueError(f"{attention_flags(args)}: {exc}")
    return exc


def fit_positions(options: SearchOptions, decoder: object) -> SearchOptions:
    """``options`` with ``max_length`` lowered to what the model's learned positions reach (BOS and
    ``max_positions - 1`` target tokens; the smallest over an ensemble), said in one warning line
    on stderr, as fairseq caps its ``--max-len-b``; unchanged for sinusoidal, rotary, relative and ALiBi
    positions and RNNs."""
    from nmt.translate.translator import fit_to_positions

    try:
        fitted = fit_to_positions(options, decoder)
    except ValueError as exc:  # -min_length above what the positions reach
        raise ValueError(f"-{exc}") from None
    if fitted is not options:
        allowed = fitted.max_length
        say(f"warning: -max_length {options.max_length} lowered to {allowed}: the model's learned positions hold BOS "
            f"and {allowed} target tokens (model.transformer.max_positions={allowed + 1})")
    return fitted


def name_input(exc: Exception, sides: dict[str, str], offset: int = 0) -> Exception:
    """An ``InputTooLong`` as a one-line error naming the file (``sides``: side -> path, ``-``
    for stdin) and line (its index + ``offset`` + 1); any other exception unchanged."""
    from nmt.data.errors import DataError
    from nmt.models.protocol import InputTooLong

    if not isinstance(exc, InputTooLong):
        return exc
    path = sides[exc.side]
    return DataError(f"{'<stdin>' if path == '-' else path}:{exc.index + offset + 1}: {exc.problem}")


def report_line(t: Translation) -> str:
    """The ``-report`` JSON line of one translation (non-finite numbers, e.g. the log-probability of
    a sample without a hypothesis, are null)."""
    return json.dumps(json_safe(t.report()), ensure_ascii=False) + "\n"


ALIGNMENT_SEPARATOR = " ||| "
"""Between an output line's text and its alignment pairs (OpenNMT-py's ``-report_align``)."""


def output_lines(t: Translation, n_best: int, with_score: bool = False, report_align: bool = False) -> list[str]:
    """The ``n_best`` output lines of one translation, best first (padded with empty lines where
    fewer hypotheses finished); ``with_score``: each line ``text<TAB>log-probability`` (OpenNMT-py's
    ``-with_score``), a padding line ``<TAB>`` (no hypothesis, no score). Samples keep their
    places: a sample without a hypothesis (``Translation.missing``) is such a padding line at its
    own place, so line j of a sentence's N is always sample j. ``report_align``: the text of each
    line is followed by `` ||| `` and the hypothesis's Pharaoh pairs (OpenNMT-py's order: ``text
    ||| pairs<TAB>score``); a padding line is then `` ||| `` (no text, no pair)."""
    from nmt.translate.alignment import pharaoh

    found = t.hypotheses[:n_best]
    missing = t.missing or [False] * len(found)
    alignments = t.alignments or [[] for _ in found]
    pad = ALIGNMENT_SEPARATOR if report_align else ""
    lines = []
    for k in range(n_best):
        if k < len(found) and not missing[k]:
            text, logprob = found[k]
            if report_align:
                text += ALIGNMENT_SEPARATOR + pharaoh(alignments[k])
            lines.append(f"{text}\t{logprob:.6g}" if with_score else text)
        else:
            lines.append(pad + "\t" if with_score else pad)
    return lines


def lines_per_sentence(args: argparse.Namespace) -> int:
    """Output lines written per input line: ``-n_best``, or 1 with ``-sample -mbr`` (the samples are
    the candidates of one MBR decision, each in ``-report``)."""
    return 1 if args.sample and args.mbr != "none" else args.n_best


def write_lines(path: str, lines: Sequence[str]) -> None:
    """``lines`` to ``path`` atomically, or to stdout for ``-``."""
    text = "".join(line + "\n" for line in lines)
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from nmt.utils.io import atomic_write_text

    atomic_write_text(path, text)


def write_heatmap(directory: Path, t: Translation, width: int, fmt: str) -> None:
    """The attention heatmap of one translation's best hypothesis, ``<index>.<fmt>``."""
    from nmt.utils.heatmap import attention_title, plot_attention

    if t.attention is None or not t.tokens:
        return
    status = "certified" if t.certified else f"not certified: {t.reason}"
    steps = len(t.tokens[0])
    title = attention_title(t.index, f"decoding steps 1-{steps}", teacher_forced=False, note=status)
    directory.mkdir(parents=True, exist_ok=True)
    plot_attention(t.attention, t.src_tokens, t.tokens[0], directory / f"{t.index:0{width}d}.{fmt}",
                   title=title, fmt=fmt)


def print_metrics(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    """The metric line of ``-tgt`` (printed even with ``-quiet``)."""
    from nmt.utils.metrics import metrics_line

    say(metrics_line(hypotheses, references))


def summary_suffix(startup: float, seconds: float, sentences: int, members: Sequence[Any],
                   precision: str = "fp32") -> str:
    """``; X sentences/s (Y with start-up); start-up Z s[ (ensemble of N)][; precision P]`` (the
    precision where it is not fp32)."""
    speed = sentences / seconds if seconds > 0 else float("inf")
    overall = sentences / (seconds + startup) if seconds + startup > 0 else float("inf")
    ensemble = f" (ensemble of {len(members)})" if len(members) > 1 else ""
    marked = f"; precision {precision}" if precision != "fp32" else ""
    return f"; {speed:.1f} sentences/s ({overall:.1f} with start-up); start-up {startup:.2f} s{ensemble}{marked}"


__all__ = ["ALIGNMENT_SEPARATOR", "PROG", "SEARCH_FLAGS", "align_options", "attention_flags", "check_word_level",
           "fit_positions", "lines_per_sentence", "no_attention", "name_input", "output_lines", "print_metrics",
           "phrase_table", "read_constraints", "read_prefixes", "read_references", "read_source", "read_stdin", "report_line", "say", "search_options", "summary_suffix", "write_heatmap",
           "write_lines"]
