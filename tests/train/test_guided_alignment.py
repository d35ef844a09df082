"""training.guided_alignment: the loss against independent computations of each mapping's
Fenchel-Young loss (and finite differences), the models' alignment scores against their attention,
the update step (no host sync, one compiled graph, accumulation exact), the config's one-line
errors, and the effect: a Transformer trained with reference alignments attends where they say
(against the same model trained without), end to end through nmt-train and nmt-translate."""
from __future__ import annotations

import json
import logging
import math
import random
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from nmt.config import ConfigError, resolve_config
from nmt.models import build_model
from nmt.models.errors import ModelConfigError
from nmt.sparse import get_loss, get_mapping
from nmt.sparse.tensor_alpha_loss import tensor_alpha_entmax_loss
from nmt.train.guided_alignment import GuidedAlignment, GuidedForward, alignment_loss
from nmt.train.precision import TrainPrecision
from nmt.train.update import update
from nmt.utils.sync_audit import SyncAudit

sys.path.insert(0, str(Path(__file__).parent))
from test_precision_compile import (PAD, STATIC_ENTMAX, VOCAB, assert_compiled_equals_eager, copy_batch,  # noqa: E402
                                    model)
from tiny_task import joined_source, tiny_config, write_task  # noqa: E402
from numpy_mappings import entmax_np, sparsemax_np, tsallis_omega_np  # noqa: E402


# ------------------------------------------------------------------ the loss, independently
def fy_np(s: np.ndarray, q: np.ndarray, mapping: str, alpha: float | None = None) -> float:
    """Omega*(s) - <s, q> + Omega(q) = <s, p - q> - Omega(p) + Omega(q), p the mapping of s, the
    Shannon or Tsallis regulariser written out (terms with p = 0 or q = 0 dropped: 0 x -inf)."""
    if mapping == "softmax":
        finite = np.isfinite(s)
        logp = np.where(finite, s - np.log(np.exp(s[finite] - s[finite].max()).sum()) - s[finite].max(), -np.inf)
        return float(sum(qi * (math.log(qi) - lp) for qi, lp in zip(q, logp) if qi > 0))
    alpha = alpha or {"sparsemax": 2.0, "entmax15": 1.5, "entmax_bisect": 1.3}[mapping]
    p = sparsemax_np(s) if mapping == "sparsemax" else entmax_np(s, alpha)
    inner = sum(si * (pi - qi) for si, pi, qi in zip(s, p, q) if pi > 0 or qi > 0)
    return float(inner - tsallis_omega_np(p, alpha) + tsallis_omega_np(q, alpha))


LOSSES = {"softmax": {}, "sparsemax": {}, "entmax15": {}, "entmax_bisect": {"alpha": 1.3}}


