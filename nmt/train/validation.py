"""Validation: teacher-forced loss / accuracy / support sizes, and decoding metrics.

Teacher-forced statistics are accumulated as tensors over the whole validation set and
read once at the end (no per-batch host sync). Decoding uses
``nmt.translate.beam_search.beam_search`` with the ``SearchOptions`` of the ``validation``
section (:func:`validation_search`: the keys named as nmt-translate's flags, beam 1 = greedy) and
scores the detokenized hypotheses against the raw reference lines.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from nmt.config import ConfigError
from nmt.config.options import DECODING_METRICS
from nmt.data.batching import collate, make_batches, shard_batches
from nmt.data.dataset import ParallelDataset
from nmt.data.field import Field
from nmt.models.seq2seq import length_mask
from nmt.train.compile import pad_to_multiple
from nmt.train.distributed import DistributedContext
from nmt.train.update import output_target, summed_output_loss
from nmt.translate.beam_search import beam_search
from nmt.translate.mbr import mbr_ranking
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_result import SearchResult
from nmt.utils import metrics as corpus_metrics
from nmt.utils.packed_linear import frozen_weights
from nmt.utils.precision import ieee_float32


@dataclass
class ValidationResult:
    """Scalars of one validation and the decoded hypotheses (dataset order, [] when not decoded).

    scalars: loss (per target token), accuracy (% of target tokens whose most probable
    type is the gold one), ppl (softmax output only), attention_support / output_support
    (mean number of nonzero attention weights / output probabilities per target token), and
    when decoding: those of exact_match, bleu, chrf (0-100), ter (sacrebleu's TER, lower is better) that
    ``validation.metrics`` lists, and certified (% of sentences whose
    search is certified: every sequence of nonzero probability found, the best hypothesis the
    argmax of the search's ranking (its length / coverage penalty), among the outputs its
    constraints allow (``block_ngram_repeat``, ``ban_unk_token``, ``min_length``)).
    """

    scalars: dict[str, float]
    hypotheses: list[str] = field(default_factory=list)
    signatures: dict[str, str] = field(default_factory=dict)
    """sacrebleu signatures of the ``bleu``, ``chrf`` and ``ter`` scalars (those computed)."""


SACREBLEU_METRICS = {"bleu": corpus_metrics.bleu_with_signature, "chrf": corpus_metrics.chrf_with_signature,
                     "ter": corpus_metrics.ter_with_signature}
"""The decoding metrics sacrebleu computes: ``(score, signature)`` of hypotheses and references."""


StatisticsFn = Callable[..., tuple[Tensor, Tensor]]

SEARCH_KEYS = ("beam_size", "max_length", "min_length", "max_length_ratio", "max_length_offset", "length_penalty",
               "length_alpha", "coverage_penalty", "beta", "coverage_epsilon", "stepwise_penalty",
               "block_ngram_repeat", "ban_unk_token", "mbr")
"""The keys of the ``validation`` section that are ``SearchOptions`` fields of the same name (and
``nmt-translate`` flags): the search of the validation decode."""

ALWAYS_SHOWN = ("beam_size", "max_length")
"""The search keys :func:`search_description` shows at their defaults too."""


def validation_search(validation: Mapping[str, Any], source: str = "<config>") -> SearchOptions:
    """The ``SearchOptions`` of the validation decode: the :data:`SEARCH_KEYS` of ``validation``
    (a resolved ``validation`` section), one hypothesis per sentence, certified, the other fields at
    ``SearchOptions``' defaults (as ``nmt-translate`` without those flags). The values are checked by
    ``SearchOptions`` itself (the checks of ``nmt-translate``'s flags): a bad one is a
    :class:`ConfigError` naming ``source`` and ``validation.<key>``, e.g. ``run.yaml:
    validation.length_penalty: must be one of none, average, gnmt, got 'wu'``."""
    try:
        return SearchOptions(n_best=1, certify=True, **{key: validation[key] for key in SEARCH_KEYS})
    except ValueError as exc:
        field_name, _, problem = str(exc).partition(" ")  # every message starts with the field's name
        if field_name not in SEARCH_KEYS:
            raise ConfigError(source, "validation", str(exc)) from None
        raise ConfigError(source, f"validation.{field_name}", problem) from None


def search_description(options: SearchOptions) -> str:
    """``key=value`` pairs of the search ``options`` for the log: :data:`ALWAYS_SHOWN`, and every other
    key of :data:`SEARCH_KEYS` that is off its ``SearchOptions`` default, e.g. ``beam_size=5
    max_length=100 length_penalty=gnmt length_alpha=1.0``."""
    defaults = SearchOptions()
    return " ".join(f"{key}={getattr(options, key)}" for key in SEARCH_KEYS
                    if key in ALWAYS_SHOWN or getattr(options, key) != getattr(defaults, key))


def batch_statistics(model: nn.Module, loss_fn: Callable, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                     tgt_out: Tensor, pad_index: int, kinds: tuple[str, ...],
                     src_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Teacher-forced sums of one batch (call under ``torch.no_grad()``, model in eval mode).

    src: (B, L); src_lengths: (B,) (on the host for the RNN encoder's packing); tgt_in, tgt_out:
    (B, T). Returns ``totals`` (5,) float64: summed loss, correct tokens (the most probable type
    is the gold one), target tokens, nonzero attention weights and nonzero output probabilities
    over the real target positions; and ``kind_totals`` (len(kinds), 2) float64: per attention kind
    of a model with attention maps (the Transformer), the nonzero weights of the real query rows
    of every head and layer, and the number of those rows. Padding positions count nowhere, so
    padding a batch to longer lengths changes nothing. No host synchronisation here (masks
    multiply, they never index); what ``training.compile`` compiles for validation. ``src_mask``:
    the lengths' :func:`length_mask` (B, L), made by the caller outside a compiled call (a graph
    taking the host lengths would copy them with a sync and not be captured), or None.
    """
    mask = tgt_out != pad_index  # (B, T)
    kind_totals = torch.zeros(len(kinds), 2, dtype=torch.float64, device=src.device)
    if src_mask is None:
        src_mask = length_mask(src_lengths, src.size(1), src.device)  # (B, L)
    if kinds:
        logits, attention, maps = model(src, src_lengths, tgt_in, return_maps=True, src_mask=src_mask)
        for j, kind in enumerate(kinds):
            rows = (src_mask if kind == "encoder_self" else mask)[:, None, :].double()  # (B, 1, T_query)
            for probs in maps[kind]:  # (B, heads, T_query, T_key)
                kind_totals[j, 0] += ((probs > 0).sum(-1).double() * rows).sum()
                kind_totals[j, 1] += rows.sum() * probs.size(1)
    else:
        logits, attention = model(src, src_lengths, tgt_in, src_mask=src_mask)
    loss = summed_output_loss(loss_fn, logits, tgt_out, pad_index, 0.0,
                              output_target(model, logits, tgt_out, src, src_lengths, src_mask))
    probs = model.output_probs(logits, src, src_mask)  # (B, T, V): with copying the tokens' marginal
    weights = mask.double()  # (B, T)
    totals = torch.stack([loss.double(), ((probs.argmax(-1) == tgt_out).double() * weights).sum(), weights.sum(),
                          ((attention > 0).sum(-1).double() * weights).sum(),
                          ((probs > 0).sum(-1).double() * weights).sum()])
    return totals, kind_totals


@torch.no_grad()
def teacher_forced_statistics(model: nn.Module, dataset: ParallelDataset, loss_fn: Callable, batch_size: int,
                              device: torch.device, is_softmax: bool, *, statistics: StatisticsFn = batch_statistics,
                              pad_multiple: int = 1, ranks: DistributedContext | None = None) -> dict[str, float]:
    """Loss, token accuracy, perplexity and support sizes of ``model`` on ``dataset`` (eval mode).

    For a model with several attention kinds (``model.attention_kinds``, the Transformer) also
    ``attention_support_<kind>``: the mean number of nonzero weights of one head's row, over
    the real (non-padding) query positions, the heads and the layers of that kind.
    ``statistics``: ``batch_statistics`` or its compiled form; ``pad_multiple``: batch lengths
    padded to multiples of it (fewer shapes for a compiled ``statistics``; same figures).
    The sums stay on ``device`` and are read once at the end (source lengths stay on the host).
    ``ranks``: the processes of a data-parallel job (several: each takes every N-th batch, and one
    all-reduce sums the totals; every process gets the whole set's figures).
    """
    vocab = dataset.tgt_field.vocab
    totals = torch.zeros(5, dtype=torch.float64, device=device)  # loss, correct, tokens, att support, out support
    kinds = tuple(getattr(model, "attention_kinds", ()))
    kind_totals = torch.zeros(len(kinds), 2, dtype=torch.float64, device=device)  # support sum, rows
    for indices in _share(make_batches(dataset, batch_size, "sentences", shuffle=False), ranks):
        batch = pad_to_multiple(collate(dataset, indices, vocab.pad_index, vocab.bos_index, vocab.eos_index),
                                pad_multiple, vocab.pad_index).to(device, lengths_on_host=True)
        src_mask = length_mask(batch.src_lengths, batch.src.size(1), batch.src.device)  # outside a compiled call
        batch_totals, batch_kind_totals = statistics(model, loss_fn, batch.src, batch.src_lengths, batch.tgt_in,
                                                     batch.tgt_out, vocab.pad_index, kinds, src_mask)
        totals += batch_totals
        kind_totals += batch_kind_totals
    if ranks is not None and ranks.enabled:  # one all-reduce of both (the kinds' after the five totals)
        both = ranks.sum_tensor_(torch.cat([totals, kind_totals.flatten()]))
        totals, kind_totals = both[:5], both[5:].view(-1, 2)
    loss_sum, correct, tokens, att_support, out_support = totals.tolist()
    tokens = max(tokens, 1.0)
    scalars = {
        "loss": loss_sum / tokens,
        "accuracy": 100.0 * correct / tokens,
        "attention_support": att_support / tokens,
        "output_support": out_support / tokens,
        "tokens": tokens,
    }
    for kind, (support, rows) in zip(kinds, kind_totals.tolist()):
        scalars[f"attention_support_{kind}"] = support / max(rows, 1.0)
    if is_softmax:
        scalars["ppl"] = math.exp(min(loss_sum / tokens, 700.0))
    return scalars


@torch.no_grad()
def decode_dataset(model: nn.Module, dataset: ParallelDataset, tgt_field: Field, batch_size: int,
                   options: SearchOptions, device: torch.device, ranks: DistributedContext | None = None
                   ) -> tuple[list[str], float] | None:
    """Detokenized best hypothesis of every example (dataset order) and the % certified
    (certified only with ``options.certify``: of the search ``options`` ask for, its length and
    coverage penalties, n-gram and ``<unk>`` bans included). Decodes in IEEE float32
    (:func:`nmt.utils.precision.ieee_float32`), as ``nmt-translate`` does: a validation's BLEU and
    certificates are what translating the checkpoint gives, TF32 or not in training. ``ranks``:
    the processes of a data-parallel job (several: each decodes every N-th batch, rank 0 gathers
    the hypotheses and gets the result, the others None)."""
    vocab = tgt_field.vocab
    hypotheses: list[str] = [""] * len(dataset)
    certified = 0
    mine: list[int] = []  # the positions this process decoded
    for indices in _share(make_batches(dataset, batch_size, "sentences", shuffle=False), ranks):
        mine.extend(indices)
        batch = collate(dataset, indices, vocab.pad_index, vocab.bos_index, vocab.eos_index).to(device)
        with ieee_float32():
            result = beam_search(model, batch.src, batch.src_lengths, bos=vocab.bos_index, eos=vocab.eos_index,
                                 pad=vocab.pad_index, unk=vocab.unk_index, options=options)
        if options.mbr != "none":
            decisions = mbr_decisions(result, tgt_field, options)
            for row, index in enumerate(_positions(batch)):
                hypotheses[index] = decisions[row]
        else:
            best = result.tokens[:, 0, :].cpu()
            for row, index in enumerate(_positions(batch)):
                hypotheses[index] = tgt_field.decode(best[row])
        certified += int(result.exact.sum())
    if ranks is not None and ranks.enabled:  # rank 0 merges every rank's hypotheses (host objects, Gloo)
        parts = ranks.gather(([(i, hypotheses[i]) for i in mine], certified))
        if parts is None:
            return None
        certified = 0
        for pairs, count in parts:
            certified += count
            for i, text in pairs:
                hypotheses[i] = text
    return hypotheses, 100.0 * certified / max(len(dataset), 1)


def _share(batches: list[list[int]], ranks: DistributedContext | None) -> list[list[int]]:
    """This process's batches of a data-parallel job (:func:`nmt.data.batching.shard_batches`; all of
    them in one process)."""
    return shard_batches(batches, (ranks.rank, ranks.world_size) if ranks is not None and ranks.enabled else None)


def mbr_decisions(result: SearchResult, tgt_field: Field, options: SearchOptions) -> list[str]:
    """The detokenized MBR decision of every sentence of a beam search run with ``options.mbr``
    (``validation.mbr``): among its finished hypotheses, the one of highest expected utility under the
    model (:func:`nmt.translate.mbr.mbr_ranking`, as ``nmt-translate -mbr`` chooses); the search's
    best where no hypothesis is a candidate. The result is read back to the host once for the batch."""
    tokens, lengths, complete = result.tokens.cpu(), result.lengths.tolist(), result.complete.tolist()
    scores, exact = result.scores.tolist(), result.exact.tolist()
    decisions = []
    for row, (n_tokens, done) in enumerate(zip(lengths, complete)):
        texts = [tgt_field.decode(ids) if n else "" for ids, n in zip(tokens[row], n_tokens)]
        order, _, _ = mbr_ranking(texts, scores[row], [n > 0 and not d for n, d in zip(n_tokens, done)],
                                  [n == 0 for n in n_tokens], bool(exact[row]), options.beam_size, options.mbr,
                                  sampled=False)
        decisions.append(texts[order[0]])
    return decisions


@frozen_weights()  # the weights stay fixed while validating: packed CPU products (nmt.utils.packed_linear)
def validate(model: nn.Module, dataset: ParallelDataset, references: Sequence[str], loss_fn: Callable, *,
             batch_size: int, device: torch.device, is_softmax: bool, search: SearchOptions | None,
             statistics: StatisticsFn = batch_statistics, pad_multiple: int = 1,
             metrics: Sequence[str] = DECODING_METRICS, ranks: DistributedContext | None = None
             ) -> ValidationResult | None:
    """Full validation of ``model`` (put in eval mode, restored to its previous mode after).

    references: raw target line of each ``dataset`` example. ``search``: the decode's options
    (:func:`validation_search` of the config; its best hypothesis is scored, and ``certified`` is
    the share of sentences that search certified); None: no decoding (teacher-forced scalars only).
    ``statistics`` and ``pad_multiple``: see ``teacher_forced_statistics`` (the trainer passes the
    compiled form under ``training.compile``). ``metrics``: the decoding metrics computed
    (``validation.metrics``; the others are absent from the scalars). ``ranks``: the processes of a
    data-parallel job, every one of them calling this: each takes every N-th batch of the
    teacher-forced pass and of the decoding, rank 0 gets the result (the whole set's figures, as one
    process computes them up to the order of the float64 sums), the others None.
    """
    with eval_mode(model):
        scalars = teacher_forced_statistics(model, dataset, loss_fn, batch_size, device, is_softmax,
                                            statistics=statistics, pad_multiple=pad_multiple, ranks=ranks)
        hypotheses: list[str] = []
        signatures: dict[str, str] = {}
        if search is not None:
            decoded = decode_dataset(model, dataset, dataset.tgt_field, batch_size, search, device, ranks)
            if decoded is None:  # another rank's: rank 0 scores the hypotheses
                return None
            hypotheses, certified = decoded
            if "exact_match" in metrics:
                scalars["exact_match"] = corpus_metrics.exact_match(hypotheses, references)
            for name in SACREBLEU_METRICS:
                if name in metrics:
                    scalars[name], signatures[name] = SACREBLEU_METRICS[name](hypotheses, references)
            scalars["certified"] = certified
    if ranks is not None and not ranks.is_main:
        return None
    return ValidationResult(scalars, hypotheses, signatures)


@torch.no_grad()
def attention_matrices(model: nn.Module, dataset: ParallelDataset, indices: Sequence[int],
                       device: torch.device) -> list[tuple[Tensor, list[str], list[str]]]:
    """Teacher-forced attention of the given examples: ``(matrix (T, L), src tokens, tgt tokens)``,
    the attention alignments are read from (``model.teacher_forced_alignment``: the full-context
    pass's where the model aligns from one, ``model.transformer.full_context_alignment``).

    The target axis is the gold target followed by ``<eos>`` (what the decoder predicts at
    each step); the source axis is the source tokens.
    """
    if not indices:
        return []
    src_vocab, tgt_vocab = dataset.src_field.vocab, dataset.tgt_field.vocab
    batch, attention = _teacher_forced(model, dataset, indices, device, alignment=True)
    attention = attention.float().cpu()
    out = []
    for row, index in enumerate(_positions(batch)):
        src_ids, tgt_ids = dataset.src[index], dataset.tgt[index]
        matrix = attention[row, : len(tgt_ids) + 1, : len(src_ids)]
        out.append((matrix, src_vocab.tokens(src_ids), tgt_vocab.tokens(tgt_ids) + ["<eos>"]))
    return out


@torch.no_grad()
def attention_grids(model: nn.Module, dataset: ParallelDataset, indices: Sequence[int],
                    device: torch.device) -> list[tuple[Tensor, list[str], list[str]]]:
    """Teacher-forced cross-attention of every layer and head of a model with attention maps
    (the Transformer): ``(grid (layers, heads, T, L), src tokens, tgt tokens)`` per example, with
    the axes of :func:`attention_matrices`. [] for a model without ``attention_kinds``."""
    if not indices or not getattr(model, "attention_kinds", ()):
        return []
    src_vocab, tgt_vocab = dataset.src_field.vocab, dataset.tgt_field.vocab
    batch, (_, _, maps) = _teacher_forced(model, dataset, indices, device, return_maps=True)
    cross = torch.stack(maps["cross"], dim=1).float().cpu()  # (B, layers, heads, T, L)
    out = []
    for row, index in enumerate(_positions(batch)):
        src_ids, tgt_ids = dataset.src[index], dataset.tgt[index]
        grid = cross[row, :, :, : len(tgt_ids) + 1, : len(src_ids)]
        out.append((grid, src_vocab.tokens(src_ids), tgt_vocab.tokens(tgt_ids) + ["<eos>"]))
    return out


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block, restored to its previous mode after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _teacher_forced(model: nn.Module, dataset: ParallelDataset, indices: Sequence[int], device: torch.device,
                    alignment: bool = False, **kwargs: Any) -> tuple[Any, Any]:
    """``(batch, model(src, src_lengths, tgt_in, **kwargs))`` for the given examples, in eval mode;
    with ``alignment`` ``model.teacher_forced_alignment(src, src_lengths, tgt_in)`` instead."""
    tgt_vocab = dataset.tgt_field.vocab
    with eval_mode(model):
        batch = collate(dataset, list(indices), tgt_vocab.pad_index, tgt_vocab.bos_index,
                        tgt_vocab.eos_index).to(device)
        if alignment:
            return batch, model.teacher_forced_alignment(batch.src, batch.src_lengths, batch.tgt_in)
        return batch, model(batch.src, batch.src_lengths, batch.tgt_in, **kwargs)


def _positions(batch) -> list[int]:
    """Dataset positions of the batch rows, in row order."""
    indices = batch.indices
    return indices.tolist() if isinstance(indices, Tensor) else list(indices)


__all__ = ["SEARCH_KEYS", "StatisticsFn", "ValidationResult", "batch_statistics", "search_description", "validate",
           "validation_search", "teacher_forced_statistics", "decode_dataset", "attention_matrices",
           "attention_grids", "eval_mode"]
