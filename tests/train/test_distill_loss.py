"""The word-level distillation loss (nmt.train.distill) against independent truths: the mixed
Fenchel-Young loss's value from the conjugate written out with independently computed mappings
(softmax by torch, sparsemax and 1.5-entmax by sorting / bisection here), its gradient the closed
form ``p*(z) - ((1 - w) y + w q)`` and finite differences (float64), and the classic KD objective
``(1 - w) CE + w KL(q || p)`` from torch.nn.functional for a softmax student and teacher."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.sparse import get_loss, get_mapping
from nmt.train.distill import (DistillForward, Teacher, distill_loss, teacher_distribution,
                               token_list_difference)

PAD = 1


def sparsemax_ref(z: torch.Tensor) -> torch.Tensor:
    """Sparsemax by sorting (Martins & Astudillo 2016), row-wise."""
    zs, _ = torch.sort(z, dim=-1, descending=True)
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cums = zs.cumsum(-1)
    support = (1 + k * zs > cums).sum(-1, keepdim=True)
    tau = (cums.gather(-1, support - 1) - 1) / support.to(z.dtype)
    return (z - tau).clamp(min=0)


def entmax_ref(z: torch.Tensor, alpha: float = 1.5, iters: int = 200) -> torch.Tensor:
    """alpha-entmax by bisection on the threshold: p = [(alpha - 1) z - tau]_+^(1 / (alpha - 1)), sum 1."""
    x = (alpha - 1) * z
    lo, hi = x.max(-1, keepdim=True).values - 1, x.max(-1, keepdim=True).values
    for _ in range(iters):
        mid = (lo + hi) / 2
        mass = (x - mid).clamp(min=0).pow(1 / (alpha - 1)).sum(-1, keepdim=True)
        lo, hi = torch.where(mass >= 1, mid, lo), torch.where(mass >= 1, hi, mid)
    p = (x - (lo + hi) / 2).clamp(min=0).pow(1 / (alpha - 1))
    return p / p.sum(-1, keepdim=True)


MAPPINGS = {  # name: (independent mapping, Omega)
    "softmax": (lambda z: torch.softmax(z, -1), lambda p: torch.where(p > 0, p * p.clamp(min=1e-300).log(), 0).sum(-1)),
    "sparsemax": (sparsemax_ref, lambda p: (p.pow(2).sum(-1) - 1) / 2),
    "entmax15": (entmax_ref, lambda p: (p.pow(1.5).sum(-1) - 1) / 0.75),
}


def fy(name: str, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """L(z; y) = Omega*(z) - <z, y> + Omega(y), Omega*(z) = <z, p> - Omega(p), per row."""
    mapping, omega = MAPPINGS[name]
    p = mapping(z)
    return (z * p).sum(-1) - omega(p) - (z * y).sum(-1) + omega(y)


def batch(n: int = 7, v: int = 9, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, generator=g, dtype=torch.float64) * 2
    t = torch.randn(n, v, generator=g, dtype=torch.float64) * 3
    target = torch.randint(3, v, (n,), generator=g)
    target[2] = PAD  # a padded position: ignored
    target[5] = PAD
    return z, t, target


@pytest.mark.parametrize("student", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("teacher", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("weight", [0.3, 1.0])
def test_mixed_loss_value_and_gradient_are_the_closed_forms(student, teacher, weight):
    z, t, target = batch()
    q = MAPPINGS[teacher][0](t / 1.7)
    if teacher != "softmax":
        assert (q == 0).any()  # a sparse teacher distribution
    z.requires_grad_(True)
    loss = distill_loss(get_loss(student), z, target, q, weight, PAD)
    keep = target != PAD
    onehot = F.one_hot(torch.where(keep, target, 0), z.size(-1)).to(z.dtype)
    with torch.no_grad():
        expected = ((1 - weight) * fy(student, z, onehot) + weight * fy(student, z, q))[keep].sum()
    torch.testing.assert_close(loss, expected, rtol=1e-9, atol=1e-9)
    (grad,) = torch.autograd.grad(loss, z)
    p = MAPPINGS[student][0](z.detach())
    closed = torch.where(keep[:, None], p - ((1 - weight) * onehot + weight * q), 0)
    torch.testing.assert_close(grad, closed, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("student", ["softmax", "sparsemax", "entmax15"])
def test_mixed_loss_gradient_matches_finite_differences_with_label_smoothing(student):
    """Label smoothing smooths the reference part only: target (1 - w)((1 - e) e_y + e / V) + w q."""
    z, t, target = batch(seed=1)
    q = entmax_ref(t)
    weight, eps = 0.4, 0.1
    loss_fn = get_loss(student)

    def f(scores):
        return distill_loss(loss_fn, scores, target, q, weight, PAD, label_smoothing=eps)

    assert torch.autograd.gradcheck(f, (z.clone().requires_grad_(True),), eps=1e-6, atol=1e-6)
    z.requires_grad_(True)
    (grad,) = torch.autograd.grad(f(z), z)
    keep = target != PAD
    onehot = F.one_hot(torch.where(keep, target, 0), z.size(-1)).to(z.dtype)
    smoothed = (1 - eps) * onehot + eps / z.size(-1)
    p = MAPPINGS[student][0](z.detach())
    torch.testing.assert_close(grad, torch.where(keep[:, None], p - ((1 - weight) * smoothed + weight * q), 0),
                               rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_softmax_student_and_teacher_give_the_classic_kd_objective(temperature):
    """(1 - w) CE(y) + w KL(q || p), q = softmax(t / T), from torch.nn.functional."""
    z, t, target = batch(seed=2)
    z, t = z.float(), t.float()
    weight = 0.7
    q = get_mapping("softmax")(t / temperature)
    loss = distill_loss(get_loss("softmax"), z, target, q, weight, PAD)
    keep = target != PAD
    ce = F.cross_entropy(z, target, ignore_index=PAD, reduction="sum")
    kl = F.kl_div(F.log_softmax(z, -1), F.softmax(t / temperature, -1), reduction="none").sum(-1)[keep].sum()
    torch.testing.assert_close(loss, (1 - weight) * ce + weight * kl, rtol=1e-5, atol=1e-5)


class _Toy(torch.nn.Module):
    """A teacher-forced 'model' with the Seq2Seq forward signature: scores from the target prefix and
    the source's mean embedding."""

    def __init__(self, vocab: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.src = torch.nn.Embedding(vocab, 6)
        self.tgt = torch.nn.Embedding(vocab, 6)
        self.out = torch.nn.Linear(6, vocab)
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, src, src_lengths, tgt_in, src_mask=None):
        h = self.tgt(tgt_in) + self.src(src).mean(1, keepdim=True)
        return self.out(self.dropout(h)) * 3, None


