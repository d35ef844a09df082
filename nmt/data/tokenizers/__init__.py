"""Tokenizers by name: ``char``, ``space``, ``bpe`` (subword-nmt), ``sentencepiece``.

``build_tokenizer({"type": "bpe", "merges": 8000})`` makes one from a config section;
``tokenizer_from_state_dict(tok.state_dict())`` rebuilds an identical one (from a checkpoint).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from nmt.data.errors import DataError
from nmt.data.tokenizers.base import Tokenizer
from nmt.data.tokenizers.bpe import BPETokenizer
from nmt.data.tokenizers.simple import SPACE_SYMBOL, CharTokenizer, SpaceTokenizer
from nmt.data.tokenizers.spm import SentencePieceTokenizer
from nmt.sparse.suggest import did_you_mean

TOKENIZERS: dict[str, type[Tokenizer]] = {
    cls.type_name: cls for cls in (CharTokenizer, SpaceTokenizer, BPETokenizer, SentencePieceTokenizer)
}

# keys that only a state dict carries (learned models), not a user config
_STATE_ONLY = {"bpe": {"codes"}, "sentencepiece": {"model_proto"}}


def _make(cfg: Mapping[str, Any], allowed_state: bool, where: str) -> Tokenizer:
    if not isinstance(cfg, Mapping):
        raise DataError(f"{where}: expected a mapping with a 'type' key, got {type(cfg).__name__}")
    kind = cfg.get("type")
    if kind not in TOKENIZERS:
        valid = sorted(TOKENIZERS)
        hint = did_you_mean(str(kind), valid) if kind is not None else ""
        raise DataError(
            f"{where}.type: unknown tokenizer {kind!r}{hint}; valid: {', '.join(valid)}"
        )
    cls = TOKENIZERS[kind]
    params = [p.name for p in inspect.signature(cls.__init__).parameters.values()  # not object's *args, **kwargs
              if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not allowed_state:
        params = [p for p in params if p not in _STATE_ONLY.get(kind, ())]
    kwargs = {k: v for k, v in cfg.items() if k != "type"}
    for key in kwargs:
        if key not in params:
            raise DataError(
                f"{where}.{key}: unknown key for tokenizer {kind!r}{did_you_mean(key, params)}; "
                f"valid: {', '.join(params) or '(none)'}"
            )
    return cls(**kwargs)


def build_tokenizer(cfg: Mapping[str, Any]) -> Tokenizer:
    """A tokenizer from a config section ``{type: char|space|bpe|sentencepiece, ...}``.

    Unknown types or keys raise a one-line ``DataError`` naming the key and the closest valid one.
    """
    return _make(cfg, allowed_state=False, where="tokenizer")


def tokenizer_from_state_dict(state: Mapping[str, Any]) -> Tokenizer:
    """Rebuild the tokenizer whose ``state_dict()`` is ``state`` (learned codes/models included)."""
    return _make(state, allowed_state=True, where="tokenizer state")


__all__ = [
    "SPACE_SYMBOL",
    "BPETokenizer",
    "CharTokenizer",
    "SentencePieceTokenizer",
    "SpaceTokenizer",
    "TOKENIZERS",
    "Tokenizer",
    "build_tokenizer",
    "tokenizer_from_state_dict",
]
