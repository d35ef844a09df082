"""Training and validation steps: compiled == eager, padding to a multiple changes nothing, no
host sync, bf16/fp16 autocast trains; the YAML keys reach the trainer."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from nmt.data.batching import Batch
from nmt.models import build_model
from nmt.sparse import get_loss
from nmt.train.compile import compile_for_device, compile_loss_forward, pad_to_multiple
from nmt.train.ema import WeightAverage
from nmt.train.precision import TrainPrecision
from nmt.train.update import loss_forward, update
from nmt.train.validation import batch_statistics, teacher_forced_statistics
from nmt.utils.sync_audit import SyncAudit

sys.path.insert(0, str(Path(__file__).parent))
from tiny_task import tiny_config, write_task  # noqa: E402

PAD, BOS, EOS, VOCAB = 0, 1, 2, 9
CFG = {
    "embeddings": {"src_size": 8, "tgt_size": 8, "share": False, "tie_output": False, "dropout": 0.0},
    "encoder": {"type": "lstm", "layers": 1, "hidden_size": 12, "bidirectional": True, "dropout": 0.0},
    "decoder": {"type": "lstm", "layers": 1, "hidden_size": 12, "dropout": 0.0, "input_feeding": True,
                "bridge": "linear"},
    "attention": {"score": "general", "mapping": "softmax", "params": {}, "continuous": None},
    "output": {"mapping": "softmax", "params": {}},
}


def copy_batch(seed: int, batch: int = 8, width: int = 5) -> Batch:
    """A copy-task batch (target = source), built on the host like ``collate``'s."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (batch,), generator=g)
    src = torch.randint(3, VOCAB, (batch, width), generator=g)
    src = src.masked_fill(torch.arange(width) >= lengths.unsqueeze(1), PAD)
    tgt_out = torch.cat([src, torch.full((batch, 1), PAD)], dim=1)
    tgt_out[torch.arange(batch), lengths] = EOS
    tgt_in = torch.cat([torch.full((batch, 1), BOS), src], dim=1)
    return Batch(src=src, src_lengths=lengths, tgt_in=tgt_in, tgt_out=tgt_out, tgt_lengths=lengths + 1,
                 n_tokens=int((lengths + 1).sum()), indices=list(range(batch)), n_src_tokens=int(lengths.sum()))


def model(dtype=torch.float64, **changes):
    torch.manual_seed(0)
    cfg = copy.deepcopy(CFG)
    for section, values in changes.items():
        cfg[section].update(values)
    return build_model(cfg, VOCAB, VOCAB, PAD).to(dtype)


