"""The episode's end: the engine drains after the horizon, so sacrificing the last arrivals gains nothing.

Before the drain, requests unsettled at the horizon all counted as misses, and fixed end rules on
top of the tuned heuristic gained: batch cap 1 (FP16) in the last 2 windows +0.023 ± 0.010 on
bursty_workload, the prefill/decode split in the last 4 windows +0.024 ± 0.007 on
adversarial_multitenant (20 held-out seeds, paired; `drain_max_windows=0` reproduces them).
"""

from __future__ import annotations

import pytest
from llmserve_env.agents.registry import make_policy
from llmserve_env.agents.rollout import play_episode
from llmserve_env.agents.seeds import eval_seeds
from llmserve_env.agents.stats import MeanCI, paired_diff_ci
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.core.metrics import DRAIN_MAX_WINDOWS
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import get_task

# task -> (last windows, the knobs the rule sets there): the rules measured in issue 13
END_RULES: dict[str, tuple[int, dict]] = {
    "bursty_workload": (2, {"batch_cap": 1, "quantization_tier": "FP16"}),
    "adversarial_multitenant": (4, {"prefill_decode_split": True}),
    "static_workload": (4, {"prefill_decode_split": True}),
    "azure_conv_trace": (4, {"prefill_decode_split": True}),
}


class EndRule:
    """The tuned heuristic, with `change` applied in the episode's last `last` windows."""

    name = "heuristic+end-rule"

    def __init__(self, task_id: str, last: int, change: dict):
        self.base = make_policy("heuristic", task_id)
        self.start = get_task(task_id).horizon - last
        self.change = change

    def reset(self) -> None:
        self.base.reset()

    def act(self, obs: ServeObservation) -> ServeAction:
        action = self.base.act(obs)
        return action.model_copy(update=self.change) if obs.step_index >= self.start else action


class _Env(InProcessEnv):
    """An in-process env whose episodes drain at most `drain` windows (0: the old, artifact-prone end)."""

    def __init__(self, drain: int):
        super().__init__()
        self.drain = drain

    def reset(self, task_id: str, seed: int) -> ServeObservation:
        obs = super().reset(task_id, seed)
        self.episode.drain_max_windows = self.drain
        return obs


def rule_gain(task_id: str, episodes: int, drain: int = DRAIN_MAX_WINDOWS) -> MeanCI:
    env = _Env(drain)
    last, change = END_RULES[task_id]
    seeds = eval_seeds(episodes)
    base = [play_episode(env, make_policy("heuristic", task_id), task_id, s).score for s in seeds]
    rule = [play_episode(env, EndRule(task_id, last, change), task_id, s).score for s in seeds]
    return paired_diff_ci(rule, base)


def test_the_last_window_drains_and_charges_the_drain() -> None:
    env = InProcessEnv()
    policy = make_policy("vllm_default", "adversarial_multitenant")
    obs = env.reset("adversarial_multitenant", 2)
    while not obs.done:
        obs = env.step(policy.act(obs))
    steps = env.episode.steps
    last = steps[-1].metrics
    assert 0 < last["drain_windows"] <= DRAIN_MAX_WINDOWS
    assert obs.metadata["drain_windows"] == last["drain_windows"]
    assert all(s.metrics["drain_windows"] == 0 for s in steps[:-1])
    # the drain's GPU seconds are priced like any window's
    assert last["cost_usd"] == pytest.approx(steps[0].metrics["cost_usd"] * (1 + last["drain_windows"]))
    assert last["backlog_missed"] == 0  # everything settled by its real outcome within the limit
    assert sum(s.metrics["slo_met"] + s.metrics["slo_missed"] for s in steps) == len(
        [a for w in env.episode.windows for a in w])
    assert 0.0 <= env.grade()["score"] <= 1.0


def test_without_a_drain_the_backlog_at_the_horizon_is_missed() -> None:
    env = _Env(drain=0)
    policy = make_policy("vllm_default", "adversarial_multitenant")
    obs = env.reset("adversarial_multitenant", 2)
    while not obs.done:
        obs = env.step(policy.act(obs))
    last = env.episode.steps[-1].metrics
    assert last["drain_windows"] == 0 and last["backlog_missed"] > 0


@pytest.mark.parametrize("task_id", ["bursty_workload", "adversarial_multitenant"])
def test_end_rules_gain_nothing_ci(task_id: str) -> None:
    """CI's short version (8 held-out seeds) of the 50-seed test below."""
    gain = rule_gain(task_id, 8)
    assert gain.mean - gain.half_width <= 0.0, f"{task_id}: end rule gains {gain}"


@pytest.mark.slow
@pytest.mark.parametrize("task_id", list(END_RULES))
def test_end_rules_gain_nothing(task_id: str) -> None:
    """Paired over 50 held-out seeds, the fixed end rules are not better than the heuristic alone
    (with the drain off, `rule_gain(task, 20, drain=0)`, the first two gain; see the docstring)."""
    gain = rule_gain(task_id, 50)
    assert gain.mean - gain.half_width <= 0.0, f"{task_id}: end rule gains {gain}"
