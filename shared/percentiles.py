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
# From this many (value, count) pairs on, where numba imports, the compiled selection (`_weighted_ranks`)
# beats both: it finds the two ranks each percentile needs without sorting. (Unweighted, numpy's
# vectorised sort is faster than selecting.)
_SELECT_MIN = 16
# From this many values on, a selection first bins them (`_bucket_ranks`: a pass for the range, one to bin them,
# then the bin holding each rank) rather than partitioning them all by quickselect, whose unpredictable three-way
# branch made a cluster window's ~600 ITL pairs cost ~22 us (~7 us binned; from 64 pairs on the binning is the
# faster, timed on this machine).
_BUCKET_MIN = 64


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
    if HAVE_NUMBA and isinstance(values, np.ndarray) and values.dtype == np.float64 and values.ndim == 1:
        got = np.empty(len(qs))
        if _few(values, _qs_array(qs), got):  # the same values as below, in one compiled call
            return got.tolist()
    s: list[float] | np.ndarray
    if isinstance(values, np.ndarray):
        s = np.sort(values, kind="stable")
        if s[-1] != s[-1]:  # a NaN: placed as sorted() places it
            s = sorted(values.tolist())
    else:
        s = sorted(values)
    out = []
    for q in qs:
        pos = (n - 1) * q / 100.0
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        # the same float operations on a sorted array's elements as on the list's (float64 either way)
        out.append(float(s[lo] + (s[hi] - s[lo]) * (pos - lo)))
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
    n = len(samples)
    if isinstance(samples, ItlSamples):
        if HAVE_NUMBA and n >= _SELECT_MIN:
            got = _selected(samples.gap_s, np.asarray(samples.count, dtype=np.int64), qs)
            if got is not None:
                return got
        if n < _NUMPY_MIN:
            return _weighted_few(samples.rows(), qs)
        return _weighted_numpy(samples.gap_s, samples.count, int(samples.count.sum()), qs)
    if HAVE_NUMBA and n >= _SELECT_MIN:
        pairs = np.asarray(samples, dtype=np.float64)
        got = _selected(pairs[:, 0].copy(), pairs[:, 1].astype(np.int64), qs)
        if got is not None:
            return got
    if n < _NUMPY_MIN:
        return _weighted_few(samples, qs)
    total = 0
    for _, c in samples:
        total += c
    arr = np.asarray(samples, dtype=np.float64)
    return _weighted_numpy(arr[:, 0], arr[:, 1], total, qs)


def _selected(values: np.ndarray, counts: np.ndarray, qs: tuple[float, ...]) -> list[float] | None:
    """`_weighted_ranks`' percentiles, None where it leaves them to the sorting paths."""
    out = np.empty(len(qs))
    return out.tolist() if _weighted_ranks(values, counts, _qs_array(qs), out) else None


_QS: dict[tuple[float, ...], np.ndarray] = {}


def _qs_array(qs: tuple[float, ...]) -> np.ndarray:
    """The percentiles asked for as an array, made once per tuple (a window asks for the same few)."""
    arr = _QS.get(qs)
    if arr is None:
        arr = _QS[qs] = np.array(qs, dtype=np.float64)
    return arr


# ------------------------------------------------------------------------------ compiled selection
# The value at a rank of the sorted values is the same whichever way it is found, so selecting it
# (quickselect, O(n)) gives the sort's result exactly; the interpolation is then the same float
# operations as the sorting paths'. The kernel returns False, changing nothing, for what it leaves to
# them: a NaN (whose place in a sort is numpy's or Python's rule) or a negative count.


@njit
def _partition(v: np.ndarray, c: np.ndarray, lo: int, hi: int, p: float) -> tuple[int, int, int, int]:
    """Three-way partition of v[lo:hi] (with c alongside) around p: < p, == p, > p; returns the == run's
    bounds and the counts below p and at p."""
    lt, i, gt = lo, lo, hi
    below = equal = 0
    while i < gt:
        x = v[i]
        if x < p:
            below += c[i]
            v[i], v[lt] = v[lt], x
            c[i], c[lt] = c[lt], c[i]
            lt += 1
            i += 1
        elif x > p:
            gt -= 1
            v[i], v[gt] = v[gt], x
            c[i], c[gt] = c[gt], c[i]
        else:
            equal += c[i]
            i += 1
    return lt, gt, below, equal


