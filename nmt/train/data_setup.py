"""From the ``data:`` config section to fields and datasets (and generated data if asked).

Fields (tokenizer + vocabulary per side) are built from the training data on a fresh run
(training the tokenizer first when it learns a model: BPE merges, sentencepiece; a vocabulary
comes from ``data.<side>.vocab_file`` instead when that is set) and come from the checkpoint on
a resumed run, so a resumed run sees exactly the same ids (and from the parent's checkpoint on a
run started with ``training.init_from``: :mod:`nmt.train.init_from`).
"""
from __future__ import annotations

import itertools
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmt.data.corpora import (Corpus, CorpusWeights, check_corpus_files, is_weighted, read_corpora, tag_line_counts,
                              training_corpora)
from nmt.data.corpus_arrays import ConcatenatedArrays
from nmt.data.dataset import ParallelDataset, read_parallel
from nmt.data.epoch_segmentation import ResampledFiles, ResampledPairs
from nmt.data.sampled_vocabulary import vocabulary_token_lists
from nmt.data.source_noise import NoiseSettings, SourceNoise
from nmt.data.source_tags import config_tags, pair_prefixes, tagged, with_tags
from nmt.data.subword_sampling import SubwordSampler, build_sampler, sampling_enabled
from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.alignment_arrays import (AlignedFiles, ArrayAlignments, alignment_cache_key, build_alignment_arrays,
                                      load_alignment_arrays)
from nmt.data.id_arrays import ArrayParallelDataset, cache_directory, load_id_dataset
from nmt.data.word_alignments import TrainingAlignments, read_training_alignments
from nmt.data.pair_filter import PairFilter, describe_skipped
from nmt.data.textfiles import iter_lines
from nmt.data.tokenizers import Tokenizer, build_tokenizer
from nmt.data.vocab_file import read_vocab_file, write_vocab_file
from nmt.data.vocabulary import Vocabulary
from nmt.utils.allocator import release_freed_memory
from nmt.utils.file_fingerprint import describe_change, fingerprint

logger = logging.getLogger(__name__)

DATA_FILE_KEYS = ("data.train.src", "data.train.tgt", "data.valid.src", "data.valid.tgt")
"""The config keys of the data files a checkpoint fingerprints (see :func:`data_fingerprints`)."""
GENERATED_NAMES = {("train", "src"): "train.src", ("train", "tgt"): "train.tgt",
                   ("valid", "src"): "valid.src", ("valid", "tgt"): "valid.tgt"}


@dataclass
class TrainingData:
    """Everything the trainer reads: both fields, both datasets, and the raw validation pairs.

    ``valid_references[i]`` is the raw target line of ``valid`` example ``i`` (for exact
    match / BLEU against detokenized hypotheses). ``resampled``: with subword sampling
    (``data.<side>.subword_sampling``) the training pairs to re-segment every epoch
    (``train`` is then their deterministic segmentation, for the data line and the vocabulary's
    unknown-token count); None otherwise. ``weights``: with several corpora (or a weight other
    than 1) what builds each epoch's examples from ``train`` (or the epoch's segmentation): the
    corpora's pairs lie one after the other in ``train``; None otherwise.
    """

    src_field: Field
    tgt_field: Field
    train: ParallelDataset | ArrayParallelDataset | ConcatenatedArrays
    valid: ParallelDataset
    valid_references: list[str]
    resampled: ResampledPairs | ResampledFiles | None = None
    weights: CorpusWeights | None = None
    alignments: TrainingAlignments | ArrayAlignments | None = None
    valid_alignments: TrainingAlignments | None = None


def generate_if_missing(data_cfg: dict) -> bool:
    """Run the generator named by ``data.generate`` when a train/valid file is missing.

    Files are generated (seeded by ``data.generate_seed``) into a temporary directory and
    moved to the paths the config names; existing files are never overwritten.
    Returns True when something was generated.
    """
    if data_cfg["generate"] is None:
        return False
    targets = {(split, side): Path(data_cfg[split][side]) for split, side in GENERATED_NAMES}
    missing = {key: path for key, path in targets.items() if not path.exists()}
    if not missing:
        return False
    from nmt.data.synthetic import generate_quickstart

    anchor = next(iter(missing.values())).parent
    anchor.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=anchor, prefix=".generate.") as tmp:
        generate_quickstart(tmp, seed=data_cfg["generate_seed"])
        for key, path in missing.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(Path(tmp) / GENERATED_NAMES[key]), str(path))
    logger.info("generated %s data: %s", data_cfg["generate"], ", ".join(str(p) for p in missing.values()))
    return True


