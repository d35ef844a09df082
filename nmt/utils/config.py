"""Deprecated: moved to :mod:`nmt.config` (``nmt.config.loading`` / ``nmt.config.validation``).

This alias stays for one release. It resolves names lazily (module ``__getattr__``), so
``nmt.utils`` itself imports no domain part; use ``from nmt.config import load_config``.
"""
from __future__ import annotations

import importlib
from typing import Any

_NAMES = ("ConfigError", "load_config", "resolve_config", "apply_overrides", "parse_override", "read_yaml",
          "check_config", "check_mapping", "config_differences", "registered_mappings", "save_config",
          "dump_config", "Option")


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module("nmt.config"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_NAMES)
