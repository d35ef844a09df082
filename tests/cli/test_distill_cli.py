"""``nmt-train`` with ``training.distill``: a tiny teacher on the generated quick-start task, a
student distilled from it for a few steps, then resumed longer with another weight; a missing
teacher is a one-line error before anything is written."""
import json

import yaml

from test_train_cli import quickstart_like, run


def test_distilled_student_trains_and_resumes(tmp_path, monkeypatch, capsys):
    teacher = quickstart_like(tmp_path)  # runs/quickstart, 3 steps (validated: best.pt)
    teacher["model"]["output"] = {"mapping": "softmax", "params": {}}
    assert run(tmp_path, monkeypatch, teacher) == 0
    capsys.readouterr()
    student = quickstart_like(tmp_path)  # the quick start's entmax15 output, its data and vocabularies
    student["training"].update(save_dir="runs/student", distill={"teacher": "runs/quickstart", "temperature": 2.0})
    assert run(tmp_path, monkeypatch, student) == 0
    assert "training finished (max_steps) at step 3" in capsys.readouterr().out
    run_dir = tmp_path / "runs" / "student"
    log = (run_dir / "train.log").read_text()
    assert "distillation: teacher runs/quickstart/best.pt (step 3, output softmax, temperature 2), weight 0.5" in log
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["distill"]
    assert saved == {"teacher": "runs/quickstart", "weight": 0.5, "temperature": 2.0}
    # resumed longer, with another weight (allowed, and said)
    assert run(tmp_path, monkeypatch, student, "-set", "training.max_steps=5", "-set", "training.distill.weight=0.25") == 0
    assert "at step 5" in capsys.readouterr().out
    log = (run_dir / "train.log").read_text()
    assert "resuming with changed settings: training.max_steps, training.distill.weight" in log
    assert "weight 0.25" in log
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 5]
    assert all(r["train_loss"] > 0 and r["valid_loss"] > 0 for r in records)


def test_a_missing_teacher_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    student = quickstart_like(tmp_path)
    student["training"].update(save_dir="runs/student", distill={"teacher": "runs/none/best.pt"})
    assert run(tmp_path, monkeypatch, student) == 2
    err = capsys.readouterr().err.strip()
    assert err == "nmt-train: error: c.yaml: training.distill.teacher: runs/none/best.pt: no such checkpoint file or run directory"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()
