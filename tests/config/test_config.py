"""Config loading: schema defaults, overrides, and one-line errors naming key and file."""
from pathlib import Path

import pytest
import yaml

from nmt.config import (ConfigError, Option, apply_overrides, config_differences, dump_config, load_config,
                        parse_override, resolve_config, save_config, validate)
from nmt.config.options import SCHEMA

MINIMAL = {
    "data": {"train": {"src": "a.src", "tgt": "a.tgt"}, "valid": {"src": "v.src", "tgt": "v.tgt"}},
    "training": {"save_dir": "runs/x", "max_steps": 10},
}


def write(tmp_path: Path, config: dict, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def error_of(path, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    return message


def test_defaults_filled_for_every_schema_key(tmp_path):
    config = load_config(write(tmp_path, MINIMAL))

    def walk(schema, node, prefix=""):
        for key, spec in schema.items():
            assert key in node, prefix + key
            if isinstance(spec, Option):
                if spec.default is not None and key not in ("save_dir", "max_steps", "src", "tgt"):
                    assert node[key] == spec.default or isinstance(spec.default, dict), prefix + key
            else:
                walk(spec, node[key], prefix + key + ".")

    walk(SCHEMA, config)
    assert config["model"]["attention"]["mapping"] == "entmax15"
    assert config["training"]["optimizer"]["lr"] == 1e-3


def test_unknown_key_suggests_closest(tmp_path):
    bad = {**MINIMAL, "training": {**MINIMAL["training"], "lerning_rate": 0.1, "max_step": 3}}
    bad["training"].pop("lerning_rate")
    message = error_of(write(tmp_path, bad))
    assert "training.max_step" in message and "did you mean 'max_steps'" in message


def test_unknown_section_and_nested_key(tmp_path):
    assert "did you mean 'model'" in error_of(write(tmp_path, {**MINIMAL, "modle": {}}))
    nested = {**MINIMAL, "model": {"encoder": {"hiden_size": 8}}}
    message = error_of(write(tmp_path, nested))
    assert "model.encoder.hiden_size" in message and "did you mean 'hidden_size'" in message


@pytest.mark.parametrize("key, value, expected", [
    (("training", "batch_size"), "sixty", "training.batch_size: must be an integer"),
    (("training", "batch_size"), 3.5, "training.batch_size: must be an integer"),
    (("training", "batch_size"), True, "training.batch_size: must be an integer"),
    (("training", "progress"), "yes please", "training.progress: must be true/false"),
    (("model", "embeddings"), 5, "model.embeddings: must be a section"),
    (("training", "optimizer", "lr"), "fast", "training.optimizer.lr: must be a number"),
    (("training", "batch_size"), 0, "training.batch_size: must be >= 1"),
])
def test_wrong_type(tmp_path, key, value, expected):
    config = yaml.safe_load(yaml.safe_dump(MINIMAL))
    node = config
    for part in key[:-1]:
        node = node.setdefault(part, {})
    node[key[-1]] = value
    assert expected in error_of(write(tmp_path, config))


def test_numeric_strings_are_floats(tmp_path):
    config = {**MINIMAL, "training": {**MINIMAL["training"], "optimizer": {"lr": "1e-3"}}}
    assert load_config(write(tmp_path, config))["training"]["optimizer"]["lr"] == 1e-3


def test_bad_choice_suggests(tmp_path):
    config = {**MINIMAL, "model": {"attention": {"score": "genral"}}}
    message = error_of(write(tmp_path, config))
    assert "model.attention.score" in message and "did you mean 'general'" in message


def test_unknown_mapping_name(tmp_path):
    config = {**MINIMAL, "model": {"attention": {"mapping": "entmx15"}}}
    message = error_of(write(tmp_path, config))
    assert "model.attention.mapping: unknown mapping 'entmx15'" in message
    assert "did you mean 'entmax15'" in message
    config = {**MINIMAL, "model": {"output": {"mapping": "sparsmax"}}}
    assert "model.output.mapping" in error_of(write(tmp_path, config))


def test_unknown_mapping_parameter(tmp_path):
    config = {**MINIMAL, "model": {"attention": {"mapping": "entmax_bisect", "params": {"alfa": 1.3}}}}
    message = error_of(write(tmp_path, config))
    assert "model.attention.params.alfa" in message and "did you mean 'alpha'" in message
    config["model"]["attention"]["params"] = {"alpha": 1.3}
    assert load_config(write(tmp_path, config))["model"]["attention"]["params"] == {"alpha": 1.3}


def test_structured_mapping_params_and_continuous_kwargs(tmp_path):
    config = {**MINIMAL, "model": {"attention": {"mapping": "fusedmax", "params": {"lamb": 0.1}}}}
    message = error_of(write(tmp_path, config))
    assert "model.attention.params.lamb: unknown parameter 'lamb' of mapping 'fusedmax' (did you mean 'lam'?)" in message
    config["model"]["attention"]["params"] = {"lam": 0.1}
    load_config(write(tmp_path, config))
    config = {**MINIMAL, "model": {"attention": {"continuous": {"nbasis": 3}}}}
    message = error_of(write(tmp_path, config))
    assert "model.attention.continuous.nbasis: unknown argument 'nbasis' of ContinuousAttention" in message
    config["model"]["attention"]["continuous"] = {}
    load_config(write(tmp_path, config))


def test_tokenizer_keys_checked(tmp_path):
    config = {**MINIMAL, "data": {**MINIMAL["data"], "src": {"tokenizer": {"type": "bpe", "merge": 100}}}}
    message = error_of(write(tmp_path, config))
    assert "data.src.tokenizer.merge" in message and "did you mean 'merges'" in message


def test_output_mapping_without_loss(tmp_path):
    config = {**MINIMAL, "model": {"output": {"mapping": "fusedmax"}}}
    assert "model.output.mapping: 'fusedmax' cannot be an output mapping" in error_of(write(tmp_path, config))


def test_unknown_tokenizer(tmp_path):
    config = {**MINIMAL, "data": {**MINIMAL["data"], "tgt": {"tokenizer": {"type": "chars"}}}}
    message = error_of(write(tmp_path, config))
    assert "data.tgt.tokenizer.type" in message and "did you mean 'char'" in message


def test_missing_required_and_limits(tmp_path):
    config = yaml.safe_load(yaml.safe_dump(MINIMAL))
    del config["training"]["save_dir"]
    assert "training.save_dir: is required" in error_of(write(tmp_path, config))
    config = yaml.safe_load(yaml.safe_dump(MINIMAL))
    del config["training"]["max_steps"]
    assert "training.max_steps" in error_of(write(tmp_path, config))


def test_missing_file_and_bad_yaml(tmp_path):
    assert "no such config file" in error_of(tmp_path / "nope.yaml")
    path = tmp_path / "bad.yaml"
    path.write_text("training:\n  save_dir: [unclosed\n", encoding="utf-8")
    assert "invalid YAML: line" in error_of(path)


def test_duplicate_keys_are_an_error_naming_the_line(tmp_path):
    """YAML keeps the last of two equal keys: a second ``training:`` section silently replaced the
    first (the error then named a key that the file does set), a second ``lr:`` won unannounced."""
    path = tmp_path / "dup.yaml"
    path.write_text(yaml.safe_dump(MINIMAL, sort_keys=False) + "training:\n  max_steps: 5\n", encoding="utf-8")
    assert error_of(path) == f"{path}: invalid YAML: line 11, column 1: duplicate key 'training' (first on line 8)"
    path.write_text("training:\n  optimizer: {lr: 0.1, name: adam, lr: 0.2}\n", encoding="utf-8")
    assert error_of(path).endswith("line 2, column 36: duplicate key 'lr' (first on line 2)")
    # a key given again after a merge (<<) overrides the merged value: that is no duplicate
    text = yaml.safe_dump({**MINIMAL, "model": {"embeddings": "EMB"}}).replace(
        "embeddings: EMB", "embeddings: {<<: *b, tgt_size: 16}")
    path.write_text("x: &b {src_size: 8, tgt_size: 8}\n" + text, encoding="utf-8")
    assert "x: unknown key" in error_of(path)  # parsed without a duplicate-key error


def test_exponent_floats_without_a_dot_are_numbers_everywhere(tmp_path):
    """YAML 1.1 (PyYAML) reads 1e-6 as a string: the schema's floats took it, but mapping parameters,
    continuous-attention arguments and lists refused '1e-6' as not a number."""
    text = yaml.safe_dump({**MINIMAL, "model": {"attention": {"mapping": "fusedmax", "params": {"lam": "LAM"},
                                                              "continuous": {"ridge": "RIDGE"}}},
                           "training": {**MINIMAL["training"], "optimizer": {"betas": ["0.9", "BETA"]}}})
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("LAM", "1e-3").replace("RIDGE", "1E-2").replace("'0.9'", "0.9")
                    .replace("BETA", "9.99e-1"), encoding="utf-8")
    config = load_config(path, ["model.output.params={impl: auto}", "model.attention.continuous.variance_floor=1e-6"])
    assert config["model"]["attention"]["params"] == {"lam": 1e-3}
    assert config["model"]["attention"]["continuous"] == {"ridge": 1e-2, "variance_floor": 1e-6}
    assert config["training"]["optimizer"]["betas"] == [0.9, 0.999]
    assert parse_override("a.b=+2e3", "s") == (["a", "b"], 2000.0)
    assert parse_override("a.b=abc1e3", "s") == (["a", "b"], "abc1e3")


def test_a_config_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"data:\n  train: {src: caf\xe9.src}\n")
    assert error_of(path) == f"{path}: cannot read config: line 2: not valid UTF-8 (byte 0xe9 at column 19)"


