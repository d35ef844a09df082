"""Decoding at ``-precision int8``: the certificate is about the int8 model, and holds.

* Brute force: a float32 Transformer (nmt.models.transformer, sparse output) whose products run in
  int8 (an int8 region, as the translator opens it). Its whole output space is enumerated under
  the same int8 products (each row quantized alone, so the enumeration's batches of one compute
  what the search's batches compute); every certified sentence's hypotheses are exactly that
  support and its first is the argmax, in both search loops; the int8 model's scores really
  differ from the float32 model's (the path is taken), and certificates still occur.
* Search and scoring agree: teacher-forced scoring at int8 gives the search's scores (a per-batch
  activation scale would break this).
* CLI: ``-precision int8`` translates and scores, names the precision in the summary and in every
  report record, and ``-device auto`` means the CPU with it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from nmt.translate.beam_search import beam_search
from nmt.translate.scoring import score_batch
from nmt.utils.int8_linear import int8_products
from nmt.utils.packed_linear import frozen_weights
from test_certificate_bruteforce import found_hypotheses, predicted_certificate
from tiny_runs import translate_main
from toy_decoders import BOS, EOS, PAD, enumerate_support, random_sources, tiny_transformer

MAX_LENGTH = 6
MODES = [dict(mode="dynamic"), dict(mode="static", stop_every=3)]


@pytest.fixture(scope="module")
def model_and_support():
    """A float32 tiny Transformer, its sources, and each source's support under int8 and float32."""
    torch.manual_seed(0)
    model = tiny_transformer(output="entmax15", attention="entmax15", eos_bias=1.5, seed=1, dtype=torch.float32,
                             output_scale=4.0)
    src, lengths = random_sources(8, 9, 5, seed=3)
    with torch.no_grad(), frozen_weights():
        plain = [enumerate_support(model, src[b], lengths[b], MAX_LENGTH) for b in range(len(src))]
        with int8_products():
            quantized = [enumerate_support(model, src[b], lengths[b], MAX_LENGTH) for b in range(len(src))]
    return model, src, lengths, quantized, plain


def test_the_int8_model_differs_from_the_float32_one(model_and_support):
    _, _, _, quantized, plain = model_and_support
    shared = [(s, q[0][s], p[0][s]) for q, p in zip(quantized, plain) for s in q[0] if s in p[0]]
    assert shared and max(abs(a - b) for _, a, b in shared) > 1e-4


@pytest.mark.parametrize("mode", MODES, ids=["dynamic", "static"])
def test_certificates_hold_for_the_int8_model_by_brute_force(model_and_support, mode):
    model, src, lengths, quantized, _ = model_and_support
    certified = 0
    for beam_size in (2, 4, 8):
        with torch.no_grad(), frozen_weights(), int8_products():
            result = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, beam_size=beam_size, n_best=50,
                                 max_length=MAX_LENGTH, **mode)
        for b in range(len(src)):
            support, frontier, cut = quantized[b]
            exact, _ = predicted_certificate(frontier, cut, beam_size, support, MAX_LENGTH)
            assert bool(result.exact[b]) == exact
            found = found_hypotheses(result, b)
            for seq, logprob in found.items():
                assert seq in support and logprob == pytest.approx(support[seq], abs=1e-4)
            if exact:
                certified += 1
                assert set(found) == set(support)
                best = max(support.values())
                first = tuple(result.tokens[b, 0, : int(result.lengths[b, 0])].tolist())
                assert support[first] == pytest.approx(best, abs=1e-4)
    assert certified >= 6


