"""The wire contract: the action an agent sends, the observation it gets, the state it can audit.

These are plain pydantic models because they sit at the edge of the system: every field is
validated, and a bad value is rejected with an error naming the field and its allowed values
(HTTP 422), never clamped. They carry OpenEnv's wire fields (`metadata` on the action; `done`,
`reward`, `metadata` on the observation; `episode_id`, `step_count` on the state) with OpenEnv's
model settings, but do not import OpenEnv: the simulator, trainer and agents load in milliseconds,
without OpenEnv's web stack (gradio, fastapi, mcp). The server's OpenEnv subclasses of these
models live in `server/wire.py`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

QuantizationTier = Literal["FP16", "INT8", "INT4"]
QUANTIZATION_TIERS: tuple[QuantizationTier, ...] = ("FP16", "INT8", "INT4")

BATCH_CAP_RANGE = (1, 512)
KV_BUDGET_RANGE = (0.1, 1.0)
SPECULATION_RANGE = (0, 8)
# The most replicas any task may allow (each task declares its own range in TaskSpec.replicas).
MAX_REPLICAS = 64


# OpenEnv's model settings for actions and observations (openenv.core.env_server.types), so the
# wire format and validation are the same whether a model is this one or the server's subclass.
_WIRE_CONFIG = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True)


class ActionBase(BaseModel):
    """The fields every OpenEnv action carries."""

    model_config = _WIRE_CONFIG

    metadata: dict[str, Any] = Field(default_factory=dict, description="Additional metadata for the action")


class ObservationBase(BaseModel):
    """The fields every OpenEnv observation carries, in OpenEnv's order."""

    model_config = _WIRE_CONFIG

    done: bool = Field(default=False, description="Whether the episode has ended (at the task's horizon: arrivals stop, the engine drains, the episode terminates)")
    reward: bool | int | float | None = Field(default=None, description="Reward signal from the last action")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Additional metadata for the observation")


