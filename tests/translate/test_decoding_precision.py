"""Decoding and scoring in "fp32" run in IEEE float32: no TF32 products on a GPU.

torch lets cuDNN's LSTM use TF32 for float32 by default (``torch.backends.cudnn.rnn.fp32_precision
== "tf32"``); on an H200 that put sentence scores up to 7e-3 from the CPU's and changed 1-2
hypotheses in 1,000. The settings are global and act on CUDA only, so the CPU checks what the
search and the scorer run under, and that the settings come back after."""
from __future__ import annotations

import pytest
import torch

from nmt.utils.precision import ieee_float32, inference_precision
from toy_decoders import MarkovDecoder

BACKENDS = (torch.backends.cudnn.rnn, torch.backends.cuda.matmul)


def settings() -> tuple:
    return tuple(b.fp32_precision for b in BACKENDS)


@pytest.fixture(autouse=True)
def _tf32_as_torch_sets_it():
    """Start from torch's GPU default (cuDNN's RNNs in TF32) and from TF32 matrix products, as a
    user's ``torch.set_float32_matmul_precision("high")`` makes them; restore what was there."""
    before, legacy = settings(), torch.get_float32_matmul_precision()
    cpu_before = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.cudnn.rnn.fp32_precision = "tf32"
    torch.set_float32_matmul_precision("high")  # the legacy setting and matmul.fp32_precision = "tf32"
    yield
    torch.set_float32_matmul_precision(legacy)
    torch.backends.mkldnn.matmul.fp32_precision = cpu_before
    for b, value in zip(BACKENDS, before):
        b.fp32_precision = value


def test_cublas_sees_one_setting_inside_after_set_float32_matmul_precision_high():
    """torch checks at each CUDA float32 matrix product (``Context::allowTF32CuBLAS``, which this
    getter calls) that the legacy setting agrees with ``matmul.fp32_precision``; "ieee" alone
    after the user's "high" made every product of a GPU decoding raise ("mix of the legacy and
    new APIs"). The check runs on the CPU too."""
    assert torch._C._get_cublas_allow_tf32() is True
    cpu = torch.backends.mkldnn.matmul.fp32_precision  # set by "high" too
    with ieee_float32():
        assert torch._C._get_cublas_allow_tf32() is False
        assert torch.get_float32_matmul_precision() == "highest"  # no mixed state: torch's own check passes
    assert torch._C._get_cublas_allow_tf32() is True and torch.backends.mkldnn.matmul.fp32_precision == cpu
    assert torch.get_float32_matmul_precision() == "high" and settings() == ("tf32", "tf32")


def test_ieee_float32_inside_and_the_settings_back_after_even_on_an_error():
    with ieee_float32():
        assert settings() == ("ieee", "ieee")
        with ieee_float32():  # nested: the outer one's settings come back
            assert settings() == ("ieee", "ieee")
        assert settings() == ("ieee", "ieee")
    assert settings() == ("tf32", "tf32")
    with pytest.raises(KeyError):
        with ieee_float32():
            raise KeyError("x")
    assert settings() == ("tf32", "tf32")


def test_half_precisions_autocast_and_leave_the_float32_settings():
    with inference_precision("cpu", "bf16"):
        assert torch.is_autocast_enabled("cpu") and settings() == ("tf32", "tf32")
    with inference_precision("cpu", "fp32"):
        assert not torch.is_autocast_enabled("cpu") and settings() == ("ieee", "ieee")
    assert settings() == ("tf32", "tf32")


def test_translator_and_scorer_run_the_model_in_ieee_float32():
    """The model's steps, in a search and in teacher-forced scoring, see the IEEE settings (fp32)
    and the autocast ones (bf16); afterwards the user's settings are back."""
    from nmt.data.field import Field
    from nmt.data.tokenizers import CharTokenizer, SpaceTokenizer
    from nmt.data.vocabulary import Vocabulary
    from nmt.translate.scorer import Scorer
    from nmt.translate.translator import Translator

    seen: list = []

    class Recording(MarkovDecoder):
        def step(self, *args, **kwargs):
            seen.append((settings(), torch.is_autocast_enabled("cpu")))
            return super().step(*args, **kwargs)

    model = Recording(vocab=7, mapping="softmax", seed=0)
    src_field = Field(SpaceTokenizer(), Vocabulary(["x", "y"]))
    tgt_field = Field(CharTokenizer(), Vocabulary(["a", "b"]))
    for precision, expected in (("fp32", (("ieee", "ieee"), False)), ("bf16", (("tf32", "tf32"), True))):
        seen.clear()
        Translator(model, src_field, tgt_field, beam_size=2, max_length=4, precision=precision).translate(["x y"])
        Scorer(model, src_field, tgt_field, precision=precision).score(["x y"], ["ab"])
        assert len(seen) >= 2 and set(seen) == {expected}, (precision, seen)
        assert settings() == ("tf32", "tf32")


def test_validation_decodes_in_ieee_float32(monkeypatch):
    """Training's validation decodes as nmt-translate does (its BLEU is the checkpoint's), while
    its loss and training keep torch's default."""
    from nmt.data.dataset import ParallelDataset
    from nmt.data.field import Field
    from nmt.data.tokenizers import CharTokenizer, SpaceTokenizer
    from nmt.data.vocabulary import Vocabulary
    from nmt.train import validation
    from nmt.translate.search_options import SearchOptions

    seen: list = []
    real = validation.beam_search

    def recording(*args, **kwargs):
        seen.append(settings())
        return real(*args, **kwargs)

    monkeypatch.setattr(validation, "beam_search", recording)
    src_field = Field(SpaceTokenizer(), Vocabulary(["x", "y"]))
    tgt_field = Field(CharTokenizer(), Vocabulary(["a", "b"]))
    data = ParallelDataset([("x y", "ab"), ("y", "b")], src_field, tgt_field)
    model = MarkovDecoder(vocab=7, mapping="softmax", seed=0)
    hyps, _ = validation.decode_dataset(model, data, tgt_field, 2, SearchOptions(beam_size=2, max_length=4),
                                        torch.device("cpu"))
    assert len(hyps) == 2 and seen and set(seen) == {("ieee", "ieee")}
    assert settings() == ("tf32", "tf32")
