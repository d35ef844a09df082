"""Parallel training data as flat token-id arrays, cached next to the data and memory-mapped.

For corpora of tens of millions of pairs, ``ParallelDataset``'s Python lists cost ~100 bytes
per token in every process. Here each side is two numpy arrays, ``ids`` (int32, all kept
sentences one after the other) and ``offsets`` (int64, ``n + 1``): sentence ``i`` is
``ids[offsets[i]:offsets[i + 1]]``. They are built once by streaming the text files (the
corpus is never held as a list), written as ``.npy`` files into a cache directory and opened
with ``mmap_mode="r"``: the operating system pages them in on demand and shares the pages
between the processes of a node.

Cache directory: ``<directory of the source file>/.nmt_id_cache/<key>`` (or
``<fallback>/id_cache/<key>`` when that directory is not writable), where ``key`` hashes the
absolute paths, sizes, modification and status-change times (ctime) of both files, both
fields (tokenizer and vocabulary state) and the length rules (:meth:`PairFilter.cache_settings`: the
limits, and the minimums and the ratio where on); any change gives a new key and a rebuild. The
directory is filled under a temporary name, flushed to disk and renamed into place (atomic), so
concurrent builders, crashes and power cuts never leave a partial cache; a killed builder's
temporary is removed by a later run (:func:`nmt.utils.io.atomic_directory`).

``ArrayParallelDataset`` keeps the pairs ``ParallelDataset`` keeps (same skipping rules, same
order), so batching and collating give the same batches.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.pair_filter import PairFilter, length_rules, skipped_counts
from nmt.data.textfiles import PathLike, iter_lines
from nmt.data.unknown_tokens import UnkCounts, kept_pairs_line
from nmt.utils.allocator import release_freed_memory
from nmt.utils.io import atomic_directory

logger = logging.getLogger(__name__)

CACHE_VERSION = 2  # 2: text spelling <pad>/<bos>/<eos> encodes as <unk> (Field.encode)
CACHE_DIRNAME = ".nmt_id_cache"
ARRAYS = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets", "src_lengths", "tgt_lengths", "line_numbers")


class RaggedIds:
    """Sentences of one side as ``ids`` + ``offsets``; ``view[i]`` is sentence ``i`` as a list of ints."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        self.ids, self.offsets = ids, offsets

    def __len__(self) -> int:
        return int(self.offsets.size) - 1

    def __getitem__(self, i: int) -> list[int]:
        return self.ids[self.offsets[i] : self.offsets[i + 1]].tolist()


class PairArrays:
    """What the array datasets (:class:`ArrayParallelDataset`,
    :class:`nmt.data.corpus_arrays.ConcatenatedArrays`) read the same way from their attributes:
    ``len`` (the kept pairs, ``src_lengths.size``), ``dataset[i]`` (``(src[i], tgt[i])``, the ids of
    pair ``i`` as lists of ints: ``src`` and ``tgt`` are the subclass's rows) and :meth:`summary`."""

    src_lengths: np.ndarray
    n_input: int
    skipped: dict[str, int]
    unk_tokens: UnkCounts | None

    def __len__(self) -> int:
        return int(self.src_lengths.size)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.src[i], self.tgt[i]

    def summary(self) -> str:
        """One log line, e.g. ``kept 5990 of 6000 pairs (skipped 2 empty, 8 too long)``, followed
        by ``; <unk>: target 40 of 27000 tokens (0.1%)`` where a side has tokens outside its vocabulary."""
        return kept_pairs_line(len(self), self.n_input, self.skipped, self.unk_tokens)


