"""The one-line configuration error and the standard "unknown name" error of the config layer."""
from __future__ import annotations

from typing import Any

from nmt.sparse.suggest import did_you_mean


class ConfigError(ValueError):
    """A one-line configuration error: ``<source>: <key>: <problem>`` (``<source>: <problem>``
    for whole-file problems)."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source, self.key, self.problem = source, key, problem
        super().__init__(f"{source}: {key}: {problem}" if key else f"{source}: {problem}")


def unknown_name_error(source: str, key: str, what: str, name: Any, valid: list[str] | tuple[str, ...],
                       owner: str = "") -> ConfigError:
    """The standard error for an unknown key / choice: suggestion first, then the valid names.

    e.g. ``f.yaml: model.attention.params.lamb: unknown parameter 'lamb' of 'fusedmax' (did you
    mean 'lam'?); valid: lam, gamma``.
    """
    of = f" of {owner}" if owner else ""
    return ConfigError(source, key, f"unknown {what} {name!r}{of}{did_you_mean(name, valid, cutoff=0.5)}; "
                       f"valid: {', '.join(map(str, valid))}")


__all__ = ["ConfigError", "unknown_name_error"]
