"""The native library of nmt.sparse, built on first use from its C sources and called through
ctypes: the sorted threshold (``_sorted_threshold.c``), the Newton threshold of whole rows
(``_newton_threshold.c``), alpha-entmax's threshold, mapping and backward at any alpha in (1, 2),
also the powerless backward of sparsemax and 1.5-entmax (``_power_threshold.c``:
:func:`power_threshold`, :func:`power_probs`, :func:`power_backward`, :func:`support_backward`), a
beam search step's reading of its log-probabilities (``_step_candidates.c``: support statistics and
best candidates), and the structured proxes' taut strings, OSCAR's ordered fit and their backward's
group averaging (``_taut_string.c``, ``_group_average.c``: :func:`taut_string`, :func:`ordered_fit`,
:func:`group_average`), and cross-entropy's backward and label-smoothing statistics
(``_cross_entropy.c``: :func:`xent_backward`, :func:`xent_smoothing`). Float-vector ``log2``,
``exp2`` and ``exp`` polynomials shared by two of them are in ``_float_math.h``.

Attention-sized inputs are bound by per-operation overhead: the NumPy solve of
:func:`nmt.sparse._threshold._numpy_sorted_shifted_threshold` makes some twenty array operations.
The C code solves four rows side by side in vectors (the compiler's vector extensions: SSE, NEON,
whatever the target has without flags), keeping only the entries that can be in the support and
sorting them by a bitonic network (no data-dependent branch); rows holding NaN or ``+inf``, rows
without a finite entry and rows with more than 64 candidates are solved one by one (an insertion
and merge sort of the candidates). Same arithmetic, same bits (tested against the NumPy and torch
paths, and the two C paths against each other).

The Newton loops (whole rows, :func:`newton_threshold`; long rows from their segments' bound,
:func:`bound_threshold` and :func:`bound_entmax15`) split large inputs' rows over torch's threads
through OpenMP: built with ``-fopenmp`` the library links ``libgomp.so.1``, the copy torch has
loaded, and runs in torch's own thread pool, whose workers wait spinning for the next parallel
region (a thread of our own had to compete with them for a core: 2-3x slower in training).

The library is compiled once per source version with the system's C compiler (``$CC``, else
``cc`` or ``gcc``; ``-O2 -ffp-contract=off`` and ``-fopenmp`` where it builds, no other
dependency) into
``$NMT_CACHE_DIR`` (default ``$XDG_CACHE_HOME/nmt`` or ``~/.cache/nmt``), written atomically
(a temporary name, then a rename; the file mode follows the umask) so that concurrent processes
(data-parallel ranks) may build it at once. Without a compiler, or with ``NMT_NATIVE=0``, nothing
is built and :func:`native_sorted_shifted_threshold` returns None: the callers keep the NumPy path.
A failed build is logged once (INFO) and not retried in that process.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("_sorted_threshold.c")
CANDIDATES_SOURCE = Path(__file__).with_name("_step_candidates.c")
NEWTON_SOURCE = Path(__file__).with_name("_newton_threshold.c")
POWER_SOURCE = Path(__file__).with_name("_power_threshold.c")
TAUT_SOURCE = Path(__file__).with_name("_taut_string.c")
GROUP_SOURCE = Path(__file__).with_name("_group_average.c")
XENT_SOURCE = Path(__file__).with_name("_cross_entropy.c")
SOURCES = (SOURCE, CANDIDATES_SOURCE, NEWTON_SOURCE, POWER_SOURCE, TAUT_SOURCE, GROUP_SOURCE, XENT_SOURCE)
"""The C files built into the one library: the sorted threshold (with the mappings around it), a
search step's support statistics and best candidates (:func:`step_candidates`) and the Newton
thresholds (:func:`newton_threshold`, :func:`bound_threshold`) and those of any power
(:func:`power_threshold`, with the mapping and backward), the structured proxes' taut strings and
ordered fit (:func:`taut_string`, :func:`ordered_fit`) and their backward's group averaging
(:func:`group_average`), and cross-entropy's backward and label-smoothing statistics
(:func:`xent_backward`, :func:`xent_smoothing`)."""
HEADERS = (Path(__file__).with_name("_cpu_dispatch.h"), Path(__file__).with_name("_float_math.h"),
           Path(__file__).with_name("_power_avx2.h"))
"""The headers they include (the run-time choice of AVX2 / AVX-512 functions; float vector log2,
exp2 and exp; alpha-entmax's AVX2 float passes): part of a build's identity, not compiled by
themselves."""
CFLAGS = ("-O2", "-shared", "-fPIC", "-ffp-contract=off", "-std=c99")
"""Compiler flags: no contraction of products and sums into FMAs (the other paths round each
operation), no fast-math."""
OPENMP_FLAGS = ("-fopenmp",)
"""Tried first: the Newton loops split their rows over the OpenMP team of the process (linked to
``libgomp.so.1``, the copy torch has loaded: torch's own pool). A compiler without OpenMP builds
the library without them (one thread)."""

_FUNCTIONS = {torch.float32: "nmt_sorted_threshold_f32", torch.float64: "nmt_sorted_threshold_f64"}
_CANDIDATES = {torch.float32: "nmt_step_candidates_f32", torch.float64: "nmt_step_candidates_f64"}
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {  # suffix of the entry point -> argument types
    "": [_P, _I64, _I64, _INT, ctypes.c_double, _P, _P, _P, _INT],
    "_probs": [_P, _I64, _I64, _INT, _P, _P, _P, _P, _P],
    "_backward": [_P, _P, _I64, _I64, _INT, _P],
}
_CANDIDATES_SIGNATURE = [_P, _P, _I64, _I64, _I64, _I64, _P, _P, _P, _P, _INT]
_NEWTON = {torch.float32: "nmt_newton_threshold_f32", torch.float64: "nmt_newton_threshold_f64"}
_NEWTON_SIGNATURE = [_P, _I64, _I64, _INT, _P, _I64, _P, _P, _INT]
_BOUND = {torch.float32: "nmt_bound_threshold_f32", torch.float64: "nmt_bound_threshold_f64"}
_BOUND_SIGNATURE = [_P, _I64, _I64, _INT, ctypes.c_double, _INT, _I64, _P, _P, _P, _P, _P, _P, _P, _INT]
_POWER = {torch.float32: "nmt_power_threshold_f32"}
_POWER_SIGNATURE = [_P, _I64, _I64, _P, _I64, _P, _I64, ctypes.c_double, _P, _INT, _INT]
_POWER_PROBS = {torch.float32: "nmt_power_probs_f32"}
_POWER_PROBS_SIGNATURE = [_P, _I64, _I64, _P, _I64, _I64, ctypes.c_double, _P, _P, _P, _P, _P, _P, _INT]
_POWER_BACKWARD = {torch.float32: "nmt_power_backward_f32"}
_POWER_BACKWARD_SIGNATURE = [_P, _P, _I64, _I64, _P, _I64, _P, _I64, _P, _P, _P, _INT]
_TAUT = {torch.float32: "nmt_taut_string_f32", torch.float64: "nmt_taut_string_f64"}
_TAUT_SIGNATURE = [_P, _I64, _I64, _P, ctypes.c_double, ctypes.c_double, _P, _P, _P, _INT]
_ORDERED = {torch.float32: "nmt_taut_string_f32_ordered", torch.float64: "nmt_taut_string_f64_ordered"}
_ORDERED_SIGNATURE = [_P, _I64, _I64, _P, ctypes.c_double, _P, _P, _P, _INT]
_GROUP = {torch.float32: "nmt_group_average_f32", torch.float64: "nmt_group_average_f64"}
_GROUP_SIGNATURE = [_P, _P, _P, _I64, _I64, _I64, _P, _P, _INT]
_XENT = {torch.float32: "nmt_xent_backward_f32"}
_XENT_SIGNATURE = [_P, _P, _I64, _I64, _P, _P, ctypes.c_float, _P, _P, _INT]
_XENT_SMOOTHING = {torch.float32: "nmt_xent_smoothing_f32"}
_XENT_SMOOTHING_SIGNATURE = [_P, _P, _I64, _I64, _P, _P, _P, _INT]

logger = logging.getLogger(__name__)
_state: dict[str, object] = {}  # "lib": the loaded CDLL or None once decided


def enabled() -> bool:
    """Whether the native path may be used (``NMT_NATIVE`` unset or not "0")."""
    return os.environ.get("NMT_NATIVE", "1") != "0"


def cache_dir() -> Path:
    """Where built libraries are kept: ``$NMT_CACHE_DIR``, else ``$XDG_CACHE_HOME/nmt``, else
    ``~/.cache/nmt``."""
    if os.environ.get("NMT_CACHE_DIR"):
        return Path(os.environ["NMT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nmt"


def _compiler() -> Optional[str]:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build(directory: Optional[Path] = None, defines: Sequence[str] = (), openmp: bool = True,
          sources: Sequence[Path] = SOURCES, stem: str = "sorted_threshold") -> Path:
    """Compile the library into ``directory`` (default :func:`cache_dir`) unless a build of this
    source with this compiler and these ``defines`` (preprocessor names; ``NMT_ROWS_ONLY``: no
    vector path, for the tests) is there; returns its path. With ``openmp``, first with
    :data:`OPENMP_FLAGS`, then (if that fails) without. ``sources`` and ``stem`` (the file name's
    start) build another library the same way, :data:`HEADERS` on its include path (decoding's
    native search bookkeeping, :mod:`nmt.translate.native_step`; the LSTM cell of CPU inference,
    :mod:`nmt.models.native_lstm_cell`). Raises OSError / CalledProcessError / RuntimeError (no
    compiler) on failure."""
    if openmp:
        try:
            return _build(directory, defines, OPENMP_FLAGS, sources, stem)
        except subprocess.CalledProcessError:
            logger.info("native library: no OpenMP with this compiler; built for one thread")
    return _build(directory, defines, (), sources, stem)


def _build(directory: Optional[Path], defines: Sequence[str], extra: Sequence[str],
           sources: Sequence[Path] = SOURCES, stem: str = "sorted_threshold") -> Path:
    """:func:`build` with the extra compiler flags ``extra``."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C compiler found ($CC, cc, gcc)")
    flags = (*CFLAGS, *extra, *(f"-D{name}" for name in defines))
    key = hashlib.sha256(b"\0".join([*(path.read_bytes() for path in (*sources, *HEADERS)), compiler.encode(),
                                     " ".join(flags).encode(), platform.machine().encode()])).hexdigest()[:16]
    directory = Path(directory) if directory is not None else cache_dir()
    target = directory / f"{stem}-{key}.so"
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{target.name}.{os.getpid()}.partial"
    try:
        include = f"-I{HEADERS[0].parent}"  # the header, for sources kept elsewhere
        subprocess.run([compiler, *flags, include, "-o", str(partial), *map(str, sources), "-lm"], check=True,
                       capture_output=True, timeout=120)
        os.replace(partial, target)  # atomic: another process may have renamed its own build there
    finally:
        partial.unlink(missing_ok=True)
    return target


def load(path: Path) -> ctypes.CDLL:
    """The built library at ``path``, its entry points typed for :func:`solve`."""
    lib = ctypes.CDLL(str(path))
    for name in _FUNCTIONS.values():
        for suffix, argtypes in _SIGNATURES.items():
            getattr(lib, name + suffix).argtypes = argtypes
            getattr(lib, name + suffix).restype = None
    for names, argtypes in ((_CANDIDATES, _CANDIDATES_SIGNATURE), (_NEWTON, _NEWTON_SIGNATURE),
                            (_BOUND, _BOUND_SIGNATURE), (_POWER, _POWER_SIGNATURE),
                            (_POWER_PROBS, _POWER_PROBS_SIGNATURE), (_POWER_BACKWARD, _POWER_BACKWARD_SIGNATURE),
                            (_TAUT, _TAUT_SIGNATURE), (_ORDERED, _ORDERED_SIGNATURE), (_GROUP, _GROUP_SIGNATURE),
                            (_XENT, _XENT_SIGNATURE), (_XENT_SMOOTHING, _XENT_SMOOTHING_SIGNATURE)):
        for name in names.values():
            getattr(lib, name).argtypes = argtypes
            getattr(lib, name).restype = ctypes.c_int if names in (_CANDIDATES, _POWER_PROBS, _POWER_BACKWARD,
                                                                   _XENT, _XENT_SMOOTHING) else None
    return lib


def library() -> Optional[ctypes.CDLL]:
    """The loaded library, building it on first use; None when disabled or where it cannot be
    built or loaded (decided once per process)."""
    return load_once(_state, build, load, "sorted threshold", "the NumPy path")


def load_once(state: dict, build_library: Callable[[], Path], load_library: Callable[[Path], ctypes.CDLL],
              what: str, fallback: str = "the torch operations") -> Optional[ctypes.CDLL]:
    """``state["lib"]``: the library ``load_library(build_library())`` built and loaded on first use
    (this one, and the others of this builder: decoding's search step, the LSTM cell); None when
    disabled (:func:`enabled`) or where it cannot be built or loaded (AttributeError: a library
    without one of its entry points), logged once (INFO, naming ``what`` and the ``fallback`` used)
    and decided once per process."""
    if "lib" in state:
        return state["lib"]
    lib = None
    if enabled():
        try:
            lib = load_library(build_library())
        except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            logger.info("native %s unavailable (%s is used): %s %s", what, fallback, exc,
                        detail.decode(errors="replace")[:200])
    state["lib"] = lib
    return lib


class NativeLibrary:
    """A library of other C sources, compiled and loaded as this module's is: :func:`build` (the
    system's C compiler, :func:`cache_dir`, atomic writes, OpenMP where it builds unless ``openmp``
    is False) on first use, :func:`load_once` (once per process; None when disabled or where it
    cannot be built), ``entry_points`` typed (name -> ``(argtypes, restype)``). The modules that own
    one export its ``build``, ``load``, ``library`` and ``state`` (decoding's search step, the LSTM
    cell, the dropout mask)."""

    def __init__(self, sources: Sequence[Path], stem: str, entry_points: dict[str, tuple[list, Any]],
                 what: str, openmp: bool = True) -> None:
        self.sources, self.stem, self.entry_points = tuple(sources), stem, dict(entry_points)
        self.what, self.openmp = what, openmp
        self.state: dict[str, object] = {}  # "lib": the loaded CDLL or None once decided

    def build(self, directory: Optional[Path] = None, defines: Sequence[str] = ()) -> Path:
        """Compile the library into ``directory`` (default the cache) unless built; ``defines`` as
        for :func:`build` (``NMT_ROWS_ONLY``, ``NMT_NO_AVX2``, ``NMT_NO_AVX512``: the narrower
        paths, for the tests)."""
        return build(directory, defines, openmp=self.openmp, sources=self.sources, stem=self.stem)

    def load(self, path: Path) -> ctypes.CDLL:
        """The built library at ``path`` with its entry points typed."""
        lib = ctypes.CDLL(str(path))
        for name, (argtypes, restype) in self.entry_points.items():
            getattr(lib, name).argtypes = argtypes
            getattr(lib, name).restype = restype
        return lib

    def library(self) -> Optional[ctypes.CDLL]:
        """The loaded library, built on first use; None when disabled or where it cannot be built or
        loaded (decided once per process)."""
        return load_once(self.state, self.build, self.load, self.what)


def available() -> bool:
    """Whether the library is built and loaded (:func:`library` is not None)."""
    return library() is not None


def native_sorted_shifted_threshold(z: Tensor, q: float, scale: float) -> Optional[tuple[Tensor, Tensor]]:
    """``(tau_rel, zmax)``, each ``(R, 1)`` of ``z``'s dtype, for the rows ``z: (R, n)`` (CPU,
    float32 or float64, any strides; detached), exactly as
    :func:`nmt.sparse._threshold._numpy_sorted_shifted_threshold` computes them; None when the
    library is unavailable. Reads ``z`` on the host (a CPU tensor: no device involved); large inputs
    (:data:`NEWTON_SPLIT_MIN_NUMEL`) split their rows over torch's threads."""
    lib = library()
    if lib is None or q not in (1.0, 2.0) or z.dtype not in _FUNCTIONS:
        return None
    return solve(lib, z, q, scale)


def solve(lib: ctypes.CDLL, z: Tensor, q: float, scale: float) -> tuple[Tensor, Tensor]:
    """``(tau_rel, zmax)`` of the rows ``z: (R, n)`` (CPU, float32/64) by the loaded ``lib``."""
    rows, n = z.shape
    z = z.detach().contiguous()
    # separate storages: the results may leave a custom operator, whose outputs must not alias
    tau, zmax = torch.empty(rows, 1, dtype=z.dtype), torch.empty(rows, 1, dtype=z.dtype)
    threads = _threads(z.numel())
    scratch = torch.empty(threads * 2 * n, dtype=z.dtype)  # per thread
    getattr(lib, _FUNCTIONS[z.dtype])(z.data_ptr(), rows, n, int(q), float(scale), tau.data_ptr(),
                                      zmax.data_ptr(), scratch.data_ptr(), threads)
    return tau, zmax


def sorted_probs(x: Tensor, q: float, root: bool) -> Optional[tuple[Tensor, Optional[Tensor]]]:
    """The mapping of the rows ``x: (R, n)`` (CPU, float32/64, any strides) on the native threshold,
    in one call: ``q = 1`` sparsemax ``p = [(x - zmax) - tau]_+``; ``q = 2`` 1.5-entmax
    ``r = [(x/2 - zmax/2) - tau]_+`` and ``p = r^2`` (``r`` returned where ``root``, else None),
    bit for bit the torch forward on :func:`native_sorted_shifted_threshold`'s threshold.
    Returns ``(p, r)``, new ``(R, n)`` tensors; None when the library is unavailable."""
    lib = library()
    if lib is None or q not in (1.0, 2.0) or x.dtype not in _FUNCTIONS:
        return None
    rows, n = x.shape
    x = x.detach().contiguous()
    p = torch.empty_like(x)
    r = torch.empty_like(x) if root and q == 2.0 else None
    tau, zmax = torch.empty(rows, dtype=x.dtype), torch.empty(rows, dtype=x.dtype)
    scratch = torch.empty(2 * n, dtype=x.dtype)
    getattr(lib, _FUNCTIONS[x.dtype] + "_probs")(
        x.data_ptr(), rows, n, int(q), tau.data_ptr(), zmax.data_ptr(), scratch.data_ptr(),
        p.data_ptr(), r.data_ptr() if r is not None else None)
    return p, r


MAX_CANDIDATES = 256
"""The most candidates :func:`step_candidates` keeps per group (``NMT_MAX_WIDTH`` in the C file)."""


def step_candidates(log_probs: Tensor, offsets: Tensor, slots: int,
                    width: int) -> Optional[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """One pass over the rows ``log_probs: (G * slots, V)`` (CPU, float32/64; ``offsets: (G * slots,)``
    of the same dtype; detached): per row the number of finite entries (int32) and whether it holds
    a NaN or ``+inf`` (bool), and per group of ``slots`` rows, concatenated (``slots * V`` entries),
    its ``width`` largest candidates ``c = offsets + log_probs`` with every non-finite ``c`` as
    ``-inf``: values ``(G, width)`` in descending order, ties in index order (the lower first), and
    long indices ``(G, width)`` into the concatenated rows (see ``_step_candidates.c``). The same
    values as torch's ``nansum(0 * x + 1)``, ``amax`` tests and ``add`` + ``nan_to_num`` + a stable
    descending sort. None when the library is unavailable, the dtype is not float32/64 or ``width``
    is not in ``[1, min(slots * V, MAX_CANDIDATES)]``. Large inputs (:data:`NEWTON_SPLIT_MIN_NUMEL`)
    split their groups over torch's threads; no device is involved."""
    lib = library()
    n, v = log_probs.shape
    if lib is None or log_probs.dtype not in _CANDIDATES or not 1 <= width <= min(slots * v, MAX_CANDIDATES):
        return None
    groups = n // slots
    log_probs = log_probs.contiguous()  # only read through its pointer: no gradient is involved
    if offsets.dtype != log_probs.dtype:
        offsets = offsets.to(log_probs.dtype)
    offsets = offsets.contiguous()
    support = torch.empty(n, dtype=torch.int32)
    unknown = torch.empty(n, dtype=torch.bool)  # written as bytes 0 / 1
    values = torch.empty(groups, width, dtype=log_probs.dtype)
    index = torch.empty(groups, width, dtype=torch.long)
    if groups and getattr(lib, _CANDIDATES[log_probs.dtype])(
            log_probs.data_ptr(), offsets.data_ptr(), groups, slots, v, width, support.data_ptr(), unknown.data_ptr(),
            values.data_ptr(), index.data_ptr(), _threads(log_probs.numel())) != 0:
        return None  # the library refused the width (its own bound): nothing was written
    return support, unknown, values, index


NEWTON_SPLIT_MIN_NUMEL = 1 << 16
"""Inputs of at least this many entries split their rows over torch's number of threads (the
OpenMP team); smaller ones run on one."""


def newton_threshold(z: Tensor, q: float, lo: Tensor, max_iter: int) -> Optional[tuple[Tensor, Tensor]]:
    """Exact threshold of the rows ``z: (R, n)`` (CPU, float32/64, row maximum 0, ``-inf``
    allowed; detached) for ``q`` in {1, 2}, by Newton steps from the lower bound ``lo: (R,)``,
    each step one pass over a row held in cache (sums in doubles, in vectors), finished by the
    verified closed form (see ``_newton_threshold.c``). Returns ``(tau (R,), ok (R,) bool)``:
    ``ok`` False for rows whose closed form failed the check or that reached ``max_iter`` (the
    caller solves them otherwise); None when the library is unavailable. Large inputs
    (:data:`NEWTON_SPLIT_MIN_NUMEL`) split their rows over torch's threads, in the OpenMP team the
    library shares with torch; no device is involved."""
    lib = library()
    if lib is None or q not in (1.0, 2.0) or z.dtype not in _NEWTON:
        return None
    rows, n = z.shape
    z = z.detach().contiguous()
    lo = lo.detach().to(z.dtype).contiguous()
    tau = torch.empty(rows, dtype=z.dtype)
    ok = torch.empty(rows, dtype=torch.int32)
    solve_rows = getattr(lib, _NEWTON[z.dtype])

    if rows:
        solve_rows(z.data_ptr(), rows, n, int(q), lo.data_ptr(), int(max_iter), tau.data_ptr(), ok.data_ptr(),
                   _threads(z.numel()))
    return tau, ok.bool()


POWER_SPLIT_MIN_NUMEL = 1 << 12
"""Inputs of :func:`power_threshold` and :func:`power_probs` of at least this many entries split
their rows over torch's threads: a step's powers cost some 30 operations an entry, so smaller
inputs than the other Newton loops' (:data:`NEWTON_SPLIT_MIN_NUMEL`) pay for the parallel region."""

POWER_PROBS_MAX_N = 256
"""Longest rows :func:`power_probs` solves a block of rows at a time, one a vector lane
(``POWER_BLOCK_MAX_N`` in ``_power_threshold.c``: a block on the stack); longer rows go one by one,
pruned."""

POWER_STATS = 5
"""Floats a row of :func:`power_probs`' stats (``POWER_STATS`` in ``_power_threshold.c``)."""

POWER_LONG_SCRATCH = 32 * 8
"""Doubles of scratch a thread of :func:`power_probs` needs for the block maxima of long rows
(``POWER_LONG_MAX_ACC`` accumulators of up to 8 lanes in ``_power_threshold.c``)."""


def power_long_scratch(n: int) -> int:
    """Doubles of scratch a thread of :func:`power_probs` takes for rows of ``n`` entries longer than
    :data:`POWER_PROBS_MAX_N` (``POWER_LONG_THREAD_SCRATCH`` in ``_power_threshold.c``): the
    candidates and their powers (``n + 8`` each), the block maxima, the candidates' int32 places."""
    return 2 * (n + 8) + POWER_LONG_SCRATCH + (n + 1) // 2


def power_threshold(z: Tensor, q: Union[float, Tensor], lo: Tensor, max_iter: int,
                    tol: float, blocks: bool = True) -> Optional[Tensor]:
    """Threshold of the rows ``z: (R, n)`` (CPU, float32, row maximum 0, ``-inf`` allowed;
    detached) for a power ``q > 1`` (alpha-entmax with alpha in (1, 2): a float, or an ``(R,)``
    tensor, one per row), by Newton steps on the q-norm from the lower bound ``lo: (R,)``, each
    step one pass over a row held in cache, the powers by polynomials in doubles (see
    ``_power_threshold.c``), until a step is at most ``tol * max(1, |tau|)`` or after ``max_iter``
    steps: the loop of :func:`nmt.sparse._threshold._newton_norm` (inexact) without its twenty
    operations a step. Short rows go a block of rows at a time, one a lane (``blocks=False``: row
    by row, as longer rows go; the tests compare the two). Returns ``tau (R,)`` (rows without a
    finite entry or holding NaN: ``lo``);
    None when the library is unavailable or ``z`` is not float32. Inputs of
    :data:`POWER_SPLIT_MIN_NUMEL` entries or more split their rows over torch's threads; no device
    is involved."""
    lib = library()
    if lib is None or z.dtype not in _POWER:
        return None
    rows, n = z.shape
    z = z.detach().contiguous()
    lo = lo.detach().to(z.dtype).contiguous()
    qs = _RowValues(q, rows)
    tau = torch.empty(rows, dtype=z.dtype)
    if rows:
        getattr(lib, _POWER[z.dtype])(z.data_ptr(), rows, n, qs.ptr, qs.stride, lo.data_ptr(), int(max_iter),
                                      float(tol), tau.data_ptr(), int(blocks), _threads(z.numel(), POWER_SPLIT_MIN_NUMEL))
    return tau


def power_probs(x: Tensor, am1: Union[float, Tensor], max_iter: int, tol: float,
                root: bool, stats: bool = False, weights: bool = False,
                dalpha: bool = False) -> Optional[tuple]:
    """alpha-entmax of the rows ``x: (R, n)`` (CPU, float32, any values; detached) for
    ``alpha - 1 = am1`` in (0, 1) (a float, or an ``(R,)`` tensor, one per row), in one native call
    (``_power_threshold.c``): per row its maximum, ``z = (alpha - 1) (x - max)`` in doubles, the
    threshold by :func:`power_threshold`'s loop (``tol``, ``max_iter`` as there), then
    ``r = [z - tau]_+`` and ``p = r^q / sum r^q``. Rows of at most :data:`POWER_PROBS_MAX_N`
    entries go a block of rows at a time and start the loop from -1 on their entries above -1 (with
    a ``max_iter`` of 20 or more: from the power mean's bound ``mean(z) - k^(-1/q)`` over those k
    where higher, and after coarse Newton steps with float sums, each shortened by a margin that
    keeps it below the root, on the entries above the threshold they reach); longer rows go one by one:
    the loop starts from the threshold of some block maxima (a lower bound; on broad rows the
    candidates' mean bound where higher; on broad rows whose every candidate is in the support, the
    root of their moments' binomial series less half ``tol``, which one pass settles) and runs on the
    entries above it alone (with coarse float steps first, as the short rows, where that start is far
    from the root), dropping after every step those below tau, and the output is written at the
    candidates' places from the loop's last powers. Rows holding NaN or ``+inf``: all NaN; rows without a finite entry:
    all zeros. Returns ``(p, r)`` (``r`` None unless ``root``), new ``(R, n)`` float32 tensors;
    None where it does not serve (no library, not float32, a build without vector extensions).
    ``weights`` adds ``s = r^(q - 1)`` (third; ``(R, n)`` float32): the backward's ``s`` (proportional
    to ``p^(2 - alpha)``), the Newton loop's last powers taken at the threshold returned, so
    :func:`power_backward` ``(s, grad, 1.0)`` needs no power (NaN rows NaN, rows without a finite
    entry zeros). ``dalpha`` (rows of at most :data:`POWER_PROBS_MAX_N` entries; longer ones: None)
    adds (after ``s``) ``dp/dalpha`` (NaN rows NaN, 0 off the support), taken in doubles from the
    block's ``p`` and ``s``: ``w - s sum w / sum s`` with ``w = p (1 - (alpha - 1) ln p) / (alpha - 1)^2``
    (``ln p`` from the logarithms of the last pass's ``d``); :func:`power_backward` ``(s, grad, 1.0,
    da=...)`` then gives alpha's gradient without a logarithm.
    ``stats`` adds (after it) ``(tau, zmax, total, p_sum, pr)``, each ``(R,)`` float32: the threshold of
    ``z``, the row maximum, ``sum r^q`` before the normalisation, and the row sums of the written
    ``p`` and of ``p r`` taken in double (what the Tsallis losses' conjugate needs; rows holding NaN
    or ``+inf``: -1 then NaNs; rows without a finite entry: ``+inf`` then zeros). Rows
    split over torch's threads from :data:`POWER_SPLIT_MIN_NUMEL` entries; no device is involved."""
    lib = library()
    # (rows of 2^31 entries and more: the long rows' candidates are kept by int32 places)
    if (lib is None or x.dtype not in _POWER_PROBS or x.shape[-1] >= 2 ** 31 - 16
            or (dalpha and x.shape[-1] > POWER_PROBS_MAX_N)):
        return None
    rows, n = x.shape
    x = x.detach().contiguous()
    a = _RowValues(am1, rows)
    p = torch.empty_like(x)
    r = torch.empty_like(x) if root else None
    s = torch.empty_like(x) if weights else None
    da = torch.empty_like(x) if dalpha else None
    st = torch.empty(rows, POWER_STATS, dtype=torch.float32) if stats else None
    threads = _threads(x.numel(), POWER_SPLIT_MIN_NUMEL)
    scratch = torch.empty(threads * power_long_scratch(n), dtype=torch.float64) if n > POWER_PROBS_MAX_N else None
    if rows and not getattr(lib, _POWER_PROBS[x.dtype])(
            x.data_ptr(), rows, n, a.ptr, a.stride, int(max_iter), float(tol), p.data_ptr(),
            r.data_ptr() if r is not None else None, s.data_ptr() if s is not None else None,
            da.data_ptr() if da is not None else None, st.data_ptr() if st is not None else None,
            scratch.data_ptr() if scratch is not None else None,
            threads):
        return None
    return ((p, r) + ((s,) if weights else ()) + ((da,) if dalpha else ())
            + (tuple(st.unbind(1)) if st is not None else ()))


def power_backward(r: Tensor, grad: Tensor, e: Union[float, Tensor],
                   am1: Optional[Union[float, Tensor]] = None,
                   da: Optional[Tensor] = None) -> Optional[tuple[Tensor, Optional[Tensor]]]:
    """``J^T grad`` of alpha-entmax per row of ``r, grad: (R, n)`` (CPU, float32) in one native call:
    ``s = r^e`` on the support, ``s * (grad - <s, grad> / sum s)``, sums in double, the powers by
    the polynomials of ``_power_threshold.c`` (chunks without a support entry skipped). ``r`` is the
    forward's ``[z - tau]_+`` (as :func:`power_probs` returns it) with ``e = (2 - alpha) / (alpha -
    1)``, or the output ``p`` with ``e = 2 - alpha`` (``s`` is ``p^(2 - alpha)`` up to the row's
    scale, which cancels); ``e`` a float or an ``(R,)`` tensor. ``am1`` (``alpha - 1``, a float or
    ``(R,)``; ``r`` must then be ``p``): also alpha's gradient ``<grad, dp/dalpha>`` per row, from
    the same pass (see the C file); or ``da`` (``(R, n)``, :func:`power_probs`' ``dalpha``,
    ``dp/dalpha``) with ``r`` its ``s`` and ``e = 1``: alpha's gradient is ``<grad, da>`` (no
    logarithm; ``am1`` unread). ``e = 1`` and ``e = 0`` (without ``am1``) take no power: ``r``
    is then ``s`` itself (:func:`power_probs`' ``weights``, 1.5-entmax's ``sqrt(p)``) or ``p`` of
    sparsemax (``s`` its support's indicator). A NaN in ``r`` makes its row's gradients NaN. Returns ``(gx,
    galpha)``: ``gx`` a new ``(R, n)`` float32 tensor, ``galpha`` ``(R,)`` float32 (None without
    ``am1`` or ``da``); None where it does not serve (no library, not float32, a build without vector
    extensions). Rows split over torch's threads from :data:`POWER_SPLIT_MIN_NUMEL` entries."""
    lib = library()
    if lib is None or r.dtype not in _POWER_BACKWARD:
        return None
    rows, n = r.shape
    # (no-op conversions skipped: each costs a dispatch, at attention sizes a few percent of the call)
    r, grad = r.contiguous(), (grad if grad.dtype is r.dtype else grad.to(r.dtype)).contiguous()
    es = _RowValues(e, rows)
    a = _RowValues(am1, rows) if am1 is not None else None
    out = torch.empty_like(r)
    if da is not None:
        da = (da if da.dtype is r.dtype else da.to(r.dtype)).contiguous()
    ga = torch.empty(rows, dtype=torch.float32) if am1 is not None or da is not None else None
    if rows and not getattr(lib, _POWER_BACKWARD[r.dtype])(
            r.data_ptr(), grad.data_ptr(), rows, n, es.ptr, es.stride, None if a is None else a.ptr,
            0 if a is None else a.stride, None if da is None else da.data_ptr(), out.data_ptr(),
            None if ga is None else ga.data_ptr(),
            _threads(r.numel(), POWER_SPLIT_MIN_NUMEL)):
        return None
    return out, ga


def bound_threshold(z: Tensor, q: float, scale: float, exact_scale: bool,
                    max_iter: int) -> Optional[tuple[Tensor, Tensor, Tensor]]:
    """Exact threshold of ``scale * z`` for the rows ``z: (R, n)`` (CPU, float32/64, any values;
    detached), ``q`` in {1, 2}, relative to the row maximum as ``root_threshold(relative=True)``
    returns it: per row the maximum and the maxima of about 64-entry segments, whose own exact
    threshold bounds the row's from below; the entries ``v = scale (z - max)`` above that bound
    (no other can reach the threshold); on broad rows their moments: float32 rows whose every
    candidate is in the support get the closed form on all of them, verified by their minimum, with
    no Newton step; the others the Newton loop of :func:`newton_threshold` on the candidates alone,
    from the bound (or, on broad rows, the candidates' mean less ``k^(-1/q)``, or for 1.5-entmax
    the threshold of normal scores of their mean and variance, a guess its first step corrects
    from above), its closed form verified (see ``_newton_threshold.c``). ``exact_scale``: ``scale`` is a power of two (``v`` is then rounded
    as ``torch.add(-zmax * scale, z, alpha=scale)``, else as ``(z - zmax) * scale``). Returns
    ``(tau (R,), zmax (R,), ok (R,) bool)``: rows holding NaN or ``+inf`` get ``zmax`` NaN (``tau`` -1), rows
    without a finite entry ``tau = +inf`` and ``zmax = 0``; ``ok`` False for rows left unverified
    (the caller solves them otherwise; their ``tau`` is a lower bound of the threshold, so only the
    entries above it need sorting). None when the library is unavailable. Large inputs split
    their rows over torch's threads as :func:`newton_threshold`; no device is involved."""
    found = _bound(z, q, scale, exact_scale, max_iter, None)
    return None if found is None else found[:3]


def bound_entmax15(z: Tensor, max_iter: int, root: bool,
                   cube: bool) -> Optional[tuple[Tensor, Tensor, Tensor, Tensor, Optional[Tensor], Optional[Tensor]]]:
    """1.5-entmax of the rows ``z: (R, n)`` (CPU, float32/64; detached) in one native call:
    :func:`bound_threshold` (``q = 2``, scale 1/2), then, per row while it is in cache,
    ``r = [(-zmax/2 + z/2) - tau]_+`` and ``p = r * r`` as the torch forward rounds them (bit
    for bit on the same threshold). Returns ``(tau, zmax, ok, p, r, cube)``: ``p: (R, n)``,
    ``r`` (where ``root``, else None), ``cube: (R,)`` the row sums of ``r p = p^1.5`` taken in
    double (where ``cube``, else None); rows with ``ok`` False are not written (the caller fixes
    their threshold and computes them). None when the library is unavailable."""
    return _bound(z, 2.0, 0.5, True, max_iter, (root, cube))


def bound_sparsemax(z: Tensor, max_iter: int,
                    squares: bool) -> Optional[tuple[Tensor, Tensor, Tensor, Tensor, Optional[Tensor]]]:
    """Sparsemax of the rows ``z: (R, n)`` (CPU, float32/64; detached) in one native call:
    :func:`bound_threshold` (``q = 1``, scale 1), then, per row while it is in cache,
    ``p = [(z - zmax) - tau]_+`` as the torch forward rounds it (bit for bit on the same
    threshold). Returns ``(tau, zmax, ok, p, squares)``: ``p: (R, n)``, ``squares: (R,)`` the row
    sums of ``p^2`` taken in double (where ``squares``, else None); rows with ``ok`` False are not
    written (the caller fixes their threshold and computes them). None when the library is
    unavailable."""
    found = _bound(z, 1.0, 1.0, True, max_iter, (False, squares))
    return None if found is None else (*found[:4], found[5])


def _bound(z: Tensor, q: float, scale: float, exact_scale: bool, max_iter: int,
           outputs: Optional[tuple[bool, bool]]) -> Optional[tuple]:
    """The native bound threshold (``outputs=None``), or with the mapping's outputs
    (``outputs = (root, power_sum)``, ``q = 2`` at scale 1/2 or ``q = 1`` at scale 1): see
    :func:`bound_threshold`, :func:`bound_entmax15` and :func:`bound_sparsemax`."""
    lib = library()
    if lib is None or q not in (1.0, 2.0) or z.dtype not in _BOUND:
        return None
    rows, n = z.shape
    z = z.detach().contiguous()
    tau, zmax = torch.empty(rows, dtype=z.dtype), torch.empty(rows, dtype=z.dtype)
    ok = torch.empty(rows, dtype=torch.int32)
    p = r = power_sum = None
    if outputs is not None:
        p = torch.empty_like(z)
        r = torch.empty_like(z) if outputs[0] and q == 2.0 else None
        power_sum = torch.empty(rows, dtype=z.dtype) if outputs[1] else None
    threads = _threads(z.numel())
    scratch = torch.empty(threads * max(n, 1), dtype=z.dtype)  # per thread: the compacted candidates

    def ptr(t: Optional[Tensor]) -> Optional[int]:
        return None if t is None else t.data_ptr()

    if rows:
        getattr(lib, _BOUND[z.dtype])(
            z.data_ptr(), rows, n, int(q), float(scale), int(exact_scale), int(max_iter), tau.data_ptr(),
            zmax.data_ptr(), ok.data_ptr(), scratch.data_ptr(), ptr(p), ptr(r), ptr(power_sum), threads)
    return tau, zmax, ok.bool(), p, r, power_sum


def _threads(numel: int, split_min: Optional[int] = None) -> int:
    """Threads for a native call on ``numel`` entries: torch's count from ``split_min`` entries on
    (default :data:`NEWTON_SPLIT_MIN_NUMEL`; the library's OpenMP team, one where it was built
    without OpenMP), else one."""
    return torch.get_num_threads() if numel >= (NEWTON_SPLIT_MIN_NUMEL if split_min is None else split_min) else 1


def taut_string(x: Tensor, lengths: Tensor, lam_low: float, lam_up: float) -> Optional[tuple[Tensor, Tensor]]:
    """Taut strings of the row prefixes of ``x: (R, n)`` (CPU, float32/64; the first ``lengths[r]``
    entries of row ``r``, ``lengths: (R,)`` integers) through the gates ``r_k - lam_low <= s_k <=
    r_k + lam_up`` around the running sums, in one native call (``_taut_string.c``: the funnel
    scan a row at a time, pool-adjacent-violators for the isotonic fit ``lam_low = 0, lam_up =
    inf``; rows split over torch's threads): what :func:`nmt.sparse._taut_string.taut_string`
    computes, exact (sums and slopes in double). Returns ``(y, groups)``: the slopes (0 past the
    length), ``x``'s dtype, and each position's group, the first position of its straight segment
    (``m`` past the length), int64; None when the library is unavailable or the dtype is another.
    No device is involved."""
    return _prefix_fit(_TAUT, x, lengths, 2 * x.shape[-1] + 1, (float(lam_low), float(lam_up)))


def ordered_fit(keys: Tensor, lengths: Tensor, lam: float) -> Optional[tuple[Tensor, Tensor]]:
    """OSCAR's ordered fit of the row prefixes of ``keys: (R, n)`` (CPU, float32/64; ``lengths: (R,)``),
    the prox of ``lam * sum_{i<j} max(z_i, z_j)``, in one native call (``_taut_string.c``: a stable
    decreasing sort, the sorted keys less ``lam (m - 1 - k)``, pool-adjacent-violators, back in
    place; rows split over torch's threads): what :func:`nmt.sparse._prox_oscar.ordered_fit` computes.
    Returns ``(fit, groups)``: the fit (0 past the length; a row holding NaN: NaN), ``keys``' dtype,
    and each position's group, its block's first sorted position (``m`` past the length), int64;
    None when the library is unavailable or the dtype is another. No device is involved."""
    return _prefix_fit(_ORDERED, keys, lengths, 4 * keys.shape[-1], (float(lam),))


def _prefix_fit(functions: dict, x: Tensor, lengths: Tensor, scratch_doubles: int,
                params: tuple) -> Optional[tuple[Tensor, Tensor]]:
    """The call :func:`taut_string` and :func:`ordered_fit` share: rows ``x: (R, n)`` with their
    lengths, the entry point's ``params``, ``scratch_doubles`` a thread; ``(values, groups)`` or None."""
    lib = library()
    if lib is None or x.dtype not in functions:
        return None
    rows, n = x.shape
    x = x.detach().contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    out = torch.empty_like(x)
    groups = torch.empty(rows, n, dtype=torch.int64)
    threads = _threads(x.numel(), POWER_SPLIT_MIN_NUMEL)
    scratch = torch.empty(threads * scratch_doubles, dtype=torch.float64)
    if rows and n:
        getattr(lib, functions[x.dtype])(x.data_ptr(), rows, n, lengths.data_ptr(), *params, out.data_ptr(),
                                         groups.data_ptr(), scratch.data_ptr(), threads)
    return out, groups


def group_average(grad: Tensor, groups: Tensor, member: Tensor, n_groups: int) -> Optional[Tensor]:
    """:func:`nmt.sparse._groups.group_average` of ``grad: (R, n)`` (CPU, float32/64) in one native
    call (``_group_average.c``: per row the sums and counts over the ids ``groups: (R, n)`` int64 in
    ``[0, n_groups)``, in double, of the entries where ``member: (R, n)`` bool; rows split over
    torch's threads): every member entry gets its group's mean, the others 0. Returns a new
    ``(R, n)`` tensor of ``grad``'s dtype; None when the library is unavailable or the dtype is
    another. No device is involved."""
    lib = library()
    if lib is None or grad.dtype not in _GROUP:
        return None
    rows, n = grad.shape
    grad = grad.detach().contiguous()
    groups = groups.to(torch.int64).contiguous()
    member = member.to(torch.bool).contiguous().view(torch.uint8)
    out = torch.empty_like(grad)
    threads = _threads(grad.numel(), POWER_SPLIT_MIN_NUMEL)
    scratch = torch.empty(threads * 2 * max(1, n_groups), dtype=torch.float64)
    if rows and n:
        getattr(lib, _GROUP[grad.dtype])(grad.data_ptr(), groups.data_ptr(), member.data_ptr(), rows, n, int(n_groups),
                                         out.data_ptr(), scratch.data_ptr(), threads)
    return out


class _RowValues:
    """A per-row parameter as the power loops take it: ``ptr`` (the address of float64 values) and
    ``stride``: one value a row (stride 1) for a tensor of ``rows`` values, else the float's one value
    (stride 0, held in a ctypes double: no tensor made per call). Keep it alive across the call."""

    __slots__ = ("held", "ptr", "stride")

    def __init__(self, v: Union[float, Tensor], rows: int) -> None:
        if isinstance(v, Tensor):
            held = v.detach().reshape(rows)
            self.held = (held if held.dtype is torch.float64 else held.to(torch.float64)).contiguous()
            self.ptr, self.stride = self.held.data_ptr(), 1
        else:
            self.held = ctypes.c_double(float(v))
            self.ptr, self.stride = ctypes.addressof(self.held), 0


def _xent_serves(logp: Tensor) -> bool:
    """Whether the cross-entropy calls below take ``logp``: float32 ``(R, V)`` on the CPU, eager."""
    return (logp.dtype is torch.float32 and logp.device.type == "cpu" and logp.dim() == 2
            and not torch.compiler.is_compiling())


def xent_smoothing(z: Tensor, logp: Tensor) -> Optional[tuple[Tensor, Tensor, Tensor]]:
    """Cross-entropy's label-smoothing statistics in one native pass over ``z, logp: (R, V)`` (the
    scores and their ``log_softmax``; CPU float32, eager): ``(m, s, finite)``, ``m`` the number of
    finite scores (``z > -inf``) per row and ``s`` the sum of ``logp`` over them (in double; a NaN
    there: NaN), each ``(R,)`` float32, and ``finite`` the ``(R, V)`` bool mask of them (what the
    backward reads). None where it does not serve (see :func:`xent_backward`). Rows split over
    torch's threads from :data:`POWER_SPLIT_MIN_NUMEL` entries."""
    if not _xent_serves(logp) or z.dtype is not torch.float32:
        return None
    if z.shape != logp.shape:
        raise ValueError(f"scores {tuple(z.shape)} and log-probabilities {tuple(logp.shape)} differ in shape")
    lib = library()
    if lib is None:
        return None
    rows, n = logp.shape
    z, logp = z.contiguous(), logp.contiguous()
    m, sums = torch.empty(rows), torch.empty(rows)
    finite = torch.empty(rows, n, dtype=torch.bool)  # (bytes 0 / 1)
    if rows and not getattr(lib, _XENT_SMOOTHING[logp.dtype])(
            z.data_ptr(), logp.data_ptr(), rows, n, m.data_ptr(), sums.data_ptr(), finite.data_ptr(),
            _threads(logp.numel(), POWER_SPLIT_MIN_NUMEL)):
        return None
    return m, sums, finite


def xent_backward(logp: Tensor, finite: Optional[Tensor], index: Tensor, a: Optional[Tensor], eps: float,
                  g: Tensor) -> Optional[Tensor]:
    """Cross-entropy's ``J^T g`` at class indices in one native pass (``_cross_entropy.c``):
    ``(p - y) g`` per row of ``logp: (R, V)`` (the forward's ``log_softmax``; ``p = exp(logp)``, NaN
    rows 0), ``y`` the target: ``1 - eps`` at ``index: (R,)`` (int64 in ``[0, V)``, as the loss's forward
    checked: not read on the host again) plus, with label smoothing, ``a: (R,)`` on the classes of the bool mask ``finite:
    (R, V)`` (the forward's ``z > -inf``; None without smoothing); ``g: (R,)`` the rows' gradients
    (0 for ignored rows: zeros). CPU float32 (``logp``, ``a``, ``g``), eager; a new ``(R, V)``
    float32 tensor, or None where it does not serve (no library, another dtype or device, compiled,
    a build without vector extensions). ``p`` by the polynomial of ``_float_math.h`` (``VEXPF``):
    within 1.5 float32 ulps of ``exp`` (torch's float32 ``exp``: about one). Rows split over torch's threads from
    :data:`POWER_SPLIT_MIN_NUMEL` entries; no device is involved. Not differentiable itself (a
    caller that needs the backward's graph takes torch's operations)."""
    if not _xent_serves(logp):
        return None
    rows, n = logp.shape
    if index.shape != (rows,) or (finite is not None and finite.shape != logp.shape):
        raise ValueError(f"xent_backward: index {tuple(index.shape)} or mask "
                         f"{None if finite is None else tuple(finite.shape)} do not fit log-probabilities "
                         f"{tuple(logp.shape)}")
    lib = library()
    if lib is None:
        return None
    logp = logp.contiguous()
    finite = finite.to(torch.bool).contiguous() if a is not None else None
    a = a.to(torch.float32).contiguous() if a is not None else None
    index = index.to(torch.int64).contiguous()
    g = g.to(torch.float32).contiguous()
    out = torch.empty_like(logp)
    if rows and not getattr(lib, _XENT[logp.dtype])(
            logp.data_ptr(), finite.data_ptr() if finite is not None else None, rows, n, index.data_ptr(),
            a.data_ptr() if a is not None else None, 1.0 - float(eps), g.data_ptr(), out.data_ptr(),
            _threads(logp.numel(), POWER_SPLIT_MIN_NUMEL)):
        return None
    return out


SUPPORT_BACKWARD_MIN_N = 8
"""Shortest float32 rows whose sparsemax / 1.5-entmax backward :func:`support_backward_serves`
(shorter rows go entry by entry there: torch's passes are faster, (65536, 4) 0.35 against 0.71 ms;
from 8 entries on the native pass is, (32768, 8) 0.12 against 0.22 ms, (1024, 8000) 1.4 against
2.4-3.2 ms, 2 threads)."""


def support_backward_serves(s: Tensor) -> bool:
    """Whether :func:`support_backward` is the faster route for ``s``: float32 CPU rows of at least
    :data:`SUPPORT_BACKWARD_MIN_N` entries, eager, the library loaded."""
    return (s.dtype is torch.float32 and s.device.type == "cpu" and s.shape[-1] >= SUPPORT_BACKWARD_MIN_N
            and not torch.compiler.is_compiling() and library() is not None)


def support_backward(s: Tensor, grad: Tensor, indicator: bool) -> Tensor:
    """``J^T grad`` of sparsemax / 1.5-entmax per row of ``s, grad: (R, n)`` (CPU, one float dtype):
    ``w * (grad - <w, grad> / sum w)`` with ``w = s`` (1.5-entmax: ``s = sqrt(p)``) or, where
    ``indicator``, ``w = sign(s)`` (sparsemax: ``s = p``, the sum clamped at 1); sums in double.
    float32 rows take :func:`power_backward` at ``e = 1`` / ``e = 0`` (no power; vectors, rows split
    over torch's threads), float64 rows a scalar loop. The library must be loaded (:func:`available`)."""
    lib = library()
    assert lib is not None, "support_backward needs the native library"
    if s.dtype is torch.float32:
        found = power_backward(s, grad, 0.0 if indicator else 1.0)
        if found is not None:  # (not in a build without vector extensions)
            return found[0]
    rows, n = s.shape
    s, grad = s.contiguous(), grad.to(s.dtype).contiguous()
    out = torch.empty_like(s)
    getattr(lib, _FUNCTIONS[s.dtype] + "_backward")(s.data_ptr(), grad.data_ptr(), rows, n,
                                                     int(indicator), out.data_ptr())
    return out


__all__ = ["CANDIDATES_SOURCE", "CFLAGS", "HEADERS", "MAX_CANDIDATES", "NEWTON_SOURCE", "NEWTON_SPLIT_MIN_NUMEL", "NativeLibrary",
           "OPENMP_FLAGS", "POWER_LONG_SCRATCH", "power_long_scratch", "POWER_PROBS_MAX_N", "POWER_STATS", "POWER_SOURCE", "POWER_SPLIT_MIN_NUMEL", "SOURCE", "SOURCES", "available", "bound_entmax15",
           "bound_sparsemax", "bound_threshold", "build", "cache_dir", "load_once",
           "enabled", "library", "load", "native_sorted_shifted_threshold", "newton_threshold", "power_backward", "power_probs", "power_threshold",
           "solve", "sorted_probs", "step_candidates", "taut_string", "ordered_fit", "group_average", "TAUT_SOURCE", "GROUP_SOURCE", "support_backward", "support_backward_serves", "SUPPORT_BACKWARD_MIN_N", "XENT_SOURCE", "xent_backward", "xent_smoothing"]
