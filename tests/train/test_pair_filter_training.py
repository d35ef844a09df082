"""The training pair filters end to end (``data.<side>.min_length``, ``data.max_length_ratio`` beside
``max_length``): the pairs ``load_training_data`` keeps and the counts its log gives (in total and per
corpus) equal a brute-force recount of the files (Python reading the text, tokenizing each line with
the run's tokenizer, applying the rules as the README states them with exact fractions), for the
char, space, BPE and sentencepiece tokenizers, one corpus or two weighted ones, with and without
the id cache; with subword sampling each epoch's segmentation is filtered by its own lengths;
validation is never filtered; a resume with a changed filter is refused as a changed max_length is,
and a checkpoint written before the options resumes."""
from __future__ import annotations

import logging
import random
from collections import Counter
from pathlib import Path

import pytest

from nmt.config import ConfigError, resolve_config
from nmt.data.dataset import read_parallel
from nmt.data.epoch_segmentation import ResampledFiles, ResampledPairs
from nmt.data.pair_filter import PairFilter
from nmt.train.checkpoint import load_checkpoint, save_checkpoint
from nmt.train.data_setup import load_training_data
from nmt.train.trainer import Trainer
from pair_rules import brute_force
from tiny_task import tiny_config

TOKENIZERS = {
    "char": {"type": "char"},
    "space": {"type": "space"},
    "bpe": {"type": "bpe", "merges": 40},
    "sentencepiece": {"type": "sentencepiece", "vocab_size": 60, "model_type": "unigram"},
}
# (src max, tgt max, src min, tgt min, ratio) per tokenizer: every rule skips some pairs of the corpora
RULES = {"char": (60, 70, 6, 4, 2.5), "space": (10, 12, 2, 1, 2.0), "bpe": (16, 18, 2, 2, 1.75),
         "sentencepiece": (11, 12, 3, 2, 2.0)}
WORDS = ["haus", "klein", "der", "mann", "ein", "hund", "läuft", "schnell", "die", "frau", "sieht", "rot",
         "grün", "spielt", "im", "park", "zwei", "kinder", "ball", "wasser"]


