"""``training.optimizer.decay_vectors: false``: biases, norm gains and other 1-D parameters take no
weight decay, matrices and embeddings take it (two parameter groups, HF Transformers' and nanoGPT's
rule). Checked against closed forms of one step (AdamW's decoupled decay, SGD's L2 term), on a
trained run that resumes bit-equal, and for the one-line errors: the option without a decay, a
resume or an ``init_optimizer`` across a change of the groups, a resume with another optimizer."""
import re

import pytest
import torch

from nmt.config import SCHEMA, ConfigError, resolve_config, saved_value
from nmt.train.checkpoint import load_checkpoint, save_checkpoint
from nmt.train.optimizers import build_optimizer, parameter_groups
from nmt.train.trainer import Trainer
from tiny_task import assert_resumes_exactly, interrupt_at, tiny_config, write_task

BASE = {"name": "adamw", "lr": 0.1, "betas": [0.9, 0.999], "eps": 1e-8, "momentum": 0.0, "nesterov": False,
        "weight_decay": 0.5, "decay_vectors": False, "adafactor": {}}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))


def test_the_groups_split_matrices_from_vectors():
    model = _model()
    matrices, vectors = parameter_groups(model.parameters())
    names = {id(p): n for n, p in model.named_parameters()}
    assert [names[id(p)] for p in matrices["params"]] == ["0.weight", "1.weight"]
    assert [names[id(p)] for p in vectors["params"]] == ["1.bias", "2.weight", "2.bias"]
    assert vectors["weight_decay"] == 0.0 and "weight_decay" not in matrices


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_one_step_with_zero_gradients_decays_the_matrices_alone(name):
    """A zero gradient leaves only the decay: AdamW's decoupled x (1 - lr wd), SGD's L2 term
    x - lr wd x (the same here), on the matrices; the vectors do not move. With decay_vectors true
    (the default) every parameter shrinks alike."""
    for decay_vectors in (False, True):
        model = _model()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = build_optimizer(model.parameters(), {**BASE, "name": name, "decay_vectors": decay_vectors})
        assert len(opt.param_groups) == (1 if decay_vectors else 2)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        for n, p in model.named_parameters():
            shrunk = before[n] * (1 - 0.1 * 0.5)
            want = shrunk if decay_vectors or p.dim() >= 2 else before[n]
            torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=0), (name, n)


def test_without_a_decay_the_option_is_an_error(tmp_path):
    task = write_task(tmp_path / "task", n_train=40)
    cfg = tiny_config(task, tmp_path / "run", device="cpu", optimizer={"name": "adamw", "decay_vectors": False})
    with pytest.raises(ConfigError, match=re.escape("training.optimizer.decay_vectors: false needs")):
        Trainer(resolve_config(cfg, "c.yaml"), "c.yaml")


def _make(task, save_dir, optimizer: dict, **training) -> Trainer:
    cfg = tiny_config(task, save_dir, device="cpu", optimizer=optimizer, **training)
    return Trainer(resolve_config(cfg, "c.yaml"), "c.yaml")


OPT = {"name": "adamw", "weight_decay": 0.1, "decay_vectors": False}


def test_a_run_without_vector_decay_trains_and_resumes_bit_equal(tmp_path):
    """The tiny task's LSTM with AdamW: two groups, both under the lr schedule; a killed and
    resumed run equals the straight one; the trained biases differ from a run that decays them."""
    task = write_task(tmp_path / "task", n_train=40)
    straight, resumed = assert_resumes_exactly(lambda d: _make(task, d, OPT, max_steps=10), tmp_path)
    groups = resumed.optimizer.param_groups
    assert len(groups) == 2 and groups[1]["weight_decay"] == 0.0 and groups[0]["weight_decay"] == 0.1
    assert groups[0]["lr"] == groups[1]["lr"]
    decayed = _make(task, tmp_path / "all", {**OPT, "decay_vectors": True}, max_steps=10)
    decayed.train()
    pairs = list(zip(straight.model.named_parameters(), decayed.model.named_parameters()))
    assert any(not torch.equal(p, q) for (n, p), (_, q) in pairs if p.dim() < 2)


