"""The Triton kernels of nmt.sparse._triton: on CUDA when present, else on CPU in the interpreter.

``TRITON_INTERPRET=1`` must be set when ``triton.language`` is first imported (its library
functions are built for the interpreter then). Without CUDA this module imports triton that way
at collection time (restoring the variable at once) and sets the variable around each test. If
triton was imported earlier in the process without it, the module's tests skip and
``test_module_in_fresh_process`` runs this file in a fresh interpreter-mode process instead.
References are computed in float64 by the torch implementation (and the ``entmax`` package on
unmasked rows); gradients are checked against torch autograd of the float64 reference and by
central finite differences. ``test_kernels_compile_for_sm90`` compiles the kernels for an H100
in a subprocess (Triton's compiler and ptxas, no GPU needed): it checks what the interpreter is
lenient about (types of loop-carried values, constexpr use).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA and "triton.language" not in sys.modules:
    _old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401  (library functions built for the interpreter)
    except ImportError:
        pass
    finally:
        if _old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _old

triton = pytest.importorskip("triton")

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from nmt.sparse import _triton as T  # noqa: E402
from nmt.sparse import entmax15, entmax_bisect, sparsemax  # noqa: E402
from nmt.sparse.entmax import entmax_bisect_above_one  # noqa: E402

# numpy's warnings from the interpreter evaluating masked-out lanes (e.g. log2(0) under a where)
pytestmark = [pytest.mark.filterwarnings(f"ignore:{m}:RuntimeWarning")
              for m in ("invalid value encountered", "divide by zero", "overflow encountered")]
pytestmark.append(pytest.mark.cuda)  # on CUDA the kernels run compiled

INTERPRETED = isinstance(triton.language.standard.max, InterpretedFunction)


def _interpreter_takes_numpy_24_indices() -> None:
    """Triton < 3.7's interpreter turns a scalar kernel argument used as an index (``range(0,
    slots)``) into an int by ``int()`` of its one-element array, which NumPy >= 2.4 refuses
    (triton-lang/triton#9171, fixed in 3.7 by taking ``.squeeze()``); torch 2.11 pins Triton 3.6.
    Only the interpreter is affected (the compiled kernels take the int as it is): the tests give
    the interpreter the fixed conversion. Idempotent; nothing where the interpreter has the fix."""
    import numpy as np
    from triton.runtime import interpreter

    newer = tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 7)
    numpy_24 = tuple(int(v) for v in np.__version__.split(".")[:2]) >= (2, 4)
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if newer or not numpy_24 or patch is None or getattr(patch, "nmt_index", False):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.nmt_index = True
    interpreter._patch_lang_tensor = patched


def _interpreter_patches_the_language_once_a_launch() -> None:
    """Triton's interpreter patches ``triton.language`` for interpretation (``_patch_lang``:
    ``inspect.getmembers`` over tl / tl.core, their tensor class, math, ...) at every launch, and
    again at every call of a jit function from inside a kernel (``InterpretedFunction.__call__``:
    each ``tl.max`` / ``tl.sum`` of every bisection step), where the patches are already in place
    (nothing restores that second scope). That was half of this file's time (cProfile of
    test_fused_index_losses_equal_static[2]: 25 of 53 s in 8,847 patches for 66 launches). Here a
    call of ``_patch_lang`` is skipped (an empty scope) where every attribute that the last real
    patch for the same language modules set still holds the value it set (identity): the
    interpreter's state is then the one the patch would make; otherwise it patches as before. The
    kernels run the same interpreted code; the test below checks that a launch leaves the language
    as the interpreter's own patching does. Idempotent; nothing where the interpreter's patching
    has another form (Triton < 3.7 without ``_LangPatchScope``)."""
    import inspect

    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang", None)
    scope_class = getattr(interpreter, "_LangPatchScope", None)
    if patch is None or scope_class is None or getattr(patch, "nmt_once", False) \
            or not hasattr(scope_class(), "_changes"):
        return
    langs = (triton.language, triton.language.core)
    last: dict = {}  # the language modules a function sees -> [(object, name, value set)]

    def patched(fn):
        key = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in langs)
        done = last.get(key)
        if done is not None and all(getattr(obj, name, None) is value for obj, name, value in done):
            return scope_class()
        scope = patched.nmt_original(fn)  # the interpreter's own
        last[key] = [(obj, name, getattr(obj, name, None)) for obj, name, _ in scope._changes]
        return scope

    patched.nmt_once = True
    patched.nmt_original = patch
    interpreter._patch_lang = patched


if INTERPRETED:
    _interpreter_takes_numpy_24_indices()
    _interpreter_patches_the_language_once_a_launch()
RUNNABLE = ON_CUDA != INTERPRETED  # CUDA with compiled kernels, or CPU with the interpreter
DEVICE = "cuda" if ON_CUDA else "cpu"
NINF = float("-inf")
LENGTHS = (1, 7, 50, 300, 1000)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def device_mode(request):
    """Set ``TRITON_INTERPRET=1`` around each test on CPU; skip where the kernels cannot run here."""
    if request.node.name.startswith(("test_module_in_fresh_process", "test_kernels_compile",
                                     "test_module_imports_without")):
        yield
        return
    if not RUNNABLE:
        pytest.skip("triton was imported without TRITON_INTERPRET=1: see test_module_in_fresh_process")
    old = os.environ.get("TRITON_INTERPRET")
    if not ON_CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
    T._FAILED.clear()  # a kernel's failure (one warning, then torch's code) is its own test's
    yield
    if old is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = old


def test_module_in_fresh_process(subprocess_env):
    """Where this process cannot run the kernels (triton imported before without the
    interpreter, and no CUDA), run this file in a fresh process with ``TRITON_INTERPRET=1``."""
    if RUNNABLE:
        pytest.skip("the kernels run in this process")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          __file__], cwd=ROOT, env=subprocess_env(TRITON_INTERPRET="1"),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_a_launch_patches_the_language_as_the_interpreter_does(monkeypatch):
    """``_interpreter_patches_the_language_once_a_launch``: entmax_bisect(1.3) with the kernels
    (a bisection: many calls of library jit functions from inside the kernel) gives bit-equal
    outputs with the skipping patch and with the interpreter's own patching at every call, run
    first; a launch leaves every attribute of ``triton.language``, its dtype class and its math
    module as it found them (identity: the launch's patches restored) and, with the skipping patch,
    those of its tensor class too (the interpreter's own patching leaves some of tl.core's patches
    of that class behind: added or replaced attributes); and the skipping patch really patches at
    most twice a launch (the launch, the first library call) where the interpreter's own patches at
    every call."""
    from triton.runtime import interpreter

    patch = interpreter._patch_lang
    if not INTERPRETED or not getattr(patch, "nmt_once", False):
        pytest.skip("the kernels run compiled, or the interpreter's patching has another form")
    lang = triton.language
    owners = (lang, lang.tensor, lang.dtype, lang.math)
    x = rows(50)
    real: list = []
    original = patch.nmt_original

    def counted(fn):
        real.append(fn)
        return original(fn)

    outputs = {}
    for mode in ("interpreter", "once"):
        monkeypatch.setattr(interpreter, "_patch_lang", counted if mode == "interpreter" else patch)
        monkeypatch.setattr(patch, "nmt_original", counted)
        before = [dict(vars(owner)) for owner in owners]
        real.clear()
        launches, fn_calls = count_launches_and_calls(lambda: outputs.__setitem__(mode, entmax_bisect(x, 1.3, impl="triton")))
        after = [dict(vars(owner)) for owner in owners]
        for owner, was, now in zip(owners, before, after):
            assert was.keys() <= now.keys(), (mode, owner)  # nothing removed
            if mode == "once" or owner is not lang.tensor:
                assert was.keys() == now.keys() and all(was[k] is now[k] for k in was), (mode, owner)
        assert launches >= 1 and fn_calls > 10 * launches, (launches, fn_calls)
        if mode == "interpreter":
            assert len(real) == launches + fn_calls
        else:
            assert len(real) <= 2 * launches, (len(real), launches, fn_calls)
        monkeypatch.undo()
    assert torch.equal(outputs["once"], outputs["interpreter"])


def count_launches_and_calls(run) -> tuple[int, int]:
    """``run()`` with the interpreter's kernel launches (``GridExecutor.__call__``) and calls of
    jit functions from inside kernels (``InterpretedFunction.__call__``) counted."""
    from triton.runtime import interpreter

    counts = [0, 0]
    originals = (interpreter.GridExecutor.__call__, interpreter.InterpretedFunction.__call__)

    def counting(i):
        def call(self, *args, **kwargs):
            counts[i] += 1
            return originals[i](self, *args, **kwargs)
        return call

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(interpreter.GridExecutor, "__call__", counting(0))
        mp.setattr(interpreter.InterpretedFunction, "__call__", counting(1))
        run()
    return counts[0], counts[1]


def rows(n: int, seed: int = 0) -> torch.Tensor:
    """(8, n) float32 on CPU: random, tied, shifted by 1e3, near-uniform, masked, all-masked,
    wide, one dominant entry."""
    g = torch.Generator().manual_seed(seed * 1000 + n)
    x = torch.randn(8, n, generator=g)
    x[0] *= 2
    x[1] = (x[1] * 2).round() / 2  # many exact ties
    x[2] = x[2] + 1e3  # large shift: the threshold is found relative to the row max
    x[3] = x[3] * 1e-3  # near-uniform: the support is (almost) everything
    keep = torch.rand(n, generator=g) < 0.6
    keep[n // 2] = True
    x[4] = x[4].masked_fill(~keep, NINF)
    x[5] = NINF  # all masked
    x[6] = x[6] * 20
    x[7, 0] = 50.0  # one dominant entry
    return x


def run(fn, *args):
    """``fn`` on the kernels' device; results back on the CPU."""
    out = fn(*[a.to(DEVICE) for a in args])
    return tuple(o.cpu() for o in out) if isinstance(out, tuple) else out.cpu()


def ref_forward(kind: str, x: torch.Tensor, alpha: float = 1.5) -> torch.Tensor:
    x = x.double()
    if kind == "sparsemax":
        return sparsemax(x)
    if kind == "entmax15":
        return entmax15(x)
    return entmax_bisect(x, alpha=alpha)


def assert_matches(p: torch.Tensor, ref: torch.Tensor, atol: float = 1e-6, tiny: float = 0.0) -> None:
    """Values within ``atol``; zeros at the same positions, except entries below ``tiny`` in the
    reference (alpha-entmax: GPUs flush float32 denormals to zero in the kernel's exp2)."""
    err = (p.double() - ref).abs().max().item() if p.numel() else 0.0
    assert err <= atol, f"max abs error {err:.3g} > {atol}"
    assert torch.equal(p > 0, ref > 0) if tiny == 0 else (
        torch.equal(p[ref == 0] > 0, ref[ref == 0] > 0) and (p[ref > tiny] > 0).all()), \
        "zeros at different positions"


def forward_ok(x: torch.Tensor, mode: int, alpha=None):
    """Kernel output and the per-row in-kernel verification flag (1: exact closed form verified)."""
    args = (x,) if alpha is None else (x, alpha)
    return run(lambda *a: T._forward(a[0], mode, a[1] if len(a) > 1 else None, with_ok=True), *args)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
def test_exact_forward_matches_float64_reference(kind, n):
    x = rows(n)
    p, ok = forward_ok(x, T._SPARSEMAX if kind == "sparsemax" else T._ENTMAX15)
    assert torch.equal(p, run(T.sparsemax_forward if kind == "sparsemax" else T.entmax15_forward, x))
    assert p.dtype == torch.float32 and p.shape == x.shape
    assert_matches(p, ref_forward(kind, x))
    assert (p[5] == 0).all()  # all-masked row: zeros, as the torch path
    assert (p[4][x[4] == NINF] == 0).all()  # masked entries: exact zeros
    assert torch.allclose(p[[0, 1, 2, 3, 4, 6, 7]].double().sum(-1), torch.ones(7, dtype=torch.float64))
    # every non-empty row ended with the closed form verified in the kernel (no fallback)
    assert ok.tolist() == [1, 1, 1, 1, 1, 0, 1, 1]


@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
def test_exact_forward_matches_entmax_package(kind):
    entmax = pytest.importorskip("entmax")
    x = rows(50)[[0, 1, 2, 3, 6, 7]]
    p = run(T.sparsemax_forward if kind == "sparsemax" else T.entmax15_forward, x)
    ref = (entmax.sparsemax if kind == "sparsemax" else entmax.entmax15)(x.double(), dim=-1)
    assert_matches(p, ref)


@pytest.mark.parametrize("n", (1, 7, 300))
def test_alpha_forward_per_row_alphas(n):
    """One call, one alpha per row: 1 (softmax), 1.25, 1.5, 2, 3 on every kind of row (length 1:
    a finite and an all-masked row)."""
    alphas = (1.0, 1.25, 1.5, 2.0, 3.0)
    kinds = [0, 5] if n == 1 else list(range(8))
    base = rows(n)[kinds]
    r = len(kinds)
    x = base.repeat(len(alphas), 1)
    a = torch.tensor(alphas).repeat_interleave(r)
    p, ok = forward_ok(x, T._ALPHA, a)
    assert torch.equal(p, run(T.entmax_forward, x, a))
    nonempty = [int(k != 5) for k in kinds]
    for i, alpha in enumerate(alphas):
        blk = slice(r * i, r * i + r)
        if alpha == 1:  # softmax: no exact zeros but the masked ones (float32 underflow aside)
            ref = torch.softmax(x[blk].double(), -1).nan_to_num(0.0)
            assert (p[blk] - ref).abs().max() <= 1e-6
            assert torch.equal(p[blk] == 0, (ref == 0) | ((p[blk] == 0) & (ref < 1e-30)))
        else:
            assert_matches(p[blk], ref_forward("bisect", x[blk], alpha),
                           tiny=0.0 if alpha in (1.5, 2.0) else 1e-30)
        if alpha in (1.5, 2.0):  # exact finish, verified in the kernel
            assert ok[blk].tolist() == nonempty
    # alpha = 1.5 / 2 rows agree with the dedicated exact kernels (up to float32 rounding: the
    # Newton iterates before the verified closed form differ)
    assert_matches(p[2 * r:3 * r], run(T.entmax15_forward, base).double(), atol=2e-7)
    assert_matches(p[3 * r:4 * r], run(T.sparsemax_forward, base).double(), atol=2e-7)


def test_alpha_forward_matches_entmax_package():
    entmax = pytest.importorskip("entmax")
    x = rows(50)[[0, 1, 3, 6, 7]]
    for alpha in (1.25, 1.5, 2.0, 3.0):
        p = run(T.entmax_forward, x, torch.full((x.shape[0],), alpha))
        ref = entmax.entmax_bisect(x.double(), alpha=alpha, dim=-1, n_iter=100)
        assert_matches(p, ref / ref.sum(-1, keepdim=True), tiny=0.0 if alpha in (1.5, 2.0) else 1e-30)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes_computed_in_float32_returned_in_input_dtype(dtype):
    x = rows(50).to(dtype)
    for fwd, kind in ((T.sparsemax_forward, "sparsemax"), (T.entmax15_forward, "entmax15")):
        p = run(fwd, x)
        assert p.dtype == dtype
        tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float64: 1e-6}[dtype]
        assert (p.double() - ref_forward(kind, x.float())).abs().max() <= tol
        same = run(fwd, x.float()).to(dtype)  # the float32 result, cast by torch
        if dtype == torch.bfloat16:  # the interpreter's cast may round differently: one ulp
            assert ((p.float() - same.float()).abs() <= same.float().abs() * 2 ** -7).all()
        else:
            assert torch.equal(p, same)


