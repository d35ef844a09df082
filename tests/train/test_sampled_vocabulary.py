"""``data.<side>.subword_sampling.vocab_samples``: the vocabulary counts the deterministic
segmentation plus the sampled segmentations of the first N training epochs.

Truth: the training path itself. The epochs' segmentations are made by ``ResampledPairs.for_epoch``
(the samplers returning ids, as training uses them) and read back through the vocabulary; their
token counts, summed with a plain count of the deterministic tokens, sorted and cut by hand, must
be the vocabulary (tokens, order and counts). A vocabulary without the option is compared byte for
byte with the files the deterministic count alone writes."""
from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest

from nmt.config import ConfigError, resolve_config
from nmt.data.dataset import read_parallel
from nmt.data.errors import DataError
from nmt.data.vocab_file import write_vocab_file
from nmt.data.vocabulary import SPECIALS, Vocabulary
from nmt.train.data_setup import build_fields, load_training_data, resampled_pairs
from nmt.train.trainer import Trainer
from test_subword_sampling_training import SAMPLING, words_config, write_words_task
from tiny_task import assert_same_run

SEED = 1234  # training.seed's default


@pytest.fixture
def task(tmp_path):
    return write_words_task(tmp_path / "data")


def sides(samples: int | None, base: dict = SAMPLING, **extra) -> dict:
    """SAMPLING with ``vocab_samples`` set on both sides (None: the key left out), no length limit
    (every pair kept in every epoch)."""
    out = copy.deepcopy(base)
    for side in ("src", "tgt"):
        out[side].update({"max_length": 1000, **extra})
        if samples is not None:
            out[side]["subword_sampling"]["vocab_samples"] = samples
    return out


def data_config(task, tmp_path, samples, **kw) -> dict:
    return resolve_config(words_config(task, tmp_path / "run", sides(samples, **kw)), "w.yaml")["data"]


def epoch_tokens(pairs, src, tgt, data_cfg, epochs) -> tuple[Counter, Counter, int]:
    """Token counts per side of training epochs 0..epochs-1 made the training way, and how many
    of their ids are <unk>."""
    resampled = resampled_pairs(pairs, src, tgt, data_cfg)
    counts, unk = (Counter(), Counter()), 0
    for epoch in range(epochs):
        ds = resampled.for_epoch(SEED, epoch)
        assert len(ds) == len(pairs)
        for k, (rows, field) in enumerate(((ds.src, src), (ds.tgt, tgt))):
            for ids in rows:
                unk += ids.count(field.vocab.unk_index)
                counts[k].update(field.vocab.itos[i] for i in ids)
    return counts[0], counts[1], unk


def cut(counts: Counter, min_freq: int = 1, max_size: int | None = None) -> list[str]:
    kept = sorted((t for t, c in counts.items() if c >= min_freq and t not in SPECIALS), key=lambda t: (-counts[t], t))
    return kept if max_size is None else kept[:max_size]


@pytest.mark.parametrize("samples", [1, 3])
def test_the_vocabulary_is_the_count_of_the_deterministic_and_the_first_epochs_segmentations(task, tmp_path, samples):
    pairs = read_parallel(task["train"]["src"], task["train"]["tgt"])
    data_cfg = data_config(task, tmp_path, samples)
    src, tgt = build_fields(data_cfg, pairs, tmp_path / "w", SEED)
    src_counts, tgt_counts, unk = epoch_tokens(pairs, src, tgt, data_cfg, samples)
    assert unk == 0  # every piece the first N epochs sample is in the vocabulary
    for field, sampled, k in ((src, src_counts, 0), (tgt, tgt_counts, 1)):
        truth = sampled + Counter(t for p in pairs for t in field.tokenizer.tokenize(p[k]))
        assert field.vocab.itos[len(SPECIALS):] == cut(truth)
        assert field.vocab.counts == dict(truth)
    # the deterministic count's tokens and more (no max_size; the BPE-dropout side gains pieces such
    # as 'k@@'; the 40-piece unigram model's samples may all be deterministic pieces of some word)
    plain_src, plain_tgt = build_fields(data_config(task, tmp_path, 0), pairs, tmp_path / "w0", SEED)
    assert set(plain_src.vocab.itos) < set(src.vocab.itos) and set(plain_tgt.vocab.itos) <= set(tgt.vocab.itos)
    # and the deterministic vocabulary leaves sampled pieces unknown in those epochs
    assert epoch_tokens(pairs, plain_src, plain_tgt, data_config(task, tmp_path, 0), samples)[2] > 0


