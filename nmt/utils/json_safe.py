"""JSON without non-finite numbers: JSON has no infinity or NaN (Python's ``json`` would write the
non-standard tokens ``Infinity`` / ``NaN``, which other readers refuse)."""
from __future__ import annotations

import math
from typing import Any


def json_number(x: float | None) -> float | None:
    """``x``, or None where JSON has no number (inf, nan)."""
    return x if x is not None and math.isfinite(x) else None


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (in dicts, lists and tuples, at any depth) replaced by
    None; tuples become lists. Other values are returned as they are."""
    if isinstance(value, float):
        return json_number(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


__all__ = ["json_number", "json_safe"]
