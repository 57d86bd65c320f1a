"""Residual control over the tuned heuristic: a learned policy that follows or nudges it.

A residual PPO agent (`python tools/train.py --advice true --init follow`) does not start from nothing,
nor from a lossy imitation: every window the tuned heuristic (agents/heuristic.py) proposes an
action, the agent sees that proposal beside the observation, and for each knob it either follows
the proposal (choice 0) or nudges it. (The weights shipped in weights/ were trained without it;
the README's "PPO against the rivals" gives what the residual agent found.)

| knob                   | choices (0 = follow)                                       |
|------------------------|------------------------------------------------------------|
| `batch_cap`            | follow, halve, double (kept in 1..512)                     |
| `kv_budget_fraction`   | follow, -0.15, +0.15 (kept in 0.1..1.0)                    |
| `speculation_depth`    | follow, off, +1, +2 (kept in 0..8)                         |
| `quantization_tier`    | follow, FP16, INT8, INT4                                   |
| `prefill_decode_split` | follow, off, on                                            |
| `priority_routing`     | follow, off, on                                            |

so `ADVICE_NVEC = (3, 3, 4, 4, 3, 3)`. A policy that always follows is the heuristic exactly, so
learning starts at the best hand-made policy and only has to find where a nudge pays; nudges
are small, so exploring them costs little. The heuristic keeps its own state from the
observations alone, whatever the agent played.

Features: the heuristic's proposal on the same scales as the previous-action features
(`ADVICE_FEATURE_NAMES`), appended to `agents.encoding`'s observation features.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from llmserve_env.agents.encoding import (
    OBS_DIM,
    SINGLE,
    ObservationEncoder,
    Replicas,
    action_features,
    action_nvec,
    decode_action,
    encode_action,
    feature_names,
)
from llmserve_env.agents.heuristic import HeuristicPolicy, heuristic
from llmserve_env.shared.models import (
    BATCH_CAP_RANGE,
    KV_BUDGET_RANGE,
    QUANTIZATION_TIERS,
    SPECULATION_RANGE,
    ServeAction,
    ServeObservation,
)
from llmserve_env.shared.tasks import is_cluster_range

ADVICE_NVEC: tuple[int, ...] = (3, 3, 4, 4, 3, 3)
FOLLOW: tuple[int, ...] = (0, 0, 0, 0, 0, 0)  # per knob, the index that means "follow the heuristic"
KV_NUDGE = 0.15
ADVICE_FEATURE_NAMES: tuple[str, ...] = (
    "advice_batch_cap",
    "advice_kv_budget_fraction",
    "advice_speculation_depth",
    "advice_quant_int8",
    "advice_quant_int4",
    "advice_prefill_decode_split",
    "advice_priority_routing",
)
ADVICE_DIM = len(ADVICE_FEATURE_NAMES)


def advice_features(a: ServeAction) -> np.ndarray:
    return np.asarray(action_features(a), dtype=np.float32)


def decode_advised(idx: Sequence[int] | np.ndarray, advice: ServeAction) -> ServeAction:
    """The action an ADVICE_NVEC index vector stands for, given the heuristic's proposal."""
    b, k, g, q, split, prio = (int(i) for i in idx)
    a = advice
    batch = a.batch_cap if b == 0 else a.batch_cap // 2 if b == 1 else a.batch_cap * 2
    kv = a.kv_budget_fraction + (0.0, -KV_NUDGE, KV_NUDGE)[k]
    spec = (a.speculation_depth, 0, a.speculation_depth + 1, a.speculation_depth + 2)[g]
    return ServeAction(
        batch_cap=min(max(batch, BATCH_CAP_RANGE[0]), BATCH_CAP_RANGE[1]),
        kv_budget_fraction=round(min(max(kv, KV_BUDGET_RANGE[0]), KV_BUDGET_RANGE[1]), 4),
        speculation_depth=min(max(spec, SPECULATION_RANGE[0]), SPECULATION_RANGE[1]),
        quantization_tier=a.quantization_tier if q == 0 else QUANTIZATION_TIERS[q - 1],
        prefill_decode_split=a.prefill_decode_split if split == 0 else split == 2,
        priority_routing=a.priority_routing if prio == 0 else prio == 2,
    )


class Advisor:
    """The task's tuned heuristic, run beside a learned policy for its proposals."""

    def __init__(self, task_id: str):
        self.policy: HeuristicPolicy = heuristic(task_id)
        self.proposal: ServeAction | None = None

    def reset(self) -> None:
        self.policy.reset()
        self.proposal = None

    def observe(self, obs: ServeObservation) -> np.ndarray:
        """Let the heuristic see the window just served; its proposal's features for the next one."""
        self.proposal = self.policy.act(obs)
        return advice_features(self.proposal)

    def decode(self, idx: Sequence[int] | np.ndarray) -> ServeAction:
        if self.proposal is None:
            raise RuntimeError("observe() an observation before decoding an advised action")
        return decode_advised(idx, self.proposal)


class AdviceOnClusterError(ValueError):
    """The heuristic's advice has no `replicas` proposal: residual control is for single-server tasks."""


def view_shape(advice: bool, replicas: Replicas = SINGLE) -> tuple[tuple[int, ...], int]:
    """(action grid, feature count) of a learned policy with or without the heuristic's advice, on a
    task with this replica range (cluster tasks add the `replicas` head and the cluster features)."""
    if advice and is_cluster_range(replicas):
        raise AdviceOnClusterError("advice (the heuristic's proposal) is for single-server tasks: the heuristic "
                                   "proposes no replica count")
    if advice:
        return ADVICE_NVEC, OBS_DIM + ADVICE_DIM
    return action_nvec(replicas), len(feature_names(replicas))


class FeatureView:
    """What a learned policy sees and how its choices become actions, in one place for the
    Gymnasium wrapper (training) and PPOPolicy (serving): the observation encoder, plus the
    heuristic's proposal when trained with advice. `decode` also records the action, so the next
    features carry it as the previous action."""

    def __init__(self, task_id: str, horizon: int, advice: bool, replicas: Replicas = SINGLE):
        self.replicas = replicas
        self.nvec, self.dim = view_shape(advice, replicas)
        self.encoder = ObservationEncoder(horizon, replicas)
        self.advisor = Advisor(task_id) if advice else None

    def reset(self) -> None:
        self.encoder.reset()
        if self.advisor is not None:
            self.advisor.reset()

    def features(self, obs: ServeObservation) -> np.ndarray:
        x = self.encoder.encode(obs)
        return x if self.advisor is None else np.concatenate([x, self.advisor.observe(obs)])

    def encode(self, action: ServeAction) -> np.ndarray:
        """The plain grid's indices nearest `action` (a teacher's, for behaviour cloning; not with advice),
        the replica step taken from the count asked for so far."""
        if self.advisor is not None:
            raise ValueError("with advice the action indices are follow-or-nudge choices, not the plain grid")
        return encode_action(action, self.replicas, self.encoder.current_replicas)

    def decode(self, idx: Sequence[int] | np.ndarray) -> ServeAction:
        if self.advisor is not None:
            action = self.advisor.decode(idx)
        else:
            action = decode_action(idx, self.replicas, self.encoder.current_replicas)
        self.encoder.record_action(action)
        return action
