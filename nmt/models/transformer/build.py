"""Build a :class:`TransformerSeq2Seq` from the resolved ``model:`` section (``model.type: transformer``)."""
from __future__ import annotations

from typing import Any

from torch import nn

from nmt.models.copy_attention import CopyAttention
from nmt.models.dropout import word_dropouts
from nmt.models.embeddings import Embeddings
from nmt.models.errors import ModelConfigError, keyed
from nmt.models.generator import Generator
from nmt.models.transformer.alibi import ALIBI_ENCODER_FORMS
from nmt.models.transformer.decoder import TransformerDecoder
from nmt.models.transformer.encoder import TransformerEncoder
from nmt.models.transformer.head_mapping import HeadMapping
from nmt.models.transformer.layers import AttentionSpec, LayerSpec
from nmt.models.transformer.model import ATTENTION_KINDS, TransformerSeq2Seq
from nmt.models.transformer.positions import build_positions


def attention_spec(attention_cfg: dict[str, Any], kind: str) -> AttentionSpec:
    """The mapping of one attention kind: ``model.attention.<kind>.mapping`` / ``.params``, where a
    null mapping inherits ``model.attention.mapping`` (and, then, a null params its params) and a
    null params with an explicit mapping means no parameters."""
    section = attention_cfg.get(kind) or {}
    mapping = section.get("mapping")
    params = section.get("params")
    if mapping is None:
        mapping = attention_cfg.get("mapping", "softmax")
        if params is None:
            params = attention_cfg.get("params") or {}
    return AttentionSpec(mapping, dict(params or {}))


def build_transformer(model_cfg: dict[str, Any], src_vocab_size: int, tgt_vocab_size: int,
                      pad_index: int = 0) -> TransformerSeq2Seq:
    """Build and initialise the Transformer of the resolved ``model:`` section.

    Embeddings have size ``transformer.d_model`` (``embeddings.src_size`` / ``tgt_size`` are
    for the RNN) and start N(0, d_model^-1/2) with a zero padding row (scaled by sqrt(d_model)
    in the forward pass); linear layers start Xavier-uniform with zero biases; learned alphas
    at 1.5. Raises :class:`ModelConfigError` (a ValueError) naming the key for impossible
    combinations (shared embeddings without a shared vocabulary, d_model not divisible by heads,
    unknown names).
    """
    t = model_cfg["transformer"]
    emb_cfg, att_cfg, out_cfg = model_cfg["embeddings"], model_cfg["attention"], model_cfg["output"]
    if att_cfg.get("coverage", False):
        raise ModelConfigError("model.attention.coverage", "coverage attention is the RNN decoder's (its one "
                               "attention carries the coverage from step to step); a Transformer has none")
    d_model = t["d_model"]
    if d_model % t["heads"]:
        raise ModelConfigError("model.transformer.heads",
                               f"d_model ({d_model}) must be a multiple of heads ({t['heads']})")
    kv_heads = t.get("kv_heads", 0)  # (absent from older checkpoints: every head its own keys and values)
    if kv_heads and t["heads"] % kv_heads:
        raise ModelConfigError("model.transformer.kv_heads",
                               f"heads ({t['heads']}) must be a multiple of kv_heads ({kv_heads})")
    if t.get("alignment_heads", 0) > t["heads"]:
        raise ModelConfigError("model.transformer.alignment_heads",
                               f"{t['alignment_heads']} heads, but the layers have {t['heads']} (0: all of them)")
    relative = t.get("max_relative_positions", 20) if t["positions"] == "relative" else 0
    if t["positions"] == "relative" and relative < 1:
        raise ModelConfigError("model.transformer.max_relative_positions", f"must be >= 1, got {relative}")
    alibi_encoder = t.get("alibi_encoder", "symmetric")  # checkpoints from before the option: symmetric
    if alibi_encoder not in ALIBI_ENCODER_FORMS:
        raise ModelConfigError("model.transformer.alibi_encoder",
                               f"unknown value {alibi_encoder!r}; valid: {', '.join(ALIBI_ENCODER_FORMS)}")
    spec = keyed("model.transformer.norm", LayerSpec, d_model, t["heads"], t["d_ff"], t["norm"], t["dropout"],
                  t["attention_dropout"], t["activation_dropout"], t["activation"], relative,
                  t["positions"] == "alibi", alibi_encoder, t.get("layer_norm", "layer"),  # older runs: LayerNorm
                  kv_heads)
    specs = {kind: attention_spec(att_cfg, kind) for kind in ATTENTION_KINDS}
    specs["cross"].continuous = att_cfg.get("continuous")  # combined attention: cross-attention only
    for kind, attention in specs.items():  # check names and parameters up front, naming the key
        keyed(f"model.attention.{kind}", HeadMapping, t["heads"], attention.mapping, attention.params)

    src_emb = Embeddings(src_vocab_size, d_model, pad_index, 0.0)
    if emb_cfg["share"]:
        if src_vocab_size != tgt_vocab_size:
            raise ModelConfigError("model.embeddings.share", "needs one shared vocabulary (data.shared_vocab: "
                                   f"true), got source {src_vocab_size} and target {tgt_vocab_size} types")
        tgt_emb = src_emb
    else:
        tgt_emb = Embeddings(tgt_vocab_size, d_model, pad_index, 0.0)
    for emb in {id(src_emb): src_emb, id(tgt_emb): tgt_emb}.values():
        nn.init.normal_(emb.lut.weight, mean=0.0, std=d_model ** -0.5)
        emb.lut.weight.data[pad_index].zero_()

    if t["positions"] == "rotary" and not t.get("rotary_base", 10000.0) > 1:
        raise ModelConfigError("model.transformer.rotary_base", f"must be > 1, got {t['rotary_base']}")

    def positions() -> nn.Module:
        return keyed("model.transformer.positions", build_positions, t["positions"], d_model, t["max_positions"],
                     t["heads"], t.get("rotary_base", 10000.0), relative or 20)

    encoder = TransformerEncoder(spec, t["encoder_layers"], specs["encoder_self"], positions(), emb_cfg["dropout"])
    decoder = keyed("model.transformer.alignment_layer", TransformerDecoder, spec, t["decoder_layers"],
                    specs["decoder_self"], specs["cross"], positions(), emb_cfg["dropout"],
                    t.get("alignment_layer", -1), t.get("alignment_heads", 0),  # absent from older checkpoints
                    t.get("full_context_alignment", False))
    copy = CopyAttention(d_model, d_model, src_vocab_size) if out_cfg.get("copy", False) else None
    generator = keyed("model.output.mapping", Generator, d_model, tgt_vocab_size, out_cfg["mapping"],
                       out_cfg.get("params") or {}, copy)
    if copy is not None:
        nn.init.xavier_uniform_(copy.keys.weight)
    nn.init.xavier_uniform_(generator.proj.weight)
    nn.init.zeros_(generator.proj.bias)
    if emb_cfg["tie_output"]:
        generator.proj.weight = tgt_emb.lut.weight
    return TransformerSeq2Seq(src_emb, tgt_emb, encoder, decoder, generator, *word_dropouts(emb_cfg))


__all__ = ["attention_spec", "build_transformer"]