def test_min_freq_and_max_size_apply_to_the_summed_counts(task, tmp_path):
    pairs = read_parallel(task["train"]["src"], task["train"]["tgt"])
    whole = build_fields(data_config(task, tmp_path, 2), pairs, tmp_path / "w", SEED)
    cut_cfg = data_config(task, tmp_path, 2, min_freq=3, max_size=25)
    for field, limited in zip(whole, build_fields(cut_cfg, pairs, tmp_path / "w2", SEED)):
        counts = Counter(field.vocab.counts)
        assert limited.vocab.itos[len(SPECIALS):] == cut(counts, 3, 25)
        assert len(limited.vocab) < len(field.vocab)


def test_under_a_shared_vocabulary_each_side_counts_its_own_samples(task, tmp_path):
    """One field from data.src's settings; the target lines sampled with the target's settings and
    generator (here another dropout), as training samples them."""
    shared = {"src": {"tokenizer": {"type": "bpe", "merges": 40}, "subword_sampling": {"dropout": 0.3}},
              "tgt": {"tokenizer": {"type": "bpe", "merges": 40}, "subword_sampling": {"dropout": 0.1}}}
    config = words_config(task, tmp_path / "run", sides(None, shared))
    config["data"]["shared_vocab"] = True
    config["data"]["src"]["subword_sampling"]["vocab_samples"] = 2
    data_cfg = resolve_config(config, "w.yaml")["data"]
    pairs = read_parallel(task["train"]["src"], task["train"]["tgt"])
    src, tgt = build_fields(data_cfg, pairs, tmp_path / "w", SEED)
    assert src is tgt
    src_counts, tgt_counts, unk = epoch_tokens(pairs, src, tgt, data_cfg, 2)
    assert unk == 0
    truth = src_counts + tgt_counts + Counter(t for p in pairs for line in p for t in src.tokenizer.tokenize(line))
    assert src.vocab.itos[len(SPECIALS):] == cut(truth)


def test_without_vocab_samples_the_vocabulary_files_are_the_deterministic_counts_byte_for_byte(task, tmp_path):
    """A config without the key and one with vocab_samples: 0 write the same bytes as a plain
    count of the deterministic tokens (what nmt wrote before the option)."""
    pairs = read_parallel(task["train"]["src"], task["train"]["tgt"])
    written = []
    for name, samples in (("absent", None), ("zero", 0)):
        src, tgt = build_fields(data_config(task, tmp_path, samples), pairs, tmp_path / name, SEED)
        for side, field in (("src", src), ("tgt", tgt)):
            write_vocab_file(tmp_path / name / f"vocab.{side}", field.vocab)
        written.append([(tmp_path / name / f"vocab.{s}").read_bytes() for s in ("src", "tgt")])
        for k, field in enumerate((src, tgt)):
            plain = Vocabulary.build(field.tokenizer.tokenize(p[k]) for p in pairs)
            write_vocab_file(tmp_path / name / f"plain.{k}", plain)
            assert (tmp_path / name / f"plain.{k}").read_bytes() == written[-1][k]
    assert written[0] == written[1]


