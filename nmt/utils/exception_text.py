"""An exception's message shortened for a one-line error (the CLI's ``error: ...`` lines)."""
from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, outer whitespace stripped; the exception's type name
    when the message is empty."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def one_line(exc: BaseException, limit: int = 400) -> str:
    """The whole message joined on one line (torch's ``load_state_dict`` names the weights on later
    lines), cut to ``limit`` characters with ``...``; the type name when the message is empty."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return (text if len(text) <= limit else text[: limit - 3] + "...") if text else type(exc).__name__


__all__ = ["first_line", "one_line"]
