"""Futures of a scenario family's day conditioned on what the episode has shown (the sampled planner's forecast).

A family task (shared/scenarios.py) draws each day's cycle (peak window, level, peak-to-trough), an AR(1)
log-rate noise per cycled tenant, flash crowds and batch jobs (scheduled, some announced, plus ad-hoc
ones). Drawing other days from the family and keeping the ones whose last two windows look like today's
(the planner's `nearest` forecast) forgets everything the morning said about this day, and plays jobs
that are not today's. `DayForecast` is the posterior of the same model given the episode so far:

- **The cycle**: particles (peak, level, ratio) drawn from the family's ranges, weighted by the likelihood
  of each cycled tenant's observed per-window counts: the log-rate residual against the particle's cycle
  is the AR(1) noise plus Poisson error (variance 1 / expected count), scored innovation by innovation
  with a Student-t (4 degrees of freedom) so that a flash crowd's jump does not rule a particle out.
- **The noise ahead**: its expected path from the last window's residual (shrunk by its Poisson share),
  decaying at the family's phi, not a sampled path: with the planner's 2 futures a sampled path's noise
  was most of a forecast's error (bench/forecast_error.py). No flash crowds ahead: at the families' 0.5 a
  day they add ~3 % to the expected rate, and one drawn at the wrong time was a large error.
  With `noise="sampled"` (opt-in) each future plays one drawn path instead (the last window's noise drawn
  given its residual, then the AR(1) forward) and flash crowds ahead at the family's rate: worse as a
  point forecast, but a policy valued on it meets the day's swings, as the one that comes will have them.
- **The surprises, stratified** (`stratified`, the planner's opt-in `surprises`): futures without an ad-hoc
  job or flash crowd ahead and futures with some, each set weighted by its chance over the windows left, so
  that every decision's values weigh the surprises a day may still bring at their odds, where two futures
  drawn at random hold one or not by luck.
- **The jobs** (tenants with jobs only, no cycle): the announced jobs the observation shows, as
  announced; a job running unannounced (arrivals no announced job explains) continues at its observed rate
  for a length drawn from its scheduled slot's range (or the ad-hoc range), at least what it has run; each
  scheduled job not yet seen starts in what is left of its start range; ad-hoc jobs at the family's rate.

**The hedge** (`wide`, off by default): a share of the cycle's particles drawn instead from `WIDE_PRIOR`, far
wider ranges than the family's (a peak anywhere in the day, load x0.5-2). Built for the family, the planner
otherwise cannot believe a day the family never drew: on the shifted split (peaks hours earlier, more
load) every particle is wrong and its rollouts rank the bases as if the day were a family day. With the
hedge the likelihood moves the posterior onto the wide particles that fit the morning, as an operator's
level correction would, and on a family day the family's particles keep fitting best.

Only what the observation carries is read: past arrivals (counted per tenant and window) and the
announced jobs. Deterministic for (seed, window). Futures are turned into requests by
`shared.workloads.arrivals_at_rates`, each tenant's lengths drawn as the task draws them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from llmserve_env.shared import portable_math as pm
from llmserve_env.shared.arrival_list import arrival_columns
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.scenarios import (
    FlashCrowd,
    cycle_mean,
    draw_flash_crowd,
    draw_integer,
    draw_uniform,
    is_family,
    raised_cosine,
)
from llmserve_env.shared.tasks import TaskSpec
from llmserve_env.shared.workloads import arrivals_at_rates

FORECAST_STREAM = 0x464F5245  # "FORE"
WIDE_STREAM = 0x57494445  # "WIDE"
SURPRISE_STREAM = 0x53555250  # "SURP"
STUDENT_NU = 4.0
# ASSUMPTION, the hedge's ranges (not any task's): a peak anywhere in the cycle, half to twice the published
# load, a flatter or steeper day than the families'. Wide enough to hold a day the family never drew.
WIDE_PRIOR = {"level": (0.5, 2.0), "peak_to_trough": (1.5, 5.0)}
# the off-family judge's hedge: a quarter of its particles wide, prior odds 1:3 that the day left the family;
# chosen before any shifted day was played, not tuned
OFF_FAMILY_WIDE = 0.25
# how a future's noise ahead is played: its expected path from the last window (the default), or a path drawn
# from the AR(1) given the last window, with flash crowds ahead drawn at the family's rate (module docstring)
NOISE_MODES = ("expected", "sampled")
# the stratified futures' peak zone (`DayForecast.peak_zone`): a surprise starting up to 4 windows before the
# peak window or 1 after it meets the peak's windows (the families' flash crowds last 1-4 windows, ad-hoc jobs
# 2-6). Any zone keeps the stratified values unbiased (the split is weighted by its chance); chosen before any
# run, not tuned
PEAK_ZONE = (4, 1)


@dataclass(frozen=True, slots=True)
class Job:
    """A batch job as the forecast plays it: `rate_rps` over windows [start, start + windows)."""

    tenant: str
    start: int
    windows: int
    rate_rps: float


def tenant_counts(task: TaskSpec, wins: list[Sequence[Arrival]]) -> dict[str, np.ndarray]:
    """Each tenant's arrivals per window: what `DayForecast` conditions on."""
    names = [t.name for t in task.tenants]
    counts = np.array([arrival_columns(w).tenant_counts(names) for w in wins], dtype=float).reshape(len(wins), len(names))
    return {name: counts[:, i].copy() for i, name in enumerate(names)}


