"""Load, override, validate and save nmt YAML configs.

``load_config(path, overrides)`` reads the YAML file, applies ``-set key.path=value``
overrides, checks every section against :data:`nmt.utils.config_schema.SCHEMA` (unknown
key, wrong type, bad choice), then checks what the schema alone cannot: mapping names and
their parameters against the ``nmt.sparse`` registry (by signature), that the output
mapping has a loss, continuous-attention keyword arguments, tokenizer types, and a few
cross-key constraints. Every problem is a one-line :class:`ConfigError`
``<file>: <key>: <problem> (did you mean ...?)``.
"""
from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from nmt.utils.config_schema import SCHEMA
from nmt.utils.io import atomic_write_text
from nmt.utils.schema import ConfigError, Option, unknown_name_error, validate

_MAPPING_CALL_ARGS = {"scores", "dim", "mask", "X", "x", "input"}
_SIMPLE = (int, float, bool, str, list, type(None))


def read_yaml(path: str | Path) -> dict:
    """Parse a YAML file into a dict; one-line ConfigError for a missing file or bad YAML."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, "", "no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, "", f"cannot read config: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(source, "", f"invalid YAML: {where}{problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, "", f"the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def parse_override(item: str, source: str) -> tuple[list[str], Any]:
    """Split ``'a.b.c=value'`` into ``(['a', 'b', 'c'], value)``; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(source, item, "an override must look like key.path=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(source, key, "empty component in the key path")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(config: dict, overrides: Iterable[str], source: str) -> dict:
    """Return a copy of ``config`` with each ``key.path=value`` override set.

    Keys are checked against the schema as they are walked, so ``-set trainig.lr=1`` fails
    with the same one-line error (and suggestion) as the misspelt key in a file.
    """
    config = copy.deepcopy(config)
    for item in overrides:
        where = f"{source} (-set {item})"
        parts, value = parse_override(item, where)
        node, spec = config, SCHEMA
        for depth, part in enumerate(parts):
            dotted = ".".join(parts[: depth + 1])
            if isinstance(spec, dict):
                if part not in spec:
                    raise unknown_name_error(where, dotted, "key", part, sorted(spec))
                spec = spec[part]
            # below an Option (a free-form dict such as mapping params) any key is accepted
            if depth == len(parts) - 1:
                node[part] = value
            else:
                child = node.get(part)
                if child is None:
                    child = node[part] = {}
                elif not isinstance(child, dict):
                    raise ConfigError(where, dotted, f"is {type(child).__name__}, not a section")
                node = child
    return config


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> dict:
    """Read, override and validate a config file; return the fully resolved dict."""
    source, overrides = str(path), list(overrides)
    config = apply_overrides(read_yaml(path), overrides, source)
    try:
        return resolve_config(config, source)
    except ConfigError as exc:  # a bad value that came from -set: name the override
        for item in reversed(overrides):
            key = item.split("=", 1)[0].strip()
            if exc.key == key or exc.key.startswith(key + "."):
                raise ConfigError(f"{source} (-set {item})", exc.key, exc.problem) from None
        raise


def resolve_config(raw: dict, source: str = "<config>") -> dict:
    """Validate an already-parsed config dict and fill every default."""
    config = validate(raw, SCHEMA, source)
    check_config(config, source)
    return config


def check_config(config: dict, source: str) -> None:
    """Checks beyond types: mappings and their parameters, losses, tokenizers, limits."""
    model = config["model"]
    check_mapping(model["attention"]["mapping"], model["attention"]["params"], source, "model.attention")
    check_mapping(model["output"]["mapping"], model["output"]["params"], source, "model.output")
    check_loss(model["output"]["mapping"], model["output"]["params"], source)
    if model["attention"]["continuous"] is not None:
        check_continuous(model["attention"]["continuous"], source)
    data = config["data"]
    for side in ("src", "tgt"):
        check_tokenizer(data[side]["tokenizer"], source, f"data.{side}.tokenizer")
    if model["embeddings"]["share"] and not data["shared_vocab"]:
        raise ConfigError(source, "model.embeddings.share", "sharing embeddings needs data.shared_vocab: true")
    if model["embeddings"]["share"] and model["embeddings"]["src_size"] != model["embeddings"]["tgt_size"]:
        raise ConfigError(source, "model.embeddings.share", "shared embeddings need src_size == tgt_size")
    training = config["training"]
    if training["max_steps"] is None and training["max_epochs"] is None and training["max_minutes"] is None:
        raise ConfigError(source, "training.max_steps",
                          "set training.max_steps, training.max_epochs or training.max_minutes")
    betas = training["optimizer"]["betas"]
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas):
        raise ConfigError(source, "training.optimizer.betas", f"must be two numbers in [0, 1), got {betas!r}")


