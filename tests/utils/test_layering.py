"""Import directions: nmt.utils imports no domain part; nmt.sparse imports nothing else of nmt."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import nmt.sparse
import nmt.utils

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = ("nmt.sparse", "nmt.models", "nmt.data", "nmt.train", "nmt.translate", "nmt.config", "nmt.cli")


def _loaded_after_import(modules: list[str]) -> set[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print('\\n'.join(m for m in sys.modules if m.startswith('nmt')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    return set(out.stdout.split())


def test_utils_import_no_domain_part():
    names = [f"nmt.utils.{m.name}" for m in pkgutil.iter_modules(nmt.utils.__path__)]
    loaded = _loaded_after_import(names)
    assert not [m for m in loaded if m.startswith(DOMAIN)], loaded


def test_sparse_imports_nothing_else_of_nmt():
    names = [f"nmt.sparse.{m.name}" for m in pkgutil.iter_modules(nmt.sparse.__path__)]
    loaded = _loaded_after_import(names)
    assert all(m in ("nmt", "nmt._version") or m.startswith("nmt.sparse") for m in loaded), loaded
