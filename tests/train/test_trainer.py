"""End-to-end training on a tiny task: outputs, resume equality, early stopping, validation statistics."""
import json
import os
import signal

import pytest
import torch

from nmt.train.checkpoint import load_checkpoint
from nmt.train.trainer import Trainer
from nmt.train.validation import teacher_forced_statistics
from nmt.config import ConfigError, resolve_config
from nmt.utils.precision import ieee_float32
from tiny_task import assert_same_run, make_trainer, tiny_config


def test_run_directory_contents(tiny_task, tmp_path):
    save_dir = tmp_path / "run"
    config = tiny_config(tiny_task, save_dir, tensorboard=True)
    config["validation"]["n_heatmaps"] = 1
    summary = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml").train()
    assert summary.step == 12 and summary.stopped_by == "max_steps"
    names = set(os.listdir(save_dir))
    assert {"last.pt", "best.pt", "config.yaml", "metrics.jsonl", "train.log"} - {"train.log"} <= names
    assert sorted(n for n in names if n.startswith("step_")) == ["step_12.pt", "step_8.pt"]  # keep_last 2
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(save_dir / "tensorboard"))
    records = [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8, 12]
    for key in ("epoch", "lr", "train_loss", "valid_loss", "valid_accuracy", "valid_attention_support",
                "valid_output_support", "tokens_per_sec", "elapsed"):
        assert key in records[-1], key
    best = load_checkpoint(save_dir / "best.pt")
    assert best["step"] == summary.best_step
    assert best["metrics"]["valid_loss"] == pytest.approx(min(r["valid_loss"] for r in records))
    last = load_checkpoint(save_dir / "last.pt")
    assert last["step"] == 12 and last["config"]["training"]["save_dir"] == str(save_dir)


def test_interrupted_and_resumed_equals_uninterrupted(tiny_task, tmp_path):
    # on the CPU wherever CUDA is: bit-identical weights need deterministic kernels (on CUDA cuDNN's
    # LSTM backward and the atomics of embedding / scatter backward may differ run to run)
    straight = make_trainer(tiny_task, tmp_path / "straight", device="cpu")
    straight.train()

    def interrupt_at_7(step):  # mid-epoch (5 batches per epoch), between validations
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)

    first = make_trainer(tiny_task, tmp_path / "resumed", device="cpu")
    summary = first.train(step_hook=interrupt_at_7)
    assert summary.stopped_by == "SIGINT" and summary.step == 7
    assert load_checkpoint(tmp_path / "resumed" / "last.pt")["step"] == 7

    second = make_trainer(tiny_task, tmp_path / "resumed", device="cpu")
    assert second.resumed and second.progress.step == 7
    assert second.train().step == 12
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")


def test_resume_refuses_a_different_model(tiny_task, tmp_path):
    make_trainer(tiny_task, tmp_path / "run", max_steps=2).train()
    config = tiny_config(tiny_task, tmp_path / "run")
    config["model"]["attention"]["mapping"] = "softmax"
    with pytest.raises(ConfigError, match=r"tiny.yaml: model.attention.mapping: differs from the run"):
        Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")


def test_resume_refuses_another_bucket_size(tiny_task, tmp_path):
    """training.bucket_size cuts the epoch's batch order the data position indexes: another one
    mid-epoch would repeat some examples and skip others (README: other batching is refused)."""
    make_trainer(tiny_task, tmp_path / "run", max_steps=2).train()
    with pytest.raises(ConfigError, match=r"tiny.yaml: training.bucket_size: differs from the run"):
        make_trainer(tiny_task, tmp_path / "run", bucket_size=3)


