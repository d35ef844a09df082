"""The training pairs' length rules (``nmt.data.pair_filter``): each pair's verdict against a
brute-force statement of the rules (exact fractions for the ratio, decimal semantics for R), the
edge cases (a ratio of exactly R kept in both directions, empty sides counted as empty whatever
the other rules), the datasets' counts and log line, the config's one-line errors naming the key,
and the cache key following the settings."""
from __future__ import annotations

import itertools

import pytest

from nmt.config import ConfigError, resolve_config
from nmt.data.dataset import ParallelDataset
from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.id_arrays import cache_key, encode_to_arrays, ArrayParallelDataset
from nmt.data.pair_filter import PairFilter
from nmt.data.tokenizers import build_tokenizer
from nmt.data.vocabulary import Vocabulary
from pair_rules import brute_force



SETTINGS = [(None, None, 1, 1, None), (8, 6, 1, 1, None), (8, 6, 2, 3, None), (None, None, 1, 1, 1.5),
            (9, 9, 2, 1, 1.0), (None, 7, 3, 1, 2), (12, 12, 1, 1, 1.15), (5, 5, 1, 1, 9)]


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_every_verdict_is_the_brute_force_one(settings):
    rule = PairFilter(*settings)
    for n_src, n_tgt in itertools.product(range(0, 14), repeat=2):
        assert rule.reason(n_src, n_tgt) == brute_force(n_src, n_tgt, *settings), (n_src, n_tgt)
    for n_src, n_tgt in ((20, 23), (23, 20), (20, 24), (100, 115), (100, 116)):  # R = 1.15 at larger counts
        assert rule.reason(n_src, n_tgt) == brute_force(n_src, n_tgt, *settings), (n_src, n_tgt)


def test_edge_cases():
    ratio = PairFilter(max_length_ratio=1.5)
    assert ratio.reason(2, 3) is None and ratio.reason(3, 2) is None  # exactly R: kept, both directions
    assert ratio.reason(2, 4) == "ratio" and ratio.reason(4, 2) == "ratio"
    assert PairFilter(max_length_ratio=1.15).reason(20, 23) is None  # 1.15 * 20 is 22.999... in floats
    assert ratio.reason(0, 5) == ratio.reason(5, 0) == ratio.reason(0, 0) == "empty"  # not a ratio of 0
    assert PairFilter(min_src_length=3).reason(0, 1) == "empty"  # the first rule broken counts
    assert PairFilter(4, 4, 2, 2, 1.0).reason(5, 1) == "too_long"
    assert PairFilter(max_length_ratio=1.0).reason(3, 3) is None  # R = 1 keeps equal lengths only
    assert PairFilter(max_length_ratio=0).max_length_ratio is None  # 0: off
    assert PairFilter().rules == ("empty", "too_long")  # the defaults: the rules of before
    assert PairFilter(min_tgt_length=2, max_length_ratio=3).rules == ("empty", "too_long", "too_short", "ratio")


@pytest.mark.parametrize("kwargs, message", [
    ({"max_length_ratio": 0.5}, "data.max_length_ratio: expected null, 0 (off) or a number >= 1, got 0.5"),
    ({"max_length_ratio": float("nan")}, "data.max_length_ratio: expected null, 0 (off) or a number >= 1, got nan"),
    ({"min_src_length": 0}, "data.src.min_length: expected a positive integer, got 0"),
    ({"max_tgt_length": 3, "min_tgt_length": 4},
     "data.tgt.min_length: 4 is above data.tgt.max_length (3): no pair could be kept"),
    ({"max_src_length": 0}, "data.src.max_length: expected a positive integer or null, got 0"),
])
def test_bad_settings_are_one_line_errors_naming_the_key(kwargs, message):
    with pytest.raises(DataError) as err:
        PairFilter(**kwargs)
    assert str(err.value) == message


def _base() -> dict:
    return {"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"}},
            "training": {"max_steps": 1, "save_dir": "r"}}


