"""``nmt-average``: average the weights of several checkpoints into one released model.

    nmt-average -models a.pt b.pt ... -output avg.pt
    nmt-average -last N -run RUN_DIR -output avg.pt     # the newest N step_*.pt of a run
    nmt-average -best N -run RUN_DIR -output avg.pt     # the N best kept best_step_*.pt of a run

All checkpoints must share the architecture (``model`` config; dropout rates may differ),
both vocabularies and tokenizers (compared by content: the same BPE codes or sentencepiece model
from another path agree), and weight shapes; the output holds the mean weights, the fields and config of
the last checkpoint (the newest with ``-last N`` and ``-best N``, the last named with ``-models``) and no
optimizer state. It loads in ``nmt-translate``. Step
checkpoints are kept by ``training.keep_last`` (the newest N of them), the best ones by
``training.keep_best`` (the N best validations by ``validation.metric``, as the run's ``last.pt``
ranks them: :func:`nmt.train.keep_best.best_kept_checkpoints`).

The output is written atomically: an interrupted run (SIGINT, SIGTERM) leaves neither a partial
output nor a temporary file; one killed by SIGKILL leaves a temporary ``.AVG.pt.*.tmp`` that the
next write of the same output removes.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

PROG = "nmt-average"


def build_parser() -> argparse.ArgumentParser:
    from nmt.cli.model_writer import model_parser

    p = model_parser(PROG, "Average checkpoint weights into a released model.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("-models", "--models", nargs="+", metavar="M.pt", help="checkpoints to average")
    source.add_argument("-last", "--last", type=int, metavar="N", help="the newest N step checkpoints of -run")
    source.add_argument("-best", "--best", type=int, metavar="N",
                        help="the N best checkpoints -run kept by validation.metric (training.keep_best >= N)")
    p.add_argument("-run", "--run", metavar="RUN_DIR", help="run directory (training.save_dir) for -last / -best")
    p.add_argument("-output", "--output", required=True, metavar="AVG.pt", help="averaged model (written atomically)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; 0 on success, 2 on bad input (one line on stderr), 128+N on signal N (SIGINT /
    SIGTERM: the output is not written and no temporary file is left; see :mod:`nmt.cli.signals`)."""
    args = build_parser().parse_args(argv)
    from nmt.cli.model_writer import write_model
    from nmt.train.checkpoint import CheckpointError
    from nmt.train.keep_best import best_kept_checkpoints
    from nmt.train.model_release import average_checkpoints, last_step_checkpoints

    paths: list[str] = []

    def build() -> dict:
        if args.last is not None or args.best is not None:
            flag = "-last" if args.last is not None else "-best"
            if args.run is None:
                raise CheckpointError(f"{flag} N needs -run RUN_DIR")
            paths.extend(last_step_checkpoints(args.run, args.last) if args.last is not None
                         else best_kept_checkpoints(args.run, args.best))
        else:
            if args.run is not None:
                raise CheckpointError("-run is for -last N / -best N; with -models name the files")
            paths.extend(args.models)
        return average_checkpoints(paths)

    code = write_model(PROG, args.output, build)
    if code:
        return code
    print(f"{PROG}: averaged {len(paths)} checkpoint{'s' if len(paths) != 1 else ''} ({', '.join(str(p) for p in paths)}) into {args.output}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
