"""Deprecated: moved to :mod:`nmt.config.options`.

This alias stays for one release. It resolves names lazily (module ``__getattr__``), so
``nmt.utils`` itself imports no domain part; use ``from nmt.config.options import SCHEMA``.
"""
from __future__ import annotations

import importlib
from typing import Any

_NAMES = ("SCHEMA", "METRICS", "HIGHER_IS_BETTER")


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module("nmt.config.options"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_NAMES)