def test_a_run_saved_before_pool_sort_resumes_with_its_target_source_batches(tiny_task, tmp_path, caplog,
                                                                             monkeypatch):
    """New runs sort pools by target length alone; a checkpoint written before training.pool_sort
    existed (its config lacks the key) sorted them by (target, source) length and resumes so: the
    resumed run equals an uninterrupted target_source run (README: old runs keep their batches)."""
    import logging
    import random

    from nmt.train.checkpoint import save_checkpoint

    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # off after a CLI test's setup_logging
    monkeypatch.setattr(logging.getLogger("nmt"), "handlers", [])  # theirs may hold a closed stream
    # sources longer than their targets by 0-3 tokens: the two sorts make other batches
    rng = random.Random(1)
    src = tiny_task["train"]["src"]
    with open(src, encoding="utf-8") as handle:
        lines = [line.rstrip("\n") + " f" * rng.randint(0, 3) + "\n" for line in handle]
    with open(src, "w", encoding="utf-8") as handle:
        handle.writelines(lines)
    straight = make_trainer(tiny_task, tmp_path / "straight", device="cpu", pool_sort="target_source")
    straight.train()
    new_default = make_trainer(tiny_task, tmp_path / "new", device="cpu")
    new_default.train()
    assert not all(torch.equal(a, b) for a, b in zip(straight.model.state_dict().values(),
                                                     new_default.model.state_dict().values()))

    def interrupt_at_7(step):
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)

    first = make_trainer(tiny_task, tmp_path / "resumed", device="cpu", pool_sort="target_source")
    assert first.train(step_hook=interrupt_at_7).step == 7
    last = tmp_path / "resumed" / "last.pt"
    checkpoint = load_checkpoint(last)
    del checkpoint["config"]["training"]["pool_sort"]  # as an nmt before the option wrote it
    save_checkpoint(last, checkpoint)
    with caplog.at_level("INFO", logger="nmt.train.trainer"):
        second = make_trainer(tiny_task, tmp_path / "resumed", device="cpu")  # pool_sort left at its default
    assert second.config["training"]["pool_sort"] == "target_source"
    assert any("training.pool_sort: 'target_source'" in r.getMessage() for r in caplog.records)
    assert second.train().step == 12
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")
    assert load_checkpoint(last)["config"]["training"]["pool_sort"] == "target_source"
    # another order than the checkpoint's is refused, as another bucket_size is
    checkpoint = load_checkpoint(last)
    del checkpoint["config"]["training"]["pool_sort"]
    save_checkpoint(last, checkpoint)
    with pytest.raises(ConfigError, match=r"tiny.yaml: training.pool_sort: differs from the run"):
        make_trainer(tiny_task, tmp_path / "resumed", max_steps=14, pool_sort="source_target")
    with pytest.raises(ConfigError, match=r"tiny.yaml: training.pool_sort: differs from the run"):
        make_trainer(tiny_task, tmp_path / "new", max_steps=14, pool_sort="target_source")


def test_resume_refuses_a_data_file_that_changed(tiny_task, tmp_path):
    """A killed run resumed after its training file got more lines went on with the old vocabulary
    and a data position that indexed other batches, without a word: last.pt now holds a
    fingerprint of each data file, and a changed one is a one-line error naming key and file."""
    make_trainer(tiny_task, tmp_path / "run", max_steps=2).train()
    assert set(load_checkpoint(tmp_path / "run" / "last.pt")["trainer"]["data_files"]) == {
        "data.train.src", "data.train.tgt", "data.valid.src", "data.valid.tgt"}
    tgt = tiny_task["train"]["tgt"]
    before = os.path.getsize(tgt)
    with open(tgt, "a", encoding="utf-8") as handle:
        handle.write("fedcba\n")
    with pytest.raises(ConfigError) as caught:
        make_trainer(tiny_task, tmp_path / "run", max_steps=4)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"tiny.yaml: data.train.tgt: {tgt} changed since the run in {tmp_path / 'run'} "
                              f"saved last.pt (size {before} -> {before + 7} bytes)")
    assert "training.resume_ignore_data_change: true" in message
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 2  # nothing was touched


