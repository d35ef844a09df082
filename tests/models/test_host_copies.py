"""Host-to-device copies of training and decoding: the same values, and on CUDA no host sync
(pinned staging, ``non_blocking``; a copy from pageable memory makes torch wait for the stream).

The CPU tests check the values against torch's own functions; the CUDA tests count real syncs
with CUDA's sync debug mode (skipped without CUDA)."""
from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from nmt.data.batching import Batch
from nmt.models.encoder import _pack
from nmt.models.seq2seq import length_mask
from nmt.utils.device import host_to_device
from nmt.utils.host_syncs import host_sync_sites_on

from tiny_models import random_batch

ON_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not ON_CUDA, reason="needs CUDA")


@pytest.mark.parametrize("seed", range(6))
def test_pack_equals_torch_pack_padded_sequence(seed):
    """Lengths with ties, in any order: the same data, batch sizes and (un)sort indices."""
    g = torch.Generator().manual_seed(seed)
    batch, width = 9, 7
    lengths = torch.randint(1, width + 1, (batch,), generator=g)
    lengths[seed % batch] = width
    emb = torch.randn(batch, width, 5, generator=g, dtype=torch.float64)
    ours = _pack(emb, lengths)
    theirs = pack_padded_sequence(emb, lengths, batch_first=True, enforce_sorted=False)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)


def test_host_to_device_on_the_cpu_is_to():
    x = torch.arange(5)
    assert host_to_device(x, "cpu") is x
    assert torch.equal(host_to_device(x, "cpu"), x)


def _host_batch() -> Batch:
    """Six sentences padded on the host, as ``collate`` leaves a training batch."""
    src, lengths, tgt_in = random_batch(batch=6, src_len=9, seed=1)
    return Batch(src=src, src_lengths=lengths, tgt_in=tgt_in, tgt_out=tgt_in.roll(-1, 1),
                 tgt_lengths=torch.full((6,), tgt_in.size(1)), n_tokens=6 * tgt_in.size(1), indices=list(range(6)))


def _cuda_training_setup(model_type: str):
    """(model on CUDA in training mode, fused Adam, the host batch, the 1.5-entmax loss): the LSTM
    with 1.5-entmax attention and output, or the Transformer with its default mappings."""
    from nmt.models import build_model
    from nmt.models.transformer import build_transformer
    from nmt.sparse import get_loss
    from nmt.train.optimizers import build_optimizer
    from tiny_models import model_cfg, transformer_cfg

    torch.manual_seed(0)
    if model_type == "lstm":
        model = build_model(model_cfg(attention={"mapping": "entmax15"}, output={"mapping": "entmax15"}), 13, 11, 0)
    else:
        model = build_transformer(transformer_cfg(), 13, 11, 0)
    model = model.float().cuda().train()
    optimizer = build_optimizer(model.parameters(), {"name": "adam", "lr": 1e-3, "betas": (0.9, 0.98),
                                                     "eps": 1e-9, "weight_decay": 0.0})
    return model, optimizer, _host_batch(), get_loss("entmax15")


@cuda_only
def test_copies_to_cuda_make_no_host_sync():
    """Batch.to, length_mask with host lengths and the packed encoder's sort order: no sync,
    the values of the CPU."""
    batch = _host_batch()
    src, lengths = batch.src, batch.src_lengths
    torch.cuda.synchronize()
    moved, sites = host_sync_sites_on("cuda", lambda: batch.to("cuda", lengths_on_host=True))
    assert not sites, sites
    assert moved.src.is_cuda and not moved.src_lengths.is_cuda and torch.equal(moved.src.cpu(), src)
    mask, sites = host_sync_sites_on("cuda", lambda: length_mask(lengths, 9, torch.device("cuda")))
    assert not sites, sites
    assert torch.equal(mask.cpu(), length_mask(lengths, 9, torch.device("cpu")))
    emb = torch.randn(6, 9, 4)
    emb_cuda = emb.cuda()  # a blocking copy from pageable memory: outside the audited call
    torch.cuda.synchronize()
    packed, sites = host_sync_sites_on("cuda", lambda: _pack(emb_cuda, lengths))
    assert not sites, sites
    for a, b in zip(packed, pack_padded_sequence(emb, lengths, batch_first=True, enforce_sorted=False)):
        assert torch.equal(a.cpu(), b)


