"""training.distill in the trainer: the config's one-line errors, the update step (no host sync,
one compiled graph, accumulation exact), the teacher's pull on a trained student (KL(q || p) on
the validation set, against the same student trained without it), and resume."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nmt.config import ConfigError, resolve_config
from nmt.sparse import get_loss, get_mapping
from nmt.train.distill import DistillForward, Teacher, distill_loss
from nmt.train.precision import TrainPrecision
from nmt.train.update import update
from nmt.utils.sync_audit import SyncAudit

sys.path.insert(0, str(Path(__file__).parent))
from tiny_task import assert_same_run, interrupt_at, make_trainer, tiny_config, write_task  # noqa: E402
from test_precision_compile import (PAD, STATIC_ENTMAX, assert_compiled_equals_eager, copy_batch,  # noqa: E402
                                    model)

TEACHER_STEPS = 150


def trained(cfg: dict):
    """A Trainer of ``cfg`` (resolved as tiny.yaml) after its training."""
    from nmt.train.trainer import Trainer

    trainer = Trainer(resolve_config(cfg, "tiny.yaml"), "tiny.yaml")
    trainer.train()
    return trainer


def softmax_config(data: dict, save_dir: Path, **training) -> dict:
    """The tiny task's config with a softmax output and no dropout, on the CPU."""
    cfg = tiny_config(data, save_dir, device="cpu", **training)
    cfg["model"]["output"]["mapping"] = "softmax"
    cfg["model"]["embeddings"]["dropout"] = cfg["model"]["decoder"]["dropout"] = 0.0
    return cfg


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory) -> tuple[dict, Path]:
    """The tiny task's data and a softmax teacher trained on it (its run directory, with best.pt)."""
    root = tmp_path_factory.mktemp("distill")
    data = write_task(root / "data")
    trained(softmax_config(data, root / "teacher", max_steps=TEACHER_STEPS, valid_every=TEACHER_STEPS,
                           log_every=TEACHER_STEPS, optimizer={"name": "adam", "lr": 0.02}))
    return data, root / "teacher"


def student(data: dict, save_dir: Path, **training):
    return make_trainer(data, save_dir, device="cpu", **training)


# ------------------------------------------------------------------ config errors
def test_config_refuses_a_missing_teacher_a_bad_weight_and_temperature(tmp_path):
    data = write_task(tmp_path / "data")
    missing = tmp_path / "nowhere.pt"
    with pytest.raises(ConfigError, match=rf"^tiny.yaml: training.distill.teacher: {missing}: no such checkpoint file"):
        student(data, tmp_path / "s", distill={"teacher": str(missing)})
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(ConfigError, match=r"training.distill.teacher: .*empty_run: a directory without best.pt"):
        student(data, tmp_path / "s", distill={"teacher": str(tmp_path / "empty_run")})
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"^tiny.yaml: training.distill.teacher: .*garbage.pt"):
        student(data, tmp_path / "s", distill={"teacher": str(tmp_path / "garbage.pt")})
    for key, value, problem in (("weight", 0.0, r"must be in \(0, 1\], got 0.0"),
                                ("weight", 1.5, r"must be in \(0, 1\], got 1.5"),
                                ("temperature", 0.0, r"must be > 0, got 0.0")):
        with pytest.raises(ConfigError, match=rf"^tiny.yaml: training.distill.{key}: {problem}"):
            resolve_config(tiny_config(data, tmp_path / "s", distill={"teacher": None, key: value}), "tiny.yaml")
    assert not (tmp_path / "s" / "config.yaml").exists()


def test_a_teacher_with_other_vocabularies_is_refused_naming_the_side(teacher_run, tmp_path):
    data, teacher = teacher_run
    other = tiny_config(data, tmp_path / "s", device="cpu", distill={"teacher": str(teacher)})
    other["data"]["tgt"]["max_size"] = 3  # a smaller target vocabulary: the teacher's is cut at id 7
    from nmt.train.trainer import Trainer

    with pytest.raises(ConfigError, match=r"^tiny.yaml: training.distill.teacher: .*best.pt: its target vocabulary "
                       r"differs from this run's \(10 vs 7 tokens; the first 7 agree\); .*vocab_file"):
        Trainer(resolve_config(other, "tiny.yaml"), "tiny.yaml")
    assert not (tmp_path / "s" / "vocab.tgt").exists()  # refused before the run wrote anything but its directory


