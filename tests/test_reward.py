"""Reward: bounded, goodput-driven, each penalty term pulls the way its docstring says."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest
from llmserve_env.core import reward as reward_mod
from llmserve_env.core.metrics import TenantStats, WindowMetrics
from llmserve_env.core.reward import WEIGHTS, compute_reward
from llmserve_env.shared.tasks import TASKS

TASK = TASKS["static_workload"]


def metrics(**kw) -> WindowMetrics:
    base = dict(
        window_s=1.0, arrivals=20, arrival_rate_rps=20.0, mean_prompt_tokens=256.0, finished=20, slo_met=20,
        slo_missed=0, backlog_missed=0, slo_attainment=1.0, goodput_rps=20.0, goodput_tokens_per_s=2560.0,
        p50_ttft_ms=40.0, p99_ttft_ms=90.0, p50_ttft_dispatch_ms=30.0, p50_itl_ms=9.0, p99_itl_ms=15.0,
        p50_tpot_ms=9.0, p50_e2e_ms=1200.0, output_tokens=2560, prompt_tokens=5120, throughput_tps=2560.0,
        queue_depth=0, active_requests=25, kv_occupancy=0.3, gpu_memory_used_gb=30.0, evictions=0,
        spec_acceptance_rate=0.0, cost_usd=0.5 * TASK.cost_budget_per_1k * 2.56, cost_per_1k_tokens=0.5 * TASK.cost_budget_per_1k,
        quality=1.0, per_tenant={"chat": TenantStats(20, 20, 0)},
    )
    base.update(kw)
    return WindowMetrics(**base)


def test_perfect_window_earns_one_and_names_every_term():
    r, terms = compute_reward(metrics(), TASK)
    assert r == 1.0
    assert set(terms) == set(WEIGHTS) == {"goodput", "miss", "memory", "evict", "cost", "quality"}
    assert terms["goodput"] == 1.0 and all(terms[k] == 0.0 for k in terms if k != "goodput")


@pytest.mark.parametrize(
    ("change", "term"),
    [
        ({"slo_met": 10, "slo_missed": 10}, "miss"),
        ({"kv_occupancy": 0.97}, "memory"),
        ({"evictions": 5}, "evict"),
        ({"cost_per_1k_tokens": 1.5 * TASK.cost_budget_per_1k}, "cost"),
        ({"quality": 0.97}, "quality"),
    ],
)
def test_each_penalty_lowers_the_reward(change, term):
    r0, _ = compute_reward(metrics(), TASK)
    r1, terms = compute_reward(metrics(**change), TASK)
    assert terms[term] > 0.0
    assert r1 < r0


def test_goodput_normalised_by_the_windows_demand():
    half, _ = compute_reward(metrics(slo_met=10, slo_missed=0), TASK)
    assert half == pytest.approx(0.5)  # 10 of 20 arrivals met, the rest still in flight
    burst, _ = compute_reward(metrics(arrivals=60, slo_met=60), TASK)
    assert burst == 1.0  # a burst fully served weighs like a lull fully served
    catch_up, terms = compute_reward(metrics(arrivals=5, slo_met=30), TASK)
    assert catch_up == 1.0 and terms["goodput"] == 1.0  # draining carry-over cannot exceed 1
    idle, _ = compute_reward(metrics(arrivals=0, slo_met=0, output_tokens=0, cost_per_1k_tokens=0.0), TASK)
    assert idle == 0.0


def test_backlog_is_not_free():
    clean, _ = compute_reward(metrics(), TASK)
    backlog, terms = compute_reward(metrics(slo_met=5, slo_missed=40, backlog_missed=35), TASK)
    assert terms["miss"] == pytest.approx(40 / 45) and backlog < 0 < clean


def test_bounded_for_any_metrics():
    rnd = random.Random(0)
    for _ in range(2000):
        arrivals = rnd.randint(0, 500)
        m = metrics(arrivals=arrivals, slo_met=rnd.randint(0, 600), slo_missed=rnd.randint(0, 600),
                    kv_occupancy=rnd.random(), evictions=rnd.randint(0, 10_000), quality=rnd.uniform(0.0, 1.0),
                    cost_per_1k_tokens=rnd.uniform(0, 1.0))
        r, terms = compute_reward(m, TASK)
        assert -1.0 <= r <= 1.0
        assert all(0.0 <= v <= 1.0 for v in terms.values())


def test_no_budget_means_no_cost_term():
    free = replace(TASK, cost_budget_per_1k=0.0)
    _, terms = compute_reward(metrics(cost_per_1k_tokens=5.0), free)
    assert terms["cost"] == 0.0


def test_docstring_formula_matches_the_weights():
    doc = reward_mod.__doc__ or ""
    line = next(x for x in doc.splitlines() if x.strip().startswith("window  = clip("))
    found = {name: -float(w) for w, name in re.findall(r"- ([0-9.]+) (\w+)", line)}
    found["goodput"] = 1.0
    assert found == WEIGHTS


@pytest.mark.parametrize("task_id", list(TASKS))
def test_step_rewards_sum_to_the_grade(task_id):
    """The step reward decomposes the grade: any policy's summed reward is its score (issue 13 item 6)."""
    from llmserve_env.agents.registry import make_policy
    from llmserve_env.agents.rollout import play_episode
    from llmserve_env.core.inprocess import InProcessEnv

    for name in ("random", "heuristic"):
        result = play_episode(InProcessEnv(), make_policy(name, task_id, seed=1), task_id, 7)
        assert result.total_reward == pytest.approx(result.score, abs=1e-9)


