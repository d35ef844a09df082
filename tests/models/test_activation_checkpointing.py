"""Activation checkpointing of the Transformer's layers (``training.checkpoint_activations``):
with dropout on and a fixed seed, a checkpointed training step gives the same loss and gradients
as the plain one (the truth: the same model run without checkpointing), for every attention
mapping, position kind and loss; the recomputation redraws the same dropout masks (native CPU ones
included) and saves fewer tensors for the backward."""
from __future__ import annotations

import pytest
import torch
from tiny_models import PAD, SRC_VOCAB, TGT_VOCAB, positions_cfg, random_batch, transformer_cfg

from nmt.models import native_dropout
from nmt.models.transformer import build_transformer
from nmt.models.transformer.checkpointing import set_activation_checkpointing
from nmt.sparse.registry import get_loss
from nmt.train.update import loss_forward

MAPPINGS = {
    "softmax": {"mapping": "softmax", "params": {}},
    "sparsemax": {"mapping": "sparsemax", "params": {}},
    "entmax15": {"mapping": "entmax15", "params": {}},
    "entmax_bisect-learned": {"mapping": "entmax_bisect", "params": {"alpha": "learned"}},
}
DROPOUTS = {"dropout": 0.3, "attention_dropout": 0.2, "activation_dropout": 0.25}


def make(dtype: torch.dtype, attention: dict, positions: str = "sinusoidal", norm: str = "pre",
         scale: float = 3.0) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformer_cfg(attention=attention, embeddings={"dropout": 0.1},
                          transformer={**DROPOUTS, "norm": norm, **positions_cfg(positions)})
    model = build_transformer(cfg, SRC_VOCAB, TGT_VOCAB, PAD).to(dtype).train()
    with torch.no_grad():  # sharper scores: the sparse mappings have zeros inside rows
        for name, p in model.named_parameters():
            if "proj.weight" in name and "generator" not in name:
                p.mul_(scale)
    return model


