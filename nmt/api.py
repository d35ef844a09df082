"""The Python API: ``m = nmt.load("best.pt"); m.translate(["ein Satz"], beam_size=5)``.

``load`` rebuilds one checkpoint (or an ensemble of several) for inference; ``Model.translate``
returns ``Translation`` objects (``.text``, ``.score``, ``.certificate`` with ``.certified``
and ``.reason``, ``.nbest``) and ``Model.score`` returns ``PairScore`` objects (teacher-forced
log-probabilities, zero-probability references). Search options are ``SearchOptions`` fields,
given to ``load`` (the model's defaults) or per call. Passing one string where a list of
sentences is expected is a TypeError, never a translation of its characters.

Alignments and unknown-word replacement are per call: ``m.translate(lines, align=True)`` gives
each hypothesis its word alignment (``Translation.alignments``, ``.alignment`` for the best;
``align=AlignOptions(mode="support", level="token")`` for the others, see
``nmt.translate.alignment``), ``replace_unk=True`` replaces ``<unk>`` outputs by the most attended
source piece (or its ``phrase_table`` entry); ``m.score(sources, targets, align=True)`` aligns the
references. Forced target prefixes are per call too: ``m.translate(lines, prefixes=["Ein", "", ...])``
(each output starts with its line's prefix; the certificate is about those outputs), and so are
lexical constraints: ``m.translate(lines, constraints=[["Haus"], [], ["rote", "Auto"]])`` (each output
holds its line's phrases; ``constraints_mode="ordered"``: in the given order).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

if TYPE_CHECKING:
    from nmt.models.protocol import StepDecoder
    from nmt.translate.alignment import AlignOptions
    from nmt.translate.loading import LoadedModel
    from nmt.translate.scorer import PairScore
    from nmt.translate.search_options import SearchOptions
    from nmt.translate.translator import Translation

PathLike = Union[str, "os.PathLike[str]"]


def _sentences(name: str, value: Any) -> list[str]:
    """``value`` as a list of strings; TypeError for a single string or a non-string item."""
    if isinstance(value, (str, bytes)):
        preview = value[:40] if isinstance(value, str) else value[:40].decode("utf-8", "replace")
        raise TypeError(f"{name} must be a list of sentences, not a single string; wrap it: [{preview!r}]")
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{name} must be a list of sentences, got {type(value).__name__}") from None
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(item).__name__}")
    return items


class Model:
    """A loaded model (or ensemble) ready to translate and score; see ``load``.

    Attributes: ``decoder`` (the ``StepDecoder``: the model or an ``Ensemble``), ``options`` (the
    default ``SearchOptions``), ``device``, ``batch_size`` and ``batch_type`` (of translation: sentences
    or padded source tokens), ``precision`` (of the model's computations: fp32, bf16 or fp16 autocast),
    ``members`` (the ``LoadedModel`` of each checkpoint: config, training step, path).
    """

    def __init__(self, decoder: StepDecoder, members: list[LoadedModel], device: str, options: SearchOptions,
                 batch_size: int, batch_type: str = "sentences", precision: str = "fp32") -> None:
        self.decoder, self.members = decoder, members
        self.src_field, self.tgt_field = members[0].src_field, members[0].tgt_field
        self.device, self.options, self.batch_size, self.batch_type = device, options, batch_size, batch_type
        self.precision = precision

    @property
    def src_tags(self) -> tuple[str, ...]:
        """The source tags the model was trained with (``data.train`` ``src_tag``; sorted, maybe empty)."""
        return self.src_field.tags

    def __repr__(self) -> str:
        paths = ", ".join(str(m.path) for m in self.members)
        return f"nmt.Model({paths}; device={self.device}; {self.options})"

    def translate(self, sentences: Sequence[str], options: SearchOptions | None = None, *,
                  align: bool | AlignOptions = False, replace_unk: bool = False, prefixes: Sequence[str] | None = None,
                  phrase_table: Mapping[str, str] | None = None, constraints: Sequence[Sequence[str]] | None = None,
                  constraints_mode: str = "unordered", src_tag: str | None = None, **search: Any) -> list[Translation]:
        """Translate a list of sentences (one ``Translation`` each, in order).

        ``options`` replaces the model's default ``SearchOptions``; keywords (``beam_size=5``,
        ``n_best=3``, ``return_attention=True``, any ``SearchOptions`` field) override fields of
        it for this call. An unknown keyword is a TypeError naming the valid ones. ``align``:
        True (word alignment, argmax mode) or an ``AlignOptions`` gives each hypothesis its
        ``(source, target)`` pairs (``Translation.alignments``); ``replace_unk``: each ``<unk>``
        output piece replaced by the source piece of highest attention at its step (or by that
        piece's entry in ``phrase_table``, a dict of source token -> target text, where it has one;
        ``nmt.translate.phrase_table.read_phrase_table`` reads OpenNMT-py's files). ``prefixes``:
        one target text per sentence (``""``: none) that its outputs must start with (forced
        target prefixes; each certificate is then about the outputs that start with it).
        ``constraints``: per sentence, a list of target phrases (``[]``: none) every output must hold
        (lexical constraints, ``constraints_mode`` "unordered": all, in any order, a phrase given k
        times at least k times; "ordered": in the
        given order, without overlap; each certificate is then about the outputs that meet them;
        ``Translation.constraints_met`` says which each hypothesis meets). Not with ``sample``.
        ``src_tag``: one of the model's source tags (:attr:`src_tags`, e.g. ``"<2de>"``) put before
        every sentence, as training put it before its corpus's (``decoding["src_tag"]`` says so); one
        the model lacks is a one-line ``DataError`` (ValueError) listing its tags.
        """
        from nmt.translate.translator import Translator

        lines = _sentences("sentences", sentences)
        forced = None if prefixes is None else _sentences("prefixes", prefixes)
        if forced is not None and len(forced) != len(lines):
            raise ValueError(f"{len(lines)} sentences but {len(forced)} prefixes")
        phrases = None if constraints is None else [_sentences(f"constraints[{i}]", c) for i, c in
                                                     enumerate(_sentences_of_lists(constraints))]
        if phrases is not None and len(phrases) != len(lines):
            raise ValueError(f"{len(lines)} sentences but {len(phrases)} constraint lists")
        chosen = (options or self.options).updated(**search)
        translator = Translator(self.decoder, self.src_field, self.tgt_field, chosen,
                                batch_size=self.batch_size, batch_type=self.batch_type, device=self.device,
                                precision=self.precision, align=_align_options(align),
                                replace_unk=replace_unk, phrase_table=phrase_table, src_tag=src_tag)
        return translator.translate(lines, prefixes=forced, constraints=phrases, constraints_mode=constraints_mode)

    def score(self, sources: Sequence[str], targets: Sequence[str], *,
              align: bool | AlignOptions = False, src_tag: str | None = None) -> list[PairScore]:
        """Teacher-forced scores of ``targets`` given ``sources`` (one ``PairScore`` per pair:
        ``.logprob``, ``.token_logprobs``, ``.zero_probability``, ``.first_zero``; with ``align``
        (True or an ``AlignOptions``), ``.alignment``: the reference's pairs); ``src_tag``: one of
        the model's source tags put before every source, as in :meth:`translate`."""
        from nmt.translate.scorer import Scorer
        from nmt.translate.translator import CPU_BATCH

        src, tgt = _sentences("sources", sources), _sentences("targets", targets)
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} sources but {len(tgt)} targets")
        sentences = self.batch_size if self.batch_type == "sentences" else CPU_BATCH[0]  # scoring counts sentences
        scorer = Scorer(self.decoder, self.src_field, self.tgt_field, batch_size=sentences, device=self.device,
                        precision=self.precision,
                        align=_align_options(align), src_tag=src_tag)
        return scorer.score(src, tgt)


def _sentences_of_lists(constraints: Sequence[Sequence[str]]) -> list[Sequence[str]]:
    """``constraints`` as a list of per-sentence phrase lists; a TypeError for a string (one
    sentence's phrases given flat) where lists are expected."""
    if isinstance(constraints, str) or any(isinstance(c, str) for c in constraints):
        raise TypeError("constraints must be a list of phrase lists, one per sentence (e.g. [['Haus'], []]), "
                        "not a list of strings")
    return list(constraints)


def _align_options(align: bool | AlignOptions) -> AlignOptions | None:
    """``align`` of ``translate`` / ``score`` as ``AlignOptions`` (True: the defaults; False: None)."""
    from nmt.translate.alignment import AlignOptions

    if isinstance(align, AlignOptions):
        return align
    if not isinstance(align, bool):
        raise TypeError(f"align must be True, False or an AlignOptions, got {type(align).__name__}")
    return AlignOptions() if align else None


def load(checkpoint: PathLike | Sequence[PathLike], device: str = "auto", *, batch_size: int | None = None,
         batch_type: str | None = None, precision: str = "fp32", options: SearchOptions | None = None,
         **search: Any) -> Model:
    """Load a checkpoint (several: an ensemble, mean of probabilities) for translation.

    device: "auto" (CUDA when available, else CPU), "cpu", "cuda" or "cuda:N"; one unknown or
    unusable here (no CUDA, an index past the machine's GPUs) is a one-line ValueError naming it,
    before any checkpoint is read. Batches of translation: ``batch_size`` sentences or padded source
    tokens (``batch_type`` "sentences" / "tokens"); unset, ``nmt-translate``'s defaults for the device
    (64 sentences on the CPU, 8,192 tokens on a GPU; :func:`nmt.translate.translator.default_batching`);
    scoring batches sentences (``batch_size`` of them, 64 where translation counts tokens).
    ``precision``: "fp32" (IEEE float32 on a GPU too), "bf16" or "fp16" (the model under autocast;
    the search stays in float32), for translation and scoring alike, as ``nmt-translate -precision``. Search
    defaults: ``options`` (default ``SearchOptions()``) with keyword overrides, e.g.
    ``load("best.pt", beam_size=8)``. Raises ``CheckpointError`` for an unreadable file.
    """
    from nmt.translate.loading import load_models, resolve_device
    from nmt.translate.search_options import SearchOptions
    from nmt.translate.translator import check_batch_size, default_batching
    from nmt.utils.precision import check_inference_device, check_precision, requested_device

    if isinstance(checkpoint, (str, os.PathLike)):
        paths = [checkpoint]
    else:
        try:
            paths = list(checkpoint)
        except TypeError:
            raise TypeError(f"checkpoint must be a path or a list of paths, got {type(checkpoint).__name__}") from None
        for i, path in enumerate(paths):
            if not isinstance(path, (str, os.PathLike)):
                raise TypeError(f"checkpoint[{i}] must be a path, got {type(path).__name__}")
    if not paths:
        raise ValueError("load: no checkpoint given")
    if batch_size is not None:
        check_batch_size(batch_size)
    check_precision(precision, inference=True)
    if batch_type not in (None, "sentences", "tokens"):
        raise ValueError(f"batch_type must be sentences or tokens, got {batch_type!r}")
    chosen = (options or SearchOptions()).updated(**search)
    name = resolve_device(requested_device(precision, device))
    check_inference_device(precision, name)
    batch_size, batch_type = default_batching(name, batch_size, batch_type)
    decoder, _, _, members = load_models(paths, name)
    return Model(decoder, members, name, chosen, batch_size, batch_type, precision)


__all__ = ["Model", "load"]
