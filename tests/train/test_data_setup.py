"""Fields built from training pairs: separate, shared vocabulary, shared tokenizer."""
import pytest

from nmt.data.tokenizers import build_tokenizer
from nmt.train.data_setup import build_fields

PAIRS = [("das haus ist klein", "the house is small"), ("das haus ist gross", "the house is big"),
         ("ein kleines haus", "a small house")] * 5


def _config(**data):
    side = {"tokenizer": {"type": "bpe", "merges": 20}, "min_freq": 1, "max_size": None}
    return {"src": dict(side), "tgt": dict(side), "shared_vocab": False, "shared_tokenizer": False, **data}


def _types(field):
    return {field.vocab.itos[i] for i in range(len(field.vocab))}


def test_shared_tokenizer_has_one_model_and_a_vocabulary_per_side(tmp_path):
    src, tgt = build_fields(_config(shared_tokenizer=True), PAIRS, tmp_path)
    assert src.tokenizer is tgt.tokenizer
    joint_tokens = {tok for s, t in PAIRS for tok in src.tokenize(s) + tgt.tokenize(t)}
    src_tokens = {tok for s, _ in PAIRS for tok in src.tokenize(s)}
    tgt_tokens = {tok for _, t in PAIRS for tok in tgt.tokenize(t)}
    specials = _types(src) - src_tokens
    assert _types(src) - specials == src_tokens and _types(tgt) - specials == tgt_tokens
    assert src_tokens | tgt_tokens == joint_tokens and not (tgt_tokens <= src_tokens)
    # the one model is the one learned from both sides' text together
    joint = build_tokenizer({"type": "bpe", "merges": 20})
    joint.train([s for s, _ in PAIRS] + [t for _, t in PAIRS], None)
    assert all(tgt.tokenize(t) == joint.tokenize(t) and src.tokenize(s) == joint.tokenize(s) for s, t in PAIRS)


def test_shared_vocabulary_is_one_field(tmp_path):
    src, tgt = build_fields(_config(shared_vocab=True), PAIRS, tmp_path)
    assert src is tgt


def test_separate_tokenizers_learn_from_their_own_side(tmp_path):
    src, tgt = build_fields(_config(), PAIRS, tmp_path)
    assert src.tokenizer is not tgt.tokenizer
    assert not ({"the", "house"} & _types(src))


def _cli_run(tmp_path, capsys, edit, **data_changes):
    """nmt-train on the tiny task after ``edit(data_dir)``; returns (exit code, stderr lines)."""
    import sys
    from pathlib import Path

    import yaml

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_task import tiny_config, write_task

    from nmt.cli.train import main

    data = write_task(tmp_path / "data")
    edit(tmp_path / "data")
    config = tiny_config(data, tmp_path / "run", max_steps=None, max_epochs=2)
    for side, values in data_changes.items():
        config["data"][side].update(values)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    code = main(["-config", str(tmp_path / "c.yaml"), "-quiet"])
    return code, capsys.readouterr().err.strip().splitlines()


def test_empty_training_files_are_a_one_line_error(tmp_path, capsys):
    def empty(d):
        (d / "train.src").write_text("")
        (d / "train.tgt").write_text("")
    code, err = _cli_run(tmp_path, capsys, empty)
    d = tmp_path / "data"
    assert code == 2 and err == [f"nmt-train: error: {d}/train.src, {d}/train.tgt: no training pairs: 0 lines, "
                                 "none with text on both sides"]
    assert not (tmp_path / "run" / "last.pt").exists()


def test_every_pair_too_long_names_the_count_and_the_limit(tmp_path, capsys):
    code, err = _cli_run(tmp_path, capsys, lambda d: None, src={"max_length": 1})  # sources have 2-5 tokens
    d = tmp_path / "data"
    assert code == 2 and err == [f"nmt-train: error: {d}/train.src, {d}/train.tgt: no training pairs left: all 40 "
                                 "dropped (0 empty, 40 too long; data.src.max_length=1, data.tgt.max_length=50)"]


def test_blank_validation_file_is_an_error_before_training(tmp_path, capsys):
    def blank(d):
        (d / "valid.src").write_text("\n \n\n")
        (d / "valid.tgt").write_text("x\n\n\n")
    code, err = _cli_run(tmp_path, capsys, blank)
    d = tmp_path / "data"
    assert code == 2 and err == [f"nmt-train: error: {d}/valid.src, {d}/valid.tgt: no validation pairs: 3 lines, "
                                 "3 of them empty (a pair needs tokens on both sides)"]
    assert not (tmp_path / "run" / "last.pt").exists()


def test_id_cache_trains_exactly_like_the_list_dataset(tmp_path):
    import torch

    from nmt.config import resolve_config
    from nmt.train.checkpoint import load_checkpoint
    from nmt.train.trainer import Trainer
    from tiny_task import tiny_config, write_task

    data = write_task(tmp_path / "data", n_train=30)
    weights = {}
    for cached in (False, True):
        # on the CPU wherever CUDA is: two runs compared bit for bit need deterministic kernels (on
        # CUDA cuDNN's LSTM backward and atomic embedding / scatter backward may differ run to run)
        config = tiny_config(data, tmp_path / f"run_{cached}", max_steps=5, valid_every=5, device="cpu")
        config["data"]["id_cache"] = cached
        trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
        assert type(trainer.data.train).__name__ == ("ArrayParallelDataset" if cached else "ParallelDataset")
        trainer.train()
        weights[cached] = load_checkpoint(tmp_path / f"run_{cached}" / "last.pt")["model"]
    assert (tmp_path / "data" / ".nmt_id_cache").is_dir()
    for name, value in weights[False].items():
        assert torch.equal(value, weights[True][name]), name
    # resumed (fields from the checkpoint): the cache is reused, the text not re-encoded
    config["training"]["max_steps"] = 6
    assert Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml").train().step == 6
    assert len(list((tmp_path / "data" / ".nmt_id_cache").iterdir())) == 1


@pytest.mark.parametrize("shared", ["none", "shared_vocab", "shared_tokenizer"])
def test_streamed_fields_equal_the_list_built_ones(tmp_path, shared):
    from nmt.data.dataset import read_parallel
    from nmt.train.data_setup import streamed_fields
    from tiny_task import write_task

    data = write_task(tmp_path / "data", n_train=50)
    config = _config(train=data["train"], valid=data["valid"], src={"tokenizer": {"type": "space"}, "min_freq": 2,
                                                                 "max_size": None, "max_length": 50},
                     tgt={"tokenizer": {"type": "char"}, "min_freq": 1, "max_size": 4, "max_length": 50})
    config["shared_vocab"] = shared == "shared_vocab"
    config["shared_tokenizer"] = shared == "shared_tokenizer"
    expected = build_fields(config, read_parallel(data["train"]["src"], data["train"]["tgt"]), tmp_path / "w")
    streamed = streamed_fields(config)
    for a, b in zip(expected, streamed):
        assert a.state_dict() == b.state_dict()
