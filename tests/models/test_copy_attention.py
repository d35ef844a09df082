"""Copying source tokens (model.output.copy): the source-to-target table; the token distribution
is the joint mapping's vocabulary entry plus the copying positions (a per-token Python sum as the
truth), exact zeros kept; a step's log-probabilities equal the teacher-forced pass's (LSTM and
Transformer, beam-shaped rows too); the loss target is the set target of the correct parts (the
dense construction by loops) and for softmax the loss is the marginal likelihood; the gradient of
the whole loss by finite differences; no host sync; one compiled graph; the packed CPU step steps
aside."""
from __future__ import annotations

import pytest
import torch

from nmt.models import build_model
from nmt.models.copy_attention import NOT_COPIED, CopyAttention, source_to_target
from nmt.models.seq2seq import length_mask
from nmt.sparse import get_loss, get_mapping, set_target
from nmt.train.update import loss_forward
from nmt.utils.sync_audit import SyncAudit
from tiny_models import SRC_VOCAB, TGT_VOCAB, model_cfg, random_batch, sharpen_attention, transformer_cfg

MAPPINGS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax_bisect", {"alpha": 1.3})]
IDS = ["softmax", "sparsemax", "entmax15", "bisect-1.3"]


def copy_model(kind: str, mapping: str = "entmax15", params: dict | None = None, seed: int = 0,
               dtype=torch.float64):
    """A tiny LSTM or Transformer that copies, in eval mode; source types 4.. copy target ids
    (type % TGT_VOCAB, some of them 1 = <unk>), the specials nothing; weights scaled so that the
    sparse mappings have zeros."""
    torch.manual_seed(seed)
    output = {"mapping": mapping, "params": dict(params or {}), "copy": True}
    cfg = model_cfg(output=output) if kind == "lstm" else transformer_cfg(output=output)
    model = build_model(cfg, SRC_VOCAB, TGT_VOCAB).to(dtype).eval()
    table = torch.tensor([NOT_COPIED] * 4 + [max(t % TGT_VOCAB, 4) if t % 5 else 1 for t in range(4, SRC_VOCAB)])
    model.generator.copy.set_vocabularies(table)
    if kind == "lstm":
        sharpen_attention(model)  # every weight x 10, the attention keys x 100
    with torch.no_grad():
        model.generator.proj.weight.mul_(0.3 if kind == "lstm" else 4)
        model.generator.copy.keys.weight.mul_(3)
    return model


