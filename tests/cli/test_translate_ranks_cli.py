"""nmt-translate under torchrun (nmt.cli.translate_ranks): two CPU processes, started by the real
``torchrun`` (``python -m torch.distributed.run --standalone``), write the outputs of one process:
the same translations, n-best lists, certificates and support sizes, scores equal up to float32
rounding (see assert_same_translations), and in score mode the same bytes; each process decodes
every second batch (the shards are checked to cover the input once, and to differ). A stream is
refused in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_runs import tiny_rnn_config, train_run, translate_main as translate, write_reversal

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A tiny reversal model and an input of 40 words (several batches of 4) with an empty line."""
    root = tmp_path_factory.mktemp("translate_ranks")
    write_reversal(root, 120, 40)
    train_run(tiny_rnn_config(root, "space", "char", 300), root / "config.yaml")
    inputs = (root / "valid.src").read_text(encoding="utf-8").splitlines()
    inputs.insert(5, "")
    (root / "input.txt").write_text("".join(line + "\n" for line in inputs), encoding="utf-8")
    refs = (root / "valid.tgt").read_text(encoding="utf-8").splitlines()
    refs.insert(5, "")
    (root / "refs.txt").write_text("".join(line + "\n" for line in refs), encoding="utf-8")
    return {"root": root, "model": str(root / "run" / "best.pt"), "inputs": inputs}


def torchrun(args: list[str], processes: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={processes}", "-m", "nmt.cli.translate", *args],
                          env=env, capture_output=True, text=True, timeout=240)


def assert_same_translations(one_out: Path, two_out: Path, one_report: Path, two_report: Path, n: int) -> None:
    """The same texts, n-best lists, certificates and support sizes in input order; scores within
    float32 rounding (a process caches each target token's input products when the token first
    arrives, rounded as the kernel sums for that many new tokens: other batches first, other bits)."""
    def split(line: str) -> tuple[str, float]:  # -with_score: text TAB score (an empty input: an empty line)
        text, _, score = line.partition("\t")
        return text, float(score) if score else 0.0
    one = [split(x) for x in one_out.read_text(encoding="utf-8").splitlines()]
    two = [split(x) for x in two_out.read_text(encoding="utf-8").splitlines()]
    assert [t for t, _ in one] == [t for t, _ in two] and len(one) == 2 * n  # -n_best 2
    assert [s for _, s in two] == pytest.approx([s for _, s in one], rel=1e-5, abs=2e-5)  # printed to 5 places
    records = [[json.loads(x) for x in path.read_text().splitlines()] for path in (one_report, two_report)]
    for a, b in zip(*records):
        for key in ("id", "certified", "n_nonzero", "reason", "cut"):
            assert a[key] == b[key], (a["id"], key)
        assert [h["text"] for h in a["nbest"]] == [h["text"] for h in b["nbest"]]
        assert [h["logprob"] for h in b["nbest"]] == pytest.approx([h["logprob"] for h in a["nbest"]], rel=1e-5, abs=1e-6)
    assert len(records[1]) == n and any(r["certified"] for r in records[1])


def test_two_processes_write_one_processs_outputs(trained, capsys, tmp_path):
    root = trained["root"]
    common = ["-model", trained["model"], "-src", str(root / "input.txt"), "-beam_size", "3", "-n_best", "2",
              "-with_score", "-batch_size", "4", "-max_length", "10", "-threads", "1"]
    one = ["-output", str(tmp_path / "one.txt"), "-report", str(tmp_path / "one.jsonl")]
    code, _, err = translate(common + one, capsys)
    assert code == 0, err
    two = ["-output", str(tmp_path / "two.txt"), "-report", str(tmp_path / "two.jsonl"), "-tgt",
           str(root / "refs.txt")]
    run = torchrun(common + two)
    assert run.returncode == 0, run.stderr
    assert_same_translations(tmp_path / "one.txt", tmp_path / "two.txt", tmp_path / "one.jsonl",
                             tmp_path / "two.jsonl", len(trained["inputs"]))
    assert "(2 processes; search time: the slowest's)" in run.stderr
    assert run.stderr.count("exact match") == 1  # the metrics against -tgt: rank 0 alone
    # score mode: the same scores
    score = ["-mode", "score", "-tgt", str(root / "refs.txt")]
    code, _, err = translate(common[:4] + score + ["-output", str(tmp_path / "one.scores")], capsys)
    assert code == 0, err
    run = torchrun(common[:4] + score + ["-output", str(tmp_path / "two.scores"), "-batch_size", "4"])
    assert run.returncode == 0, run.stderr
    one_scores = (tmp_path / "one.scores").read_text().splitlines()
    assert len(one_scores) == len(trained["inputs"])
    assert (tmp_path / "two.scores").read_bytes() == (tmp_path / "one.scores").read_bytes()  # no cache there


def test_the_shards_cover_the_input_once(trained):
    """Translator.translate(shard=...) of each rank: every input decoded by exactly one of them."""
    import nmt
    from nmt.translate.translator import Translator

    model = nmt.load(trained["model"], device="cpu")
    translator = Translator(model.decoder, model.src_field, model.tgt_field, model.options, batch_size=4,
                            beam_size=3, max_length=10, n_best=2)
    lines = trained["inputs"]
    shards = [translator.translate(lines, shard=(rank, 2)) for rank in range(2)]
    whole = translator.translate(lines)
    for i, t in enumerate(whole):
        mine = [s[i] for s in shards if s[i] is not None]
        assert len(mine) == 1 or (lines[i] == "" and len(mine) == 2), i  # an empty line: every rank's
        assert [h[0] for h in mine[0].hypotheses] == [h[0] for h in t.hypotheses]
        assert mine[0].certified == t.certified and mine[0].n_nonzero == t.n_nonzero
    assert all(any(s[i] is None for s in shards) for i, line in enumerate(lines) if line)  # both ranks worked
    with pytest.raises(ValueError, match=r"shard \(2, 2\)"):
        translator.translate(lines, shard=(2, 2))


def test_a_stream_under_torchrun_is_one_line_error(trained, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    code, _, err = translate(["-model", trained["model"], "-src", "-", "-output", "-"], capsys)
    assert code == 2
    assert err.strip().splitlines() == ["nmt-translate: error: -src -: standard input is translated by one process; "
                                        "under torchrun name an input file (every process decodes its share of it)"]
