"""End to end: train a tiny model with the real nmt-train, then translate with nmt-translate."""
from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch

from nmt.cli import train as train_cli
from nmt.cli import translate as translate_cli
from tiny_runs import tiny_rnn_config, train_run, translate_main as translate, write_reversal


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A tiny reversal model ('a b c' -> 'cba') with entmax15 attention and output."""
    root = tmp_path_factory.mktemp("translate_cli")
    write_reversal(root, 120, 8)
    config = tiny_rnn_config(root, "space", "char", 60)
    train_run(config, root / "config.yaml")
    inputs = (root / "valid.src").read_text(encoding="utf-8").splitlines()
    inputs.insert(3, "")  # an empty line must stay aligned
    (root / "input.txt").write_text("".join(line + "\n" for line in inputs), encoding="utf-8")
    refs = (root / "valid.tgt").read_text(encoding="utf-8").splitlines()
    refs.insert(3, "")
    (root / "refs.txt").write_text("".join(line + "\n" for line in refs), encoding="utf-8")
    return {"root": root, "model": str(root / "run" / "best.pt"), "inputs": inputs}


def test_outputs_report_heatmaps_and_summary(trained, capsys):
    root = trained["root"]
    out, report, att = root / "out.txt", root / "report.jsonl", root / "att"
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out),
                              "-report", str(report), "-tgt", str(root / "refs.txt"), "-attention", str(att),
                              "-support", "-beam_size", "3", "-max_length", "10"], capsys)
    assert code == 0, err
    assert gc.get_freeze_count() == 0  # frozen after loading, thawed when main returned
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(trained["inputs"]) and lines[3] == ""
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == list(range(len(trained["inputs"])))
    for i, r in enumerate(records):
        assert set(r) >= {"id", "certified", "exact", "n_nonzero", "mass", "reason", "nbest"}
        assert r["exact"] == r["certified"]  # the deprecated name, kept for one release
        if i == 3:
            assert r["nbest"] == [] and r["reason"] == "empty_input"
            assert r["support"] == []  # -support: the field on every line, no step for an empty one
            continue
        assert r["nbest"][0]["text"] == lines[i]
        assert (r["reason"] is None) == r["certified"]
        assert 0.0 < r["mass"] <= 1.0 + 1e-5
        if r["certified"]:  # all sequences of nonzero probability found: their mass is 1
            assert r["mass"] == pytest.approx(1.0, abs=1e-4)
            assert r["n_nonzero"] >= 1
        assert len(r["support"]) == len(lines[i]) + 1  # one step per character, and EOS
        for step in r["support"]:
            assert 1 <= step["size"] and sum(p for _, p in step["tokens"]) == pytest.approx(1.0, abs=1e-4)
    pngs = sorted(p.name for p in att.iterdir())
    assert len(pngs) == len(trained["inputs"]) - 1 and "3.png" not in pngs
    assert (att / "0.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "certified" in err and "sentences/s" in err and "BLEU" in err and "exact match" in err
    assert "tok:13a" in err and "version:" in err  # sacrebleu signatures
    # TER beside BLEU and chrF: sacrebleu's TER of the written outputs against the references, recomputed
    refs = (root / "refs.txt").read_text(encoding="utf-8").split("\n")[:-1]
    direct = sacrebleu.metrics.TER()
    score = direct.corpus_score(lines, [refs]).score
    assert f"; TER {score:.2f} ({direct.get_signature()}); exact match" in err


def test_report_marks_outputs_cut_at_the_length_limit(trained, capsys, tmp_path):
    """Every report line and n-best entry carries "cut" (ends without EOS, cut by the length
    limit; tests/translate/test_cut_outputs.py makes models that are cut). This model gives EOS
    nonzero probability at every step, so even -max_length 1 cuts nothing, and the summary says
    nothing of cuts."""
    root = trained["root"]
    out, report = tmp_path / "out.txt", tmp_path / "report.jsonl"
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out),
                              "-report", str(report), "-beam_size", "2", "-n_best", "2", "-max_length", "1"], capsys)
    assert code == 0, err
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert all(r["cut"] is False and all(h["cut"] is False for h in r["nbest"]) for r in records)
    assert all(set(h) == {"text", "logprob", "cut"} for r in records for h in r["nbest"])
    assert "cut at the length limit" not in err


def test_cli_equals_direct_search(trained, capsys):
    """The CLI's batching, sorting and detokenizing reproduce a direct call per sentence."""
    from nmt.translate.beam_search import beam_search
    from nmt.translate.loading import load_model

    root = trained["root"]
    out = root / "direct.txt"
    # -device cpu: the direct search below runs on the CPU (a GPU's decoding is compared with the
    # CPU's, within rounding, by test_translation_and_scoring_on_cuda_equal_the_cpu)
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out),
                              "-beam_size", "4", "-batch_size", "3", "-quiet", "-device", "cpu"], capsys)
    assert code == 0, err
    assert err == ""
    loaded = load_model(trained["model"])
    vocab = loaded.tgt_field.vocab
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    for line, src in zip(lines, trained["inputs"]):
        if not src:
            assert line == ""
            continue
        ids = torch.tensor([loaded.src_field.encode(src)])
        r = beam_search(loaded.model, ids, torch.tensor([ids.size(1)]), bos=vocab.bos_index, eos=vocab.eos_index,
                        pad=vocab.pad_index, beam_size=4, max_length=100)
        assert line == loaded.tgt_field.decode(r.tokens[0, 0])


def test_nbest_and_ensemble(trained, capsys):
    root = trained["root"]
    single, double = root / "single.txt", root / "double.txt"
    args = ["-src", str(root / "input.txt"), "-n_best", "2", "-beam_size", "3", "-quiet"]
    assert translate(["-model", trained["model"], "-output", str(single)] + args, capsys)[0] == 0
    code, _, err = translate(["-model", trained["model"], trained["model"], "-output", str(double)] + args, capsys)
    assert code == 0, err
    lines = single.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 2 * len(trained["inputs"])
    assert lines[6:8] == ["", ""]  # the empty input line, twice
    # an ensemble of a model with itself has the model's distribution
    assert double.read_text(encoding="utf-8") == single.read_text(encoding="utf-8")