def _runs(counts: np.ndarray) -> list[tuple[int, int]]:
    """[first, last] window of each run of windows with arrivals."""
    out: list[tuple[int, int]] = []
    start = None
    for i, c in enumerate(counts.tolist()):
        if c > 0 and start is None:
            start = i
        elif c <= 0 and start is not None:
            out.append((start, i - 1))
            start = None
    if start is not None:
        out.append((start, len(counts) - 1))
    return out


class DayForecast:
    """The posterior over a family task's day given the episode so far (module docstring)."""

    def __init__(self, task: TaskSpec, particles: int = 2048, seed: int = 0, wide: float = 0.0,
                 noise: str = "expected"):
        if noise not in NOISE_MODES:
            raise ValueError(f"noise must be one of {', '.join(NOISE_MODES)}, got {noise!r}")
        self.noise = noise
        if not is_family(task):
            raise ValueError(f"task {task.task_id!r} is not a scenario family: its day has no distribution to condition")
        if particles < 1:
            raise ValueError(f"particles must be >= 1, got {particles}")
        if not 0.0 <= wide <= 1.0:
            raise ValueError(f"wide must be a share in [0, 1], got {wide}")
        self.task = task
        w = task.workload
        fam = w["family"]
        self.horizon, self.window_s = task.horizon, task.window_s
        self.phi, self.sigma = float(fam["noise"]["phi"]), float(fam["noise"]["sigma"])
        self.crowds = fam.get("flash_crowds")
        rng = np.random.default_rng([int(seed), FORECAST_STREAM])
        peak, level, ratio = (rng.uniform(float(fam[key][0]), float(fam[key][1]), particles)
                              for key in ("peak_window", "level", "peak_to_trough"))
        k = np.arange(self.horizon, dtype=np.float64)
        n = int(w["cycle_windows"])
        self.n_wide = n_wide = int(round(wide * particles))
        if n_wide:
            # a hedge against a day outside the family (module docstring): the last n_wide particles drawn
            # from WIDE_PRIOR's ranges instead, from their own stream so the family's particles are unchanged
            wrng = np.random.default_rng([int(seed), FORECAST_STREAM, WIDE_STREAM])
            peak[-n_wide:] = wrng.uniform(0.0, float(n), n_wide)
            level[-n_wide:] = wrng.uniform(*WIDE_PRIOR["level"], n_wide)
            ratio[-n_wide:] = wrng.uniform(*WIDE_PRIOR["peak_to_trough"], n_wide)
        shape = np.stack([raised_cosine(k, n, p) for p in peak])  # (particles, horizon)
        # each cycled tenant's expected rate per particle and window, as shared.scenarios._draw builds it
        self.cycle: dict[str, np.ndarray] = {}
        for name, spec in w["tenants"].items():
            self.cycle[name] = cycle_mean(spec, level[:, None], ratio[:, None], shape)
        self.job_tenants = [t.name for t in task.tenants if t.name not in self.cycle]
        # per cycled tenant: the counts last conditioned on and their likelihood terms (`_terms`)
        self._memo: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.specs = list(fam.get("jobs", []))
        self.extra = fam.get("extra_jobs")
        for spec in self.specs:
            if spec["tenant"] in self.cycle:
                raise ValueError(f"task {task.task_id!r}: jobs on a cycled tenant ({spec['tenant']!r}) are not modelled")

    # ------------------------------------------------------------------------------ the cycle

    def log_weights(self, counts: dict[str, np.ndarray]) -> np.ndarray:
        """Log-likelihood of every particle given each cycled tenant's counts of the windows served so far."""
        ll = np.zeros(next(iter(self.cycle.values())).shape[0])
        for name, m in self.cycle.items():
            c = np.asarray(counts.get(name, ()), dtype=np.float64)
            if c.shape[0]:
                ll += self._terms(name, m, c).sum(axis=1)
        return ll

    def _terms(self, name: str, m: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Each particle's log-likelihood term of every window of `c` (particles, windows). An episode asks
        again each window with one window more: the terms of the windows asked before are kept and only
        the new ones computed, each by the same operations on the same values as from scratch."""
        k = c.shape[0]
        if name not in self._memo:
            self._memo[name] = (np.empty(0), np.empty((m.shape[0], self.horizon)))
        seen, terms = self._memo[name]
        j = seen.shape[0]
        if j > k or not np.array_equal(seen, c[:j]):
            j = 0  # another episode, or a fork's other past: from scratch
        if j < k:
            lo = max(j - 1, 0)  # a window's innovation reads the window before it
            z, p = self._residuals(m[:, lo:k], c[lo:k])
            v = np.empty_like(z)
            e = np.empty_like(z)
            s2 = self.sigma ** 2
            e[:, 0], v[:, 0] = z[:, 0], s2 + p[:, 0]
            e[:, 1:] = z[:, 1:] - self.phi * z[:, :-1]
            v[:, 1:] = s2 * (1.0 - self.phi ** 2) + p[:, 1:] + self.phi ** 2 * p[:, :-1]
            nu = STUDENT_NU
            block = -0.5 * pm.log(v) - 0.5 * (nu + 1.0) * pm.log1p(e * e / (nu * v))
            terms[:, j:k] = block[:, j - lo:]
        self._memo[name] = (c.copy(), terms)
        return terms[:, :k]

    def posterior(self, counts: dict[str, np.ndarray]) -> np.ndarray:
        """Every particle's posterior weight given the counts so far (summing to 1)."""
        lw = self.log_weights(counts)
        w = pm.exp(lw - lw.max())
        return w / w.sum()

    def outside_share(self, counts: dict[str, np.ndarray]) -> float:
        """The posterior's mass on the hedge's particles given the counts so far (0 without the hedge): above
        one half, the day is more likely outside the family than in it (prior odds 1:3 at `wide` 0.25)."""
        return float(self.posterior(counts)[-self.n_wide:].sum()) if self.n_wide else 0.0

    def _residuals(self, m: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The log-rate residual (the AR(1) noise plus Poisson error) and that error's variance."""
        expected = m * self.window_s
        z = pm.log((c[None, :] + 0.5) / (expected + 0.5)) + 0.5 * self.sigma ** 2
        return z, 1.0 / (expected + 0.5)

    # ------------------------------------------------------------------------------ futures

    def futures(self, k: int, counts: dict[str, np.ndarray], announced: list[dict[str, Any]], samples: int,
                seed: int, first_id: int) -> list[list[Sequence[Arrival]]]:
        """`samples` futures: arrival windows k..horizon-1 each, drawn from the posterior given the counts
        of windows 0..k-1 (tenant -> counts) and the jobs announced before window k."""
        self._check_window(k)
        rng = np.random.default_rng([int(seed), FORECAST_STREAM, k])
        w = self.posterior(counts)
        picks = rng.choice(w.shape[0], size=samples, p=w)
        known, running, unseen = self._jobs_seen(k, counts, announced)
        out = []
        next_id = first_id
        for j in picks.tolist():
            rates = self._rates_ahead(int(j), k, counts, rng)
            wins = self._arrivals(k, rates, known + self._jobs_drawn(k, running, unseen, rng), rng, next_id)
            next_id += sum(len(x) for x in wins)
            out.append(wins)
        return out

    def stratified(self, k: int, counts: dict[str, np.ndarray], announced: list[dict[str, Any]], samples: int,
                   surprises: int, seed: int, first_id: int, peak: bool = False
                   ) -> tuple[list[list[Sequence[Arrival]]], list[float]]:
        """Futures stratified by the day's surprises ahead, with their weights (summing to 1): `samples`
        futures with none (no ad-hoc job, no flash crowd from window k on) weighted by the chance of none over
        the windows left, and `surprises` futures with at least one (their number the Poisson's given one or
        more; each a flash crowd or an ad-hoc job in proportion to the family's rates of each, at a time drawn
        uniformly over the windows left, drawn as the family draws one) weighted by the chance of some. Each
        stratum is otherwise the posterior's, as `futures` draws it (the noise's expected path): the expectation
        of futures drawn with the surprises at random (`noise="sampled"`; the default futures leave the flash
        crowds out), without two futures' luck deciding whether a surprise is in them at all.

        With `peak` (surprises >= 2) the surprise stratum is split again by where its first surprise starts: in
        the peak zone (`peak_zone`: the windows from which a surprise meets the posterior's peak) in even-numbered
        surprise futures, elsewhere in odd ones, each half weighted by that chance (the zone's share of the windows
        left). The first surprise's start is uniform over the windows left, so the split keeps the stratum's
        expectation whatever the zone; it puts a surprise at the peak, where a rule without headroom loses most,
        into every decision's values at its odds instead of into a draw's luck. Where the zone is behind or covers
        every window left, the stratum is drawn as without `peak`."""
        self._check_window(k)
        if samples < 1 or surprises < 1 or (peak and surprises < 2):
            raise ValueError(f"stratified futures need samples >= 1 and surprises >= 1 (without a surprise stratum the "
                             f"quiet futures alone would leave the surprises out), and surprises >= 2 with peak (a "
                             f"future in the zone and one outside it), got {samples} and {surprises}")
        rng = np.random.default_rng([int(seed), FORECAST_STREAM, k, SURPRISE_STREAM])
        w = self.posterior(counts)
        picks = rng.choice(w.shape[0], size=samples + surprises, p=w)
        known, running, unseen = self._jobs_seen(k, counts, announced)
        left = self.horizon - k
        lam_crowd = float(self.crowds["per_day"]) * left / self.horizon if self.crowds else 0.0
        lam_job = float(self.extra["per_day"]) * left / self.horizon if self.extra else 0.0
        p_some = 1.0 - pm.exp(-(lam_crowd + lam_job))
        zone = self.peak_zone(k, w) if peak else []
        inside = len(zone) / left
        split = 0.0 < inside < 1.0
        outside = [i for i in range(k, self.horizon) if not zone[0] <= i <= zone[-1]] if split else []
        out = []
        next_id = first_id
        for n, j in enumerate(picks.tolist()):
            rates = self._rates_ahead(int(j), k, counts, rng, crowds=False)
            jobs = known + self._jobs_drawn(k, running, unseen, rng, adhoc=False)
            if n >= samples and p_some > 0.0:
                # how many surprises: the Poisson's count given at least one (drawn until it is one or more)
                count = 0
                while count == 0:
                    count = int(rng.poisson(lam_crowd + lam_job))
                for m in range(count):
                    if m == 0 and split:
                        where = zone if (n - samples) % 2 == 0 else outside
                        start = where[draw_integer(rng, (0, len(where) - 1))]
                    else:
                        start = k + draw_integer(rng, (0, left - 1))
                    if rng.random() * (lam_crowd + lam_job) < lam_crowd:
                        assert self.crowds is not None
                        self._crowd_on(rates, k, draw_flash_crowd(rng, self.crowds, start))
                    else:
                        jobs.append(self._adhoc_job(rng, start))
            wins = self._arrivals(k, rates, jobs, rng, next_id)
            next_id += sum(len(x) for x in wins)
            out.append(wins)
        if not split:
            return out, [(1.0 - p_some) / samples] * samples + [p_some / surprises] * surprises
        n_in = (surprises + 1) // 2
        return out, [(1.0 - p_some) / samples] * samples + [
            p_some * (inside / n_in if i % 2 == 0 else (1.0 - inside) / (surprises - n_in)) for i in range(surprises)]

    def peak_zone(self, k: int, weights: np.ndarray) -> list[int]:
        """The windows from k on where a surprise that starts meets the day's peak: the posterior mean cycle's
        highest window of the day (summed over the cycled tenants) and the PEAK_ZONE windows before it (a surprise
        lasts some windows) and after it. Empty once the peak is behind."""
        # (summed particle by particle in order: BLAS's weights @ m sums in an order its CPU-chosen kernel picks)
        mean = sum((weights[:, None] * m).sum(axis=0) for m in self.cycle.values())
        top = int(np.argmax(mean))
        lo, hi = top - PEAK_ZONE[0], top + PEAK_ZONE[1]
        return list(range(max(lo, k), min(hi, self.horizon - 1) + 1))

    def _check_window(self, k: int) -> None:
        if not 0 <= k < self.horizon:
            raise ValueError(f"window k must be in 0..{self.horizon - 1}, got {k}")

    def _rates_ahead(self, j: int, k: int, counts: dict[str, np.ndarray], rng: np.random.Generator,
                     crowds: bool = True) -> dict[str, np.ndarray]:
        return self._cycle_ahead(j, k, counts) if self.noise == "expected" \
            else self._cycle_drawn(j, k, counts, rng, crowds)

    def _arrivals(self, k: int, rates: dict[str, np.ndarray], jobs: list[Job], rng: np.random.Generator,
                  first_id: int) -> list[Sequence[Arrival]]:
        """The arrival windows k.. of the cycled tenants' rates plus the jobs' (each over its windows)."""
        for job in jobs:
            lo, hi = max(job.start, k), min(job.start + job.windows, self.horizon)
            if hi > lo:
                r = rates.setdefault(job.tenant, np.zeros(self.horizon - k))
                r[lo - k:hi - k] += job.rate_rps
        return arrivals_at_rates(self.task, rates, k, rng, first_id)

    def _cycle_ahead(self, j: int, k: int, counts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each cycled tenant's expected rate over windows k.. under particle j, given the last residual: with
        x the AR(1) noise, E[exp(x_{k-1+h} - s2/2) | x_{k-1}] = exp(phi^h x_{k-1} - phi^(2h) s2/2)."""
        s2 = self.sigma ** 2
        decay = pm.power(self.phi, np.arange(1, self.horizon - k + 1, dtype=np.float64))
        rates: dict[str, np.ndarray] = {}
        for name, m in self.cycle.items():
            c = np.asarray(counts.get(name, ()), dtype=np.float64)
            if k > 0 and c.shape[0] == k:
                z, p = self._residuals(m[j:j + 1, k - 1:k], c[k - 1:k])
                x = float(z[0, 0]) * s2 / (s2 + float(p[0, 0]))  # the last window's noise, less its Poisson share
                rates[name] = m[j, k:] * pm.exp(decay * x - 0.5 * s2 * decay * decay)
            else:
                rates[name] = m[j, k:].copy()  # the stationary noise's mean factor is 1
        return rates

    def _cycle_drawn(self, j: int, k: int, counts: dict[str, np.ndarray], rng: np.random.Generator,
                     crowds: bool = True) -> dict[str, np.ndarray]:
        """Each cycled tenant's rate over windows k.. under particle j on one drawn noise path (`noise="sampled"`):
        the last window's noise drawn from its posterior given the residual (Gaussian: the AR(1)'s sigma^2
        against the Poisson share), carried forward by the AR(1) as shared.scenarios draws a day; then flash
        crowds ahead at the family's rate over the windows left, each drawn as the family draws one."""
        s2 = self.sigma ** 2
        innov = self.sigma * float(np.sqrt(max(0.0, 1.0 - self.phi ** 2)))
        left = self.horizon - k
        rates: dict[str, np.ndarray] = {}
        for name, m in self.cycle.items():
            c = np.asarray(counts.get(name, ()), dtype=np.float64)
            eps = rng.standard_normal(left)
            path = np.empty(left)
            if k > 0 and c.shape[0] == k:
                z, p = self._residuals(m[j:j + 1, k - 1:k], c[k - 1:k])
                share = s2 / (s2 + float(p[0, 0]))
                x = float(z[0, 0]) * share + float(np.sqrt(s2 * (1.0 - share))) * float(rng.standard_normal())
                path[0] = self.phi * x + innov * float(eps[0])
            else:
                path[0] = self.sigma * float(eps[0])  # nothing seen: the stationary distribution
            for i in range(1, left):
                path[i] = self.phi * path[i - 1] + innov * float(eps[i])
            rates[name] = m[j, k:] * pm.exp(path - 0.5 * s2)
        if self.crowds and crowds:
            for _ in range(int(rng.poisson(float(self.crowds["per_day"]) * left / self.horizon))):
                self._crowd_on(rates, k, draw_flash_crowd(rng, self.crowds, k + draw_integer(rng, (0, left - 1))))
        return rates

    @staticmethod
    def _crowd_on(rates: dict[str, np.ndarray], k: int, crowd: FlashCrowd) -> None:
        """Multiply the crowd's tenant's rates (windows k..) over the crowd's windows by its factor."""
        if crowd.tenant in rates:
            lo = crowd.start_window - k
            rates[crowd.tenant][lo:lo + crowd.windows] *= crowd.factor

    def _adhoc_job(self, rng: np.random.Generator, start: int) -> Job:
        """One ad-hoc job from window `start`: its length and rate drawn from the family's `extra_jobs`."""
        assert self.extra is not None
        return Job(self.extra["tenant"], start, draw_integer(rng, self.extra["windows"]),
                   draw_uniform(rng, self.extra["rate_rps"]))

    def _jobs_seen(self, k: int, counts: dict[str, np.ndarray], announced: list[dict[str, Any]]
                   ) -> tuple[list[Job], list[tuple[Job, Any]], list[dict[str, Any]]]:
        """What the episode has shown of the jobs before window k: the announced ones; each job running
        unannounced, with the length range it is drawn from (its scheduled slot's, else the ad-hoc one's,
        at least what it has run; the Job holds its run so far); the scheduled slots not yet seen."""
        known = [Job(str(a["tenant"]), int(a["start_window"]), int(a["windows"]), float(a["rate_rps"]))
                 for a in announced]
        used: set[int] = set()

        def slot(tenant: str, start: int) -> int | None:
            for i, spec in enumerate(self.specs):
                lo, hi = (int(x) for x in spec["start_window"])
                if i not in used and spec["tenant"] == tenant and lo <= start <= hi:
                    return i
            return None

        for job in known:
            i = slot(job.tenant, job.start)
            if i is not None:
                used.add(i)
        running: list[tuple[Job, Any]] = []
        for tenant in self.job_tenants:
            c = np.asarray(counts.get(tenant, ()), dtype=np.float64)
            for first, last in _runs(c):
                if any(j.tenant == tenant and j.start == first for j in known):
                    continue  # an announced job's own arrivals
                i = slot(tenant, first)
                if i is not None:
                    used.add(i)
                if last < k - 1:
                    continue  # ran and ended before this window
                explained = sum(j.rate_rps for j in known if j.tenant == tenant and j.start <= k - 1 < j.start + j.windows)
                rate = float(c[max(first, k - 3):k].mean()) / self.window_s - explained
                if rate > 0.0:
                    bounds = (self.specs[i]["windows"] if i is not None
                              else self.extra["windows"] if self.extra else (k - first, k - first))
                    running.append((Job(tenant, first, k - first, rate), bounds))
        unseen = [spec for i, spec in enumerate(self.specs) if i not in used and int(spec["start_window"][1]) >= k]
        return known, running, unseen

    def _jobs_drawn(self, k: int, running: list[tuple[Job, Any]], unseen: list[dict[str, Any]],
                    rng: np.random.Generator, adhoc: bool = True) -> list[Job]:
        """One draw of what the episode has not shown: each running job's length, each unseen slot's job
        in what is left of its start range, and (`adhoc`) ad-hoc jobs at the family's rate."""
        jobs = []
        for job, bounds in running:
            lo, hi = (max(int(x), job.windows) for x in bounds)
            jobs.append(Job(job.tenant, job.start, draw_integer(rng, (lo, hi)), job.rate_rps))
        for spec in unseen:
            start = draw_integer(rng, (max(int(spec["start_window"][0]), k), spec["start_window"][1]))
            jobs.append(Job(spec["tenant"], start, draw_integer(rng, spec["windows"]), draw_uniform(rng, spec["rate_rps"])))
        if self.extra and adhoc:
            left = self.horizon - k
            for _ in range(int(rng.poisson(float(self.extra["per_day"]) * left / self.horizon))):
                jobs.append(self._adhoc_job(rng, k + draw_integer(rng, (0, left - 1))))
        return jobs


class OffFamilyJudge:
    """Whether the day seen so far is more likely outside the family than in it: a posterior hedged with
    `OFF_FAMILY_WIDE` of wide particles holds more than half its mass on them. Asked by the planner's
    `off_family` and by the gated learned policy (agents/gated.py), with the counts each window shows."""

    def __init__(self, task: TaskSpec, seed: int):
        self.forecast = DayForecast(task, seed=seed, wide=OFF_FAMILY_WIDE)

    def outside(self, counts: dict[str, np.ndarray]) -> bool:
        return self.forecast.outside_share(counts) > 0.5
