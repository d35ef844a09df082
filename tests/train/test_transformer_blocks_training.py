"""model.transformer.activation (gated: swiglu, geglu) and model.transformer.layer_norm: rms in
training and translation: a run trains (its blocks hold the gated inner product and RMSNorm gains),
a killed run resumes to the same weights, and nmt-translate of the checkpoint gives the in-process
search's outputs and certificates. The blocks' arithmetic is checked against closed forms in
tests/models/test_transformer.py, their certificates by enumeration in
tests/translate/test_certificate_bruteforce.py."""
from __future__ import annotations

import pytest
import torch

from nmt.config import resolve_config
from nmt.train.trainer import Trainer
from tiny_task import (TINY_TRANSFORMER, as_transformer, assert_resumes_exactly, cli_translation_matches_search,
                       tiny_config, write_task)


@pytest.fixture
def task(tmp_path):
    return write_task(tmp_path / "task", n_train=40)


def make(data, save_dir, activation: str = "swiglu", layer_norm: str = "rms", **training) -> Trainer:
    cfg = as_transformer(tiny_config(data, save_dir, device="cpu", **training))
    cfg["model"]["transformer"].update(activation=activation, layer_norm=layer_norm)
    return Trainer(resolve_config(cfg, "c.yaml"), "c.yaml")


def test_a_gated_rms_transformer_trains_resumes_and_translates(task, tmp_path):
    straight, _ = assert_resumes_exactly(lambda d: make(task, d, max_steps=10), tmp_path)
    state = straight.model.state_dict()
    d_ff = TINY_TRANSFORMER["d_ff"]
    inner = [k for k in state if k.endswith("feed_forward.inner.weight")]
    assert inner and all(state[k].shape[0] == 2 * d_ff for k in inner)
    norms = [m for m in straight.model.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))]
    assert norms and all(isinstance(m, torch.nn.RMSNorm) for m in norms)
    make(task, tmp_path / "long", activation="geglu", max_steps=150, valid_every=150).train()
    cli_translation_matches_search(tmp_path / "long" / "last.pt", task["valid"]["src"], tmp_path)
