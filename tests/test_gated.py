"""The off-family gate between two policies (agents/gated.py): it decides window by window as the planner's
judge does on the same arrivals, serves the chosen policy's own action, and is silent on a family day."""

from __future__ import annotations

import pytest
from llmserve_env.agents.base import Policy
from llmserve_env.agents.forecast import OffFamilyJudge, tenant_counts
from llmserve_env.agents.gated import GatedPolicy
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import get_task
from llmserve_env.shared.workloads import generate_arrivals, windows


class Recording:
    """A policy that remembers the last action it proposed."""

    def __init__(self, inner: Policy):
        self.inner, self.name, self.last = inner, inner.name, None

    def reset(self) -> None:
        self.inner.reset()

    def act(self, obs: ServeObservation) -> ServeAction:
        self.last = self.inner.act(obs)
        return self.last


def test_the_gate_hands_a_shifted_day_to_the_outside_policy_as_the_planners_judge_decides() -> None:
    inside, outside = Recording(make_policy("operator", "diurnal_family")), Recording(make_policy("schedule", "diurnal_family"))
    gated = GatedPolicy("diurnal_family", inside, outside, seed=500_000)
    gated.reset()
    env = InProcessEnv()
    obs = env.reset(task_id="diurnal_family_shifted", seed=500_000)
    chose_outside = []
    while not obs.done:
        before = gated.stats.outside
        action = gated.act(obs)
        chose_outside.append(gated.stats.outside > before)
        assert action == (outside.last if chose_outside[-1] else inside.last)
        obs = env.step(action)
    # the judge on the day's own arrivals, window by window (the planner's count of them)
    shifted = get_task("diurnal_family_shifted")
    day = windows(generate_arrivals(shifted, 500_000), shifted)
    judge = OffFamilyJudge(get_task("diurnal_family"), 500_000)
    assert chose_outside == [judge.outside(tenant_counts(shifted, day[:k])) for k in range(len(chose_outside))]
    assert sum(chose_outside) >= 40 and gated.stats.as_dict()["gate_outside_windows"] == sum(chose_outside)


def test_on_a_family_day_the_gate_is_silent_and_the_episode_is_the_inside_policys() -> None:
    env = InProcessEnv()
    gated = GatedPolicy("diurnal_family", make_policy("operator", "diurnal_family"),
                        make_policy("schedule", "diurnal_family"), seed=500_000)
    with_gate = play_episode(env, gated, "diurnal_family", 500_000)
    alone = play_episode(env, make_policy("operator", "diurnal_family"), "diurnal_family", 500_000)
    assert gated.stats.outside == 0 and gated.stats.inside == with_gate.steps
    assert with_gate.score == alone.score


def test_the_gate_needs_a_scenario_family() -> None:
    with pytest.raises(ValueError, match="needs a scenario family task"):
        GatedPolicy("diurnal_autoscale", make_policy("operator", "diurnal_autoscale"),
                    make_policy("schedule", "diurnal_autoscale"))