def test_compiled_training_equals_eager():
    """Three SGD steps, float64: parameters equal to 1e-10 (compile: dynamo capture and AOT autograd,
    backend aot_eager; inductor's C++ code generation takes minutes on a loaded 2-core machine)."""
    runs = {}
    for name, forward in (("eager", loss_forward), ("compiled", compile_loss_forward("cpu", backend="aot_eager"))):
        m = model()
        optimizer = torch.optim.SGD(m.parameters(), lr=0.5)
        losses = [float(update(m, get_loss("softmax"), optimizer, copy_batch(s), PAD, 1.0, forward=forward)[0])
                  for s in range(3)]
        runs[name] = (losses, [p.detach().clone() for p in m.parameters()])
    assert runs["compiled"][0] == pytest.approx(runs["eager"][0], rel=1e-12)
    for a, b in zip(runs["compiled"][1], runs["eager"][1]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert runs["eager"][0][0] != runs["eager"][0][2]  # the steps did change the model


class _TwoBiases(torch.nn.Module):
    """A linear layer with two biases added first, as the LSTM cell's ``bias_ih + bias_hh``."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(VOCAB, 4, generator=g, dtype=torch.float64))
        self.bias_ih = torch.nn.Parameter(torch.randn(4, generator=g, dtype=torch.float64))
        self.bias_hh = torch.nn.Parameter(torch.randn(4, generator=g, dtype=torch.float64))


def _two_biases_forward(model, loss_fn, src, src_lengths, tgt_in, tgt_out, pad_index, label_smoothing, src_mask=None):
    hidden = torch.nn.functional.embedding(src, model.weight) + (model.bias_ih + model.bias_hh)  # (B, L, 4)
    return (hidden.tanh() ** 2 * src_mask[..., None]).sum() * 50.0


def test_inductor_gradients_accumulate_and_clip_as_eager():
    """Inductor's CPU backward returns one tensor for equal gradients (``bias_ih``'s and
    ``bias_hh``'s), which autograd stored as the ``.grad`` of both: the next accumulated batch
    added into it twice, and clipping scaled it twice (the compiled LSTM trained to other
    parameters than eager with ``training.accumulate: 2``, and with the default clipping).
    Real inductor here (a graph of a few operations: seconds), float64."""
    import torch._dynamo

    torch._dynamo.reset()
    runs = []
    for forward in (_two_biases_forward, compile_for_device(_two_biases_forward, "cpu")):
        m = _TwoBiases()
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(2):
            update(m, None, optimizer, [copy_batch(2 * step), copy_batch(2 * step + 1)], PAD, 1.0, forward=forward)
        runs.append([p.detach().clone() for p in m.parameters()])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("encoder", ["lstm", "gru"])
def test_compiled_lstm_step_is_one_graph(encoder):
    """With ``training.compile_encoder`` and the source mask (as ``update`` gives it), a compiled
    forward pass with an LSTM encoder is one graph: the encoder runs over the padded batch with its padding made inert, no packing
    between graphs (a GRU encoder still packs between graphs); loss and every gradient equal the
    eager step's (float64, 2-layer encoder)."""
    import torch._dynamo

    from nmt.models.seq2seq import length_mask

    graphs: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm

    m = model(encoder={"type": encoder, "layers": 2})
    batch = copy_batch(4)
    mask = length_mask(batch.src_lengths, batch.src.size(1), batch.src.device)
    args = (m, get_loss("softmax"), batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, PAD, 0.0, mask)
    compiled = compile_for_device(loss_forward, "cpu", backend=counting, encoder_in_graph=True)
    assert_compiled_equals_eager(m, compiled, loss_forward, args)
    assert (len(graphs) == 1) == (encoder == "lstm"), graphs


def assert_compiled_equals_eager(m: torch.nn.Module, compiled, eager, args: tuple) -> None:
    """The loss and every parameter's gradient of ``compiled(*args)`` equal ``eager(*args)``'s
    (each after a dynamo reset; the loss to 1e-12 relative, gradients to 1e-10 / 1e-12): the
    compiled training step computes what the eager one does. ``torch._dynamo.config.allow_rnn``
    (process-wide, set by compiling the LSTM encoder into the graph) is restored after."""
    results = []
    before = torch._dynamo.config.allow_rnn
    try:
        for forward in (compiled, eager):
            torch._dynamo.reset()
            m.zero_grad()
            loss = forward(*args)
            loss.backward()
            results.append((loss.detach(), [p.grad.clone() for p in m.parameters()]))
    finally:
        torch._dynamo.config.allow_rnn = before
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=0)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_padding_to_a_multiple_changes_neither_loss_nor_gradients():
    batch = copy_batch(3, width=5)
    padded = pad_to_multiple(batch, 4, PAD)
    assert padded.src.shape == (8, 8) and padded.tgt_in.shape == (8, 8) and padded.n_tokens == batch.n_tokens
    assert torch.equal(padded.src[:, :5], batch.src) and bool((padded.src[:, 5:] == PAD).all())
    grads = []
    for b in (batch, padded):
        m = model()
        loss = loss_forward(m, get_loss("softmax"), b.src, b.src_lengths, b.tgt_in, b.tgt_out, PAD, 0.0)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in m.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-12, atol=1e-12)
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert pad_to_multiple(batch, 1, PAD) is batch


