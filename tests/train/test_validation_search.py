"""The validation decode's search options (``validation.length_penalty``, ``min_length``,
``coverage_penalty`` / ``beta`` / ``coverage_epsilon`` / ``stepwise_penalty``, ``ban_unk_token``,
``mbr``: the MBR decision among the beam's hypotheses):
a tiny real training run's validation hypotheses, certificates and metrics equal what the
translator API (``Translator``, the path of ``nmt-translate``) gives with the same ``SearchOptions``
on the step checkpoint that validation saved, and best.pt is the step the independently computed
metric selects; bad values are one-line config errors naming the key (``SearchOptions``' own
checks); a checkpoint written before the keys existed resumes."""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import sacrebleu

from nmt.config import ConfigError, resolve_config
from nmt.config.options import VALIDATION
from nmt.train.checkpoint import load_checkpoint, save_checkpoint
from nmt.train.trainer import Trainer, check_run_config
from nmt.train.validation import SEARCH_KEYS, validation_search
from nmt.translate.loading import load_model
from nmt.translate.search_options import SearchOptions
from nmt.translate.translator import Translator
from tiny_task import tiny_config, write_task

BEAM, MAX_LENGTH = 5, 8
NEW_KEYS = ("min_length", "length_penalty", "length_alpha", "coverage_penalty", "beta", "coverage_epsilon",
            "stepwise_penalty", "ban_unk_token", "mbr")

# each set changes what the tiny run's validation outputs or certifies at some validated step (checked
# below against the same search without it), so an option the trainer dropped would be seen
OPTION_SETS = {
    "gnmt": {"length_penalty": "gnmt", "length_alpha": 1.0},
    "average": {"length_penalty": "average"},
    "min_length": {"min_length": 4},
    "wu": {"coverage_penalty": "wu", "beta": 1.0, "coverage_epsilon": 0.01},
    "summary_stepwise": {"coverage_penalty": "summary", "beta": 1.0, "stepwise_penalty": True},
    "ban_unk": {"ban_unk_token": True},
    "mbr_chrf": {"mbr": "chrf"},
}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("data"))


@pytest.fixture
def logs(caplog, monkeypatch):
    """caplog at INFO for nmt's loggers (a CLI test's setup_logging turns their propagation off)."""
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="nmt"):
        yield caplog


def run_config(task: dict, save_dir: Path, **search) -> dict:
    """The tiny reversal task, trained long enough (200 updates, lr 0.02) for its outputs to differ
    between searches: sparsemax output (certificates do occur), a 5-character target vocabulary (the
    rest is <unk>, which the model learns to output), chrF selecting best.pt, every step file kept."""
    config = tiny_config(task, save_dir, max_steps=200, valid_every=50, keep_last=10, device="cpu",
                         optimizer={"lr": 0.02})
    config["model"]["output"]["mapping"] = "sparsemax"
    config["data"]["tgt"]["max_size"] = 5
    config["validation"].update(metric="chrf", decode=True, beam_size=BEAM, max_length=MAX_LENGTH, **search)
    return config


def train_recording(config: dict, monkeypatch) -> tuple[Trainer, list]:
    """Train with ``config``; returns the trainer and each validation's (search, ValidationResult)."""
    import nmt.train.trainer as trainer_module

    seen, real_validate = [], trainer_module.validate

    def recording_validate(*args, **kwargs):
        result = real_validate(*args, **kwargs)
        seen.append((kwargs["search"], result))
        return result

    monkeypatch.setattr(trainer_module, "validate", recording_validate)
    trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
    trainer.train()
    return trainer, seen


def translate(checkpoint: Path, lines: list[str], options: SearchOptions) -> tuple[list[str], float]:
    """Best hypothesis of every line (``""`` where the search found none) and the % of lines
    certified, by the translator API on ``checkpoint``."""
    loaded = load_model(checkpoint)
    translations = Translator(loaded.model, loaded.src_field, loaded.tgt_field, options, batch_size=2).translate(lines)
    hypotheses = [t.hypotheses[0][0] if t.hypotheses else "" for t in translations]
    return hypotheses, 100.0 * sum(t.certified for t in translations) / len(lines)


