"""Which view a learned policy has of a task: one choice for the Gym wrapper, the trainer and PPOPolicy.

- `default`: agents/advice.py's FeatureView (the observation encoder, the heuristic's advice on request);
  on a prefix-caching cluster task wrapped by agents/prefix_view.py (the cache_affinity head and the hit
  rate);
- `family`: agents/family_features.py's FamilyView (scenario families: history features, a replica count
  head).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmserve_env.agents.advice import FeatureView, view_shape
from llmserve_env.agents.family_features import FamilyView, family_shape, is_family_encoding
from llmserve_env.agents.prefix_view import (
    PrefixFeatureView,
    is_prefix_encoding,
    prefix_shape,
    uses_prefix_view,
)
from llmserve_env.shared.tasks import TaskSpec

ENCODINGS = ("default", "family")
View = FeatureView | PrefixFeatureView | FamilyView


def make_view(task: TaskSpec, advice: bool = False, encoding: str = "default") -> View:
    if encoding == "family":
        if advice:
            raise ValueError("advice is for the default encoding's single-server tasks, not encoding='family'")
        return FamilyView(task)
    if encoding != "default":
        raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    base = FeatureView(task.task_id, task.horizon, advice, task.replicas)
    return PrefixFeatureView(base) if uses_prefix_view(task) and not advice else base


def view_dims(task: TaskSpec, advice: bool = False, encoding: str = "default") -> tuple[tuple[int, ...], int]:
    """(action grid, feature count) of `make_view(task, advice, encoding)`, without building it."""
    if encoding == "family":
        return family_shape([t.name for t in task.tenants], task.replicas)
    if uses_prefix_view(task) and not advice:
        return prefix_shape(task.replicas)
    return view_shape(advice, task.replicas)


def view_meta(view: View) -> dict[str, Any]:
    """What a weights JSON records of the view it was trained on ({} for the default view)."""
    return view.meta() if isinstance(view, FamilyView | PrefixFeatureView) else {}


def encoding_of(meta: Mapping[str, Any]) -> str:
    """The view a weights JSON was trained on: family, prefix or default."""
    if is_family_encoding(meta):
        return "family"
    return "prefix" if is_prefix_encoding(meta) else "default"
