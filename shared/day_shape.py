"""The published mean day of a cycle task: each tenant's expected arrival rate, window by window.

    rates = expected_rates(task)            # {tenant: np.ndarray of req/s, one per window}
    cycle = expected_rates(task, jobs=False)  # the daily cycle alone (no scheduled jobs)

Read from `task.workload` alone (the `cycle` kind of shared.workloads: the raised cosine of
`cycle_rate` per cycled tenant, plus each entry of `jobs` at its rate over its windows, every cycle),
before the log-normal noise, whose mean factor is 1; or, for a multi-turn chat on a daily cycle (the
`multiturn` kind with a `day`), its conversations' expected turns (shared/prefix.expected_turn_rates).
A task drawn from a scenario family publishes
its family's nominal day under the same keys, so this is what an operator knows in advance about a
day: never the episode's own draw. Rivals that plan by the day (agents/operator.py) read it here.
"""

from __future__ import annotations

import numpy as np
from llmserve_env.shared.prefix import MultiTurnSpec, expected_turn_rates, workload_day_scale
from llmserve_env.shared.tasks import TaskSpec
from llmserve_env.shared.workloads import cycle_rate


class NotCycleTaskError(ValueError):
    """A task without a daily cycle (no published day to read)."""


def publishes_day(task: TaskSpec) -> bool:
    """Whether `expected_rates` can read the task's day: a `cycle` workload, or a multi-turn chat with a `day`."""
    w = task.workload
    return w.get("kind") == "cycle" or (w.get("kind") == "multiturn" and bool(w.get("day")))


def expected_rates(task: TaskSpec, jobs: bool = True) -> dict[str, np.ndarray]:
    """Each tenant's expected req/s in every window of the episode (`task.horizon` entries); tenants the
    workload never names get zeros. `jobs=False` leaves out the scheduled jobs (the cycle alone)."""
    w = task.workload
    if not publishes_day(task):
        raise NotCycleTaskError(f"{task.task_id!r} has workload kind {w.get('kind')!r}: expected_rates needs "
                                "kind 'cycle' or a multi-turn chat with a 'day' (a published day)")
    out = {t.name: np.zeros(task.horizon) for t in task.tenants}
    if w["kind"] == "multiturn":  # its conversations' turns, from the published spec and day
        out[task.tenants[0].name] += expected_turn_rates(MultiTurnSpec(**w.get("spec", {})),
                                                         task.horizon * task.window_s, task.window_s,
                                                         workload_day_scale(w, task.window_s))
        return out
    for name, spec in w.get("tenants", {}).items():
        out[name] += [cycle_rate(task, spec, k) for k in range(task.horizon)]
    if jobs:
        for j in w.get("jobs", []):
            out[j["tenant"]] += job_rates(task, j)
    return out


def job_rates(task: TaskSpec, job: dict) -> np.ndarray:
    """One job's req/s per window of the episode: `rate_rps` over `windows` windows from `start_window`,
    every cycle (as shared.workloads generates it)."""
    n = int(task.workload["cycle_windows"])
    start, length, rate = int(job["start_window"]), int(job["windows"]), float(job["rate_rps"])
    return np.array([rate if start <= k % n < start + length else 0.0 for k in range(task.horizon)])