def test_overrides(tmp_path):
    path = write(tmp_path, MINIMAL)
    config = load_config(path, ["training.max_steps=7", "model.attention.mapping=entmax_bisect",
                                "model.attention.params.alpha=1.2", "training.optimizer.lr=1e-4",
                                "model.encoder.bidirectional=false"])
    assert config["training"]["max_steps"] == 7
    assert config["model"]["attention"]["mapping"] == "entmax_bisect"
    assert config["model"]["attention"]["params"] == {"alpha": 1.2}
    assert config["training"]["optimizer"]["lr"] == 1e-4
    assert config["model"]["encoder"]["bidirectional"] is False
    assert parse_override("a.b=[1, 2]", "s") == (["a", "b"], [1, 2])


def test_override_errors_name_key_and_file(tmp_path):
    path = write(tmp_path, MINIMAL)
    message = error_of(path, ["trainig.max_steps=3"])
    assert "-set trainig.max_steps=3" in message and "did you mean 'training'" in message
    assert "training.max_steps: must be an integer" in error_of(path, ["training.max_steps=many"])
    assert "key.path=value" in error_of(path, ["training.max_steps"])


def test_apply_overrides_does_not_mutate():
    original = yaml.safe_load(yaml.safe_dump(MINIMAL))
    apply_overrides(original, ["training.max_steps=3"], "s")
    assert original == MINIMAL


