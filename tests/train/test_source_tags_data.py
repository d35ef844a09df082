"""Source tags in the training data (``data.train[i].src_tag``, ``data.valid.src_tag``): the ids a
tagged corpus feeds the encoder are the tag's id followed by the ids the source tokenizer gives
the line alone (recomputed here from the tokenizer and the vocabulary), for every tokenizer, with
the id cache on and off and with subword sampling (against the same run without tags); the tag is
a vocabulary token whatever min_freq says, counts toward the length rules, round-trips through
the vocabulary files, and a run resumed with another tag is refused."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from nmt.config import ConfigError, resolve_config
from nmt.data.source_tags import tag_problem, with_tags
from nmt.data.field import Field
from nmt.data.errors import DataError
from nmt.data.tokenizers import build_tokenizer
from nmt.data.vocab_file import read_vocab_file, write_vocab_file
from nmt.data.vocabulary import SPECIALS, Vocabulary
from nmt.train.data_setup import load_training_data

WORDS = ["haus", "klein", "gross", "das", "ist", "ein", "baum", "garten", "blume", "rot"]
TOKENIZERS = {"char": {"type": "char"}, "space": {"type": "space"}, "bpe": {"type": "bpe", "merges": 25},
              "sentencepiece": {"type": "sentencepiece", "vocab_size": 40, "model_type": "unigram"}}


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def corpora(root: Path, n: int = 30, seed: int = 0) -> dict:
    """Two training corpora sharing their sources (targets: the words uppercased / reversed, one
    blank source line in the first), and a validation pair of files."""
    rng = random.Random(seed)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) for _ in range(n)]
    src[3] = ""  # a blank source: the tag never makes a pair of it
    valid = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for _ in range(6)]
    root.mkdir(parents=True, exist_ok=True)
    return {
        "train": [{"src": write(root / "a.src", src), "tgt": write(root / "up.tgt", [s.upper() or "X" for s in src]),
                   "src_tag": "<2up>", "name": "up"},
                  {"src": write(root / "b.src", src), "tgt": write(root / "rev.tgt", [s[::-1] or "x" for s in src]),
                   "src_tag": "<2rev>"}],
        "valid": {"src": write(root / "v.src", valid), "tgt": write(root / "v.tgt", [v[::-1] for v in valid]),
                  "src_tag": "<2rev>"},
    }


def resolved(data: dict, tmp_path: Path, **sides) -> dict:
    raw = {"data": {**data, **sides}, "training": {"save_dir": str(tmp_path / "run"), "max_steps": 1}}
    return resolve_config(raw, "c.yaml")["data"]


def lines_of(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def by_hand(field: Field, tag: str | None, line: str) -> list[int]:
    """The ids of ``line``: the tag's id, then the vocabulary's ids of the tokenizer's tokens (a
    special's spelling or an unknown token: <unk>), recomputed without Field.encode."""
    ids = [field.vocab.stoi.get(t, field.vocab.unk_index) for t in field.tokenizer.tokenize(line)]
    ids = [i if i >= len(SPECIALS) else field.vocab.unk_index for i in ids]
    return ([field.vocab.stoi[tag]] if tag is not None and ids else []) + ids


def assert_wired(data, cfg: dict) -> None:
    """Every kept training pair (and validation pair) is its corpus's tag id + the line's ids."""
    src = data.src_field
    tags = [c["src_tag"] for c in cfg["train"]]
    lines = [(tag, line) for c, tag in zip(cfg["train"], tags) for line in lines_of(c["src"])]
    assert len(data.train) == sum(1 for _, line in lines if line.strip())  # the blank line alone is skipped
    for i in range(len(data.train)):
        tag, line = lines[int(data.train.line_numbers[i]) - 1]
        assert data.train[i][0] == by_hand(src, tag, line)
        assert data.train[i][0][0] == src.vocab.stoi[tag] and data.train.src_lengths[i] == len(data.train[i][0])
    valid_lines = lines_of(cfg["valid"]["src"])
    for i in range(len(data.valid)):
        assert data.valid[i][0] == by_hand(src, "<2rev>", valid_lines[data.valid.line_numbers[i] - 1])