def check_tokenizer(tokenizer_cfg: dict, source: str, prefix: str) -> None:
    """Tokenizer type and type-specific keys, checked by constructing the (untrained) tokenizer."""
    from nmt.data.errors import DataError
    from nmt.data.tokenizers import build_tokenizer

    try:
        build_tokenizer(tokenizer_cfg)
    except (DataError, TypeError, ValueError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        key, sep, problem = message.partition(": ")
        if sep and key.startswith("tokenizer"):
            raise ConfigError(source, prefix + key[len("tokenizer"):], problem) from None
        raise ConfigError(source, prefix, message) from None


def registered_mappings() -> tuple[str, ...]:
    """Names the nmt.sparse registry accepts (attention and output mappings)."""
    from nmt.sparse import MAPPING_NAMES

    return tuple(MAPPING_NAMES)


def check_mapping(name: str, params: dict, source: str, prefix: str) -> None:
    """``name`` must be a registered mapping and ``params`` keyword arguments of it."""
    from nmt.sparse import mapping_function

    names = registered_mappings()
    if name not in names:
        raise unknown_name_error(source, f"{prefix}.mapping", "mapping", name, names)
    accepted = [p for p in _keyword_parameters(mapping_function(name)) if p not in _MAPPING_CALL_ARGS]
    _check_kwargs(params, accepted, source, f"{prefix}.params", "parameter", repr(name))


def check_loss(name: str, params: dict, source: str) -> None:
    """The output mapping must have a Fenchel-Young loss."""
    from nmt.sparse import get_loss

    try:
        get_loss(name, **params)
    except (ValueError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(source, "model.output.mapping", f"{name!r} cannot be an output mapping: {first}") from None


def check_continuous(kwargs: dict, source: str) -> None:
    """Continuous-attention kwargs must match ``ContinuousAttention.__init__``."""
    from nmt.models.continuous_attention import ContinuousAttention

    accepted = _keyword_parameters(ContinuousAttention.__init__)
    accepted = [p for p in accepted if p != "self"]
    _check_kwargs(kwargs, accepted, source, "model.attention.continuous", "argument", "ContinuousAttention")
    required = [p.name for p in inspect.signature(ContinuousAttention.__init__).parameters.values()
                if p.default is inspect.Parameter.empty and p.name != "self"
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    missing = [p for p in required if p not in kwargs]
    if missing:
        raise ConfigError(source, f"model.attention.continuous.{missing[0]}", "is required but missing")


def _keyword_parameters(function: Callable) -> list[str]:
    params = inspect.signature(function).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _check_kwargs(kwargs: dict, accepted: list[str], source: str, prefix: str, what: str, owner: str) -> None:
    for key, value in kwargs.items():
        if key not in accepted:
            raise unknown_name_error(source, f"{prefix}.{key}", what, key, accepted or ["(none)"], owner)
        if not isinstance(value, _SIMPLE):
            raise ConfigError(source, f"{prefix}.{key}", f"must be a number, string, boolean or list, got {value!r}")


def config_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two resolved configs (``old`` vs ``new``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        diffs: list[str] = []
        for key in list(old) + [k for k in new if k not in old]:
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old or key not in new:
                diffs.append(path)
            else:
                diffs.extend(config_differences(old[key], new[key], path))
        return diffs
    return [] if old == new else [prefix]


def dump_config(config: dict) -> str:
    """YAML text of a resolved config (section order preserved)."""
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False, allow_unicode=True)


def save_config(config: dict, path: str | Path) -> None:
    """Write the resolved config to ``path`` atomically."""
    atomic_write_text(path, dump_config(config))


__all__ = ["ConfigError", "load_config", "resolve_config", "apply_overrides", "parse_override", "read_yaml",
           "check_config", "check_mapping", "config_differences", "registered_mappings", "save_config", "dump_config", "Option"]
