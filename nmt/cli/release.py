"""``nmt-release -model best.pt -output model.pt``: a checkpoint without its training state.

Keeps the weights, both fields (tokenizers + vocabularies), the resolved config, the step
and the metrics; drops the optimizer, schedule, RNG states and data position. The result is
smaller and loads in ``nmt-translate`` (it cannot resume training).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

PROG = "nmt-release"


def build_parser() -> argparse.ArgumentParser:
    from nmt.cli.model_writer import model_parser

    p = model_parser(PROG, "Strip a checkpoint to what translation needs.")
    p.add_argument("-model", "--model", required=True, metavar="M.pt", help="checkpoint (e.g. RUN/best.pt)")
    p.add_argument("-output", "--output", required=True, metavar="OUT.pt", help="released model (written atomically)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; 0 on success, 2 on bad input (one line on stderr), 128+N on signal N (SIGINT /
    SIGTERM: the output is not written and no temporary file is left; see :mod:`nmt.cli.signals`)."""
    args = build_parser().parse_args(argv)
    import os

    from nmt.cli.model_writer import write_model
    from nmt.train.checkpoint import load_checkpoint
    from nmt.train.model_release import released

    code = write_model(PROG, args.output, lambda: released(load_checkpoint(args.model, training=False), args.model))
    if code:
        return code
    before, after = os.path.getsize(args.model), os.path.getsize(args.output)
    print(f"{PROG}: {args.output}: {after / 1e6:.2f} MB ({args.model}: {before / 1e6:.2f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