def build_fields(data_cfg: dict, train_pairs: list[tuple[str, str]], work_dir: str | Path,
                 seed: int | None = None) -> tuple[Field, Field]:
    """Train tokenizers (if they learn a model) and build vocabularies from the training pairs
    (or read them from ``data.<side>.vocab_file``: :func:`nmt.data.vocab_file.read_vocab_file`).

    With ``data.shared_vocab`` one field (src settings, the src vocabulary file) is built from
    both sides and returned twice. With ``data.shared_tokenizer`` (and no shared vocabulary) one
    tokenizer (src settings) is trained on both sides, and each side gets its own vocabulary of the
    tokens it uses: OpenNMT-py's usual joint sentencepiece/BPE model with per-side vocabularies.
    A vocabulary with ``subword_sampling.vocab_samples`` N > 0 (the src one under shared_vocab)
    also counts the sampled segmentations of the first N training epochs of a run seeded with
    ``seed`` (``training.seed``; :mod:`nmt.data.sampled_vocabulary`).
    """
    src_lines = [s for s, _ in train_pairs]
    tgt_lines = [t for _, t in train_pairs]
    work_dir = Path(work_dir)
    src_cfg, tgt_cfg = data_cfg["src"], data_cfg["tgt"]
    if data_cfg["shared_vocab"]:
        tokenizer = _trained_tokenizer(src_cfg, src_lines + tgt_lines, work_dir / "tokenizer_shared")
        field = Field(tokenizer, counted_vocabulary(data_cfg, "src", tokenizer,
                                                    (("src", src_lines), ("tgt", tgt_lines)), seed))
        return field, field
    if data_cfg["shared_tokenizer"]:
        tokenizer = _trained_tokenizer(src_cfg, src_lines + tgt_lines, work_dir / "tokenizer_shared")
        return (Field(tokenizer, counted_vocabulary(data_cfg, "src", tokenizer, (("src", src_lines),), seed)),
                Field(tokenizer, counted_vocabulary(data_cfg, "tgt", tokenizer, (("tgt", tgt_lines),), seed)))
    src_tokenizer = _trained_tokenizer(src_cfg, src_lines, work_dir / "tokenizer_src")
    tgt_tokenizer = _trained_tokenizer(tgt_cfg, tgt_lines, work_dir / "tokenizer_tgt")
    return (Field(src_tokenizer, counted_vocabulary(data_cfg, "src", src_tokenizer, (("src", src_lines),), seed)),
            Field(tgt_tokenizer, counted_vocabulary(data_cfg, "tgt", tgt_tokenizer, (("tgt", tgt_lines),), seed)))


def counted_vocabulary(data_cfg: dict, vocab_side: str, tokenizer: Tokenizer,
                       sides: Sequence[tuple[str, list[str]]], seed: int | None) -> Vocabulary:
    """The vocabulary configured by ``data.<vocab_side>`` over the lines of ``sides`` (``(side,
    lines)``: one side, or both under shared_vocab): :func:`side_vocabulary`, unchanged, when its
    ``subword_sampling.vocab_samples`` is 0 or a ``vocab_file`` is set; else the counts of the
    deterministic segmentation plus the first ``vocab_samples`` epochs' sampled segmentations of
    each side that samples (:func:`nmt.data.sampled_vocabulary.vocabulary_token_lists`)."""
    side_cfg, key = data_cfg[vocab_side], f"data.{vocab_side}"
    samples = _vocab_samples(side_cfg)
    if samples == 0:
        return side_vocabulary(side_cfg, tokenizer, [line for _, lines in sides for line in lines], key,
                               config_tags(data_cfg) if vocab_side == "src" else ())
    if seed is None:
        raise DataError(f"{key}.subword_sampling.vocab_samples: the vocabulary counts the training epochs' "
                        "sampled segmentations, which need training.seed (pass seed=)")
    samplers = _side_samplers(data_cfg, [(side, tokenizer, None) for side, _ in sides])  # returning tokens
    counted = [(side, lines, samplers[side]) for side, lines in sides]
    start = time.perf_counter()
    vocab = Vocabulary.build(vocabulary_token_lists(tokenizer, counted, seed, samples),
                             side_cfg["min_freq"], side_cfg["max_size"])
    logger.info("%s vocabulary: counted over the deterministic segmentation and the sampled segmentations of "
                "epochs 0-%d (%s.subword_sampling.vocab_samples: %d, training.seed %d) in %.1fs: %d types",
                key, samples - 1, key, samples, seed, time.perf_counter() - start, len(vocab))
    return vocab


def _vocab_samples(side_cfg: dict) -> int:
    """The sampled epochs a side's vocabulary counts: ``subword_sampling.vocab_samples``, 0 where a
    ``vocab_file`` gives the vocabulary (or a hand-made config lacks the key)."""
    if side_cfg.get("vocab_file") is not None:
        return 0
    return int(side_cfg.get("subword_sampling", {}).get("vocab_samples", 0))