def step(model: torch.nn.Module, checkpointed: bool, loss_name: str = "softmax", smoothing: float = 0.0,
         seed: int = 7, batch_seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One training step's summed loss and the gradients, from torch seed ``seed``."""
    set_activation_checkpointing(model, checkpointed)
    model.zero_grad(set_to_none=True)
    src, lengths, tgt_in = random_batch(4, 9, 6, lengths=[9, 4, 7, 2], seed=batch_seed)
    tgt_out = torch.roll(tgt_in, -1, 1)
    tgt_out[:, -1] = 3
    torch.manual_seed(seed)
    loss = loss_forward(model, get_loss(loss_name), src, lengths, tgt_in, tgt_out, PAD, smoothing)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def assert_same(a, b, atol: float) -> None:
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    torch.testing.assert_close(loss_a, loss_b, rtol=0, atol=atol)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("name", MAPPINGS)
@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rotary", "relative", "alibi", "alibi-split"])
def test_float64_step_equals_the_plain_step(name, positions):
    model = make(torch.float64, MAPPINGS[name], positions)
    plain = step(model, False)
    assert plain[1], "no gradients"
    assert_same(step(model, True), plain, 1e-12)
    assert step(model, False, seed=8)[0] != plain[0]  # not vacuous: dropout is drawn from the seed


@pytest.mark.parametrize("loss_name,smoothing", [("softmax", 0.1), ("entmax15", 0.0), ("sparsemax", 0.2),
                                                 ("entmax_bisect", 0.1)])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_float64_losses_and_norms(loss_name, smoothing, norm):
    model = make(torch.float64, MAPPINGS["entmax15"], norm=norm)
    assert_same(step(model, True, loss_name, smoothing), step(model, False, loss_name, smoothing), 1e-12)


@pytest.mark.parametrize("name", MAPPINGS)
def test_float32_step_is_bit_equal(name):
    """float32 runs the native CPU dropout (where built): the recomputation runs the same kernels on
    the same inputs in the same order, so the loss and gradients are bit-equal (tolerance 0)."""
    model = make(torch.float32, MAPPINGS[name])
    assert_same(step(model, True), step(model, False), 0.0)


def test_recomputed_dropout_masks_equal_the_forward_ones(monkeypatch):
    """Every dropout of the checkpointed layers is drawn twice (forward and recomputation) with the
    same seed, hence the same mask; the run after it sees torch's generator as without
    checkpointing."""
    if native_dropout.library() is None:
        pytest.skip("the native dropout library is not built here")
    seeds: list[int] = []
    draw = native_dropout.draw_seed

    def recorded() -> torch.Tensor:
        seed = draw()
        seeds.append(int(seed))
        return seed

    monkeypatch.setattr(native_dropout, "draw_seed", recorded)
    model = make(torch.float32, MAPPINGS["softmax"])
    step(model, False)
    plain, seeds[:] = list(seeds), []
    step(model, True)
    assert len(seeds) > len(plain)  # the recomputation drew again
    assert sorted(set(seeds)) == sorted(set(plain))  # and only the forward's seeds
    after_plain = (step(model, False), torch.rand(3))
    after_ckpt = (step(model, True), torch.rand(3))
    assert torch.equal(after_plain[1], after_ckpt[1])


def test_bf16_autocast_step_is_bit_equal():
    """Under CPU bf16 autocast the recomputation runs under the same autocast state."""
    model = make(torch.float32, MAPPINGS["entmax15"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = step(model, True)
        b = step(model, False)
    assert_same(a, b, 0.0)


def saved_bytes(model: torch.nn.Module, checkpointed: bool) -> int:
    """Bytes of the distinct tensors autograd saves for the backward of one forward pass."""
    set_activation_checkpointing(model, checkpointed)
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())] = t.untyped_storage().nbytes()
        return t

    src, lengths, tgt_in = random_batch(4, 9, 6, lengths=[9, 4, 7, 2])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_forward(model, get_loss("softmax"), src, lengths, tgt_in, tgt_in, PAD, 0.0)
    return sum(seen.values())


def test_checkpointing_saves_fewer_tensors_and_decoding_never_checkpoints(monkeypatch):
    model = make(torch.float64, MAPPINGS["softmax"])
    assert saved_bytes(model, True) < saved_bytes(model, False)
    calls = []
    import nmt.models.transformer.checkpointing as ckpt
    monkeypatch.setattr(ckpt, "checkpoint", lambda *a, **k: calls.append(1) or a[0](*a[1:]))
    set_activation_checkpointing(model, True)
    src, lengths, tgt_in = random_batch(4, 9, 6)
    with torch.no_grad():
        model(src, lengths, tgt_in)
    assert not calls
    model(src, lengths, tgt_in)
    assert len(calls) == 4  # two encoder and two decoder layers


def test_a_model_without_transformer_layers_is_refused():
    with pytest.raises(ValueError, match="model.type: transformer"):
        set_activation_checkpointing(torch.nn.Linear(2, 2), True)
    set_activation_checkpointing(torch.nn.Linear(2, 2), False)  # off: nothing to do


@pytest.mark.parametrize("packed", [True, False])
def test_packed_and_padded_encoder_paths(packed, monkeypatch):
    """The CPU encoder's packed rows (a PackedRows argument of the checkpointed layer) and the
    padded layout both give the plain step's loss and gradients."""
    import nmt.models.transformer.packed_rows as packed_rows

    monkeypatch.setattr(packed_rows, "PACKED_ENCODER", packed)
    packs = []
    real = packed_rows.PackedRows.of
    monkeypatch.setattr(packed_rows.PackedRows, "of", staticmethod(lambda mask: packs.append(1) or real(mask)))
    model = make(torch.float64, MAPPINGS["sparsemax"])
    assert_same(step(model, True), step(model, False), 1e-12)
    assert bool(packs) == packed


def test_fused_attention_heads(monkeypatch):
    """Heads served by the fused kernel (``scaled_dot_product_attention``, its own attention dropout
    drawn from torch's generator), as on CUDA where nobody reads the probabilities."""
    import nmt.models.transformer.multihead_attention as mha

    calls = []
    real = mha.F.scaled_dot_product_attention
    monkeypatch.setattr(mha, "fused_attention_serves", lambda x: True)
    monkeypatch.setattr(mha.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = make(torch.float64, MAPPINGS["softmax"])
    assert_same(step(model, True), step(model, False), 1e-12)
    assert calls
