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
simulator's hot path, thousands of times a second. A report's requests may come as columns
(shared/records.py), read as records on demand.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.records import FirstTokens, ItlSamples, RequestBatch, RequestRecord

if TYPE_CHECKING:
    import numpy as np

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


# Arrival's slots' setters in field order, to write them directly: an episode builds ~10^4 arrivals, and a
# frozen dataclass's __init__ spends most of its time in object.__setattr__ (one call per field); these build
# the same objects in half the time (`new_arrival` one at a time, shared/arrival_list.py `arrivals_of` in bulk)
_NEW = object.__new__
ARRIVAL_SLOT_SETTERS = tuple(Arrival.__dict__[f].__set__ for f in (
    "request_id", "arrival_s", "prompt_tokens", "output_tokens", "tenant", "priority", "prefix_ids",
    "prefix_block_tokens"))
(_SET_ID, _SET_T, _SET_P, _SET_O, _SET_TENANT, _SET_PRIO, _SET_IDS, _SET_UNIT) = ARRIVAL_SLOT_SETTERS


def new_arrival(request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int, tenant: str,
                priority: int, prefix_ids: tuple[int, ...] | None = None, prefix_block_tokens: int = 0) -> Arrival:
    """`Arrival(request_id, arrival_s, prompt_tokens, output_tokens, tenant, priority, prefix_ids,
    prefix_block_tokens)`, built without the frozen dataclass's per-field `object.__setattr__` calls: for the
    workload generators' bulk (no validation there either: the callers pass the fields' types)."""
    a = _NEW(Arrival)
    _SET_ID(a, request_id)
    _SET_T(a, arrival_s)
    _SET_P(a, prompt_tokens)
    _SET_O(a, output_tokens)
    _SET_TENANT(a, tenant)
    _SET_PRIO(a, priority)
    _SET_IDS(a, prefix_ids)
    _SET_UNIT(a, prefix_block_tokens)
    return a


@dataclass(slots=True, frozen=True)
class ResourceSample:
    """The engine's resources at one instant of the window."""

    t_s: float
    running: int
    queued: int
    kv_blocks_used: int
    kv_blocks_total: int
    gpu_memory_used_gb: float