@pytest.mark.parametrize("data, message", [
    ({"max_length_ratio": 0.9}, "t.yaml: data.max_length_ratio: expected null, 0 (off) or a number >= 1, got 0.9"),
    ({"max_length_ratio": -1}, "t.yaml: data.max_length_ratio: must be >= 0, got -1.0"),
    ({"src": {"min_length": 0}}, "t.yaml: data.src.min_length: must be >= 1, got 0"),
    ({"tgt": {"min_length": 60}}, "t.yaml: data.tgt.min_length: 60 is above data.tgt.max_length (50): no pair "
                                  "could be kept"),
])
def test_config_errors_name_the_file_and_key(data, message):
    raw = _base()
    for key, value in data.items():
        raw["data"][key] = value
    with pytest.raises(ConfigError) as err:
        resolve_config(raw, "t.yaml")
    assert str(err.value) == message


def test_config_defaults_keep_todays_data():
    config = resolve_config(_base(), "t.yaml")
    assert config["data"]["max_length_ratio"] is None
    assert config["data"]["src"]["min_length"] == config["data"]["tgt"]["min_length"] == 1
    assert PairFilter.from_config(config["data"]) == PairFilter(50, 50)


def _field(tokenizer_type: str, lines) -> Field:
    tokenizer = build_tokenizer({"type": tokenizer_type})
    return Field(tokenizer, Vocabulary.build(tokenizer.tokenize(line) for line in lines))


PAIRS = [("a b c", "x"), ("", "y y"), ("a b", "x y z"), ("a b c d e f", "x y"), ("a", "x y z w"),
         ("a b c", "x y z w v u t"), ("b", ""), ("a b", "x y z"), ("c c c c", "z z")]


@pytest.mark.parametrize("cached", [False, True])
def test_datasets_count_each_rule_and_say_so(tmp_path, cached):
    """The list dataset and the id arrays keep the same pairs, count each rule (the brute force
    per pair), and the log line names the counts of the rules that are on."""
    field_src, field_tgt = _field("space", [s for s, _ in PAIRS]), _field("space", [t for _, t in PAIRS])
    settings = (5, 6, 2, 1, 2.0)
    rule = PairFilter(*settings)
    expected = [brute_force(len(s.split()), len(t.split()), *settings) for s, t in PAIRS]
    if cached:
        (tmp_path / "s").write_text("".join(s + "\n" for s, _ in PAIRS), encoding="utf-8")
        (tmp_path / "t").write_text("".join(t + "\n" for _, t in PAIRS), encoding="utf-8")
        arrays, meta = encode_to_arrays(tmp_path / "s", tmp_path / "t", field_src, field_tgt, pair_filter=rule)
        data = ArrayParallelDataset(arrays, meta, field_src, field_tgt)
    else:
        data = ParallelDataset(PAIRS, field_src, field_tgt, pair_filter=rule)
    assert list(data.line_numbers) == [n for n, why in enumerate(expected, 1) if why is None]
    counts = {why: expected.count(why) for why in ("empty", "too_long", "too_short", "ratio")}
    assert counts == {"empty": 2, "too_long": 2, "too_short": 1, "ratio": 1}  # each rule met (line 9: exactly R)
    assert data.skipped == counts
    assert data.summary() == "kept 3 of 9 pairs (skipped 2 empty, 2 too long, 1 too short, 1 over the length ratio)"
    plain = ParallelDataset(PAIRS, field_src, field_tgt, 5, 6)  # the rules of before: their line as it was
    assert plain.summary() == "kept 5 of 9 pairs (skipped 2 empty, 2 too long)"
    with pytest.raises(ValueError, match="not both"):
        ParallelDataset(PAIRS, field_src, field_tgt, 5, pair_filter=rule)


def test_the_cache_key_follows_the_rules_and_keeps_older_caches(tmp_path):
    """A changed minimum or ratio names another cache; with both off the key is the one of the two
    limits alone (caches built before the rules existed are still found)."""
    (tmp_path / "s").write_text("a b\n", encoding="utf-8")
    (tmp_path / "t").write_text("x\n", encoding="utf-8")
    field = _field("space", ["a b x"])
    key = lambda rule: cache_key(tmp_path / "s", tmp_path / "t", field, field, pair_filter=rule)
    plain = cache_key(tmp_path / "s", tmp_path / "t", field, field, 50, 50)
    assert key(PairFilter(50, 50)) == key(PairFilter(50, 50, 1, 1, 0)) == plain
    others = [key(PairFilter(50, 50, 2, 1)), key(PairFilter(50, 50, 1, 2)), key(PairFilter(50, 50, 1, 1, 9)),
              key(PairFilter(50, 50, 1, 1, 3)), key(PairFilter(50, 49))]
    assert len(set(others + [plain])) == len(others) + 1
