"""SentencePiece (Kudo & Richardson 2018): train a unigram/BPE model on raw text and apply it.

The trained model's serialized bytes live in the tokenizer state, so a checkpoint rebuilds the
exact same segmentation. Pieces mark word starts with "▁"; ``detokenize`` is sentencepiece's
own decoding (lossless up to whitespace normalisation).
"""
from __future__ import annotations

import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import sentencepiece

from nmt.data.errors import DataError
from nmt.data.textfiles import write_bytes_atomic
from nmt.data.tokenizers.base import Tokenizer, words_of_spans

_MODEL_TYPES = ("unigram", "bpe", "char", "word")
_MARKER = "\u2581"  # sentencepiece's word-start marker

_TRAINING_ONLY = (
    "input", "input_format", "model_prefix", "num_threads", "vocab_size", "character_coverage",
    "input_sentence_size", "shuffle_input_sentence", "mining_sentence_size", "training_sentence_size",
    "seed_sentencepiece_size", "seed_sentencepieces_file", "shrinking_factor", "num_sub_iterations",
    "self_test_sample_size", "train_extremely_large_corpus", "hard_vocab_limit", "use_all_vocab",
    "vocabulary_output_piece_score", "enable_differential_privacy", "differential_privacy_noise_level",
    "differential_privacy_clipping_threshold",
)
"""Fields of a model's ``trainer_spec`` that only training reads: where the data was, how much of
it, threads, sizes (the pieces themselves are compared). Two models differing only here segment
alike (e.g. one trained from a copy of the data at another path)."""


def _model_content(proto: bytes | None) -> Any:
    """A sentencepiece model's ``ModelProto`` without ``_TRAINING_ONLY`` settings and self-test
    samples (equal for models that segment alike); the bytes when protobuf cannot read it."""
    if proto is None:
        return None
    try:
        from sentencepiece import sentencepiece_model_pb2
        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(proto)
    except Exception:  # protobuf missing or too old for sentencepiece's generated module
        return bytes(proto)
    fields = model.trainer_spec.DESCRIPTOR.fields_by_name
    for name in _TRAINING_ONLY:
        if name in fields:
            model.trainer_spec.ClearField(name)
    if "self_test_data" in model.DESCRIPTOR.fields_by_name:
        model.ClearField("self_test_data")
    return model


