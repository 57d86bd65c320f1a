"""A Gymnasium view of LLMServeEnv, for RL libraries (registered as "LLMServe-v0" on import).

    import gymnasium
    import llmserve_env.gym_env  # registers LLMServe-v0
    env = gymnasium.make("LLMServe-v0", task="bursty_workload")

It steps the simulator in process through `core.inprocess.InProcessEnv` (the same episode,
workload, metrics, reward and grader as the HTTP server, without the HTTP).

Action space: `MultiDiscrete([10, 7, 7, 3, 2, 2])`, one index per knob: batch cap on a log
scale (1, 2, 4, ..., 512), KV budget fraction (0.1 .. 1.0, 7 levels), speculation depth
(0, 1, 2, 3, 4, 6, 8), quantization tier (FP16, INT8, INT4), prefill/decode split, priority
routing. On cluster tasks (`diurnal_autoscale`, `multitenant_autoscale`, a `trace:PATH?replicas=N`
replay) a seventh index moves the replicas asked for by one (one fewer, keep, one more; kept in
the task's range): `MultiDiscrete([10, 7, 7, 3, 2, 2, 3])`; the single-server tasks keep exactly
the six. See `agents/encoding.py` for the grid and why a step, not a count.

Observation space: `Box(0, 4, (25,), float32)`: the observation's numeric fields on fixed log or
ratio scales (roughly 0..1), the previous window's arrival rate and queue, the previous action,
and the episode's progress (`agents.encoding.FEATURE_NAMES` names each). Cluster tasks add 7:
the replicas asked for, ready, starting and draining, the next start's remaining cold start, and the
time of day (`agents.encoding.CLUSTER_FEATURE_NAMES`), so `Box(0, 4, (32,), float32)` there.

Prefix-caching cluster tasks (`mooncake_cluster`, `multiturn_cluster`, a
`trace:...?prefix_block_tokens=N&replicas=M` replay; issue 32) add one last action index, `cache_affinity` from `agents.prefix_view.AFFINITY_LEVELS`
(0, 0.25, 0.5, 0.75, 1), and two features, the window's prefix hit rate and the affinity last asked
for (`agents.prefix_view.PREFIX_FEATURE_NAMES`): `MultiDiscrete([10, 7, 7, 3, 2, 2, 3, 5])` and
`Box(0, 4, (34,), float32)` on a cluster replay.

With `encoding="family"` (`train.py --encoding family`, issue 28) the view is
agents/family_features.py's: arrival-rate history per tenant, announced jobs, starting replicas' times
to ready, the second harmonic of the time of day, and a replica COUNT head (`MultiDiscrete([10, 7, 7,
3, 2, 2, hi - lo + 1])`) in place of the step; on a prefix-caching task the affinity head and the two
prefix features are appended to it as well (agents/views.py chooses the view for the wrapper, train.py
and PPOPolicy alike).

With `advice=True` (`train.py --advice true`, the residual agent) the tuned heuristic runs
beside the agent: the observation gains its proposal (`agents.advice.ADVICE_FEATURE_NAMES`,
Box of 32) and the action becomes "follow or nudge the proposal" per knob (`MultiDiscrete([3, 3,
4, 4, 3, 3])`, 0 = follow); see agents/advice.py. Single-server tasks only (the heuristic proposes
no replica count): `advice=True` on a cluster task raises `AdviceOnClusterError` (a ValueError).

Reward: the environment's own step reward (`core.reward`), unchanged: the grade's decomposition,
so an episode's rewards sum to its grade.

Start: each `reset` starts an episode of the task on a fresh episode seed drawn from the
training seeds (0 .. 99,999) by the env's `np_random`, so `reset(seed=s)` is reproducible;
`options={"episode_seed": n}` plays a chosen episode instead (evaluation).

Forking (model-based RL, planning): `env.unwrapped.runtime` is the `InProcessEnv` behind the
wrapper; `runtime.fork()` returns an independent environment continuing from the current state
(bit-identical to the original under the same actions), `runtime.save()` / `runtime.restore(saved)`
snapshot and roll back the episode (core/inprocess.py).

Episode end: after the task's horizon of windows. This is `terminated`, not `truncated`: arrivals
stop at the horizon and the last reward holds the engine's drain under the last action (every
request is judged by its real outcome), and the step index is observed, so nothing lies past the
end to bootstrap from. The wire's `metadata["terminated"]` says the same. `info["score"]` then
holds the grader's score for the episode.
"""

from __future__ import annotations

from typing import Any, cast

import gymnasium
import numpy as np
from gymnasium import spaces
from llmserve_env.agents.encoding import OBS_HIGH
from llmserve_env.agents.seeds import TRAIN_SEED_LIMIT
from llmserve_env.agents.views import View, make_view
from llmserve_env.core.episode import ObservedWindow
from llmserve_env.core.errors import EnvError
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.shared.models import ServeObservation
from llmserve_env.shared.workloads import resolve_task

ENV_ID = "LLMServe-v0"


class LLMServeGymEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """LLMServeEnv as a Gymnasium env (see the module docstring for the spaces)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, task: str = "static_workload", grade_on_done: bool = True, advice: bool = False,
                 encoding: str = "default"):
        self.task = resolve_task(task)
        self.task_id = task
        self.grade_on_done = grade_on_done
        # the default view (a prefix-caching cluster task adds the cache_affinity head and the hit rate;
        # one replica has no routing to weigh; every other task's spaces stay as they were) or the family view
        self.view: View = make_view(self.task, advice, encoding)
        self.action_space = spaces.MultiDiscrete(np.array(self.view.nvec, dtype=np.int64))
        self.observation_space = spaces.Box(0.0, OBS_HIGH, shape=(self.view.dim,), dtype=np.float32)
        self.runtime = InProcessEnv("sim")  # documented: fork / save / restore the episode through it
        self.episode_seed: int | None = None
        # The fast path (`Episode.advance`): each step encodes the window's fields directly, without
        # building the pydantic observation; the advisor proposes from the full observation.
        self.fast = not advice

    @property
    def last_observation(self) -> ServeObservation | None:
        """The raw observation behind the last features (built when read, on the fast path)."""
        try:
            return self.runtime.episode.last_observation
        except EnvError:  # before the first reset
            return None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if options and "episode_seed" in options:
            self.episode_seed = int(options["episode_seed"])
        else:
            self.episode_seed = int(self.np_random.integers(0, TRAIN_SEED_LIMIT))
        obs = self.runtime.reset(seed=self.episode_seed, task_id=self.task_id)
        self.view.reset()
        return self.view.features(obs), {"episode_seed": self.episode_seed}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        act = self.view.decode(action)
        if self.fast:
            out = self.runtime.episode.advance(act)
            # the encoder reads only the fields ObservedWindow holds (tests/test_gym_env.py checks both
            # paths give the same features, rewards and grades)
            features = self.view.features(cast(ServeObservation, ObservedWindow(out, self.task)))
            reward, done = out.reward, out.done
        else:
            obs = self.runtime.step(act)
            features, reward, done = self.view.features(obs), float(obs.reward or 0.0), obs.done
        info: dict[str, Any] = {}
        if done and self.grade_on_done:
            info["score"] = self.runtime.grade_result().score
        return features, float(reward), bool(done), False, info

    def close(self) -> None:
        self.runtime.close()


gymnasium.register(id=ENV_ID, entry_point="llmserve_env.gym_env:LLMServeGymEnv")