def _sampling_settings(settings: dict) -> dict:
    """A side's ``subword_sampling`` section without ``vocab_samples`` (what its sampler draws from)."""
    return {k: v for k, v in settings.items() if k != "vocab_samples"}


def side_vocabulary(side_cfg: dict, tokenizer: Tokenizer, lines: Iterable[str], key: str,
                    tags: Sequence[str] = ()) -> Vocabulary:
    """The vocabulary of one side (``side_cfg``: ``data.src`` or ``data.tgt``, named by ``key``):
    read from ``vocab_file`` when it is set (``lines`` are then not read), else counted over the
    tokenized ``lines``; ``min_freq`` / ``max_size`` apply either way, except to the source tags
    ``tags`` a vocabulary file holds (kept in their places: :func:`nmt.data.vocab_file.read_vocab_file`)."""
    if side_cfg.get("vocab_file") is not None:
        return read_vocab_file(side_cfg["vocab_file"], side_cfg["min_freq"], side_cfg["max_size"], key, keep=tags)
    return Vocabulary.build((tokenizer.tokenize(line) for line in lines), side_cfg["min_freq"], side_cfg["max_size"])


def streamed_fields(data_cfg: dict) -> tuple[Field, Field] | None:
    """The fields of :func:`build_fields`, built by streaming the training files line by line
    (never a list of the corpus; with several corpora their files one after the other, as
    :func:`nmt.data.corpora.read_corpora` reads them), when no tokenizer learns a model and no
    vocabulary counts sampled segmentations (``vocab_samples``); None otherwise."""
    side_cfgs = (data_cfg["src"],) if data_cfg["shared_vocab"] or data_cfg["shared_tokenizer"] else (
        data_cfg["src"], data_cfg["tgt"])
    tokenizers = [build_tokenizer(side["tokenizer"]) for side in side_cfgs]
    if any(t.needs_training for t in tokenizers):
        return None
    if any(_vocab_samples(side) for side in side_cfgs):
        return None  # the count holds sampled segmentations: build_fields over the text
    corpora = training_corpora(data_cfg["train"])
    src, tgt = data_cfg["src"], data_cfg["tgt"]
    src_lines = lambda: itertools.chain.from_iterable(iter_lines(c.src) for c in corpora)
    tgt_lines = lambda: itertools.chain.from_iterable(iter_lines(c.tgt) for c in corpora)
    tags = config_tags(data_cfg)
    if data_cfg["shared_vocab"]:
        lines = itertools.chain(src_lines(), tgt_lines())
        field = Field(tokenizers[0], side_vocabulary(src, tokenizers[0], lines, "data.src", tags))
        return field, field
    return (Field(tokenizers[0], side_vocabulary(src, tokenizers[0], src_lines(), "data.src", tags)),
            Field(tokenizers[-1], side_vocabulary(tgt, tokenizers[-1], tgt_lines(), "data.tgt")))


def _trained_tokenizer(side_cfg: dict, lines: list[str], work_dir: Path) -> Tokenizer:
    tokenizer = build_tokenizer(side_cfg["tokenizer"])
    if tokenizer.needs_training:
        work_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.train(lines, work_dir)
    return tokenizer