def test_scoring_at_int8_gives_the_search_scores(model_and_support):
    model, src, lengths, _, _ = model_and_support
    with torch.no_grad(), frozen_weights(), int8_products():
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, beam_size=4, n_best=4,
                             max_length=MAX_LENGTH)
        complete = [(b, i) for b in range(len(src)) for i in range(result.tokens.size(1)) if result.complete[b, i]]
        tgt_out = torch.stack([result.tokens[b, i] for b, i in complete])
        tgt_in = torch.cat([torch.full((len(complete), 1), BOS), tgt_out[:, :-1]], 1).masked_fill(tgt_out == PAD, PAD)
        tgt_lengths = torch.stack([result.lengths[b, i] for b, i in complete])
        rows = torch.tensor([b for b, _ in complete])
        scored = score_batch(model, src[rows], lengths[rows], tgt_in, tgt_out, tgt_lengths)
    want = torch.stack([result.scores[b, i] for b, i in complete])
    assert len(complete) >= 10 and torch.allclose(scored.total.to(want.dtype), want, atol=1e-4, rtol=0)


def test_cli_translates_and_scores_at_int8(checkpoint, tmp_path, capsys):
    src = tmp_path / "src.txt"
    src.write_text("a b c\nb c\nc a\n", encoding="utf-8")
    outputs, lines = {}, {}
    for precision in ("fp32", "int8"):
        report = tmp_path / f"{precision}.jsonl"
        code, out, err = translate_main(["-model", checkpoint, "-src", str(src), "-output", "-", "-beam_size", "3",
                                         "-precision", precision, "-report", str(report)], capsys)
        assert code == 0, err
        outputs[precision] = out.splitlines()
        lines[precision] = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
        summary = [line for line in err.splitlines() if "sentences/s" in line][0]
        assert summary.endswith("; precision int8") == (precision == "int8")
    assert len(outputs["int8"]) == 3
    assert all(r["decoding"]["precision"] == "int8" for r in lines["int8"])
    assert all("precision" not in r.get("decoding", {}) for r in lines["fp32"])
    # scoring the int8 search's outputs at int8 gives its scores (each row quantized alone)
    tgt = tmp_path / "hyp.txt"
    tgt.write_text("".join(r["nbest"][0]["text"] + "\n" for r in lines["int8"]), encoding="utf-8")
    code, out, err = translate_main(["-model", checkpoint, "-src", str(src), "-tgt", str(tgt), "-mode", "score",
                                     "-precision", "int8", "-output", "-"], capsys)
    assert code == 0, err
    scores = [json.loads(line)["logprob"] for line in out.splitlines()]
    assert len(scores) == 3
    for got, record in zip(scores, lines["int8"]):
        assert math.isclose(got, record["nbest"][0]["logprob"], abs_tol=1e-4)
    assert "precision int8" in err


def test_int8_on_a_gpu_is_one_line(checkpoint, tmp_path, capsys):
    from nmt.api import load

    with pytest.raises(ValueError, match="precision int8 runs on the CPU only"):
        from nmt.utils.precision import check_inference_device

        check_inference_device("int8", "cuda")
    model = load(checkpoint, device="auto", precision="int8")  # auto: the CPU with int8
    assert model.device == "cpu" and model.translate(["a b c"])[0] is not None


def test_an_ensemble_of_one_model_twice_at_int8_equals_that_model(checkpoint, tmp_path, capsys):
    """``-model a.pt a.pt -precision int8``: both members' products run in int8 (one region for the
    run), and the mean of two equal distributions is that distribution, so the outputs, their scores
    and the certificates equal the single int8 model's."""
    src = tmp_path / "src.txt"
    src.write_text("a b c\nb c\nc a\na\n", encoding="utf-8")
    records = {}
    for name, models in (("one", [checkpoint]), ("two", [checkpoint, checkpoint])):
        report = tmp_path / f"{name}.jsonl"
        code, out, err = translate_main(["-model", *models, "-src", str(src), "-output", "-", "-beam_size", "3",
                                         "-precision", "int8", "-report", str(report)], capsys)
        assert code == 0, err
        assert "precision int8" in err
        records[name] = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert len(records["one"]) == 4
    for a, b in zip(records["one"], records["two"]):
        assert [h["text"] for h in a["nbest"]] == [h["text"] for h in b["nbest"]]
        assert a["exact"] == b["exact"] and b["decoding"]["precision"] == "int8"
        for x, y in zip(a["nbest"], b["nbest"]):
            assert math.isclose(x["logprob"], y["logprob"], rel_tol=1e-6, abs_tol=1e-6)
