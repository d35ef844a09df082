"""``nmt-train``: a smoke run on the generated quick-start task, and one-line config errors."""
import json

import pytest
import yaml

from nmt.cli.train import main

TINY_MODEL = {
    "embeddings": {"src_size": 8, "tgt_size": 8},
    "encoder": {"layers": 1, "hidden_size": 8},
    "decoder": {"layers": 1, "hidden_size": 8},
}


def quickstart_like(tmp_path, **changes) -> dict:
    config = yaml.safe_load(open(__file__.replace("tests/cli/test_train_cli.py", "configs/quickstart.yaml")))
    config["model"].update(TINY_MODEL)
    config["training"].update(max_steps=3, valid_every=3, log_every=1, tensorboard=False)
    config["validation"].update(n_heatmaps=0, max_length=5)
    for section, values in changes.items():
        config[section].update(values)
    return config


def run(tmp_path, monkeypatch, config, *extra):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return main(["-config", "c.yaml", "-quiet", *extra])


def test_smoke_generates_data_trains_and_resumes(tmp_path, monkeypatch, capsys):
    config = quickstart_like(tmp_path)
    assert run(tmp_path, monkeypatch, config) == 0
    for name in ("train.src", "train.tgt", "valid.src", "valid.tgt"):
        assert (tmp_path / "data" / "quickstart" / name).stat().st_size > 0
    run_dir = tmp_path / "runs" / "quickstart"
    assert {"last.pt", "best.pt", "config.yaml", "metrics.jsonl", "train.log"} <= {p.name for p in run_dir.iterdir()}
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 3 and 0 <= record["valid_exact_match"] <= 100
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["max_steps"] == 3
    log = (run_dir / "train.log").read_text()
    assert "step 2 (epoch 0): train loss" in log and "tokens/s" in log  # log_every=1; epoch as in the summary
    assert "certified=" in log and "valid bleu / chrf / ter: sacrebleu nrefs:1|" in log  # certified, BLEU signature
    captured = capsys.readouterr()  # -quiet (its --help): warnings and the closing summary line only
    assert "training finished (max_steps) at step 3" in captured.out
    assert " INFO " not in captured.err and " INFO " not in captured.out
    # same command, longer: resumes from last.pt
    assert run(tmp_path, monkeypatch, config, "-set", "training.max_steps=5") == 0
    assert "at step 5" in capsys.readouterr().out
    steps = [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3, 5]


@pytest.mark.parametrize("change, expected", [
    ({"training": {"max_step": 3}}, "c.yaml: training.max_step: unknown key 'max_step' (did you mean 'max_steps'?)"),
    ({"training": {"batch_size": "big"}}, "c.yaml: training.batch_size: must be an integer"),
    ({"model": {"output": {"mapping": "entmax"}}}, "c.yaml: model.output.mapping: unknown mapping 'entmax'"),
    ({"validation": {"length_penalty": "wu"}},
     "c.yaml: validation.length_penalty: must be one of none, average, gnmt, got 'wu'"),
    ({"validation": {"stepwise_penalty": True}},
     "c.yaml: validation.stepwise_penalty: applies to coverage_penalty wu or summary, got True with coverage_penalty none"),
])
def test_bad_config_is_one_line_error(tmp_path, monkeypatch, capsys, change, expected):
    config = quickstart_like(tmp_path, **change)
    assert run(tmp_path, monkeypatch, config) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and expected in err
    assert not (tmp_path / "data").exists()  # nothing was generated


def test_bad_override_and_missing_data(tmp_path, monkeypatch, capsys):
    config = quickstart_like(tmp_path)
    assert run(tmp_path, monkeypatch, config, "-set", "model.attention.mapping=sparsmax") == 2
    err = capsys.readouterr().err.strip()
    assert "c.yaml (-set model.attention.mapping=sparsmax): model.attention.mapping" in err
    assert "did you mean 'sparsemax'" in err
    config["data"]["generate"] = None
    assert run(tmp_path, monkeypatch, config) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "data/quickstart/train.src: no such file" in err