STATIC_ENTMAX = {"mapping": "entmax15", "params": {"impl": "static"}}


@pytest.mark.parametrize("mapping", ["softmax", "entmax15-static"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_update_step_makes_no_host_sync(precision, mapping):
    """Forward, loss, backward, clipping, fused Adam and the moving average of the weights
    (``training.ema``, with the warmup rule): no synchronising call (lengths on the host;
    softmax attention, output and cross-entropy, or 1.5-entmax attention, output and loss on
    their sync-free static path)."""
    if mapping == "softmax":
        m, loss_fn = model(torch.float32), get_loss("softmax")
    else:
        m = model(torch.float32, attention=STATIC_ENTMAX, output=STATIC_ENTMAX)
        loss_fn = get_loss("entmax15", impl="static")
    optimizer = torch.optim.Adam(m.parameters(), lr=1e-3, fused=True)
    ema = WeightAverage(m, 0.99, start_step=1, warmup=True)
    for step in range(2):
        batch = copy_batch(step)
        with SyncAudit() as audit:
            loss, n_tokens, skipped = update(m, loss_fn, optimizer, batch, PAD, 1.0,
                                             precision=TrainPrecision(precision, "cpu"))
            ema.update(step + 1)  # a copy, then an average
        assert audit.total == 0, audit.report()
        assert isinstance(n_tokens, int) and loss.dim() == 0 and not skipped
    assert ema.averaged_updates == 1


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_trains(precision):
    """Autocast runs the model's products in half precision; the loss still falls."""
    m = model(torch.float32)
    train = TrainPrecision(precision, "cpu")
    with train.autocast():
        logits, _ = m(copy_batch(0).src, copy_batch(0).src_lengths, copy_batch(0).tgt_in)
    assert logits.dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert (train.scaler is not None) == (precision == "fp16")
    optimizer = torch.optim.Adam(m.parameters(), lr=0.02, fused=True)
    losses = []
    for step in range(40):
        batch = copy_batch(step % 4)
        loss, n, _ = update(m, get_loss("softmax"), optimizer, batch, PAD, 5.0, precision=train)
        losses.append(float(loss) / n)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-4:]) < 0.8 * sum(losses[:4])


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_run_resumes_exactly(tmp_path, precision):
    """A CPU autocast run with dropout, interrupted and resumed, reaches the parameters of an
    uninterrupted one: each session starts in a new process, where the encoder probes once whether
    oneDNN runs its LSTM in half precision (the probe's cache cleared below, as in a new process);
    that probe built a 1-unit LSTM with torch's global generator, so the resumed session's dropout
    masks were drawn from a stream shifted by its initialisation."""
    import os
    import signal

    from nmt.config import resolve_config
    from nmt.models.encoder import cpu_autocast_rnn_supported
    from nmt.train.trainer import Trainer

    data = write_task(tmp_path / "data")

    def session(name):
        cpu_autocast_rnn_supported.cache_clear()  # a new process
        config = tiny_config(data, tmp_path / name, precision=precision, device="cpu", max_steps=8, valid_every=4)
        return Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")

    straight = session("straight")
    straight.train()

    def interrupt_at_6(step):
        if step == 6:
            os.kill(os.getpid(), signal.SIGINT)

    assert session("resumed").train(step_hook=interrupt_at_6).stopped_by == "SIGINT"
    resumed = session("resumed")
    assert resumed.train().step == 8
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), name
    state = torch.random.get_rng_state()
    cpu_autocast_rnn_supported.cache_clear()
    cpu_autocast_rnn_supported("lstm", torch.bfloat16)
    assert torch.equal(torch.random.get_rng_state(), state)  # the probe draws nothing