class ArrayParallelDataset(PairArrays):
    """Encoded parallel data held in (memory-mapped) numpy arrays.

    Same interface as ``ParallelDataset`` for the trainer, batching and collation: ``src`` /
    ``tgt`` (indexable: ``src[i]`` is a list of ids), ``src_lengths`` / ``tgt_lengths``
    (int64 arrays), ``line_numbers`` (1-based input line of each kept pair, int64 array),
    ``skipped`` (rule -> count, as ``ParallelDataset``'s: the ``skipped_<rule>`` entries of
    ``meta``), ``n_input``, ``unk_tokens`` (side -> ``(<unk> ids, all ids)``, counted when the
    cache was built; None for a cache built before they were recorded), ``summary()``;
    ``cache_key``: the key of the cache it was read from (:func:`cache_key`; None for arrays built
    in memory, e.g. an epoch's segmentation).
    """

    def __init__(self, arrays: dict[str, np.ndarray], meta: dict[str, Any], src_field: Field,
                 tgt_field: Field, cache_key: str | None = None) -> None:
        self.cache_key = cache_key
        self.src_field, self.tgt_field = src_field, tgt_field
        self.src = RaggedIds(arrays["src_ids"], arrays["src_offsets"])
        self.tgt = RaggedIds(arrays["tgt_ids"], arrays["tgt_offsets"])
        self.src_lengths, self.tgt_lengths = arrays["src_lengths"], arrays["tgt_lengths"]
        self.line_numbers = arrays["line_numbers"]
        self.skipped = {key[len("skipped_"):]: int(value) for key, value in meta.items() if key.startswith("skipped_")}
        self.n_input = int(meta["n_input"])
        self.max_src_length, self.max_tgt_length = meta["max_src_length"], meta["max_tgt_length"]
        unk = meta.get("unk_tokens")
        self.unk_tokens: UnkCounts | None = (None if unk is None else
                                             {side: (int(unk[side]), int(self.src.ids.size if side == "src"
                                                                         else self.tgt.ids.size))
                                              for side in ("src", "tgt")})


def cache_key(src_path: PathLike, tgt_path: PathLike, src_field: Field, tgt_field: Field,
              max_src_length: int | None = None, max_tgt_length: int | None = None, *,
              pair_filter: PairFilter | None = None, src_prefix: Sequence[int] = ()) -> str:
    """Hex digest naming the cache of these files (path, size, mtime, ctime), fields, length rules
    (``pair_filter``, or the two limits alone: :func:`nmt.data.pair_filter.length_rules`) and the
    ids put before every source (``src_prefix``: a source tag's, :mod:`nmt.data.source_tags`; left
    out of the key when empty, so an untagged corpus keeps its cache)."""
    rules = length_rules(max_src_length, max_tgt_length, pair_filter)
    digest = hashlib.sha256()
    files = []
    for path in (src_path, tgt_path):
        path = Path(path).resolve()
        try:
            stat = path.stat()
        except OSError:
            raise DataError(f"{path}: no such file") from None
        # the ctime too: a file rewritten to the same size with its old mtime put back (cp -p,
        # rsync -a, touch -r) keeps size and mtime, but no one can set the ctime
        files.append([str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns])
    tagged = {"src_prefix": [int(i) for i in src_prefix]} if src_prefix else {}
    digest.update(json.dumps({"version": CACHE_VERSION, "files": files, **rules.cache_settings(), **tagged},
                             sort_keys=True).encode())
    for field in (src_field, tgt_field):
        _digest(field.state_dict(), digest)
    return digest.hexdigest()[:24]


def _digest(value: Any, digest: "hashlib._Hash") -> None:
    """Feed a canonical encoding of nested dicts / lists / scalars / bytes / arrays into ``digest``."""
    if isinstance(value, dict):
        digest.update(b"{")
        for key in sorted(value, key=str):
            _digest(str(key), digest)
            _digest(value[key], digest)
        digest.update(b"}")
    elif isinstance(value, (list, tuple)):
        digest.update(b"[")
        for item in value:
            _digest(item, digest)
        digest.update(b"]")
    elif isinstance(value, (bytes, bytearray)):
        digest.update(b"b%d:" % len(value) + bytes(value))
    elif hasattr(value, "numpy") and hasattr(value, "dtype"):  # a tensor
        _digest(value.detach().cpu().numpy(), digest)
    elif isinstance(value, np.ndarray):
        digest.update(f"a{value.dtype}{value.shape}:".encode() + np.ascontiguousarray(value).tobytes())
    else:
        text = repr(value).encode()
        digest.update(b"s%d:" % len(text) + text)


