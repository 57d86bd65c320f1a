"""Episodes must not depend on the CPU: NumPy's transcendental ufuncs stay off every result path.

NumPy runs np.exp, np.log, np.power, np.cos, np.log1p (and the rest below) on kernels of its own where the CPU has
AVX-512 and on the C library's functions elsewhere; the two differ in the last bit, which moved whole episodes
(the golden digests of one kind of machine failed on the other). shared/portable_math.py gives the C library's
answers on every CPU; these tests keep the package on it and check that its answers are the C library's.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
from llmserve_env.shared import portable_math as pm

ROOT = Path(__file__).resolve().parents[1]
# ufuncs whose NumPy kernel depends on the CPU's SIMD extensions (AVX-512 / SVML against the C library)
CPU_DEPENDENT = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "power", "float_power", "cos", "sin",
                 "tan", "arccos", "arcsin", "arctan", "arctan2", "cosh", "sinh", "tanh", "arccosh", "arcsinh",
                 "arctanh", "cbrt",
                 # BLAS: its kernels (and so their sums' order) are chosen by the CPU too
                 "dot", "matmul", "einsum", "inner", "vdot", "tensordot", "linalg"}
# what runs when an episode is served, graded, planned or acted in (the calibration fits run offline; training
# is torch's own arithmetic)
RESULT_PATHS = ("shared", "sim", "core", "agents", "server", "gateway")
OFFLINE = ("sim/calibration/",)


def _numpy_calls(source: str, name: str) -> list[str]:
    tree = ast.parse(source, filename=name)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in CPU_DEPENDENT and isinstance(node.value, ast.Name) \
                and node.value.id in ("np", "numpy"):
            out.append(f"{name}:{node.lineno} np.{node.attr}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            out.append(f"{name}:{node.lineno} @")
    return out


def test_no_cpu_dependent_numpy_ufunc_on_a_result_path():
    found = []
    for folder in RESULT_PATHS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "shared/portable_math.py" or rel.startswith(OFFLINE):
                continue
            found += _numpy_calls(path.read_text(), rel)
    assert not found, ("NumPy's own kernels for these differ between CPUs (AVX-512 or not): use "
                       f"shared/portable_math.py instead: {found}")


def test_the_scan_finds_a_call_it_must_refuse():
    """(The scan above can fail: a module calling np.exp and numpy.power or multiplying matrices is reported, line by
    line; np.sqrt, correctly rounded on every CPU, is not.)"""
    source = "import numpy as np\nimport numpy\nx = np.exp(1.0)\ny = numpy.power(2.0, 3.0)\nz = np.sqrt(4.0)\nw = x @ y\n"
    assert sorted(_numpy_calls(source, "probe.py")) == ["probe.py:3 np.exp", "probe.py:4 np.power", "probe.py:6 @"]


@pytest.mark.parametrize(("fn", "ref", "lo", "hi"), [
    (pm.exp, math.exp, -700.0, 700.0),
    (pm.log, math.log, 1e-300, 1e300),
    (pm.log1p, math.log1p, -0.999, 1e12),
    (pm.cos, math.cos, -1e4, 1e4),
    (pm.tanh, math.tanh, -20.0, 20.0),
])
def test_each_function_is_the_c_librarys_on_scalars_and_arrays_of_any_shape(fn, ref, lo, hi):
    x = np.random.default_rng(7).uniform(lo, hi, 3000)
    want = [ref(v) for v in x.tolist()]
    got = fn(x)
    assert got.dtype == np.float64 and got.shape == x.shape
    assert got.tolist() == want  # bit for bit
    assert fn(x.reshape(30, 100)).reshape(-1).tolist() == want
    assert fn(float(x[5])) == want[5] and type(fn(float(x[5]))) is float
    assert fn(x[5]) == want[5]  # an np.float64
    assert fn(np.asarray(x[5])) == want[5]  # a 0-d array


def test_power_broadcasts_and_is_c_pow():
    rng = np.random.default_rng(3)
    base, expo = rng.uniform(0.0, 1e6, (40, 1)), rng.uniform(-3.0, 3.0, (1, 25))
    got = pm.power(base, expo)
    assert got.shape == (40, 25)
    assert got.tolist() == [[math.pow(b, e) for e in expo[0].tolist()] for b in base[:, 0].tolist()]
    assert pm.power(0.9, np.arange(1, 5, dtype=np.float64)).tolist() == [math.pow(0.9, k) for k in range(1, 5)]
    assert pm.power(2.0, 0.5) == math.pow(2.0, 0.5)


def test_where_the_math_module_raises_the_answer_is_numpys():
    with np.errstate(all="ignore"):
        assert pm.exp(np.array([1000.0, 0.0])).tolist() == np.exp(np.array([1000.0, 0.0])).tolist() == [math.inf, 1.0]
        assert pm.exp(1000.0) == math.inf
        got = pm.log(np.array([0.0, -1.0, math.e]))
        assert got[0] == -math.inf and math.isnan(got[1]) and got[2] == math.log(math.e)
        got = pm.log1p(np.array([-1.0, -2.0]))
        assert got[0] == -math.inf and math.isnan(got[1])
        got = pm.power(np.array([0.0, -8.0, 1e300]), np.array([-1.0, 1.0 / 3.0, 2.0]))
        assert got[0] == math.inf and math.isnan(got[1]) and got[2] == math.inf


def test_the_python_loop_where_numba_is_missing_gives_the_same_bits(monkeypatch):
    x = np.random.default_rng(11).uniform(-50.0, 50.0, 500)
    compiled = (pm.exp(x), pm.cos(x), pm.tanh(x), pm.log(np.abs(x)), pm.log1p(np.abs(x)), pm.power(np.abs(x), x / 7.0))
    monkeypatch.setattr(pm, "_KERNELS", {})  # as where numba is missing (or uses SVML)
    python = (pm.exp(x), pm.cos(x), pm.tanh(x), pm.log(np.abs(x)), pm.log1p(np.abs(x)), pm.power(np.abs(x), x / 7.0))
    for a, b in zip(compiled, python, strict=True):
        assert a.tolist() == b.tolist()
