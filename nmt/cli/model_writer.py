"""What ``nmt-average`` and ``nmt-release`` share: both read checkpoints and write one model file.

:func:`model_parser` makes their argument parser (with ``--version``);
:func:`write_model` builds the model inside :func:`nmt.cli.signals.stop_on_signals`, saves it
atomically and turns the failures into their exit codes and one-line messages.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable


def model_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser for ``prog`` with ``--version``; the caller adds its inputs and ``-output``."""
    from nmt._version import __version__

    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def write_model(prog: str, output: str, build: Callable[[], dict[str, Any]]) -> int:
    """Save ``build()``'s checkpoint payload to ``output``, SIGINT / SIGTERM raising
    ``Terminated`` meanwhile. Returns 0 when written; 2 after a ``CheckpointError`` or an
    ``OSError`` (of ``build`` or the save), printed as one line ``PROG: error: ...``; 128 + N
    after signal N (``PROG: interrupted by SIGTERM; OUTPUT was not written``: the atomic save
    leaves neither the output nor its temporary file)."""
    from nmt.cli.signals import Terminated, stop_on_signals
    from nmt.train.checkpoint import CheckpointError, save_checkpoint
    from nmt.utils.io import describe_os_error

    try:
        with stop_on_signals():
            save_checkpoint(output, build())
    except Terminated as exc:
        print(f"{prog}: interrupted by {exc}; {output} was not written", file=sys.stderr)
        return 128 + exc.signum
    except (CheckpointError, OSError) as exc:
        text = describe_os_error(exc) if isinstance(exc, OSError) else str(exc).strip()  # 'PATH: is a directory'
        print(f"{prog}: error: {text.splitlines()[0] if text else type(exc).__name__}", file=sys.stderr)
        return 2
    return 0


__all__ = ["model_parser", "write_model"]
