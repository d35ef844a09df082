"""CachedLaunch (nmt.sparse._triton_launch): the compiled kernel Triton would choose, launched with
what Triton would pass, at every launch of every kernel variant the wrappers make.

Checked on the CPU through Triton's real launch path with a stand-in CUDA driver (the kernels
compiled for sm_90 by Triton's own compiler, launches recorded, nothing run: the bench_launch
tool's driver), in a fresh process without ``TRITON_INTERPRET`` (an interpreted Triton cannot
compile). On CUDA, a second test checks the cached launches against Triton's on the GPU."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import os, sys
import torch
sys.path.insert(0, sys.argv[1])
import bench_launch
from nmt.sparse import _triton as T, _triton_launch as L

verified = [0]
original_verify = L.CachedLaunch._verify
def counting_verify(self, *args, **kwargs):
    verified[0] += 1
    return original_verify(self, *args, **kwargs)
L.CachedLaunch._verify = counting_verify


def inputs():
    # two float dtypes; one-column, 16-aligned-length and odd rows; 16-byte aligned and not
    for dtype in (torch.float32, torch.bfloat16):
        for n in (1, 16, 50):
            for offset in (0, 1):
                flat = torch.randn(5 * n + offset).to(dtype)
                yield flat[offset:].view(5, n)
    yield torch.randn(1, 50)  # one row: Triton specialises the row count 1 to a constant


def calls(x):
    n_rows = x.shape[0]
    t = torch.randint(0, x.shape[1], (n_rows,))
    t[0] = -100
    g = torch.randn_like(x)
    alpha = torch.full((n_rows,), 1.3)
    yield lambda: T.sparsemax_forward(x)
    yield lambda: T.entmax15_forward(x)
    yield lambda: T.entmax_forward(x, alpha)
    yield lambda: T.entmax_forward_scalar(x, 1.3)
    if n_rows > 1:  # one alpha per row of a leading dim (as one per head): read with a stride
        yield lambda: T.entmax_forward(x.view(1, n_rows, 1, -1), alpha[:1].view(1, 1, 1, 1))
    yield lambda: T.sparsemax_backward(x, g)
    yield lambda: T.entmax15_backward(x, g)
    yield lambda: T.entmax_backward(x, g, alpha)
    yield lambda: T.entmax_backward_alpha(x, g, alpha)
    yield lambda: T.entmax_backward_scalar(x, g, 1.3)
    for a in (2.0, 1.5, 1.25):
        yield lambda: T.tsallis_probs_conj(x, a)
    for reduction in T.REDUCTIONS:
        for eps in (0.0, 0.1):
            yield lambda: T.tsallis_index_loss(x, t, -100, eps, 1.5, reduction)
            yield lambda: T.tsallis_index_loss(x, t.int(), 7, eps, 1.25, reduction)
            yield lambda: T.cross_entropy_forward(x, t, -100, eps, reduction)
    work = torch.zeros(2 + 2 * n_rows)
    for eps in (0.0, 0.1):
        yield lambda: T.cross_entropy_backward(x, t, work, torch.ones(n_rows), -100, eps)  # g stride 1
        yield lambda: T.cross_entropy_backward(x, t, work, torch.ones(()), -100, eps)  # stride 0


def describe(args):
    # a launch's arguments, tensors by dtype and shape (outputs are allocated anew each call)
    return tuple((str(a.dtype), tuple(a.shape)) if isinstance(a, torch.Tensor) else a for a in args)


def record(mode):
    # every call twice (its key's first launch: Triton's path; then, cache on, a cached one):
    # what each launch passed the launcher after its first four (grid, stream) and the hooks
    os.environ["NMT_TRITON_LAUNCH_CACHE"] = mode
    seen = []
    with bench_launch.stand_in_driver() as launched:
        for x in inputs():
            for call in calls(x):
                for _ in range(2):
                    before = launched[0]
                    call()
                    assert launched[0] > before, "a wrapper launched nothing"
                    args = launched[1]
                    seen.append((args[:3], args[5]) + describe(args[9:]))
        kernels = T._kernels()  # keys learnt per kernel (None: Triton's own path)
        learnt = {name: sum(v is not None for v in getattr(kernels, name)._cache.values())
                  for name in T.KERNEL_NAMES if mode != "0"}
        del kernels
    return seen, learnt


plain, _ = record("0")
fast, learnt = record("verify")
assert verified[0] > 0, "no launch took the cached path"
assert all(learnt.values()), learnt
assert len(plain) == len(fast) and plain == fast, "the cached launches differ from Triton's"
print("OK", verified[0], learnt)
"""