def test_resume_accepts_moved_data_of_the_same_content(tiny_task, tmp_path):
    """A data file named by another path (moved, copied, relative instead of absolute) resumes when
    its content is the run's (the fingerprint decides); another file under the new path is refused
    as a changed file, naming the key and the new path."""
    import shutil

    make_trainer(tiny_task, tmp_path / "run", max_steps=2).train()
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "data", moved)
    task = {split: {side: str(moved / os.path.basename(path)) for side, path in files.items()}
            for split, files in tiny_task.items()}
    trainer = make_trainer(task, tmp_path / "run", max_steps=4)
    assert trainer.resumed and trainer.progress.step == 2
    assert trainer.train().step == 4
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    assert last["config"]["data"]["train"]["src"] == task["train"]["src"]  # the new paths are the run's now
    with open(task["train"]["tgt"], "a", encoding="utf-8") as handle:
        handle.write("fedcba\n")
    with pytest.raises(ConfigError, match=rf"^tiny.yaml: data.train.tgt: {task['train']['tgt']} changed since"):
        make_trainer(tiny_task | {"train": task["train"]}, tmp_path / "run", max_steps=6)


def test_resume_names_a_same_size_edit_and_ignores_a_touch(tiny_task, tmp_path):
    make_trainer(tiny_task, tmp_path / "run", max_steps=2).train()
    src = tiny_task["valid"]["src"]
    os.utime(src, ns=(1, 1))  # another mtime alone (a copy onto another machine): not a change
    make_trainer(tiny_task, tmp_path / "run", max_steps=3).train()
    text = open(src, encoding="utf-8").read()
    with open(src, "w", encoding="utf-8") as handle:  # same size, another first letter
        handle.write(("f" if text[0] != "f" else "e") + text[1:])
    with pytest.raises(ConfigError, match=r"^tiny.yaml: data.valid.src: .* \(same size \(\d+ bytes\), other "
                       r"content in its first MiB and last MiB\)"):
        make_trainer(tiny_task, tmp_path / "run", max_steps=4)


def test_resume_ignore_data_change_resumes_with_a_warning(tiny_task, tmp_path, caplog, monkeypatch):
    import logging

    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # off after a CLI test's setup_logging
    monkeypatch.setattr(logging.getLogger("nmt"), "handlers", [])  # theirs may hold a closed stream
    make_trainer(tiny_task, tmp_path / "run", max_steps=2).train()
    with open(tiny_task["train"]["src"], "a", encoding="utf-8") as handle:
        handle.write("a b c\n")
    with open(tiny_task["train"]["tgt"], "a", encoding="utf-8") as handle:
        handle.write("cba\n")
    with caplog.at_level("WARNING", logger="nmt.train.trainer"):
        trainer = make_trainer(tiny_task, tmp_path / "run", max_steps=4, resume_ignore_data_change=True)
    assert trainer.resumed and trainer.progress.step == 2
    warned = [r.getMessage() for r in caplog.records if "resuming anyway" in r.getMessage()]
    assert [w.split(":")[0] for w in warned] == ["data.train.src", "data.train.tgt"]
    trainer.train()
    make_trainer(tiny_task, tmp_path / "run", max_steps=5)  # last.pt now holds the new files' fingerprints


def test_a_checkpoint_without_data_fingerprints_resumes(tiny_task, tmp_path):
    """Checkpoints written before fingerprints were recorded resume unchecked."""
    from nmt.train.checkpoint import save_checkpoint

    make_trainer(tiny_task, tmp_path / "run", max_steps=2).train()
    last = tmp_path / "run" / "last.pt"
    checkpoint = load_checkpoint(last)
    del checkpoint["trainer"]["data_files"]
    save_checkpoint(last, checkpoint)
    for side, line in (("src", "a b c\n"), ("tgt", "cba\n")):
        with open(tiny_task["train"][side], "a", encoding="utf-8") as handle:
            handle.write(line)
    assert make_trainer(tiny_task, tmp_path / "run", max_steps=3).train().step == 3
    assert "data_files" in load_checkpoint(last)["trainer"]