def test_with_score_writes_tab_separated_log_probabilities(trained, capsys):
    """-with_score (OpenNMT-py's): 'text<TAB>log-probability' per output line, the same texts and
    log-probabilities (total, not length-normalised) as the report's n-best lists; -n_best's
    padding lines are a lone tab; file and streamed output alike."""
    root = trained["root"]
    out, report = root / "scored.txt", root / "scored.jsonl"
    base = ["-model", trained["model"], "-n_best", "3", "-beam_size", "3", "-quiet", "-length_penalty", "average"]
    code, _, err = translate(base + ["-src", str(root / "input.txt"), "-output", str(out), "-with_score",
                                     "-report", str(report)], capsys)
    assert code == 0, err
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 3 * len(trained["inputs"]) and all(line.count("\t") == 1 for line in lines)
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    for i, record in enumerate(records):
        written = [line.split("\t") for line in lines[3 * i: 3 * i + 3]]
        for (text, score), h in zip(written, record["nbest"]):
            assert text == h["text"] and float(score) == pytest.approx(h["logprob"], rel=1e-5, abs=1e-6)
        assert all(pair == ["", ""] for pair in written[len(record["nbest"]):])
    assert any(len(r["nbest"]) < 3 for r in records)  # padding seen (the empty input line at least)
    plain = root / "plain.txt"
    assert translate(base + ["-src", str(root / "input.txt"), "-output", str(plain)], capsys)[0] == 0
    assert plain.read_text(encoding="utf-8").split("\n")[:-1] == [line.split("\t")[0] for line in lines]
    streamed = subprocess.run([sys.executable, "-m", "nmt.cli.translate", *base, "-threads", "1", "-with_score",
                               "-src", "-", "-output", "-"], input=(root / "input.txt").read_text(encoding="utf-8"),
                              capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == out.read_text(encoding="utf-8")
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-tgt",
                              str(root / "input.txt"), "-mode", "score", "-with_score"], capsys)
    assert code == 2 and err.count("\n") == 1 and "-with_score applies to translation" in err


@pytest.mark.parametrize("kind", ["garbage", "version", "missing"])
def test_bad_checkpoint_is_a_one_line_error(trained, capsys, kind):
    root = trained["root"]
    bad = root / f"bad_{kind}.pt"
    if kind == "garbage":
        bad.write_bytes(b"this is not a checkpoint")
    elif kind == "version":
        payload = torch.load(trained["model"], weights_only=True)
        payload["format_version"] = 999
        torch.save(payload, bad)
    code, out, err = translate(["-model", str(bad), "-src", str(root / "input.txt"), "-output",
                                str(root / "never.txt")], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and str(bad) in err and err.startswith("nmt-translate: error:")
    assert not (root / "never.txt").exists()


def test_bad_source_file_is_a_one_line_error(trained, capsys):
    root = trained["root"]
    bad = root / "latin1.txt"
    bad.write_bytes(b"a b\n\xe9 c\n")
    code, _, err = translate(["-model", trained["model"], "-src", str(bad)], capsys)
    assert code == 2 and err.count("\n") == 1 and f"{bad}:2:" in err


def test_ensemble_of_different_vocabularies_is_refused(trained, capsys):
    root = trained["root"]
    payload = torch.load(trained["model"], weights_only=True)
    itos = payload["tgt_field"]["vocab"]["itos"]
    itos[-1], itos[-2] = itos[-2], itos[-1]  # same size, different vocabulary
    other = root / "other_vocab.pt"
    torch.save(payload, other)
    code, _, err = translate(["-model", trained["model"], str(other), "-src", str(root / "input.txt")], capsys)
    assert code == 2 and err.count("\n") == 1 and str(other) in err and "vocabulary" in err


def test_ensemble_of_different_tokenizers_is_refused(trained, capsys):
    """Same vocabularies, other preprocessing: the first member's tokenizer would have read and
    written text for both; refused on one line naming both files and what differs."""
    root = trained["root"]
    payload = torch.load(trained["model"], weights_only=True)
    payload["tgt_field"]["tokenizer"]["space_symbol"] = "_"
    other = root / "other_tokenizer.pt"
    torch.save(payload, other)
    code, out, err = translate(["-model", trained["model"], str(other), "-src", str(root / "input.txt")], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"nmt-translate: error: {other}: its tgt tokenizer differs from {trained['model']}'s "
                          "(char space_symbol: '\u2581' vs '_')"), err


def test_max_length_ratio_limits_each_sentence_by_its_source(trained, capsys):
    """The reversal model writes one character per source token: with ``-max_length_ratio 0.5
    -max_length_offset 0`` every output stops at floor(n / 2) characters, cut (not certified); with
    ratio 1 it has room and equals the unlimited search."""
    root, inputs = trained["root"], trained["inputs"]
    outputs = {}
    for ratio in ("0", "0.5", "1"):
        out, report = root / f"ratio{ratio}.txt", root / f"ratio{ratio}.jsonl"
        code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out),
                                  "-report", str(report), "-beam_size", "8", "-max_length_ratio", ratio,
                                  "-max_length_offset", "0", "-quiet"], capsys)
        assert code == 0, err
        outputs[ratio] = out.read_text(encoding="utf-8").split("\n")[:-1]
        if ratio == "0.5":
            records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
            reasons = set()
            for src, line, record in zip(inputs, outputs[ratio], records):
                if src:  # cut, unless a candidate was pruned before (the first violation is reported)
                    assert len(line) <= len(src.split()) // 2 and not record["certified"]
                    reasons.add(record["reason"])
            assert "max_length" in reasons and reasons <= {"max_length", "pruned"}
    assert outputs["1"] == outputs["0"] and outputs["0.5"] != outputs["0"]


def streamed_lines(trained: dict, inputs: list[str], flags: list[str]) -> list[str]:
    """The output lines of ``nmt-translate -src - -output -`` (a subprocess, one thread) given
    ``inputs`` on stdin."""
    streamed = subprocess.run([sys.executable, "-m", "nmt.cli.translate", "-model", trained["model"], "-src", "-",
                               "-output", "-", *flags, "-threads", "1", "-quiet"],
                              input="".join(line + "\n" for line in inputs), capture_output=True, text=True,
                              env=dict(os.environ), timeout=300)
    assert streamed.returncode == 0, streamed.stderr
    return streamed.stdout.split("\n")[:-1]


def test_block_ngram_repeat_from_the_cli_and_the_api(trained, capsys, tmp_path):
    """-block_ngram_repeat 1: no output, n-best entry or sample repeats a character (the char
    tokenizer's tokens), where the model alone does; the file mode, the stream mode and the Python
    API give the same translations and certificates."""
    import nmt

    root, inputs = trained["root"], trained["inputs"]
    out, report, free = tmp_path / "out.txt", tmp_path / "report.jsonl", tmp_path / "free.txt"
    common = ["-model", trained["model"], "-src", str(root / "input.txt"), "-beam_size", "4", "-quiet"]
    code, _, err = translate(common + ["-output", str(out), "-report", str(report), "-n_best", "2",
                                       "-block_ngram_repeat", "1"], capsys)
    assert code == 0, err
    assert translate(common + ["-output", str(free)], capsys)[0] == 0
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    for line in lines:
        assert len(set(line)) == len(line), line
    for record in records:
        assert all(len(set(h["text"])) == len(h["text"]) for h in record["nbest"])
        if record["certified"]:
            assert record["n_nonzero"] >= len(record["nbest"]) and 0 < record["mass"] <= 1 + 1e-5
    unblocked = free.read_text(encoding="utf-8").split("\n")[:-1]
    assert any(len(set(line)) < len(line) for line in unblocked)  # the model alone repeats characters
    model = nmt.load(trained["model"], device="cpu")
    api = model.translate([line for line in inputs], beam_size=4, n_best=2, block_ngram_repeat=1)
    assert [t.text for t in api] == lines[::2]
    assert [t.certificate.certified for t in api] == [r["certified"] for r in records]
    assert streamed_lines(trained, inputs, ["-beam_size", "4", "-block_ngram_repeat", "1"]) == lines[::2]
    samples = tmp_path / "samples.txt"
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(samples),
                              "-sample", "-n_best", "5", "-block_ngram_repeat", "1", "-max_length", "6", "-quiet"],
                             capsys)
    assert code == 0, err
    drawn = samples.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(drawn) == 5 * len(inputs) and all(len(set(line)) == len(line) for line in drawn)


