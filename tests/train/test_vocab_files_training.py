"""Vocabularies from files in training: nmt-train writes save_dir/vocab.src / vocab.tgt, and a run
reading them (data.<side>.vocab_file) has the same vocabularies, and so the same training."""
from __future__ import annotations

import os

import pytest
import torch

from nmt.config import ConfigError, resolve_config
from nmt.data import Vocabulary
from nmt.data.vocab_file import read_vocab_file
from nmt.train.checkpoint import load_checkpoint
from nmt.train.trainer import Trainer
from tiny_task import tiny_config, write_task


def train(config: dict) -> Trainer:
    trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab_run")
    torch.set_num_threads(1)
    data = write_task(root / "data")
    config = tiny_config(data, root / "first", device="cpu", max_steps=6, valid_every=3)
    return data, train(config)


def test_a_run_writes_its_vocabularies_with_counts(first_run):
    data, trainer = first_run
    save_dir = trainer.save_dir
    src_lines = open(data["train"]["src"], encoding="utf-8").read().splitlines()
    tgt_lines = open(data["train"]["tgt"], encoding="utf-8").read().splitlines()
    # independent count: the space tokens of the source, the characters of the target
    assert read_vocab_file(save_dir / "vocab.src") == Vocabulary.build(line.split() for line in src_lines)
    assert read_vocab_file(save_dir / "vocab.tgt") == Vocabulary.build(list(line) for line in tgt_lines)
    assert read_vocab_file(save_dir / "vocab.tgt").counts == {
        c: sum(line.count(c) for line in tgt_lines) for c in set("".join(tgt_lines))}
    assert oct(os.stat(save_dir / "vocab.src").st_mode & 0o777) == oct(0o666 & ~_umask())


def test_a_run_from_the_written_files_trains_identically(first_run, tmp_path):
    data, first = first_run
    config = tiny_config(data, tmp_path / "second", device="cpu", max_steps=6, valid_every=3)
    config["data"]["src"]["vocab_file"] = str(first.save_dir / "vocab.src")
    config["data"]["tgt"]["vocab_file"] = str(first.save_dir / "vocab.tgt")
    second = train(config)
    a, b = load_checkpoint(first.save_dir / "last.pt"), load_checkpoint(tmp_path / "second" / "last.pt")
    assert a["src_field"] == b["src_field"] and a["tgt_field"] == b["tgt_field"]
    for name, value in a["model"].items():  # same ids, same seed: the same training
        assert torch.equal(value, b["model"][name]), name
    # the second run writes the same files back (counts included)
    for name in ("vocab.src", "vocab.tgt"):
        assert (tmp_path / "second" / name).read_bytes() == (first.save_dir / name).read_bytes()


def test_min_freq_and_max_size_apply_to_a_counted_file(first_run, tmp_path):
    data, first = first_run
    config = tiny_config(data, tmp_path / "run", device="cpu", max_steps=1, valid_every=1)
    config["data"]["src"].update(vocab_file=str(first.save_dir / "vocab.src"), min_freq=20, max_size=3)
    trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
    src_lines = open(data["train"]["src"], encoding="utf-8").read().splitlines()
    assert trainer.data.src_field.vocab == Vocabulary.build((line.split() for line in src_lines), 20, 3)
    assert len(trainer.data.src_field.vocab) == 4 + 3  # of the 5 tokens counted 20 times or more
    trainer.lock.release()


def test_a_vocabulary_file_with_unseen_and_missing_tokens(first_run, tmp_path):
    data, _ = first_run
    (tmp_path / "src.vocab").write_text("z\nb\na\n<unk>\n", encoding="utf-8")  # no c..f: those are <unk>
    config = tiny_config(data, tmp_path / "run", device="cpu", max_steps=2, valid_every=2)
    config["data"]["src"]["vocab_file"] = str(tmp_path / "src.vocab")
    trainer = train(config)
    vocab = trainer.data.src_field.vocab
    assert vocab.itos == ["<pad>", "<unk>", "<bos>", "<eos>", "z", "b", "a"]
    assert trainer.data.src_field.encode("a c z") == [6, 1, 4]
    assert (tmp_path / "run" / "vocab.src").read_text(encoding="utf-8") == "z\nb\na\n"  # no counts to write


