"""The AVX-512 double powers of ``nmt/sparse/_power_threshold.c`` (``POW512``: the long rows' Newton
passes of alpha-entmax): its two polynomials are the Taylor series of ``ln(1 + r)`` and ``2^f``
economised on ``|r|, |f| <= 1/32`` (Chebyshev), derived here again in exact rationals with their
bounds, and the macro itself, compiled into a small library beside the source, is checked entry by
entry against Python's ``math.pow`` (the C library's, within an ulp) on arguments across the range
the loop meets."""
import ctypes
import math
import random
import re
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest

from nmt.sparse import _native

LN2 = Fraction("0.69314718055994530941723212145817656807550013436025525412068000949339362196969471560586")
H = Fraction(1, 32)


def chebyshev(n: int) -> list:
    """Monomial coefficients of T_0 .. T_n (exact)."""
    t = [[Fraction(1)], [Fraction(0), Fraction(1)]]
    for k in range(2, n + 1):
        a = [Fraction(0)] + [2 * c for c in t[k - 1]]
        b = t[k - 2] + [Fraction(0)] * (len(a) - len(t[k - 2]))
        t.append([x - y for x, y in zip(a, b)])
    return t[: n + 1]


def economise(coef: list, h: Fraction, degree: int) -> tuple:
    """The polynomial ``sum coef[j] r^j`` on ``|r| <= h`` cut to ``degree`` in the Chebyshev basis of
    ``r / h``: (its monomial coefficients in ``r``, the sum of the dropped Chebyshev coefficients'
    magnitudes, a bound of the difference on the interval)."""
    n = len(coef) - 1
    rem = [c * h ** j for j, c in enumerate(coef)]
    t = chebyshev(n)
    ch = [Fraction(0)] * (n + 1)
    for k in range(n, -1, -1):
        ch[k] = rem[k] / t[k][k]
        for j in range(k + 1):
            rem[j] -= ch[k] * t[k][j]
    mono = [Fraction(0)] * (degree + 1)
    for k in range(degree + 1):
        for j in range(k + 1):
            mono[j] += ch[k] * t[k][j]
    return [m / h ** j for j, m in enumerate(mono)], sum(abs(c) for c in ch[degree + 1:])


def log_polynomial() -> tuple:
    """log2(1 + r) = r P(r): P's coefficients (lowest first, exact) and the bound of |log2(1 + r) - r P(r)|
    on |r| <= 1/32 (dropped Chebyshev terms, the constant left out, the Taylor tail after r^16)."""
    taylor = [Fraction(0)] + [Fraction((-1) ** (j + 1), j) for j in range(1, 17)]
    mono, dropped = economise(taylor, H, 8)
    bound = (dropped + abs(mono[0]) + H ** 17 / 17) / LN2
    return [c / LN2 for c in mono[1:]], bound


def exp_polynomial() -> tuple:
    """2^f's polynomial of degree 6 (lowest first, exact) and its relative bound on |f| <= 1/32."""
    taylor = [LN2 ** j / math.factorial(j) for j in range(18)]
    mono, dropped = economise(taylor, H, 6)
    tail = (LN2 * H) ** 18 / math.factorial(18) * 2
    return mono, (dropped + tail) / Fraction(97, 100)  # (2^f >= 2^(-1/32) > 0.97: relative)


def macro_coefficients() -> tuple:
    """The constants of POW512's two Horner chains in the C file (highest degree first): LOG2_512's
    and EXP2_512's, the halves POW512_MASKED takes."""
    text = (Path(_native.__file__).with_name("_power_threshold.c")).read_text()
    body = text[text.index("#define LOG2_512"):]
    body = body[: body.index("#define POW512_MASKED")]
    chains = re.findall(r"__m512d ([px])_ = _mm512_set1_pd\(([-0-9.e]+)\);((?:\s*\\?\s*\1_ = _mm512_fmadd_pd\(\1_, [rf]_, _mm512_set1_pd\([-0-9.e]+\)\);)+)", body)
    out = {}
    for name, first, rest in chains:
        out[name] = [float(first)] + [float(v) for v in re.findall(r"_mm512_set1_pd\(([-0-9.e]+)\)", rest)]
    return out["p"], out["x"]


