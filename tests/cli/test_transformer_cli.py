"""End to end with the Transformer: nmt-train (learned alphas, noam, accumulation) a few steps,
then nmt-translate with certificates, a report and heatmaps, alone and ensembled with an RNN."""
from __future__ import annotations

import json
import random

import pytest
import torch
import yaml

from nmt.cli import train as train_cli
from nmt.cli import translate as translate_cli

LETTERS = "abcdef"
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


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train(root, name: str, model: dict, **training) -> str:
    config = {
        "data": {"train": {"src": str(root / "train.src"), "tgt": str(root / "train.tgt")},
                 "valid": {"src": str(root / "valid.src"), "tgt": str(root / "valid.tgt")},
                 "src": {"tokenizer": {"type": "char"}}, "tgt": {"tokenizer": {"type": "char"}},
                 "shared_vocab": True},
        "model": model,
        "training": {"save_dir": str(root / name), "batch_size": 16, "max_steps": 20, "valid_every": 20,
                     "log_every": 10, "keep_last": 1, "progress": False, "threads": 1, "tensorboard": False,
                     "optimizer": {"name": "adam", "lr": 0.01}, **training},
        "validation": {"metric": "loss", "batch_size": 8, "max_length": 8, "n_heatmaps": 0},
    }
    (root / f"{name}.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert train_cli.main(["-config", str(root / f"{name}.yaml"), "-quiet"]) == 0
    return str(root / name / "last.pt")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("transformer_cli")
    rng = random.Random(0)
    for split, n in (("train", 80), ("valid", 6)):
        words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 4))) for _ in range(n)]
        (root / f"{split}.src").write_text("".join(w + "\n" for w in words), encoding="utf-8")
        (root / f"{split}.tgt").write_text("".join(w[::-1] + "\n" for w in words), encoding="utf-8")
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
