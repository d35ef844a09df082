"""Source tags end to end: a tiny model trained by nmt-train on two corpora that share their
sources, ``<2up>`` (target: the source uppercased) and ``<2rev>`` (reversed), learns what each tag
asks for on unseen words; nmt-translate ``-src_tag`` (file, stream and score modes), the Python API
and nmt-server give what a search / teacher-forced scoring of the model fed the tag id and the
line's ids built by hand gives; a tag the model lacks is one line listing its tags; a resume with
another tag is refused and a run saved before the key resumes; fine-tuning adds a new tag with
``init_vocab: extend`` and refuses it with ``keep``."""
from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import nmt
from nmt.data.errors import DataError
from nmt.server.http_api import RequestError, load_service
from nmt.train.checkpoint import load_checkpoint, save_checkpoint
from nmt.translate.beam_search import beam_search
from nmt.translate.scoring import score_batch
from tiny_runs import train_run, translate_main

LETTERS = "abcdef"
TAGS = {"<2up>": str.upper, "<2rev>": lambda w: w[::-1]}


def words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 4))) for _ in range(n)]


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def train_error(config: dict, path: Path, capsys) -> str:
    """nmt-train on ``config`` that fails: its one line on stderr (asserting a non-zero exit)."""
    from nmt.cli import train as train_main

    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    threads = torch.get_num_threads()
    capsys.readouterr()
    try:
        assert train_main.main(["-config", str(path), "-quiet"]) != 0
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def tagged_config(root: Path, steps: int = 500, tags: tuple[str, str] | None = ("<2up>", "<2rev>")) -> dict:
    """Two corpora of the same 400 words (char tokenizers), targets uppercased and reversed, each
    with its tag (none where ``tags`` is None); validation: reversal, tagged ``<2rev>``."""
    rng = random.Random(0)
    train, valid = words(rng, 400), words(rng, 20)
    src = write(root / "train.src", train)
    corpora = [{"src": src, "tgt": write(root / "up.tgt", [w.upper() for w in train]), "name": "up"},
               {"src": src, "tgt": write(root / "rev.tgt", [w[::-1] for w in train]), "name": "rev"}]
    if tags is not None:
        for corpus, tag in zip(corpora, tags):
            corpus["src_tag"] = tag
    return {
        "data": {"train": corpora,
                 "valid": {"src": write(root / "valid.src", valid), "tgt": write(root / "valid.tgt", [w[::-1] for w in valid]),
                           **({"src_tag": "<2rev>"} if tags is not None else {})},
                 "src": {"tokenizer": {"type": "char"}}, "tgt": {"tokenizer": {"type": "char"}}},
        "model": {"embeddings": {"src_size": 16, "tgt_size": 16, "dropout": 0.0},
                  "encoder": {"layers": 1, "hidden_size": 32, "dropout": 0.0},
                  "decoder": {"layers": 1, "hidden_size": 32, "dropout": 0.0},
                  "attention": {"mapping": "sparsemax"}, "output": {"mapping": "entmax15"}},
        "training": {"save_dir": str(root / "run"), "batch_size": 32, "max_steps": steps, "valid_every": steps,
                     "log_every": steps, "keep_last": 1, "progress": False, "threads": 1, "tensorboard": False,
                     "device": "cpu", "optimizer": {"name": "adam", "lr": 0.01}},
        "validation": {"metric": "loss", "batch_size": 32, "max_length": 12, "n_heatmaps": 0},
    }


@pytest.fixture(scope="module")
def tagged_run(tmp_path_factory):
    """(root, config, checkpoint path, held-out words) of the trained two-tag model."""
    root = tmp_path_factory.mktemp("tags")
    config = tagged_config(root)
    run = train_run(config, root / "config.yaml")
    seen = set(Path(config["data"]["train"][0]["src"]).read_text().split())
    held = [w for w in words(random.Random(99), 80) if w not in seen][:30]
    write(root / "held.src", held)
    return root, config, str(run / "last.pt"), held


