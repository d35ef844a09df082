"""Data pipeline: tokenizers, vocabularies, fields, parallel datasets, batching, quick-start task.

Typical use (training)::

    tok = build_tokenizer({"type": "char"})
    pairs = read_parallel("train.src", "train.tgt")
    src_field = Field.build(build_tokenizer({"type": "space"}), (s for s, _ in pairs))
    tgt_field = Field.build(tok, (t for _, t in pairs))
    data = ParallelDataset(pairs, src_field, tgt_field, max_src_length=50, max_tgt_length=50)
    # or all the cleaning rules: PairFilter(50, 50, min_src_length=1, min_tgt_length=1, max_length_ratio=9)
    data = ParallelDataset(pairs, src_field, tgt_field, pair_filter=PairFilter(50, 50, max_length_ratio=9))
    for idx in make_batches(data, 64, shuffle=True, seed=1, epoch=0):
        batch = collate(data, idx, pad_index=0, bos_index=2, eos_index=3)

Large corpora: ``nmt.data.id_arrays.load_id_dataset`` (token-id arrays, cached and memory-mapped)
with ``make_batch_order`` (the same batches, held in arrays).
"""
from nmt.data.batching import Batch, BatchOrder, collate, encode_sources, make_batch_order, make_batches
from nmt.data.dataset import ParallelDataset, SourceDataset, read_lines, read_parallel
from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.pair_filter import PairFilter
from nmt.data.tokenizers import Tokenizer, build_tokenizer, tokenizer_from_state_dict
from nmt.data.vocabulary import Vocabulary

__all__ = [
    "Batch",
    "BatchOrder",
    "DataError",
    "Field",
    "PairFilter",
    "ParallelDataset",
    "SourceDataset",
    "Tokenizer",
    "Vocabulary",
    "build_tokenizer",
    "collate",
    "encode_sources",
    "make_batch_order",
    "make_batches",
    "read_lines",
    "read_parallel",
    "tokenizer_from_state_dict",
]
