"""The published day (shared/day_shape.py) and the rules that plan by it (agents/operator.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from llmserve_env.agents.autoscale import NotClusterTaskError
from llmserve_env.agents.operator import DayPlanParams, DayPlanPolicy, tuned_params
from llmserve_env.agents.planner import RIVALS_TO_BEAT
from llmserve_env.agents.registry import make_policy
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.day_shape import NotCycleTaskError, expected_rates
from llmserve_env.shared.models import ServeObservation
from llmserve_env.shared.tasks import get_task
from llmserve_env.shared.workloads import generate_arrivals, windows
from llmserve_env.tools.tune_operator import main

DIURNAL, MULTI = get_task("diurnal_autoscale"), get_task("multitenant_autoscale")


def test_expected_rates_are_the_published_day() -> None:
    day = expected_rates(DIURNAL)["chat"]
    assert day.shape == (48,) and int(np.argmax(day)) in (27, 28) and int(np.argmin(day)) in (3, 4)
    assert day.max() == pytest.approx(30.0, abs=0.1) and day.min() == pytest.approx(10.0, abs=0.1)
    multi = expected_rates(MULTI)
    assert set(multi) == {"interactive", "batch"}
    assert list(np.flatnonzero(multi["batch"])) == [*range(6, 12), *range(30, 34)]
    assert set(multi["batch"][multi["batch"] > 0]) == {4.0}
    assert not expected_rates(MULTI, jobs=False)["batch"].any()
    with pytest.raises(NotCycleTaskError, match="kind 'cycle'"):
        expected_rates(get_task("bursty_workload"))
    with pytest.raises(NotCycleTaskError, match="kind 'cycle'"):
        expected_rates(get_task("mooncake_cluster"))  # a trace replay publishes no day


def test_a_multi_turn_day_is_its_conversations_turns() -> None:
    """multiturn_cluster's published day: conversation starts on the cycle, each bringing turns_mean turns
    spread over the think times after it (shared/prefix.expected_turn_rates), against the mean of 12 generated
    days, window by window; a constant start rate gives turns_mean x that rate once the day has filled."""
    from llmserve_env.shared.prefix import MultiTurnSpec, expected_turn_rates

    task = get_task("multiturn_cluster")
    day = expected_rates(task)["chat"]
    counts = np.mean([[len(w) for w in windows(generate_arrivals(task, s), task)] for s in range(12)], axis=0)
    assert counts / task.window_s == pytest.approx(day, rel=0.10)  # 12 days: a window is ~4 % noise
    assert counts.sum() / task.window_s == pytest.approx(day.sum(), rel=0.03)  # ~1 % fewer: max_context cuts
    flat = expected_turn_rates(MultiTurnSpec(conversations_per_s=2.0), 2000.0, 10.0)
    assert flat[-1] == pytest.approx(2.0 * 4.0, rel=2e-3) and flat[0] < 0.5 * flat[-1]


def test_on_the_multi_turn_task_the_day_plan_rules_route_and_scale_with_the_day() -> None:
    """The operator plays multiturn_cluster with the router's cache affinity it was given, asking for more
    replicas at the day's peak than at its trough; a trace replay (no day) is refused."""
    params = DayPlanParams(rps_per_replica=12.0, cache_affinity=0.5, emergency_queue=1e9, alpha=0.0)
    op = DayPlanPolicy(get_task("multiturn_cluster"), params)
    trough, peak = op.act(_obs(0, {"chat": 50.0})), op.act(_obs(18, {"chat": 400.0}))
    assert trough.cache_affinity == peak.cache_affinity == 0.5 and peak.replicas > trough.replicas >= 2
    assert DayPlanPolicy(DIURNAL).act(_obs(0, {"chat": 100.0})).cache_affinity is None  # unset where no cache
    with pytest.raises(NotCycleTaskError):
        DayPlanPolicy(get_task("mooncake_cluster"))


def test_expected_rates_match_the_generated_arrivals_on_average() -> None:
    """The mean day is the mean of the days the task generates (8 seeds, the day's first and peak hours)."""
    counts = np.mean([[len(w) for w in windows(generate_arrivals(MULTI, s), MULTI)] for s in range(8)], axis=0)
    expect = sum(expected_rates(MULTI).values()) * MULTI.window_s
    for k in (0, 6, 28, 31):
        assert counts[k] == pytest.approx(expect[k], rel=0.15)