def test_each_tag_gets_its_task_on_unseen_words(tagged_run, capsys):
    root, _, checkpoint, held = tagged_run
    for tag, task in TAGS.items():
        code, out, _ = translate_main(["-model", checkpoint, "-src", str(root / "held.src"), "-src_tag", tag,
                                       "-report", str(root / "report.jsonl"), "-device", "cpu", "-quiet"], capsys)
        assert code == 0
        outputs = out.splitlines()
        right = sum(o == task(w) for o, w in zip(outputs, held))
        assert right >= 0.9 * len(held), (tag, list(zip(held, outputs)))
        records = [json.loads(line) for line in (root / "report.jsonl").read_text().splitlines()]
        assert len(records) == len(held) and all(r["decoding"] == {"src_tag": tag} for r in records)


def by_hand(vocab, tag: str, line: str) -> list[int]:
    """The tag's id, then each character's (the char tokenizer of this model) from the vocabulary."""
    return [vocab.stoi[tag]] + [vocab.stoi.get(c, vocab.unk_index) for c in line]


def test_translation_is_the_search_of_the_hand_built_ids(tagged_run, capsys):
    root, _, checkpoint, held = tagged_run
    model = nmt.load(checkpoint, device="cpu", beam_size=3, n_best=2)
    assert model.src_tags == ("<2rev>", "<2up>")
    src_vocab, tgt_field = model.src_field.vocab, model.tgt_field
    lines = held[:8]
    for tag in TAGS:
        code, out, _ = translate_main(["-model", checkpoint, "-src", str(root / "held.src"), "-src_tag", tag,
                                       "-beam_size", "3", "-n_best", "2", "-with_score", "-device", "cpu",
                                       "-quiet"], capsys)
        assert code == 0
        cli = [line.split("\t") for line in out.splitlines()]
        api = model.translate(lines, src_tag=tag)
        for i, line in enumerate(lines):
            ids = torch.tensor([by_hand(src_vocab, tag, line)])
            with torch.no_grad():
                result = beam_search(model.decoder, ids, torch.tensor([ids.size(1)]), bos=src_vocab.bos_index,
                                     eos=src_vocab.eos_index, pad=src_vocab.pad_index, beam_size=3, n_best=2)
            found = [n for n in range(2) if int(result.lengths[0, n]) > 0]  # sparse outputs: maybe one
            assert len(api[i].hypotheses) == len(found) >= 1
            for n in range(2):
                if n not in found:  # no hypothesis of nonzero probability: a padding line
                    assert cli[2 * i + n] == ["", ""]
                    continue
                length = int(result.lengths[0, n])
                text = tgt_field.decode(result.tokens[0, n, :length].tolist())
                assert api[i].hypotheses[n][0] == text
                assert api[i].hypotheses[n][1] == pytest.approx(float(result.scores[0, n]), abs=1e-4)  # packed CPU products
                assert cli[2 * i + n][0] == text
                assert float(cli[2 * i + n][1]) == pytest.approx(float(result.scores[0, n]), abs=1e-4)
            assert api[i].certified == bool(result.exact[0]) and api[i].decoding == {"src_tag": tag}
            assert api[i].src_tokens == [tag] + list(line)


