"""`InProcessEnv`: an episode driven directly in this process, with no HTTP and no OpenEnv server.

    env = InProcessEnv()                          # sim mode; InProcessEnv("real") for the gateway
    obs = env.reset("bursty_workload", seed=3)
    while not obs.done:
        obs = env.step(action)
    env.grade()                                   # the grader's result as a dict

    branch = env.fork()                           # another InProcessEnv, continuing from this state
    saved = env.save()                            # a snapshot (sim mode) ...
    env.restore(saved)                            # ... to come back to, as often as needed

It implements the `EpisodeEnv` protocol that `agents.rollout.play_episode` plays, and is what the
Gymnasium wrapper, the trainer, the evaluator, the tuning searches and the benches use.
"""

from __future__ import annotations

from typing import Any, Literal

from llmserve_env.core.episode import Episode
from llmserve_env.core.errors import EnvError, EpisodeNotDoneError
from llmserve_env.core.grader import GradeResult
from llmserve_env.core.verify import grade_own
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.workloads import resolve_task


class InProcessEnv:
    """One episode at a time, in process (a new `reset` closes the previous episode)."""

    def __init__(self, mode: Literal["sim", "real"] = "sim"):
        self.mode = mode
        self._episode: Episode | None = None

    @property
    def episode(self) -> Episode:
        if self._episode is None:
            raise EnvError("no episode: call reset(task_id, seed) first")
        return self._episode

    def reset(self, task_id: str, seed: int, *, profile: Any = None, caps: Any = None) -> ServeObservation:
        """`profile` (id, path or Profile) and `caps` (sim.caps.RequestCaps): sim mode only, to play a
        task on a fitted profile under real mode's caps (see core.episode.make_backend)."""
        task = resolve_task(task_id)
        self.close()
        self._episode = Episode.start(task, seed, self.mode, profile=profile, caps=caps)
        assert self._episode.last_observation is not None
        return self._episode.last_observation

    def step(self, action: ServeAction) -> ServeObservation:
        return self.episode.step(action)

    def fork(self) -> InProcessEnv:
        """A new environment holding an independent copy of this one's episode (see `Episode.fork`):
        step either, the other is unchanged; both grade as ordinary episodes. Sim mode only
        (ForkUnsupportedError otherwise)."""
        branch = InProcessEnv(self.mode)
        branch._episode = self.episode.fork()
        return branch

    def save(self) -> Episode:
        """A snapshot of the episode's current state (a fork nobody steps), for `restore`."""
        return self.episode.fork()

    def restore(self, saved: Episode) -> ServeObservation:
        """Continue from `saved` (from `save()`); the snapshot stays intact, so it can be restored
        again. Returns the observation the episode had when saved."""
        if not isinstance(saved, Episode):
            raise EnvError(f"restore() takes what save() returned (an Episode), got {type(saved).__name__}")
        self.close()
        self._episode = saved.fork(episode_id=saved.episode_id)
        assert self._episode.last_observation is not None
        return self._episode.last_observation

    def grade_result(self) -> GradeResult:
        ep = self.episode
        if not ep.done or ep.failed is not None:
            raise EpisodeNotDoneError(ep.episode_id, ep.step_count, ep.task.horizon)
        return grade_own(ep)

    def grade(self) -> dict[str, Any]:
        return self.grade_result().model_dump()

    def close(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None
