"""A run directory given as ``-model`` (nmt-translate, nmt-release; ``-models`` of nmt-average): a
one-line error (exit 2) that names the checkpoint to pass instead: the directory's best.pt, its
last.pt before the first validation wrote a best.pt, no file where it holds neither. Nothing is
written. (The checkpoint is chosen by the user: best, last or an average translate differently.)"""
from __future__ import annotations

import pytest

from nmt.cli import average as average_cli
from nmt.cli import release as release_cli
from nmt.cli import translate as translate_cli


@pytest.mark.parametrize("held,named", [(("best.pt", "last.pt", "step_8.pt"), "best.pt"),
                                        (("last.pt", "step_4.pt"), "last.pt"), (("config.yaml",), None)])
@pytest.mark.parametrize("program", ["translate", "release", "average"])
def test_a_run_directory_as_model_names_the_checkpoint_to_pass(tmp_path, capsys, held, named, program):
    run = tmp_path / "run"
    run.mkdir()
    for name in held:
        (run / name).write_bytes(b"")  # never read: the directory is refused first
    (tmp_path / "in.txt").write_text("a b\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = {"translate": (translate_cli, ["-model", str(run), "-src", str(tmp_path / "in.txt"), "-output", str(out)]),
            "release": (release_cli, ["-model", str(run), "-output", str(out)]),
            "average": (average_cli, ["-models", str(run), str(run), "-output", str(out)])}
    cli, args = argv[program]
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    hint = "" if named is None else f" (name one of its checkpoints, e.g. {run / named})"
    assert captured.err == f"nmt-{program}: error: {run}: is a directory, not a checkpoint file{hint}\n"
    assert captured.out == "" and not out.exists()