def load_training_data(data_cfg: dict, work_dir: str | Path,
                       fields: tuple[Field, Field] | None = None, seed: int | None = None,
                       alignments: bool = False) -> TrainingData:
    """Read train/valid files, build (or reuse) the fields, and encode both datasets.

    Training pairs that are empty, longer than ``max_length`` or shorter than ``min_length`` (per
    side), or over ``data.max_length_ratio`` are skipped and counted in the log, each under the
    first rule it breaks (:mod:`nmt.data.pair_filter`; per corpus too with several); validation
    keeps every non-empty pair whatever its length. Raises a one-line
    ``DataError`` naming the files when no training or no validation pair is left (and why).
    With ``data.id_cache`` the training set is an ``ArrayParallelDataset``
    (``nmt.data.id_arrays``, memory-mapped; with several corpora one cache per corpus, read as one
    :class:`~nmt.data.corpus_arrays.ConcatenatedArrays`), and the training text is not read at all
    when ``fields`` are given (a resumed run, or ranks > 0 of a data-parallel job) or no tokenizer
    learns a model. With ``data.train`` a list of corpora (:mod:`nmt.data.corpora`) their pairs are
    read one after the other (a missing file names its key, ``data.train[1].src``), the fields are
    built from them all (each once, whatever its weight), and ``weights`` is set (also for one
    corpus of a weight other than 1, with or without the cache); one line per corpus is logged.
    ``seed`` (``training.seed``): the seed of the sampled segmentations a vocabulary with
    ``subword_sampling.vocab_samples`` counts (:func:`build_fields`). ``alignments`` (guided
    alignment training): the corpora's ``align`` files are read
    (:func:`nmt.data.word_alignments.read_training_alignments`; with ``data.id_cache`` streamed into
    cached token-pair arrays, :func:`cached_alignments`) into ``TrainingData.alignments``.
    """
    train_files, rules = data_cfg["train"], PairFilter.from_config(data_cfg)
    corpora = training_corpora(train_files)
    fresh = fields is None  # fields built from this data (streamed or not), not given
    if data_cfg["id_cache"] and is_weighted(train_files):
        check_corpus_files(corpora)  # before streaming or caching them: the key of a missing file
    if data_cfg["id_cache"] and fields is None:
        fields = streamed_fields(data_cfg)  # None when a tokenizer must be trained on the text
    train_pairs = None
    weights = None
    if data_cfg["id_cache"] and fields is not None:  # never holds the corpus as Python lists
        src_field, tgt_field = fields
    else:
        if is_weighted(train_files):
            train_pairs, starts = read_corpora(corpora)
            weights = CorpusWeights(corpora, starts, data_cfg.get("sampling_temperature", 1.0))
        else:
            train_pairs = read_parallel(train_files["src"], train_files["tgt"])
        if not any(src.strip() and tgt.strip() for src, tgt in train_pairs):
            raise DataError(f"{_files(data_cfg, 'train')}: no training pairs: {len(train_pairs)} lines, "
                            "none with text on both sides")
        src_field, tgt_field = fields if fields is not None else build_fields(data_cfg, train_pairs, work_dir, seed)
    src_field, tgt_field = tagged_fields(src_field, tgt_field, data_cfg, corpora, fresh=fresh)
    src_prefixes = [src_field.tag_ids(c.src_tag) for c in corpora]
    valid_prefix = src_field.tag_ids(data_cfg["valid"].get("src_tag"))
    valid_pairs = read_parallel(data_cfg["valid"]["src"], data_cfg["valid"]["tgt"])
    if data_cfg["id_cache"]:
        if train_pairs is not None:  # read to train a tokenizer: drop the lines, give the memory back
            train_pairs = None
            release_freed_memory()
        train = cached_training_set(corpora, src_field, tgt_field, rules, work_dir, is_weighted(train_files),
                                    src_prefixes)
        if is_weighted(train_files):
            starts = train.starts if isinstance(train, ConcatenatedArrays) else np.array([0, train.n_input])
            weights = CorpusWeights(corpora, starts, data_cfg.get("sampling_temperature", 1.0))
    else:
        if weights is None:
            starts = np.array([0, len(train_pairs)])
        train_prefix = pair_prefixes(starts, src_prefixes) if any(src_prefixes) else None
        train = ParallelDataset(train_pairs, src_field, tgt_field, pair_filter=rules,
                                src_encode=_tag_encoder(src_field, train_prefix))
    references = None
    if alignments and data_cfg["id_cache"]:  # streamed and cached beside the token ids
        references = cached_alignments(corpora, train, src_field, tgt_field, work_dir, src_prefixes)
    elif alignments and train_pairs is not None:
        references = read_training_alignments(corpora, train_pairs, starts, train.line_numbers, src_field.tokenizer,
                                              tgt_field.tokenizer, [len(p) for p in src_prefixes])
    resampled = (resampled_files(corpora, src_field, tgt_field, data_cfg, src_prefixes) if data_cfg["id_cache"]
                 else resampled_pairs(train_pairs, src_field, tgt_field, data_cfg, train_prefix))
    if len(train) == 0:
        raise DataError(f"{_files(data_cfg, 'train')}: no training pairs left: all {train.n_input} dropped "
                        f"({describe_skipped(train.skipped)}; {rules.describe()})")
    valid, valid_references = validation_set(valid_pairs, src_field, tgt_field, valid_prefix,
                                             _files(data_cfg, "valid"))
    for name, dataset in (("train", train), ("valid", valid)):
        logger.info("%s data (%s): %s", name, _files(data_cfg, name), dataset.summary())
    if weights is not None:
        for line in weights.describe(train):
            logger.info("train corpus %s", line)
    logger.info("vocabulary: source %d types, target %d types%s", len(src_field.vocab), len(tgt_field.vocab),
                " (shared)" if src_field is tgt_field
                else " (shared tokenizer)" if src_field.tokenizer is tgt_field.tokenizer else "")
    if references is not None:
        (logger.warning if references.mismatched else logger.info)("alignments: %s", references.describe(len(train)))
    if resampled is not None:
        logger.info("subword sampling: %s; a new segmentation of the training data every epoch, seeded by "
                    "(training.seed, epoch)", resampled.describe())
    valid_aligned = None
    if data_cfg["valid"].get("align"):  # the validation's alignment error rate
        valid_corpus = Corpus("data.valid", data_cfg["valid"]["src"], data_cfg["valid"]["tgt"],
                              align=data_cfg["valid"]["align"])
        valid_aligned = read_training_alignments([valid_corpus], valid_pairs, [0, len(valid_pairs)], valid.line_numbers,
                                                 src_field.tokenizer, tgt_field.tokenizer, [len(valid_prefix)])
        (logger.warning if valid_aligned.mismatched else logger.info)(
            "valid alignments: %s", valid_aligned.describe(len(valid), "validation pairs"))
    return TrainingData(src_field, tgt_field, train, valid, valid_references, resampled, weights, references,
                        valid_aligned)


