"""nmt-average and nmt-release on a tiny trained run: means, identical translations, one-line errors."""
import os

import pytest
import torch

from nmt.cli import average as average_cli
from nmt.cli import release as release_cli
from nmt.cli import translate as translate_cli
from nmt.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from nmt.train.trainer import Trainer
from nmt.config import resolve_config
from tiny_task import tiny_config, write_task


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    torch.set_num_threads(1)
    config = tiny_config(write_task(root / "data"), root / "run", keep_last=3)
    Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml").train()
    return root / "run"


def test_average_is_the_parameter_mean(run_dir, tmp_path, capsys):
    a, b = run_dir / "step_4.pt", run_dir / "step_8.pt"
    assert average_cli.main(["-models", str(a), str(b), "-output", str(tmp_path / "avg.pt")]) == 0
    avg = load_checkpoint(tmp_path / "avg.pt", training=False)
    ma, mb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    assert avg["kind"] == "model" and "optimizer" not in avg
    for name, value in avg["model"].items():
        torch.testing.assert_close(value, (ma[name].double() + mb[name].double()).div(2).float(), rtol=0, atol=0)
    # -last 3 of the run directory: step_4, step_8, step_12
    assert average_cli.main(["-last", "3", "-run", str(run_dir), "-output", str(tmp_path / "last3.pt")]) == 0
    last3 = load_checkpoint(tmp_path / "last3.pt", training=False)
    mc = load_checkpoint(run_dir / "step_12.pt")["model"]
    name = next(iter(mc))
    torch.testing.assert_close(last3["model"][name], (ma[name] + mb[name] + mc[name]) / 3)
    assert last3["step"] == 12 and last3["averaged"] == 3


def test_release_translates_identically_and_is_smaller(run_dir, tmp_path):
    out = tmp_path / "model.pt"
    assert release_cli.main(["-model", str(run_dir / "best.pt"), "-output", str(out)]) == 0
    assert os.path.getsize(out) < os.path.getsize(run_dir / "best.pt")
    model = load_checkpoint(out, training=False)
    assert set(model) >= {"model", "config", "src_field", "tgt_field"} and "optimizer" not in model
    src = tmp_path / "in.txt"
    src.write_text("a b c\nf e d a\n\nb b\n", encoding="utf-8")
    outputs = []
    for checkpoint in (run_dir / "best.pt", out):
        target = tmp_path / f"{checkpoint.stem}.out"
        assert translate_cli.main(["-model", str(checkpoint), "-src", str(src), "-output", str(target),
                                   "-beam_size", "3", "-max_length", "8", "-quiet"]) == 0
        outputs.append(target.read_text(encoding="utf-8"))
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 4
    with pytest.raises(CheckpointError, match="a released model"):  # cannot resume from it
        load_checkpoint(out)


def _mutated(run_dir, tmp_path, name, mutate):
    checkpoint = load_checkpoint(run_dir / "step_8.pt")
    mutate(checkpoint)
    save_checkpoint(tmp_path / name, checkpoint)
    return str(tmp_path / name)