@pytest.mark.parametrize("mapping", ["softmax", "entmax15"])
def test_distill_forward_uses_the_teachers_own_mapping_at_the_temperature(mapping):
    """teacher_distribution = the teacher's mapping of its scores / T (no gradient); the whole
    forward = distill_loss of the student's scores at it; compiled (aot_eager) the same."""
    from nmt.train.compile import compile_for_device

    vocab, temperature, weight = 11, 0.8, 0.6
    teacher, student = _Toy(vocab, 0).eval(), _Toy(vocab, 1).eval()
    src = torch.randint(3, vocab, (3, 4))
    tgt_in = torch.randint(3, vocab, (3, 5))
    tgt_out = torch.randint(3, vocab, (3, 5))
    tgt_out[0, 3:] = PAD
    lengths = torch.tensor([4, 4, 4])
    q = teacher_distribution(teacher, get_mapping(mapping), temperature, src, lengths, tgt_in)
    with torch.no_grad():
        independent = MAPPINGS[mapping][0](teacher(src, lengths, tgt_in)[0].double() / temperature)
    torch.testing.assert_close(q.double(), independent, rtol=1e-5, atol=1e-6)
    assert not q.requires_grad
    wrapped = Teacher(teacher, get_mapping(mapping), mapping, weight, temperature, None, 0)
    loss_fn = get_loss("sparsemax")
    expected = distill_loss(loss_fn, student(src, lengths, tgt_in)[0].reshape(-1, vocab), tgt_out.reshape(-1),
                            q.reshape(-1, vocab), weight, PAD)
    for forward in (DistillForward(wrapped),
                    DistillForward(wrapped, lambda fn: compile_for_device(fn, "cpu", backend="aot_eager"))):
        got = forward(student, loss_fn, src, lengths, tgt_in, tgt_out, PAD, 0.0)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        got.backward()
        assert all(p.grad is None for p in teacher.parameters())


def test_token_list_difference_names_the_first_differing_id():
    assert token_list_difference(["a", "b"], ["a", "b"]) is None
    assert token_list_difference(["a", "b", "c"], ["a", "x", "c"]) == "id 1 is 'x' there, 'b' here (3 vs 3 tokens)"
    assert token_list_difference(["a", "b"], ["a", "b", "c"]) == "3 vs 2 tokens; the first 2 agree"
