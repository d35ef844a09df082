"""A tiny task and config for the trainer tests (a run takes a few seconds)."""
import random
from pathlib import Path


LETTERS = "abcdef"


def write_task(root: Path, n_train: int = 40, n_valid: int = 6, seed: int = 0) -> dict:
    """Reversal task: source 'a b c' (space tokens), target 'cba' (characters)."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 5))) for _ in range(n)]
        (root / f"{split}.src").write_text("".join(" ".join(w) + "\n" for w in words), encoding="utf-8")
        (root / f"{split}.tgt").write_text("".join(w[::-1] + "\n" for w in words), encoding="utf-8")
        paths[split] = {"src": str(root / f"{split}.src"), "tgt": str(root / f"{split}.tgt")}
    return paths


def joined_source(data: dict, root: Path) -> Path:
    """``root / "joined.src"``: each training source of the task as two words of 2-5 letters (the
    letters joined, then reversed), where BPE has something to split and its dropout to drop."""
    lines = Path(data["train"]["src"]).read_text(encoding="utf-8").splitlines()
    joined = root / "joined.src"
    joined.write_text("".join(line.replace(" ", "") + " " + line.replace(" ", "")[::-1] + "\n" for line in lines),
                      encoding="utf-8")
    return joined


def tiny_config(data: dict, save_dir: Path, **training) -> dict:
    return {
        "data": {**data, "src": {"tokenizer": {"type": "space"}}, "tgt": {"tokenizer": {"type": "char"}}},
        "model": {
            "embeddings": {"src_size": 8, "tgt_size": 8, "dropout": 0.2},
            "encoder": {"layers": 1, "hidden_size": 12, "dropout": 0.0},
            "decoder": {"layers": 1, "hidden_size": 12, "dropout": 0.2},
            "attention": {"mapping": "entmax15"},
            "output": {"mapping": "entmax15"},
        },
        "training": {"save_dir": str(save_dir), "batch_size": 8, "max_steps": 12, "valid_every": 4,
                     "log_every": 2, "keep_last": 2, "progress": False, "threads": 1, "tensorboard": False,
                     **training},
        "validation": {"metric": "loss", "batch_size": 4, "max_length": 8, "n_heatmaps": 0},
    }


TINY_TRANSFORMER = {"encoder_layers": 1, "decoder_layers": 1, "d_model": 16, "heads": 2, "d_ff": 32}
"""A ``model.transformer`` section for :func:`tiny_config` (with ``model.type: transformer``)."""


def as_transformer(cfg: dict) -> dict:
    """``cfg`` (a :func:`tiny_config`) with the model made the tiny Transformer (:data:`TINY_TRANSFORMER`)."""
    cfg["model"]["type"] = "transformer"
    cfg["model"]["transformer"] = dict(TINY_TRANSFORMER)
    return cfg


def make_trainer(data: dict, save_dir: Path, **training):
    """A :class:`nmt.train.trainer.Trainer` of the tiny task (:func:`tiny_config`'s ``training``
    keys overridden by ``training``)."""
    from nmt.config import resolve_config
    from nmt.train.trainer import Trainer

    return Trainer(resolve_config(tiny_config(data, save_dir, **training), "tiny.yaml"), "tiny.yaml")


TIMINGS = ("elapsed", "tokens_per_sec")  # the metrics.jsonl fields that differ between equal runs


def assert_same_run(straight, resumed, straight_dir: Path, resumed_dir: Path) -> None:
    """A killed-and-resumed run equals the uninterrupted one: bit-equal weights, and the same
    metrics.jsonl records apart from their timings."""
    import json

    import torch

    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), name
    read = lambda d: [{k: v for k, v in json.loads(line).items() if k not in TIMINGS}
                      for line in (Path(d) / "metrics.jsonl").read_text().splitlines()]
    assert read(straight_dir) == read(resumed_dir)


def assert_resumes_exactly(make, root: Path, steps: int = 10, kill_at: int = 7):
    """``make(save_dir)`` (a Trainer of ``steps`` updates) trained straight in ``root / "straight"``,
    and in ``root / "resumed"`` killed (SIGINT) after update ``kill_at`` then run again: the resumed
    run ends where the straight one does (:func:`assert_same_run`). Returns (straight, resumed)."""
    straight = make(root / "straight")
    straight.train()
    first = make(root / "resumed")
    assert first.train(step_hook=interrupt_at(kill_at)).stopped_by == "SIGINT"
    second = make(root / "resumed")
    assert second.resumed and second.train().step == steps
    assert_same_run(straight, second, root / "straight", root / "resumed")
    return straight, second


def lr_run(data: dict, save_dir: Path, schedule: dict, kill_at: int | None = None):
    """Train the tiny task (on the CPU) under ``lr_schedule: schedule``, recording ``(step, lr)``
    after every update; with ``kill_at`` a SIGINT stops the run after that update (run it again on
    the same ``save_dir`` to resume). Returns (trainer, its TrainSummary, the recorded pairs)."""
    import os
    import signal

    from nmt.config import resolve_config
    from nmt.train.trainer import Trainer

    trainer = Trainer(resolve_config(tiny_config(data, save_dir, lr_schedule=schedule, device="cpu"), "tiny.yaml"),
                      "tiny.yaml")
    seen = []

    def hook(step):
        seen.append((step, trainer.optimizer.param_groups[0]["lr"]))
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGINT)
    return trainer, trainer.train(step_hook=hook), seen


def interrupt_at(stop: int):
    """A ``Trainer.train`` step hook that sends this process SIGINT after update ``stop`` (the run
    then saves and stops there, as a user's Ctrl-C would make it; run it again to resume)."""
    import os
    import signal

    def hook(step: int) -> None:
        if step == stop:
            os.kill(os.getpid(), signal.SIGINT)
    return hook


def cli_translation_matches_search(checkpoint: Path, sources: str, work: Path):
    """``nmt-translate -beam_size 3 -max_length 8 -report`` of ``checkpoint`` on the ``sources`` file
    gives the outputs and certificates of an in-process ``beam_search`` of the loaded model (asserted
    line by line). Returns ``(loaded model, padded source ids (B, L), their lengths (B,))``."""
    import json

    import torch

    from nmt.cli.translate import main as translate_main
    from nmt.translate.beam_search import beam_search
    from nmt.translate.loading import load_model

    out, report = work / "out.txt", work / "report.jsonl"
    assert translate_main(["-model", str(checkpoint), "-src", sources, "-output", str(out), "-beam_size", "3",
                           "-max_length", "8", "-report", str(report), "-device", "cpu"]) in (0, None)
    lines = out.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    loaded = load_model(checkpoint, "cpu")
    ids = [loaded.src_field.encode(t) for t in Path(sources).read_text(encoding="utf-8").splitlines()]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(i) for i in ids], batch_first=True, padding_value=0)
    lengths = torch.tensor([len(i) for i in ids])
    vocab = loaded.tgt_field.vocab
    with torch.no_grad():
        result = beam_search(loaded.model, src, lengths, bos=vocab.bos_index, eos=vocab.eos_index, beam_size=3,
                             n_best=1, max_length=8)
    for b, (line, record) in enumerate(zip(lines, records)):
        assert line == loaded.tgt_field.decode(result.tokens[b, 0, :int(result.lengths[b, 0])].tolist())
        assert record["certified"] == bool(result.exact[b]) and record["n_nonzero"] == int(result.n_nonzero[b])
    return loaded, src, lengths
