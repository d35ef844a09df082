"""Deprecated: moved to :mod:`nmt.config.schema` (Option, validate) and :mod:`nmt.config.errors`
(ConfigError, unknown_name_error).

This alias stays for one release. It resolves names lazily (module ``__getattr__``), so
``nmt.utils`` itself imports no domain part; use ``from nmt.config import ConfigError, Option``.
"""
from __future__ import annotations

import importlib
from typing import Any

_NAMES = ("REQUIRED", "ConfigError", "Option", "Schema", "validate", "unknown_name_error")


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module("nmt.config"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_NAMES)
