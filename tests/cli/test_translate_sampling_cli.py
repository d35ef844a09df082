"""``nmt-translate -sample`` end to end on a train-free checkpoint (random weights, 1.5-entmax output).

The specials' output biases are very negative, so 1.5-entmax gives them probability exactly 0 and
no sample ever holds one: every sampled text tokenizes back to its own ids, and the
``-with_score`` of a sample equals what ``-score_output`` (teacher forcing) gives that text.
"""
from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from nmt.data.field import Field
from nmt.data.tokenizers import CharTokenizer, SpaceTokenizer
from nmt.models import build_model
from nmt.utils.checkpoint_file import save_checkpoint
from tiny_runs import translate_main as translate

MODEL = {
    "type": "rnn",
    "embeddings": {"src_size": 8, "tgt_size": 8, "share": False, "tie_output": False, "dropout": 0.0},
    "encoder": {"type": "lstm", "layers": 1, "hidden_size": 12, "bidirectional": True, "dropout": 0.0},
    "decoder": {"type": "lstm", "layers": 1, "hidden_size": 12, "dropout": 0.0, "input_feeding": True,
                "bridge": "linear"},
    "attention": {"score": "general", "mapping": "entmax15", "params": {}, "continuous": None},
    "output": {"mapping": "entmax15", "params": {}},
}
INPUTS = ["a b c", "d e", "", "f a b d", "c", "e e f a", "b d"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sampling_cli")
    src = Field.build(SpaceTokenizer(), ["a b c d e f"])
    tgt = Field.build(CharTokenizer(), ["abcdef"])
    torch.manual_seed(0)
    model = build_model(MODEL, len(src.vocab), len(tgt.vocab), tgt.vocab.pad_index)
    with torch.no_grad():
        model.generator.proj.weight.mul_(3.0)
        for special in (tgt.vocab.pad_index, tgt.vocab.bos_index, tgt.vocab.unk_index):
            model.generator.proj.bias[special] = -100.0
        model.generator.proj.bias[tgt.vocab.eos_index] += 0.5  # samples end
    payload = {"kind": "model", "model": model.state_dict(), "config": {"model": MODEL},
               "src_field": src.state_dict(), "tgt_field": tgt.state_dict(), "step": 1}
    save_checkpoint(root / "model.pt", payload)
    (root / "input.txt").write_text("".join(line + "\n" for line in INPUTS), encoding="utf-8")
    return {"root": root, "model": str(root / "model.pt"), "input": str(root / "input.txt")}


def test_samples_scores_report_and_summary(files, capsys, tmp_path):
    report = tmp_path / "report.jsonl"
    base = ["-model", files["model"], "-src", files["input"], "-output", "-", "-sample", "-n_best", "3",
            "-seed", "7", "-max_length", "12", "-with_score"]
    code, out, err = translate(base + ["-report", str(report)], capsys)
    assert code == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == 3 * len(INPUTS)
    assert lines[6:9] == ["\t"] * 3  # the empty input line: three padding lines
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert [r["reason"] for r in records] == ["sampled", "sampled", "empty_input", "sampled", "sampled", "sampled",
                                              "sampled"]
    assert not any(r["certified"] for r in records)
    for i, r in enumerate(records):
        if r["reason"] == "sampled":
            assert [h["text"] for h in r["nbest"]] == [line.split("\t")[0] for line in lines[3 * i: 3 * i + 3]]
            for h, line in zip(r["nbest"], lines[3 * i: 3 * i + 3]):
                assert float(line.split("\t")[1]) == pytest.approx(h["logprob"], rel=1e-5)
    assert "sampled, not certified" in err and "certified 0" not in err
    texts = [line.split("\t")[0] for line in lines]
    import nmt  # the Python API draws the same samples

    api = nmt.load(files["model"], device="cpu").translate(INPUTS, sample=True, n_best=3, seed=7, max_length=12)
    assert [text for t in api for text, _ in t.hypotheses or [("", 0.0)] * 3] == texts
    assert len(set(texts)) > 10  # samples, not one translation repeated

    # the same samples for any batching, again; other ones for another seed
    for flags in (["-batch_size", "1"], ["-batch_size", "2"], ["-batch_type", "tokens", "-batch_size", "5"]):
        code, again, err = translate(base + flags, capsys)
        assert code == 0 and again == out, (flags, err)
    code, other, _ = translate([("8" if a == "7" else a) for a in base], capsys)
    assert code == 0 and other != out

    # the score of each sample is the model's log-probability of its text (scoring, teacher forcing)
    sources = tmp_path / "src3.txt"
    targets = tmp_path / "tgt3.txt"
    pairs = [(INPUTS[i // 3], texts[i]) for i in range(len(texts)) if INPUTS[i // 3]]
    sources.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    targets.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    code, _, err = translate(["-model", files["model"], "-src", str(sources), "-tgt", str(targets),
                              "-score_output", str(tmp_path / "scores.jsonl")], capsys)
    assert code == 0, err
    scored = [json.loads(line)["logprob"] for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    sampled = [float(line.split("\t")[1]) for i, line in enumerate(lines) if INPUTS[i // 3]]
    assert scored == pytest.approx(sampled, abs=1e-4)


def test_streaming_samples_equal_the_file_samples(files, capsys, monkeypatch):
    args = ["-model", files["model"], "-output", "-", "-sample", "-n_best", "2", "-seed", "3", "-batch_size", "2"]
    code, from_file, err = translate(args + ["-src", files["input"]], capsys)
    assert code == 0, err
    with open(files["input"], "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        code, streamed, err = translate(args + ["-src", "-"], capsys)
    assert code == 0 and streamed == from_file, err


@pytest.mark.parametrize("flags,expected", [
    (["-sample", "-beam_size", "5"], "-beam_size 5 does not apply to -sample, which draws -n_best independent samples"),
    (["-temperature", "0.5"], "-temperature 0.5 applies to -sample only (add -sample to draw samples; "),
    (["-sample_topk", "3"], "-sample_topk 3 applies to -sample only (add -sample"),
    (["-sample_topp", "0.9"], "-sample_topp 0.9 applies to -sample only (add -sample"),
    (["-seed", "3"], "-seed applies to -sample only"),
    (["-sample", "-temperature", "0"], "-temperature must be a finite number > 0 (sampling at temperature 0 would be "
                                       "greedy decoding: "),
    (["-sample", "-sample_topp", "1.5"], "-sample_topp must be in (0, 1], got 1.5"),
    (["-sample", "-sample_topp", "0"], "-sample_topp must be in (0, 1], got 0.0"),
    (["-sample", "-length_penalty", "gnmt"], "-length_penalty gnmt does not apply to -sample (samples are drawn, "
                                             "not ranked); leave it out"),
    (["-sample", "-score_output", "s.jsonl", "-tgt", "t.txt"], "-sample applies to translation, not to scoring"),
])
def test_sampling_flags_that_do_not_fit_are_one_line_errors(files, capsys, tmp_path, flags, expected):
    out = tmp_path / "out.txt"
    code, _, err = translate(["-model", files["model"], "-src", files["input"], "-output", str(out), *flags], capsys)
    assert code == 2 and err.startswith(f"nmt-translate: error: {expected}") and err.count("\n") == 1, err
    assert not out.exists()


def test_sample_with_beam_size_one_is_accepted(files, capsys):
    code, out, err = translate(["-model", files["model"], "-src", files["input"], "-output", "-", "-sample",
                                "-beam_size", "1", "-quiet"], capsys)
    assert code == 0 and len(out.split("\n")[:-1]) == len(INPUTS), err


# ---- a sample without a hypothesis keeps its line; the report records the decoding settings ----------

class TransitionModel(torch.nn.Module):
    """Next-token probabilities a table of the previous token, for the target field of characters
    ``abc`` (pad 0, unk 1, bos 2, eos 3, a 4, b 5, c 6): after BOS ``a`` or ``b`` (1/2 each), after
    ``a`` only EOS, after ``b`` ``c`` or EOS, after ``c`` only EOS. With ``-min_length 2`` a sample that
    starts with ``a`` has no token of nonzero probability at its second step: no hypothesis; one that
    starts with ``b`` is ``bc`` with log-probability log(1/4)."""

    def __init__(self) -> None:
        super().__init__()
        table = torch.zeros(7, 7, dtype=torch.float64)
        table[:, 3] = 1.0
        table[2] = 0.0
        table[2, 4] = table[2, 5] = 0.5
        table[5] = 0.0
        table[5, 6] = table[5, 3] = 0.5
        self.register_buffer("log_table", torch.log(table))

    def encode(self, src, src_lengths):
        return {"src": src}, {"steps": torch.zeros(src.size(0), dtype=torch.long)}

    def step(self, tokens, state, encoder_out):
        width = encoder_out["src"].size(1)
        attention = torch.full((tokens.size(0), width), 1.0 / width, dtype=torch.float64)
        return self.log_table[tokens], attention, {"steps": state["steps"] + 1}


@pytest.fixture()
def table_model(monkeypatch):
    """``nmt-translate -model anything`` loads the :class:`TransitionModel` with its fields."""
    from nmt.translate import loading

    src = Field.build(SpaceTokenizer(), ["a b c d e f"])
    tgt = Field.build(CharTokenizer(), ["abc"])
    assert len(tgt.vocab) == 7 and (tgt.vocab.bos_index, tgt.vocab.eos_index) == (2, 3)
    model = TransitionModel()
    monkeypatch.setattr(loading, "load_models", lambda paths, device="cpu": (model, src, tgt, [model]))
    return model, src, tgt


def test_a_sample_without_hypothesis_keeps_its_line(files, table_model, capsys, tmp_path):
    from nmt.translate.sampling import sample_search
    from nmt.translate.search_options import SearchOptions
    from nmt.translate.search_step import Specials

    model, src_field, _ = table_model
    report = tmp_path / "report.jsonl"
    common = ["-model", "table.pt", "-src", files["input"], "-output", "-", "-sample", "-seed", "21",
              "-min_length", "2", "-max_length", "6", "-with_score", "-batch_size", "2", "-quiet"]
    code, out, err = translate(common + ["-n_best", "4", "-report", str(report)], capsys)
    assert code == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == 4 * len(INPUTS)
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    # the truth: sample j of line k is row (k, j) of the raw search keyed by the line's index
    shifted = 0
    for k, line in enumerate(INPUTS):
        block = lines[4 * k: 4 * k + 4]
        if not line:
            assert block == ["\t"] * 4 and records[k]["reason"] == "empty_input"
            continue
        ids = src_field.encode(line)
        raw = sample_search(model, torch.tensor([ids]), torch.tensor([len(ids)]), Specials(2, 3, 0),
                            SearchOptions(sample=True, n_best=4, seed=21, min_length=2, max_length=6),
                            sentence_ids=torch.tensor([k]))
        for j in range(4):
            if int(raw.lengths[0, j]) == 0:
                assert block[j] == "\t" and records[k]["nbest"][j] == {"text": "", "logprob": None, "cut": False,
                                                                       "missing": True}
                shifted += j < 3 and int(raw.lengths[0, j + 1:].max()) > 0  # a found sample after a missing one
            else:
                assert block[j] == f"bc\t{math.log(0.25):.6g}"
                assert records[k]["nbest"][j] == {"text": "bc", "logprob": pytest.approx(math.log(0.25)), "cut": False}
    assert shifted, "no missing sample before a found one: the test does not bite"
    # sample j does not depend on -n_best: the first two lines of each block are the -n_best 2 lines
    code, two, err = translate(common + ["-n_best", "2"], capsys)
    assert code == 0, err
    two_lines = two.split("\n")[:-1]
    assert two_lines == [line for k in range(len(INPUTS)) for line in lines[4 * k: 4 * k + 2]]


def test_the_summary_counts_the_outputs_without_a_hypothesis(files, table_model, capsys, monkeypatch):
    """The stderr summary says how many output lines are empty for want of a hypothesis, recounted
    here from the output itself: samples (each starts with ``a`` with probability 1/2, and then has
    no token under ``-min_length 2``), and searched sentences (under ``-min_length 3`` the table
    model's outputs of nonzero probability, ``a``, ``b`` and ``bc``, are all too short: none is
    left for any non-empty line), in file and streaming mode alike."""
    n_inputs = sum(1 for line in INPUTS if line)
    common = ["-model", "table.pt", "-src", files["input"], "-output", "-", "-batch_size", "2"]
    code, out, err = translate(common + ["-sample", "-n_best", "4", "-seed", "5", "-min_length", "2"], capsys)
    assert code == 0, err
    lines = out.split("\n")[:-1]
    missing = sum(1 for k, line in enumerate(INPUTS) if line for sample in lines[4 * k: 4 * k + 4] if sample == "")
    assert 0 < missing < 4 * n_inputs  # both kinds among 24 samples: the count is not trivially all or none
    assert f"; {missing} of {4 * n_inputs} samples without a hypothesis (no token of nonzero probability at " \
           "some step; empty lines)" in err, err
    code, out, err = translate(common + ["-beam_size", "3", "-min_length", "3", "-n_best", "2"], capsys)
    assert code == 0, err
    assert out == "\n" * (2 * len(INPUTS))
    assert f"; {n_inputs} sentences without a hypothesis (no output of nonzero probability; empty lines)" in err, err
    with open(files["input"], "rb") as stdin:  # streaming keeps counts, not translations
        monkeypatch.setattr(sys, "stdin", stdin)
        code, _, streamed = translate(common[:2] + ["-src", "-", "-output", "-", "-beam_size", "3",
                                                    "-min_length", "3"], capsys)
    assert code == 0 and f"; {n_inputs} sentences without a hypothesis" in streamed, streamed
    code, _, err = translate(common + ["-beam_size", "3"], capsys)
    assert code == 0 and "without a hypothesis" not in err, err


def test_the_report_records_the_decoding_settings(files, capsys, tmp_path, monkeypatch):
    """Each record carries ``decoding`` where -sample or -block_ngram_repeat changes what it means,
    and none otherwise (the records of plain beam search unchanged); the recipes' report reader
    still reads them, and a stream writes the file mode's records."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "recipes" / "translation" / "evaluate.py"
    spec = importlib.util.spec_from_file_location("evaluate_translation_report", path)
    evaluate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evaluate)
    certificate_stats, read_report = evaluate.certificate_stats, evaluate.read_report

    def records_of(flags: list[str], src: str = files["input"]) -> list[dict]:
        report = tmp_path / "r.jsonl"
        code, _, err = translate(["-model", files["model"], "-src", src, "-output", "-", "-quiet",
                                  "-report", str(report), *flags], capsys)
        assert code == 0, err
        return [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]

    sampled = records_of(["-sample", "-n_best", "2", "-seed", str(2 ** 40 + 3), "-temperature", "0.8",
                          "-sample_topp", "0.9", "-block_ngram_repeat", "2"])
    want = {"sample": True, "seed": 2 ** 40 + 3, "temperature": 0.8, "sample_topk": 0, "sample_topp": 0.9,
            "block_ngram_repeat": 2}
    assert [r["decoding"] for r in sampled] == [want] * len(INPUTS)  # empty lines too: the same run
    blocked = records_of(["-beam_size", "3", "-block_ngram_repeat", "1"])
    assert [r["decoding"] for r in blocked] == [{"block_ngram_repeat": 1}] * len(INPUTS)
    plain = records_of(["-beam_size", "3"])
    assert not any("decoding" in r for r in plain)
    assert set(blocked[0]) - set(plain[0]) == {"decoding"}
    report = tmp_path / "r.jsonl"
    records_of(["-beam_size", "3", "-block_ngram_repeat", "1"])
    assert [r["id"] for r in read_report(report)] == list(range(len(INPUTS)))  # the recipes' reader
    assert certificate_stats(read_report(report))["sentences"] == len(INPUTS) - 1
    with open(files["input"], "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        streamed = records_of(["-sample", "-n_best", "2", "-seed", str(2 ** 40 + 3), "-temperature", "0.8",
                               "-sample_topp", "0.9", "-block_ngram_repeat", "2"], src="-")
    assert streamed == sampled


def test_search_mode_dynamic_samples_as_static(files, capsys):
    base = ["-model", files["model"], "-src", files["input"], "-output", "-", "-sample", "-n_best", "3",
            "-seed", "5", "-with_score", "-quiet", "-block_ngram_repeat", "2"]
    outputs = {}
    for mode in ("dynamic", "static", "auto"):
        code, outputs[mode], err = translate(base + ["-search_mode", mode], capsys)
        assert code == 0, err
    assert outputs["dynamic"] == outputs["static"] == outputs["auto"]