class SampleSource(Protocol):
    """Resource samples not yet built as records (the compiled simulator's columns, sim/resource_samples.py)."""

    def __len__(self) -> int: ...

    def records(self) -> list[ResourceSample]: ...


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
    prefix_*          prefix caching (only for arrivals carrying prefix ids): prompt tokens of the requests
                      first admitted in the window, those of them served from the cache, and the KV blocks
                      holding cached units at the window's end (referenced or evictable). Real mode: the
                      prompt and cached tokens the engines reported (usage / timings) for the requests that
                      ended ok in the window, over those whose engine reported them
                      (notes["prefix_hit_measured"]); cached blocks 0 (not observable)

    `finished` and `pending` may be given as lists of records or as `RequestBatch`es (the compiled
    simulator's columns), `first_tokens` and `itl_samples` as lists or as `FirstTokens` / `ItlSamples`
    columns, `samples` as a list or as columns not yet built (the compiled simulator's, `SampleSource`): to a
    reader they are always lists, built from the columns the first time they are read
    (and the list is the truth from then on); `finished_batch()`, `pending_batch()`, `ttfts()` and
    `itl_as_given()` give them without building a Python object per entry, what the metrics read.
    """

    __slots__ = ("t0", "dt", "_finished", "_pending", "_first_tokens", "_itl_samples", "_samples", "output_tokens",
                 "prompt_tokens", "evictions", "spec_proposed", "spec_accepted", "busy_s", "gpu_memory_used_gb",
                 "kv_occupancy", "cost_usd", "quality", "applied", "notes", "prefix_query_tokens",
                 "prefix_hit_tokens", "prefix_cached_blocks")

    def __init__(self, t0: float, dt: float, finished: list[RequestRecord] | RequestBatch | None = None,
                 pending: list[RequestRecord] | RequestBatch | None = None,
                 first_tokens: list[tuple[int, str, float]] | FirstTokens | None = None,
                 itl_samples: list[tuple[float, int]] | ItlSamples | None = None,
                 samples: list[ResourceSample] | SampleSource | None = None,
                 output_tokens: int = 0, prompt_tokens: int = 0, evictions: int = 0, spec_proposed: int = 0,
                 spec_accepted: int = 0, busy_s: float = 0.0, gpu_memory_used_gb: float = 0.0,
                 kv_occupancy: float = 0.0, cost_usd: float = 0.0, quality: float = 1.0,
                 applied: dict[str, bool] | None = None, notes: dict[str, object] | None = None,
                 prefix_query_tokens: int = 0, prefix_hit_tokens: int = 0, prefix_cached_blocks: int = 0):
        self.t0 = t0
        self.dt = dt
        self._finished: list[RequestRecord] | RequestBatch = [] if finished is None else finished
        self._pending: list[RequestRecord] | RequestBatch = [] if pending is None else pending
        self._first_tokens: list[tuple[int, str, float]] | FirstTokens = [] if first_tokens is None else first_tokens
        self._itl_samples: list[tuple[float, int]] | ItlSamples = [] if itl_samples is None else itl_samples
        self._samples: list[ResourceSample] | SampleSource = [] if samples is None else samples
        self.output_tokens = output_tokens
        self.prompt_tokens = prompt_tokens
        self.evictions = evictions
        self.spec_proposed = spec_proposed
        self.spec_accepted = spec_accepted
        self.busy_s = busy_s
        self.gpu_memory_used_gb = gpu_memory_used_gb
        self.kv_occupancy = kv_occupancy
        self.cost_usd = cost_usd
        self.quality = quality
        self.applied = {} if applied is None else applied
        self.notes = {} if notes is None else notes
        self.prefix_query_tokens = prefix_query_tokens
        self.prefix_hit_tokens = prefix_hit_tokens
        self.prefix_cached_blocks = prefix_cached_blocks

    @property
    def finished(self) -> list[RequestRecord]:
        self._finished = _as_records(self._finished)
        return self._finished

    @finished.setter
    def finished(self, records: list[RequestRecord] | RequestBatch) -> None:
        self._finished = records

    @property
    def pending(self) -> list[RequestRecord]:
        self._pending = _as_records(self._pending)
        return self._pending

    @pending.setter
    def pending(self, records: list[RequestRecord] | RequestBatch) -> None:
        self._pending = records

    @property
    def first_tokens(self) -> list[tuple[int, str, float]]:
        if isinstance(self._first_tokens, FirstTokens):
            self._first_tokens = self._first_tokens.rows()
        return self._first_tokens

    @first_tokens.setter
    def first_tokens(self, value: list[tuple[int, str, float]] | FirstTokens) -> None:
        self._first_tokens = value

    @property
    def itl_samples(self) -> list[tuple[float, int]]:
        if isinstance(self._itl_samples, ItlSamples):
            self._itl_samples = self._itl_samples.rows()
        return self._itl_samples

    @itl_samples.setter
    def itl_samples(self, value: list[tuple[float, int]] | ItlSamples) -> None:
        self._itl_samples = value

    @property
    def samples(self) -> list[ResourceSample]:
        if not isinstance(self._samples, list):
            self._samples = self._samples.records()
        return self._samples

    @samples.setter
    def samples(self, value: list[ResourceSample] | SampleSource) -> None:
        self._samples = value

    def ttfts(self) -> list[float] | np.ndarray:
        """The first tokens' ttft_s, in order (an array where they were given as columns)."""
        ft = self._first_tokens
        return ft.ttft_s if isinstance(ft, FirstTokens) else [x[2] for x in ft]

    def itl_as_given(self) -> list[tuple[float, int]] | ItlSamples:
        """The ITL samples as the backend gave them: pairs, or columns (what shared/percentiles.py reads)."""
        return self._itl_samples

    def finished_batch(self) -> RequestBatch:
        return RequestBatch.of(self._finished)

    def pending_batch(self) -> RequestBatch:
        return RequestBatch.of(self._pending)

    def to_dict(self) -> dict[str, object]:
        """Every field by name, the requests as records (what `dataclasses.asdict` gave when this was one)."""
        out: dict[str, object] = {}
        for name in (n.lstrip("_") for n in self.__slots__):
            value = getattr(self, name)  # the request sets read as records
            dataclass_list = name in ("finished", "pending", "samples")
            out[name] = [dataclasses.asdict(x) for x in value] if dataclass_list else copy.deepcopy(value)
        return out

    def __repr__(self) -> str:
        return f"WindowReport(t0={self.t0}, dt={self.dt}, finished={len(self._finished)}, pending={len(self._pending)})"


def _as_records(requests: list[RequestRecord] | RequestBatch) -> list[RequestRecord]:
    return requests.records() if isinstance(requests, RequestBatch) else requests


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

    def run_window(self, action: ServeAction, arrivals: Sequence[Arrival], t0: float, dt: float) -> WindowReport: ...

    def close(self) -> None: ...