@pytest.mark.parametrize("id_cache", [False, True])
@pytest.mark.parametrize("tokenizer", sorted(TOKENIZERS))
def test_a_tagged_source_is_the_tag_id_then_the_tokenizers_ids(tmp_path, tokenizer, id_cache):
    cfg = resolved(corpora(tmp_path / "d"), tmp_path, id_cache=id_cache,
                   src={"tokenizer": TOKENIZERS[tokenizer]}, tgt={"tokenizer": {"type": "char"}})
    data = load_training_data(cfg, tmp_path / "run")
    src = data.src_field
    assert src.tags == ("<2rev>", "<2up>")
    # appended after the data's tokens, sorted: no other token moves
    assert src.vocab.itos[-2:] == ["<2rev>", "<2up>"]
    assert "<2up>" not in data.tgt_field.vocab
    assert_wired(data, cfg)
    # the same data untagged: the same vocabulary without the tags, every source without its first id
    untagged = resolved({**cfg, "train": [{k: v for k, v in c.items() if k != "src_tag"} for c in cfg["train"]],
                         "valid": {k: v for k, v in cfg["valid"].items() if k != "src_tag"}}, tmp_path,
                        id_cache=id_cache)
    plain = load_training_data(untagged, tmp_path / "run_plain")
    assert plain.src_field.vocab.itos == src.vocab.itos[:-2] and plain.src_field.tags == ()
    assert [plain.train[i][0] for i in range(len(plain.train))] == [data.train[i][0][1:] for i in range(len(data.train))]


def test_the_id_cache_is_keyed_by_the_tags(tmp_path):
    from nmt.data.id_arrays import cache_key

    cfg = resolved(corpora(tmp_path / "d"), tmp_path, id_cache=True)
    data = load_training_data(cfg, tmp_path / "run")
    caches = sorted(p.name for p in (tmp_path / "d" / ".nmt_id_cache").iterdir())
    swapped = {**cfg, "train": [{**cfg["train"][0], "src_tag": "<2rev>"}, {**cfg["train"][1], "src_tag": "<2up>"}]}
    again = load_training_data(swapped, tmp_path / "run2")
    assert sorted(p.name for p in (tmp_path / "d" / ".nmt_id_cache").iterdir()) != caches  # new caches
    assert [again.train[i][0][0] for i in range(len(again.train))] != [data.train[i][0][0] for i in range(len(data.train))]
    assert_wired(again, swapped)
    c = cfg["train"][0]
    key = cache_key(c["src"], c["tgt"], data.src_field, data.tgt_field)
    assert key == cache_key(c["src"], c["tgt"], data.src_field, data.tgt_field, src_prefix=())  # untagged: as before
    assert key != cache_key(c["src"], c["tgt"], data.src_field, data.tgt_field, src_prefix=[5])


@pytest.mark.parametrize("id_cache", [False, True])
@pytest.mark.parametrize("sampling", [{"tokenizer": TOKENIZERS["bpe"], "subword_sampling": {"dropout": 0.4}},
                                      {"tokenizer": TOKENIZERS["sentencepiece"],
                                       "subword_sampling": {"alpha": 0.3, "nbest": -1}}], ids=["bpe", "spm"])
def test_subword_sampling_never_sees_the_tag(tmp_path, sampling, id_cache):
    """Each epoch's sampled sources are the tag id + the segmentation the same run draws untagged."""
    d = corpora(tmp_path / "d")
    cfg = resolved(d, tmp_path, id_cache=id_cache, src=sampling)
    untagged = resolved({"train": [{k: v for k, v in c.items() if k != "src_tag"} for c in d["train"]],
                         "valid": {k: v for k, v in d["valid"].items() if k != "src_tag"}}, tmp_path,
                        id_cache=id_cache, src=sampling)
    data = load_training_data(cfg, tmp_path / "run", seed=7)
    plain = load_training_data(untagged, tmp_path / "run_plain", seed=7)
    tag_of = [data.src_field.vocab.stoi[c["src_tag"]] for c in cfg["train"]]
    starts = [0, len(lines_of(d["train"][0]["src"]))]
    for epoch in (0, 3):
        tagged_epoch, plain_epoch = data.resampled.for_epoch(7, epoch), plain.resampled.for_epoch(7, epoch)
        assert len(tagged_epoch) == len(plain_epoch)
        differs = False
        for i in range(len(tagged_epoch)):
            line = int(tagged_epoch.line_numbers[i])
            assert line == int(plain_epoch.line_numbers[i])
            corpus = 0 if line <= starts[1] else 1
            assert tagged_epoch[i][0] == [tag_of[corpus]] + plain_epoch[i][0]
            differs |= plain_epoch[i][0] != plain.train[i][0]
        assert differs  # sampling is on: not the deterministic segmentation