def test_yaml_keys_reach_the_trainer(tmp_path):
    from nmt.config import load_config
    from nmt.train.trainer import Trainer
    import yaml

    data = write_task(tmp_path / "data", n_train=24, n_valid=4)
    cfg = tiny_config(data, tmp_path / "run", precision="bf16", pad_to_multiple=4, max_steps=4, valid_every=4)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    trainer = Trainer(load_config(tmp_path / "c.yaml"), str(tmp_path / "c.yaml"))
    assert trainer.precision.name == "bf16" and trainer.loss_forward is loss_forward
    assert trainer.batch_statistics is batch_statistics
    summary = trainer.train()
    assert summary.step == 4
    bad = tiny_config(data, tmp_path / "run2", precision="fp8")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad), encoding="utf-8")
    with pytest.raises(Exception, match="training.precision"):
        load_config(tmp_path / "bad.yaml")


@pytest.mark.parametrize("in_graph", [False, True])
def test_compile_encoder_key_reaches_dynamo(tmp_path, in_graph):
    """``training.compile_encoder`` sets dynamo's ``allow_rnn`` when the trainer compiles its steps
    (what lets the LSTM encoder into the graph); the compiled steps are built lazily."""
    import torch._dynamo
    import yaml

    from nmt.config import load_config
    from nmt.train.trainer import Trainer

    before = torch._dynamo.config.allow_rnn
    try:
        data = write_task(tmp_path / "data", n_train=24, n_valid=4)
        cfg = tiny_config(data, tmp_path / "run", compile=True, compile_encoder=in_graph, max_steps=1)
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
        trainer = Trainer(load_config(tmp_path / "c.yaml"), str(tmp_path / "c.yaml"))
        assert trainer.loss_forward is not loss_forward
        assert torch._dynamo.config.allow_rnn is in_graph
        trainer.lock.release()
    finally:
        torch._dynamo.config.allow_rnn = before


@pytest.mark.parametrize("mapping", ["softmax", "entmax15-static"])
def test_validation_statistics_make_no_host_sync(mapping, monkeypatch):
    """Teacher-forced sums of a batch (forward, loss, output mapping, support counts): no
    synchronising call (masks multiply; the sums stay on the device). The encoder's CPU-only
    grouping by source length reads the host lengths (no device there): turned off to count."""
    from nmt.models import encoder

    monkeypatch.setattr(encoder, "CPU_RUNS", False)
    if mapping == "softmax":
        m, loss_fn = model(torch.float32), get_loss("softmax")
    else:
        m = model(torch.float32, attention=STATIC_ENTMAX, output=STATIC_ENTMAX)
        loss_fn = get_loss("entmax15", impl="static")
    batch = copy_batch(5)
    with torch.no_grad(), SyncAudit() as audit:
        totals, kind_totals = batch_statistics(m.eval(), loss_fn, batch.src, batch.src_lengths, batch.tgt_in,
                                               batch.tgt_out, PAD, ())
    assert audit.total == 0, audit.report()
    assert totals.shape == (5,) and kind_totals.shape == (0, 2)
    assert int(totals[2]) == batch.n_tokens  # target tokens, EOS included, padding not


