"""The morphology recipe's data preparation and shared-task evaluation."""
import importlib.util
import random
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "sigmorphon2018"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "recipes" / "morphology" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prepare = _load("prepare")
evaluate = _load("evaluate")


def _edit_distance_recursive(a: str, b: str) -> int:
    """Textbook recursive definition, an independent truth for the DP."""
    @lru_cache(maxsize=None)
    def d(i: int, j: int) -> int:
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))
    return d(len(a), len(b))


def test_levenshtein_matches_recursive_definition():
    rng = random.Random(0)
    for _ in range(300):
        a = "".join(rng.choice("abc") for _ in range(rng.randint(0, 7)))
        b = "".join(rng.choice("abc") for _ in range(rng.randint(0, 7)))
        assert evaluate.levenshtein(a, b) == _edit_distance_recursive(a, b)
    assert evaluate.levenshtein("kitten", "sitting") == 3


def test_evaluate_macro_average_and_certificates():
    hyps, golds, langs = ["a", "b", "x", "y"], ["a", "c", "x", "y"], ["l1", "l1", "l2", "l2"]
    reports = [{"id": i, "exact": e, "n_nonzero": n} for i, (e, n) in enumerate([(True, 1), (False, 3), (True, 2), (True, 1)])]
    result = evaluate.evaluate(hyps, golds, langs, reports)
    assert result["languages"]["l1"]["accuracy"] == 50.0
    assert result["macro"]["accuracy"] == 75.0
    assert result["macro"]["levenshtein"] == 0.25
    assert result["macro"]["certified"] == 75.0
    assert result["macro"]["single"] == 50.0
    with pytest.raises(ValueError, match="line counts differ"):
        evaluate.evaluate(["a"], [], ["l"])


def _write(path: Path, rows):
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


def test_prepare_pools_languages(tmp_path, capsys):
    data = tmp_path / "raw"
    data.mkdir()
    _write(data / "xx-train-medium", [("walk", "walked", "V;PST"), ("ice cream", "ice creams", "N;PL")])
    _write(data / "xx-dev", [("go", "went", "V;PST")])
    _write(data / "xx-covered-test", [("run", "V;PST")])
    _write(data / "yy-train-medium", [("a", "b", "N")])
    _write(data / "yy-train-high", [("z", "z", "N")])
    out = tmp_path / "out"
    counts = prepare.prepare(data, "medium", out)
    assert counts == {"train": 3, "dev": 1, "valid": 1, "test": 1}
    src = (out / "train.src").read_text(encoding="utf-8").splitlines()
    assert src[0] == "<xx> V PST w a l k"
    assert src[1] == "<xx> N PL i c e ▁ c r e a m"
    assert (out / "train.tgt").read_text(encoding="utf-8").splitlines() == ["walked", "ice creams", "b"]
    assert (out / "train.lang").read_text(encoding="utf-8").splitlines() == ["xx", "xx", "yy"]
    assert (out / "test.src").read_text(encoding="utf-8").splitlines() == ["<xx> V PST r u n"]
    assert not (out / "test.tgt").exists()  # covered test only: no targets
    assert "test.tgt" not in capsys.readouterr().err  # no gold at all: nothing to say
    _write(data / "yy-test", [("c", "cs", "N;PL")])  # gold for one language: still no test.tgt, said so
    prepare.prepare(data, "medium", out)
    assert not (out / "test.tgt").exists()
    assert "test.tgt not written: gold test files (LANG-test) for 1 of 2 languages" in capsys.readouterr().err
    _write(data / "xx-test", [("run", "ran", "V;PST")])  # gold for all: test.tgt, aligned with test.src
    assert prepare.prepare(data, "medium", out)["test"] == 2
    assert (out / "test.src").read_text(encoding="utf-8").splitlines() == ["<xx> V PST r u n", "<yy> N PL c"]
    assert (out / "test.tgt").read_text(encoding="utf-8").splitlines() == ["ran", "cs"]
    _write(data / "zz-train-medium", [("bad line",)])
    rc = subprocess.run([sys.executable, str(ROOT / "recipes/morphology/prepare.py"), "--data-dir", str(data),
                         "--out", str(out)], capture_output=True, text=True)
    assert rc.returncode == 1 and "zz-train-medium:1:" in rc.stderr


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared SIGMORPHON data not present")
def test_prepare_on_real_data(tmp_path):
    counts = prepare.prepare(SHARED, "low", tmp_path, languages=["english", "german"])
    assert counts["train"] == 200 and counts["dev"] == 2000 and counts["valid"] == 100
    valid_langs = (tmp_path / "valid.lang").read_text(encoding="utf-8").splitlines()
    assert valid_langs.count("english") == valid_langs.count("german") == 50
    lines = (tmp_path / "dev.src").read_text(encoding="utf-8").splitlines()
    assert all(line.startswith(("<english> ", "<german> ")) for line in lines)