@pytest.mark.parametrize("key, change", [("training.optimizer.decay_vectors", {"decay_vectors": True}),
                                         ("training.optimizer.name", {"name": "adam"})])
def test_a_resume_across_another_optimizer_state_is_a_one_line_error(tmp_path, key, change):
    task = write_task(tmp_path / "task", n_train=40)
    first = _make(task, tmp_path / "run", OPT, max_steps=10)
    assert first.train(step_hook=interrupt_at(4)).stopped_by == "SIGINT"
    with pytest.raises(ConfigError, match=re.escape(key) + ": differs from the run in .* its optimizer state"):
        _make(task, tmp_path / "run", {**OPT, **change}, max_steps=10)


def test_init_optimizer_across_other_groups_is_a_one_line_error(tmp_path):
    task = write_task(tmp_path / "task", n_train=40)
    _make(task, tmp_path / "parent", OPT, max_steps=4).train()
    with pytest.raises(ConfigError, match=re.escape("training.optimizer.decay_vectors: True in the config, False in")):
        _make(task, tmp_path / "child", {**OPT, "decay_vectors": True}, max_steps=6,
              init_from=str(tmp_path / "parent"), init_optimizer=True)
    child = _make(task, tmp_path / "child2", OPT, max_steps=6, init_from=str(tmp_path / "parent"), init_optimizer=True)
    assert child.train().step == 6


def _as_older_nmt_wrote_it(path) -> None:
    """Drop ``training.optimizer.decay_vectors`` from the checkpoint's config at ``path``, as an
    nmt before the option wrote it (that run decayed every parameter: the schema's default)."""
    checkpoint = load_checkpoint(path)
    del checkpoint["config"]["training"]["optimizer"]["decay_vectors"]
    save_checkpoint(path, checkpoint)


def test_errors_against_a_checkpoint_older_than_the_option_name_the_behaviour_it_had(tmp_path):
    """A checkpoint whose config lacks ``decay_vectors`` (written before the option) ran with the
    default, every parameter decayed: the resume and the init_optimizer errors say ``True`` there
    (the value it ran with), not None; a resume leaving the option at its default goes on."""
    task = write_task(tmp_path / "task", n_train=40)
    decayed = {**OPT, "decay_vectors": True}
    first = _make(task, tmp_path / "run", decayed, max_steps=10)
    assert first.train(step_hook=interrupt_at(4)).stopped_by == "SIGINT"
    _as_older_nmt_wrote_it(tmp_path / "run" / "last.pt")
    with pytest.raises(ConfigError, match=re.escape("training.optimizer.decay_vectors: differs from the run in ")
                       + r".*\(True there\): its optimizer state"):
        _make(task, tmp_path / "run", OPT, max_steps=10)
    assert _make(task, tmp_path / "run", decayed, max_steps=10).train().step == 10
    _as_older_nmt_wrote_it(tmp_path / "run" / "last.pt")
    with pytest.raises(ConfigError, match=re.escape("training.optimizer.decay_vectors: False in the config, True in")):
        _make(task, tmp_path / "child", OPT, max_steps=12, init_from=str(tmp_path / "run"), init_optimizer=True)


def test_saved_value_is_the_checkpoints_own_or_the_behaviour_it_had(tmp_path):
    """``saved_value``: the old config's value where it has the key; where it lacks it, the earlier
    behaviour ``RESUME_DEFAULTS`` names, else the schema's default (an option's; a section's as a
    config that leaves it out resolves it); None for a key the schema does not know."""
    old = {"training": {"optimizer": {"name": "sgd"}}, "model": {}}
    assert saved_value(old, "training.optimizer.name") == "sgd"
    assert saved_value(old, "training.optimizer.decay_vectors") is True
    assert saved_value(old, "training.pool_sort") == "target_source" != SCHEMA["training"]["pool_sort"].default
    assert saved_value(old, "training.no_such_key") is None
    data = {"train": {"src": "a.src", "tgt": "a.tgt"}, "valid": {"src": "b.src", "tgt": "b.tgt"}}
    resolved = resolve_config(tiny_config(data, tmp_path / "run", device="cpu"), "c.yaml")
    assert saved_value(old, "training.optimizer.adafactor") == resolved["training"]["optimizer"]["adafactor"]