def test_save_and_reload_roundtrip(tmp_path):
    config = load_config(write(tmp_path, MINIMAL))
    save_config(config, tmp_path / "out" / "config.yaml")
    again = load_config(tmp_path / "out" / "config.yaml")
    assert again == config
    assert yaml.safe_load(dump_config(config)) == config


def test_config_differences():
    a = {"x": {"y": 1, "z": 2}, "w": 3}
    b = {"x": {"y": 1, "z": 5}, "w": 3, "v": 0}
    assert config_differences(a, b) == ["x.z", "v"]


def test_validate_generic_schema():
    schema = {"n": Option(int, 3), "sub": {"f": Option(float, 0.5, nullable=True)}}
    assert validate({"sub": {"f": None}}, schema, "s") == {"n": 3, "sub": {"f": None}}
    with pytest.raises(ConfigError, match=r"^s: sub.f: must be a number, got null$") as info:
        validate({"sub": {"f": None}}, {"sub": {"f": Option(float, 0.5)}}, "s")
    assert info.value.key == "sub.f"


def test_reference_config_documents_every_option():
    root = Path(__file__).resolve().parents[2]
    reference = yaml.safe_load((root / "configs" / "reference.yaml").read_text(encoding="utf-8"))

    def keys(schema, node, prefix=""):
        assert set(node) == set(schema), f"{prefix}: {set(node) ^ set(schema)}"
        for key, spec in schema.items():
            if not isinstance(spec, Option):
                keys(spec, node[key], prefix + key + ".")

    keys(SCHEMA, reference)


