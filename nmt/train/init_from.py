"""Fine-tuning: a new run started from another run's model (``training.init_from``).

A new run (its ``save_dir`` holds no checkpoint) whose config sets ``training.init_from: PATH``
(a checkpoint file: a training checkpoint, or a released / averaged model; or a run directory,
meaning its ``best.pt``) starts from the parent's

- tokenizers and vocabularies: the new data is encoded with them (tokens the parent never saw
  are ``<unk>``), so the embeddings and the output layer fit. The data settings that would build
  other ones (:data:`VOCABULARY_KEYS`) are ignored, with a warning naming each that differs from
  the parent's;
- model parameters: the architecture is the config's ``model`` section, which must build the
  parent's parameters (names and shapes); otherwise a one-line ConfigError names the first key
  that makes the difference (``model.decoder.hidden_size: 24 in the config, 12 in PARENT``).
  Settings without parameters (dropout, mappings other than learned alphas) may differ: they
  are listed in an info line;
  With ``training.init_vocab: extend`` (OpenNMT-py's ``-update_vocab``) the parent's tokenizers
  cut the new training data and the vocabularies gain its tokens they lack
  (:func:`extended_fields`, :meth:`nmt.data.vocabulary.Vocabulary.extended`): the parent's tokens
  keep their ids and their embedding and output rows, the new ones get the fresh model's rows;
- optionally (``training.init_optimizer: true``) the optimizer state (Adam moments and step
  counts; OpenNMT-py's ``-reset_optim keep_states``), with the hyperparameters (lr, betas, ...)
  of the config.

Everything else starts fresh, as the peers' "reset all" fine-tuning: step 0, the lr schedule,
early stopping and its best metric, the data position. Once the new run has saved a checkpoint,
``init_from`` is ignored (an info line) and a restart resumes the run itself like any other.
"""
from __future__ import annotations

import copy
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt.config import ConfigError, added_at_default, config_differences, config_value, saved_value
from nmt.data.corpora import tag_line_counts, training_corpora
from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.source_tags import config_tags, with_tags
from nmt.data.textfiles import iter_lines
from nmt.data.unknown_tokens import UnkCounts, unk_shares
from nmt.train.checkpoint import CheckpointError, has_checkpoints
from nmt.utils.checkpoint_file import load_checkpoint
from nmt.utils.exception_text import first_line

logger = logging.getLogger(__name__)

VOCABULARY_KEYS = tuple(f"data.{side}.{key}" for side in ("src", "tgt")
                        for key in ("tokenizer", "min_freq", "max_size", "vocab_file",
                                    "subword_sampling.vocab_samples")) + (
    "data.shared_vocab", "data.shared_tokenizer")
"""The data settings that build tokenizers and vocabularies: a fine-tuned run ignores them."""


@dataclass
class Parent:
    """The checkpoint a fine-tuned run starts from: its file, its payload (loaded on the CPU)
    and its source and target fields."""

    path: Path
    payload: dict[str, Any]
    src_field: Field
    tgt_field: Field

    @property
    def fields(self) -> tuple[Field, Field]:
        """``(src_field, tgt_field)``."""
        return self.src_field, self.tgt_field


def init_checkpoint_path(value: str, source: str, key: str = "training.init_from") -> Path:
    """The checkpoint file ``key: value`` names (``training.init_from``, ``training.distill.teacher``):
    the file itself, or a run directory's ``best.pt``. ConfigError (one line naming the key and
    the path) when there is none."""
    path = Path(value)
    if path.is_dir():
        best = path / "best.pt"
        if not best.is_file():
            raise ConfigError(source, key, f"{path}: a directory without best.pt (name a "
                              "checkpoint file, or a run directory that has validated once)")
        return best
    if not path.exists():
        raise ConfigError(source, key, f"{path}: no such checkpoint file or run directory")
    return path


