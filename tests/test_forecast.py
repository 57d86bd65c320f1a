"""The sampled planner's forecast of a family day: conditioned on the episode so far, deterministic, reads
only what the observation shows (past arrivals, announced jobs)."""

from __future__ import annotations

import numpy as np
import pytest
from llmserve_env.agents.forecast import PEAK_ZONE, DayForecast, tenant_counts
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


def test_drawn_noise_paths_average_to_the_expected_path_and_vary_as_the_familys_noise() -> None:
    """`noise="sampled"`: each future plays one AR(1) path from the last window; over many draws the rate
    ahead averages to the expected path's (flash crowds off: they add rate by design), and each path's
    log-rate spread is the family's stationary sigma far ahead. The expected mode is left as it was."""
    f = DayForecast(DIURNAL, particles=64, noise="sampled")
    e = DayForecast(DIURNAL, particles=64)
    f.crowds = None
    k, j = 20, 5
    counts = {"chat": f.cycle["chat"][j, :k] * DIURNAL.window_s * 1.3}
    expected = e._cycle_ahead(j, k, counts)["chat"]
    rng = np.random.default_rng(7)
    drawn = np.stack([f._cycle_drawn(j, k, counts, rng)["chat"] for _ in range(4000)])
    assert np.abs(drawn.mean(axis=0) / expected - 1).max() < 0.03
    far = np.log(drawn[:, -1] / f.cycle["chat"][j, -1])
    assert abs(far.std() - f.sigma) < 0.01
    assert np.abs(np.log(drawn[:, 0] / expected[0])).std() < f.sigma  # the last window pins the next one
    a = f.futures(k, counts, [], 2, 0, 1 << 40)
    assert a == f.futures(k, counts, [], 2, 0, 1 << 40)
    assert [len(w) for w in a[0]] != [len(w) for w in e.futures(k, counts, [], 2, 0, 1 << 40)[0]]
    with pytest.raises(ValueError, match="noise must be one of expected, sampled"):
        DayForecast(DIURNAL, noise="random")
    with pytest.raises(ValueError, match="noise 'sampled' needs a sampled planner with the 'posterior' forecast"):
        PlannerPolicy("diurnal_autoscale", noise="sampled")
    with pytest.raises(ValueError, match="noise must be one of expected, sampled"):
        PlannerPolicy("diurnal_family", mode="clairvoyant", noise="random")


def test_futures_stratified_by_surprises_keep_the_days_expected_load() -> None:
    """`stratified`: futures without a surprise weighted by the chance of none over the windows left
    (Poisson, the family's flash crowds and ad-hoc jobs a day), futures with some by the rest; weighted, the
    load ahead is what futures with the surprises drawn at random carry (`noise="sampled"`, whose noise path
    averages to the expected one: the same expectation, stratified; ~1 % standard error here)."""
    f = DayForecast(MT, particles=64)
    g = DayForecast(MT, particles=64, noise="sampled")
    wins = windows(generate_arrivals(MT, 500_000), MT)
    k = 36
    counts = tenant_counts(MT, wins[:k])
    lam = (0.5 + 0.5) * (MT.horizon - k) / MT.horizon
    fut, w = f.stratified(k, counts, [], 2, 2, 0, 1 << 40)
    assert w == pytest.approx([np.exp(-lam) / 2] * 2 + [(1 - np.exp(-lam)) / 2] * 2) and sum(w) == pytest.approx(1)
    assert (fut, w) == f.stratified(k, counts, [], 2, 2, 0, 1 << 40)
    with pytest.raises(ValueError, match="surprises >= 1"):
        f.stratified(k, counts, [], 2, 0, 0, 1 << 40)
    plain, strat = [], []
    for seed in range(150):
        plain += [sum(len(x) for x in fu) for fu in g.futures(k, counts, [], 2, seed, 0)]
        fu, wt = f.stratified(k, counts, [], 1, 1, seed, 0)
        strat.append(sum(q * sum(len(x) for x in one) for q, one in zip(wt, fu, strict=True)))
    assert abs(np.mean(strat) / np.mean(plain) - 1) < 0.035
    # the surprise stratum carries more load than the quiet one, by the family's surprises
    quiet = np.mean([sum(len(x) for x in f.stratified(k, counts, [], 1, 1, s, 0)[0][0]) for s in range(40)])
    loud = np.mean([sum(len(x) for x in f.stratified(k, counts, [], 1, 1, s, 0)[0][1]) for s in range(40)])
    assert loud > quiet * 1.02
    with pytest.raises(ValueError, match="surprises must be >= 0"):
        PlannerPolicy("diurnal_autoscale", surprises=1)


def test_the_surprise_stratum_split_at_the_peak_keeps_its_expectation() -> None:
    """`stratified(peak=True)`: the surprise futures split by whether their first surprise starts in the peak
    zone (even-numbered) or outside it, weighted by the zone's share of the windows left: the peak's expected
    load is what the unsplit stratum gives (~1 % standard error here), the in-zone future carries more of it,
    and once the peak is behind nothing is split."""
    f = DayForecast(MT, particles=64)
    wins = windows(generate_arrivals(MT, 500_000), MT)
    k = 10
    counts = tenant_counts(MT, wins[:k])
    zone = f.peak_zone(k, f.posterior(counts))
    assert len(zone) == sum(PEAK_ZONE) + 1 and zone[0] > k
    lam = (0.5 + 0.5) * (MT.horizon - k) / MT.horizon
    some, inside = 1 - np.exp(-lam), len(zone) / (MT.horizon - k)
    fut, w = f.stratified(k, counts, [], 1, 2, 0, 1 << 40, peak=True)
    assert w == pytest.approx([1 - some, some * inside, some * (1 - inside)]) and sum(w) == pytest.approx(1)
    assert (fut, w) == f.stratified(k, counts, [], 1, 2, 0, 1 << 40, peak=True)

    def at_peak(one: list) -> int:
        return sum(len(one[i - k]) for i in zone)

    plain, split, near, far = [], [], [], []
    for seed in range(120):
        fu, wt = f.stratified(k, counts, [], 1, 2, seed, 0)
        plain.append(sum(q * at_peak(one) for q, one in zip(wt, fu, strict=True)))
        fu, wt = f.stratified(k, counts, [], 1, 2, seed, 0, peak=True)
        split.append(sum(q * at_peak(one) for q, one in zip(wt, fu, strict=True)))
        near.append(at_peak(fu[1]))
        far.append(at_peak(fu[2]))
    assert abs(np.mean(split) / np.mean(plain) - 1) < 0.03
    assert np.mean(near) > np.mean(far) * 1.05
    late = MT.horizon - 8
    assert f.peak_zone(late, f.posterior(tenant_counts(MT, wins[:late]))) == []
    assert f.stratified(late, tenant_counts(MT, wins[:late]), [], 1, 2, 0, 0, peak=True)[1] == \
        f.stratified(late, tenant_counts(MT, wins[:late]), [], 1, 2, 0, 0)[1]
    with pytest.raises(ValueError, match="surprises >= 2 with peak"):
        f.stratified(k, counts, [], 1, 1, 0, 0, peak=True)
    with pytest.raises(ValueError, match="surprise_peak needs surprises >= 2"):
        PlannerPolicy("multitenant_family", surprises=1, surprise_peak=True)
