"""One definition of the serving metrics, for the simulator and the real gateway alike.

Latencies follow vLLM's benchmark (benchmarks/benchmark_serving.py):

- TTFT = first token - arrival (queueing included); also reported from dispatch.
- ITL = the gap between consecutive output chunks of one request, one sample per chunk
  (the report's `itl_samples` are (gap_s, count) pairs, weighted by count; when a backend sends
  none, the gaps of the records' `chunk_times_s` that end inside the window are used).
- TPOT = (last token - first token) / (output tokens - 1), for requests with >= 2 tokens.
- E2E = finish - arrival.

SLOs are judged per request against its tenant's TTFT and TPOT objectives, and every arrived
request is judged exactly once ("settled"):

- it finishes with status "ok", TTFT <= SLO and TPOT <= SLO: met;
- it finishes with any other status (error, timeout, cancelled, rejected): missed;
- it is still pending when the window ends but can no longer meet its SLOs (no first token and
  older than its TTFT SLO; first token too late; or decoding for so long that its TPOT must
  exceed the SLO): missed now, and not counted again when it later finishes;
- the episode's end: arrivals stop at the horizon and the engine drains under the last action
  (`drain_window`, at most DRAIN_MAX_WINDOWS windows, stopped as soon as every request is
  settled; its GPU time is charged), so the last arrivals are judged by their real outcome, like
  any other. Whatever is still unsettled after the drain limit (`final=True`) is missed.
  Without the drain, requests unsettled at the horizon all counted as misses, and sacrificing
  the last arrivals (batch cap 1 in the last windows) to let the in-flight ones finish paid:
  an end-of-episode artifact worth about half of all measured headroom (issue 13).

SLO attainment = met / (met + missed) over the requests settled in the window (1.0 when none);
goodput = requests met per second, and their output tokens per second.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from llmserve_env.core.open_requests import OpenRequests
from llmserve_env.core.settlement import appends, settle_window
from llmserve_env.shared import records as rb
from llmserve_env.shared.arrival_list import arrival_columns
from llmserve_env.shared.backend import Arrival, WindowReport
from llmserve_env.shared.percentiles import percentiles, weighted_percentiles
from llmserve_env.shared.records import RequestBatch
from llmserve_env.shared.tasks import TaskSpec

SLO_EPS_S = 1e-9  # seconds: a latency equal to its SLO meets it, whatever the float rounding


@dataclass(slots=True)
class TenantStats:
    """One tenant in one window: requests arrived, and requests settled met / missed."""

    arrived: int = 0
    met: int = 0
    missed: int = 0

    @property
    def attainment(self) -> float:
        settled = self.met + self.missed
        return self.met / settled if settled else 1.0

    def to_dict(self) -> dict[str, float]:
        return {"arrived": self.arrived, "met": self.met, "missed": self.missed, "attainment": self.attainment}


@dataclass(slots=True)
class WindowMetrics:
    """Everything measured over one window (latencies in ms; 0.0 where there was no sample).

    arrivals / arrival_rate_rps / mean_prompt_tokens   the window's new requests
    finished        requests that reached a terminal state in the window
    slo_met / slo_missed   requests settled in the window (see the module docstring)
    backlog_missed  of slo_missed, the requests still unsettled when the episode ended (final window)
    slo_attainment  met / (met + missed), 1.0 when nothing settled
    goodput_rps / goodput_tokens_per_s   met requests (their output tokens) per second
    p50/p99_ttft_ms TTFT from arrival of the first tokens produced in the window
    p50_ttft_dispatch_ms  TTFT from dispatch of the same
    p50/p99_itl_ms  inter-token latency of the window's output chunks
    p50_tpot_ms / p50_e2e_ms  of the requests finished ok in the window
    output_tokens / prompt_tokens   generated / prefilled in the window; throughput_tps = output / s
    queue_depth / active_requests   waiting / running at window end
    kv_occupancy, gpu_memory_used_gb, evictions, spec_acceptance_rate, quality   from the backend
    cost_usd        the window's cost; cost_per_1k_tokens = 1000 x cost / output tokens
                    (0.0 when no token was produced: nothing was served to price)
    per_tenant      TenantStats per tenant of the task
    drain_windows   the episode's last window only: windows the engine drained after the horizon
                    (their settled requests, tokens, evictions and cost are folded into this window)
    """

    window_s: float
    arrivals: int
    arrival_rate_rps: float
    mean_prompt_tokens: float
    finished: int
    slo_met: int
    slo_missed: int
    backlog_missed: int
    slo_attainment: float
    goodput_rps: float
    goodput_tokens_per_s: float
    p50_ttft_ms: float
    p99_ttft_ms: float
    p50_ttft_dispatch_ms: float
    p50_itl_ms: float
    p99_itl_ms: float
    p50_tpot_ms: float
    p50_e2e_ms: float
    output_tokens: int
    prompt_tokens: int
    throughput_tps: float
    queue_depth: int
    active_requests: int
    kv_occupancy: float
    gpu_memory_used_gb: float
    evictions: int
    spec_acceptance_rate: float
    cost_usd: float
    cost_per_1k_tokens: float
    quality: float
    per_tenant: dict[str, TenantStats] = field(default_factory=dict)
    drain_windows: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able and flat, except `per_tenant` (name -> arrived/met/missed/attainment)."""
        out: dict[str, Any] = {}
        for name in _SCALAR_FIELDS:
            out[name] = getattr(self, name)
        out["per_tenant"] = {k: v.to_dict() for k, v in self.per_tenant.items()}
        return out


