"""The sampled planner's forecast of a family day: conditioned on the episode so far, deterministic, reads
only what the observation shows (past arrivals, announced jobs)."""

from __future__ import annotations

import numpy as np
import pytest
from llmserve_env.agents.forecast import DayForecast, tenant_counts
from llmserve_env.agents.planner import PlannerPolicy
from llmserve_env.shared.scenarios import announced_jobs, draw_day
from llmserve_env.shared.tasks import get_task
from llmserve_env.shared.workloads import arrivals_at_rates, generate_arrivals, windows

MT = get_task("multitenant_family")
DIURNAL = get_task("diurnal_family")


def _jobs(f: DayForecast, k: int, counts: dict[str, np.ndarray], announced: list, rng) -> list:
    """One future's jobs: what the episode showed, then one draw of the rest."""
    known, running, unseen = f._jobs_seen(k, counts, announced)
    return known + f._jobs_drawn(k, running, unseen, rng)


def test_futures_are_the_rest_of_the_day_deterministic_with_fresh_ids() -> None:
    f = DayForecast(DIURNAL, particles=256)
    wins = windows(generate_arrivals(DIURNAL, 500_000), DIURNAL)
    k = 12
    a = f.futures(k, tenant_counts(DIURNAL, wins[:k]), [], 2, 0, 1 << 40)
    b = f.futures(k, tenant_counts(DIURNAL, wins[:k]), [], 2, 0, 1 << 40)
    assert a == b
    assert [len(fut) for fut in a] == [DIURNAL.horizon - k] * 2
    ids = [r.request_id for fut in a for w in fut for r in w]
    assert len(set(ids)) == len(ids) and min(ids) >= 1 << 40
    for fut in a:
        for i, w in enumerate(fut):
            assert all((k + i) * DIURNAL.window_s <= r.arrival_s < (k + i + 1) * DIURNAL.window_s for r in w)
            assert [r.arrival_s for r in w] == sorted(r.arrival_s for r in w)


def test_the_posterior_finds_the_cycle_the_counts_came_from() -> None:
    """Counts at exactly one particle's expected rates: that particle is among the likeliest tenth, and the
    posterior's mean curve is nearer it than the prior's (the AR(1) noise, phi 0.7, leaves the cycle
    weakly identified: a steady offset looks much like noise)."""
    f = DayForecast(DIURNAL, particles=512)
    m = f.cycle["chat"]
    for j in (3, 100, 400):
        for k in (10, 30):
            lw = f.log_weights({"chat": m[j, :k] * DIURNAL.window_s})
            w = np.exp(lw - lw.max())
            post = (w[:, None] * m[:, :k]).sum(axis=0) / w.sum()
            assert int((lw > lw[j]).sum()) < 512 // 10
            assert np.abs(post / m[j, :k] - 1).max() < 0.7 * np.abs(m[:, :k].mean(axis=0) / m[j, :k] - 1).max()


def test_the_forecast_follows_the_days_level() -> None:
    """A day at 1.5x every particle's rates (the last window too): the expected future is above every prior curve's."""
    f = DayForecast(DIURNAL, particles=256)
    k = 20
    seen = f.cycle["chat"][0, :k] * DIURNAL.window_s * 1.5
    fut = f.futures(k, {"chat": seen}, [], 2, 0, 0)
    next_counts = [len(fut[s][0]) for s in range(2)]
    assert min(next_counts) > f.cycle["chat"][:, k].max() * DIURNAL.window_s


def test_jobs_ahead_replay_the_announced_and_running_jobs_and_draw_the_unseen() -> None:
    seed = 500_000  # its jobs: (8, 7 windows, 4.4 req/s, announced at 3) and (32, 5, 3.6, never announced)
    day = draw_day(MT, seed)
    assert [(j.start_window, j.windows, j.announced_at) for j in day.jobs][:2] == [(8, 7, 3), (32, 5, None)]
    wins = windows(generate_arrivals(MT, seed), MT)
    f = DayForecast(MT, particles=64)
    rng = np.random.default_rng(0)
    k = 10
    jobs = _jobs(f, k, tenant_counts(MT, wins[:k]), announced_jobs(MT, seed, k), rng)
    assert jobs[0].start == 8 and jobs[0].windows == 7  # the announced job, as announced
    later = [j for j in jobs[1:] if j.start >= 28]
    assert len(later) == 1 and 28 <= later[0].start <= 32  # the second slot, not yet seen: drawn in its range
    assert not any(4 <= j.start <= 8 for j in jobs[1:])  # the first slot is the announced job's
    k = 34  # the unannounced job has run 2 windows: it goes on at its observed rate for 5-7 windows in all
    jobs = _jobs(f, k, tenant_counts(MT, wins[:k]), announced_jobs(MT, seed, k), rng)
    running = [j for j in jobs if j.start == 32]
    assert len(running) == 1 and 3 <= running[0].windows <= 5 and abs(running[0].rate_rps - 3.6) < 1.0
    assert not any(28 <= j.start <= 32 and j is not running[0] for j in jobs)