def test_a_teacher_whose_learned_positions_are_too_few_is_refused(teacher_run, tmp_path):
    """A Transformer teacher with 6 learned positions cannot read the student's pairs of up to
    data.src.max_length 50 tokens: refused, naming both limits; at 6 / 5 tokens it is accepted."""
    data, _ = teacher_run
    cfg = tiny_config(data, tmp_path / "transformer", device="cpu", max_steps=1, valid_every=1)
    cfg["model"] = {"type": "transformer", "transformer": {
        "encoder_layers": 1, "decoder_layers": 1, "d_model": 8, "heads": 2, "d_ff": 16, "positions": "learned",
        "max_positions": 6}, "output": {"mapping": "sparsemax"}}
    cfg["data"]["src"]["max_length"], cfg["data"]["tgt"]["max_length"] = 6, 5
    cfg["validation"]["max_length"] = 5
    trained(cfg)
    distill = {"teacher": str(tmp_path / "transformer")}
    with pytest.raises(ConfigError, match=r"^tiny.yaml: training.distill.teacher: .*best.pt: its learned positions "
                       r"hold 6 source tokens, data.src.max_length is 50; lower it to 6$"):
        student(data, tmp_path / "s", distill=distill)
    longer = tiny_config(data, tmp_path / "s", device="cpu", distill=distill)
    longer["data"]["src"]["max_length"] = 6
    from nmt.train.trainer import Trainer

    with pytest.raises(ConfigError, match=r"holds? 6 decoder inputs \(BOS \+ tokens\), data.tgt.max_length is 50; "
                       r"lower it to 5$"):
        Trainer(resolve_config(longer, "tiny.yaml"), "tiny.yaml")
    longer["data"]["tgt"]["max_length"] = 5
    fits = Trainer(resolve_config(longer, "tiny.yaml"), "tiny.yaml")
    fits.lock.release()
    assert fits.teacher.mapping_name == "sparsemax"


# ------------------------------------------------------------------ the update step
def _teacher(mapping: dict, weight: float = 0.5, temperature: float = 1.0) -> Teacher:
    torch.manual_seed(5)
    t = model(torch.float32, output=mapping, decoder={"hidden_size": 16}).eval()
    for p in t.parameters():
        p.requires_grad_(False)
    return Teacher(t, get_mapping(mapping["mapping"], **mapping["params"]), mapping["mapping"], weight, temperature,
                   Path("teacher.pt"), 0)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_distill_update_makes_no_host_sync(precision, monkeypatch):
    """Teacher forward (its sync-free static 1.5-entmax output), the student's softmax loss at the
    reference and at q, backward, clipping and fused Adam: no synchronising call. The LSTM
    encoder's CPU-only path for gradient-free forwards (one oneDNN run per source length, chosen
    from the host lengths; never taken off the CPU) is switched off: it is the accelerators' path
    that is audited."""
    monkeypatch.setattr("nmt.models.encoder.CPU_RUNS", False)
    m = model(torch.float32)
    optimizer = torch.optim.Adam(m.parameters(), lr=1e-3, fused=True)
    teacher = _teacher(STATIC_ENTMAX, temperature=2.0)
    forward = DistillForward(teacher)
    dtypes = []  # the teacher's scores: under the same autocast as the student's
    teacher.model.generator.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    for step in range(2):
        batch = copy_batch(step)  # built on the host, as collate's
        with SyncAudit() as audit:
            loss, _, skipped = update(m, get_loss("softmax"), optimizer, batch, PAD, 1.0,
                                      precision=TrainPrecision(precision, "cpu"), forward=forward)
        assert audit.total == 0, audit.report()
        assert loss.dim() == 0 and torch.isfinite(loss) and skipped is None
    assert dtypes == [torch.bfloat16 if precision == "bf16" else torch.float32] * 2