def first_best(values: list[float]) -> int:
    """Index of the first maximum (validation keeps the first best: a strict improvement)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_validation_decodes_as_the_translator_does_with_the_same_options(task, tmp_path, monkeypatch, logs, name):
    search = OPTION_SETS[name]
    save_dir = tmp_path / "run"
    trainer, seen = train_recording(run_config(task, save_dir, **search), monkeypatch)
    records = [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert steps == [50, 100, 150, 200] and len(seen) == len(steps)
    sources = Path(task["valid"]["src"]).read_text(encoding="utf-8").splitlines()
    references = Path(task["valid"]["tgt"]).read_text(encoding="utf-8").splitlines()
    options = SearchOptions(beam_size=BEAM, max_length=MAX_LENGTH, **search)  # built here, not by the trainer
    without = SearchOptions(beam_size=BEAM, max_length=MAX_LENGTH)
    changed, chrf = False, []
    for step, record, (used, result) in zip(steps, records, seen):
        assert used == options
        hypotheses, certified = translate(save_dir / f"step_{step}.pt", sources, options)
        assert result.hypotheses == hypotheses, step
        assert record["valid_certified"] == pytest.approx(certified), step
        assert record["valid_chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
        assert record["valid_bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
        assert record["valid_exact_match"] == pytest.approx(
            100.0 * sum(h == r for h, r in zip(hypotheses, references)) / len(references))
        chrf.append(sacrebleu.corpus_chrf(hypotheses, [references]).score)
        changed |= translate(save_dir / f"step_{step}.pt", sources, without) != (hypotheses, certified)
    assert changed, f"{name}: the options change nothing on this run, so the test would not see them dropped"
    if name != "min_length":  # longer outputs are never certified on this run; the others certify some
        assert any(r["valid_certified"] > 0 for r in records)
    # best.pt: the step the independently computed chrF selects
    best = load_checkpoint(save_dir / "best.pt")
    assert best["step"] == steps[first_best(chrf)] == trainer.stopper.best_step
    assert [r["best"] for r in records] == [c > max(chrf[:i], default=-1.0) for i, c in enumerate(chrf)]
    # the settings are recorded: the checkpoint's config and the log
    assert all(best["config"]["validation"][key] == value for key, value in search.items())
    described = next(r.getMessage() for r in logs.records if r.getMessage().startswith("valid decoding"))
    assert f"beam_size={BEAM}" in described and f"max_length={MAX_LENGTH}" in described
    assert all(f"{key}={value}" in described for key, value in search.items())


def test_a_coverage_penalty_moves_best_pt_to_the_step_its_outputs_score_best(task, tmp_path, monkeypatch):
    """The runs of the default search and of ``coverage_penalty: wu`` train the same weights (the
    lr schedule reads the validation loss, not the decode), and their validation metrics select
    different best.pt steps: each the first best of the chrF its own search's translations get."""
    sources = Path(task["valid"]["src"]).read_text(encoding="utf-8").splitlines()
    references = Path(task["valid"]["tgt"]).read_text(encoding="utf-8").splitlines()
    best_steps = {}
    for name, search in (("default", {}), ("wu", OPTION_SETS["wu"])):
        save_dir = tmp_path / name
        train_recording(run_config(task, save_dir, **search), monkeypatch)
        options = SearchOptions(beam_size=BEAM, max_length=MAX_LENGTH, **search)
        steps = [json.loads(line)["step"] for line in (save_dir / "metrics.jsonl").read_text().splitlines()]
        chrf = [sacrebleu.corpus_chrf(translate(save_dir / f"step_{s}.pt", sources, options)[0], [references]).score
                for s in steps]
        best_steps[name] = load_checkpoint(save_dir / "best.pt")["step"]
        assert best_steps[name] == steps[first_best(chrf)]
    for step in (50, 100, 150, 200):  # the same weights: validation changed nothing of the training
        a = load_checkpoint(tmp_path / "default" / f"step_{step}.pt")["model"]
        b = load_checkpoint(tmp_path / "wu" / f"step_{step}.pt")["model"]
        assert all(a[k].equal(b[k]) for k in a)
    assert best_steps["default"] != best_steps["wu"]


