"""Every ``python recipes/X/prepare.py ...`` command written in the READMEs and in the configs'
comments is accepted by that script's command line (optional parts in [brackets] included), so
a user who copies one does not meet a usage error (the morphology configs once omitted the
required --data-dir)."""
from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"python recipes/(\w+)/prepare\.py((?:[^`#\n\[]|\[[^\]]*\])*)")  # [...] may wrap a line


def _documents() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "recipes").glob("*/README.md"))]
    return files + sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "recipes").glob("*/configs/*.yaml"))


def _commands() -> list[tuple[str, str, str]]:
    found = []
    for path in _documents():
        text = path.read_text(encoding="utf-8")
        for match in COMMAND.finditer(text):
            n = text.count("\n", 0, match.start()) + 1
            arguments = re.split(r"\s{2,}\(", match.group(2))[0].replace("[", " ").replace("]", " ")
            found.append((f"{path.relative_to(ROOT)}:{n}", match.group(1), arguments))
    return found


def _load(recipe: str):
    spec = importlib.util.spec_from_file_location(f"prepare_{recipe}_cli", ROOT / "recipes" / recipe / "prepare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_commands_are_found():
    recipes = {recipe for _, recipe, _ in _commands()}
    assert recipes == {"morphology", "translation"}


@pytest.mark.parametrize("where,recipe,arguments", _commands(), ids=[c[0] for c in _commands()])
def test_documented_prepare_command_parses(where, recipe, arguments, monkeypatch):
    module = _load(recipe)
    calls = []
    for name in ("prepare", "prepare_multi30k", "prepare_iwslt17"):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, lambda *a, **k: calls.append(a) or {})
    try:
        code = module.main(shlex.split(arguments))
    except SystemExit as e:  # argparse's usage error
        pytest.fail(f"{where}: prepare.py{arguments} exits with {e.code}")
    assert code == 0 and len(calls) == 1, where
