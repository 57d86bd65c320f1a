"""The episode grader: one score in [0, 1], deterministic for the same log.

Reference points, computed on the episode's own arrivals (regenerated with
`generate_arrivals(task, seed)`), with the task profile's `ProfileCapacity` (`shared.tasks`):

- floor (`floor_met`): a naive server that runs one request at a time, first come first served,
  at FP16 without speculation. Request i starts when it arrives or when the previous one
  finishes; its first token comes serial_itl_ms + prompt / serial_prefill_tps later, then one
  serial_itl_ms step per further token. It counts the requests that meet their tenant's TTFT and
  TPOT SLOs and finish within the episode. "Starve" (batch_cap 1) plays about this well.
- upper bound (`upper_met`): an ideal server that spends (prompt + output) / peak_tokens_per_s
  GPU-seconds on a request under any setting, and emits tokens min_itl_ms apart at best. A
  request is feasible when even alone it meets its SLOs (prompt / peak <= TTFT SLO,
  min_itl <= TPOT SLO) and finishes before the episode ends; of the feasible requests, at most
  the ones with the least work whose total work fits in the episode's seconds can be served.
  No policy on the profile can meet more, so every score below 1 has headroom.
  Per tenant, the same two counts restricted to its requests (`floor_met_by_tenant`,
  `upper_met_by_tenant`; a tenant's bound is its own feasible requests that fit alone).
- cluster tasks (`TaskSpec.replicas` above 1): the floor is a fixed small cluster of
  `task.floor_replicas` naive servers (each request to the first one free); the upper bound is the
  ideal server scaled to the largest cluster the task allows (peak_tokens_per_s x max replicas).
  Replica-seconds are billed from request to gone (`sim/cluster.py`), so C below charges
  over-provisioning, and under-provisioning shows as missed SLOs in G and W.

Print them for any task and seed:

    python -m llmserve_env.tools.grade references --task adversarial_multitenant --seed 0

The capacity figures of a profile come from `shared.tasks.PROFILE_CAPACITY` (its `source`
says where they come from); tests/test_policy_floors.py checks them against the simulator's own
step-time model (`sim.step_time.step_model`): nothing the simulator can do exceeds the ideal
server's peak, and its batch-1 FP16 step and prefill rate match the naive server's within 10 %.

Score:

    G = clip((met - f) / max(upper_met - f, 1), 0, 1)                        goodput
        f = min(floor_met, FLOOR_CAP x upper_met)   (FLOOR_CAP = 0.5: on a load so light that the
        naive server meets nearly everything, meeting everything still scores 1)
    W = min over tenants of the same, per tenant                             worst tenant
    Q = clip(1 - (1 - q) / QUALITY_TOLERANCE, 0, 1)                          quality
        q = the output-token-weighted mean of each window's quality (FP16 = 1)
    C = min(1, cost_budget_per_1k / (1000 x total cost / output tokens))     cost
        (1 when nothing was spent; 0 when money was spent and no token produced)
    score = G x Q x C                       one tenant
    score = sqrt(G x W) x Q x C             several tenants: the geometric mean makes sacrificing
                                            any tenant costly (a starved tenant drives it to 0)

`met` is the episode's total of requests that met every SLO of their tenant; requests left
unsettled at the end are misses (`core.metrics`). The log must be finished (done, horizon
steps) and consistent with the regenerated arrivals, else GradeError.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from llmserve_env.core.episode_log import EpisodeLog
from llmserve_env.core.metrics import SLO_EPS_S
from llmserve_env.shared.arrival_list import arrival_columns
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.jit import njit
from llmserve_env.shared.tasks import PROFILE_CAPACITY, ProfileCapacity, TaskSpec
from llmserve_env.shared.workloads import generate_arrivals, resolve_task, windows
from pydantic import BaseModel, Field

# A tier that loses this much quality against FP16 scores 0 on quality (the grade) and earns the
# whole quality term (the reward's window terms, core.reward).
QUALITY_TOLERANCE = 0.05


class GradeError(ValueError):
    """The log cannot be graded: unfinished, malformed, or inconsistent with its task and seed."""


class GradeResult(BaseModel):
    """A grade: the score, the terms it is built from, and the reference points used."""

    score: float = Field(..., ge=0.0, le=1.0)
    terms: dict[str, float]
    reference: dict[str, Any]
    task_id: str
    episode_id: str
    verified: bool = Field(False, description="true when the graded metrics were produced by this code: an "
                           "episode the server played, or a sim-mode log replayed window by window "
                           "(llmserve_env.core.verify); false for a real-mode log, graded as submitted")


@dataclass(frozen=True, slots=True)
class References:
    """The floor and the upper bound of one (task, seed), in requests that meet their SLOs."""

    arrivals: int
    feasible: int
    floor_met: int
    upper_met: int
    arrivals_by_tenant: dict[str, int]
    floor_met_by_tenant: dict[str, int]
    upper_met_by_tenant: dict[str, int]




@dataclass(slots=True)
class _Columns:
    """An episode's arrivals as columns (float64; tenant as its index in task.tenants) and the tenants' SLOs."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    tenant: np.ndarray
    ttft_slo_s: np.ndarray
    tpot_slo_s: np.ndarray

    @classmethod
    def of(cls, task: TaskSpec, arrivals: Sequence[Arrival]) -> _Columns:
        got = arrival_columns(arrivals)
        return cls(got.arrival_s.astype(np.float64), got.prompt_tokens.astype(np.float64),
                   got.output_tokens.astype(np.float64), got.tenant_index([t.name for t in task.tenants]),
                   np.array([t.ttft_slo_ms / 1e3 for t in task.tenants]),
                   np.array([t.tpot_slo_ms / 1e3 for t in task.tenants]))