def test_a_tag_is_in_the_vocabulary_whatever_min_freq_and_max_size(tmp_path):
    cfg = resolved(corpora(tmp_path / "d"), tmp_path, src={"tokenizer": {"type": "space"}, "min_freq": 1000,
                                                          "max_size": 1})
    data = load_training_data(cfg, tmp_path / "run")
    assert data.src_field.vocab.itos == list(SPECIALS) + ["<2rev>", "<2up>"]
    assert_wired(data, cfg)  # every word <unk>, the tags theirs


def test_the_tag_counts_toward_the_source_length(tmp_path):
    """max_length 3: a source of 3 words is kept untagged and skipped as too long with its tag."""
    d = tmp_path / "d"
    d.mkdir()
    src = ["das haus ist", "das haus"]
    one = {"src": write(d / "s", src), "tgt": write(d / "t", ["x", "y"])}
    valid = {"src": write(d / "vs", ["das"]), "tgt": write(d / "vt", ["x"])}
    side = {"tokenizer": {"type": "space"}, "max_length": 3}
    plain = load_training_data(resolved({"train": one, "valid": valid}, tmp_path, src=side), tmp_path / "r1")
    tagged = load_training_data(resolved({"train": {**one, "src_tag": "<BT>"}, "valid": valid}, tmp_path, src=side),
                                tmp_path / "r2")
    assert plain.train.skipped["too_long"] == 0 and len(plain.train) == 2
    assert tagged.train.skipped["too_long"] == 1 and list(tagged.train.line_numbers) == [2]
    assert tagged.valid[0][0] == by_hand(tagged.src_field, None, "das")  # an untagged validation set


def test_shared_vocab_holds_the_tags_once_for_both_sides(tmp_path):
    cfg = resolved(corpora(tmp_path / "d"), tmp_path, shared_vocab=True, src={"tokenizer": {"type": "space"}})
    data = load_training_data(cfg, tmp_path / "run")
    assert data.src_field is data.tgt_field and data.src_field.tags == ("<2rev>", "<2up>")
    assert_wired(data, cfg)


def test_vocab_file_lacking_a_tag_gains_it_and_keeps_one_it_has(tmp_path):
    d = corpora(tmp_path / "d")
    vocab_file = write(tmp_path / "vocab.txt", ["haus\t9", "<2rev>\t4", "klein\t3"])
    cfg = resolved(d, tmp_path, src={"tokenizer": {"type": "space"}, "vocab_file": vocab_file})
    data = load_training_data(cfg, tmp_path / "run")
    assert data.src_field.vocab.itos == list(SPECIALS) + ["haus", "<2rev>", "klein", "<2up>"]
    assert_wired(data, cfg)


def test_written_vocabulary_reads_back_with_the_tags_and_their_counts(tmp_path):
    """A tag's count is the number of non-blank source lines it starts; the file reads back as the
    same vocabulary (tokens, ids, counts) through the reader's rules."""
    d = corpora(tmp_path / "d")
    data = load_training_data(resolved(d, tmp_path, src={"tokenizer": {"type": "space"}}), tmp_path / "run")
    vocab = data.src_field.vocab
    nonblank = sum(1 for line in lines_of(d["train"][0]["src"]) if line.strip())
    assert vocab.counts["<2up>"] == vocab.counts["<2rev>"] == nonblank
    write_vocab_file(tmp_path / "vocab.src", vocab)
    back = read_vocab_file(tmp_path / "vocab.src")
    assert back == vocab and back.counts == vocab.counts


def test_with_tags_appends_sorted_and_moves_no_token():
    vocab = Vocabulary(["b", "a", "<x>"], {"b": 5, "a": 3, "<x>": 1})
    out = with_tags(vocab, ["<z>", "<x>", "<c>"], {"<z>": 7})
    assert out.itos == vocab.itos + ["<c>", "<z>"]
    assert out.counts == {"b": 5, "a": 3, "<x>": 1, "<c>": 0, "<z>": 7}
    assert with_tags(vocab, ["<x>"]) is vocab
    assert with_tags(Vocabulary(["a"]), ["<t>"]).counts is None


@pytest.mark.parametrize("tag, problem", [("", "non-empty"), ("<B T>", "without whitespace"), ("a\tb", "whitespace"),
                                         ("<eos>", "special"), (7, "non-empty string")])
def test_bad_tags_are_named(tag, problem):
    assert problem in tag_problem(tag)


