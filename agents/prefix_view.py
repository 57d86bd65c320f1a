"""The Gym view of a prefix-caching task (issue 32): the cluster view plus the routing knob and the cache.

On a task whose requests carry prefix ids (`TaskSpec.caches_prefixes`: the registered
`mooncake_cluster` and `multiturn_cluster`, or a `trace:...?prefix_block_tokens=N` replay) the learned
policy's action gains one last index, `ServeAction.cache_affinity` from `AFFINITY_LEVELS`, and its
features gain `PREFIX_FEATURE_NAMES`: the window's prefix hit rate and the affinity it last asked for.
Every other task keeps its view exactly (its spaces and the shipped weights' behaviour do not move),
which is why this wraps a view (agents/views.py picks it: the default or the family one) instead of
changing agents/encoding.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from llmserve_env.agents.advice import FeatureView
from llmserve_env.agents.encoding import ObservationEncoder, feature_names, nearest_index
from llmserve_env.agents.family_features import FamilyView
from llmserve_env.shared.models import ServeAction, ServeObservation
from llmserve_env.shared.tasks import TaskSpec

# cache_affinity levels an action index picks: 0 is least outstanding work, 1 follows the cache alone;
# 3/7 (llm-d's default weights) and 0.5 (Dynamo's, agents/routing.py) fall on or between the levels.
AFFINITY_LEVELS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
PREFIX_FEATURE_NAMES: tuple[str, ...] = ("prefix_hit_rate", "prev_cache_affinity")
# what a weights JSON trained with the affinity head says (`ActorWeights.check` and PPOPolicy read it)
AFFINITY_META_KEY = "cache_affinity_levels"


def uses_prefix_view(task: TaskSpec) -> bool:
    """A cluster task whose requests carry prefix ids (one replica has no routing to weigh)."""
    return task.caches_prefixes and task.is_cluster


def with_prefix(shape: tuple[tuple[int, ...], int]) -> tuple[tuple[int, ...], int]:
    """(action grid, feature count) of a view with the affinity head and the prefix features appended."""
    nvec, dim = shape
    return (*nvec, len(AFFINITY_LEVELS)), dim + len(PREFIX_FEATURE_NAMES)


def has_affinity_head(meta: Mapping[str, Any]) -> bool:
    return AFFINITY_META_KEY in meta


class PrefixFeatureView:
    """A view (the default `FeatureView` or the family view) with the cache_affinity head and the prefix
    features appended (same interface)."""

    def __init__(self, base: FeatureView | FamilyView):
        self.base = base
        self.nvec = (*base.nvec, len(AFFINITY_LEVELS))
        self.dim = base.dim + len(PREFIX_FEATURE_NAMES)
        self.affinity = 0.0  # before the first action: the reset observation's "previous" affinity

    @property
    def encoder(self) -> ObservationEncoder:
        """The wrapped view's encoder (train.py reads its replica count to encode a teacher's action)."""
        return self.base.encoder

    def reset(self) -> None:
        self.base.reset()
        self.affinity = 0.0

    def features(self, obs: ServeObservation) -> np.ndarray:
        # absent (None) only on a window whose observation left the field out: read as no hit
        hit = getattr(obs, "prefix_hit_rate", None) or 0.0
        extra = np.array([hit, self.affinity], dtype=np.float32)
        return np.concatenate([self.base.features(obs), extra]).astype(np.float32)

    def encode(self, action: ServeAction) -> np.ndarray:
        """The wrapped view's indices plus the level nearest the action's cache_affinity (None: least work,
        as the router does without one). llm-d's 3/7 falls nearest 0.5."""
        level = nearest_index(AFFINITY_LEVELS, action.cache_affinity if action.cache_affinity is not None else 0.0)
        return np.concatenate([self.base.encode(action), [level]]).astype(np.int64)

    def meta(self) -> dict[str, Any]:
        """What the weights' JSON records of this view: the wrapped view's, the affinity levels and every
        feature's name."""
        base = self.base.meta() if isinstance(self.base, FamilyView) else {}
        names = base.get("feature_names") or list(feature_names(self.base.replicas))
        return {**base, AFFINITY_META_KEY: list(AFFINITY_LEVELS), "feature_names": [*names, *PREFIX_FEATURE_NAMES]}

    def decode(self, idx: Sequence[int] | np.ndarray) -> ServeAction:
        if len(idx) != len(self.nvec):
            raise ValueError(f"expected {len(self.nvec)} action indices (the last one cache_affinity), got {len(idx)}")
        level = int(idx[-1])
        if not 0 <= level < len(AFFINITY_LEVELS):
            raise ValueError(f"cache_affinity index must be in 0..{len(AFFINITY_LEVELS) - 1}, got {level}")
        self.affinity = AFFINITY_LEVELS[level]
        return self.base.decode(idx[:-1]).model_copy(update={"cache_affinity": self.affinity})