def test_tgt_prefix_from_the_cli_the_stream_and_the_api(trained, capsys, tmp_path):
    """-tgt_prefix: every output (and n-best entry, and sample) starts with its line's prefix; a
    line without one translates as without the flag; the report gives prefix_length; scoring the
    outputs by teacher forcing gives their reported log-probabilities; the file mode, the stream
    mode and the Python API agree."""
    import nmt

    root, inputs = trained["root"], trained["inputs"]
    # a prefix of one or two characters the reversal would not start with, every third line none
    prefixes = ["" if i % 3 == 2 or not line else ("f" if i % 2 else "ea") for i, line in enumerate(inputs)]
    (root / "prefix.txt").write_text("".join(p + "\n" for p in prefixes), encoding="utf-8")
    out, report, free = tmp_path / "out.txt", tmp_path / "report.jsonl", tmp_path / "free.txt"
    common = ["-model", trained["model"], "-src", str(root / "input.txt"), "-beam_size", "4", "-quiet"]
    code, _, err = translate(common + ["-output", str(out), "-report", str(report), "-n_best", "2",
                                       "-tgt_prefix", str(root / "prefix.txt")], capsys)
    assert code == 0, err
    assert translate(common + ["-output", str(free), "-n_best", "2"], capsys)[0] == 0
    lines, unforced = out.read_text(encoding="utf-8").split("\n")[:-1], free.read_text(encoding="utf-8").split("\n")[:-1]
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    changed = 0
    for i, (prefix, record) in enumerate(zip(prefixes, records)):
        assert all(h["text"].startswith(prefix) for h in record["nbest"])
        assert record.get("prefix_length", 0) == (len(prefix) if inputs[i] else 0)
        if not prefix:
            assert lines[2 * i: 2 * i + 2] == unforced[2 * i: 2 * i + 2]
        else:
            changed += lines[2 * i] != unforced[2 * i]
    assert changed >= 3  # the prefixes bite (the certificates are checked by brute force in tests/translate)
    best = tmp_path / "best.txt"
    best.write_text("".join(r["nbest"][0]["text"] + "\n" if r["nbest"] else "\n" for r in records), encoding="utf-8")
    code, text, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-tgt", str(best),
                                 "-mode", "score", "-quiet"], capsys)
    assert code == 0, err
    for i, (record, scored) in enumerate(zip(records, text.splitlines())):
        if record["nbest"] and inputs[i]:
            assert json.loads(scored)["logprob"] == pytest.approx(record["nbest"][0]["logprob"], abs=1e-4)
    model = nmt.load(trained["model"], device="cpu")
    api = model.translate(inputs, beam_size=4, n_best=2, prefixes=prefixes)
    assert [t.text for t in api] == lines[::2]
    assert [t.certificate.certified for t in api] == [r["certified"] for r in records]
    assert streamed_lines(trained, inputs, ["-beam_size", "4", "-tgt_prefix", str(root / "prefix.txt"),
                                            "-batch_size", "3"]) == lines[::2]
    samples = tmp_path / "samples.txt"
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(samples),
                              "-sample", "-n_best", "4", "-tgt_prefix", str(root / "prefix.txt"), "-quiet"], capsys)
    assert code == 0, err
    drawn = samples.read_text(encoding="utf-8").split("\n")[:-1]
    assert all(drawn[4 * i + j].startswith(p) for i, p in enumerate(prefixes) for j in range(4) if inputs[i])


def test_ban_unk_token_from_the_cli(trained, capsys, tmp_path):
    """-ban_unk_token reaches the search with the vocabulary's unk id (a search without it refuses
    the option), no output holds <unk>, and the report says the certificates are about the outputs
    without it."""
    root = trained["root"]
    out, report = tmp_path / "out.txt", tmp_path / "report.jsonl"
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out),
                              "-report", str(report), "-beam_size", "3", "-n_best", "3", "-ban_unk_token", "-quiet"],
                             capsys)
    assert code == 0, err
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert all(r["decoding"] == {"ban_unk_token": True} for r in records)
    assert not any("<unk>" in h["text"] for r in records for h in r["nbest"])


def test_phrase_table_from_the_cli(trained, capsys, tmp_path):
    """-phrase_table: read before the model, only with -replace_unk, a bad line named; the report's
    decoding says it was used (the replacement itself: tests/translate/test_translate_alignment.py)."""
    root = trained["root"]
    out, report, table = tmp_path / "out.txt", tmp_path / "report.jsonl", tmp_path / "table.txt"
    table.write_text("a|||A\nb|||B\n", encoding="utf-8")
    base = ["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out), "-quiet"]
    code, _, err = translate(base + ["-replace_unk", "-phrase_table", str(table), "-report", str(report)], capsys)
    assert code == 0, err
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert all(r["decoding"] == {"replace_unk": True, "phrase_table": True} for r in records)
    code, _, err = translate(base + ["-phrase_table", str(table)], capsys)
    assert (code, err) == (2, "nmt-translate: error: -phrase_table applies to -replace_unk (it translates the source "
                              "token an <unk> output is replaced by): add -replace_unk\n")
    table.write_text("a|||A\nb B\n", encoding="utf-8")
    out.unlink()
    code, _, err = translate(base + ["-replace_unk", "-phrase_table", str(table)], capsys)
    assert (code, err) == (2, f"nmt-translate: error: {table}:2: a phrase table line is source|||target, got 'b B'\n")
    assert not out.exists()


def test_bad_tgt_prefixes_are_one_line_errors(trained, capsys, tmp_path):
    root, inputs = trained["root"], trained["inputs"]
    out = tmp_path / "out.txt"
    base = ["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out)]
    short = tmp_path / "short.txt"
    short.write_text("a\n", encoding="utf-8")
    code, _, err = translate(base + ["-tgt_prefix", str(short)], capsys)
    assert (code, err) == (2, f"nmt-translate: error: -tgt_prefix {short} has 1 lines but {root / 'input.txt'} "
                              f"has {len(inputs)}\n")
    code, _, err = translate(base + ["-tgt", str(short)], capsys)  # references: the same rule, named -tgt
    assert (code, err) == (2, f"nmt-translate: error: -tgt {short} has 1 lines but {root / 'input.txt'} "
                              f"has {len(inputs)}\n")
    long = tmp_path / "long.txt"
    long.write_text("".join(("abcdefabc" if i == 4 else "") + "\n" for i in range(len(inputs))), encoding="utf-8")
    code, _, err = translate(base + ["-tgt_prefix", str(long), "-max_length", "8"], capsys)
    assert (code, err) == (2, f"nmt-translate: error: {long}:5: a target prefix of 9 tokens, more than max_length 8 "
                              "(only EOS may follow the max_length-th token)\n")
    code, _, err = translate(base + ["-tgt_prefix", str(tmp_path / "missing.txt")], capsys)
    assert code == 2 and "missing.txt" in err and err.count("\n") == 1
    code, _, err = translate(["-model", trained["model"], "-src", "-", "-output", "-", "-tgt_prefix", "-"], capsys)
    assert (code, err) == (2, "nmt-translate: error: -tgt_prefix - and -src - both read stdin: give one of them a "
                              "file\n")
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-tgt",
                              str(root / "refs.txt"), "-mode", "score", "-tgt_prefix", str(long)], capsys)
    assert code == 2 and err.startswith("nmt-translate: error: -tgt_prefix applies to translation, not to scoring")
    assert not out.exists()