def cached_training_set(corpora: Sequence[Corpus], src_field: Field, tgt_field: Field,
                        rules: PairFilter, work_dir: str | Path, weighted: bool,
                        src_prefixes: Sequence[Sequence[int]] | None = None
                        ) -> ArrayParallelDataset | ConcatenatedArrays:
    """The memory-mapped training set of ``data.id_cache``: one corpus's cache
    (:func:`nmt.data.id_arrays.load_id_dataset`), or with several one cache per corpus read one
    after the other (:class:`nmt.data.corpus_arrays.ConcatenatedArrays`), its pairs kept by ``rules``
    (the caches are keyed by them) and corpus ``k``'s sources led by ``src_prefixes[k]`` (its source
    tag's id; keyed too). With ``weighted`` (a list,
    or one corpus with a weight) a missing file is named by its key, e.g. ``data.train[1]: ...``."""
    parts = []
    for k, corpus in enumerate(corpora):
        try:
            parts.append(load_id_dataset(corpus.src, corpus.tgt, src_field, tgt_field, fallback_dir=work_dir,
                                         pair_filter=rules, src_prefix=src_prefixes[k] if src_prefixes else ()))
        except DataError as exc:
            if not weighted:
                raise
            raise DataError(f"{corpus.key}: {exc}") from None
    return parts[0] if len(parts) == 1 else ConcatenatedArrays(parts)


def cached_alignments(corpora: Sequence[Corpus], train: ArrayParallelDataset | ConcatenatedArrays,
                      src_field: Field, tgt_field: Field, work_dir: str | Path,
                      src_prefixes: Sequence[Sequence[int]]) -> ArrayAlignments | None:
    """With ``data.id_cache``: the reference token pairs of the corpora with an ``align`` file, built
    once per corpus by streaming its files (:func:`nmt.data.alignment_arrays.build_alignment_arrays`)
    and cached in its id cache's directory under that cache's key (``train``'s parts were read from
    it) and the alignment file's fingerprint (memory-mapped at load); None when no corpus has one."""
    datasets = train.parts if isinstance(train, ConcatenatedArrays) else [train]
    starts = train.starts if isinstance(train, ConcatenatedArrays) else np.array([0, train.n_input])
    parts, sources = [], []
    for k, (corpus, dataset) in enumerate(zip(corpora, datasets)):
        if not corpus.align:
            continue
        prefix = src_prefixes[k] if src_prefixes else ()
        # beside the token ids this run reads, keyed by their cache's key
        directory = cache_directory(corpus.src, alignment_cache_key(dataset.cache_key, corpus.align, len(prefix)),
                                    work_dir)
        arrays, meta = load_alignment_arrays(directory, lambda: build_alignment_arrays(
            corpus.src, corpus.tgt, corpus.align, dataset.line_numbers, dataset.n_input, src_field.tokenizer,
            tgt_field.tokenizer, len(prefix), corpus.key))
        parts.append((np.asarray(dataset.line_numbers, dtype=np.int64) + int(starts[k]), arrays, meta))
        sources.append(AlignedFiles(corpus.src, corpus.tgt, corpus.align, int(starts[k]), int(dataset.n_input),
                                    len(prefix), corpus.key))
    return ArrayAlignments(parts, sources) if parts else None


def resampled_pairs(pairs: Sequence[tuple[str, str]], src_field: Field, tgt_field: Field,
                    data_cfg: dict, src_prefix: Callable[[int], Sequence[int]] | None = None
                    ) -> ResampledPairs | None:
    """The :class:`ResampledPairs` the ``data.<side>.subword_sampling`` sections ask for (None when
    no side samples). A sampler serves both sides when they share a field (data.shared_vocab) and
    settings: its caches are made once. ``src_prefix``: ``f(i)``, the source tag ids of pair ``i``."""
    samplers = _epoch_samplers(src_field, tgt_field, data_cfg)
    if samplers is None:
        return None
    return ResampledPairs(pairs, src_field, tgt_field, samplers["src"], samplers["tgt"],
                          pair_filter=PairFilter.from_config(data_cfg), src_prefix=src_prefix)


