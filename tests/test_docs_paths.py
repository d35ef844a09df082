"""User docs, configs and recipes name no project-machine paths (every path is the user's, or an option)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r"/work/|\.\./shared|(?<![\w.])shared/data/")


def user_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "setup.py"]
    files += sorted((ROOT / "configs").glob("*.yaml"))
    for pattern in ("*.md", "*.py", "configs/*.yaml"):
        files += sorted((ROOT / "recipes").glob(f"*/{pattern}"))
    files += sorted((ROOT / "nmt").rglob("*.py")) + sorted((ROOT / "tools").glob("*.py"))
    return files


def test_no_project_machine_paths_in_user_docs_configs_recipes_or_defaults():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in user_files() for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if MACHINE_PATH.search(line)]
    assert not found, "\n".join(found)


def test_license_matches_setup():
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith("MIT License") and "Copyright (c) 2026 the nmt authors" in license_text
    assert 'license="MIT"' in (ROOT / "setup.py").read_text(encoding="utf-8")