def test_the_search_keys_are_search_options_fields_with_their_defaults():
    """One meaning: every search key of the validation section is a ``SearchOptions`` field of that
    name with the same default (beam_size aside: validation decodes greedily by default), and every
    ``SearchOptions`` field the section names is a search key."""
    defaults = SearchOptions()
    fields = set(SearchOptions.__dataclass_fields__)
    assert set(SEARCH_KEYS) == set(VALIDATION) & fields
    assert set(NEW_KEYS) <= set(SEARCH_KEYS)
    for key in SEARCH_KEYS:
        if key != "beam_size":
            assert VALIDATION[key].default == getattr(defaults, key), key
    resolved = resolve_config({"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"}},
                               "training": {"max_steps": 1, "save_dir": "r"}}, "t.yaml")
    assert validation_search(resolved["validation"]) == SearchOptions(beam_size=1, n_best=1)


BAD_VALUES = [
    {"length_penalty": "wu"},
    {"length_alpha": -0.5},
    {"min_length": -1},
    {"min_length": 9},  # above validation.max_length (8)
    {"coverage_penalty": "gnmt"},
    {"coverage_penalty": "wu", "beta": -1.0},
    {"beta": 0.5},  # without a coverage penalty
    {"stepwise_penalty": True},  # without a coverage penalty
    {"coverage_penalty": "wu", "beta": 1.0, "coverage_epsilon": 0.0},
    {"coverage_penalty": "wu", "beta": 1.0, "coverage_epsilon": 1.5},
    {"coverage_penalty": "summary", "beta": 1.0, "coverage_epsilon": 0.01},  # wu's floor only
    {"mbr": "chrff"},
]


@pytest.mark.parametrize("bad", BAD_VALUES, ids=lambda b: ",".join(f"{k}={v}" for k, v in b.items()))
@pytest.mark.parametrize("decode", [True, False])
def test_a_bad_search_value_is_a_config_error_naming_the_key(task, tmp_path, bad, decode):
    """The error is SearchOptions' own (the checks of nmt-translate's flags) for the key that
    SearchOptions names, as ``tiny.yaml: validation.<key>: <problem>``, before anything is written;
    checked whether validation decodes or not."""
    with pytest.raises(ValueError) as direct:
        SearchOptions(beam_size=BEAM, max_length=MAX_LENGTH, **bad)
    key, _, problem = str(direct.value).partition(" ")
    assert key in bad
    config = resolve_config(run_config(task, tmp_path / "run", **bad), "tiny.yaml")
    config["validation"]["decode"], config["validation"]["metric"] = decode, "loss"
    with pytest.raises(ConfigError) as error:
        check_run_config(config, "tiny.yaml")
    assert str(error.value) == f"tiny.yaml: validation.{key}: {problem}"
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=f"validation.{key}"):
        Trainer(config, "tiny.yaml")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key, value", [("stepwise_penalty", "yes"), ("ban_unk_token", 1), ("length_penalty", 3),
                                        ("min_length", 1.5), ("beta", "much")])
def test_a_search_value_of_the_wrong_type_is_a_schema_error(task, tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"^tiny.yaml: validation.{key}: must be "):
        resolve_config(run_config(task, tmp_path / "run", **{key: value}), "tiny.yaml")


