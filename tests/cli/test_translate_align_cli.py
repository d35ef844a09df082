"""``nmt-translate -report_align`` / ``-replace_unk`` end to end: train tiny models with the real
nmt-train, translate, and check the pairs and replaced words against independent recomputations
from the attention matrices the Python API returns (``return_attention=True``)."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

import nmt
from nmt.translate.alignment import parse_pharaoh
from tiny_runs import reversal_rnn_config, train_run, translate_main as run, write_reversal

COMMON = ["-threads", "1", "-max_length", "12", "-quiet"]


@pytest.fixture(scope="module")
def reversal(tmp_path_factory) -> dict:
    """'a b c' -> 'c b a' with a char target: words of the output are runs between spaces."""
    root = tmp_path_factory.mktemp("align_cli")
    write_reversal(root, 160, 8, spaced_target=True)
    model = str(train_run(reversal_rnn_config(root, "space", "char", 80), root / "config.yaml") / "best.pt")
    inputs = ["a b c", "d e", "", "f a b d", "c c e"]
    (root / "input.txt").write_text("".join(line + "\n" for line in inputs), encoding="utf-8")
    return {"root": root, "model": model, "inputs": inputs}


def char_words(text: str) -> list[int | None]:
    """The word of each character of ``text`` (the char tokenizer's pieces), None for spaces."""
    ids, word, inside = [], -1, False
    for c in text:
        if c == " ":
            ids.append(None)
            inside = False
        else:
            word += not inside
            inside = True
            ids.append(word)
    return ids


def expected_pairs(attention: np.ndarray, source: str, text: str, mode: str, level: str,
                   threshold: float = 0.0) -> list[tuple[int, int]]:
    """Pairs recomputed from the (T, L) attention of a hypothesis ``text`` (one row per character,
    then EOS) of a space-tokenized ``source`` (one column per word); "support": the columns above
    ``threshold``."""
    pairs = set()
    words = char_words(text)
    assert attention.shape[1] == len(source.split())
    for j in range(len(text)):
        row = attention[j]
        cols = [int(np.argmax(row))] if mode == "argmax" else [int(i) for i in np.flatnonzero(row > threshold)]
        for i in cols:
            if level == "token":
                pairs.add((i, j))
            elif words[j] is not None:
                pairs.add((i, words[j]))
    return sorted(pairs)


@pytest.mark.parametrize("mode", ["argmax", "support"])
@pytest.mark.parametrize("level", ["word", "token"])
def test_report_align_pairs_are_the_attentions(reversal, mode, level, capsys, tmp_path):
    root, inputs = reversal["root"], reversal["inputs"]
    report = tmp_path / "report.jsonl"
    args = ["-model", reversal["model"], "-src", str(root / "input.txt"), "-output", "-", "-report_align",
            "-align_mode", mode, "-align_level", level, "-report", str(report), "-beam_size", "3", *COMMON]
    code, out, err = run(args, capsys)
    assert code == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == len(inputs) and lines[2] == " ||| "  # an empty input: no text, no pair
    m = nmt.load(reversal["model"], device="cpu", beam_size=3, max_length=12)
    api = m.translate(inputs, return_attention=True)
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    settings = {"align_mode": mode, "align_level": level, **({"align_threshold": 0.0} if mode == "support" else {})}
    assert [r["decoding"] for r in records] == [settings] * len(inputs)  # the empty input's too
    some_sparse = False
    for source, line, t, record in zip(inputs, lines, api, records):
        text, pairs = line.split(" ||| ")
        assert text == t.text
        if not source:
            assert pairs == "" and record["nbest"] == []
            continue
        assert len(t.tokens[0]) == len(text) + 1  # a character per step, then EOS
        assert parse_pharaoh(pairs) == expected_pairs(t.attention, source, text, mode, level)
        assert record["nbest"][0]["alignment"] == pairs
        some_sparse |= bool((t.attention[: len(text)] == 0).any())
    assert some_sparse  # sparsemax attention: the support mode left zeros out
    assert any(line.split(" ||| ")[1] for line in lines)


@pytest.mark.parametrize("level", ["word", "token"])
def test_align_threshold_keeps_the_attention_above_it(reversal, level, capsys, tmp_path):
    """-align_threshold T: the pairs of the attention above T, recomputed from the API's attention
    matrices; every n-best entry of -report carries its output line's pairs."""
    root, inputs = reversal["root"], reversal["inputs"]
    threshold = 0.25
    report = tmp_path / "report.jsonl"
    code, out, err = run(["-model", reversal["model"], "-src", str(root / "input.txt"), "-output", "-",
                          "-report_align", "-align_mode", "support", "-align_threshold", str(threshold),
                          "-align_level", level, "-n_best", "2", "-beam_size", "3", "-report", str(report),
                          *COMMON], capsys)
    assert code == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == 2 * len(inputs)
    m = nmt.load(reversal["model"], device="cpu", beam_size=3, max_length=12)
    api = m.translate(inputs, return_attention=True)
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert [r["decoding"] for r in records] == [{"align_mode": "support", "align_level": level,
                                                 "align_threshold": threshold}] * len(inputs)
    dropped = 0
    for k, (source, t, record) in enumerate(zip(inputs, api, records)):
        if not source:
            assert lines[2 * k: 2 * k + 2] == [" ||| "] * 2 and record["nbest"] == []
            continue
        text, pairs = lines[2 * k].split(" ||| ")
        assert text == t.text
        assert parse_pharaoh(pairs) == expected_pairs(t.attention, source, text, "support", level, threshold)
        everything = expected_pairs(t.attention, source, text, "support", level)
        dropped += len(everything) - len(parse_pharaoh(pairs))
        for n, entry in enumerate(record["nbest"]):  # the report's entries: the output lines' pairs
            assert lines[2 * k + n] == f"{entry['text']} ||| {entry['alignment']}"
    assert dropped > 0  # the threshold left some of the support out


def test_report_align_with_n_best_scores_streaming_and_samples(reversal, capsys):
    root, inputs = reversal["root"], reversal["inputs"]
    base = ["-model", reversal["model"], "-src", str(root / "input.txt"), "-output", "-", "-report_align",
            "-n_best", "3", "-beam_size", "3", "-with_score", *COMMON]
    code, out, err = run(base, capsys)
    assert code == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == 3 * len(inputs) and lines[6:9] == [" ||| \t"] * 3  # the empty input's padding
    m = nmt.load(reversal["model"], device="cpu", beam_size=3, max_length=12)
    api = m.translate(inputs, n_best=3, align=True)
    for k, t in enumerate(api):
        for n in range(3):
            line = lines[3 * k + n]
            if n >= len(t.hypotheses):
                assert line == " ||| \t"
                continue
            text, rest = line.split(" ||| ")  # OpenNMT-py's order: text ||| pairs<TAB>score
            pairs, score = rest.split("\t")
            assert text == t.nbest[n].text and parse_pharaoh(pairs) == t.nbest[n].alignment
            assert float(score) == pytest.approx(t.nbest[n].score, rel=1e-5)
    streamed = subprocess.run([sys.executable, "-m", "nmt.cli.translate", *base[:2], "-src", "-", "-output", "-", *base[6:]],
                              input="".join(line + "\n" for line in inputs), capture_output=True, text=True)
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == out
    # samples: each its own alignment, from its own steps
    code, out, err = run(["-model", reversal["model"], "-src", str(root / "input.txt"), "-output", "-",
                          "-report_align", "-sample", "-n_best", "2", "-seed", "3", *COMMON], capsys)
    assert code == 0, err
    samples = m.translate(inputs, sample=True, n_best=2, seed=3, beam_size=1, align=True)
    expected = [f"{h.text} ||| {' '.join(f'{s}-{t}' for s, t in h.alignment)}" for t in samples for h in t.nbest]
    assert [line for line in out.split("\n")[:-1] if line != " ||| "] == expected


def test_score_mode_reports_the_references_alignment(reversal, capsys, tmp_path):
    root = reversal["root"]
    sources = (root / "valid.src").read_text(encoding="utf-8").splitlines()
    refs = (root / "valid.tgt").read_text(encoding="utf-8").splitlines()
    code, out, err = run(["-model", reversal["model"], "-src", str(root / "valid.src"), "-tgt",
                          str(root / "valid.tgt"), "-mode", "score", "-report_align", "-align_mode", "support",
                          "-output", "-", "-quiet"], capsys)
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    m = nmt.load(reversal["model"], device="cpu")
    for source, ref, record in zip(sources, refs, records):
        # the teacher-forced attention of the reference: the forward pass's
        s = torch.tensor([m.src_field.encode(source)])
        tgt_in = torch.tensor([[m.tgt_field.vocab.bos_index] + m.tgt_field.encode(ref)])
        with torch.no_grad():
            _, attention = m.decoder(s, torch.tensor([s.size(1)]), tgt_in)
        expected = expected_pairs(attention[0].numpy(), source, ref, "support", "word")
        assert parse_pharaoh(record["alignment"]) == expected
        assert record["decoding"] == {"align_mode": "support", "align_level": "word", "align_threshold": 0.0}
    code, out, err = run(["-model", reversal["model"], "-src", str(root / "valid.src"), "-tgt",
                          str(root / "valid.tgt"), "-mode", "score", "-output", "-", "-quiet"], capsys)
    assert code == 0 and "alignment" not in out and "decoding" not in out  # not asked: not computed, nor said


@pytest.mark.parametrize("extra, message", [
    (["-align_mode", "support"], "-align_mode applies to -report_align"),
    (["-align_level", "token"], "-align_level applies to -report_align"),
    (["-report_align", "-align_threshold", "0.1"], "-align_threshold applies to -align_mode support"),
    (["-report_align", "-align_mode", "support", "-align_threshold", "1.5"], "-align_threshold must be a number in [0, 1)"),
    (["-mode", "score", "-tgt", "REF", "-replace_unk"], "-replace_unk applies to translation, not to scoring"),
])
def test_argument_errors_are_one_line(reversal, extra, message, capsys):
    root = reversal["root"]
    extra = [str(root / "valid.tgt") if x == "REF" else x for x in extra]
    code, out, err = run(["-model", reversal["model"], "-src", str(root / "input.txt"), "-output", "-", *extra,
                          "-quiet"], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("flags", [["-report_align"], ["-replace_unk"], ["-report_align", "-sample"],
                                   ["-report_align", "-mode", "score", "-tgt", "REF"]])
def test_a_model_without_attention_is_one_line_naming_the_option(reversal, monkeypatch, capsys, flags):
    from nmt.translate import loading

    m = nmt.load(reversal["model"], device="cpu")

    class NoAttention(torch.nn.Module):  # the trained model, its step's attention withheld
        def encode(self, src, src_lengths):
            return m.decoder.encode(src, src_lengths)

        def step(self, tokens, state, encoder_out):
            log_probs, _, state = m.decoder.step(tokens, state, encoder_out)
            return log_probs, None, state

    model = NoAttention()
    monkeypatch.setattr(loading, "load_models", lambda paths, device="cpu": (model, m.src_field, m.tgt_field, [model]))
    flags = [str(reversal["root"] / "valid.tgt") if x == "REF" else x for x in flags]
    code, out, err = run(["-model", "x.pt", "-src", str(reversal["root"] / "valid.src"), "-output", "-", *flags,
                          "-quiet"], capsys)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"nmt-translate: error: {flags[0]}: the model's step returns no source "
                                        "attention (None), so it has no alignments or heatmaps"]


RARE = ["zurich", "geneva", "basel", "bern", "lugano", "chur", "sion", "aarau"]
COMMON_WORDS = ["in", "the", "city", "of", "is"]


@pytest.fixture(scope="module")
def copy_model(tmp_path_factory) -> dict:
    """A word-level copy model whose target vocabulary holds only the common words (max_size 5):
    the city names are <unk> on the target side, known on the source side (but 'aarau', never
    seen in training, is <unk> there too)."""
    root = tmp_path_factory.mktemp("unk_cli")
    rng = random.Random(1)
    for split, n in (("train", 300), ("valid", 8)):
        lines = []
        for _ in range(n):
            words = [rng.choice(COMMON_WORDS) for _ in range(rng.randint(2, 5))]
            words.insert(rng.randint(0, len(words)), rng.choice(RARE[:-1]))
            lines.append(" ".join(words))
        (root / f"{split}.src").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        (root / f"{split}.tgt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    model = str(train_run(reversal_rnn_config(root, "space", "space", 600, {"max_size": 5}), root / "config.yaml")
                / "best.pt")
    inputs = ["the city of zurich", "basel is the city", "", "in bern", "aarau is in the city of geneva"]
    (root / "input.txt").write_text("".join(line + "\n" for line in inputs), encoding="utf-8")
    return {"root": root, "model": model, "inputs": inputs}


def test_replace_unk_copies_the_most_attended_source_word(copy_model, capsys, tmp_path):
    root, inputs = copy_model["root"], copy_model["inputs"]
    m = nmt.load(copy_model["model"], device="cpu", beam_size=3, max_length=12)
    assert "zurich" not in m.tgt_field.vocab and "zurich" in m.src_field.vocab and "aarau" not in m.src_field.vocab
    api = m.translate(inputs, return_attention=True)
    expected = []
    for source, t in zip(inputs, api):  # independent: the words of the source line, the rows' argmax
        words = []
        for j, token in enumerate(t.tokens[0] if t.tokens else []):
            if token == "<eos>":
                break
            words.append(source.split()[int(np.argmax(t.attention[j]))] if token == "<unk>" else token)
        expected.append(" ".join(words))
    plain = [t.text for t in api]
    assert sum(text.split().count("<unk>") for text in plain) >= 3  # the model does output <unk>
    report = tmp_path / "report.jsonl"
    code, out, err = run(["-model", copy_model["model"], "-src", str(root / "input.txt"), "-output", "-",
                          "-replace_unk", "-beam_size", "3", "-report", str(report), *COMMON], capsys)
    assert code == 0, err
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert [r["decoding"] for r in records] == [{"replace_unk": True}] * len(inputs)
    assert [r["nbest"][0]["text"] for r in records if r["nbest"]] == [e for e in expected if e]
    replaced = out.split("\n")[:-1]
    assert replaced == expected and all("<unk>" not in line for line in replaced)
    assert any(word in RARE for line in replaced for word in line.split())
    # with -report_align too: the same text, and alignments of the replaced words
    code, out, err = run(["-model", copy_model["model"], "-src", str(root / "input.txt"), "-output", "-",
                          "-replace_unk", "-report_align", "-beam_size", "3", "-report", str(report), *COMMON], capsys)
    assert code == 0, err
    assert [line.split(" ||| ")[0] for line in out.split("\n")[:-1]] == expected
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert [r["decoding"] for r in records] == [{"align_mode": "argmax", "align_level": "word",
                                                 "replace_unk": True}] * len(inputs)


def test_replace_unk_and_report_align_stream_the_file_outputs(copy_model, capsys, tmp_path):
    """Streaming (-src - -output -) writes the lines and -report records the file mode writes,
    <unk> replaced, the settings in every record."""
    root = copy_model["root"]
    args = ["-model", copy_model["model"], "-replace_unk", "-report_align", "-align_mode", "support",
            "-align_threshold", "0.1", "-n_best", "2", "-beam_size", "3", "-with_score", *COMMON]
    code, out, err = run([*args, "-src", str(root / "input.txt"), "-output", "-", "-report",
                          str(tmp_path / "file.jsonl")], capsys)
    assert code == 0, err
    assert "<unk>" not in out and any(word in out.split() for word in RARE)
    streamed = subprocess.run([sys.executable, "-m", "nmt.cli.translate", *args, "-src", "-", "-output", "-",
                               "-report", str(tmp_path / "stream.jsonl")],
                              input=(root / "input.txt").read_text(encoding="utf-8"), capture_output=True, text=True)
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == out
    records = (tmp_path / "file.jsonl").read_text(encoding="utf-8")
    assert (tmp_path / "stream.jsonl").read_text(encoding="utf-8") == records
    assert [json.loads(line)["decoding"] for line in records.splitlines()] == [
        {"align_mode": "support", "align_level": "word", "align_threshold": 0.1, "replace_unk": True}] * 5
