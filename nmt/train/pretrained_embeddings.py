"""Pretrained word vectors in a new run's embedding tables, and frozen tables
(``model.embeddings.pretrained``; OpenNMT-py's ``-src_embeddings`` / ``-tgt_embeddings`` and
``-freeze_word_vecs_enc`` / ``-freeze_word_vecs_dec``).

- :func:`load_pretrained_embeddings`: only when a run starts fresh, the row of every vocabulary
  type found in the vectors file (:func:`nmt.data.word_vectors.read_word_vectors`) gets its vector;
  the others, and the padding row (zero), keep their initialisation. A resumed run takes its
  checkpoint's weights and a fine-tuned run (``training.init_from``) its parent's: neither reads
  the file (:data:`NOT_READ_ON_RESUME`: its path may change, or the file go, between sessions).
  With ``model.embeddings.share`` the ``src`` vectors fill the one table; with ``tie_output`` the
  output layer starts from the target vectors too (it is the same tensor).
- :func:`freeze_embeddings`, at every start (fresh, resumed or fine-tuned): a frozen table's
  parameter has ``requires_grad`` False, so the optimizer, built after, never holds it (no update,
  no weight decay, no moments); the weight average (``training.ema``) of a constant is itself.
  A frozen target table tied to the output layer (``tie_output``) freezes that layer's weight as
  well (the same tensor; its bias still trains).
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from nmt.config import ConfigError
from nmt.data.errors import DataError
from nmt.data.vocabulary import PAD, Vocabulary
from nmt.data.word_vectors import VectorDimensionError, read_word_vectors

logger = logging.getLogger(__name__)

KEY = "model.embeddings.pretrained"
SIDES = {"src": "source", "tgt": "target"}
NOT_READ_ON_RESUME = (f"{KEY}.src", f"{KEY}.tgt")
"""Keys a resumed run never reads (the checkpoint holds the weights): they may differ on resume."""


def size_key(model_cfg: dict[str, Any], side: str) -> str:
    """The key that sizes the ``side`` ("src" / "tgt") embeddings: ``model.embeddings.<side>_size``
    for the RNN, ``model.transformer.d_model`` for the Transformer."""
    return "model.transformer.d_model" if model_cfg["type"] == "transformer" else f"model.embeddings.{side}_size"


def table_size(model_cfg: dict[str, Any], side: str) -> int:
    """The size the ``side`` embeddings will have (the value of :func:`size_key`)."""
    if model_cfg["type"] == "transformer":
        return model_cfg["transformer"]["d_model"]
    return model_cfg["embeddings"][f"{side}_size"]


def _dimension_error(source: str, model_cfg: dict[str, Any], side: str, path: str, dim: int) -> ConfigError:
    what = "shared" if model_cfg["embeddings"]["share"] else SIDES[side]
    return ConfigError(source, f"{KEY}.{side}", f"{path} holds {dim}-dimensional vectors, but the {what} embeddings "
                       f"have {table_size(model_cfg, side)} ({size_key(model_cfg, side)})")


def check_vector_files(config: dict[str, Any], source: str) -> None:
    """Before anything is written, for a run that will read them (a new run without
    ``training.init_from``): each vectors file exists and its dimension (header or first line, the
    rest unread) is its table's size. ConfigError naming the key and the file otherwise."""
    from nmt.data.word_vectors import vectors_dimension
    from nmt.train.checkpoint import has_checkpoints

    train_cfg, model_cfg = config["training"], config["model"]
    if train_cfg["init_from"] is not None or has_checkpoints(train_cfg["save_dir"]):
        return
    for side in SIDES:
        path = model_cfg["embeddings"]["pretrained"][side]
        if path is None:
            continue
        try:
            dim = vectors_dimension(path)
        except DataError as exc:
            raise ConfigError(source, f"{KEY}.{side}", str(exc)) from None
        if dim != table_size(model_cfg, side):
            raise _dimension_error(source, model_cfg, side, path, dim)


def _tables(model: nn.Module, shared: bool) -> dict[str, nn.Module]:
    """side -> its Embeddings module (``src`` only when the table is shared)."""
    tables = {"src": model.src_embeddings}
    if not shared:
        tables["tgt"] = model.tgt_embeddings
    return tables