def _run_on_the_stand_in(script: str, stand_in_env) -> None:
    """Run ``script`` (given the tools folder, for bench_launch's stand-in driver) in a fresh process
    with a compiling Triton; its last line must start with OK."""
    out = subprocess.run([sys.executable, "-c", script, str(ROOT / "tools")], cwd=ROOT,
                         env=stand_in_env(TRITON_DEFAULT_FP_FUSION="1"), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("OK"), out.stdout[-2000:]


def test_cached_launches_are_tritons_on_a_stand_in_gpu(stand_in_env):
    """Every kernel variant (dtypes, aligned and unaligned pointers, rows of 1 / 16 / 50,
    every loss reduction, smoothing, alpha, index widths, g strides 0 and 1): with the cache in
    ``verify`` mode every cached launch picks Triton's compiled kernel and passes what its binder
    binds (else it raises), and the launcher receives the same arguments, in the same order, as
    with the cache off."""
    _run_on_the_stand_in(_SCRIPT, stand_in_env)


_KEY_SCRIPT = r"""
import torch
try:
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl
except ImportError:
    print("SKIP: this Triton has no native_specialize_impl"); raise SystemExit(0)
from nmt.sparse._triton_launch import launch_key

flat = torch.zeros(64)
samples = [0, 1, 2, 15, 16, 17, 32, -1, -16, -100, 2**31 - 16, 2**31, 2**32 + 1, 2**63, 2**64 - 16, True, False,
           0.0, 1.0, 0.1, None]
samples += [flat[i:] for i in range(6)] + [torch.nn.Parameter(flat[i:]) for i in range(2)]
samples += [flat.to(d)[i:] for d in (torch.bfloat16, torch.float16, torch.int8, torch.int32, torch.int64)
            for i in range(9)]
by_key = {}
for a in samples:
    spec = native_specialize_impl(BaseBackend, a, False, True, True)
    by_key.setdefault(launch_key(0, (a,), {}), set()).add(spec)
assert all(len(specs) == 1 for specs in by_key.values()), by_key
print("OK", len(by_key))
"""


def test_keyed_launch_passes_cuda_tensors_by_pointer(monkeypatch):
    """``keyed_launch``: a tensor on a GPU (``get_device() >= 0``, stood in for on the CPU) goes to
    the launcher as its data pointer, an int (Triton's launcher then neither calls ``data_ptr()``
    nor asks the driver about it); its device index is in the key, so a tensor of another device
    (or off CUDA) is another key, whose first launch takes Triton's checked path. Tensors off CUDA
    and parameters stay tensors; a tensor passed again at once gets the same key part and value."""
    from nmt.sparse._triton_launch import keyed_launch, launch_key

    x, y = torch.zeros(4, 8), torch.zeros(4, 8)
    kwargs = {"BLOCK": 16, "num_warps": 1}
    key_cpu, values_cpu = keyed_launch(0, (x, y, y, 8, 0.5), kwargs)
    assert values_cpu[0] is x and values_cpu[1] is y and values_cpu[2] is y and values_cpu[3:] == (8, 0.5)
    assert key_cpu == launch_key(0, (x, y, y, 8, 0.5), kwargs) and key_cpu[3] == key_cpu[4]
    on = {"gpu": 1}
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: on["gpu"], raising=False)
    key_gpu1, values = keyed_launch(0, (x, y, y, 8, 0.5), kwargs)
    assert values == (x.data_ptr(), y.data_ptr(), y.data_ptr(), 8, 0.5)
    assert all(type(v) is int for v in values[:3])
    on["gpu"] = 0
    key_gpu0, _ = keyed_launch(0, (x, y, y, 8, 0.5), kwargs)
    assert len({key_cpu, key_gpu0, key_gpu1}) == 3  # the device index is part of the key
    parameter = torch.nn.Parameter(torch.zeros(4, 8))
    assert keyed_launch(0, (parameter,), {})[1][0] is parameter  # not a plain tensor: Triton checks it


def test_launch_hooks_are_none_where_there_is_nothing_to_call():
    """Triton 3.6 and 3.9 keep an empty ``HookChain`` for the launch hooks: the launcher gets None
    then (no call, no launch metadata built); a chain with hooks, or another hook, is passed on."""
    from nmt.sparse._triton_launch import _hook

    class Chain:
        def __init__(self, calls):
            self.calls = calls

    def hook(metadata):
        return None

    assert _hook(None) is None and _hook(Chain([])) is None
    chain = Chain([hook])
    assert _hook(chain) is chain and _hook(hook) is hook


