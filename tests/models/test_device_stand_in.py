"""Host and device tensors kept apart, checked without an accelerator: the model on the meta device
(a stand-in for CUDA), the source lengths on the host as the trainer and nmt-translate keep them.

An operation mixing a host tensor of several entries with a tensor of another device raises on the
meta device as on CUDA, so a training update, validation's statistics and the static search's
steps that run here to the end hold no such mix (a per-sentence length limit left on the host did,
before the fix of the limits: tests/translate/test_length_ratio.py). Meta tensors have no values:
what these tests check is the devices, the values are checked elsewhere. Stand-in gaps, patched
for the test: Triton's kernels are taken as absent (the static torch path serves the mappings, as
on a GPU without Triton), autocast knows no meta device (reported off), and the fused Adam refuses
meta parameters (the plain loop runs).
"""
from __future__ import annotations

import pytest
import torch

import nmt.sparse._dispatch as dispatch
from nmt.data.batching import Batch
from nmt.models import build_model
from nmt.models.protocol import shares_encoder_out, tile_state
from nmt.models.transformer import build_transformer
from nmt.sparse import get_loss
from nmt.train.optimizers import build_optimizer
from nmt.train.update import update
from nmt.train.validation import batch_statistics
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import RowState, Specials
from nmt.translate.static_search import static_step

from tiny_models import SRC_VOCAB, TGT_VOCAB, model_cfg, random_batch, transformer_cfg

META = torch.device("meta")
BOS, EOS, PAD = 2, 3, 0

MODELS = {
    "lstm-entmax15": lambda: build_model(model_cfg(attention={"mapping": "entmax15"},
                                                   output={"mapping": "entmax15"}), SRC_VOCAB, TGT_VOCAB, PAD),
    "lstm-sparsemax-bisect": lambda: build_model(
        model_cfg(attention={"mapping": "sparsemax"}, output={"mapping": "entmax_bisect", "params": {"alpha": 1.3}}),
        SRC_VOCAB, TGT_VOCAB, PAD),
    "gru-fusedmax": lambda: build_model(model_cfg(decoder={"type": "gru"}, attention={"mapping": "fusedmax"}),
                                        SRC_VOCAB, TGT_VOCAB, PAD),
    "lstm-continuous": lambda: build_model(model_cfg(attention={"mapping": "entmax15", "continuous": {}}),
                                           SRC_VOCAB, TGT_VOCAB, PAD),
    "transformer": lambda: build_transformer(transformer_cfg(), SRC_VOCAB, TGT_VOCAB, PAD),
    "lstm-coverage": lambda: build_model(model_cfg(attention={"mapping": "entmax15", "score": "mlp", "coverage": True},
                                                   output={"mapping": "entmax15"}), SRC_VOCAB, TGT_VOCAB, PAD),
    "lstm-copy": lambda: build_model(model_cfg(attention={"mapping": "entmax15"},
                                               output={"mapping": "entmax15", "copy": True}), SRC_VOCAB, TGT_VOCAB, PAD),
    "transformer-copy": lambda: build_transformer(transformer_cfg(output={"mapping": "sparsemax", "copy": True}),
                                                  SRC_VOCAB, TGT_VOCAB, PAD),
    "transformer-learned-alpha": lambda: build_transformer(
        transformer_cfg(attention={"mapping": "entmax_bisect", "params": {"alpha": "learned"}}),
        SRC_VOCAB, TGT_VOCAB, PAD),
}


@pytest.fixture
def stand_in(monkeypatch):
    """The meta device's gaps patched (see the module docstring)."""
    monkeypatch.setattr(dispatch, "triton_available", lambda x: False)
    # dynamo lists torch.is_autocast_enabled among its constant-folded functions when it is first
    # imported: import it before the patch, or a later compiled test in this process finds the
    # patch's lambda there and breaks its graph at the real function
    import torch._dynamo.variables.torch  # noqa: F401
    real_autocast = torch.is_autocast_enabled
    monkeypatch.setattr(torch, "is_autocast_enabled",
                        lambda *args: False if args and args[0] == "meta" else real_autocast(*args))


def _model_and_batch(name: str) -> tuple[torch.nn.Module, Batch]:
    torch.manual_seed(0)
    model = MODELS[name]().float().to(META)
    src, lengths, tgt_in = random_batch(batch=6, src_len=9, seed=1)
    host = Batch(src=src, src_lengths=lengths, tgt_in=tgt_in, tgt_out=tgt_in.roll(-1, 1),
                 tgt_lengths=torch.full((6,), tgt_in.size(1)), n_tokens=6 * tgt_in.size(1), indices=list(range(6)))
    moved = host.to(META, lengths_on_host=True)
    assert moved.src.device == META and moved.src_lengths.device.type == "cpu"
    return model, moved


@pytest.mark.parametrize("name", MODELS)
def test_a_training_update_keeps_host_and_device_apart(name, stand_in):
    model, batch = _model_and_batch(name)
    model.train()
    optimizer = build_optimizer(model.parameters(), {"name": "adam", "lr": 1e-3, "betas": (0.9, 0.98), "eps": 1e-9,
                                                     "weight_decay": 0.0})
    for group in optimizer.param_groups:
        group["fused"] = group["foreach"] = False
    loss, tokens, skipped = update(model, get_loss("entmax15"), optimizer, batch, PAD, clip_grad_norm=1.0)
    assert loss.device == META and tokens == batch.n_tokens and not skipped
    assert all(p.grad is None or p.grad.device == META for p in model.parameters())


@pytest.mark.parametrize("name", MODELS)
def test_validation_statistics_keep_host_and_device_apart(name, stand_in):
    model, batch = _model_and_batch(name)
    model.eval()
    kinds = ("encoder_self", "decoder_self", "cross") if name.startswith("transformer") else ()
    with torch.no_grad():
        totals, kind_totals = batch_statistics(model, get_loss("entmax15"), batch.src, batch.src_lengths,
                                               batch.tgt_in, batch.tgt_out, PAD, kinds)
    assert totals.device == META and kind_totals.device == META


@pytest.mark.parametrize("name", MODELS)
def test_static_search_steps_keep_host_and_device_apart(name, stand_in):
    """Every step of the static search, the first (one row per sentence), the ones where a
    sentence's own limit (``max_length_ratio``) falls and the last (``max_length``: every row ends)
    included."""
    model, batch = _model_and_batch(name)
    model.eval()
    options = SearchOptions(beam_size=3, max_length=6, max_length_ratio=0.8, max_length_offset=1, mode="static",
                            return_attention=True, return_support=True)
    with torch.no_grad():
        encoder_out, state = model.encode(batch.src, batch.src_lengths)
        rows = RowState.start(6, options.n_best, options.certify, META, options.length_limits(batch.src_lengths))
        stopped = torch.zeros(6, dtype=torch.bool, device=META)
        tokens = torch.full((6,), BOS, device=META)
        for t in range(options.max_length + 1):
            record, tokens, state, rows, stopped, truncated = static_step(
                model, tokens, state, encoder_out, rows, stopped, t, options, Specials(BOS, EOS, PAD))
            assert {v.device for v in record.values()} == {META} and tokens.device == META
            assert truncated is None or truncated.device == META
            if t == 0 and not shares_encoder_out(model):
                encoder_out = tile_state(encoder_out, options.beam_size)
