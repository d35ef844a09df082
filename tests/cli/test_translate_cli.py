"""End to end: train a tiny model with the real nmt-train, then translate with nmt-translate."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch
import yaml

from nmt.cli import train as train_cli
from nmt.cli import translate as translate_cli

LETTERS = "abcdef"


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A tiny reversal model ('a b c' -> 'cba') with entmax15 attention and output."""
    root = tmp_path_factory.mktemp("translate_cli")
    rng = random.Random(0)
    for split, n in (("train", 120), ("valid", 8)):
        words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 4))) for _ in range(n)]
        (root / f"{split}.src").write_text("".join(" ".join(w) + "\n" for w in words), encoding="utf-8")
        (root / f"{split}.tgt").write_text("".join(w[::-1] + "\n" for w in words), encoding="utf-8")
    config = {
        "data": {"train": {"src": str(root / "train.src"), "tgt": str(root / "train.tgt")},
                 "valid": {"src": str(root / "valid.src"), "tgt": str(root / "valid.tgt")},
                 "src": {"tokenizer": {"type": "space"}}, "tgt": {"tokenizer": {"type": "char"}}},
        "model": {"embeddings": {"src_size": 12, "tgt_size": 12, "dropout": 0.0},
                  "encoder": {"layers": 1, "hidden_size": 16, "dropout": 0.0},
                  "decoder": {"layers": 1, "hidden_size": 16, "dropout": 0.0},
                  "attention": {"mapping": "entmax15"}, "output": {"mapping": "entmax15"}},
        "training": {"save_dir": str(root / "run"), "batch_size": 16, "max_steps": 60, "valid_every": 60,
                     "log_every": 60, "keep_last": 1, "progress": False, "threads": 1,
                     "optimizer": {"name": "adam", "lr": 0.01}},
        "validation": {"metric": "loss", "batch_size": 8, "max_length": 8, "n_heatmaps": 0},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert train_cli.main(["-config", str(root / "config.yaml"), "-quiet"]) == 0
    inputs = (root / "valid.src").read_text(encoding="utf-8").splitlines()
    inputs.insert(3, "")  # an empty line must stay aligned
    (root / "input.txt").write_text("".join(line + "\n" for line in inputs), encoding="utf-8")
    refs = (root / "valid.tgt").read_text(encoding="utf-8").splitlines()
    refs.insert(3, "")
    (root / "refs.txt").write_text("".join(line + "\n" for line in refs), encoding="utf-8")
    return {"root": root, "model": str(root / "run" / "best.pt"), "inputs": inputs}


def translate(args: list[str], capsys) -> tuple[int, str, str]:
    code = translate_cli.main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_outputs_report_heatmaps_and_summary(trained, capsys):
    root = trained["root"]
    out, report, att = root / "out.txt", root / "report.jsonl", root / "att"
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out),
                              "-report", str(report), "-tgt", str(root / "refs.txt"), "-attention", str(att),
                              "-support", "-beam_size", "3", "-max_length", "10"], capsys)
    assert code == 0, err
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(trained["inputs"]) and lines[3] == ""
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == list(range(len(trained["inputs"])))
    for i, r in enumerate(records):
        assert set(r) >= {"id", "exact", "n_nonzero", "mass", "reason", "nbest"}
        if i == 3:
            assert r["nbest"] == [] and r["reason"] == "empty_input"
            continue
        assert r["nbest"][0]["text"] == lines[i]
        assert (r["reason"] is None) == r["exact"]
        assert 0.0 < r["mass"] <= 1.0 + 1e-5
        if r["exact"]:  # all sequences of nonzero probability found: their mass is 1
            assert r["mass"] == pytest.approx(1.0, abs=1e-4)
            assert r["n_nonzero"] >= 1
        assert len(r["support"]) == len(lines[i]) + 1  # one step per character, and EOS
        for step in r["support"]:
            assert 1 <= step["size"] and sum(p for _, p in step["tokens"]) == pytest.approx(1.0, abs=1e-4)
    pngs = sorted(p.name for p in att.iterdir())
    assert len(pngs) == len(trained["inputs"]) - 1 and "3.png" not in pngs
    assert (att / "0.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "exact" in err and "sentences/s" in err and "BLEU" in err and "exact match" in err


def test_cli_equals_direct_search(trained, capsys):
    """The CLI's batching, sorting and detokenizing reproduce a direct call per sentence."""
    from nmt.translate.beam_search import beam_search
    from nmt.translate.loading import load_model

    root = trained["root"]
    out = root / "direct.txt"
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out),
                              "-beam_size", "4", "-batch_size", "3", "-quiet"], capsys)
    assert code == 0, err
    assert err == ""
    loaded = load_model(trained["model"])
    vocab = loaded.tgt_field.vocab
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    for line, src in zip(lines, trained["inputs"]):
        if not src:
            assert line == ""
            continue
        ids = torch.tensor([loaded.src_field.encode(src)])
        r = beam_search(loaded.model, ids, torch.tensor([ids.size(1)]), bos=vocab.bos_index, eos=vocab.eos_index,
                        pad=vocab.pad_index, beam_size=4, max_length=100)
        assert line == loaded.tgt_field.decode(r.tokens[0, 0])