def test_cuda_tensors_do_not_read_the_environment(monkeypatch):
    """Whether the kernels run on a CUDA tensor (at every attention step of an eager GPU step)
    depends on how Triton was imported, not on reading ``TRITON_INTERPRET`` again (0.6 us a read):
    CUDA stood in for on the CPU, the environment read made to fail."""
    from nmt.sparse import _triton as T

    if T._import_triton() is None:
        pytest.skip("triton is not installed")
    monkeypatch.setattr(T, "_interpret", lambda: pytest.fail("TRITON_INTERPRET read for a CUDA tensor"))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True), raising=False)
    x = torch.zeros(2, 3)
    assert T._runs_here(x) is (not T._library_interpreted())
    assert T._interpreted(x) is False  # the compiled kernels for it


def test_launch_cache_mode_from_the_environment(monkeypatch):
    """NMT_TRITON_LAUNCH_CACHE: on by default, the documented spellings, and a one-line error
    naming the variable for anything else."""
    from nmt.sparse._triton_launch import mode

    monkeypatch.delenv("NMT_TRITON_LAUNCH_CACHE", raising=False)
    assert mode() == "1"
    for value, expected in (("0", "0"), ("off", "0"), ("1", "1"), ("ON", "1"), (" verify ", "verify")):
        monkeypatch.setenv("NMT_TRITON_LAUNCH_CACHE", value)
        assert mode() == expected, value
    monkeypatch.setenv("NMT_TRITON_LAUNCH_CACHE", "flase")
    with pytest.raises(ValueError, match="NMT_TRITON_LAUNCH_CACHE must be 1, 0 or verify.*'flase'"):
        mode()


