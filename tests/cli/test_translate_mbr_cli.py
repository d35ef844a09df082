"""``nmt-translate -mbr`` end to end on a tiny model trained by nmt-train (letter reversal, entmax15
output, 300 steps: some sentences certified, others with several outputs of nonzero probability pruned): the outputs and the
report against a recomputation with sacrebleu from the candidates the report lists, the exact
decisions against the whole support a plain certified search enumerates, sampling MBR against the
plain samples, the stream mode and the Python API against the file mode, and the errors."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import sacrebleu

import nmt
from nmt.translate.mbr import MASS_TOLERANCE
from tiny_runs import tiny_rnn_config, train_run, translate_main as translate, write_reversal

COMMON = ["-beam_size", "5", "-max_length", "8", "-quiet"]


def chrf(h: str, r: str) -> float:
    return sacrebleu.sentence_chrf(h, [r]).score / 100.0


def expected_of(entries: list[tuple[str, float]]) -> dict[str, float]:
    """Per candidate text, sum_r p(r) chrF(h, r) with p the candidates' probabilities renormalised."""
    total = math.fsum(math.exp(lp) for _, lp in entries)
    return {h: math.fsum(math.exp(lp) / total * chrf(h, r) for r, lp in entries) for h, _ in entries}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[str, object]:
    """(best.pt, the source file: the valid words and an empty line) of a tiny reversal model."""
    root = tmp_path_factory.mktemp("mbr")
    write_reversal(root, 120, 12)
    config = tiny_rnn_config(root, "space", "char", 300)
    train_run(config, root / "config.yaml")
    SOURCES[:] = (root / "valid.src").read_text(encoding="utf-8").splitlines()
    SOURCES.insert(2, "")  # an empty line stays aligned
    path = root / "src.txt"
    path.write_text("".join(line + "\n" for line in SOURCES), encoding="utf-8")
    return str(root / "run" / "best.pt"), path


SOURCES: list[str] = []  # the source lines, set by the fixture


@pytest.fixture
def checkpoint(trained) -> str:
    return trained[0]


@pytest.fixture
def source(trained):
    return trained[1]


def run(checkpoint, source, tmp_path, capsys, *flags, name="out"):
    out, report = tmp_path / f"{name}.txt", tmp_path / f"{name}.jsonl"
    code, _, err = translate(["-model", checkpoint, "-src", str(source), "-output", str(out), "-report", str(report),
                              *COMMON, *flags], capsys)
    assert code == 0, err
    return (out.read_text(encoding="utf-8").split("\n")[:-1],
            [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()])


def test_mbr_outputs_equal_a_recomputation_from_the_reported_candidates(checkpoint, source, tmp_path, capsys):
    lines, records = run(checkpoint, source, tmp_path, capsys, "-mbr", "chrf", "-n_best", "500")
    best, best_records = run(checkpoint, source, tmp_path, capsys, "-mbr", "chrf", name="best")
    plain, plain_records = run(checkpoint, source, tmp_path, capsys, "-n_best", "500", name="plain")
    several = exact = 0
    for i, (record, one, free) in enumerate(zip(records, best_records, plain_records)):
        if not SOURCES[i]:
            assert record["nbest"] == [] and best[i] == ""
            assert record["mbr"] == {"utility": "chrf", "expected": None, "exact": False, "candidates": 0}  # every record has one
            continue
        candidates = [(h["text"], h["logprob"]) for h in record["nbest"] if not h["cut"]]
        truth = expected_of(candidates)
        assert record["mbr"]["candidates"] == len(candidates)
        assert [h["expected_utility"] for h in record["nbest"] if not h["cut"]] == pytest.approx(
            [truth[h["text"]] for h in record["nbest"] if not h["cut"]], abs=1e-6)
        assert best[i] == one["nbest"][0]["text"] == record["nbest"][0]["text"]
        assert truth[best[i]] == pytest.approx(max(truth.values()), abs=1e-6)  # the argmax
        assert one["mbr"] == record["mbr"] and record["mbr"]["expected"] == pytest.approx(max(truth.values()),
                                                                                          abs=1e-6)
        several += len(candidates) > 1
        # exact: the plain search certified, so its n-best list is the whole support, and that is the candidates
        whole = free["certified"] and abs(free["mass"] - 1.0) <= MASS_TOLERANCE
        assert record["mbr"]["exact"] == whole
        if whole:
            exact += 1
            support = {h["text"]: h["logprob"] for h in free["nbest"]}
            assert {h: lp for h, lp in candidates} == pytest.approx(support, abs=1e-6)
            full = expected_of(list(support.items()))
            assert full[best[i]] == pytest.approx(max(full.values()), abs=1e-6)
    assert several >= 2 and exact >= 1 and exact < len(SOURCES) - 1


