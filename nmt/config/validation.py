"""Cross-checks of a schema-valid config: what the option schema alone cannot check.

Mapping and loss names and parameters are checked by the ``nmt.sparse`` registry (the one
checker, :func:`nmt.sparse.check_mapping` / :func:`nmt.sparse.check_loss`); this module only
adds the YAML key to its plain ``ValueError`` (the name under ``<section>.mapping``, each
parameter, checked on its own, under ``<section>.params.<name>``). Also checked here:
continuous-attention keyword arguments (names by signature, values by constructing
``ContinuousAttention``), tokenizer
types and keys, and a few cross-key constraints. Every problem is a one-line
:class:`ConfigError` naming the file and the key.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from nmt.config.errors import ConfigError, unknown_name_error
from nmt.config.options import DECODING_METRICS
from nmt.utils.exception_text import first_line
from nmt.sparse import registry

_SIMPLE = (int, float, bool, str, list, type(None))


def check_config(config: dict, source: str) -> None:
    """Checks beyond types: mappings and their parameters, losses, tokenizers, limits."""
    model = config["model"]
    if model["type"] == "transformer":
        check_head_mapping(model["attention"]["mapping"], model["attention"]["params"], source, "model.attention")
    else:
        check_mapping(model["attention"]["mapping"], model["attention"]["params"], source, "model.attention")
    check_mapping(model["output"]["mapping"], model["output"]["params"], source, "model.output")
    check_loss(model["output"]["mapping"], model["output"]["params"], source)
    if model["attention"]["continuous"] is not None:  # the RNN's attention, a Transformer's cross-attention
        check_continuous(model["attention"]["continuous"], source)
    if model["type"] == "transformer":
        for kind in ("encoder_self", "decoder_self", "cross"):
            check_attention_kind(model["attention"], kind, source)
    data = config["data"]
    for side in ("src", "tgt"):
        check_tokenizer(data[side]["tokenizer"], source, f"data.{side}.tokenizer")
    check_subword_sampling(data, source)
    check_corpora(data, source)
    check_extra_valid(data, source)
    check_source_tags(data, source)
    check_source_noise(data, source)
    check_pair_filter(data, source)
    if data["shared_vocab"] and data["tgt"]["vocab_file"] not in (None, data["src"]["vocab_file"]):
        raise ConfigError(source, "data.tgt.vocab_file", "with data.shared_vocab one vocabulary serves both sides: "
                          "set data.src.vocab_file (and leave this key null)")
    if model["embeddings"]["share"] and not data["shared_vocab"]:
        raise ConfigError(source, "model.embeddings.share", "sharing embeddings needs data.shared_vocab: true")
    if (model["type"] == "rnn" and model["embeddings"]["share"]
            and model["embeddings"]["src_size"] != model["embeddings"]["tgt_size"]):
        raise ConfigError(source, "model.embeddings.share", "shared embeddings need src_size == tgt_size")
    check_pretrained_embeddings(model, source)
    check_positions(config, source)
    training = config["training"]
    if training["max_steps"] is None and training["max_epochs"] is None and training["max_minutes"] is None:
        raise ConfigError(source, "training.max_steps",
                          "set training.max_steps, training.max_epochs or training.max_minutes")
    check_lr_schedule(training, source)
    check_freeze(training, source)
    check_validation_metrics(config["validation"], source)
    check_optimizer(training["optimizer"], source)


OPTIMIZER_READS = {"adam": ("betas", "eps"), "adamw": ("betas", "eps"), "sgd": ("momentum", "nesterov"),
                   "adafactor": ("adafactor",)}
"""The ``training.optimizer`` keys each optimizer reads besides ``name``, ``lr``, ``weight_decay`` and
``decay_vectors``."""


def check_optimizer(cfg: dict, source: str) -> None:
    """``training.optimizer``: the keys the named optimizer does not read keep their defaults (a
    ``momentum`` given to adam is a mistake, not a no-op), Nesterov momentum needs a momentum,
    ``decay_vectors: false`` a weight decay, the betas are two numbers in [0, 1). One-line :class:`ConfigError` naming the key."""
    from nmt.config.options import TRAINING

    name = cfg["name"]
    for key, option in TRAINING["optimizer"].items():
        if key in ("name", "lr", "weight_decay", "decay_vectors") or key in OPTIMIZER_READS[name]:
            continue
        default = option.default if not isinstance(option, dict) else {k: o.default for k, o in option.items()}
        if cfg[key] != default:
            changed = key if not isinstance(option, dict) else next(
                f"{key}.{k}" for k in option if cfg[key][k] != default[k])
            readers = ", ".join(n for n, keys in OPTIMIZER_READS.items() if key in keys)
            raise ConfigError(source, f"training.optimizer.{changed}",
                              f"the {name} optimizer does not read it (only {readers}): remove it")
    if not cfg["decay_vectors"] and cfg["weight_decay"] == 0:
        raise ConfigError(source, "training.optimizer.decay_vectors",
                          "false needs training.optimizer.weight_decay > 0 (there is no decay to leave out)")
    if name == "sgd" and cfg["nesterov"] and cfg["momentum"] == 0:
        raise ConfigError(source, "training.optimizer.nesterov", "true needs training.optimizer.momentum > 0")
    betas = cfg["betas"]
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas):
        raise ConfigError(source, "training.optimizer.betas", f"must be two numbers in [0, 1), got {betas!r}")


def check_freeze(training: dict, source: str) -> None:
    """``training.freeze``: model parts (:data:`nmt.models.encoder_decoder.PARTS`), each once."""
    from nmt.models.encoder_decoder import PARTS

    check_names(training["freeze"], PARTS, "training.freeze", "model part", source)


def check_names(names: list, valid: tuple[str, ...], key: str, what: str, source: str) -> None:
    """A list option of names (``validation.metrics``, ``training.freeze``): each one of ``valid``,
    each once; a one-line ConfigError naming ``key[i]`` (``unknown <what> 'x'; valid: ...``)."""
    for i, name in enumerate(names):
        if name not in valid:
            raise ConfigError(source, f"{key}[{i}]", f"unknown {what} {name!r}; valid: {', '.join(valid)}")
        if name in names[:i]:
            raise ConfigError(source, f"{key}[{i}]", f"{name!r} is listed twice")


def check_validation_metrics(validation: dict, source: str) -> None:
    """``validation.metrics``: known decoding metrics, each once, holding ``validation.metric``
    when that is a decoding metric (loss and accuracy are always computed)."""
    metrics = validation["metrics"]
    check_names(metrics, DECODING_METRICS, "validation.metrics", "decoding metric", source)
    metric = validation["metric"]
    if metric in DECODING_METRICS and metric not in metrics:
        raise ConfigError(source, "validation.metrics",
                          f"validation.metric is {metric!r}, which this list leaves out (add it)")


def check_pretrained_embeddings(model: dict, source: str) -> None:
    """``model.embeddings.pretrained`` with ``share``: one table, filled by ``src`` and frozen by
    ``freeze_src``; ``tgt`` / ``freeze_tgt`` set as well is an error naming the key."""
    if not model["embeddings"]["share"]:
        return
    pretrained = model["embeddings"]["pretrained"]
    key = "model.embeddings.pretrained"
    if pretrained["tgt"] is not None:
        raise ConfigError(source, f"{key}.tgt", "with model.embeddings.share one table serves both sides: "
                          f"{key}.src fills it (leave this key null)")
    if pretrained["freeze_tgt"]:
        raise ConfigError(source, f"{key}.freeze_tgt", "with model.embeddings.share one table serves both "
                          f"sides: {key}.freeze_src freezes it (leave this key false)")


def check_positions(config: dict, source: str) -> None:
    """A Transformer with learned positions holds ``model.transformer.max_positions`` source tokens
    and as many decoder inputs (BOS + target tokens): the longest training pair
    (``data.<side>.max_length``) and the validation search (``validation.max_length`` tokens
    before EOS) must fit, else a run fails mid-way. One line naming both keys."""
    model = config["model"]
    if model["type"] != "transformer" or model["transformer"]["positions"] != "learned":
        return
    limit = model["transformer"]["max_positions"]
    table = f"model.transformer.max_positions={limit} (learned positions) hold"
    longest = config["data"]["src"]["max_length"]
    if longest > limit:
        raise ConfigError(source, "data.src.max_length", f"{longest} source tokens need more positions than {table}")
    targets = [("data.tgt.max_length", config["data"]["tgt"]["max_length"], "target tokens")]
    if config["validation"]["decode"]:
        targets.append(("validation.max_length", config["validation"]["max_length"], "hypothesis tokens"))
    for key, n, what in targets:
        if n + 1 > limit:
            raise ConfigError(source, key, f"{n} {what} need {n + 1} decoder positions (BOS + tokens), more than "
                              f"{table}; at most {limit - 1}")


def check_pair_filter(data: dict, source: str) -> None:
    """The training pairs' length rules (:class:`nmt.data.pair_filter.PairFilter`): ``data.max_length_ratio``
    null, 0 or >= 1, and each side's ``min_length`` at most its ``max_length``; one line naming the key."""
    from nmt.data.errors import DataError
    from nmt.data.pair_filter import PairFilter

    try:
        PairFilter.from_config(data)
    except DataError as exc:
        key, _, problem = str(exc).partition(": ")
        raise ConfigError(source, key, problem) from None


