"""The `Backend` protocol: what the simulator and the real-mode gateway both implement.

One window of serving, as data:

    arrivals (from the workload, never from the actions)
        -> backend.run_window(action, arrivals, t0, dt)
        -> WindowReport: per-request RequestRecords + resource samples + window totals

Times are seconds on the episode clock (the episode starts at t=0). A backend keeps requests
that are unfinished at the window's end and carries them into the next window; they appear in
`WindowReport.pending` as a snapshot and, once they reach a terminal state, in exactly one later
window's `WindowReport.finished`.

These are plain dataclasses (slots) rather than pydantic models: they are built on the
simulator's hot path, thousands of times a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from llmserve_env.shared.models import ServeAction

# Terminal states: every request ends in exactly one of these.
TERMINAL_STATUSES: frozenset[str] = frozenset({"ok", "error", "timeout", "cancelled", "rejected"})
# Non-terminal states, seen only in `WindowReport.pending` snapshots.
LIVE_STATUSES: frozenset[str] = frozenset({"queued", "running"})


@dataclass(slots=True, frozen=True)
class Arrival:
    """One request as the workload generates it.

    request_id     unique within the episode, increasing with arrival time
    arrival_s      episode-clock seconds
    prompt_tokens  >= 1
    output_tokens  >= 1, the target completion length (max_tokens in real mode)
    tenant         tenant name (its SLOs live in the task's TenantSpec)
    priority       0 is the highest; larger numbers are less important
    prefix_ids     one id per unit of `prefix_block_tokens` tokens of the prompt (and of the answer,
                   where a later request resends it), prefix-unique: equal ids mean equal text up to
                   and including that unit (vLLM's block hash, Mooncake's remapped hash_ids;
                   `shared.prefix.chain_ids` makes them from per-position ids), for prefix caching
                   (sim/prefix_cache.py); None: no caching, the seed's path
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tenant: str = "default"
    priority: int = 1
    prefix_ids: tuple[int, ...] | None = None
    prefix_block_tokens: int = 0


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request, with raw timestamps (episode-clock seconds).

    dispatch_s      when the backend admitted it (sim: scheduled into a batch; real: HTTP sent)
    first_token_s   when its first output token was produced / received
    finish_s        when it reached its terminal state
    output_tokens   tokens actually produced (usage first, tokenizer count as fallback in real mode)
    chunk_times_s   real mode: the arrival time of every streamed chunk (first included);
                    the simulator leaves it empty and reports ITL through WindowReport.itl_samples
    preemptions     times it was evicted from the KV cache and recomputed
    attempts        HTTP attempts (real mode retries); 1 in sim
    cost_usd        what serving it cost (API price in real mode; 0 in sim, where cost is per GPU-second)
    """

    request_id: int
    tenant: str
    priority: int
    arrival_s: float
    prompt_tokens: int
    target_output_tokens: int
    status: str = "queued"
    dispatch_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    output_tokens: int = 0
    chunk_times_s: list[float] = field(default_factory=list)
    preemptions: int = 0
    attempts: int = 0
    cost_usd: float = 0.0
    error: str | None = None


@dataclass(slots=True, frozen=True)
class ResourceSample:
    """The engine's resources at one instant of the window."""

    t_s: float
    running: int
    queued: int
    kv_blocks_used: int
    kv_blocks_total: int
    gpu_memory_used_gb: float


@dataclass(slots=True)
class WindowReport:
    """Everything a backend measured over [t0, t0 + dt).

    finished          requests that reached a terminal state in this window (each exactly once per episode)
    pending           snapshot of requests still queued or running at the window's end
    first_tokens      (request_id, tenant, ttft_s from arrival) for first tokens produced in this window
    itl_samples       (gap_s, count): `count` output chunks arrived `gap_s` after their predecessor;
                      the simulator emits one entry per batched iteration, the gateway one per chunk gap
    output_tokens     output tokens produced in the window (all requests, finished or not)
    prompt_tokens     prompt tokens prefilled in the window (recomputation after preemption included)
    evictions         preemptions in the window
    spec_proposed / spec_accepted   draft tokens proposed / accepted by verification
    busy_s            seconds the engine was executing (sim) or had a request in flight (real)
    gpu_memory_used_gb  weights + KV in use at window end (real mode: 0, not observable)
    kv_occupancy      KV blocks in use / blocks budgeted, at window end (real: in-flight token budget use)
    cost_usd          cost of the window (GPU-seconds x price in sim; API tokens x price in real)
    quality           relative output quality of the tier used, 1.0 = FP16 reference
    applied           which knobs the backend could honour, e.g. {"speculation_depth": False}
    notes             backend-specific diagnostics (event-loop lag, retries, ...)
    """

    t0: float
    dt: float
    finished: list[RequestRecord] = field(default_factory=list)
    pending: list[RequestRecord] = field(default_factory=list)
    first_tokens: list[tuple[int, str, float]] = field(default_factory=list)
    itl_samples: list[tuple[float, int]] = field(default_factory=list)
    samples: list[ResourceSample] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    evictions: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0
    busy_s: float = 0.0
    gpu_memory_used_gb: float = 0.0
    kv_occupancy: float = 0.0
    cost_usd: float = 0.0
    quality: float = 1.0
    applied: dict[str, bool] = field(default_factory=dict)
    notes: dict[str, object] = field(default_factory=dict)
    # prefix caching (only for arrivals carrying prefix ids): prompt tokens of the requests first
    # admitted in the window, those of them served from the cache, and the KV blocks holding cached
    # units at the window's end (referenced or evictable). Real mode: the prompt and cached tokens the
    # engines reported (usage / timings) for the requests that ended ok in the window, over those whose
    # engine reported them (notes["prefix_hit_measured"]); cached blocks 0 (not observable)
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefix_cached_blocks: int = 0


class BackendUnavailableError(RuntimeError):
    """`run_window` could not serve the window at all (real mode: every attempt of the window failed to
    connect to its endpoint). Nothing of the window was consumed: the backend withdrew its arrivals and
    can serve the same window again, so the episode stays at its step (the server answers 503)."""

    def __init__(self, endpoint: str, reason: str):
        super().__init__(f"endpoint {endpoint} is unreachable: {reason}")
        self.endpoint = endpoint
        self.reason = reason


@runtime_checkable
class Backend(Protocol):
    """A serving engine the environment drives one window at a time.

    `reset(seed)` drops every request and starts a fresh episode clock at 0; its engine-side
    randomness (e.g. speculative acceptance draws) comes from `seed` alone, on a stream separate
    from the workload's. `run_window` serves `arrivals` (all with t0 <= arrival_s < t0 + dt)
    together with any carried-over requests under `action`, and returns what happened.
    `close()` releases resources (real mode: cancels in-flight requests, each ending `cancelled`).
    """

    name: str

    def reset(self, seed: int) -> None: ...

    def run_window(self, action: ServeAction, arrivals: list[Arrival], t0: float, dt: float) -> WindowReport: ...

    def close(self) -> None: ...