def test_compiled_distill_step_is_one_graph_and_equals_eager():
    """Teacher and student (LSTM encoders in the graph) compile into one graph: no graph break,
    so no host read; loss and gradients equal the eager step's (float64)."""
    import torch._dynamo

    from nmt.models.seq2seq import length_mask
    from nmt.train.compile import compile_for_device

    graphs: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm

    teacher = _teacher({"mapping": "softmax", "params": {}}, weight=0.7, temperature=1.5)
    teacher.model.double()
    m = model()
    batch = copy_batch(4)
    mask = length_mask(batch.src_lengths, batch.src.size(1), batch.src.device)
    args = (m, get_loss("sparsemax"), batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, PAD, 0.0, mask)
    compiled = DistillForward(teacher, lambda fn: compile_for_device(fn, "cpu", backend=counting,
                                                                      encoder_in_graph=True))
    assert_compiled_equals_eager(m, compiled, DistillForward(teacher), args)
    assert len(graphs) == 1, graphs


@pytest.mark.parametrize("normalization", ["tokens", "sents"])
def test_accumulated_distill_batches_give_the_gradient_of_one_batch(normalization):
    """Two half batches accumulated = one batch of all their sentences (float64, SGD): the
    distillation loss is a sum over tokens like the plain one."""
    from nmt.data.batching import Batch

    teacher = _teacher({"mapping": "entmax15", "params": {}})
    teacher.model.double()
    whole = copy_batch(7, batch=8)

    def half(rows: slice) -> Batch:
        lengths = whole.src_lengths[rows]
        return Batch(src=whole.src[rows], src_lengths=lengths, tgt_in=whole.tgt_in[rows], tgt_out=whole.tgt_out[rows],
                     tgt_lengths=whole.tgt_lengths[rows], n_tokens=int((lengths + 1).sum()), indices=list(range(4)),
                     n_src_tokens=int(lengths.sum()))

    runs = []
    for batches in ([whole], [half(slice(0, 4)), half(slice(4, 8))]):
        m = model()
        optimizer = torch.optim.SGD(m.parameters(), lr=0.5)
        update(m, get_loss("entmax15"), optimizer, batches, PAD, None, 0.1, forward=DistillForward(teacher),
               normalization=normalization)
        runs.append([p.detach().clone() for p in m.parameters()])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ training
def validation_kl(trainer, teacher_dir: Path) -> float:
    """Mean KL(q || p) per validation target token between the teacher's and the trained
    student's softmax distributions (teacher forcing), recomputed here with torch.nn.functional."""
    from nmt.data.batching import collate
    from nmt.translate.loading import load_model

    teacher = load_model(teacher_dir / "best.pt", "cpu").model
    student_model = trainer.model.eval()
    valid = trainer.data.valid
    b = collate(valid, list(range(len(valid))), trainer.pad, trainer.bos, trainer.eos)
    with torch.no_grad():
        q = F.softmax(teacher(b.src, b.src_lengths, b.tgt_in)[0], -1)
        logp = F.log_softmax(student_model(b.src, b.src_lengths, b.tgt_in)[0], -1)
    kl = F.kl_div(logp, q, reduction="none").sum(-1)
    keep = b.tgt_out != trainer.pad
    return float(kl[keep].sum() / keep.sum())


def test_a_distilled_student_moves_toward_its_teacher(teacher_run, tmp_path):
    """The same student (seed, data, steps) trained with and without the teacher: with it, its
    validation distributions are closer to the teacher's (KL(q || p)): about 0.55-0.7 times the
    plain student's over training seeds 1, 2, 3 and 1234 (measured), 0.8 asserted."""
    data, teacher = teacher_run
    kls = {}
    for name, distill in (("plain", {}), ("distilled", {"distill": {"teacher": str(teacher), "weight": 0.8}})):
        trainer = trained(softmax_config(data, tmp_path / name, max_steps=100, valid_every=100, log_every=100,
                                         optimizer={"name": "adam", "lr": 0.01}, **distill))
        kls[name] = validation_kl(trainer, teacher)
    assert kls["distilled"] < 0.8 * kls["plain"], kls


def test_an_interrupted_distilled_run_resumes_as_if_uninterrupted(teacher_run, tmp_path):
    """The teacher is reloaded on resume (eval mode, no random numbers drawn): bit-equal weights
    and the same metrics as the uninterrupted run; an entmax15 student with label smoothing."""
    data, teacher = teacher_run
    settings = {"distill": {"teacher": str(teacher), "weight": 0.5, "temperature": 2.0}, "label_smoothing": 0.1}
    straight = student(data, tmp_path / "straight", **settings)
    straight.train()

    first = student(data, tmp_path / "resumed", **settings)
    assert first.train(step_hook=interrupt_at(7)).step == 7
    second = student(data, tmp_path / "resumed", **settings)
    assert second.resumed and second.progress.step == 7
    assert second.train().step == 12
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")