# The engine drains for at most this many windows after the horizon (seconds with 1 s windows):
# on the shipped tasks every policy tried settles everything within 24 (adversarial_multitenant,
# random actions); a longer tail is rare and missed.
DRAIN_MAX_WINDOWS = 32


def with_drain(last: WindowMetrics, drained: list[WindowMetrics]) -> WindowMetrics:
    """The episode's last window with its drain folded in: the requests the drain settled, the
    tokens it produced, its evictions and its cost are added (rates are recomputed per window
    second, so the reward and the grade charge them); latencies, queue and memory stay the
    last window's own."""
    if not drained:
        return last
    m = copy.copy(last)
    m.per_tenant = {n: TenantStats(t.arrived, t.met, t.missed) for n, t in last.per_tenant.items()}
    good_tokens = last.goodput_tokens_per_s * last.window_s
    for d in drained:
        m.finished += d.finished
        m.slo_met += d.slo_met
        m.slo_missed += d.slo_missed
        m.backlog_missed += d.backlog_missed
        good_tokens += d.goodput_tokens_per_s * d.window_s
        m.output_tokens += d.output_tokens
        m.prompt_tokens += d.prompt_tokens
        m.evictions += d.evictions
        m.cost_usd += d.cost_usd
        for n, t in d.per_tenant.items():
            m.per_tenant[n].met += t.met
            m.per_tenant[n].missed += t.missed
    settled = m.slo_met + m.slo_missed
    m.slo_attainment = m.slo_met / settled if settled else 1.0
    m.goodput_rps = m.slo_met / m.window_s
    m.goodput_tokens_per_s = good_tokens / m.window_s
    m.throughput_tps = m.output_tokens / m.window_s
    m.cost_per_1k_tokens = 1e3 * m.cost_usd / m.output_tokens if m.output_tokens else 0.0
    m.drain_windows = len(drained)
    return m


_SCALAR_FIELDS: tuple[str, ...] = tuple(f for f in WindowMetrics.__dataclass_fields__ if f != "per_tenant")


