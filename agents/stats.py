"""Means with 95 % confidence intervals (Student's t), for scores over a handful of episodes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Two-sided 95 % Student-t critical values t_{0.975, df} for df = 1..30 (no scipy on the serving path).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    # Beyond 30 degrees of freedom: the normal quantile plus the first Cornish-Fisher correction.
    z = 1.959964
    return z + (z**3 + z) / (4 * df)


@dataclass(frozen=True)
class MeanCI:
    mean: float
    half_width: float
    n: int

    @property
    def finite_half_width(self) -> float | None:
        """The half width, or None for one sample (JSON has no infinity)."""
        return self.half_width if math.isfinite(self.half_width) else None

    def __str__(self) -> str:
        if not math.isfinite(self.half_width):
            return f"{self.mean:.3f} (n={self.n}, no CI)"
        return f"{self.mean:.3f} ± {self.half_width:.3f}"


def mean_ci(xs: Sequence[float]) -> MeanCI:
    """Sample mean and the half width of its 95 % t interval (infinite for one sample)."""
    n = len(xs)
    if n == 0:
        raise ValueError("no samples")
    mean = math.fsum(xs) / n
    if n == 1:
        return MeanCI(mean, math.inf, 1)
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    return MeanCI(mean, t975(n - 1) * math.sqrt(var / n), n)


def paired_diff_ci(a: Sequence[float], b: Sequence[float]) -> MeanCI:
    """Mean of a - b over paired episodes (same seeds) with its 95 % interval."""
    if len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    return mean_ci([x - y for x, y in zip(a, b, strict=True)])