def check_corpora(data: dict, source: str) -> None:
    """``data.train`` as a list of corpora: not with ``data.generate`` (it writes one pair of
    training files). With ``data.id_cache`` each corpus gets its own cache."""
    if not isinstance(data["train"], list):
        return
    if data["generate"] is not None:
        raise ConfigError(source, "data.generate", "generates one training corpus, but data.train is a list: "
                          "give data.train as one {src, tgt} mapping")


def keyed_corpora(data: dict) -> list[tuple[str, dict]]:
    """``(key, section)`` of each training corpus: ``data.train[i]`` of a list, ``data.train`` of one mapping."""
    train = data["train"]
    return [(f"data.train[{i}]", c) for i, c in enumerate(train)] if isinstance(train, list) else [("data.train", train)]


def check_source_noise(data: dict, source: str) -> None:
    """A corpus's ``noise`` not with its ``align``: the references name the un-noised source words
    (one line naming the key)."""
    from nmt.data.source_noise import NoiseSettings

    for key, corpus in keyed_corpora(data):
        if corpus["align"] is not None and NoiseSettings.from_config(corpus["noise"]).active:
            raise ConfigError(source, f"{key}.noise", "noise moves and removes the source words that "
                              f"{key}.align names: give the aligned corpus without noise (or as a second, "
                              "unaligned corpus)")