@pytest.mark.parametrize("flags, expected", [
    (["-max_length_ratio", "nan"], "nmt-translate: error: -max_length_ratio must be a finite number, got nan\n"),
    (["-max_length_ratio", "-1"], "nmt-translate: error: -max_length_ratio must be a finite number >= 0, got -1.0\n"),
    (["-max_length_offset", "-1"], "nmt-translate: error: -max_length_offset must be >= 0, got -1\n"),
    (["-max_length", "0"], "nmt-translate: error: -max_length must be >= 1, got 0\n"),
    (["-block_ngram_repeat", "-1"], "nmt-translate: error: -block_ngram_repeat must be >= 0 (0: off), got -1\n"),
    (["-block_ngram_repeat", "-2", "-sample"],
     "nmt-translate: error: -block_ngram_repeat must be >= 0 (0: off), got -2\n"),
    (["-max_length", "-3"], "nmt-translate: error: -max_length must be >= 1, got -3\n"),
    (["-length_alpha", "nan"], "nmt-translate: error: -length_alpha must be a finite number, got nan\n"),
    (["-length_alpha", "inf"], "nmt-translate: error: -length_alpha must be a finite number, got inf\n"),
    (["-device", "tpu"], "nmt-translate: error: -device tpu: not a device name; valid: auto, cpu, cuda, cuda:N\n"),
    (["-device", "gpu"], "nmt-translate: error: -device gpu: not a device name; valid: auto, cpu, cuda, cuda:N\n"),
    (["-device", "cuda:x"], "nmt-translate: error: -device cuda:x: not a device name; valid: auto, cpu, cuda, "
                            "cuda:N\n"),
    (["-device", "meta"], "nmt-translate: error: -device meta: not a usable device here (cpu, cuda or cuda:N); "
                          "the meta device holds no data\n"),
])
def test_bad_flag_values_are_one_line_errors(trained, capsys, tmp_path, flags, expected):
    out = tmp_path / "out.txt"
    code, _, err = translate(["-model", trained["model"], "-src", str(trained["root"] / "input.txt"),
                              "-output", str(out), *flags], capsys)
    assert code == 2 and err.startswith(expected) and err.count("\n") == 1 and not out.exists()


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_cuda_device_without_cuda_is_one_line_error(trained, capsys, tmp_path, monkeypatch, device):
    """-device cuda:N where CUDA is unavailable (simulated where it is): one line naming the option."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out.txt"
    code, _, err = translate(["-model", trained["model"], "-src", str(trained["root"] / "input.txt"),
                              "-output", str(out), "-device", device], capsys)
    assert (code, err) == (2, f"nmt-translate: error: -device {device}: CUDA is not available on this machine\n")
    assert not out.exists()


@pytest.mark.parametrize("flag, kind", [("-report", "dir"), ("-attention", "file"), ("-output", "dir"),
                                        ("-score_output", "dir")])
def test_an_unwritable_output_path_fails_before_translating(trained, capsys, tmp_path, flag, kind):
    """A directory where a file is written (or a file where the heatmap directory goes) was found
    only after the whole input was translated, with the other outputs already written."""
    out, bad = tmp_path / "out.txt", tmp_path / "taken"
    bad.mkdir() if kind == "dir" else bad.write_text("x\n", encoding="utf-8")
    extra = ["-tgt", str(trained["root"] / "refs.txt")] if flag == "-score_output" else []
    args = ["-model", trained["model"], "-src", str(trained["root"] / "input.txt"), *extra, flag, str(bad)]
    code, stdout, err = translate(args + (["-output", str(out)] if flag != "-output" else []), capsys)
    problem = "is a directory" if kind == "dir" else "exists and is not a directory"
    assert code == 2 and stdout == "" and err == f"nmt-translate: error: {flag} {bad}: {problem}\n"
    assert not out.exists()


def test_scoring_own_translations_equals_their_search_logprob_and_flags_zero_references(trained, capsys):
    root = trained["root"]
    out, report, scores = root / "for_scoring.txt", root / "for_scoring.jsonl", root / "scores.jsonl"
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out),
                              "-report", str(report), "-beam_size", "3", "-quiet"], capsys)
    assert code == 0, err
    # the model's own translations as references: the score is the beam-search log-probability
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-tgt", str(out),
                              "-score_output", str(scores), "-batch_size", "3", "-quiet"], capsys)
    assert code == 0, err
    assert err.count("\n") == 1 and "zero probability 0.0%" in err and "mean log-prob" in err  # kept by -quiet
    searched = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    scored = [json.loads(line) for line in scores.read_text(encoding="utf-8").splitlines()]
    assert [s["id"] for s in scored] == list(range(len(trained["inputs"])))
    for i, (r, s) in enumerate(zip(searched, scored)):
        if i == 3:
            assert s["reason"] == "empty_source" and s["logprob"] is None
            continue
        assert not s["zero_probability"] and s["first_zero"] is None
        assert s["logprob"] == pytest.approx(r["nbest"][0]["logprob"], abs=1e-4)
        assert s["n_tokens"] == len(s["tokens"]) == len(s["token_logprobs"]) and s["tokens"][-1] == "<eos>"
        assert sum(s["token_logprobs"]) == pytest.approx(s["logprob"], abs=1e-4)

    # references the entmax15 output gives probability 0: where they leave the support
    wrong = root / "wrong.txt"
    wrong.write_text("".join(("aaaaaaaaaa" if line else "") + "\n" for line in trained["inputs"]), encoding="utf-8")
    code, out_text, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-tgt",
                                     str(wrong), "-mode", "score"], capsys)
    assert code == 0, err
    records = [json.loads(line) for line in out_text.splitlines()]
    zero = [r for r in records if r["zero_probability"]]
    assert zero and f"zero probability {100.0 * len(zero) / (len(records) - 1):.1f}%" in err
    for r in zero:
        z = r["first_zero"]
        assert r["logprob"] is None and r["token_logprobs"][z["position"]] is None
        assert all(x is not None for x in r["token_logprobs"][: z["position"]])
        assert z["token"] == r["tokens"][z["position"]] and z["rank_by"] == "score"
        assert z["rank"] > z["support_size"] >= 1


def test_scoring_runs_the_model_at_the_precision_of_translation(trained, capsys):
    """-precision bf16 was ignored by scoring (-mode score / -score_output): the references were
    scored in float32, so a bf16 translation's own log-probability did not come back."""
    root = trained["root"]
    out, report = root / "bf16.txt", root / "bf16.jsonl"
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out),
                              "-report", str(report), "-beam_size", "3", "-precision", "bf16", "-quiet"], capsys)
    assert code == 0, err
    scored = {}
    for precision in ("fp32", "bf16"):
        code, text, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-tgt", str(out),
                                     "-mode", "score", "-precision", precision, "-quiet"], capsys)
        assert code == 0, err
        scored[precision] = [json.loads(line)["logprob"] for line in text.splitlines()]
    searched = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert scored["fp32"] != scored["bf16"]  # autocast took effect
    for i, (r, s) in enumerate(zip(searched, scored["bf16"])):
        if i != 3:  # the empty line
            assert s == pytest.approx(r["nbest"][0]["logprob"], abs=1e-4)


