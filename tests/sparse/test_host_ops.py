"""Host work per front-door call on the CUDA route, pinned: torch operators, nmt's Python calls
and Triton launches of each mapping and loss (``tools/host_ops.py``, which counts them through
Triton's real launch path with the stand-in CUDA driver, CPU tensors taken as CUDA ones).

An eager GPU step is bound by the host's time to issue it, and on CUDA every torch operator costs
the host several microseconds: a change that adds an operator (an allocation, a view, a cast, a
fill), a Python call or a launch to these routes fails here, loudly, with the operators by name.
Counts are deterministic (no timing). Where a change adds host work on purpose, raise the bound
with the reason next to it.

The counter is checked against what torch's own calls are known to dispatch (softmax: one
``_softmax`` forward, one ``_softmax_backward_data`` backward; ``F.cross_entropy``:
``_log_softmax`` and ``nll_loss_forward``, and their backwards), so a counter that counts nothing
cannot pass. ``detach``: autograd's saving of an output for the backward, counted by the dispatch
mode for torch's softmax as for nmt's Functions."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import dataclasses, json, sys
sys.path.insert(0, sys.argv[1])
import host_ops
print("JSON " + json.dumps([dataclasses.asdict(r) for r in host_ops.measure()]))
"""

# label: (forward operators, backward operators), each at most; in words what each is
OPS = {
    # torch's own: the references (exact)
    "softmax": ({"_softmax": 1, "detach": 1}, {"_softmax_backward_data": 1, "detach": 1}),
    "softmax, 4-D scores": ({"_softmax": 1, "detach": 1}, {"_softmax_backward_data": 1, "detach": 1}),
    "F.cross_entropy": ({"_log_softmax": 1, "nll_loss_forward": 1, "detach": 1},
                        {"ones_like": 1, "nll_loss_backward": 1, "_log_softmax_backward_data": 1, "detach": 1}),
    # the mappings: the output (forward) and dx (backward) allocations, nothing else (no view of
    # (..., n) scores, no alpha tensor for a float alpha, no cast)
    "sparsemax": ({"empty_like": 1, "detach": 1}, {"empty_like": 1, "detach": 1}),
    "entmax15": ({"empty_like": 1, "detach": 1}, {"empty_like": 1, "detach": 1}),
    "entmax15, 4-D scores": ({"empty_like": 1, "detach": 1}, {"empty_like": 1, "detach": 1}),
    "entmax_bisect(alpha=1.5)": ({"empty_like": 1, "detach": 1}, {"empty_like": 1, "detach": 1}),
    "entmax_bisect(alpha=1.3)": ({"empty_like": 1, "detach": 1}, {"empty_like": 1, "detach": 1}),
    # a learned alpha per head (1, H, 1, 1): read where it lies (no expand, no copy); backward: dx,
    # the per-row alpha gradients (empty), their view (..., 1) and autograd's sum over B and T
    "entmax_bisect(learned alpha)": ({"empty_like": 1, "detach": 1},
                                     {"empty_like": 1, "empty": 1, "view": 1, "sum": 1, "detach": 1}),
    "entmax_bisect_above_one(learned)": ({"empty_like": 1, "detach": 1},
                                         {"empty_like": 1, "empty": 1, "view": 1, "sum": 1, "detach": 1}),
    # index losses ("mean"): the loss and one work buffer (factor, flag, statistics), the flag's
    # view and the range check's _assert_async; backward: autograd's ones_like and dx
    "cross_entropy_loss": ({"empty": 2, "select": 1, "_assert_async": 1}, {"ones_like": 1, "empty_like": 1}),
    # the Tsallis losses also allocate the gradient p - y in the forward (empty_like); backward:
    # the factor of "mean" (select), g times it, the gradient times that
    "sparsemax_loss": ({"empty_like": 1, "empty": 2, "select": 1, "_assert_async": 1},
                       {"ones_like": 1, "select": 1, "mul": 2}),
    "entmax15_loss": ({"empty_like": 1, "empty": 2, "select": 1, "_assert_async": 1},
                      {"ones_like": 1, "select": 1, "mul": 2}),
    "entmax_bisect_loss(alpha=1.3)": ({"empty_like": 1, "empty": 2, "select": 1, "_assert_async": 1},
                                      {"ones_like": 1, "select": 1, "mul": 2}),
}