@njit
def _pivot(v: np.ndarray, lo: int, hi: int) -> float:
    """The median of the range's first, middle and last values."""
    a, b, z = v[lo], v[(lo + hi - 1) // 2], v[hi - 1]
    if a > b:
        a, b = b, a
    if b > z:
        b = z
    return a if a > b else b


@njit
def _select(v: np.ndarray, c: np.ndarray, m: int, k: int) -> float:
    """The value at 0-based rank k of v[:m] expanded (each value c times, every c >= 1); permutes v and c."""
    lo, hi = 0, m
    while True:
        p = _pivot(v, lo, hi)
        lt, gt, below, equal = _partition(v, c, lo, hi, p)
        if k < below:
            hi = lt
        elif k < below + equal:
            return p
        else:
            k -= below + equal
            lo = gt


@njit
def _after(v: np.ndarray, c: np.ndarray, m: int, at: float, k: int) -> float:
    """The value at rank k given that `at` is the value at rank k - 1: `at` again if enough of it (and of
    smaller values) fill rank k, else the smallest value above it."""
    upto = 0
    above = math.inf
    for j in range(m):
        x = v[j]
        if x <= at:
            upto += c[j]
        elif x < above:
            above = x
    return at if upto > k else above


@njit
def _weighted_ranks(values: np.ndarray, counts: np.ndarray, qs: np.ndarray, out: np.ndarray) -> bool:
    """`_weighted_numpy`'s percentiles of (values, counts) into `out` by selection; False (nothing written)
    for a NaN value or a negative count. Pairs with no count take no rank (as in the running sum)."""
    n = values.shape[0]
    v = np.empty(n)
    c = np.empty(n, dtype=np.int64)
    m = 0
    total = 0
    for j in range(n):
        x, w = values[j], counts[j]
        if x != x or w < 0:
            return False
        if w > 0:
            v[m] = x
            c[m] = w
            total += w
            m += 1
    if m >= _BUCKET_MIN:
        _weighted_from_bins(v, c, m, total, qs, out)
        return True
    for i in range(qs.shape[0]):
        if total <= 0:
            out[i] = 0.0
            continue
        pos = (total - 1) * qs[i] / 100.0
        lo = int(pos)
        v_lo = _select(v, c, m, lo)
        v_hi = v_lo if lo + 1 > total - 1 else _after(v, c, m, v_lo, lo + 1)
        out[i] = v_lo + (v_hi - v_lo) * (pos - lo)
    return True


# Selection by bins. The values are binned by a map that never decreases with the value ((x - least) x scale,
# truncated, every operation rounding monotonically), so every value of a lower bin is <= every value of a
# higher one and the value at a rank is its bin's value at the rank within the bin: found among that bin's
# values alone. The value at a rank is one value, whichever way it is found. (No recursion: numba's cache
# does not reload a recursive kernel.)


@njit
def _bins(v: np.ndarray, c: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """v[:m] binned (the comment above): each value's bin and the expanded values below each bin (`upto`, one
    longer than the bins); no bins (empty arrays) where every value is the same, there are few, or the range is
    infinite."""
    mn = mx = v[0]
    for j in range(1, m):
        x = v[j]
        if x < mn:
            mn = x
        elif x > mx:
            mx = x
    nb = min(m, 4096)
    span = mx - mn
    scale = nb / span if span > 0 else math.inf
    if span == 0 or m < _BUCKET_MIN // 2 or not (span < math.inf and scale < math.inf):
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    top = nb - 1
    bins = np.empty(m, dtype=np.int64)
    upto = np.zeros(nb + 1, dtype=np.int64)
    for j in range(m):
        b = min(int((v[j] - mn) * scale), top)
        bins[j] = b
        upto[b + 1] += c[j]
    for b in range(nb):
        upto[b + 1] += upto[b]
    return bins, upto


@njit
def _bin_of(upto: np.ndarray, rank: int) -> int:
    """The bin b with upto[b] <= rank < upto[b + 1] (a binary search)."""
    lo, hi = 0, upto.shape[0] - 1
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if upto[mid] <= rank:
            lo = mid
        else:
            hi = mid
    return lo


@njit
def _in_bin(v: np.ndarray, c: np.ndarray, m: int, bins: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The values of v[:m] in bin b, with their counts (copies, in order)."""
    size = 0
    for j in range(m):
        size += bins[j] == b
    sv = np.empty(size)
    sc = np.empty(size, dtype=np.int64)
    s = 0
    for j in range(m):
        if bins[j] == b:
            sv[s] = v[j]
            sc[s] = c[j]
            s += 1
    return sv, sc


@njit
def _descend(v: np.ndarray, c: np.ndarray, rank: int) -> float:
    """The value at `rank` of v expanded by c (copies, which it may permute): binned again while that narrows
    it (twice at most), then `_select`."""
    for _ in range(2):
        bins, upto = _bins(v, c, v.shape[0])
        if not upto.shape[0]:
            break
        b = _bin_of(upto, rank)
        v, c = _in_bin(v, c, v.shape[0], bins, b)
        rank -= upto[b]
    mn = v.min()
    return mn if mn == v.max() else _select(v, c, v.shape[0], rank)


@njit
def _bucket_ranks(v: np.ndarray, c: np.ndarray, m: int, ranks: np.ndarray, out: np.ndarray) -> None:
    """The values at `ranks` (ascending 0-based ranks of v[:m] expanded, each value c times, every c >= 1; NaN-
    free) into `out`, in the same order; v and c unchanged. One binning of all the values; each bin holding a
    rank asked for is gathered once."""
    nr = ranks.shape[0]
    bins, upto = _bins(v, c, m)
    if not upto.shape[0]:  # one value, few values, or an infinite range
        for i in range(nr):
            out[i] = _descend(v[:m].copy(), c[:m].copy(), ranks[i])
        return
    i = 0
    while i < nr:
        b = _bin_of(upto, ranks[i])
        sv, sc = _in_bin(v, c, m, bins, b)
        k = i
        while k < nr and ranks[k] < upto[b + 1]:  # the ranks in this bin
            out[k] = _descend(sv.copy(), sc.copy(), ranks[k] - upto[b])
            k += 1
        i = k


@njit
def _weighted_from_bins(v: np.ndarray, c: np.ndarray, m: int, total: int, qs: np.ndarray, out: np.ndarray) -> None:
    """`_weighted_ranks`' percentiles of v[:m] with counts c (total > 0) into `out`, the values at the ranks found
    by `_bucket_ranks`: the same ranks, the same interpolation."""
    nq = qs.shape[0]
    ranks = np.empty(2 * nq, dtype=np.int64)
    for i in range(nq):
        lo = int((total - 1) * qs[i] / 100.0)
        ranks[2 * i] = lo
        ranks[2 * i + 1] = lo if lo + 1 > total - 1 else lo + 1
    order = np.argsort(ranks)
    got = np.empty(2 * nq)
    _bucket_ranks(v, c, m, ranks[order], got)
    values = np.empty(2 * nq)
    values[order] = got
    for i in range(nq):
        pos = (total - 1) * qs[i] / 100.0
        v_lo, v_hi = values[2 * i], values[2 * i + 1]
        out[i] = v_lo + (v_hi - v_lo) * (pos - int(pos))


@njit
def _few(values: np.ndarray, qs: np.ndarray, out: np.ndarray) -> bool:
    """`percentiles` of a non-empty float array of fewer than `_NUMPY_MIN` values into `out`: a sorted copy and
    the list path's interpolation, the same float operations in the same order (the same values, bit for bit:
    tests/test_metrics.py); False (nothing written) where a value is NaN, whose place the list path decides.
    Which value is at a rank does not depend on the sort's stability, NaN aside. (From `_NUMPY_MIN` values on,
    numpy's sort is faster than numba's.)"""
    n = values.shape[0]
    for j in range(n):
        if values[j] != values[j]:
            return False
    s = np.sort(values)
    for i in range(qs.shape[0]):
        pos = (n - 1) * qs[i] / 100.0
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        out[i] = s[lo] + (s[hi] - s[lo]) * (pos - lo)
    return True


def warm() -> None:
    """Compile (or load from numba's cache) the selections before the first window needs them."""
    if HAVE_NUMBA:
        out = np.empty(1)
        _weighted_ranks(np.ones(2), np.ones(2, dtype=np.int64), np.array([50.0]), out)
        _few(np.ones(2), np.array([50.0]), out)


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