@njit
def _floor_met(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, tenant: np.ndarray,
               ttft_slo_s: np.ndarray, tpot_slo_s: np.ndarray, itl: float, prefill_tps: float, horizon_s: float,
               servers: int, eps: float, met: np.ndarray) -> None:
    """The naive servers (module docstring), each request to the first one free; met[tenant] counts the
    requests that meet their SLOs."""
    free = np.zeros(servers)
    for i in range(arrival_s.shape[0]):
        j = 0  # the server free first (a heap's top: which of equal ones is taken does not change the times)
        for s in range(1, servers):
            if free[s] < free[j]:
                j = s
        a = arrival_s[i]
        start = a if a >= free[j] else free[j]
        first = start + itl + prompt[i] / prefill_tps
        finish = first + (output[i] - 1.0) * itl
        free[j] = finish
        k = tenant[i]
        if first - a <= ttft_slo_s[k] + eps and itl <= tpot_slo_s[k] + eps and finish < horizon_s:
            met[k] += 1


def warm() -> None:
    """Compile (or load from numba's cache) the floor's kernel before the first episode starts (both modes
    compute the references at reset)."""
    one = np.ones(1)
    _floor_met(one, one, one, np.zeros(1, dtype=np.int64), one, one, 0.01, 1e4, 10.0, 1, SLO_EPS_S,
               np.zeros(1, dtype=np.int64))


def _serial_floor(task: TaskSpec, cols: _Columns, cap: ProfileCapacity) -> dict[str, int]:
    # task.floor_replicas naive servers (1 on single-server tasks), each request to the first one free
    met = np.zeros(len(task.tenants), dtype=np.int64)
    _floor_met(cols.arrival_s, cols.prompt, cols.output, cols.tenant, cols.ttft_slo_s, cols.tpot_slo_s,
               cap.serial_itl_ms / 1e3, cap.serial_prefill_tps, task.horizon * task.window_s, task.floor_replicas,
               SLO_EPS_S, met)
    return {t.name: int(m) for t, m in zip(task.tenants, met.tolist(), strict=True)}