@pytest.mark.parametrize("name", ["quickstart.yaml", "quickstart_transformer.yaml", "reference.yaml", "multi30k_lstm.yaml"])
def test_shipped_configs_validate(name):
    root = Path(__file__).resolve().parents[2]
    resolve_config(yaml.safe_load((root / "configs" / name).read_text(encoding="utf-8")), name)


def test_bad_parameter_values_name_the_key(tmp_path):
    """Values are checked by the registry (mapping params) or by ContinuousAttention; the config adds the key."""
    config = {**MINIMAL, "model": {"attention": {"mapping": "entmax_bisect", "params": {"alpha": 0.5}}}}
    message = error_of(write(tmp_path, config))
    assert "c.yaml: model.attention.params.alpha: parameter 'alpha' of mapping 'entmax_bisect' must be" in message
    config = {**MINIMAL, "model": {"output": {"mapping": "entmax_bisect", "params": {"n_iter": 0}}}}
    assert "c.yaml: model.output.params.n_iter: parameter 'n_iter'" in error_of(write(tmp_path, config))
    config = {**MINIMAL, "model": {"attention": {"continuous": {"ridge": -1.0}}}}
    message = error_of(write(tmp_path, config))
    assert message.endswith("c.yaml: model.attention.continuous: ridge: expected a float > 0, got -1.0")
    assert "\n" not in message


@pytest.mark.parametrize("section", ["attention", "output"])
def test_infinite_alpha_is_refused(tmp_path, section):
    """alpha = inf passed the check (inf >= 1): the mapping gave uniform rows and the loss NaN at step 1."""
    text = yaml.safe_dump({**MINIMAL, "model": {section: {"mapping": "entmax_bisect", "params": {"alpha": ".inf"}}}})
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("'.inf'", ".inf"))
    assert error_of(path).endswith(f"c.yaml: model.{section}.params.alpha: parameter 'alpha' of mapping "
                                   "'entmax_bisect' must be a finite number >= 1, got inf")


