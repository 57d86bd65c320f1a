"""The episode log: what the grader reads, and what `POST /grader` accepts from a client.

Pydantic, because a log crosses the system's edge. Every list and dict is size-limited, so a
log larger than the longest possible episode is rejected by validation before any work is done:
at most MAX_HORIZON steps, and per step at most a few dozen action, metric, tenant and reward
entries, with bounded key lengths.
"""

from __future__ import annotations

from typing import Annotated, Literal

from llmserve_env.shared.tasks import MAX_HORIZON
from pydantic import BaseModel, ConfigDict, Field

MAX_KEYS = 64
MAX_TENANTS = 32

Key = Annotated[str, Field(min_length=1, max_length=64)]
Scalar = float | int | bool | str | None
TenantEntry = dict[Key, float | int]


class StepRecord(BaseModel):
    """One window: the action played, the metrics measured (WindowMetrics.to_dict()), the reward."""

    model_config = ConfigDict(extra="forbid")

    step_index: int = Field(..., ge=0, lt=MAX_HORIZON)
    action: dict[Key, Scalar] = Field(default_factory=dict, max_length=MAX_KEYS)
    metrics: dict[Key, Scalar | Annotated[dict[Key, TenantEntry], Field(max_length=MAX_TENANTS)]] = Field(
        default_factory=dict, max_length=MAX_KEYS
    )
    reward: float = Field(..., allow_inf_nan=False)
    reward_terms: dict[Key, float] = Field(default_factory=dict, max_length=MAX_KEYS)


class EpisodeLog(BaseModel):
    """A whole episode: enough to regenerate its arrivals (task_id, seed) and grade it."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str = Field(..., min_length=1, max_length=255)
    task_id: str = Field(..., min_length=1, max_length=4096)
    seed: int = Field(..., ge=0, le=2**63 - 1)
    mode: Literal["sim", "real"] = "sim"
    profile: str = Field("", max_length=255)
    horizon: int = Field(..., ge=1, le=MAX_HORIZON)
    done: bool
    steps: list[StepRecord] = Field(default_factory=list, max_length=MAX_HORIZON)
