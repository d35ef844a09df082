"""build_model: shared / tied embeddings, configuration errors, initialisation, state dict round trip."""
from __future__ import annotations

import io

import pytest
import torch
from tiny_models import PAD, SRC_VOCAB, TGT_VOCAB, model_cfg, random_batch

from nmt.models import ModelConfigError, build_model


def test_share_embeddings_uses_one_table():
    model = build_model(model_cfg(embeddings={"share": True}), 20, 20, PAD)
    assert model.src_embeddings is model.tgt_embeddings
    n_shared = sum(p.numel() for p in model.parameters())
    n_separate = sum(p.numel() for p in build_model(model_cfg(), 20, 20, PAD).parameters())
    assert n_separate - n_shared == 20 * 6


def test_tie_output_uses_target_embedding_as_generator_weight():
    model = build_model(model_cfg(embeddings={"tie_output": True}), SRC_VOCAB, TGT_VOCAB, PAD)
    assert model.generator.proj.weight is model.tgt_embeddings.weight
    src, src_lengths, tgt_in = random_batch()
    logits, _ = model(src, src_lengths, tgt_in)
    logits.sum().backward()
    assert model.tgt_embeddings.weight.grad is not None


@pytest.mark.parametrize(
    ("sections", "src_vocab", "tgt_vocab", "message"),
    [
        ({"embeddings": {"share": True}}, 13, 11, r"model\.embeddings\.share: .*13.*11"),
        ({"embeddings": {"share": True, "tgt_size": 4}}, 13, 13, r"model\.embeddings\.share: .*src_size == tgt_size"),
        ({"embeddings": {"tie_output": True, "tgt_size": 5}}, 13, 11,
         r"model\.embeddings\.tie_output: .*tgt_size == decoder\.hidden_size.*5 and 6"),
        ({"attention": {"score": "dot"}}, 13, 11, r"^model\.attention: score 'dot' needs"),
        ({"attention": {"score": "cosine"}}, 13, 11, r"^model\.attention: unknown score 'cosine'.*dot, general, mlp"),
        ({"decoder": {"bridge": "copy"}}, 13, 11, r"^model\.decoder\.bridge: bridge 'copy' needs.*2x8 and 2x6"),
        ({"decoder": {"bridge": "dense"}}, 13, 11, r"^model\.decoder\.bridge: unknown bridge 'dense'"),
        ({"encoder": {"type": "transformer"}}, 13, 11, r"^model\.encoder: unknown rnn type 'transformer'.*lstm, gru"),
        ({"decoder": {"type": "rnn"}}, 13, 11, r"^model\.decoder: unknown rnn type 'rnn'"),
        ({"encoder": {"hidden_size": 7}}, 13, 11, r"^model\.encoder: hidden_size must be even"),
        ({"attention": {"mapping": "spasemax"}}, 13, 11, r"^model\.attention: unknown mapping 'spasemax'.*'sparsemax'"),
        ({"attention": {"mapping": "entmax_bisect", "params": {"beta": 2}}}, 13, 11,
         r"^model\.attention: unknown parameter 'beta'.*alpha"),
        ({"output": {"mapping": "entmax"}}, 13, 11, r"^model\.output: unknown mapping 'entmax'"),
    ],
)
def test_configuration_errors_name_the_key(sections, src_vocab, tgt_vocab, message):
    with pytest.raises(ModelConfigError, match=message) as info:
        build_model(model_cfg(**sections), src_vocab, tgt_vocab, PAD)
    assert "\n" not in str(info.value)
    assert str(info.value) == f"{info.value.key}: {info.value.problem}"


def test_missing_key_is_named():
    cfg = model_cfg()
    del cfg["decoder"]["bridge"]
    with pytest.raises(ValueError, match=r"model\.decoder\.bridge: missing key"):
        build_model(cfg, SRC_VOCAB, TGT_VOCAB, PAD)


def test_initialisation_uniform_with_zero_padding_rows():
    model = build_model(model_cfg(), SRC_VOCAB, TGT_VOCAB, PAD)
    for name, p in model.named_parameters():
        assert p.abs().max() <= 0.1, name
    assert torch.all(model.src_embeddings.weight[PAD] == 0)
    assert torch.all(model.tgt_embeddings.weight[PAD] == 0)
    assert model.src_embeddings.weight[1:].std() > 0.05  # really uniform(-0.1, 0.1), not a constant


@pytest.mark.parametrize("tied", [False, True])
def test_state_dict_round_trip(tied):
    cfg = model_cfg(embeddings={"tie_output": tied, "share": tied}, attention={"mapping": "sparsemax"},
                    output={"mapping": "entmax15"})
    model = build_model(cfg, SRC_VOCAB, SRC_VOCAB, PAD).eval()
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    torch.manual_seed(123)  # a different initialisation, overwritten by the load
    restored = build_model(cfg, SRC_VOCAB, SRC_VOCAB, PAD).eval()
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    if tied:
        assert restored.generator.proj.weight is restored.tgt_embeddings.weight
    src, src_lengths, tgt_in = random_batch()
    for a, b in zip(model(src, src_lengths, tgt_in), restored(src, src_lengths, tgt_in)):
        assert torch.equal(a, b)


def test_dropout_only_in_training():
    cfg = model_cfg(embeddings={"dropout": 0.5}, encoder={"dropout": 0.5}, decoder={"dropout": 0.5})
    model = build_model(cfg, SRC_VOCAB, TGT_VOCAB, PAD)
    src, src_lengths, tgt_in = random_batch()
    model.train()
    assert not torch.equal(model(src, src_lengths, tgt_in)[0], model(src, src_lengths, tgt_in)[0])
    model.eval()
    assert torch.equal(model(src, src_lengths, tgt_in)[0], model(src, src_lengths, tgt_in)[0])
