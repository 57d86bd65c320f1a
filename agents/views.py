"""Which view a learned policy has of a task: one choice for the Gym wrapper, the trainer and PPOPolicy.

- `default`: agents/advice.py's FeatureView (the observation encoder, the heuristic's advice on request);
- `family`: agents/family_features.py's FamilyView (scenario families: history features, a replica count
  head);

either wrapped, on a prefix-caching cluster task, by agents/prefix_view.py (the cache_affinity head and
the hit rate).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmserve_env.agents.advice import FeatureView, view_shape
from llmserve_env.agents.encoding import Replicas
from llmserve_env.agents.family_features import FamilyView, family_shape, is_family_encoding
from llmserve_env.agents.prefix_view import (
    PrefixFeatureView,
    has_affinity_head,
    uses_prefix_view,
    with_prefix,
)
from llmserve_env.shared.tasks import TaskSpec

ENCODINGS = ("default", "family")
View = FeatureView | PrefixFeatureView | FamilyView


def make_view(task: TaskSpec, advice: bool = False, encoding: str = "default") -> View:
    base: FeatureView | FamilyView
    if encoding == "family":
        if advice:
            raise ValueError("advice is for the default encoding's single-server tasks, not encoding='family'")
        base = FamilyView(task)
    elif encoding == "default":
        base = FeatureView(task.task_id, task.horizon, advice, task.replicas)
    else:
        raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    return PrefixFeatureView(base) if uses_prefix_view(task) else base


def view_dims(task: TaskSpec, advice: bool = False, encoding: str = "default") -> tuple[tuple[int, ...], int]:
    """(action grid, feature count) of `make_view(task, advice, encoding)`: read off the view itself, so the
    choice of view lives in make_view alone."""
    view = make_view(task, advice, encoding)
    return tuple(view.nvec), view.dim


def view_meta(view: View) -> dict[str, Any]:
    """What a weights JSON records of the view it was trained on ({} for the default view)."""
    return view.meta() if isinstance(view, FamilyView | PrefixFeatureView) else {}


def weights_shape(meta: Mapping[str, Any], advice: bool, replicas: Replicas) -> tuple[tuple[int, ...], int]:
    """(action grid, feature count) of weights trained on the view their JSON names."""
    if is_family_encoding(meta):
        shape = family_shape(meta["tenants"], replicas)
    else:
        shape = view_shape(advice, replicas)
    return with_prefix(shape) if has_affinity_head(meta) else shape


def encoding_of(meta: Mapping[str, Any]) -> str:
    """The base view a weights JSON was trained on: family or default."""
    return "family" if is_family_encoding(meta) else "default"
