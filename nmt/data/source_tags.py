"""Source tags: one whole token put before a corpus's source sentences (``data.train[i].src_tag``,
``data.valid.src_tag``, ``nmt-translate -src_tag``).

Tagged back-translation (Caswell et al. 2019: ``<BT>`` before every back-translated source) and
multilingual models (Johnson et al. 2017: ``<2de>`` names the target language) need a token that
no tokenizer cuts. A tag is therefore never text: its id is put before the ids the source
tokenizer gives the line (:func:`tagged`), so BPE / sentencepiece learning, segmentation and
subword sampling never see it. A source line without a token stays empty (the tag never makes a
pair of an empty line). The tag counts toward the source's length (``data.src.max_length``, the
length ratio), as OpenNMT-py's ``prefix`` transform runs before its length filter.

Every tag a config declares is a source-vocabulary token whatever ``min_freq`` / ``max_size``
say (:func:`with_tags`): one the vocabulary already holds keeps its id, the others are appended
after its tokens in sorted order, so no other token's id moves. The source field keeps the
model's tags (:attr:`nmt.data.field.Field.tags`), saved in checkpoints.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from nmt.data.errors import DataError
from nmt.data.vocabulary import SPECIALS, Vocabulary

Encode = Callable[[int, str], list[int]]


def tag_problem(tag: object) -> str | None:
    """Why ``tag`` cannot be a source tag (None when it can): it must be a non-empty string
    without whitespace, other than the specials (``<pad>``, ``<unk>``, ``<bos>``, ``<eos>``)."""
    if not isinstance(tag, str) or not tag:
        return f"a source tag must be a non-empty string, got {tag!r}"
    if any(c.isspace() for c in tag):
        return f"a source tag is one token without whitespace, got {tag!r}"
    if tag in SPECIALS:
        return f"{tag!r} is a special token ({', '.join(SPECIALS)}), not a source tag"
    return None


def config_tags(data_cfg: Mapping) -> list[str]:
    """The distinct tags a resolved ``data`` section declares (``data.train``'s corpora and
    ``data.valid``), sorted; a hand-made section without them (e.g. ``build_fields``' of given
    pairs) declares none there."""
    train = data_cfg.get("train") or []
    corpora = train if isinstance(train, list) else [train]
    tags = {c.get("src_tag") for c in corpora} | {(data_cfg.get("valid") or {}).get("src_tag")}
    return sorted(t for t in tags if t is not None)


def with_tags(vocab: Vocabulary, tags: Iterable[str], counts: Mapping[str, int] | None = None) -> Vocabulary:
    """``vocab`` with each of ``tags`` it lacks appended after its tokens, in sorted order (every
    token keeps its id; ``vocab`` itself when it holds them all). With counts (``vocab.counts``
    known) a new tag's count is ``counts[tag]`` (0 when absent): the source lines it starts."""
    new = sorted(set(t for t in tags if t not in vocab))
    if not new:
        return vocab
    old = vocab.itos[len(SPECIALS):]
    if vocab.counts is None:
        return Vocabulary(old + new)
    return Vocabulary(old + new, {**vocab.counts, **{t: int((counts or {}).get(t, 0)) for t in new}})


def tagged(encode: Encode, prefix: Sequence[int] | Callable[[int], Sequence[int]]) -> Encode:
    """``f(i, text) -> prefix + encode(i, text)`` (``prefix`` a list of ids, or ``f(i)`` giving
    pair ``i``'s), the ids left empty when ``encode`` gives none."""
    of = prefix if callable(prefix) else (lambda _, fixed=list(prefix): fixed)

    def encode_tagged(i: int, text: str) -> list[int]:
        ids = encode(i, text)
        return list(of(i)) + ids if ids else ids

    return encode_tagged


def pair_prefixes(starts: Sequence[int], prefixes: Sequence[Sequence[int]]) -> Callable[[int], list[int]]:
    """``f(i)``: the prefix of pair ``i`` (0-based) of corpora read one after the other, corpus
    ``k`` holding pairs ``starts[k]:starts[k + 1]`` and taking ``prefixes[k]``."""
    bounds = np.asarray(starts, dtype=np.int64)[1:]
    lists = [list(p) for p in prefixes]
    return lambda i: lists[int(np.searchsorted(bounds, i, side="right"))]


def unknown_tag_error(tag: str, tags: Sequence[str]) -> DataError:
    """The one-line error of a tag the model does not know, listing the model's tags."""
    known = ", ".join(tags) if tags else "none (it was trained without data.train src_tag)"
    return DataError(f"source tag {tag!r}: not one of the model's source tags: {known}")


__all__ = ["config_tags", "pair_prefixes", "tag_problem", "tagged", "unknown_tag_error", "with_tags"]