def encode_to_arrays(src_path: PathLike, tgt_path: PathLike, src_field: Field, tgt_field: Field,
                     max_src_length: int | None = None, max_tgt_length: int | None = None,
                     src_encode: Callable[[int, str], list[int]] | None = None,
                     tgt_encode: Callable[[int, str], list[int]] | None = None,
                     first_index: int = 0, *, pair_filter: PairFilter | None = None,
                     src_prefix: Sequence[int] = ()) -> tuple[dict[str, np.ndarray], dict]:
    """Stream both files, encode every pair and keep it by ``ParallelDataset``'s rules (``pair_filter``,
    or the two length limits alone).

    ``src_encode`` / ``tgt_encode`` (optional, as ``ParallelDataset``'s): ``f(i, text) -> ids``
    instead of the field's ``encode``, called for each non-blank line in order with ``i`` the
    line's 0-based index plus ``first_index`` (e.g. one epoch's sampled segmentation).
    ``src_prefix``: ids put before every source that has ids (a source tag's), counted in its length.
    Returns ``(arrays, meta)``: the arrays of :data:`ARRAYS` and the counts. Memory: the
    arrays (4 bytes per token id) plus one line at a time.
    """
    rules = length_rules(max_src_length, max_tgt_length, pair_filter)
    reason = rules.reason
    prefix = [int(i) for i in src_prefix]
    skipped = skipped_counts(rules.rules)
    ids = {"src": array("i"), "tgt": array("i")}
    lengths = {"src": array("q"), "tgt": array("q")}
    line_numbers = array("q")
    n = 0
    src_lines, tgt_lines = iter_lines(src_path), iter_lines(tgt_path)
    while True:
        s = next(src_lines, None)
        t = next(tgt_lines, None)
        if s is None or t is None:
            if s is not None or t is not None:
                n_src = n + (s is not None) + sum(1 for _ in src_lines)
                n_tgt = n + (t is not None) + sum(1 for _ in tgt_lines)
                raise DataError(f"{Path(src_path)} has {n_src} lines but {Path(tgt_path)} has {n_tgt}")
            break
        n += 1
        s_ids = (src_encode(first_index + n - 1, s) if src_encode else src_field.encode(s)) if s.strip() else []
        if prefix and s_ids:
            s_ids = prefix + s_ids
        t_ids = (tgt_encode(first_index + n - 1, t) if tgt_encode else tgt_field.encode(t)) if t.strip() else []
        why = reason(len(s_ids), len(t_ids))
        if why is not None:
            skipped[why] += 1
        else:
            ids["src"].extend(s_ids)
            ids["tgt"].extend(t_ids)
            lengths["src"].append(len(s_ids))
            lengths["tgt"].append(len(t_ids))
            line_numbers.append(n)
    arrays: dict[str, np.ndarray] = {}  # views of the array buffers (no copy): written, then dropped
    for side in ("src", "tgt"):
        arrays[f"{side}_ids"] = np.frombuffer(ids[side], dtype=np.int32) if ids[side] else np.zeros(0, np.int32)
        side_lengths = np.frombuffer(lengths[side], dtype=np.int64) if lengths[side] else np.zeros(0, np.int64)
        arrays[f"{side}_lengths"] = side_lengths
        arrays[f"{side}_offsets"] = np.concatenate([np.zeros(1, np.int64), np.cumsum(side_lengths)])
    arrays["line_numbers"] = np.frombuffer(line_numbers, dtype=np.int64) if line_numbers else np.zeros(0, np.int64)
    meta = {"version": CACHE_VERSION, "n_input": n, **{f"skipped_{rule}": count for rule, count in skipped.items()},
            "max_src_length": rules.max_src_length, "max_tgt_length": rules.max_tgt_length,
            **{key: value for key, value in rules.cache_settings().items() if key != "max"},
            "src": str(Path(src_path)), "tgt": str(Path(tgt_path)),
            "unk_tokens": {side: int(np.count_nonzero(arrays[f"{side}_ids"] == field.vocab.unk_index))
                           for side, field in (("src", src_field), ("tgt", tgt_field))}}
    return arrays, meta


def cache_directory(src_path: PathLike, key: str, fallback_dir: PathLike | None) -> Path:
    """Where the cache of ``key`` lives: next to the source file, else under ``fallback_dir``."""
    beside = Path(src_path).resolve().parent / CACHE_DIRNAME / key
    if beside.is_dir() or fallback_dir is None or os.access(Path(src_path).resolve().parent, os.W_OK):
        return beside
    return Path(fallback_dir) / "id_cache" / key