@pytest.mark.parametrize("device, expected", [
    ("tpu", "c.yaml: training.device: 'tpu' is not a device name; valid: auto, cpu, cuda, cuda:N\n"),
    ("gpu", "c.yaml: training.device: 'gpu' is not a device name; valid: auto, cpu, cuda, cuda:N\n"),
    ("cuda:x", "c.yaml: training.device: 'cuda:x' is not a device name; valid: auto, cpu, cuda, cuda:N\n"),
    ("xla", "c.yaml: training.device: 'xla' is not usable here ("),
    ("meta", "c.yaml: training.device: 'meta' is not usable here (the meta device holds no data)"),
])
def test_unusable_device_is_one_line_error(tmp_path, monkeypatch, capsys, device, expected):
    config = quickstart_like(tmp_path, training={"device": device})
    assert run(tmp_path, monkeypatch, config) == 2
    err = capsys.readouterr().err
    assert err.startswith("nmt-train: error: " + expected) and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_cuda_device_without_cuda_is_one_line_error(tmp_path, monkeypatch, capsys, device):
    """training.device cuda:N where CUDA is unavailable (simulated where it is): one line, nothing written."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run(tmp_path, monkeypatch, quickstart_like(tmp_path, training={"device": device})) == 2
    assert capsys.readouterr().err == (f"nmt-train: error: c.yaml: training.device: '{device}' requested but CUDA "
                                       "is not available\n")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


def test_any_other_bad_value_is_one_unquoted_line(tmp_path, monkeypatch, capsys):
    """A ValueError that is not a ConfigError (from anywhere in the run) prints its first line as
    it is, not its repr."""
    import nmt.train.trainer as trainer

    def refuse(config, source):
        raise ValueError("a 'bad' value\nsecond line")

    monkeypatch.setattr(trainer, "check_run_config", refuse)
    assert run(tmp_path, monkeypatch, quickstart_like(tmp_path)) == 2
    assert capsys.readouterr().err == "nmt-train: error: a 'bad' value\n"



@pytest.mark.parametrize("cxx, named", [
    ("/nonexistent/g++", "(CXX=/nonexistent/g++ is not an executable)"),
    (None, "(g++ is not on PATH)"),
])
def test_compile_without_a_cxx_compiler_is_one_line_error(tmp_path, monkeypatch, capsys, cxx, named):
    """``training.compile`` on the CPU with no C++ compiler for inductor (CXX pointing nowhere, or
    no g++ on PATH): one line naming the key, what is missing and the ways out, before anything is
    generated or written (it failed at the first step, deep inside inductor, after the data and the
    model were built)."""
    from torch._inductor import config as inductor_config

    monkeypatch.setenv("PATH", str(tmp_path / "no_compilers"))
    if cxx is None:
        monkeypatch.delenv("CXX", raising=False)
    else:
        monkeypatch.setenv("CXX", cxx)
    config = quickstart_like(tmp_path, training={"compile": True, "device": "cpu"})
    with inductor_config.patch({"cpp.cxx": (None, cxx or "g++")}):  # read from CXX when torch loads it
        assert run(tmp_path, monkeypatch, config) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("nmt-train: error: c.yaml: training.compile: torch.compile (inductor) needs a C++ "
                          f"compiler for CPU training and finds none {named}; install one"), err
    assert err.endswith("or set training.compile: false to train without compiling\n")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


def test_compiler_checks_name_cc_for_cuda_and_accept_a_found_one(tmp_path, monkeypatch):
    """On CUDA Triton compiles with $CC, else gcc or clang on PATH (checked without a GPU: the check
    only reads the device type)."""
    import sys

    from nmt.train.compile import compiler_problem

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert "(CC=/nonexistent/cc is not an executable); install one" in compiler_problem("cuda:1")
    monkeypatch.delenv("CC")
    assert "(CC is unset and neither gcc nor clang is on PATH)" in compiler_problem("cuda")
    monkeypatch.setenv("CC", sys.executable)  # any executable file: found
    assert compiler_problem("cuda") is None
    assert compiler_problem("meta") is None  # other device types: left to torch


def test_a_compiler_lost_after_the_check_is_one_line_error(tmp_path, monkeypatch, capsys):
    """A real inductor failure (no C++ compiler at compile time) is recognised in its exception
    chain; nmt-train turns it into one line; any other RuntimeError still propagates."""
    import torch
    from torch._inductor import config as inductor_config

    import nmt.train.trainer as trainer
    from nmt.train.compile import compiler_failure

    with inductor_config.patch({"cpp.cxx": (None, "/nonexistent/g++")}):
        with pytest.raises(RuntimeError) as info:
            torch.compile(lambda x: x.sin() + 1)(torch.randn(4))
    torch._dynamo.reset()
    assert compiler_failure(info.value).startswith("torch.compile (inductor) found no working C++ compiler")
    assert compiler_failure(RuntimeError("CUDA out of memory")) is None

    def fail(self):
        raise info.value

    monkeypatch.setattr(trainer.Trainer, "train", fail)
    monkeypatch.setattr(trainer, "compiler_problem", lambda device: None)
    assert run(tmp_path, monkeypatch, quickstart_like(tmp_path, training={"compile": True})) == 2
    err = capsys.readouterr().err
    assert err.startswith("nmt-train: error: c.yaml: training.compile: torch.compile (inductor) found no "
                          "working C++ compiler") and err.count("\n") == 1, err


@pytest.mark.parametrize("saved", [False, True])
def test_a_forced_quit_says_whether_a_checkpoint_holds_the_state(tmp_path, monkeypatch, capsys, saved):
    """A second Ctrl-C (KeyboardInterrupt out of the trainer) names last.pt only where one was saved."""
    import nmt.train.trainer as trainer

    def interrupted(self):
        if saved:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            (self.save_dir / "last.pt").write_bytes(b"")
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Trainer, "train", interrupted)
    assert run(tmp_path, monkeypatch, quickstart_like(tmp_path)) == 130
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == ("nmt-train: forced quit; last.pt holds the last saved state" if saved
                   else "nmt-train: forced quit; no checkpoint was saved: the same command starts over")


def test_a_truncated_last_pt_resumes_from_an_older_checkpoint_with_one_warning(tmp_path, monkeypatch, capsys):
    """Resume falls back to the newest checkpoint that loads (one warning line naming the file and
    why); when none loads, a one-line error naming each file, exit 2, and nothing is overwritten."""
    config = quickstart_like(tmp_path, training={"max_steps": 4, "valid_every": 2, "keep_last": 2})
    assert run(tmp_path, monkeypatch, config) == 0
    run_dir = tmp_path / "runs" / "quickstart"
    last = run_dir / "last.pt"
    data = last.read_bytes()
    last.unlink()  # a new inode: step_4.pt / best.pt, hard links of the old one, stay whole
    last.write_bytes(data[: len(data) // 3])  # a copy cut short (a full disk, an interrupted cp)
    capsys.readouterr()
    assert run(tmp_path, monkeypatch, config, "-set", "training.max_steps=6") == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if "last.pt: not a readable nmt checkpoint" in line]
    assert len(warning) == 1 and warning[0].endswith(
        f"; resuming from {run_dir.relative_to(tmp_path)}/step_4.pt (step 4) instead"), err
    steps = [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 6]
    for name in ("last.pt", "best.pt", "step_4.pt", "step_6.pt"):
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).write_bytes(b"")
    assert run(tmp_path, monkeypatch, config, "-set", "training.max_steps=8") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"nmt-train: error: {run_dir.relative_to(tmp_path)}: no checkpoint there can be resumed from (last.pt: ")
    assert all(f"{name}: not a readable" in err for name in ("last.pt", "best.pt", "step_4.pt", "step_6.pt"))
    assert (run_dir / "last.pt").read_bytes() == b""


def test_no_progress_bar_where_stderr_is_not_a_terminal(tmp_path, monkeypatch, capsys):
    """``training.progress`` draws tqdm's bar on a terminal only: a redirected stderr (a log file,
    here pytest's capture) gets the log lines and no carriage-return bar updates."""
    import sys

    assert not sys.stderr.isatty()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(quickstart_like(tmp_path)), encoding="utf-8")
    assert main(["-config", "c.yaml"]) == 0  # not -quiet: progress on, as configured
    err = capsys.readouterr().err
    assert "step 2 (epoch 0): train loss" in err and "\r" not in err and "step/s" not in err


