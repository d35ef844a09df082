"""Decoding: batched beam search with exactness certificates, ensembles, file translation.

    from nmt.translate import beam_search, load_models, SearchOptions, Translator
"""
from nmt.translate.beam_search import SearchResult, beam_search, greedy_search
from nmt.translate.certificate import REASONS, reason_name
from nmt.translate.ensemble import Ensemble
from nmt.translate.length_penalty import LENGTH_PENALTIES, length_penalty
from nmt.translate.loading import LoadedModel, load_model, load_models
from nmt.translate.search_options import SearchOptions
from nmt.translate.translator import Translation, TranslationSummary, Translator

__all__ = [
    "Ensemble",
    "LENGTH_PENALTIES",
    "LoadedModel",
    "REASONS",
    "SearchOptions",
    "SearchResult",
    "Translation",
    "TranslationSummary",
    "Translator",
    "beam_search",
    "greedy_search",
    "length_penalty",
    "load_model",
    "load_models",
    "reason_name",
]
