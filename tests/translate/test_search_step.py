"""select_step's native statistics pass (CPU) against the torch passes it replaces: the same step."""
import pytest
import torch

import nmt.translate.search_step as step_module
from nmt.sparse import _native
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import RowState, Specials, select_step


@pytest.mark.skipif(not _native.available(), reason="native library not built")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("beam,certify,t", [(1, True, 3), (5, True, 3), (5, False, 0), (4, True, 7)])
def test_native_statistics_give_the_same_step(monkeypatch, count_calls, dtype, beam, certify, t):
    """Scores with NaN / +inf rows, dead slots and exact zeros, a vocabulary that splits blocks
    across slots: the records, parents, tokens, scores, certificates and stop flags are identical
    with the native pass and with the torch passes (``step_candidates`` unavailable)."""
    g = torch.Generator().manual_seed(beam * 10 + t)
    batch, vocab = 6, 3963
    slots = 1 if t == 0 else beam
    options = SearchOptions(beam_size=beam, certify=certify, length_penalty="average", max_length=20)
    log_probs = torch.log_softmax(torch.randn(batch * slots, vocab, generator=g, dtype=dtype) * 3, -1)
    log_probs[:, ::3] = float("-inf")
    log_probs[1, 5] = float("nan")
    log_probs[-1, 9] = float("inf")
    scores = torch.randn(batch, slots, generator=g, dtype=dtype) - 4
    if slots > 1:
        scores[2, 1:] = float("-inf")  # dead slots
    start = RowState.start(batch, 1, certify, torch.device("cpu"))
    rows = RowState(scores, start.exact, start.reason, start.best_finished.to(dtype), start.top_finished)
    attention = torch.rand(batch * slots, 11, generator=g)
    special = Specials(bos=2, eos=3, pad=0)
    calls = count_calls(step_module, "step_candidates")
    native = select_step(log_probs, attention, rows, t, options, special)
    assert calls == [True]
    monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
    torch_passes = select_step(log_probs, attention, rows, t, options, special)
    for name in native.record:
        assert torch.equal(native.record[name], torch_passes.record[name]), name
    for a, b in ((native.parent, torch_passes.parent), (native.chosen, torch_passes.chosen),
                 (native.done, torch_passes.done), *zip(vars(native.rows).values(), vars(torch_passes.rows).values())):
        assert (a is None and b is None) or torch.equal(a, b)


def bookkeeping_case(seed: int, beam: int, n_best: int, penalty: str, certify: bool, dtype: torch.dtype,
                     device: str = "cpu") -> tuple:
    """``select_step``'s arguments for a test of the step's bookkeeping: a 5-token vocabulary in
    which EOS is often chosen, NaN and +inf entries, the first step (one slot, seed % 4 == 0) or a
    later one, rows mid-search (:func:`_random_rows`)."""
    g = torch.Generator().manual_seed(seed)
    batch, vocab, t = 9, 5, seed % 4
    slots = 1 if t == 0 else beam
    options = SearchOptions(beam_size=beam, n_best=n_best, certify=certify, length_penalty=penalty,
                            length_alpha=0.7, max_length=12)
    log_probs = torch.log_softmax(torch.randn(batch * slots, vocab, generator=g, dtype=dtype) * 2, -1)
    log_probs[torch.rand(batch * slots, vocab, generator=g) < 0.2] = float("-inf")
    log_probs[seed % (batch * slots), 1] = float("nan")
    log_probs[(seed + 4) % (batch * slots), 2] = float("inf")
    rows = _random_rows(g, batch, slots, n_best, dtype, certify)
    rows = RowState(*(x.to(device) for x in (rows.scores, rows.exact, rows.reason, rows.best_finished,
                                              rows.top_finished)))
    attention = torch.rand(batch * slots, 4, generator=g)
    return log_probs.to(device), attention.to(device), rows, t, options, Specials(bos=0, eos=3, pad=4)


def assert_same_step(a, b) -> None:
    """Two StepOutcomes equal bit for bit: records, parents, tokens, stop flags, every row field."""
    assert a.record.keys() == b.record.keys()
    for name in a.record:
        assert torch.equal(a.record[name], b.record[name]), name
    pairs = [(a.parent, b.parent), (a.chosen, b.chosen), (a.done, b.done), *zip(vars(a.rows).values(),
                                                                                 vars(b.rows).values())]
    for x, y in pairs:
        assert (x is None and y is None) or (x.dtype == y.dtype and torch.equal(x, y))


def _random_rows(g, batch, slots, n_best, dtype, certify):
    """Rows mid-search: live and dead slots, finished hypotheses kept (descending, some -inf),
    certificates already broken on some rows, best candidates finished on others."""
    scores = torch.randn(batch, slots, generator=g, dtype=dtype) - 3
    scores[torch.rand(batch, slots, generator=g) < 0.25] = float("-inf")
    best = (torch.randn(batch, n_best, generator=g, dtype=dtype) - 4).sort(dim=1, descending=True).values
    best[torch.rand(batch, n_best, generator=g) < 0.4] = float("-inf")
    best = best.sort(dim=1, descending=True).values
    exact = (torch.rand(batch, generator=g) < 0.6) & certify
    reason = torch.where(exact, 0, torch.randint(1, 5, (batch,), generator=g)) if certify else torch.full((batch,), 3)
    top = torch.rand(batch, generator=g) < 0.2
    return RowState(scores, exact, reason, best, top)