def check_extra_valid(data: dict, source: str) -> None:
    """``data.extra_valid``: each entry a section of :data:`nmt.config.options.EXTRA_VALID` (resolved in
    place), names distinct, without whitespace and other than ``valid``; one line naming the key."""
    from nmt.config.options import EXTRA_VALID
    from nmt.config.schema import validate

    resolved, seen = [], set()
    for i, entry in enumerate(data["extra_valid"]):
        key = f"data.extra_valid[{i}]"
        entry = validate(entry, EXTRA_VALID, source, key)
        name = entry["name"]
        if not name or any(c.isspace() for c in name) or name == "valid":
            raise ConfigError(source, f"{key}.name", f"a name without whitespace other than 'valid', got {name!r}")
        if name in seen:
            raise ConfigError(source, f"{key}.name", f"{name!r} names an earlier set too")
        seen.add(name)
        resolved.append(entry)
    data["extra_valid"] = resolved


def check_source_tags(data: dict, source: str) -> None:
    """Each ``src_tag`` (``data.train``'s, ``data.train[i]``'s, ``data.valid``'s) a non-empty string
    without whitespace, not a special (:func:`nmt.data.source_tags.tag_problem`); one line naming the key."""
    from nmt.data.source_tags import tag_problem

    keyed = [(f"{key}.src_tag", corpus.get("src_tag")) for key, corpus in keyed_corpora(data)]
    extra = [(f"data.extra_valid[{i}].src_tag", entry.get("src_tag")) for i, entry in enumerate(data["extra_valid"])]
    for key, tag in keyed + [("data.valid.src_tag", data["valid"].get("src_tag"))] + extra:
        problem = None if tag is None else tag_problem(tag)
        if problem is not None:
            raise ConfigError(source, key, problem)


def check_subword_sampling(data: dict, source: str) -> None:
    """``data.<side>.subword_sampling`` against the tokenizer that side uses (the src one under
    ``shared_vocab`` / ``shared_tokenizer``), ``nbest`` in {-1} or >= 1, and ``vocab_samples``
    (:func:`_check_vocab_samples`). With ``data.id_cache`` the cache holds the deterministic ids and
    each epoch's segmentation is made by streaming the files (``nmt.data.epoch_segmentation.ResampledFiles``)."""
    from nmt.data.subword_sampling import sampling_problem

    shared = data["shared_vocab"] or data["shared_tokenizer"]
    for side in ("src", "tgt"):
        settings = data[side]["subword_sampling"]
        key = f"data.{side}.subword_sampling"
        if settings["nbest"] == 0:
            raise ConfigError(source, f"{key}.nbest", "must be -1 (all segmentations) or >= 1, got 0")
        tokenizer = data["src" if shared else side]["tokenizer"]
        problem = sampling_problem(settings, tokenizer)
        if problem is not None:
            raise ConfigError(source, f"{key}.{problem[0]}", problem[1])
        _check_vocab_samples(data, side, source)