def _read_arrays(directory: Path, names: Sequence[str], version: int, what: str
                 ) -> tuple[dict[str, np.ndarray], dict] | None:
    """The arrays ``names`` (memory-mapped ``.npy`` files) and ``meta.json`` of a cache directory;
    None where it has no ``meta.json`` or another ``version``; ``DataError`` naming it (``what``)
    where a file cannot be read."""
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("version") != version:
            return None
        arrays = {name: np.load(directory / f"{name}.npy", mmap_mode="r") for name in names}
    except (OSError, ValueError) as exc:
        raise DataError(f"{directory}: unreadable {what} ({exc}); delete the directory to rebuild it") from None
    return arrays, meta


def _write_arrays(directory: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """The ``arrays`` (one ``.npy`` file each) and ``meta.json`` written into ``directory`` atomically
    (:func:`nmt.utils.io.atomic_directory`: files flushed to disk before the rename; a killed
    writer's temporary is swept later). When another process was faster, its cache stands."""
    try:
        with atomic_directory(directory) as tmp:
            for name, values in arrays.items():
                np.save(tmp / f"{name}.npy", values)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    except OSError:
        if not (directory / "meta.json").is_file():  # not another process's finished cache
            raise


def cached_arrays(directory: Path, names: Sequence[str], version: int,
                  build: Callable[[], tuple[dict[str, np.ndarray], dict]] | None,
                  what: str = "token-id cache") -> tuple[dict[str, np.ndarray], dict] | None:
    """The arrays ``names`` and the meta of the cache in ``directory`` (``version``), memory-mapped;
    where it is missing, ``build()``'s, written there atomically first (another process's finished
    cache stands) and read back, the build's buffers given back to the system; None where it is
    missing and ``build`` is None (another rank builds it). ``what`` names the cache in the log
    lines and errors."""
    cached = _read_arrays(directory, names, version, what)
    if cached is not None:
        logger.info("%s: %s", what, directory)
        return cached
    if build is None:
        return None
    arrays, meta = build()
    _write_arrays(directory, {name: arrays[name] for name in names}, meta)
    del arrays
    release_freed_memory()  # the build's buffers: back to the system, not kept for this process
    cached = _read_arrays(directory, names, version, what)
    if cached is None:
        raise DataError(f"{directory}: {what} missing right after it was written")
    logger.info("%s written: %s", what, directory)
    return cached


def load_id_dataset(src_path: PathLike, tgt_path: PathLike, src_field: Field, tgt_field: Field,
                    max_src_length: int | None = None, max_tgt_length: int | None = None,
                    fallback_dir: PathLike | None = None, build: bool = True, *,
                    pair_filter: PairFilter | None = None, src_prefix: Sequence[int] = ()
                    ) -> ArrayParallelDataset | None:
    """The array dataset of these files and fields, memory-mapped from its cache; its pairs kept by
    ``pair_filter`` (or the two length limits alone) and every source led by ``src_prefix`` (a
    source tag's id, :func:`encode_to_arrays`), which the cache is keyed by.

    A missing cache is built (streaming the files) when ``build`` is True; with ``build``
    False a missing cache returns None (other ranks wait for the one that builds).
    """
    rules = length_rules(max_src_length, max_tgt_length, pair_filter)
    key = cache_key(src_path, tgt_path, src_field, tgt_field, pair_filter=rules, src_prefix=src_prefix)
    directory = cache_directory(src_path, key, fallback_dir)
    cached = cached_arrays(directory, ARRAYS, CACHE_VERSION, (lambda: encode_to_arrays(
        src_path, tgt_path, src_field, tgt_field, pair_filter=rules, src_prefix=src_prefix)) if build else None)
    if cached is None:
        return None
    arrays, meta = cached
    return ArrayParallelDataset(arrays, meta, src_field, tgt_field, key)


__all__ = ["ArrayParallelDataset", "PairArrays", "RaggedIds", "cache_key", "cache_directory", "cached_arrays",
           "encode_to_arrays", "load_id_dataset"]