def test_nbest_and_ensemble(trained, capsys):
    root = trained["root"]
    single, double = root / "single.txt", root / "double.txt"
    args = ["-src", str(root / "input.txt"), "-n_best", "2", "-beam_size", "3", "-quiet"]
    assert translate(["-model", trained["model"], "-output", str(single)] + args, capsys)[0] == 0
    code, _, err = translate(["-model", trained["model"], trained["model"], "-output", str(double)] + args, capsys)
    assert code == 0, err
    lines = single.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 2 * len(trained["inputs"])
    assert lines[6:8] == ["", ""]  # the empty input line, twice
    # an ensemble of a model with itself has the model's distribution
    assert double.read_text(encoding="utf-8") == single.read_text(encoding="utf-8")


@pytest.mark.parametrize("kind", ["garbage", "version", "missing"])
def test_bad_checkpoint_is_a_one_line_error(trained, capsys, kind):
    root = trained["root"]
    bad = root / f"bad_{kind}.pt"
    if kind == "garbage":
        bad.write_bytes(b"this is not a checkpoint")
    elif kind == "version":
        payload = torch.load(trained["model"], weights_only=True)
        payload["format_version"] = 999
        torch.save(payload, bad)
    code, out, err = translate(["-model", str(bad), "-src", str(root / "input.txt"), "-output",
                                str(root / "never.txt")], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and str(bad) in err and err.startswith("nmt-translate: error:")
    assert not (root / "never.txt").exists()


def test_bad_source_file_is_a_one_line_error(trained, capsys):
    root = trained["root"]
    bad = root / "latin1.txt"
    bad.write_bytes(b"a b\n\xe9 c\n")
    code, _, err = translate(["-model", trained["model"], "-src", str(bad)], capsys)
    assert code == 2 and err.count("\n") == 1 and f"{bad}:2:" in err


def test_entry_point_reads_stdin_and_writes_stdout(trained):
    """The installed program (python -m) with -src - and -output -."""
    env = {k: v for k, v in os.environ.items()}
    proc = subprocess.run(
        [sys.executable, "-m", "nmt.cli.translate", "-model", trained["model"], "-src", "-", "-output", "-",
         "-beam_size", "2", "-threads", "1"],
        input="a b c\n\nf e\n", capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    assert "start-up" in proc.stderr


def test_ensemble_of_different_vocabularies_is_refused(trained, capsys):
    root = trained["root"]
    payload = torch.load(trained["model"], weights_only=True)
    itos = payload["tgt_field"]["vocab"]["itos"]
    itos[-1], itos[-2] = itos[-2], itos[-1]  # same size, different vocabulary
    other = root / "other_vocab.pt"
    torch.save(payload, other)
    code, _, err = translate(["-model", trained["model"], str(other), "-src", str(root / "input.txt")], capsys)
    assert code == 2 and err.count("\n") == 1 and str(other) in err and "vocabulary" in err


@pytest.mark.parametrize("flags, expected", [
    (["-length_alpha", "nan"], "nmt-translate: error: -length_alpha must be a finite number, got nan\n"),
    (["-length_alpha", "inf"], "nmt-translate: error: -length_alpha must be a finite number, got inf\n"),
    (["-device", "tpu"], "nmt-translate: error: -device tpu: not a usable device here (cpu, cuda or cuda:N); "),
    (["-device", "meta"], "nmt-translate: error: -device meta: not a usable device here (cpu, cuda or cuda:N); "
                          "the meta device holds no data\n"),
])
def test_bad_flag_values_are_one_line_errors(trained, capsys, tmp_path, flags, expected):
    out = tmp_path / "out.txt"
    code, _, err = translate(["-model", trained["model"], "-src", str(trained["root"] / "input.txt"),
                              "-output", str(out), *flags], capsys)
    assert code == 2 and err.startswith(expected) and err.count("\n") == 1 and not out.exists()


def test_device_defaults_to_auto_and_resolves_on_this_machine():
    args = translate_cli.build_parser().parse_args(["-model", "m.pt", "-src", "in.txt"])
    assert args.device == "auto" and args.batch_type == "sentences" and args.precision == "fp32"


def test_token_batches_and_static_search_give_the_same_translations(trained, capsys):
    """-batch_type tokens (other batches, still sorted by length) and -search_mode static change
    neither the outputs nor the certificates, in input order."""
    root = trained["root"]
    runs = {}
    for name, extra in (("default", []), ("tokens", ["-batch_type", "tokens", "-batch_size", "12"]),
                        ("static", ["-search_mode", "static", "-stop_every", "3", "-batch_size", "5"])):
        out, report = root / f"out_{name}.txt", root / f"report_{name}.jsonl"
        code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out),
                                  "-report", str(report), "-beam_size", "3", "-max_length", "10", "-quiet"] + extra,
                                 capsys)
        assert code == 0, err
        records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
        runs[name] = (out.read_text(encoding="utf-8"), [(r["exact"], r["reason"], r["n_nonzero"],
                                                          [h["text"] for h in r["nbest"]]) for r in records])
    assert runs["tokens"] == runs["default"]
    assert runs["static"] == runs["default"]


