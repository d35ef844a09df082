"""The configuration layer: YAML loading, the option schema, validation.

``load_config(path, overrides)`` returns a fully resolved config dict; every problem is a
one-line :class:`ConfigError` ``<file>: <key>: <problem>``. Modules: ``errors``
(ConfigError), ``schema`` (the Option / validate machinery), ``options`` (the SCHEMA tree of
every section and key), ``validation`` (cross-checks against the ``nmt.sparse`` registry,
tokenizers and continuous attention), ``loading`` (read, override, resolve, save, diff).
Imports: ``nmt.sparse`` and ``nmt.utils``; ``nmt.data`` / ``nmt.models`` only lazily, inside
the checks that construct a tokenizer or continuous attention.
"""
from nmt.config.errors import ConfigError, unknown_name_error
from nmt.config.loading import (
    added_at_default,
    apply_overrides,
    config_differences,
    config_value,
    dump_config,
    load_config,
    parse_override,
    read_yaml,
    resolve_config,
    resume_defaults,
    save_config,
    saved_value,
)
from nmt.config.options import HIGHER_IS_BETTER, METRICS, RESUME_DEFAULTS, SCHEMA
from nmt.config.schema import REQUIRED, Option, Schema, validate
from nmt.config.validation import check_config, check_mapping, registered_mappings

__all__ = [
    "ConfigError", "unknown_name_error", "Option", "REQUIRED", "Schema", "validate", "SCHEMA", "METRICS",
    "HIGHER_IS_BETTER", "load_config", "resolve_config", "apply_overrides", "parse_override", "read_yaml",
    "RESUME_DEFAULTS", "added_at_default", "resume_defaults", "saved_value", "config_differences", "config_value", "dump_config", "save_config", "check_config", "check_mapping", "registered_mappings",
]
