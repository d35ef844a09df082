"""Whole-word dropout (model.embeddings.src_word_dropout / tgt_word_dropout): each token's vector
is zeroed whole or scaled by 1 / (1 - p), at rate p, unbiased, no gradient through a dropped word,
the identity in eval mode, no host sync, one compiled graph; in the LSTM and the Transformer a
side's forward pass reads its tokens through it (a draw that drops every word gives the forward of
a zeroed table, one that keeps every word that of a table scaled by 1 / (1 - p)), the other side
untouched, also with shared embeddings; a run trains with it and resumes to the same weights."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from nmt.config import resolve_config
from nmt.models import build_model
from nmt.models.dropout import WordDropout
from nmt.utils.sync_audit import SyncAudit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from tiny_task import assert_resumes_exactly, tiny_config, write_task  # noqa: E402


def test_each_word_is_dropped_whole_or_scaled_at_rate_p():
    torch.manual_seed(0)
    x = torch.randn(64, 50, 16) + 3.0
    drop = WordDropout(0.3).train()
    out = drop(x)
    zero = (out == 0).all(dim=-1)
    kept = torch.isclose(out, x / 0.7, rtol=1e-6, atol=0).all(dim=-1)
    assert bool((zero ^ kept).all())  # every word: all of it gone, or all of it scaled
    n = zero.numel()
    assert abs(zero.float().mean().item() - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5
    mean = torch.stack([drop(x) for _ in range(400)]).mean(0)  # unbiased: E[out] = x
    assert torch.allclose(mean, x, rtol=0.0, atol=0.12 * float(x.abs().max()))
    y = x.clone().requires_grad_(True)
    out = drop(y)
    out.sum().backward()
    dropped = (out == 0).all(dim=-1)
    assert bool((y.grad[dropped] == 0).all()) and torch.allclose(y.grad[~dropped], torch.full_like(y.grad[~dropped], 1 / 0.7))


def test_identity_in_eval_and_at_zero_no_sync_one_graph():
    x = torch.randn(4, 7, 8)
    assert WordDropout(0.5).eval()(x) is x and WordDropout(0.0).train()(x) is x
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        WordDropout(1.0)
    drop = WordDropout(0.4).train()
    with SyncAudit() as audit:
        drop(x.requires_grad_(True)).sum().backward()
    assert audit.total == 0, audit.report()
    compiled = torch.compile(drop, fullgraph=True, backend="aot_eager")
    out = compiled(torch.randn(4, 7, 8))
    per_word = (out == 0).all(-1) | (out != 0).all(-1)
    assert bool(per_word.all())


def model_config(kind: str, side: str, p: float, share: bool = False) -> dict:
    raw = {"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "a", "tgt": "b"}, "shared_vocab": share},
           "training": {"save_dir": "unused", "max_steps": 1},
           "model": {"embeddings": {"src_size": 16, "tgt_size": 16, "dropout": 0.0, "share": share,
                                    f"{side}_word_dropout": p},
                     "encoder": {"hidden_size": 8, "dropout": 0.0}, "decoder": {"hidden_size": 16, "dropout": 0.0}}}
    if kind == "transformer":
        raw["model"] = {"type": "transformer", "embeddings": raw["model"]["embeddings"],
                        "transformer": {"encoder_layers": 1, "decoder_layers": 1, "d_model": 16, "heads": 2,
                                        "d_ff": 32, "dropout": 0.0, "attention_dropout": 0.0}}
    return resolve_config(raw, "w.yaml")["model"]


@pytest.mark.parametrize("kind", ["rnn", "transformer"])
@pytest.mark.parametrize("side", ["src", "tgt"])
@pytest.mark.parametrize("share", [False, True])
def test_the_forward_pass_reads_each_sides_words_through_it(kind, side, share, monkeypatch):
    torch.manual_seed(1)
    p = 0.25
    model = build_model(model_config(kind, side, p, share), 20, 20).train()
    src = torch.randint(4, 20, (3, 6))
    lengths = torch.tensor([6, 5, 3])
    tgt_in = torch.randint(4, 20, (3, 5))

    def forward(m):
        return m(src, lengths, tgt_in)[0]

    reference = copy.deepcopy(model)
    reference.src_word_dropout.p = reference.tgt_word_dropout.p = 0.0

    def with_table(scale: float):
        """The reference's forward with this side's embeddings scaled (with ``share`` the other side
        reads the same table: it is given the unscaled one through a second module)."""
        other = copy.deepcopy(reference)
        table = other.src_embeddings if side == "src" else other.tgt_embeddings
        if share:  # scale one side only: give that side a table of its own
            table = copy.deepcopy(table)
            setattr(other, f"{side}_embeddings", table)
        with torch.no_grad():
            table.lut.weight.mul_(scale)
        return forward(other)

    real = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.zeros(*a, **{**k, "device": k.get("device")}))
    dropped_all = forward(model)
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full(a[0], 0.999, device=k.get("device")))
    kept_all = forward(model)
    monkeypatch.setattr(torch, "rand", real)
    torch.testing.assert_close(dropped_all, with_table(0.0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kept_all, with_table(1 / (1 - p)), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(dropped_all, forward(reference))
    model.eval()
    reference.eval()
    torch.testing.assert_close(forward(model), forward(reference), rtol=0, atol=0)


def test_a_run_with_word_dropout_trains_and_resumes_to_the_same_weights(tmp_path):
    from nmt.train.trainer import Trainer

    data = write_task(tmp_path / "task", n_train=40)

    def make(save_dir):
        cfg = tiny_config(data, save_dir, device="cpu", max_steps=10)
        cfg["model"]["embeddings"].update(src_word_dropout=0.2, tgt_word_dropout=0.1)
        return Trainer(resolve_config(cfg, "w.yaml"), "w.yaml")

    straight, _ = assert_resumes_exactly(make, tmp_path)
    assert straight.model.src_word_dropout.p == 0.2 and straight.model.tgt_word_dropout.p == 0.1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_words_drop_whole_without_a_sync():
    """On CUDA (float32 and bf16): whole words dropped at rate p, the rest scaled, forward and
    backward under ``torch.cuda.set_sync_debug_mode("error")``."""
    drop = WordDropout(0.3).train()
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(64, 50, 16, device="cuda") + 3.0).to(dtype).requires_grad_(True)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = drop(x)
            out.float().sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        out = out.detach().float().cpu()
        zero = (out == 0).all(-1)
        kept = torch.isclose(out, (x.detach().float().cpu() / 0.7), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6,
                             atol=0).all(-1)
        assert bool((zero ^ kept).all())
        assert abs(zero.float().mean().item() - 0.3) < 4 * (0.21 / zero.numel()) ** 0.5