@pytest.mark.parametrize("key, value, expected", [
    (("model", "embeddings", "dropout"), 1.5, "model.embeddings.dropout: must be in [0, 1), got 1.5"),
    (("model", "encoder", "dropout"), 1.0, "model.encoder.dropout: must be in [0, 1), got 1.0"),
    (("model", "decoder", "dropout"), -0.1, "model.decoder.dropout: must be in [0, 1), got -0.1"),
    (("training", "label_smoothing"), 1.5, "training.label_smoothing: must be in [0, 1), got 1.5"),
    (("training", "optimizer", "lr"), ".nan", "training.optimizer.lr: must be a number, got nan"),
    (("training", "optimizer", "lr"), ".inf", "training.optimizer.lr: must be finite, got inf"),
    (("training", "optimizer", "lr"), 0, "training.optimizer.lr: must be > 0, got 0.0"),
    (("training", "clip_grad_norm"), ".nan", "training.clip_grad_norm: must be a number, got nan"),
    (("training", "clip_grad_norm"), 0, "training.clip_grad_norm: must be > 0, got 0.0"),
    (("training", "lr_schedule", "decay_factor"), 2, "training.lr_schedule.decay_factor: must be in (0, 1), got 2.0"),
    (("training", "lr_schedule", "decay_factor"), 1, "training.lr_schedule.decay_factor: must be in (0, 1), got 1.0"),
    (("training", "max_minutes"), "-.inf", "training.max_minutes: must be finite, got -inf"),
    (("model", "encoder", "hidden_size"), 10 ** 9, "model.encoder.hidden_size: must be in [1, 65536], got 1000000000"),
    (("model", "decoder", "layers"), 10 ** 6, "model.decoder.layers: must be in [1, 256], got 1000000"),
    (("training", "seed"), -1, "training.seed: must be in [0, 9223372036854775807], got -1"),
    (("training", "seed"), 2 ** 63, "training.seed: must be in [0, 9223372036854775807], got 9223372036854775808"),
    (("model", "attention", "params"), {"lam": -1.0},
     "model.attention.params.lam: parameter 'lam' of mapping 'fusedmax' must be a finite number, 0 <= lam, got -1.0"),
    (("model", "attention", "params"), {"gamma": 0},
     "model.attention.params.gamma: parameter 'gamma' of mapping 'fusedmax' must be a finite number, 0 < gamma, got 0"),
])
def test_out_of_range_and_non_finite_values_name_file_and_key(tmp_path, key, value, expected):
    config = yaml.safe_load(yaml.safe_dump(MINIMAL))
    if key[:2] == ("model", "attention"):
        config.setdefault("model", {})["attention"] = {"mapping": "fusedmax"}
    node = config
    for part in key[:-1]:
        node = node.setdefault(part, {})
    node[key[-1]] = value
    text = yaml.safe_dump(config).replace("'.nan'", ".nan").replace("'.inf'", ".inf").replace("'-.inf'", "-.inf")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    message = error_of(path)
    assert message == f"{path}: {expected}", message


@pytest.mark.parametrize("seed", [0, 2 ** 63 - 1])
def test_every_seed_the_schema_accepts_seeds_the_generators_and_the_batch_order(seed):
    """training.seed's range [0, 2^63) is what the consumers take: torch, python, numpy (by
    seed_everything, with the rank added on ranks > 0) and the batch order's generator; a
    negative seed used to pass the schema and fail at the first batch, naming neither key nor file."""
    import numpy as np

    from nmt.data.batching import make_batch_order
    from nmt.train.rng import seed_everything

    class Lengths:
        src_lengths = tgt_lengths = np.array([3, 1, 2, 5])

        def __len__(self):
            return 4

    for rank in (0, 7):
        seed_everything(seed + rank)
    order = make_batch_order(Lengths(), 2, "sentences", True, seed, 0)
    assert sorted(i for batch in order.lists() for i in batch) == [0, 1, 2, 3]


def test_bad_value_through_the_cli_is_exit_2_and_nothing_written(tmp_path, capsys):
    from nmt.cli.train import main

    config = yaml.safe_load(yaml.safe_dump(MINIMAL))
    config["training"]["save_dir"] = str(tmp_path / "run")
    config["training"].setdefault("optimizer", {})["lr"] = float("nan")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert main(["-config", str(tmp_path / "c.yaml"), "-quiet"]) == 2
    err = capsys.readouterr().err
    assert err == f"nmt-train: error: {tmp_path}/c.yaml: training.optimizer.lr: must be a number, got nan\n"
    assert not (tmp_path / "run").exists()


def _transformer(attention: dict, **model) -> dict:
    return {**MINIMAL, "model": {"type": "transformer", "attention": attention, **model}}