def test_the_seed_is_needed_and_each_seed_counts_its_own_epochs(task, tmp_path):
    pairs = read_parallel(task["train"]["src"], task["train"]["tgt"])
    data_cfg = data_config(task, tmp_path, 1)
    with pytest.raises(DataError, match=r"data.src.subword_sampling.vocab_samples: .*training.seed"):
        build_fields(data_cfg, pairs, tmp_path / "w")
    a = build_fields(data_cfg, pairs, tmp_path / "a", 1)
    b = build_fields(data_cfg, pairs, tmp_path / "b", 2)
    assert a[0].vocab.counts != b[0].vocab.counts
    assert build_fields(data_cfg, pairs, tmp_path / "c", 1)[0].vocab.counts == a[0].vocab.counts


def test_a_training_run_sees_no_unknown_piece_in_its_first_n_epochs(task, tmp_path):
    config = words_config(task, tmp_path / "run", sides(3), max_steps=13)
    t = Trainer(resolve_config(config, "w.yaml"), "w.yaml")
    seen = []
    original = t._epoch_train_set
    t._epoch_train_set = lambda epoch: seen.append(original(epoch)) or seen[-1]
    t.train()
    assert len(seen) == 3
    for ds in seen:
        assert not any(t.data.src_field.vocab.unk_index in ids for ids in ds.src)
        assert not any(t.data.tgt_field.vocab.unk_index in ids for ids in ds.tgt)
        assert "<unk>" not in ds.summary()
    vocab_src = (tmp_path / "run" / "vocab.src").read_text(encoding="utf-8")
    assert len(vocab_src.splitlines()) == len(t.data.src_field.vocab) - len(SPECIALS)


def test_interrupted_and_resumed_equals_uninterrupted(task, tmp_path):
    """The resumed run takes its fields from the checkpoint; its batches, weights and metrics are
    those of a run never interrupted."""
    import os
    import signal

    def make(save_dir):
        return Trainer(resolve_config(words_config(task, save_dir, sides(2)), "w.yaml"), "w.yaml")
    straight = make(tmp_path / "straight")
    straight.train()

    def interrupt_at_9(step):
        if step == 9:
            os.kill(os.getpid(), signal.SIGINT)
    first = make(tmp_path / "resumed")
    assert first.train(step_hook=interrupt_at_9).stopped_by == "SIGINT"
    second = make(tmp_path / "resumed")
    assert second.resumed and second.progress.step == 9
    assert second.data.src_field.vocab == straight.data.src_field.vocab
    assert second.data.tgt_field.vocab == straight.data.tgt_field.vocab
    assert second.train().step == 14
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")


@pytest.mark.parametrize("change,key,match", [
    (lambda d: d["tgt"].update(subword_sampling={"dropout": 0.1, "vocab_samples": 1}) or d.update(shared_vocab=True),
     "data.tgt.subword_sampling.vocab_samples", "set data.src.subword_sampling.vocab_samples instead"),
    (lambda d: d["src"].update(vocab_file="v.txt"), "data.src.subword_sampling.vocab_samples",
     "read from data.src.vocab_file"),
    (lambda d: d["tgt"]["subword_sampling"].update(alpha=None), "data.tgt.subword_sampling.vocab_samples",
     "but data.tgt.subword_sampling samples"),
    (lambda d: d["src"]["subword_sampling"].update(vocab_samples=-1), "data.src.subword_sampling.vocab_samples",
     ">= 0"),
])
def test_config_errors_name_the_key(task, tmp_path, change, key, match):
    config = words_config(task, tmp_path / "run", sides(1))
    change(config["data"])
    with pytest.raises(ConfigError, match=match) as err:
        resolve_config(config, "w.yaml")
    assert str(err.value).startswith(f"w.yaml: {key}") and "\n" not in str(err.value)


def test_the_shared_vocabulary_may_count_samples_of_the_target_side_only(task, tmp_path):
    shared = {"src": {"tokenizer": {"type": "bpe", "merges": 40}},
              "tgt": {"tokenizer": {"type": "bpe", "merges": 40}, "subword_sampling": {"dropout": 0.2}}}
    config = words_config(task, tmp_path / "run", sides(None, shared))
    config["data"]["shared_vocab"] = True
    config["data"]["src"]["subword_sampling"] = {"vocab_samples": 1}
    data_cfg = resolve_config(config, "w.yaml")["data"]
    data = load_training_data(data_cfg, tmp_path / "w", seed=SEED)
    assert epoch_tokens(read_parallel(task["train"]["src"], task["train"]["tgt"]), data.src_field,
                        data.tgt_field, data_cfg, 1)[2] == 0


