#!/usr/bin/env python
"""What the optimizers of ``training.optimizer.name`` cost, and (``--multi30k``) what they train to.

Cost: for the models of ``configs/quickstart.yaml`` and ``configs/multi30k_lstm.yaml`` (built as
``tools/bench_ema.py`` builds them: the configs' model sections, the data's vocabulary sizes), the
gradients of one real update on a random batch are kept and each optimizer steps on them: ms per
optimizer step, ms per whole training update (``nmt.train.update.update``: forward, loss,
backward, clipping, step), the optimizer state's size (MB, float32) and the host syncs per step (the
calls of ``nmt.utils.sync_audit.SyncAudit``: those that would wait for a GPU; on the CPU they are
counted, not felt), each with its ratio to Adam's (fused) measured in the same run. Rows: adam,
adamw, sgd (momentum 0.9), adafactor (``nmt.train.adafactor``), adafactor with ``beta1: 0.9``, and
``torch.optim.Adafactor`` for comparison. Medians of ``--repeats`` timings.

    python tools/bench_optimizers.py [--device cpu|cuda] [--threads N] [--quick] [--json OUT]

``--multi30k DIR`` trains the word-level LSTM of ``tools/bench_source_noise.py`` (de -> en,
``--steps`` updates of 64 sentences, one thread, 1.5-entmax attention and output) once per name in
``--optimizers`` (each with its ``--lr`` entry; ``--adafactor`` JSON: the adafactor runs' settings) and prints test_2016_flickr BLEU (beam 5), the
certified share and the training speed:

    python tools/bench_optimizers.py --multi30k path/to/multi30k --steps 2000 --optimizers adam adafactor
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tools"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_ema import SETTINGS, _batch, _time  # noqa: E402
from bench_source_noise import parsed_with_run_options  # noqa: E402
from nmt.config import load_config  # noqa: E402
from nmt.models import build_model  # noqa: E402
from nmt.sparse import get_loss  # noqa: E402
from nmt.train.optimizers import build_optimizer  # noqa: E402
from nmt.train.update import update  # noqa: E402
from nmt.utils.allocator import keep_freed_memory  # noqa: E402
from nmt.utils.io import atomic_write_text  # noqa: E402
from nmt.utils.sync_audit import SyncAudit  # noqa: E402

BASE = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "momentum": 0.0, "nesterov": False, "weight_decay": 0.0}
OPTIMIZERS = {
    "adam": lambda params: build_optimizer(params, {**BASE, "name": "adam"}),
    "adamw": lambda params: build_optimizer(params, {**BASE, "name": "adamw", "weight_decay": 0.01}),
    "sgd": lambda params: build_optimizer(params, {**BASE, "name": "sgd", "momentum": 0.9}),
    "adafactor": lambda params: build_optimizer(params, {**BASE, "name": "adafactor", "lr": 0.01}),
    "adafactor beta1": lambda params: build_optimizer(params, {**BASE, "name": "adafactor", "lr": 0.01,
                                                                "adafactor": {"beta1": 0.9}}),
    "torch Adafactor": lambda params: torch.optim.Adafactor(params, lr=0.01),
}


def state_megabytes(optimizer: torch.optim.Optimizer) -> float:
    """The optimizer state's tensors, in MB."""
    return sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values()
               if torch.is_tensor(v)) / 2 ** 20