def test_arrivals_at_rates_counts_and_refuses_unknown_tenants() -> None:
    rng = np.random.default_rng(1)
    rates = {"interactive": np.full(MT.horizon - 40, 20.0)}
    wins = arrivals_at_rates(MT, rates, 40, rng, 7)
    assert len(wins) == MT.horizon - 40
    total = sum(len(w) for w in wins)
    assert abs(total - 20.0 * MT.window_s * len(wins)) < 4 * np.sqrt(20.0 * MT.window_s * len(wins))
    assert {a.tenant for w in wins for a in w} == {"interactive"} and wins[0][0].request_id == 7
    with pytest.raises(ValueError, match="no tenant 'chat'"):
        arrivals_at_rates(MT, {"chat": np.ones(8)}, 40, rng)


def test_the_planner_forecasts_a_family_by_its_posterior_and_others_by_the_nearest_days() -> None:
    assert PlannerPolicy("multitenant_family", pool=2).forecast == "posterior"
    assert PlannerPolicy("diurnal_autoscale", pool=2).forecast == "nearest"
    assert PlannerPolicy("diurnal_family", pool=2, forecast="nearest").forecast == "nearest"
    with pytest.raises(ValueError, match="forecast"):
        PlannerPolicy("diurnal_autoscale", forecast="posterior")
    with pytest.raises(ValueError, match="forecast"):
        PlannerPolicy("diurnal_family", forecast="oracle")
    with pytest.raises(ValueError, match="scenario family"):
        DayForecast(get_task("diurnal_autoscale"))
    p = PlannerPolicy("diurnal_family", pool=2)
    wins = windows(generate_arrivals(DIURNAL, 1_000_000), DIURNAL)
    futs = p.future_windows(1_000_000, wins[:5])
    assert len(futs) == 2 and all(f[:5] == wins[:5] and len(f) == DIURNAL.horizon for f in futs)


def _wide_mass(f: DayForecast, task_id: str, seed: int, k: int, n_wide: int) -> float:
    played = get_task(task_id)
    wins = windows(generate_arrivals(played, seed), played)
    lw = f.log_weights(tenant_counts(f.task, wins[:k]))
    w = np.exp(lw - lw.max())
    return float(w[-n_wide:].sum() / w.sum())


def test_the_hedge_leaves_the_familys_particles_as_they_were() -> None:
    plain, hedged = DayForecast(DIURNAL, particles=400), DayForecast(DIURNAL, particles=400, wide=0.25)
    assert np.array_equal(plain.cycle["chat"][:300], hedged.cycle["chat"][:300])
    assert not np.allclose(plain.cycle["chat"][300:], hedged.cycle["chat"][300:])
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="wide must be a share in"):
            DayForecast(DIURNAL, wide=bad)
    with pytest.raises(ValueError, match="wide_prior needs the 'posterior' forecast"):
        PlannerPolicy("diurnal_autoscale", wide_prior=0.25)


def test_the_hedge_takes_the_posterior_only_on_a_day_outside_the_family() -> None:
    """A quarter of the particles drawn from the wide ranges: after 16 windows of a family day they hold
    little of the posterior; of a shifted day (peak hours earlier, more load), nearly all of it."""
    f = DayForecast(DIURNAL, wide=0.25)
    n_wide = 512
    seeds = range(500_000, 500_006)
    family = [_wide_mass(f, "diurnal_family", s, 16, n_wide) for s in seeds]
    shifted = [_wide_mass(f, "diurnal_family_shifted", s, 16, n_wide) for s in seeds]
    assert max(family) < 0.2
    assert float(np.median(shifted)) > 0.9


def test_the_likelihood_asked_window_by_window_is_the_one_computed_from_scratch() -> None:
    """`log_weights` keeps the terms of the windows it was asked before and computes only the new ones;
    every answer must be bit for bit the from-scratch one, also when the counts go back to a shorter day
    or change their past (another episode, a fork)."""
    family = get_task("multitenant_family")
    shifted = get_task("multitenant_family_shifted")
    asked = DayForecast(family, seed=3, wide=0.25)
    for task, seed in ((shifted, 1_000_000), (family, 1_000_001), (family, 1_000_001)):
        day = windows(generate_arrivals(task, seed), task)
        for k in range(family.horizon):
            counts = tenant_counts(task, day[:k])
            assert np.array_equal(asked.log_weights(counts), DayForecast(family, seed=3, wide=0.25).log_weights(counts))
    other = tenant_counts(family, windows(generate_arrivals(family, 7), family)[:20])
    other = {name: c + (np.arange(20) == 3) for name, c in other.items()}  # the same length, another past
    assert np.array_equal(asked.log_weights(other), DayForecast(family, seed=3, wide=0.25).log_weights(other))