def test_launch_key_is_at_least_as_fine_as_tritons_specialisation(subprocess_env):
    """The key of one argument against Triton's own specialisation of it (what its binder calls):
    two arguments with one key never get two specialisations. Ints around 16's multiples, 1, the
    int32 / int64 / uint64 bounds; bools; floats; None; tensors of five dtypes at every alignment,
    parameters among them. In a fresh process (Triton's specialisation imports modules that an
    interpreted Triton cannot)."""
    pytest.importorskip("triton")
    out = subprocess.run([sys.executable, "-c", _KEY_SCRIPT], cwd=ROOT, env=subprocess_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    if out.stdout.startswith("SKIP"):
        pytest.skip(out.stdout.strip())
    assert out.stdout.startswith("OK"), out.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cached_launches_match_tritons_on_cuda(subprocess_env):
    """On a GPU: the wrappers' results with the cache on, in ``verify`` mode (every cached launch
    checked against Triton's choice) and off are bitwise equal (in a fresh process: the mode is
    read when the kernels are built)."""
    pytest.importorskip("triton")
    script = r"""
import os, sys, torch
from nmt.sparse import _triton as T
torch.manual_seed(0)
results = {}
for mode in ("0", "verify", "1"):
    os.environ["NMT_TRITON_LAUNCH_CACHE"] = mode
    T._KERNELS.clear()
    out = []
    for n, dtype in ((1, torch.float32), (50, torch.float32), (8000, torch.bfloat16)):  # few compilations
        g = torch.Generator(device="cuda").manual_seed(n)
        x = (torch.randn(33, n, device="cuda", generator=g) * 3).to(dtype)
        t = torch.randint(0, n, (33,), device="cuda", generator=g)
        for _ in range(2):
            p = T.entmax15_forward(x)
            out += [p, T.entmax15_backward(p, x), T.sparsemax_forward(x)]
            out += list(T.tsallis_index_loss(x, t, -100, 0.1, 1.5, "mean"))
            loss, work = T.cross_entropy_forward(x, t, -100, 0.0, "sum")
            out += [loss, work, T.cross_entropy_backward(x, t, work, torch.ones(33, device="cuda"))]
    torch.cuda.synchronize()
    results[mode] = [o.float().cpu() for o in out]
for mode in ("verify", "1"):
    for a, b in zip(results["0"], results[mode]):
        assert torch.equal(a.nan_to_num(), b.nan_to_num()), mode
print("OK")
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout[-2000:] + out.stderr[-3000:]


def test_launch_device_is_the_first_tensors():
    """A launch belongs on its first tensor argument's CUDA device; CPU tensors (the interpreter)
    and launches without a tensor leave the current device alone."""
    from nmt.sparse._triton_launch import launch_device

    assert launch_device(()) is None and launch_device((3, 0.5, None)) is None
    assert launch_device((7, torch.zeros(2), torch.zeros(2))) is None
    if torch.cuda.is_available():
        last = torch.cuda.device_count() - 1
        assert launch_device((7, torch.zeros(2, device=f"cuda:{last}"), torch.zeros(2))) == last


_DEVICE_SCRIPT = r"""
import contextlib, os, sys
import torch
sys.path.insert(0, sys.argv[1])
import bench_launch
from triton.runtime.driver import driver
from nmt.sparse import _triton as T, _triton_launch as L

current = [0]
streams, at_launch = [], []


@contextlib.contextmanager
def on_device(index):  # torch's device guard, for the stand-in's notion of the current device
    before, current[0] = current[0], index
    try:
        yield
    finally:
        current[0] = before


L.on_device = on_device
L.current_device = lambda: current[0]
on_gpu_1 = [False]
real_launch_device = L.launch_device
L.launch_device = lambda args: 1 if on_gpu_1[0] else real_launch_device(args)

for mode in ("1", "verify", "0"):
    os.environ["NMT_TRITON_LAUNCH_CACHE"] = mode
    with bench_launch.stand_in_driver() as launched:
        active = driver.active
        active.get_current_device = lambda: current[0]
        active.get_current_stream = lambda device: streams.append(device) or 0
        launcher_cls = active.launcher_cls

        def recording_launcher(src, metadata):
            launch = launcher_cls(src, metadata)
            def run(*args):
                at_launch.append(current[0])
                return launch(*args)
            return run
        active.launcher_cls = recording_launcher
        x, g = torch.randn(5, 50), torch.randn(5, 50)
        for gpu_1 in (False, True, True):  # on the current device; on another, twice (the cached path)
            on_gpu_1[0] = gpu_1
            del at_launch[:], streams[:]
            T.entmax15_forward(x)
            T.entmax15_backward(x, g)
            assert at_launch == [1 if gpu_1 else 0] * 2, (mode, gpu_1, at_launch)
            assert set(streams) <= {1 if gpu_1 else 0}, (mode, gpu_1, streams)
            assert current[0] == 0, (mode, "the current device was not restored")
        if mode != "0":
            devices = {key[0] for key in T._kernels().forward._cache}
            assert devices == {0, 1}, (mode, devices)

# without the launch cache (a Triton older than 3.3): DeviceLaunch
seen = []
class Kernel:
    def __getitem__(self, grid):
        return lambda *args: seen.append((grid, current[0], len(args)))
for gpu_1 in (False, True):
    on_gpu_1[0] = gpu_1
    L.DeviceLaunch(Kernel())[(4,)](torch.zeros(1), 3)
    assert seen[-1] == ((4,), 1 if gpu_1 else 0, 2) and current[0] == 0, seen
print("OK")
"""


def test_launches_run_on_the_device_of_their_tensors(stand_in_env):
    """Triton launches on the current device; nmt's launches enter the tensors' device instead
    (``-device cuda:1`` with ``cuda:0`` current). Through Triton's real launch path with the
    stand-in driver, a second GPU simulated: with the cache on, in ``verify`` mode and off, a
    kernel given tensors of device 1 is compiled, keyed, given its stream and launched there, on
    the current device as before, and the current device is restored after; likewise
    DeviceLaunch, the launch of a Triton without the cache."""
    _run_on_the_stand_in(_DEVICE_SCRIPT, stand_in_env)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_kernels_on_a_second_gpu_equal_the_first(subprocess_env):
    """With ``cuda:0`` current, the mappings, losses and search kernels on tensors of ``cuda:1``
    give what they give on ``cuda:0`` (Triton alone would launch them on ``cuda:0``)."""
    pytest.importorskip("triton")
    script = r"""
import torch
from nmt.sparse import entmax15, sparsemax, entmax_bisect, entmax15_loss, cross_entropy_loss
torch.cuda.set_device(0)
results = []
for device in ("cuda:0", "cuda:1"):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(33, 50, generator=g) * 3).to(device).requires_grad_()
    t = torch.randint(0, 50, (33,), generator=g).to(device)
    out = [entmax15(x), sparsemax(x), entmax_bisect(x, 1.3)]
    loss = entmax15_loss(x, t) + cross_entropy_loss(x, t)
    grad, = torch.autograd.grad(loss + sum((o * o).sum() for o in out), x)
    assert torch.cuda.current_device() == 0
    results.append([o.detach().cpu() for o in out] + [loss.detach().cpu(), grad.cpu()])
for a, b in zip(*results):
    assert torch.equal(a, b)
print("OK")
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout[-2000:] + out.stderr[-3000:]
