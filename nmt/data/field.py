"""A Field pairs a tokenizer with a vocabulary: text <-> token ids for one side of the data."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nmt.data.errors import DataError
from nmt.data.source_tags import unknown_tag_error
from nmt.data.tokenizers import Tokenizer, tokenizer_from_state_dict
from nmt.data.vocabulary import SPECIALS, Vocabulary


class Field:
    """Text processing of one side (source or target); saved whole in checkpoints.

    ``tags``: the source tags the model was trained with (:mod:`nmt.data.source_tags`; sorted,
    each a token of ``vocab``; empty for a target field and a model without tags).
    """

    def __init__(self, tokenizer: Tokenizer, vocab: Vocabulary, tags: Iterable[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.tags: tuple[str, ...] = tuple(sorted(set(tags)))
        for tag in self.tags:
            if tag not in vocab or vocab.stoi[tag] < len(SPECIALS):
                raise DataError(f"field: source tag {tag!r} is not a token of its vocabulary")

    def tag_ids(self, tag: str | None) -> list[int]:
        """``[id of tag]`` (``[]`` for None): what goes before a source line's ids. A tag that is not
        one of :attr:`tags` is a one-line ``DataError`` listing them."""
        if tag is None:
            return []
        if tag not in self.tags:
            raise unknown_tag_error(tag, self.tags)
        return [self.vocab.stoi[tag]]

    @classmethod
    def build(
        cls,
        tokenizer: Tokenizer,
        lines: Iterable[str],
        min_freq: int = 1,
        max_size: int | None = None,
    ) -> "Field":
        """Field whose vocabulary is built from the tokenized ``lines`` (tokenizer already trained)."""
        return cls(tokenizer, Vocabulary.build((tokenizer.tokenize(l) for l in lines), min_freq, max_size))

    def tokenize(self, text: str) -> list[str]:
        """Tokens of ``text``."""
        return self.tokenizer.tokenize(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS; unknown tokens -> ``unk_index``).

        A token of the text spelled like a special (``<pad>``, ``<bos>``, ``<eos>``, e.g. the word
        ``<eos>`` under the space tokenizer) is text, not a control symbol: it is unknown
        (``unk_index``), as the vocabulary never counts it. Its special id would hide a source token
        as padding, end a target early or be dropped from the loss.
        """
        return self.encode_tokens(self.tokenizer.tokenize(text))

    def encode_tokens(self, tokens: Iterable[str]) -> list[int]:
        """Token ids of ``tokens`` as :meth:`encode` maps them (outside the vocabulary or spelled
        like a special: ``unk_index``); e.g. the tokens of a sampled segmentation."""
        first = len(SPECIALS)
        unk = self.vocab.unk_index
        return [i if i >= first else unk for i in self.vocab.lookup(tokens)]

    def decode_tokens(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids`` up to the first EOS, without pad/BOS/EOS (``<unk>`` is kept).

        ``ids`` may be a list or a 1-d tensor.
        """
        if hasattr(ids, "tolist"):
            ids = ids.tolist()  # one transfer for a tensor
        v = self.vocab
        out: list[int] = []
        for i in ids:
            if i == v.eos_index:
                break
            if i != v.pad_index and i != v.bos_index:
                out.append(i)
        return v.tokens(out)

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenized text of ``ids`` (stops at EOS, drops pad/BOS/EOS)."""
        return self.tokenizer.detokenize(self.decode_tokens(ids))

    def state_dict(self) -> dict[str, Any]:
        """``{"tokenizer": ..., "vocab": ...}`` (and ``"tags"`` where there are some), plain data,
        self-contained."""
        state = {"tokenizer": self.tokenizer.state_dict(), "vocab": self.vocab.state_dict()}
        if self.tags:
            state["tags"] = list(self.tags)
        return state

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> "Field":
        """Rebuild from ``state_dict()``."""
        if not isinstance(state, Mapping) or "tokenizer" not in state or "vocab" not in state:
            raise DataError("field state: expected the keys 'tokenizer' and 'vocab'")
        tags = state.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise DataError("field state: 'tags' must be a list of strings")
        return cls(tokenizer_from_state_dict(state["tokenizer"]), Vocabulary.from_state_dict(state["vocab"]), tags)

    def __repr__(self) -> str:
        tags = f", tags={list(self.tags)}" if self.tags else ""
        return f"Field({self.tokenizer!r}, {self.vocab!r}{tags})"


def field_difference(src: Field, tgt: Field, other_src: Field, other_tgt: Field,
                     other: str, first: str) -> str | None:
    """One line saying what makes the fields of checkpoint ``other`` (``other_src``, ``other_tgt``)
    process text otherwise than those of ``first`` (``src``, ``tgt``): ``"b.pt: its src tokenizer
    differs from a.pt's (bpe codes: 120 vs 100 merges)"``, ``"b.pt: its tgt vocabulary differs
    from a.pt's"``; None when they agree. Tokenizers are compared first (other tokenizers make
    other vocabularies too) and by what they do (:meth:`Tokenizer.difference`)."""
    for side, mine, theirs in (("src", src, other_src), ("tgt", tgt, other_tgt)):
        problem = mine.tokenizer.difference(theirs.tokenizer)
        if problem is not None:
            return f"{other}: its {side} tokenizer differs from {first}'s ({problem})"
    for side, mine, theirs in (("src", src, other_src), ("tgt", tgt, other_tgt)):
        if mine.vocab != theirs.vocab:
            return f"{other}: its {side} vocabulary differs from {first}'s"
    if src.tags != other_src.tags:
        return (f"{other}: its source tags differ from {first}'s ({', '.join(other_src.tags) or 'none'} vs "
                f"{', '.join(src.tags) or 'none'})")
    return None


__all__ = ["Field", "field_difference"]
