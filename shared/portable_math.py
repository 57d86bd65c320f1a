"""exp, log, log1p, cos, tanh and pow that give the same bits on every x86-64 CPU: the C library's, element by element.

NumPy picks each transcendental ufunc's kernel by the CPU it runs on: on a CPU with AVX-512 (most Intel
servers) `np.exp`, `np.log`, `np.power`, `np.cos`, `np.log1p` run its own AVX-512 kernels (Intel's SVML for
some), elsewhere (an AMD EPYC without AVX-512, say) the C library's functions. The two differ in the last bit
for some inputs, and one last bit in a step time or a drawn prompt length moves an episode's trajectory: the
same task, seed and actions graded differently on two machines (the golden digests written on one kind of
machine failed on the other; found at stop 73). Every result path (workloads, scenario days, step-time tables,
the planner's forecast, the learned policies' layers) calls these instead; `tests/test_portable_math.py` keeps NumPy's ufuncs off those
paths. On a CPU without AVX-512 NumPy's results are these, bit for bit (the C library's `exp`, `log`, `pow`,
`cos`, `log1p`), so nothing moved there.

Scalars give a Python float; arrays (any shape) a float64 array of the same shape. Where C's function
returns inf or nan (NumPy's answer) Python's math module raises instead: that element is answered as NumPy
would (overflow to inf, log(0) to -inf, a domain error to nan). Arrays go through small compiled loops where numba
is installed (a few ns an element), else Python's (~0.13 us); the engine's own compiled kernels call the C library
themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, overload

import numpy as np

__all__ = ["cos", "exp", "log", "log1p", "power", "tanh"]


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _log(x: float) -> float:
    try:
        return math.log(x)
    except ValueError:  # C: log(0) = -inf, log(x < 0) = nan
        return -math.inf if x == 0.0 else math.nan


def _log1p(x: float) -> float:
    try:
        return math.log1p(x)
    except ValueError:
        return -math.inf if x == -1.0 else math.nan


def _pow(x: float, y: float) -> float:
    try:
        return math.pow(x, y)
    except OverflowError:
        return math.inf
    except ValueError:  # a negative base with a non-integer exponent (C: nan), or 0 to a negative power (inf)
        return math.inf if x == 0.0 else math.nan


# Compiled (`_kernel`): each element one call to the C library's function (numba's math functions are the C library's,
# unless it found Intel's SVML, whose vector kernels are the CPU's own again: then the Python loop). ~5-10 ns an
# element against ~0.13 us in Python: a day's arrivals are drawn at every reset.
def _exp_into(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.shape[0]):
        out[i] = math.exp(x[i])


def _log_into(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.shape[0]):
        out[i] = math.log(x[i])


def _log1p_into(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.shape[0]):
        out[i] = math.log1p(x[i])


def _cos_into(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.shape[0]):
        out[i] = math.cos(x[i])


def _tanh_into(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.shape[0]):
        out[i] = math.tanh(x[i])


def _pow_into(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.shape[0]):
        out[i] = math.pow(x[i], y[i])


_KERNELS: dict[str, Callable[..., None]] | None = None


def _kernel(name: str) -> Callable[..., None] | None:
    """The compiled loop `name` (`_exp_into`, ...), or None where numba is missing or uses SVML. Compiled on first
    use: importing this module (the workloads, the scenarios) does not import numba."""
    global _KERNELS
    if _KERNELS is None:
        from llmserve_env.shared.jit import HAVE_NUMBA, njit_borrowing

        usable = False
        if HAVE_NUMBA:
            from numba import config

            usable = not getattr(config, "USING_SVML", False)
        loops = (_exp_into, _log_into, _log1p_into, _cos_into, _tanh_into, _pow_into)
        _KERNELS = {f.__name__: njit_borrowing(f) for f in loops} if usable else {}
    return _KERNELS.get(name)


def _elementwise(fast: Callable[..., float], safe: Callable[..., float], loop: str, *args: Any) -> Any:
    """fast(*args) element by element over the broadcast arguments: scalars give a float (`safe`: NumPy's answer
    where Python's math raises), arrays an array of their broadcast shape (the compiled loop `loop` where usable)."""
    if all(isinstance(v, float | int) for v in args):  # (np.float64 is a float)
        return safe(*(float(v) for v in args))
    arrays = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in args))
    shape = arrays[0].shape
    if not shape:
        return safe(*(float(v) for v in arrays))
    compiled = _kernel(loop)
    if compiled is not None:
        flats = [np.ascontiguousarray(v).reshape(-1) for v in arrays]
        out = np.empty_like(flats[0])
        compiled(*flats, out)
        return out.reshape(shape)
    lists = [v.ravel().tolist() for v in arrays]
    try:
        values = list(map(fast, *lists))
    except (OverflowError, ValueError):  # rare: the element-wise answers C (and NumPy) give
        values = list(map(safe, *lists))
    return np.array(values, dtype=np.float64).reshape(shape)


@overload
def exp(x: float) -> float: ...
@overload
def exp(x: np.ndarray) -> np.ndarray: ...
def exp(x: Any) -> Any:
    """e**x, as the C library computes it."""
    return _elementwise(math.exp, _exp, "_exp_into", x)


@overload
def log(x: float) -> float: ...
@overload
def log(x: np.ndarray) -> np.ndarray: ...
def log(x: Any) -> Any:
    """The natural logarithm, as the C library computes it."""
    return _elementwise(math.log, _log, "_log_into", x)


@overload
def log1p(x: float) -> float: ...
@overload
def log1p(x: np.ndarray) -> np.ndarray: ...
def log1p(x: Any) -> Any:
    """log(1 + x), as the C library computes it."""
    return _elementwise(math.log1p, _log1p, "_log1p_into", x)


@overload
def cos(x: float) -> float: ...
@overload
def cos(x: np.ndarray) -> np.ndarray: ...
def cos(x: Any) -> Any:
    """The cosine (radians), as the C library computes it."""
    return _elementwise(math.cos, math.cos, "_cos_into", x)


@overload
def tanh(x: float) -> float: ...
@overload
def tanh(x: np.ndarray) -> np.ndarray: ...
def tanh(x: Any) -> Any:
    """The hyperbolic tangent, as the C library computes it."""
    return _elementwise(math.tanh, math.tanh, "_tanh_into", x)


def power(x: Any, y: Any) -> Any:
    """x**y, as the C library's pow computes it; x and y broadcast as NumPy's do (two scalars: a float)."""
    return _elementwise(math.pow, _pow, "_pow_into", x, y)
