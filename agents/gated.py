"""A learned family actor with the planner's off-family judge in front (issue 28).

An actor trained on a scenario family knows the family's days; one that memorised them (the planner's
DAgger student on multitenant_family) falls on a day outside the family, while one taught by the
operator reads the rates and holds there. The gate plays both: each window the off-family judge
(agents/forecast.py `OffFamilyJudge`, the one the planner's `off_family` asks) reads the per-tenant
arrival counts the observation has shown so far; while it says the day is a family day the in-family
actor's action is served, and once it says the day has left the family, the off-family actor's. Both
actors see every observation, so each one's history (rates, last action) stays its own.

Not shipped: no shipped weights are gated (measured on fresh seeds in docs/learning.md, "An off-family
gate between two learned actors"; `bench/gate_confirm.py` plays it). The judge's particles are drawn from
`seed`, the episode's, as the planner draws them. The judge's likelihood keeps the terms of the windows
it has scored (agents/forecast.py), so each window adds one window's work: a decision (both actors and the
judge) took 0.6-0.9 ms in the median on this 2-core machine at load average ~5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from llmserve_env.agents.base import Policy
from llmserve_env.agents.forecast import OffFamilyJudge
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.scenarios import is_family
from llmserve_env.shared.tasks import TaskSpec, get_task


@dataclass
class GateStats:
    """Windows served by each actor in the episode so far."""

    inside: int = 0
    outside: int = 0

    def as_dict(self) -> dict[str, Any]:
        n = self.inside + self.outside
        return {"gate_outside_windows": self.outside, "gate_outside_share": self.outside / n if n else 0.0}


def observed_counts(task: TaskSpec, counts: dict[str, list[float]], obs: ServeObservation) -> None:
    """Append the window the observation reports to each tenant's arrival counts (the reset observation,
    step 0, reports none). The rate is the count over the window to 4 decimals (core/episode.py), so the
    count is recovered exactly for windows under 10,000 s."""
    if obs.step_index == 0:
        return
    by_tenant = obs.metadata["cluster"]["arrival_rate_by_tenant"]
    for name, seen in counts.items():
        seen.append(float(round(float(by_tenant.get(name, 0.0)) * task.window_s)))


class GatedPolicy:
    """The in-family actor while the off-family judge is silent, the off-family actor once it speaks."""

    def __init__(self, task_id: str, inside: Policy, outside: Policy, seed: int = 0):
        self.task = get_task(task_id)
        if not is_family(self.task):
            raise ValueError(f"an off-family gate needs a scenario family task, {task_id!r} is not one")
        self.inside, self.outside = inside, outside
        self.judge = OffFamilyJudge(self.task, seed)
        self.name = "gated"
        self._counts: dict[str, list[float]] = {}
        self.stats = GateStats()

    def reset(self) -> None:
        self.inside.reset()
        self.outside.reset()
        self._counts = {t.name: [] for t in self.task.tenants}
        self.stats = GateStats()

    def act(self, obs: ServeObservation) -> ServeAction:
        observed_counts(self.task, self._counts, obs)
        inside, outside = self.inside.act(obs), self.outside.act(obs)
        if self.judge.outside({name: np.asarray(c) for name, c in self._counts.items()}):
            self.stats.outside += 1
            return outside
        self.stats.inside += 1
        return inside
