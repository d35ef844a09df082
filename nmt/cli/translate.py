"""``nmt-translate``: translate (or score) with one checkpoint or an ensemble.

    nmt-translate -model M.pt [M2.pt ...] -src FILE|- -output FILE|- -beam_size 5 -n_best 1
                  [-batch_size N] -max_length 100 [-max_length_ratio R] -length_penalty none
                  [-coverage_penalty wu|summary -beta B [-stepwise_penalty] [-coverage_epsilon E]]
                  [-block_ngram_repeat N] [-ban_unk_token] [-tgt_prefix PREFIXES]
                  [-mbr none|chrf|bleu|exact_match]
                  [-constraints FILE|- [-constraints_mode unordered|ordered]]
                  -report FILE.jsonl
                  [-tgt REF] [-attention DIR] [-support] [-device auto|cpu|cuda]
                  [-report_align [-align_mode argmax|support] [-align_level word|token]]
                  [-replace_unk [-phrase_table FILE]]
                  [-batch_type sentences|tokens] [-precision fp32|bf16|fp16|int8]
                  [-search_mode auto|dynamic|static] [-stop_every K]
    nmt-translate -model M.pt -src FILE -output FILE -sample -n_best N [-temperature T]
                  [-sample_topk K] [-sample_topp P] [-seed S]                    (sampling)
    nmt-translate -model M.pt -src SRC -tgt REF -score_output scores.jsonl      (scoring)

Modes (one module each): a source file is translated whole and every output written
atomically (``translate_file``); ``-src - -output -`` streams, translating lines as they
arrive (``translate_stream``); ``-mode score`` / ``-score_output`` scores the references
(``translate_score``). Output: the detokenized best hypothesis per input line (``n_best``
lines per input line with ``-n_best N``, padded with empty lines; ``-with_score``: a tab and the
log-probability after each; ``-report_align``: `` ||| `` and the Pharaoh alignment
pairs after each text, before the score); empty input lines give empty
output lines. ``-report``: one JSON line per input sentence with its certificate and n-best
list. A summary goes to stderr (not with ``-quiet``); the metric line of ``-tgt`` always.
Heavy modules (torch, matplotlib, sacrebleu) are imported only when needed.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Sequence

from nmt.cli.translate_common import PROG, SEARCH_FLAGS, search_options  # noqa: F401 (SEARCH_FLAGS re-exported)

if TYPE_CHECKING:
    from nmt.cli.translate_ranks import Ranks

CONSTRAINT_MODES = ("unordered", "ordered")
"""``nmt.translate.constraint_automaton.CONSTRAINT_MODES`` (the first the default), spelled here so that
loading this module imports no model code (a test keeps the two equal)."""
DEFAULT_MODE = CONSTRAINT_MODES[0]

_IMPORTED_AT = time.perf_counter()  # start-up is measured from here when run as a program
MODES = ("translate", "score")


def build_parser() -> argparse.ArgumentParser:
    """The ``nmt-translate`` argument parser; search flag defaults are ``SearchOptions()``'s."""
    from nmt.translate.coverage_penalty import COVERAGE_PENALTIES
    from nmt.translate.length_penalty import LENGTH_PENALTIES
    from nmt.translate.mbr import MBR_CHOICES
    from nmt.translate.search_options import SEARCH_MODES, SearchOptions
    from nmt.utils.precision import INFERENCE_PRECISIONS

    from nmt._version import __version__
    from nmt.cli.help_format import DefaultsHelpFormatter
    from nmt.translate.alignment import ALIGN_LEVELS, ALIGN_MODES
    from nmt.utils.heatmap import FORMATS

    d = SearchOptions()
    p = argparse.ArgumentParser(prog=PROG, description="Translate with certified beam search, or score references.",
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("-model", "--model", nargs="+", required=True, metavar="M.pt",
                   help="checkpoint(s); several are decoded as an ensemble (mean of probabilities), "
                   "which needs the same tokenizers and vocabularies in all")
    p.add_argument("-src", "--src", required=True, metavar="FILE|-", help="source text, one sentence a line; - reads stdin (with -output -: "
                   "streamed, each line translated as it arrives; interactive on a terminal); a line longer than "
                   "a Transformer's learned positions hold is an error naming it")
    p.add_argument("-mode", "--mode", choices=MODES, default="translate",
                   help="translate the source, or score the references of -tgt (teacher forcing)")
    p.add_argument("-score_output", "--score_output", metavar="FILE.jsonl|-",
                   help="score mode: one JSON line per pair (log-probabilities, zero-probability "
                   "references and where they leave the support); implies -mode score "
                   "(default: -output)")
    p.add_argument("-output", "--output", default="-", metavar="FILE|-", help="translations (- = stdout)")
    p.add_argument("-beam_size", "--beam_size", type=int, default=None,
                   help=f"beam size (1 = greedy; with -sample only 1, its default there) (default: {d.beam_size})")
    p.add_argument("-n_best", "--n_best", type=int, default=d.n_best,
                   help="hypotheses written per sentence: N consecutive lines per input line, best first, "
                   "as OpenNMT-py writes them (an empty line where fewer hypotheses finished, e.g. no other of "
                   "nonzero probability; not with scoring); with -sample, the number of samples per sentence, "
                   "in sample order")
    p.add_argument("-sample", "--sample", action="store_true", default=d.sample,
                   help="sample -n_best translations of each sentence from the model's distribution instead of "
                   "searching (back-translation; fairseq's --sampling, OpenNMT-py's random sampling): a "
                   "sentence's samples depend only on -seed, its line and the sample's number, not on batching (the "
                   "noise is the same on every device); a token of probability zero (sparse output) is never drawn; "
                   "not certified")
    p.add_argument("-temperature", "--temperature", type=float, default=d.temperature,
                   help="-sample from mapping(scores / T): the output scores divided before the output "
                   "mapping (a sparse mapping stays sparse); 1 = the model's distribution")
    p.add_argument("-sample_topk", "--sample_topk", type=int, default=d.sample_topk,
                   help="-sample from the K most probable tokens only (ties kept; 0 = no truncation)")
    p.add_argument("-sample_topp", "--sample_topp", type=float, default=d.sample_topp,
                   help="-sample from the nucleus: the most probable tokens whose mass reaches P (after "
                   "-sample_topk; 1 = no truncation)")
    p.add_argument("-seed", "--seed", type=int, default=None,
                   help="seed of -sample, in [0, 2^64); with the line number and the sample's number it fixes each "
                   f"sample (default: {d.seed})")
    p.add_argument("-with_score", "--with_score", action="store_true",
                   help="each output line 'translation<TAB>log-probability' (OpenNMT-py's -with_score; a "
                   "padding line of -n_best is a lone tab; not with scoring)")
    p.add_argument("-batch_size", "--batch_size", type=int, default=None,
                   help="sentences (or padded source tokens, see -batch_type) per batch (default: 64 "
                   "sentences on the CPU, 8192 tokens on a GPU; score and stdin modes: 64 sentences)")
    p.add_argument("-batch_type", "--batch_type", default=None, choices=("sentences", "tokens"),
                   help="unit of -batch_size (default: sentences, or tokens when neither is given on a GPU); "
                   "sources are sorted by length either way")
    p.add_argument("-max_length", "--max_length", type=int, default=d.max_length,
                   help="max target tokens before EOS (>= 1; a Transformer with learned positions: lowered, "
                   "with a warning, to max_positions - 1; scoring applies no length limit)")
    p.add_argument("-min_length", "--min_length", type=int, default=d.min_length,
                   help="min target tokens before EOS (not with scoring)")
    p.add_argument("-max_length_ratio", "--max_length_ratio", type=float, default=d.max_length_ratio,
                   help="with R > 0, each sentence also stops at floor(R x its source tokens) + "
                   "-max_length_offset target tokens (OpenNMT-py's rule, default 1.25 there; 0 = off; not with scoring)")
    p.add_argument("-max_length_offset", "--max_length_offset", type=int, default=d.max_length_offset,
                   help="tokens added to the -max_length_ratio limit")
    p.add_argument("-block_ngram_repeat", "--block_ngram_repeat", type=int, default=d.block_ngram_repeat, metavar="N",
                   help="N >= 1: no output holds an N-gram of N generated tokens twice (OpenNMT-py's "
                   "-block_ngram_repeat, fairseq's --no-repeat-ngram-size; 1: no token twice; EOS is never "
                   "blocked, BOS takes no part): a token that would repeat one gets probability 0 at its step, "
                   "in beam search, greedy and -sample; a certified sentence's output is then the most probable "
                   "one without a repeated N-gram (n_nonzero and mass count those); 0 = off")
    p.add_argument("-length_penalty", "--length_penalty", default=d.length_penalty,
                   choices=LENGTH_PENALTIES, help="ranking of finished hypotheses")
    p.add_argument("-length_alpha", "--length_alpha", type=float, default=d.length_alpha,
                   help="alpha of the gnmt penalty")
    p.add_argument("-coverage_penalty", "--coverage_penalty", default=d.coverage_penalty, choices=COVERAGE_PENALTIES,
                   help="add a penalty of the attention's coverage of the source to the ranking of finished "
                   "hypotheses (OpenNMT-py's): wu (GNMT: beta x sum of log min(coverage, 1), coverage floored at "
                   "-coverage_epsilon for sparse attention) or summary (-beta x the coverage above 1); needs a "
                   "model with attention; certificates stay exact")
    p.add_argument("-beta", "--beta", type=float, default=d.beta,
                   help="weight of -coverage_penalty (>= 0; 0: no effect)")
    p.add_argument("-coverage_epsilon", "--coverage_epsilon", type=float, default=d.coverage_epsilon,
                   help="-coverage_penalty wu: floor of each source token's coverage, in (0, 1] (a token sparse "
                   "attention never looked at costs beta x log(epsilon) instead of -inf)")
    p.add_argument("-stepwise_penalty", "--stepwise_penalty", action="store_true", default=d.stepwise_penalty,
                   help="also apply -coverage_penalty at every step: the beam keeps the candidates of best "
                   "log-probability / length penalty + coverage penalty so far (the final ranking is the same)")
    p.add_argument("-mbr", "--mbr", default=d.mbr, choices=MBR_CHOICES,
                   help="minimum Bayes risk decoding: output the candidate of highest expected utility (sentence "
                   "chrF, BLEU or exact match, with sacrebleu) under the model. Beam search: the candidates are every "
                   "finished hypothesis (at least a beam's worth), weighted by their probabilities renormalised (no "
                   "length penalty), and -n_best writes the N first by expected utility; a certified sentence's are "
                   "its whole support, so its decision is the model's exact MBR decision (-report's \"mbr\": "
                   "\"exact\"). -sample: the -n_best N samples are the candidates and pseudo-references (1/N each) "
                   "and one line per sentence is written. Cut hypotheses (no EOS) are no candidates. Costs n^2 "
                   "sentence scores per sentence of n candidates")
    p.add_argument("-report", "--report", metavar="FILE.jsonl", help="per-sentence certificates and n-best lists (not with scoring)")
    p.add_argument("-tgt", "--tgt", metavar="REF", help="references: print BLEU, chrF (with sacrebleu signatures) and exact-match "
                   "accuracy; in score mode, the targets to score")
    p.add_argument("-ban_unk_token", "--ban_unk_token", action="store_true", default=d.ban_unk_token,
                   help="never output <unk>: it gets probability 0 at every step (a certificate is then about the "
                   "outputs without it)")
    p.add_argument("-tgt_prefix", "--tgt_prefix", metavar="FILE|-", default=None,
                   help="forced target prefixes, one a line beside -src (an empty line: none): each output starts "
                   "with its line's prefix (tokenized alone: end it at a word boundary; kept in the output), and "
                   "a certificate is about the outputs that do. OpenNMT-py's -tgt_prefix reads them from -tgt; "
                   "here they have their own file, so -tgt stays the references (- reads stdin when -src is a file)")
    p.add_argument("-constraints", "--constraints", metavar="FILE|-", default=None,
                   help="lexical constraints, one line beside -src: target phrases separated by TABs (an empty "
                   "line: none), each tokenized alone by the target tokenizer; every output holds them (EOS is "
                   "banned until it does; the beam is allocated dynamically), and a certificate is about the "
                   "outputs that do (none: an empty line, reason no_hypothesis or max_length). fairseq's "
                   "--constraints, Sockeye's constraints (- reads stdin when -src is a file)")
    p.add_argument("-constraints_mode", "--constraints_mode", choices=CONSTRAINT_MODES, default=DEFAULT_MODE,
                   help="unordered (default, as Sockeye): every phrase somewhere, any order, occurrences may "
                   "overlap, a phrase given k times at least k times; ordered (fairseq's --constraints "
                   "ordered): in the line's order, without overlap")
    p.add_argument("-src_tag", "--src_tag", metavar="TAG", default=None,
                   help="put this source tag (one the model was trained with: data.train src_tag, e.g. <BT> or "
                   "<2de>) before every source line, as one token no tokenizer cuts (OpenNMT-py's src_prefix, "
                   "fairseq's language tokens); a tag the model lacks is refused with the list of its tags; "
                   "the report's decoding records it")
    p.add_argument("-attention", "--attention", metavar="DIR", help="write one attention heatmap per sentence (best hypothesis; not with scoring)")
    p.add_argument("-attention_format", "--attention_format", choices=FORMATS, default="png",
                   help="file format of the heatmaps")
    p.add_argument("-report_align", "--report_align", action="store_true",
                   help="append ' ||| ' and the alignment of each output line (words, or tokens with -align_level token), "
                   "as OpenNMT-py's -report_align: "
                   "Pharaoh pairs src-tgt (0-based, sorted; e.g. 'das Haus ||| 0-0 1-1'), from the attention of the "
                   "hypothesis's steps (a Transformer: its last layer's cross-attention averaged over the heads; an "
                   "ensemble: the members' mean); every -n_best line and sample has its own; also each n-best entry's "
                   "\"alignment\" in -report (the -align_* settings in each record's \"decoding\"); with -mode score, "
                   "the reference's in each JSON line")
    p.add_argument("-align_mode", "--align_mode", choices=ALIGN_MODES, default=None,
                   help="argmax: each target token to its most attended source token (OpenNMT-py, fairseq); "
                   "support: to every source token of attention above -align_threshold (0: the exact support of "
                   "a sparse attention; a Transformer's: the union of its heads' supports) (default: argmax)")
    p.add_argument("-align_level", "--align_level", choices=ALIGN_LEVELS, default=None,
                   help="word: indices of the words of the source line and the output text (a pair where any of "
                   "their subword pieces are aligned); token: of the model's pieces (default: word)")
    p.add_argument("-align_threshold", "--align_threshold", type=float, default=None, metavar="T",
                   help="-align_mode support: the attention a source token must exceed, in [0, 1) (default: 0)")
    p.add_argument("-replace_unk", "--replace_unk", action="store_true",
                   help="replace each <unk> output token by the source token of highest attention at its step "
                   "(its surface text from the tokenized input, before detokenization; a subword piece copies "
                   "that piece only); not with scoring")
    p.add_argument("-phrase_table", "--phrase_table", metavar="FILE", default=None,
                   help="with -replace_unk: source|||target lines (OpenNMT-py's format); a replaced <unk> whose "
                   "source token is in the table takes its target instead of a copy")
    p.add_argument("-support", "--support", action="store_true", default=d.return_support,
                   help="report, per step, the tokens of nonzero probability and their probabilities")
    p.add_argument("-support_topk", "--support_topk", type=int, default=d.support_topk,
                   help="at most this many support tokens per step in the report")
    p.add_argument("-no_certify", "--no_certify", action="store_true", default=not d.certify,
                   help="skip the certificate (and its extra search); the summary says certified n/a")
    p.add_argument("-device", "--device", default="auto", help="auto (cuda when available), cpu, cuda or cuda:N")
    p.add_argument("-precision", "--precision", default="fp32", choices=INFERENCE_PRECISIONS,
                   help="fp32 (IEEE float32 on a GPU too: no TF32), or bf16/fp16 autocast of the model, in scoring "
                        "too (the search stays in float32); int8 (CPU only; -device auto then means cpu): the model's "
                        "matrix products with int8 weights and dynamically quantized inputs")
    p.add_argument("-search_mode", "--search_mode", default=d.mode, choices=SEARCH_MODES,
                   help="static: fixed shapes, no per-step host sync (GPU); dynamic: finished sentences (with -sample: samples) "
                        "leave the batch (CPU); auto: static on CUDA")
    p.add_argument("-stop_every", "--stop_every", type=int, default=d.stop_every,
                   help="static search reads its stop flag every K steps")
    p.add_argument("-threads", "--threads", type=int, help="torch CPU threads")
    p.add_argument("-quiet", "--quiet", action="store_true",
                   help="no progress bar and no summary (the metric line of -tgt is kept)")
    return p


def _run_mode(args: argparse.Namespace) -> str:
    """What the run does: "score" (``-mode score`` or ``-score_output``), "stream" (``-src -
    -output -``) or "file" (a source translated whole, every output written at the end)."""
    if args.score_output or args.mode == "score":
        return "score"
    return "stream" if args.src == "-" and args.output == "-" else "file"


def _check_arguments(args: argparse.Namespace) -> None:
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"-batch_size must be >= 1, got {args.batch_size}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"-threads must be >= 1, got {args.threads}")
    if args.max_length < 1:  # 0 would make every translation empty (SearchOptions allows it for the API)
        raise ValueError(f"-max_length must be >= 1, got {args.max_length}")
    for name in ("length_alpha", "max_length_ratio", "beta", "coverage_epsilon"):
        if not math.isfinite(getattr(args, name)):
            raise ValueError(f"-{name} must be a finite number, got {getattr(args, name)}")
    if _run_mode(args) == "score":  # flags of translation that scoring would ignore
        scoring = "-mode score" if args.mode == "score" else "-score_output"
        one_line = "it writes one JSON line per reference of -tgt"
        # length limits of the search: a reference shorter than -min_length (its EOS forbidden) or
        # longer than the ratio's limit could not be found, but scoring gives the model's
        # log-probability, as for one longer than -max_length (whose default is always on)
        unlimited = "it gives each reference the model's log-probability, whatever its length"
        given = [("-attention", args.attention is not None, one_line), ("-n_best", args.n_best != 1, one_line),
                 ("-sample", args.sample, "it gives each reference the model's log-probability"),
                 ("-with_score", args.with_score, one_line),
                 ("-report", args.report is not None, one_line), ("-support", args.support, one_line),
                 ("-replace_unk", args.replace_unk, "the references are scored as they are"),
                 ("-min_length", args.min_length != 0, unlimited),
                 ("-max_length_ratio", args.max_length_ratio != 0, unlimited),
                 ("-block_ngram_repeat", args.block_ngram_repeat != 0,
                  "it gives each reference the model's log-probability, repeated n-grams or not"),
                 ("-ban_unk_token", args.ban_unk_token, "it gives each reference the model's log-probability, "
                  "<unk> or not"),
                 ("-coverage_penalty", args.coverage_penalty != "none", "it gives each reference the model's "
                  "log-probability (no ranking)"),
                 ("-mbr", args.mbr != "none", "it gives each reference the model's log-probability (no candidates "
                  "to choose among)"),
                 ("-tgt_prefix", args.tgt_prefix is not None,
                  "it gives each reference the model's log-probability (a reference is a whole output)"),
                 ("-constraints", args.constraints is not None,
                  "it gives each reference the model's log-probability, whatever phrases it holds")]
        for flag, used, why in given:
            if used:
                raise ValueError(f"{flag} applies to translation, not to scoring ({scoring}): {why}")
    for flag, value in (("-align_mode", args.align_mode), ("-align_level", args.align_level),
                        ("-align_threshold", args.align_threshold)):
        if value is not None and not args.report_align:
            raise ValueError(f"{flag} applies to -report_align (add it to write alignments)")
    if args.phrase_table is not None and not args.replace_unk:
        raise ValueError("-phrase_table applies to -replace_unk (it translates the source token an <unk> output "
                         "is replaced by): add -replace_unk")
    if args.align_threshold is not None and args.align_mode != "support":
        raise ValueError("-align_threshold applies to -align_mode support (argmax takes the most attended "
                         "source token)")
    # outputs are written after the whole input is translated: a path that cannot take them fails now
    for name in ("output", "report", "score_output"):
        path = getattr(args, name)
        if path not in (None, "-") and os.path.isdir(path):
            raise ValueError(f"-{name} {path}: is a directory")
    stdin = [flag for flag, value in (("-src", args.src), ("-tgt_prefix", args.tgt_prefix),
                                      ("-constraints", args.constraints)) if value == "-"]
    if len(stdin) > 1:
        flags = " and ".join(f"{flag} -" for flag in reversed(stdin))
        raise ValueError(f"{flags} both read stdin: give one of them a file" if len(stdin) == 2 else
                         f"{flags} all read stdin: give all but one of them a file")
    if args.constraints is not None and args.sample:
        raise ValueError("-constraints applies to beam search, not to -sample (a sample forced to hold a phrase is "
                         "no longer a sample of the model's distribution)")
    if args.constraints_mode != DEFAULT_MODE and args.constraints is None:
        raise ValueError("-constraints_mode applies to -constraints (add the constraints file)")
    if args.attention is not None and os.path.exists(args.attention) and not os.path.isdir(args.attention):
        raise ValueError(f"-attention {args.attention}: exists and is not a directory")


def run(args: argparse.Namespace, start: float | None = None) -> int:
    """Run the mode ``args`` ask for; ``start``: perf_counter() time the program started."""
    start = time.perf_counter() if start is None else start
    import torch

    from nmt.cli.translate_ranks import join

    _check_arguments(args)
    search_options(args)  # bad search flags fail before any input is read
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    mode = _run_mode(args)
    ranks = join(args, mode)  # under torchrun: this process's share and GPU
    try:
        return _run_mode_of(args, start, mode, ranks)
    finally:
        ranks.close()


def _run_mode_of(args: argparse.Namespace, start: float, mode: str, ranks: Ranks) -> int:
    """``run``'s work once the process knows its place (``ranks``) and ``mode``."""
    from nmt.translate.loading import resolve_device
    from nmt.utils.device import make_current
    from nmt.utils.precision import check_inference_device, requested_device

    args.device = resolve_device(requested_device(args.precision, args.device), what="-device")
    check_inference_device(args.precision, args.device)
    make_current(args.device)  # one device: Triton's launches need no switch, nothing reaches cuda:0
    from nmt.translate.translator import default_batching

    # files: batches by tokens on a GPU; scoring and streaming count sentences on every device
    args.batch_size, args.batch_type = default_batching(args.device if mode == "file" else "cpu",
                                                        args.batch_size, args.batch_type)
    if mode == "score":
        from nmt.cli.translate_score import run_score

        return run_score(args, start, ranks)
    if mode == "stream":
        from nmt.cli.translate_stream import run_stream

        return run_stream(args, start)
    from nmt.cli.translate_file import run_file

    return run_file(args, start, ranks)


def _discard_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so that the interpreter's final flush of what is
    still buffered for a closed pipe raises no second BrokenPipeError ('Exception ignored ...')."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no descriptor (stdout replaced in-process): nothing to flush there
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns 0 on success, 2 on bad input (a one-line error on stderr), 128+N on signal N,
    141 (128 + SIGPIPE, no message) when stdout is a pipe whose reader has gone.

    SIGINT and SIGTERM (SIGINT even where the parent ignored it, as for a background job)
    stop the run with exit status 128+N; every output (translations, report, heatmaps) is
    written atomically at the end, so an interrupted or killed run leaves no file, or a
    partial one, under the final name.
    """
    start = _IMPORTED_AT if argv is None else time.perf_counter()
    from nmt.utils.checkpoint_file import CheckpointError
    from nmt.utils.allocator import keep_freed_memory, thaw_live_objects

    from nmt.cli.signals import Terminated, stop_on_signals

    keep_freed_memory()
    try:
        with stop_on_signals():  # files not yet completed are never written
            # the parser imports the toolkit, which reads its NMT_* variables (a bad one: a ValueError)
            args = build_parser().parse_args(argv)
            return run(args, start)
    except BrokenPipeError:  # stdout's reader has gone (`| head -1`): end quietly, as SIGPIPE ends cat
        _discard_stdout()
        return 128 + signal.SIGPIPE
    except OSError as exc:  # an output in a read-only directory, a full disk, ...
        from nmt.utils.io import describe_os_error

        print(f"{PROG}: error: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except (ValueError, CheckpointError) as exc:  # DataError, bad checkpoints / options
        text = str(exc).strip()
        print(f"{PROG}: error: {text.splitlines()[0] if text else type(exc).__name__}", file=sys.stderr)
        return 2
    except Terminated as exc:
        print(f"{PROG}: interrupted by {exc}; unfinished outputs were not written", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; unfinished outputs were not written", file=sys.stderr)
        return 128 + signal.SIGINT
    finally:
        thaw_live_objects()  # frozen after loading the model (run_file, run_stream, run_score)


if __name__ == "__main__":
    sys.exit(main())