@pytest.mark.parametrize("mode, flags, named", [
    (["-mode", "score"], ["-attention", "att"], "-attention"),
    (["-mode", "score"], ["-n_best", "3"], "-n_best"),
    (["-score_output", "scores.jsonl"], ["-report", "r.jsonl"], "-report"),
    (["-score_output", "scores.jsonl"], ["-support"], "-support"),
    (["-mode", "score"], ["-min_length", "2"], "-min_length"),
    (["-score_output", "scores.jsonl"], ["-max_length_ratio", "1.5"], "-max_length_ratio"),
    (["-mode", "score"], ["-block_ngram_repeat", "2"], "-block_ngram_repeat"),
    (["-mode", "score"], ["-ban_unk_token"], "-ban_unk_token"),
    (["-score_output", "scores.jsonl"], ["-tgt_prefix", "prefix.txt"], "-tgt_prefix"),
])
def test_scoring_refuses_flags_of_translation(trained, capsys, tmp_path, mode, flags, named):
    """-mode score ignored -attention and -n_best (no heatmap, one line per pair) without a word."""
    root = trained["root"]
    args = [tmp_path / a if a.endswith((".jsonl", "att")) else a for a in mode + flags]
    code, out, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-tgt",
                                str(root / "refs.txt"), *map(str, args)], capsys)
    scoring = "-mode score" if "-mode" in mode else "-score_output"
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"nmt-translate: error: {named} applies to translation, not to scoring ({scoring})")
    assert not any(tmp_path.iterdir())
    if named in ("-min_length", "-max_length_ratio"):  # scoring applies no length limit of the search
        assert err.rstrip().endswith("it gives each reference the model's log-probability, whatever its length")


def test_scoring_applies_no_length_limit(trained, capsys, tmp_path):
    """-min_length was ignored by scoring without a word (a reference shorter than it, whose EOS
    the search forbids, scored its model log-probability): now refused (above). -max_length, whose
    default is always on, stays accepted and unapplied: a reference longer than it is scored whole,
    as with -min_length 0 and -max_length_ratio 0, the values that apply no limit."""
    root = trained["root"]
    runs = {}
    for name, flags in (("plain", []), ("limits", ["-max_length", "1", "-min_length", "0", "-max_length_ratio", "0"])):
        code, out, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-tgt",
                                    str(root / "refs.txt"), "-mode", "score", "-quiet", *flags], capsys)
        assert code == 0, err
        runs[name] = [json.loads(line) for line in out.splitlines()]
    assert runs["plain"] == runs["limits"]
    assert max(r["n_tokens"] for r in runs["limits"]) > 2  # references longer than -max_length 1, scored whole


@pytest.mark.parametrize("data", [b"a b\r\nc \xe9 d\n", b"\xef\xbb\xbfab \xff\n", b"ok\n\n  \xc3"])
def test_stream_and_file_name_a_bad_byte_alike(tmp_path, data):
    """Streaming (-src - -output -) named the line of a bad UTF-8 byte but not its column."""
    import io
    import queue

    from nmt.cli.translate_stream import _read_lines
    from nmt.data import DataError
    from nmt.data.textfiles import decode_lines, read_lines

    lines: queue.Queue = queue.Queue()
    _read_lines(io.BytesIO(data), lines)
    items = [lines.get_nowait() for _ in range(lines.qsize())]
    streamed = items[-1]
    assert isinstance(streamed, DataError)
    src = tmp_path / "in.txt"
    src.write_bytes(data)
    for read in (lambda: read_lines(src), lambda: decode_lines(data, "<stdin>")):
        with pytest.raises(DataError) as whole:
            read()
        assert str(streamed) == str(whole.value).replace(str(src), "<stdin>")
    assert "column" in str(streamed)
    good = data.splitlines(keepends=True)[: len(items) - 1]
    assert items[:-1] == decode_lines(b"".join(good), "<stdin>")  # the lines before it, as a file gives them


def test_stream_translates_each_line_before_stdin_closes(trained):
    """The installed program (python -m) behind a pipe: the translation of a line comes back while
    stdin is still open; empty lines stay aligned; the summary comes at end of input."""
    import select

    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt.cli.translate", "-model", trained["model"], "-src", "-", "-output", "-",
         "-beam_size", "2", "-threads", "1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )
    try:
        answers = []
        for line in ("a b c", "", "f e"):
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, "no translation while stdin is open"
            answers.append(proc.stdout.readline())
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=120) == 0
        err = proc.stderr.read()
    finally:
        proc.kill()
    assert rest == "" and answers[1] == "\n" and all(a.endswith("\n") for a in answers)
    assert "3 sentences (1 empty)" in err and "start-up" in err
    same = trained["root"] / "stream_in.txt"
    same.write_text("a b c\n\nf e\n", encoding="utf-8")
    assert translate_cli.main(["-model", trained["model"], "-src", str(same), "-output", str(same) + ".out",
                               "-beam_size", "2", "-quiet"]) == 0
    assert "".join(answers) == (trained["root"] / "stream_in.txt.out").read_text(encoding="utf-8")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stream_stopped_while_stdin_is_open_exits_cleanly(trained, sig):
    """A signal while streaming with stdin still open: the reader thread held sys.stdin's lock in
    readline(), so the interpreter's shutdown aborted ('Fatal Python error: _enter_buffered_busy',
    SIGABRT) instead of exiting with 128+N and the one-line message."""
    import select

    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt.cli.translate", "-model", trained["model"], "-src", "-", "-output", "-",
         "-beam_size", "2", "-threads", "1", "-quiet"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )
    try:
        proc.stdin.write("a b c\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready and proc.stdout.readline().endswith("\n")
        proc.send_signal(sig)  # waiting for the next line, stdin open
        code = proc.wait(timeout=120)
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.stdin.close()
    assert code == 128 + sig, err
    assert err == f"nmt-translate: interrupted by {signal.Signals(sig).name}; unfinished outputs were not written\n"


@pytest.mark.parametrize("mode", ["stream", "file", "score"])
def test_a_closed_stdout_pipe_ends_quietly_with_sigpipe_status(trained, mode):
    """``nmt-translate ... | head -1``: stdout's reader gone. It printed 'error: [Errno 32] Broken
    pipe' and exited 2 (a shell pipeline reports a failure where cat or sort end quietly, killed by
    SIGPIPE: 141). Now no message and 128 + SIGPIPE."""
    root = trained["root"]
    src = ["-src", "-"] if mode == "stream" else ["-src", str(root / "input.txt")]
    score = ["-mode", "score", "-tgt", str(root / "refs.txt")] if mode == "score" else []
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has already gone (head -1 after its line)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "nmt.cli.translate", "-model", trained["model"], *src, "-output", "-", *score,
             "-beam_size", "2", "-threads", "1", "-quiet"],
            input="".join(line + "\n" for line in trained["inputs"]).encode(), stdout=write_end,
            stderr=subprocess.PIPE, env=dict(os.environ), timeout=120,
        )
    finally:
        os.close(write_end)
    err = proc.stderr.decode()
    assert (proc.returncode, err) == (128 + signal.SIGPIPE, "")