def _obs(step: int, arrived: dict[str, float], queue: int = 0, ready: int = 2, **cluster) -> ServeObservation:
    per = {t: {"arrived": n, "met": n, "missed": 0, "attainment": 1.0} for t, n in arrived.items()}
    return ServeObservation(step_index=step, queue_depth=queue, task_id="x",
                            metadata={"per_tenant": per, "cluster": {"ready": ready, **cluster}})


def test_operator_asks_one_cold_start_ahead_and_releases_as_the_forecast_falls() -> None:
    p = DayPlanParams(rps_per_replica=6.0, lead=0, release_hold=0, alpha=0.0, emergency_queue=1e9)
    op = DayPlanPolicy(DIURNAL, p)
    need = np.ceil(expected_rates(DIURNAL)["chat"] / 6.0 - 1e-9)
    cold = op.cold
    assert cold == 9  # 87 s at 10 s a window
    for k in (0, 10, 20, 30, 40):
        a = op.act(_obs(k, {"chat": 10 * expected_rates(DIURNAL)["chat"][max(0, k - 1)]}))
        assert a.replicas == int(need[k:k + cold + 1].max())
    assert op.act(_obs(47, {"chat": 100})).replicas == int(need[47])


def test_operator_follows_the_observed_level_and_schedule_does_not() -> None:
    """A day at twice the published rate: the operator's level doubles its replicas, the open loop stays."""
    day = expected_rates(DIURNAL)["chat"]
    op = DayPlanPolicy(DIURNAL, DayPlanParams(alpha=1.0, emergency_queue=1e9))
    sched = DayPlanPolicy(DIURNAL, DayPlanParams(feedback=False))
    for k in range(1, 6):
        seen = {"chat": 2 * day[k - 1] * DIURNAL.window_s}
        a, b = op.act(_obs(k, seen)), sched.act(_obs(k, seen))
    assert op.level["chat"] == pytest.approx(2.0)
    assert a.replicas >= 2 * b.replicas - 1 and b.replicas < a.replicas


def test_emergency_step_on_a_queue_and_knobs_by_the_trade_offs() -> None:
    op = DayPlanPolicy(MULTI, DayPlanParams(alpha=0.0, emergency_queue=8, emergency_hold=1, spec_max_rps=100.0))
    calm = op.act(_obs(1, {"interactive": 40, "batch": 0}))
    assert calm.quantization_tier == "FP16" and calm.batch_cap == 128 and calm.speculation_depth == 2
    assert not calm.priority_routing and not calm.prefill_decode_split
    jammed = op.act(_obs(2, {"interactive": 40, "batch": 0}, queue=100))
    assert jammed.replicas == calm.replicas + 1 and jammed.speculation_depth == 0
    during_job = op.act(_obs(7, {"interactive": 40, "batch": 40}))
    assert during_job.priority_routing  # the batch job (windows 6-11) is expected


def test_announced_jobs_replace_the_published_ones_when_the_task_announces() -> None:
    op = DayPlanPolicy(MULTI, DayPlanParams(alpha=1.0, emergency_queue=1e9, job_prior=False))
    # without the prior: nothing announced, nothing arriving, and the published 03:00 job is not assumed
    assert not op.act(_obs(7, {"interactive": 40, "batch": 0}, announced_jobs=[])).priority_routing
    # a job nobody announced: its observed rate is kept as a level
    assert op.act(_obs(8, {"interactive": 40, "batch": 40}, announced_jobs=[])).priority_routing
    assert op.extra["batch"] == pytest.approx(4.0)
    op2 = DayPlanPolicy(MULTI, DayPlanParams(alpha=0.0, emergency_queue=1e9, job_prior=False))
    late = [{"tenant": "batch", "start_window": 20, "windows": 4, "rate_rps": 8.0}]
    assert op2.act(_obs(20, {"interactive": 40, "batch": 0}, announced_jobs=late)).priority_routing