def test_scores_are_the_teacher_forced_scores_of_the_hand_built_ids(tagged_run, capsys):
    root, _, checkpoint, held = tagged_run
    model = nmt.load(checkpoint, device="cpu")
    vocab, tgt_vocab = model.src_field.vocab, model.tgt_field.vocab
    lines, refs = held[:6], [w.upper() for w in held[:6]]
    write(root / "refs.tgt", refs)
    write(root / "six.src", lines)
    code, out, _ = translate_main(["-model", checkpoint, "-src", str(root / "six.src"), "-tgt", str(root / "refs.tgt"),
                                   "-mode", "score", "-src_tag", "<2up>", "-device", "cpu", "-quiet"], capsys)
    assert code == 0
    cli = [json.loads(line) for line in out.splitlines()]
    api = model.score(lines, refs, src_tag="<2up>")
    for i, (line, ref) in enumerate(zip(lines, refs)):
        src = torch.tensor([by_hand(vocab, "<2up>", line)])
        y = [tgt_vocab.stoi[c] for c in ref]
        with torch.no_grad():
            scores = score_batch(model.decoder, src, torch.tensor([src.size(1)]),
                                 torch.tensor([[tgt_vocab.bos_index] + y]), torch.tensor([y + [tgt_vocab.eos_index]]),
                                 torch.tensor([len(y) + 1]))
        assert api[i].logprob == pytest.approx(float(scores.total[0]), abs=1e-5)
        assert cli[i]["logprob"] == pytest.approx(float(scores.total[0]), abs=1e-4)
        assert api[i].decoding == {"src_tag": "<2up>"} and cli[i]["decoding"] == {"src_tag": "<2up>"}


def test_stream_mode_tags_every_line_as_file_mode(tagged_run, capsys, monkeypatch):
    import io

    root, _, checkpoint, held = tagged_run
    _, file_out, _ = translate_main(["-model", checkpoint, "-src", str(root / "held.src"), "-src_tag", "<2rev>",
                                     "-device", "cpu", "-quiet"], capsys)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("".join(w + "\n" for w in held).encode())))
    code, stream_out, _ = translate_main(["-model", checkpoint, "-src", "-", "-output", "-", "-src_tag", "<2rev>",
                                          "-device", "cpu", "-quiet"], capsys)
    assert code == 0 and stream_out == file_out


def test_a_tag_the_model_lacks_is_one_line_listing_its_tags(tagged_run, capsys):
    root, _, checkpoint, _ = tagged_run
    code, out, err = translate_main(["-model", checkpoint, "-src", str(root / "held.src"), "-src_tag", "<2de>",
                                     "-device", "cpu", "-quiet"], capsys)
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and "'<2de>': not one of the model's source tags: <2rev>, <2up>" in err
    with pytest.raises(DataError, match="<2rev>, <2up>"):
        nmt.load(checkpoint, device="cpu").translate(["abc"], src_tag="<BT>")


def test_server_takes_a_per_request_tag(tagged_run):
    _, _, checkpoint, held = tagged_run
    service = load_service([checkpoint], "cpu", beam_size=2)
    model = nmt.load(checkpoint, device="cpu", beam_size=2)
    assert service.describe()["src_tags"] == ["<2rev>", "<2up>"]
    for tag in TAGS:
        answer = service.translate({"src": held[:5], "src_tag": tag})["translations"]
        expected = model.translate(held[:5], src_tag=tag)
        assert [a["text"] for a in answer] == [t.text for t in expected]
        assert all(a["decoding"] == {"src_tag": tag} for a in answer)
    plain = service.translate({"src": held[:2]})["translations"]
    assert [a["text"] for a in plain] == [t.text for t in model.translate(held[:2])] and "decoding" not in plain[0]
    scores = service.score({"src": held[:3], "tgt": [w.upper() for w in held[:3]], "src_tag": "<2up>"})["scores"]
    assert [s["logprob"] for s in scores] == pytest.approx(
        [s.logprob for s in model.score(held[:3], [w.upper() for w in held[:3]], src_tag="<2up>")])
    with pytest.raises(RequestError) as err:
        service.translate({"src": ["abc"], "src_tag": "<2de>"})
    assert err.value.status == 400 and "<2rev>, <2up>" in str(err.value)
    with pytest.raises(RequestError, match="src_tag must be a string"):
        service.score({"src": ["abc"], "tgt": ["x"], "src_tag": 3})


def test_a_resume_with_another_tag_is_refused(tagged_run, tmp_path, capsys):
    root, config, _, _ = tagged_run
    changed = json.loads(json.dumps(config))
    changed["data"]["train"][1]["src_tag"] = "<2back>"
    changed["training"]["max_steps"] = config["training"]["max_steps"] + 1
    err = train_error(changed, tmp_path / "changed.yaml", capsys)
    assert re.search(r"changed.yaml: data.train: differs from the run in .*use another training.save_dir", err)


