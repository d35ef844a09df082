"""Build a :class:`Seq2Seq` from the resolved YAML ``model:`` section.

This is where the model code reads the config, so this is where YAML keys enter error
messages: the model classes raise plain ``ValueError``s about their own arguments, and
:func:`build_model` re-raises each one once as a :class:`ModelConfigError` carrying the key of
the section (or option) it built from. Callers that know the file (the trainer) turn it into
a one-line ``<file>: <key>: <problem>`` from the ``key`` / ``problem`` attributes.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from nmt.models.attention import GlobalAttention
from nmt.models.copy_attention import CopyAttention
from nmt.models.decoder import Bridge, InputFeedingDecoder
from nmt.models.dropout import word_dropouts
from nmt.models.embeddings import Embeddings
from nmt.models.encoder import RNNEncoder
from nmt.models.errors import ModelConfigError, keyed
from nmt.models.generator import Generator
from nmt.models.seq2seq import Seq2Seq

PARAM_INIT = 0.1
"""Parameters start uniform in [-0.1, 0.1] (OpenNMT-py's ``param_init``), padding rows at zero."""


_keyed = keyed


def _section(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    try:
        section = cfg[name]
    except KeyError:
        raise ModelConfigError(f"model.{name}", "missing section") from None
    if not isinstance(section, dict):
        raise ModelConfigError(f"model.{name}", f"expected a mapping, got {type(section).__name__}")
    return section


def _get(section: dict[str, Any], path: str, key: str) -> Any:
    try:
        return section[key]
    except KeyError:
        raise ModelConfigError(f"{path}.{key}", "missing key") from None


def init_parameters(model: nn.Module, scale: float = PARAM_INIT) -> None:
    """Uniform(-scale, scale) for every parameter except those of continuous attention
    (which initialises itself); embedding padding rows are set back to zero."""
    skip = set()
    for module in model.modules():
        if isinstance(module, GlobalAttention) and module.continuous is not None:
            skip.update(id(p) for p in module.continuous.parameters())
    for p in model.parameters():
        if id(p) not in skip:
            nn.init.uniform_(p, -scale, scale)
    for module in model.modules():
        if isinstance(module, Embeddings):
            module.lut.weight.data[module.pad_index].zero_()


MODEL_TYPES = ("rnn", "transformer")


def build_model(model_cfg: dict[str, Any], src_vocab_size: int, tgt_vocab_size: int,
                pad_index: int = 0) -> nn.Module:
    """Build the model of ``model.type``: the RNN :class:`Seq2Seq` (default, below) or the
    Transformer (:func:`nmt.models.transformer.build_transformer`). Both implement ``forward``
    (teacher forcing) and the ``StepDecoder`` protocol."""
    model_type = model_cfg.get("type", "rnn")
    if model_type == "transformer":
        from nmt.models.transformer.build import build_transformer

        return build_transformer(model_cfg, src_vocab_size, tgt_vocab_size, pad_index)
    if model_type != "rnn":
        raise ModelConfigError("model.type", f"unknown model type {model_type!r}; valid: {', '.join(MODEL_TYPES)}")
    return build_rnn(model_cfg, src_vocab_size, tgt_vocab_size, pad_index)


def describe_attention(model_cfg: dict[str, Any]) -> str:
    """The attention mapping(s) of a ``model:`` section in words, e.g. ``entmax15`` or, for a
    Transformer, ``encoder_self entmax_bisect(alpha=learned), decoder_self softmax, cross entmax15``."""
    if model_cfg.get("type", "rnn") != "transformer":
        return str(model_cfg["attention"]["mapping"])
    from nmt.models.transformer.build import attention_spec
    from nmt.models.transformer.model import ATTENTION_KINDS

    parts = []
    for kind in ATTENTION_KINDS:
        spec = attention_spec(model_cfg["attention"], kind)
        params = ", ".join(f"{k}={v}" for k, v in spec.params.items())
        parts.append(f"{kind} {spec.mapping}" + (f"({params})" if params else ""))
    return ", ".join(parts)


def build_rnn(model_cfg: dict[str, Any], src_vocab_size: int, tgt_vocab_size: int, pad_index: int = 0) -> Seq2Seq:
    """Build and initialise the RNN model described by the (fully resolved) ``model:`` section.

    Raises :class:`ModelConfigError` (a ValueError) naming the key for impossible
    combinations: shared embeddings with different vocabulary or embedding sizes, tied output weights with
    ``embeddings.tgt_size != decoder.hidden_size``, ``dot`` scores with different encoder
    and decoder sizes, ``copy`` bridges between different shapes, unknown names.
    """
    emb_cfg = _section(model_cfg, "embeddings")
    enc_cfg = _section(model_cfg, "encoder")
    dec_cfg = _section(model_cfg, "decoder")
    att_cfg = _section(model_cfg, "attention")
    out_cfg = _section(model_cfg, "output")
    g = _get

    src_size = g(emb_cfg, "model.embeddings", "src_size")
    tgt_size = g(emb_cfg, "model.embeddings", "tgt_size")
    emb_dropout = g(emb_cfg, "model.embeddings", "dropout")
    src_emb = _keyed("model.embeddings", Embeddings, src_vocab_size, src_size, pad_index, emb_dropout)
    if g(emb_cfg, "model.embeddings", "share"):
        if src_vocab_size != tgt_vocab_size:
            raise ModelConfigError(
                "model.embeddings.share", f"needs one joint vocabulary, got source {src_vocab_size} "
                f"and target {tgt_vocab_size} types"
            )
        if src_size != tgt_size:
            raise ModelConfigError("model.embeddings.share",
                                   f"needs src_size == tgt_size, got {src_size} and {tgt_size}")
        tgt_emb = src_emb
    else:
        tgt_emb = _keyed("model.embeddings", Embeddings, tgt_vocab_size, tgt_size, pad_index, emb_dropout)

    encoder = _keyed(
        "model.encoder",
        RNNEncoder,
        g(enc_cfg, "model.encoder", "type"),
        src_size,
        g(enc_cfg, "model.encoder", "hidden_size"),
        layers=g(enc_cfg, "model.encoder", "layers"),
        bidirectional=g(enc_cfg, "model.encoder", "bidirectional"),
        dropout=g(enc_cfg, "model.encoder", "dropout"),
    )
    dec_type = g(dec_cfg, "model.decoder", "type")
    dec_size = g(dec_cfg, "model.decoder", "hidden_size")
    dec_layers = g(dec_cfg, "model.decoder", "layers")
    attention = _keyed(
        "model.attention",
        GlobalAttention,
        dec_size,
        encoder.hidden_size,
        score=g(att_cfg, "model.attention", "score"),
        mapping=g(att_cfg, "model.attention", "mapping"),
        mapping_params=att_cfg.get("params") or {},
        continuous=att_cfg.get("continuous"),
        coverage=att_cfg.get("coverage", False),
    )
    bridge = _keyed("model.decoder.bridge", Bridge, g(dec_cfg, "model.decoder", "bridge"), encoder.layers,
                    encoder.hidden_size, dec_type, dec_layers, dec_size)
    decoder = _keyed(
        "model.decoder",
        InputFeedingDecoder,
        dec_type,
        tgt_size,
        dec_size,
        encoder.hidden_size,
        attention,
        bridge,
        layers=dec_layers,
        dropout=g(dec_cfg, "model.decoder", "dropout"),
        input_feeding=g(dec_cfg, "model.decoder", "input_feeding"),
    )
    copy = CopyAttention(dec_size, encoder.hidden_size, src_vocab_size) if out_cfg.get("copy", False) else None
    generator = _keyed("model.output", Generator, dec_size, tgt_vocab_size, g(out_cfg, "model.output", "mapping"),
                       out_cfg.get("params") or {}, copy)
    model = Seq2Seq(src_emb, tgt_emb, encoder, decoder, generator, *word_dropouts(emb_cfg))
    init_parameters(model)
    if g(emb_cfg, "model.embeddings", "tie_output"):
        if tgt_size != dec_size:
            raise ModelConfigError(
                "model.embeddings.tie_output", f"needs embeddings.tgt_size == decoder.hidden_size, "
                f"got {tgt_size} and {dec_size}"
            )
        generator.proj.weight = tgt_emb.lut.weight
    return model