def check_init_from(config: dict, source: str) -> None:
    """The check of ``training.init_from`` that needs no loading, for a new run only: the path
    exists (a file, or a run directory with ``best.pt``), and ``training.init_optimizer: true`` has a
    parent to take the optimizer state from. ConfigError otherwise; nothing written."""
    train_cfg = config["training"]
    value = train_cfg["init_from"]
    if has_checkpoints(train_cfg["save_dir"]):  # a resume: init_from and init_optimizer are not used
        return
    if value is not None:
        init_checkpoint_path(value, source)
        if train_cfg["init_optimizer"] and train_cfg["init_vocab"] == "extend":
            raise ConfigError(source, "training.init_optimizer", "true with training.init_vocab: extend: the parent's "
                              "optimizer state does not fit the extended embedding and output tables; leave one out")
    elif train_cfg["init_optimizer"]:
        raise ConfigError(source, "training.init_optimizer", "true needs training.init_from (the run whose "
                          "optimizer state it carries): set init_from, or leave init_optimizer false")


def load_parent(config: dict, source: str, resuming: bool) -> Parent | None:
    """The parent of a new fine-tuned run, or None (no ``training.init_from``, or ``resuming``:
    the run's own checkpoint wins; an info line says so).

    Loads the checkpoint on the CPU (``weights_only``) and its fields; logs a warning per
    :data:`VOCABULARY_KEYS` setting of ``config`` that differs from the parent's (ignored).
    Raises ConfigError naming ``source``, ``training.init_from`` (or ``training.init_optimizer``)
    and the file when it is missing, unreadable, not an nmt checkpoint, or (with
    ``init_optimizer``) a released model without optimizer state.
    """
    train_cfg = config["training"]
    value = train_cfg["init_from"]
    if value is None:
        return None
    if resuming:
        logger.info("training.init_from (%s) ignored: %s holds a checkpoint of this run, which resumes", value,
                    train_cfg["save_dir"])
        return None
    path = init_checkpoint_path(value, source)
    try:
        payload = load_checkpoint(path, map_location="cpu", training=False)
        src_field = Field.from_state_dict(payload["src_field"])
        tgt_field = Field.from_state_dict(payload["tgt_field"])
    except (CheckpointError, DataError) as exc:
        raise ConfigError(source, "training.init_from", first_line(exc)) from None
    if train_cfg["init_optimizer"] and payload.get("kind", "training") != "training":
        raise ConfigError(source, "training.init_optimizer", f"{path} is a released model without optimizer "
                          "state; name a training checkpoint, or set training.init_optimizer: false")
    parent_cfg = payload["config"]
    extending = train_cfg["init_vocab"] == "extend"
    for key in VOCABULARY_KEYS:
        if extending and key.endswith((".min_freq", ".max_size")):
            continue  # they choose the new tokens
        mine, theirs = config_value(config, key), saved_value(parent_cfg, key)
        if mine != theirs and not added_at_default(parent_cfg, config, key):
            logger.warning("%s: %r ignored (%r in %s): a fine-tuned run keeps its parent's tokenizers and "
                           "vocabularies", key, mine, theirs, path)
    return Parent(path, payload, src_field, tgt_field)


def extended_fields(parent: Parent, config: dict) -> tuple[Field, Field]:
    """The parent's fields with their vocabularies extended by the new training data's tokens
    (``training.init_vocab: extend``): the parent's tokenizers cut every training corpus's lines
    (streamed), and each vocabulary gains the tokens it lacks that ``data.<side>.min_freq`` and
    ``max_size`` of ``config`` keep (:meth:`~nmt.data.vocabulary.Vocabulary.extended`). A parent
    with one shared vocabulary (``data.shared_vocab``) keeps one, extended by both sides under
    ``data.src``'s settings. The source vocabulary also gains the source tags ``config`` declares
    that it lacks (:func:`nmt.data.source_tags.with_tags`). One info line per vocabulary."""
    data_cfg = config["data"]
    corpora = training_corpora(data_cfg["train"])
    src, tgt = parent.fields

    def tokens(field_: Field, sides: tuple[str, ...]):
        return (field_.tokenizer.tokenize(line) for side in sides for corpus in corpora
                for line in iter_lines(getattr(corpus, side)))

    def extend(field_: Field, side: str, sides: tuple[str, ...]) -> Field:
        settings = data_cfg[side]
        vocab = field_.vocab.extended(tokens(field_, sides), settings["min_freq"], settings["max_size"])
        if side == "src" and config_tags(data_cfg):  # the source tags: tokens whatever min_freq / max_size
            vocab = with_tags(vocab, config_tags(data_cfg), tag_line_counts(corpora))
        logger.info("training.init_vocab extend: %s vocabulary %d -> %d types (%d new from the training data)",
                    "shared" if len(sides) == 2 else {"src": "source", "tgt": "target"}[side], len(field_.vocab),
                    len(vocab), len(vocab) - len(field_.vocab))
        return Field(field_.tokenizer, vocab, field_.tags)

    if config_value(parent.payload["config"], "data.shared_vocab"):
        shared = extend(src, "src", ("src", "tgt"))
        return shared, shared
    return extend(src, "src", ("src",)), extend(tgt, "tgt", ("tgt",))