@pytest.mark.parametrize("model, expected", [
    ({"type": "transfomer"}, "model.type: unknown value 'transfomer' (did you mean 'transformer'?)"),
    ({"type": "transformer", "attention": {"cross": {"mapping": "softmax", "params": {"alpha": "learned"}}}},
     "model.attention.cross.params.alpha: 'learned' needs mapping entmax_bisect, got 'softmax'"),
    ({"type": "transformer", "attention": {"mapping": "entmax15", "params": {"alpha": "learned"}}},
     "model.attention.params.alpha: 'learned' needs mapping entmax_bisect, got 'entmax15'"),
    ({"type": "transformer", "attention": {"encoder_self": {"mapping": "sparsemx"}}},
     "model.attention.encoder_self.mapping: unknown mapping 'sparsemx' (did you mean 'sparsemax'?)"),
    ({"type": "transformer", "attention": {"decoder_self": {"mapping": "entmax_bisect", "params": {"alfa": 1.2}}}},
     "model.attention.decoder_self.params.alfa: unknown parameter 'alfa'"),
    ({"type": "transformer", "attention": {"continuous": {"family": "gaussian"}}},
     "model.attention.continuous.family: unknown argument 'family' of ContinuousAttention"),
    ({"type": "transformer", "transformer": {"norm": "sandwich"}}, "model.transformer.norm: unknown value"),
    ({"type": "rnn", "attention": {"params": {"alpha": "learned"}}}, "model.attention.params.alpha:"),
    ({"type": "transformer", "attention": {"mapping": "entmax_bisect", "params": {"alpha": "learned", "alpha_init": 2}}},
     "model.attention.params.alpha_init: the starting value of a learned alpha must be a number in [1.01, 2), got 2"),
    ({"type": "transformer", "attention": {"mapping": "entmax15", "params": {"temperature": "warm"}}},
     "model.attention.params.temperature: temperature must be a positive number, got 'warm'"),
    ({"type": "transformer", "attention": {"decoder_self": {"mapping": "softmax", "params": {"temperature": -1}}}},
     "model.attention.decoder_self.params.temperature: temperature must be a positive number, got -1"),
    ({"type": "transformer", "attention": {"mapping": "entmax_bisect", "params": {"alpha": 1.5, "alpha_init": 1.2}}},
     "model.attention.params.alpha_init: needs alpha: learned"),
])
def test_transformer_config_errors_name_the_key(tmp_path, model, expected):
    message = error_of(write(tmp_path, {**MINIMAL, "model": model}))
    assert f"c.yaml: {expected}" in message


def test_transformer_config_resolves_kinds(tmp_path):
    config = load_config(write(tmp_path, _transformer(
        {"mapping": "entmax_bisect", "params": {"alpha": "learned"}, "cross": {"mapping": "sparsemax"}})))
    assert config["model"]["transformer"]["d_model"] == 512 and config["model"]["type"] == "transformer"
    assert config["model"]["attention"]["encoder_self"] == {"mapping": None, "params": None}
    from nmt.models import describe_attention

    assert describe_attention(config["model"]) == ("encoder_self entmax_bisect(alpha=learned), "
                                                   "decoder_self entmax_bisect(alpha=learned), cross sparsemax")



LEARNED = {"type": "transformer", "transformer": {"positions": "learned", "max_positions": 32}}


@pytest.mark.parametrize("key, value, expected", [
    ("data.src.max_length", 40, "40 source tokens need more positions than model.transformer.max_positions=32 "
                                "(learned positions) hold"),
    ("data.tgt.max_length", 32, "32 target tokens need 33 decoder positions (BOS + tokens), more than "
                                "model.transformer.max_positions=32 (learned positions) hold; at most 31"),
    ("validation.max_length", 100, "100 hypothesis tokens need 101 decoder positions (BOS + tokens), more than "
                                   "model.transformer.max_positions=32 (learned positions) hold; at most 31"),
])
def test_learned_positions_must_hold_the_lengths_a_run_needs(tmp_path, key, value, expected):
    """A run whose pairs or validation search need more learned positions than the table holds failed
    mid-way ('a sequence of 33 positions exceeds max_positions=32'): now at load, naming both keys."""
    config = {**MINIMAL, "data": {**MINIMAL["data"], "src": {"max_length": 32}, "tgt": {"max_length": 31}},
              "model": LEARNED, "validation": {"max_length": 31}}
    load_config(write(tmp_path, config))  # exactly full: accepted
    path = write(tmp_path, config, "long.yaml")
    assert error_of(path, [f"{key}={value}"]) == f"{path} (-set {key}={value}): {key}: {expected}"
    assert load_config(path, [f"{key}={value}", "model.transformer.positions=sinusoidal"])  # any length
    if key == "validation.max_length":  # no search, no limit
        assert load_config(path, [f"{key}={value}", "validation.decode=false"])
