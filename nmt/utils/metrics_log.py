"""``metrics.jsonl``: one JSON object per validation, appended as training goes."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from nmt.utils.io import atomic_write_text


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no inf/nan
    return value


class MetricsLog:
    """Appends records to ``path``; :meth:`truncate_after` drops records of a step > N
    (used on resume so a restarted run does not log the same step twice)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, record: dict[str, Any]) -> None:
        """Append one record as a single JSON line (flushed)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({k: _jsonable(v) for k, v in record.items()}, sort_keys=False)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()

    def read(self) -> list[dict[str, Any]]:
        """All records; a torn last line (crash mid-write) is ignored."""
        if not self.path.is_file():
            return []
        records = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records

    def truncate_after(self, step: int) -> None:
        """Rewrite the file atomically keeping only records with ``step <= step``."""
        if not self.path.is_file():
            return
        kept = [r for r in self.read() if r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))


__all__ = ["MetricsLog"]