def test_stream_keeps_no_translation_it_has_written(trained, capsys, monkeypatch, tmp_path):
    """Streaming kept every Translation (tokens, n-best, support sizes: about 1 KB a line) until
    end of input, for the report and the summary: memory grew with the input (100,000 lines: +100
    MB). Now a batch's translations are garbage once written; the report, summary and metric line
    are the same as from a file."""
    import weakref

    from nmt.translate.translator import Translator

    inputs = trained["inputs"] * 3
    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in inputs), encoding="utf-8")
    refs = tmp_path / "refs.txt"
    refs.write_text((trained["root"] / "refs.txt").read_text(encoding="utf-8") * 3, encoding="utf-8")
    seen: list = []
    kept: list[int] = []
    original = Translator.translate

    def recording(self, lines, *a, **k):
        gc.collect()
        kept.append(sum(ref() is not None for ref in seen[:-1]))  # older than the batch just written
        done = original(self, lines, *a, **k)
        seen.append(weakref.ref(done[0]))  # -batch_size 1: one line a batch
        return done

    monkeypatch.setattr(Translator, "translate", recording)
    with open(src, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        code, out, err = translate(["-model", trained["model"], "-src", "-", "-output", "-", "-batch_size", "1",
                                    "-report", str(tmp_path / "s.jsonl"), "-tgt", str(refs)], capsys)
    assert code == 0, err
    assert len(kept) == len(inputs) and not any(kept)
    monkeypatch.undo()
    code, file_out, file_err = translate(["-model", trained["model"], "-src", str(src), "-output", "-", "-batch_size",
                                          "1", "-report", str(tmp_path / "f.jsonl"), "-tgt", str(refs)], capsys)
    assert code == 0 and out == file_out
    assert (tmp_path / "s.jsonl").read_text(encoding="utf-8") == (tmp_path / "f.jsonl").read_text(encoding="utf-8")
    without_speed = [re.sub(r"; [0-9.]+ sentences/s.*", "", line) for line in (err, file_err)]
    assert without_speed[0] == without_speed[1] and err.count("\n") == 2 and "BLEU" in err


def test_quiet_no_certify_formats_and_version(trained, capsys):
    root = trained["root"]
    att = root / "att_svg"
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output",
                              str(root / "q.txt"), "-tgt", str(root / "refs.txt"), "-quiet"], capsys)
    assert code == 0 and err.count("\n") == 1 and err.startswith("nmt-translate: BLEU ")  # the metric line only
    code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output",
                              str(root / "nc.txt"), "-no_certify", "-attention", str(att), "-attention_format",
                              "svg"], capsys)
    assert code == 0 and "certified n/a" in err and "exact" not in err
    assert sorted(p.suffix for p in att.iterdir()) == [".svg"] * (len(trained["inputs"]) - 1)
    assert (att / "0.svg").read_text(encoding="utf-8").lstrip().startswith("<?xml")
    from nmt.cli import average as average_cli, release as release_cli

    for cli, prog in ((translate_cli, "nmt-translate"), (train_cli, "nmt-train"), (average_cli, "nmt-average"),
                      (release_cli, "nmt-release")):
        with pytest.raises(SystemExit) as stop:
            cli.main(["--version"])
        assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"{prog} 0.1.0"
    help_text = translate_cli.build_parser().format_help()
    assert "(default: 5)" in help_text and "(default: png)" in help_text and "(default: None)" not in help_text


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_no_sentence_to_decode_gives_certified_n_a(trained, capsys, tmp_path, text):
    """An empty -src (or empty lines only) decodes nothing: the summary said 'certified 0.0%'."""
    src = tmp_path / "nothing.txt"
    src.write_text(text, encoding="utf-8")
    code, _, err = translate(["-model", trained["model"], "-src", str(src), "-output", str(tmp_path / "o.txt")],
                             capsys)
    assert code == 0, err
    assert "certified n/a" in err and "%" not in err.split("sentences/s")[0]


def test_interactive_mode_on_a_terminal_prompts_and_answers_each_line(trained):
    """stdin a terminal (a pseudo-terminal here): a prompt on stderr, one answer per line, Ctrl-D ends."""
    import pty
    import select

    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt.cli.translate", "-model", trained["model"], "-src", "-", "-output", "-",
         "-beam_size", "2", "-threads", "1"],
        stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )
    os.close(terminal)
    try:
        def read_until_prompt() -> str:
            seen = ""
            while not seen.endswith("> "):
                ready, _, _ = select.select([proc.stderr], [], [], 120)
                assert ready, f"no prompt; stderr so far {seen!r}"
                seen += os.read(proc.stderr.fileno(), 4096).decode()
            return seen

        assert "Ctrl-D ends" in read_until_prompt()
        os.write(controller, b"a b c\n")
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready
        answer = proc.stdout.readline()
        read_until_prompt()  # asks for the next line
        os.write(controller, b"\x04")  # Ctrl-D: end of input
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
        os.close(controller)
    same = trained["root"] / "interactive_in.txt"
    same.write_text("a b c\n", encoding="utf-8")
    assert translate_cli.main(["-model", trained["model"], "-src", str(same), "-output", str(same) + ".out",
                               "-beam_size", "2", "-quiet"]) == 0
    assert answer == (trained["root"] / "interactive_in.txt.out").read_text(encoding="utf-8")


def test_device_defaults_to_auto_and_resolves_on_this_machine():
    args = translate_cli.build_parser().parse_args(["-model", "m.pt", "-src", "in.txt"])
    assert args.device == "auto" and args.batch_type is None and args.batch_size is None
    assert args.precision == "fp32"


