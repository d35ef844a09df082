"""``nmt-train`` with ``training.keep_best``, then ``nmt-average -best N -run DIR``: the output is
the mean of exactly the N best validations' checkpoints (recomputed from their state dicts, chosen by
a brute-force sort of metrics.jsonl), and the one-line errors."""
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

from nmt.cli import average as average_cli  # noqa: E402
from nmt.cli import translate as translate_cli  # noqa: E402
from nmt.cli.train import main as train_main  # noqa: E402
from nmt.train.checkpoint import load_checkpoint  # noqa: E402
from tiny_task import tiny_config, write_task  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A noisy tiny run (lr 0.1: validation accuracy goes up and down) keeping its 4 best by accuracy."""
    root = tmp_path_factory.mktemp("keep_best")
    torch.set_num_threads(1)
    config = tiny_config(write_task(root / "data"), root / "run", max_steps=24, valid_every=2, keep_best=4,
                         optimizer={"lr": 0.1}, device="cpu")
    config["validation"]["metric"] = "accuracy"
    (root / "c.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert train_main(["-config", str(root / "c.yaml"), "-quiet"]) == 0
    return root / "run"


def best_steps(run: Path, n: int) -> list[int]:
    """The n best validations of metrics.jsonl by accuracy (ties: the earlier step), by a plain sort."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in sorted(records, key=lambda r: (-r["valid_accuracy"], r["step"]))[:n]]


@pytest.mark.parametrize("n", [1, 3, 4])
def test_average_best_is_the_mean_of_exactly_the_n_best(run_dir, tmp_path, capsys, n):
    steps = best_steps(run_dir, n)
    out = tmp_path / "avg.pt"
    assert average_cli.main(["-best", str(n), "-run", str(run_dir), "-output", str(out)]) == 0
    assert f"averaged {n} checkpoint" in capsys.readouterr().err
    avg = load_checkpoint(out, training=False)
    assert avg["kind"] == "model" and "optimizer" not in avg and avg["averaged"] == n
    assert avg["released_from"] == [str(run_dir / f"best_step_{s}.pt") for s in sorted(steps)]
    assert avg["step"] == max(steps)  # config, fields and step of the newest, as with -last
    models = [torch.load(run_dir / f"best_step_{s}.pt", weights_only=True)["model"] for s in steps]
    assert all(torch.load(run_dir / f"best_step_{s}.pt", weights_only=True)["metrics"]["step"] == s for s in steps)
    assert avg["model"].keys() == models[0].keys()
    for name, value in avg["model"].items():
        expected = (sum(m[name].double() for m in models) / n).to(models[0][name].dtype)
        torch.testing.assert_close(value, expected, rtol=0, atol=0)


def test_the_average_of_the_best_translates(run_dir, tmp_path):
    out = tmp_path / "avg.pt"
    assert average_cli.main(["-best", "4", "-run", str(run_dir), "-output", str(out)]) == 0
    (tmp_path / "in.txt").write_text("a b c\n", encoding="utf-8")
    assert translate_cli.main(["-model", str(out), "-src", str(tmp_path / "in.txt"),
                               "-output", str(tmp_path / "out.txt"), "-quiet"]) == 0
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == 1


def test_errors_are_one_line(run_dir, tmp_path, capsys):
    out = tmp_path / "avg.pt"
    assert average_cli.main(["-best", "5", "-run", str(run_dir), "-output", str(out)]) == 2
    assert capsys.readouterr().err == (f"nmt-average: error: {run_dir}: keeps 4 best checkpoint(s) (by validation "
                                       "accuracy), 5 asked; keep more with training.keep_best\n")
    assert average_cli.main(["-best", "2", "-output", str(out)]) == 2
    assert "-best N needs -run RUN_DIR" in capsys.readouterr().err
    assert average_cli.main(["-best", "0", "-run", str(run_dir), "-output", str(out)]) == 2
    assert "-best must be >= 1, got 0" in capsys.readouterr().err
    assert average_cli.main(["-best", "1", "-run", str(tmp_path / "nope"), "-output", str(out)]) == 2
    assert f"{tmp_path / 'nope'}: no such run directory" in capsys.readouterr().err
    assert not out.exists()


def test_a_run_without_kept_best_or_with_a_missing_file(run_dir, tmp_path, capsys):
    off = tmp_path / "off"
    off.mkdir()
    (off / "last.pt").write_bytes((run_dir / "last.pt").read_bytes())
    payload = torch.load(off / "last.pt", weights_only=True)
    payload["trainer"].pop("keep_best")  # as an older nmt, or keep_best 0, wrote it
    torch.save(payload, off / "last.pt")
    assert average_cli.main(["-best", "1", "-run", str(off), "-output", str(tmp_path / "a.pt")]) == 2
    assert "keeps no best checkpoints, 1 asked; keep more with training.keep_best" in capsys.readouterr().err
    # a kept file the record names is gone (a save in progress, or removed by hand)
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in run_dir.glob("*.pt"):
        (copy / path.name).write_bytes(path.read_bytes())
    top = best_steps(run_dir, 1)[0]
    (copy / f"best_step_{top}.pt").unlink()
    assert average_cli.main(["-best", "2", "-run", str(copy), "-output", str(tmp_path / "b.pt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"best_step_{top}.pt: missing, though {copy / 'last.pt'} keeps it" in err
    (copy / "last.pt").write_bytes(b"torn")
    assert average_cli.main(["-best", "1", "-run", str(copy), "-output", str(tmp_path / "c.pt")]) == 2
    assert f"{copy / 'last.pt'}: damaged" in capsys.readouterr().err
