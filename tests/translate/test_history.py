"""backtrack: the one-slot (greedy) shortcut against the step-by-step walk through the parents."""
import pytest
import torch

from nmt.translate import history


def _records(steps: int, batch: int, slots: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "token": torch.randint(4, 20, (steps, batch, slots), generator=g),
        "parent": torch.randint(0, slots, (steps, batch, slots), generator=g),
        "attention": torch.rand(steps, batch, slots, 6, generator=g),
        "support_size": torch.randint(1, 9, (steps, batch, slots), generator=g, dtype=torch.int32),
        "support_tokens": torch.randint(0, 20, (steps, batch, slots, 3), generator=g),
    }


@pytest.mark.parametrize("n_best", [1, 3])
def test_one_slot_backtracking_equals_the_walk_through_the_parents(monkeypatch, n_best):
    records = _records(steps=7, batch=5, slots=1, seed=n_best)
    records["parent"].zero_()
    end_step = torch.tensor([[6, 2, -1], [0, 5, 3], [-1, -1, -1], [4, 4, 1], [3, 6, 0]])[:, :n_best]
    slot = torch.zeros_like(end_step)
    per_row = ("attention", "support_size", "support_tokens")
    fast = history.backtrack(records, end_step, slot, pad=1, per_row=per_row)
    monkeypatch.setattr(history, "_backtrack_one_slot", None)  # not reached: the walk below
    walked = dict(records, token=records["token"].expand(-1, -1, 2), parent=records["parent"].expand(-1, -1, 2))
    for name in per_row:  # a second slot that no hypothesis ends in or passes through
        walked[name] = records[name].expand((-1, -1, 2) + records[name].shape[3:])
    slow = history.backtrack(walked, end_step, slot, pad=1, per_row=per_row)
    assert fast.keys() == slow.keys()
    for name in fast:
        assert fast[name].dtype == slow[name].dtype and torch.equal(fast[name], slow[name]), name
    assert (fast["tokens"][2] == 1).all() and fast["tokens"][0, 0].tolist() == records["token"][:, 0, 0].tolist()