@cuda_only
def test_lstm_encoder_on_cuda_makes_no_host_sync(make_model):
    """The packed encoder with host lengths (what training does): no sync, the CPU's values."""
    model = make_model(dtype=torch.float32)
    src, lengths, _ = random_batch(batch=5, src_len=8, seed=2)
    with torch.no_grad():
        emb = model.src_embeddings(src)
        expected, _ = model.encoder(emb, lengths)
        model.cuda()
        emb = emb.cuda()
        torch.cuda.synchronize()
        (memory, _), sites = host_sync_sites_on("cuda", lambda: model.encoder(emb, lengths))
    assert not sites, sites
    torch.testing.assert_close(memory.cpu(), expected, rtol=1e-4, atol=1e-5)  # cuDNN vs the CPU: 2e-6 apart


def test_pack_is_not_traced_by_torch_compile(monkeypatch):
    """Under torch.compile our packing runs eagerly between graphs (with its sync-free copy of
    the sort order), as torch's pack_padded_sequence does (dynamo skips it): the same graphs and
    breaks as with torch's function. Traced, its data-dependent packing split the step into more graphs, and the
    compiled CUDA training step ran 10-17x slower (H200, 2026-11-26)."""
    import torch._dynamo

    from nmt.models import build_model, encoder
    from nmt.sparse import get_loss
    from nmt.train.update import loss_forward
    from tiny_models import model_cfg

    monkeypatch.setattr(encoder, "CPU_RUNS", False)  # the packed path, which CUDA takes
    model = build_model(model_cfg(), 13, 11, 0).train()
    src, lengths, tgt_in = random_batch(batch=4, src_len=7, seed=1)
    args = (model, get_loss("softmax"), src, lengths, tgt_in, tgt_in.roll(-1, 1), 0, 0.0)

    def graphs() -> tuple[int, int]:
        torch._dynamo.reset()
        explained = torch._dynamo.explain(loss_forward)(*args)
        return explained.graph_count, explained.graph_break_count

    copies: list[bool] = []  # our packing's sort-order copy, and whether dynamo traced it
    monkeypatch.setattr(encoder, "host_to_device", lambda tensor, device: copies.append(
        torch.compiler.is_compiling()) or tensor.to(device))
    ours = graphs()
    assert copies == [False]  # run eagerly between graphs, with our sync-free copy
    monkeypatch.setattr(encoder, "_pack", lambda emb, lengths: pack_padded_sequence(
        emb, lengths, batch_first=True, enforce_sorted=False))
    assert ours == graphs()
    assert copies == [False]


@pytest.mark.parametrize("model_type", ["lstm", "transformer"])
def test_compiled_forward_takes_no_host_lengths_beside_the_encoders(monkeypatch, model_type):
    """With the source mask made by ``update`` (outside the compiled forward), the host lengths
    enter no graph except the RNN encoder's own host-side conversion (a graph whose only input
    they are): on CUDA a graph with a host input copies it with a sync and is not captured by
    CUDA graphs. Without the mask, the graph that builds it takes the lengths (the check fails)."""
    import torch._dynamo

    from nmt.models import build_model, encoder
    from nmt.models.seq2seq import length_mask
    from nmt.models.transformer import build_transformer
    from nmt.sparse import get_loss
    from nmt.train.update import loss_forward
    from tiny_models import model_cfg, transformer_cfg

    monkeypatch.setattr(encoder, "CPU_RUNS", False)  # the packed path, which CUDA takes
    torch.manual_seed(0)
    if model_type == "lstm":
        model = build_model(model_cfg(), 13, 11, 0).train()
    else:
        model = build_transformer(transformer_cfg(), 13, 11, 0).train()
    src, lengths, tgt_in = random_batch(batch=4, src_len=7, seed=1)

    def graphs_taking_lengths(mask):
        torch._dynamo.reset()
        inputs: list[list[str]] = []

        def backend(gm, example_inputs):
            inputs.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
            return gm

        torch.compile(loss_forward, backend=backend)(model, get_loss("softmax"), src, lengths, tgt_in,
                                                     tgt_in.roll(-1, 1), 0, 0.0, mask)
        assert len(inputs) >= 1
        return [names for names in inputs if any("lengths" in n for n in names)]

    taking = graphs_taking_lengths(length_mask(lengths, src.size(1), src.device))
    assert all(len(names) == 1 for names in taking), taking  # the encoder's conversion alone
    assert any(len(names) > 1 for names in graphs_taking_lengths(None))