@pytest.mark.parametrize("model_type", ["lstm", "transformer"])
def test_compiled_and_padded_validation_equal_eager(tmp_path, model_type):
    """``training.compile`` validates with the compiled ``batch_statistics`` on batches padded to
    ``training.pad_to_multiple``: the same figures as eager, unpadded validation (float64;
    Transformer support per attention kind included). Compiled (backend aot_eager) only for the
    Transformer: tracing the LSTM decoder's unrolled steps takes 20 s here, and the LSTM's
    capture is tested with the training step above."""
    from nmt.config import resolve_config
    from nmt.train.trainer import Trainer

    data = write_task(tmp_path / "data", n_train=24, n_valid=5)
    # on the CPU wherever CUDA is: the contract of the CPU compile (on a CUDA machine the trainer
    # would pick the GPU, where tracing the float64 Transformer took 126 s)
    cfg = tiny_config(data, tmp_path / "run", pad_to_multiple=4, max_steps=2, device="cpu")
    if model_type == "transformer":
        cfg["model"] = {"type": "transformer",
                        "transformer": {"encoder_layers": 1, "decoder_layers": 1, "d_model": 8, "heads": 2,
                                        "d_ff": 16, "dropout": 0.0, "attention_dropout": 0.0},
                        "attention": {"mapping": "entmax15", "params": {"temperature": 2.0}},
                        "output": {"mapping": "sparsemax"}}
    trainer = Trainer(resolve_config(cfg, "tiny.yaml"), "tiny.yaml")
    trainer.model.double().eval()
    valid = trainer.data.valid
    args = (trainer.model, valid, trainer.loss_fn, 3, trainer.device, False)
    eager = teacher_forced_statistics(*args)
    padded = teacher_forced_statistics(*args, pad_multiple=4)
    compiled = padded if model_type == "lstm" else teacher_forced_statistics(
        *args, pad_multiple=4, statistics=compile_for_device(batch_statistics, "cpu", backend="aot_eager"))
    assert set(eager) == set(padded) == set(compiled)
    assert eager["tokens"] == sum(len(t) + 1 for t in valid.tgt)
    if model_type == "transformer":
        assert "attention_support_cross" in eager
    for name in eager:
        assert padded[name] == pytest.approx(eager[name], rel=1e-12), name
        assert compiled[name] == pytest.approx(eager[name], rel=1e-12), name


def test_compiled_step_with_word_dropout_is_one_graph():
    """Whole-word dropout on both sides (model.embeddings.src/tgt_word_dropout) adds no graph break
    to the compiled LSTM step, and its loss differs from the step without it (the masks apply)."""
    from nmt.models.seq2seq import length_mask

    graphs: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm

    before = torch._dynamo.config.allow_rnn
    try:
        m = model(embeddings={"src_word_dropout": 0.3, "tgt_word_dropout": 0.3}).train()
        batch = copy_batch(5)
        mask = length_mask(batch.src_lengths, batch.src.size(1), batch.src.device)
        args = (m, get_loss("softmax"), batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, PAD, 0.0, mask)
        torch._dynamo.reset()
        compiled = compile_for_device(loss_forward, "cpu", backend=counting, encoder_in_graph=True)
        loss = compiled(*args)
        loss.backward()
        assert len(graphs) == 1, graphs
        m.src_word_dropout.p = m.tgt_word_dropout.p = 0.0
        assert abs(float(loss) - float(loss_forward(*args))) > 1e-6  # float64: far above rounding
    finally:
        torch._dynamo.config.allow_rnn = before
        torch._dynamo.reset()


@pytest.mark.parametrize("mapping", ["softmax", "entmax15"])
def test_compiled_copying_step_is_one_graph_and_equals_eager(mapping):
    """A copying output (model.output.copy; its loss target from the mapping over the correct parts)
    adds no graph break to the compiled LSTM step (encoder in the graph), and loss and gradients
    equal the eager step's, label smoothing included (float64, the mappings' accelerator path)."""
    from nmt.models.copy_attention import NOT_COPIED
    from nmt.models.seq2seq import length_mask

    graphs: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm

    params = {} if mapping == "softmax" else {"impl": "static"}
    m = model(attention={"mapping": mapping, "params": params},
              output={"mapping": mapping, "params": params, "copy": True}).train()
    m.generator.copy.set_vocabularies(torch.tensor([NOT_COPIED] * 3 + list(range(3, VOCAB))))
    batch = copy_batch(6)
    mask = length_mask(batch.src_lengths, batch.src.size(1), batch.src.device)
    args = (m, get_loss(mapping, **params), batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, PAD, 0.1, mask)
    compiled = compile_for_device(loss_forward, "cpu", backend=counting, encoder_in_graph=True)
    assert_compiled_equals_eager(m, compiled, loss_forward, args)
    assert len(graphs) == 1, graphs