def test_blank_lines_draw_nothing_as_in_training(task, tmp_path):
    """Blank lines among the training lines (ParallelDataset does not sample them; sampling one
    would draw nothing either) leave the counts in step with the epochs' draws."""
    path = Path(task["train"]["src"])
    lines = path.read_text(encoding="utf-8").splitlines()
    for i in (3, 10, 11, 30):
        lines[i] = "  "
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    pairs = read_parallel(task["train"]["src"], task["train"]["tgt"])
    data_cfg = data_config(task, tmp_path, 3)
    src, tgt = build_fields(data_cfg, pairs, tmp_path / "w", SEED)
    resampled = resampled_pairs(pairs, src, tgt, data_cfg)
    for epoch in range(3):
        ds = resampled.for_epoch(SEED, epoch)
        assert len(ds) == len(pairs) - 4
        assert not any(src.vocab.unk_index in ids for ids in ds.src)


def test_a_checkpoint_of_an_nmt_without_vocab_samples_resumes(task, tmp_path):
    """A sampling run saved before the option existed resumes (0 is what it counted); turning the
    option on for that run is refused (its vocabulary is the checkpoint's, counted without it)."""
    from nmt.train.checkpoint import load_checkpoint, save_checkpoint

    make = lambda samples, steps: Trainer(resolve_config(words_config(task, tmp_path / "run", sides(samples),
                                                                      max_steps=steps), "w.yaml"), "w.yaml")
    make(None, 2).train()
    last = tmp_path / "run" / "last.pt"
    checkpoint = load_checkpoint(last)
    for side in ("src", "tgt"):
        del checkpoint["config"]["data"][side]["subword_sampling"]["vocab_samples"]
    save_checkpoint(last, checkpoint)
    with pytest.raises(ConfigError, match=r"data.src.subword_sampling.vocab_samples: differs from the run"):
        make(1, 3)
    resumed = make(None, 3)
    assert resumed.resumed and resumed.train().step == 3


def test_with_id_cache_and_ready_codes_the_count_still_holds_the_samples(task, tmp_path):
    """BPE codes given (codes_file: nothing to learn) and data.id_cache: the fields would be
    counted streaming the files, but vocab_samples needs the sampled segmentations: the same
    vocabulary as without the cache, and no <unk> in the counted epochs of the streamed dataset."""
    pairs = read_parallel(task["train"]["src"], task["train"]["tgt"])
    learned = build_fields(data_config(task, tmp_path, 0), pairs, tmp_path / "learn", SEED)[0].tokenizer
    codes = tmp_path / "codes.bpe"
    codes.write_text(learned.codes, encoding="utf-8")
    ready = {"src": {"tokenizer": {"type": "bpe", "codes_file": str(codes)},
                     "subword_sampling": {"dropout": 0.3, "vocab_samples": 2}},
             "tgt": {"tokenizer": {"type": "char"}}}  # nothing to learn on either side
    vocabs = {}
    for cached in (False, True):
        config = words_config({**task, "id_cache": cached}, tmp_path / f"run_{cached}", sides(None, ready))
        data_cfg = resolve_config(config, "w.yaml")["data"]
        data = load_training_data(data_cfg, tmp_path / f"w_{cached}", seed=SEED)
        vocabs[cached] = data.src_field.vocab
        for epoch in range(2):
            ds = data.resampled.for_epoch(SEED, epoch)
            assert not any(data.src_field.vocab.unk_index in ds.src[i] for i in range(len(ds)))
    assert vocabs[True] == vocabs[False] and vocabs[True].counts == vocabs[False].counts
    assert len(vocabs[True]) > len(build_fields(data_config(task, tmp_path, 0), pairs, tmp_path / "w0", SEED)[0].vocab)
