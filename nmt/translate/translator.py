"""Translate lists of lines in batches: search, detokenize, certificates, attention, support."""
from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from nmt.data.batching import encode_sources, shard_batches
from nmt.data.field import Field
from nmt.models.protocol import NoAttention, StepDecoder, check_lengths, position_limits
from nmt.translate.alignment import UNK, AlignOptions, Pair, align, output_rows, pharaoh, replace_unknowns
from nmt.translate.beam_search import SearchResult, beam_search, refuse_sampling
from nmt.translate.certificate import NOT_CERTIFIED, SAMPLED, reason_name
from nmt.translate.full_context_alignment import full_context_alignment, hypothesis_alignment
from nmt.translate.mbr import MbrDecision, is_exact, mbr_ranking
from nmt.translate.sampling import sample_search
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import Specials
from nmt.translate.target_prefix import check_prefix_lengths, prefix_tensor
from nmt.translate.constraint_automaton import (DEFAULT_MODE, MAX_STATES, Automaton, ConstraintError,
                                                ConstraintTables, batch_tables, build_automaton, check_mode,
                                                explored_states_bound, phrases_met)
from nmt.utils.device import checked_device
from nmt.utils.packed_linear import frozen_weights
from nmt.utils.precision import check_inference_device, check_precision, inference_precision

EMPTY_INPUT = "empty_input"
"""``reason`` of an empty input line: it is not decoded and its output is empty."""
NOT_CERTIFIED_REASON = reason_name(NOT_CERTIFIED)
SAMPLED_REASON = reason_name(SAMPLED)


@dataclass(frozen=True)
class Hypothesis:
    """One entry of an n-best list: detokenized ``text``, total log-probability ``score`` (EOS
    included) and the target ``tokens`` (one label per generated id); ``cut``: it ends without
    EOS, cut by the length limit (``max_length`` or the sentence's ``max_length_ratio`` limit);
    ``missing``: a sample that has no hypothesis (no token of nonzero sampling probability at some
    step), kept at its place in the sample order: ``text`` "", ``score`` -inf, no ``tokens``;
    ``alignment``: its ``(source, target)`` pairs (see ``nmt.translate.alignment``), None where
    alignments were not asked for; ``coverage_penalty``: its coverage penalty (<= 0, part of its
    ranking; ``SearchOptions.coverage_penalty``), None without one; ``expected_utility``: with MBR
    (``SearchOptions.mbr``), its expected utility (None: no MBR, or not a candidate)."""

    text: str
    score: float
    tokens: list[str]
    cut: bool = False
    missing: bool = False
    alignment: list[Pair] | None = None
    coverage_penalty: float | None = None
    expected_utility: float | None = None


@dataclass(frozen=True)
class Certificate:
    """The certificate of one sentence's search.

    certified: the search provably found every sequence of nonzero probability, so the first
    hypothesis is the true argmax; reason: why not (``"pruned"``, ``"max_length"``,
    ``"not_certified"`` when certificates were off, ``"sampled"`` for samples, ``"empty_input"``),
    None when certified;
    n_nonzero: hypotheses of nonzero probability found; mass: their total probability.
    """

    certified: bool
    reason: str | None
    n_nonzero: int
    mass: float


