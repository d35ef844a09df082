"""``nmt-train -config FILE.yaml [-set key.path=value ...]``: train (or resume) a model.

Started by ``torchrun --nproc_per_node=N -m nmt.cli.train -config FILE.yaml`` (or
``torchrun ... $(which nmt-train) ...``) it trains data-parallel: see ``nmt.train.distributed``.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The ``nmt-train`` argument parser (``--help`` shows defaults; config defaults are listed in
    ``configs/reference.yaml``)."""
    from nmt._version import __version__
    from nmt.cli.help_format import DefaultsHelpFormatter

    parser = argparse.ArgumentParser(
        prog="nmt-train",
        description="Train a sequence-to-sequence model from a YAML config. If training.save_dir already "
                    "holds last.pt, training resumes from it.",
        epilog="Every config option, with its default and meaning, is listed in configs/reference.yaml.",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-config", "--config", required=True, metavar="FILE.yaml", help="YAML config file")
    parser.add_argument("-set", "--set", dest="overrides", action="extend", nargs="+", default=[],
                        metavar="KEY=VALUE", help="override a config value, e.g. -set training.max_steps=500 "
                        "model.attention.mapping=sparsemax (values are parsed as YAML)")
    parser.add_argument("-init_from", "--init_from", metavar="PATH", default=None,
                        help="fine-tune: start a new run from this checkpoint, or a run directory's best.pt "
                        "(its weights, tokenizers and vocabularies; fresh step, optimizer and schedule); the same "
                        "as -set training.init_from=PATH. Ignored once save_dir holds a checkpoint (it resumes)")
    parser.add_argument("-quiet", "--quiet", action="store_true",
                        help="no progress bar; on the terminal, warnings and the closing summary line only "
                        "(train.log keeps the full record)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (0 done, 1 non-finite loss, 2 bad config/data/save_dir, 128+N on signal N).

    Subnormal floats are flushed to zero while it runs (:mod:`nmt.utils.denormals`): set before
    torch's thread pool starts, so that its workers inherit the mode."""
    from nmt.utils.denormals import flush_denormals, restore_denormals

    flush_denormals()
    try:
        return _run(argv)
    finally:
        restore_denormals()


def _run(argv: Sequence[str] | None) -> int:
    """``main`` once the floating-point mode is set."""
    args = build_parser().parse_args(argv)
    import logging

    from nmt.utils.allocator import freeze_live_objects, keep_freed_memory, thaw_live_objects

    keep_freed_memory()

    from nmt.utils.logging import setup_logging

    logger = setup_logging(level=logging.WARNING if args.quiet else logging.INFO)
    save_dir = None
    try:
        from nmt.data.errors import DataError
        from nmt.train.checkpoint import CheckpointError
        from nmt.config import ConfigError, load_config
        from nmt.train.nonfinite import NonFiniteLossError
        from nmt.utils.dir_lock import DirectoryLock, DirectoryLockedError

        overrides = list(args.overrides)
        if args.init_from is not None:  # a JSON string is a YAML string: any path stays a string
            import json

            overrides.append(f"training.init_from={json.dumps(args.init_from)}")
        config = load_config(args.config, overrides)
        if args.quiet:
            config["training"]["progress"] = False
        from nmt.train.trainer import RUN_LOCK_WHAT, Trainer, check_run_config

        check_run_config(config, args.config)  # bad values: an error before anything is written
        save_dir = Path(config["training"]["save_dir"])
        from nmt.train.distributed import torchrun_environment

        if torchrun_environment() and os.environ["RANK"] != "0":  # rank 0 locks and logs for the job
            config["training"]["progress"] = False
            setup_logging(level=logging.WARNING)
            lock = None
        else:
            lock = DirectoryLock(save_dir, RUN_LOCK_WHAT).acquire()  # before train.log: one run per save_dir
            setup_logging(save_dir / "train.log", level=logging.WARNING if args.quiet else logging.INFO)
        trainer = Trainer(config, source=args.config, lock=lock)
        freeze_live_objects()  # model, vocabularies and data: keep full collections short
        try:
            summary = trainer.train()
        finally:
            thaw_live_objects()
            trainer.dist.close()
    except (ConfigError, DataError, CheckpointError, DirectoryLockedError) as exc:
        print(f"nmt-train: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # any other bad value: still a one-line error
        text = str(exc).strip()  # (``!r`` in the f-string would quote the whole line)
        print(f"nmt-train: error: {text.splitlines()[0] if text else type(exc).__name__}", file=sys.stderr)
        return 2
    except NonFiniteLossError as exc:
        print(f"nmt-train: error: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # a compiler that went missing after the check (training.compile)
        from nmt.train.compile import compiler_failure

        reason = compiler_failure(exc)
        if reason is None:
            raise
        print(f"nmt-train: error: {args.config}: training.compile: {reason}", file=sys.stderr)
        return 2
    except OSError as exc:  # save_dir a file, read-only, full disk: one line naming the path
        from nmt.utils.io import describe_os_error

        print(f"nmt-train: error: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        last = save_dir / "last.pt" if save_dir is not None else None
        state = ("last.pt holds the last saved state" if last is not None and last.is_file()
                 else "no checkpoint was saved: the same command starts over")
        print(f"nmt-train: forced quit; {state}", file=sys.stderr)
        return 128 + signal.SIGINT
    if args.quiet:  # otherwise the trainer has logged it already
        print(summary.line())
    if summary.stopped_by.startswith("SIG"):
        if trainer.dist.is_main:
            logger.warning("resume with the same command")
        return 128 + getattr(signal, summary.stopped_by)
    return 0


if __name__ == "__main__":
    sys.exit(main())