def load_pretrained_embeddings(model: nn.Module, model_cfg: dict[str, Any], src_vocab: Vocabulary,
                               tgt_vocab: Vocabulary, source: str) -> dict[str, int]:
    """Copy the vectors of ``model_cfg["embeddings"]["pretrained"]`` into ``model``'s tables.

    model: an encoder-decoder with ``src_embeddings`` / ``tgt_embeddings`` (its ``weight`` a
    (V, D) table); the vocabularies: its source and target ones (row i is ``itos[i]``). Logs one
    line per table. Returns side -> rows filled. Raises ConfigError naming the key and the file:
    a missing file, a dimension other than the table's, a malformed line (with its number).
    """
    cfg = model_cfg["embeddings"]["pretrained"]
    shared = model_cfg["embeddings"]["share"]
    vocabs = {"src": src_vocab, "tgt": tgt_vocab}
    filled: dict[str, int] = {}
    for side, table in _tables(model, shared).items():
        path = cfg[side]
        if path is None:
            continue
        key, vocab = f"{KEY}.{side}", vocabs[side]
        try:
            vectors = read_word_vectors(path, [t for t in vocab.itos if t != PAD], dim=table.dim)
        except VectorDimensionError as exc:
            raise _dimension_error(source, model_cfg, side, path, exc.dim) from None
        except DataError as exc:
            raise ConfigError(source, key, str(exc)) from None
        rows = torch.tensor([vocab.stoi[t] for t in vectors.tokens], dtype=torch.long)
        with torch.no_grad():
            table.weight.index_copy_(0, rows.to(table.weight.device),
                                     vectors.vectors.to(table.weight.device, table.weight.dtype))
        filled[side] = len(rows)
        what = "shared" if shared else SIDES[side]
        logger.info("pretrained %s embeddings: %s of %s types found in %s (dimension %d)", what,
                    f"{len(rows):,}", f"{len(vocab):,}", path, vectors.dim)
        if not len(rows):
            logger.warning("%s: no %s vocabulary type is in %s (another tokenization or casing?): the table keeps "
                           "its initialisation", key, what, path)
        if vectors.duplicates:
            token, line = vectors.duplicates[0]
            logger.warning("%s: %d vocabulary type(s) listed more than once, the first vector of each used "
                           "(e.g. %r again on line %d)", path, len(vectors.duplicates), token, line)
    return filled


def freeze_embeddings(model: nn.Module, model_cfg: dict[str, Any]) -> list[str]:
    """Freeze the tables ``model.embeddings.pretrained.freeze_src`` / ``freeze_tgt`` name
    (``requires_grad`` False: call before the optimizer is built). Returns the frozen parameters'
    names in ``model`` (a tied output weight shares the target table's name); logs one line each."""
    emb_cfg = model_cfg["embeddings"]
    cfg = emb_cfg["pretrained"]
    frozen = []
    for side, table in _tables(model, emb_cfg["share"]).items():
        if not cfg[f"freeze_{side}"]:
            continue
        table.weight.requires_grad_(False)
        name = next(n for n, p in model.named_parameters(remove_duplicate=False) if p is table.weight)
        frozen.append(name)
        tied = [n for n, p in model.named_parameters(remove_duplicate=False) if p is table.weight and n != name]
        what = "shared" if emb_cfg["share"] else SIDES[side]
        also = f"; tied to it (model.embeddings.tie_output), {', '.join(tied)} is frozen too" if tied else ""
        logger.info("%s.freeze_%s: the %s embeddings (%s) are frozen%s", KEY, side, what, name, also)
    return frozen


def check_init_optimizer(parent_config: dict[str, Any], config: dict[str, Any], source: str) -> None:
    """``training.init_optimizer`` carries the parent's per-parameter state, which holds no frozen
    table: it needs the parent's freeze settings. ConfigError naming the first that differs."""
    mine = config["model"]["embeddings"]["pretrained"]
    theirs = (parent_config.get("model", {}).get("embeddings", {}).get("pretrained") or {})
    for side in SIDES:
        flag = f"freeze_{side}"
        if bool(mine[flag]) != bool(theirs.get(flag, False)):
            raise ConfigError(source, f"{KEY}.{flag}", f"{mine[flag]!r} in the config, {theirs.get(flag, False)!r} "
                              "in the parent: training.init_optimizer carries the optimizer state of the parent's "
                              "trained parameters, so the frozen tables must be the same (or set "
                              "training.init_optimizer: false)")


__all__ = ["KEY", "NOT_READ_ON_RESUME", "check_init_optimizer", "check_vector_files", "freeze_embeddings",
           "load_pretrained_embeddings", "size_key", "table_size"]