def _fit(works: np.ndarray, horizon_s: float) -> int:
    """How many of `works` (GPU-seconds), shortest first, fit in the horizon: their running sum, added one
    by one in that order (np.cumsum adds sequentially), up to the first that overflows."""
    used = np.cumsum(np.sort(works))
    over = np.flatnonzero(used > horizon_s)
    return int(over[0]) if over.size else int(used.size)


def _ideal_upper(task: TaskSpec, cols: _Columns, cap: ProfileCapacity) -> tuple[int, dict[str, int], int]:
    horizon_s = task.horizon * task.window_s
    peak = cap.peak_tokens_per_s
    min_itl = cap.min_itl_ms / 1e3
    prefill = cols.prompt / peak
    done = cols.arrival_s + prefill + (cols.output - 1.0) * min_itl
    ok = ((prefill <= (cols.ttft_slo_s + SLO_EPS_S)[cols.tenant])
          & (min_itl <= (cols.tpot_slo_s + SLO_EPS_S)[cols.tenant]) & (done < horizon_s))
    works = (cols.prompt + cols.output)[ok] / peak
    tenant = cols.tenant[ok]
    total = _fit(works, horizon_s)
    by_tenant = {t.name: _fit(works[tenant == i], horizon_s) for i, t in enumerate(task.tenants)}
    return total, by_tenant, int(ok.sum())


def compute_references(task: TaskSpec, seed: int, capacity: ProfileCapacity | None = None,
                       arrivals: Sequence[Arrival] | None = None) -> References:
    """The floor and upper bound of `task` under `seed` (see the module docstring).

    `arrivals` saves regenerating them when the caller already has generate_arrivals(task, seed).
    """
    cap = capacity or task.capacity()
    if arrivals is None:
        arrivals = generate_arrivals(task, seed)
    cols = _Columns.of(task, arrivals)
    floor = _serial_floor(task, cols, cap)
    # the ideal server scaled to the largest cluster the task allows (unchanged on single-server tasks)
    upper_cap = cap if task.replicas[1] == 1 else replace(cap, peak_tokens_per_s=cap.peak_tokens_per_s * task.replicas[1])
    upper, upper_by_tenant, feasible = _ideal_upper(task, cols, upper_cap)
    counts = np.bincount(cols.tenant, minlength=len(task.tenants)).tolist()
    by_tenant = {t.name: int(c) for t, c in zip(task.tenants, counts, strict=True)}
    return References(
        arrivals=len(arrivals),
        feasible=feasible,
        floor_met=sum(floor.values()),
        upper_met=upper,
        arrivals_by_tenant=by_tenant,
        floor_met_by_tenant=floor,
        upper_met_by_tenant=upper_by_tenant,
    )


# The floor is capped at this share of the upper bound: on a workload so light that the naive
# server already serves nearly everything, meeting every request must still score 1.
FLOOR_CAP = 0.5


def _normalised(met: float, floor: float, upper: float) -> float:
    lo = min(float(floor), FLOOR_CAP * upper)
    return min(1.0, max(0.0, (met - lo) / max(upper - lo, 1.0)))


def _number(step: int, metrics: dict[str, Any], key: str, integer: bool = False) -> float:
    v = metrics.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise GradeError(f"step {step}: metrics[{key!r}] is missing or not a number")
    if not math.isfinite(v) or v < 0:
        raise GradeError(f"step {step}: metrics[{key!r}] must be finite and >= 0")
    if integer and v != int(v):
        raise GradeError(f"step {step}: metrics[{key!r}] must be an integer")
    return float(v)


@dataclass(slots=True)
class Totals:
    met: float = 0  # whole requests in a graded log; a planner's lookahead adds shares of open ones
    missed: float = 0
    output_tokens: float = 0.0
    quality_tokens: float = 0.0
    cost_usd: float = 0.0


