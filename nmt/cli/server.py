"""``nmt-server``: translate and score over HTTP with one checkpoint or an ensemble.

    nmt-server -model M.pt [M2.pt ...] [-host 127.0.0.1] [-port 5000] [-device auto] [-beam_size 5]
               [-n_best 1] [-max_length 100] [-max_length_ratio R] [-length_penalty none]
               [-coverage_penalty wu|summary -beta B [-stepwise_penalty]]
               [-block_ngram_repeat N] [-ban_unk_token] [-mbr chrf|bleu|exact_match] [-no_certify]
               [-phrase_table FILE]
               [-batch_size N] [-batch_type sentences|tokens] [-precision fp32|bf16|fp16|int8]
               [-max_sentences 10000] [-threads N] [-quiet]

The search flags set the defaults of every request (a request's ``"options"`` override them). The
endpoints are described in :mod:`nmt.server.http_api`. It prints ``nmt-server: serving ... on
http://HOST:PORT`` on stderr once the port is bound (``-port 0``: a free port, the line says which),
then one line per request (not with ``-quiet``). SIGINT / SIGTERM stop it (exit status 128 + N).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

PROG = "nmt-server"


def build_parser() -> argparse.ArgumentParser:
    from nmt.cli.help_format import DefaultsHelpFormatter
    from nmt.translate.coverage_penalty import COVERAGE_PENALTIES
    from nmt.translate.length_penalty import LENGTH_PENALTIES
    from nmt.translate.mbr import MBR_CHOICES
    from nmt.translate.search_options import SearchOptions
    from nmt.utils.precision import INFERENCE_PRECISIONS

    d = SearchOptions()
    p = argparse.ArgumentParser(prog=PROG, formatter_class=DefaultsHelpFormatter,
                                description="Translate and score over HTTP (JSON): POST /translate, POST /score, "
                                "POST /translator/translate (OpenNMT-py's request), GET /health, GET /model.")
    p.add_argument("-model", "--model", nargs="+", required=True, metavar="M.pt",
                   help="checkpoint(s); several make an ensemble (mean of probabilities)")
    p.add_argument("-host", "--host", default="127.0.0.1",
                   help="address to listen on (0.0.0.0: every interface; the API has no authentication)")
    p.add_argument("-port", "--port", type=int, default=5000, help="port (0: a free one, printed at start)")
    p.add_argument("-device", "--device", default="auto", help="auto (cuda when available), cpu, cuda or cuda:N")
    p.add_argument("-batch_size", "--batch_size", type=int, default=None,
                   help="sentences (or padded source tokens) per batch of a search (default: 64 sentences on the "
                   "CPU, 8,192 tokens on a GPU, as nmt-translate)")
    p.add_argument("-batch_type", "--batch_type", default=None, choices=("sentences", "tokens"),
                   help="what -batch_size counts")
    p.add_argument("-precision", "--precision", default="fp32", choices=INFERENCE_PRECISIONS,
                   help="the model's computations (bf16 / fp16: autocast; int8: CPU, int8 matrix products; as "
                        "nmt-translate -precision)")
    p.add_argument("-max_sentences", "--max_sentences", type=int, default=10_000,
                   help="most sentences one request may hold (more: status 413)")
    p.add_argument("-beam_size", "--beam_size", type=int, default=d.beam_size)
    p.add_argument("-n_best", "--n_best", type=int, default=d.n_best)
    p.add_argument("-max_length", "--max_length", type=int, default=d.max_length)
    p.add_argument("-max_length_ratio", "--max_length_ratio", type=float, default=d.max_length_ratio)
    p.add_argument("-length_penalty", "--length_penalty", default=d.length_penalty, choices=LENGTH_PENALTIES)
    p.add_argument("-length_alpha", "--length_alpha", type=float, default=d.length_alpha)
    p.add_argument("-coverage_penalty", "--coverage_penalty", default=d.coverage_penalty, choices=COVERAGE_PENALTIES)
    p.add_argument("-beta", "--beta", type=float, default=d.beta)
    p.add_argument("-stepwise_penalty", "--stepwise_penalty", action="store_true", default=d.stepwise_penalty)
    p.add_argument("-block_ngram_repeat", "--block_ngram_repeat", type=int, default=d.block_ngram_repeat)
    p.add_argument("-ban_unk_token", "--ban_unk_token", action="store_true", default=d.ban_unk_token)
    p.add_argument("-mbr", "--mbr", default=d.mbr, choices=MBR_CHOICES,
                   help="minimum Bayes risk decoding by default (a request's \"options\": {\"mbr\": ...} overrides "
                   "it): the candidate of highest expected chrF, BLEU or exact match under the model, as "
                   "nmt-translate -mbr; each record's \"mbr\" says whether the decision is exact")
    p.add_argument("-no_certify", "--no_certify", action="store_true", help="skip the certificates")
    p.add_argument("-phrase_table", "--phrase_table", metavar="FILE", default=None,
                   help="source|||target lines for the requests with \"replace_unk\": true (as nmt-translate's)")
    p.add_argument("-threads", "--threads", type=int, help="torch CPU threads")
    p.add_argument("-quiet", "--quiet", action="store_true", help="no line per request")
    return p


SEARCH_DEFAULTS = ("beam_size", "n_best", "max_length", "max_length_ratio", "length_penalty", "length_alpha",
                   "coverage_penalty", "beta", "stepwise_penalty", "block_ngram_repeat", "ban_unk_token", "mbr")
"""Flags that are ``SearchOptions`` fields of the same name."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: serves until SIGINT / SIGTERM (then 128 + N); 2 on bad input (one line on
    stderr: a checkpoint, a flag, a port already taken)."""
    from nmt.cli.signals import Terminated, stop_on_signals
    from nmt.utils.checkpoint_file import CheckpointError

    server = None
    try:
        with stop_on_signals():
            args = build_parser().parse_args(argv)
            import torch

            from nmt.server.http_api import load_service, make_server

            if args.threads is not None:
                if args.threads < 1:
                    raise ValueError(f"-threads must be >= 1, got {args.threads}")
                torch.set_num_threads(args.threads)
            if not 0 <= args.port <= 65535:
                raise ValueError(f"-port must be in [0, 65535], got {args.port}")
            if args.max_sentences < 1:
                raise ValueError(f"-max_sentences must be >= 1, got {args.max_sentences}")
            search = {name: getattr(args, name) for name in SEARCH_DEFAULTS}
            table = None
            if args.phrase_table is not None:
                from nmt.translate.phrase_table import read_phrase_table

                table = read_phrase_table(args.phrase_table)
            try:
                service = load_service(args.model, args.device, batch_size=args.batch_size, batch_type=args.batch_type,
                                       precision=args.precision,
                                       max_sentences=args.max_sentences, phrase_table=table,
                                       certify=not args.no_certify, **search)
            except TypeError as exc:
                raise ValueError(str(exc)) from None
            log = None if args.quiet else (lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True))
            server = make_server(service, args.host, args.port, log)
            host, port = server.server_address[:2]
            print(f"{PROG}: serving {' '.join(args.model)} ({service.model.device}) on http://{host}:{port}",
                  file=sys.stderr, flush=True)
            server.serve_forever()
            return 0
    except Terminated as exc:
        return 128 + exc.signum
    except OSError as exc:  # the port is taken, the address is not this machine's, ...
        from nmt.utils.io import describe_os_error

        print(f"{PROG}: error: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except (ValueError, CheckpointError) as exc:
        text = str(exc).strip()
        print(f"{PROG}: error: {text.splitlines()[0] if text else type(exc).__name__}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            server.server_close()


if __name__ == "__main__":
    sys.exit(main())
