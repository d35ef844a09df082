"""Training a Transformer end to end: reports (support per attention kind, learned alphas,
per-layer/head heatmap grids), the noam schedule and gradient accumulation from the config."""
import json

import pytest
import torch

from nmt.config import resolve_config
from nmt.train.trainer import Trainer
from nmt.train.validation import teacher_forced_statistics
from tiny_task import tiny_config

TRANSFORMER = {
    "type": "transformer",
    "embeddings": {"dropout": 0.1},
    "transformer": {"encoder_layers": 2, "decoder_layers": 2, "d_model": 8, "heads": 2, "d_ff": 16,
                    "dropout": 0.1, "attention_dropout": 0.1},
    "attention": {"mapping": "entmax15", "cross": {"mapping": "entmax_bisect", "params": {"alpha": "learned"}}},
    "output": {"mapping": "entmax15"},
}


def transformer_config(tiny_task, save_dir, model=None, **training):
    config = tiny_config(tiny_task, save_dir, **training)
    config["model"] = model or TRANSFORMER
    return config


def test_softmax_support_per_kind_is_the_number_of_visible_positions(tiny_task, tmp_path):
    """Softmax weights are all positive: the mean support is the mean count of visible keys."""
    model_cfg = {**TRANSFORMER, "attention": {"mapping": "softmax"}, "output": {"mapping": "softmax"}}
    trainer = Trainer(resolve_config(transformer_config(tiny_task, tmp_path / "run", model_cfg), "t.yaml"), "t.yaml")
    data = trainer.data.valid
    stats = teacher_forced_statistics(trainer.model.eval(), data, trainer.loss_fn, 4, trainer.device, True)
    n = [len(s) for s in data.src]
    m = [len(t) + 1 for t in data.tgt]  # target + EOS rows
    assert stats["attention_support_encoder_self"] == pytest.approx(sum(x * x for x in n) / sum(n))
    assert stats["attention_support_decoder_self"] == pytest.approx(sum(y * (y + 1) / 2 for y in m) / sum(m))
    assert stats["attention_support_cross"] == pytest.approx(sum(x * y for x, y in zip(n, m)) / sum(m))


def test_transformer_run_reports_alphas_support_and_grids(tiny_task, tmp_path):
    save_dir = tmp_path / "run"
    config = transformer_config(tiny_task, save_dir, tensorboard=True, accumulate=2,
                                lr_schedule={"type": "noam", "warmup_steps": 3}, max_steps=6, valid_every=3)
    config["validation"]["n_heatmaps"] = 1
    summary = Trainer(resolve_config(config, "t.yaml"), "t.yaml").train()
    assert summary.step == 6
    records = [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    for kind in ("encoder_self", "decoder_self", "cross"):
        assert last[f"valid_attention_support_{kind}"] >= 1
    assert set(last["alphas"]) == {"cross"}
    alphas = last["alphas"]["cross"]
    assert len(alphas) == 2 and all(len(heads) == 2 for heads in alphas)
    assert all(1 < a <= 2 for heads in alphas for a in heads)
    assert any(a != 1.5 for heads in alphas for a in heads)  # trained
    # noam: at step 3 the lr of the next (4th) update: peak * sqrt(3 / 4)
    assert records[0]["step"] == 3 and records[0]["lr"] == pytest.approx(1e-3 * (3 / 4) ** 0.5)
    # 5 batches of 8 per epoch, 2 per update: the 3rd update of an epoch uses its last (odd) batch
    assert [r["epoch"] for r in records] == [0, 1] and summary.epoch == 2

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(save_dir / "tensorboard"), size_guidance={"images": 0, "histograms": 0})
    events.Reload()
    tags = events.Tags()
    assert "attention_layers_heads/valid_0" in tags["images"] and "attention/valid_0" in tags["images"]
    assert {"alpha/cross/layer0", "alpha/cross/layer1"} <= set(tags["histograms"])
    assert "alpha/cross/layer1/head1" in tags["scalars"]
    assert "valid/attention_support_cross" in tags["scalars"]


def relative_model(positions: str) -> dict:
    """The run's Transformer with rotary (base 500), relative (K = 3) or ALiBi positions ("alibi-split":
    the direction-aware encoder)."""
    alibi_encoder = "split" if positions == "alibi-split" else "symmetric"
    return {**TRANSFORMER, "transformer": {**TRANSFORMER["transformer"], "positions": positions.split("-")[0],
                                           "rotary_base": 500.0, "max_relative_positions": 3,
                                           "alibi_encoder": alibi_encoder}}


