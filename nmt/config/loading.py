"""Load, override, resolve and save nmt YAML configs.

``load_config(path, overrides)`` reads the YAML file, applies ``-set key.path=value``
overrides, checks every section against :data:`nmt.config.options.SCHEMA` (unknown key,
wrong type, bad choice; :mod:`nmt.config.schema`), then runs the cross-checks of
:mod:`nmt.config.validation`. Every problem is a one-line :class:`ConfigError`
``<file>: <key>: <problem> (did you mean ...?)``.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Iterable

import yaml

from nmt.config.errors import ConfigError, unknown_name_error
from nmt.config.options import RESUME_DEFAULTS, SCHEMA
from nmt.config.schema import REQUIRED, ListableSection, Option, validate
from nmt.config.validation import check_config
from nmt.utils.io import atomic_write_text


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML forbids it; PyYAML would keep
    the last one silently; keys brought in by a merge, ``<<: *anchor``, may be overridden) and reads
    ``1e-3`` as a number (below)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in first:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first on line {first[key]})", key_node.start_mark)
                first[key] = key_node.start_mark.line + 1
            except TypeError:  # an unhashable key: the base class says so
                break
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) needs a dot and a signed exponent in a float: 1e-3, 1E5 and 1.0e5 would be strings,
# refused wherever a number is checked as such (mapping parameters, continuous attention, lists)
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def read_yaml(path: str | Path) -> dict:
    """Parse a YAML file into a dict; one-line ConfigError for a missing file or bad YAML."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(source, "", "no such config file") from None
    except UnicodeDecodeError as exc:  # where, as for data files (not the byte offset)
        line, line_start = raw.count(b"\n", 0, exc.start) + 1, raw.rfind(b"\n", 0, exc.start) + 1
        raise ConfigError(source, "", f"cannot read config: line {line}: not valid UTF-8 "
                          f"(byte 0x{raw[exc.start]:02x} at column {exc.start - line_start + 1})") from None
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read config: {exc}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
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
        value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw.strip() else None
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


def added_at_default(old: dict, new: dict, key: str) -> bool:
    """Whether ``key`` is an option (or section) that ``old`` (a checkpoint's config, written by an
    older nmt) lacks and ``new`` leaves at its schema default: the behaviour the old run had, so
    no difference to its resume (e.g. ``data.src.subword_sampling``, off by default). A list of
    sections (``data.train``: several corpora) is such a difference when its items differ only by
    keys of that kind (e.g. each corpus's ``src_tag``, null by default)."""
    if _items_added_at_default(old, new, key):
        return True
    node: Any = old
    for part in key.split("."):
        if not isinstance(node, dict):
            return False
        if part not in node:
            break
        node = node[part]
    else:
        return False  # present in the old config
    found, default = _schema_default(key)
    return found and config_value(new, key) == default


def _schema_default(key: str) -> tuple[bool, Any]:
    """``(True, the schema's default of key)`` (an option's, or a section's resolved from nothing),
    ``(False, None)`` where the schema has no such key or it is required."""
    spec = config_value(SCHEMA, key)
    if spec is None:
        return False, None
    default = spec.default if isinstance(spec, Option) else validate({}, spec, "<schema>", key)
    return default is not REQUIRED, None if default is REQUIRED else default


def saved_value(old: dict, key: str) -> Any:
    """The value of dotted ``key`` that the run of ``old`` (a checkpoint's resolved config) had,
    for messages that set it beside a config's: ``old``'s own, or where ``old`` lacks the key (an
    nmt older than the option wrote it) the behaviour that run had: the earlier value of
    :data:`nmt.config.options.RESUME_DEFAULTS`, else the schema's default; None where neither
    says (a key the schema does not know)."""
    found, value = _lookup(old, key)
    if found:
        return value
    if key in RESUME_DEFAULTS:
        return RESUME_DEFAULTS[key]
    return _schema_default(key)[1]


def _items_added_at_default(old: dict, new: dict, key: str) -> bool:
    """Whether ``key`` holds in both configs lists of sections of one length whose items differ
    only by keys the old item lacks and the new one leaves at the schema's default."""
    (found_old, items_old), (found_new, items_new) = _lookup(old, key), _lookup(new, key)
    spec = config_value(SCHEMA, key)
    if not (found_old and found_new and isinstance(spec, ListableSection) and isinstance(items_old, list)
            and isinstance(items_new, list) and len(items_old) == len(items_new)):
        return False
    defaults = _item_defaults(spec)
    for a, b in zip(items_old, items_new):
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return False
        for name in config_differences(a, b):
            if name in a or name not in defaults or b.get(name) != defaults[name]:
                return False
    return True


def _item_defaults(spec: ListableSection) -> dict:
    """The defaults of a listable section's optional keys and subsections (required ones left out)."""
    return {name: option.default if isinstance(option, Option) else validate({}, option, "<schema>", name)
            for name, option in spec.items() if not (isinstance(option, Option) and option.default is REQUIRED)}


def _lookup(config: Any, dotted: str) -> tuple[bool, Any]:
    """``(found, value)`` of dotted key ``dotted`` in nested dicts (``(False, None)`` where a part of
    the path is missing)."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _set_key(config: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def resume_defaults(old: dict, new: dict) -> list[str]:
    """Give a resumed run the behaviour its checkpoint ran with where a default has changed since.

    For every key of :data:`nmt.config.options.RESUME_DEFAULTS` that ``old`` (the checkpoint's
    config, written before the option existed) lacks: ``old`` gets the earlier behaviour's value
    (what that run did), and so does ``new`` (the resolved config of the resume) where it holds
    the schema default, i.e. the key was not set or was set to the default. A value set to
    anything else stays, and then differs from the checkpoint's. Both dicts are changed in place;
    returns the keys ``new`` took the earlier value for."""
    kept: list[str] = []
    for key, before in RESUME_DEFAULTS.items():
        if _lookup(old, key)[0] or not isinstance(old.get(key.split(".")[0]), dict):
            continue
        _set_key(old, key, before)
        if config_value(new, key) == config_value(SCHEMA, key).default:
            _set_key(new, key, before)
            kept.append(key)
    return kept


def config_value(config: Any, dotted: str) -> Any:
    """The value at dotted key ``dotted`` (``"model.decoder.hidden_size"``) of a resolved config,
    None where a part of the path is missing (a config of an older nmt, say)."""
    return _lookup(config, dotted)[1]


def dump_config(config: dict) -> str:
    """YAML text of a resolved config (section order preserved)."""
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False, allow_unicode=True)


def save_config(config: dict, path: str | Path) -> None:
    """Write the resolved config to ``path`` atomically."""
    atomic_write_text(path, dump_config(config))


__all__ = ["added_at_default", "resume_defaults", "saved_value", "load_config", "resolve_config", "apply_overrides", "parse_override", "read_yaml",
           "config_differences", "config_value", "save_config", "dump_config"]