def test_default_batching_depends_on_the_device_and_keeps_given_values():
    from nmt.translate.translator import default_batching

    assert default_batching("cpu") == (64, "sentences")
    assert default_batching("cuda") == default_batching("cuda:1") == (8192, "tokens")
    assert default_batching("cuda", batch_type="sentences") == (64, "sentences")
    assert default_batching("cuda", batch_type="tokens") == (8192, "tokens")
    assert default_batching("cpu", batch_type="tokens") == (2048, "tokens")
    assert default_batching("cuda", batch_size=100) == (100, "sentences")
    assert default_batching("cpu", 500, "tokens") == (500, "tokens")


@pytest.mark.parametrize("argv, expected", [
    ([], (8192, "tokens")),  # a file on a GPU: token batches
    (["-batch_size", "32"], (32, "sentences")),
    (["-score_output", "s.jsonl", "-tgt", "ref.txt"], (64, "sentences")),  # scoring counts sentences
])
def test_cli_picks_the_device_default_batching(monkeypatch, argv, expected):
    """With the device resolved to CUDA (faked: no GPU needed), nmt-translate fills in the GPU's
    default batching for file translation only."""
    import nmt.cli.translate_file as translate_file
    import nmt.cli.translate_score as translate_score
    import nmt.translate.loading as loading
    import nmt.utils.device as device_utils

    seen = {}
    monkeypatch.setattr(loading, "resolve_device", lambda name, what: "cuda:0")
    monkeypatch.setattr(device_utils, "make_current", lambda name: None)
    for module, name in ((translate_file, "run_file"), (translate_score, "run_score")):
        monkeypatch.setattr(module, name, lambda args, start, ranks=None: seen.setdefault(
            "batching", (args.batch_size, args.batch_type)) and 0)
    args = translate_cli.build_parser().parse_args(["-model", "m.pt", "-src", "in.txt"] + argv)
    translate_cli.run(args)
    assert seen["batching"] == expected


def test_token_batches_and_static_search_give_the_same_translations(trained, capsys):
    """-batch_type tokens (other batches, still sorted by length) and -search_mode static change
    neither the outputs nor the certificates, in input order."""
    root = trained["root"]
    runs = {}
    for name, extra in (("default", []), ("tokens", ["-batch_type", "tokens", "-batch_size", "12"]),
                        ("static", ["-search_mode", "static", "-stop_every", "3", "-batch_size", "5"])):
        out, report = root / f"out_{name}.txt", root / f"report_{name}.jsonl"
        code, _, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", str(out),
                                  "-report", str(report), "-beam_size", "3", "-max_length", "10", "-quiet"] + extra,
                                 capsys)
        assert code == 0, err
        records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
        runs[name] = (out.read_text(encoding="utf-8"), [(r["exact"], r["reason"], r["n_nonzero"],
                                                          [h["text"] for h in r["nbest"]]) for r in records])
    assert runs["tokens"] == runs["default"]
    assert runs["static"] == runs["default"]


