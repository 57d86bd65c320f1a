"""The per-window reward: goodput, minus what it cost to get it.

    D       = max(arrivals, met + missed, 1)           requests the window is accountable for
    goodput = met / D                                   in [0, 1]
    miss    = missed / D                                in [0, 1]
    memory  = clip((kv_occupancy - 0.9) / 0.1, 0, 1)    KV cache within 10 % of full
    evict   = min(1, evictions / D)                     preemptions (recomputed work)
    cost    = clip(cost_per_1k / budget - 1, 0, 1)      spending over task.cost_budget_per_1k
    quality = clip((1 - quality) / QUALITY_TOLERANCE, 0, 1)   quantization's quality loss

    reward  = clip(goodput - 0.5 miss - 0.1 memory - 0.2 evict - 0.2 cost - 0.5 quality, -1, 1)

met / missed are the requests settled in the window (`shared.metrics`): missed includes failed
requests, requests still waiting past their TTFT SLO (charged once, in the window where that
becomes certain); the episode's last window also holds what the engine's drain after the
horizon settled, and costs (shared.metrics.with_drain), so the last arrivals are judged by their
real outcome and the drain's GPU time is charged. Normalising by D keeps the reward in [-1, 1] whatever
the load, so a lull and a burst weigh alike. `cost` is 0 when no token was produced (nothing was
served to price; in sim mode the GPU is priced per wall-clock second, so the term charges
windows that hold the GPU yet produce few tokens). QUALITY_TOLERANCE = 0.05 is shared with the
grader: a tier that loses 5 % quality against FP16 earns the whole quality penalty (INT8 at
quality 0.99 gives a term of 0.2, INT4 at 0.97 gives 0.6).

The terms dict returned beside the reward names each term before weighting
(goodput, miss, memory, evict, cost, quality).
"""

from __future__ import annotations

from llmserve_env.shared.metrics import WindowMetrics
from llmserve_env.shared.tasks import TaskSpec

QUALITY_TOLERANCE = 0.05
MEMORY_PRESSURE_FROM = 0.9
WEIGHTS: dict[str, float] = {
    "goodput": 1.0,
    "miss": -0.5,
    "memory": -0.1,
    "evict": -0.2,
    "cost": -0.2,
    "quality": -0.5,
}


def _clip(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


def compute_reward(m: WindowMetrics, task: TaskSpec) -> tuple[float, dict[str, float]]:
    """The reward of one window and its unweighted terms (formula in the module docstring)."""
    d = max(m.arrivals, m.slo_met + m.slo_missed, 1)
    budget = task.cost_budget_per_1k
    terms = {
        "goodput": m.slo_met / d,
        "miss": m.slo_missed / d,
        "memory": _clip((m.kv_occupancy - MEMORY_PRESSURE_FROM) / (1.0 - MEMORY_PRESSURE_FROM), 0.0, 1.0),
        "evict": min(1.0, m.evictions / d),
        "cost": _clip(m.cost_per_1k_tokens / budget - 1.0, 0.0, 1.0) if budget > 0 else 0.0,
        "quality": _clip((1.0 - m.quality) / QUALITY_TOLERANCE, 0.0, 1.0),
    }
    r = 0.0
    for name, w in WEIGHTS.items():
        r += w * terms[name]
    return _clip(r, -1.0, 1.0), terms
