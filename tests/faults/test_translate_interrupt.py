"""nmt-translate interrupted (SIGINT, SIGTERM) or killed mid-way: non-zero exit, no output under
the final name; a UTF-8 BOM on stdin is dropped like for -src FILE."""
import io
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nmt.cli import translate as translate_cli
from nmt.train.trainer import Trainer
from nmt.config import resolve_config
from tiny_task import tiny_config, write_task

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """An untrained tiny model checkpoint (translation only needs weights and fields)."""
    root = tmp_path_factory.mktemp("interrupt")
    trainer = Trainer(resolve_config(tiny_config(write_task(root / "data"), root / "run"), "tiny.yaml"), "tiny.yaml")
    trainer.save()
    trainer.lock.release()
    return root / "run" / "last.pt"


def start_translation(model: Path, out: Path, ignore_sigint: bool) -> subprocess.Popen:
    """nmt-translate in a child whose search announces itself and then takes a while."""
    script = textwrap.dedent(f"""
        import sys, time
        from nmt.cli import translate
        from nmt.translate.translator import Translator
        real = Translator.translate
        def slow(self, lines, progress=None, **kwargs):
            print("translating", file=sys.stderr, flush=True)
            time.sleep(8)
            return real(self, lines, progress, **kwargs)
        Translator.translate = slow
        sys.exit(translate.main(["-model", {str(model)!r}, "-src", "-", "-output", {str(out)!r}, "-quiet"]))
    """)
    preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
    proc.stdin.write("a b c\nd e\n" * 50)
    proc.stdin.close()
    assert proc.stderr.readline().strip() == "translating"
    return proc


@pytest.mark.parametrize("sig, ignore_sigint", [(signal.SIGINT, True), (signal.SIGTERM, False),
                                                (signal.SIGKILL, False)],
                         ids=["SIGINT-to-a-background-job", "SIGTERM", "SIGKILL"])
def test_interrupted_translation_exits_nonzero_and_writes_no_output(model, tmp_path, sig, ignore_sigint):
    out = tmp_path / "out.txt"
    proc = start_translation(model, out, ignore_sigint)
    proc.send_signal(sig)
    code = proc.wait(timeout=60)
    err = proc.stderr.read()
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:
        assert code == 128 + sig, err
        assert err.strip() == f"nmt-translate: interrupted by {signal.Signals(sig).name}; unfinished outputs were not written"
    assert os.listdir(tmp_path) == []  # no output, no temporary file


def test_bom_on_stdin_is_dropped_like_for_files(model, tmp_path, monkeypatch, capsys):
    text = "a b c\nd e\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbf" + text.encode())))
    from nmt.cli.translate_common import read_source

    assert read_source("-") == ["a b c", "d e"]
    (tmp_path / "src.txt").write_bytes(b"\xef\xbb\xbf" + text.encode())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbf" + text.encode())))
    assert translate_cli.main(["-model", str(model), "-src", "-", "-quiet"]) == 0  # streamed
    from_stdin = capsys.readouterr().out
    assert translate_cli.main(["-model", str(model), "-src", str(tmp_path / "src.txt"), "-quiet"]) == 0
    assert capsys.readouterr().out == from_stdin


def test_a_model_with_nan_weights_certifies_no_sentence(model, tmp_path, capsys):
    import json
    import math

    import torch

    payload = torch.load(model, weights_only=True)
    payload["model"] = {k: v.fill_(math.nan) if v.is_floating_point() else v for k, v in payload["model"].items()}
    nan_model = tmp_path / "nan.pt"
    torch.save(payload, nan_model)
    (tmp_path / "src.txt").write_text("a b c\nd e\nf\n")
    report = tmp_path / "report.jsonl"
    assert translate_cli.main(["-model", str(nan_model), "-src", str(tmp_path / "src.txt"),
                               "-output", str(tmp_path / "out.txt"), "-report", str(report)]) == 0
    records = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(r["certified"], r["reason"], r["n_nonzero"], r["mass"]) for r in records] == \
        [(False, "nonfinite_scores", 0, 0.0)] * 3
    assert "certified 0.0%" in capsys.readouterr().err