def test_bf16_precision_runs_the_model_under_autocast(trained):
    """-precision bf16: the model's products run in bfloat16 (scores move by rounding only)."""
    from nmt.translate.loading import load_models
    from nmt.translate.translator import Translator

    decoder, src_field, tgt_field, _ = load_models([trained["model"]], "cpu")
    lines = [line for line in trained["inputs"] if line]
    out = {p: Translator(decoder, src_field, tgt_field, batch_size=4, precision=p, beam_size=3,
                         max_length=10).translate(lines) for p in ("fp32", "bf16")}
    fp32 = [t.hypotheses[0][1] for t in out["fp32"]]
    bf16 = [t.hypotheses[0][1] for t in out["bf16"]]
    assert fp32 != bf16  # autocast took effect
    same = [a for a, b in zip(out["fp32"], out["bf16"]) if a.text == b.text]
    assert len(same) >= len(lines) // 2
    for a, b in zip(out["fp32"], out["bf16"]):
        if a.text == b.text:
            assert b.hypotheses[0][1] == pytest.approx(a.hypotheses[0][1], abs=0.1 + 0.05 * abs(a.hypotheses[0][1]))
    with pytest.raises(ValueError, match=r"^precision must be one of fp32, bf16, fp16, int8, got 'fp8'$"):
        Translator(decoder, src_field, tgt_field, precision="fp8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_translation_and_scoring_on_cuda_equal_the_cpu(trained):
    """On CUDA (source lengths kept on the host, batches copied through pinned memory): the
    CPU's hypotheses and certificates, log-probabilities within rounding; scoring likewise."""
    from nmt.translate.loading import load_models
    from nmt.translate.scorer import Scorer
    from nmt.translate.translator import Translator

    lines = [line for line in trained["inputs"] if line]
    refs = (trained["root"] / "valid.tgt").read_text(encoding="utf-8").splitlines()
    out, scored = {}, {}
    for device in ("cpu", "cuda"):
        decoder, src_field, tgt_field, _ = load_models([trained["model"]], device)
        for ratio in (0.0, 0.7):  # with per-sentence limits too (the static loop's masks on CUDA)
            out[device, ratio] = Translator(decoder, src_field, tgt_field, batch_size=3, device=device, beam_size=3,
                                            max_length=10, max_length_ratio=ratio, max_length_offset=0).translate(lines)
        scored[device] = Scorer(decoder, src_field, tgt_field, batch_size=3, device=device).score(lines, refs)
    for ratio in (0.0, 0.7):
        for a, b in zip(out["cpu", ratio], out["cuda", ratio]):
            assert (a.text, a.certified, a.reason, a.src_tokens) == (b.text, b.certified, b.reason, b.src_tokens)
            # in IEEE float32 (nmt.utils.precision.ieee_float32): the summation order alone; with
            # cuDNN's TF32 LSTM (torch's default, before decoding turned it off) 1.4e-4 on an H200
            assert b.hypotheses[0][1] == pytest.approx(a.hypotheses[0][1], abs=1e-4)
    for a, b in zip(scored["cpu"], scored["cuda"]):
        assert (a.tokens, a.zero_probability) == (b.tokens, b.zero_probability)
        assert b.logprob == pytest.approx(a.logprob, abs=1e-4)


@pytest.mark.parametrize("value", ["abc", "0"])
def test_a_bad_nmt_variable_is_a_one_line_error_of_both_programs(tmp_path, value):
    """``NMT_ONEDNN_MIN_ROWS`` is read when the toolkit is imported: a bad value stops
    nmt-translate and nmt-train with one line naming it (fresh processes: this one has read it)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "NMT_ONEDNN_MIN_ROWS": value, "PYTHONPATH": str(root)}
    for args in (["-m", "nmt.cli.translate", "-model", str(tmp_path / "m.pt"), "-src", str(tmp_path / "s.txt")],
                 ["-m", "nmt.cli.train", "-config", str(root / "configs" / "quickstart.yaml")]):
        out = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
        prog = "nmt-translate" if "translate" in args[1] else "nmt-train"
        assert out.returncode == 2, out.stderr
        assert out.stderr == f"{prog}: error: NMT_ONEDNN_MIN_ROWS must be a positive integer, got {value!r}\n"
    assert not (tmp_path / "runs").exists()



def test_constraints_from_the_cli_the_stream_and_the_api(trained, capsys, tmp_path):
    """-constraints FILE (TAB-separated phrases, an empty line: none): every complete output holds its
    line's phrases (unordered: anywhere; ordered: in order), a line without constraints translates as
    without the flag, the report names the phrases and which each n-best entry meets; the file mode,
    the stream mode and the Python API agree."""
    import nmt

    root, inputs = trained["root"], trained["inputs"]
    # phrases the reversal would rarely hold: one or two characters, every third line none, one line
    # two, one line a phrase twice (two occurrences asked for)
    sets = [[] if i % 3 == 2 or not line else (["f", "ea"] if i == 1 else ["e", "e"] if i == 4 else
                                                ["fa" if i % 2 else "e"]) for i, line in enumerate(inputs)]
    path = root / "constraints.txt"
    path.write_text("".join("\t".join(s) + "\n" for s in sets), encoding="utf-8")
    out, report, free = tmp_path / "out.txt", tmp_path / "report.jsonl", tmp_path / "free.txt"
    common = ["-model", trained["model"], "-src", str(root / "input.txt"), "-beam_size", "4", "-max_length", "10",
              "-quiet"]
    assert translate(common + ["-output", str(free)], capsys)[0] == 0
    unconstrained = free.read_text(encoding="utf-8").split("\n")[:-1]
    for mode in ("unordered", "ordered"):
        code, _, err = translate(common + ["-output", str(out), "-report", str(report), "-n_best", "2",
                                           "-constraints", str(path), "-constraints_mode", mode], capsys)
        assert code == 0, err
        lines = out.read_text(encoding="utf-8").split("\n")[:-1]
        records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
        changed = 0
        for i, (phrases, record) in enumerate(zip(sets, records)):
            if not phrases or not inputs[i]:
                assert "constraints" not in record
                assert lines[2 * i] == unconstrained[i]
                continue
            assert record["constraints"] == phrases and record["decoding"]["constraints"] == mode
            for entry in record["nbest"]:
                assert entry["constraints_met"] == [True] * len(phrases) or entry["cut"]
                if not entry["cut"]:  # (no phrase here overlaps itself: str.count counts every occurrence)
                    assert all(entry["text"].count(p) >= phrases.count(p) for p in phrases)
            if mode == "ordered" and len(phrases) > 1 and record["nbest"] and not record["nbest"][0]["cut"]:
                text = record["nbest"][0]["text"]
                assert text.index(phrases[0]) + len(phrases[0]) <= text.rindex(phrases[-1])
            assert record["constraints_met"] == (bool(record["nbest"]) and all(record["nbest"][0]["constraints_met"]))
            changed += lines[2 * i] != unconstrained[i]
        assert changed >= 3
        model = nmt.load(trained["model"], device="cpu")
        api = model.translate(inputs, beam_size=4, n_best=2, max_length=10, constraints=sets, constraints_mode=mode)
        assert [t.text for t in api] == lines[::2]
        assert [t.certificate.certified for t in api] == [r["certified"] for r in records]
        assert streamed_lines(trained, inputs, ["-beam_size", "4", "-max_length", "10", "-constraints", str(path),
                                                "-constraints_mode", mode, "-batch_size", "3"]) == lines[::2]


@pytest.mark.parametrize("content,flags,message", [
    ("a\n", [], "-constraints {c} has 1 lines but {s} has 9"),
    (None, ["-sample"], "-constraints applies to beam search, not to -sample"),
    (None, ["-mode", "score", "-tgt", "REF"], "-constraints applies to translation, not to scoring (-mode score)"),
    ("a\tz\n" + "\n" * 8, [], "{c}:1: constraint phrase 2 'z' holds a word the target vocabulary lacks"),
    ("\n\na\t\n" + "\n" * 6, [], "{c}:3: constraint phrase 2 '' has no token"),
    ("\n" * 4 + "abcabc\n" + "\n" * 4, ["-max_length", "5"], "{c}:5: the constraints need at least 6 tokens, more "
                                                              "than max_length 5"),
])
def test_bad_constraints_are_one_line_errors(trained, capsys, tmp_path, content, flags, message):
    root = trained["root"]
    path = tmp_path / "c.txt"
    path.write_text(content if content is not None else "\n" * len(trained["inputs"]), encoding="utf-8")
    flags = [str(root / "refs.txt") if f == "REF" else f for f in flags]
    code, out, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", "-",
                                "-quiet", "-constraints", str(path), *flags], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message.format(c=path, s=root / "input.txt") in lines[0], err
    code, out, err = translate(["-model", trained["model"], "-src", str(root / "input.txt"), "-output", "-",
                                "-quiet", "-constraints_mode", "ordered"], capsys)
    assert code == 2 and "-constraints_mode applies to -constraints" in err


def test_constraints_read_from_stdin_equal_the_file(trained, tmp_path):
    """-constraints - reads the constraints from stdin beside a source file: the outputs and reports
    equal those of the same constraints given as a file; a second flag reading stdin is refused on
    one line."""
    root, inputs = trained["root"], trained["inputs"]
    sets = ["e" if i % 2 else "" for i in range(len(inputs))]
    path = tmp_path / "c.txt"
    path.write_text("".join(s + "\n" for s in sets), encoding="utf-8")
    results = {}
    for name, flag in (("file", str(path)), ("stdin", "-")):
        out, report = tmp_path / f"{name}.txt", tmp_path / f"{name}.jsonl"
        run = subprocess.run([sys.executable, "-m", "nmt.cli.translate", "-model", trained["model"], "-src",
                              str(root / "input.txt"), "-output", str(out), "-report", str(report), "-beam_size", "3",
                              "-max_length", "10", "-constraints", flag, "-threads", "1", "-quiet"],
                             input=path.read_text(encoding="utf-8"), capture_output=True, text=True,
                             env=dict(os.environ), timeout=300)
        assert run.returncode == 0, run.stderr
        results[name] = (out.read_text(encoding="utf-8"), report.read_text(encoding="utf-8"))
    assert results["stdin"] == results["file"]
    assert any(json.loads(line).get("constraints") == ["e"] for line in results["file"][1].splitlines())
    for flags, message in ((["-src", "-", "-constraints", "-"], "-constraints - and -src - both read stdin: give one "
                                                               "of them a file"),
                           (["-src", str(root / "input.txt"), "-tgt_prefix", "-", "-constraints", "-"],
                            "-constraints - and -tgt_prefix - both read stdin: give one of them a file")):
        run = subprocess.run([sys.executable, "-m", "nmt.cli.translate", "-model", trained["model"], "-output", "-",
                              *flags], input="", capture_output=True, text=True, env=dict(os.environ), timeout=300)
        assert (run.returncode, run.stderr) == (2, f"nmt-translate: error: {message}\n")