class MetricsTracker:
    """Turns each window's report into WindowMetrics, settling every request exactly once.

    It persists across an episode's windows: requests are registered when they arrive, settled
    when they finish or as soon as they can no longer meet their SLOs, and on the final window
    (or at `close()`) whatever is left counts as missed. A record for a request that never arrived, or one that
    finishes twice, is a backend bug and raises ValueError.
    """

    def __init__(self, task: TaskSpec):
        self.task = task
        self._names = [t.name for t in task.tenants]
        # each tenant's TTFT and TPOT SLOs in seconds, in task order (indexed by ArrivalColumns.tenant_index)
        self._slo_columns = (np.array([t.ttft_slo_ms / 1e3 + SLO_EPS_S for t in task.tenants]),
                             np.array([t.tpot_slo_ms / 1e3 + SLO_EPS_S for t in task.tenants]))
        self._open = OpenRequests()  # arrived, not yet settled
        self._flagged: set[int] = set()  # settled as missed while still pending
        self.closed = False

    def observe(self, report: WindowReport, arrivals: Sequence[Arrival], final: bool = False) -> WindowMetrics:
        if self.closed:
            raise ValueError("the episode's final window was already observed")
        dt = report.dt
        t0 = report.t0
        t_end = t0 + dt
        names = self._names
        opened = self._open
        flagged = self._flagged

        # The window's arrivals open a request each (appended to the table in the settlement's call, or
        # merged in first where their ids do not simply follow the open ones'); the requests as columns
        # (shared/records.py: the simulator's own shape, the gateway's records converted once), settled
        # by the docstring's rules in one pass (core/settlement.py).
        cols = arrival_columns(arrivals)
        index = cols.tenant_index(names)
        append = appends(opened.ids, cols.request_id)
        if not append:
            ttft, tpot = self._slo_columns
            opened.add(cols.request_id, index, cols.arrival_s + ttft[index], tpot[index])
        fin = report.finished_batch()
        pen = report.pending_batch()
        (ids, tenant, deadline, tpot_slo, arrived_n, prompt_sum, met_n, missed_n, good_tokens, backlog, unknown,
         late_ids, e2es, tpots, ttft_dispatch, queued) = settle_window(
            opened.ids, opened.tenant, opened.deadline, opened.tpot_slo, cols.request_id, index, cols.arrival_s,
            cols.prompt_tokens, append, *self._slo_columns, fin.request_id, fin.status, fin.arrival_s,
            fin.first_token_s, fin.finish_s, fin.output_tokens, fin.dispatch_s, pen.request_id, pen.status,
            pen.first_token_s, pen.target_output_tokens, pen.dispatch_s, float(t0), float(t_end), len(names), rb.OK,
            rb.QUEUED, bool(final))
        if len(unknown):
            self._settled_before(unknown.tolist())
        if len(late_ids):
            flagged.update(late_ids.tolist())
        self._open = OpenRequests(ids, tenant, deadline, tpot_slo)
        if final:
            flagged.clear()
            self.closed = True
        queued, good_tokens, backlog, prompt_sum = int(queued), int(good_tokens), int(backlog), int(prompt_sum)
        arrived = dict(zip(names, arrived_n.tolist(), strict=True))
        running = len(pen) - queued
        met_by, missed_by = met_n.tolist(), missed_n.tolist()
        met = sum(met_by)
        missed = sum(missed_by)
        per_tenant = {n: TenantStats(arrived[n], met_by[k], missed_by[k]) for k, n in enumerate(names)}
        ttft_p50, ttft_p99 = percentiles(report.ttfts(), 50.0, 99.0)
        itl = report.itl_as_given()
        if not len(itl):
            itl = _chunk_gaps((fin, pen), t0, t_end)
        itl_p50, itl_p99 = weighted_percentiles(itl, 50.0, 99.0)
        out_tokens = int(report.output_tokens)
        settled = met + missed
        cost = float(report.cost_usd)
        n_arr = len(cols)
        return WindowMetrics(
            window_s=dt,
            arrivals=n_arr,
            arrival_rate_rps=n_arr / dt,
            mean_prompt_tokens=prompt_sum / n_arr if n_arr else 0.0,
            finished=len(fin),
            slo_met=met,
            slo_missed=missed,
            backlog_missed=backlog,
            slo_attainment=met / settled if settled else 1.0,
            goodput_rps=met / dt,
            goodput_tokens_per_s=good_tokens / dt,
            p50_ttft_ms=1e3 * ttft_p50,
            p99_ttft_ms=1e3 * ttft_p99,
            p50_ttft_dispatch_ms=1e3 * percentiles(ttft_dispatch, 50.0)[0],
            p50_itl_ms=1e3 * itl_p50,
            p99_itl_ms=1e3 * itl_p99,
            p50_tpot_ms=1e3 * percentiles(tpots, 50.0)[0],
            p50_e2e_ms=1e3 * percentiles(e2es, 50.0)[0],
            output_tokens=out_tokens,
            prompt_tokens=int(report.prompt_tokens),
            throughput_tps=out_tokens / dt,
            queue_depth=queued,
            active_requests=running,
            kv_occupancy=min(1.0, max(0.0, float(report.kv_occupancy))),
            gpu_memory_used_gb=float(report.gpu_memory_used_gb),
            evictions=int(report.evictions),
            spec_acceptance_rate=report.spec_accepted / report.spec_proposed if report.spec_proposed else 0.0,
            cost_usd=cost,
            cost_per_1k_tokens=1e3 * cost / out_tokens if out_tokens else 0.0,
            quality=float(report.quality),
            per_tenant=per_tenant,
        )

    def _settled_before(self, unknown: list[int]) -> None:
        """The finished requests that were not open (`unknown`, in row order) must each have been flagged
        while pending (settled then: unflagged now), once; else it is a backend bug (ValueError naming the
        request, nothing settled)."""
        once = set(unknown)
        bad = [rid for rid in unknown if rid not in self._flagged]
        if bad or len(once) < len(unknown):
            rid = bad[0] if bad else next(r for r in unknown if unknown.count(r) > 1)
            raise ValueError(f"request {rid} finished but is not outstanding (never arrived, or finished twice)")
        self._flagged.difference_update(once)

    def close(self) -> None:
        """End the episode's accounting (nothing may be observed after); raises if requests are
        still open: observe a window with final=True to charge them."""
        if len(self._open):
            raise ValueError(f"{len(self._open)} requests are still open; observe the last window with final=True")
        self._flagged.clear()
        self.closed = True

    def fork(self) -> MetricsTracker:
        """An independent copy: the requests still open and flagged are copied, the task shared."""
        clone = copy.copy(self)
        clone._open = self._open.copy()
        clone._flagged = set(self._flagged)
        return clone

    def open_requests(self) -> list[tuple[str, float, float]]:
        """(tenant, latest first-token time that meets its TTFT SLO, TPOT SLO in s) of every request
        arrived and not yet settled, in request id order."""
        o, names = self._open, self._names
        return [(names[k], d, p) for k, d, p in zip(o.tenant.tolist(), o.deadline.tolist(), o.tpot_slo.tolist(),
                                                    strict=True)]

    def open_ids(self) -> np.ndarray:
        """The ids of the requests arrived and not yet settled, ascending (read-only)."""
        return self._open.ids

    @property
    def outstanding(self) -> int:
        """Requests arrived and not yet settled."""
        return len(self._open)


def _chunk_gaps(batches: tuple[RequestBatch, ...], t0: float, t_end: float) -> list[tuple[float, int]]:
    """ITL samples from records' chunk times (real mode): gaps whose later chunk is in the window."""
    gaps: list[tuple[float, int]] = []
    for batch in batches:
        for ct in batch.chunk_times.values():
            for i in range(1, len(ct)):
                if t0 <= ct[i] < t_end:
                    gaps.append((ct[i] - ct[i - 1], 1))
    return gaps