def test_a_resume_names_a_teacher_file_rewritten_since_the_checkpoint(teacher_run, tmp_path, caplog, monkeypatch):
    """The checkpoint keeps the teacher's step and file fingerprint: resuming against the same
    file is silent, against that path rewritten with another checkpoint (here the teacher's
    weights perturbed and saved as a later step, as the teacher's own run would rewrite its
    best.pt) is one warning naming the file and both steps; training goes on."""
    import logging
    import shutil

    from nmt.utils.checkpoint_file import load_checkpoint, save_checkpoint

    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # off after a CLI test's setup_logging
    data, teacher = teacher_run
    copy = tmp_path / "teacher.pt"
    shutil.copyfile(teacher / "best.pt", copy)
    settings = {"distill": {"teacher": str(copy), "weight": 0.5}, "max_steps": 3, "valid_every": 3}
    student(data, tmp_path / "run", **settings).train()
    caplog.clear()
    with caplog.at_level("WARNING", logger="nmt.train.trainer"):
        student(data, tmp_path / "run", **{**settings, "max_steps": 4}).train()
    assert not [r for r in caplog.records if "training.distill.teacher" in r.getMessage()]
    payload = load_checkpoint(copy)
    old_step = payload["step"]
    payload["step"] = old_step + 50
    for tensor in payload["model"].values():
        if tensor.is_floating_point():
            tensor.add_(0.01)
    save_checkpoint(copy, payload)
    caplog.clear()
    with caplog.at_level("WARNING", logger="nmt.train.trainer"):
        assert student(data, tmp_path / "run", **{**settings, "max_steps": 5}).train().step == 5
    lines = [r.getMessage() for r in caplog.records if "training.distill.teacher" in r.getMessage()]
    assert len(lines) == 1, lines
    assert (f"{copy} now holds step {old_step + 50} (step {old_step} when the checkpoint was written)" in lines[0]
            and "last.pt" in lines[0] and "goes on" in lines[0]), lines[0]


def test_the_mixed_loss_of_a_batch_is_what_the_update_returns(teacher_run, tmp_path):
    """The trainer's update returns the summed mixed loss of its batch: recomputed from the teacher's
    and the student's teacher-forced scores (softmax teacher, entmax15 student)."""
    data, teacher = teacher_run
    trainer = student(data, tmp_path / "s", distill={"teacher": str(teacher), "weight": 0.3})
    try:
        from nmt.data.batching import collate

        b = collate(trainer.train_set, list(range(8)), trainer.pad, trainer.bos, trainer.eos)
        trainer.model.eval()  # no dropout: the same scores twice
        with torch.no_grad():
            q = F.softmax(trainer.teacher.model(b.src, b.src_lengths, b.tgt_in)[0], -1)
            z = trainer.model(b.src, b.src_lengths, b.tgt_in)[0]
            v = z.size(-1)
            expected = distill_loss(get_loss("entmax15"), z.reshape(-1, v), b.tgt_out.reshape(-1), q.reshape(-1, v),
                                    0.3, trainer.pad)
            got = trainer.loss_forward(trainer.model, trainer.loss_fn, b.src, b.src_lengths, b.tgt_in, b.tgt_out,
                                       trainer.pad, 0.0)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        assert not trainer.teacher.model.training
        assert all(not p.requires_grad for p in trainer.teacher.model.parameters())
    finally:
        trainer.lock.release()