def resampled_files(corpora: Sequence[Corpus], src_field: Field, tgt_field: Field,
                    data_cfg: dict, src_prefixes: Sequence[Sequence[int]] | None = None) -> ResampledFiles | None:
    """With ``data.id_cache``: the :class:`ResampledFiles` (the corpora's files streamed every
    epoch) the ``subword_sampling`` sections ask for, None when no side samples; ``src_prefixes``:
    each corpus's source tag ids."""
    samplers = _epoch_samplers(src_field, tgt_field, data_cfg)
    if samplers is None:
        return None
    return ResampledFiles([(c.src, c.tgt) for c in corpora], src_field, tgt_field, samplers["src"],
                          samplers["tgt"], pair_filter=PairFilter.from_config(data_cfg), src_prefixes=src_prefixes)


def _tag_encoder(src_field: Field, prefix: Sequence[int] | Callable[[int], Sequence[int]] | None
                 ) -> Callable[[int, str], list[int]] | None:
    """The source encoder of a dataset whose sources are led by ``prefix`` (ids, or ``f(i)`` per
    pair: :func:`nmt.data.source_tags.tagged`); None (the field's own ``encode``) without a prefix."""
    if prefix is None:
        return None
    return tagged(lambda _, text: src_field.encode(text), prefix)


def tagged_fields(src_field: Field, tgt_field: Field, data_cfg: dict, corpora: Sequence[Corpus],
                  fresh: bool) -> tuple[Field, Field]:
    """The fields with the source tags ``data_cfg`` declares (:func:`nmt.data.source_tags.config_tags`)
    among the source field's ``tags`` and tokens. ``fresh`` (fields built from this data): a tag the
    vocabulary lacks is appended (:func:`nmt.data.source_tags.with_tags`; with counts, the source
    lines it starts in the training corpora). Otherwise (a resumed run's, a fine-tuned run's or
    another rank's fields) a tag the vocabulary lacks is a ``DataError`` naming its key. Shared
    fields (``data.shared_vocab``) stay one field. The fields themselves when nothing changes."""
    tags = config_tags(data_cfg)
    if not tags or (set(tags) <= set(src_field.tags)):
        return src_field, tgt_field
    vocab = src_field.vocab
    missing = [t for t in tags if t not in vocab]
    if missing and not fresh:
        raise DataError(f"{tag_key(data_cfg, missing[0])}: {missing[0]!r} is not a token of the source vocabulary "
                        "this run starts from (a checkpoint's): fine-tune with training.init_vocab: extend to add it")
    if missing:
        vocab = with_tags(vocab, tags, tag_line_counts(corpora) if vocab.counts is not None else None)
        logger.info("source tags %s: added to the source vocabulary (ids %s)", ", ".join(missing),
                    ", ".join(str(vocab.stoi[t]) for t in missing))
    src = Field(src_field.tokenizer, vocab, set(src_field.tags) | set(tags))
    return src, (src if tgt_field is src_field else tgt_field)


def tag_key(data_cfg: dict, tag: str) -> str:
    """The first config key declaring source tag ``tag`` (``data.train[1].src_tag``, ``data.valid.src_tag``)."""
    for corpus in training_corpora(data_cfg["train"]):
        if corpus.src_tag == tag:
            return f"{corpus.key}.src_tag"
    return "data.valid.src_tag"


def _epoch_samplers(src_field: Field, tgt_field: Field, data_cfg: dict) -> dict[str, SubwordSampler | None] | None:
    """Each side's sampler (returning ids; None for a deterministic side), one shared by both sides
    with one field and the same settings; None when no side samples."""
    samplers = _side_samplers(data_cfg, [("src", src_field.tokenizer, src_field.encode_tokens),
                                         ("tgt", tgt_field.tokenizer, tgt_field.encode_tokens)])
    if samplers["src"] is None and samplers["tgt"] is None:
        return None
    return samplers


def _side_samplers(data_cfg: dict, sides: Sequence[tuple[str, Tokenizer, Callable | None]]
                   ) -> dict[str, SubwordSampler | None]:
    """``side -> sampler`` of ``data.<side>.subword_sampling`` for each ``(side, tokenizer, encode)``
    (``encode``: the field's ``encode_tokens`` for ids, None for tokens; :func:`build_sampler`), None
    for a side that does not sample. Sides with one tokenizer, one ``encode`` (one field) and the same
    settings share one sampler: its caches are made once. DataError naming ``data.<side>.``'s key."""
    samplers: dict[str, SubwordSampler | None] = {}
    made: list[tuple[Tokenizer, Callable | None, dict, SubwordSampler]] = []
    for side, tokenizer, encode in sides:
        settings = _sampling_settings(data_cfg[side].get("subword_sampling", {}))
        if not sampling_enabled(settings):
            samplers[side] = None
            continue
        same = [s for t, e, cfg, s in made if t is tokenizer and e == encode and cfg == settings]
        if not same:
            try:
                same = [build_sampler(tokenizer, settings, encode)]
            except DataError as exc:
                raise DataError(f"data.{side}.{exc}") from None
            made.append((tokenizer, encode, settings, same[0]))
        samplers[side] = same[0]
    return samplers


