"""The ``--help`` formatter of the nmt programs: every option that has a default shows it."""
from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help when it has a default worth showing (not
    None, not False of a switch, not an empty list, not already written in the help text)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default == [] or default is argparse.SUPPRESS or "(default" in text
                or action.option_strings == [] and action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)):
            return text
        return f"{text} (default: %(default)s)"


__all__ = ["DefaultsHelpFormatter"]
