"""Benchmark: combined (discrete + continuous) attention vs discrete attention alone.

Forward + backward of one attention call with a ``general`` score, batch 64, D = 512,
L = 30 and 100 (sentence lengths drawn in [L/2, L]), T query steps (T = 1 is one decoder
step with input feeding; larger T is a whole target sentence at once). Goal from issue 6:
combined <= 2x discrete.

    python tools/bench_continuous.py            # full grid
    python tools/bench_continuous.py --quick    # tiny sizes, a smoke run

Importable: ``rows = bench_continuous.run(quick=True)`` returns a list of dicts (for
tools/bench_sparse.py).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

import torch
from torch import Tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sparse import median_ms  # noqa: E402  (shared timing helper)

from nmt.models.continuous_attention import ContinuousAttention  # noqa: E402
from nmt.sparse import get_mapping  # noqa: E402


def _inputs(batch: int, length: int, steps: int, dim: int, seed: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, length // 2), length + 1, (batch,), generator=g)
    lengths[0] = length
    return {
        "query": torch.randn(batch, steps, dim, generator=g).requires_grad_(),
        "memory": torch.randn(batch, length, dim, generator=g).requires_grad_(),
        "weight": (torch.randn(dim, dim, generator=g) / dim ** 0.5).requires_grad_(),
        "mask": torch.arange(length)[None] < lengths[:, None],
        "grad": torch.randn(batch, steps, dim, generator=g),
    }


def _attention(x: dict[str, Tensor], mapping: Callable, continuous: ContinuousAttention | None,
               fused: bool = False) -> Tensor:
    """General-score attention; + continuous context (``fused``: one ``(p + w) @ memory`` product)."""
    scores = torch.bmm(x["query"] @ x["weight"], x["memory"].transpose(1, 2))   # (B, T, L)
    probs = mapping(scores, dim=-1, mask=x["mask"].unsqueeze(1).expand_as(scores))
    if continuous is not None and fused:
        return torch.bmm(probs + continuous.source_weights(probs, x["mask"]), x["memory"])
    context = torch.bmm(probs, x["memory"])
    if continuous is not None:
        context = context + continuous(probs, x["memory"], x["mask"])
    return context


def run(quick: bool = False, batch: int = 64, dim: int = 512, lengths: tuple[int, ...] = (30, 100),
        steps: tuple[int, ...] = (1, 20), mappings: tuple[str, ...] = ("softmax", "entmax15"),
        alphas: tuple[float, ...] = (1.0, 2.0), repeats: int = 20, threads: int | None = None) -> list[dict[str, Any]]:
    """Time discrete vs combined attention (forward + backward); one row per setting.

    Row keys: mapping, alpha, L, T, batch, dim, discrete_ms, combined_ms, ratio (combined /
    discrete), fused_ms, fused_ratio (the same with ``source_weights`` and one context product).
    """
    if quick:
        batch, dim, lengths, steps, repeats = 4, 16, (7,), (1, 3), 2
    if threads is not None:
        torch.set_num_threads(threads)
    rows = []
    for mapping_name in mappings:
        mapping = get_mapping(mapping_name)
        for length in lengths:
            for n_steps in steps:
                x = _inputs(batch, length, n_steps, dim, seed=length + n_steps)

                def step(continuous: ContinuousAttention | None, fused: bool = False) -> None:
                    out = _attention(x, mapping, continuous, fused)
                    out.backward(x["grad"])

                discrete = median_ms(lambda: step(None), repeats, warmup=1)
                for alpha in alphas:
                    module = ContinuousAttention(alpha=alpha)
                    combined = median_ms(lambda: step(module), repeats, warmup=1)
                    fused = median_ms(lambda: step(module, fused=True), repeats, warmup=1)
                    rows.append({"mapping": mapping_name, "alpha": alpha, "L": length, "T": n_steps,
                                 "batch": batch, "dim": dim, "discrete_ms": round(discrete, 3),
                                 "combined_ms": round(combined, 3), "ratio": round(combined / discrete, 2),
                                 "fused_ms": round(fused, 3), "fused_ratio": round(fused / discrete, 2)})
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of :func:`run` rows."""
    head = ("| mapping | alpha | L | T | discrete ms | combined ms | ratio | fused ms | fused ratio |\n"
            "|---|---|---|---|---|---|---|---|---|")
    body = [f"| {r['mapping']} | {r['alpha']:g} | {r['L']} | {r['T']} | {r['discrete_ms']:.3f} | "
            f"{r['combined_ms']:.3f} | {r['ratio']:.2f} | {r['fused_ms']:.3f} | {r['fused_ratio']:.2f} |"
            for r in rows]
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    rows = run(quick=args.quick, repeats=args.repeats, threads=args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, forward+backward, median of repeats")
    print(format_rows(rows))


if __name__ == "__main__":
    main()