def test_the_job_prior_keeps_published_jobs_until_an_announcement_takes_them() -> None:
    """With `job_prior` (the default) a published job nobody announced is still expected at its time; an
    announcement takes the nearest published job of its tenant, for good: not back when it leaves the list."""
    quiet = {"interactive": 40, "batch": 0}
    assert DayPlanPolicy(MULTI, DayPlanParams(alpha=0.0)).act(_obs(7, quiet, announced_jobs=[])).priority_routing
    op = DayPlanPolicy(MULTI, DayPlanParams(alpha=0.0))
    moved = [{"tenant": "batch", "start_window": 9, "windows": 6, "rate_rps": 4.0}]  # the 03:00 job (6-11), later
    assert not op.act(_obs(7, quiet, announced_jobs=moved)).priority_routing
    assert op.matched == {("batch", 9): 0}
    assert op.act(_obs(9, quiet, announced_jobs=moved)).priority_routing
    assert not op.act(_obs(15, quiet, announced_jobs=[])).priority_routing  # ended: window 6's job stays taken
    # the 15:00 job (30-33) is still expected, one cold start ahead: more replicas asked than without it
    late = DayPlanPolicy(MULTI, DayPlanParams(alpha=0.0)).act(_obs(22, quiet, announced_jobs=[]))
    none = DayPlanPolicy(MULTI, DayPlanParams(alpha=0.0, job_prior=False)).act(_obs(22, quiet, announced_jobs=[]))
    assert late.replicas > none.replicas
    # an announcement near 15:00 takes that job, not the 03:00 one
    op3 = DayPlanPolicy(MULTI, DayPlanParams(alpha=0.0))
    op3.act(_obs(1, quiet, announced_jobs=[{"tenant": "batch", "start_window": 27, "windows": 4, "rate_rps": 4.0}]))
    assert op3.matched == {("batch", 27): 1}


def test_registered_cluster_only_and_rivals_to_beat() -> None:
    for name in ("operator", "schedule"):
        policy = make_policy(name, "diurnal_autoscale")
        assert policy.name == name and policy.p == tuned_params(name, "diurnal_autoscale")
        with pytest.raises(NotClusterTaskError, match="single-server"):
            make_policy(name, "bursty_workload")
    assert {"operator", "schedule", "hpa", "dynamo_planner", "tuned_static"} == set(RIVALS_TO_BEAT)
    env = InProcessEnv()
    obs = env.reset("multitenant_autoscale", 0)
    policy = make_policy("operator", "multitenant_autoscale")
    policy.reset()
    while not obs.done:
        obs = env.step(policy.act(obs))
    assert 0.0 < env.grade()["score"] <= 1.0


def test_a_stored_entry_without_a_later_axis_keeps_the_behaviour_it_was_tuned_with(tmp_path) -> None:
    # Settings tuned before job_prior existed were played without it; the field's default (on) must not
    # switch it on for them. An entry that names the axis gets its own value.
    params = {"rps_per_replica": 6.5, "lead": 2, "alpha": 0.1, "emergency_queue": 32.0}
    path = tmp_path / "operator_tuned.json"
    path.write_text(json.dumps({"tasks": {"multitenant_family": {"operator": {"params": params}}}}))
    old = tuned_params("operator", "multitenant_family", path)
    assert old.job_prior is False and old.rps_per_replica == 6.5 and old.lead == 2
    path.write_text(json.dumps({"tasks": {"multitenant_family": {"operator": {"params": {**params, "job_prior": True}}}}}))
    assert tuned_params("operator", "multitenant_family", path).job_prior is True
    assert tuned_params("operator", "multitenant_family").job_prior is True  # the shipped file names it
    assert DayPlanParams().job_prior is True  # an untuned rule keeps the field's default


def test_tuner_refuses_a_single_server_task(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--task", "bursty_workload"])
    assert "single-server" in capsys.readouterr().err


def test_the_operator_descent_also_starts_from_the_schedules_tuned_plan(tmp_path) -> None:
    from dataclasses import asdict

    from llmserve_env.agents.operator import grid_for, schedule_start

    grid = grid_for(MULTI)
    names = list(grid)
    base = asdict(DayPlanParams())
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"tasks": {}}))
    assert schedule_start("multitenant_autoscale", grid, names, base, path) is None
    plan = {"rps_per_replica": 7.5, "lead": -2, "release_hold": 2, "low_priority_weight": 0.5, "batch_cap": 256,
            "kv": 1.0, "spec_depth": 0, "spec_max_rps": 3.0, "slack": 0.2}
    path.write_text(json.dumps({"tasks": {"multitenant_autoscale": {"schedule": {"params": plan}}}}))
    start = schedule_start("multitenant_autoscale", grid, names, base, path)
    assert start is not None
    values = {n: grid[n][i] for n, i in zip(names, start, strict=True)}
    assert values == {**{n: base[n] for n in names}, **plan}  # the plan's axes, the feedback axes at defaults
    # the shifted test reads its training family's plan (shared.splits.tuned_task)
    path.write_text(json.dumps({"tasks": {"multitenant_family": {"schedule": {"params": plan}}}}))
    assert schedule_start("multitenant_family_shifted", grid, names, base, path) == start