def test_id_cache_reads_the_vocabulary_file_too(first_run, tmp_path):
    data, first = first_run
    config = tiny_config(data, tmp_path / "run", device="cpu", max_steps=1, valid_every=1)
    config["data"]["id_cache"] = True
    config["data"]["tgt"]["vocab_file"] = str(first.save_dir / "vocab.tgt")
    config["data"]["tgt"]["max_size"] = 2
    trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
    assert trainer.data.tgt_field.vocab == read_vocab_file(first.save_dir / "vocab.tgt", max_size=2)
    trainer.lock.release()


def test_shared_vocab_takes_the_src_file(first_run, tmp_path):
    data, first = first_run
    (tmp_path / "joint").write_text("a 5\nb 4\nc 3\n", encoding="utf-8")
    config = tiny_config(data, tmp_path / "run", device="cpu", max_steps=1, valid_every=1)
    config["data"]["shared_vocab"] = True
    config["data"]["src"]["vocab_file"] = str(tmp_path / "joint")
    trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
    assert trainer.data.src_field.vocab.itos[4:] == trainer.data.tgt_field.vocab.itos[4:] == ["a", "b", "c"]
    trainer.lock.release()
    config["data"]["tgt"]["vocab_file"] = str(first.save_dir / "vocab.tgt")
    with pytest.raises(ConfigError, match=r"tiny.yaml: data.tgt.vocab_file: with data.shared_vocab"):
        resolve_config(config, "tiny.yaml")


def test_a_bad_vocabulary_file_is_one_line_naming_file_and_line(first_run, tmp_path, capsys):
    import yaml

    from nmt.cli.train import main

    data, _ = first_run
    (tmp_path / "v").write_text("a\t3\nb\t2\na\t1\n", encoding="utf-8")
    config = tiny_config(data, tmp_path / "run", device="cpu", max_steps=1, valid_every=1)
    config["data"]["src"]["vocab_file"] = str(tmp_path / "v")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["-config", str(tmp_path / "c.yaml"), "-quiet"]) == 2
    assert capsys.readouterr().err == f"nmt-train: error: {tmp_path / 'v'}:3: duplicate token 'a' (first on line 1)\n"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_vocabulary_the_format_cannot_hold_is_not_written_and_training_goes_on(tmp_path, caplog, monkeypatch):
    """A token that would read back as another (here one ending in a carriage return, without
    counts) leaves that file unwritten with a one-line warning naming file and token; the other
    side's file is written and reads back as its vocabulary; a fresh run removes an older file of
    the unwritable name (it is not this run's)."""
    import logging

    from nmt.data.field import Field
    from nmt.data.tokenizers import build_tokenizer
    from nmt.train.data_setup import write_run_vocabularies

    tok = build_tokenizer({"type": "char"})
    good, bad = Field(tok, Vocabulary(["a", "b"])), Field(tok, Vocabulary(["a\r", "b"]))
    (tmp_path / "vocab.tgt").write_text("stale\n", encoding="utf-8")
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # an earlier CLI test's setup_logging turns it off
    with caplog.at_level(logging.WARNING, logger="nmt"):
        written = write_run_vocabularies(tmp_path, good, bad, fresh=True)
    assert written == [tmp_path / "vocab.src"]
    assert read_vocab_file(tmp_path / "vocab.src").itos == good.vocab.itos
    assert not (tmp_path / "vocab.tgt").exists()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"{tmp_path / 'vocab.tgt'}: token 'a\\r' cannot be written") and "\n" not in warning
