"""dynamo_planner's load predictor: Holt's linear trend computed as statsmodels computes it, bit for bit."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from llmserve_env.agents.autoscale import PLANNER_GRID, holt_forecast


def _statsmodels_holt(series: list[float], alpha: float, beta: float) -> float:
    """What agents/autoscale.py called before (statsmodels, known initial level and zero trend, fixed smoothing)."""
    from statsmodels.tsa.holtwinters import Holt

    x = np.asarray(series, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = Holt(x, initialization_method="known", initial_level=x[0], initial_trend=0.0).fit(
            smoothing_level=alpha, smoothing_trend=beta, optimized=False)
    return float(fit.forecast(1)[0])


def test_holt_forecast_is_statsmodels_bit_for_bit() -> None:
    pytest.importorskip("statsmodels")
    rng = np.random.default_rng(0)
    params = [(a, b) for a in PLANNER_GRID["alpha"] for b in (0.3, *PLANNER_GRID.get("beta", ()))]
    params += [(float(a), float(b)) for a, b in rng.uniform(0.01, 0.99, size=(20, 2))]
    for i in range(300):
        n = int(rng.integers(3, 25))
        if i % 3 == 0:  # request counts per interval, as dynamo_planner feeds it
            series = [float(v) for v in rng.poisson(rng.uniform(1, 400), size=n)]
        elif i % 3 == 1:  # a rising or falling day, with noise
            series = list(np.maximum(0.0, np.linspace(rng.uniform(0, 300), rng.uniform(0, 300), n)
                                     + rng.normal(0, 20, n)))
        else:
            series = list(rng.uniform(0, 1e4, size=n))
        alpha, beta = params[i % len(params)]
        assert holt_forecast(series, alpha, beta) == _statsmodels_holt(series, alpha, beta), (series, alpha, beta)
