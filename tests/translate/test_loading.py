"""Rebuilding a model from a checkpoint: errors are one line naming the file and what is wrong."""
import pytest
import torch

from nmt.data.field import Field
from nmt.data.tokenizers import CharTokenizer, SpaceTokenizer
from nmt.models import build_model
from nmt.translate.loading import load_model
from nmt.utils.checkpoint_file import CheckpointError, save_checkpoint

MODEL = {
    "type": "rnn",
    "embeddings": {"src_size": 4, "tgt_size": 4, "share": False, "tie_output": False, "dropout": 0.0},
    "encoder": {"type": "lstm", "layers": 1, "hidden_size": 6, "bidirectional": True, "dropout": 0.0},
    "decoder": {"type": "lstm", "layers": 1, "hidden_size": 6, "dropout": 0.0, "input_feeding": True,
                "bridge": "linear"},
    "attention": {"score": "general", "mapping": "entmax15", "params": {}, "continuous": None},
    "output": {"mapping": "entmax15", "params": {}},
}


def released_model(tmp_path, mutate=None):
    src = Field.build(SpaceTokenizer(), ["a b c", "b c d"])
    tgt = Field.build(CharTokenizer(), ["abc", "cd"])
    model = build_model(MODEL, len(src.vocab), len(tgt.vocab), tgt.vocab.pad_index)
    payload = {"kind": "model", "model": model.state_dict(), "config": {"model": MODEL},
               "src_field": src.state_dict(), "tgt_field": tgt.state_dict(), "step": 3}
    if mutate is not None:
        mutate(payload)
    path = tmp_path / "model.pt"
    save_checkpoint(path, payload)
    return path


def test_a_released_model_loads(tmp_path):
    loaded = load_model(released_model(tmp_path))
    assert loaded.step == 3 and not loaded.model.training


FIRST = "src_embeddings.lut.weight"


@pytest.mark.parametrize("mutate,named", [
    (lambda p: p["model"].pop(FIRST), ["Missing key", FIRST]),
    (lambda p: p["model"].__setitem__("extra.weight", torch.zeros(2)), ["Unexpected key", "extra.weight"]),
    (lambda p: p["model"].__setitem__(FIRST, torch.zeros(3, 3)), ["size mismatch", FIRST]),
])
def test_weights_that_do_not_fit_name_the_weight_on_one_line(tmp_path, mutate, named):
    """torch's load_state_dict error puts the weight on its second line; only the first
    ('Error(s) in loading state_dict for Seq2Seq:') reached the message, naming nothing."""
    path = released_model(tmp_path, mutate)
    with pytest.raises(CheckpointError) as info:
        load_model(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: cannot rebuild the model (")
    assert all(text in message for text in named), message


def spm_model(tmp_path, name: str, model_file, lines) -> str:
    """A released model whose source side is the sentencepiece model ``model_file``."""
    from nmt.data.tokenizers import SentencePieceTokenizer

    def mutate(payload):
        src = Field.build(SentencePieceTokenizer(model_file=model_file), lines)
        tgt = Field.from_state_dict(payload["tgt_field"])
        model = build_model(MODEL, len(src.vocab), len(tgt.vocab), tgt.vocab.pad_index)
        payload.update(model=model.state_dict(), src_field=src.state_dict())

    folder = tmp_path / name
    folder.mkdir()
    return str(released_model(folder, mutate))


def test_an_ensemble_needs_the_same_tokenizers_by_content_not_path(tmp_path):
    """Members whose sentencepiece models are the same file at two paths decode together; members
    with other models are refused on one line naming both files and what differs (the vocabularies
    built from them could even agree, and the first member's tokenizer would read for both)."""
    from nmt.data.tokenizers import SentencePieceTokenizer
    from nmt.translate.loading import load_models

    lines = ["a b c d e", "b c d a", "c d e a b b", "d e e a c"] * 5
    models = []
    for size in (12, 11):
        tok = SentencePieceTokenizer(vocab_size=size, model_type="char" if size == 11 else "unigram")
        tok.train(lines)
        models.append(tok.model_proto)
    for name, proto in (("one.model", models[0]), ("copy.model", models[0]), ("other.model", models[1])):
        (tmp_path / name).write_bytes(proto)
    a = spm_model(tmp_path, "a", tmp_path / "one.model", lines)
    b = spm_model(tmp_path, "b", tmp_path / "copy.model", lines)
    c = spm_model(tmp_path, "c", tmp_path / "other.model", lines)
    decoder, src_field, _, members = load_models([a, b])
    assert len(members) == 2 and len(decoder) == 2
    with pytest.raises(CheckpointError) as info:
        load_models([a, b, c])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{c}: its src tokenizer differs from {a}'s (sentencepiece model_type: unigram vs char)")