SMOOTH = [0, 2, 3, 4, 5, 6, 7]
"""Rows of :func:`rows` where finite differences apply (the tied row 1 can put an entry exactly
on the threshold, a kink: e.g. sparsemax of (2, 1, ...) with the threshold 1)."""


def assert_close_scaled(dx: torch.Tensor, ref: torch.Tensor, rtol: float = 2e-5) -> None:
    """Per row, ``max |dx - ref| <= rtol * max(1, max |ref|)`` (alpha > 2 has large, ill-conditioned
    gradients near the support's edge: float32 ``p`` gives them to a relative precision)."""
    err = (dx.double() - ref).abs().amax(-1)
    bound = rtol * ref.abs().amax(-1).clamp(min=1)
    assert (err <= bound).all(), (err, bound)


def _ref_vjp(kind: str, x: torch.Tensor, g: torch.Tensor, alpha: float = 1.5) -> torch.Tensor:
    x64 = x.double().requires_grad_()
    p = torch.softmax(x64, -1) if kind == "softmax" else ref_forward(kind, x64, alpha)
    (dx,) = torch.autograd.grad(p, x64, g.double())
    return dx.nan_to_num(0.0)


def _fd_vjp_dot(kind: str, x: torch.Tensor, g: torch.Tensor, v: torch.Tensor, alpha: float = 1.5,
                h: float = 1e-7) -> torch.Tensor:
    """Per row ``<g, (f(x + h v) - f(x - h v)) / 2h>``, f the float64 reference: ``<J^T g, v>``."""
    x64, v64 = x.double(), v.double()
    plus, minus = ref_forward(kind, x64 + h * v64, alpha), ref_forward(kind, x64 - h * v64, alpha)
    return ((plus - minus) / (2 * h) * g.double()).sum(-1)


@pytest.mark.parametrize("n", (1, 7, 300))
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
def test_exact_backward(kind, n):
    x = rows(n, seed=1)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(n))
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(n + 1))
    if kind == "sparsemax":
        p = run(T.sparsemax_forward, x)
        dx = run(T.sparsemax_backward, p, g)
    else:
        p = run(T.entmax15_forward, x)
        dx = run(T.entmax15_backward, p, g)
        assert torch.allclose(dx, run(T.entmax_backward, p, g, torch.full((8,), 1.5)), atol=1e-6)
    assert dx.dtype == torch.float32
    assert_close_scaled(dx, _ref_vjp(kind, x, g))
    assert (dx[5] == 0).all() and (dx[x == NINF] == 0).all()
    fd = _fd_vjp_dot(kind, x, g, v)[SMOOTH]
    got = (dx.double() * v.double()).sum(-1)[SMOOTH]
    assert torch.allclose(got, fd, rtol=1e-4, atol=1e-4), (got, fd)


@pytest.mark.parametrize("alpha", [1.0, 1.25, 2.0, 3.0])
def test_alpha_backward(alpha):
    x = rows(50, seed=2)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    a = torch.full((x.shape[0],), alpha)
    p = run(T.entmax_forward, x, a)
    dx = run(T.entmax_backward, p, g, a)
    kind = "softmax" if alpha == 1 else "bisect"
    assert_close_scaled(dx, _ref_vjp(kind, x, g, alpha))
    assert (dx[5] == 0).all()
    if alpha == 2.0:
        assert torch.allclose(dx, run(T.sparsemax_backward, p, g), atol=1e-6)
    if alpha > 1:
        fd = _fd_vjp_dot("bisect", x, g, v, alpha)[SMOOTH]
        got = (dx.double() * v.double()).sum(-1)[SMOOTH]
        assert torch.allclose(got, fd, rtol=1e-4, atol=1e-4), (got, fd)