def measure(setting: str, name: str, device: torch.device, calls: int, repeats: int) -> dict:
    """One row: the optimizer ``name`` on the model of ``setting``."""
    path, vocab, shape = SETTINGS[setting]
    config = load_config(ROOT / path, ["training.save_dir=unused"])
    torch.manual_seed(0)
    model = build_model(config["model"], vocab[0], vocab[1], pad_index=0).to(device)
    optimizer = OPTIMIZERS[name](model.parameters())
    loss_fn = get_loss(config["model"]["output"]["mapping"])
    batch = _batch(vocab, shape, device)
    clip = config["training"]["clip_grad_norm"]

    def train_update():
        update(model, loss_fn, optimizer, batch, 0, clip)

    _time(train_update, 2, 1, device)  # warm-up: the state exists
    loss = loss_fn(model(batch.src, batch.src_lengths, batch.tgt_in)[0].flatten(0, 1), batch.tgt_out.flatten())
    loss.sum().backward()  # gradients kept: the optimizer steps on them again and again
    step_ms = _time(optimizer.step, calls, repeats, device)
    with SyncAudit() as audit:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    update_ms = _time(train_update, max(1, calls // 10), repeats, device)
    return {"model": setting, "optimizer": name, "parameters": sum(p.numel() for p in model.parameters()),
            "tensors": sum(1 for _ in model.parameters()), "step_ms": statistics.median(step_ms),
            "update_ms": statistics.median(update_ms), "state_mb": state_megabytes(optimizer),
            "host_syncs": audit.total}


def cost(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    settings = ["quickstart"] if args.quick else list(SETTINGS)
    calls, repeats = (5, 2) if args.quick else (args.calls, args.repeats)
    rows = [measure(s, name, device, calls, repeats) for s in settings for name in OPTIMIZERS]
    print(f"optimizer cost on {device} ({args.threads} threads; medians of {repeats} timings; "
          f"ratios to adam's in this run)")
    for s in settings:
        mine = [r for r in rows if r["model"] == s]
        adam = mine[0]
        print(f"{s}: {adam['parameters']:,d} parameters in {adam['tensors']} tensors")
        print(f"  {'optimizer':<16} {'step ms':>8} {'x adam':>7} {'update ms':>9} {'x adam':>7} {'state MB':>8} "
              f"{'x adam':>7} {'host syncs':>10}")
        for r in mine:
            print(f"  {r['optimizer']:<16} {r['step_ms']:>8.3f} {r['step_ms'] / adam['step_ms']:>7.2f} "
                  f"{r['update_ms']:>9.2f} {r['update_ms'] / adam['update_ms']:>7.2f} {r['state_mb']:>8.2f} "
                  f"{r['state_mb'] / adam['state_mb']:>7.3f} {r['host_syncs']:>10d}")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps({"device": str(device), "threads": args.threads,
                                                       "results": rows}, indent=1) + "\n")
    return 0


def training(args: argparse.Namespace) -> int:
    """The ``--multi30k`` comparison (see the module docstring)."""
    import sacrebleu

    import nmt
    from bench_copy import timed_translations, training_speed
    from bench_source_noise import certified_percent, best_texts, config, test_set
    from nmt.config import resolve_config
    from nmt.train.trainer import Trainer

    data = Path(args.multi30k)
    sources, references = test_set(data, "de", "en", args.test_lines)
    lrs = args.lr or [0.001 if name != "adafactor" else 0.01 for name in args.optimizers]
    if len(lrs) != len(args.optimizers):
        raise SystemExit("--lr: one learning rate per --optimizers entry")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, lr) in enumerate(zip(args.optimizers, lrs)):
            save_dir = Path(tmp) / f"{k}-{name}"  # (one optimizer at two rates: two runs)
            cfg = config(data, "de", "en", save_dir, None, args.steps, args.seed)
            cfg["training"]["optimizer"] = {"name": name, "lr": lr}
            if name == "adafactor" and args.adafactor:
                cfg["training"]["optimizer"]["adafactor"] = json.loads(args.adafactor)
            cfg["training"]["threads"] = 1
            Trainer(resolve_config(cfg, f"{name}.yaml"), f"{name}.yaml").train()
            model = nmt.load(save_dir / "last.pt", device="cpu")
            translations, speed = timed_translations(model, sources)
            rows.append({"optimizer": name, "lr": lr, "seed": args.seed, "adafactor": args.adafactor,
                         "bleu": sacrebleu.corpus_bleu(best_texts(translations), [references]).score,
                         "certified": certified_percent(translations),
                         "train_tokens_per_sec": training_speed(save_dir)})
    print(f"{data}: de->en, word LSTM, {args.steps} updates, seed {args.seed}; test_2016_flickr "
          f"({len(sources)} lines), beam 5")
    print(f"{'optimizer':<10} {'lr':>7} {'BLEU':>6} {'certified':>9} {'train tok/s':>11}")
    for r in rows:
        print(f"{r['optimizer']:<10} {r['lr']:>7g} {r['bleu']:>6.2f} {r['certified']:>9.2f} "
              f"{r['train_tokens_per_sec'] or 0:>11.0f}")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(rows, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--quick", action="store_true", help="the quick-start model only, few calls")
    p.add_argument("--calls", type=int, default=50, help="optimizer steps per timing")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--multi30k", help="train and translate Multi30k instead (directory of train / val / "
                                      "test_2016_flickr .de / .en)")
    p.add_argument("--optimizers", nargs="+", default=["adam", "adafactor"], choices=("adam", "adamw", "sgd",
                                                                                      "adafactor"))
    p.add_argument("--lr", type=float, nargs="+", help="one per --optimizers entry (default 0.001, adafactor 0.01)")
    p.add_argument("--adafactor", help="the adafactor runs' training.optimizer.adafactor section (JSON), "
                                       "e.g. '{\"beta1\": 0.9}'")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--test-lines", type=int, default=None)
    args = parsed_with_run_options(p, argv)  # --json, --quiet
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as nmt-train does: no page faults on the steps' full-size temporaries
    return training(args) if args.multi30k else cost(args)


if __name__ == "__main__":
    sys.exit(main())