def reference_case(seed: int = 0):
    """Scores (2, 3 heads, 4, 5) with the last source position padded in example 1, and reference rows:
    some uniform over two tokens, one-hot, and zero rows (no reference)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64) * 2
    scores[1, :, :, 4] = -math.inf
    ref = torch.zeros(2, 4, 5, dtype=torch.float64)
    ref[0, 0, 1] = ref[0, 0, 3] = 0.5
    ref[0, 2, 4] = 1.0
    ref[1, 0, 0] = 1.0
    ref[1, 1, [0, 2, 3]] = 1 / 3
    return scores, ref


@pytest.mark.parametrize("mapping", list(LOSSES))
def test_the_loss_is_each_heads_fenchel_young_loss_summed_over_referenced_tokens(mapping):
    scores, ref = reference_case()
    got = alignment_loss(get_loss(mapping, **LOSSES[mapping]), scores, ref)
    expected = 0.0
    for b in range(2):
        for t in range(4):
            if ref[b, t].sum() > 0:
                expected += sum(fy_np(scores[b, h, t].numpy(), ref[b, t].numpy(), mapping) for h in range(3)) / 3
    assert got.dim() == 0 and math.isclose(float(got), expected, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("mapping", list(LOSSES))
def test_its_gradient_is_mapping_minus_reference_on_referenced_rows(mapping):
    """Finite differences (gradcheck, float64, no padding) and the closed form ``(p - q) / heads`` on
    rows with a reference, 0 elsewhere (padding included)."""
    loss_fn = get_loss(mapping, **LOSSES[mapping])
    scores, ref = reference_case(1)
    finite = scores[:1].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: alignment_loss(loss_fn, s, ref[:1]), (finite,), eps=1e-6, atol=1e-6)
    scores.requires_grad_(True)
    alignment_loss(loss_fn, scores, ref).backward()
    p = get_mapping(mapping, **LOSSES[mapping])(scores.detach(), dim=-1)
    has = (ref.sum(-1) > 0).unsqueeze(1).unsqueeze(-1)
    expected = torch.where(has, p - ref.unsqueeze(1), 0.0) / 3
    torch.testing.assert_close(scores.grad, expected, rtol=1e-7, atol=1e-9)


# ------------------------------------------------------------------ the models' alignment scores
TRANSFORMER = {"type": "transformer",
               "transformer": {"encoder_layers": 1, "decoder_layers": 2, "d_model": 8, "heads": 2, "d_ff": 16,
                               "dropout": 0.0, "attention_dropout": 0.0, "positions": "sinusoidal"},
               "embeddings": {"dropout": 0.0}, "output": {"mapping": "softmax", "params": {}}}


def transformer(cross: dict, layer: int = -1, heads: int = 0):
    cfg = resolve_config({"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "a", "tgt": "b"}},
                          "training": {"save_dir": "unused", "max_steps": 1},
                          "model": {**TRANSFORMER, "transformer": {**TRANSFORMER["transformer"],
                                                                   "alignment_layer": layer,
                                                                   "alignment_heads": heads},
                                    "attention": {"cross": cross}}}, "t.yaml")
    torch.manual_seed(0)
    return build_model(cfg["model"], VOCAB, VOCAB, PAD).double().eval()


@pytest.mark.parametrize("cross,layer,heads", [({"mapping": "entmax15", "params": {"temperature": 2.0}}, 0, 1),
                                                ({"mapping": "sparsemax"}, -1, 0),
                                                ({"mapping": "softmax"}, 1, 2)])
def test_transformer_alignment_scores_map_to_the_chosen_heads_and_their_mean_is_reported(cross, layer, heads):
    m = transformer(cross, layer, heads)
    b = copy_batch(2)
    with torch.no_grad():
        logits, attention, maps = m(b.src, b.src_lengths, b.tgt_in, return_maps=True)
        logits2, scores = m(b.src, b.src_lengths, b.tgt_in, alignment_scores=True)
    chosen = maps["cross"][layer][:, :heads or 2]
    info = m.alignment_attention
    assert (info.mapping, info.heads) == (cross["mapping"], heads or 2) and "temperature" not in info.params
    assert scores.shape == chosen.shape and torch.equal(logits, logits2)
    assert (b.src == PAD).any() and bool(torch.isneginf(scores.permute(0, 3, 1, 2)[b.src == PAD]).all())
    torch.testing.assert_close(get_mapping(info.mapping, **info.params)(scores, dim=-1), chosen, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(attention, chosen.mean(1), rtol=1e-12, atol=1e-12)
    # the step reports the same layer's mean: the last step of a cached pass equals teacher forcing's last row
    encoder_out, state = m.encode(b.src, b.src_lengths)
    for t in range(b.tgt_in.size(1)):
        _, step_attention, state = m.step(b.tgt_in[:, t], state, encoder_out)
        torch.testing.assert_close(step_attention, attention[:, t], rtol=1e-10, atol=1e-12)


def test_the_default_alignment_layer_is_the_last_layer_with_all_heads_as_before():
    m = transformer({"mapping": "entmax15"})
    b = copy_batch(3)
    with torch.no_grad():
        _, attention, maps = m(b.src, b.src_lengths, b.tgt_in, return_maps=True)
    assert torch.equal(attention, maps["cross"][-1].mean(1))
    with pytest.raises(ModelConfigError, match=r"model.transformer.alignment_layer: alignment_layer 2 is not a layer "
                                               r"of a 2-layer decoder \(0 .. 1, or -1 .. -2 from the last\)"):
        transformer({"mapping": "softmax"}, layer=2)
    with pytest.raises(ModelConfigError, match=r"model.transformer.alignment_heads: 3 heads, but the layers have 2"):
        transformer({"mapping": "softmax"}, heads=3)


@pytest.mark.parametrize("attention", [{"mapping": "softmax"}, {"mapping": "entmax_bisect", "params": {"alpha": 1.3}}])
def test_rnn_alignment_scores_map_to_its_attention(attention):
    m = model(attention=attention).eval()
    b = copy_batch(5)
    with torch.no_grad():
        logits, probs = m(b.src, b.src_lengths, b.tgt_in)
        logits2, scores = m(b.src, b.src_lengths, b.tgt_in, alignment_scores=True)
    info = m.alignment_attention
    assert scores.shape == (8, 1) + probs.shape[1:] and info.heads == 1 and torch.equal(logits, logits2)
    assert bool(torch.isneginf(scores[:, 0].transpose(1, 2)[b.src == PAD]).all())
    torch.testing.assert_close(get_mapping(info.mapping, **info.params)(scores[:, 0], dim=-1), probs,
                               rtol=1e-12, atol=1e-12)


LEARNED_CROSS = {"mapping": "entmax_bisect", "params": {"alpha": "learned", "alpha_init": 1.3, "temperature": 1.5}}


def learned_transformer(layer: int = 1, heads: int = 2):
    """The Transformer above with learned-alpha cross-attention heads (Correia et al. 2019), their
    alphas set apart (1.25 and 1.7 in the alignment layer)."""
    m = transformer(LEARNED_CROSS, layer, heads)
    with torch.no_grad():
        m.decoder.layers[layer].cross_attn.mapping.alpha_logit.copy_(torch.tensor([1.25 - 1, 1.7 - 1]).logit())
    return m


def test_learned_alpha_heads_take_the_loss_at_their_own_alphas():
    from nmt.train.guided_alignment import guided_alignment, guided_loss_forward

    m = learned_transformer()
    g = guided_alignment({"training": {"guided_alignment": {"weight": 0.4}}}, "t.yaml", m)
    assert g.learned_alpha and g.heads == 2 and "entmax_bisect (learned alpha)" in g.describe()
    alphas = m.alignment_alpha().detach()
    torch.testing.assert_close(alphas, torch.tensor([1.25, 1.7], dtype=torch.float64))
    b = copy_batch(8)
    ref = reversal_reference(b).double()
    with torch.no_grad():
        _, scores = m(b.src, b.src_lengths, b.tgt_in, alignment_scores=True)
    got = alignment_loss(g.loss, scores, ref, alphas)
    expected = 0.0
    for i in range(ref.size(0)):
        for t in range(ref.size(1)):
            if ref[i, t].sum() > 0:
                expected += sum(fy_np(scores[i, h, t].numpy(), ref[i, t].numpy(), "entmax_bisect", float(alphas[h]))
                                for h in range(2)) / 2
    assert math.isclose(float(got), expected, rel_tol=1e-9)
    # the gradient reaches each head's alpha parameter: the guided total's gradient minus the main loss's is
    # weight x the central difference of the alignment loss in that parameter (the scores do not depend on it)
    logit = m.decoder.layers[1].cross_attn.mapping.alpha_logit
    args = (m, get_loss("softmax"), b.src, b.src_lengths, b.tgt_in, b.tgt_out, PAD, 0.0, None, ref, g.loss, 0.4)
    m.zero_grad()
    guided_loss_forward(*args, learned_alpha=True)[0].backward()
    guided = logit.grad.clone()
    m.zero_grad()
    guided_loss_forward(*args[:-1], 0.0, learned_alpha=True)[0].backward()
    plain = logit.grad.clone()
    numeric = torch.zeros(2, dtype=torch.float64)
    for h in range(2):
        values = []
        for sign in (1, -1):
            with torch.no_grad():
                logit[h] += sign * 1e-6
                values.append(float(alignment_loss(g.loss, scores, ref, m.alignment_alpha())))
                logit[h] -= sign * 1e-6
        numeric[h] = (values[0] - values[1]) / 2e-6
    assert bool((numeric.abs() > 1e-3).all())
    torch.testing.assert_close(guided - plain, 0.4 * numeric, rtol=1e-6, atol=1e-8)


def test_a_compiled_guided_step_with_learned_alphas_is_one_graph_and_equals_eager():
    from nmt.train.compile import compile_for_device

    graphs: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm

    m = learned_transformer(layer=0, heads=1)
    b = copy_batch(9)
    ref = reversal_reference(b).double()
    g = GuidedAlignment(0.5, tensor_alpha_entmax_loss, "entmax_bisect", 1, learned_alpha=True)
    args = (m, get_loss("softmax"), b.src, b.src_lengths, b.tgt_in, b.tgt_out, PAD, 0.0, None, ref)
    compiled = GuidedForward(g, lambda fn: compile_for_device(fn, "cpu", backend=counting))
    assert_compiled_equals_eager(m, compiled, GuidedForward(g), args)
    assert len(graphs) == 1, graphs


def test_a_compiled_full_context_guided_step_is_one_graph_and_equals_eager():
    """model.transformer.full_context_alignment: the causal pass, the full-context pass up to the
    alignment layer and both losses compile into one graph, equal to the eager step (float64)."""
    from nmt.train.compile import compile_for_device

    graphs: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm

    m = transformer({"mapping": "entmax15"}, 1, 1)
    m.decoder.full_context_alignment = True
    m.train()
    b = copy_batch(10)
    ref = reversal_reference(b).double()
    g = GuidedAlignment(0.5, get_loss("entmax15"), "entmax15", 1)
    args = (m, get_loss("softmax"), b.src, b.src_lengths, b.tgt_in, b.tgt_out, PAD, 0.0, None, ref)
    compiled = GuidedForward(g, lambda fn: compile_for_device(fn, "cpu", backend=counting))
    assert_compiled_equals_eager(m, compiled, GuidedForward(g), args)
    assert len(graphs) == 1, graphs


# ------------------------------------------------------------------ the update step
def reversal_reference(batch) -> torch.Tensor:
    """Target token t of a copy-task pair aligned to source token t (B, T, L)."""
    ref = torch.zeros(batch.tgt_in.size(0), batch.tgt_in.size(1), batch.src.size(1))
    for i, n in enumerate(batch.src_lengths.tolist()):
        ref[i, torch.arange(n), torch.arange(n)] = 1.0
    return ref


def guide(mapping: dict, weight: float = 0.3, heads: int = 1) -> GuidedAlignment:
    return GuidedAlignment(weight, get_loss(mapping["mapping"], **mapping.get("params", {})), mapping["mapping"], heads)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_guided_update_makes_no_host_sync(precision, monkeypatch):
    """Forward with the attention's scores, output and alignment losses (static 1.5-entmax), backward,
    clipping and fused Adam: no synchronising call (the accelerators' path of the LSTM encoder)."""
    monkeypatch.setattr("nmt.models.encoder.CPU_RUNS", False)
    m = model(torch.float32, attention=STATIC_ENTMAX)
    optimizer = torch.optim.Adam(m.parameters(), lr=1e-3, fused=True)
    forward = GuidedForward(guide(STATIC_ENTMAX))
    for step in range(2):
        batch = copy_batch(step)
        batch.align = reversal_reference(batch)  # built on the host with the batch, as the trainer does
        with SyncAudit() as audit:
            loss, _, skipped = update(m, get_loss("softmax"), optimizer, batch, PAD, 1.0,
                                      precision=TrainPrecision(precision, "cpu"), forward=forward)
            aligned = forward.take()
        assert audit.total == 0, audit.report()
        assert loss.dim() == 0 and torch.isfinite(loss) and skipped is None and float(aligned) > 0


def test_compiled_guided_step_is_one_graph_and_equals_eager():
    from nmt.models.seq2seq import length_mask
    from nmt.train.compile import compile_for_device

    graphs: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm

    m = model(attention={"mapping": "sparsemax"})
    batch = copy_batch(4)
    mask = length_mask(batch.src_lengths, batch.src.size(1), batch.src.device)
    ref = reversal_reference(batch).double()
    args = (m, get_loss("entmax15"), batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, PAD, 0.0, mask, ref)
    g = guide({"mapping": "sparsemax"}, 0.7)
    compiled = GuidedForward(g, lambda fn: compile_for_device(fn, "cpu", backend=counting, encoder_in_graph=True))
    assert_compiled_equals_eager(m, compiled, GuidedForward(g), args)
    assert len(graphs) == 1, graphs


@pytest.mark.parametrize("normalization", ["tokens", "sents"])
def test_accumulated_guided_batches_give_the_gradient_of_one_batch(normalization):
    from nmt.data.batching import Batch

    whole = copy_batch(7, batch=8)
    whole.align = reversal_reference(whole).double()

    def half(rows: slice) -> Batch:
        lengths = whole.src_lengths[rows]
        return Batch(src=whole.src[rows], src_lengths=lengths, tgt_in=whole.tgt_in[rows], tgt_out=whole.tgt_out[rows],
                     tgt_lengths=whole.tgt_lengths[rows], n_tokens=int((lengths + 1).sum()), indices=list(range(4)),
                     n_src_tokens=int(lengths.sum()), align=whole.align[rows])

    runs = []
    for batches in ([whole], [half(slice(0, 4)), half(slice(4, 8))]):
        m = model(attention={"mapping": "entmax15"})
        optimizer = torch.optim.SGD(m.parameters(), lr=0.5)
        forward = GuidedForward(guide({"mapping": "entmax15"}, 0.5))
        update(m, get_loss("softmax"), optimizer, batches, PAD, None, 0.0, forward=forward, normalization=normalization)
        runs.append(([p.detach().clone() for p in m.parameters()], forward.take()))
    for a, b in zip(runs[0][0], runs[1][0]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-12, atol=0)


# ------------------------------------------------------------------ the config
def test_the_config_errors_name_the_key(tmp_path):
    from nmt.train.trainer import Trainer, check_run_config

    data = write_task(tmp_path / "data")
    (tmp_path / "data" / "train.align").write_text("0-0\n" * 40, encoding="utf-8")
    aligned = {**data, "train": {**data["train"], "align": str(tmp_path / "data" / "train.align")}}

    def check(data_section, **changes):
        cfg = tiny_config(data_section, tmp_path / "run", device="cpu", guided_alignment={"weight": 0.1})
        for section, values in changes.items():
            for key, value in values.items():
                cfg[section][key] = value
        config = resolve_config(cfg, "g.yaml")
        check_run_config(config, "g.yaml")
        Trainer(config, "g.yaml")

    key = r"^g.yaml: training.guided_alignment.weight: "
    with pytest.raises(ConfigError, match=key + "guided alignment needs reference alignments: set data.train.align"):
        check(data)
    with pytest.raises(ConfigError, match=key + ".*mapping fusedmax has no Fenchel-Young loss"):
        check(aligned, model={"attention": {"mapping": "fusedmax"}})
    with pytest.raises(ConfigError, match=r"training.guided_alignment.weight: must be >= 0"):
        resolve_config(tiny_config(data, tmp_path / "run", guided_alignment={"weight": -1.0}), "g.yaml")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ the effect, end to end
def copy_task(root: Path, n_train: int = 300, n_valid: int = 30) -> None:
    """'a b c' -> 'A B C' (space tokens on both sides), 3 to 7 letters, with the reference alignment of
    every pair (letter i with letter i) in ``root / "train.align"`` and ``"valid.align"``. A Transformer left to
    itself need not attend there in any given head: the letters can reach the output through other
    layers and heads."""
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        words = [[rng.choice("abcdefgh") for _ in range(rng.randint(3, 7))] for _ in range(n)]
        (root / f"{split}.src").write_text("".join(" ".join(w) + "\n" for w in words), encoding="utf-8")
        (root / f"{split}.tgt").write_text("".join(" ".join(c.upper() for c in w) + "\n" for w in words),
                                           encoding="utf-8")
        # the training pairs' references, and the validation pairs' (data.valid.align: the AER)
        (root / f"{split}.align").write_text("".join(" ".join(f"{i}-{i}" for i in range(len(w))) + "\n"
                                                  for w in words), encoding="utf-8")


def transformer_run(root: Path, name: str, weight: float, steps: int) -> dict:
    from tiny_runs import data_section

    data = data_section(root, "space", "space")
    data["train"]["align"] = str(root / "train.align")
    data["valid"]["align"] = str(root / "valid.align")
    return {"data": data,
            "model": {"type": "transformer",
                      "transformer": {"encoder_layers": 2, "decoder_layers": 2, "d_model": 32, "heads": 2, "d_ff": 64,
                                      "dropout": 0.0, "attention_dropout": 0.0, "alignment_layer": -1,
                                      "alignment_heads": 1},
                      "embeddings": {"dropout": 0.0}, "attention": {"cross": {"mapping": "entmax15"}},
                      "output": {"mapping": "softmax"}},
            "training": {"save_dir": str(root / name), "batch_size": 16, "max_steps": steps, "valid_every": steps,
                         "log_every": steps, "keep_last": 1, "progress": False, "threads": 1,
                         "optimizer": {"name": "adam", "lr": 0.01}, "guided_alignment": {"weight": weight}},
            "validation": {"metric": "loss", "batch_size": 8, "max_length": 12, "n_heatmaps": 0}}


def copy_agreement(model_file: Path, root: Path) -> float:
    """The share of validation target letters whose reported alignment (teacher forcing, the most
    attended source word: ``nmt.load(...).score(..., align=True)``) is the source letter they copy."""
    import nmt

    m = nmt.load(str(model_file), device="cpu")
    sources = (root / "valid.src").read_text(encoding="utf-8").splitlines()
    targets = (root / "valid.tgt").read_text(encoding="utf-8").splitlines()
    hits = total = 0
    for src, scored in zip(sources, m.score(sources, targets, align=True)):
        n = len(src.split())
        hits += sum(s == t for s, t in scored.alignment)
        total += n
    return hits / total


def test_guided_training_moves_the_attention_onto_the_reference(tmp_path, capsys):
    from nmt.translate.alignment import parse_pharaoh
    from tiny_runs import train_run, translate_main

    """2 + 2 layers, 2 heads of 1.5-entmax cross-attention, the last layer's first head supervised,
    200 steps of 16 pairs (nmt-train): that head's argmax is on the copied letter for 86% of the
    validation letters, against 30% without guidance (measured; 88-92% against 25-49% with
    training seeds 1-3; asserted: 75% and 30 points more); nmt-translate -report_align then
    reports the copy's pairs."""
    copy_task(tmp_path)
    figures = {}
    for name, weight in (("plain", 0.0), ("guided", 1.0)):
        run = train_run(transformer_run(tmp_path, name, weight, 200), tmp_path / f"{name}.yaml")
        figures[name] = copy_agreement(run / "best.pt", tmp_path)
        # data.valid.align: with one sure link per word and one predicted per word, AER = 1 - agreement
        last = json.loads((run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1])
        assert last["valid_aer"] == pytest.approx(1 - figures[name], abs=1e-9), (name, last, figures)
    assert figures["guided"] >= 0.75 and figures["guided"] >= figures["plain"] + 0.3, figures
    capsys.readouterr()  # what training printed
    code, out, _ = translate_main(["-model", str(tmp_path / "guided" / "best.pt"), "-src", str(tmp_path / "valid.src"),
                                   "-output", "-", "-report_align", "-beam_size", "2", "-quiet"], capsys)
    assert code == 0
    hits = total = 0
    for line in out.splitlines():
        text, pairs = line.split(" ||| ")
        pairs = parse_pharaoh(pairs)
        assert sorted(t for _, t in pairs) == list(range(len(text.split())))  # argmax: one source word per output word
        hits, total = hits + sum(s == t for s, t in pairs), total + len(pairs)
    assert total > 0 and hits / total >= 0.75, (hits, total)


def test_guided_training_of_learned_alpha_heads_moves_their_attention_and_their_alpha(tmp_path):
    """The same task with adaptively sparse cross-attention (alpha learned per head, from 1.5): the
    supervised head's argmax is on the copied letter for 87-90% of the validation letters against
    22-45% without guidance (training seeds 0-3, measured), and the loss's alpha-gradient takes that
    head's alpha to 1.72-1.74 (the references are one-hot: a sparser mapping fits them; without
    guidance 1.23-1.40, and 1.47-1.56 when the guided loss's alpha is detached). Asserted: 75%, 30
    points more, and an alpha above 1.65 in the guided run."""
    from tiny_runs import train_run

    copy_task(tmp_path)
    figures, alphas = {}, {}
    for name, weight in (("plain", 0.0), ("guided", 1.0)):
        config = transformer_run(tmp_path, name, weight, 200)
        config["model"]["attention"] = {"cross": {"mapping": "entmax_bisect", "params": {"alpha": "learned"}}}
        run = train_run(config, tmp_path / f"{name}.yaml")
        figures[name] = copy_agreement(run / "best.pt", tmp_path)
        last = json.loads((run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1])
        alphas[name] = last["alphas"]["cross"][-1][0]  # the last layer's first head: the supervised one
    assert figures["guided"] >= 0.75 and figures["guided"] >= figures["plain"] + 0.3, figures
    assert alphas["guided"] > 1.65 > alphas["plain"], alphas


def test_full_context_guided_training_validation_scoring_and_translation_read_one_pass(tmp_path, capsys):
    """model.transformer.full_context_alignment through nmt-train and nmt-translate: the validation
    AER is 1 - the agreement of the scorer's alignments (both from the full-context pass), and
    -report_align's pairs are the scorer's alignments of the outputs (its pass over each output)."""
    import nmt
    from nmt.translate.alignment import parse_pharaoh
    from tiny_runs import train_run, translate_main

    copy_task(tmp_path)
    config = transformer_run(tmp_path, "full", 1.0, 40)
    config["model"]["transformer"]["full_context_alignment"] = True
    run = train_run(config, tmp_path / "full.yaml")
    last = json.loads((run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert last["valid_aer"] == pytest.approx(1 - copy_agreement(run / "best.pt", tmp_path), abs=1e-9)
    capsys.readouterr()
    code, out, _ = translate_main(["-model", str(run / "best.pt"), "-src", str(tmp_path / "valid.src"), "-output", "-",
                                   "-report_align", "-beam_size", "2", "-quiet"], capsys)
    assert code == 0
    texts, pairs = zip(*(line.split(" ||| ") for line in out.splitlines()))
    sources = (tmp_path / "valid.src").read_text(encoding="utf-8").splitlines()
    scored = nmt.load(str(run / "best.pt"), device="cpu").score(sources, list(texts), align=True)
    assert [parse_pharaoh(p) for p in pairs] == [s.alignment for s in scored]


def test_validation_metric_aer_keeps_the_checkpoint_of_the_lowest_alignment_error(tmp_path, capsys):
    """validation.metric: aer: best.pt is the validation with the lowest valid_aer (4 validations of a
    guided run); without data.valid.align a one-line error names the key."""
    from nmt.train.checkpoint import load_checkpoint
    from tiny_runs import train_run

    copy_task(tmp_path)
    config = transformer_run(tmp_path, "aer", 1.0, 40)
    config["training"].update(valid_every=10, keep_last=4)
    config["validation"]["metric"] = "aer"
    run = train_run(config, tmp_path / "aer.yaml")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["step"] for r in records] == [10, 20, 30, 40]
    best = min(records, key=lambda r: (r["valid_aer"], r["step"]))
    assert load_checkpoint(run / "best.pt")["step"] == best["step"]
    assert [r["best"] for r in records] == [r["valid_aer"] < min([1.1] + [q["valid_aer"] for q in records[:i]])
                                            for i, r in enumerate(records)]
    import yaml

    from nmt.cli import train as train_main

    del config["data"]["valid"]["align"]
    config["training"]["save_dir"] = str(tmp_path / "no_align")
    (tmp_path / "no_align.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    capsys.readouterr()
    assert train_main.main(["-config", str(tmp_path / "no_align.yaml"), "-quiet"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("no_align.yaml: validation.metric: 'aer' (the alignment error rate) needs "
                                             "the validation pairs' reference alignments: set data.valid.align"), err


def test_an_interrupted_guided_run_resumes_as_if_uninterrupted(tmp_path, caplog, monkeypatch):
    """Two corpora, the first with alignments (every source letter with the target's one word), the
    second without (weight 0.5): bit-equal weights and the same metrics as the uninterrupted run;
    the log line shows the alignment part."""
    from tiny_task import assert_same_run, interrupt_at, make_trainer

    data = write_task(tmp_path / "data")
    lines = Path(data["train"]["src"]).read_text(encoding="utf-8").splitlines()
    align = tmp_path / "data" / "train.align"
    align.write_text("".join(" ".join(f"{i}-0" for i in range(len(s.split()))) + "\n" for s in lines), encoding="utf-8")
    corpora = {**data, "train": [{**data["train"], "align": str(align)}, {**data["train"], "weight": 0.5}]}
    settings = {"device": "cpu", "guided_alignment": {"weight": 0.3}}
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="nmt"):
        straight = make_trainer(corpora, tmp_path / "straight", **settings)
        straight.train()
    assert straight.guide is not None and len(straight.data.alignments) == len(lines)
    log = caplog.text
    assert "guided alignment: weight 0.3 x the entmax15 attention's Fenchel-Young loss" in log
    assert " (alignment loss " in log and f"alignments: {len(lines)} of " in log

    first = make_trainer(corpora, tmp_path / "resumed", **settings)
    assert first.train(step_hook=interrupt_at(7)).step == 7
    second = make_trainer(corpora, tmp_path / "resumed", **settings)
    assert second.resumed and second.progress.step == 7 and second.train().step == 12
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lstm", "learned_alpha_transformer"])
def test_two_guided_processes_equal_one_process_with_twice_the_batch(tmp_path, ranks, kind):
    """Data parallel (2 Gloo ranks): the parameters after 4 guided steps agree with one process of
    twice the batch (float32 summation order apart, the plain data-parallel test's tolerance); with
    learned-alpha heads (their alphas read outside DistributedDataParallel's forward) too."""
    from ddp_workers import gloo_config

    from nmt.train.checkpoint import load_checkpoint
    from nmt.train.trainer import Trainer

    data = write_task(tmp_path / "data")
    lines = Path(data["train"]["src"]).read_text(encoding="utf-8").splitlines()
    align = tmp_path / "data" / "train.align"
    align.write_text("".join(" ".join(f"{i}-0" for i in range(0, len(s.split()), 2)) + "\n" for s in lines),
                     encoding="utf-8")
    data = {**data, "train": {**data["train"], "align": str(align)}}
    guided = {"weight": 0.8}

    def config(name: str, batch: int, **training) -> dict:
        out = gloo_config(data, tmp_path / name, batch, max_steps=4, valid_every=4, **training)
        if kind != "lstm":
            out["model"] = {"type": "transformer", "transformer": {**TRANSFORMER["transformer"], "alignment_heads": 1},
                            "embeddings": {"dropout": 0.0},
                            "attention": {"cross": {"mapping": "entmax_bisect", "params": {"alpha": "learned"}}},
                            "output": {"mapping": "softmax"}}
        return out

    one = Trainer(resolve_config(config("one", 8, guided_alignment=guided), "t"), "t")
    one.train()
    results = ranks.run(config("two", 4, guided_alignment=guided))
    assert [r[2:4] for r in results] == [("max_steps", 4)] * 2, results
    a, b = (load_checkpoint(tmp_path / run / "last.pt")["model"] for run in ("one", "two"))
    plain = Trainer(resolve_config(config("plain", 8), "t"), "t")
    plain.train()
    c = load_checkpoint(tmp_path / "plain" / "last.pt")["model"]
    assert max((a[k] - c[k]).abs().max() for k in a) > 1e-4  # the alignment loss moved the weights
    for name in a:
        if name.endswith("k_proj.bias"):
            # zero gradient in exact arithmetic (a key bias shifts every score of a row, and the mappings
            # are shift invariant): Adam turns its rounding noise into full steps
            continue
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=2e-6, msg=name)
    if kind != "lstm":  # the supervised head's alpha moved, and alike in both runs
        key = "decoder.layers.1.cross_attn.mapping.alpha_logit"
        assert float((a[key] - c[key]).abs().max()) > 1e-4
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=2e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mapping", [{"mapping": "softmax"}, STATIC_ENTMAX, {"mapping": "sparsemax",
                                                                            "params": {"impl": "static"}}])