def test_reward_terms_report_the_window_score_and_the_grade_so_far():
    from llmserve_env.core.inprocess import InProcessEnv

    env = InProcessEnv()
    env.reset("bursty_workload", 2)
    action = {"batch_cap": 64, "kv_budget_fraction": 0.9, "speculation_depth": 0, "quantization_tier": "FP16",
              "prefill_decode_split": False, "priority_routing": False}
    from llmserve_env.shared.models import ServeAction

    total = 0.0
    for _ in range(5):
        obs = env.step(ServeAction(**action))
        total += obs.reward
        terms = obs.metadata["reward_terms"]
        assert set(WEIGHTS) < set(terms) and -1.0 <= terms["window"] <= 1.0
        assert terms["grade_so_far"] == pytest.approx(total, abs=1e-12)


def test_references_so_far_follow_each_tenants_arrivals():
    """The grade so far is judged on the requests arrived so far: a tenant's references scale with its
    own arrivals, and a tenant that has not arrived yet is left out (not a worst tenant at 0)."""
    from llmserve_env.core.grader import References, Totals, objective, references_so_far

    task = TASKS["multitenant_autoscale"]
    names = [t.name for t in task.tenants]
    ref = References(arrivals=300, feasible=300, floor_met=100, upper_met=280,
                     arrivals_by_tenant={names[0]: 200, names[1]: 100},
                     floor_met_by_tenant={names[0]: 80, names[1]: 20},
                     upper_met_by_tenant={names[0]: 190, names[1]: 90})
    cut = references_so_far(ref, {names[0]: 50})
    assert cut.arrivals == 50 and cut.arrivals_by_tenant == {names[0]: 50, names[1]: 0}
    assert cut.floor_met_by_tenant[names[0]] == pytest.approx(20.0)
    assert cut.upper_met_by_tenant[names[0]] == pytest.approx(47.5)
    assert cut.upper_met == pytest.approx(280 * 50 / 300)
    tot = Totals(met=45, output_tokens=1000, quality_tokens=1000.0, cost_usd=0.0)
    score, terms, _, _ = objective(task, tot, {names[0]: 45, names[1]: 0}, cut)
    # the absent tenant is not the worst: the worst is the arrived one, (45 - 20) / (47.5 - 20)
    assert score > 0.5 and terms["worst_tenant"] == pytest.approx(25 / 27.5)


def test_night_windows_of_a_cluster_task_reward_the_replica_count():
    """Issue 14: with references scaled by windows elapsed, multitenant_autoscale's quiet first windows
    (and its batch tenant, absent until 03:00) held the grade so far at 0, so every replica count earned
    exactly 0 there. Scaled by arrivals, the night windows price the replicas: fewer earn more while
    the SLOs hold, and the rewards still sum to the grade."""
    from llmserve_env.core.inprocess import InProcessEnv
    from llmserve_env.shared.models import ServeAction

    knobs = {"batch_cap": 256, "kv_budget_fraction": 1.0, "speculation_depth": 2, "quantization_tier": "FP16",
             "prefill_decode_split": False, "priority_routing": False}
    night = {}
    for replicas in (2, 5):
        env = InProcessEnv()
        env.reset("multitenant_autoscale", 1)
        rewards = [env.step(ServeAction(**knobs, replicas=replicas)).reward for _ in range(48)]
        night[replicas] = sum(rewards[:5])
        assert all(r != 0.0 for r in rewards[:5])
        assert sum(rewards) == pytest.approx(env.grade()["score"], abs=1e-9)
    assert night[2] > night[5] > 0.0