def test_bf16_precision_runs_the_model_under_autocast(trained):
    """-precision bf16: the model's products run in bfloat16 (scores move by rounding only)."""
    from nmt.translate.loading import load_models
    from nmt.translate.translator import Translator

    decoder, src_field, tgt_field, _ = load_models([trained["model"]], "cpu")
    lines = [line for line in trained["inputs"] if line]
    out = {p: Translator(decoder, src_field, tgt_field, batch_size=4, precision=p, beam_size=3,
                         max_length=10).translate(lines) for p in ("fp32", "bf16")}
    fp32 = [t.hypotheses[0][1] for t in out["fp32"]]
    bf16 = [t.hypotheses[0][1] for t in out["bf16"]]
    assert fp32 != bf16  # autocast took effect
    same = [a for a, b in zip(out["fp32"], out["bf16"]) if a.text == b.text]
    assert len(same) >= len(lines) // 2
    for a, b in zip(out["fp32"], out["bf16"]):
        if a.text == b.text:
            assert b.hypotheses[0][1] == pytest.approx(a.hypotheses[0][1], abs=0.1 + 0.05 * abs(a.hypotheses[0][1]))
    with pytest.raises(ValueError, match=r"^precision must be one of fp32, bf16, fp16, got 'fp8'$"):
        Translator(decoder, src_field, tgt_field, precision="fp8")
