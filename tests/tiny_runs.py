"""Tiny models trained by the real nmt-train for the end-to-end tests (tests/conftest.py, tests/cli,
tests/translate, tests/tools): the letter-reversal corpus most of them learn, a config's data
section over a directory's train / valid files, the reversal RNN of the alignment and coverage
tests, the run itself, and nmt-translate's main run in the test process. Importable as
``tiny_runs`` (tests/ is on the path of every test)."""
from __future__ import annotations

import random
from pathlib import Path

import torch
import yaml

LETTERS = "abcdef"


def write_reversal(root: Path, n_train: int, n_valid: int, max_letters: int = 4, spaced_source: bool = True,
                   spaced_target: bool = False, seed: int = 0) -> None:
    """``root / {train,valid}.{src,tgt}``: ``n_train`` / ``n_valid`` words of 2 to ``max_letters``
    letters drawn from one ``random.Random(seed)`` (train first), the target each word reversed;
    a side ``spaced`` holds its letters apart (``a b c``), else as one token (``abc``)."""
    rng = random.Random(seed)
    for split, n in (("train", n_train), ("valid", n_valid)):
        words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(2, max_letters))) for _ in range(n)]
        (root / f"{split}.src").write_text("".join(_spelled(w, spaced_source) for w in words), encoding="utf-8")
        (root / f"{split}.tgt").write_text("".join(_spelled(w[::-1], spaced_target) for w in words), encoding="utf-8")


def _spelled(word: str, spaced: bool) -> str:
    """``word`` as a line: its letters apart (``a b c``) where ``spaced``, else as it is."""
    return (" ".join(word) if spaced else word) + "\n"


def data_section(root: Path, src_tokenizer: str, tgt_tokenizer: str) -> dict:
    """A config's ``data`` section: ``root / {train,valid}.{src,tgt}`` with a tokenizer type per side."""
    return {"train": {"src": str(root / "train.src"), "tgt": str(root / "train.tgt")},
            "valid": {"src": str(root / "valid.src"), "tgt": str(root / "valid.tgt")},
            "src": {"tokenizer": {"type": src_tokenizer}}, "tgt": {"tokenizer": {"type": tgt_tokenizer}}}


def tiny_rnn_config(root: Path, src_tokenizer: str, tgt_tokenizer: str, steps: int, *, size: int = 12,
                    hidden: int = 16, attention: str = "entmax15", output: str = "entmax15", batch_size: int = 16,
                    lr: float = 0.01, valid_batch_size: int = 8, max_length: int = 8) -> dict:
    """A one-layer LSTM encoder-decoder (embeddings ``size``, ``hidden`` units a side, no dropout,
    ``attention`` / ``output`` mappings) on ``root``'s files, trained ``steps`` updates of
    ``batch_size`` sentences (Adam, ``lr``, one thread, validated and saved once at the end, one
    checkpoint kept) into ``root / "run"``; validation by loss, decoding to ``max_length``."""
    return {
        "data": data_section(root, src_tokenizer, tgt_tokenizer),
        "model": {"embeddings": {"src_size": size, "tgt_size": size, "dropout": 0.0},
                  "encoder": {"layers": 1, "hidden_size": hidden, "dropout": 0.0},
                  "decoder": {"layers": 1, "hidden_size": hidden, "dropout": 0.0},
                  "attention": {"mapping": attention}, "output": {"mapping": output}},
        "training": {"save_dir": str(root / "run"), "batch_size": batch_size, "max_steps": steps,
                     "valid_every": steps, "log_every": steps, "keep_last": 1, "progress": False, "threads": 1,
                     "optimizer": {"name": "adam", "lr": lr}},
        "validation": {"metric": "loss", "batch_size": valid_batch_size, "max_length": max_length, "n_heatmaps": 0},
    }


def reversal_rnn_config(root: Path, src_tokenizer: str, tgt_tokenizer: str, steps: int,
                        tgt_vocab: dict | None = None) -> dict:
    """The reversal RNN (embeddings 16, one LSTM layer of 24 a side, sparsemax attention, entmax15
    output) on ``root``'s files, trained ``steps`` updates of 16 sentences (Adam, lr 0.02) into
    ``root / "run"``; ``tgt_vocab``: keys added to the target side's section (e.g. ``max_size``)."""
    config = tiny_rnn_config(root, src_tokenizer, tgt_tokenizer, steps, size=16, hidden=24, attention="sparsemax",
                             lr=0.02, max_length=12)
    config["data"]["tgt"].update(tgt_vocab or {})
    return config


def train_run(config: dict, path: Path) -> Path:
    """Writes ``config`` as YAML to ``path`` and trains it with nmt-train's ``main`` (``-quiet``),
    asserting it succeeds; torch's thread count (which the run sets) restored after it. Returns the
    run directory (``training.save_dir``)."""
    from nmt.cli import train as train_main

    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    threads = torch.get_num_threads()
    try:
        assert train_main.main(["-config", str(path), "-quiet"]) == 0
    finally:
        torch.set_num_threads(threads)
    return Path(config["training"]["save_dir"])


def translate_main(args: list[str], capsys) -> tuple[int, str, str]:
    """nmt-translate's ``main(args)`` in this process: its exit code and what it wrote to stdout
    and stderr (read, and so emptied, from pytest's ``capsys``)."""
    from nmt.cli import translate as translate_cli

    code = translate_cli.main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
