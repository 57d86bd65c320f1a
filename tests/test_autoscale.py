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


def test_autoscalers_route_on_the_prefix_caching_tasks_only() -> None:
    """On mooncake_cluster / multiturn_cluster an autoscaler is scaling plus a tuned cache affinity: the grid
    gains the operator's affinity axis and the action carries the value; elsewhere nothing changes."""
    from llmserve_env.agents.autoscale import rival, tuning_grid
    from llmserve_env.agents.operator import PREFIX_GRID  # the operator's affinity axis is the same values
    from llmserve_env.core.inprocess import InProcessEnv
    from llmserve_env.shared.tasks import get_task

    for kind in ("hpa", "dynamo_planner"):
        grid, base = tuning_grid(kind, get_task("mooncake_cluster"))
        assert grid["cache_affinity"] == PREFIX_GRID["cache_affinity"] and base["cache_affinity"] in grid["cache_affinity"]
        grid, base = tuning_grid(kind, get_task("diurnal_autoscale"))
        assert "cache_affinity" not in grid and base["cache_affinity"] is None
    assert "cache_affinity" not in tuning_grid("tuned_static", get_task("mooncake_cluster"))[0]
    with pytest.raises(ValueError, match="kind must be one of"):
        tuning_grid("operator", get_task("mooncake_cluster"))

    env = InProcessEnv()
    obs = env.reset("mooncake_cluster", 0)
    for aff, want in ((0.75, 0.75), (None, None)):
        policy = rival("hpa", "mooncake_cluster", {"target_in_system": 16.0, "stabilization": 3, "cache_affinity": aff})
        policy.reset()
        action = policy.act(obs)
        assert action.cache_affinity == want and action.replicas == get_task("mooncake_cluster").initial_replicas


def test_hpa_scales_on_the_metric_it_was_tuned_on() -> None:
    """HPA's desired = ceil(current x metric / target): on requests in the system per ready replica, or on the KV
    cache's utilisation (a long prompt weighs as the memory it holds); an unknown metric is refused."""
    from llmserve_env.agents.autoscale import HPAController, HPAParams
    from llmserve_env.shared.models import ServeObservation
    from llmserve_env.shared.tasks import get_task

    task = get_task("mooncake_cluster")  # starts with 2 replicas
    # 2 requests on 2 ready replicas, KV 90 % full: light by count, heavy by memory
    obs = ServeObservation(step_index=3, kv_cache_occupancy=0.9, queue_depth=0, active_requests=2,
                           metadata={"cluster": {"ready": 2}})
    by_kv = HPAController(task, HPAParams(metric="kv_cache", target_kv=0.5, stabilization=1))
    assert by_kv.replicas(obs) == 4  # ceil(2 x 0.9 / 0.5)
    by_count = HPAController(task, HPAParams(metric="in_system", target_in_system=4.0, stabilization=1))
    assert by_count.replicas(obs) == 1  # ceil(2 x (1 / 4)): scaled down at once (stabilisation 1 window)
    within = HPAController(task, HPAParams(metric="kv_cache", target_kv=0.85, stabilization=1))
    assert within.replicas(obs) == 2  # 0.9 / 0.85 is within Kubernetes' 0.1 tolerance: no change
    with pytest.raises(ValueError, match="metric must be one of in_system, kv_cache"):
        HPAParams(metric="gpu")