def data_fingerprints(data_cfg: dict) -> dict[str, dict]:
    """Config key (``data.train.src``, ...) -> ``{"path", **fingerprint}`` of each data file
    (:func:`nmt.utils.file_fingerprint.fingerprint`: size, hashes of the first and last MiB and
    of sampled blocks; about 2 MiB read per file, whatever its size). A file that cannot be read
    is left out: loading the data names it."""
    prints = {}
    for key, path in _data_files(data_cfg):
        try:
            prints[key] = {"path": str(path), **fingerprint(path)}
        except OSError:
            continue
    return prints


def data_changes(saved: dict[str, dict], current: dict[str, dict]) -> list[tuple[str, str, str]]:
    """``(key, path, what changed)`` of each data file whose fingerprint differs between ``saved``
    (a checkpoint's) and ``current`` (both from :func:`data_fingerprints`); a file absent from
    either is not compared."""
    changes = []
    for key in current:
        if key in saved:
            what = describe_change(saved[key], current[key])
            if what is not None:
                changes.append((key, current[key]["path"], what))
    return changes


@dataclass
class ExtraValidation:
    """One ``data.extra_valid`` set, encoded with the run's fields: its ``name``, the dataset and the
    raw target line of each example (``references``), and its files for messages."""

    name: str
    dataset: ParallelDataset
    references: list[str]
    src: str
    tgt: str


def load_extra_validation(data_cfg: dict, src_field: Field, tgt_field: Field) -> list[ExtraValidation]:
    """The ``data.extra_valid`` sets (monitored only), read and encoded with the run's fields, each
    pair kept whole as the validation's are; its ``src_tag`` one the fields already hold (a monitored
    set never changes the vocabulary: sets may come and go between a run's sessions). One-line
    ``DataError`` naming the key for a missing file, an unknown tag or a set without pairs."""
    sets = []
    for i, entry in enumerate(data_cfg.get("extra_valid") or []):
        key = f"data.extra_valid[{i}]"
        try:
            prefix = src_field.tag_ids(entry.get("src_tag"))
        except DataError as exc:
            raise DataError(f"{key}.src_tag: {exc} (a monitored set takes the training corpora's tags)") from None
        for side in ("src", "tgt"):
            if not Path(entry[side]).is_file():
                raise DataError(f"{key}.{side}: {entry[side]}: no such file")
        dataset, references = validation_set(read_parallel(entry["src"], entry["tgt"]), src_field, tgt_field,
                                              prefix, f"{key}: {entry['src']}, {entry['tgt']}")
        logger.info("valid %s data (%s, %s): %s", entry["name"], entry["src"], entry["tgt"], dataset.summary())
        sets.append(ExtraValidation(entry["name"], dataset, references, entry["src"], entry["tgt"]))
    return sets


def validation_set(pairs: list[tuple[str, str]], src_field: Field, tgt_field: Field, prefix: Sequence[int],
                   where: str) -> tuple[ParallelDataset, list[str]]:
    """A validation set of the raw ``pairs``: every non-empty pair encoded whole (no length filter),
    ``prefix`` (a source tag's ids, or none) before each source; and the raw target line of each of
    its examples (what decoding metrics score against). A one-line ``DataError`` starting with
    ``where`` (its files) when no pair has tokens on both sides."""
    dataset = ParallelDataset(pairs, src_field, tgt_field, None, None,
                              src_encode=_tag_encoder(src_field, prefix or None))
    if len(dataset) == 0:
        raise DataError(f"{where}: no validation pairs: {dataset.n_input} lines, "
                        f"{dataset.skipped['empty']} of them empty (a pair needs tokens on both sides)")
    return dataset, [pairs[line - 1][1] for line in dataset.line_numbers]


def check_valid_positions(data: TrainingData, data_cfg: dict, limits: tuple[int | None, int | None],
                          extra_sets: Sequence[ExtraValidation] = ()) -> None:
    """Validation keeps every pair whole, however long: a pair longer than the model's learned
    positions hold (``limits``: :func:`nmt.models.protocol.position_limits`; the training pairs
    fit by the config's check of ``data.<side>.max_length``) is a one-line ``DataError`` naming
    the validation file and line, at start rather than at the first validation (``data.valid``'s
    and the ``extra_sets``')."""
    from nmt.models.protocol import too_long

    src_limit, tgt_limit = limits
    sets = [(data.valid, data_cfg["valid"]["src"], data_cfg["valid"]["tgt"])]
    sets += [(extra.dataset, extra.src, extra.tgt) for extra in extra_sets]
    for valid, src, tgt in sets:
        for i, line in enumerate(valid.line_numbers):
            if src_limit is not None and valid.src_lengths[i] > src_limit:
                raise DataError(f"{src}:{line}: {too_long('source', valid.src_lengths[i], src_limit)}")
            if tgt_limit is not None and valid.tgt_lengths[i] + 1 > tgt_limit:
                raise DataError(f"{tgt}:{line}: {too_long('target', valid.tgt_lengths[i], tgt_limit)}")