@pytest.mark.parametrize("case,expected", [
    ("arch", r"other.pt: another architecture than .*step_4.pt \(model.encoder.hidden_size differs\)$"),
    ("vocab", r"other.pt: its tgt vocabulary differs from .*step_4.pt's$"),
    ("tokenizer", r"other.pt: its tgt tokenizer differs from .*step_4.pt's \(tokenizer type: char vs space\)$"),
    ("shape", r"other.pt: weight '.*' is \(3, 3\) torch.float32, .* in .*step_4.pt$"),
])
def test_mismatched_checkpoints_are_one_line_errors(run_dir, tmp_path, capsys, case, expected):
    def mutate(ckpt):
        if case == "arch":
            ckpt["config"]["model"]["encoder"]["hidden_size"] += 2
        elif case == "vocab":
            ckpt["tgt_field"]["vocab"]["itos"][-1] += "x"
        elif case == "tokenizer":  # same vocabulary, other preprocessing
            ckpt["tgt_field"]["tokenizer"] = {"type": "space"}
        else:
            name = next(iter(ckpt["model"]))
            ckpt["model"][name] = torch.zeros(3, 3)
    other = _mutated(run_dir, tmp_path, "other.pt", mutate)
    assert average_cli.main(["-models", str(run_dir / "step_4.pt"), other, "-output", str(tmp_path / "x.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    import re
    assert re.search(expected, err), err
    assert not (tmp_path / "x.pt").exists()


def test_average_of_models_trained_with_other_dropout(run_dir, tmp_path):
    """Dropout is training regularisation, not architecture: checkpoints that differ only in
    their dropout rates average (the config, dropout included, is the last file's)."""
    def mutate(ckpt):
        model = ckpt["config"]["model"]
        model["embeddings"]["dropout"] = 0.45
        for section in ("encoder", "decoder", "transformer"):
            for key in ("dropout", "attention_dropout", "activation_dropout"):
                if key in model.get(section) or {}:
                    model[section][key] = 0.35
    other = _mutated(run_dir, tmp_path, "other.pt", mutate)
    out = tmp_path / "avg.pt"
    assert average_cli.main(["-models", str(run_dir / "step_4.pt"), other, "-output", str(out)]) == 0
    avg = load_checkpoint(out, training=False)
    assert avg["config"]["model"]["embeddings"]["dropout"] == 0.45


def test_bad_arguments_are_one_line_errors(run_dir, tmp_path, capsys):
    assert average_cli.main(["-last", "5", "-run", str(run_dir), "-output", str(tmp_path / "x.pt")]) == 2
    assert "3 step checkpoint(s), 5 asked; keep more with training.keep_last" in capsys.readouterr().err
    assert release_cli.main(["-model", str(tmp_path / "nope.pt"), "-output", str(tmp_path / "x.pt")]) == 2
    assert "nope.pt: no such checkpoint file" in capsys.readouterr().err
    assert average_cli.main(["-last", "2", "-output", str(tmp_path / "x.pt")]) == 2
    assert "-last N needs -run RUN_DIR" in capsys.readouterr().err
    # an output that is a directory: 'PATH: is a directory' as nmt-translate says it, not '[Errno 21] ...'
    assert release_cli.main(["-model", str(run_dir / "last.pt"), "-output", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"nmt-release: error: {tmp_path}: is a directory\n"
    assert average_cli.main(["-models", str(run_dir / "last.pt"), "-output", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"nmt-average: error: {tmp_path}: is a directory\n"


def _average_dying_in_save(run_dir, output, how: str):
    """nmt-average in a child process whose save writes half the file, then gets ``how`` (SIGKILL / SIGTERM)."""
    import signal
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = textwrap.dedent(f"""
        import os, signal, sys, torch
        from nmt.cli import average
        def dying_save(obj, handle, *args, **kwargs):
            handle.write(b"half an average"); handle.flush()
            os.kill(os.getpid(), signal.{how})
        torch.save = dying_save
        sys.exit(average.main(["-last", "2", "-run", {str(run_dir)!r}, "-output", {str(output)!r}]))
    """)
    return subprocess.run([sys.executable, "-c", script], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=120)


def test_a_killed_average_leaves_a_temporary_that_the_next_run_removes(run_dir, tmp_path, capsys):
    import signal

    out = tmp_path / "avg.pt"
    proc = _average_dying_in_save(run_dir, out, "SIGKILL")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (stray,) = [p.name for p in tmp_path.glob(".avg.pt.*.tmp")]  # kill -9: nothing could clean up
    assert not out.exists()
    assert average_cli.main(["-last", "2", "-run", str(run_dir), "-output", str(out)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["avg.pt"]  # the dead writer's temporary is gone
    assert load_checkpoint(out, training=False)["averaged"] == 2


def test_a_terminated_average_exits_143_leaving_no_file(run_dir, tmp_path):
    import signal

    proc = _average_dying_in_save(run_dir, tmp_path / "avg.pt", "SIGTERM")
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"nmt-average: interrupted by SIGTERM; {tmp_path}/avg.pt was not written"
    assert list(tmp_path.iterdir()) == []
