"""Fine-tuning (training.init_from): a new run starts from a trained run's weights, tokenizers and
vocabularies with a fresh step, optimizer, schedule and early stopping; resumes as any run;
one-line errors for a wrong architecture or path; its checkpoints average, release and translate."""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal

import pytest
import torch
import yaml

from nmt.config import ConfigError, resolve_config
from nmt.train.checkpoint import load_checkpoint
from nmt.train.trainer import Trainer
from tiny_task import tiny_config, write_task


def make(config: dict) -> Trainer:
    return Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A trained parent run (CPU) and the data of its fine-tuning: a new training set with letters
    the parent never saw (g, h), and the parent's validation set."""
    root = tmp_path_factory.mktemp("init_from")
    torch.set_num_threads(1)
    data = write_task(root / "data")
    make(tiny_config(data, root / "parent", device="cpu", max_steps=8, valid_every=4)).train()
    new = root / "new"
    new.mkdir()
    words = ["gab", "hhc", "fgd", "ab", "cgh", "dead", "hg", "beef", "gg", "fade"] * 3
    (new / "train.src").write_text("".join(" ".join(w) + "\n" for w in words), encoding="utf-8")
    (new / "train.tgt").write_text("".join(w[::-1] + "\n" for w in words), encoding="utf-8")
    child_data = {"train": {"src": str(new / "train.src"), "tgt": str(new / "train.tgt")}, "valid": data["valid"]}
    return root / "parent", child_data


def child_config(parent, save_dir, **training) -> dict:
    run, data = parent
    settings = {"device": "cpu", "max_steps": 6, "valid_every": 3, "init_from": str(run), **training}
    return tiny_config(data, save_dir, **settings)