class StateBase(BaseModel):
    """The fields every OpenEnv state carries."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, arbitrary_types_allowed=True)

    episode_id: str | None = Field(default=None, description="Unique identifier for the current episode")
    step_count: int = Field(default=0, ge=0, description="Number of steps taken in the current episode")


class ServeAction(ActionBase):
    """The serving policy applied for the next time window.

    Action space (all six fields are required; nothing is clamped):

    | field                  | type  | range / values        | meaning                                                        |
    |------------------------|-------|-----------------------|----------------------------------------------------------------|
    | `batch_cap`            | int   | 1..512                | most sequences running at once (continuous batching)           |
    | `kv_budget_fraction`   | float | 0.1..1.0              | share of the GPU memory left after weights given to KV blocks   |
    | `speculation_depth`    | int   | 0..8                  | draft tokens proposed per verification step (0 = off)          |
    | `quantization_tier`    | enum  | FP16, INT8, INT4      | weight precision: less memory/faster decode, lower quality     |
    | `prefill_decode_split` | bool  | true/false            | disaggregate prefill and decode onto separate GPU partitions   |
    | `priority_routing`     | bool  | true/false            | admit and protect the priority tenant first                    |

    Optional seventh field, for the cluster tasks:

    | `replicas`             | int   | the task's range      | serving replicas wanted (None = keep the current count)        |

    Optional, for the cluster tasks' router (shared/prefix_routing.py; it matters where requests carry
    prefix ids):

    | `cache_affinity`       | float | 0.0..1.0              | weight of a replica's cached prefix against its load when routing (None = least outstanding work, as before) |

    Every task declares its allowed range (`TaskSpec.replicas`, in `GET /tasks`); the single-server
    tasks allow exactly 1, so `replicas` may be left out (or be 1) there and anything else is answered
    with a 422 naming the range. Left out, the action is the seed's six-field action, bit for bit.

    `metadata` (inherited) is free-form and ignored by the dynamics.
    """

    batch_cap: int = Field(..., ge=1, le=512, strict=True, description="Most running sequences, 1..512")
    kv_budget_fraction: float = Field(
        ..., ge=0.1, le=1.0, strict=True, allow_inf_nan=False, description="KV-cache share of free memory, 0.1..1.0"
    )
    speculation_depth: int = Field(..., ge=0, le=8, strict=True, description="Draft depth, 0..8 (0 = no speculation)")
    quantization_tier: QuantizationTier = Field(..., description="Weight precision: FP16, INT8 or INT4")
    prefill_decode_split: bool = Field(..., strict=True, description="Prefill/decode disaggregation on or off")
    priority_routing: bool = Field(..., strict=True, description="Priority-tenant-first admission on or off")
    replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS, strict=True,
                                 description="Serving replicas wanted, within the task's range (None = unchanged)")
    cache_affinity: float | None = Field(
        None, ge=0.0, le=1.0, strict=True, allow_inf_nan=False, exclude_if=lambda v: v is None,
        description="Cluster routing: weight of a replica's cached prefix against its load, 0..1 "
                    "(None = least outstanding work)")

    def knobs(self) -> dict[str, Any]:
        """The six knobs as a plain dict (no metadata), plus `replicas` and `cache_affinity` when set."""
        exclude = {"metadata"}
        if self.replicas is None:
            exclude.add("replicas")
        if self.cache_affinity is None:
            exclude.add("cache_affinity")
        return self.model_dump(exclude=exclude)


# The six per-replica knobs' names, in the action's field order (`replicas` is not one of them).
KNOBS: tuple[str, ...] = tuple(name for name in ServeAction.model_fields
                               if name not in ("metadata", "replicas", "cache_affinity"))


class ServeObservation(ObservationBase):
    """What the agent sees after a window (or after reset).

    Observation space (window = the `window_s` seconds just served; all values finite, >= 0):

    | field                   | unit      | range      | meaning                                                       |
    |-------------------------|-----------|------------|---------------------------------------------------------------|
    | `queue_depth`           | requests  | 0..inf     | waiting, not yet admitted, at window end                      |
    | `active_requests`       | requests  | 0..512     | running (prefill or decode) at window end                     |
    | `kv_cache_occupancy`    | fraction  | 0..1       | KV blocks in use / KV blocks budgeted, at window end          |
    | `mean_prompt_length`    | tokens    | 0..inf     | mean prompt length of the window's arrivals                   |
    | `p50_ttft_ms`           | ms        | 0..inf     | median time to first token (from arrival) of first tokens in the window |
    | `p99_ttft_ms`           | ms        | 0..inf     | 99th percentile of the same                                    |
    | `p50_itl_ms`            | ms        | 0..inf     | median inter-token latency of the window's output chunks      |
    | `throughput_tps`        | tokens/s  | 0..inf     | output tokens generated in the window / window_s              |
    | `slo_compliance_rate`   | fraction  | 0..1       | requests settled in the window that met every SLO of their tenant (late waiters count as misses) |
    | `gpu_memory_used_gb`    | GB        | 0..inf     | weights + KV blocks in use (+ activations)                    |
    | `estimated_cost_per_1k` | USD       | 0..inf     | GPU (or API) cost of the window per 1,000 output tokens       |
    | `request_arrival_rate`  | req/s     | 0..inf     | arrivals in the window / window_s                             |
    | `spec_acceptance_rate`  | fraction  | 0..1       | accepted draft tokens / proposed (0 when speculation is off)  |
    | `eviction_events`       | count     | 0..inf     | preemptions (KV blocks ran out) in the window                 |
    | `step_index`            | steps     | 0..horizon | windows served so far in this episode                         |
    | `task_id`               | -         | task ids   | the task being played                                         |
    | `episode_id`            | -         | -          | pass it back to `/step`, `/state`, `/grader` over HTTP        |

    Optional, present only on workloads with prefix caching (arrivals carrying prefix ids; absent,
    not null, elsewhere, so every other task's observation is the seed's, key for key):

    | `prefix_hit_rate`       | fraction  | 0..1       | prompt tokens served from the prefix cache / prompt tokens, of the requests first admitted in the window |
    | `prefix_cached_blocks`  | blocks    | 0..inf     | 16-token KV blocks holding cached prefix units at window end (all replicas), shared or evictable |

    `reward` is the step reward (bounded, see `core.reward`), `done` is true once the horizon is
    reached, and `metadata` carries the per-tenant attainment, goodput, the reward's terms, which
    knobs the backend could apply, and the backend's own notes.
    """

    queue_depth: int = Field(0, ge=0)
    active_requests: int = Field(0, ge=0)
    kv_cache_occupancy: float = Field(0.0, ge=0.0, le=1.0)
    mean_prompt_length: float = Field(0.0, ge=0.0)
    p50_ttft_ms: float = Field(0.0, ge=0.0)
    p99_ttft_ms: float = Field(0.0, ge=0.0)
    p50_itl_ms: float = Field(0.0, ge=0.0)
    throughput_tps: float = Field(0.0, ge=0.0)
    slo_compliance_rate: float = Field(1.0, ge=0.0, le=1.0)
    gpu_memory_used_gb: float = Field(0.0, ge=0.0)
    estimated_cost_per_1k: float = Field(0.0, ge=0.0)
    request_arrival_rate: float = Field(0.0, ge=0.0)
    spec_acceptance_rate: float = Field(0.0, ge=0.0, le=1.0)
    eviction_events: int = Field(0, ge=0)
    step_index: int = Field(0, ge=0)
    task_id: str = ""
    episode_id: str = ""
    prefix_hit_rate: float | None = Field(None, ge=0.0, le=1.0, exclude_if=lambda v: v is None,
                                          description="Prefix-cache hit rate (tokens) of the window's first admissions; "
                                                      "only on workloads with prefix caching")
    prefix_cached_blocks: int | None = Field(None, ge=0, exclude_if=lambda v: v is None,
                                             description="KV blocks holding cached prefix units at window end; "
                                                         "only on workloads with prefix caching")


class ServeState(StateBase):
    """Everything needed to audit an episode or replay it bit for bit.

    `episode_id` and `step_count` come from OpenEnv's `State`. An episode is fully determined by
    (`task_id`, `seed`, `mode`, `profile`, `action_history`): replaying the same actions on a fresh
    episode with the same task and seed reproduces every observation in sim mode.
    """

    task_id: str = ""
    seed: int = 0
    mode: Literal["sim", "real"] = "sim"
    profile: str = ""
    horizon: int = 0
    window_s: float = 0.0
    done: bool = False
    cumulative_reward: float = 0.0
    action_history: list[dict[str, Any]] = Field(default_factory=list)
    last_observation: dict[str, Any] | None = None
