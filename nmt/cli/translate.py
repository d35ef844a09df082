"""``nmt-translate``: translate a file (or stdin) with one checkpoint or an ensemble.

    nmt-translate -model M.pt [M2.pt ...] -src FILE|- -output FILE|- -beam_size 5 -n_best 1
                  -batch_size 64 -max_length 100 -length_penalty none -report FILE.jsonl
                  [-tgt REF] [-attention DIR] [-support] [-device auto|cpu|cuda]
                  [-batch_type sentences|tokens] [-precision fp32|bf16|fp16]
                  [-search_mode auto|dynamic|static] [-stop_every K]

Output: the detokenized best hypothesis per input line (``n_best`` lines per input line with
``-n_best N``, padded with empty lines), written atomically; empty input lines give empty
output lines. ``-report``: one JSON line per input sentence with its certificate and n-best
list. A summary goes to stderr. Heavy modules (matplotlib, sacrebleu) are imported only when
needed.
"""
from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from nmt.translate.search_options import SearchOptions

_IMPORTED_AT = time.perf_counter()  # start-up is measured from here when run as a program
PROG = "nmt-translate"
SEARCH_FLAGS = ("beam_size", "n_best", "max_length", "min_length", "length_penalty", "length_alpha",
                "support_topk", "stop_every")
"""Flags that are ``SearchOptions`` fields of the same name (defaults taken from it)."""


def build_parser() -> argparse.ArgumentParser:
    """The ``nmt-translate`` argument parser; search flag defaults are ``SearchOptions()``'s."""
    from nmt.translate.length_penalty import LENGTH_PENALTIES
    from nmt.translate.search_options import SEARCH_MODES, SearchOptions
    from nmt.utils.precision import PRECISIONS

    d = SearchOptions()
    p = argparse.ArgumentParser(prog=PROG, description="Translate with certified beam search.")
    p.add_argument("-model", "--model", nargs="+", required=True, metavar="M.pt",
                   help="checkpoint(s); several are decoded as an ensemble (mean of probabilities)")
    p.add_argument("-src", "--src", required=True, metavar="FILE|-", help="source text, one sentence a line")
    p.add_argument("-output", "--output", default="-", metavar="FILE|-", help="translations (default: stdout)")
    p.add_argument("-beam_size", "--beam_size", type=int, default=d.beam_size, help="beam size (1 = greedy)")
    p.add_argument("-n_best", "--n_best", type=int, default=d.n_best, help="hypotheses written per sentence")
    p.add_argument("-batch_size", "--batch_size", type=int, default=64,
                   help="sentences (or padded source tokens, see -batch_type) per batch")
    p.add_argument("-batch_type", "--batch_type", default="sentences", choices=("sentences", "tokens"),
                   help="unit of -batch_size; sources are sorted by length either way")
    p.add_argument("-max_length", "--max_length", type=int, default=d.max_length,
                   help="max target tokens before EOS")
    p.add_argument("-min_length", "--min_length", type=int, default=d.min_length,
                   help="min target tokens before EOS")
    p.add_argument("-length_penalty", "--length_penalty", default=d.length_penalty,
                   choices=LENGTH_PENALTIES)
    p.add_argument("-length_alpha", "--length_alpha", type=float, default=d.length_alpha,
                   help="alpha of the gnmt penalty")
    p.add_argument("-report", "--report", metavar="FILE.jsonl", help="per-sentence certificates and n-best lists")
    p.add_argument("-tgt", "--tgt", metavar="REF", help="references: print BLEU, chrF and exact-match accuracy")
    p.add_argument("-attention", "--attention", metavar="DIR", help="write one attention heatmap PNG per sentence")
    p.add_argument("-support", "--support", action="store_true", default=d.return_support,
                   help="report, per step, the tokens of nonzero probability and their probabilities")
    p.add_argument("-support_topk", "--support_topk", type=int, default=d.support_topk,
                   help="at most this many support tokens per step in the report")
    p.add_argument("-no_certify", "--no_certify", action="store_true", default=not d.certify,
                   help="skip the exactness certificate (and its extra search)")
    p.add_argument("-device", "--device", default="auto", help="auto (cuda when available), cpu, cuda or cuda:N")
    p.add_argument("-precision", "--precision", default="fp32", choices=PRECISIONS,
                   help="fp32, or bf16/fp16 autocast of the model (the search stays in float32)")
    p.add_argument("-search_mode", "--search_mode", default=d.mode, choices=SEARCH_MODES,
                   help="static: fixed shapes, no per-step host sync (GPU); dynamic: finished sentences "
                        "leave the batch (CPU); auto: static on CUDA")
    p.add_argument("-stop_every", "--stop_every", type=int, default=d.stop_every,
                   help="static search reads its stop flag every K steps")
    p.add_argument("-threads", "--threads", type=int, help="torch CPU threads")
    p.add_argument("-quiet", "--quiet", action="store_true", help="no progress bar and no summary")
    return p


def _read_source(path: str) -> list[str]:
    from nmt.data.textfiles import decode_lines, read_lines

    if path != "-":
        return read_lines(path)
    return decode_lines(sys.stdin.buffer.read(), "<stdin>")  # a BOM is dropped as for files


def search_options(args: argparse.Namespace) -> SearchOptions:
    """The ``SearchOptions`` the flags ask for; a bad value is a ValueError naming the flag."""
    from nmt.translate.search_options import SearchOptions

    try:
        return SearchOptions(**{name: getattr(args, name) for name in SEARCH_FLAGS},
                             certify=not args.no_certify, return_support=args.support, mode=args.search_mode,
                             return_attention=args.attention is not None)
    except ValueError as exc:
        raise ValueError(f"-{exc}") from None  # every message starts with the field = flag name


