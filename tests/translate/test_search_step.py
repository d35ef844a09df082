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
def test_native_statistics_give_the_same_step(monkeypatch, dtype, beam, certify, t):
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
    calls = []
    real = step_module.step_candidates

    def counting(*args):
        calls.append(True)
        return real(*args)

    monkeypatch.setattr(step_module, "step_candidates", counting)
    native = select_step(log_probs, attention, rows, t, options, special)
    assert calls == [True]
    monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
    torch_passes = select_step(log_probs, attention, rows, t, options, special)
    for name in native.record:
        assert torch.equal(native.record[name], torch_passes.record[name]), name
    for a, b in ((native.parent, torch_passes.parent), (native.chosen, torch_passes.chosen),
                 (native.done, torch_passes.done), *zip(vars(native.rows).values(), vars(torch_passes.rows).values())):
        assert torch.equal(a, b)
