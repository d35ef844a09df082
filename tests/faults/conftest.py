"""Fault-injection tests: crashes during saves, NaN losses, concurrent runs, full / read-only
directories, interrupted translation. They reuse the trainer tests' tiny task."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
