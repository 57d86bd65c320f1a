"""The real-mode dispatcher: releases arrivals on time, admits them under the policy, streams them.

It lives on one long-lived asyncio loop (the backend runs that loop in a background thread; tests
run it under looptime), so requests stay in flight across windows.

- Release: each arrival of a window is released at its offset from the window's start (wall
  clock, 1:1 with the episode clock). A request's latencies are measured from that scheduled
  release, so a late client shows up as latency, never hides.
- Admission (shared/admission.py): `batch_cap` is the most in flight; `kv_budget_fraction` x
  LLMSERVE_REAL_MAX_INFLIGHT_TOKENS is a budget of in-flight tokens, a request counting
  prompt + max_tokens; waiting order is (priority, arrival) with `priority_routing`, else arrival;
  the head of a lane that does not fit blocks its lane (no overtaking), except that a lane with
  nothing in flight always admits its head (a request bigger than the budget would otherwise wait
  forever). With `prefill_decode_split`, prompts of LLMSERVE_REAL_PREFILL_LANE_TOKENS or more go
  to a prefill lane and the rest to a decode lane, each with half the slots and half the budget
  (batch_cap 1 cannot be split: the split is then reported as not applied).
- Replicas (an endpoint pool, LLMSERVE_REAL_ENDPOINTS): `action.replicas` = k serves on the pool's
  first k endpoints (None keeps the count). Each arrival is routed at its release to the endpoint
  with the least outstanding work (shared/routing.py, the simulator's router rule), or with
  `action.cache_affinity` set, by the simulator's cache-aware rule (shared/prefix_routing.py) over
  the prefix units it already sent each endpoint, and waits in that endpoint's queue: the six knobs apply to every endpoint (batch_cap and the token budget are
  per endpoint, as per replica in the simulator). An endpoint past the first k takes no new request
  and finishes what it holds (draining). Cold start is not applied: the endpoints are already up,
  so a replica is ready at once (and costs tokens, not replica-seconds); starting endpoints on
  demand is not supported.
- Attempts: the spend guard reserves each attempt's worst case; 429/408/409/5xx and connection
  errors before the first token are retried after Retry-After or capped exponential back-off with
  jitter; a stream cut after its first token ends `error` (a retry would stream the answer twice);
  silence longer than the stall timeout, or the whole request past LLMSERVE_REAL_REQUEST_TIMEOUT_S,
  ends `timeout`.
- Prefix hits (issue 32): the engine's own count of cached prompt tokens (usage's
  prompt_tokens_details.cached_tokens, llama-server's timings) for requests with prefix ids that end
  ok, summed into the window's prefix_query/hit_tokens; requests whose engine said nothing are counted
  apart (notes prefix_hit_unmeasured), never as 0 hits.
- Terminal states: every request ends exactly once in ok / error / timeout / cancelled / rejected,
  is written to the recorder once, and appears in exactly one report (or in the records that
  `cancel_all` returns when the episode is reset or closed).
- Abandonment: when no window follows the last one for LLMSERVE_REAL_ABANDON_S, the episode's
  client is taken to be gone: its queued and in-flight requests end `cancelled` at once (recorded,
  and carried by the next report if the client does come back).
- Server-wide caps (gateway/budget.py's ProcessGuard, shared by every episode of the process):
  requests in flight (LLMSERVE_REAL_MAX_INFLIGHT_TOTAL) and dollars (LLMSERVE_REAL_MAX_USD_TOTAL).
- The model: every response's `model` is compared with the one requested; a mismatch (a server
  that ignores the name) is counted in the report's notes, and the quantization tier is then not
  reported as applied.

Times: the loop clock inside. The episode clock is anchored once per episode (loop time
`anchor` is episode time 0) and window k covers [anchor + k*dt, anchor + (k+1)*dt): windows stay
aligned to their boundaries however long the caller takes between steps (a late step releases its
window's arrivals late, and the lateness shows in their latencies and in `window_late_ms`).
A request's episode-clock time for loop time x is x - anchor.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from llmserve_env.gateway.budget import BudgetExceededError, ProcessGuard, Reservation, SpendGuard
from llmserve_env.gateway.config import GatewayConfig, Secret, redact
from llmserve_env.gateway.looplag import LoopLagMonitor, lag_summary_ms
from llmserve_env.gateway.pricing import TierPrice, TierTable
from llmserve_env.gateway.recorder import JsonlRecorder
from llmserve_env.gateway.streaming import AttemptError, AttemptOutcome, ChatRequest, StreamClient
from llmserve_env.gateway.window import WindowAccumulator
from llmserve_env.shared.admission import AdmissionLimits, blocks_for, token_budget, waiting_key
from llmserve_env.shared.backend import (
    TERMINAL_STATUSES,
    Arrival,
    BackendUnavailableError,
    RequestRecord,
    ResourceSample,
    WindowReport,
)
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.prefix_routing import affinity_choice, hit_cap_units, leading_overlap
from llmserve_env.shared.routing import least_outstanding, outstanding_work

logger = logging.getLogger("llmserve_env.gateway")

DECODE_LANE, PREFILL_LANE = 0, 1
# OpenAI answers a request for "gpt-4.1" with the dated snapshot that served it, "gpt-4.1-2025-04-14".
_SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}")


def same_model(requested: str, served: str | None) -> bool:
    """True when `served` is the model asked for (or its dated snapshot); None (not said) counts as the same."""
    if served is None or served == requested:
        return True
    return served.startswith(requested) and _SNAPSHOT.fullmatch(served[len(requested):]) is not None


@dataclass(slots=True)
class AttemptLog:
    """One HTTP attempt, episode-clock times."""

    start_s: float
    end_s: float
    outcome: str
    status: int | None = None
    retry_after_s: float | None = None
    error: str | None = None


@dataclass(slots=True, eq=False)
class Entry:
    """A request the dispatcher owns, from release to its terminal state."""

    record: RequestRecord
    prompt: str
    max_tokens: int
    release_t: float  # scheduled release on the loop clock (its arrival)
    endpoint: int = 0  # its place in the pool (routed at release)
    lane: int = DECODE_LANE
    tokens: int = 0  # prompt + max_tokens: its claim on the in-flight token budget
    tier: str = ""
    price: TierPrice | None = None
    task: asyncio.Task[None] | None = None
    last_chunk_t: float | None = None
    text_parts: list[str] = field(default_factory=list)
    attempt_log: list[AttemptLog] = field(default_factory=list)
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    completion_id: str | None = None
    served_model: str | None = None
    step: int = 0  # the window it arrived in
    sort_key: tuple = ()
    # prefix caching (issue 32): the prompt's leading units as sent (their ids), the tokens the router
    # took as cached on its endpoint (affinity routing only), and what the engine said it served from
    # its cache, with the prompt tokens it counted (None: the engine did not say)
    prefixed: bool = False  # its arrival carries prefix ids
    prefix_keys: tuple[int, ...] = ()
    routed_hit: int = 0
    cached_tokens: int | None = None
    engine_prompt_tokens: int | None = None

    def ep(self, t: float) -> float:
        return self.record.arrival_s + (t - self.release_t)


@dataclass(frozen=True, slots=True)
class Lanes:
    """Per-lane admission limits under one action."""

    split: bool
    limits: tuple[AdmissionLimits, ...]
    budget_total: int

    @classmethod
    def for_action(cls, action: ServeAction, capacity_tokens: int) -> Lanes:
        budget = token_budget(action.kv_budget_fraction, capacity_tokens)
        if action.prefill_decode_split and action.batch_cap >= 2:
            prefill_cap = action.batch_cap // 2
            prefill_budget = budget // 2
            return cls(True, (AdmissionLimits(action.batch_cap - prefill_cap, budget - prefill_budget),
                              AdmissionLimits(prefill_cap, prefill_budget)), budget)
        return cls(False, (AdmissionLimits(action.batch_cap, budget),), budget)


class Dispatcher:
    def __init__(self, config: GatewayConfig, client: StreamClient | Sequence[StreamClient], tiers: TierTable,
                 count_tokens: Callable[[str], int], *, recorder: JsonlRecorder | None = None,
                 lag_monitor: bool | LoopLagMonitor = True, process: ProcessGuard | None = None,
                 on_endpoint: Callable[[bool, str | None], None] | None = None):
        self.config = config
        # one client per endpoint of the pool (config.pool), in its order
        self.clients: list[StreamClient] = list(client) if isinstance(client, Sequence) else [client]
        if len(self.clients) != len(config.pool):
            raise ValueError(f"{len(self.clients)} clients for {len(config.pool)} endpoints")
        self.client = self.clients[0]
        self.tiers = tiers
        self.recorder = recorder
        self._secret: Secret = config.api_key
        self._count_tokens = count_tokens  # fallback when the server sends no usage
        # The process's monitor (gateway/service.py) or, standalone, one of its own.
        self._lag = lag_monitor if isinstance(lag_monitor, LoopLagMonitor) else (LoopLagMonitor() if lag_monitor else None)
        self._lag_held = False
        self._lag_since = 0.0
        self._process = process or ProcessGuard(config.max_usd_total, config.max_inflight_total)
        self._on_endpoint = on_endpoint  # told of each attempt: reached the server or not (for /health)
        self._anchor: float | None = None  # loop time of episode time 0
        self._window_open = False
        self._abandon_handle: asyncio.TimerHandle | None = None
        self._abandon_task: asyncio.Task | None = None
        self._window_task: asyncio.Task | None = None
        self.episode_id = ""
        self._step = 0
        self._served: dict[str, str] = {}  # requested model -> model the server said answered
        self._mismatch: str | None = None  # the first mismatch of the episode
        self._cancel_reason = "cancelled"
        self.closed: str | None = None  # why the service closed it (then it serves no more windows)
        self._action: ServeAction | None = None
        self._lanes: Lanes | None = None
        self._waiting: list[Entry] = []
        self._running: set[Entry] = set()
        self._replicas = 1  # endpoints taking new requests: the pool's first k
        n = len(self.clients)
        self._lane_running: list[list[int]] = [[0, 0] for _ in range(n)]  # [endpoint][lane]
        self._lane_tokens: list[list[int]] = [[0, 0] for _ in range(n)]
        self._handles: dict[int, tuple[asyncio.TimerHandle, Arrival]] = {}
        # prefix ids the gateway sent to each endpoint this episode (cache-aware routing's view of a cache)
        self._sent: list[set[int]] = [set() for _ in range(n)]
        self._window = WindowAccumulator()
        # this window's attempts: how many sent in it reached an endpoint, how many could not connect (and why)
        self._reached = 0
        self._unreached = 0
        self._unreached_error: str | None = None
        self._window_start = 0.0  # loop time the current window's call began
        self._seed = 0
        self._episode = 0
        self._rng = random.Random(0)
        self._guard = self._new_guard()
        self._budget_logged = False

    def __repr__(self) -> str:
        return (f"Dispatcher(base_url={self.config.base_url!r}, running={len(self._running)}, "
                f"waiting={len(self._waiting)})")

    # ----------------------------------------------------------------- lifecycle

    def _new_guard(self) -> SpendGuard:
        c = self.config
        return SpendGuard(c.max_requests_per_episode, c.max_tokens_per_episode, c.max_usd_per_episode)

    async def start(self) -> None:
        """Nothing runs until a window does: an idle episode costs no CPU."""

    async def stop(self, reason: str = "backend closed") -> list[RequestRecord]:
        flushed = await self.cancel_all(reason)
        if self._window_task is not None:
            self._window_task.cancel()  # a step blocked in its window (shutdown) gets its answer now
        self._set_busy(force_idle=True)
        if self._lag is not None and not self._lag.running:
            await self._lag.stop()
        return flushed

    def new_episode(self, seed: int, episode_id: str = "") -> None:
        """Fresh counters, spend guard, clock and back-off jitter stream (call after `cancel_all`)."""
        self._seed = seed
        self._episode += 1
        self.episode_id = episode_id
        self._rng = random.Random(seed)
        self._guard = self._new_guard()
        self._budget_logged = False
        self._window = WindowAccumulator()
        self._anchor = None
        self._served = {}
        self._mismatch = None
        self._replicas = 1
        self._sent = [set() for _ in self.clients]

    def start_replicas(self, k: int) -> None:
        """The count the episode starts with (its task's initial replicas), before its first window."""
        self._check_replicas(k)
        self._replicas = k

    def _check_replicas(self, k: int) -> None:
        if not 1 <= k <= len(self.clients):
            raise ValueError(f"replicas must be in 1..{len(self.clients)} (LLMSERVE_REAL_ENDPOINTS has "
                             f"{len(self.clients)} endpoint{'s' if len(self.clients) > 1 else ''}), got {k}")

    @property
    def busy(self) -> bool:
        return bool(self._window_open or self._running or self._waiting or self._handles)

    def _set_busy(self, force_idle: bool = False) -> None:
        """Hold the process's lag monitor exactly while this episode has work."""
        if self._lag is None:
            return
        busy = self.busy and not force_idle
        if busy and not self._lag_held:
            self._lag_held = True
            self._lag.acquire()
        elif not busy and self._lag_held:
            self._lag_held = False
            self._lag.release()

    async def cancel_all(self, reason: str, take: bool = True) -> list[RequestRecord]:
        """Cancel everything not yet terminal. With `take`, returns every terminal record no report has
        carried (reset, close); without, they stay for the next report (abandonment)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._abandon_handle is not None:
            self._abandon_handle.cancel()
            self._abandon_handle = None
        for handle, arrival in self._handles.values():
            handle.cancel()
            rec = _record_for(arrival, prompt_tokens=min(arrival.prompt_tokens, self.config.max_prompt_tokens),
                              max_tokens=min(arrival.output_tokens, self.config.max_completion_tokens))
            self._terminal_unowned(rec, "cancelled", f"{reason} before it arrived", arrival.arrival_s)
        self._handles.clear()
        waiting, self._waiting = self._waiting, []
        for entry in waiting:
            self._finish(entry, "cancelled", f"{reason} while queued", now)
        tasks = [e.task for e in self._running if e.task is not None]
        self._cancel_reason = reason
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        # A task cancelled before its first step never runs its own handler: end those here, so no
        # admitted request goes unrecorded.
        for e in [e for e in self._running if e.record.status not in TERMINAL_STATUSES]:
            self._finish(e, "cancelled", f"{reason} before it was sent", loop.time())
        self._set_busy()
        flushed = self._window.take().finished if take else []
        if self.recorder is not None:
            self.recorder.flush()
        return flushed

    def _abandon(self) -> None:
        """No step for LLMSERVE_REAL_ABANDON_S: stop sending this episode's requests."""
        self._abandon_handle = None
        if not (self._running or self._waiting or self._handles):
            return
        n = len(self._running) + len(self._waiting) + len(self._handles)
        logger.info("episode %s: no step for %g s; cancelling its %d outstanding requests",
                    self.episode_id or self._episode, self.config.abandon_s, n)
        self._window.abandoned += n
        # Held here: the loop keeps only a weak reference to a task.
        self._abandon_task = asyncio.get_running_loop().create_task(self.cancel_all(
            f"episode abandoned (no step for LLMSERVE_REAL_ABANDON_S={self.config.abandon_s:g} s)", take=False))

    async def _withdraw(self, arrivals: Sequence[Arrival]) -> None:
        """Take back a window no attempt of which reached the endpoint, so that the same window can be
        sent again: its arrivals not yet sent are dropped, those still retrying are cancelled (the
        record file keeps their attempts; a resent request's later row supersedes them), and none is
        reported. Requests of earlier windows stay for the next report. The episode clock restarts at
        the next window, so the retried window is served whole."""
        ids = {a.request_id for a in arrivals}
        for rid in ids & self._handles.keys():
            self._handles.pop(rid)[0].cancel()
        self._waiting = [e for e in self._waiting if e.record.request_id not in ids]
        tasks = [e.task for e in self._running if e.record.request_id in ids and e.task is not None]
        self._cancel_reason = "endpoint unreachable, window withdrawn to be sent again"
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        w = self._window
        kept = []
        for rec in w.finished:
            if rec.request_id not in ids:
                kept.append(rec)
                continue
            w.errors -= rec.status == "error"
            w.timeouts -= rec.status == "timeout"
            w.cancelled -= rec.status == "cancelled"
            w.rejected -= rec.status == "rejected"
            w.attempts -= rec.attempts  # every attempt of a request released in this window was in it
            w.retries -= max(0, rec.attempts - 1)
            w.prompt_tokens -= rec.prompt_tokens * rec.attempts
        w.finished = kept
        w.failure = next((f"request {r.request_id}: {r.error}" for r in reversed(kept)
                          if r.status in ("error", "timeout")), None)
        if self.recorder is not None:
            self.recorder.flush()
        self._anchor = None

    # ----------------------------------------------------------------- one window

    async def run_window(self, action: ServeAction, arrivals: Sequence[Arrival], prompts: dict[int, str],
                         t0: float, dt: float, wall_s: float | None = None) -> WindowReport:
        """Serve window [t0, t0 + dt) of the episode clock: release `arrivals` at their times, then report
        at the window's end (or after `wall_s`, the most this call may take, if sooner)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._abandon_handle is not None:
            self._abandon_handle.cancel()
            self._abandon_handle = None
        if self._anchor is None:
            self._anchor = now - t0
        start = self._anchor + t0
        late = max(0.0, now - start)
        self._window_open = True
        self._window_task = asyncio.current_task()
        self._reached = self._unreached = 0
        self._unreached_error = None
        self._window_start = now
        self._set_busy()
        self._step = int(round(t0 / dt)) if dt > 0 else 0
        self._set_action(action)
        c = self.config
        cap = c.max_requests_per_step
        sent = [min(a.prompt_tokens, c.max_prompt_tokens) for a in arrivals[:cap]]
        for i, arrival in enumerate(arrivals):
            release_t = self._anchor + arrival.arrival_s  # in the past when the step came late: released now
            prompt = prompts[arrival.request_id]
            over_cap = i >= cap
            handle = loop.call_at(release_t, self._release, arrival, prompt, release_t, over_cap, self._step)
            self._handles[arrival.request_id] = (handle, arrival)
        end = start + dt if wall_s is None else min(start + dt, now + wall_s)
        try:
            await asyncio.sleep(max(0.0, end - loop.time()))
        finally:
            self._window_open = False
            self._window_task = None
        if arrivals and self._unreached and not self._reached:
            await self._withdraw(arrivals)
            self._set_busy()
            if c.abandon_s > 0:
                self._abandon_handle = loop.call_later(c.abandon_s, self._abandon)
            raise BackendUnavailableError(
                self.config.base_url if len(self.clients) == 1 else ", ".join(self.config.pool[:self._replicas]),
                f"all {self._unreached} attempts of this window failed to connect, none reached it; "
                f"last error: {self._unreached_error}")
        report = self._report(action, t0, dt, loop.time())
        report.notes["window_late_ms"] = round(1e3 * late, 3)
        report.notes["mean_prompt_tokens_sent"] = round(sum(sent) / len(sent), 3) if sent else None
        self._set_busy()
        if c.abandon_s > 0:
            self._abandon_handle = loop.call_later(c.abandon_s, self._abandon)
        return report

    # ----------------------------------------------------------------- admission

    def _set_action(self, action: ServeAction) -> None:
        old = self._action
        if action.replicas is not None:
            self._check_replicas(action.replicas)
            self._replicas = action.replicas
        self._action = action
        self._lanes = Lanes.for_action(action, self.config.max_inflight_tokens)
        if old is None or old.priority_routing != action.priority_routing:
            for e in self._waiting:
                e.sort_key = self._key(e)
            self._waiting.sort(key=lambda e: e.sort_key)
        # Lanes may have changed: re-tag running requests and rebuild the lane counters.
        self._lane_running = [[0, 0] for _ in self.clients]
        self._lane_tokens = [[0, 0] for _ in self.clients]
        for e in self._running:
            e.lane = self._lane_of(e)
            self._lane_running[e.endpoint][e.lane] += 1
            self._lane_tokens[e.endpoint][e.lane] += e.tokens
        self._pump()

    def _key(self, e: Entry) -> tuple:
        r = e.record
        routing = self._action.priority_routing if self._action is not None else False
        return waiting_key(r.priority, r.arrival_s, r.request_id, routing)

    def _lane_of(self, e: Entry) -> int:
        if self._lanes is not None and self._lanes.split and e.record.prompt_tokens >= self.config.prefill_lane_tokens:
            return PREFILL_LANE
        return DECODE_LANE

    def _release(self, arrival: Arrival, prompt: str, release_t: float, over_cap: bool, step: int) -> None:
        self._handles.pop(arrival.request_id, None)
        c = self.config
        prompt_n = min(arrival.prompt_tokens, c.max_prompt_tokens)
        max_tokens = min(arrival.output_tokens, c.max_completion_tokens)
        entry = Entry(record=_record_for(arrival, prompt_tokens=prompt_n, max_tokens=max_tokens), prompt=prompt,
                      max_tokens=max_tokens, release_t=release_t, step=step)
        entry.tokens = prompt_n + entry.max_tokens
        now = asyncio.get_running_loop().time()
        if over_cap:
            self._finish(entry, "rejected", f"over LLMSERVE_REAL_MAX_REQUESTS_PER_STEP={c.max_requests_per_step}", now)
            return
        if entry.tokens > c.max_inflight_tokens:
            self._finish(entry, "rejected", f"prompt + max_tokens = {entry.tokens} exceeds "
                         f"LLMSERVE_REAL_MAX_INFLIGHT_TOKENS={c.max_inflight_tokens}", now)
            return
        if self._guard.exhausted is not None:
            self._finish(entry, "rejected", f"spend limit reached ({self._guard.exhausted} per episode)", now)
            return
        entry.endpoint = self._route(arrival, entry)
        entry.sort_key = self._key(entry)
        bisect.insort(self._waiting, entry, key=lambda e: e.sort_key)
        self._pump()

    def _route(self, arrival: Arrival, entry: Entry) -> int:
        """The endpoint, of the first k, with the least outstanding work (shared/routing.py); with
        `action.cache_affinity` set, the simulator's cache-aware rule (shared/prefix_routing.py): each
        endpoint's work against the share of the prompt whose leading units were already sent there.
        The prompt's full units are remembered as sent to the endpoint chosen, whatever the rule."""
        unit = arrival.prefix_block_tokens
        prompt_n = entry.record.prompt_tokens
        keys = arrival.prefix_ids[:prompt_n // unit] if arrival.prefix_ids and unit > 0 else ()
        entry.prefix_keys = keys
        entry.prefixed = arrival.prefix_ids is not None
        affinity = self._action.cache_affinity if self._action is not None else None
        if self._replicas == 1:
            best = 0
        else:
            work = [0.0] * self._replicas
            for e in (*self._waiting, *self._running):
                if e.endpoint < self._replicas:
                    r = e.record
                    work[e.endpoint] += outstanding_work(r.prompt_tokens - e.routed_hit, e.max_tokens,
                                                         len(r.chunk_times_s), r.first_token_s is not None)
            if affinity is None:
                best = least_outstanding(work)
            else:
                cap = keys[:hit_cap_units(prompt_n, unit)] if keys else ()
                hits = [unit * leading_overlap(cap, self._sent[i]) for i in range(self._replicas)]
                best = affinity_choice(work, [h / prompt_n for h in hits], affinity)
                entry.routed_hit = hits[best]
        if keys:
            self._sent[best].update(keys)
        return best

    def _pump(self) -> None:
        """Admit waiting requests, in order, while their lane has room."""
        lanes = self._lanes
        if lanes is None or not self._waiting:
            return
        n_lanes = len(lanes.limits)
        blocked = [[False] * n_lanes for _ in self.clients]  # [endpoint][lane]: its head did not fit
        open_lanes = n_lanes * len(self.clients)
        admitted: list[Entry] = []
        process = self._process
        for e in self._waiting:
            lane, ep = self._lane_of(e), e.endpoint
            if blocked[ep][lane]:
                continue
            if process.full:  # the whole server is at LLMSERVE_REAL_MAX_INFLIGHT_TOTAL: wait for a slot
                process.waiting.add(self)
                self._window.process_capped = True
                break
            limits = lanes.limits[lane]
            running, used = self._lane_running[ep][lane], self._lane_tokens[ep][lane]
            if limits.admits(running, used, e.tokens):
                e.lane = lane
                self._lane_running[ep][lane] += 1
                self._lane_tokens[ep][lane] += e.tokens
                process.inflight += 1
                admitted.append(e)
            else:
                blocked[ep][lane] = True
                open_lanes -= 1
                if open_lanes == 0:
                    break
        if not admitted:
            return
        gone = set(admitted)
        self._waiting = [e for e in self._waiting if e not in gone]
        loop = asyncio.get_running_loop()
        action = self._action
        assert action is not None
        for e in admitted:
            self._running.add(e)
            e.record.status = "running"
            e.tier = action.quantization_tier  # the tier in force when it was admitted
            e.price = self.tiers.for_tier(e.tier)
            e.task = loop.create_task(self._serve(e), name=f"request-{e.record.request_id}")
        self._window.set_running(len(self._running), loop.time())

    # ----------------------------------------------------------------- one request

    def _on_chunk(self, e: Entry) -> Callable[[float, str], None]:
        # Looks up self._window on every chunk: a reset replaces the accumulator.
        def on_chunk(t: float, text: str) -> None:
            rec = e.record
            if e.last_chunk_t is None:
                rec.first_token_s = e.ep(t)
                self._window.first_tokens.append((rec.request_id, rec.tenant, t - e.release_t))
            else:
                self._window.itl_samples.append((t - e.last_chunk_t, 1))
            e.last_chunk_t = t
            rec.chunk_times_s.append(e.ep(t))
            e.text_parts.append(text)
            self._window.output_tokens += 1

        return on_chunk

    async def _serve(self, e: Entry) -> None:
        loop = asyncio.get_running_loop()
        c = self.config
        assert e.price is not None
        request = ChatRequest(model=e.price.model, prompt=e.prompt, max_tokens=e.max_tokens,
                              extra_body={"ignore_eos": True} if c.ignore_eos else {})
        on_chunk = self._on_chunk(e)
        try:
            async with asyncio.timeout(c.request_timeout_s):
                for attempt_no in range(1, c.max_attempts + 1):
                    worst = e.price.cost(e.record.prompt_tokens, e.max_tokens)
                    try:
                        self._process.check(worst)
                        reservation = self._guard.reserve(e.tokens, worst)
                        process_res = self._process.reserve(worst)
                    except BudgetExceededError as exc:
                        self._log_budget(str(exc))
                        self._finish(e, "rejected" if attempt_no == 1 else "error", str(exc), loop.time())
                        return
                    now = loop.time()
                    if attempt_no == 1:
                        e.record.dispatch_s = e.ep(now)
                    e.record.attempts += 1
                    self._window.attempts += 1
                    self._window.retries += int(attempt_no > 1)
                    self._window.prompt_tokens += e.record.prompt_tokens
                    try:
                        outcome = await self.clients[e.endpoint].stream(request, on_chunk)
                    except AttemptError as err:
                        billed = self._settle(e, reservation, process_res, err.outcome)
                        self._endpoint(err.kind != "connection" or err.outcome.first_t is not None, err,
                                       err.outcome.dispatch_t)
                        e.completion_id = err.outcome.completion_id or e.completion_id
                        msg = redact(err.message, self._secret)
                        e.attempt_log.append(AttemptLog(e.ep(err.outcome.dispatch_t), e.ep(loop.time()), err.kind,
                                                        err.status, err.retry_after_s, msg))
                        if err.kind == "stall":
                            self._finish(e, "timeout", msg, loop.time(), output_tokens=billed)
                            return
                        if not err.retryable or attempt_no == c.max_attempts:
                            tail = "" if not err.retryable else f" (after {attempt_no} attempts)"
                            self._finish(e, "error", msg + tail, loop.time(), output_tokens=billed)
                            return
                        delay = err.retry_after_s if err.retry_after_s is not None else self._backoff(attempt_no)
                        logger.info("request %d attempt %d failed (%s); retrying in %.2f s",
                                    e.record.request_id, attempt_no, msg[:120], delay)
                        await asyncio.sleep(delay)
                        continue
                    billed = self._settle(e, reservation, process_res, outcome)
                    self._endpoint(True, None, outcome.dispatch_t)
                    self._check_model(e, outcome.served_model)
                    e.attempt_log.append(AttemptLog(e.ep(outcome.dispatch_t), e.ep(loop.time()), "ok", outcome.status_code))
                    e.usage_prompt_tokens = outcome.usage_prompt_tokens
                    e.completion_id = outcome.completion_id
                    e.finish_reason = outcome.finish_reason
                    e.cached_tokens = outcome.cached_tokens
                    e.engine_prompt_tokens = outcome.engine_prompt_tokens
                    if e.prefixed:
                        self._count_prefix(e)
                    self._finish(e, "ok", None, loop.time(), output_tokens=billed)
                    return
        except TimeoutError:
            self._finish(e, "timeout", f"request exceeded LLMSERVE_REAL_REQUEST_TIMEOUT_S={c.request_timeout_s:g}",
                         loop.time())
        except asyncio.CancelledError:
            self._finish(e, "cancelled", f"{self._cancel_reason} while in flight", loop.time())
            raise

    def _count_prefix(self, e: Entry) -> None:
        """The engine's cache hit for a prefix request that ended ok, in its window's totals."""
        w = self._window
        if e.cached_tokens is None or not e.engine_prompt_tokens:
            w.prefix_unmeasured += 1
            return
        w.prefix_measured += 1
        w.prefix_query += e.engine_prompt_tokens
        w.prefix_hit += min(e.cached_tokens, e.engine_prompt_tokens)

    def _backoff(self, attempt_no: int) -> float:
        """Full-jitter exponential back-off: uniform in [0, min(cap, base * 2**(n-1))]."""
        c = self.config
        return self._rng.uniform(0.0, min(c.backoff_cap_s, c.backoff_base_s * 2 ** (attempt_no - 1)))

    def _endpoint(self, reached: bool, err: AttemptError | None, dispatch_t: float) -> None:
        message = None if err is None else redact(err.message, self._secret)[:200]
        if reached:
            # only an attempt sent in this window says the endpoint answers now: a stream sent before it
            # and cut by the engine's death (its first token came) is not one
            self._reached += dispatch_t >= self._window_start
        else:
            self._unreached += 1
            self._unreached_error = message
        if self._on_endpoint is not None:
            self._on_endpoint(reached, message)

    def _check_model(self, e: Entry, served: str | None) -> None:
        assert e.price is not None
        e.served_model = served
        requested = e.price.model
        if served is None:
            return
        self._served.setdefault(requested, served)
        if not same_model(requested, served):
            self._window.model_mismatches += 1
            note = f"requested {requested!r}, the server answered as {served!r}"
            self._window.model_mismatch = note
            if self._mismatch is None:
                self._mismatch = note
                logger.warning("real mode: %s (the endpoint ignores the model name?)", note)

    def _tier_applied(self) -> bool:
        """The quantization tier changes the model only if the table maps tiers to different models and
        the server answered each with the model asked for, and different ones with different models."""
        if not self.tiers.distinct_models or self._mismatch is not None:
            return False
        served = list(self._served.values())
        return len(set(served)) == len(served)

    def _settle(self, e: Entry, reservation: Reservation, process_res: Reservation,
                outcome: AttemptOutcome) -> int | None:
        """Charge an attempt what it used: nothing unless the server accepted it (HTTP 200). Returns the
        output tokens billed (usage first, else a tiktoken count of the text), None when not accepted."""
        assert e.price is not None
        if outcome.status_code != 200:
            self._guard.settle(reservation, 0, 0.0)
            self._process.settle(process_res, 0.0)
            return None
        prompt = outcome.usage_prompt_tokens or e.record.prompt_tokens
        out = outcome.usage_completion_tokens
        if out is None:
            out = self._count_tokens(outcome.text) if outcome.text_parts else 0
        cost = e.price.cost(prompt, out)
        self._guard.settle(reservation, prompt + out, cost)
        self._process.settle(process_res, cost)
        e.record.cost_usd += cost
        self._window.cost_usd += cost
        return out

    def _log_budget(self, message: str) -> None:
        if not self._budget_logged:
            logger.error("%s", message)
            self._budget_logged = True

    # ----------------------------------------------------------------- terminal states

    def _finish(self, e: Entry, status: str, error: str | None, now: float, output_tokens: int | None = None) -> None:
        rec = e.record
        if rec.status in TERMINAL_STATUSES:
            raise RuntimeError(f"request {rec.request_id} finished twice ({rec.status} then {status})")
        rec.status = status
        rec.finish_s = e.ep(now)
        rec.error = redact(error, self._secret) if error else None
        if output_tokens is None:
            output_tokens = self._count_tokens("".join(e.text_parts)) if e.text_parts else 0
        rec.output_tokens = output_tokens
        self._window.output_tokens += output_tokens - len(rec.chunk_times_s)  # chunks counted as they came
        if status == "rejected":
            self._window.rejected += 1
        if e in self._running:
            self._running.discard(e)
            self._lane_running[e.endpoint][e.lane] -= 1
            self._lane_tokens[e.endpoint][e.lane] -= e.tokens
            self._window.set_running(len(self._running), now)
            self._free_process_slot()
        self._emit(rec, e)
        if self._lanes is not None:
            # Admission runs after the finishing task returns control; never from inside cancel_all.
            asyncio.get_running_loop().call_soon(self._pump)
        self._set_busy()

    def _free_process_slot(self) -> None:
        process = self._process
        process.inflight -= 1
        if process.waiting:
            loop = asyncio.get_running_loop()
            waiting, process.waiting = process.waiting, set()
            for d in waiting:
                loop.call_soon(d._pump)

    def _terminal_unowned(self, rec: RequestRecord, status: str, error: str, t: float) -> None:
        rec.status, rec.finish_s, rec.error = status, t, error
        self._emit(rec, None)

    def _emit(self, rec: RequestRecord, e: Entry | None) -> None:
        self._window.finished.append(rec)
        w = self._window
        if rec.status == "error":
            w.errors += 1
            w.failure = f"request {rec.request_id}: {rec.error}"
        elif rec.status == "timeout":
            w.timeouts += 1
            w.failure = f"request {rec.request_id}: {rec.error}"
        elif rec.status == "cancelled":
            w.cancelled += 1
        if self.recorder is not None:
            self.recorder.write(rec, {
                "mode": "real",
                "episode_id": self.episode_id,
                "episode": self._episode,
                "step": e.step if e is not None else self._step,
                "seed": self._seed,
                "endpoint": self.config.pool[e.endpoint] if e is not None else None,
                "model": e.price.model if e is not None and e.price is not None else None,
                "served_model": e.served_model if e is not None else None,
                "tier": e.tier if e is not None else None,
                "max_tokens": e.max_tokens if e is not None else None,
                "usage_prompt_tokens": e.usage_prompt_tokens if e is not None else None,
                # the engine's prefix cache hit (its own fields; None: not said) and the units sent
                "cached_tokens": e.cached_tokens if e is not None else None,
                "engine_prompt_tokens": e.engine_prompt_tokens if e is not None else None,
                "prefix_units_sent": len(e.prefix_keys) if e is not None and e.prefixed else None,
                "routed_hit_tokens": e.routed_hit if e is not None and e.prefixed else None,
                "finish_reason": e.finish_reason if e is not None else None,
                "completion_id": e.completion_id if e is not None else None,
                # loop clock (time.monotonic) minus episode clock for this request: to line the
                # record up with server-side logs taken on the same machine
                "loop_minus_episode_s": e.release_t - rec.arrival_s if e is not None else None,
                "attempt_log": [
                    {"start_s": a.start_s, "end_s": a.end_s, "outcome": a.outcome, "status": a.status,
                     "retry_after_s": a.retry_after_s, "error": a.error}
                    for a in (e.attempt_log if e is not None else [])
                ],
            })

    # ----------------------------------------------------------------- the report

    def _report(self, action: ServeAction, t0: float, dt: float, now: float) -> WindowReport:
        w = self._window
        busy = w.close_busy(now)
        got = w.take()
        lanes = self._lanes
        assert lanes is not None
        in_use = sum(map(sum, self._lane_tokens))
        # Serving endpoints: the first k, and any past them still finishing what they hold (draining).
        holding = [sum(r) > 0 for r in self._lane_running]
        holding_q = {e.endpoint for e in self._waiting}
        draining = sum(1 for i in range(self._replicas, len(self.clients)) if holding[i] or i in holding_q)
        serving = self._replicas + draining
        budget_total = lanes.budget_total * serving
        pending = [_snapshot(e.record) for e in self._waiting] + [_snapshot(e.record) for e in self._running]
        pending.sort(key=lambda r: r.request_id)
        price = self.tiers.for_tier(action.quantization_tier)
        lag = lag_summary_ms(self._lag.since(self._lag_since)) if self._lag is not None else {}
        self._lag_since = now
        bottleneck = bool(lag) and lag["loop_lag_p99_ms"] > self.config.lag_bottleneck_ms
        if bottleneck:
            logger.warning("client is the bottleneck: event-loop lag p99 %.1f ms over the window "
                           "(%d streams in flight); measured latencies include it",
                           lag["loop_lag_p99_ms"], len(self._running))
        if self.recorder is not None:
            self.recorder.flush()
        notes: dict[str, object] = {
            "backend": "real",
            "client": self.config.client,
            "model": price.model,
            "price_known": price.price_known,
            "in_flight": len(self._running),
            "queued": len(self._waiting),
            "attempts": got.attempts,
            "retries": got.retries,
            "rejected": got.rejected,
            "errors": got.errors,
            "timeouts": got.timeouts,
            "cancelled": got.cancelled,
            "failure": got.failure,
            # An empty window has no TTFT: the observation's p50/p99_ttft_ms then read 0.0 by the shared
            # metrics' convention for no samples; these say whether that 0.0 is a measurement.
            "ttft_samples": len(got.first_tokens),
            "itl_samples": len(got.itl_samples),
            "served_model": self._served.get(price.model),
            "model_mismatches": got.model_mismatches,
            "lanes": 2 if lanes.split else 1,
            "cluster": {"target": self._replicas, "ready": self._replicas, "starting": 0, "draining": draining,
                        "endpoints": len(self.clients), "cold_start_applied": False,
                        "in_flight_by_endpoint": [sum(r) for r in self._lane_running]},
            **lag,
            "client_bottleneck": bottleneck,
            "spend_requests": self._guard.requests,
            "spend_tokens": self._guard.tokens,
            "spend_usd": round(self._guard.usd, 6),
        }
        notes["server_in_flight"] = self._process.inflight
        notes["server_spend_usd"] = round(self._process.usd, 6)
        if got.process_capped:
            notes["server_inflight_capped"] = True
        if got.prefix_measured or got.prefix_unmeasured:
            # prefix requests ended ok in the window: with the engine's cache counts, and without
            notes["prefix_hit_measured"] = got.prefix_measured
            notes["prefix_hit_unmeasured"] = got.prefix_unmeasured
        if got.model_mismatch is not None:
            notes["model_mismatch"] = got.model_mismatch
        if got.abandoned:
            notes["abandoned_cancelled"] = got.abandoned
        if self._guard.exhausted is not None:
            notes["budget_exhausted"] = f"spend limit reached: {self._guard.exhausted} per episode"
        if self._process.exhausted is not None:
            notes["budget_exhausted"] = f"spend limit reached: {self._process.exhausted} for the whole server"
        return WindowReport(
            t0=t0,
            dt=dt,
            finished=got.finished,
            pending=pending,
            first_tokens=got.first_tokens,
            itl_samples=got.itl_samples,
            samples=[ResourceSample(t_s=t0 + dt, running=len(self._running), queued=len(self._waiting),
                                    kv_blocks_used=blocks_for(in_use), kv_blocks_total=blocks_for(budget_total),
                                    gpu_memory_used_gb=0.0)],
            output_tokens=got.output_tokens,
            prompt_tokens=got.prompt_tokens,
            prefix_query_tokens=got.prefix_query,
            prefix_hit_tokens=got.prefix_hit,
            busy_s=busy,
            gpu_memory_used_gb=0.0,
            kv_occupancy=min(1.0, in_use / budget_total),
            cost_usd=got.cost_usd,
            quality=price.quality,
            applied={
                "batch_cap": True,
                "kv_budget_fraction": True,
                "priority_routing": True,
                "prefill_decode_split": lanes.split or not action.prefill_decode_split,
                "quantization_tier": self._tier_applied(),
                "speculation_depth": False,
                # routed over the first k endpoints (cold start: not applied, notes["cluster"])
                **({"replicas": True} if action.replicas is not None else {}),
                # cache-aware routing over the pool (one endpoint: nothing to route, as the simulator says)
                **({"cache_affinity": len(self.clients) > 1} if action.cache_affinity is not None else {}),
            },
            notes=notes,
        )


def _record_for(a: Arrival, prompt_tokens: int, max_tokens: int) -> RequestRecord:
    return RequestRecord(request_id=a.request_id, tenant=a.tenant, priority=a.priority, arrival_s=a.arrival_s,
                         prompt_tokens=prompt_tokens, target_output_tokens=max_tokens)


def _snapshot(rec: RequestRecord) -> RequestRecord:
    return replace(rec, chunk_times_s=list(rec.chunk_times_s))