def test_the_polynomials_are_the_economised_series_and_their_bounds_hold():
    """The C file's constants are the economised series rounded to doubles, and the dropped terms
    stay within what its comment states (1.9e-17 in log2, 7.0e-18 relative in 2^f)."""
    p_c, x_c = macro_coefficients()
    p_exact, p_bound = log_polynomial()
    x_exact, x_bound = exp_polynomial()
    assert p_c == [float(c) for c in reversed(p_exact)]
    assert x_c == [float(c) for c in reversed(x_exact)]
    assert float(p_bound) < 1.9e-17 and float(x_bound) < 7.2e-18
    # and a sampled check in exact arithmetic of the rounded coefficients (the bound plus their rounding)
    for i in range(-64, 65):
        r = H * Fraction(i, 64)
        approx = r * sum(Fraction(c) * r ** j for j, c in enumerate(reversed(p_c)))
        exact = sum(Fraction((-1) ** (j + 1), j) * r ** j for j in range(1, 40)) / LN2
        assert abs(approx - exact) < Fraction(3, 10 ** 17), (i, float(approx - exact))
        f = H * Fraction(i, 64)
        approx = sum(Fraction(c) * f ** j for j, c in enumerate(reversed(x_c)))
        exact = sum(LN2 ** j * f ** j / math.factorial(j) for j in range(30))
        assert abs(approx / exact - 1) < Fraction(2, 10 ** 17), (i, float(approx / exact - 1))


SHIM = r"""
#include "%s"
#ifdef NMT_WIDE_AVX512
AVX512 void pow512_rows(const double *d, const double *e, double *out, long n)
{
    POW512_TABLES;
    for (long i = 0; i + 8 <= n; i += 8) {
        __m512d o;
        POW512(_mm512_loadu_pd(d + i), _mm512_loadu_pd(e + i), o);
        _mm512_storeu_pd(out + i, o);
    }
}
int pow512_here(void) { return CPU_HAS_AVX512(); }
#else
int pow512_here(void) { return 0; }
#endif
"""


def test_pow512_against_the_c_library(tmp_path):
    """POW512 on d from 1e-300 to 4 (and near 1, where log2 d nearly cancels) and e from 0.1 to 9
    (q - 1 at alpha 1.1-1.9), with |e log2 d| up to 1000: relative error below 4 eps + ln 2 |y| eps
    (the rounding of y = e log2 d) against ``math.pow``; y below -1022 gives 0."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "shim.c"
    src.write_text(SHIM % (Path(_native.__file__).with_name("_power_threshold.c")))
    lib_path = tmp_path / "shim.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-ffp-contract=off", "-std=c99", str(src), "-o", str(lib_path), "-lm"],
                   check=True, capture_output=True)
    lib = ctypes.CDLL(str(lib_path))
    if not lib.pow512_here():
        pytest.skip("no AVX-512 here")
    rng = random.Random(7)
    d, e = [], []
    for i in range(40000):
        kind = i % 4
        ei = rng.uniform(0.1, 9.0)
        if kind == 0:
            di = 10 ** rng.uniform(-300 / max(ei, 1.0) * 0.33, math.log10(4))
        elif kind == 1:
            di = 1 + rng.uniform(-1e-3, 1e-3)
        elif kind == 2:
            di = rng.uniform(1e-3, 1.0)
        else:  # every top-four-bit cell of the mantissa, at its edges
            di = (1 + (rng.randrange(16) + rng.choice([0.0, 1e-15, 0.5, 1 - 1e-15])) / 16) * 2.0 ** rng.randrange(-40, 2)
        d.append(di)
        e.append(ei)
    d += [2.0 ** -1060 * 3, 1e-200, 1.0, 2.0, 0.5]
    e += [0.5, 6.0, 3.0, 1.0, 2.0]
    while len(d) % 8:
        d.append(1.0)
        e.append(1.0)
    n = len(d)
    arr = ctypes.c_double * n
    out = arr()
    lib.pow512_rows(arr(*d), arr(*e), out, ctypes.c_long(n))
    eps = 2.0 ** -52
    worst = 0.0
    for di, ei, oi in zip(d, e, out):
        y = ei * math.log2(di)
        if y < -1022:
            assert oi == 0.0
            continue
        want = math.pow(di, ei)
        rel = abs(oi - want) / want
        bound = 4 * eps + math.log(2) * abs(y) * eps * 1.5
        worst = max(worst, rel / bound)
        assert rel <= bound, (di, ei, oi, want, rel)
    print("worst relative error over its bound", worst)
    assert worst > 0.0  # (the comparison ran)
