"""`InProcessEnv`: an episode driven directly in this process, with no HTTP and no OpenEnv server.

    env = InProcessEnv()                          # sim mode; InProcessEnv("real") for the gateway
    obs = env.reset("bursty_workload", seed=3)
    while not obs.done:
        obs = env.step(action)
    env.grade()                                   # the grader's result as a dict

It implements the `EpisodeEnv` protocol that `agents.rollout.play_episode` plays, and is what the
Gymnasium wrapper, the trainer, the evaluator, the tuning searches and the benches use.
"""

from __future__ import annotations

from typing import Any

from llmserve_env.runtime.episode import Episode
from llmserve_env.runtime.errors import EnvError, EpisodeNotDoneError
from llmserve_env.shared.grader import GradeResult, grade_episode
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.workloads import resolve_task


class InProcessEnv:
    """One episode at a time, in process (a new `reset` closes the previous episode)."""

    def __init__(self, mode: str = "sim"):
        self.mode = mode
        self._episode: Episode | None = None

    @property
    def episode(self) -> Episode:
        if self._episode is None:
            raise EnvError("no episode: call reset(task_id, seed) first")
        return self._episode

    def reset(self, task_id: str, seed: int, *, profile: Any = None, caps: Any = None) -> ServeObservation:
        """`profile` (id, path or Profile) and `caps` (sim.caps.RequestCaps): sim mode only, to play a
        task on a fitted profile under real mode's caps (see runtime.episode.make_backend)."""
        task = resolve_task(task_id)
        self.close()
        self._episode = Episode.start(task, seed, self.mode, profile=profile, caps=caps)
        assert self._episode.last_observation is not None
        return self._episode.last_observation

    def step(self, action: ServeAction) -> ServeObservation:
        return self.episode.step(action)

    def grade_result(self) -> GradeResult:
        ep = self.episode
        if not ep.done or ep.failed is not None:
            raise EpisodeNotDoneError(ep.episode_id, ep.step_count, ep.task.horizon)
        return grade_episode(ep.episode_log())

    def grade(self) -> dict[str, Any]:
        return self.grade_result().model_dump()

    def close(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None
