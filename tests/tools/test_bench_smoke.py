"""Smoke runs of the benchmarks that tools/gpu_check.sh drives: they run and report figures.

Timing is never asserted (speed goals live in the benchmarks' output, not in tests); these check
that the scripts still run end to end on the CPU with their diagnostics on. The benchmarks run on
one torch thread (``--threads 1``, as every test: the suite's workers share the cores), and
tools/bench_train.py's in test_bench_train_smoke.py (two files, so that ``pytest -n 2 --dist
loadfile`` spreads them over both workers)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_tools import TOOLS  # noqa: E402
from bench_tools import load as _load  # noqa: E402


@pytest.mark.parametrize("extra", [[], ["--no-package", "--spread", "0.1"]])
def test_bench_sparse_quick(capsys, extra):
    """``bench_sparse --quick``: the mapping and loss tables with their host sync counts; with
    ``--no-package`` the header says the package's columns are left out, with ``--spread`` the
    scores' deviation."""
    bench = _load("bench_sparse")
    try:
        bench.main(["--quick", "--threads", "1", *extra])
    except SystemExit as exit_:  # argparse-style exits: only success is fine
        assert exit_.code in (0, None)
    printed = capsys.readouterr().out
    assert "softmax" in printed and "entmax15" in printed
    assert ("entmax package: left out" in printed) == bool(extra)
    assert f"scores N(0, {'0.1' if extra else '1'}^2)" in printed


def test_bench_sparse_as_a_narrower_processor():
    """``bench_sparse --cpu-width avx2``: the script runs itself again with torch held to its AVX2
    kernels (``ATEN_CPU_CAPABILITY``) and nmt's native library built without the AVX-512 functions,
    and prints its tables under that header."""
    from nmt.sparse import _native

    if not _native.available():
        pytest.skip("native library not built")
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["PYTHONPATH"] = os.pathsep.join([str(TOOLS.parent), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(TOOLS / "bench_sparse.py"), "--quick", "--threads", "1",
                           "--no-losses", "--no-package", "--shapes", "64x300", "--cpu-width", "avx2"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CPU width avx2" in done.stdout and "entmax15" in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("name,expect", [("bench_structured", ("fusedmax", "oscarmax", "training step")),
                                         ("bench_continuous", ("entmax15", "softmax"))])
def test_the_attention_benchmarks_run(capsys, name, expect):
    """``bench_structured --quick`` and ``bench_continuous --quick`` (their timing helper lives in
    bench_sparse: they failed to import once it was renamed, unnoticed until this test) print
    their tables."""
    bench = _load(name)
    try:
        bench.main(["--quick", "--threads", "1"])
    except SystemExit as exit_:
        assert exit_.code in (0, None)
    printed = capsys.readouterr().out
    assert all(word in printed for word in expect), printed[-2000:]


