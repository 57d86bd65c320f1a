"""Play one episode of a policy against any environment front (in process or over HTTP).

The loop is the same wherever the environment lives, so an evaluation in process and a
baseline run against a deployed server give comparable numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from llmserve_env.agents.base import Policy
from llmserve_env.shared.models import ServeAction, ServeObservation


class EpisodeEnv(Protocol):
    """The three calls an episode needs; `grade()` returns the grader's result as a dict with `score`."""

    def reset(self, task_id: str, seed: int) -> ServeObservation: ...

    def step(self, action: ServeAction) -> ServeObservation: ...

    def grade(self) -> dict[str, Any]: ...


@dataclass
class EpisodeResult:
    task_id: str
    seed: int
    policy: str
    score: float
    total_reward: float
    steps: int
    grade: dict[str, Any] = field(default_factory=dict)
    actions: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "seed": self.seed, "policy": self.policy, "score": self.score,
                "total_reward": self.total_reward, "steps": self.steps}


def play_episode(env: EpisodeEnv, policy: Policy, task_id: str, seed: int, keep_actions: bool = False) -> EpisodeResult:
    """Reset, act until `done`, grade."""
    policy.reset()
    obs = env.reset(task_id=task_id, seed=seed)
    total, steps, actions = 0.0, 0, []
    while not obs.done:
        action = policy.act(obs)
        if keep_actions:
            actions.append(action.knobs())
        obs = env.step(action)
        total += float(obs.reward or 0.0)
        steps += 1
    grade = env.grade()
    return EpisodeResult(task_id=task_id, seed=seed, policy=policy.name, score=float(grade["score"]),
                         total_reward=total, steps=steps, grade=grade, actions=actions)
