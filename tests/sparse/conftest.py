"""Independent oracles for the mapping tests: KKT certificates and a generic convex solver."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

def kkt_violation(p: torch.Tensor, x: torch.Tensor, alpha: float) -> float:
    """Largest violation of the optimality conditions of alpha-entmax (alpha > 1), last dim.

    ``p`` solves ``max <x, p> - Omega_alpha(p)`` on the simplex iff ``p >= 0``, ``sum p = 1`` and
    there is ``tau`` with ``p_i^(alpha-1) = (alpha-1) x_i - tau`` on the support and
    ``(alpha-1) x_i <= tau`` off it. ``tau`` is estimated from the support and checked.
    """
    p, x = p.double(), x.double()
    am1 = alpha - 1
    supp = p > 0
    z = am1 * x
    taus = torch.where(supp, z - p.clamp(min=0) ** am1, torch.nan)
    tau = taus.nanmean(dim=-1, keepdim=True)
    v_supp = torch.where(supp, (taus - tau).abs(), 0).amax(dim=-1)
    v_off = torch.where(~supp & (x > -np.inf), (z - tau).clamp(min=0), 0).amax(dim=-1)
    v_sum = (p.sum(dim=-1) - 1).abs()
    v_neg = (-p).clamp(min=0).amax(dim=-1)
    return float(torch.stack([v_supp, v_off, v_sum, v_neg]).max())


def solve_generic(x: np.ndarray, alpha: float) -> np.ndarray:
    """alpha-entmax of one short vector by a generic constrained solver (scipy SLSQP)."""
    from scipy.optimize import minimize

    n = len(x)

    def objective(p):
        p = np.clip(p, 0, None)
        if alpha == 1:
            reg = np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0))
        else:
            reg = (np.sum(p ** alpha) - 1) / (alpha * (alpha - 1))
        return -(x @ p) + reg

    res = minimize(objective, np.full(n, 1.0 / n), method="SLSQP", bounds=[(0, 1)] * n,
                   constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1}],
                   options={"ftol": 1e-14, "maxiter": 500})
    return res.x


@pytest.fixture
def ref():
    """The reference package ``entmax`` (an oracle only); skips the test when absent."""
    return pytest.importorskip("entmax")


@pytest.fixture(scope="session")
def kkt():
    """``kkt(p, x, alpha) -> float``: largest violation of alpha-entmax's optimality conditions."""
    return kkt_violation


@pytest.fixture
def generic_solver():
    """``solve(x: np.ndarray, alpha) -> np.ndarray``: alpha-entmax by scipy SLSQP."""
    pytest.importorskip("scipy")
    return solve_generic


@pytest.fixture
def compiled_vs_eager():
    """``run(total, x, alpha) -> (operators, (compiled, eager) losses, x-gradients, alpha-gradients)``:
    ``total`` (a scalar function of the scores that also uses the leaf ``alpha``) compiled with
    ``fullgraph=True`` (aot_eager: dynamo and AOT autograd, no code generation), run forward and
    backward next to eager mode; ``operators`` are the ``nmt::`` custom operators its dynamo
    graphs call (autograd Functions' subgraphs included), in order. torch._dynamo is imported
    here, not at collection: it imports triton, which test_triton.py must import first (in the
    interpreter's mode)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def run(total, x, alpha):
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(total, fullgraph=True, dynamic=False, backend=counter)
        xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        lc = compiled(xc)
        lc.backward()
        gc, alpha.grad = alpha.grad.clone(), None
        le = total(xe)
        le.backward()
        assert counter.frame_count == 1
        ops = [str(n.target) for gm in counter.graphs for mod in gm.modules() if hasattr(mod, "graph")
               for n in mod.graph.nodes if str(n.target).startswith("nmt.")]
        torch._dynamo.reset()
        return ops, (lc, le), (xc.grad, xe.grad), (gc, alpha.grad)

    return run


@pytest.fixture(scope="session")
def native_variant(tmp_path_factory):
    """``variant(*defines) -> ctypes.CDLL``: the native library compiled with the preprocessor names
    ``defines`` (``NMT_NO_AVX512``, ``NMT_NO_AVX2``, ``NMT_ROWS_ONLY``, ``NMT_POWER_COUNTS``, ...; empty
    names left out), built
    once a session into a directory of its own and loaded: every test module asking for a variant
    gets the same build (a compiler run costs 1.5-4 s; nine modules asked for three each). The
    handle is shared, so a test that reads a build's global counters (``nmt_power_counts``) sets
    them to zero first. Callers skip first where there is no compiler or library."""
    from nmt.sparse import _native

    built: dict = {}

    def variant(*defines: str):
        defines = tuple(d for d in defines if d)  # ("": none, as FLOAT_PASS_BUILDS' full build)
        if defines not in built:
            built[defines] = _native.load(_native.build(tmp_path_factory.mktemp("-".join(defines)),
                                                        defines=list(defines)))
        return built[defines]

    return variant


@pytest.fixture(scope="module", params=["default", "NMT_NO_AVX512", "NMT_NO_AVX2", "NMT_ROWS_ONLY"])
def native_build(request, native_variant):
    """The native library as built for this machine, then built without its 512-bit vector paths
    (``NMT_NO_AVX512``), without its 256- and 512-bit ones (``NMT_NO_AVX2``) and without vectors
    (``NMT_ROWS_ONLY``): every path the C code can take (the wide ones where this processor has
    them). The narrower builds come from :func:`native_variant` (built once a session)."""
    from nmt.sparse import _native

    if not _native.available():
        pytest.skip("native library not built")
    if request.param == "default":
        return _native.library()
    return native_variant(request.param)


def _subprocess_env(**extra: str) -> dict:
    out = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [out.get("PYTHONPATH")] if p])
    out.update(extra)
    return out


@pytest.fixture
def subprocess_env():
    """``env(**extra)``: this process's environment for a fresh Python subprocess, without
    ``TRITON_INTERPRET`` (a compiling Triton unless ``extra`` sets it), the repository first on
    ``PYTHONPATH``, then ``extra``."""
    return _subprocess_env


@pytest.fixture(scope="session")
def stand_in_env():
    """``subprocess_env``'s ``env(**extra)`` for a script that runs the stand-in driver of
    ``tools/stand_in_driver.py`` (kernels compiled for sm_90, launches counted); skips the test
    without Triton >= 3.3 and its NVIDIA backend (the stand-in compiles for sm_90; nmt's launch
    cache needs 3.3's launcher layout)."""
    pytest.importorskip("triton")
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("triton without its NVIDIA backend")
    try:
        import triton.knobs  # noqa: F401  (Triton >= 3.3)
    except ImportError:
        pytest.skip("Triton < 3.3: the kernels keep Triton's own launch")
    return _subprocess_env
