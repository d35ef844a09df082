"""End to end with the Transformer: nmt-train (learned alphas, noam, accumulation) a few steps,
then nmt-translate with certificates, a report and heatmaps, alone and ensembled with an RNN."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from nmt.cli import train as train_cli
from nmt.cli import translate as translate_cli
from tiny_runs import data_section, train_run, write_reversal

TRANSFORMER = {
    "type": "transformer",
    "embeddings": {"dropout": 0.0, "share": True, "tie_output": True},
    "transformer": {"encoder_layers": 1, "decoder_layers": 2, "d_model": 16, "heads": 4, "d_ff": 32,
                    "dropout": 0.0, "attention_dropout": 0.0},
    "attention": {"mapping": "entmax_bisect", "params": {"alpha": "learned"}},
    "output": {"mapping": "entmax15"},
}
RNN = {"embeddings": {"src_size": 12, "tgt_size": 12, "dropout": 0.0},
       "encoder": {"layers": 1, "hidden_size": 16, "dropout": 0.0},
       "decoder": {"layers": 1, "hidden_size": 16, "dropout": 0.0},
       "attention": {"mapping": "entmax15"}, "output": {"mapping": "entmax15"}}


def train(root, name: str, model: dict, **training) -> str:
    config = {
        "data": {**data_section(root, "char", "char"), "shared_vocab": True},
        "model": model,
        "training": {"save_dir": str(root / name), "batch_size": 16, "max_steps": 20, "valid_every": 20,
                     "log_every": 10, "keep_last": 1, "progress": False, "threads": 1, "tensorboard": False,
                     "optimizer": {"name": "adam", "lr": 0.01}, **training},
        "validation": {"metric": "loss", "batch_size": 8, "max_length": 8, "n_heatmaps": 0},
    }
    return str(train_run(config, root / f"{name}.yaml") / "last.pt")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("transformer_cli")
    write_reversal(root, 80, 6, spaced_source=False)
    transformer = train(root, "transformer", TRANSFORMER, accumulate=2,
                        lr_schedule={"type": "noam", "warmup_steps": 5})
    rnn = train(root, "rnn", RNN)
    return {"root": root, "transformer": transformer, "rnn": rnn}


def test_train_then_translate_a_transformer(models, capsys):
    root = models["root"]
    record = json.loads((root / "transformer" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 20
    assert set(record["alphas"]) == {"encoder_self", "decoder_self", "cross"}
    assert all(1 < a <= 2 for layers in record["alphas"].values() for heads in layers for a in heads)
    assert "learned alphas, cross:" in (root / "transformer" / "train.log").read_text()
    out, report, att = root / "out.txt", root / "report.jsonl", root / "att"
    code = translate_cli.main(["-model", models["transformer"], "-src", str(root / "valid.src"), "-output",
                               str(out), "-report", str(report), "-attention", str(att), "-tgt",
                               str(root / "valid.tgt"), "-beam_size", "3", "-n_best", "2", "-max_length", "8"])
    assert code == 0, capsys.readouterr().err
    assert len(out.read_text(encoding="utf-8").splitlines()) == 12  # n_best 2
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 6
    for r in records:
        assert {"exact", "n_nonzero", "mass", "reason", "nbest"} <= set(r)
        assert r["exact"] == (r["reason"] is None) and len(r["nbest"]) == 2
    assert len(list(att.glob("*.png"))) >= 6


def test_ensemble_of_an_rnn_and_a_transformer(models, capsys):
    root = models["root"]
    out = root / "ensemble.txt"
    code = translate_cli.main(["-model", models["rnn"], models["transformer"], "-src", str(root / "valid.src"),
                               "-output", str(out), "-beam_size", "2", "-max_length", "8", "-quiet"])
    assert code == 0, capsys.readouterr().err
    assert len(out.read_text(encoding="utf-8").splitlines()) == 6


LEARNED = {**TRANSFORMER, "transformer": {**TRANSFORMER["transformer"], "positions": "learned", "max_positions": 10}}
FITS = {"src": {"tokenizer": {"type": "char"}, "max_length": 10}, "tgt": {"tokenizer": {"type": "char"}, "max_length": 9}}


def learned_config(root, name: str) -> dict:
    config = yaml.safe_load((root / "transformer.yaml").read_text(encoding="utf-8"))
    config["data"].update(FITS)
    config["model"] = LEARNED
    config["training"].update(save_dir=str(root / name), max_steps=2, valid_every=2)
    return config


@pytest.fixture(scope="module")
def learned(models) -> str:
    """A Transformer with 10 learned positions: sources of 10 tokens, BOS + 9 target tokens."""
    root = models["root"]
    return str(train_run(learned_config(root, "learned"), root / "learned.yaml") / "last.pt")


def test_learned_positions_lower_max_length_with_a_warning(models, learned, capsys):
    """-max_length 100 needs 101 decoder positions: fairseq caps it at what the model holds; so
    does nmt-translate, in one warning line (it failed mid-way: 'a sequence of 11 positions ...')."""
    root = models["root"]
    out = root / "learned.txt"
    for model in ([learned], [learned, models["rnn"]]):  # an ensemble: its smallest table
        code = translate_cli.main(["-model", *model, "-src", str(root / "valid.src"), "-output", str(out),
                                   "-beam_size", "2", "-max_length", "100", "-quiet"])
        err = capsys.readouterr().err
        assert code == 0, err
        assert err == ("nmt-translate: warning: -max_length 100 lowered to 9: the model's learned positions hold "
                       "BOS and 9 target tokens (model.transformer.max_positions=10)\n")
        assert len(out.read_text(encoding="utf-8").splitlines()) == 6
    code = translate_cli.main(["-model", learned, "-src", str(root / "valid.src"), "-output", str(out),
                               "-max_length", "9", "-quiet"])
    assert code == 0 and capsys.readouterr().err == ""  # fits: no word
    import nmt

    model = nmt.load(learned, device="cpu")  # the API's default max_length 100: searched as far as 9
    assert model.translate(["abc", "abcdefabcd"])[1].reason in (None, "max_length", "pruned")
    with pytest.raises(ValueError, match=r"^input 2: 11 source tokens, more than the learned positions hold"):
        model.translate(["abc", "abcdefabcde"])


def test_learned_positions_refuse_a_longer_source_naming_its_line(models, learned, capsys, tmp_path):
    root = models["root"]
    src = tmp_path / "long.src"
    src.write_text("abc\n\nabcdefabcde\nabcdefabcdefabcdef\n", encoding="utf-8")  # line 3: 11 characters
    out = tmp_path / "out.txt"
    code = translate_cli.main(["-model", learned, "-src", str(src), "-output", str(out), "-max_length", "9"])
    err = capsys.readouterr().err
    problem = "11 source tokens, more than the learned positions hold (model.transformer.max_positions=10)"
    assert code == 2 and err == f"nmt-translate: error: {src}:3: {problem}\n" and not out.exists()

    proc = subprocess.run([sys.executable, "-m", "nmt.cli.translate", "-model", learned, "-src", "-", "-output", "-",
                           "-max_length", "9", "-threads", "1", "-quiet"], input=src.read_text(encoding="utf-8"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.endswith(f"nmt-translate: error: <stdin>:3: {problem}\n")

    refs = tmp_path / "long.tgt"
    refs.write_text("cba\n\nabcdefabcd\nfedcba\n", encoding="utf-8")  # line 3: 10 target tokens + BOS
    ok = tmp_path / "ok.src"
    ok.write_text("abc\n\nabc\nabc\n", encoding="utf-8")
    code = translate_cli.main(["-model", learned, "-src", str(ok), "-tgt", str(refs), "-mode", "score"])
    err = capsys.readouterr().err
    assert code == 2 and err == (f"nmt-translate: error: {refs}:3: 10 target tokens need 11 decoder positions "
                                 "(BOS + tokens), more than the learned positions hold "
                                 "(model.transformer.max_positions=10)\n")


def test_learned_positions_refuse_a_longer_validation_pair_at_start(models, capsys):
    """Validation keeps every pair whole: one longer than the positions hold failed at the first
    validation; now at start, naming the validation file and line."""
    root = models["root"]
    config = learned_config(root, "learned_long_valid")
    valid = root / "long_valid.tgt"
    lines = (root / "valid.tgt").read_text(encoding="utf-8").splitlines()
    lines[4] = "abcdefabcd"  # 10 target tokens need 11 decoder positions
    valid.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    config["data"]["valid"]["tgt"] = str(valid)
    (root / "long_valid.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert train_cli.main(["-config", str(root / "long_valid.yaml"), "-quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (f"nmt-train: error: {valid}:5: 10 target tokens need 11 decoder positions (BOS + tokens), "
                   "more than the learned positions hold (model.transformer.max_positions=10)\n")