def test_field_tags_round_trip_and_an_old_field_state_has_none(tmp_path):
    field = Field(build_tokenizer({"type": "space"}), Vocabulary(["a", "<BT>"]), ["<BT>"])
    state = field.state_dict()
    assert state["tags"] == ["<BT>"] and Field.from_state_dict(state).tags == ("<BT>",)
    old = Field(build_tokenizer({"type": "space"}), Vocabulary(["a"]))
    assert "tags" not in old.state_dict() and Field.from_state_dict(old.state_dict()).tags == ()
    assert field.tag_ids("<BT>") == [5] and field.tag_ids(None) == []
    with pytest.raises(DataError, match=r"'<2de>': not one of the model's source tags: <BT>$"):
        field.tag_ids("<2de>")
    with pytest.raises(DataError, match="none"):
        old.tag_ids("<BT>")
    with pytest.raises(DataError, match="not a token of its vocabulary"):
        Field(build_tokenizer({"type": "space"}), Vocabulary(["a"]), ["<BT>"])


@pytest.mark.parametrize("data, key, problem", [
    ({"train": [{"src": "a", "tgt": "b"}, {"src": "c", "tgt": "d", "src_tag": "<B T>"}]}, "data.train[1].src_tag",
     "without whitespace"),
    ({"train": {"src": "a", "tgt": "b", "src_tag": ""}}, "data.train.src_tag", "non-empty"),
    ({"train": {"src": "a", "tgt": "b", "src_tag": "<pad>"}}, "data.train.src_tag", "special"),
    ({"train": {"src": "a", "tgt": "b"}, "valid": {"src": "v", "tgt": "w", "src_tag": "<unk>"}}, "data.valid.src_tag",
     "special"),
    ({"train": {"src": "a", "tgt": "b", "src_tag": 3}}, "data.train.src_tag", "must be a string"),
])
def test_config_errors_name_the_key(data, key, problem):
    raw = {"data": {"valid": {"src": "v", "tgt": "w"}, **data}, "training": {"save_dir": "run", "max_steps": 1}}
    with pytest.raises(ConfigError) as err:
        resolve_config(raw, "c.yaml")
    message = str(err.value)
    assert message.startswith(f"c.yaml: {key}") and problem in message and "\n" not in message


def test_an_ensemble_of_models_with_other_tags_is_named():
    from nmt.data.field import field_difference

    space = build_tokenizer({"type": "space"})
    vocab = Vocabulary(["a", "<2de>", "<2fr>"])
    tgt = Field(space, Vocabulary(["x"]))
    one, other = Field(space, vocab, ["<2de>", "<2fr>"]), Field(space, vocab, ["<2de>"])
    assert field_difference(one, tgt, one, tgt, "b.pt", "a.pt") is None
    assert field_difference(one, tgt, other, tgt, "b.pt", "a.pt") == (
        "b.pt: its source tags differ from a.pt's (<2de> vs <2de>, <2fr>)")


def logged(data_cfg: dict, work_dir: Path) -> list[str]:
    """The messages ``load_training_data`` logs (a handler on its own logger: whatever another test
    did to logging's propagation and levels)."""
    import logging

    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("nmt.train.data_setup")
    level, disabled = logger.level, logger.disabled
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.disabled = False
    try:
        load_training_data(data_cfg, work_dir)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.disabled = disabled
    return messages


