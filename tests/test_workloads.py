"""Arrival generators: deterministic per (task, seed), independent of actions, shaped as documented."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from llmserve_env.shared.tasks import TASKS, UnknownTaskError, get_task
from llmserve_env.shared.workloads import generate_arrivals, high_load_regime, resolve_task, windows

SYNTHETIC = [t for t in TASKS.values() if t.workload["kind"] != "trace"]


@pytest.mark.parametrize("task", list(TASKS.values()), ids=list(TASKS))
def test_arrivals_well_formed_and_windowed(task):
    arr = generate_arrivals(task, 7)
    assert arr, "a task must send requests"
    assert [a.request_id for a in arr] == list(range(len(arr)))
    times = [a.arrival_s for a in arr]
    assert times == sorted(times)
    assert 0.0 <= times[0] and times[-1] < task.horizon * task.window_s
    names = {t.name: t for t in task.tenants}
    for a in arr:
        t = names[a.tenant]
        assert a.priority == t.priority
        assert t.prompt_clip[0] <= a.prompt_tokens <= t.prompt_clip[1]
        assert t.output_clip[0] <= a.output_tokens <= t.output_clip[1]
    ws = windows(arr, task)
    assert len(ws) == task.horizon
    assert [a for w in ws for a in w] == arr
    for k, w in enumerate(ws):
        assert all(k * task.window_s <= a.arrival_s < (k + 1) * task.window_s for a in w)


@pytest.mark.parametrize("task", SYNTHETIC, ids=[t.task_id for t in SYNTHETIC])
def test_deterministic_per_seed_and_different_across_seeds(task):
    assert generate_arrivals(task, 3) == generate_arrivals(task, 3)
    assert generate_arrivals(task, 3) != generate_arrivals(task, 4)


def test_rejects_bad_seeds():
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="seed"):
            generate_arrivals(TASKS["static_workload"], bad)  # type: ignore[arg-type]


def test_length_distribution_does_not_move_arrival_times():
    task = TASKS["bursty_workload"]
    longer = replace(task, tenants=tuple(replace(t, prompt_tokens=(t.prompt_tokens[0] * 2, 0.1))
                                         for t in task.tenants))
    a, b = generate_arrivals(task, 11), generate_arrivals(longer, 11)
    assert [x.arrival_s for x in a] == [x.arrival_s for x in b]
    assert [x.tenant for x in a] == [x.tenant for x in b]
    assert [x.prompt_tokens for x in a] != [x.prompt_tokens for x in b]


def test_static_is_poisson_at_its_rate_with_its_lengths():
    task = TASKS["static_workload"]
    counts, prompts, outputs = [], [], []
    for seed in range(6):
        arr = generate_arrivals(task, seed)
        counts += [len(w) for w in windows(arr, task)]
        prompts += [a.prompt_tokens for a in arr]
        outputs += [a.output_tokens for a in arr]
    rate = task.workload["rate_rps"] * task.window_s
    assert np.mean(counts) == pytest.approx(rate, rel=0.05)
    assert np.var(counts) / np.mean(counts) == pytest.approx(1.0, abs=0.35)  # Poisson: variance = mean
    assert np.median(prompts) == pytest.approx(task.tenants[0].prompt_tokens[0], rel=0.06)
    assert np.median(outputs) == pytest.approx(task.tenants[0].output_tokens[0], rel=0.06)
    assert np.log(prompts).std() == pytest.approx(task.tenants[0].prompt_tokens[1], rel=0.08)


def test_bursty_alternates_lulls_and_bursts():
    task = TASKS["bursty_workload"]
    lo, hi = task.workload["rates_rps"]
    dwell = np.array(task.workload["mean_dwell_windows"])
    counts = []
    for seed in range(8):
        counts += [len(w) for w in windows(generate_arrivals(task, seed), task)]
    counts = np.array(counts)
    p_burst = dwell[1] / dwell.sum()  # stationary share of time in the burst phase
    mean = lo * (1 - p_burst) + hi * p_burst
    # A mixture of two Poisson rates: variance = mean + variance of the rate (far above Poisson's).
    expected_var = mean + p_burst * (1 - p_burst) * (hi - lo) ** 2
    assert counts.mean() == pytest.approx(mean, rel=0.15)
    assert np.var(counts) == pytest.approx(expected_var, rel=0.35)
    assert (counts > (lo + hi) / 2).mean() == pytest.approx(p_burst, abs=0.12)
    shares = {t.name: t.share for t in task.tenants}
    arr = [a for seed in range(6) for a in generate_arrivals(task, seed)]
    assert sum(a.tenant == "rag" for a in arr) / len(arr) == pytest.approx(shares["rag"], abs=0.03)


def _spike_share(w: dict) -> float:
    """Expected share of spiking windows: spikes of mean length m after geometric gaps of mean (1-p)/p."""
    m = sum(w["spike_len_windows"]) / 2
    p = w["spike_prob"]
    return m / (m + (1 - p) / p)


def test_spike_mechanism_frequency_length_and_tenant():
    task = TASKS["adversarial_multitenant"]
    loud = replace(task, workload=dict(task.workload, spike_factor=12.0))  # spikes unmistakable
    base = task.workload["rate_rps"] * task.tenant("batch").share
    runs, spiking, others = [], [], []
    for seed in range(10):
        ws = windows(generate_arrivals(loud, seed), loud)
        flags = [sum(a.tenant == "batch" for a in w) > base * 4 for w in ws]
        spiking += flags
        others += [(f, sum(a.tenant != "batch" for a in w)) for f, w in zip(flags, ws, strict=True)]
        run = 0
        for f in flags + [False]:
            if f:
                run += 1
            elif run:
                runs.append(run)
                run = 0
    lo, hi = task.workload["spike_len_windows"]
    assert np.mean(spiking) == pytest.approx(_spike_share(task.workload), abs=0.06)
    assert lo <= np.median(runs) <= hi
    # The other tenants do not spike with it.
    in_spike = [n for f, n in others if f]
    out_spike = [n for f, n in others if not f]
    assert np.mean(in_spike) == pytest.approx(np.mean(out_spike), rel=0.15)


def test_adversarial_batch_tenant_rate_includes_its_spikes():
    task = TASKS["adversarial_multitenant"]
    w = task.workload
    base = w["rate_rps"] * task.tenant("batch").share
    expected = base * (1 + (w["spike_factor"] - 1) * _spike_share(w)) * task.window_s
    batch = [sum(a.tenant == "batch" for a in win) for seed in range(10)
             for win in windows(generate_arrivals(task, seed), task)]
    assert np.mean(batch) == pytest.approx(expected, rel=0.12)
    assert len({t.name for t in task.tenants}) >= 3
    assert sum(t.priority == 0 for t in task.tenants) == 1
    assert max(t.prompt_tokens[0] for t in task.tenants) >= 2048  # long prompts in the mix


def test_high_load_regime_is_the_regime_the_arrivals_came_from():
    bursty, spiky = TASKS["bursty_workload"], TASKS["adversarial_multitenant"]
    lo, hi = bursty.workload["rates_rps"]
    high_counts, low_counts = [], []
    for seed in range(6):
        regime = high_load_regime(bursty, seed)
        assert regime.shape == (bursty.horizon,) and ((regime >= 0) & (regime <= 1 + 1e-9)).all()
        assert np.array_equal(regime, high_load_regime(bursty, seed))  # deterministic
        counts = [len(w) for w in windows(generate_arrivals(bursty, seed), bursty)]
        high_counts += [n for n, r in zip(counts, regime, strict=True) if r == 1.0]
        low_counts += [n for n, r in zip(counts, regime, strict=True) if r == 0.0]
        # A spike window holds spike_factor x the batch tenant's base rate.
        flags = high_load_regime(spiky, seed)
        assert set(np.unique(flags)) <= {0.0, 1.0}
    assert np.mean(high_counts) == pytest.approx(hi * bursty.window_s, rel=0.1)
    assert np.mean(low_counts) == pytest.approx(lo * bursty.window_s, rel=0.1)
    w = spiky.workload
    base = w["rate_rps"] * spiky.tenant("batch").share * spiky.window_s
    in_spike, out_spike = [], []
    for seed in range(10):
        flags = high_load_regime(spiky, seed)
        for f, win in zip(flags, windows(generate_arrivals(spiky, seed), spiky), strict=True):
            (in_spike if f else out_spike).append(sum(a.tenant == "batch" for a in win))
    assert np.mean(in_spike) == pytest.approx(base * w["spike_factor"], rel=0.2)
    assert np.mean(out_spike) == pytest.approx(base, rel=0.2)
    assert not high_load_regime(TASKS["static_workload"], 0).any()


def test_resolve_task_knows_builtins_and_rejects_the_rest():
    for task_id in TASKS:
        assert resolve_task(task_id) is get_task(task_id)
    with pytest.raises(UnknownTaskError) as err:
        resolve_task("nope")
    assert "static_workload" in str(err.value)
    with pytest.raises(UnknownTaskError):
        resolve_task("trace:")


@pytest.mark.parametrize("task", list(TASKS.values()), ids=list(TASKS))
def test_task_descriptions_state_rates_slos_and_horizon(task):
    d = task.describe()
    assert d["horizon"] == task.horizon and d["workload"]["kind"] in {"poisson", "mmpp", "spiky", "trace", "cycle", "multiturn"}
    assert abs(sum(t["share"] for t in d["tenants"]) - 1.0) < 1e-9
    for t in task.tenants:
        assert f"{t.ttft_slo_ms:g}" in task.description or f"{t.ttft_slo_ms / 1000:g} s" in task.description
    assert str(task.horizon) in task.description