def init_model(parent: Parent, model: torch.nn.Module, config: dict, source: str) -> None:
    """Load the parent's parameters into ``model`` (built from ``config["model"]`` with the
    parent's vocabulary sizes, or larger ones with ``training.init_vocab: extend``: then the
    embedding and output tables take the parent's rows first, their other rows stay the model's
    own). ConfigError ``source: KEY: X in the config, Y in PARENT`` when the names or shapes of the
    parameters differ (beyond the tables' rows): KEY is the first ``model.*`` setting that,
    changed alone in the parent's model section, changes them (the first differing setting when
    none does alone; the first differing parameter when no setting differs)."""
    state = parent.payload["model"]
    if config["training"]["init_vocab"] == "extend":
        from nmt.models import build_model

        with torch.device("meta"):  # the config's model at the parent's vocabulary sizes: the architecture check
            same_sizes = build_model(config["model"], len(parent.src_field.vocab), len(parent.tgt_field.vocab),
                                     pad_index=parent.tgt_field.vocab.pad_index)
        if _shapes(state) != _shapes(same_sizes.state_dict()):
            raise _architecture_error(parent, same_sizes, config, source)
        merged = {name: value.detach().clone() for name, value in model.state_dict().items()}
        for name, value in merged.items():  # the parent's rows first (its tokens keep their ids)
            if value.dim():
                value[: state[name].size(0)].copy_(state[name])
            else:
                value.copy_(state[name])
        state = merged
    elif _shapes(state) != _shapes(model.state_dict()):
        raise _architecture_error(parent, model, config, source)
    model.load_state_dict(state)
    changed = config_differences(parent.payload["config"]["model"], config["model"], "model")
    if changed:
        logger.info("fine-tuning with model settings other than %s's: %s", parent.path, ", ".join(changed))


def init_optimizer(parent: Parent, optimizer: torch.optim.Optimizer, config: dict, source: str) -> None:
    """Load the parent's optimizer state (per-parameter moments and step counts) into
    ``optimizer``, keeping ``optimizer``'s hyperparameters (lr as the schedule set it, betas, eps,
    weight decay: this config's). ConfigError naming ``training.optimizer.name`` when the parent
    used another optimizer, ``training.optimizer.decay_vectors`` when other parameter groups,
    ``training.init_optimizer`` when its state does not fit."""
    parent_name = saved_value(parent.payload["config"], "training.optimizer.name")
    name = config["training"]["optimizer"]["name"]
    if parent_name != name:
        raise ConfigError(source, "training.optimizer.name", f"{name!r} in the config, {parent_name!r} in "
                          f"{parent.path}: training.init_optimizer carries the state of the same optimizer only")
    groups = len(parent.payload["optimizer"].get("param_groups", ()))
    if groups != len(optimizer.param_groups):  # (decay_vectors: one group, or matrices and vectors)
        raise ConfigError(source, "training.optimizer.decay_vectors",
                          f"{config['training']['optimizer'].get('decay_vectors', True)!r} in the config, "
                          f"{saved_value(parent.payload['config'], 'training.optimizer.decay_vectors')!r} in "
                          f"{parent.path}: training.init_optimizer carries the state of the same parameter groups only")
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict(parent.payload["optimizer"])
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ConfigError(source, "training.init_optimizer",
                          f"the optimizer state of {parent.path} does not fit this model ({first_line(exc)})") from None
    for group, settings in zip(optimizer.param_groups, hyper):
        group.update(settings)


