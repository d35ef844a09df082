"""configs/reference.yaml lists every option: the schema's keys, and inside the free-form
sections the tokenizer keys by type, the mapping parameters by mapping and the continuous
attention keys, each with its default (read from the code's signatures), and it validates."""
from __future__ import annotations

import copy
import inspect
import re
from pathlib import Path

import pytest
import yaml

from nmt.config import resolve_config
from nmt.config.options import SCHEMA
from nmt.config.schema import Option
from nmt.data.tokenizers import TOKENIZERS
from nmt.models.continuous_attention import ContinuousAttention
from nmt.sparse import registry

REFERENCE = Path(__file__).resolve().parents[2] / "configs" / "reference.yaml"
TEXT = REFERENCE.read_text(encoding="utf-8")
CONFIG = yaml.safe_load(TEXT)


def catalogue(header: str) -> dict[str, dict]:
    """The ``#   name: {...}`` comment lines under the comment line containing ``header``."""
    lines = TEXT.splitlines()
    start = next(i for i, line in enumerate(lines) if header in line)
    entries: dict[str, dict] = {}
    for line in lines[start + 1:]:
        match = re.fullmatch(r"\s*#\s{3}(\w+): (\{.*\})\s*", line)
        if not match:
            break
        entries[match.group(1)] = yaml.safe_load(match.group(2))
    assert entries, f"no entries under {header!r} in {REFERENCE.name}"
    return entries


def defaults(function, skip: set[str] = frozenset()) -> dict:
    """Keyword parameters of ``function`` (not self, *args, **kwargs, ``skip``) and their defaults."""
    return {p.name: p.default for p in inspect.signature(function).parameters.values()
            if p.name != "self" and p.name not in skip and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def schema_keys(schema: dict, prefix: str = "") -> list[str]:
    out = []
    for key, spec in schema.items():
        out += [prefix + key] if isinstance(spec, Option) else schema_keys(spec, prefix + key + ".")
    return out


def test_every_schema_key_is_in_the_reference_and_nothing_else():
    def walk(node: dict, prefix: str = "") -> list[str]:
        out = []
        for key, value in node.items():
            spec = SCHEMA
            for part in (prefix + key).split("."):
                spec = spec[part]
            out += [prefix + key] if isinstance(spec, Option) else walk(value, prefix + key + ".")
        return out

    assert sorted(walk(CONFIG)) == sorted(schema_keys(SCHEMA))


def test_tokenizer_keys_by_type():
    from nmt.data.tokenizers import _STATE_ONLY

    listed = catalogue("keys by tokenizer type")
    assert set(listed) == set(TOKENIZERS)
    for name, cls in TOKENIZERS.items():
        assert listed[name] == defaults(cls.__init__, set(_STATE_ONLY.get(name, ()))), name


@pytest.mark.parametrize("section", ["attention", "output"])
def test_mapping_parameters_by_mapping(section):
    header = "parameters by mapping" if section == "attention" else "parameters by output mapping"
    listed = catalogue(header)
    names = [n for n in registry.MAPPING_NAMES if section == "attention" or _has_loss(n)]
    assert list(listed) == names
    for name in names:
        # output params go to the mapping and its loss: the ones both take
        accepted = [p for p in registry.mapping_parameters(name)
                    if section == "attention" or p in registry.loss_parameters(name)]
        expected = {p: defaults(registry.mapping_function(name))[p] for p in accepted}
        assert listed[name] == expected, name


def _has_loss(name: str) -> bool:
    try:
        registry.check_loss(name, {})
    except ValueError:
        return False
    return True


def test_continuous_attention_keys():
    listed = catalogue("continuous attention keys")
    assert list(listed) == ["continuous"] and listed["continuous"] == defaults(ContinuousAttention.__init__)


def test_every_listed_setting_validates():
    resolve_config(CONFIG, REFERENCE.name)
    settings = []
    for name, keys in catalogue("keys by tokenizer type").items():
        settings.append((("data", "src", "tokenizer"), {"type": name, **keys}))
    for name, params in catalogue("parameters by mapping").items():
        settings.append((("model", "attention"), {**CONFIG["model"]["attention"], "mapping": name, "params": params}))
    for name, params in catalogue("parameters by output mapping").items():
        settings.append((("model", "output"), {"mapping": name, "params": params}))
    settings.append((("model", "attention", "continuous"), catalogue("continuous attention keys")["continuous"]))
    for path, value in settings:
        config = copy.deepcopy(CONFIG)
        node = config
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        resolve_config(config, f"{REFERENCE.name} with {'.'.join(path)} = {value}")


def test_reference_values_are_the_schema_defaults():
    """The file says it lists every option *with its default*: each value is the schema's default,
    except training.max_steps, whose default is null but one of the three limits must be set (the
    file says so next to it)."""
    from nmt.config.schema import REQUIRED

    example_only = {"training.max_steps"}
    differ = []
    for key in schema_keys(SCHEMA):
        spec, value = SCHEMA, CONFIG
        for part in key.split("."):
            spec, value = spec[part], value[part]
        if spec.default is REQUIRED or key in example_only:
            continue
        if value != spec.default or (value is not None and type(value) is not type(spec.default)):
            differ.append(f"{key}: reference {value!r}, schema {spec.default!r}")
    assert not differ, differ
    assert SCHEMA["training"]["max_steps"].default is None
    assert "The default is null" in TEXT.split("max_steps: 10000", 1)[1][:200]
