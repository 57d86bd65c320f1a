"""Scenario families (shared/scenarios.py, shared/splits.py): deterministic days, disjoint splits,
shifted families outside the training ranges, fixed-day tasks untouched, no future in the observation."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import STEADY_ACTION
from llmserve_env.core.episode import Episode
from llmserve_env.core.verify import grade_log
from llmserve_env.shared import splits
from llmserve_env.shared import tasks as tasks_mod
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.scenarios import announced_jobs, draw_day, replica_disruptions
from llmserve_env.shared.tasks import CLUSTER_TASKS, FAMILY_TASKS, TASKS
from llmserve_env.shared.workloads import generate_arrivals, windows

FAMILIES = list(splits.SHIFTED_TASKS)


def _action(replicas: int | None = None) -> ServeAction:
    return ServeAction.model_validate({**STEADY_ACTION, "replicas": replicas})


def _arrival_tuples(task, seed):
    return [(a.arrival_s, a.prompt_tokens, a.output_tokens, a.tenant) for a in generate_arrivals(task, seed)]


@pytest.mark.parametrize("task_id", list(FAMILY_TASKS))
def test_a_seed_is_one_day_and_seeds_differ(task_id):
    task = TASKS[task_id]
    a, b = draw_day(task, 7), draw_day(dataclasses.replace(task, workload=dict(task.workload)), 7)  # a fresh spec: no cache hit
    assert a is not b and (a.peak_window, a.level, a.jobs) == (b.peak_window, b.level, b.jobs)
    assert all(np.array_equal(a.rates[n], b.rates[n]) for n in a.rates)
    assert _arrival_tuples(task, 7) == _arrival_tuples(task, 7)
    days = [draw_day(task, s) for s in range(20)]
    assert len({round(d.peak_window, 6) for d in days}) == 20 and len({round(d.level, 6) for d in days}) == 20


@pytest.mark.parametrize("task_id", list(FAMILY_TASKS))
def test_drawn_days_stay_in_the_declared_ranges(task_id):
    task = TASKS[task_id]
    fam = task.workload["family"]
    for seed in range(40):
        d = draw_day(task, seed)
        assert fam["peak_window"][0] <= d.peak_window <= fam["peak_window"][1]
        assert fam["level"][0] <= d.level <= fam["level"][1]
        assert fam["peak_to_trough"][0] <= d.peak_to_trough <= fam["peak_to_trough"][1]
        scheduled = fam.get("jobs", [])
        for spec, job in zip(scheduled, d.jobs, strict=False):
            assert spec["start_window"][0] <= job.start_window <= spec["start_window"][1]
            assert spec["rate_rps"][0] <= job.rate_rps <= spec["rate_rps"][1]
        for job in d.jobs[len(scheduled):]:  # the ad-hoc jobs are never announced
            assert job.announced_at is None


def test_the_training_family_is_centred_on_the_published_fixed_day():
    for family, fixed in (("diurnal_family", "diurnal_autoscale"), ("multitenant_family", "multitenant_autoscale")):
        fam, base = TASKS[family].workload["family"], TASKS[fixed].workload
        assert {k: v for k, v in TASKS[family].workload.items() if k != "family"} == base
        assert np.mean(fam["peak_window"]) == base["peak_window"] and np.mean(fam["level"]) == 1.0
        assert np.mean(fam["peak_to_trough"]) == 3.0  # the fixed day's 30 / 10 and 16 / 4 ... 3x at the mean level
        for spec, job in zip(fam.get("jobs", []), base.get("jobs", []), strict=True):
            assert np.mean(spec["start_window"]) == job["start_window"] and np.mean(spec["windows"]) == job["windows"]


def _disjoint(a, b) -> bool:
    return a[1] < b[0] or b[1] < a[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_shifted_families_lie_outside_the_training_ranges(family):
    train = TASKS[family].workload["family"]
    shifted = TASKS[splits.SHIFTED_TASKS[family]].workload["family"]
    assert _disjoint(train["peak_window"], shifted["peak_window"])  # peaks at hours never trained on
    assert shifted["level"][0] > train["level"][1]  # more load than any training day
    for tj, sj in zip(train.get("jobs", []), shifted.get("jobs", []), strict=True):
        assert all(_disjoint(sj["start_window"], other["start_window"]) for other in train["jobs"])
        assert sj["rate_rps"][1] > tj["rate_rps"][1]
    # what it publishes is the training family's nominal day: the shift is not announced
    strip = ({k: v for k, v in TASKS[t].workload.items() if k != "family"} for t in (family, splits.SHIFTED_TASKS[family]))
    assert next(strip) == next(strip)


def test_splits_never_overlap_and_name_every_seed():
    train, val, test = splits.train_seeds(100), splits.validation_seeds(100), splits.test_seeds(100)
    assert max(train) < min(val) and max(val) < min(test)
    assert splits.TRAIN_SEED_LIMIT <= splits.VALIDATION_SEED_BASE and splits.VALIDATION_SEED_LIMIT <= splits.TEST_SEED_BASE
    assert {splits.split_of(s) for s in train} == {"train"} and {splits.split_of(s) for s in test} == {"test"}
    assert {splits.split_of(s) for s in val} == {"validation"}
    with pytest.raises(ValueError, match="no split"):
        splits.split_of(splits.TRAIN_SEED_LIMIT)
    with pytest.raises(ValueError, match="training seeds"):
        splits.train_seeds(1, offset=splits.TRAIN_SEED_LIMIT)
    for family in FAMILIES:
        assert splits.split_task(family, "test") == family and splits.split_task(family, "shifted") in TASKS
    with pytest.raises(ValueError, match="split must be one of"):
        splits.split_task("diurnal_family", "train")


def test_fixed_day_tasks_draw_no_scenario():
    for task_id in ("diurnal_autoscale", "multitenant_autoscale", *tasks_mod.SINGLE_SERVER_TASKS):
        task = TASKS[task_id]
        assert "family" not in task.workload and replica_disruptions(task) is None
        with pytest.raises(ValueError, match="not a scenario family"):
            draw_day(task, 0)
    # the published jobs of a fixed-day task are known until they end, at their place in the cycle
    multi = TASKS["multitenant_autoscale"]
    assert [j["start_window"] for j in announced_jobs(multi, 0, 0)] == [6, 30]
    assert [j["start_window"] for j in announced_jobs(multi, 0, 12)] == [30]
    assert announced_jobs(multi, 0, 34) == []


def test_families_are_cluster_tasks_everywhere_tasks_are_listed():
    assert set(FAMILY_TASKS) <= set(CLUSTER_TASKS) <= set(TASKS)
    for t in FAMILY_TASKS.values():
        d = t.describe()
        assert d["workload"]["family"]["sources"]["preemption_per_replica_hour"].startswith("AWS")
        json.dumps(d)  # /tasks serves it


def test_no_future_in_the_observation():
    """Only the announced jobs, from their announcement window on; nothing of the drawn day otherwise."""
    task = TASKS["multitenant_family"]
    seed = next(s for s in range(splits.TEST_SEED_BASE, splits.TEST_SEED_BASE + 50)
                if any(j.announced_at is None for j in draw_day(task, s).jobs)
                and any(j.announced_at is not None and j.announced_at > 0 for j in draw_day(task, s).jobs))
    day = draw_day(task, seed)
    ep = Episode.start(task, seed, "sim")
    seen = [ep.last_observation.metadata["cluster"]]
    served = ep.windows
    while not ep.done:
        seen.append(ep.step(_action()).metadata["cluster"])
    for k, c in enumerate(seen):
        public = [j.public() for j in day.jobs]
        for job in c["announced_jobs"]:
            i = public.index(job)
            assert day.jobs[i].announced_at is not None and day.jobs[i].announced_at <= k
        assert not (set(c) & {"peak_window", "level", "peak_to_trough", "rates", "jobs", "flash_crowds"})
        if k:  # the rate of the window just served, and only of it
            n = sum(a.tenant == "batch" for a in served[k - 1])
            assert c["arrival_rate_by_tenant"]["batch"] == pytest.approx(n / task.window_s)
    # two days that differ give the same reset observation, announced jobs aside
    other = next(s for s in range(seed + 1, seed + 50) if not draw_day(task, s).announced(0))
    mine = dict(Episode.start(task, seed, "sim").last_observation.metadata["cluster"], announced_jobs=[])
    assert Episode.start(task, other, "sim").last_observation.metadata["cluster"] == mine


def test_preemption_loses_requests_replaces_the_replica_and_forks_exactly(monkeypatch):
    base = TASKS["diurnal_family"]
    fam = {**base.workload["family"], "preemption_per_replica_hour": 0.5}  # a stress rate, for the test only
    task = dataclasses.replace(base, task_id="stress_family", workload={**base.workload, "family": fam})
    monkeypatch.setitem(TASKS, "stress_family", task)
    action = _action(3)
    ep = Episode.start(task, 5, "sim")
    for _ in range(20):
        ep.step(action)
    twin = ep.fork()
    mine = [ep.step(action) for _ in range(28)]
    theirs = [twin.step(action) for _ in range(28)]
    assert [o.reward for o in mine] == [o.reward for o in theirs]
    c = mine[-1].metadata["cluster"]
    assert c["preempted"] > 0 and c["target"] == 3 and c["ready"] + c["starting"] == 3
    g = grade_log(ep.episode_log())
    assert g.verified and g.reference["met"] < g.reference["arrivals"]


def test_cold_start_jitter_is_per_replica_and_deterministic():
    task = TASKS["diurnal_family"]
    action = _action(5)
    ready_in = [Episode.start(task, 3, "sim").step(action).metadata["cluster"]["starting_ready_in_s"] for _ in range(2)]
    assert ready_in[0] == ready_in[1] and len(set(ready_in[0])) == 3
    fixed = Episode.start(TASKS["diurnal_autoscale"], 3, "sim").step(action).metadata["cluster"]
    assert len(set(fixed["starting_ready_in_s"])) == 1 and "preempted" not in fixed


@pytest.mark.parametrize("task_id", ["diurnal_family_shifted", "multitenant_family"])
def test_a_family_episode_grades_and_verifies(task_id):
    task = TASKS[task_id]
    ep = Episode.start(task, splits.TEST_SEED_BASE, "sim")
    assert sum(len(w) for w in ep.windows) == len(generate_arrivals(task, splits.TEST_SEED_BASE))
    while not ep.done:
        ep.step(_action(5))
    g = grade_log(ep.episode_log())
    assert g.verified and 0.0 < g.score <= 1.0
    assert len(windows(generate_arrivals(task, 0), task)) == task.horizon


def test_split_summary_pairs_every_agent_with_the_best_rival():
    from llmserve_env.agents.family_table import families_in, split_job, split_summary
    from llmserve_env.agents.planner import RIVALS_TO_BEAT

    low, high = RIVALS_TO_BEAT[0], RIVALS_TO_BEAT[1]
    scores = {low: [0.1, 0.2, 0.3], high: [0.5, 0.4, 0.6], "ppo": [0.6, 0.5, 0.6], "planner": [0.5, 0.5, 0.5]}
    cells, flat = split_summary("diurnal_family", "shifted", scores)
    assert flat["diurnal_family.shifted.best_rival"] == high
    assert flat["diurnal_family.shifted.learned_minus_best_rival"] == pytest.approx(0.0667, abs=1e-4)
    assert flat["diurnal_family.shifted.planner_minus_best_rival"] == pytest.approx(0.0)
    assert "diurnal_family.shifted.clairvoyant_minus_best_rival" not in flat and len(cells) == len(scores) + 1
    assert families_in(["static_workload", "multitenant_family_shifted", "diurnal_family"]) == [
        "multitenant_family", "diurnal_family"]
    job = split_job("hpa", "diurnal_family", "shifted", 1_000_000)
    assert job.task_id == "diurnal_family_shifted" and job.policy.args == ("hpa", "diurnal_family")


def test_every_agent_plays_the_shifted_split_built_for_its_family():
    from llmserve_env.agents.family_table import split_job

    for agent in ("planner", "clairvoyant", "hpa"):
        job = split_job(agent, "diurnal_family", "shifted", 1_000_000)
        assert job.task_id == "diurnal_family_shifted" and job.policy.args == (agent, "diurnal_family")


def test_a_shifted_task_is_played_with_its_training_familys_tuning():
    """Shifted tasks are test-only (never tuned): every rival plays one with what its training family tuned."""
    from llmserve_env.agents.autoscale import _params
    from llmserve_env.agents.operator import tuned_params
    from llmserve_env.agents.tuned_static import tuned_action
    from llmserve_env.shared.splits import SHIFTED_TASKS, tuned_task

    for family, shifted in SHIFTED_TASKS.items():
        assert tuned_task(shifted) == family and tuned_task(family) == family
        assert tuned_action(shifted) == tuned_action(family)
        assert tuned_params("operator", shifted) == tuned_params("operator", family)
        assert _params("hpa", shifted) == _params("hpa", family) != {}
    assert tuned_task("static_workload") == "static_workload"
