"""Every C source and header of the package ships with it (setup.py's package_data): an installed
nmt builds its native kernels from them on first use, and without them silently runs the slower
torch paths."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _package_data() -> dict[str, list[str]]:
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "package_data":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no package_data")


def test_every_native_source_is_package_data():
    listed = {(package, name) for package, names in _package_data().items() for name in names}
    sources = {(".".join(path.parent.relative_to(ROOT).parts), path.name)
               for pattern in ("*.c", "*.h") for path in (ROOT / "nmt").rglob(pattern)}
    assert sources, "no native sources found"
    assert sources <= listed, f"not in setup.py's package_data: {sorted(sources - listed)}"
    assert listed <= sources, f"listed but missing: {sorted(listed - sources)}"