def test_model_errors_name_key_and_file(tiny_task, tmp_path):
    config = tiny_config(tiny_task, tmp_path / "run")
    config["model"]["embeddings"]["tie_output"] = True  # tgt_size 8 != decoder hidden 12
    with pytest.raises(ConfigError, match=r"^tiny.yaml: model\.embeddings\.tie_output: "):
        Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")


def test_model_construction_errors_name_section_and_file(tiny_task, tmp_path):
    config = tiny_config(tiny_task, tmp_path / "run")
    config["model"]["attention"]["score"] = "dot"  # decoder hidden 12 != encoder hidden
    if config["model"]["decoder"]["hidden_size"] == config["model"]["encoder"]["hidden_size"]:
        config["model"]["decoder"]["hidden_size"] += 2
    with pytest.raises(ConfigError, match=r"^tiny.yaml: model\.attention: score 'dot' needs"):
        Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")


def test_extending_a_finished_run(tiny_task, tmp_path):
    make_trainer(tiny_task, tmp_path / "run", max_steps=6).train()  # ends off the valid_every grid
    summary = make_trainer(tiny_task, tmp_path / "run", max_steps=10).train()
    assert summary.step == 10
    steps = [json.loads(l)["step"] for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [4, 6, 8, 10]


def test_extending_a_finished_run_keeps_the_patience_of_a_longer_run(tiny_task, tmp_path, monkeypatch):
    """The extra validation at the end of a run (off the valid_every grid) may give best.pt a new
    best, but must not reset or raise the bar of the early-stopping patience: extended to 20 steps,
    a run that ended at step 10 stops where a 20-step run stops (validation losses scripted)."""
    from nmt.train.validation import ValidationResult

    losses = {4: 1.0, 8: 1.1, 10: 0.9, 12: 1.05, 16: 1.2, 20: 1.3}
    current = {}
    monkeypatch.setattr("nmt.train.trainer.validate", lambda *args, **kwargs: ValidationResult(
        {"loss": losses[current["trainer"].progress.step]}))

    def run(save_dir, max_steps):
        current["trainer"] = make_trainer(tiny_task, save_dir, max_steps=max_steps, early_stopping_patience=2)
        return current["trainer"].train()

    straight = run(tmp_path / "straight", 20)
    assert (straight.stopped_by, straight.step) == ("early_stopping", 12)  # 1.1 and 1.05 do not beat 1.0
    first = run(tmp_path / "extended", 10)
    assert (first.stopped_by, first.best_step) == ("max_steps", 10)  # best.pt: the off-grid step 10
    extended = run(tmp_path / "extended", 20)
    assert (extended.stopped_by, extended.step) == ("early_stopping", 12)
    assert load_checkpoint(tmp_path / "extended" / "best.pt")["step"] == 10


def test_early_stopping_when_nothing_improves(tiny_task, tmp_path):
    trainer = make_trainer(tiny_task, tmp_path / "run", optimizer={"lr": 1e-30}, early_stopping_patience=2,
                           max_steps=100)
    summary = trainer.train()
    # lr 1e-30 (lr must be > 0): Adam's steps of ~1e-30 are below float32 resolution of the
    # weights, so they never change and the validation loss never improves after the first validation
    assert summary.stopped_by == "early_stopping" and summary.step == 12 and summary.best_step == 4


def test_max_epochs(tiny_task, tmp_path):
    summary = make_trainer(tiny_task, tmp_path / "run", max_steps=None, max_epochs=2).train()
    assert summary.stopped_by == "max_epochs" and summary.step == 10 and summary.epoch == 2


def test_max_minutes_stops_on_the_time_budget(tiny_task, tmp_path, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("nmt.train.trainer.time.perf_counter", lambda: clock[0])

    def tick(step):  # every update takes 10 s of the fake clock
        clock[0] += 10.0

    summary = make_trainer(tiny_task, tmp_path / "run", max_steps=None, max_minutes=1.0).train(step_hook=tick)
    assert summary.stopped_by == "max_minutes" and summary.step == 6
    assert (tmp_path / "run" / "last.pt").exists()  # the end-of-run validation saved it


def test_the_time_budget_of_a_resumed_run_counts_the_validation_before_its_checkpoint(tiny_task, tmp_path,
                                                                                       monkeypatch):
    """max_minutes counts validation time over all sessions: a run resumed from the checkpoint of
    a validation stops where an uninterrupted run does (fake clock: 5 s an update, 30 s a validation)."""
    import nmt.train.trainer as trainer_module

    clock = [0.0]
    monkeypatch.setattr("nmt.train.trainer.time.perf_counter", lambda: clock[0])
    real_validate = trainer_module.validate

    def slow_validate(*args, **kwargs):
        clock[0] += 30.0
        return real_validate(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "validate", slow_validate)
    real_step = Trainer.train_step

    def slow_step(self, indices):
        clock[0] += 5.0
        return real_step(self, indices)

    monkeypatch.setattr(Trainer, "train_step", slow_step)
    straight = make_trainer(tiny_task, tmp_path / "straight", max_steps=None, max_minutes=1.0).train()
    assert (straight.stopped_by, straight.step) == ("max_minutes", 6)  # 4 x 5 s + 30 s + 2 x 5 s
    make_trainer(tiny_task, tmp_path / "resumed", max_steps=4, max_minutes=1.0).train()
    assert load_checkpoint(tmp_path / "resumed" / "last.pt")["trainer"]["progress"]["elapsed"] == 50.0
    resumed = make_trainer(tiny_task, tmp_path / "resumed", max_steps=None, max_minutes=1.0).train()
    assert (resumed.stopped_by, resumed.step) == ("max_minutes", 6)


def test_a_run_needs_some_limit(tiny_task, tmp_path):
    with pytest.raises(ConfigError, match="max_minutes"):
        make_trainer(tiny_task, tmp_path / "run", max_steps=None)


@pytest.mark.parametrize("output", ["softmax", "sparsemax"])
def test_validation_statistics_match_per_sentence_brute_force(tiny_task, tmp_path, output):
    config = tiny_config(tiny_task, tmp_path / "run")
    config["model"]["output"]["mapping"] = output
    trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
    model, data = trainer.model.eval(), trainer.data.valid
    dev = trainer.device  # "auto": the GPU where there is one; the brute force runs there too
    # in IEEE float32 both (a no-op on the CPU): on CUDA, cuDNN's LSTM may take TF32 products for
    # float32 (torch's default), whose rounding differs between a padded batch and one sentence far
    # beyond rel 1e-5, and could flip an argmax or a sparse support at the margin
    with ieee_float32():
        stats = teacher_forced_statistics(model, data, trainer.loss_fn, 4, dev, output == "softmax")
    vocab = data.tgt_field.vocab
    loss = correct = tokens = att = out = 0.0
    with torch.no_grad(), ieee_float32():
        for src, tgt in zip(data.src, data.tgt):  # one unpadded sentence at a time
            logits, attention = model(torch.tensor([src], device=dev), torch.tensor([len(src)], device=dev),
                                      torch.tensor([[vocab.bos_index] + tgt], device=dev))
            gold = torch.tensor(tgt + [vocab.eos_index], device=dev)
            loss += trainer.loss_fn(logits[0], gold, reduction="sum").item()
            probs = model.output_mapping(logits[0])
            correct += (probs.argmax(-1) == gold).sum().item()
            tokens += len(gold)
            att += (attention[0] > 0).sum().item()
            out += (probs > 0).sum().item()
    assert stats["loss"] == pytest.approx(loss / tokens, rel=1e-5)
    assert stats["accuracy"] == pytest.approx(100 * correct / tokens)
    assert stats["attention_support"] == pytest.approx(att / tokens)
    assert stats["output_support"] == pytest.approx(out / tokens)
    assert ("ppl" in stats) == (output == "softmax")
    if output == "softmax":
        assert stats["ppl"] == pytest.approx(torch.tensor(loss / tokens).exp().item(), rel=1e-5)


def record_validation(monkeypatch) -> list:
    """The trainer's validations from now on, as ``(keyword arguments, ValidationResult)`` appended
    to the list returned (the real ``validate`` runs)."""
    import nmt.train.trainer as trainer_module

    seen, real_validate = [], trainer_module.validate

    def recording_validate(*args, **kwargs):
        result = real_validate(*args, **kwargs)
        seen.append((kwargs, result))
        return result

    monkeypatch.setattr(trainer_module, "validate", recording_validate)
    return seen


def test_validation_decoding_obeys_the_configured_length_ratio(tiny_task, tmp_path, monkeypatch):
    """``validation.max_length_ratio`` / ``max_length_offset`` reach the validation search: with
    ratio 0.5 and offset 0 no hypothesis is longer than half its source (the untrained model would
    run to ``validation.max_length``)."""
    seen = record_validation(monkeypatch)
    config = tiny_config(tiny_task, tmp_path / "run", max_steps=4)
    config["validation"].update(decode=True, max_length_ratio=0.5, max_length_offset=0)
    trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
    trainer.train()
    kwargs, result = seen[0]
    assert kwargs["search"].max_length_ratio == 0.5 and kwargs["search"].max_length_offset == 0
    data = trainer.data.valid
    assert len(result.hypotheses) == len(data.src)
    for src, hypothesis in zip(data.src, result.hypotheses):
        assert len(data.tgt_field.tokenize(hypothesis)) <= len(src) // 2


def test_validation_decoding_blocks_repeated_ngrams_as_configured(tiny_task, tmp_path, monkeypatch):
    """``validation.block_ngram_repeat`` reaches the validation search: with 1 no validation
    hypothesis repeats a token (the untrained model's do)."""
    seen = record_validation(monkeypatch)
    hypotheses = {}
    for block in (0, 1):
        seen.clear()
        config = tiny_config(tiny_task, tmp_path / f"run{block}", max_steps=4)
        config["validation"].update(decode=True, block_ngram_repeat=block, max_length=12)
        trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
        trainer.train()
        kwargs, result = seen[0]
        assert kwargs["search"].block_ngram_repeat == block
        field = trainer.data.valid.tgt_field
        hypotheses[block] = [field.tokenize(h) for h in result.hypotheses]
    assert all(len(set(tokens)) == len(tokens) for tokens in hypotheses[1])
    assert any(len(set(tokens)) < len(tokens) for tokens in hypotheses[0])


def test_a_negative_validation_block_ngram_repeat_is_a_config_error(tiny_task, tmp_path):
    config = tiny_config(tiny_task, tmp_path / "run")
    config["validation"]["block_ngram_repeat"] = -1
    with pytest.raises(ConfigError, match="validation.block_ngram_repeat"):
        resolve_config(config, "tiny.yaml")


def test_a_negative_validation_length_ratio_is_a_config_error(tiny_task, tmp_path):
    config = tiny_config(tiny_task, tmp_path / "run")
    config["validation"]["max_length_ratio"] = -1.0
    with pytest.raises(ConfigError, match="validation.max_length_ratio"):
        resolve_config(config, "tiny.yaml")


def test_a_fresh_start_drops_the_tensorboard_points_of_an_attempt_killed_before_its_first_checkpoint(
        tiny_task, tmp_path):
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from nmt.utils.tensorboard import TensorBoardWriter

    dead = TensorBoardWriter(tmp_path / "run" / "tensorboard")  # what a run killed at step 3 left
    dead.scalars("train", {"loss": 99.0}, 2)
    dead.close()
    time.sleep(1.1)  # event files are ordered by their names' time in seconds
    make_trainer(tiny_task, tmp_path / "run", tensorboard=True).train()  # no last.pt: a fresh start
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    points = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert [step for step, _ in points] == [2, 4, 6, 8, 10, 12] and 99.0 not in [v for _, v in points]