def _check_arguments(args: argparse.Namespace) -> None:
    if args.batch_size < 1:
        raise ValueError(f"-batch_size must be >= 1, got {args.batch_size}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"-threads must be >= 1, got {args.threads}")
    if not math.isfinite(args.length_alpha):
        raise ValueError(f"-length_alpha must be a finite number, got {args.length_alpha}")


def _check_device(name: str) -> None:
    """ValueError (one line) unless ``name`` is a torch device this machine can allocate on."""
    import torch

    try:
        if torch.device(name).type == "meta":
            raise ValueError("the meta device holds no data")
        torch.empty(0, device=torch.device(name))
    except Exception as exc:  # RuntimeError, NotImplementedError (no backend), AssertionError (not compiled)
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"-device {name}: not a usable device here (cpu, cuda or cuda:N); {detail[:120]}") from None


def _json_number(x: float) -> float | None:
    return x if math.isfinite(x) else None


def run(args: argparse.Namespace, start: float | None = None) -> int:
    """Translate as ``args`` say; ``start``: perf_counter() time the program started."""
    start = time.perf_counter() if start is None else start
    import torch

    from nmt.translate.loading import load_models
    from nmt.translate.translator import Translator, TranslationSummary

    _check_arguments(args)
    options = search_options(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"-device {args.device}: CUDA is not available on this machine")
    _check_device(args.device)
    lines = _read_source(args.src)
    references = None
    if args.tgt:
        from nmt.data.textfiles import read_lines

        references = read_lines(args.tgt)
        if len(references) != len(lines):
            raise ValueError(f"{args.tgt} has {len(references)} lines but {args.src} has {len(lines)}")
    decoder, src_field, tgt_field, members = load_models(args.model, args.device)
    startup = time.perf_counter() - start

    translator = Translator(decoder, src_field, tgt_field, options, batch_size=args.batch_size,
                            batch_type=args.batch_type, device=args.device, precision=args.precision)
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=len(lines), unit="sent", file=sys.stderr, desc=PROG, leave=False, disable=None)
    try:
        translations = translator.translate(lines, progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()

    out_lines = []
    for t in translations:
        texts = [text for text, _ in t.hypotheses][: args.n_best]
        out_lines.extend(texts + [""] * (args.n_best - len(texts)))
    _write_lines(args.output, out_lines)
    if args.report:
        from nmt.utils.io import atomic_open

        with atomic_open(args.report, "w") as handle:
            for t in translations:
                record = t.report()
                record["nbest"] = [{"text": h["text"], "logprob": _json_number(h["logprob"])} for h in record["nbest"]]
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    if args.attention:
        _write_heatmaps(Path(args.attention), translations)

    if not args.quiet:
        summary = TranslationSummary.of(translations)
        seconds = translator.search_seconds
        speed = len(lines) / seconds if seconds > 0 else float("inf")
        ensemble = f" (ensemble of {len(members)})" if len(members) > 1 else ""
        overall = len(lines) / (seconds + startup) if seconds + startup > 0 else float("inf")
        print(f"{PROG}: {summary.line()}; {speed:.1f} sentences/s ({overall:.1f} with start-up); "
              f"start-up {startup:.2f} s{ensemble}", file=sys.stderr)
        if references is not None:
            from nmt.utils.metrics import bleu, chrf, exact_match

            best = [t.text for t in translations]
            print(f"{PROG}: BLEU {bleu(best, references):.2f}; chrF {chrf(best, references):.2f}; "
                  f"exact match {exact_match(best, references):.2f}%", file=sys.stderr)
    return 0


def _write_lines(path: str, lines: Sequence[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from nmt.utils.io import atomic_write_text

    atomic_write_text(path, text)


def _write_heatmaps(directory: Path, translations) -> None:
    from nmt.utils.heatmap import plot_attention

    directory.mkdir(parents=True, exist_ok=True)
    width = len(str(max(len(translations) - 1, 0)))
    for t in translations:
        if t.attention is None or not t.tokens:
            continue
        status = "exact" if t.exact else f"not exact: {t.reason}"
        plot_attention(t.attention, t.src_tokens, t.tokens[0], directory / f"{t.index:0{width}d}.png",
                       title=f"sentence {t.index} ({status})")


class Interrupted(Exception):
    """SIGINT / SIGTERM arrived: stop at once; files not yet completed are never written."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns 0 on success, 2 on bad input (a one-line error on stderr), 128+N on signal N.

    SIGINT and SIGTERM (SIGINT even where the parent ignored it, as for a background job)
    stop the run with exit status 128+N; every output (translations, report, heatmaps) is
    written atomically at the end, so an interrupted or killed run leaves no file, or a
    partial one, under the final name.
    """
    start = _IMPORTED_AT if argv is None else time.perf_counter()
    args = build_parser().parse_args(argv)
    from nmt.utils.checkpoint_file import CheckpointError
    from nmt.utils.allocator import keep_freed_memory

    keep_freed_memory()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return run(args, start)
    except OSError as exc:  # an output in a read-only directory, a full disk, ...
        from nmt.utils.io import describe_os_error

        print(f"{PROG}: error: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except (ValueError, CheckpointError) as exc:  # DataError, bad checkpoints / options
        text = str(exc).strip()
        print(f"{PROG}: error: {text.splitlines()[0] if text else type(exc).__name__}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(f"{PROG}: interrupted by {exc}; unfinished outputs were not written", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; unfinished outputs were not written", file=sys.stderr)
        return 128 + signal.SIGINT
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