@pytest.mark.skipif(not _native.available(), reason="native library not built")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("beam,n_best", [(1, 1), (2, 1), (3, 3), (5, 2)])
@pytest.mark.parametrize("penalty", ["none", "average", "gnmt"])
@pytest.mark.parametrize("certify", [True, False])
def test_the_native_bookkeeping_gives_the_torch_step(monkeypatch, dtype, beam, n_best, penalty, certify):
    """The one native call after the candidates (nmt.translate.native_step) against the torch code
    it replaces, from the same candidates: a 5-token vocabulary in which EOS is often chosen,
    finished hypotheses entering the n best, NaN and +inf rows in live and dead slots, the length
    penalties (GNMT's divisions are inexact), the first step (one slot) and later ones; every
    record, parent, token, score, certificate and stop flag bit for bit."""
    from nmt.translate import native_step
    if native_step.library() is None:
        pytest.skip("native search step not built")
    real = step_module.step_update
    calls: list = []

    def counting(*args, **kwargs):  # put back before every native step (the reference removes it)
        calls.append(True)
        return real(*args, **kwargs)

    outcomes = set()
    for seed in range(12):
        case = bookkeeping_case(seed, beam, n_best, penalty, certify, dtype)
        monkeypatch.setattr(step_module, "step_update", counting)
        native = select_step(*case)
        monkeypatch.setattr(step_module, "step_update", lambda *args, **kwargs: None)
        reference = select_step(*case)
        assert_same_step(native, reference)
        outcomes.update(reference.done.tolist())
        outcomes.update(f"finished {x}" for x in torch.isfinite(reference.rows.best_finished).flatten().tolist())
    assert len(calls) == 12
    assert outcomes == {True, False, "finished True", "finished False"}  # stops and finished hypotheses met


@pytest.mark.skipif(not _native.available(), reason="native library not built")
def test_the_native_bookkeeping_declines_what_it_does_not_hold():
    from nmt.translate import native_step
    if native_step.library() is None:
        pytest.skip("native search step not built")
    rows = RowState.start(2, 1, True, torch.device("cpu"))
    args = (rows.scores, rows.exact.view(2, 1), rows.exact, rows.reason, rows.best_finished, rows.top_finished)
    common = dict(vocab=5, eos=3, certify=True, penalty=1.0, bound_penalty=1.0, nonfinite_code=4, pruned_code=1)
    top, index = torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long)
    assert native_step.step_update(top, index, *args, beam_size=1, **common) is not None
    assert native_step.step_update(top, index, *args, beam_size=3, **common) is None  # fewer candidates than slots
    assert native_step.step_update(top[:, :1], index[:, :1], *args[:5], rows.top_finished.int(), beam_size=1,
                                   **common) is None  # not bool flags
    assert native_step.step_update(top.half(), index, *args, beam_size=1, **common) is None


@pytest.mark.skipif(not _native.available(), reason="native library not built")
@pytest.mark.parametrize("use_native", [True, False])
def test_a_finished_score_equal_to_the_live_bound_stops_the_row(monkeypatch, use_native):
    """The stop test's tie: the worst kept finished score equals the best live score (no length
    penalty): the row is settled (>=), in the native call and in the torch code alike."""
    if not use_native:
        monkeypatch.setattr(step_module, "step_update", lambda *args, **kwargs: None)
    options = SearchOptions(beam_size=1, certify=False, max_length=12)
    log_probs = torch.tensor([[-1.0, -5.0, -3.0, -6.0, -7.0]])  # token 0 extends the prefix to -2
    rows = RowState(torch.tensor([[-1.0]]), torch.tensor([False]), torch.tensor([3]), torch.tensor([[-2.0]]),
                    torch.tensor([False]))
    step = select_step(log_probs, torch.ones(1, 2), rows, 2, options, Specials(bos=0, eos=3, pad=4))
    assert step.chosen.tolist() == [[0]] and step.rows.scores.tolist() == [[-2.0]]
    assert step.done.tolist() == [True]


def test_divided_divides_by_a_device_scalar_off_the_cpu():
    """``divided`` (the length penalty's divisions of a step) divides by the number on the CPU and
    by a 0-dim tensor of the same device elsewhere (meta here): CUDA turns a division by a host
    number into a product with its reciprocal, which the CPU and the search's kernels do not."""
    from nmt.translate.search_step import divided

    x = torch.tensor([-3.0, -7.25, float("-inf")])
    assert torch.equal(divided(x, 2.5), x / 2.5)
    seen = []
    real = torch.Tensor.__truediv__

    def spy(self, other):
        seen.append(other)
        return real(self, other)

    torch.Tensor.__truediv__ = spy
    try:
        out = divided(torch.empty(3, device="meta"), 1.7)
    finally:
        torch.Tensor.__truediv__ = real
    assert out.device.type == "meta" and out.shape == (3,)
    assert len(seen) == 1 and isinstance(seen[0], torch.Tensor) and seen[0].dim() == 0
    assert seen[0].device.type == "meta" and seen[0].dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_divided_on_cuda_is_the_cpu_quotient():
    """The GNMT penalties of 100 steps divide random scores on CUDA exactly as on the CPU (and as
    the step's kernels, which divide IEEE-rounded), in float32 and float64."""
    from nmt.translate.length_penalty import length_penalty
    from nmt.translate.search_step import divided

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = (torch.randn(4096, generator=g) * 20).to(dtype)
        for t in range(1, 101):
            value = length_penalty("gnmt", t, 0.6)
            assert torch.equal(divided(x.cuda(), value).cpu(), x / value), (dtype, t)
