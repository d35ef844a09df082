"""``nmt-translate -src - -output -``: translate lines as they arrive, so it can sit behind a pipe.

A reader thread puts stdin's lines on a queue as they arrive. The main thread waits for one
line, takes whatever else is already queued (up to ``-batch_size`` lines), translates that
batch and writes and flushes its output lines before waiting again: it never waits for more
input (nor for EOF) to translate what it has. When stdin is a terminal the mode is
interactive: a prompt on stderr, one line at a time, Ctrl-D to end. ``-report`` is written
atomically at the end (its lines wait in a temporary file; with ``-tgt``, the metric line comes
at the end too); heatmaps as sentences come. Translations are not kept once written, so memory
does not grow with the input (the best hypotheses are, with ``-tgt``).
"""
from __future__ import annotations

import argparse
import queue
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import BinaryIO, Union

from nmt.cli.translate_common import (
    align_options,
    check_word_level,
    fit_positions,
    lines_per_sentence,
    no_attention,
    name_input,
    output_lines,
    print_metrics,
    phrase_table,
    read_constraints,
    read_prefixes,
    read_references,
    report_line,
    say,
    search_options,
    summary_suffix,
    write_heatmap,
)

PROMPT = "> "
_Item = Union[str, BaseException, None]  # a line, a reading error, or None at EOF


def _read_lines(stream: BinaryIO, lines: "queue.Queue[_Item]") -> None:
    """Reader thread: each line of ``stream`` (UTF-8, newline stripped) onto ``lines``, then None."""
    from nmt.data.textfiles import decode_line

    try:
        for number, raw in enumerate(iter(stream.readline, b""), 1):
            # as for files: a byte-order mark dropped, a bad byte a DataError naming line and column
            lines.put(decode_line(raw, "<stdin>", number))
    except BaseException as exc:  # noqa: BLE001 - handed to the main thread
        lines.put(exc)
        return
    lines.put(None)


def _next_batch(lines: "queue.Queue[_Item]", size: int) -> tuple[list[str], bool]:
    """Wait for one line, then take what is already queued (at most ``size`` lines in all).

    Returns ``(lines, ended)``; a reading error is raised here, in the main thread."""
    batch: list[str] = []
    item = lines.get()
    while True:
        if isinstance(item, BaseException):
            raise item
        if item is None:
            return batch, True
        batch.append(item)
        if len(batch) >= size:
            return batch, False
        try:
            item = lines.get_nowait()
        except queue.Empty:
            return batch, False


def _batch_lines(lines: list | None, flag: str, path: str | None, first: int, size: int) -> list | None:
    """The lines ``first .. first + size`` of a file read beside stdin (``-tgt_prefix``,
    ``-constraints``; None where the flag is not given); a ValueError naming the flag and file
    when the file ends before stdin does."""
    if lines is None:
        return None
    held = lines[first: first + size]
    if len(held) < size:
        raise ValueError(f"{flag} {path} has {len(lines)} lines but stdin has more ({first + size} so far)")
    return held