def test_distillation_and_guided_alignment_add_up(teacher_run, tmp_path):
    """training.distill with training.guided_alignment: the update's loss of a batch is the mixed
    distillation loss plus weight x the attention's Fenchel-Young loss at the batch's reference
    grid, each recomputed here from the teacher's and the student's teacher-forced scores; the
    compiled step (teacher, student and both losses) is one graph equal to the eager one."""
    from dataclasses import replace

    from nmt.data.batching import collate
    from nmt.models.seq2seq import length_mask
    from nmt.train.compile import compile_for_device
    from nmt.train.guided_alignment import GuidedForward, alignment_loss

    data, teacher = teacher_run
    lines = Path(data["train"]["src"]).read_text(encoding="utf-8").splitlines()
    align = tmp_path / "train.align"
    align.write_text("".join(" ".join(f"{i}-0" for i in range(0, len(s.split()), 2)) + "\n" for s in lines),
                     encoding="utf-8")
    data = {**data, "train": {**data["train"], "align": str(align)}}
    trainer = student(data, tmp_path / "s", distill={"teacher": str(teacher), "weight": 0.3},
                      guided_alignment={"weight": 0.5})
    try:
        assert isinstance(trainer.loss_forward, GuidedForward) and trainer.loss_forward.teacher is trainer.teacher
        part = list(range(8))
        b = collate(trainer.train_set, part, trainer.pad, trainer.bos, trainer.eos)
        b = replace(b, align=trainer.alignments.reference([trainer.train_set.line_numbers[i] for i in part],
                                                          b.tgt_in.size(1), b.src.size(1), rows=len(part)))
        assert float(b.align.sum()) > 0
        trainer.model.eval()  # no dropout: the same scores twice
        with torch.no_grad():
            q = F.softmax(trainer.teacher.model(b.src, b.src_lengths, b.tgt_in)[0], -1)
            z, scores = trainer.model(b.src, b.src_lengths, b.tgt_in, alignment_scores=True)
            v = z.size(-1)
            expected = (distill_loss(get_loss("entmax15"), z.reshape(-1, v), b.tgt_out.reshape(-1), q.reshape(-1, v),
                                     0.3, trainer.pad)
                        + 0.5 * alignment_loss(get_loss("entmax15"), scores, b.align))
            args = (trainer.model, trainer.loss_fn, b.src, b.src_lengths, b.tgt_in, b.tgt_out, trainer.pad, 0.0)
            got = trainer.loss_forward(*args, align=b.align)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        assert float(trainer.loss_forward.take()) > 0
    finally:
        trainer.lock.release()

    graphs: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm

    guide = trainer.guide
    teacher_copy = _teacher({"mapping": "softmax", "params": {}}, weight=0.7, temperature=1.5)
    teacher_copy.model.double()
    m = model()
    batch = copy_batch(4)
    ref = torch.zeros(batch.tgt_in.size(0), batch.tgt_in.size(1), batch.src.size(1), dtype=torch.float64)
    for i, n in enumerate(batch.src_lengths.tolist()):
        ref[i, torch.arange(n), torch.arange(n)] = 1.0
    mask = length_mask(batch.src_lengths, batch.src.size(1), batch.src.device)  # made by update(), as in training
    args = (m, get_loss("sparsemax"), batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, PAD, 0.0, mask, ref)
    compiled = GuidedForward(guide, lambda fn: compile_for_device(fn, "cpu", backend=counting, encoder_in_graph=True),
                             teacher=teacher_copy)
    assert_compiled_equals_eager(m, compiled, GuidedForward(guide, teacher=teacher_copy), args)
    assert len(graphs) == 1, graphs


@pytest.mark.slow
def test_two_distilling_processes_equal_one_process_with_twice_the_batch(teacher_run, tmp_path, ranks):
    """Data parallel (2 Gloo ranks, each its own teacher copy): the parameters after 4 distilled
    steps agree with one process of twice the batch (float32 summation order apart, as the plain
    data-parallel test's tolerance)."""
    from ddp_workers import gloo_config

    from nmt.train.checkpoint import load_checkpoint
    from nmt.train.trainer import Trainer

    data, teacher = teacher_run
    distill = {"teacher": str(teacher), "weight": 0.6, "temperature": 1.5}
    one = Trainer(resolve_config(gloo_config(data, tmp_path / "one", 8, max_steps=4, valid_every=4, distill=distill),
                                 "t"), "t")
    one.train()
    results = ranks.run(gloo_config(data, tmp_path / "two", 4, max_steps=4, valid_every=4, distill=distill))
    assert [r[2:4] for r in results] == [("max_steps", 4)] * 2, results
    a, b = (load_checkpoint(tmp_path / run / "last.pt")["model"] for run in ("one", "two"))
    start = Trainer(resolve_config(gloo_config(data, tmp_path / "fresh", 8, max_steps=4), "t"), "t")
    start.lock.release()
    assert max((a[k] - start.model.state_dict()[k]).abs().max() for k in a) > 1e-3  # the steps moved the weights
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=2e-6, msg=name)
