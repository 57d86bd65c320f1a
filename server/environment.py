"""LLMServeEnvironment: the OpenEnv `Environment` an agent plays.

Action space: `ServeAction` (shared/models.py). Observation space: `ServeObservation`.
Reward: `core.reward.GradeReward`, per window: the grade's decomposition (an episode's rewards
sum to its grade). Start: `reset(task_id, seed)` fixes
the task's whole arrival stream from (task, seed) and an empty server. Episode end: `done` after
the task's horizon of windows; arrivals stop there and the engine drains under the last action
(bounded, its cost charged), the last window's metrics and reward holding what the drain settled.

Where the episode lives: an instance holds the episode it reset (WebSocket sessions, in-process
use). Over stateless HTTP, OpenEnv builds a fresh instance per call, so `step`/`state` take the
`episode_id` that `reset` returned and find the episode in the shared `EpisodeStore`.

Where a step runs: OpenEnv runs a plain `step` in a thread pool. The server uses
`InlineStepEnvironment` in sim mode, whose `step_async` runs the simulator on the event loop
instead (see its docstring for why); real mode keeps OpenEnv's thread pool.
"""

from __future__ import annotations

import inspect
from typing import Any

from llmserve_env.core.episode import Episode, check_episode_id
from llmserve_env.core.errors import (
    EnvError,
    EpisodeNotDoneError,
    EpisodeRequiredError,
    SimOnlyOptionError,
    UnknownProfileRequestError,
    UnknownSplitError,
)
from llmserve_env.core.grader import GradeResult
from llmserve_env.core.verify import grade_own
from llmserve_env.server.config import ServerSettings
from llmserve_env.server.episodes import EpisodeStore
from llmserve_env.shared.models import ServeAction, ServeObservation, ServeState
from llmserve_env.shared.tasks import TASKS, TaskSpec
from llmserve_env.shared.workloads import resolve_task
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

DEFAULT_TASK = "static_workload"
SEED_LIMIT = 2**63  # seeds are 0 <= seed < 2**63 (what an episode log and numpy's SeedSequence hold)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}... ({len(text)} characters)"
TASK_SPLIT = "test"
DESCRIPTION = (
    "Set an LLM inference server's policy each window (batch cap, KV budget, speculation depth, "
    "quantization, prefill/decode split, priority routing) while traffic changes; rewarded for "
    "goodput within latency SLOs under memory, cost and quality limits."
)