VOCAB_FILES = ("vocab.src", "vocab.tgt")
"""The vocabulary files nmt-train writes in ``save_dir`` (:func:`write_run_vocabularies`)."""


def source_noise(data_cfg: dict, data: TrainingData, seed: int) -> SourceNoise | None:
    """The noise of the training sources (``data.train[i].noise``, :mod:`nmt.data.source_noise`),
    logged one line per noised corpus; None when no corpus is noised."""
    corpora = training_corpora(data_cfg["train"])
    settings = [NoiseSettings.from_config(c.noise) for c in corpora]
    if not any(s.active for s in settings):
        return None
    starts = data.weights.starts if data.weights is not None else np.array([0, np.iinfo(np.int64).max])
    for corpus, noise in zip(corpora, settings):
        if noise.active:
            logger.info("source noise: %s: %s, anew every epoch", corpus.label, noise.describe())
    return SourceNoise([(s, c.src_tag is not None) for s, c in zip(settings, corpora)], starts, data.src_field, seed)


def write_run_vocabularies(save_dir: str | Path, src_field: Field, tgt_field: Field, fresh: bool) -> list[Path]:
    """Write ``save_dir/vocab.src`` and ``vocab.tgt`` (:func:`nmt.data.vocab_file.write_vocab_file`:
    the tokens after the specials, with counts when the vocabulary was counted or read with
    counts), atomically, for another run's ``data.<side>.vocab_file``. A fresh run writes both
    (a shared vocabulary twice); a resumed one only those missing (its vocabularies come from the
    checkpoint, without counts, and would overwrite files that have them). A vocabulary the
    format cannot hold (a token that would read back as another) is not written: a warning names
    the file and the token, training goes on (the checkpoints hold the vocabulary), and a fresh
    run removes an older file of that name, which is not this run's. Returns the written paths."""
    written = []
    for name, field in zip(VOCAB_FILES, (src_field, tgt_field)):
        path = Path(save_dir) / name
        if fresh or not path.exists():
            try:
                write_vocab_file(path, field.vocab)
            except DataError as exc:
                logger.warning("%s; not written (the checkpoints hold the vocabulary)", exc)
                if fresh:
                    path.unlink(missing_ok=True)
                continue
            written.append(path)
    return written


def _files(data_cfg: dict, split: str) -> str:
    """``src, tgt`` of a split (of each training corpus, ``; ``-separated, when there are several),
    followed by ``, source tag T`` where one is set."""
    def files(c: dict) -> str:
        return f"{c['src']}, {c['tgt']}" + (f", source tag {c['src_tag']}" if c.get("src_tag") is not None else "")

    if isinstance(data_cfg[split], list):
        return "; ".join(files(c) for c in data_cfg[split])
    return files(data_cfg[split])


def _data_files(data_cfg: dict) -> list[tuple[str, str]]:
    """``(config key, path)`` of each data file: :data:`DATA_FILE_KEYS` (and ``data.train.align``
    where set), or with several training corpora ``data.train[i].src`` / ``.tgt`` (/ ``.align``)
    for each, then the validation files; last ``data.valid.align`` where set."""
    train = data_cfg["train"]
    if not isinstance(train, list):
        files = [(key, data_cfg[key.split(".")[1]][key.split(".")[2]]) for key in DATA_FILE_KEYS]
        files += [("data.train.align", train["align"])] if train.get("align") else []
    else:
        files = ([(f"data.train[{i}].{side}", corpus[side]) for i, corpus in enumerate(train)
                  for side in ("src", "tgt", "align") if side != "align" or corpus.get("align")]
                 + [(f"data.valid.{side}", data_cfg["valid"][side]) for side in ("src", "tgt")])
    return files + ([("data.valid.align", data_cfg["valid"]["align"])] if data_cfg["valid"].get("align") else [])


__all__ = ["ExtraValidation", "load_extra_validation", "validation_set", "tag_key", "tagged_fields", "cached_training_set", "cached_alignments", "counted_vocabulary", "resampled_files", "resampled_pairs", "DATA_FILE_KEYS", "VOCAB_FILES", "TrainingData", "side_vocabulary", "write_run_vocabularies", "check_valid_positions", "data_changes", "data_fingerprints", "generate_if_missing", "build_fields", "streamed_fields", "load_training_data"]