@pytest.mark.parametrize("n", [7, 50, 300])
def test_alpha_backward_with_the_alpha_gradient(n):
    """``entmax_backward_alpha``: the scores' gradient equals ``entmax_backward``'s (the same
    source; compiled for a GPU, to a rounding), and the alpha-gradient per row, computed in the same launch, equals torch's formula
    (``_alpha_grad``) in float64 at the same ``p``, and finite differences of the forward kernel
    in alpha on smooth rows; a row holding NaN gives NaN, an all-masked row 0."""
    from nmt.sparse.entmax import _alpha_grad

    x = rows(n, seed=5)
    x[1, 0] = float("nan")  # the tied row: its alpha-gradient is NaN
    gen = torch.Generator().manual_seed(9)
    g = torch.randn(x.shape, generator=gen)
    a = 1.05 + 1.9 * torch.rand(x.shape[0], generator=gen)  # alphas in (1.05, 2.95)
    p = run(T.entmax_forward, x, a)
    dx, ga = run(T.entmax_backward_alpha, p, g, a)
    assert ga.shape == (x.shape[0],) and ga.dtype == torch.float32
    # the same source, but two kernels: compiled for a GPU, each contracts its own multiply-adds
    # (seen on an H200: 1-ulp differences); the interpreter (numpy) gives equal values
    tol = dict(rtol=0, atol=0) if INTERPRETED else dict(rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(dx, run(T.entmax_backward, p, g, a), **tol)
    ref = _alpha_grad(p.double(), a.double()[:, None], g.double())[:, 0]
    assert torch.isnan(ga[1]) and torch.isnan(ref[1]) and ga[5] == 0
    finite = [i for i in range(x.shape[0]) if i != 1]
    assert torch.allclose(ga[finite].double(), ref[finite], rtol=1e-4, atol=1e-5), (ga, ref)
    h = 1e-5  # central differences of <g, p(alpha)> in alpha, float64 reference mapping (near-flat rows
    # change support quickly with alpha: 1e-3 is 6% off on the near-uniform row)
    for i in SMOOTH:
        if i == 5:
            continue
        up = ref_forward("bisect", x[i:i + 1].double(), float(a[i]) + h)
        down = ref_forward("bisect", x[i:i + 1].double(), float(a[i]) - h)
        fd = float(((up - down) * g[i].double()).sum() / (2 * h))
        assert abs(float(ga[i]) - fd) <= 2e-3 * max(1.0, abs(fd)), (i, float(ga[i]), fd)


def test_nan_rows():
    """A NaN or +inf score, or an alpha < 1, NaN or +inf, makes its row NaN (as the static torch path);
    the other rows are unaffected."""
    x = rows(7)
    x[0, 2], x[1, 3] = float("nan"), float("inf")
    for fwd in (T.sparsemax_forward, T.entmax15_forward):
        p = run(fwd, x)
        assert p[:2].isnan().all() and not p[2:].isnan().any()
        assert torch.equal(p[2:], run(fwd, x[2:]))
    a = torch.tensor([1.5, 1.5, 0.5, float("nan"), 1.5, 1.0, 2.0, 3.0])
    p = run(T.entmax_forward, x, a)
    assert p[:4].isnan().all() and not p[4:].isnan().any()
    a[4] = float("inf")  # (uniform rows, were it computed: the static path's NaN row too)
    p = run(T.entmax_forward, x, a)
    assert p[:5].isnan().all() and not p[5:].isnan().any()


def test_empty_shapes_and_bad_input():
    for fwd in (T.sparsemax_forward, T.entmax15_forward):
        assert run(fwd, torch.zeros(0, 5)).shape == (0, 5)
        assert run(fwd, torch.zeros(3, 0)).shape == (3, 0)
    with pytest.raises(ValueError, match="at least one dim"):
        run(T.sparsemax_forward, torch.zeros(()))
    with pytest.raises(ValueError, match="one alpha per row"):
        run(T.entmax_forward, torch.zeros(2, 3), torch.ones(3))
    with pytest.raises(ValueError, match="broadcastable"):
        run(T.entmax_forward, torch.zeros(2, 3, 4), torch.ones(3, 1, 1))
    with pytest.raises(ValueError, match="same shape"):
        run(T.sparsemax_backward, torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="limit"):
        run(T.sparsemax_forward, torch.zeros(1, T.MAX_N + 1))


def test_is_available():
    assert T.is_available(torch.zeros(2, 3, device=DEVICE))
    assert T.is_available(torch.zeros(4, T.MAX_N, device=DEVICE))
    assert not T.is_available(torch.zeros(1, T.MAX_N + 1, device=DEVICE))
    assert not T.is_available(torch.zeros(2, 3, dtype=torch.long, device=DEVICE))
    os.environ["TRITON_INTERPRET"] = "0"  # restored by the fixture
    assert not T.is_available(torch.zeros(2, 3))  # CPU without the interpreter
    with pytest.raises(ValueError, match="CUDA"):
        T.sparsemax_forward(torch.zeros(2, 3))


def test_module_imports_without_triton(monkeypatch):
    """A fresh copy of the module, with triton unimportable, imports and reports unavailable."""
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.spec_from_file_location("_triton_without_triton", T.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert not mod.is_available(torch.zeros(2, 3))
    with pytest.raises(RuntimeError, match="needs triton"):
        mod.sparsemax_forward(torch.zeros(2, 3))


def test_wrappers_do_not_sync(monkeypatch):
    """Everything around the launch is free of host-synchronising calls, and the grid depends on
    the shape only (the launch itself is replaced: the interpreter copies to the host by design)."""
    from nmt.utils.sync_audit import SyncAudit

    launches = []

    class Launcher:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((grid, kwargs["BLOCK"]))
            return launch

    fake = type("K", (), {"forward": Launcher(), "backward": Launcher()})()
    monkeypatch.setattr(T, "_kernels", lambda x=None: fake)
    x, a = torch.randn(6, 300, device=DEVICE), torch.full((6,), 1.3, device=DEVICE)
    with SyncAudit() as audit:
        T.sparsemax_forward(x), T.entmax15_forward(x), T.entmax_forward(x, a)
        T.sparsemax_backward(x, x), T.entmax_backward(x, x, a)
    assert audit.total == 0, audit.report()
    assert launches == [((6,), 512)] * 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_front_doors_with_impl_triton_equal_static(dtype):
    """sparsemax / entmax15 / entmax_bisect(impl="triton") run the kernels (forward and backward)
    and agree with impl="static": 3-D input along dim=1, a mask with an all-masked row."""
    from nmt.sparse import _dispatch

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 9, 3, generator=g) * 2).to(dtype)
    mask = torch.rand(2, 9, 3, generator=g) < 0.7
    mask[0, :, 1] = False
    mask[1, 4, 2] = True
    grad = torch.randn(2, 9, 3, generator=g).to(dtype)
    fronts = {"sparsemax": lambda t, **k: sparsemax(t, dim=1, mask=mask.to(t.device), **k),
              "entmax15": lambda t, **k: entmax15(t, dim=1, mask=mask.to(t.device), **k),
              "bisect1.3": lambda t, **k: entmax_bisect(t, 1.3, dim=1, mask=mask.to(t.device), **k),
              "bisect1.5": lambda t, **k: entmax_bisect(t, 1.5, dim=1, mask=mask.to(t.device), **k),
              "bisect2": lambda t, **k: entmax_bisect(t, 2.0, dim=1, mask=mask.to(t.device), **k)}
    atol = 1e-6 if dtype == torch.float32 else 1e-2
    for name, f in fronts.items():
        out = {}
        for impl in ("static", "triton"):
            xi = x.to(DEVICE).clone().requires_grad_()
            p = f(xi, impl=impl)
            p.backward(grad.to(DEVICE))
            out[impl] = (p.detach().cpu(), xi.grad.cpu())
        (ps, gs), (pt, gt) = out["static"], out["triton"]
        assert pt.dtype == dtype
        assert_matches(pt.float(), ps.double(), atol, tiny=1e-30 if name == "bisect1.3" else 0.0)
        assert torch.allclose(gt.float(), gs.float(), atol=10 * atol), name
        assert (pt[0, :, 1] == 0).all() and (gt[0, :, 1] == 0).all()
    assert _dispatch.resolve_impl("triton", x.to(DEVICE)) == "triton"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_reach_the_kernels_without_casts(dtype, monkeypatch):
    """impl="triton" with float16 / bfloat16 scores: the kernels get the half tensor itself (no
    upcast before, no downcast after: the mapping's own node is the output's grad_fn), and
    the result is the float32 route's rounded to the input dtype (one ulp apart at most: the
    interpreter's cast may round otherwise); gradients within the half dtype's rounding of the
    float32 route's; a learnable alpha's gradient is summed in float32."""
    from nmt.sparse import _dispatch

    seen = []
    for name in ("sparsemax_forward", "entmax15_forward", "entmax_forward", "entmax_forward_scalar"):
        original = getattr(T, name)
        monkeypatch.setattr(T, name, lambda *a, _f=original: seen.append(a[0].dtype) or _f(*a))
    g = torch.Generator().manual_seed(11)
    x32 = torch.randn(6, 40, generator=g) * 2
    grad32 = torch.randn(6, 40, generator=g)
    fronts = {"sparsemax": lambda t: sparsemax(t, impl="triton"),
              "entmax15": lambda t: entmax15(t, impl="triton"),
              "bisect1.3": lambda t: entmax_bisect(t, 1.3, impl="triton")}
    ulp = torch.finfo(dtype).eps
    for name, f in fronts.items():
        seen.clear()
        xh = x32.to(dtype).to(DEVICE).requires_grad_()
        ph = f(xh)
        assert seen == [dtype] and ph.dtype == dtype, (name, seen)
        assert "ToCopy" not in ph.grad_fn.name(), ph.grad_fn.name()
        xf = x32.to(dtype).float().to(DEVICE).requires_grad_()  # the same scores, upcast
        pf = f(xf)
        assert torch.allclose(ph.float(), pf.to(dtype).float(), rtol=ulp, atol=0), name
        assert ((ph == 0) == (pf == 0)).all(), name  # the same support
        ph.backward(grad32.to(dtype).to(DEVICE))
        pf.backward(grad32.to(dtype).float().to(DEVICE))
        assert torch.allclose(xh.grad.float(), xf.grad, rtol=4 * ulp, atol=4 * ulp * xf.grad.abs().max()), name
    alpha = torch.tensor([[1.2], [1.5], [2.0], [1.0], [1.7], [3.0]], device=DEVICE, requires_grad=True)
    alpha32 = alpha.detach().clone().requires_grad_()
    ph = entmax_bisect(x32.to(dtype).to(DEVICE), alpha, impl="triton")
    pf = entmax_bisect(x32.to(dtype).float().to(DEVICE), alpha32, impl="triton")
    (ph.float() * grad32.to(DEVICE)).sum().backward()
    (pf * grad32.to(DEVICE)).sum().backward()
    assert alpha.grad.dtype == torch.float32
    assert torch.allclose(alpha.grad, alpha32.grad, rtol=0.01, atol=0.01), (alpha.grad, alpha32.grad)
    assert _dispatch.resolve_impl("triton", x32.to(dtype).to(DEVICE)) == "triton"


def test_learnable_alpha_with_impl_triton():
    """A per-row tensor alpha (rows at 1: softmax): the kernels for the scores' gradient, torch
    for alpha's; both equal the static path's."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 30, generator=g)
    grad = torch.randn(4, 30, generator=g)
    out = {}
    for impl in ("static", "triton"):
        alpha = torch.tensor([[1.0], [1.3], [1.5], [2.5]], device=DEVICE, requires_grad=True)
        xi = x.to(DEVICE).clone().requires_grad_()
        p = entmax_bisect(xi, alpha, impl=impl)
        p.backward(grad.to(DEVICE))
        out[impl] = (p.detach().cpu(), xi.grad.cpu(), alpha.grad.cpu())
    for a, b in zip(out["static"], out["triton"]):
        assert torch.allclose(a, b, atol=2e-5), (a, b)


def test_learnable_head_alphas_with_impl_triton_take_no_extra_graph_nodes():
    """The adaptive heads' layout: scores (B, H, T, S), one learnable alpha per head (1, H, 1, 1),
    a key mask. The kernels' values and both gradients equal the static path's, and between the
    mapping's node and alpha the graph holds nothing but the caller's own view: the kernels read
    the per-head alpha where it lies (no expand, copy, view, permute or cast of the already-last,
    already-float32 alpha: each an operation and an autograd node, host time on an accelerator),
    and autograd sums the per-row alpha gradients over B and T."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, 2, 5, 9, generator=g) * 2
    grad = torch.randn(3, 2, 5, 9, generator=g)
    mask = torch.ones(3, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., 6:] = False
    out = {}
    for impl in ("static", "triton"):
        alpha = torch.tensor([1.25, 1.8], device=DEVICE, requires_grad=True)
        xi = x.to(DEVICE).clone().requires_grad_()
        p = entmax_bisect_above_one(xi, alpha.view(1, 2, 1, 1), mask=mask.to(DEVICE), impl=impl)
        if impl == "triton":
            node = p.grad_fn
            assert node.name() == "EntmaxBisectFunctionBackward", node.name()
            to_alpha = node.next_functions[1][0]  # the alpha input's side
            chain = []
            while to_alpha is not None and not hasattr(to_alpha, "variable"):
                chain.append(to_alpha.name())
                to_alpha = to_alpha.next_functions[0][0]
            assert chain == ["ViewBackward0"], chain  # the caller's view only
        p.backward(grad.to(DEVICE))
        out[impl] = (p.detach().cpu(), xi.grad.cpu(), alpha.grad.cpu())
    for a, b in zip(out["static"], out["triton"]):
        assert torch.allclose(a, b, atol=2e-5), (a, b)
    assert (out["triton"][0][1, ..., 6:] == 0).all() and (out["triton"][1][1, ..., 6:] == 0).all()


