"""SearchOptions: one place for the search defaults (the CLI's too), checked fields, same search either way."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from nmt.cli import translate as translate_cli
from nmt.translate.beam_search import beam_search
from nmt.translate.search_options import SearchOptions
from nmt.translate.translator import Translator
from toy_decoders import BOS, EOS, PAD, TinyAttentionRNN, random_sources


def test_cli_defaults_are_the_dataclass_defaults():
    args = translate_cli.build_parser().parse_args(["-model", "m.pt", "-src", "in.txt"])
    assert translate_cli.search_options(args) == SearchOptions()
    for name in translate_cli.SEARCH_FLAGS:  # every search flag is a field of the same name
        assert getattr(args, name) == getattr(SearchOptions(), name), name


def test_cli_flags_reach_the_options():
    args = translate_cli.build_parser().parse_args(
        ["-model", "m.pt", "-src", "in.txt", "-beam_size", "3", "-n_best", "7", "-max_length", "9", "-min_length",
         "2", "-length_penalty", "gnmt", "-length_alpha", "1.5", "-support", "-support_topk", "4", "-no_certify",
         "-attention", "dir", "-search_mode", "static", "-stop_every", "2"])
    assert translate_cli.search_options(args) == SearchOptions(
        beam_size=3, n_best=7, max_length=9, min_length=2, length_penalty="gnmt", length_alpha=1.5,
        return_support=True, support_topk=4, certify=False, return_attention=True, mode="static", stop_every=2)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(beam_size=0), r"^beam_size must be >= 1, got 0$"),
        (dict(n_best=0), r"^n_best must be >= 1, got 0$"),
        (dict(support_topk=0), r"^support_topk must be >= 1"),
        (dict(max_length=-1), r"^max_length must be >= 0"),
        (dict(min_length=5, max_length=4), r"^min_length must be in \[0, max_length=4\], got 5$"),
        (dict(min_length=-1), r"^min_length must be in"),
        (dict(length_penalty="avg"), r"^length_penalty must be one of none, average, gnmt, got 'avg'$"),
        (dict(length_alpha=math.nan), r"^length_alpha must be a finite number >= 0, got nan$"),
        (dict(length_alpha=math.inf), r"^length_alpha must be a finite number"),
        (dict(length_alpha=-0.5), r"^length_alpha must be a finite number >= 0"),
        (dict(beam_size=2.0), r"^beam_size must be an integer, got 2.0$"),
        (dict(n_best=True), r"^n_best must be an integer"),
        (dict(certify="yes"), r"^certify must be True or False"),
    ],
)
def test_invalid_fields_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        SearchOptions(**fields)
    with pytest.raises(ValueError, match=message):  # overrides are checked the same way
        SearchOptions().updated(**fields)


def test_options_are_frozen_and_unknown_overrides_rejected():
    options = SearchOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beam_size = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="unknown search option.*beam"):
        options.updated(beam=3)
    model = TinyAttentionRNN()
    src, lengths = random_sources(2, 13, 4, seed=0)
    with pytest.raises(TypeError, match="beamsize"):
        beam_search(model, src, lengths, bos=BOS, eos=EOS, beamsize=3)


def test_cli_bad_search_flag_is_a_one_line_error_naming_the_flag(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    code = translate_cli.main(["-model", str(tmp_path / "m.pt"), "-src", str(src), "-beam_size", "0", "-quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err == "nmt-translate: error: -beam_size must be >= 1, got 0\n"


@pytest.mark.parametrize("certify", [True, False])
def test_options_object_equals_keyword_arguments(certify):
    model = TinyAttentionRNN(mapping="entmax15", seed=4)
    src, lengths = random_sources(4, 13, 6, seed=5)
    kwargs = dict(beam_size=3, n_best=4, max_length=7, min_length=1, length_penalty="gnmt", length_alpha=0.8,
                  certify=certify, return_support=True, support_topk=3, return_attention=True)
    by_keywords = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, **kwargs)
    by_options = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, options=SearchOptions(**kwargs))
    mixed = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD,
                        options=SearchOptions(**{**kwargs, "beam_size": 1, "n_best": 1}), beam_size=3, n_best=4)
    for result in (by_options, mixed):
        for field in dataclasses.fields(by_keywords):
            if not field.compare:  # the model's encoding of the batch, kept for a later pass
                continue
            a, b = getattr(by_keywords, field.name), getattr(result, field.name)
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, b), field.name
            else:
                assert a == b, field.name
    assert by_keywords.attention is not None and by_keywords.support_tokens is not None


def test_translator_takes_options_or_keywords():
    model = TinyAttentionRNN()
    options = SearchOptions(beam_size=2, n_best=2)
    assert Translator(model, None, None, options).options == options  # type: ignore[arg-type]
    assert Translator(model, None, None, beam_size=2, n_best=2).options == options  # type: ignore[arg-type]
    overridden = Translator(model, None, None, options, beam_size=4)  # type: ignore[arg-type]
    assert overridden.options == SearchOptions(beam_size=4, n_best=2)
    with pytest.raises(ValueError, match="^batch_size must be >= 1"):
        Translator(model, None, None, batch_size=0)  # type: ignore[arg-type]
