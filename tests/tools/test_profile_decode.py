"""tools/profile_decode.py on a tiny Transformer: its phases are the search's, counted independently,
and its wrappers leave the profiled methods as they were. Timing is never asserted."""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

import nmt
from tiny_runs import data_section, train_run, write_reversal

TOOLS = Path(__file__).resolve().parents[2] / "tools"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("profile_decode", TOOLS / "profile_decode.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["profile_decode"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def transformer(tmp_path_factory) -> tuple[str, str]:
    """A tiny softmax Transformer trained a few steps, and 70 source lines (two batches of 64)."""
    root = tmp_path_factory.mktemp("profile_decode")
    write_reversal(root, 70, 6, max_letters=5, spaced_source=False)
    config = {
        "data": data_section(root, "char", "char"),
        "model": {"type": "transformer", "embeddings": {"dropout": 0.0},
                  "transformer": {"encoder_layers": 1, "decoder_layers": 2, "d_model": 16, "heads": 4,
                                  "d_ff": 32, "dropout": 0.0, "attention_dropout": 0.0}},
        "training": {"save_dir": str(root / "run"), "batch_size": 16, "max_steps": 6, "valid_every": 6,
                     "log_every": 6, "keep_last": 1, "progress": False, "threads": 1, "tensorboard": False,
                     "optimizer": {"name": "adam", "lr": 0.01}},
        "validation": {"metric": "loss", "batch_size": 8, "max_length": 8, "n_heatmaps": 0},
    }
    return str(train_run(config, root / "config.yaml") / "last.pt"), str(root / "train.src")


def _methods(tool) -> list:
    """The profiled methods as they are now (module functions or the classes' own attributes)."""
    found = []
    for module_name, owner_name, method, _ in tool.LABELLED + tool.TIMED:
        owner = importlib.import_module(module_name)
        found.append(getattr(owner, owner_name).__dict__[method] if owner_name else getattr(owner, method))
    return found


def _independent_counts(model_path: str, src: str, beam: int, count_calls) -> dict[str, int]:
    """Calls of the model's step and encode in the same translation, counted by other wrappers."""
    from nmt.models.transformer.model import TransformerSeq2Seq

    steps = count_calls(TransformerSeq2Seq, "step_with_scores")
    encodes = count_calls(TransformerSeq2Seq, "encode")
    search = {"beam_size": beam, **({"length_penalty": "average"} if beam > 1 else {})}
    model = nmt.load(model_path, device="cpu", batch_size=64, max_length=100, **search)
    lines = Path(src).read_text(encoding="utf-8").splitlines()
    model.translate(lines)
    return {"step": len(steps), "encode": len(encodes)}


@pytest.mark.parametrize("beam", [1, 5])
def test_timers_count_the_searchs_own_calls_and_restore_the_methods(tool, transformer, beam, capsys, count_calls):
    model_path, src = transformer
    before = _methods(tool)
    tool.main(["timers", "--model", model_path, "--src", src, "--beam", str(beam), "--threads", "1", "--reps", "2"])
    out = capsys.readouterr().out
    assert _methods(tool) == before
    calls = {label: int(n) for label, n in re.findall(r"^  (\w[\w :.()-]*?)\s+CPU .* calls (\d+)$", out, re.M)}
    expected = _independent_counts(model_path, src, beam, count_calls)
    assert calls["step"] == expected["step"] > 0
    assert calls["encode"] == expected["encode"] == 2  # 70 lines, batches of 64
    assert calls["translate"] == 1
    cpu = {label: float(s) for label, s in re.findall(r"^  (\w[\w :.()-]*?)\s+CPU\s+([0-9.]+) s", out, re.M)}
    assert sum(v for k, v in cpu.items() if k != "translate") <= cpu["translate"] + 1e-3


def test_profile_labels_every_sublayer_and_restores_the_methods(tool, transformer, capsys):
    model_path, src = transformer
    before = _methods(tool)
    tool.main(["profile", "--model", model_path, "--src", src, "--beam", "5", "--threads", "1"])
    out = capsys.readouterr().out
    assert _methods(tool) == before
    paths = set(re.findall(r"^  (search\S*)", out, re.M))
    for label in ("search/encode/layer/qkv_proj", "search/encode/layer/feed_forward", "search/encode/cross_kv",
                  "search/step/layer/attend", "search/step/layer/cross_attention/attend",
                  "search/step/layer/feed_forward", "search/step/layer/norm", "search/step/output_layer",
                  "search/step/output_mapping_log_probs"):
        assert label in paths, label
