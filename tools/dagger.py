"""DAgger's data (Ross, Gordon and Bagnell, AISTATS 2011): the student acts, an expert labels the states it visits.

`train.py --init dagger --teacher operator --encoding family` runs the rounds (`train.dagger_clone`):
round 0 the expert plays (behaviour cloning's data); every later round the student of the round before
plays its greedy action on new training seeds while the expert, watching every observation as if it
were acting, labels each state with the action it would take; the labelled states join the data set
and the student is retrained on all of it. The student's mistakes lead it to states the expert's own
episodes never visit; the labels there teach it to recover, where cloning alone drifts.

This module plays those episodes with numpy alone (in train.py's worker processes): no torch here.

The expert: any registry policy (`agents.registry.make_policy`) that decides from the observation it
is shown, whoever acted before. The day-plan rules (`operator`, `schedule`) do: their state (level,
releases, emergency step) is built from the observations alone. The rollout planner (agents/planner.py)
mirrors the episode in its own simulator, so it labels through `decide` (its action, not played) and
then `commit`s the action the episode took (the student's), keeping its mirror on the student's
episode. It is the expert the learning issue names, and the costly one: 4-14 s of CPU a decision at its
defaults on the families (docs/benchmarks.md), where these episodes cost ~0.3 s each, so a round of
1,536 labelled states is hours of CPU on one core.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from llmserve_env.agents.planner import PlannerPolicy
from llmserve_env.agents.ppo_policy import ActorWeights
from llmserve_env.agents.registry import make_policy
from llmserve_env.gym_env import LLMServeGymEnv
from llmserve_env.shared.models import ServeAction
from llmserve_env.tools.train_config import DAGGER_EXPERTS

# the experts that label states they did not choose (see the module docstring): one list, train.py's
EXPERTS = DAGGER_EXPERTS


@dataclass
class Labelled:
    """One episode's labelled states: raw features (before normalisation), the expert's action indices,
    the discounted returns of the rewards as played, the episode's grade, and the share of states where
    the player's action (student or expert) was the expert's whole label."""

    features: np.ndarray
    labels: np.ndarray
    returns: np.ndarray
    score: float
    agreement: float


def discounted_returns(rewards: Sequence[float], gamma: float) -> np.ndarray:
    """Each step's discounted return to the episode's end (float32), what the critic is fitted to."""
    g, out = 0.0, []
    for r in reversed(rewards):
        g = r + gamma * g
        out.append(g)
    return np.asarray(out[::-1], np.float32)


def label_episode(env: LLMServeGymEnv, expert_name: str, seed: int, student: ActorWeights | None,
                  gamma: float, expert_options: Mapping[str, Any] | None = None) -> Labelled:
    """Play episode `seed` of `env`'s task with the student's greedy action (the expert's own where
    `student` is None), the expert labelling every state. `env` must have the family view
    (`LLMServeGymEnv(task, encoding="family", grade_on_done=False)`)."""
    expert = make_policy(expert_name, env.task_id, seed=seed, **(expert_options or {}))
    expert.reset()
    # the planner labels with decide(), then plays in its mirror what the episode took
    planner = expert if isinstance(expert, PlannerPolicy) else None
    x, _ = env.reset(options={"episode_seed": seed})
    view = env.view
    feats, labels, rewards, agree = [], [], [], 0
    while True:
        obs = env.last_observation
        assert obs is not None  # reset set it
        label = view.encode(planner.decide(obs) if planner is not None else expert.act(obs))
        if student is None:
            played = label
        else:
            played = np.asarray([int(np.argmax(h)) for h in student.logits(x.astype(np.float64))], np.int64)
        agree += int(np.array_equal(played, label))
        feats.append(x)
        labels.append(label)
        x, r, terminated, truncated, _ = env.step(played)
        if planner is not None:
            planner.commit(ServeAction.model_validate(env.runtime.episode.steps[-1].action))
        rewards.append(r)
        if terminated or truncated:
            break
    return Labelled(np.stack(feats), np.stack(labels), discounted_returns(rewards, gamma), env.runtime.grade_result().score,
                    agree / len(labels))


def label_episodes(task_id: str, seeds: Sequence[int], expert_name: str,
                   student: tuple[Mapping[str, np.ndarray], dict] | None, gamma: float) -> list[Labelled]:
    """`label_episode` on each seed (a worker's share of a round); `student` as (npz arrays, JSON meta)."""
    if expert_name not in EXPERTS:
        raise ValueError(f"DAgger's expert must label states it did not choose: one of {', '.join(EXPERTS)}, "
                         f"not {expert_name!r}")
    env = LLMServeGymEnv(task_id, grade_on_done=False, encoding="family")
    actor = ActorWeights.from_arrays(*student) if student is not None else None
    try:
        return [label_episode(env, expert_name, int(s), actor, gamma) for s in seeds]
    finally:
        env.close()
