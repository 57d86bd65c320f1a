"""A request's record (`RequestRecord`), and many of them as columns (`RequestBatch`); a window's first tokens
and inter-token gaps as columns (`FirstTokens`, `ItlSamples`).

`RequestRecord` is what happened to one request, as both backends report it (shared/backend.py's
`WindowReport` carries them). `RequestBatch` is the simulator's shape of many: a `WindowReport`'s
finished and pending requests are lists of records to every reader; the compiled simulator
(sim/array_engine.py) hands them over as one batch instead, and the records are built only if a
reader asks for them. The metrics (core/metrics.py) read the columns directly: the same values,
without a Python object per request per window, which was most of a simulated window's cost
(issue 27). A batch built from records (`from_records`, the gateway's and the Python engine's lists)
reads the same, so the metrics have one definition for both.

Times are episode-clock seconds; NaN stands for a record's None (not dispatched, no first token,
not finished). Status is a code into `STATUSES`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import numpy as np


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



STATUSES: tuple[str, ...] = ("queued", "running", "ok", "error", "timeout", "cancelled", "rejected", "preempted")
STATUS_CODE: dict[str, int] = {s: i for i, s in enumerate(STATUSES)}
QUEUED, RUNNING, OK, REJECTED = STATUS_CODE["queued"], STATUS_CODE["running"], STATUS_CODE["ok"], STATUS_CODE["rejected"]

_INT_COLUMNS = ("request_id", "priority", "prompt_tokens", "target_output_tokens", "status", "output_tokens",
                "preemptions", "attempts")
_FLOAT_COLUMNS = ("arrival_s", "dispatch_s", "first_token_s", "finish_s", "cost_usd")


@dataclass(slots=True)
class RequestBatch:
    """The fields of `RequestRecord`, one array per field (tenant names in an object array), one row per request.

    `error` holds a row's message where it has one (row -> text); `chunk_times` a row's streamed
    chunk times where it has any (records from real mode; the simulator reports ITL as samples)."""

    request_id: np.ndarray
    tenant: np.ndarray  # object array of names
    priority: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    target_output_tokens: np.ndarray
    status: np.ndarray
    dispatch_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    output_tokens: np.ndarray
    preemptions: np.ndarray
    attempts: np.ndarray
    cost_usd: np.ndarray
    error: dict[int, str]
    chunk_times: dict[int, list[float]]
    # The int and float columns' own 2-D arrays where the columns are their rows (`from_blocks`): a
    # cluster's window joins its replicas' batches with one concatenate each instead of one per column.
    blocks: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.request_id)

    @classmethod
    def from_blocks(cls, ints: np.ndarray, floats: np.ndarray, tenants: np.ndarray, error: dict[int, str],
                    chunk_times: dict[int, list[float]]) -> RequestBatch:
        """A batch whose columns are the rows of `ints` (`_INT_COLUMNS`' order) and `floats` (`_FLOAT_COLUMNS`')."""
        return cls(ints[0], tenants, ints[1], floats[0], ints[2], ints[3], ints[4], floats[1], floats[2], floats[3],
                   ints[5], ints[6], ints[7], floats[4], error, chunk_times, (ints, floats))

    def __iter__(self) -> Iterator[RequestRecord]:
        """The rows as records (built on each call: hot paths read the columns)."""
        return iter(self.records())

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord]) -> RequestBatch:
        n = len(records)
        ints = np.empty((len(_INT_COLUMNS), n), dtype=np.int64)
        floats = np.empty((len(_FLOAT_COLUMNS), n))
        if n:
            code = STATUS_CODE
            ints[:] = np.array([(r.request_id, r.priority, r.prompt_tokens, r.target_output_tokens, code[r.status],
                                 r.output_tokens, r.preemptions, r.attempts) for r in records], dtype=np.int64).T
            nan = np.nan
            floats[:] = np.array([(r.arrival_s, nan if r.dispatch_s is None else r.dispatch_s,
                                   nan if r.first_token_s is None else r.first_token_s,
                                   nan if r.finish_s is None else r.finish_s, r.cost_usd) for r in records]).T
        tenants = np.array([r.tenant for r in records], dtype=object)
        return cls.from_blocks(ints, floats, tenants, {j: r.error for j, r in enumerate(records) if r.error is not None},
                               {j: r.chunk_times_s for j, r in enumerate(records) if r.chunk_times_s})

    @classmethod
    def of(cls, requests: Sequence[RequestRecord] | RequestBatch) -> RequestBatch:
        """`requests` as columns: a batch as it is, records converted."""
        return requests if isinstance(requests, RequestBatch) else cls.from_records(requests)

    @classmethod
    def concat(cls, batches: Iterable[RequestBatch]) -> RequestBatch:
        parts = list(batches)
        if len(parts) > 1:  # an empty part adds no row (a cluster's idle replicas: most of them, most windows)
            parts = [b for b in parts if len(b)] or parts[:1]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.from_records([])
        error: dict[int, str] = {}
        chunks: dict[int, list[float]] = {}
        off = 0
        for b in parts:
            if b.error:  # (most batches have neither)
                error.update({off + j: e for j, e in b.error.items()})
            if b.chunk_times:
                chunks.update({off + j: c for j, c in b.chunk_times.items()})
            off += len(b)
        tenants = np.concatenate([b.tenant for b in parts])
        if all(b.blocks is not None for b in parts):
            ints = np.concatenate([b.blocks[0] for b in parts], axis=1)  # type: ignore[index]
            floats = np.concatenate([b.blocks[1] for b in parts], axis=1)  # type: ignore[index]
            return cls.from_blocks(ints, floats, tenants, error, chunks)
        cols: dict[str, Any] = {name: np.concatenate([getattr(b, name) for b in parts])
                                for name in (*_INT_COLUMNS, *_FLOAT_COLUMNS)}
        return cls(tenant=tenants, error=error, chunk_times=chunks, **cols)

    def slice(self, lo: int, hi: int) -> RequestBatch:
        """Rows lo..hi-1 (views; their messages and chunk times re-keyed): the batch itself where that is every row."""
        if lo == 0 and hi == len(self):
            return self
        error = {j - lo: e for j, e in self.error.items() if lo <= j < hi}
        chunks = {j - lo: c for j, c in self.chunk_times.items() if lo <= j < hi}
        if self.blocks is not None:
            return self.from_blocks(self.blocks[0][:, lo:hi], self.blocks[1][:, lo:hi], self.tenant[lo:hi], error, chunks)
        cols: dict[str, Any] = {name: getattr(self, name)[lo:hi] for name in (*_INT_COLUMNS, *_FLOAT_COLUMNS)}
        return RequestBatch(tenant=self.tenant[lo:hi], error=error, chunk_times=chunks, **cols)

    def records(self) -> list[RequestRecord]:
        """The rows as records (None where a time is NaN), as the backend would have listed them."""
        n = len(self)
        if not n:
            return []
        status = [STATUSES[s] for s in self.status.tolist()]
        disp, ft, fin = (_nones(getattr(self, c).tolist()) for c in ("dispatch_s", "first_token_s", "finish_s"))
        rid, prio, arr, prompt, target, out, pre, att, cost = (
            getattr(self, c).tolist() for c in ("request_id", "priority", "arrival_s", "prompt_tokens",
                                                "target_output_tokens", "output_tokens", "preemptions", "attempts",
                                                "cost_usd"))
        ten, err, chunks = self.tenant.tolist(), self.error, self.chunk_times
        return [RequestRecord(rid[j], ten[j], prio[j], arr[j], prompt[j], target[j], status[j], disp[j], ft[j], fin[j],
                              out[j], list(chunks.get(j, ())), pre[j], att[j], cost[j], err.get(j))
                for j in range(n)]


def _nones(values: list[float]) -> list[float | None]:
    return [None if x != x else x for x in values]


class _Rows:
    """Rows given as columns, one array per field (a slotted dataclass's fields, in order, with `_DTYPES`):
    built from tuples (`of`), joined (`concat`), read back as tuples (`rows`)."""

    __slots__ = ()
    _DTYPES: ClassVar[tuple[type, ...]]

    def __len__(self) -> int:
        return len(getattr(self, self._names()[0]))

    @classmethod
    def of(cls, rows: list[tuple] | Self) -> Self:
        if not isinstance(rows, list):
            return rows
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(cls._DTYPES)
        return cls(*(np.array(c, dtype=d) for c, d in zip(columns, cls._DTYPES, strict=True)))

    @classmethod
    def concat(cls, parts: Iterable[list[tuple] | Self]) -> list[tuple] | Self:
        """The parts joined in order: a list where every part is one (the Python engine's and the gateway's
        lists stay lists), else columns."""
        got = list(parts)
        lists = [p for p in got if isinstance(p, list)]
        if len(lists) == len(got):
            return [row for p in lists for row in p]
        if len(got) == 1:
            return got[0]
        full = [cls.of(p) for p in got if len(p)]  # an empty part adds no row
        if len(full) <= 1:
            return full[0] if full else cls.of(got[0])
        return cls(*(np.concatenate([getattr(c, n) for c in full]) for n in cls._names()))

    def rows(self) -> list[tuple]:
        return list(zip(*(getattr(self, n).tolist() for n in self._names()), strict=True))

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        """The fields' names in order: a slotted dataclass's slots (dataclasses.fields() costs ~10 us a call)."""
        return cls.__slots__


@dataclass(slots=True)
class FirstTokens(_Rows):
    """A window's first tokens as columns: `WindowReport.first_tokens`' (request_id, tenant, ttft_s from
    arrival) triples, one array each (tenant names in an object array). The compiled simulator hands
    them over this way; a reader of the report's list gets the triples."""

    _DTYPES = (np.int64, object, np.float64)
    request_id: np.ndarray
    tenant: np.ndarray
    ttft_s: np.ndarray


@dataclass(slots=True)
class ItlSamples(_Rows):
    """A window's inter-token-latency samples as columns: `WindowReport.itl_samples`' (gap_s, count) pairs,
    one array each. The compiled simulator hands them over this way (one per batched iteration); a
    reader of the report's list gets the pairs."""

    _DTYPES = (np.float64, np.int64)
    gap_s: np.ndarray
    count: np.ndarray