def _totals(log: EpisodeLog, task: TaskSpec, per_window: list[Sequence[Arrival]]) -> tuple[Totals, dict[str, list[int]]]:
    """Sum the log's metrics, checking them against the regenerated arrivals."""
    names = [t.name for t in task.tenants]
    tot = Totals()
    by_tenant = {n: [0, 0, 0] for n in names}  # arrived, met, missed
    for k, step in enumerate(log.steps):
        if step.step_index != k:
            raise GradeError(f"step {k}: step_index is {step.step_index}, expected {k}")
        m = step.metrics
        arrivals = int(_number(k, m, "arrivals", integer=True))
        if arrivals != len(per_window[k]):
            raise GradeError(f"step {k}: {arrivals} arrivals logged, the task and seed give {len(per_window[k])}")
        met = int(_number(k, m, "slo_met", integer=True))
        missed = int(_number(k, m, "slo_missed", integer=True))
        out = _number(k, m, "output_tokens", integer=True)
        quality = _number(k, m, "quality")
        if quality > 1.0:
            raise GradeError(f"step {k}: quality {quality} is above 1 (FP16 = 1)")
        tot.met += met
        tot.missed += missed
        tot.output_tokens += out
        tot.quality_tokens += quality * out
        tot.cost_usd += _number(k, m, "cost_usd")
        pt = m.get("per_tenant")
        if not isinstance(pt, dict) or set(pt) != set(names):
            raise GradeError(f"step {k}: per_tenant must list exactly the tenants {', '.join(names)}")
        expected = dict(zip(names, arrival_columns(per_window[k]).tenant_counts(names), strict=True))
        sum_met = sum_missed = 0
        for n in names:
            entry = pt[n]
            counts = [int(_number(k, entry, key, integer=True)) for key in ("arrived", "met", "missed")]
            if counts[0] != expected[n]:
                raise GradeError(f"step {k}: tenant {n!r} logged {counts[0]} arrivals, expected {expected[n]}")
            for i in range(3):
                by_tenant[n][i] += counts[i]
            sum_met += counts[1]
            sum_missed += counts[2]
        if (sum_met, sum_missed) != (met, missed):
            raise GradeError(f"step {k}: per-tenant met/missed do not add up to slo_met/slo_missed")
    return tot, by_tenant


def references_so_far(ref: References, arrived_by_tenant: Mapping[str, int]) -> References:
    """`ref` cut to the requests that have arrived so far (`arrived_by_tenant`, counts per tenant):
    each tenant's floor and upper counts scaled by the share of its arrivals seen, the totals by the
    share of all arrivals (fractional counts), and only the tenants already arrived counted (a tenant
    with no arrival yet is left out of the worst-tenant term, as the grade leaves out one that never
    arrives). The references of the episode so far, for the grade-decomposing step reward
    (core.reward); scaling by arrivals rather than by elapsed windows keeps a quiet night from
    reading as under-served (issue 14: on the cluster tasks the time share held the grade so far at
    0 for the first six windows whatever the policy did)."""
    arrived = sum(arrived_by_tenant.values())
    total = arrived / ref.arrivals if ref.arrivals else 0.0
    share = {n: (arrived_by_tenant.get(n, 0) / v if v else 0.0) for n, v in ref.arrivals_by_tenant.items()}
    return References(
        arrivals=arrived, feasible=ref.feasible,
        floor_met=ref.floor_met * total, upper_met=ref.upper_met * total,  # type: ignore[arg-type]
        arrivals_by_tenant={n: arrived_by_tenant.get(n, 0) for n in ref.arrivals_by_tenant},
        floor_met_by_tenant={n: v * share[n] for n, v in ref.floor_met_by_tenant.items()},  # type: ignore[misc]
        upper_met_by_tenant={n: v * share[n] for n, v in ref.upper_met_by_tenant.items()},  # type: ignore[misc]
    )


def add_window(tot: Totals, met_by_tenant: dict[str, float], metrics: dict[str, Any]) -> None:
    """Fold one window's metrics (WindowMetrics.to_dict(), already validated) into running totals:
    what `objective` reads. For callers that score partial episodes (agents/planner.py)."""
    tot.met += metrics["slo_met"]
    tot.missed += metrics["slo_missed"]
    out = metrics["output_tokens"]
    tot.output_tokens += out
    tot.quality_tokens += metrics["quality"] * out
    tot.cost_usd += metrics["cost_usd"]
    for n, entry in metrics["per_tenant"].items():
        met_by_tenant[n] += entry["met"]