def test_bench_launch_quick():
    """``bench_launch --quick --device cpu``: every layer's host time per call through Triton's real
    launch path with the stand-in driver (kernels compiled for sm_90, no GPU), each launch reaching
    the stand-in launcher. In a fresh process: this one may have imported triton for its
    interpreter, whose library functions do not compile."""
    pytest.importorskip("triton")
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("triton without its NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    out = subprocess.run([sys.executable, str(TOOLS / "bench_launch.py"), "--quick", "--device", "cpu",
                          "--threads", "1"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    for label in ("Triton launch", "Triton launch, tensors to the launcher", "entmax15 forward+backward",
                  "cross_entropy_loss forward+backward", "entmax_bisect, learned alpha, fwd+bwd",
                  "Triton launch, from a second thread", "entmax15 backward (retained graph)"):
        assert label in out.stdout
    assert int(out.stdout.split("# ")[-1].split()[0]) > 0  # launches reached the stand-in launcher


@pytest.mark.cuda
def test_bench_sparse_graphs(capsys):
    """``bench_sparse --graphs``: on CUDA the mappings and losses captured in CUDA graphs and timed
    as replays (no host sync may happen inside a capture, so this also checks that); elsewhere a
    one-line refusal."""
    bench = _load("bench_sparse")
    if torch.cuda.is_available():
        bench.main(["--device", "cuda", "--graphs", "--quick"])
        printed = capsys.readouterr().out
        assert "CUDA-graph replays" in printed and "entmax15_loss" in printed
        return
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--graphs", "--quick"])
    assert exit_.value.code == 2 and "--graphs needs --device cuda" in capsys.readouterr().err



def test_bench_host_quick(tmp_path):
    """``bench_host --quick``: the eager update's host work on the CUDA route (stand-in driver, no
    GPU), per setting: torch operations, Python calls, Triton launches by kernel, host syncs and
    times, each setting's extra work against softmax / softmax by function and by site. The
    1.5-entmax attention launches the mapping kernels at every decoder step; softmax / softmax
    launches none of them (its loss the cross-entropy kernels only). In a fresh process: the tool
    sets the environment (no native code) before importing nmt, and may not share triton with
    an interpreter."""
    pytest.importorskip("triton")
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("triton without its NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out_json = tmp_path / "host.json"
    out = subprocess.run([sys.executable, str(TOOLS / "bench_host.py"), "--quick", "--json", str(out_json),
                          "--rows", "entmax15 / entmax15"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads(out_json.read_text())
    rows = {row["setting"]: row for row in report["rows"]}
    assert list(rows) == ["softmax / softmax", "entmax15 / entmax15"]  # the baseline first, always
    steps = sum(shape[2] for shape in report["model"]["batch_shapes"]) / report["model"]["batches"]
    for row in rows.values():
        assert row["torch_ops"] > 100 and row["python_calls"] > 100 and row["host_ms"] > 0 and row["cpu_ms"] > 0
        assert row["host_syncs"] == 0 and row["jit_runs"] == 0  # sync-free; every launch from nmt's cache
        assert sum(row["python_calls_by_layer"].values()) == pytest.approx(row["python_calls"])
        assert sum(row["torch_ops_by_site"].values()) == pytest.approx(row["torch_ops"])
    soft, ent = rows["softmax / softmax"]["launches_by_kernel"], rows["entmax15 / entmax15"]["launches_by_kernel"]
    assert not set(soft) & {"_forward_kernel", "_backward_kernel"}
    assert set(soft) == {"_ce_forward_kernel", "_ce_backward_kernel", "_finish_kernel"}
    # one forward and one backward launch per decoder step (attention), the loss's forward once more
    assert ent["_forward_kernel"] == steps + 1 and ent["_backward_kernel"] == steps
    extra = rows["entmax15 / entmax15"]["extra_vs_softmax"]
    assert extra["python_calls_by_function"] and extra["torch_ops_by_site"]
    assert any("Entmax15" in site for site, _ in extra["torch_ops_by_site"])
    for label in ("torch ops", "py calls", "launches by kernel", "minus softmax / softmax"):
        assert label in out.stdout
    # --against: a report against itself differs nowhere
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _load("bench_host").print_against(report, report, 5)
    lines = printed.getvalue().splitlines()
    assert any(line.startswith("softmax / softmax") and line.count(" -> ") == 5 for line in lines)
    assert not [line for line in lines if line.strip().startswith(("+", "-"))]


def test_bench_translate_sampling_rows_run_both_loops(tmp_path):
    """The sampling table of tools/bench_translate.py on a random-weight checkpoint: every setting
    gets both loops' figures, and the loops' samples agree (the tool's own differ count)."""
    import argparse

    from nmt.data.field import Field
    from nmt.data.tokenizers import CharTokenizer, SpaceTokenizer
    from nmt.models import build_model
    from nmt.utils.checkpoint_file import save_checkpoint

    config = {
        "type": "rnn",
        "embeddings": {"src_size": 8, "tgt_size": 8, "share": False, "tie_output": False, "dropout": 0.0},
        "encoder": {"type": "lstm", "layers": 1, "hidden_size": 12, "bidirectional": True, "dropout": 0.0},
        "decoder": {"type": "lstm", "layers": 1, "hidden_size": 12, "dropout": 0.0, "input_feeding": True,
                    "bridge": "linear"},
        "attention": {"score": "general", "mapping": "softmax", "params": {}, "continuous": None},
        "output": {"mapping": "entmax15", "params": {}},
    }
    src, tgt = Field.build(SpaceTokenizer(), ["a b c d e f"]), Field.build(CharTokenizer(), ["abcdef"])
    torch.manual_seed(0)
    model = build_model(config, len(src.vocab), len(tgt.vocab), tgt.vocab.pad_index)
    with torch.no_grad():
        model.generator.proj.weight.mul_(3.0)
        model.generator.proj.bias[tgt.vocab.eos_index] += 1.0
    save_checkpoint(tmp_path / "m.pt", {"kind": "model", "model": model.state_dict(), "config": {"model": config},
                                        "src_field": src.state_dict(), "tgt_field": tgt.state_dict(), "step": 1})
    bench = _load("bench_translate")
    args = argparse.Namespace(device="cpu", precision="fp32", batch_size=4, repeats=1, max_length=10,
                              max_length_ratio=0.0, stop_every=4)
    lines = ["a b c", "d e", "f a b d", "c", "e e f a", "b d"]
    rows = bench.sampling_rows({"entmax15": str(tmp_path / "m.pt")}, lines, args)
    sampled = [r for r in rows if "sent_per_s_static" in r]
    assert [r["setting"] for r in sampled] == [label for label, _ in bench.SAMPLING_SETTINGS]
    assert all(r["differ"] == 0 and r["sent_per_s_dynamic"] > 0 for r in sampled)
    assert [r["setting"] for r in rows if "sent_per_s" in r] == ["beam 5", "beam 5 block 3"]


def test_bench_subword_sampling_quick(tmp_path, capsys):
    """``bench_subword_sampling --quick``: a row per sampler setting with the time of every epoch."""
    bench = _load("bench_subword_sampling")
    out = tmp_path / "subword.json"
    assert bench.main(["--quick", "--epochs", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["tokenizer"] for r in rows] == ["sentencepiece", "sentencepiece", "bpe"]
    assert all(len(r["epoch_s"]) == 2 and r["deterministic_s"] > 0 and "kept" in r["summary"] for r in rows)
    assert "seconds per epoch" in capsys.readouterr().out


def test_bench_sampled_vocabulary_quick(tmp_path, capsys):
    """``bench_sampled_vocabulary --quick``: per sampler and vocab_samples N, the counting time and
    each epoch's <unk> counts; epochs below N have none (the vocabulary counted their pieces)."""
    bench = _load("bench_sampled_vocabulary")
    out = tmp_path / "vocab.json"
    assert bench.main(["--quick", "--epochs", "2", "--samples", "0,2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["tokenizer"], r["vocab_samples"]) for r in rows] == [
        ("sentencepiece", 0), ("sentencepiece", 2), ("bpe", 0), ("bpe", 2)]
    assert all(src_unk == 0 and tgt_unk == 0 for r in rows if r["vocab_samples"] == 2
               for src_unk, _, tgt_unk, _ in r["unk"])
    assert rows[2]["unk"][0][0] > 0  # BPE-dropout over the deterministic vocabulary: unknown pieces
    assert "<unk> share" in capsys.readouterr().out


def test_bench_ema_quick(tmp_path, capsys):
    """``bench_ema --quick``: the quick-start model's EMA update, swap and training update timed."""
    bench = _load("bench_ema")
    out = tmp_path / "ema.json"
    assert bench.main(["--quick", "--threads", "1", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["model"] == "quickstart" and row["parameters"] > 0
    assert row["ema_update_ms"] > 0 and row["swap_ms"] > 0 and row["train_update_ms"] > 0
    assert "EMA update" in capsys.readouterr().out


def test_bench_optimizers_quick_and_on_a_small_corpus(tmp_path, capsys):
    """``bench_optimizers --quick``: every optimizer's step, update, state and host syncs on the
    quick-start model (the state of Adafactor without first moments a small fraction of Adam's,
    torch's Adafactor the only one reading from the device); ``--multi30k``: two trainings translated."""
    bench = _load("bench_optimizers")
    out = tmp_path / "optimizers.json"
    assert bench.main(["--quick", "--threads", "1", "--json", str(out)]) == 0
    rows = {r["optimizer"]: r for r in json.loads(out.read_text())["results"]}
    assert list(rows) == ["adam", "adamw", "sgd", "adafactor", "adafactor beta1", "torch Adafactor"]
    assert all(r["step_ms"] > 0 and r["update_ms"] > 0 for r in rows.values())
    assert rows["adafactor"]["state_mb"] < 0.05 * rows["adam"]["state_mb"]
    assert [name for name, r in rows.items() if r["host_syncs"]] == ["torch Adafactor"]
    assert "x adam" in capsys.readouterr().out
    corpus = tmp_path / "multi30k"
    corpus.mkdir()
    spm = pytest.importorskip("sentencepiece")
    small_corpus(corpus, spm, seed=5)
    for lang in ("de", "en"):
        (corpus / f"test_2016_flickr.{lang}").write_text((corpus / f"val.{lang}").read_text())
    assert bench.main(["--multi30k", str(corpus), "--steps", "3", "--test-lines", "5", "--threads", "1", "--quiet",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["optimizer"], r["lr"]) for r in rows] == [("adam", 0.001), ("adafactor", 0.01)]
    assert all(0.0 <= r["bleu"] <= 100.0 and 0.0 <= r["certified"] <= 100.0 for r in rows)


def test_bench_alignment_smoke(tmp_path, capsys):
    """``bench_alignment`` on a few pairs and steps: four rows (causal / full context, plain / guided),
    each a validation AER in [0, 1]; the task's references are the shuffles (checked on its files)."""
    bench = _load("bench_alignment")
    bench.permutation_task(tmp_path / "task", 20, 5)
    for src, tgt, align in zip(*((tmp_path / "task" / f"train.{e}").read_text().splitlines()
                                 for e in ("src", "tgt", "align"))):
        pairs = [tuple(map(int, p.split("-"))) for p in align.split()]
        assert sorted(j for _, j in pairs) == list(range(len(src.split())))
        assert all(src.split()[i].upper() == tgt.split()[j] for i, j in pairs)
    out = tmp_path / "a.json"
    assert bench.main(["--pairs", "40", "--valid", "5", "--steps", "3", "--quiet", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["alignment"], r["weight"]) for r in rows] == [("causal", 0.0), ("causal", 1.0), ("full context", 0.0),
                                                               ("full context", 1.0)]
    assert all(0.0 <= r["aer"] <= 1.0 for r in rows)
    assert "validation AER" in capsys.readouterr().out


def small_corpus(directory, spm, seed: int) -> None:
    """A random Multi30k-shaped corpus in ``directory`` (train / val .de / .en, up to 20 words a line)
    and its joint sentencepiece model ``spm.model`` (150 pieces): what the harness benchmarks read."""
    import random

    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))) for _ in range(200)]
    for split, n in (("train", 300), ("val", 10)):
        for lang in ("de", "en"):
            lines = (" ".join(rng.choice(words) for _ in range(rng.randint(1, 20))) for _ in range(n))
            (directory / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=f"{directory / 'train.de'},{directory / 'train.en'}",
                                   model_prefix=str(directory / "spm"), vocab_size=150, minloglevel=2)


def test_bench_cross_kv_on_a_small_corpus(tmp_path, capsys):
    """``bench_cross_kv``'s modes on a small random corpus with its own sentencepiece model: the padded
    share equals a count of the source's pad ids, ``ab`` leaves the decoder's projection as it found
    it, and every mode prints its figures."""
    spm = pytest.importorskip("sentencepiece")

    bench = _load("bench_cross_kv")
    small_corpus(tmp_path, spm, seed=0)
    common = ["--data-dir", str(tmp_path), "--spm", str(tmp_path / "spm.model"), "--batch-size", "8", "--threads", "1"]
    cfg = bench.config(tmp_path, tmp_path / "spm.model", "target", overrides=("training.batch_size=8",))
    batches, _, _ = bench.batches(cfg, None)
    pads = sum(int((b.src == bench.PAD).sum()) for b in batches)
    assert bench.padded_share(batches) == pytest.approx(pads / sum(b.src.numel() for b in batches))
    projection = bench.TransformerDecoder.cross_keys_values
    small = ["--warmup", "1", "--batches", "1", "--passes", "2"]
    for mode in ("padding", "ab", "share"):
        assert bench.main([mode, *common, *small]) == 0
    assert bench.TransformerDecoder.cross_keys_values is projection
    printed = capsys.readouterr().out
    assert f"pool_sort target: {len(batches)} batches, {pads / sum(b.src.numel() for b in batches):.1%}" in printed
    assert "median of the passes' ratios" in printed and "the padding's" in printed


def test_bench_checkpointing_on_a_small_corpus(tmp_path, capsys):
    """``bench_checkpointing``'s modes on a small random corpus with its own sentencepiece model: the
    allocation curve is the running sum of the profile's allocations (a known tensor's bytes), the
    checkpointed step holds fewer bytes for the backward, and both modes print their figures."""
    spm = pytest.importorskip("sentencepiece")

    bench = _load("bench_checkpointing")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        x = torch.empty(1000, 250)
        del x
    curve = bench.allocation_curve(prof)
    assert max(curve) >= 1000 * 250 * 4 and curve[-1] == 0
    small_corpus(tmp_path, spm, seed=0)
    common = ["--data-dir", str(tmp_path), "--spm", str(tmp_path / "spm.model"), "--batch-size", "8",
              "--warmup", "1", "--batches", "2", "--passes", "1", "--threads", "1"]
    assert bench.main(["memory", *common]) == 0
    printed = capsys.readouterr().out
    held = [float(line.split("backward")[1].split("MiB")[0]) for line in printed.splitlines()
            if line.startswith("checkpoint_activations")]
    assert len(held) == 2 and held[1] < held[0]
    assert bench.main(["time", *common]) == 0
    assert "median of the passes' ratios" in capsys.readouterr().out


def test_bench_lstm_padding_on_a_small_corpus(tmp_path, capsys):
    """``bench_lstm_padding``'s modes on a small random corpus: an unpadded twin holds the batch's
    real source tokens in order and no padding, ``ab`` leaves the row-group setting as it found
    it, and every mode prints its figures."""
    spm = pytest.importorskip("sentencepiece")

    from nmt.models import inert_padding_lstm

    bench = _load("bench_lstm_padding")
    small_corpus(tmp_path, spm, seed=1)
    cfg = bench.config(tmp_path, tmp_path / "spm.model", "target", "softmax")
    batches, _, _ = bench.batches(cfg, 3)
    for batch in batches:
        twin = bench.ideal(batch)
        real = batch.src[torch.arange(batch.src.size(1))[None] < batch.src_lengths[:, None]]
        assert twin.src.size(0) == batch.src.size(0) and torch.all(twin.src_lengths == twin.src.size(1))
        assert torch.equal(twin.src.reshape(-1)[:real.numel()], real) and torch.equal(twin.tgt_out, batch.tgt_out)
    common = ["--data-dir", str(tmp_path), "--spm", str(tmp_path / "spm.model"), "--warmup", "1", "--batches", "1",
              "--passes", "2", "--batch-size", "8", "--threads", "1"]
    default = inert_padding_lstm.MAX_GROUPS
    for mode in ("share", "ab", "step"):
        assert bench.main([mode, *common]) == 0
    assert inert_padding_lstm.MAX_GROUPS == default
    printed = capsys.readouterr().out
    assert "of it the encoder" in printed and "median of the passes' ratios" in printed and "ms_per_step_min" in printed


def test_bench_source_noise_smoke(tmp_path, capsys):
    """``bench_source_noise`` on a small Multi30k-shaped corpus (its test set a copy of val): two
    rows (plain, noised) with BLEU on clean and noised sources; the noised test sources are words
    of the clean ones (or <unk>), one at least left of each line, none moved more than 3 places
    when nothing is deleted."""
    spm = pytest.importorskip("sentencepiece")
    bench = _load("bench_source_noise")
    small_corpus(tmp_path, spm, seed=3)
    for lang in ("de", "en"):
        (tmp_path / f"test_2016_flickr.{lang}").write_text((tmp_path / f"val.{lang}").read_text())
    lines = (tmp_path / "train.de").read_text().splitlines()[:100]
    noised = bench.noised_lines(lines, {"delete": 0.3, "blank": 0.2, "shuffle": 3}, seed=1)
    assert all(n and set(n.split()) <= set(line.split()) | {"<unk>"} for n, line in zip(noised, lines))
    assert sum(n != line for n, line in zip(noised, lines)) > 50
    moved = bench.noised_lines(lines, {"shuffle": 3}, seed=1)
    for n, line in zip(moved, lines):
        words, places = line.split(), []
        for w in n.split():  # each word's first unused place in the line
            places.append(next(i for i, v in enumerate(words) if v == w and i not in places))
        assert sorted(places) == list(range(len(words))) and all(abs(a - b) <= 3 for a, b in enumerate(places))
    out = tmp_path / "noise.json"
    assert bench.main(["--data", str(tmp_path), "--steps", "3", "--test-lines", "5", "--quiet", "--json", str(out),
                       "--runs", "plain", "noised", "word_dropout"]) == 0
    rows = json.loads(out.read_text())
    assert [r["training"] for r in rows] == ["plain", "noised", "word_dropout"]
    assert all(0.0 <= r[k] <= 100.0 for r in rows for k in ("clean", "noised"))
    assert "BLEU noised" in capsys.readouterr().out


def test_bench_backtranslation_smoke(tmp_path, capsys):
    """``bench_backtranslation`` on a small Multi30k-shaped corpus: a reverse model, its back-translations,
    and the four forward runs (real, bt, bt_tagged, bt_noised), each with a BLEU in [0, 100]."""
    spm = pytest.importorskip("sentencepiece")
    bench = _load("bench_backtranslation")
    small_corpus(tmp_path, spm, seed=4)
    for lang in ("de", "en"):
        (tmp_path / f"test_2016_flickr.{lang}").write_text((tmp_path / f"val.{lang}").read_text())
    out = tmp_path / "bt.json"
    assert bench.main(["--data", str(tmp_path), "--real", "60", "--mono", "40", "--steps", "3", "--test-lines", "5",
                       "--quiet", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["training"] for r in result["rows"]] == ["real", "bt", "bt_tagged", "bt_noised"]
    assert all(0.0 <= r["bleu"] <= 100.0 for r in result["rows"]) and 0.0 <= result["reverse_bleu"] <= 100.0
    assert "monolingual en lines back-translated" in capsys.readouterr().out


def test_bench_copy_smoke(tmp_path, capsys):
    """``bench_copy`` on a small prepared morphology setting (two languages, lemma -> lemma + suffix):
    a plain and a copying run per seed, each with macro accuracy and certificate shares in [0, 100]
    and its speeds, and the speed ratios."""
    import random

    bench = _load("bench_copy")
    rng = random.Random(0)
    for split, n in (("train", 60), ("valid", 10), ("dev", 12)):
        src, tgt, lang = [], [], []
        for i in range(n):
            language = ("english", "german")[i % 2]
            lemma = "".join(rng.choice("abcdef") for _ in range(rng.randint(2, 5)))
            src.append(f"<{language}> V PST " + " ".join(lemma))
            tgt.append(lemma + ("ed" if language == "english" else "te"))
            lang.append(language)
        for ext, values in (("src", src), ("tgt", tgt), ("lang", lang)):
            (tmp_path / f"{split}.{ext}").write_text("".join(v + "\n" for v in values), encoding="utf-8")
    out = tmp_path / "copy.json"
    assert bench.main(["--data", str(tmp_path), "--steps", "4", "--valid-every", "2", "--seeds", "1",
                       "--dev-lines", "6", "--quiet", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["run"], r["copy"]) for r in rows] == [("plain-1", False), ("copy-1", True)]
    assert all(0.0 <= r[k] <= 100.0 for r in rows for k in ("accuracy", "certified", "single"))
    assert all(r["decode_sentences_per_sec"] > 0 for r in rows)
    assert "copying / plain speed" in capsys.readouterr().out
    corpus = tmp_path / "multi30k"  # the translation mode, on a Multi30k-shaped corpus (its test set: val)
    corpus.mkdir()
    spm = pytest.importorskip("sentencepiece")
    small_corpus(corpus, spm, seed=4)
    for lang in ("de", "en"):
        (corpus / f"test_2016_flickr.{lang}").write_text((corpus / f"val.{lang}").read_text())
    assert bench.main(["--multi30k", str(corpus), "--steps", "3", "--seeds", "1", "--dev-lines", "5", "--quiet",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["run"], r["copy"]) for r in rows] == [("plain-1", False), ("copy-1", True)]
    assert all(0.0 <= r[k] <= 100.0 for r in rows for k in ("bleu", "bleu_replace_unk", "certified"))
    assert "+repl.unk" in capsys.readouterr().out


def test_bench_coverage_smoke(tmp_path, capsys):
    """``bench_coverage`` on a small Multi30k-shaped corpus: the plain, coverage and loss-only runs, each
    with BLEU, repetition share and certified share in [0, 100]; the bigram test by hand."""
    spm = pytest.importorskip("sentencepiece")
    bench = _load("bench_coverage")
    assert bench.repeats_a_bigram("a b c a b") and not bench.repeats_a_bigram("a b b a")
    small_corpus(tmp_path, spm, seed=5)
    for lang in ("de", "en"):
        (tmp_path / f"test_2016_flickr.{lang}").write_text((tmp_path / f"val.{lang}").read_text())
    out = tmp_path / "coverage.json"
    assert bench.main(["--data", str(tmp_path), "--steps", "3", "--test-lines", "5", "--quiet", "--json",
                       str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["run"] for r in rows] == ["plain", "coverage", "loss"]
    assert all(0.0 <= r[k] <= 100.0 for r in rows for k in ("bleu", "repeating_percent", "certified"))
    assert "repeating %" in capsys.readouterr().out
    # --late: the attention run (trained first, no row asked) continued without and with the loss
    assert bench.main(["--data", str(tmp_path), "--steps", "3", "--runs", "plain", "--late", "2", "--test-lines",
                       "5", "--quiet", "--json", str(out)]) == 0
    assert [r["run"] for r in json.loads(out.read_text())] == ["plain", "continued", "late loss"]
    assert "late phases of 2 updates" in capsys.readouterr().out