def test_the_guided_update_on_cuda_equals_the_cpus_and_never_syncs(mapping):
    """The same float32 update on CUDA and on the CPU (loss, alignment loss, parameters after it),
    the CUDA one under ``torch.cuda.set_sync_debug_mode("error")`` (lengths on the host, references
    copied with the batch)."""
    assert_cuda_update_equals_cpus(lambda: model(torch.float32, attention=mapping), lambda: guide(mapping, 0.7))


def assert_cuda_update_equals_cpus(build: Callable[[], torch.nn.Module], make_guide: Callable[[], GuidedAlignment]
                                   ) -> None:
    """One guided update of ``build()``'s model on the CPU and on CUDA (under CUDA's sync detector):
    the same loss, alignment loss and parameters after it."""
    results = []
    for device in ("cpu", "cuda"):
        m = build().to(device)
        optimizer = torch.optim.SGD(m.parameters(), lr=0.5)
        forward = GuidedForward(make_guide())
        batch = copy_batch(3)
        batch.align = reversal_reference(batch)
        batch = batch.to(device, lengths_on_host=True)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            loss, _, _ = update(m, get_loss("softmax"), optimizer, batch, PAD, None, forward=forward)
            aligned = forward.take()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        results.append((loss.cpu(), aligned.cpu(), [p.detach().cpu() for p in m.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-5, atol=1e-5)
    for a, b in zip(results[1][2], results[0][2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_guided_update_of_learned_alpha_heads_on_cuda_equals_the_cpus_and_never_syncs():
    """A Transformer whose supervised heads learn their alphas: the same float32 update on CUDA and on
    the CPU, the CUDA one under ``torch.cuda.set_sync_debug_mode("error")``."""
    assert_cuda_update_equals_cpus(lambda: learned_transformer().float().train(), lambda: GuidedAlignment(
        0.7, tensor_alpha_entmax_loss, "entmax_bisect", 2, learned_alpha=True))


def test_weight_zero_reads_no_alignments_and_changes_nothing_and_bad_lines_are_one_line_errors(tmp_path):
    """An ``align`` file with weight 0 is not read (a malformed one included): the run equals one without
    it, bit for bit. With a weight, a malformed line of that file is one line naming it."""
    from nmt.data.errors import DataError
    from tiny_task import make_trainer

    data = write_task(tmp_path / "data")
    align = tmp_path / "data" / "train.align"
    align.write_text("0-0\n" * 39 + "0:0\n", encoding="utf-8")
    aligned = {**data, "train": {**data["train"], "align": str(align)}}
    runs = []
    for name, section in (("plain", data), ("aligned", aligned)):
        trainer = make_trainer(section, tmp_path / name, device="cpu", max_steps=4, valid_every=4)
        assert trainer.guide is None and trainer.data.alignments is None
        trainer.train()
        runs.append(trainer.model.state_dict())
    for key in runs[0]:
        assert torch.equal(runs[0][key], runs[1][key]), key
    with pytest.raises(DataError, match=rf"^{align}:40: '0:0' is not an alignment pair"):
        make_trainer(aligned, tmp_path / "bad", device="cpu", guided_alignment={"weight": 0.1})


def test_each_sampled_segmentation_gets_the_references_of_its_own_pieces(tmp_path):
    """BPE-dropout on the source (a new segmentation every epoch) with a source tag: after each epoch's
    segmentation, the reference of every example joins exactly the pieces of its first source word
    (pieces read back from the epoch's ids, grouped by the tokenizer, the tag's position skipped) with
    the target's word, and the references differ between epochs."""
    from nmt.train.trainer import Trainer

    data = write_task(tmp_path / "data", n_train=40)
    lines = Path(data["train"]["src"]).read_text(encoding="utf-8").splitlines()
    joined = joined_source(data, tmp_path / "data")
    align = tmp_path / "data" / "train.align"
    align.write_text("0-0\n" * len(lines), encoding="utf-8")  # the first source word with the target's one word
    train = {"src": str(joined), "tgt": data["train"]["tgt"], "align": str(align), "src_tag": "<T>"}
    cfg = tiny_config({**data, "train": [train], "valid": {**data["valid"], "src_tag": "<T>"}}, tmp_path / "run",
                      device="cpu", guided_alignment={"weight": 0.2})
    cfg["data"]["src"] = {"tokenizer": {"type": "bpe", "merges": 30}, "subword_sampling": {"dropout": 0.5}}
    trainer = Trainer(resolve_config(cfg, "tiny.yaml"), "tiny.yaml")
    src_tok, tgt_tok = trainer.data.src_field.tokenizer, trainer.data.tgt_field.tokenizer
    itos_s, itos_t = trainer.data.src_field.vocab.itos, trainer.data.tgt_field.vocab.itos
    seen = []
    for epoch in (1, 2):
        trainer.train_set = trainer._epoch_train_set(epoch)
        refs, dataset = trainer.alignments, trainer.train_set
        checked = 0
        for k, line in enumerate(dataset.line_numbers):
            pairs = refs.by_line.get(int(line))
            if pairs is None:
                continue
            src = [itos_s[i] for i in dataset.src[k]]
            assert src[0] == "<T>"
            src_words = [None] + src_tok.word_ids(src[1:])
            tgt_words = tgt_tok.word_ids([itos_t[i] for i in dataset.tgt[k]])
            expected = {(a, b) for a, w in enumerate(src_words) if w == 0 for b, v in enumerate(tgt_words) if v == 0}
            assert {(int(a), int(b)) for a, b in pairs} == expected, (line, src)
            checked += 1
        assert checked >= 30
        seen.append({int(line): refs.by_line[int(line)].tolist() for line in refs.by_line})
    assert seen[0] != seen[1]  # another segmentation, other token pairs
    assert trainer.train().step == 12  # and it trains so


def test_the_alignment_error_rate_by_hand():
    from nmt.train.alignment_error import alignment_error_rate, predicted_word_pairs

    # sentence 1: A = {0-0, 1-1}, S = {0-0, 1-2}; sentence 2: A = {0-0}, S = {0-0}: 1 - 2 (1 + 1) / (4 + 2)
    got = alignment_error_rate([{(0, 0), (1, 1)}, {(0, 0)}], [{(0, 0), (1, 2)}, {(0, 0)}])
    assert got == pytest.approx(1 - 4 / 6)
    assert alignment_error_rate([{(0, 0)}], [{(0, 0)}]) == 0.0 and math.isnan(alignment_error_rate([set()], [set()]))
    # target tokens 0, 1 (word 0), 2 (no word), 3 (word 1); source tokens 0 (a tag: no word), 1, 2 (word 0), 3 (word 1)
    attention = torch.tensor([[0.0, 0.9, 0.1, 0.0], [0.0, 0.0, 0.2, 0.8], [1.0, 0, 0, 0], [0.7, 0.1, 0.1, 0.1],
                              [0.0, 0.0, 0.0, 1.0]])  # the last row: EOS, not read
    assert predicted_word_pairs(attention, [None, 0, 0, 1], [0, 0, None, 1]) == {(0, 0), (1, 0)}


def test_a_copying_models_guided_loss_is_its_copying_loss_plus_the_weighted_alignment_loss():
    """model.output.copy under guided alignment: the output part is the copying model's own loss
    (its set target, label smoothing as mixed losses), the alignment part the attention's."""
    from nmt.models.copy_attention import NOT_COPIED
    from nmt.models.seq2seq import length_mask
    from nmt.train.update import loss_forward

    m = model(attention={"mapping": "sparsemax"}, output={"mapping": "entmax15", "copy": True})
    m.generator.copy.set_vocabularies(torch.tensor([NOT_COPIED] * 3 + list(range(3, VOCAB))))
    batch = copy_batch(5)
    mask = length_mask(batch.src_lengths, batch.src.size(1), batch.src.device)
    ref = reversal_reference(batch).double()
    fn = get_loss("entmax15")
    g = guide({"mapping": "sparsemax"}, 0.7)
    forward = GuidedForward(g)
    total = forward(m, fn, batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, PAD, 0.1, mask, ref)
    aligned = forward.take()
    output = loss_forward(m, fn, batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, PAD, 0.1, mask)
    torch.testing.assert_close(total, output + 0.7 * aligned, rtol=1e-12, atol=1e-12)
    assert float(aligned) > 0