def write_corpus(root: Path, name: str, n: int, seed: int) -> dict:
    """``n`` pairs of 0-13 words a side drawn independently (a blank or whitespace-only line now and
    then), so lengths, ratios and empty sides of every kind occur."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    lines = {"src": [], "tgt": []}
    for _ in range(n):
        for side in lines:
            k = rng.choice([0] + list(range(1, 14)) * 2)
            lines[side].append(" ".join(rng.choice(WORDS) for _ in range(k)) if k else rng.choice(["", "  "]))
    paths = {}
    for side, text in lines.items():
        path = root / f"{name}.{side}"
        path.write_text("".join(line + "\n" for line in text), encoding="utf-8")
        paths[side] = str(path)
    return paths


def data_config(root: Path, tokenizer: str, corpora: str, cached: bool, sampling: dict | None = None) -> dict:
    one = write_corpus(root, "a", 90, seed=1)
    train = one if corpora == "one" else [{**one, "weight": 2, "name": "a"}, {**write_corpus(root, "b", 70, seed=2),
                                                                          "weight": 0.5, "name": "b"}]
    max_src, max_tgt, min_src, min_tgt, ratio = RULES[tokenizer]
    valid = write_corpus(root, "valid", 30, seed=3)
    config = tiny_config({"train": train, "valid": valid}, root / "run")
    config["data"]["src"] = {"tokenizer": dict(TOKENIZERS[tokenizer]), "max_length": max_src, "min_length": min_src}
    config["data"]["tgt"] = {"tokenizer": dict(TOKENIZERS[tokenizer]), "max_length": max_tgt, "min_length": min_tgt}
    if sampling:
        config["data"]["src"]["subword_sampling"] = dict(sampling)
    config["data"].update(max_length_ratio=ratio, id_cache=cached)
    return resolve_config(config, "f.yaml")["data"]


def corpus_pairs(data_cfg: dict) -> list[list[tuple[str, str]]]:
    train = data_cfg["train"]
    return [read_parallel(c["src"], c["tgt"]) for c in (train if isinstance(train, list) else [train])]


@pytest.mark.parametrize("cached", [False, True], ids=["lists", "id_cache"])
@pytest.mark.parametrize("corpora", ["one", "two"])
@pytest.mark.parametrize("tokenizer", list(TOKENIZERS))
def test_kept_pairs_and_counts_are_a_brute_force_recount(tmp_path, tokenizer, corpora, cached, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)
    data_cfg = data_config(tmp_path, tokenizer, corpora, cached)
    with caplog.at_level(logging.INFO, logger="nmt"):
        data = load_training_data(data_cfg, tmp_path / "work")
    src, tgt = data.src_field, data.tgt_field
    rules = RULES[tokenizer]
    kept, per_corpus, line = [], [], 0
    for pairs in corpus_pairs(data_cfg):
        counts = Counter()
        for s, t in pairs:
            line += 1
            why = brute_force(len(src.tokenize(s)) if s.strip() else 0, len(tgt.tokenize(t)) if t.strip() else 0, *rules)
            counts[why] += 1
            if why is None:
                kept.append(line)
        per_corpus.append(counts)
    total = sum(per_corpus, Counter())
    assert all(total[rule] > 0 for rule in ("empty", "too_long", "too_short", "ratio", None)), total  # each met
    assert list(data.train.line_numbers) == kept
    assert data.train.skipped == {rule: total[rule] for rule in ("empty", "too_long", "too_short", "ratio")}
    said = lambda c: (f"(skipped {c['empty']} empty, {c['too_long']} too long, {c['too_short']} too short, "
                      f"{c['ratio']} over the length ratio)")
    assert f"kept {len(kept)} of {line} pairs {said(total)}" in caplog.text
    if corpora == "two":
        for name, counts in zip("ab", per_corpus):
            n = sum(counts.values())
            assert f"train corpus {name}: kept {counts[None]} of {n} pairs {said(counts)}, weight" in caplog.text
    # validation is never filtered: every pair with tokens on both sides, whatever its lengths
    valid = read_parallel(data_cfg["valid"]["src"], data_cfg["valid"]["tgt"])
    assert list(data.valid.line_numbers) == [n for n, (s, t) in enumerate(valid, 1) if s.strip() and t.strip()]


SAMPLING = {"bpe": {"dropout": 0.3}, "sentencepiece": {"alpha": 0.5}}


@pytest.mark.parametrize("cached", [False, True], ids=["lists", "id_cache"])
@pytest.mark.parametrize("tokenizer", list(SAMPLING))
def test_each_sampled_epoch_is_filtered_by_its_own_lengths(tmp_path, tokenizer, cached):
    """With subword sampling (source side) an epoch's pairs are kept by that epoch's lengths, as
    max_length always was: the brute force applied to the same epoch's unfiltered segmentation
    (the draws do not depend on the filter: every non-blank line is drawn in order)."""
    data_cfg = data_config(tmp_path, tokenizer, "two", cached, SAMPLING[tokenizer])
    data = load_training_data(data_cfg, tmp_path / "work", seed=5)
    resampled = data.resampled
    assert isinstance(resampled, ResampledFiles if cached else ResampledPairs)
    pairs = [p for corpus in corpus_pairs(data_cfg) for p in corpus]
    unfiltered = ResampledPairs(pairs, data.src_field, data.tgt_field, resampled.samplers["src"],
                                resampled.samplers["tgt"], pair_filter=PairFilter())
    changed = False
    for epoch in (1, 2):
        everything = unfiltered.for_epoch(5, epoch)
        lengths = {n: (len(s), len(t)) for n, s, t in zip(everything.line_numbers, everything.src, everything.tgt)}
        verdicts = {n: brute_force(*lengths.get(n, (0, 0)), *RULES[tokenizer]) for n in range(1, len(pairs) + 1)}
        epoch_set = resampled.for_epoch(5, epoch)
        assert list(epoch_set.line_numbers) == [n for n, why in verdicts.items() if why is None]
        assert epoch_set.skipped == dict(Counter(w for w in verdicts.values() if w is not None)) | {
            rule: 0 for rule in ("empty", "too_long", "too_short", "ratio")
            if rule not in verdicts.values()}
        deterministic = {n: len(data.src_field.tokenize(pairs[n - 1][0])) for n in lengths}
        changed |= any(lengths[n][0] != deterministic[n] for n in lengths)
    assert changed  # the epochs' lengths differ from the deterministic ones: the filter sees the samples


def test_the_id_cache_is_rebuilt_when_the_rules_change(tmp_path):
    data_cfg = data_config(tmp_path, "space", "one", cached=True)
    first = load_training_data(data_cfg, tmp_path / "work")
    again = load_training_data(data_cfg, tmp_path / "work")
    caches = tmp_path / ".nmt_id_cache"
    assert len(list(caches.iterdir())) == 1 and again.train.skipped == first.train.skipped
    data_cfg["max_length_ratio"] = 1.5
    tighter = load_training_data(data_cfg, tmp_path / "work")
    assert len(list(caches.iterdir())) == 2 and tighter.train.skipped["ratio"] > first.train.skipped["ratio"]
    data_cfg["tgt"]["min_length"] = 5
    assert load_training_data(data_cfg, tmp_path / "work").train.skipped["too_short"] > tighter.train.skipped["too_short"]
    assert len(list(caches.iterdir())) == 3


def test_a_resume_with_a_changed_filter_is_refused_like_a_changed_max_length(tmp_path):
    from tiny_task import write_task

    data = write_task(tmp_path / "data")
    config = tiny_config(data, tmp_path / "run", max_steps=4, valid_every=4, device="cpu")
    Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml").train()
    for key, change in (("data.max_length_ratio", {"max_length_ratio": 3}),
                        ("data.src.min_length", {"src": {**config["data"]["src"], "min_length": 2}}),
                        ("data.src.max_length", {"src": {**config["data"]["src"], "max_length": 7}})):
        changed = {**config, "data": {**config["data"], **change}, "training": {**config["training"], "max_steps": 6}}
        with pytest.raises(ConfigError, match=f"tiny.yaml: {key}: differs from the run in"):
            Trainer(resolve_config(changed, "tiny.yaml"), "tiny.yaml")
    # a checkpoint written before the options existed (its config lacks them) resumes at their defaults
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    del last["config"]["data"]["max_length_ratio"], last["config"]["data"]["src"]["min_length"]
    del last["config"]["data"]["tgt"]["min_length"]
    save_checkpoint(tmp_path / "run" / "last.pt", last)
    config["training"]["max_steps"] = 6
    assert Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml").train().step == 6
