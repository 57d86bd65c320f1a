"""The numeric view of the environment that learned policies use, with numpy alone.

One definition shared by the Gymnasium wrapper (training) and the PPO policy (serving), so a
trained network sees at serve time exactly the features it was trained on.

Action grid (a `MultiDiscrete` vector of indices, one per knob):

| index | knob                   | choices                                  |
|-------|------------------------|------------------------------------------|
| 0     | `batch_cap`            | 1, 2, 4, ..., 512 (log scale, 10 values) |
| 1     | `kv_budget_fraction`   | 0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0     |
| 2     | `speculation_depth`    | 0, 1, 2, 3, 4, 6, 8                      |
| 3     | `quantization_tier`    | FP16, INT8, INT4                         |
| 4     | `prefill_decode_split` | off, on                                  |
| 5     | `priority_routing`     | off, on                                  |
| 6     | `replicas`             | one fewer, keep, one more (cluster tasks only) |

The `replicas` head exists on cluster tasks only (`TaskSpec.is_cluster`): on the single-server tasks
the grid is exactly the six knobs above, so weights trained before the cluster tasks keep their
shapes and their behaviour. It moves the replicas asked for (`metadata.cluster.target`) by at most
one a window, kept in the task's range, rather than naming a count: a sampled count (PPO explores
by sampling every head every window) would start and drain replicas at random, each start billed
for a cold start (87 s, 9 windows) before it serves, and no episode would stay near a sound policy;
a step is explored as a small random walk. One step a window crosses 1 -> 8 replicas in 7 windows,
faster than one replica starts.

Observation features: fixed transforms (log scales for heavy-tailed counts and latencies,
ratios for fractions) that put every feature roughly in [0, 1] and clip to [0, OBS_HIGH]; the
previous window's arrival rate and queue (so a policy sees the trend, not just the level); the
previous action; and the episode's progress. No running statistics live here: train.py's
running normalisation is stored beside the weights. On cluster tasks `CLUSTER_FEATURE_NAMES`
follow: the cluster state of `metadata["cluster"]` (replicas asked for, ready, starting,
draining, as fractions of the task's maximum; how soon the next starting replica is ready, as a
fraction of the cold start) and the next window's time of day on the daily cycle (sine and
cosine, shifted into [0, 1]), so a policy can see a ramp coming and a cold start in progress.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from llmserve_env.shared.models import QUANTIZATION_TIERS, ServeAction, ServeObservation
from llmserve_env.shared.tasks import is_cluster_range

BATCH_CAPS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
KV_FRACTIONS: tuple[float, ...] = (0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0)
SPEC_DEPTHS: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8)
ACTION_NVEC: tuple[int, ...] = (len(BATCH_CAPS), len(KV_FRACTIONS), len(SPEC_DEPTHS), len(QUANTIZATION_TIERS), 2, 2)
REPLICA_STEPS: tuple[int, ...] = (-1, 0, 1)  # the cluster tasks' `replicas` head: change of the count asked for

OBS_HIGH = 4.0


def _log_scale(x: float, top: float) -> float:
    """log1p(x) / log1p(top): 0 at 0, 1 at `top`, slowly above."""
    return math.log1p(max(x, 0.0)) / math.log1p(top)


Replicas = tuple[int, int]  # a task's (min, max) replica range
SINGLE: Replicas = (1, 1)


def action_nvec(replicas: Replicas = SINGLE) -> tuple[int, ...]:
    """The action grid: the six knobs, plus the replica step (REPLICA_STEPS) on a cluster task."""
    return ACTION_NVEC + ((len(REPLICA_STEPS),) if is_cluster_range(replicas) else ())


def decode_action(idx: Sequence[int] | np.ndarray, replicas: Replicas = SINGLE,
                  current: int | None = None) -> ServeAction:
    """The `ServeAction` a MultiDiscrete index vector stands for (on `action_nvec(replicas)`); on a
    cluster task `current` is the replica count asked for so far (`metadata.cluster.target`)."""
    if len(idx) != len(action_nvec(replicas)):
        raise ValueError(f"expected {len(action_nvec(replicas))} action indices for replicas {replicas}, "
                         f"got {len(idx)}")
    b, k, s, q, split, prio = (int(i) for i in idx[:6])
    knobs: dict[str, Any] = {
        "batch_cap": BATCH_CAPS[b], "kv_budget_fraction": KV_FRACTIONS[k], "speculation_depth": SPEC_DEPTHS[s],
        "quantization_tier": QUANTIZATION_TIERS[q], "prefill_decode_split": bool(split), "priority_routing": bool(prio),
    }
    if is_cluster_range(replicas):
        if current is None:
            raise ValueError("current: a cluster task's replica step needs the replica count asked for so far")
        # validated once with its replica count (a copy with the count added was half of this call's ~13 us)
        knobs["replicas"] = min(max(current + REPLICA_STEPS[int(idx[6])], replicas[0]), replicas[1])
    return ServeAction(**knobs)


def nearest_index(choices: Sequence[float], value: float, log: bool = False) -> int:
    """The index of the choice nearest `value` (the first on a tie; on a log scale with `log`)."""
    if log:
        return min(range(len(choices)), key=lambda i: abs(math.log(choices[i]) - math.log(value)))
    return min(range(len(choices)), key=lambda i: abs(choices[i] - value))


def encode_action(action: ServeAction, replicas: Replicas = SINGLE, current: int | None = None) -> np.ndarray:
    """The grid point nearest to `action` (exact for actions on the grid). On a cluster task the
    replica step is the one towards `action.replicas` from `current`, the count asked for so far
    (keep when `replicas` is unset)."""
    extra: list[int] = []
    if is_cluster_range(replicas):
        if current is None:
            raise ValueError("current: a cluster task's replica step needs the replica count asked for so far")
        n = action.replicas if action.replicas is not None else current
        extra = [REPLICA_STEPS.index(int(np.sign(n - current)))]
    return np.array(
        [
            nearest_index(BATCH_CAPS, action.batch_cap, log=True),
            nearest_index(KV_FRACTIONS, action.kv_budget_fraction),
            nearest_index(SPEC_DEPTHS, action.speculation_depth),
            QUANTIZATION_TIERS.index(action.quantization_tier),
            int(action.prefill_decode_split),
            int(action.priority_routing),
            *extra,
        ],
        dtype=np.int64,
    )


def action_features(a: ServeAction) -> list[float]:
    """An action's seven features, roughly in [0, 1]: batch cap (log2 / 9), KV budget, speculation
    depth / 8, INT8, INT4, split, priority routing (the previous action's and advice's features)."""
    return [
        math.log2(a.batch_cap) / 9.0,
        a.kv_budget_fraction,
        a.speculation_depth / 8.0,
        float(a.quantization_tier == "INT8"),
        float(a.quantization_tier == "INT4"),
        float(a.prefill_decode_split),
        float(a.priority_routing),
    ]


NO_ACTION: tuple[float, ...] = (0.0,) * 7  # before the first action of an episode

FEATURE_NAMES: tuple[str, ...] = (
    "queue_depth",
    "active_requests",
    "kv_cache_occupancy",
    "mean_prompt_length",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_itl_ms",
    "throughput_tps",
    "slo_compliance_rate",
    "gpu_memory_used_gb",
    "estimated_cost_per_1k",
    "request_arrival_rate",
    "spec_acceptance_rate",
    "eviction_events",
    "reward",
    "progress",
    "prev_request_arrival_rate",
    "prev_queue_depth",
    "prev_batch_cap",
    "prev_kv_budget_fraction",
    "prev_speculation_depth",
    "prev_quant_int8",
    "prev_quant_int4",
    "prev_prefill_decode_split",
    "prev_priority_routing",
)
OBS_DIM = len(FEATURE_NAMES)
CLUSTER_FEATURE_NAMES: tuple[str, ...] = (
    "replicas_target",
    "replicas_ready",
    "replicas_starting",
    "replicas_draining",
    "next_ready_in",
    "time_of_day_sin",
    "time_of_day_cos",
)


def feature_names(replicas: Replicas = SINGLE) -> tuple[str, ...]:
    """The feature vector's names: FEATURE_NAMES, plus CLUSTER_FEATURE_NAMES on a cluster task."""
    return FEATURE_NAMES + (CLUSTER_FEATURE_NAMES if is_cluster_range(replicas) else ())