def test_mbr_over_samples_writes_one_line_per_sentence(checkpoint, source, tmp_path, capsys):
    flags = ["-sample", "-n_best", "6", "-seed", "3"]
    samples, _ = run(checkpoint, source, tmp_path, capsys, *flags, "-beam_size", "1", name="samples")
    lines, records = run(checkpoint, source, tmp_path, capsys, *flags, "-beam_size", "1", "-mbr", "chrf")
    assert len(lines) == len(SOURCES)  # one line per sentence: the MBR decision over its 6 samples
    for i, (line, record) in enumerate(zip(lines, records)):
        drawn = samples[6 * i: 6 * i + 6]
        if not SOURCES[i]:
            assert line == "" and record["mbr"] == {"utility": "chrf", "expected": None, "exact": False, "candidates": 0}
            continue
        kept = [h["text"] for h in record["nbest"] if not h["cut"] and not h.get("missing")]
        assert sorted(h["text"] for h in record["nbest"]) == sorted(drawn)  # the same samples, reordered
        expected = {h: math.fsum(chrf(h, r) for r in kept) / len(kept) for h in kept}
        assert line == max(kept, key=lambda h: (expected[h], -kept.index(h)))
        assert record["mbr"]["exact"] is False and record["mbr"]["expected"] == pytest.approx(expected[line])


def test_the_stream_and_the_api_give_the_file_mode_decisions(checkpoint, source, tmp_path, capsys):
    lines, records = run(checkpoint, source, tmp_path, capsys, "-mbr", "bleu", "-n_best", "2")
    streamed = subprocess.run([sys.executable, "-m", "nmt.cli.translate", "-model", checkpoint, "-src", "-",
                               "-output", "-", *COMMON, "-mbr", "bleu", "-n_best", "2", "-threads", "1"],
                              input="".join(line + "\n" for line in SOURCES), capture_output=True, text=True,
                              env=dict(os.environ), timeout=300)
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout.split("\n")[:-1] == lines
    model = nmt.load(checkpoint, device="cpu", beam_size=5, max_length=8)
    for t, record in zip(model.translate(SOURCES, mbr="bleu", n_best=2), records):
        assert [text for text, _ in t.hypotheses] == [h["text"] for h in record["nbest"]]
        if t.mbr is not None:
            assert t.expected_utility == pytest.approx(record["mbr"]["expected"])
            assert t.mbr.exact == record["mbr"]["exact"] and t.mbr.utility == "bleu"
            assert [h.expected_utility for h in t.nbest] == pytest.approx(
                [h["expected_utility"] for h in record["nbest"]])


@pytest.mark.parametrize("flags,message", [
    (["-mbr", "chrf", "-beam_size", "1"],
     "nmt-translate: error: -mbr chrf needs beam_size >= 2 (greedy search finds one candidate), got beam_size 1"),
    (["-mbr", "chrf", "-sample", "-n_best", "1"],
     "nmt-translate: error: -mbr chrf with sample=True needs n_best >= 2 samples"),
    (["-mbr", "exact_match", "-mode", "score", "-tgt", "SRC"],
     "nmt-translate: error: -mbr applies to translation, not to scoring (-mode score)"),
])
def test_bad_mbr_flags_are_one_line_errors(checkpoint, source, capsys, flags, message):
    flags = [str(source) if f == "SRC" else f for f in flags]
    code, _, err = translate(["-model", checkpoint, "-src", str(source), "-output", os.devnull, *flags], capsys)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1, err


def test_an_unknown_utility_names_the_valid_ones(checkpoint, source, capsys):
    with pytest.raises(SystemExit) as info:
        translate(["-model", checkpoint, "-src", str(source), "-mbr", "ter"], capsys)
    assert info.value.code == 2
    assert "argument -mbr/--mbr: invalid choice: 'ter' (choose from 'none', 'chrf', 'bleu', 'exact_match')" in \
        capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^mbr must be one of none, chrf, bleu, exact_match, got 'ter'$"):
        nmt.load(checkpoint, device="cpu").translate(["a"], mbr="ter")