class LLMServeEnvironment(Environment[ServeAction, ServeObservation, ServeState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, store: EpisodeStore | None = None, config: ServerSettings | None = None):
        super().__init__()
        self.config = config or ServerSettings.from_env()
        self.store = store if store is not None else EpisodeStore(self.config.max_episodes,
                                                                   self.config.idle_timeout_s)
        self._episode: Episode | None = None

    # -- OpenEnv API ---------------------------------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str = DEFAULT_TASK,
              profile: str | None = None, caps: dict[str, Any] | None = None, **kwargs: Any) -> ServeObservation:
        if kwargs:
            raise EnvError(f"unknown reset argument(s): {', '.join(sorted(kwargs))}; "
                           f"allowed: task_id, seed, episode_id, profile, caps")
        sim_profile, sim_caps = self._sim_options(profile, caps)
        if isinstance(seed, float) and seed.is_integer() and abs(seed) < 2**64:
            seed = int(seed)  # a whole float is the integer on the wire (server/bodies.py, issue 30)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT):
            raise EnvError(f"seed must be an integer with 0 <= seed < 2**63, got {_short(seed)}")
        if not isinstance(task_id, str):
            raise EnvError(f"task_id must be a string, got {_short(task_id)}")
        if episode_id is not None:
            # Checked before any work: a malformed id is a 422, a taken one a 409 (never a takeover).
            self.store.check_free(check_episode_id(episode_id))
        task_id = self.config.trace_task_id(task_id)
        task = resolve_task(task_id)
        ep = Episode.start(task, 0 if seed is None else seed, self.config.mode, episode_id, profile=sim_profile,
                           caps=sim_caps)
        try:
            # atomic check: two resets racing for one new id get one 409; a named id gets a tombstone
            self.store.put(ep, named=episode_id is not None)
        except EnvError:
            ep.close()
            raise
        if self._episode is not None:
            self._episode.close()
        self._episode = ep
        assert ep.last_observation is not None
        return ep.last_observation

    def _sim_options(self, profile: Any, caps: Any) -> tuple[Any, Any]:
        """`profile`: an id only (a folder of LLMSERVE_PROFILE_PATH or the user folder holds fitted ones;
        a client never names a file). `caps`: real mode's request caps, applied by the simulator."""
        if (profile is not None or caps is not None) and self.config.mode != "sim":
            raise SimOnlyOptionError("profile and caps are sim-mode options; this server runs in real mode")
        loaded = None
        if profile is not None:
            from llmserve_env.sim.profiles import (
                InvalidProfileError,
                UnknownProfileError,
                list_profiles,
                load_profile,
            )

            if not isinstance(profile, str) or "/" in profile or "\\" in profile or profile.endswith(".json"):
                raise UnknownProfileRequestError(
                    f"profile must be a profile id (one of {', '.join(list_profiles())}), got {profile!r}")
            try:
                loaded = load_profile(profile)
            except (UnknownProfileError, InvalidProfileError) as exc:
                raise UnknownProfileRequestError(str(exc)) from None
        parsed = None
        if caps is not None:
            from llmserve_env.sim.caps import CapsError, RequestCaps

            if not isinstance(caps, dict):
                raise EnvError(f"caps must be an object of max_requests_per_step, max_prompt_tokens, "
                               f"max_completion_tokens, got {caps!r}")
            try:
                parsed = RequestCaps.from_dict(caps)
            except CapsError as exc:
                raise EnvError(str(exc)) from None
        return loaded, parsed

    def step(self, action: ServeAction, timeout_s: float | None = None, episode_id: str | None = None,
             request_id: str | None = None, **kwargs: Any) -> ServeObservation:
        # timeout_s and request_id are fields of OpenEnv's StepRequest: accepted, not used (a
        # simulated window takes milliseconds; the gateway has its own step timeout).
        if kwargs:
            raise EnvError(f"unknown step argument(s): {', '.join(sorted(kwargs))}; "
                           f"allowed: action, episode_id, timeout_s, request_id")
        return self._resolve(episode_id, "POST /step").step(action)

    @property
    def state(self) -> ServeState:
        return self.state_of(None)

    def state_of(self, episode_id: str | None) -> ServeState:
        ep = self._resolve(episode_id, "GET /state")
        return ServeState(
            episode_id=ep.episode_id,
            step_count=ep.step_count,
            task_id=ep.task.task_id,
            seed=ep.seed,
            mode=ep.mode,
            profile=ep.task.profile,
            horizon=ep.task.horizon,
            window_s=ep.task.window_s,
            done=ep.done,
            cumulative_reward=ep.cumulative_reward,
            action_history=[s.action for s in ep.steps],
            last_observation=ep.last_observation.model_dump() if ep.last_observation else None,
        )

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="LLMServeEnv",
            description=DESCRIPTION,
            version="0.2.0",
            author="LLMServeEnv",
            documentation_url="/docs",
        )

    def close(self) -> None:
        # The stateless HTTP handlers close their throwaway instance after every call: the episode
        # lives on in the store, so only drop the reference here.
        self._episode = None

    # -- OpenEnv's task API (GET /{env_name}/splits, POST /{env_name}/tasks ...) -----------------
    # Discovery only: every task is in the one split "test"; pass a task's task_id to reset().
    def list_splits(self) -> list[dict[str, str]]:
        return [{"name": TASK_SPLIT, "type": "test"}]

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [t.describe() for t in self._split(split)]

    def num_tasks(self, split: str) -> int:
        return len(self._split(split))

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        tasks = self._split(split)
        if not 0 <= index < len(tasks):
            raise IndexError(index)  # OpenEnv answers 400 "Invalid task index"
        return tasks[index].describe()

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        return [t.describe() for t in self._split(split)[start:stop]]

    @staticmethod
    def _split(split: str) -> list[TaskSpec]:
        if split != TASK_SPLIT:
            raise UnknownSplitError(split, TASK_SPLIT)
        return list(TASKS.values())

    # -- beyond OpenEnv ------------------------------------------------------------------------
    @property
    def episode(self) -> Episode:
        return self._resolve(None, "this call")

    def fork(self, episode_id: str) -> ServeState:
        """POST /fork: a new episode continuing from `episode_id`'s current state (sim mode only),
        registered in the store like any episode (its count limit and idle timeout apply)."""
        clone = self._resolve(episode_id, "POST /fork").fork()
        self.store.put(clone)
        return self.state_of(clone.episode_id)

    def grade(self, episode_id: str | None = None) -> GradeResult:
        ep = self._resolve(episode_id, "POST /grader")
        if not ep.done or ep.failed is not None:
            raise EpisodeNotDoneError(ep.episode_id, ep.step_count, ep.task.horizon)
        return grade_own(ep)

    def _resolve(self, episode_id: str | None, route: str) -> Episode:
        if episode_id:
            if self._episode is not None and self._episode.episode_id == episode_id:
                return self._episode
            return self.store.get(episode_id)
        if self._episode is None:
            raise EpisodeRequiredError(route)
        return self._episode


class InlineStepEnvironment(LLMServeEnvironment):
    """Sim mode on the server: `step` runs inline on the event loop, not in OpenEnv's thread pool.

    A simulator step is ~1-2 ms of pure Python holding the GIL, so a worker thread buys no
    parallelism; the hand-off (submit, wake the worker, wake the loop again) cost ~0.16 ms of the
    ~0.4 ms server overhead per HTTP step, and under many clients the threads only fight over the
    GIL. Real mode must not use this: its `run_window` blocks for the window's wall-clock time.
    `reset` stays in the thread pool (generating a task's arrivals takes several ms).
    """

    async def step_async(self, action: ServeAction, timeout_s: float | None = None,
                         episode_id: str | None = None, **kwargs: Any) -> ServeObservation:
        return self.step(action, timeout_s, episode_id, **kwargs)


# OpenEnv calls inspect.signature(env.step_async) on every HTTP step to filter the request's extra
# fields; a precomputed signature makes that a lookup (~30 us less per step, measured).
InlineStepEnvironment.step_async.__signature__ = inspect.signature(  # type: ignore[attr-defined]
    InlineStepEnvironment.step_async)