def cluster_features(obs: ServeObservation, replicas: Replicas) -> list[float]:
    """The cluster state and time of day of a cluster task's observation (metadata["cluster"])."""
    c = (obs.metadata or {}).get("cluster") or {}
    top = float(replicas[1])
    ready_in = c.get("starting_ready_in_s") or []
    cold = float(c.get("cold_start_s") or 0.0)
    # 0 when nothing is starting; else the soonest start's remaining share of the cold start.
    next_ready = min(ready_in) / cold if ready_in and cold > 0 else 0.0
    cycle = int(c.get("cycle_windows") or 0)
    phase = 2.0 * math.pi * int(c.get("window_in_cycle", 0)) / cycle if cycle else 0.0
    return [
        float(c.get("target", 0)) / top,
        float(c.get("ready", 0)) / top,
        float(c.get("starting", 0)) / top,
        float(c.get("draining", 0)) / top,
        next_ready,
        0.5 * (math.sin(phase) + 1.0),
        0.5 * (math.cos(phase) + 1.0),
    ]


class ObservationEncoder:
    """Turns each `ServeObservation` into a float32 feature vector of length OBS_DIM (plus the
    cluster features on a cluster task: `feature_names(replicas)`).

    Stateful over one episode: it remembers the previous window's arrival rate and queue and
    the action last played. Call `reset()` at the start of an episode and `record_action()`
    after choosing each action.
    """

    def __init__(self, horizon: int, replicas: Replicas = SINGLE):
        self.horizon = max(int(horizon), 1)
        self.replicas = replicas
        self.reset()

    def reset(self) -> None:
        self._prev_rate = 0.0
        self._prev_queue = 0.0
        self._prev_action: ServeAction | None = None
        self.current_replicas: int | None = None  # metadata.cluster.target of the last observation

    def current(self, obs: ServeObservation) -> int:
        """The replica count asked for so far on a cluster task (the target the last window ran to)."""
        c = (obs.metadata or {}).get("cluster") or {}
        return int(c.get("target", self.replicas[0]))

    def record_action(self, action: ServeAction) -> None:
        self._prev_action = action

    def encode(self, obs: ServeObservation) -> np.ndarray:
        a = self._prev_action
        reward = float(obs.reward) if obs.reward is not None else 0.0
        feats = [
            _log_scale(obs.queue_depth, 1000.0),
            _log_scale(obs.active_requests, 512.0),
            obs.kv_cache_occupancy,
            _log_scale(obs.mean_prompt_length, 8192.0),
            _log_scale(obs.p50_ttft_ms, 60_000.0),
            _log_scale(obs.p99_ttft_ms, 60_000.0),
            _log_scale(obs.p50_itl_ms, 1000.0),
            _log_scale(obs.throughput_tps, 50_000.0),
            obs.slo_compliance_rate,
            _log_scale(obs.gpu_memory_used_gb, 160.0),
            _log_scale(obs.estimated_cost_per_1k * 1000.0, 100.0),
            _log_scale(obs.request_arrival_rate, 200.0),
            obs.spec_acceptance_rate,
            _log_scale(obs.eviction_events, 1000.0),
            # Rewards are bounded; shift so the feature stays non-negative for the Box.
            0.5 * (reward + 1.0),
            obs.step_index / self.horizon,
            _log_scale(self._prev_rate, 200.0),
            _log_scale(self._prev_queue, 1000.0),
            *(action_features(a) if a is not None else NO_ACTION),
        ]
        if is_cluster_range(self.replicas):
            feats += cluster_features(obs, self.replicas)
            self.current_replicas = self.current(obs)
        self._prev_rate = obs.request_arrival_rate
        self._prev_queue = float(obs.queue_depth)
        return np.clip(np.asarray(feats, dtype=np.float32), 0.0, OBS_HIGH)