def objective(task: TaskSpec, tot: Totals, met_by_tenant: Mapping[str, float],
              ref: References) -> tuple[float, dict[str, float], float, float]:
    """The grade's formula (module docstring) on totals and references: (score, terms, mean quality,
    cost per 1k tokens). grade_episode applies it to a whole log; a planner to an episode so far."""
    g = _normalised(tot.met, ref.floor_met, ref.upper_met)
    terms = {"goodput": g}
    if len(task.tenants) > 1:
        terms["worst_tenant"] = min(
            _normalised(met_by_tenant[n], ref.floor_met_by_tenant[n], ref.upper_met_by_tenant[n])
            for n in met_by_tenant
            if ref.arrivals_by_tenant[n] > 0
        )
        base = math.sqrt(g * terms["worst_tenant"])
    else:
        base = g
    q_mean = tot.quality_tokens / tot.output_tokens if tot.output_tokens else 1.0
    terms["quality"] = min(1.0, max(0.0, 1.0 - (1.0 - q_mean) / QUALITY_TOLERANCE))
    if tot.output_tokens:
        cost_per_1k = 1e3 * tot.cost_usd / tot.output_tokens
        terms["cost"] = min(1.0, task.cost_budget_per_1k / cost_per_1k) if cost_per_1k > 0 else 1.0
    else:
        cost_per_1k = 0.0
        terms["cost"] = 0.0 if tot.cost_usd > 0 else 1.0
    score = base * terms["quality"] * terms["cost"]
    return min(1.0, max(0.0, score)), terms, q_mean, cost_per_1k


def grade_episode(log: EpisodeLog, played: tuple[Sequence[Arrival], References] | None = None) -> GradeResult:
    """Grade a finished episode (see the module docstring); GradeError if it cannot be graded.

    `played`: the arrivals generate_arrivals(task, seed) gave and their references, as the episode
    this process played computed them at its start from the log's task, seed and profile (saves
    generating both again: ~14 % of a cluster episode). Never from a submitted log."""
    task = resolve_task(log.task_id)  # UnknownTaskError / TraceError propagate
    if log.horizon != task.horizon:
        raise GradeError(f"log horizon {log.horizon} differs from task {task.task_id!r}'s {task.horizon}")
    if not log.done or len(log.steps) < task.horizon:
        raise GradeError(f"episode {log.episode_id!r} is unfinished: {len(log.steps)} of {task.horizon} steps"
                         f"{'' if log.done else ', not done'}")
    if len(log.steps) > task.horizon:
        raise GradeError(f"episode {log.episode_id!r} has {len(log.steps)} steps, the horizon is {task.horizon}")
    cap = PROFILE_CAPACITY.get(log.profile) or task.capacity()
    arrivals = generate_arrivals(task, log.seed) if played is None else played[0]
    per_window = windows(arrivals, task)
    tot, by_tenant = _totals(log, task, per_window)
    if tot.met + tot.missed != len(arrivals):
        raise GradeError(f"{tot.met} met + {tot.missed} missed requests, but {len(arrivals)} arrived: "
                         f"every request must be settled by the end of the episode")
    ref = compute_references(task, log.seed, cap, arrivals) if played is None else played[1]
    score, terms, q_mean, cost_per_1k = objective(task, tot, {n: v[1] for n, v in by_tenant.items()}, ref)
    reference = {
        **asdict(ref),
        "capacity": cap.describe(),
        "met": tot.met,
        "met_by_tenant": {n: v[1] for n, v in by_tenant.items()},
        "mean_quality": q_mean,
        "cost_per_1k_tokens": cost_per_1k,
        "cost_budget_per_1k": task.cost_budget_per_1k,
        "quality_tolerance": QUALITY_TOLERANCE,
    }
    return GradeResult(score=score, terms=terms, reference=reference,
                       task_id=task.task_id, episode_id=log.episode_id)