def test_a_checkpoint_without_the_search_keys_resumes_with_their_defaults(task, tmp_path, logs):
    """A run whose last.pt was written before the keys existed (its config lacks them) resumes: the
    defaults are the search it validated with, so no difference is reported; setting one on the
    resume is allowed (validation settings may change) and reported; the translator loads it."""
    save_dir = tmp_path / "run"
    config = tiny_config(task, save_dir, max_steps=4, device="cpu")
    Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml").train()
    last = save_dir / "last.pt"
    checkpoint = load_checkpoint(last)
    for key in NEW_KEYS:
        del checkpoint["config"]["validation"][key]
    save_checkpoint(last, checkpoint)
    load_model(last)  # translating an old checkpoint reads no validation key
    resumed = Trainer(resolve_config(tiny_config(task, save_dir, max_steps=8, device="cpu"), "tiny.yaml"), "tiny.yaml")
    assert resumed.resumed
    said = [r.getMessage() for r in logs.records if "resuming with changed settings" in r.getMessage()]
    assert said and not any("validation." in line for line in said)  # training.max_steps only
    assert resumed.train().step == 8
    assert all(load_checkpoint(last)["config"]["validation"][key] == VALIDATION[key].default for key in NEW_KEYS)
    # the same old checkpoint resumed with a length penalty: allowed, and said
    checkpoint = load_checkpoint(last)
    for key in NEW_KEYS:
        del checkpoint["config"]["validation"][key]
    save_checkpoint(last, checkpoint)
    changed = tiny_config(task, save_dir, max_steps=12, device="cpu")
    changed["validation"].update(length_penalty="gnmt", beam_size=2)
    logs.clear()
    again = Trainer(resolve_config(changed, "tiny.yaml"), "tiny.yaml")
    said = [r.getMessage() for r in logs.records if "resuming with changed settings" in r.getMessage()]
    assert len(said) == 1 and "validation.length_penalty" in said[0] and "validation.length_alpha" not in said[0]
    assert again.search == SearchOptions(beam_size=2, max_length=8, length_penalty="gnmt")
    assert again.train().step == 12


def test_the_readme_translation_of_fairseq_eval_bleu_args():
    """README's YAML for ``--eval-bleu-args '{"beam": 4, "max_len_a": 1.2, "max_len_b": 10,
    "no_repeat_ngram_size": 3}'`` validates and asks for that search."""
    import re

    import yaml

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    start = readme.index("fairseq's `--eval-bleu --eval-bleu-args")
    block = re.search(r"```yaml\n(.*?)```", readme[start:], re.S).group(1)
    section = yaml.safe_load(block)["validation"]
    config = resolve_config({"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"}},
                             "training": {"max_steps": 1, "save_dir": "r"}, "validation": section}, "README.md")
    assert config["validation"]["metric"] == "bleu"
    assert validation_search(config["validation"], "README.md") == SearchOptions(
        beam_size=4, n_best=1, max_length_ratio=1.2, max_length_offset=10, block_ngram_repeat=3,
        length_penalty="average")


def test_ter_selects_best_pt_by_its_lowest_value(task, tmp_path, monkeypatch, logs):
    """``validation.metric: ter``: every record's ``valid_ter`` is sacrebleu's TER of the translator's
    hypotheses on that step's checkpoint (recomputed here), best.pt is the first minimum of those
    (lower is better: early stopping's and best.pt's order), and the log line shows it."""
    save_dir = tmp_path / "run"
    config = run_config(task, save_dir)
    config["validation"]["metric"] = "ter"
    trainer, seen = train_recording(config, monkeypatch)
    records = [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]
    sources = Path(task["valid"]["src"]).read_text(encoding="utf-8").splitlines()
    references = Path(task["valid"]["tgt"]).read_text(encoding="utf-8").splitlines()
    options = SearchOptions(beam_size=BEAM, max_length=MAX_LENGTH)
    ter = []
    for record, (_, result) in zip(records, seen):
        hypotheses, _ = translate(save_dir / f"step_{record['step']}.pt", sources, options)
        ter.append(sacrebleu.metrics.TER().corpus_score(hypotheses, [references]).score)
        assert record["valid_ter"] == pytest.approx(ter[-1]) == pytest.approx(result.scalars["ter"])
    assert best_index_of(ter, lower=True) != best_index_of(ter, lower=False)  # the direction matters here
    best_index = best_index_of(ter, lower=True)
    assert load_checkpoint(save_dir / "best.pt")["step"] == records[best_index]["step"] == trainer.stopper.best_step
    assert [r["best"] for r in records] == [t < min(ter[:i], default=float("inf")) for i, t in enumerate(ter)]
    messages = [r.getMessage() for r in logs.records]
    assert any(" valid: " in m and f"ter={records[0]['valid_ter']:.4g}" in m for m in messages)
    assert any(m.startswith("valid bleu / chrf / ter: sacrebleu ") and "tok:tercom" in m for m in messages)


