"""Scenario families: each episode's day drawn from its seed, from the distribution the task declares.

A family task (`shared.tasks`: diurnal_family, multitenant_family and their shifted tests) publishes
a NOMINAL day in its `workload` under the keys every cycle task has (`cycle_windows`, `peak_window`,
`noise_sigma`, `tenants: {name: {trough_rps, peak_rps}}`, `jobs`), and under `workload["family"]`
the distributions a seed's day is drawn from:

    peak_window      [lo, hi]  the daily peak, in windows (fractional), uniform
    level            [lo, hi]  the day's mean rate as a multiple of the nominal mean, uniform
    peak_to_trough   [lo, hi]  the day's peak rate over its trough rate, uniform
    noise            {phi, sigma}  AR(1) in log-rate per window and tenant (stationary sigma)
    flash_crowds     {per_day, factor [lo, hi], windows [lo, hi], tenant}  a Poisson number of crowds,
                     each multiplying the tenant's rate by a uniform factor for a uniform run of windows
    jobs             [{tenant, start_window [lo, hi], windows [lo, hi], rate_rps [lo, hi]}]  the
                     scheduled batch jobs, each with a uniform start, length and rate
    announced_share  probability that a scheduled job is announced (as a cron job is)
    lead_windows     [lo, hi]  how many windows before its start an announced job is announced
    extra_jobs       {per_day, tenant, windows [lo, hi], rate_rps [lo, hi]}  ad-hoc jobs, never announced
    preemption_per_replica_hour  spot preemption hazard of a replica, per hour of the (compressed) day
    cold_start_sigma log-normal sigma of each replica's cold-start time around the profile's figure

Every range cites its source or says it is an assumption (`FAMILY_SOURCES`, repeated in /tasks).

`draw_day(task, seed)` returns the day (`Day`): each cycled tenant's mean rate per window (the
cycle, the noise and the flash crowds included) and its jobs; `shared.workloads` turns it into
Poisson arrivals. The draw has its own random stream (seed, SCENARIO_STREAM): the arrival times,
tenants and lengths stream of shared.workloads is untouched by it, and the same seed always gives
the same day. Nothing of the day reaches a policy except through the observation: the arrivals it
serves and the announced jobs (`Day.announced(k)`, shown in `metadata["cluster"]["announced_jobs"]`
from their announcement window on).

`replica_disruptions(task)` gives the cluster simulator (sim/cluster.py) the family's spot
preemptions and cold-start jitter, drawn per (seed, replica index) from a third stream
(REPLICA_STREAM), so a replica's fate depends on nothing but its place in the request order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from llmserve_env.shared import portable_math as pm

if TYPE_CHECKING:  # shared.tasks imports this module's sources and rates for its family tasks
    from llmserve_env.shared.tasks import TaskSpec

SCENARIO_STREAM = 0x5343454E  # "SCEN": the day's draw
REPLICA_STREAM = 0x5245504C   # "REPL": each replica's cold-start jitter and preemption time

# The spot preemption hazard the families use. AWS's Spot Instance Advisor reports each instance type's
# "frequency of interruption: the rate at which Spot has reclaimed capacity during the trailing month" in
# buckets <5 %, 5-10 %, 10-15 %, 15-20 % and >20 % (AWS EC2 documentation; the advisor's data at
# spot-bid-advisor.s3.amazonaws.com). Taking the top bucket's floor, 20 % of replicas reclaimed per
# 30-day month, as a per-replica Poisson hazard: 0.20 / 720 h = 2.8e-4 per replica-hour of the day.
# On a compressed day (one window = 30 minutes of the day) that is ~0.02 preemptions per episode at 3-4
# replicas: rare, as spot GPUs in the busier buckets are. The rate is a floor of a bucket, not a trace fit.
AWS_SPOT_TOP_BUCKET_PER_HOUR = 0.20 / (30 * 24)

FAMILY_SOURCES = {
    "peak_window": "ASSUMPTION: a peak hour that moves by +-1.5 h from day to day; SageServe (Jaiswal et al. "
                   "2025, arXiv:2502.14617) reports Microsoft O365 LLM traffic whose daily and weekly patterns "
                   "shift across regions and days, without a figure for the spread",
    "level": "ASSUMPTION: +-15 % day-to-day level; BurstGPT (Wang et al. 2024, arXiv:2401.17644) shows Azure "
             "OpenAI daily volumes varying from day to day over 213 days",
    "peak_to_trough": "ASSUMPTION: 2.5-3.5x around the fixed-day tasks' 3x (shared/tasks.py: daytime peaks a few "
                      "times the night trough, BurstGPT and SageServe)",
    "noise": "ASSUMPTION: AR(1) in log-rate, phi 0.7 per 30-minute window, stationary sigma 0.15 (the fixed-day "
             "tasks' per-window sigma); autocorrelated because BurstGPT finds bursty, non-Poisson request rates",
    "flash_crowds": "ASSUMPTION: 0.5 a day, x1.5-2.5 for 0.5-2 h; BurstGPT reports sudden bursts in "
                    "conversation traffic without a per-day rate",
    "jobs": "ASSUMPTION: the published jobs' start +-2 windows (1 h), length +-1 window, rate +-25 %",
    "announced_share": "ASSUMPTION: half the scheduled jobs announced 1-3 h ahead (as cron jobs are), the rest not",
    "extra_jobs": "ASSUMPTION: 0.5 unannounced ad-hoc batch jobs a day",
    "preemption_per_replica_hour": "AWS Spot Instance Advisor, top interruption bucket (>20 % of capacity "
                                   "reclaimed in the trailing month) at its floor: 0.20 / 720 h",
    "cold_start_sigma": "ASSUMPTION: log-normal sigma 0.15 around the profile's cited cold start (weight load "
                        "bandwidth and engine start-up vary from node to node)",
}


@dataclass(frozen=True, slots=True)
class DrawnJob:
    """One batch job of a drawn day; `announced_at` is the window from which the observation shows it
    (None: never announced)."""

    tenant: str
    start_window: int
    windows: int
    rate_rps: float
    announced_at: int | None

    def public(self) -> dict[str, Any]:
        """What an announcement says: the job's tenant, start, length and expected rate."""
        return {"tenant": self.tenant, "start_window": self.start_window, "windows": self.windows,
                "rate_rps": round(self.rate_rps, 4)}


