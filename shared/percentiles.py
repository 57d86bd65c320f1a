"""Percentiles as numpy computes them ("linear"), fast for the small lists a window has: one
definition for the metrics (core/metrics.py) and the gateway's event-loop lag (gateway/looplag.py),
in the contract so that a backend needs nothing from the environment's core to use it.
"""

from __future__ import annotations

import math

import numpy as np
from llmserve_env.shared.jit import HAVE_NUMBA, njit
from llmserve_env.shared.records import ItlSamples

# Below this many samples a sorted Python list beats numpy's per-call overhead (same results).
_NUMPY_MIN = 128


def percentiles(values: list[float] | np.ndarray, *qs: float) -> list[float]:
    """numpy's default ("linear") percentiles of `values` (one sort for all), 0.0 for an empty list."""
    n = len(values)
    if n == 0:
        return [0.0] * len(qs)
    if n >= _NUMPY_MIN:
        arr = np.sort(np.asarray(values, dtype=np.float64))
        if arr[-1] != arr[-1]:  # a NaN (sorted last): numpy's own rules for it
            return [float(x) for x in np.percentile(arr, qs)]
        return [_numpy_linear(arr, q) for q in qs]
    s = sorted(values.tolist() if isinstance(values, np.ndarray) else values)
    out = []
    for q in qs:
        pos = (n - 1) * q / 100.0
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        out.append(s[lo] + (s[hi] - s[lo]) * (pos - lo))
    return out


def _numpy_linear(s: np.ndarray, q: float) -> float:
    """np.percentile(s, q) of a sorted, NaN-free array, its "linear" method operation for operation (numpy 2's
    _quantile and _lerp: the virtual index (n - 1) x q / 100, and the lerp taken from the upper neighbour at
    weights from 0.5 on), without its per-call machinery, which was most of a window's metrics. Bit for bit
    numpy's value (tests/test_metrics.py compares them exactly)."""
    n = s.shape[0]
    virtual = (n - 1) * (q / 100.0)
    if virtual >= n - 1:
        return float(s[-1])
    lo = math.floor(virtual)
    a, b = s[lo], s[lo + 1]
    t = virtual - lo
    diff = b - a
    return float(b - diff * (1 - t)) if t >= 0.5 else float(a + diff * t)


def weighted_percentiles(samples: list[tuple[float, int]] | ItlSamples, *qs: float) -> list[float]:
    """Percentiles of `samples` expanded (value repeated count times), numpy's linear method. `samples`
    are (value, count) pairs, or their columns (shared/records.py `ItlSamples`: the same results)."""
    if isinstance(samples, ItlSamples):
        if len(samples) < _NUMPY_MIN:
            return _weighted_few(samples.rows(), qs)
        return _weighted_many(samples.gap_s, samples.count, int(samples.count.sum()), qs)
    if len(samples) < _NUMPY_MIN:
        return _weighted_few(samples, qs)
    total = 0
    for _, c in samples:
        total += c
    arr = np.asarray(samples, dtype=np.float64)
    return _weighted_many(arr[:, 0], arr[:, 1], total, qs)


def _weighted_many(values: np.ndarray, counts: np.ndarray, total: int, qs: tuple[float, ...]) -> list[float]:
    """`weighted_percentiles` of many pairs: compiled where numba imports, else by numpy (the same values:
    tests/test_metrics.py compares them exactly)."""
    if total <= 0:
        return [0.0] * len(qs)
    if HAVE_NUMBA:
        out = np.empty(len(qs))
        _weighted_sorted(values, np.asarray(counts, dtype=np.int64), total, np.array(qs, dtype=np.float64), out)
        return out.tolist()
    return _weighted_numpy(values, counts, total, qs)


@njit
def _weighted_sorted(values: np.ndarray, counts: np.ndarray, total: int, qs: np.ndarray, out: np.ndarray) -> None:
    """`_weighted_numpy`'s values in one call: the pairs sorted by value (stable, as numpy's), then one walk
    of the running count per percentile, stopping at the ranks it needs; the same float operations."""
    order = np.argsort(values, kind="mergesort")
    n = values.shape[0]
    for i in range(qs.shape[0]):
        pos = (total - 1) * qs[i] / 100.0
        lo = int(pos)
        first, second = lo + 1, min(lo + 1, total - 1) + 1  # the running counts that reach ranks lo and lo + 1
        v_lo = v_hi = values[order[n - 1]]
        found_lo = False
        seen = 0
        for j in range(n):
            seen += counts[order[j]]
            if not found_lo and seen >= first:
                v_lo, found_lo = values[order[j]], True
            if seen >= second:
                v_hi = values[order[j]]
                break
        out[i] = v_lo + (v_hi - v_lo) * (pos - lo)


def warm() -> None:
    """Compile (or load from numba's cache) the weighted walk before the first window needs it."""
    if HAVE_NUMBA:
        _weighted_sorted(np.ones(2), np.ones(2, dtype=np.int64), 2, np.array([50.0]), np.empty(1))


def _weighted_numpy(values: np.ndarray, counts: np.ndarray, total: int, qs: tuple[float, ...]) -> list[float]:
    """`weighted_percentiles` by numpy: a stable sort by value and the counts' running sum."""
    order = np.argsort(values, kind="stable")
    vals = values[order]
    cum = np.cumsum(counts[order])  # whole counts: the same sums as floats or as integers
    out = []
    for q in qs:
        pos = (total - 1) * q / 100.0
        lo = int(pos)
        # the k-th expanded value (0-based) is the first whose cumulative count exceeds k
        v_lo = vals[int(np.searchsorted(cum, lo + 1))]
        v_hi = vals[int(np.searchsorted(cum, min(lo + 1, total - 1) + 1))]
        out.append(float(v_lo + (v_hi - v_lo) * (pos - lo)))
    return out


def _weighted_few(samples: list[tuple[float, int]], qs: tuple[float, ...]) -> list[float]:
    """`weighted_percentiles` of a few pairs: a sorted Python list walked once per percentile."""
    total = 0
    for _, c in samples:
        total += c
    if total <= 0:
        return [0.0] * len(qs)
    s = sorted(samples)
    out = []
    for q in qs:
        pos = (total - 1) * q / 100.0
        lo = int(pos)
        hi = min(lo + 1, total - 1)
        v_lo = v_hi = s[-1][0]
        seen = 0
        found_lo = False
        for v, c in s:
            if c <= 0:
                continue
            seen += c
            if not found_lo and seen > lo:
                v_lo, found_lo = v, True
            if seen > hi:
                v_hi = v
                break
        out.append(v_lo + (v_hi - v_lo) * (pos - lo))
    return out