def test_a_run_saved_before_src_tag_resumes(tmp_path, capsys):
    """A list of corpora saved by an nmt without src_tag: the same config resumes (no tag is the
    default); one that now sets a tag is refused."""
    config = tagged_config(tmp_path, steps=4, tags=None)
    run = train_run(config, tmp_path / "c.yaml")
    checkpoint = load_checkpoint(run / "last.pt")
    assert checkpoint["config"]["data"]["train"][0]["src_tag"] is None and "tags" not in checkpoint["src_field"]
    for corpus in checkpoint["config"]["data"]["train"]:
        del corpus["src_tag"]
    del checkpoint["config"]["data"]["valid"]["src_tag"]
    save_checkpoint(run / "last.pt", checkpoint)
    tagged = json.loads(json.dumps(config))
    tagged["data"]["train"][0]["src_tag"] = "<BT>"
    tagged["training"]["max_steps"] = 6
    assert "t.yaml: data.train: differs from the run" in train_error(tagged, tmp_path / "t.yaml", capsys)
    config["training"]["max_steps"] = 6
    train_run(config, tmp_path / "c.yaml")
    assert load_checkpoint(run / "last.pt")["step"] == 6


def test_fine_tuning_adds_a_new_tag_with_extend_only(tagged_run, tmp_path, capsys):
    root, config, checkpoint, _ = tagged_run
    child = json.loads(json.dumps(config))
    child["data"]["train"] = [{**child["data"]["train"][1], "src_tag": "<2dup>",
                               "tgt": write(tmp_path / "dup.tgt", [w + w for w in
                                                                   Path(child["data"]["train"][0]["src"]).read_text().split()])}]
    child["training"].update(save_dir=str(tmp_path / "child"), init_from=checkpoint, max_steps=3, valid_every=3)
    err = train_error(child, tmp_path / "keep.yaml", capsys)
    assert re.search(r"data.train\[0\].src_tag: '<2dup>' is not a token of the source vocabulary.*init_vocab: extend", err)
    child["training"]["init_vocab"] = "extend"
    run = train_run(child, tmp_path / "extend.yaml")
    parent_vocab = nmt.load(checkpoint, device="cpu").src_field.vocab
    model = nmt.load(run / "last.pt", device="cpu")
    assert model.src_tags == ("<2dup>", "<2rev>", "<2up>")  # the parent's tags stay the model's
    assert model.src_field.vocab.itos == parent_vocab.itos + ["<2dup>"]
    assert model.translate(["abc"], src_tag="<2dup>")[0].decoding == {"src_tag": "<2dup>"}


def test_alignments_index_the_lines_pieces_not_the_tag(tagged_run):
    """Token level: each target piece's pairs are the source positions of its attention support
    (Translation.attention, the tag's column included) other than the tag's, shifted past it; word
    level (the char tokenizer's words) never names the tag."""
    from nmt.translate.alignment import AlignOptions

    _, _, checkpoint, held = tagged_run
    model = nmt.load(checkpoint, device="cpu")
    lines = held[:6] + ["ab cd"]
    done = model.translate(lines, src_tag="<2rev>", align=AlignOptions(mode="support", level="token"))
    for line, t in zip(lines, done):
        attention = t.attention  # (T, 1 + len(line)): the best hypothesis's steps over tag + pieces
        assert attention.shape[1] == 1 + len(line)
        expected = sorted((i - 1, j) for j in range(len(t.tokens[0]) - 1)
                          for i in np.flatnonzero(attention[j] > 0) if i >= 1)
        assert t.alignments[0] == expected and all(i < len(line) for i, _ in expected)
    words = model.translate(lines, src_tag="<2rev>", align=True)
    assert all(i <= 1 for t in words[-1:] for i, _ in t.alignments[0])  # "ab cd": words 0 and 1
    assert words[-1].decoding == {"align_mode": "argmax", "align_level": "word", "src_tag": "<2rev>"}
