"""What ``training.ema`` costs: the moving-average update per optimizer update, and the swap in
and out around a validation, next to one training update, for the models of
``configs/quickstart.yaml`` and ``configs/multi30k_lstm.yaml``.

The models are built from the configs' model sections with the vocabulary sizes of their data
(quick start: 30 / 22 types, as nmt-train reports them; Multi30k: 8000 per side, the
sentencepiece size, an upper bound of each side's vocabulary). The training update is
``nmt.train.update.update`` (fused Adam where the device has it, clipping as the configs) on a
random batch of the config's batch size (quick start: 32 sentences of 8 source / 10 target
tokens; Multi30k: 64 of 15 / 17). Medians of ``--repeats`` timings of ``--calls`` calls each;
the machine's load shows in the spread, so say whether it was shared.

    python tools/bench_ema.py [--device cpu|cuda] [--quick] [--threads N] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nmt.config import load_config  # noqa: E402
from nmt.data.batching import Batch  # noqa: E402
from nmt.models import build_model  # noqa: E402
from nmt.sparse import get_loss  # noqa: E402
from nmt.train.ema import WeightAverage  # noqa: E402
from nmt.train.update import update  # noqa: E402
from nmt.utils.io import atomic_write_text  # noqa: E402

SETTINGS = {  # config, (src vocab, tgt vocab), (sentences, src length, tgt length)
    "quickstart": ("configs/quickstart.yaml", (30, 22), (32, 8, 10)),
    "multi30k_lstm": ("configs/multi30k_lstm.yaml", (8000, 8000), (64, 15, 17)),
}


def _batch(vocab: tuple[int, int], shape: tuple[int, int, int], device: torch.device) -> Batch:
    g = torch.Generator().manual_seed(0)
    n, src_len, tgt_len = shape
    src = torch.randint(4, vocab[0], (n, src_len), generator=g)
    tgt = torch.randint(4, vocab[1], (n, tgt_len + 1), generator=g)
    lengths = torch.full((n,), src_len)
    batch = Batch(src=src, src_lengths=lengths, tgt_in=tgt[:, :-1], tgt_out=tgt[:, 1:], tgt_lengths=torch.full((n,), tgt_len),
                  n_tokens=n * tgt_len, indices=list(range(n)), n_src_tokens=n * src_len)
    return batch.to(device, lengths_on_host=True)


def _time(fn, calls: int, repeats: int, device: torch.device) -> list[float]:
    """Milliseconds per call, one figure per repeat (the device synchronised at each end)."""
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append(1000 * (time.perf_counter() - start) / calls)
    return out


def measure(name: str, device: torch.device, calls: int, repeats: int) -> dict:
    """One row: parameters, ms per EMA update, per swap in + out, per training update."""
    path, vocab, shape = SETTINGS[name]
    config = load_config(ROOT / path, ["training.save_dir=unused"])
    model = build_model(config["model"], vocab[0], vocab[1], pad_index=0).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=device.type in ("cpu", "cuda"))
    loss_fn = get_loss(config["model"]["output"]["mapping"])
    batch = _batch(vocab, shape, device)
    ema = WeightAverage(model, 0.999)
    step = [0]

    def ema_update():
        step[0] += 1
        ema.update(step[0])

    def swap():
        with ema.swapped():
            pass

    def train_update():
        update(model, loss_fn, optimizer, batch, 0, config["training"]["clip_grad_norm"])

    _time(train_update, 2, 1, device)  # warm-up
    _time(ema_update, 5, 1, device)
    ema_ms = _time(ema_update, calls, repeats, device)
    swap_ms = _time(swap, max(1, calls // 10), repeats, device)
    train_ms = _time(train_update, max(1, calls // 50), repeats, device)
    row = {"model": name, "parameters": sum(p.numel() for p in model.parameters()),
           "ema_update_ms": statistics.median(ema_ms), "ema_update_ms_range": [min(ema_ms), max(ema_ms)],
           "swap_ms": statistics.median(swap_ms), "train_update_ms": statistics.median(train_ms),
           "train_update_ms_range": [min(train_ms), max(train_ms)]}
    row["ema_share"] = row["ema_update_ms"] / row["train_update_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--quick", action="store_true", help="the quick-start model only, few calls")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--calls", type=int, default=200, help="EMA updates per timing")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    names = ["quickstart"] if args.quick else list(SETTINGS)
    calls, repeats = (20, 2) if args.quick else (args.calls, args.repeats)
    rows = [measure(name, device, calls, repeats) for name in names]
    print(f"training.ema cost on {device} ({args.threads} threads; medians of {repeats} timings):")
    for row in rows:
        print(f"  {row['model']:<14} {row['parameters']:>10,d} parameters: EMA update {row['ema_update_ms']:.3f} ms "
              f"({100 * row['ema_share']:.2f}% of a training update of {row['train_update_ms']:.1f} ms); "
              f"swap in + out around a validation {row['swap_ms']:.3f} ms")
    if args.json:
        atomic_write_text(args.json, json.dumps({"device": str(device), "threads": args.threads, "results": rows},
                                                indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