@dataclass
class Translation:
    """The translation of one input line (``index``: 0-based position in the input).

    hypotheses: n-best list of ``(text, logprob)`` (only hypotheses that exist);
    tokens: target tokens of each hypothesis, one per generated id (EOS included when generated);
    certified: the certificate (``reason`` says why not; see ``Certificate``);
    attention: (T, L) numpy matrix of the best hypothesis (with ``return_attention``);
    support: per step of the best hypothesis, ``{"size": n, "tokens": [[token, prob], ...]}``
    (the most probable tokens of nonzero probability; with ``return_support``);
    support_sizes: number of nonzero-probability tokens at each step of the best hypothesis;
    cut: per hypothesis, True when it ends without EOS, cut by the length limit (``max_length``
    or the sentence's ``max_length_ratio`` limit): its text is a truncated prefix.
    missing: per hypothesis, True for a sample without a hypothesis (``("", -inf)`` at its place, so
    that entry j is always sample j; empty where none is missing, and always for beam search, whose
    n-best lists hold only hypotheses that exist).
    decoding: the settings that change what the certificate (or a sample) means, as
    :meth:`~nmt.translate.search_options.SearchOptions.report_settings` gives them, and those that
    made the alignments (:meth:`~nmt.translate.alignment.AlignOptions.report_settings`) and the
    text (``"replace_unk": True``); None: none.
    alignments: per hypothesis, its ``(source, target)`` pairs, sorted (word or token indices, see
    ``nmt.translate.alignment``; [] for a sample without a hypothesis); None where alignments were
    not asked for (``Translator(align=...)``).
    prefix_length: the tokens of the forced target prefix every hypothesis starts with (0: none;
    ``Translator.translate(prefixes=...)``): the certificate is then about the outputs that start
    with it.
    coverage_penalties: per hypothesis, its coverage penalty (with ``SearchOptions.coverage_penalty``;
    empty without one).
    constraints: the sentence's constraint phrases (``Translator.translate(constraints=...)``; empty:
    none): every complete hypothesis meets them, and the certificate is about the outputs that do.
    constraints_met: per hypothesis, per phrase, whether it meets it (unordered mode: it occurs as
    many times as the phrases list it up to and including this entry; ordered mode: it and every
    phrase before it, in order; :func:`nmt.translate.constraint_automaton.phrases_met`); empty
    without constraints.
    mbr: the MBR decision (``SearchOptions.mbr``; None without MBR): then ``hypotheses`` (and every
    per-hypothesis list) are in MBR order, the candidates by expected utility, highest first (the
    first is the output; the candidates are ranked over all of them, and beam search keeps the
    ``n_best`` first; samples keep all, the missing and cut ones last), and
    ``expected_utilities`` holds each hypothesis's expected utility (None: not a candidate, e.g.
    cut by the length limit). ``attention`` and ``support`` are the output's.
    """

    index: int
    src_tokens: list[str]
    hypotheses: list[tuple[str, float]]
    tokens: list[list[str]]
    certified: bool
    n_nonzero: int
    mass: float
    reason: str | None
    attention: np.ndarray | None = None
    support: list[dict[str, Any]] | None = None
    support_sizes: list[int] = field(default_factory=list)
    cut: list[bool] = field(default_factory=list)
    missing: list[bool] = field(default_factory=list)
    decoding: dict[str, Any] | None = None
    alignments: list[list[Pair]] | None = None
    prefix_length: int = 0
    coverage_penalties: list[float] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    constraints_met: list[list[bool]] = field(default_factory=list)
    mbr: MbrDecision | None = None
    expected_utilities: list[float | None] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The best hypothesis ('' when there is none)."""
        return self.hypotheses[0][0] if self.hypotheses else ""

    @property
    def score(self) -> float:
        """Log-probability of the best hypothesis (-inf when there is none)."""
        return self.hypotheses[0][1] if self.hypotheses else float("-inf")

    @property
    def nbest(self) -> list[Hypothesis]:
        """The n-best list as ``Hypothesis`` objects."""
        cut = self.cut or [False] * len(self.hypotheses)
        missing = self.missing or [False] * len(self.hypotheses)
        alignments = self.alignments if self.alignments is not None else [None] * len(self.hypotheses)
        penalties = self.coverage_penalties or [None] * len(self.hypotheses)
        expected = self.expected_utilities or [None] * len(self.hypotheses)
        return [Hypothesis(text, score, tokens, c, m, a, p, e) for (text, score), tokens, c, m, a, p, e
                in zip(self.hypotheses, self.tokens, cut, missing, alignments, penalties, expected)]

    @property
    def expected_utility(self) -> float | None:
        """With MBR, the output's expected utility (None: no MBR, or no candidate)."""
        return None if self.mbr is None else self.mbr.expected

    @property
    def alignment(self) -> list[Pair] | None:
        """The best hypothesis's alignment pairs ([] when there is none; None: not asked for)."""
        if self.alignments is None:
            return None
        return self.alignments[0] if self.alignments else []

    @property
    def output_cut(self) -> bool:
        """The best hypothesis (the output line) was cut by the length limit, without EOS."""
        return bool(self.cut and self.cut[0])

    @property
    def certificate(self) -> Certificate:
        """The certificate as one object."""
        return Certificate(self.certified, self.reason, self.n_nonzero, self.mass)

    @property
    def exact(self) -> bool:
        """Deprecated name of ``certified`` (kept for one release)."""
        return self.certified

    def report(self) -> dict[str, Any]:
        """The JSON-lines record of this sentence (``exact``: deprecated alias of ``certified``,
        kept for one release; ``cut``: the output, i.e. the best hypothesis, was cut by the length
        limit without EOS, as each n-best entry's ``cut`` says of it; an n-best entry of a sample
        without a hypothesis has ``"missing": true``, others no such key; ``decoding``: the settings
        of :attr:`decoding` (sampling, n-gram blocking, alignment and ``<unk>`` replacement), only where there
        are any; with alignments, each n-best entry's
        ``"alignment"``: its pairs in the Pharaoh format, ``"0-0 1-2"``; with a coverage penalty, each
        n-best entry's ``"coverage_penalty"`` (<= 0, added to its ranking); ``prefix_length``: the
        tokens of the sentence's forced target prefix, only where it has one; with constraints,
        ``"constraints"``: the phrases, ``"constraints_met"``: whether the output meets every one, and
        each n-best entry's ``"constraints_met"``: per phrase, whether it meets it; with MBR,
        ``"mbr"``: ``{"utility", "expected", "exact", "candidates"}`` (:class:`MbrDecision`) and each
        n-best entry's ``"expected_utility"``, null for one that is no candidate)."""
        record: dict[str, Any] = {
            "id": self.index,
            "certified": self.certified,
            "exact": self.certified,
            "n_nonzero": self.n_nonzero,
            "mass": self.mass,
            "reason": self.reason,
            "cut": self.output_cut,
            "nbest": [{"text": h.text, "logprob": h.score, "cut": h.cut, **({"missing": True} if h.missing else {}),
                       **({"alignment": pharaoh(h.alignment)} if h.alignment is not None else {}),
                       **({"coverage_penalty": h.coverage_penalty} if h.coverage_penalty is not None else {}),
                       **({"constraints_met": met} if self.constraints else {}),
                       **({"expected_utility": h.expected_utility} if self.mbr is not None else {})}
                      for h, met in zip(self.nbest, self.constraints_met or [None] * len(self.hypotheses))],
        }
        if self.mbr is not None:
            record["mbr"] = self.mbr.report()
        if self.decoding is not None:
            record["decoding"] = dict(self.decoding)
        if self.prefix_length:
            record["prefix_length"] = self.prefix_length
        if self.constraints:
            record["constraints"] = list(self.constraints)
            record["constraints_met"] = bool(self.constraints_met) and all(self.constraints_met[0])
        if self.support is not None:
            record["support"] = self.support
        return record


