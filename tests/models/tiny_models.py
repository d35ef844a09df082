"""Tiny model configurations and batches shared by the model tests."""
from __future__ import annotations

import copy
from typing import Any

import torch

from nmt.models import Seq2Seq

SRC_VOCAB = 13
TGT_VOCAB = 11
PAD = 0

BASE_CFG: dict[str, Any] = {
    "embeddings": {"src_size": 6, "tgt_size": 6, "share": False, "tie_output": False, "dropout": 0.0},
    "encoder": {"type": "lstm", "layers": 2, "hidden_size": 8, "bidirectional": True, "dropout": 0.0},
    "decoder": {
        "type": "lstm", "layers": 2, "hidden_size": 6, "dropout": 0.0, "input_feeding": True, "bridge": "linear",
    },
    "attention": {"score": "general", "mapping": "softmax", "params": {}, "continuous": None},
    "output": {"mapping": "softmax", "params": {}},
}


def model_cfg(**sections: dict[str, Any]) -> dict[str, Any]:
    """BASE_CFG with some keys overridden, e.g. ``model_cfg(decoder={"type": "gru"})``."""
    cfg = copy.deepcopy(BASE_CFG)
    for name, values in sections.items():
        cfg[name].update(values)
    return cfg


def random_batch(batch: int = 3, src_len: int = 7, tgt_len: int = 5, lengths: list[int] | None = None,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded (src (B, L), src_lengths (B,), tgt_in (B, T)) with ids >= 4 (no specials)."""
    g = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths = [src_len] + torch.randint(1, src_len + 1, (batch - 1,), generator=g).tolist()
    src = torch.randint(4, SRC_VOCAB, (batch, src_len), generator=g)
    src_lengths = torch.tensor(lengths)
    src = src.masked_fill(torch.arange(src_len)[None] >= src_lengths[:, None], PAD)
    tgt_in = torch.randint(4, TGT_VOCAB, (batch, tgt_len), generator=g)
    tgt_in[:, 0] = 2  # BOS
    return src, src_lengths, tgt_in


def sharpen_attention(model: Seq2Seq, factor: float = 10.0) -> None:
    """Scale all weights (uniform +-1 instead of +-0.1) and the attention keys once more,
    so that scores spread over several units and sparse mappings have exact zeros."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(factor)
        model.decoder.attention.key_proj.weight.mul_(factor)


TRANSFORMER_CFG: dict[str, Any] = {
    "type": "transformer",
    "embeddings": {"src_size": 8, "tgt_size": 8, "share": False, "tie_output": False, "dropout": 0.0},
    "transformer": {
        "encoder_layers": 2, "decoder_layers": 2, "d_model": 8, "heads": 2, "d_ff": 16, "norm": "pre",
        "positions": "sinusoidal", "max_positions": 64, "dropout": 0.0, "attention_dropout": 0.0,
        "activation_dropout": 0.0, "activation": "relu",
    },
    "attention": {"score": "general", "mapping": "softmax", "params": {}, "continuous": None,
                  "encoder_self": None, "decoder_self": None, "cross": None},
    "output": {"mapping": "softmax", "params": {}},
}


def transformer_cfg(**sections: Any) -> dict[str, Any]:
    """TRANSFORMER_CFG with some keys overridden, e.g. ``transformer_cfg(transformer={"norm": "post"})``."""
    cfg = copy.deepcopy(TRANSFORMER_CFG)
    for name, values in sections.items():
        if isinstance(values, dict) and isinstance(cfg.get(name), dict):
            cfg[name].update(values)
        else:
            cfg[name] = values
    return cfg


def positions_cfg(kind: str) -> dict[str, Any]:
    """The ``model.transformer`` keys of a position kind named in a test parametrisation: a
    ``positions`` value, or ``"alibi-split"`` (ALiBi with the direction-aware encoder,
    ``alibi_encoder: split``)."""
    if kind == "alibi-split":
        return {"positions": "alibi", "alibi_encoder": "split"}
    return {"positions": kind}


def assert_offset_invariant(attention, shift: int = 5) -> None:
    """An ``attend`` of positional self-attention (relative or ALiBi heads, float64): four keys
    placed after ``shift`` masked ones (the queries' ``query_offset`` moved by as much) give the same
    probabilities (zero on the masked keys) and outputs as at positions 0.. (positions enter only
    as distances)."""
    q = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    k, v = torch.randn(1, 2, 4, 4, dtype=torch.float64), torch.randn(1, 2, 4, 4, dtype=torch.float64)
    out, probs = attention.attend(q, k, v, query_offset=0)
    k_shifted = torch.cat([torch.randn(1, 2, shift, 4, dtype=torch.float64), k], dim=2)
    v_shifted = torch.cat([torch.randn(1, 2, shift, 4, dtype=torch.float64), v], dim=2)
    mask = torch.arange(shift + 4) >= shift
    out_shifted, probs_shifted = attention.attend(q, k_shifted, v_shifted, mask, query_offset=shift)
    torch.testing.assert_close(probs_shifted[..., shift:], probs, rtol=0, atol=1e-12)
    assert torch.equal(probs_shifted[..., :shift], torch.zeros_like(probs_shifted[..., :shift]))
    torch.testing.assert_close(out_shifted, out, rtol=0, atol=1e-12)


def assert_long_steps_equal_teacher_forcing(model, src: torch.Tensor, lengths: torch.Tensor,
                                            tgt_in: torch.Tensor, logits: torch.Tensor) -> None:
    """Incremental decoding of ``tgt_in`` (B, T) gives the teacher-forced ``logits``' log-probabilities
    (float64, 1e-10; the same zeros) at the first step, steps 255 and 256 (around a power-of-two
    cache length) and the last."""
    with torch.no_grad():
        encoder_out, state = model.encode(src, lengths)
        for t in range(tgt_in.size(1)):
            log_probs, _, state = model.step(tgt_in[:, t], state, encoder_out)
            if t in (0, 255, 256, tgt_in.size(1) - 1):
                want = model.log_probs(logits[:, t])
                finite = torch.isfinite(want)
                assert torch.equal(torch.isfinite(log_probs), finite)
                assert (log_probs[finite] - want[finite]).abs().max() <= 1e-10