@dataclass(frozen=True, slots=True)
class FlashCrowd:
    tenant: str
    start_window: int
    windows: int
    factor: float


@dataclass(frozen=True)
class Day:
    """One seed's day: the drawn parameters, each cycled tenant's mean rate per window, the jobs."""

    peak_window: float
    level: float
    peak_to_trough: float
    rates: dict[str, np.ndarray]
    jobs: tuple[DrawnJob, ...]
    flash_crowds: tuple[FlashCrowd, ...] = field(default=())

    def announced(self, k: int) -> list[dict[str, Any]]:
        """The jobs announced by window k (the window about to be served) and not yet finished."""
        return [j.public() for j in self.jobs
                if j.announced_at is not None and j.announced_at <= k < j.start_window + j.windows]


def is_family(task: TaskSpec) -> bool:
    return "family" in task.workload


def draw_uniform(rng: np.random.Generator, bounds: Any) -> float:
    """A uniform draw from the range [lo, hi] (lo where it is one point): the families' every real range."""
    lo, hi = (float(x) for x in bounds)
    return float(rng.uniform(lo, hi)) if hi > lo else lo


def draw_integer(rng: np.random.Generator, bounds: Any) -> int:
    """A uniform integer from [lo, hi], both included (lo where it is one point)."""
    lo, hi = (int(x) for x in bounds)
    return int(rng.integers(lo, hi + 1)) if hi > lo else lo


def draw_flash_crowd(rng: np.random.Generator, spec: dict[str, Any], start: int) -> FlashCrowd:
    """One flash crowd of the family's `flash_crowds` spec from window `start`: its length, then its factor (the
    order a day draws them in, after the start; the planner's forecast draws crowds ahead the same way)."""
    return FlashCrowd(spec["tenant"], start, draw_integer(rng, spec["windows"]), draw_uniform(rng, spec["factor"]))


def raised_cosine(k: np.ndarray, n: int, peak_window: float) -> np.ndarray:
    """The daily shape at window centres: 1 at the peak, 0 half a cycle away (as shared.workloads.cycle_rate)."""
    phase = ((k + 0.5 - peak_window) / n) % 1.0
    return 0.5 * (1.0 + pm.cos(2.0 * np.pi * phase))  # (C's cos on every CPU: portable_math)


def cycle_mean(spec: dict[str, Any], level: Any, ratio: Any, shape: np.ndarray) -> np.ndarray:
    """A cycled tenant's mean rate (req/s) at each window of `shape` (raised_cosine) before the day's noise: its
    published trough-peak mean scaled by `level`, spread by the peak-to-trough `ratio`. Scalars for one day, or
    column arrays for many (the planner's forecast particles): the same operations either way."""
    mean = 0.5 * (float(spec["trough_rps"]) + float(spec["peak_rps"]))
    trough = 2.0 * mean * level / (1.0 + ratio)
    return trough * (1.0 + (ratio - 1.0) * shape)