@pytest.fixture
def log(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # the CLI's setup_logging turns it off
    caplog.set_level(logging.INFO, logger="nmt")
    return caplog


def test_the_child_starts_from_the_parent_with_everything_else_fresh(parent, tmp_path, log):
    run, _ = parent
    best = load_checkpoint(run / "best.pt")
    child = make(child_config(parent, tmp_path / "child"))
    # the parent's fields, whatever the new data holds: g and h are unknown
    assert child.data.src_field.state_dict() == best["src_field"]
    assert child.data.tgt_field.state_dict() == best["tgt_field"]
    assert "g" not in child.data.src_field.vocab and "h" not in child.data.tgt_field.vocab
    assert child.data.src_field.encode("g a h") == [1, child.data.src_field.vocab.stoi["a"], 1]
    for name, value in child.model.state_dict().items():  # the run directory means its best.pt
        assert torch.equal(value, best["model"][name]), name
    assert child.progress.step == 0 and child.progress.epoch == 0 and not child.resumed
    assert child.optimizer.state_dict()["state"] == {}  # no Adam moments yet
    assert child.schedule.step_count == 0 and child.stopper.best_step < 0
    assert any(r.getMessage().startswith(f"fine-tuning from {run / 'best.pt'} (step {best['step']})")
               for r in log.records)
    # before any update the child's validation loss is the parent's: recomputed here one sentence
    # at a time from the child's own encoding of the validation files (the parent's was batched)
    model, valid, vocab = child.model.eval(), child.data.valid, child.data.tgt_field.vocab
    total = tokens = 0.0
    with torch.no_grad():
        for src, tgt in zip(valid.src, valid.tgt):
            logits, _ = model(torch.tensor([src]), torch.tensor([len(src)]), torch.tensor([[vocab.bos_index] + tgt]))
            total += child.loss_fn(logits[0], torch.tensor(tgt + [vocab.eos_index]), reduction="sum").item()
            tokens += len(tgt) + 1
    assert total / tokens == pytest.approx(best["metrics"]["valid_loss"], rel=1e-5)
    child.model.train()
    summary = child.train()
    assert summary.step == 6
    last = load_checkpoint(tmp_path / "child" / "last.pt")
    assert last["step"] == 6 and last["trainer"]["progress"]["step"] == 6
    assert last["src_field"] == best["src_field"] and last["tgt_field"] == best["tgt_field"]
    records = [json.loads(line) for line in (tmp_path / "child" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 6]
    assert (tmp_path / "child" / "vocab.src").read_text(encoding="utf-8").split("\n")[:-1] == \
        best["src_field"]["vocab"]["itos"][4:]  # the parent's vocabulary, written for reuse


def test_the_tokens_the_parent_never_saw_are_one_warning_with_their_counts(parent, tmp_path, log):
    """New data with letters outside the parent's vocabularies (g, h) trains them as <unk>: one
    warning says so with the counts, recounted here from the text (space tokens, characters) and
    the parent's token lists; data the parent's vocabularies cover gives none."""
    run, data = parent
    best = load_checkpoint(run / "best.pt")
    known = {side: set(best[f"{side}_field"]["vocab"]["itos"][4:]) for side in ("src", "tgt")}
    with open(data["train"]["src"], encoding="utf-8") as f:
        src_tokens = f.read().split()
    with open(data["train"]["tgt"], encoding="utf-8") as f:
        tgt_tokens = list(f.read().replace("\n", ""))
    counts = [(sum(t not in known[side] for t in tokens), len(tokens))
              for side, tokens in (("src", src_tokens), ("tgt", tgt_tokens))]
    (s_unk, s_all), (t_unk, t_all) = counts
    assert s_unk > 0 and t_unk > 0
    make(child_config(parent, tmp_path / "child"))
    warnings = [r.getMessage() for r in log.records if r.levelno == logging.WARNING and "<unk>" in r.getMessage()]
    assert warnings == [f"training data: source {s_unk} of {s_all} tokens ({100 * s_unk / s_all:.1f}%), target "
                        f"{t_unk} of {t_all} tokens ({100 * t_unk / t_all:.1f}%) are <unk>: tokens "
                        f"{run / 'best.pt'}'s vocabularies lack (a fine-tuned run keeps its parent's vocabularies "
                        "and cannot learn new tokens; training.init_vocab: extend adds them)"]
    log.clear()
    own = tiny_config({"train": data["valid"], "valid": data["valid"]}, tmp_path / "covered", device="cpu",
                      init_from=str(run))
    make(own)
    assert not [r for r in log.records if "<unk>" in r.getMessage()]


def test_init_optimizer_without_init_from_is_one_line_and_nothing_written(parent, tmp_path, capsys):
    """training.init_optimizer: true with no parent was silently a plain fresh run."""
    from nmt.cli.train import main

    run, data = parent
    config = tiny_config(data, tmp_path / "run", device="cpu", init_optimizer=True)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["-config", str(tmp_path / "c.yaml"), "-quiet"]) == 2
    assert capsys.readouterr().err == (f"nmt-train: error: {tmp_path / 'c.yaml'}: training.init_optimizer: true needs "
                                       "training.init_from (the run whose optimizer state it carries): set "
                                       "init_from, or leave init_optimizer false\n")
    assert not (tmp_path / "run").exists()
    assert main(["-config", str(tmp_path / "c.yaml"), "-quiet", "-init_from", str(run)]) == 0


def test_init_optimizer_carries_the_moments_with_this_configs_hyperparameters(parent, tmp_path):
    run, _ = parent
    best = load_checkpoint(run / "best.pt")
    config = child_config(parent, tmp_path / "child", init_optimizer=True)
    config["training"]["optimizer"] = {"lr": 5e-4, "betas": [0.8, 0.99]}
    child = make(config)
    state = child.optimizer.state_dict()
    assert len(state["state"]) == len(best["optimizer"]["state"]) > 0
    for index, moments in best["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(state["state"][index][key].cpu(), value.cpu()), (index, key)
    for group in child.optimizer.param_groups:  # the config's, not the parent's (lr 1e-3, betas 0.9 / 0.999)
        assert group["lr"] == 5e-4 and group["betas"] == (0.8, 0.99)
    assert child.progress.step == 0 and child.schedule.step_count == 0
    child.lock.release()
    config["training"]["optimizer"] = {"name": "sgd"}
    with pytest.raises(ConfigError, match=r"tiny.yaml: training.optimizer.name: 'sgd' in the config, 'adam' in .*"
                                          r"best.pt: training.init_optimizer carries the state of the same optimizer"):
        make(config)


def test_a_killed_child_resumes_from_its_own_last_pt(parent, tmp_path, log):
    run, data = parent
    straight = make(child_config(parent, tmp_path / "straight"))
    straight.train()
    copy = tmp_path / "parent_copy.pt"  # the parent is gone by the time the child resumes
    shutil.copy(run / "best.pt", copy)

    def interrupt_at_4(step):
        if step == 4:
            os.kill(os.getpid(), signal.SIGINT)

    first = make(child_config(parent, tmp_path / "child", init_from=str(copy)))
    assert first.train(step_hook=interrupt_at_4).stopped_by == "SIGINT"
    copy.unlink()
    log.clear()
    second = make(child_config(parent, tmp_path / "child", init_from=str(copy)))
    assert second.resumed and second.progress.step == 4 and second.resume_path.name == "last.pt"
    assert any("training.init_from" in r.getMessage() and "ignored" in r.getMessage() for r in log.records)
    assert second.train().step == 6
    for name, value in straight.model.state_dict().items():  # as the uninterrupted child
        assert torch.equal(value, second.model.state_dict()[name]), name


def test_another_architecture_is_one_line_naming_the_key(parent, tmp_path):
    run, _ = parent
    config = child_config(parent, tmp_path / "child")
    config["model"]["decoder"]["hidden_size"] = 16
    config["model"]["decoder"]["dropout"] = 0.1  # differs too, but changes no parameter
    with pytest.raises(ConfigError) as info:
        make(config)
    assert str(info.value) == (f"tiny.yaml: model.decoder.hidden_size: 16 in the config, 12 in {run / 'best.pt'}: "
                               "fine-tuning (training.init_from) needs the parent's architecture")
    assert not (tmp_path / "child" / "vocab.src").exists() and not (tmp_path / "child" / "vocab.tgt").exists()
    config = child_config(parent, tmp_path / "child2")
    config["model"]["attention"]["score"] = "dot"  # no attention weights: other parameter names
    with pytest.raises(ConfigError, match=r"model.attention.score: 'dot' in the config, 'general' in "):
        make(config)


def test_settings_without_parameters_may_differ(parent, tmp_path, log):
    config = child_config(parent, tmp_path / "child", max_steps=2, valid_every=2)
    config["model"]["decoder"]["dropout"] = 0.0
    config["model"]["output"]["mapping"] = "sparsemax"
    config["data"]["src"]["min_freq"] = 3  # would build another vocabulary: ignored
    child = make(config)
    messages = [r.getMessage() for r in log.records]
    assert any("model settings other than" in m and "model.decoder.dropout, model.output.mapping" in m
               for m in messages)
    assert any(m.startswith("data.src.min_freq: 3 ignored (1 in ") for m in messages)
    assert child.train().step == 2


def test_vocab_samples_is_a_vocabulary_setting_the_child_ignores(parent, tmp_path, log):
    """data.<side>.subword_sampling.vocab_samples builds another vocabulary: ignored with a warning
    (the parent's fields are kept); a parent whose config predates the key warns of nothing."""
    from nmt.train.checkpoint import save_checkpoint
    from nmt.train.init_from import load_parent

    config = child_config(parent, tmp_path / "child")
    config["data"]["src"]["tokenizer"] = {"type": "bpe", "merges": 10}
    config["data"]["src"]["subword_sampling"] = {"dropout": 0.2, "vocab_samples": 2}
    best = parent[0] / "best.pt"
    loaded = load_parent(resolve_config(config, "tiny.yaml"), "tiny.yaml", resuming=False)
    messages = [r.getMessage() for r in log.records]
    assert any(m.startswith("data.src.subword_sampling.vocab_samples: 2 ignored (0 in ") for m in messages)
    assert loaded.src_field.state_dict() == load_checkpoint(best)["src_field"]
    old = load_checkpoint(best)
    for side in ("src", "tgt"):
        del old["config"]["data"][side]["subword_sampling"]["vocab_samples"]
    save_checkpoint(tmp_path / "old.pt", old)
    log.clear()
    plain = child_config(parent, tmp_path / "child2", init_from=str(tmp_path / "old.pt"))
    load_parent(resolve_config(plain, "tiny.yaml"), "tiny.yaml", resuming=False)
    assert not any("vocab_samples" in r.getMessage() for r in log.records)


def test_a_missing_or_unreadable_parent_is_one_line_naming_it(parent, tmp_path):
    missing = tmp_path / "nope" / "best.pt"
    with pytest.raises(ConfigError, match=rf"^tiny.yaml: training.init_from: {missing}: no such checkpoint file"):
        make(child_config(parent, tmp_path / "a", init_from=str(missing)))
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"training.init_from: .*garbage.pt: not a readable nmt checkpoint"):
        make(child_config(parent, tmp_path / "b", init_from=str(tmp_path / "garbage.pt")))
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(ConfigError, match=r"training.init_from: .*empty_run: a directory without best.pt"):
        make(child_config(parent, tmp_path / "c", init_from=str(tmp_path / "empty_run")))


def test_nmt_train_init_from_fine_tunes_and_its_checkpoints_average_release_and_translate(parent, tmp_path, capsys):
    from nmt.cli import average, release, train, translate

    run, _ = parent
    config = child_config(parent, tmp_path / "child", max_steps=6, valid_every=2, keep_last=3)
    del config["training"]["init_from"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert train.main(["-config", str(tmp_path / "c.yaml"), "-quiet", "-init_from", str(run)]) == 0
    saved = yaml.safe_load((tmp_path / "child" / "config.yaml").read_text(encoding="utf-8"))
    assert saved["training"]["init_from"] == str(run)
    avg, model = tmp_path / "avg.pt", tmp_path / "model.pt"
    assert average.main(["-last", "3", "-run", str(tmp_path / "child"), "-output", str(avg)]) == 0
    assert release.main(["-model", str(tmp_path / "child" / "best.pt"), "-output", str(model)]) == 0
    (tmp_path / "in.txt").write_text("a b c\ng a\n", encoding="utf-8")
    for checkpoint in (tmp_path / "child" / "last.pt", avg, model):
        out = tmp_path / f"{checkpoint.stem}.out"
        assert translate.main(["-model", str(checkpoint), "-src", str(tmp_path / "in.txt"), "-output", str(out),
                               "-max_length", "8", "-quiet"]) == 0
        assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    # a released model is a parent too (its weights and fields), but has no optimizer state to carry
    grandchild = make(child_config(parent, tmp_path / "grandchild", init_from=str(model)))
    released = load_checkpoint(model, training=False)
    for name, value in grandchild.model.state_dict().items():
        assert torch.equal(value, released["model"][name]), name
    grandchild.lock.release()
    with pytest.raises(ConfigError, match=r"training.init_optimizer: .*model.pt is a released model"):
        make(child_config(parent, tmp_path / "g2", init_from=str(model), init_optimizer=True))
    capsys.readouterr()
    assert train.main(["-config", str(tmp_path / "c.yaml"), "-quiet", "-set", f"training.save_dir={tmp_path / 'x'}",
                       "-init_from", str(tmp_path / "nope.pt")]) == 2
    assert capsys.readouterr().err == (f"nmt-train: error: {tmp_path / 'c.yaml'}: training.init_from: "
                                       f"{tmp_path / 'nope.pt'}: no such checkpoint file or run directory\n")
    assert not (tmp_path / "x").exists()  # refused before anything was written


def test_init_vocab_extend_appends_the_new_tokens_and_keeps_the_parents_rows(parent, tmp_path, log):
    """training.init_vocab: extend: each vocabulary is the parent's, in its order, then the new
    data's tokens it lacks, most frequent first (recounted here from the text); the parent's rows
    of the embedding and output tables and every other parameter are the parent's, the new rows
    the fresh model's; nothing of the new data is <unk>; the run trains, saves the extended fields
    and resumes with them."""
    from collections import Counter

    run, data = parent
    best = load_checkpoint(run / "best.pt")
    child = make(child_config(parent, tmp_path / "child", init_vocab="extend"))
    with open(data["train"]["src"], encoding="utf-8") as f:
        src_counts = Counter(f.read().split())
    with open(data["train"]["tgt"], encoding="utf-8") as f:
        tgt_counts = Counter(f.read().replace("\n", ""))
    for side, counts in (("src", src_counts), ("tgt", tgt_counts)):
        old = best[f"{side}_field"]["vocab"]["itos"]
        new = sorted((t for t in counts if t not in old), key=lambda t: (-counts[t], t))
        assert set(new) == {"g", "h"}
        assert getattr(child.data, f"{side}_field").vocab.itos == old + new
    assert 1 not in child.data.src_field.encode("g a h") and 1 not in child.data.tgt_field.encode("hag")
    assert child.data.train.unk_tokens == {"src": (0, 90), "tgt": (0, 90)}  # (<unk>, tokens) per side
    fresh_rows = 0
    for name, value in child.model.state_dict().items():
        theirs = best["model"][name]
        assert torch.equal(value[: theirs.size(0)] if value.dim() else value, theirs), name
        if value.shape != theirs.shape:  # a vocabulary table: two more rows, the model's own
            assert value.size(0) == theirs.size(0) + 2 and value.shape[1:] == theirs.shape[1:], name
            fresh_rows += 1
            assert bool(torch.isfinite(value[theirs.size(0):]).all()) and bool(value[theirs.size(0):].abs().sum() > 0)
    assert fresh_rows == 4  # source and target embeddings, output weight and bias
    messages = [r.getMessage() for r in log.records]
    assert "training.init_vocab extend: source vocabulary 10 -> 12 types (2 new from the training data)" in messages
    assert any("extended to 12 and 12" in m for m in messages) and not any("<unk>" in m for m in messages)
    assert child.train().step == 6
    last = load_checkpoint(tmp_path / "child" / "last.pt")
    assert last["src_field"]["vocab"]["itos"] == child.data.src_field.vocab.itos
    resumed = make(child_config(parent, tmp_path / "child", init_vocab="extend", max_steps=8))
    assert resumed.resumed and resumed.data.tgt_field.vocab.itos == child.data.tgt_field.vocab.itos
    assert resumed.train().step == 8


def test_init_vocab_extend_follows_min_freq_and_max_size(parent, tmp_path):
    run, data = parent
    with open(data["train"]["src"], encoding="utf-8") as f:
        src_text = f.read().split()
    g, h = src_text.count("g"), src_text.count("h")
    assert g != h
    config = child_config(parent, tmp_path / "child", init_vocab="extend")
    config["data"]["src"]["min_freq"] = max(g, h)  # only the more frequent of the two
    config["data"]["tgt"]["max_size"] = len(load_checkpoint(run / "best.pt")["tgt_field"]["vocab"]["itos"]) - 4 + 1
    child = make(config)
    assert child.data.src_field.vocab.itos[-1] == ("g" if g > h else "h") and "gh".replace(
        child.data.src_field.vocab.itos[-1], "") not in child.data.src_field.vocab
    assert len(child.data.tgt_field.vocab.itos) == config["data"]["tgt"]["max_size"] + 4  # one new token: the cap


def test_init_vocab_extend_with_init_optimizer_is_one_line(parent, tmp_path):
    with pytest.raises(ConfigError, match=r"^tiny\.yaml: training\.init_optimizer: true with training\.init_vocab: "
                                          r"extend: the parent's optimizer state does not fit"):
        make(child_config(parent, tmp_path / "child", init_vocab="extend", init_optimizer=True))
    assert not (tmp_path / "child" / "last.pt").exists()


def test_init_vocab_extend_keeps_a_shared_vocabulary_shared(parent, tmp_path):
    """A parent with one vocabulary for both sides (data.shared_vocab): the child's is one too, the
    parent's tokens then the new tokens of both sides (recounted from the text)."""
    from collections import Counter

    _, data = parent
    shared_data = {"train": data["valid"], "valid": data["valid"]}
    config = tiny_config(shared_data, tmp_path / "shared_parent", device="cpu", max_steps=2, valid_every=2)
    config["data"]["shared_vocab"] = True
    make(config).train()
    child_cfg = tiny_config(data, tmp_path / "child", device="cpu", max_steps=2, valid_every=2,
                            init_from=str(tmp_path / "shared_parent"), init_vocab="extend")
    child_cfg["data"]["shared_vocab"] = True
    child = make(child_cfg)
    best = load_checkpoint(tmp_path / "shared_parent" / "best.pt")
    old = best["src_field"]["vocab"]["itos"]
    assert best["tgt_field"]["vocab"]["itos"] == old
    counts = Counter()
    for side in ("src", "tgt"):  # the src settings' tokenizer (space) cuts both sides
        with open(data["train"][side], encoding="utf-8") as f:
            counts.update(f.read().split())
    new = sorted((t for t in counts if t not in old), key=lambda t: (-counts[t], t))
    assert child.data.src_field.vocab.itos == old + new == child.data.tgt_field.vocab.itos and len(new) > 2
    assert child.train().step == 2
