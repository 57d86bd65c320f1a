"""The model-predictive planner: deterministic, runs on every task, refuses what it cannot mirror."""

from __future__ import annotations

import pytest
from llmserve_env.agents.planner import PlannerError, PlannerPolicy, neighbours
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.runtime.inprocess import InProcessEnv
from llmserve_env.shared.tasks import SINGLE_SERVER_TASKS
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


@pytest.mark.parametrize("task_id", list(SINGLE_SERVER_TASKS))  # cluster episodes cannot fork yet
def test_plans_on_every_task(task_id: str) -> None:
    """A few decisions on each registered task (new tasks included), sampled and clairvoyant."""
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