def _check_vocab_samples(data: dict, side: str, source: str) -> None:
    """``data.<side>.subword_sampling.vocab_samples`` > 0 needs a vocabulary it counts (not a
    ``vocab_file``; under shared_vocab only data.src's, which counts both sides) and sampling on a
    side that vocabulary counts."""
    from nmt.data.subword_sampling import sampling_enabled

    key = f"data.{side}.subword_sampling.vocab_samples"
    if not data[side]["subword_sampling"]["vocab_samples"]:
        return
    if data["shared_vocab"] and side == "tgt":
        raise ConfigError(source, key, "the shared vocabulary (data.shared_vocab) is counted with data.src's "
                          "settings: set data.src.subword_sampling.vocab_samples instead")
    if data[side]["vocab_file"] is not None:
        raise ConfigError(source, key, f"the vocabulary is read from data.{side}.vocab_file, not counted: "
                          "set one of the two")
    counted = ("src", "tgt") if data["shared_vocab"] else (side,)
    if not any(sampling_enabled(data[s]["subword_sampling"]) for s in counted):
        raise ConfigError(source, key, "counts sampled segmentations, but " + " nor ".join(
            f"data.{s}.subword_sampling" for s in counted) + " samples (set alpha or dropout)")


def check_tokenizer(tokenizer_cfg: dict, source: str, prefix: str) -> None:
    """Tokenizer type and type-specific keys, checked by constructing the (untrained) tokenizer."""
    from nmt.data.errors import DataError
    from nmt.data.tokenizers import build_tokenizer

    try:
        build_tokenizer(tokenizer_cfg)
    except (DataError, TypeError, ValueError) as exc:
        message = first_line(exc)
        key, sep, problem = message.partition(": ")
        if sep and key.startswith("tokenizer"):
            raise ConfigError(source, prefix + key[len("tokenizer"):], problem) from None
        raise ConfigError(source, prefix, message) from None


def registered_mappings() -> tuple[str, ...]:
    """Names the nmt.sparse registry accepts (attention and output mappings)."""
    return tuple(registry.MAPPING_NAMES)


def check_mapping(name: str, params: dict, source: str, prefix: str) -> None:
    """``name`` must be a registered mapping and ``params`` parameters of it (checked by the registry)."""
    _keyed(source, f"{prefix}.mapping", registry.check_mapping, name, {})
    for key, value in params.items():
        _check_simple(value, source, f"{prefix}.params.{key}")
        _keyed(source, f"{prefix}.params.{key}", registry.check_mapping, name, {key: value})


def check_attention_kind(attention: dict, kind: str, source: str) -> None:
    """``model.attention.<kind>`` of a Transformer: a registered mapping and its parameters, where
    ``alpha: learned`` (one trainable alpha per head) is accepted for entmax_bisect."""
    section = attention[kind]
    if section["mapping"] is None and section["params"] is None:
        return  # inherits model.attention, checked on its own
    name = section["mapping"] if section["mapping"] is not None else attention["mapping"]
    check_head_mapping(name, section["params"] or {}, source, f"model.attention.{kind}")


def check_head_mapping(name: str, params: dict, source: str, prefix: str) -> None:
    """:func:`check_mapping`, where ``alpha: learned`` (with an optional ``alpha_init`` in
    [1.01, 2)) is accepted for entmax_bisect, and ``temperature`` (> 0) for any mapping."""
    from nmt.models.transformer.head_mapping import TEMPERATURE, head_temperature

    params = dict(params)
    if TEMPERATURE in params:
        try:
            head_temperature(params)
        except ValueError as err:
            raise ConfigError(source, f"{prefix}.params.{TEMPERATURE}", str(err)) from None
        del params[TEMPERATURE]
    if params.get("alpha") == "learned":
        if name != "entmax_bisect":
            raise ConfigError(source, f"{prefix}.params.alpha", f"'learned' needs mapping entmax_bisect, got {name!r}")
        del params["alpha"]
        if "alpha_init" in params:
            start = params.pop("alpha_init")
            if isinstance(start, bool) or not isinstance(start, (int, float)) or not 1.01 <= start < 2:
                raise ConfigError(source, f"{prefix}.params.alpha_init",
                                  f"the starting value of a learned alpha must be a number in [1.01, 2), got {start!r}")
    elif "alpha_init" in params:
        raise ConfigError(source, f"{prefix}.params.alpha_init", "needs alpha: learned (a trainable alpha per head)")
    check_mapping(name, params, source, prefix)