@pytest.mark.parametrize("positions", ["rotary", "relative", "alibi", "alibi-split"])
def test_a_relative_position_run_resumes_as_uninterrupted_and_its_checkpoint_translates(positions, tiny_task,
                                                                                        tmp_path):
    """positions: rotary / relative / alibi through the trainer: a run killed at step 7 and resumed equals
    the straight run (bit-equal weights, same metrics); load_model rebuilds the model from the checkpoint's
    config (the rotary base, the relative tables of 2K + 1 vectors, ALiBi's slopes from the heads: nothing
    saved) and gives the trainer's logits."""
    import os
    import signal

    from nmt.models.transformer.positions import ScoreBiasPositions
    from nmt.models.transformer.rotary import RotaryPositions
    from nmt.train.checkpoint import load_checkpoint
    from nmt.translate.loading import load_model
    from tiny_task import assert_same_run

    def trainer(save_dir):
        config = transformer_config(tiny_task, save_dir, relative_model(positions), device="cpu")
        return Trainer(resolve_config(config, "t.yaml"), "t.yaml")

    straight = trainer(tmp_path / "straight")
    straight.train()

    def interrupt_at_7(step):
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)

    assert trainer(tmp_path / "resumed").train(step_hook=interrupt_at_7).step == 7
    second = trainer(tmp_path / "resumed")
    assert second.resumed and second.train().step == 12
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")

    saved = load_checkpoint(tmp_path / "resumed" / "last.pt")["model"]
    tables = [key for key in saved if "relative" in key]
    loaded = load_model(tmp_path / "resumed" / "last.pt")
    positions_module = loaded.model.encoder.positions
    if positions == "rotary":
        assert not tables and not any("positions" in key for key in saved)  # no table, nothing saved
        assert isinstance(positions_module, RotaryPositions) and positions_module.base == 500.0
    elif positions.startswith("alibi"):
        assert not tables and not any("positions" in key or "alibi" in key for key in saved)  # nothing saved
        assert isinstance(positions_module, ScoreBiasPositions) and positions_module.settings == {"heads": 2}
        slopes = loaded.model.decoder.layers[0].self_attn.alibi.slopes
        assert slopes.tolist() == [1 / 16, 1 / 256]
        encoder_bias = loaded.model.encoder.layers[0].self_attn.alibi
        want = ([1 / 16, 1 / 128], [1 / 8, 1 / 256]) if positions == "alibi-split" else (slopes.tolist(),) * 2
        assert (encoder_bias.left.tolist(), encoder_bias.right.tolist()) == want
    else:
        assert len(tables) == 4 and all(saved[key].shape == (7, 4) for key in tables)  # 2 + 2 layers
        assert isinstance(positions_module, ScoreBiasPositions) and positions_module.settings == {"max_relative": 3}
    assert loaded.model.position_limits() == (None, None)
    src, lengths, tgt_in = torch.tensor([[4, 5, 6, 7]]), torch.tensor([4]), torch.tensor([[2, 5, 6]])
    with torch.no_grad():
        want, _ = second.model.eval()(src, lengths, tgt_in)
        got, _ = loaded.model(src, lengths, tgt_in)
    assert torch.equal(got, want)


@pytest.mark.parametrize("positions,missing", [
    ("sinusoidal", ("rotary_base", "max_relative_positions", "alibi_encoder")),
    ("alibi", ("alibi_encoder",)),
])
def test_a_checkpoint_saved_before_newer_options_resumes_and_loads(positions, missing, tiny_task, tmp_path):
    """A run whose checkpoint config lacks model.transformer options added since (as nmt wrote it
    before them: rotary_base and max_relative_positions for a sinusoidal run, alibi_encoder for an
    ALiBi one): resuming counts the keys at their defaults as no difference, and load_model rebuilds
    the same model (ALiBi: the symmetric encoder)."""
    from nmt.train.checkpoint import load_checkpoint, save_checkpoint
    from nmt.translate.loading import load_model

    def trainer(**training):
        model = relative_model(positions) if positions == "alibi" else None
        config = transformer_config(tiny_task, tmp_path / "run", model, device="cpu", **training)
        return Trainer(resolve_config(config, "t.yaml"), "t.yaml")

    first = trainer(max_steps=4)
    first.train()
    last = tmp_path / "run" / "last.pt"
    checkpoint = load_checkpoint(last)
    for key in missing:
        del checkpoint["config"]["model"]["transformer"][key]
    save_checkpoint(last, checkpoint)
    loaded = load_model(last)
    if positions == "alibi":
        assert all(layer.self_attn.alibi.form == "symmetric" for layer in loaded.model.encoder.layers)
    src, lengths, tgt_in = torch.tensor([[4, 5, 6]]), torch.tensor([3]), torch.tensor([[2, 5]])
    with torch.no_grad():
        assert torch.equal(loaded.model(src, lengths, tgt_in)[0], first.model.eval()(src, lengths, tgt_in)[0])
    second = trainer(max_steps=6)
    assert second.resumed and second.train().step == 6


def test_a_grouped_query_attention_run_trains_and_its_checkpoint_translates(tiny_task, tmp_path):
    """``model.transformer.kv_heads: 1`` (multi-query attention, 2 heads) through the trainer: the
    checkpoint holds key/value projections of one head, load_model rebuilds the model from its
    config and gives the trainer's logits, and ``nmt-translate`` gives the in-process beam search's
    outputs and certificates."""
    from nmt.train.checkpoint import load_checkpoint
    from tiny_task import cli_translation_matches_search

    model = {**TRANSFORMER, "transformer": {**TRANSFORMER["transformer"], "kv_heads": 1}}
    config = transformer_config(tiny_task, tmp_path / "run", model, device="cpu")
    trainer = Trainer(resolve_config(config, "t.yaml"), "t.yaml")
    assert trainer.train().step == 12
    saved = load_checkpoint(tmp_path / "run" / "last.pt")["model"]
    kv = [key for key in saved if key.endswith(("k_proj.weight", "v_proj.weight"))]
    assert len(kv) == 2 * 6 and all(saved[key].shape == (4, 8) for key in kv)  # d_head 4, d_model 8
    loaded, src, lengths = cli_translation_matches_search(tmp_path / "run" / "last.pt", tiny_task["valid"]["src"],
                                                          tmp_path)
    tgt_in = torch.tensor([[2, 5, 6]] * src.size(0))
    with torch.no_grad():
        want, _ = trainer.model.eval()(src, lengths, tgt_in)
        got, _ = loaded.model(src, lengths, tgt_in)
    assert torch.equal(got, want)
