"""A small declarative schema for nested YAML configs: types, defaults, choices.

A schema is a nested ``dict`` whose leaves are :class:`Option` objects and whose inner
nodes are sub-sections (plain dicts). :func:`validate` checks a user config against it and
returns a new, fully resolved dict (every default filled in). Every problem raises a
one-line :class:`ConfigError` naming the source (file), the dotted key, and, for a
misspelt key or choice, the closest valid name.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Mapping

from nmt.config.errors import ConfigError, unknown_name_error

REQUIRED = object()
"""Sentinel default: the option must be given."""


_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true/false", str: "a string", dict: "a mapping", list: "a list"}


@dataclass(frozen=True)
class Option:
    """One config value.

    type: int | float | bool | str | dict | list (float accepts integers and numeric strings
    such as ``1e-3``, which YAML reads as strings); default: a value or REQUIRED;
    choices: allowed values; nullable: ``null`` allowed; doc: one-line description (used
    by the reference config).

    Bounds for numbers: minimum / maximum (inclusive unless min_inclusive / max_inclusive
    is False, e.g. dropout ``minimum=0, maximum=1, max_inclusive=False`` is [0, 1)); a
    float is never NaN and, with ``finite`` (the default), never +-inf. The error names
    the interval, e.g. ``must be in [0, 1), got 1.5``.
    """

    type: type
    default: Any = REQUIRED
    doc: str = ""
    choices: tuple | None = None
    nullable: bool = False
    minimum: float | None = None
    maximum: float | None = None
    min_inclusive: bool = True
    max_inclusive: bool = True
    finite: bool = True

    def check(self, value: Any, source: str, key: str) -> Any:
        """Return the validated (possibly converted) value or raise ConfigError."""
        if value is None:
            if self.nullable:
                return None
            raise ConfigError(source, key, f"must be {_TYPE_NAMES[self.type]}, got null")
        value = self._convert(value, source, key)
        if self.choices is not None and value not in self.choices:
            raise unknown_name_error(source, key, "value", value, self.choices)
        if self.type in (int, float):
            self._check_bounds(value, source, key)
        return copy.deepcopy(value)

    def _check_bounds(self, value: float, source: str, key: str) -> None:
        if value != value:  # NaN: no order, never a meaningful setting
            raise ConfigError(source, key, f"must be a number, got {value!r}")
        if self.finite and value in (math.inf, -math.inf):
            raise ConfigError(source, key, f"must be finite, got {value!r}")
        low_ok = (self.minimum is None or value > self.minimum
                  or (self.min_inclusive and value == self.minimum))
        high_ok = (self.maximum is None or value < self.maximum
                   or (self.max_inclusive and value == self.maximum))
        if not (low_ok and high_ok):
            raise ConfigError(source, key, f"must be {self.range_text()}, got {value!r}")

    def range_text(self) -> str:
        """The allowed interval in words: ``>= 1``, ``> 0``, ``in [0, 1)``, ``in (0, 1)``."""
        def number(x: float) -> str:
            return f"{x:g}" if isinstance(x, float) else str(x)
        if self.minimum is not None and self.maximum is not None:
            return (f"in {'[' if self.min_inclusive else '('}{number(self.minimum)}, "
                    f"{number(self.maximum)}{']' if self.max_inclusive else ')'}")
        if self.minimum is not None:
            return f"{'>=' if self.min_inclusive else '>'} {number(self.minimum)}"
        if self.maximum is not None:
            return f"{'<=' if self.max_inclusive else '<'} {number(self.maximum)}"
        return "a number"

    def _convert(self, value: Any, source: str, key: str) -> Any:
        expected = self.type
        if expected is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
        elif expected is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif isinstance(value, expected):
            return value
        raise ConfigError(source, key, f"must be {_TYPE_NAMES[expected]}, got {type(value).__name__} {value!r}")


Schema = Mapping[str, "Option | Schema"]


class ListableSection(dict):
    """A section that may also be given as a YAML list of such sections (e.g. ``data.train``: one
    ``{src, tgt}`` or a list of corpora). A mapping resolves to one section; a list (at least one
    item) to a list of resolved sections, item ``i`` named ``<key>[i]`` in errors."""


def _validate_list(items: list, spec: ListableSection, source: str, path: str) -> list[dict]:
    if not items:
        raise ConfigError(source, path, "must be a mapping or a non-empty list of mappings, got an empty list")
    return [validate(item, spec, source, f"{path}[{i}]") for i, item in enumerate(items)]


def validate(config: Any, schema: Schema, source: str, prefix: str = "") -> dict:
    """Check ``config`` against ``schema``; return a new dict with every default filled in.

    ``source`` names the file (or other origin) in error messages; ``prefix`` is the dotted
    path of ``config`` inside the whole document.
    """
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ConfigError(source, prefix, f"must be a section (a mapping of keys), got {type(config).__name__}")
    for key in config:
        if key not in schema:
            raise unknown_name_error(source, _join(prefix, str(key)), "key", key, sorted(schema))
    resolved: dict = {}
    for key, spec in schema.items():
        path = _join(prefix, key)
        if isinstance(spec, Option):
            if key in config:
                resolved[key] = spec.check(config[key], source, path)
            elif spec.default is REQUIRED:
                raise ConfigError(source, path, "is required but missing")
            else:
                resolved[key] = copy.deepcopy(spec.default)
        elif isinstance(spec, ListableSection) and isinstance(config.get(key), list):
            resolved[key] = _validate_list(config[key], spec, source, path)
        else:
            resolved[key] = validate(config.get(key), spec, source, path)
    return resolved


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


__all__ = ["REQUIRED", "ListableSection", "Option", "Schema", "validate"]