def describe(parent: Parent, init_optimizer_state: bool, fields: tuple[Field, Field] | None = None) -> str:
    """One line for the log: what the new run took from ``parent`` (``fields``: the run's, where
    they extend the parent's)."""
    step = parent.payload.get("step")
    sizes = f"source {len(parent.src_field.vocab)}, target {len(parent.tgt_field.vocab)} types"
    if fields is not None and (len(fields[0].vocab), len(fields[1].vocab)) != (len(parent.src_field.vocab),
                                                                              len(parent.tgt_field.vocab)):
        sizes += f", extended to {len(fields[0].vocab)} and {len(fields[1].vocab)}"
    return (f"fine-tuning from {parent.path}{f' (step {step})' if step is not None else ''}: its weights, "
            f"tokenizers and vocabularies ({sizes}){' and optimizer state' if init_optimizer_state else ''}; step, "
            f"{'' if init_optimizer_state else 'optimizer, '}lr schedule and early stopping start fresh")


def _architecture_error(parent: Parent, model: torch.nn.Module, config: dict, source: str) -> ConfigError:
    parent_model_cfg = parent.payload["config"]["model"]
    target = _shapes(parent.payload["model"])
    differences = config_differences(parent_model_cfg, config["model"], "model")
    culprit = next((key for key in differences if _changes_parameters(parent, key, config, target)),
                   differences[0] if differences else None)
    if culprit is not None:
        mine, theirs = config_value(config, culprit), saved_value(parent.payload["config"], culprit)
        return ConfigError(source, culprit, f"{mine!r} in the config, {theirs!r} in {parent.path}: fine-tuning "
                           "(training.init_from) needs the parent's architecture")
    ours = _shapes(model.state_dict())
    name = next(n for n in list(target) + list(ours) if target.get(n) != ours.get(n))
    return ConfigError(source, "model", f"parameter {name}: shape {ours.get(name)} in the model of the config, "
                       f"{target.get(name)} in {parent.path}: fine-tuning (training.init_from) needs the parent's "
                       "architecture")


def _changes_parameters(parent: Parent, key: str, config: dict, target: dict[str, tuple[int, ...]]) -> bool:
    """Whether the parent's model section with ``key`` set to ``config``'s value builds other
    parameters than ``target`` (built on the meta device: no memory, no initialisation)."""
    from nmt.models import build_model

    trial = copy.deepcopy(parent.payload["config"]["model"])
    node, parts = trial, key.split(".")[1:]
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    value = config_value(config, key)
    node[parts[-1]] = copy.deepcopy(value)
    try:
        with torch.device("meta"):
            built = build_model(trial, len(parent.src_field.vocab), len(parent.tgt_field.vocab),
                                pad_index=parent.tgt_field.vocab.pad_index)
    except Exception:  # noqa: BLE001 - a combination the builder refuses: not this key alone
        return False
    return _shapes(built.state_dict()) != target


def _shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in state.items()}




def warn_unknown_tokens(parent: Parent, unk_tokens: UnkCounts | None) -> None:
    """One warning when the new training data (``unk_tokens``: the dataset's ``<unk>`` counts) has
    tokens the parent's vocabularies lack: they are all ``<unk>`` in this run, which cannot learn
    them (new characters or words need a new vocabulary, so a run of its own)."""
    shares = unk_shares(unk_tokens)
    if shares:
        logger.warning("training data: %s are <unk>: tokens %s's vocabularies lack (a fine-tuned run keeps its "
                       "parent's vocabularies and cannot learn new tokens; training.init_vocab: extend adds them)",
                       shares, parent.path)


__all__ = ["VOCABULARY_KEYS", "Parent", "check_init_from", "describe", "extended_fields", "init_checkpoint_path",
           "init_model",
           "init_optimizer", "load_parent", "warn_unknown_tokens"]
