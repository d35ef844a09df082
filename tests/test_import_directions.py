"""The package's import picture (README "What is where"): no import runs back up a floor.

Every ``import nmt.x`` / ``from nmt.x import ...`` in nmt/ is read with ``ast`` (function-level and
lazy imports included: a lazy import is still a dependency) and checked against the parts each part
may use. A new part must be added here, with its allowed directions, before it can import anything.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "nmt"

# part -> the parts it may import (itself always allowed). Arrows point down:
# cli -> server -> api; cli -> train -> translate, config -> models, data -> sparse, utils (models and data
# never read config)
ALLOWED: dict[str, set[str]] = {
    "sparse": set(),
    "utils": set(),
    "config": {"sparse", "utils", "data", "models"},  # checks names against registry, tokenizers, modules
    "data": {"sparse", "utils"},
    "models": {"sparse", "utils"},
    "translate": {"models", "data", "sparse", "utils", "config"},
    "train": {"translate", "models", "data", "config", "sparse", "utils"},
    "cli": {"server", "train", "translate", "models", "data", "config", "sparse", "utils"},
    "api": {"translate", "models", "data", "config", "sparse", "utils"},  # nmt.load / Model (nmt/api.py)
    "server": {"api", "translate", "models", "data", "config", "sparse", "utils"},  # nmt-server's HTTP API
    "": {"api", "translate", "models", "data", "config", "sparse", "utils"},  # nmt/__init__.py (lazy nmt.load)
    "_version": set(),  # the version string (nmt/_version.py): a leaf that every part may read
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] != "__init__" else ""


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "nmt"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "nmt":
                if target == "nmt":  # from nmt import x: x may be a part
                    found += [(node.lineno, f"nmt.{a.name}") for a in node.names]
                else:
                    found.append((node.lineno, target))
    return found


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py"))


def test_every_part_is_known():
    parts = {_part(".".join(p.relative_to(ROOT.parent).with_suffix("").parts)) for p in _modules()}
    assert parts <= set(ALLOWED), f"parts without allowed directions: {sorted(parts - set(ALLOWED))}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_no_forbidden_import(path: Path):
    source = _part(".".join(path.relative_to(ROOT.parent).with_suffix("").parts))
    bad = []
    for line, target in _imports(path):
        dest = _part(target)
        if dest in ("", "__version__") and target.count(".") <= 1:
            continue  # the package itself (its version string)
        if dest != source and dest != "_version" and dest not in ALLOWED[source]:
            bad.append(f"{path.relative_to(ROOT.parent)}:{line}: nmt.{source or '__init__'} imports {target}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_forbidden_import(tmp_path):
    """Guard against a vacuous checker: a planted translate -> train import is found."""
    fake = ROOT / "translate" / "beam_search.py"
    found = _imports(fake)
    assert any(t.startswith("nmt.models") for _, t in found)
    planted = tmp_path / "x.py"
    planted.write_text("def f():\n    from nmt.train.trainer import Trainer\n")
    tree = ast.parse(planted.read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert _part(node.module) == "train" and "train" not in ALLOWED["translate"]