def check_loss(name: str, params: dict, source: str) -> None:
    """The output mapping must have a Fenchel-Young loss taking ``params`` (checked by the registry)."""
    try:
        registry.check_loss(name, {})
    except ValueError as exc:
        raise ConfigError(source, "model.output.mapping",
                          f"{name!r} cannot be an output mapping: {first_line(exc)}") from None
    for key, value in params.items():
        _keyed(source, f"model.output.params.{key}", registry.check_loss, name, {key: value})


def check_continuous(kwargs: dict, source: str) -> None:
    """Continuous-attention kwargs: names from ``ContinuousAttention.__init__``, values by constructing it."""
    from nmt.models.continuous_attention import ContinuousAttention

    prefix = "model.attention.continuous"
    parameters = [p for p in inspect.signature(ContinuousAttention.__init__).parameters.values()
                  if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    accepted = [p.name for p in parameters]
    for key, value in kwargs.items():
        if key not in accepted:
            raise unknown_name_error(source, f"{prefix}.{key}", "argument", key, accepted or ["(none)"],
                                     "ContinuousAttention")
        _check_simple(value, source, f"{prefix}.{key}")
    missing = [p.name for p in parameters if p.default is inspect.Parameter.empty and p.name not in kwargs]
    if missing:
        raise ConfigError(source, f"{prefix}.{missing[0]}", "is required but missing")
    _keyed(source, prefix, ContinuousAttention, **kwargs)  # its message starts with the argument's name


def _check_simple(value: Any, source: str, key: str) -> None:
    if not isinstance(value, _SIMPLE):
        raise ConfigError(source, key, f"must be a number, string, boolean or list, got {value!r}")


def _keyed(source: str, key: str, function: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call ``function``; its plain ValueError becomes a ConfigError naming ``source`` and ``key``."""
    try:
        return function(*args, **kwargs)
    except ValueError as exc:
        raise ConfigError(source, key, first_line(exc)) from None


__all__ = ["check_config", "check_positions", "check_subword_sampling", "check_tokenizer", "check_mapping", "check_attention_kind", "check_loss", "check_continuous",
           "registered_mappings"]


def check_lr_schedule(training: dict, source: str) -> None:
    """``training.lr_schedule``: the keys its type does not read keep their defaults (a
    ``decay_patience`` given to ``cosine`` is a mistake, not a no-op), and the type's own needs
    (a decay length for linear / cosine longer than the warmup, ``decay_steps`` for exponential,
    a warmup for noam, ``min_lr`` not above ``optimizer.lr`` where it is the end point, a warmup
    for ``warmup_init_lr``, which is not above ``optimizer.lr``, ``period_steps`` for cosine's
    ``t_mult`` / ``lr_shrink``; see :func:`nmt.config.lr_schedule.schedule_problem`).
    One-line :class:`ConfigError` naming the key."""
    from nmt.config.options import TRAINING
    from nmt.config.lr_schedule import READS, schedule_problem

    cfg = training["lr_schedule"]
    kind = cfg["type"]
    for key, option in TRAINING["lr_schedule"].items():
        if key != "type" and key not in READS[kind] and cfg[key] != option.default:
            readers = ", ".join(t for t, keys in READS.items() if key in keys)
            raise ConfigError(source, f"training.lr_schedule.{key}",
                              f"the {kind} schedule does not read it (only {readers}): remove it")
    if kind in ("linear", "cosine") and cfg["min_lr"] > training["optimizer"]["lr"]:
        raise ConfigError(source, "training.lr_schedule.min_lr", f"{cfg['min_lr']} is above training.optimizer.lr "
                          f"{training['optimizer']['lr']}: the {kind} schedule decays from lr to min_lr")
    problem = schedule_problem(cfg, training["max_steps"], training["optimizer"]["lr"])
    if problem is not None:
        raise ConfigError(source, *problem)
