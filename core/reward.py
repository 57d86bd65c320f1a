"""The step reward: the grade's own decomposition; and the per-window health terms beside it.

The reward of window k is the increase of the grade's formula over the episode so far:

    reward_k = Phi_k - Phi_(k-1),   Phi_0 = 0
    Phi_k    = core.grader.objective(totals of windows 0..k, references of the arrivals of 0..k)

with the grader's own totals (requests met per tenant, output tokens, quality, cost) and its
floor and ideal-server references cut to the requests arrived so far
(core.grader.references_so_far: each tenant's references scaled by the share of its arrivals
seen; a tenant not arrived yet is left out of the worst-tenant term). Scaling by arrivals, not by
windows elapsed, matters where load varies: with the share of windows a quiet night read as
under-served, the grade so far sat clipped at 0 and every night window's reward was exactly 0
whatever the replica count (issue 14; multitenant_autoscale's batch tenant, absent until 03:00,
held the worst-tenant term at 0 too). The last window
(its drain included) uses the full references, so Phi_horizon is the episode's grade and the
rewards of an episode sum to its grade exactly: a policy that raises the summed reward raises
the grade, and nothing else (issue 13 item 6: the previous reward, the weighted window terms
below, tracked the grade with a rank correlation of 0.92-0.99 over policies but agreed in sign
with the grade's change between nearby policies only 0.75-0.82 of the time). `GradeReward`
computes it; the episode holds one.

The window terms, reported beside the reward in `reward_terms` (and their weighted sum as
`window`), say why a window went well or badly:

    D       = max(arrivals, met + missed, 1)           requests the window is accountable for
    goodput = met / D                                   in [0, 1]
    miss    = missed / D                                in [0, 1]
    memory  = clip((kv_occupancy - 0.9) / 0.1, 0, 1)    KV cache within 10 % of full
    evict   = min(1, evictions / D)                     preemptions (recomputed work)
    cost    = clip(cost_per_1k / budget - 1, 0, 1)      spending over task.cost_budget_per_1k
    quality = clip((1 - quality) / QUALITY_TOLERANCE, 0, 1)   quantization's quality loss

    window  = clip(goodput - 0.5 miss - 0.1 memory - 0.2 evict - 0.2 cost - 0.5 quality, -1, 1)

met / missed are the requests settled in the window (`core.metrics`): missed includes failed
requests, requests still waiting past their TTFT SLO (charged once, in the window where that
becomes certain); the episode's last window also holds what the engine's drain after the
horizon settled, and costs (core.metrics.with_drain), so the last arrivals are judged by their
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

import copy

from llmserve_env.core.grader import QUALITY_TOLERANCE, References, Totals, objective, references_so_far
from llmserve_env.core.metrics import WindowMetrics
from llmserve_env.shared.tasks import TaskSpec

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
    """The window score (`window` in the module docstring) and its unweighted terms: diagnostics
    reported beside the step reward, which is GradeReward's."""
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


class GradeReward:
    """The step reward of one episode: the increase of the grade's formula (module docstring)."""

    def __init__(self, task: TaskSpec, references: References):
        self.task = task
        self.references = references
        self.totals = Totals()
        self.met_by = {t.name: 0 for t in task.tenants}
        self.arrived_by = {t.name: 0 for t in task.tenants}  # the references' cut (references_so_far)
        self.windows = 0
        self.phi = 0.0

    def step(self, m: WindowMetrics) -> tuple[float, dict[str, float]]:
        """(reward, terms) of the next window: terms are the window terms, `window` and `grade_so_far`."""
        window, terms = compute_reward(m, self.task)
        tot = self.totals
        tot.met += m.slo_met
        tot.missed += m.slo_missed
        tot.output_tokens += m.output_tokens
        tot.quality_tokens += m.quality * m.output_tokens
        tot.cost_usd += m.cost_usd
        for n, t in m.per_tenant.items():
            self.met_by[n] += t.met
            self.arrived_by[n] += t.arrived
        self.windows += 1
        last = self.windows >= self.task.horizon
        ref = self.references if last else references_so_far(self.references, self.arrived_by)
        phi = objective(self.task, tot, self.met_by, ref)[0]
        reward = phi - self.phi
        self.phi = phi
        terms["window"] = window
        terms["grade_so_far"] = phi
        return reward, terms

    def fork(self) -> GradeReward:
        clone = copy.copy(self)
        clone.totals = copy.copy(self.totals)
        clone.met_by = dict(self.met_by)
        clone.arrived_by = dict(self.arrived_by)
        return clone