def test_moving_average_from_the_command_line_and_translating_with_it(tmp_path, monkeypatch, capsys):
    """-set training.ema.decay=0.99 on the quick-start config: the validation log says it evaluates
    the average, best.pt holds it (and says so), and nmt-translate -model best.pt translates with it."""
    import torch

    from nmt.cli import translate as translate_cli
    from nmt.train.checkpoint import load_checkpoint

    config = quickstart_like(tmp_path)
    assert run(tmp_path, monkeypatch, config, "-set", "training.ema.decay=0.99") == 0
    run_dir = tmp_path / "runs" / "quickstart"
    log = (run_dir / "train.log").read_text()
    assert "ema: moving average of the weights, decay 0.99" in log and "step 3 valid (ema weights): loss=" in log
    best = load_checkpoint(run_dir / "best.pt")
    assert best["weights"] == "ema" and best["ema"]["averaged_updates"] == 3
    assert any(not torch.equal(best["model"][k], best["raw_model"][k]) for k in best["raw_model"])
    capsys.readouterr()
    source = tmp_path / "data" / "quickstart" / "valid.src"
    output = tmp_path / "valid.out"
    assert translate_cli.main(["-model", str(run_dir / "best.pt"), "-src", str(source), "-output", str(output),
                               "-max_length", "5"]) == 0
    assert len(output.read_text(encoding="utf-8").splitlines()) == len(source.read_text(encoding="utf-8").splitlines())


