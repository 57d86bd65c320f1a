"""The model-predictive planner: deterministic, runs on every task, refuses what it cannot mirror."""

from __future__ import annotations

import pytest
from llmserve_env.agents.planner import PlannerError, PlannerPolicy, default_horizon, neighbours
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.runtime.inprocess import InProcessEnv
from llmserve_env.shared.tasks import TASKS, get_task
from llmserve_env.shared.traces import packaged_trace_path

SHORT_TRACE = f"trace:{packaged_trace_path('azure_conv_2023.csv')}?speedup=6&horizon=6"
SMALL = {"horizon": 2, "samples": 2, "pool": 3}


def test_deterministic_for_a_seed_and_labelled() -> None:
    env = InProcessEnv()
    runs = [play_episode(env, PlannerPolicy(SHORT_TRACE, "sampled", seed=3, **SMALL), SHORT_TRACE, 0,
                         keep_actions=True) for _ in range(2)]
    assert runs[0].actions == runs[1].actions and runs[0].score == runs[1].score
    assert runs[0].policy == "planner"
    bound = PlannerPolicy(SHORT_TRACE, "clairvoyant", **SMALL)
    assert bound.name == "clairvoyant_bound" and bound.samples == 1
    assert play_episode(env, bound, SHORT_TRACE, 0).steps == 6


@pytest.mark.parametrize("task_id", list(TASKS))
def test_plans_on_every_task(task_id: str) -> None:
    """A few decisions on each registered task (new tasks included, cluster tasks too), sampled and
    clairvoyant."""
    for mode in ("planner", "clairvoyant"):
        env = InProcessEnv()
        policy = make_policy(mode, task_id, **SMALL)
        policy.reset()
        obs = env.reset(task_id, 1_000_000)
        for _ in range(3):
            obs = env.step(policy.act(obs))
        assert policy.stats.decisions == 3 and policy.stats.simulated_windows > 3


def test_candidates_are_the_proposal_its_neighbours_and_the_spread() -> None:
    policy = PlannerPolicy("adversarial_multitenant")
    proposal = policy.rollout.act(InProcessEnv().reset("adversarial_multitenant", 0))
    cands = policy._candidates(proposal)
    assert cands[0] == proposal and len(cands) == len({c.model_dump_json() for c in cands})
    for n in neighbours(proposal, True):
        diff = [k for k, v in n.knobs().items() if proposal.knobs()[k] != v]
        assert len(diff) == 1 and n in cands


def test_refuses_an_episode_it_does_not_mirror() -> None:
    env = InProcessEnv()
    policy = PlannerPolicy("bursty_workload", **SMALL)
    policy.reset()
    obs = env.reset("bursty_workload", 5)
    env.step(policy.act(obs))
    other = make_policy("vllm_default", "bursty_workload")
    obs = env.step(other.act(obs))  # the environment moved without the planner
    with pytest.raises(PlannerError, match="diverged"):
        policy.act(obs)
    fresh = PlannerPolicy("bursty_workload", **SMALL)
    with pytest.raises(PlannerError, match="task"):
        fresh.act(InProcessEnv().reset("static_workload", 0))


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(ValueError, match="mode"):
        PlannerPolicy("bursty_workload", mode="oracle")
    with pytest.raises(ValueError, match="horizon"):
        PlannerPolicy("bursty_workload", horizon=0)


