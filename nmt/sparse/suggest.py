"""The "did you mean" hint of one-line errors about unknown names (mappings, tokenizers, config keys).

It lives here, at the bottom of the import graph (``nmt.sparse`` imports nothing else of nmt), so the
registry, the tokenizers (``nmt.data``) and the config layer (``nmt.config``) share one implementation.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: object, valid: Iterable[object], cutoff: float = 0.6) -> str:
    """``" (did you mean 'x'?)"`` for the closest name in ``valid``, or ``""`` when none is close."""
    match = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=cutoff)
    return f" (did you mean {match[0]!r}?)" if match else ""


__all__ = ["did_you_mean"]