CPU_BATCH = (64, "sentences")
"""Default batching on the CPU: 64 sentences (per-step cost grows with the batch there)."""
ACCELERATOR_BATCH = (8192, "tokens")
"""Default batching on an accelerator: 8,192 padded source tokens (a few hundred sentences of
Multi30k length, about 80 of 100 tokens), since a GPU's step costs about the same for 64 or 600
sentences."""
TOKENS_ON_CPU = 2048
"""``batch_type="tokens"`` without a size on the CPU."""


def default_batching(device: str | torch.device, batch_size: int | None = None,
                     batch_type: str | None = None) -> tuple[int, str]:
    """``(batch_size, batch_type)`` with the unset ones (None) chosen for ``device``.

    Neither set: 64 sentences on the CPU, 8,192 padded source tokens on an accelerator. Only the
    type set: 64 sentences, or a token budget of 8,192 (accelerator) / 2,048 (CPU). Only the size
    set: that many sentences. Values given are kept as they are."""
    on_cpu = torch.device(device).type == "cpu"
    if batch_size is None and batch_type is None:
        return CPU_BATCH if on_cpu else ACCELERATOR_BATCH
    if batch_type is None:
        return batch_size, "sentences"
    if batch_size is None:
        if batch_type == "sentences":
            return CPU_BATCH[0], batch_type
        return (TOKENS_ON_CPU if on_cpu else ACCELERATOR_BATCH[0]), batch_type
    return batch_size, batch_type


def fit_to_positions(options: SearchOptions, model: StepDecoder) -> SearchOptions:
    """``options`` with ``max_length`` lowered to what the model's learned positions reach (BOS and
    ``max_positions - 1`` target tokens; the smallest over an ensemble, see
    :func:`nmt.models.protocol.position_limits`); ``options`` itself where they reach it
    (sinusoids, RNNs). ValueError where ``min_length`` is above what they reach."""
    _, limit = position_limits(model)
    if limit is None or options.max_length + 1 <= limit:
        return options
    return options.updated(max_length=limit - 1)