# label: (forward, backward) Triton launches, exact: a mapping one each; an index loss its kernel
# and the reduction, cross-entropy one more backward (the Tsallis gradient comes from the forward)
LAUNCHES = {"cross_entropy_loss": (2, 1), "sparsemax_loss": (2, 0),
            "entmax15_loss": (2, 0), "entmax_bisect_loss(alpha=1.3)": (2, 0)}

# label: (forward, backward) calls of nmt's own Python functions, each at most (front door,
# dispatch, wrapper, launch cache): the values of 2026-11-28
NMT_CALLS = {
    "sparsemax": (31, 18), "entmax15": (31, 18), "entmax15, 4-D scores": (31, 18),
    "entmax_bisect(alpha=1.5)": (35, 18), "entmax_bisect(alpha=1.3)": (36, 18),
    "entmax_bisect(learned alpha)": (49, 25), "entmax_bisect_above_one(learned)": (49, 25),
    "cross_entropy_loss": (35, 16), "sparsemax_loss": (41, 1), "entmax15_loss": (41, 1),
    "entmax_bisect_loss(alpha=1.3)": (43, 1),
}


@pytest.fixture(scope="module")
def counted(stand_in_env):
    """``tools/host_ops.py``'s counts by label, from a fresh process with a compiling Triton (the
    stand-in driver compiles for sm_90). Skipped without Triton >= 3.3 and its NVIDIA backend."""
    env = stand_in_env(TRITON_DEFAULT_FP_FUSION="1")
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT / "tools")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    line = [s for s in out.stdout.splitlines() if s.startswith("JSON ")]
    assert line, out.stdout[-2000:]
    return {r["label"]: r for r in json.loads(line[-1][5:])}


def _over(got: dict, bound: dict) -> dict:
    """Operators dispatched more often than ``bound`` allows (those it does not name: 0)."""
    return {name: (n, bound.get(name, 0)) for name, n in got.items() if n > bound.get(name, 0)}


def test_every_front_door_is_counted(counted):
    assert set(counted) == set(OPS)


@pytest.mark.parametrize("label", list(OPS))
def test_operators_per_call(label, counted):
    """Each front door's forward and backward dispatch at most the operators named in OPS (by
    name and count; torch's references exactly theirs)."""
    r = counted[label]
    fwd, bwd = OPS[label]
    if label in ("softmax", "softmax, 4-D scores", "F.cross_entropy"):  # the counter counts what torch is known to dispatch
        assert r["fwd_op_names"] == fwd and r["bwd_op_names"] == bwd, r
        return
    assert not _over(r["fwd_op_names"], fwd), (label, "forward: (count, bound)", _over(r["fwd_op_names"], fwd))
    assert not _over(r["bwd_op_names"], bwd), (label, "backward: (count, bound)", _over(r["bwd_op_names"], bwd))
    assert r["fwd_ops"] <= sum(fwd.values()) and r["bwd_ops"] <= sum(bwd.values())


@pytest.mark.parametrize("label", list(NMT_CALLS))
def test_launches_and_python_calls_per_call(label, counted):
    """One launch per mapping forward and backward (losses: see LAUNCHES); nmt's own Python calls
    at most NMT_CALLS (every call in the route costs the host; torch's and Triton's calls vary
    with their versions and are not pinned)."""
    r = counted[label]
    assert (r["fwd_launches"], r["bwd_launches"]) == LAUNCHES.get(label, (1, 1)), r
    fwd, bwd = NMT_CALLS[label]
    assert r["fwd_nmt_calls"] <= fwd and r["bwd_nmt_calls"] <= bwd, (label, r["fwd_nmt_calls"], r["bwd_nmt_calls"])


def test_the_front_doors_dispatch_no_more_operators_than_torch(counted):
    """The issue's target in operators: a mapping's forward+backward no more than softmax's, an
    index loss's no more than ``F.cross_entropy``'s plus one (the range check's flag view)."""
    def ops(label: str) -> int:
        return counted[label]["fwd_ops"] + counted[label]["bwd_ops"]

    for label in ("sparsemax", "entmax15", "entmax15, 4-D scores", "entmax_bisect(alpha=1.5)",
                  "entmax_bisect(alpha=1.3)"):
        assert ops(label) <= ops("softmax"), label
    for label in ("cross_entropy_loss", "sparsemax_loss", "entmax15_loss", "entmax_bisect_loss(alpha=1.3)"):
        assert ops(label) <= ops("F.cross_entropy") + 2, label