def brute_marginal(probs: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """(V,) of one row's joint probs (V + L) and its positions' ids (L,): loops."""
    out = probs[:vocab].clone()
    for j, t in enumerate(ids.tolist()):
        if t >= 0:
            out[t] += probs[vocab + j]
    return out


def test_the_source_to_target_table():
    src_tokens = ["<pad>", "<unk>", "<bos>", "<eos>", "a", "b", "zz", "<unk2>"]
    tgt_index = {"<pad>": 0, "<unk>": 1, "<bos>": 2, "<eos>": 3, "b": 4, "a": 5}
    table = source_to_target(src_tokens, tgt_index, 1, ("<pad>", "<bos>", "<eos>"))
    assert table.tolist() == [NOT_COPIED, 1, NOT_COPIED, NOT_COPIED, 5, 4, 1, 1]
    copy = CopyAttention(4, 4, len(src_tokens))
    copy.set_vocabularies(table)
    src = torch.tensor([[4, 5, 6, 3], [1, 4, 0, 0]])
    assert copy.ids(src, src != 0).tolist() == [[5, 4, 1, NOT_COPIED], [1, 5, NOT_COPIED, NOT_COPIED]]
    with pytest.raises(ValueError, match="3 entries for a source vocabulary of 8"):
        copy.set_vocabularies(table[:3])


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
@pytest.mark.parametrize("mapping,params", MAPPINGS, ids=IDS)
def test_the_token_distribution_adds_each_tokens_copies(kind, mapping, params):
    model = copy_model(kind, mapping, params)
    src, lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5, lengths=[7, 4, 2])
    with torch.no_grad():
        scores, _ = model(src, lengths, tgt_in)
        mask = length_mask(lengths, src.size(1), src.device)
        probs = model.output_probs(scores, src, mask)
    assert scores.shape == (3, 5, TGT_VOCAB + 7)
    joint = get_mapping(mapping, **params)(scores, dim=-1)
    ids = model.generator.copy.ids(src, mask)
    for b in range(3):
        assert torch.all(torch.isinf(scores[b, :, TGT_VOCAB + int(lengths[b]):]))  # padding copies nothing
        for t in range(5):
            torch.testing.assert_close(probs[b, t], brute_marginal(joint[b, t], ids[b], TGT_VOCAB), rtol=0, atol=1e-15)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 5, dtype=torch.float64))
    if mapping != "softmax":
        assert bool((probs == 0).any()) and bool((joint[..., TGT_VOCAB:] > 0).any())  # zeros, and copies


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
@pytest.mark.parametrize("mapping,params", MAPPINGS, ids=IDS)
def test_a_steps_log_probs_are_the_teacher_forced_passs(kind, mapping, params):
    """Steps over N = B x 2 rows (two slots per sentence, the encoder output kept once per
    sentence as a search keeps it) give the log of the forward pass's token distribution, -inf
    exactly at its zeros; the ranking scores are each token's largest joint score."""
    model = copy_model(kind, mapping, params)
    src, lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5, lengths=[7, 4, 2])
    with torch.no_grad():
        scores, _ = model(src, lengths, tgt_in)
        probs = model.output_probs(scores, src, length_mask(lengths, src.size(1), src.device))
        encoder_out, state = model.encode(src, lengths)
        state = {k: v.repeat_interleave(2, dim=0) for k, v in state.items()}
        for t in range(tgt_in.size(1)):
            ranking, log_probs, _, state = model.step_with_scores(tgt_in[:, t].repeat_interleave(2), state, encoder_out)
            expected = probs[:, t].repeat_interleave(2, dim=0)
            assert torch.equal(torch.isinf(log_probs), expected == 0)
            torch.testing.assert_close(log_probs.exp(), expected, rtol=1e-9, atol=1e-12)
            ids = model.generator.copy.ids(src, length_mask(lengths, src.size(1), src.device))
            for n in range(6):
                joint = scores[n // 2, t]
                best = joint[:TGT_VOCAB].clone()
                for j, y in enumerate(ids[n // 2].tolist()):
                    if y >= 0:
                        best[y] = max(best[y], joint[TGT_VOCAB + j])
                torch.testing.assert_close(ranking[n], best, rtol=1e-9, atol=1e-9)


def dense_target(mapping, scores, tgt_out, ids, vocab):
    """The set target over all V + L columns, the allowed set built by loops."""
    allowed = torch.zeros(scores.shape, dtype=torch.bool)
    for b in range(scores.size(0)):
        for t in range(scores.size(1)):
            y = int(tgt_out[b, t])
            allowed[b, t, y] = True
            for j, x in enumerate(ids[b].tolist()):
                allowed[b, t, vocab + j] = x == y
    return set_target(mapping, scores, allowed)


@pytest.mark.parametrize("mapping,params", MAPPINGS, ids=IDS)
def test_the_loss_target_is_the_set_target_of_the_correct_parts(mapping, params):
    model = copy_model("lstm", mapping, params)
    src, lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5, lengths=[7, 4, 2], seed=3)
    mask = length_mask(lengths, src.size(1), src.device)
    ids = model.generator.copy.ids(src, mask)
    tgt_out = torch.where(torch.rand(tgt_in.shape) < 0.5, ids[:, :5].clamp(min=4), tgt_in)  # copyable targets
    with torch.no_grad():
        scores, _ = model(src, lengths, tgt_in)
        target = model.output_target(scores, tgt_out, src, mask)
    torch.testing.assert_close(target, dense_target(model.generator.mapping, scores, tgt_out, ids, TGT_VOCAB),
                               rtol=0, atol=1e-15)
    loss = loss_forward(model, get_loss(mapping, **params), src, lengths, tgt_in, tgt_out, 0, 0.0)
    if mapping == "softmax":  # the marginal likelihood of the target tokens
        probs = model.output_probs(scores, src, mask)
        nll = -probs.gather(-1, tgt_out.unsqueeze(-1)).log().sum()
        torch.testing.assert_close(loss, nll, rtol=1e-12, atol=1e-12)
    assert torch.isfinite(loss) and float(loss.detach()) > 0


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
@pytest.mark.parametrize("mapping,params", MAPPINGS[:3], ids=IDS[:3])
def test_the_loss_gradient_by_finite_differences(kind, mapping, params):
    """The training loss (padding targets ignored) as a function of the copy keys' weight and
    the output layer's: autograd (the target held) against central differences (recomputed)."""
    model = copy_model(kind, mapping, params, seed=1)
    src, lengths, tgt_in = random_batch(batch=2, src_len=5, tgt_len=4, lengths=[5, 3], seed=5)
    tgt_out = tgt_in.roll(-1, dims=1)
    tgt_out[1, -1] = 0  # a padding target
    fn = get_loss(mapping, **params)

    def loss() -> torch.Tensor:
        return loss_forward(model, fn, src, lengths, tgt_in, tgt_out, 0, 0.1)

    weights = [model.generator.copy.keys.weight, model.generator.proj.weight]
    model.zero_grad()
    loss().backward()
    h = 1e-6
    for w in weights:
        numeric = torch.zeros_like(w)
        with torch.no_grad():
            for idx in [(i, j) for i in range(0, w.size(0), 3) for j in range(0, w.size(1), 2)]:
                w[idx] += h
                up = loss()
                w[idx] -= 2 * h
                down = loss()
                w[idx] += h
                numeric[idx] = (up - down) / (2 * h)
        sampled = numeric != 0
        torch.testing.assert_close(w.grad[sampled], numeric[sampled], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_no_host_sync_in_the_loss_and_the_step(kind, monkeypatch):
    """The mappings on their accelerator path (``impl: static``; the CPU path hands rows to
    NumPy), the Transformer encoder's padded layout (its packed rows read the mask: CPU only)."""
    import nmt.models.transformer.packed_rows as packed_rows

    monkeypatch.setattr(packed_rows, "PACKED_ENCODER", False)
    model = copy_model(kind, "entmax15", {"impl": "static"}, dtype=torch.float32)
    src, lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5)
    mask = length_mask(lengths, src.size(1), src.device)
    fn = get_loss("entmax15", impl="static")
    model.train()
    loss_forward(model, fn, src, lengths, tgt_in, tgt_in.roll(-1, 1), 0, 0.1, src_mask=mask)  # lazy set-ups
    with SyncAudit() as audit:
        loss = loss_forward(model, fn, src, lengths, tgt_in, tgt_in.roll(-1, 1), 0, 0.1, src_mask=mask)
        loss.backward()
    model.eval()
    with torch.no_grad():
        encoder_out, state = model.encode(src, lengths)
    with SyncAudit() as step_audit, torch.no_grad():
        for t in range(3):
            _, _, state = model.step(tgt_in[:, t], state, encoder_out)
    assert audit.total == 0, audit.report()
    assert step_audit.total == 0, step_audit.report()


def test_one_compiled_graph_for_the_copying_loss():
    model = copy_model("transformer", "entmax15", dtype=torch.float32).train()
    src, lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5)
    mask = length_mask(lengths, src.size(1), src.device)
    fn = get_loss("entmax15")
    eager = loss_forward(model, fn, src, lengths, tgt_in, tgt_in.roll(-1, 1), 0, 0.1, src_mask=mask)
    compiled = torch.compile(loss_forward, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(model, fn, src, lengths, tgt_in, tgt_in.roll(-1, 1), 0, 0.1, mask), eager,
                               rtol=1e-5, atol=1e-5)


def test_the_packed_cpu_step_serves_a_copying_model_as_the_module_path(monkeypatch):
    """The CPU's packed LSTM decoding step (float32, eval) serves a copying model: the same
    log-probabilities (zeros at the same places) and ranking scores as the module path."""
    import nmt.models.packed_decoder_step as packed
    from nmt.utils import packed_linear

    model = copy_model("lstm", "entmax15", dtype=torch.float32)
    src, lengths, tgt_in = random_batch(batch=2, src_len=5, tgt_len=3, lengths=[5, 3])
    results = {}
    for served in (True, False):
        encoder_out, state = model.encode(src, lengths)
        calls = []
        real = packed.packed_step
        monkeypatch.setattr(packed, "packed_step", lambda *a, **k: calls.append(1) or real(*a, **k))
        if not served:
            monkeypatch.setattr(packed, "servable", lambda *a: False)
        with torch.no_grad(), packed_linear.frozen_weights():  # a decoding region, as the translator's
            steps = []
            for t in range(3):
                scores, log_probs, _, state = model.step_with_scores(tgt_in[:, t], state, encoder_out)
                steps.append((scores, log_probs))
        assert bool(calls) == served
        results[served] = steps
    for (s1, l1), (s2, l2) in zip(results[True], results[False]):
        assert torch.equal(torch.isinf(l1), torch.isinf(l2))
        torch.testing.assert_close(l1.exp(), l2.exp(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
@pytest.mark.parametrize("mapping", ["softmax", "entmax15"])
def test_sampling_tempers_the_copies_with_the_vocabulary(kind, mapping):
    """At temperature T the distribution drawn from is the marginal of mapping(joint / T), its
    T = 1 log-probabilities the step's."""
    from nmt.translate.sample_distribution import tempered_step

    model = copy_model(kind, mapping)
    src, lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=2, lengths=[7, 4, 2])
    mask = length_mask(lengths, src.size(1), src.device)
    with torch.no_grad():
        scores, _ = model(src, lengths, tgt_in[:, :1])
        encoder_out, state = model.encode(src, lengths)
        log_probs, tempered, _, _ = tempered_step(model, tgt_in[:, 0], state, encoder_out, 2.0, True)
        step_log_probs, _, _ = model.step(tgt_in[:, 0], state, encoder_out)
    ids = model.generator.copy.ids(src, mask)
    joint = get_mapping(mapping)(scores[:, 0] / 2.0, dim=-1)
    for b in range(3):
        expected = brute_marginal(joint[b], ids[b], TGT_VOCAB)
        assert torch.equal(torch.isinf(tempered[b]), expected == 0)
        torch.testing.assert_close(tempered[b].exp(), expected, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(log_probs, step_log_probs, rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_on_cuda_the_copying_loss_and_step_equal_the_cpus_without_a_sync(kind):
    """On CUDA (float32, and the loss under bf16 autocast): the training loss and its gradients, and
    a step's log-probabilities (exact zeros at the same places) equal the CPU's, the loss forward and
    backward and the steps under ``torch.cuda.set_sync_debug_mode("error")`` (the LSTM encoder
    packs by host lengths: encoded before the detector is on)."""
    cpu = copy_model(kind, "entmax15", dtype=torch.float32)
    cuda = copy_model(kind, "entmax15", dtype=torch.float32).cuda()
    src, lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5, lengths=[7, 4, 2])
    tgt_out = tgt_in.roll(-1, 1)
    mask = length_mask(lengths, src.size(1), src.device)
    fn = get_loss("entmax15")
    for model in (cpu, cuda):
        model.train()
    expected = loss_forward(cpu, fn, src, lengths, tgt_in, tgt_out, 0, 0.1, src_mask=mask)
    expected.backward()
    args = [t.cuda() for t in (src,)] + [lengths] + [t.cuda() for t in (tgt_in, tgt_out)]
    cuda_mask = mask.cuda()  # copied before the detector is on (a host-to-device copy syncs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = loss_forward(cuda, fn, *args, 0, 0.1, src_mask=cuda_mask)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(loss.cpu(), expected, rtol=1e-4, atol=1e-4)
    for a, b in zip(cuda.parameters(), cpu.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-3, atol=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        half = loss_forward(cuda, fn, *args, 0, 0.1, src_mask=cuda_mask)
    assert torch.isfinite(half) and half.dtype == torch.float32
    for model in (cpu, cuda):
        model.eval()
    with torch.no_grad():
        out_cpu, state_cpu = cpu.encode(src, lengths)
        out_cuda, state_cuda = cuda.encode(src.cuda(), lengths)
        tokens = tgt_in.cuda()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            steps = []
            for t in range(3):
                log_probs, _, state_cuda = cuda.step(tokens[:, t], state_cuda, out_cuda)
                steps.append(log_probs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        for t in range(3):
            expected, _, state_cpu = cpu.step(tgt_in[:, t], state_cpu, out_cpu)
            got = steps[t].cpu()
            assert torch.equal(torch.isinf(got), torch.isinf(expected))
            torch.testing.assert_close(got.exp(), expected.exp(), rtol=1e-4, atol=1e-5)