def check_batch_size(batch_size: Any) -> None:
    """TypeError unless ``batch_size`` is an integer (a bool is not), ValueError unless it is >= 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
        raise TypeError(f"batch_size must be an integer, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


class Translator:
    """Batched translation with one model or an ``Ensemble``.

    ``options`` (default ``SearchOptions()``) are the search options; keyword
    ``search_overrides`` (``beam_size=5``, ..., any ``SearchOptions`` field) replace fields of
    it. ``max_src_length`` truncates long sources (None: keep them whole). Sources are sorted
    by length into batches of ``batch_size`` sentences (``batch_type="sentences"``) or padded
    source tokens (``"tokens"``); outputs come back in input order. ``precision`` "bf16" or
    "fp16" runs the model under autocast (the search itself stays in float32); "fp32" in IEEE float32
    on a GPU too (:func:`nmt.utils.precision.ieee_float32`: no TF32 products, the CPU's results).
    ``device`` is the model's (``cpu``, ``cuda``, ``cuda:N``): one unknown or unusable here is a
    ValueError naming it at construction (``"auto"`` too: it is resolved where the model is loaded,
    ``nmt.load``).
    ``search_seconds`` accumulates the time spent in ``translate``. With learned positions
    (:func:`nmt.models.protocol.position_limits`) ``translate`` refuses, before decoding, a
    source longer than they hold (``InputTooLong`` naming the first such input; truncate with
    ``max_src_length``), and searches at most as far as they reach (``max_length`` lowered to
    ``max_positions - 1``, as fairseq's generator does; ``nmt-translate`` says so in a warning).

    ``align`` (an ``AlignOptions``; None: off) gives every hypothesis its alignment pairs
    (``Translation.alignments``) from the attention of its steps; ``replace_unk`` replaces each
    ``<unk>`` output piece by the source piece it attends most (before detokenization, see
    :func:`nmt.translate.alignment.replace_unknowns`), or by its entry in ``phrase_table`` (source
    token -> target text, :func:`nmt.translate.phrase_table.read_phrase_table`; only with
    ``replace_unk``) where it has one. Either records the attention in the search
    (``return_attention``); a model that returns none is a ``NoAttention`` (ValueError) at the
    first batch. Without them the search is what the options alone ask for.
    """

    def __init__(self, model: StepDecoder, src_field: Field, tgt_field: Field, options: SearchOptions | None = None,
                 *, batch_size: int = 64, batch_type: str = "sentences", device: str | torch.device = "cpu",
                 max_src_length: int | None = None, precision: str = "fp32", align: AlignOptions | None = None,
                 replace_unk: bool = False, phrase_table: Mapping[str, str] | None = None,
                 src_tag: str | None = None, **search_overrides: Any) -> None:
        check_batch_size(batch_size)
        # a tag the model lacks: one line listing its tags; no tag asks nothing of the field
        self.src_prefix = [] if src_tag is None else src_field.tag_ids(src_tag)
        self.src_tag = src_tag
        if batch_type not in ("sentences", "tokens"):
            raise ValueError(f"batch_type must be sentences or tokens, got {batch_type!r}")
        if align is not None and not isinstance(align, AlignOptions):
            raise TypeError(f"align must be an AlignOptions or None, got {type(align).__name__}")
        if not isinstance(replace_unk, bool):
            raise TypeError(f"replace_unk must be True or False, got {replace_unk!r}")
        if phrase_table is not None and not replace_unk:
            raise ValueError("a phrase table applies to replace_unk (it translates the source token an <unk> "
                             "output is replaced by): add replace_unk")
        if align is not None and align.level == "word":
            for side, field_ in (("source", src_field), ("target", tgt_field)):
                check_word_ids(field_, side)
        self.batch_type, self.precision = batch_type, check_precision(precision, inference=True)
        self.model, self.src_field, self.tgt_field = model, src_field, tgt_field
        self.options = (options or SearchOptions()).updated(**search_overrides)
        self.align, self.replace_unk, self.phrase_table = align, replace_unk, phrase_table
        if align is not None or replace_unk:  # the attention of every step of every hypothesis
            self.options = self.options.updated(return_attention=True)
        self.batch_size, self.max_src_length = batch_size, max_src_length
        self.device = checked_device(device, "Translator device")  # one line, not an error at the first batch
        check_inference_device(self.precision, self.device)
        self.search_seconds = 0.0

    def translate(self, lines: Sequence[str], progress: Callable[[int], None] | None = None,
                  first_index: int = 0, prefixes: Sequence[str] | None = None,
                  constraints: Sequence[Sequence[str]] | None = None,
                  constraints_mode: str = DEFAULT_MODE, shard: tuple[int, int] | None = None
                  ) -> list[Translation]:
        """Translations of ``lines`` in input order; ``progress(n)`` is called after each batch
        of n lines. ``shard``: ``(rank, ranks)``, one of several processes translating ``lines``
        (``nmt-translate`` under ``torchrun``): every process checks every input and cuts the same
        length-sorted batches, and this one decodes batches ``rank, rank + ranks, ...`` only, the
        entries of the others' lines left None (merged, the processes' entries are one process's
        translations: the same batches, so the same hypotheses and certificates, scores up to float32
        rounding: :class:`~nmt.models.token_products.TokenProducts` rounds a token's products with the
        tokens first computed alongside it). Empty lines give empty translations with reason ``"empty_input"``.
        ``first_index``: the input index of ``lines[0]`` (a stream translated in pieces): each
        ``Translation.index`` counts from it, and so do the sentence indices that key sampling's
        noise (``sample=True``), so that a sentence's samples depend on its place in the whole input
        only. ``prefixes``: one target text per line (``""``: none) that its outputs must start
        with (:mod:`nmt.translate.target_prefix`), tokenized alone by the target tokenizer (so it
        should end at a word boundary) and kept in the output text; one longer than ``max_length``
        tokens is a ``PrefixTooLong`` (ValueError) naming its input before any is decoded.
        ``constraints``: per line, the target phrases its outputs must hold (``[]``: none), each
        tokenized alone by the target tokenizer, in ``constraints_mode`` (``"unordered"``: all of them,
        any order; ``"ordered"``: in the given order; :mod:`nmt.translate.constraint_automaton`); a
        phrase with no token or a word the target vocabulary lacks, or constraints that need more than
        ``max_length`` tokens, is a ``ConstraintError`` (ValueError) naming its input before any is
        decoded (every input is checked first); the automata are built per batch, once per distinct
        list of phrases in it (:func:`_batch_tables`); not with sampling."""
        vocab = self.tgt_field.vocab
        results: list[Translation | None] = [None] * len(lines)
        start = time.perf_counter()
        source_limit, _ = position_limits(self.model)
        options = fit_to_positions(self.options, self.model)  # as far as the positions reach
        decoding = self._report_settings(options)
        prefix_ids: list[list[int]] | None = None
        if prefixes is not None:
            if len(prefixes) != len(lines):
                raise ValueError(f"{len(prefixes)} target prefixes for {len(lines)} lines")
            prefix_ids = [self.tgt_field.encode(p) for p in prefixes]
            check_prefix_lengths(prefix_ids, options.max_length)
        phrase_ids = None
        if constraints is not None:
            if len(constraints) != len(lines):
                raise ValueError(f"{len(constraints)} constraint lists for {len(lines)} lines")
            refuse_sampling(options)
            check_mode(constraints_mode)
            phrase_ids = []  # every input checked in input order before any is decoded; automata per batch
            for i, phrases in enumerate(constraints):
                phrase_ids.append(self._phrase_ids(i, phrases))
                self._check_fit(i, phrase_ids[i], constraints_mode, options.max_length,
                                [] if prefix_ids is None else prefix_ids[i])
            if any(phrase_ids):  # the certificate is about the outputs that meet them
                decoding = {**(decoding or {}), "constraints": constraints_mode}
        batches = encode_sources(self.src_field, lines, self.batch_size, self.batch_type,
                                 max_length=self.max_src_length, src_tag=self.src_tag)
        if source_limit is not None:  # every source checked before any is decoded
            check_lengths({i: n for batch in batches for i, n in zip(batch.indices, batch.src_lengths.tolist())},
                          "source", source_limit)
        # a model aligning from a pass without the future mask: the search records no attention (its
        # steps' would be discarded), the pass over the outputs gives it after each search
        full_context = options.return_attention and full_context_alignment(self.model)
        search = options.updated(return_attention=False) if full_context else options
        batches = shard_batches(batches, shard)
        with frozen_weights():  # the weights stay fixed while decoding: packed CPU products
            for batch in batches:
                if batch.empty:  # no step, so no support entry: [] where the support was asked for
                    for i in batch.indices:
                        results[i] = Translation(first_index + i, [], [], [], False, 0, 0.0, EMPTY_INPUT,
                                                 support=[] if options.return_support else None,
                                                 decoding=decoding, alignments=[] if self.align is not None else None,
                                                 mbr=_no_candidate(options))
                else:
                    # the source lengths stay on the host: the encoders read them there (an RNN packs
                    # with them) and masks copy them without a sync (nmt.utils.device.host_to_device)
                    on_device = batch.to(self.device, lengths_on_host=True)
                    # forced prefixes: (B, P) on the host, copied with the search's state (no sync)
                    forced = None if prefix_ids is None else [prefix_ids[i] for i in batch.indices]
                    prefix = prefix_tensor(forced) if forced is not None and any(forced) else None
                    tables = None if phrase_ids is None else _batch_tables(phrase_ids, batch.indices, constraints_mode)
                    with inference_precision(self.device, self.precision):
                        if options.sample:  # keyed by the sentences' indices in the input, not the batch
                            ids = torch.tensor([first_index + i for i in batch.indices], dtype=torch.long)
                            result = sample_search(self.model, on_device.src, on_device.src_lengths,
                                                   Specials(vocab.bos_index, vocab.eos_index, vocab.pad_index,
                                                            vocab.unk_index),
                                                   search, sentence_ids=ids, prefix=prefix)
                        else:
                            result = beam_search(self.model, on_device.src, on_device.src_lengths,
                                                 bos=vocab.bos_index, eos=vocab.eos_index, pad=vocab.pad_index,
                                                 unk=vocab.unk_index, options=search, prefix=prefix,
                                                 constraints=tables)
                        if full_context:  # alignments from a pass without the future mask over each output
                            result = replace(result, attention=hypothesis_alignment(
                                self.model, on_device.src, on_device.src_lengths, result.tokens, result.lengths,
                                vocab.bos_index, result.encoder_out))
                    host = _HostResult.of(result)  # one transfer and conversion per field and batch
                    if options.return_attention and host.attention is None:
                        raise NoAttention("the model's step returns no source attention (None), so it has no "
                                          "alignments or heatmaps")
                    src_ids = batch.src.tolist()
                    lengths = batch.src_lengths.tolist()
                    for row, i in enumerate(batch.indices):
                        src_tokens = self.src_field.vocab.tokens(src_ids[row][: lengths[row]])
                        source = self._source_pieces(lines[i], lengths[row])
                        results[i], entries = self._unpack(host, row, first_index + i, src_tokens, decoding,
                                                           source, 0 if forced is None else len(forced[row]),
                                                           options)
                        if phrase_ids is not None and phrase_ids[i]:
                            self._mark_constraints(results[i], host, row, entries, constraints[i], phrase_ids[i],
                                                   constraints_mode)
                if progress is not None:
                    progress(len(batch))
        self.search_seconds += time.perf_counter() - start
        return results  # type: ignore[return-value]

    def _phrase_ids(self, index: int, phrases: Sequence[str]) -> list[list[int]]:
        """The token ids of input ``index``'s constraint phrases; ``ConstraintError`` for a phrase
        without a token or with a word the target vocabulary lacks (it could only be met by
        generating ``<unk>``)."""
        out = []
        for n, phrase in enumerate(phrases):
            ids = self.tgt_field.encode(phrase)
            if not ids:
                raise ConstraintError(index, f"constraint phrase {n + 1} {phrase!r} has no token")
            if self.tgt_field.vocab.unk_index in ids:
                raise ConstraintError(index, f"constraint phrase {n + 1} {phrase!r} holds a word the target "
                                             "vocabulary lacks (only <unk> could meet it)")
            out.append(ids)
        return out

    @staticmethod
    def _check_fit(index: int, phrase_ids: list[list[int]], mode: str, max_length: int, prefix_ids: list[int]) -> None:
        """``ConstraintError`` where input ``index``'s constraint automaton would have too many states
        or its outputs, after its forced prefix ``prefix_ids`` (``[]``: none; a prefix may hold a
        phrase or start one), would need more than ``max_length`` tokens. Cheap where it can be: the
        phrases one after the other after the prefix meet the constraints, so when those tokens fit
        ``max_length`` and :func:`explored_states_bound` fits :data:`MAX_STATES` nothing can fail and
        no automaton is built (the batches build theirs); otherwise it is built, checked and dropped."""
        if (len(prefix_ids) + sum(len(p) for p in phrase_ids) <= max_length
                and explored_states_bound(phrase_ids, mode) <= MAX_STATES):
            return
        automaton = build_automaton(phrase_ids, mode, index)
        if automaton.dist[0] > max_length:
            raise ConstraintError(index, f"the constraints need at least {automaton.dist[0]} tokens, more than "
                                         f"max_length {max_length}")
        need = len(prefix_ids) + automaton.dist[automaton.run(prefix_ids)]
        if need > max_length:  # the phrases do not fit after the prefix (never without one: checked above)
            raise ConstraintError(index, f"the target prefix and the constraints need at least {need} tokens, "
                                         f"more than max_length {max_length}")

    def _mark_constraints(self, translation: Translation, host: "_HostResult", row: int, entries: list[int],
                          phrases: Sequence[str], phrase_ids: list[list[int]], mode: str) -> None:
        """Record on ``translation`` its constraint phrases and, per hypothesis (``entries``: the
        result's n-best entry of each, in the translation's order), which it meets (its generated
        ids, EOS excluded, scanned on the host)."""
        eos = self.tgt_field.vocab.eos_index
        translation.constraints = list(phrases)
        translation.constraints_met = [
            phrases_met([t for t in host.tokens[row][n][:host.lengths[row][n]] if t != eos], phrase_ids, mode)
            for n in entries]

    def _report_settings(self, options: SearchOptions) -> dict[str, Any] | None:
        """The ``decoding`` of every ``Translation`` of a run: ``options``' report settings, the
        alignment's (``align_mode``, ``align_level``, ``align_threshold`` of "support"),
        ``"replace_unk": True`` where it is on (and ``"phrase_table": True`` with a table) and the
        ``"src_tag"`` put before every source, the ``"precision"`` where it is not fp32 (bf16, fp16,
        int8: not the float32 model's search); None where there are none."""
        settings = dict(options.report_settings() or {})
        if self.align is not None:
            settings.update(self.align.report_settings())
        if self.replace_unk:
            settings["replace_unk"] = True
        if self.phrase_table is not None:
            settings["phrase_table"] = True
        if self.src_tag is not None:
            settings["src_tag"] = self.src_tag
        if self.precision != "fp32":
            settings["precision"] = self.precision
        return settings or None

    def _source_pieces(self, line: str, length: int) -> "_SourcePieces | None":
        """The surface pieces of a source line (the first ``length``, as decoded) and their words,
        where alignments or ``<unk>`` replacement need them (None otherwise)."""
        if self.align is None and not self.replace_unk:
            return None
        pieces = self.src_field.tokenize(line)
        words = self.src_field.tokenizer.word_ids(pieces) if self.align is not None and self.align.level == "word" else None
        if self.src_prefix:  # the tag's place: in no word, and an <unk> attending to it stays <unk>
            pieces = [UNK] * len(self.src_prefix) + pieces
            words = None if words is None else [None] * len(self.src_prefix) + words
        return _SourcePieces(pieces[:length], None if words is None else words[:length])

    def _unpack(self, result: "_HostResult", row: int, index: int, src_tokens: list[str],
                decoding: dict[str, Any] | None = None, source: "_SourcePieces | None" = None,
                prefix_length: int = 0, options: SearchOptions | None = None) -> tuple[Translation, list[int]]:
        """Sentence ``row`` of a batched result already on the host (Python lists, NumPy arrays),
        and the result's n-best entry of each of its hypotheses, in its order.
        Samples keep their places: one without a hypothesis is ``("", -inf)``, marked missing.
        ``source``: the source's surface pieces, with alignments or ``<unk>`` replacement;
        ``prefix_length``: the tokens of its forced target prefix; ``options``: the search's, whose
        ``mbr`` reorders the hypotheses by expected utility (:meth:`_mbr`)."""
        field_ = self.tgt_field
        lengths, scores, token_rows = result.lengths[row], result.scores[row], result.tokens[row]
        sampled = result.reason[row] == SAMPLED
        hypotheses, tokens, cut, missing, entries = [], [], [], [], []
        penalties = [] if result.coverage_penalty is None else result.coverage_penalty[row]
        alignments: list[list[Pair]] | None = [] if self.align is not None else None
        for n, length in enumerate(lengths):
            if length == 0:
                if sampled:  # sample n has none: its place stays, so entry j is sample j
                    entries.append(n)
                    hypotheses.append(("", float("-inf")))
                    tokens.append([])
                    cut.append(False)
                    missing.append(True)
                    if alignments is not None:
                        alignments.append([])
                continue
            ids = token_rows[n][:length]
            labels = field_.vocab.tokens(ids)  # one label per generated id, specials included
            if source is None:
                text = field_.decode(ids)
            else:  # the attention of hypothesis n's steps (T, L) over the source's pieces
                attention = result.attention[row, n, :length, : len(src_tokens)]
                rows = output_rows(labels)
                pieces = [labels[r] for r in rows]  # Field.decode_tokens's pieces
                if self.replace_unk:
                    pieces = replace_unknowns(pieces, rows, attention, source.pieces, table=self.phrase_table)
                text = field_.tokenizer.detokenize(pieces)
                if alignments is not None:
                    tgt_words = field_.tokenizer.word_ids(pieces) if source.words is not None else None
                    alignments.append(align(attention, rows, self.align, source.words, tgt_words,
                                            src_offset=len(self.src_prefix)))  # the line's pieces, not the tag
            entries.append(n)
            hypotheses.append((text, float(scores[n])))
            tokens.append(labels)
            cut.append(not result.complete[row][n])  # no EOS: cut by the length limit
            missing.append(False)
        coverage = [float(penalties[n]) for n in entries] if penalties else []
        decision, expected = None, []
        if options is not None and options.mbr != "none":
            order, expected, decision = self._mbr(result, row, hypotheses, cut, missing, options, sampled)
            hypotheses, tokens, cut, missing, entries = ([x[j] for j in order] for x in
                                                         (hypotheses, tokens, cut, missing, entries))
            coverage = [coverage[j] for j in order] if coverage else []
            alignments = None if alignments is None else [alignments[j] for j in order]
        best = entries[0] if entries else 0
        best_len = lengths[best]
        attention = None
        if result.attention is not None and best_len > 0:
            attention = result.attention[row, best, :best_len, : len(src_tokens)]
        sizes = result.support_size[row][best][:best_len] if result.support_size is not None else []
        support = None
        if result.support_tokens is not None:
            support = []
            probs = result.support_probs[row][best][:best_len]
            toks = result.support_tokens[row][best][:best_len]
            for t in range(best_len):
                pairs = [[field_.vocab.tokens([tok])[0], p] for tok, p in zip(toks[t], probs[t]) if p > 0.0]
                support.append({"size": sizes[t] if sizes else len(pairs), "tokens": pairs})
        return Translation(
            index=index,
            src_tokens=src_tokens,
            hypotheses=hypotheses,
            tokens=tokens,
            certified=bool(result.exact[row]),
            n_nonzero=int(result.n_nonzero[row]),
            mass=float(result.mass[row]),
            reason=reason_name(int(result.reason[row])),
            attention=attention,
            support=support,
            support_sizes=sizes,
            cut=cut,
            missing=missing if any(missing) else [],
            decoding=decoding,
            alignments=alignments,
            prefix_length=prefix_length,
            coverage_penalties=coverage,
            mbr=decision,
            expected_utilities=expected,
        ), entries

    @staticmethod
    def _mbr(result: "_HostResult", row: int, hypotheses: list[tuple[str, float]], cut: list[bool],
             missing: list[bool], options: SearchOptions,
             sampled: bool) -> tuple[list[int], list[float | None], MbrDecision]:
        """The MBR order of a sentence's hypotheses (indices into them; beam search: the
        ``options.n_best`` first, samples: all), each one's expected utility in that order, and the
        decision (:mod:`nmt.translate.mbr`). The candidates are the hypotheses that are neither cut
        nor missing; of an uncertified beam-searched sentence only the first ``beam_size`` of those in
        the search's order (:func:`nmt.translate.mbr.candidate_mask`)."""
        order, expected, candidates = mbr_ranking([text for text, _ in hypotheses], [score for _, score in hypotheses],
                                                  cut, missing, sampled or bool(result.exact[row]), options.beam_size,
                                                  options.mbr, sampled)
        if not sampled:
            order, expected = order[:options.n_best], expected[:options.n_best]
        mass = float(result.mass[row])
        exact = not sampled and is_exact(bool(result.exact[row]), mass, candidates, int(result.n_nonzero[row]))
        chosen = expected[0] if expected else None
        return order, expected, MbrDecision(options.mbr, chosen, exact, candidates, None if sampled else mass)


def _no_candidate(options: SearchOptions) -> MbrDecision | None:
    """The MBR decision of a sentence with no search (an empty input line): no candidate, not
    exact, ``expected`` None (None without MBR), so every record of an MBR run has its ``"mbr"``."""
    if options.mbr == "none":
        return None
    return MbrDecision(options.mbr, None, False, 0, None if options.sample else 0.0)


def check_word_ids(field_: Field, side: str) -> None:
    """ValueError unless ``field_``'s tokenizer groups pieces into words (word-level alignment)."""
    try:
        field_.tokenizer.word_ids([])
    except NotImplementedError as exc:
        raise ValueError(f"word-level alignment needs the {side} pieces' words, but {exc}; align tokens "
                         "instead") from None


@dataclass
class _SourcePieces:
    """A source line's surface pieces (as tokenized, before the vocabulary; rare words kept) and
    each one's word (None: not asked for)."""

    pieces: list[str]
    words: list[int | None] | None


@dataclass
class _HostResult:
    """A batch's :class:`SearchResult` on the host, each field converted once (``tolist``; the
    attention as one NumPy array): unpacking sentence by sentence then indexes Python lists
    instead of making a few tensor operations per sentence (4 per sentence cost ~4% of greedy
    decoding on the CPU)."""

    lengths: list
    scores: list
    tokens: list
    complete: list
    exact: list
    n_nonzero: list
    mass: list
    reason: list
    attention: Any
    support_size: Any
    support_tokens: Any
    support_probs: Any
    coverage_penalty: Any = None

    @classmethod
    def of(cls, result: SearchResult) -> "_HostResult":
        def lists(value: Any) -> Any:
            return None if value is None else value.cpu().tolist()

        return cls(lengths=lists(result.lengths), scores=lists(result.scores), tokens=lists(result.tokens),
                   complete=lists(result.complete), exact=lists(result.exact), n_nonzero=lists(result.n_nonzero), mass=lists(result.mass),
                   reason=lists(result.reason),
                   attention=None if result.attention is None else result.attention.cpu().numpy(),
                   support_size=lists(result.support_size), support_tokens=lists(result.support_tokens),
                   support_probs=lists(result.support_probs), coverage_penalty=lists(result.coverage_penalty))


@dataclass
class TranslationSummary:
    """Corpus statistics of a list of translations. ``certified_percent``: sentences whose
    search was certified (None when certificates were off); ``single_percent``: sentences
    certified to have exactly one sequence of nonzero probability (``n_nonzero == 1``); both
    None too when no sentence was decoded (no input, or empty lines only): a percentage of
    nothing is not 0%. ``cut``: sentences whose output (best hypothesis) was cut by the length
    limit without EOS; with samples, the samples so cut (every sample is an output line). ``sampled``: the sentences were sampled (``SearchOptions.sample``), not
    searched: nothing is certified, and both percentages are None. ``no_output``: output lines
    without a hypothesis (written empty): searched sentences of a non-empty input that found none
    (no output of nonzero probability, e.g. every one blocked by ``block_ngram_repeat``), or samples
    with no token of nonzero probability at some step, out of ``samples`` samples drawn.
    ``mbr``: the utility of MBR decoding (None: none); ``mbr_exact_percent``: the decoded sentences
    whose MBR decision is exact (:func:`nmt.translate.mbr.is_exact`; None without MBR or sentences);
    ``mbr_empty``: with MBR over samples (one output line per sentence), the sentences none of whose
    samples has a hypothesis (their line is written empty)."""

    sentences: int
    empty: int
    certified_percent: float | None
    single_percent: float | None
    mean_support: float | None
    cut: int = 0
    sampled: bool = False
    no_output: int = 0
    samples: int = 0
    mbr: str | None = None
    mbr_exact_percent: float | None = None
    mbr_empty: int = 0

    @classmethod
    def of(cls, translations: Sequence[Translation]) -> "TranslationSummary":
        return SummaryCounts().add(translations).summary()

    def line(self) -> str:
        """One human-readable line (``certified n/a`` when certificates were off or nothing was
        decoded; ``sampled, not certified`` for samples)."""
        support = "n/a" if self.mean_support is None else f"{self.mean_support:.2f}"
        empty = f" ({self.empty} empty)" if self.empty else ""
        if self.sampled:
            certified = "sampled, not certified"
        elif self.certified_percent is None:
            certified = "certified n/a"
        else:
            certified = f"certified {self.certified_percent:.1f}%; single hypothesis {self.single_percent:.1f}%"
        if not self.cut:
            cut = ""
        elif self.sampled:
            cut = f"; {self.cut} of {self.samples} samples cut at the length limit (no EOS)"
        else:
            cut = f"; {self.cut} output{'s' if self.cut != 1 else ''} cut at the length limit (no EOS)"
        return (f"{self.sentences} sentences{empty}; {certified}; mean output support {support}{cut}"
                f"{self._no_output()}{self._mbr()}")

    def _mbr(self) -> str:
        """The summary's clause on MBR decoding ('' without it)."""
        if self.mbr is None:
            return ""
        if self.sampled:
            return f"; MBR {self.mbr} over the samples (estimated, not exact)"
        exact = "n/a" if self.mbr_exact_percent is None else f"{self.mbr_exact_percent:.1f}%"
        return f"; MBR {self.mbr}, exact {exact}"

    def _no_output(self) -> str:
        """The summary's clause on output lines left empty for want of a hypothesis ('' if none)."""
        if not self.no_output:
            return ""
        if self.sampled and self.mbr is not None:  # one line per sentence: the MBR decision
            return (f"; {self.no_output} of {self.samples} samples without a hypothesis (no token of nonzero "
                    f"probability at some step; no candidates), {self.mbr_empty} sentence"
                    f"{'s' if self.mbr_empty != 1 else ''} with none (empty lines)")
        if self.sampled:
            return (f"; {self.no_output} of {self.samples} samples without a hypothesis (no token of nonzero "
                    "probability at some step; empty lines)")
        return (f"; {self.no_output} sentence{'s' if self.no_output != 1 else ''} without a hypothesis (no output "
                "of nonzero probability; empty lines)")


class SummaryCounts:
    """The counts behind a ``TranslationSummary``, added batch by batch (streaming keeps these,
    not the translations)."""

    def __init__(self) -> None:
        self.sentences = self.decoded = self.certified = self.single = self.cut = 0
        self.no_output = self.samples = 0
        self.certify_off = self.sampled = False
        self.support_total = self.support_steps = 0
        self.mbr: str | None = None
        self.mbr_exact = self.mbr_empty = 0

    def add(self, translations: Sequence[Translation]) -> "SummaryCounts":
        self.sentences += len(translations)
        for t in translations:
            if t.reason == EMPTY_INPUT:
                continue
            self.decoded += 1
            self.certified += bool(t.certified)
            # a single hypothesis is known only when certified: certified and n_nonzero == 1
            self.single += bool(t.certified and t.n_nonzero == 1)
            self.certify_off |= t.reason == NOT_CERTIFIED_REASON
            self.sampled |= t.reason == SAMPLED_REASON
            if t.reason == SAMPLED_REASON:  # every sample is an output line
                self.samples += len(t.hypotheses)
                self.no_output += sum(t.missing)
                self.cut += sum(map(bool, t.cut or ()))
            else:  # the output line is the best hypothesis
                self.no_output += not t.hypotheses
                self.cut += t.output_cut
            self.support_total += sum(t.support_sizes)
            self.support_steps += len(t.support_sizes)
            if t.mbr is not None:
                self.mbr = t.mbr.utility
                self.mbr_exact += t.mbr.exact
                # MBR over samples writes one line, the decision: empty only where no sample has a hypothesis
                self.mbr_empty += bool(t.reason == SAMPLED_REASON and t.missing and t.missing[0])
        return self

    def summary(self) -> TranslationSummary:
        n = max(self.decoded, 1)
        off = not self.decoded or self.certify_off or self.sampled
        return TranslationSummary(
            sentences=self.sentences,
            empty=self.sentences - self.decoded,
            certified_percent=None if off else 100.0 * self.certified / n,
            single_percent=None if off else 100.0 * self.single / n,
            mean_support=self.support_total / self.support_steps if self.support_steps else None,
            cut=self.cut,
            sampled=self.sampled,
            no_output=self.no_output,
            samples=self.samples,
            mbr=self.mbr,
            mbr_exact_percent=100.0 * self.mbr_exact / self.decoded if self.mbr is not None and self.decoded else None,
            mbr_empty=self.mbr_empty,
        )


def _batch_tables(phrase_ids: Sequence[list[list[int]]], indices: Sequence[int], mode: str) -> ConstraintTables | None:
    """The constraint tables of the inputs ``indices`` (a batch), their automata built now (the
    inputs were checked before decoding: none fails), once per distinct list of phrases in the
    batch; None where none of them has a phrase (the batch searches as without constraints)."""
    if not any(phrase_ids[i] for i in indices):
        return None
    built: dict[tuple[tuple[int, ...], ...], Automaton] = {}
    automata = []
    for i in indices:
        key = tuple(tuple(p) for p in phrase_ids[i])
        if key not in built:
            built[key] = build_automaton(phrase_ids[i], mode, i)
        automata.append(built[key])
    return batch_tables(automata)


__all__ = ["EMPTY_INPUT", "Certificate", "check_batch_size", "check_word_ids", "fit_to_positions", "Hypothesis", "SummaryCounts",
           "Translation", "TranslationSummary", "Translator"]