def test_cluster_candidates_scale_replicas_and_include_the_rivals() -> None:
    """On a cluster task the candidates hold the current replica count, +-1 and +-3 within the range, and
    the production rivals' proposals; the default lookahead outlasts a replica's cold start."""
    task = "diurnal_autoscale"
    policy = make_policy("planner", task)
    policy.reset()
    obs = InProcessEnv().reset(task, 1_000_000)
    policy._sync(obs)
    proposal = policy.rollout.act(obs)
    rival_actions = [r.act(obs) for r in policy.rivals]
    assert [r.name for r in policy.rivals] == ["hpa", "dynamo_planner", "tuned_static"]
    target = policy.shadow.backend.target
    proposal = proposal.model_copy(update={"replicas": target})
    cands = policy._candidates(proposal, rival_actions)
    lo, hi = get_task(task).replicas
    counts = {c.replicas for c in cands}
    assert all(c.replicas is not None and lo <= c.replicas <= hi for c in cands)
    assert {m for m in (target - 3, target - 1, target, target + 1, target + 3) if lo <= m <= hi} <= counts
    assert all(a in cands for a in rival_actions)
    cold_windows = policy.shadow.backend.cold_start_s / get_task(task).window_s
    assert policy.horizon > cold_windows
    # single-server tasks: no replica field in any candidate, no rivals
    single = PlannerPolicy("bursty_workload")
    single.reset()
    assert single.rivals == [] and single.horizon == 8
    assert all(c.replicas is None for c in single._candidates(
        single.rollout.act(InProcessEnv().reset("bursty_workload", 0))))


def test_planner_episode_on_a_cluster_task_scales() -> None:
    """A cluster episode played by the planner commits replica counts and forks the cluster each window."""
    task = "multitenant_autoscale"
    env = InProcessEnv()
    policy = make_policy("planner", task, horizon=3, samples=1, pool=2)
    policy.reset()
    obs = env.reset(task, 1_000_000)
    actions = []
    for _ in range(4):
        a = policy.act(obs)
        actions.append(a)
        obs = env.step(a)
    assert all(a.replicas is not None for a in actions)
    assert policy.stats.simulated_windows >= 4 * 3


def test_cluster_lookahead_sees_the_peak_and_scales_ahead_of_the_ramp() -> None:
    """diurnal_autoscale at its trough (window 0, 2 replicas ready): held for the rest of the day, 2 replicas
    drown at the 14:00 peak, so a lookahead to the episode's end scales up now (a replica needs 8.7 windows
    to start). The 12-window lookahead it replaces ended before the ramp and held 2 (issue 14's diagnosis)."""
    task = "diurnal_autoscale"
    assert default_horizon(get_task(task)) == get_task(task).horizon
    policy = PlannerPolicy(task, "clairvoyant", neighbourhood=False, spread=False, rivals=(), replica_deltas=(2,),
                           schedule_offsets=())
    policy.reset()
    action = policy.act(InProcessEnv().reset(task, 1_000_002))
    cands, scores = policy.last_decision
    assert [c.replicas for c in cands] == [2, 4]
    assert action.replicas == 4
    assert scores[cands.index(action)] > scores[0] + 0.1  # holding 2 for the day is far worse


def test_two_step_schedules_let_the_scale_up_wait_for_the_ramp() -> None:
    """The same decision with two-step schedules: "2 now, 4 from 6 windows ahead" scores above "4 now" (the
    trough does not need the peak's replicas for the 8.7-window cold start it would pay for all morning),
    so the planner keeps 2 and re-decides next window. Every schedule changes to the best held count."""
    task = "diurnal_autoscale"
    policy = PlannerPolicy(task, "clairvoyant", neighbourhood=False, spread=False, rivals=(), replica_deltas=(2,),
                           schedule_offsets=(3, 6, 12))
    policy.reset()
    action = policy.act(InProcessEnv().reset(task, 1_000_002))
    _, scores = policy.last_decision
    assert {later for _, _, later in policy.last_schedules} == {4}
    assert {(now, j) for now, j, _ in policy.last_schedules} == {(c, j) for c in (1, 2, 3) for j in (3, 6, 12)}
    assert policy.last_schedules[(2, 6, 4)] > scores[1] + policy.margin  # waiting beats scaling now
    assert action.replicas == 2 and policy.stats.scheduled == 1
    with pytest.raises(ValueError, match="schedule_offsets"):
        PlannerPolicy(task, schedule_offsets=(0,))