def test_set_cosine_schedule_end_to_end(tmp_path, monkeypatch, capsys):
    """``-set training.lr_schedule.type=cosine``: the logged lr of every step (train.log, %.3g) and
    of each validation (metrics.jsonl, exact) is the closed form at that step, min_lr at the last."""
    import math

    config = quickstart_like(tmp_path, training={"max_steps": 6, "valid_every": 3})
    assert run(tmp_path, monkeypatch, config, "-set", "training.lr_schedule.type=cosine",
               "training.lr_schedule.warmup_steps=2", "training.lr_schedule.min_lr=0.0001") == 0
    base, w, total, low = config["training"]["optimizer"]["lr"], 2, 6, 1e-4

    def closed(t):  # the lr of update t + 1, logged at step t
        if t < w:
            return base * (t + 1) / w
        return low + (base - low) * (1 + math.cos(math.pi * min(1.0, (t - w) / (total - w)))) / 2

    run_dir = tmp_path / "runs" / "quickstart"
    log = (run_dir / "train.log").read_text()
    for t in range(1, total + 1):
        assert f"step {t} (epoch 0): train loss" in log and f", lr {closed(t):.3g}, " in log.split(f"step {t} ")[1]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 6]
    assert [r["lr"] for r in records] == pytest.approx([closed(3), low], rel=1e-12)
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["lr_schedule"]["type"] == "cosine"


def test_validation_with_translate_search_flags_scores_what_nmt_translate_outputs(tmp_path, monkeypatch, capsys):
    """-set validation.length_penalty=gnmt ... coverage_penalty=wu ... ban_unk_token=true: the run's
    validation metrics and certificates are those of ``nmt-translate -model last.pt`` with the flags of
    the same names on the validation source (the run's one validation is at its last step)."""
    import sacrebleu

    from nmt.cli import translate as translate_cli

    config = quickstart_like(tmp_path)
    search = {"beam_size": 3, "length_penalty": "gnmt", "length_alpha": 1.0, "min_length": 1,
              "coverage_penalty": "wu", "beta": 0.3, "coverage_epsilon": 0.001, "stepwise_penalty": True,
              "ban_unk_token": True}
    settings = [f"validation.{key}={str(value).lower()}" for key, value in search.items()]
    assert run(tmp_path, monkeypatch, config, "-set", *settings) == 0
    run_dir = tmp_path / "runs" / "quickstart"
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 3
    assert "valid decoding (its exact match, bleu, chrf, ter and certified): beam_size=3 max_length=5 min_length=1 " \
           "length_penalty=gnmt length_alpha=1.0 coverage_penalty=wu beta=0.3 coverage_epsilon=0.001 " \
           "stepwise_penalty=True ban_unk_token=True" in (run_dir / "train.log").read_text()
    capsys.readouterr()
    source, output, report = (tmp_path / "data" / "quickstart" / "valid.src", tmp_path / "valid.out",
                              tmp_path / "valid.jsonl")
    flags = [f"-{key}" if value is True else f"-{key} {value}" for key, value in search.items()]
    assert translate_cli.main(["-model", str(run_dir / "last.pt"), "-src", str(source), "-output", str(output),
                               "-report", str(report), "-max_length", "5", *" ".join(flags).split()]) == 0
    hypotheses = output.read_text(encoding="utf-8").splitlines()
    references = (tmp_path / "data" / "quickstart" / "valid.tgt").read_text(encoding="utf-8").splitlines()
    certified = [json.loads(line)["certified"] for line in report.read_text(encoding="utf-8").splitlines()]
    assert len(hypotheses) == len(references) == len(certified)
    assert record["valid_chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    assert record["valid_bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert record["valid_exact_match"] == pytest.approx(
        100.0 * sum(h == r for h, r in zip(hypotheses, references)) / len(references))
    assert record["valid_certified"] == pytest.approx(100.0 * sum(certified) / len(certified))