@pytest.mark.parametrize("n", [7, 300])
def test_losses_with_impl_triton_equal_static(n):
    """The sparse Fenchel-Young losses with impl="triton" (p from the mapping kernel, the conjugate
    from p) equal impl="static" (the thresholds): values and gradients, index targets with
    ignored rows, label smoothing, a distribution target, -inf scores, an all -inf row; a one-hot
    prediction on its target gives exactly 0. (Host syncs: tests/sparse/test_cuda.py on CUDA.)"""
    from nmt.sparse import entmax15_loss, entmax_bisect_loss, sparsemax_loss

    g = torch.Generator().manual_seed(n)
    x = torch.randn(12, n, generator=g) * 3
    x[5, n // 2:] = NINF
    x[7] = NINF  # only -inf: an infinite loss for an index target
    x[9] = NINF
    x[9, 1] = 0.0  # exactly one-hot on class 1
    t = torch.randint(0, max(n // 2, 1), (12,), generator=g)
    t[::4] = -100
    t[9] = 1
    dist = torch.softmax(torch.randn(12, n, generator=g), -1)
    dist[5, n // 2:] = 0
    dist[7] = dist[9] = 0
    dist[7, 0] = dist[9, 1] = 1.0
    dist = dist / dist.sum(-1, keepdim=True)
    losses = {"sparsemax": sparsemax_loss, "entmax15": entmax15_loss,
              "bisect1.3": lambda *a, **k: entmax_bisect_loss(*a, alpha=1.3, **k),
              "bisect1.5": lambda *a, **k: entmax_bisect_loss(*a, alpha=1.5, **k)}
    cases = [(t, {"reduction": "none"}), (t, {"reduction": "none", "label_smoothing": 0.1}),
             (dist, {"reduction": "none"}), (t, {})]
    for name, loss_fn in losses.items():
        for target, kw in cases:
            out = {}
            for impl in ("static", "triton"):
                xi = x.to(DEVICE).clone().requires_grad_()
                loss = loss_fn(xi, target.to(DEVICE), impl=impl, **kw)
                torch.where(loss.isfinite(), loss, 0).sum().backward()
                out[impl] = (loss.detach().cpu(), xi.grad.cpu())
            (ls, gs), (lt, gt) = out["static"], out["triton"]
            assert torch.equal(ls.isinf(), lt.isinf()), (name, kw)
            fin = ls.isfinite()
            assert torch.allclose(lt[fin], ls[fin], atol=1e-5, rtol=1e-5), (name, kw, lt, ls)
            assert torch.allclose(gt, gs, atol=1e-5), (name, kw)
            if loss.dim() and "label_smoothing" not in kw:
                assert lt[9] == 0 and ls[9] == 0, (name, kw)  # one-hot on the target: exactly 0


def test_auto_prefers_kernels_off_cpu_except_float64(monkeypatch):
    """impl="auto" off the CPU takes the kernels where they accept the input, but not for
    float64 (the kernels compute in float32)."""
    from nmt.sparse import _dispatch

    monkeypatch.setattr(_dispatch, "triton_available", lambda x: True)
    assert _dispatch.resolve_impl("auto", torch.empty(2, 3, device="meta")) == "triton"
    assert _dispatch.resolve_impl("auto", torch.empty(2, 3, device="meta", dtype=torch.float64)) == "static"
    assert _dispatch.resolve_impl("auto", torch.empty(2, 3)) == "pruned"


_COMPILE_SCRIPT = """
import triton
from triton.backends import backends
if "nvidia" not in backends:
    print("SKIP: triton without the NVIDIA backend"); raise SystemExit(0)
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from nmt.sparse import _triton as T
from nmt.sparse._triton_launch import CachedLaunch
T._import_triton()
k = T._kernels()  # the triton.jit functions (CachedLaunch holds one as .fn)
k = type("Jitted", (), {name: f.fn if isinstance(f, CachedLaunch) else f
                        for name in T.KERNEL_NAMES for f in [getattr(k, name)]})
target = GPUTarget("cuda", 90, 32)
ptr = {"X": "*bf16", "Y": "*bf16", "A": "*fp32", "OK": "*i32", "CONJ": "*fp32", "ZMAX": "*fp32",
       "T": "*i64", "LOSS": "*fp32", "WORK": "*fp32", "n": "i32", "ignore_index": "i32",
       "smoothing": "fp32", "alpha_all": "fp32", "a_inner": "i32", "a_size": "i32", "loss_at": "i32"}
const = ("MODE", "HAS_OK", "LOSS_MODE", "SMOOTH", "ALPHA_ROWS", "BLOCK", "N_BISECT", "MAX_ITER")
for mode in (T._SPARSEMAX, T._ENTMAX15, T._ALPHA):
    # the mapping (with its flags), the conjugate outputs, the index-target loss without / with smoothing;
    # alpha-entmax with alphas per row (or broadcast) and with one alpha for every row, a number
    for alpha_rows in ((True, False) if mode == T._ALPHA else (False,)):
        for loss_mode, smooth in ((0, False), (1, False), (2, False), (2, True)):
            values = {"MODE": mode, "HAS_OK": loss_mode == 0, "LOSS_MODE": loss_mode, "SMOOTH": smooth,
                      "ALPHA_ROWS": alpha_rows, "BLOCK": 64, "N_BISECT": T.N_BISECT, "MAX_ITER": T.MAX_ITER}
            src = ASTSource(k.forward, {**ptr, **{c: "constexpr" for c in const}}, constexprs=values)
            assert triton.compile(src, target=target, options={"num_warps": T._num_warps(64)}).asm["cubin"]
        for alpha_grad in ((False, True) if mode == T._ALPHA else (False,)):  # with the alpha-gradient
            sig = {"P": "*fp16", "G": "*fp16", "DX": "*fp16", "A": "*fp32", "GA": "*fp32", "n": "i32",
                   "alpha_all": "fp32", "a_inner": "i32", "a_size": "i32", "MODE": "constexpr",
                   "ALPHA_GRAD": "constexpr", "ALPHA_ROWS": "constexpr", "BLOCK": "constexpr"}
            src = ASTSource(k.backward, sig, constexprs={"MODE": mode, "ALPHA_GRAD": alpha_grad,
                                                         "ALPHA_ROWS": alpha_rows, "BLOCK": 64})
            assert triton.compile(src, target=target, options={"num_warps": T._num_warps(64)}).asm["cubin"]
for smooth in (False, True):  # the cross-entropy kernels
    sig = {"X": "*fp32", "T": "*i64", "LOSS": "*fp32", "WORK": "*fp32", "n": "i32", "loss_at": "i32",
           "ignore_index": "i32", "eps": "fp32", "SMOOTH": "constexpr", "BLOCK": "constexpr"}
    src = ASTSource(k.ce_forward, sig, constexprs={"SMOOTH": smooth, "BLOCK": 1024})
    assert triton.compile(src, target=target, options={"num_warps": T._num_warps(1024)}).asm["cubin"]
    sig = {"X": "*bf16", "T": "*i32", "WORK": "*fp32", "G": "*fp32", "DX": "*bf16",
           "n": "i32", "g_stride": "i32", "ignore_index": "i64", "eps": "fp32", "SMOOTH": "constexpr",
           "BLOCK": "constexpr"}
    src = ASTSource(k.ce_backward, sig, constexprs={"SMOOTH": smooth, "BLOCK": 1024})
    assert triton.compile(src, target=target, options={"num_warps": T._num_warps(1024)}).asm["cubin"]
for reduce in T.REDUCTIONS.values():  # the index losses' reduction and check (float32 and float64 losses)
    for loss in ("*fp32", "*fp64"):
        sig = {"LOSS": loss, "WORK": loss, "OUT": loss, "n_rows": "i32", "loss_at": "i32",
               "REDUCE": "constexpr", "BLOCK": "constexpr"}
        src = ASTSource(k.finish, sig, constexprs={"REDUCE": reduce, "BLOCK": 1024})
        assert triton.compile(src, target=target, options={"num_warps": 4}).asm["cubin"]
from nmt.sparse import _triton_candidates as TC  # the search step's candidates
c = TC._kernel()
c = c.fn if isinstance(c, CachedLaunch) else c
sig = {"LP": "*fp32", "OFF": "*fp32", "SUP": "*i32", "UNK": "*i8", "TV": "*fp32", "TI": "*i64", "slots": "i32",
       "V": "i32", "W": "constexpr", "W_PAD": "constexpr", "BLOCK": "constexpr"}
for w, block in ((1, 16), (6, 1024), (17, 1024)):
    src = ASTSource(c, sig, constexprs={"W": w, "W_PAD": max(2, 1 << (w - 1).bit_length()), "BLOCK": block})
    assert triton.compile(src, target=target, options={"num_warps": 4 if block >= 512 else 1}).asm["cubin"]
from nmt.translate import triton_step as TS  # the search step's bookkeeping
u = TS._kernel()
u = u.fn if isinstance(u, CachedLaunch) else u
sig = {"PREV": "*fp32", "UNK": "*i8", "TV": "*fp32", "TI": "*i64", "EX_IN": "*i8", "WHY_IN": "*i64",
       "BEST_IN": "*fp32", "TOP_IN": "*i8", "SCORE": "*fp32", "LIVE": "*fp32", "PARENT": "*i64", "TOKEN": "*i64",
       "EX": "*i8", "WHY": "*i64", "BEST": "*fp32", "TOP": "*i8", "DONE": "*i8", "slots": "i32", "width": "i32",
       "vocab": "i32", "eos": "i32", "penalty": "fp32", "bound": "fp32", "code_nonfinite": "i32",
       "code_pruned": "i32", "K": "constexpr", "K_PAD": "constexpr", "NB": "constexpr", "NB_PAD": "constexpr",
       "S_PAD": "constexpr", "CERTIFY": "constexpr"}
for k_, nb, certify in ((1, 1, True), (5, 2, True), (5, 5, False)):
    values = {"K": k_, "K_PAD": T.pad_pow2(k_, 2), "NB": nb, "NB_PAD": T.pad_pow2(nb, 2),
              "S_PAD": T.pad_pow2(k_, 2), "CERTIFY": certify}
    assert triton.compile(ASTSource(u, sig, constexprs=values), target=target, options={"num_warps": 1}).asm["cubin"]
from nmt.translate import triton_static_mask as TM
u = T.jitted(TM._static_mask_kernel, "t")
u = u.fn if isinstance(u, CachedLaunch) else u
sig = {**{name: "*i8" for name in ("STOPPED", "DONE", "EX_NEW", "EX_OLD", "EX_O", "STOPPED_O")},
       **{name: "*i64" for name in ("TOKEN", "PARENT", "WHY_NEW", "WHY_OLD", "TOKEN_O", "PARENT_O", "WHY_O",
                                     "FLAT_O")},
       **{name: "*fp32" for name in ("SCORE", "LIVE", "SCORE_O", "LIVE_O")}, "SUPPORT": "*i32",
       "SUPPORT_O": "*i32", "rows": "i32", "slots": "i32", "pad": "i32", "K": "constexpr", "K_PAD": "constexpr",
       "BLOCK_R": "constexpr", "HAS_SUPPORT": "constexpr"}
for k_, has_support in ((1, True), (5, True), (5, False)):
    values = {"K": k_, "K_PAD": T.pad_pow2(k_, 2), "BLOCK_R": TM.BLOCK_ROWS, "HAS_SUPPORT": has_support}
    assert triton.compile(ASTSource(u, sig, constexprs=values), target=target, options={"num_warps": 1}).asm["cubin"]
print("OK")
"""


def test_kernels_compile_for_sm90(subprocess_env):
    """Compile every kernel variant for an H100 in a fresh process (no GPU needed), the search
    step's kernels (nmt.sparse._triton_candidates, nmt.translate.triton_step) and the static
    loop's masking (nmt.translate.triton_static_mask) included."""
    out = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], cwd=ROOT,
                         env=subprocess_env(TRITON_DEFAULT_FP_FUSION="1"), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    if out.stdout.startswith("SKIP"):
        pytest.skip(out.stdout.strip())
    assert out.stdout.strip().endswith("OK")


# --- the losses' fused kernels: index targets in one launch, cross-entropy, the conjugate ------

def _loss_rows(n: int, seed: int = 0):
    """(12, n) float32 scores and index targets: ignored rows, -inf scores, a row of only -inf,
    a row exactly one-hot on its target, a target whose score is -inf, a near-uniform row."""
    g = torch.Generator().manual_seed(seed * 100 + n)
    x = torch.randn(12, n, generator=g) * 3
    x[5, n // 2:] = NINF
    x[7] = NINF  # only -inf: an infinite loss for an index target
    x[9] = NINF
    x[9, 1] = 0.0  # exactly one-hot on class 1
    x[10] *= 1e-3
    t = torch.randint(0, max(n // 2, 1), (12,), generator=g)
    t[::4] = -100
    t[9] = 1
    if n > 3:
        x[11, 3] = NINF
        t[11] = 3  # an impossible target
    return x, t


def _tsallis_and_ce():
    from nmt.sparse import cross_entropy_loss, entmax15_loss, entmax_bisect_loss, sparsemax_loss

    return {"cross_entropy": cross_entropy_loss, "sparsemax": sparsemax_loss, "entmax15": entmax15_loss,
            "bisect1.3": lambda *a, **k: entmax_bisect_loss(*a, alpha=1.3, **k),
            "bisect2.5": lambda *a, **k: entmax_bisect_loss(*a, alpha=2.5, **k)}


@pytest.mark.parametrize("n", [2, 7, 300])
def test_fused_index_losses_equal_static(n):
    """Index targets with impl="triton" take one kernel per loss (cross-entropy: its forward and
    backward kernels; Tsallis: the mapping kernel with the loss and gradient p - y in its
    epilogue): values and gradients equal impl="static" (the torch paths) for every reduction,
    ignore_index (default and custom, int32 targets), label smoothing (0.1 and 1), -inf scores,
    a row of only -inf, impossible targets; a one-hot prediction on its target is exactly 0."""
    from nmt.sparse import losses as L

    x, t = _loss_rows(n)
    t_custom = torch.where(t == -100, -1, t).to(torch.int32)
    cases = [(t, {"reduction": "none"}), (t, {"reduction": "none", "label_smoothing": 0.1}),
             (t, {"reduction": "none", "label_smoothing": 1.0}), (t, {}), (t, {"reduction": "sum"}),
             (t_custom, {"ignore_index": -1, "label_smoothing": 0.2})]
    for name, loss_fn in _tsallis_and_ce().items():
        for target, kw in cases:
            out = {}
            for impl in ("static", "triton"):
                xi = x.to(DEVICE).clone().requires_grad_()
                loss = loss_fn(xi, target.to(DEVICE), impl=impl, **kw)
                g = torch.linspace(0.5, 1.5, loss.numel(), device=DEVICE).reshape(loss.shape)
                (loss * g).sum().backward()  # (inf values: the gradient is still p - y)
                out[impl] = (loss.detach().cpu(), xi.grad.cpu())
            (ls, gs), (lt, gt) = out["static"], out["triton"]
            assert lt.dtype == ls.dtype == torch.float32
            assert torch.equal(ls.isinf(), lt.isinf()) and torch.equal(ls.isnan(), lt.isnan()), (name, kw)
            fin = ls.isfinite()
            assert torch.allclose(lt[fin], ls[fin], atol=1e-5, rtol=1e-5), (name, kw, lt, ls)
            assert torch.allclose(gt, gs, atol=1e-5), (name, kw, (gt - gs).abs().max())
            if loss.dim():
                assert lt[7] == float("inf") and (n <= 3 or lt[11] == float("inf")), (name, kw)
                assert lt[4] == 0 and lt[8] == 0 and not gt[4].any() and not gt[8].any()  # ignored
                if "label_smoothing" not in kw:
                    assert lt[9] == 0 and not gt[9].any(), (name, kw)  # one-hot on the target
                assert gt[7, t[7]] == -(1 - kw.get("label_smoothing", 0.0)) * g[7].item()
    assert L._fused_index_function(L.Shannon(), x.to(DEVICE), "triton") is L._CrossEntropyKernelFunction
    assert L._fused_index_function(L.TsallisEntmax15(), x.to(DEVICE), "triton") is L._TsallisKernelFunction
    assert L._fused_index_function(L.Tsallis(1.3, n_iter=5), x.to(DEVICE), "triton") is None


def test_fused_losses_nan_rows():
    """A NaN or +inf score: the row's loss is NaN (cross-entropy: inf where the target's score is
    -inf), as on the torch paths; the other rows are unaffected."""
    x, t = _loss_rows(50)
    x[1, 2], x[2, 3] = float("nan"), float("inf")
    for name, loss_fn in _tsallis_and_ce().items():
        for kw in ({}, {"label_smoothing": 0.1}):
            ls = loss_fn(x.to(DEVICE), t.to(DEVICE), reduction="none", impl="static", **kw).cpu()
            lt = loss_fn(x.to(DEVICE), t.to(DEVICE), reduction="none", impl="triton", **kw).cpu()
            assert lt[1:3].isnan().all() and ls[1:3].isnan().all(), (name, kw)
            assert torch.equal(lt[3:].isinf(), ls[3:].isinf())
            fin = ls[3:].isfinite()
            assert torch.allclose(lt[3:][fin], ls[3:][fin], atol=1e-5, rtol=1e-5), name


@pytest.mark.parametrize("eps", [0.0, 0.15])
def test_cross_entropy_kernels_equal_torch_cross_entropy(eps):
    """The cross-entropy kernels against torch.nn.functional.cross_entropy (float32): values for
    every reduction (label smoothing: ours is KL(y || p) = H(y, p) - H(y)) and gradients, ignored
    rows included; the gradient is softmax - y for any incoming per-row gradient."""
    import torch.nn.functional as F

    from nmt.sparse import cross_entropy_loss

    g = torch.Generator().manual_seed(3)
    x = torch.randn(33, 257, generator=g) * 4
    t = torch.randint(0, 257, (33,), generator=g)
    t[::5] = -100
    n_valid = (t != -100).sum()
    ys = torch.tensor([1 - eps + eps / 257] + [eps / 257] * 256, dtype=torch.float64)
    entropy = float(-(ys * ys.log()).sum()) if eps > 0 else 0.0
    for red in ("mean", "sum", "none"):
        xo, xr = x.to(DEVICE).clone().requires_grad_(), x.clone().requires_grad_()
        ours = cross_entropy_loss(xo, t.to(DEVICE), reduction=red, label_smoothing=eps, impl="triton")
        ref = F.cross_entropy(xr, t, reduction=red, label_smoothing=eps)
        if red == "none":
            ref = torch.where(t == -100, 0, ref - entropy)
        else:
            ref = ref - entropy * (1 if red == "mean" else n_valid)
        torch.testing.assert_close(ours.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-4)
        w = torch.rand(ours.shape, generator=g)
        (ours * w.to(DEVICE)).sum().backward()
        (ref * w).sum().backward()
        torch.testing.assert_close(xo.grad.cpu(), xr.grad, rtol=1e-5, atol=1e-6)


def test_cross_entropy_kernels_direct():
    """The wrappers: the forward writes the loss, log sum exp and the target statistics (rows
    counted, indices out of range counted and never read); the backward takes an expanded
    per-row gradient."""
    x, t = _loss_rows(40)
    t[2] = 40  # out of range
    t[3] = -7  # out of range (not the ignore value)
    n_rows = 12
    loss, work = run(lambda a, b: T.cross_entropy_forward(a, b, -100, 0.0), x, t)
    assert work.shape == (2 + 2 * n_rows,) and loss.shape == (n_rows,)  # factor, flag, status, lse
    assert work[:2].tolist() == [1.0, 0.0]  # "none": factor 1; refused indices
    status = work[2:2 + n_rows]  # 1: counted, 3: counted and refused, 0: ignored
    assert status.tolist() == [0.0 if v == -100 else 3.0 if i in (2, 3) else 1.0 for i, v in enumerate(t.tolist())]
    lse = work[2 + n_rows:]
    ref = torch.logsumexp(x - x.amax(-1, keepdim=True), -1)
    assert torch.allclose(lse[[0, 1, 4]], ref[[0, 1, 4]]) and loss[0] == 0  # row 0 is ignored
    total, work = run(lambda a, b: T.cross_entropy_forward(a, b, -100, 0.0, "mean"), x, t)
    assert work.shape == (2 + 3 * n_rows,) and total.shape == ()  # then the rows' losses
    assert work[0] == torch.tensor(1 / 9) and work[1] == 0  # 9 rows counted (refused included)
    counted = (t != -100) & (torch.arange(12) != 2) & (torch.arange(12) != 3) & loss.isfinite()
    assert torch.equal(work[2 + 2 * n_rows:][counted], loss[counted])
    ok, work = run(lambda a, b: T.cross_entropy_forward(a, b, -100, 0.0, "sum"), x[counted], t[counted])
    assert work[:2].tolist() == [1.0, 1.0] and torch.allclose(ok, loss[counted].sum())
    xs, ts = x.to(DEVICE), t.clamp(0, 39).to(DEVICE)
    loss, work = T.cross_entropy_forward(xs, ts)
    g = torch.full((1,), 0.5, device=DEVICE).expand(12)
    dx = T.cross_entropy_backward(xs, ts, work, g).cpu()
    expected = 0.5 * (torch.softmax(x, -1).nan_to_num(0) - F_one_hot(ts.cpu(), 40))
    assert torch.allclose(dx, expected, atol=1e-6)
    work = work.clone()
    work[0] = 0.25  # one value for every row, times the factor of "mean"
    dx = T.cross_entropy_backward(xs, ts, work, torch.tensor(2.0, device=DEVICE)).cpu()
    assert torch.allclose(dx, expected, atol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        T.cross_entropy_backward(xs, ts, work, g[:3])


def F_one_hot(t: torch.Tensor, n: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(t, n).float()


_OUT_OF_RANGE_SCRIPT = """
import sys, torch
from nmt.sparse import cross_entropy_loss, entmax15_loss
loss_fn = {"cross_entropy": cross_entropy_loss, "entmax15": entmax15_loss}[sys.argv[1]]
x = torch.randn(4, 9, device="cuda")
loss = loss_fn(x, torch.tensor([0, int(sys.argv[2]), 2, -100], device="cuda"), impl="triton")
torch.cuda.synchronize()
print("not refused:", float(loss))
"""


def test_fused_losses_refuse_out_of_range_targets(subprocess_env):
    """An index outside [0, V) that is not ignore_index is refused (the kernels count it): eager
    on the CPU a ValueError, as the torch paths; on CUDA, where reading the count back would
    synchronise, a device-side assertion that fails the next synchronising call (as
    ``F.cross_entropy`` does there). It leaves the CUDA context unusable, so it runs in a fresh
    process per case (on CUDA one case per kernel: 11 s each)."""
    from nmt.sparse import cross_entropy_loss, entmax15_loss

    x = torch.randn(4, 9, device=DEVICE)
    for name, loss_fn in (("cross_entropy", cross_entropy_loss), ("entmax15", entmax15_loss)):
        for bad in (9, -1):
            if DEVICE == "cpu":
                t = torch.tensor([0, bad, 2, -100])
                with pytest.raises(ValueError, match="out of range"):
                    loss_fn(x, t, impl="triton")
                continue
            if (name, bad) not in (("cross_entropy", 9), ("entmax15", -1)):
                continue
            out = subprocess.run([sys.executable, "-c", _OUT_OF_RANGE_SCRIPT, name, str(bad)], cwd=ROOT,
                                 env=subprocess_env(), capture_output=True, text=True, timeout=300)
            assert out.returncode != 0 and "not refused" not in out.stdout, (name, bad, out.stdout)
            said = out.stdout + out.stderr  # the device's assertion message goes to stdout or stderr
            assert "target class index out of range [0, 9)" in said, (name, bad, said[-2000:])
        assert loss_fn(x, torch.tensor([0, -1, 2, 3], device=DEVICE), ignore_index=-1, impl="triton").isfinite()


@pytest.mark.parametrize("max_iter", [None, 1])
@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.3, 2.5])
def test_tsallis_probs_conj_matches_definition(alpha, max_iter, monkeypatch):
    """The conjugate from the mapping kernel equals <x', p> - Omega(p) computed in float64 from the
    kernel's own p (x' = x - max x); zmax is the row maximum (0 for a row without a finite score,
    NaN for a NaN row); exactly 0 for a one-hot row. With the refinement capped at one step most
    rows stay unverified and renormalised: the general form of the conjugate, still equal."""
    x, _ = _loss_rows(300)
    if max_iter is not None:  # no bisection, one refinement step
        monkeypatch.setattr(T, "MAX_ITER", max_iter)
        monkeypatch.setattr(T, "N_BISECT", 0)
        mode = T._tsallis_mode(alpha)
        _, ok = run(lambda a: T._forward(a, mode, None, with_ok=True, alpha=alpha), x)
        assert (ok[:5] == 0).any()  # some rows unverified
    x[6, 4] = float("nan")
    p, conj, zmax = run(lambda a: T.tsallis_probs_conj(a, alpha), x)
    xm = x.masked_fill(x.isnan(), NINF).amax(-1, keepdim=True)
    xm = torch.where(xm == NINF, 0, xm)
    pd = p.double()
    zs = torch.where(pd > 0, (x - xm).double(), 0)
    want = (pd * zs).sum(-1) - (pd.pow(alpha).sum(-1) - 1) / (alpha * (alpha - 1))
    ok = torch.ones(12, dtype=torch.bool)
    ok[[6, 7]] = False  # NaN row; the empty row's conjugate is never used
    assert torch.allclose(conj[ok].double(), want[ok], atol=2e-5), (conj, want)
    assert conj[9] == 0 and conj[6].isnan() and zmax[6].isnan() and zmax[7] == 0
    assert torch.equal(zmax[ok], xm[ok, 0])


def test_fused_loss_paths_do_not_sync(monkeypatch):
    """Forward and backward of every loss with impl="triton" (the fused index kernels, and the
    mapping kernel's conjugate for distribution targets), every reduction, smoothing: no
    host-synchronising call around the launches (which are replaced: the interpreter copies to
    the host by design)."""
    from nmt.utils.sync_audit import SyncAudit

    class Launcher:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid):
            if self.name == "finish":  # WORK[:2] = (factor 1, range check passed): else the check
                return lambda *args, **kwargs: args[1][:2].fill_(1.0)  # reads an empty buffer's garbage
            return lambda *args, **kwargs: None

    fake = type("K", (), {name: Launcher(name) for name in T.KERNEL_NAMES})()
    monkeypatch.setattr(T, "_kernels", lambda x=None: fake)
    x, t = _loss_rows(60)
    dist = torch.softmax(torch.randn(12, 60), -1).to(DEVICE)
    x, t = x.to(DEVICE), t.to(DEVICE)
    for name, loss_fn in _tsallis_and_ce().items():
        for target, kw in ((t, {}), (t, {"label_smoothing": 0.1}), (t, {"reduction": "sum"}),
                           (t, {"reduction": "none"}), (dist, {})):
            xs = x.clone().requires_grad_()
            with SyncAudit() as audit:
                loss_fn(xs, target, impl="triton", **kw).sum().backward()
            assert audit.total == 0, (name, kw, audit.report())


def test_cross_entropy_kernel_dispatch(monkeypatch):
    """Cross-entropy takes its kernels for impl="auto" off the CPU and for "triton" where they
    run, never for float64, "static" / "pruned" or while compiling; an impl the kernels cannot
    serve falls back to torch instead of raising."""
    from nmt.sparse import _dispatch, cross_entropy_loss
    from nmt.sparse.losses import _cross_entropy_uses_kernel as uses

    meta = torch.empty(2, 3, device="meta")
    monkeypatch.setattr(_dispatch, "triton_available", lambda x: True)
    assert uses(meta, "auto") and uses(meta, "triton") and not uses(meta, "static")
    assert not uses(meta, "pruned") and not uses(meta.double(), "auto")
    assert not uses(torch.empty(2, 3), "auto")  # CPU: the torch path
    monkeypatch.setattr(_dispatch, "triton_available", lambda x: False)
    assert not uses(meta, "triton")
    x, t = torch.randn(3, 5), torch.tensor([0, 4, -100])
    assert torch.allclose(cross_entropy_loss(x, t, impl="triton"), cross_entropy_loss(x, t))


def test_compiled_graphs_call_the_kernels_as_operators(compiled_vs_eager):
    """While torch.compile traces, impl="triton" (on CUDA: "auto") keeps the kernels: each mapping,
    backward and loss is one ``nmt::triton_*`` operator of a single graph (fullgraph), with the
    values and gradients of the eager kernel calls (the same kernels run: equal to rounding)."""
    from nmt.sparse import cross_entropy_loss, entmax15_loss, entmax_bisect_loss, sparsemax_loss

    impl = "auto" if ON_CUDA else "triton"
    x, t = _loss_rows(40)
    x[7, 0] = 0.0
    x[11, 3] = 0.0  # finite losses only
    x, t = x.to(DEVICE), t.to(DEVICE)
    alpha = torch.full((x.shape[0], 1), 1.3, device=DEVICE, requires_grad=True)
    w = torch.randn(x.shape, device=DEVICE)

    def total(s):
        maps = (sparsemax(s, impl=impl) + entmax15(s, impl=impl) + entmax_bisect(s, 1.2, impl=impl)
                + entmax_bisect(s, alpha, impl=impl))
        losses = (sparsemax_loss(s, t, impl=impl) + entmax15_loss(s, t, label_smoothing=0.1, impl=impl)
                  + entmax_bisect_loss(s, t, alpha=1.3, impl=impl) + cross_entropy_loss(s, t, impl=impl)
                  + cross_entropy_loss(s, t, label_smoothing=0.1, impl=impl))
        return (maps * w).sum() + losses

    ops, losses, x_grads, alpha_grads = compiled_vs_eager(total, x, alpha)
    names = {n.split(".")[1] for n in ops}
    assert names == {f"triton_{k}" for k in (
        "sparsemax_forward", "entmax15_forward", "entmax_forward_scalar", "entmax_forward", "sparsemax_backward",
        "entmax15_backward", "entmax_backward_scalar", "entmax_backward_alpha", "tsallis_index_loss",
        "cross_entropy_forward", "cross_entropy_backward")}
    for (compiled, eager), atol in zip((losses, x_grads, alpha_grads), (1e-5, 1e-6, 1e-6)):
        torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=atol)


def test_kernel_operators_pass_opcheck():
    """Each kernel operator's schema and fake (shape-only) implementation agree with what it
    returns (``torch.library.opcheck``), for float32 and bfloat16 rows."""
    from nmt.sparse._compiled_ops import KERNEL_OPERATORS as K

    for dtype in (torch.float32, torch.bfloat16):
        x = rows(50).to(DEVICE, dtype)
        x[5] = 0.0  # an empty row gives infinite losses; fine, but keep values finite here
        p, g = K.entmax15_forward(x), torch.randn(x.shape, device=DEVICE).to(dtype)
        a = torch.full((x.shape[0],), 1.3, device=DEVICE)
        t = torch.tensor([0, 3, -100, 49, 7, 1, 2, 8], device=DEVICE)
        work = K.cross_entropy_forward(x, t, -100, 0.1, "mean")[1]
        x4, p4, g4 = x.view(2, 4, 1, 50), p.view(2, 4, 1, 50), g.view(2, 4, 1, 50)  # (..., n) rows, per head
        heads = torch.tensor([1.3, 1.6, 2.0, 1.1], device=DEVICE).view(1, 4, 1, 1)
        cases = [(K.sparsemax_forward, (x,)), (K.entmax15_forward, (x,)), (K.entmax_forward, (x, a)),
                 (K.entmax_forward, (x4, heads)), (K.entmax_forward_scalar, (x, 1.3)),
                 (K.sparsemax_backward, (p, g)), (K.entmax15_backward, (p, g)), (K.entmax_backward, (p, g, a)),
                 (K.entmax_backward_scalar, (p, g, 1.3)), (K.entmax_backward_alpha, (p, g, a)),
                 (K.entmax_backward_alpha, (p4, g4, heads)),
                 (K.tsallis_probs_conj, (x, 1.3)), (K.tsallis_index_loss, (x, t, -100, 0.1, 1.5, "none")),
                 (K.tsallis_index_loss, (x, t, -100, 0.0, 1.5, "mean")),
                 (K.cross_entropy_forward, (x, t, -100, 0.1, "none")),
                 (K.cross_entropy_forward, (x, t, -100, 0.1, "sum")),
                 (K.cross_entropy_backward, (x, t, work, torch.ones(8, device=DEVICE), -100, 0.1)),
                 (K.cross_entropy_backward, (x, t, work, torch.ones((), device=DEVICE), -100, 0.1))]
        for op, args in cases:
            torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


# --- the search step's candidates (nmt.sparse._triton_candidates) -------------------------------

def _step_rows(groups: int, slots: int, vocab: int, seed: int):
    """Log-probabilities (groups * slots, vocab) with exact zeros (-inf), exact ties, a NaN and a
    +inf row entry, and prefix scores with a dead slot (-inf)."""
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(groups * slots, vocab, generator=g) * 3, -1)
    lp = lp.masked_fill(lp < -6, NINF)
    lp[0] = (lp[0] * 2).round() / 2  # ties inside a row
    off = torch.randn(groups * slots, generator=g).round() - 3  # ties across rows
    if slots > 1:
        off[1] = NINF  # a slot without a live prefix
    if groups * slots > 3:
        lp[2, vocab // 2] = float("nan")
        lp[3, 0] = float("inf")
    return lp, off


@pytest.mark.parametrize("groups,slots,vocab,width", [(3, 1, 10, 2), (4, 5, 37, 6), (2, 3, 1500, 4),
                                                      (5, 2, 7, 14), (1, 4, 3, 12), (2, 1, 2049, 1)])
def test_step_candidates_kernel_equals_the_torch_passes(groups, slots, vocab, width):
    """The flags, support sizes and best candidates of one pass equal torch's passes: the row
    maximum's NaN / +inf test, the count of finite entries, and a stable descending sort of
    ``offset + log_prob`` with every non-finite candidate -inf (ties in index order)."""
    from nmt.sparse import _triton_candidates as TC

    lp, off = _step_rows(groups, slots, vocab, seed=groups * 7 + vocab)
    support, unknown, values, index = TC.step_candidates(lp.to(DEVICE), off.to(DEVICE), slots, width)
    row_max = lp.amax(-1)
    assert torch.equal(unknown.cpu(), torch.isnan(row_max) | (row_max == float("inf")))
    assert torch.equal(support.cpu(), torch.isfinite(lp).sum(-1).to(torch.int32))
    cand = (off[:, None] + lp).nan_to_num(nan=NINF, posinf=NINF, neginf=NINF).view(groups, slots * vocab)
    expected_values, expected_index = cand.sort(dim=1, descending=True, stable=True)
    assert torch.equal(values.cpu(), expected_values[:, :width])
    assert torch.equal(index.cpu(), expected_index[:, :width])


def test_step_candidates_kernel_declines_what_it_does_not_take():
    from nmt.sparse import _triton_candidates as TC

    lp, off = _step_rows(2, 3, 5, seed=1)
    assert TC.step_candidates(lp.double().to(DEVICE), off.to(DEVICE), 3, 4) is None  # float64: torch's passes
    assert TC.step_candidates(lp.to(DEVICE), off.to(DEVICE), 3, 16) is None  # wider than slots * V
    assert TC.step_candidates(lp.to(DEVICE), off.to(DEVICE), 4, 2) is None  # rows not in groups of slots
    assert TC.step_candidates(lp.to(DEVICE), off.to(DEVICE), 3, TC.MAX_WIDTH + 1) is None


def test_step_candidates_wrapper_does_not_sync(monkeypatch):
    """Around the launch (replaced: the interpreter copies to the host by design) nothing
    synchronises, and the grid (one program per group) and block follow the shapes only."""
    from nmt.sparse import _triton_candidates as TC
    from nmt.utils.sync_audit import SyncAudit

    launches = []

    class Launcher:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((grid, kwargs["W"], kwargs["W_PAD"], kwargs["BLOCK"]))

    monkeypatch.setattr(TC, "_kernel", lambda x=None: Launcher())
    lp, off = _step_rows(4, 5, 3000, seed=2)
    lp, off = lp.to(DEVICE), off.to(DEVICE)
    with SyncAudit() as audit:
        TC.step_candidates(lp, off, 5, 6)
        TC.step_candidates(lp[:5, :40], off[:5], 5, 3)
    assert audit.total == 0, audit.report()
    assert launches == [((4,), 6, 8, 1024), ((1,), 3, 4, 64)]


def test_a_search_kernel_that_fails_to_build_leaves_the_search_to_torch(monkeypatch):
    """A kernel this Triton or device cannot build: one warning, then None at once (the search's
    torch code serves), for each of the search step's two kernels and the static loop's masking."""
    from nmt.sparse import _triton_candidates as TC
    from nmt.translate import triton_static_mask as TM
    from nmt.translate import triton_step
    from nmt.translate.search_step import RowState

    def broken(x=None):
        raise RuntimeError("PassManager::run failed\nmore lines")

    monkeypatch.setattr(T, "_FAILED", {})
    monkeypatch.setattr(TC, "_kernel", broken)
    monkeypatch.setattr(triton_step, "_kernel", broken)
    monkeypatch.setattr(TM, "_kernel", broken)
    lp, off = _step_rows(2, 3, 5, seed=1)
    rows = RowState.start(2, 1, True, torch.device(DEVICE))
    args = (rows.scores, rows.exact.view(2, 1), rows.exact, rows.reason, rows.best_finished, rows.top_finished)
    common = dict(beam_size=1, vocab=5, eos=3, certify=True, penalty=1.0, bound_penalty=1.0, nonfinite_code=4,
                  pruned_code=1)
    top, index = torch.zeros(2, 2, device=DEVICE), torch.zeros(2, 2, dtype=torch.long, device=DEVICE)
    with pytest.warns(RuntimeWarning, match="PassManager::run failed") as warned:
        assert TC.step_candidates(lp.to(DEVICE), off.to(DEVICE), 3, 4) is None
        assert triton_step.step_update(top, index, *args, **common) is None
        assert TM.mask_stopped(*_mask_case(4, 2, 2, True, seed=0), slots=2, pad=0) is None
    assert len(warned) == 3
    monkeypatch.setattr(TC, "_kernel", lambda x=None: pytest.fail("launched again"))
    monkeypatch.setattr(triton_step, "_kernel", lambda x=None: pytest.fail("launched again"))
    monkeypatch.setattr(TM, "_kernel", lambda x=None: pytest.fail("launched again"))
    assert TC.step_candidates(lp.to(DEVICE), off.to(DEVICE), 3, 4) is None
    assert triton_step.step_update(top, index, *args, **common) is None
    assert TM.mask_stopped(*_mask_case(4, 2, 2, True, seed=0), slots=2, pad=0) is None


def test_step_candidates_kernel_can_be_turned_off(monkeypatch):
    from nmt.sparse import _triton_candidates as TC

    lp, off = _step_rows(2, 3, 5, seed=1)
    assert TC.step_candidates(lp.to(DEVICE), off.to(DEVICE), 3, 4) is not None
    monkeypatch.setenv("NMT_TRITON_CANDIDATES", "0")
    assert TC.step_candidates(lp.to(DEVICE), off.to(DEVICE), 3, 4) is None


@pytest.mark.parametrize("beam,n_best", [(1, 1), (3, 3), (5, 2)])
@pytest.mark.parametrize("penalty", ["none", "gnmt"])
@pytest.mark.parametrize("certify", [True, False])
def test_the_step_kernel_gives_the_torch_step(beam, n_best, penalty, certify, monkeypatch):
    """The step's bookkeeping in one launch (nmt.translate.triton_step) against the torch code it
    replaces, from the same candidates (the cases of the native call's test: EOS often chosen,
    finished hypotheses entering the n best, NaN and +inf rows in live and dead slots, GNMT's
    inexact divisions, the first step and later ones): every record, parent, token, score,
    certificate and stop flag bit for bit."""
    import nmt.translate.search_step as step_module
    from nmt.translate import triton_step
    from nmt.translate.search_step import select_step

    sys.path.insert(0, str(ROOT / "tests" / "translate"))
    from test_search_step import assert_same_step, bookkeeping_case

    launched = []

    def kernel(*args, **kwargs):
        out = triton_step.step_update(*args, **kwargs)
        launched.append(out is not None)
        return out

    for seed in range(3):
        case = bookkeeping_case(seed, beam, n_best, penalty, certify, torch.float32, DEVICE)
        monkeypatch.setattr(step_module, "step_update", kernel)  # the CPU (interpreter) takes the kernel
        monkeypatch.setattr(step_module, "triton_step_update", kernel)  # as does CUDA
        fused = select_step(*case)
        monkeypatch.setattr(step_module, "step_update", lambda *args, **kwargs: None)
        monkeypatch.setattr(step_module, "triton_step_update", lambda *args, **kwargs: None)
        assert_same_step(fused, select_step(*case))
    assert launched == [True] * 3


def test_the_step_kernel_declines_what_it_does_not_hold(monkeypatch):
    from nmt.translate import triton_step
    from nmt.translate.search_step import RowState

    rows = RowState.start(2, 1, True, torch.device(DEVICE))
    args = (rows.scores, rows.exact.view(2, 1), rows.exact, rows.reason, rows.best_finished, rows.top_finished)
    common = dict(vocab=5, eos=3, certify=True, penalty=1.0, bound_penalty=1.0, nonfinite_code=4, pruned_code=1)
    top, index = torch.zeros(2, 2, device=DEVICE), torch.zeros(2, 2, dtype=torch.long, device=DEVICE)
    assert triton_step.step_update(top, index, *args, beam_size=1, **common) is not None
    assert triton_step.step_update(top, index, *args, beam_size=3, **common) is None  # fewer candidates than slots
    assert triton_step.step_update(top.double(), index, *args, beam_size=1, **common) is None  # float64: torch's
    monkeypatch.setenv("NMT_TRITON_STEP", "0")
    assert triton_step.step_update(top, index, *args, beam_size=1, **common) is None


def _mask_case(rows: int, k: int, slots: int, support: bool, seed: int):
    """A static step's (B, K) records and (B,) flags with stopped sentences, ones stopping now, both
    and neither; NaN-free scores with -inf entries; the certificate before and after the step."""
    g = torch.Generator().manual_seed(seed)
    stopped = torch.rand(rows, generator=g) < 0.4
    done = torch.rand(rows, generator=g) < 0.4
    token = torch.randint(0, 50, (rows, k), generator=g)
    parent = torch.randint(0, slots, (rows, k), generator=g)
    score = torch.randn(rows, k, generator=g).masked_fill(torch.rand(rows, k, generator=g) < 0.2, NINF)
    sizes = torch.randint(1, 40, (rows, k), generator=g, dtype=torch.int32) if support else None
    live = score.masked_fill(torch.rand(rows, k, generator=g) < 0.3, NINF)
    exact, old_exact = torch.rand(rows, generator=g) < 0.5, torch.rand(rows, generator=g) < 0.5
    reason, old_reason = torch.randint(0, 5, (rows,), generator=g), torch.randint(0, 5, (rows,), generator=g)
    return [None if t is None else t.to(DEVICE) for t in (stopped, done, token, parent, score, sizes, live, exact,
                                                           reason, old_exact, old_reason)]


@pytest.mark.parametrize("rows,k,slots,support", [(1, 1, 1, True), (7, 1, 1, False), (33, 5, 5, True),
                                                  (64, 5, 1, True), (70, 3, 3, False), (5, 12, 12, True)])
def test_the_static_mask_kernel_equals_the_torch_masking(rows, k, slots, support):
    """The static loop's masking in one launch (nmt.translate.triton_static_mask) against the torch
    code it replaces (static_search.mask_stopped), bit for bit: records with the history's fill
    values where a sentence had stopped, live prefixes cut where it stops now, the certificate
    kept where it had stopped, the flags and the flat parent rows of the state's gather; rows in
    several programs and one partial program, beams of 1 to 12."""
    from nmt.translate import triton_static_mask as TM
    from nmt.translate.static_search import mask_stopped

    for seed in range(3):
        case = _mask_case(rows, k, slots, support, seed)
        fused = TM.mask_stopped(*case, slots=slots, pad=1)
        expected = mask_stopped(*case, slots=slots, pad=1)
        assert fused is not None
        for name in fused._fields:
            a, b = getattr(fused, name), getattr(expected, name)
            assert (a is None) == (b is None), name
            if a is not None:
                assert a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()), (name, seed)


def test_the_static_mask_kernel_declines_what_it_does_not_take(monkeypatch):
    from nmt.translate import triton_static_mask as TM

    case = _mask_case(6, 3, 3, True, seed=0)
    assert TM.mask_stopped(*case, slots=3, pad=0) is not None
    as_double = list(case)
    as_double[4], as_double[6] = case[4].double(), case[6].double()
    assert TM.mask_stopped(*as_double, slots=3, pad=0) is None  # float64: torch's
    strided = list(case)
    strided[2] = case[2].t().contiguous().t()  # (B, K) but not contiguous
    assert TM.mask_stopped(*strided, slots=3, pad=0) is None
    monkeypatch.setenv("NMT_TRITON_MASK", "0")
    assert TM.mask_stopped(*case, slots=3, pad=0) is None


def test_the_static_mask_wrapper_does_not_sync(monkeypatch):
    """Around the launch (replaced) nothing synchronises; the grid follows the rows only."""
    from nmt.translate import triton_static_mask as TM
    from nmt.utils.sync_audit import SyncAudit

    grids = []

    class Launcher:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: grids.append((grid, kwargs["K"], kwargs["HAS_SUPPORT"]))

    monkeypatch.setattr(TM, "_kernel", lambda x=None: Launcher())
    case = _mask_case(70, 5, 5, True, seed=1)
    with SyncAudit() as audit:
        TM.mask_stopped(*case, slots=5, pad=0)
        TM.mask_stopped(*case[:5], None, *case[6:], slots=5, pad=0)
    assert audit.total == 0, audit.report()
    assert grids == [((3,), 5, True), ((3,), 5, False)]


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_beam_search_with_the_candidates_kernel_equals_the_torch_passes(mode, monkeypatch):
    """What a GPU search runs (the kernel's candidates, then the step's bookkeeping in torch or by
    its kernel, then, static, the masking of stopped sentences by its kernel): the same hypotheses, scores, certificates and support statistics as the torch
    passes alone, for a sparse and a softmax output, with a certificate (width K + 1) and without."""
    import nmt.translate.search_step as step_module
    from nmt.sparse import _triton_candidates as TC
    from nmt.translate import static_search, triton_step
    from nmt.translate.beam_search import beam_search
    from nmt.translate.triton_static_mask import mask_stopped

    sys.path.insert(0, str(ROOT / "tests" / "translate"))
    from toy_decoders import BOS, EOS, PAD, TinyAttentionRNN, random_sources

    src, lengths = random_sources(4, 9, 5, seed=3)
    calls, masked = [], []

    def masking(*args, **kwargs):
        masked.append(1)
        return mask_stopped(*args, **kwargs)

    def kernel(*args):
        calls.append(1)
        return TC.step_candidates(*args)

    for mapping, certify in (("sparsemax", True), ("softmax", False)):
        model = TinyAttentionRNN(mapping=mapping, seed=2, dtype=torch.float32).to(DEVICE)
        kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=3, n_best=2, max_length=6, certify=certify,
                  return_support=True, length_penalty="average", mode=mode)
        monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
        monkeypatch.setattr(step_module, "triton_step_candidates", lambda *args: None)
        monkeypatch.setattr(static_search, "_masking", lambda device: None)
        torch_passes = beam_search(model, src.to(DEVICE), lengths.to(DEVICE), **kw)
        monkeypatch.setattr(step_module, "step_candidates", kernel)  # the CPU (interpreter) takes the kernels
        monkeypatch.setattr(step_module, "triton_step_candidates", kernel)  # as would CUDA
        monkeypatch.setattr(step_module, "step_update", lambda *args, **kwargs: None)  # the torch bookkeeping
        with_kernel = beam_search(model, src.to(DEVICE), lengths.to(DEVICE), **kw)
        monkeypatch.setattr(step_module, "step_update", triton_step.step_update)  # and the step's kernel
        both = beam_search(model, src.to(DEVICE), lengths.to(DEVICE), **kw)
        monkeypatch.setattr(static_search, "_masking", lambda device: masking)  # and the static loop's masking
        every = beam_search(model, src.to(DEVICE), lengths.to(DEVICE), **kw)
        for result in (with_kernel, both, every):
            for name in ("tokens", "lengths", "complete", "exact", "reason", "n_nonzero", "support_size",
                         "support_tokens"):
                assert torch.equal(getattr(result, name), getattr(torch_passes, name)), (mapping, name)
            for name in ("scores", "ranking_scores", "mass", "support_probs"):
                torch.testing.assert_close(getattr(result, name), getattr(torch_passes, name))
    assert calls and (masked if mode == "static" else not masked)


@pytest.mark.parametrize("block", [1, 2])
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_blocked_search_with_the_kernels_equals_the_constrained_brute_force(mode, block, monkeypatch):
    """``block_ngram_repeat`` on the path of a GPU search (the candidates kernel, the step's kernel,
    static: the masking kernel; in Triton's interpreter on the CPU): the torch passes' hypotheses,
    scores and certificates, and every certified sentence's hypotheses are the brute-force support
    of the constrained problem (no repeated n-gram), its first the argmax."""
    import nmt.translate.search_step as step_module
    from nmt.sparse import _triton_candidates as TC
    from nmt.translate import static_search, triton_step
    from nmt.translate.beam_search import beam_search
    from nmt.translate.triton_static_mask import mask_stopped

    sys.path.insert(0, str(ROOT / "tests" / "translate"))
    from toy_decoders import BOS, EOS, PAD, MarkovDecoder, enumerate_support, random_sources

    model = MarkovDecoder(vocab=7, mapping="sparsemax", seed=3, scale=1.0, eos_bonus=0.4, dtype=torch.float32).to(DEVICE)
    src, lengths = random_sources(6, 9, 5, seed=10)
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=4, n_best=50, max_length=6, block_ngram_repeat=block,
              return_support=True, mode=mode)
    calls = []
    monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
    monkeypatch.setattr(step_module, "triton_step_candidates", lambda *args: None)
    monkeypatch.setattr(step_module, "step_update", lambda *args, **kwargs: None)
    monkeypatch.setattr(static_search, "_masking", lambda device: None)
    torch_passes = beam_search(model, src.to(DEVICE), lengths.to(DEVICE), **kw)

    def kernel(*args):
        calls.append(1)
        return TC.step_candidates(*args)

    monkeypatch.setattr(step_module, "step_candidates", kernel)
    monkeypatch.setattr(step_module, "triton_step_candidates", kernel)
    monkeypatch.setattr(step_module, "step_update", triton_step.step_update)
    monkeypatch.setattr(static_search, "_masking", lambda device: mask_stopped)
    kernels = beam_search(model, src.to(DEVICE), lengths.to(DEVICE), **kw)
    assert calls
    for name in ("tokens", "lengths", "complete", "exact", "reason", "n_nonzero", "support_size"):
        assert torch.equal(getattr(kernels, name), getattr(torch_passes, name)), name
    torch.testing.assert_close(kernels.scores, torch_passes.scores)
    certified = 0
    for b in range(6):
        support, _, _ = enumerate_support(model.cpu(), src[b], lengths[b], 6, block=block)
        model.to(DEVICE)
        found = {tuple(kernels.tokens[b, i, :int(kernels.lengths[b, i])].tolist()): float(kernels.scores[b, i])
                 for i in range(50) if bool(kernels.complete[b, i])}
        assert set(found) <= set(support)
        if bool(kernels.exact[b]):
            certified += 1
            assert set(found) == set(support) and int(kernels.n_nonzero[b]) == len(support)
            best = max(support.values())
            assert float(kernels.scores[b, 0]) == pytest.approx(best, abs=1e-5)
    assert certified