def run_stream(args: argparse.Namespace, start: float) -> int:
    """Translate stdin to stdout line by line as ``args`` say (see the module docstring)."""
    from nmt.translate.loading import load_models
    from nmt.translate.translator import SummaryCounts, Translator
    from nmt.utils.allocator import freeze_live_objects

    options = search_options(args)
    align = align_options(args)
    references = read_references(args.tgt, None, "-") if args.tgt else None
    prefixes = read_prefixes(args.tgt_prefix, None, "-")
    constraints = read_constraints(args.constraints, None, "-")
    table = phrase_table(args)
    decoder, src_field, tgt_field, members = load_models(args.model, args.device)
    freeze_live_objects()  # the loaded objects are never garbage: keep full collections short
    startup = time.perf_counter() - start
    options = fit_positions(options, decoder)
    check_word_level(align, src_field, tgt_field)
    interactive = sys.stdin.isatty()
    translator = Translator(decoder, src_field, tgt_field, options,
                            batch_size=1 if interactive else args.batch_size, batch_type=args.batch_type,
                            device=args.device, precision=args.precision, align=align, replace_unk=args.replace_unk,
                            phrase_table=table, src_tag=args.src_tag)
    lines: "queue.Queue[_Item]" = queue.Queue()
    # the reader thread's own reader of stdin's descriptor, never closed: a thread still blocked in
    # sys.stdin.buffer.readline() when the program ends (a signal, an error, a closed stdout) holds
    # that object's lock, and the interpreter's shutdown, which closes sys.stdin, then aborts
    try:
        stdin = open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115
    except (AttributeError, OSError, ValueError):  # no descriptor (stdin replaced in-process): its own buffer
        stdin = sys.stdin.buffer
    threading.Thread(target=_read_lines, args=(stdin, lines), daemon=True, name="stdin").start()
    if interactive and not args.quiet:
        say("type a sentence and press Enter; Ctrl-D ends")

    counts = SummaryCounts()  # not the translations: memory must not grow with the input
    texts: list[str] = []  # the best hypotheses, for the metric line of -tgt only
    # the report is written atomically at the end: its lines wait in an anonymous temporary file
    report = tempfile.TemporaryFile("w+", encoding="utf-8") if args.report else None  # noqa: SIM115
    try:
        ended = False
        while not ended:
            if interactive:
                print(PROMPT, end="", file=sys.stderr, flush=True)
            batch, ended = _next_batch(lines, translator.batch_size)
            if not batch:
                break
            try:
                # indices count from the stream's start: a sentence's samples depend on its line only
                forced = _batch_lines(prefixes, "-tgt_prefix", args.tgt_prefix, counts.sentences, len(batch))
                held = _batch_lines(constraints, "-constraints", args.constraints, counts.sentences, len(batch))
                done = translator.translate(batch, first_index=counts.sentences, prefixes=forced, constraints=held,
                                            constraints_mode=args.constraints_mode)
            except ValueError as exc:  # a source longer than learned positions hold: its line of stdin
                raise no_attention(name_input(exc, {"source": "-", "prefix": args.tgt_prefix,
                                                    "constraints": args.constraints},
                                              offset=counts.sentences), args) from None
            counts.add(done)
            sys.stdout.write("".join(line + "\n" for t in done
                                     for line in output_lines(t, lines_per_sentence(args), args.with_score, args.report_align)))
            sys.stdout.flush()
            if report is not None:
                report.write("".join(report_line(t) for t in done))
            if references is not None:
                texts.extend(t.text for t in done)
            if args.attention:
                for t in done:
                    write_heatmap(Path(args.attention), t, 1, args.attention_format)
            del done
        if interactive:
            print(file=sys.stderr)

        if report is not None:
            from nmt.utils.io import atomic_open

            report.seek(0)
            with atomic_open(args.report, "w") as handle:
                shutil.copyfileobj(report, handle)
    finally:
        if report is not None:
            report.close()
    if not args.quiet:
        summary = counts.summary()
        say(summary.line() + summary_suffix(startup, translator.search_seconds, counts.sentences, members, args.precision))
    if constraints is not None and len(constraints) != counts.sentences:
        raise ValueError(f"-constraints {args.constraints} has {len(constraints)} lines but stdin had "
                         f"{counts.sentences}")
    if prefixes is not None and len(prefixes) != counts.sentences:
        raise ValueError(f"-tgt_prefix {args.tgt_prefix} has {len(prefixes)} lines but stdin had {counts.sentences}")
    if references is not None:
        if len(references) != len(texts):
            raise ValueError(f"{args.tgt} has {len(references)} lines but stdin had {len(texts)}")
        print_metrics(texts, references)
    return 0


__all__ = ["PROMPT", "run_stream"]