def test_the_data_log_names_each_corpus_tag(tmp_path):
    d = corpora(tmp_path / "d")
    lines = logged(resolved(d, tmp_path), tmp_path / "run")
    assert any(line.startswith("train corpus up: kept 29 of 30 pairs") and line.endswith(", source tag <2up>")
               for line in lines)
    assert any(line.startswith(f"train corpus {d['train'][1]['src']}, {d['train'][1]['tgt']}: kept 29")
               and line.endswith(", source tag <2rev>") for line in lines)
    assert any(line.startswith(f"valid data ({d['valid']['src']}, {d['valid']['tgt']}, source tag <2rev>)")
               for line in lines)
    single = {"train": {k: v for k, v in d["train"][0].items() if k != "name"}, "valid": d["valid"]}
    assert any(line.startswith(f"train data ({d['train'][0]['src']}, {d['train'][0]['tgt']}, source tag <2up>)")
               for line in logged(resolved(single, tmp_path), tmp_path / "run1"))


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("id_cache", [False, True])
def test_a_runs_vocab_src_read_back_with_the_same_settings_gives_the_same_ids(tmp_path, shared, id_cache):
    """README: another run given ``save_dir/vocab.src`` as ``data.src.vocab_file`` gets the same ids.
    With ``max_size`` the file holds max_size tokens and the tags (a tag's count: the lines it
    starts, more than any word's), and a tag only data.valid declares has count 0 (below min_freq):
    the tags are read whatever min_freq / max_size say, so no word is dropped for them and no tag
    moves to the end."""
    from nmt.train.data_setup import write_run_vocabularies

    d = corpora(tmp_path / "d")
    d["valid"]["src_tag"] = "<2ar>"  # sorted before the training tags; count 0
    side = {"tokenizer": {"type": "space"}, "max_size": 6, "min_freq": 2}
    extra = {"shared_vocab": True} if shared else {}
    first = load_training_data(resolved(d, tmp_path, src=side, id_cache=id_cache, **extra), tmp_path / "run")
    itos = first.src_field.vocab.itos
    assert itos[-3:] == ["<2ar>", "<2rev>", "<2up>"] and first.src_field.vocab.counts["<2ar>"] == 0
    assert len(itos) == len(SPECIALS) + 6 + 3  # max_size words, then the tags
    (tmp_path / "run").mkdir(exist_ok=True)
    write_run_vocabularies(tmp_path / "run", first.src_field, first.tgt_field, True)
    again = load_training_data(resolved(d, tmp_path, src={**side, "vocab_file": str(tmp_path / "run" / "vocab.src")},
                                        id_cache=id_cache, **extra), tmp_path / "run2")
    assert again.src_field.vocab.itos == itos and again.src_field.vocab.counts == first.src_field.vocab.counts
    assert again.src_field.tags == first.src_field.tags
    assert [again.train[i][0] for i in range(len(again.train))] == [first.train[i][0] for i in range(len(first.train))]


def test_a_vocab_file_without_counts_keeps_its_tags_beyond_max_size(tmp_path):
    """Without counts max_size keeps the first lines: a tag further down keeps its place (its id)."""
    d = corpora(tmp_path / "d")
    vocab_file = write(tmp_path / "vocab.txt", ["haus", "<2up>", "klein", "gross", "<2rev>", "das"])
    cfg = resolved(d, tmp_path, src={"tokenizer": {"type": "space"}, "vocab_file": vocab_file, "max_size": 2})
    data = load_training_data(cfg, tmp_path / "run")
    assert data.src_field.vocab.itos == list(SPECIALS) + ["haus", "<2up>", "klein", "<2rev>"]
    assert_wired(data, cfg)


@pytest.mark.slow
@pytest.mark.parametrize("cached", [False, True])
def test_two_ranks_train_a_tagged_run_as_one_process(tmp_path, ranks, cached):
    """Two Gloo ranks of batch 4 give the weights of one process of batch 8 on two tagged corpora
    (and a tagged validation set) only if rank 1 encodes with rank 0's tagged fields (the tags
    appended to its vocabulary, each corpus led by its tag; with data.id_cache: rank 1 reads the
    caches rank 0 wrote, keyed by the tags); the checkpoint keeps the tags."""
    import torch

    from ddp_workers import gloo_config
    from nmt.train.checkpoint import load_checkpoint
    from nmt.train.trainer import Trainer
    from tiny_task import write_task

    real = write_task(tmp_path / "real", n_train=24, seed=1)
    bt = write_task(tmp_path / "bt", n_train=30, seed=2)
    data = {"train": [{**real["train"], "src_tag": "<2x>"}, {**bt["train"], "weight": 0.7, "src_tag": "<BT>"}],
            "valid": {**real["valid"], "src_tag": "<2x>"}}
    Trainer(resolve_config(gloo_config(data, tmp_path / "one", 8, max_steps=8, valid_every=4), "t"), "t").train()
    results = ranks.run(gloo_config({**data, "id_cache": cached}, tmp_path / "two", 4, max_steps=8, valid_every=4))
    assert [r[2:4] for r in results] == [("max_steps", 8)] * 2
    one, two = load_checkpoint(tmp_path / "one" / "last.pt"), load_checkpoint(tmp_path / "two" / "last.pt")
    assert one["src_field"]["tags"] == two["src_field"]["tags"] == ["<2x>", "<BT>"]
    assert one["src_field"] == two["src_field"]
    for name in one["model"]:
        torch.testing.assert_close(two["model"][name], one["model"][name], rtol=1e-5, atol=2e-6, msg=name)