def test_compiled_validation_takes_no_host_lengths():
    """Validation's compiled batch statistics, given the source mask as teacher_forced_statistics
    gives it: no graph takes the host lengths (the Transformer, attention kinds included)."""
    import torch._dynamo

    from nmt.models.seq2seq import length_mask
    from nmt.models.transformer import build_transformer
    from nmt.sparse import get_loss
    from nmt.train.validation import batch_statistics
    from tiny_models import transformer_cfg

    torch.manual_seed(0)
    model = build_transformer(transformer_cfg(), 13, 11, 0).eval()
    src, lengths, tgt_in = random_batch(batch=4, src_len=7, seed=1)
    kinds = tuple(model.attention_kinds)
    inputs: list[list[str]] = []

    def backend(gm, example_inputs):
        inputs.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(batch_statistics, backend=backend)
        totals, _ = compiled(model, get_loss("softmax"), src, lengths, tgt_in, tgt_in.roll(-1, 1), 0, kinds,
                             length_mask(lengths, src.size(1), src.device))
        expected, _ = batch_statistics(model, get_loss("softmax"), src, lengths, tgt_in, tgt_in.roll(-1, 1), 0, kinds)
    assert inputs and not any("lengths" in n for names in inputs for n in names), inputs
    torch.testing.assert_close(totals, expected)


@cuda_only
@pytest.mark.parametrize("model_type", ["lstm", "transformer"])
def test_training_update_on_cuda_makes_no_host_sync(model_type):
    """A whole eager update on CUDA (the batch moved from the host as the trainer moves it; the
    LSTM with 1.5-entmax attention and output, the Transformer with its default mappings; the
    1.5-entmax loss, clipping, fused Adam): no host sync (the sync debug mode), as measured on an
    H200 for the Multi30k LSTM (2026-11-26)."""
    from nmt.train.update import update

    model, optimizer, host, loss_fn = _cuda_training_setup(model_type)

    def step():
        return update(model, loss_fn, optimizer, host.to("cuda", lengths_on_host=True), 0, 5.0)

    step()  # lazy initialisations (kernels, cuDNN, the pinned pool) are not the step's syncs
    torch.cuda.synchronize()
    (loss, n_tokens, skipped), sites = host_sync_sites_on("cuda", step)
    assert not sites, sites
    assert torch.isfinite(loss).item() and n_tokens == host.n_tokens and not skipped


@cuda_only
@pytest.mark.parametrize("model_type,encoder_in_graph", [("lstm", False), ("lstm", True), ("transformer", False)])
def test_compiled_training_update_on_cuda_makes_no_host_sync(model_type, encoder_in_graph):
    """The compiled update (``training.compile``'s graphs, here with the "aot_eager" backend: the
    same graphs and graph breaks as inductor's, without its code generation) on CUDA: after the
    compiling step, no host sync. The source mask comes from ``update``; the LSTM's packing runs
    between graphs with its pinned copy (torch's packing, run there before, copied the sort order
    from pageable memory: a sync per step), or with ``training.compile_encoder`` the LSTM runs in
    the graph from the mask."""
    import torch._dynamo

    from nmt.train.compile import compile_loss_forward
    from nmt.train.update import update

    torch._dynamo.reset()
    model, optimizer, host, loss_fn = _cuda_training_setup(model_type)
    before = torch._dynamo.config.allow_rnn
    forward = compile_loss_forward("cuda", backend="aot_eager", encoder_in_graph=encoder_in_graph)

    def step():
        return update(model, loss_fn, optimizer, host.to("cuda", lengths_on_host=True), 0, 5.0, forward=forward)

    try:
        step()  # compiles
        step()
        torch.cuda.synchronize()
        (loss, n_tokens, skipped), sites = host_sync_sites_on("cuda", step)
    finally:
        torch._dynamo.config.allow_rnn = before
    assert not sites, sites
    assert torch.isfinite(loss).item() and n_tokens == host.n_tokens and not skipped
