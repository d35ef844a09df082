"""Decoding: batched beam search with certificates, scoring of given targets, ensembles,
file translation.

    from nmt.translate import beam_search, load_models, SearchOptions, Translator, Scorer
"""
from nmt.translate.alignment import AlignOptions
from nmt.translate.beam_search import SearchResult, beam_search, greedy_search
from nmt.translate.certificate import REASONS, reason_name
from nmt.translate.constraint_automaton import CONSTRAINT_MODES, batch_tables, build_automaton
from nmt.translate.coverage_penalty import COVERAGE_PENALTIES, coverage_penalty
from nmt.translate.ensemble import Ensemble
from nmt.translate.length_penalty import LENGTH_PENALTIES, length_penalty
from nmt.translate.loading import LoadedModel, load_model, load_models, resolve_device
from nmt.translate.scorer import PairScore, Scorer, ScoreSummary
from nmt.translate.scoring import BatchScores, score_batch
from nmt.translate.search_options import SearchOptions
from nmt.translate.translator import Certificate, Hypothesis, Translation, TranslationSummary, Translator

__all__ = [
    "AlignOptions",
    "BatchScores",
    "CONSTRAINT_MODES",
    "COVERAGE_PENALTIES",
    "Certificate",
    "Ensemble",
    "Hypothesis",
    "LENGTH_PENALTIES",
    "LoadedModel",
    "PairScore",
    "REASONS",
    "ScoreSummary",
    "Scorer",
    "SearchOptions",
    "SearchResult",
    "Translation",
    "TranslationSummary",
    "Translator",
    "batch_tables",
    "beam_search",
    "build_automaton",
    "coverage_penalty",
    "greedy_search",
    "length_penalty",
    "load_model",
    "load_models",
    "reason_name",
    "resolve_device",
    "score_batch",
]