def _draw(task: TaskSpec, seed: int) -> Day:
    w = task.workload
    fam = w["family"]
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), SCENARIO_STREAM]))
    n, horizon = int(w["cycle_windows"]), task.horizon
    # always the same number of draws in the same order, so one parameter's range never moves another's draw
    peak = draw_uniform(rng, fam["peak_window"])
    level = draw_uniform(rng, fam["level"])
    ratio = draw_uniform(rng, fam["peak_to_trough"])
    k = np.arange(horizon, dtype=np.float64)
    shape = raised_cosine(k, n, peak)
    phi, sigma = float(fam["noise"]["phi"]), float(fam["noise"]["sigma"])
    rates: dict[str, np.ndarray] = {}
    for name, spec in w["tenants"].items():
        eps = rng.standard_normal(horizon)
        x = np.empty(horizon)
        x[0] = sigma * eps[0]  # started in the stationary distribution
        innov = sigma * math.sqrt(max(0.0, 1.0 - phi * phi))
        for i in range(1, horizon):
            x[i] = phi * x[i - 1] + innov * eps[i]
        rates[name] = cycle_mean(spec, level, ratio, shape) * pm.exp(x - 0.5 * sigma * sigma)
    crowds: list[FlashCrowd] = []
    fc = fam.get("flash_crowds")
    if fc:
        for _ in range(int(rng.poisson(float(fc["per_day"])))):
            c = draw_flash_crowd(rng, fc, draw_integer(rng, (0, horizon - 1)))
            rates[c.tenant][c.start_window:c.start_window + c.windows] *= c.factor
            crowds.append(c)
    jobs: list[DrawnJob] = []
    share = float(fam.get("announced_share", 0.0))
    for spec in fam.get("jobs", []):
        start = draw_integer(rng, spec["start_window"])
        length = draw_integer(rng, spec["windows"])
        rate = draw_uniform(rng, spec["rate_rps"])
        lead = draw_integer(rng, fam.get("lead_windows", (0, 0)))
        announced = bool(rng.random() < share)
        jobs.append(DrawnJob(spec["tenant"], start, length, rate, max(0, start - lead) if announced else None))
    extra = fam.get("extra_jobs")
    if extra:
        for _ in range(int(rng.poisson(float(extra["per_day"])))):
            jobs.append(DrawnJob(extra["tenant"], draw_integer(rng, (0, horizon - 1)), draw_integer(rng, extra["windows"]),
                                 draw_uniform(rng, extra["rate_rps"]), None))
    for r in rates.values():
        r.setflags(write=False)
    return Day(peak, level, ratio, rates, tuple(jobs), tuple(crowds))


# (task id, seed) -> (the workload dict drawn from, its day). A day is read at reset (arrivals, grader
# references) and at every step (announced jobs): ~0.3 ms a draw, so it is kept for the recent episodes.
_CACHE: dict[tuple[str, int], tuple[dict[str, Any], Day]] = {}
_CACHE_MAX = 256


def draw_day(task: TaskSpec, seed: int) -> Day:
    """The day of `task` (a family task) under `seed`: deterministic, the same for every policy."""
    if not is_family(task):
        raise ValueError(f"task {task.task_id!r} is not a scenario family (no workload['family'])")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    key = (task.task_id, int(seed))
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is task.workload:
        return hit[1]
    day = _draw(task, int(seed))
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = (task.workload, day)
    return day


def job_cycle_windows(task: TaskSpec) -> int:
    """Windows after which a task's published jobs (`workload["jobs"]`) repeat: its day's cycle, else its horizon."""
    return int(task.workload.get("cycle_windows") or task.horizon)


def announced_jobs(task: TaskSpec, seed: int, k: int) -> list[dict[str, Any]]:
    """The jobs the observation shows before window k is served. A fixed-day task publishes its jobs
    (`workload["jobs"]`, every cycle), so each is known until it ends; a family shows its announced jobs
    from their announcement window on, and never the unannounced ones."""
    if is_family(task):
        return draw_day(task, seed).announced(k)
    n = job_cycle_windows(task)
    kk = k % n
    return [{"tenant": j["tenant"], "start_window": k - kk + int(j["start_window"]), "windows": int(j["windows"]),
             "rate_rps": float(j["rate_rps"])}
            for j in task.workload.get("jobs", []) if kk < int(j["start_window"]) + int(j["windows"])]


@dataclass(frozen=True, slots=True)
class ReplicaDisruptions:
    """Spot preemptions and cold-start jitter of a family's replicas (sim/cluster.py).

    Replica i of the episode with seed s (in request order) starts `cold_start_factor` times the
    profile's cold start after its request and is reclaimed `lifetime_s` after its request (inf:
    never), both drawn from (s, REPLICA_STREAM, i). `day_hour_s` converts the hazard per hour of the
    day into episode seconds (a window of window_s seconds stands for 24 / cycle_windows hours of the
    day; the cold start itself is not compressed).
    """

    preemption_per_hour: float
    cold_start_sigma: float
    day_hour_s: float

    def draw(self, seed: int, i: int) -> tuple[float, float]:
        """(cold-start factor, seconds from request to preemption) of replica i under `seed`."""
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), REPLICA_STREAM, int(i)]))
        z, e = float(rng.standard_normal()), float(rng.standard_exponential())
        s = self.cold_start_sigma
        factor = math.exp(s * z - 0.5 * s * s) if s > 0 else 1.0
        life = e / self.preemption_per_hour * self.day_hour_s if self.preemption_per_hour > 0 else math.inf
        return factor, life


def replica_disruptions(task: TaskSpec) -> ReplicaDisruptions | None:
    """The family's replica disruptions; None for a task without any (every fixed-day task)."""
    fam = task.workload.get("family")
    if not fam:
        return None
    rate = float(fam.get("preemption_per_replica_hour", 0.0))
    sigma = float(fam.get("cold_start_sigma", 0.0))
    if rate <= 0 and sigma <= 0:
        return None
    n = int(task.workload.get("cycle_windows") or task.cycle_windows or task.horizon)
    return ReplicaDisruptions(rate, sigma, task.window_s * n / 24.0)