class SentencePieceTokenizer(Tokenizer):
    """SentencePiece segmentation.

    cfg keys: ``vocab_size`` (default 8000; with ``hard_vocab_limit: false``, the default, a
    smaller corpus yields a smaller vocabulary instead of an error), ``model_type``
    (unigram | bpe | char | word), ``character_coverage`` (default 1.0), ``seed`` (default 1),
    ``num_threads`` (default 1: training is then deterministic), ``input_sentence_size``
    (0 = all lines), ``model_file`` (optional: use this trained ``.model`` instead of training).
    """

    type_name = "sentencepiece"

    def __init__(
        self,
        vocab_size: int = 8000,
        model_type: str = "unigram",
        character_coverage: float = 1.0,
        seed: int = 1,
        num_threads: int = 1,
        input_sentence_size: int = 0,
        hard_vocab_limit: bool = False,
        model_file: str | os.PathLike | None = None,
        model_proto: bytes | None = None,
    ) -> None:
        if not isinstance(vocab_size, int) or vocab_size < 2:
            raise DataError(f"tokenizer.vocab_size: expected an integer >= 2, got {vocab_size!r}")
        if model_type not in _MODEL_TYPES:
            raise DataError(
                f"tokenizer.model_type: unknown {model_type!r}, expected one of {', '.join(_MODEL_TYPES)}"
            )
        self.vocab_size = vocab_size
        self.model_type = model_type
        self.character_coverage = float(character_coverage)
        self.seed = int(seed)
        self.num_threads = int(num_threads)
        self.input_sentence_size = int(input_sentence_size)
        self.hard_vocab_limit = bool(hard_vocab_limit)
        self.model_proto: bytes | None = None
        self._sp: sentencepiece.SentencePieceProcessor | None = None
        if model_proto is None and model_file is not None:
            try:
                model_proto = Path(model_file).read_bytes()
            except OSError as e:
                raise DataError(f"{model_file}: cannot read sentencepiece model ({e.strerror})") from None
            self._load(model_proto, str(model_file))
        elif model_proto is not None:
            self._load(model_proto, "tokenizer.model_proto")

    @property
    def needs_training(self) -> bool:  # type: ignore[override]
        return self.model_proto is None

    def _load(self, proto: bytes, origin: str) -> None:
        sp = sentencepiece.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(proto)
        except (RuntimeError, TypeError) as e:
            raise DataError(f"{origin}: not a valid sentencepiece model ({e})") from None
        self.model_proto = bytes(proto)
        self._sp = sp

    def train(self, lines: Iterable[str], work_dir: str | os.PathLike | None = None) -> None:
        """Train on ``lines`` (empty lines ignored); write ``work_dir/sentencepiece.model`` if given."""
        data = [line for line in lines if line.strip()]
        if not data:
            raise DataError("sentencepiece training data is empty")
        model = io.BytesIO()
        sentencepiece.set_random_generator_seed(self.seed)
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(data),
                model_writer=model,
                vocab_size=self.vocab_size,
                model_type=self.model_type,
                character_coverage=self.character_coverage,
                num_threads=self.num_threads,
                input_sentence_size=self.input_sentence_size,
                shuffle_input_sentence=True,
                hard_vocab_limit=self.hard_vocab_limit,
                minloglevel=2,
            )
        except RuntimeError as e:
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise DataError(f"sentencepiece training failed: {msg}") from None
        self._load(model.getvalue(), "trained sentencepiece model")
        if work_dir is not None:
            write_bytes_atomic(Path(work_dir) / "sentencepiece.model", self.model_proto)

    def _processor(self) -> sentencepiece.SentencePieceProcessor:
        if self._sp is None:
            raise RuntimeError("sentencepiece tokenizer has no model: call train() or set model_file")
        return self._sp

    def tokenize(self, text: str) -> list[str]:
        return self._processor().encode(text, out_type=str)

    def detokenize(self, tokens: list[str]) -> str:
        """The text of ``tokens``. A piece that is not in the model (e.g. a source piece that
        ``-replace_unk`` copied from another model) is decoded as its text, so its word-start
        marker stays a space: "▁Zug" is " Zug", as a piece of the model would be."""
        text = self._processor().decode_pieces(list(tokens))
        if _MARKER not in text:  # sentencepiece decoded every marker: no unknown "▁..." piece
            return text
        pieces, _ = self._split_unknown(tokens)
        return self._processor().decode_pieces(pieces)

    def _split_unknown(self, tokens: list[str]) -> tuple[list[str], list[int]]:
        """``tokens`` with each piece that is not in the model and starts with "▁" split into "▁"
        and its rest (sentencepiece decodes the marker of a piece it knows, and "▁" alone, as a
        space, but an unknown piece's text as it is); and, for each piece, the given token it
        comes from."""
        sp = self._processor()
        unk = sp.unk_id()
        pieces: list[str] = []
        owner: list[int] = []
        for k, t in enumerate(tokens):
            if len(t) > 1 and t.startswith(_MARKER) and sp.piece_to_id(t) == unk and sp.piece_to_id(_MARKER) != unk:
                pieces.extend((_MARKER, t[1:]))
                owner.extend((k, k))
            else:
                pieces.append(t)
                owner.append(k)
        return pieces, owner

    def word_ids(self, pieces: list[str]) -> list[int | None]:
        """From where sentencepiece's decoding puts each piece in the text (its surface span):
        exact under normalisation, byte fallback and ``<unk>`` (decoded " ⁇ "). A piece starting
        with "▁" starts a word, the others continue it; a lone "▁" (decoded to a space, or to
        nothing at the start) belongs to the word it starts. Without sentencepiece's decoding
        spans (protobuf missing) the "▁" rule alone."""
        pieces = list(pieces)
        try:
            proto = self._processor().decode_pieces_as_proto(pieces)
        except (AttributeError, ImportError, TypeError):  # an old sentencepiece or no protobuf
            return self._marker_word_ids(pieces)
        owner = list(range(len(pieces)))
        if _MARKER in proto.text:  # an unknown "▁..." piece: decoded as detokenize decodes it
            split, owner = self._split_unknown(pieces)
            proto = self._processor().decode_pieces_as_proto(split)
        text = proto.text
        char_of_byte = [0] * (len(text.encode("utf-8")) + 1)
        offset = 0
        for c, char in enumerate(text):
            width = len(char.encode("utf-8"))
            for b in range(offset, offset + width):
                char_of_byte[b] = c
            offset += width
        char_of_byte[offset] = len(text)
        spans = [(len(text), 0)] * len(pieces)  # each given piece: the union of its parts' spans
        for k, p in zip(owner, proto.pieces):
            begin, end = spans[k]
            spans[k] = (min(begin, char_of_byte[p.begin]), max(end, char_of_byte[p.end]))
        return words_of_spans(text, spans, blank_to_next=True)

    def noise_units(self, piece: str) -> tuple[bool, bool]:
        """A word is a piece starting with "▁" and the pieces after it (fairseq's noising with a
        sentencepiece end marker): ``(piece starts with "▁", False)``."""
        return piece.startswith(_MARKER), False

    @staticmethod
    def _marker_word_ids(pieces: list[str]) -> list[int | None]:
        """The "▁" rule: a piece starting with "▁" starts a word, the others continue the last."""
        ids: list[int | None] = []
        word = -1
        for t in pieces:
            word += t.startswith("\u2581") or word < 0
            ids.append(word)
        return ids

    def _difference(self, other: Tokenizer) -> str | None:
        """The models' content: pieces, scores, normalization and the settings encoding reads
        (model type, whitespace and byte handling, special ids), not the training data's paths
        nor training-only settings (``_TRAINING_ONLY``); the config keys only shaped training."""
        assert isinstance(other, SentencePieceTokenizer)
        a, b = _model_content(self.model_proto), _model_content(other.model_proto)
        if a is None or b is None:
            return None if a is b else "sentencepiece model: trained in one only"
        if isinstance(a, bytes) or isinstance(b, bytes):  # no protobuf to read them with
            return None if a == b else "sentencepiece model: other bytes"
        if a == b:
            return None
        spec_a, spec_b = a.trainer_spec, b.trainer_spec
        if spec_a.model_type != spec_b.model_type:
            kinds = type(spec_a).ModelType
            return f"sentencepiece model_type: {kinds.Name(spec_a.model_type).lower()} vs " \
                   f"{kinds.Name(spec_b.model_type).lower()}"
        if len(a.pieces) != len(b.pieces):
            return f"sentencepiece pieces: {len(a.pieces)} vs {len(b.pieces)}"
        for i, (x, y) in enumerate(zip(a.pieces, b.pieces)):
            if x != y:
                what = f"{x.piece!r} vs {y.piece!r}" if x.piece != y.piece else f"{x.piece!r}: score or type"
                return f"sentencepiece piece {i}: {what}"
        for name in ("normalizer_spec", "denormalizer_spec"):
            if getattr(a, name) != getattr(b, name):
                return f"sentencepiece {name}: other normalization rules"
        for field, _ in spec_a.ListFields() + spec_b.ListFields():
            mine, theirs = getattr(spec_a, field.name), getattr(spec_b, field.name)
            if mine != theirs:
                return f"sentencepiece trainer_spec.{field.name}: {mine!r} vs {theirs!r}"
        return "sentencepiece model: other content"

    def state_dict(self) -> dict[str, Any]:
        return {
            "type": self.type_name,
            "vocab_size": self.vocab_size,
            "model_type": self.model_type,
            "character_coverage": self.character_coverage,
            "seed": self.seed,
            "num_threads": self.num_threads,
            "input_sentence_size": self.input_sentence_size,
            "hard_vocab_limit": self.hard_vocab_limit,
            "model_proto": self.model_proto,
        }

    def __repr__(self) -> str:
        n = None if self._sp is None else self._sp.get_piece_size()
        return f"SentencePieceTokenizer(model_type={self.model_type!r}, pieces={n})"


__all__ = ["SentencePieceTokenizer"]