def test_ter_needs_decoding(task, tmp_path):
    config = run_config(task, tmp_path / "run")
    config["validation"].update(metric="ter", decode=False)
    with pytest.raises(ConfigError, match="validation.metric: 'ter' needs decoding"):
        check_run_config(resolve_config(config, "tiny.yaml"), "tiny.yaml")


def best_index_of(values: list[float], lower: bool) -> int:
    """Index of the first minimum (``lower``) or maximum of ``values``."""
    sign = 1 if lower else -1
    return min(range(len(values)), key=lambda i: (sign * values[i], i))


def test_validation_metrics_computes_only_the_listed_decoding_metrics(task, tmp_path, monkeypatch, logs):
    """``validation.metrics: [chrf]`` (OpenNMT-py's ``-valid_metrics``): every record holds
    ``valid_chrf`` (sacrebleu's chrF of the translator's hypotheses on that step's checkpoint,
    recomputed here) and ``valid_certified``, and no BLEU, TER or exact match; sacrebleu's other
    metrics are never called; the log names what is computed."""
    import nmt.train.validation as validation_module

    def refused(*_):
        raise AssertionError("a metric left out of validation.metrics was computed")

    for name in ("bleu", "ter"):
        monkeypatch.setitem(validation_module.SACREBLEU_METRICS, name, refused)
    save_dir = tmp_path / "run"
    config = run_config(task, save_dir)
    config["validation"]["metrics"] = ["chrf"]
    trainer, seen = train_recording(config, monkeypatch)
    records = [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]
    sources = Path(task["valid"]["src"]).read_text(encoding="utf-8").splitlines()
    references = Path(task["valid"]["tgt"]).read_text(encoding="utf-8").splitlines()
    for record, (_, result) in zip(records, seen):
        assert not {"valid_bleu", "valid_ter", "valid_exact_match"} & set(record)
        hypotheses, certified = translate(save_dir / f"step_{record['step']}.pt", sources,
                                          SearchOptions(beam_size=BEAM, max_length=MAX_LENGTH))
        assert record["valid_chrf"] == pytest.approx(sacrebleu.metrics.CHRF().corpus_score(
            hypotheses, [references]).score)
        assert record["valid_certified"] == pytest.approx(certified)
        assert list(result.signatures) == ["chrf"]
    messages = [r.getMessage() for r in logs.records]
    assert any(m.startswith("valid decoding (its chrf and certified): beam_size=5") for m in messages)
    assert any(m.startswith("valid chrf: sacrebleu nrefs:1|") for m in messages)
    assert not any("bleu=" in m or "ter=" in m for m in messages)


@pytest.mark.parametrize("metrics, metric, key, message", [
    (["chrf", "meteor"], "chrf", "validation.metrics[1]", "unknown decoding metric 'meteor'; valid: exact_match, "
                                                          "bleu, chrf, ter"),
    (["bleu", "bleu"], "bleu", "validation.metrics[1]", "'bleu' is listed twice"),
    (["bleu"], "ter", "validation.metrics", "validation.metric is 'ter', which this list leaves out (add it)"),
    (["loss"], "loss", "validation.metrics[0]", "unknown decoding metric 'loss'"),
])
def test_a_bad_validation_metrics_list_is_a_config_error_naming_the_key(task, tmp_path, metrics, metric, key,
                                                                       message):
    config = run_config(task, tmp_path / "run")
    config["validation"].update(metrics=metrics, metric=metric)
    with pytest.raises(ConfigError, match="^" + re.escape(f"tiny.yaml: {key}: {message}")):
        resolve_config(config, "tiny.yaml")


def test_an_empty_metrics_list_still_decodes_for_certificates_and_ranks_by_loss(task, tmp_path, monkeypatch):
    """``metrics: []`` with ``metric: loss``: the validation set is still decoded (certified share
    recorded, as the certificates are the search's own) and no sacrebleu metric is computed."""
    config = run_config(task, tmp_path / "run")
    config["validation"].update(metrics=[], metric="loss")
    config["training"]["max_steps"] = 50
    _, seen = train_recording(config, monkeypatch)
    scalars = seen[-1][1].scalars
    assert "certified" in scalars and not {"bleu", "chrf", "ter", "exact_match"} & set(scalars)
