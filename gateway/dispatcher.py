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
- Attempts: the spend guard reserves each attempt's worst case; 429/408/409/5xx and connection
  errors before the first token are retried after Retry-After or capped exponential back-off with
  jitter; a stream cut after its first token ends `error` (a retry would stream the answer twice);
  silence longer than the stall timeout, or the whole request past LLMSERVE_REAL_REQUEST_TIMEOUT_S,
  ends `timeout`.
- Terminal states: every request ends exactly once in ok / error / timeout / cancelled / rejected,
  is written to the recorder once, and appears in exactly one report (or in the records that
  `cancel_all` returns when the episode is reset or closed).

Times: the loop clock inside; a request's episode-clock time for loop time x is
arrival_s + (x - scheduled release), so every latency is a measured wall-clock duration.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from llmserve_env.gateway.budget import BudgetExceededError, Reservation, SpendGuard
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
    RequestRecord,
    ResourceSample,
    WindowReport,
)
from llmserve_env.shared.models import ServeAction

logger = logging.getLogger("llmserve_env.gateway")

DECODE_LANE, PREFILL_LANE = 0, 1


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
    sort_key: tuple = ()

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
    def __init__(self, config: GatewayConfig, client: StreamClient, tiers: TierTable,
                 count_tokens: Callable[[str], int], *, recorder: JsonlRecorder | None = None,
                 lag_monitor: bool = True):
        self.config = config
        self.client = client
        self.tiers = tiers
        self.recorder = recorder
        self._secret: Secret = config.api_key
        self._count_tokens = count_tokens  # fallback when the server sends no usage
        self._lag = LoopLagMonitor() if lag_monitor else None
        self._action: ServeAction | None = None
        self._lanes: Lanes | None = None
        self._waiting: list[Entry] = []
        self._running: set[Entry] = set()
        self._lane_running: list[int] = [0, 0]
        self._lane_tokens: list[int] = [0, 0]
        self._handles: dict[int, tuple[asyncio.TimerHandle, Arrival]] = {}
        self._window = WindowAccumulator()
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
        if self._lag is not None:
            self._lag.start()

    async def stop(self) -> list[RequestRecord]:
        flushed = await self.cancel_all("backend closed")
        if self._lag is not None:
            await self._lag.stop()
        return flushed

    def new_episode(self, seed: int) -> None:
        """Fresh counters, spend guard and back-off jitter stream (call after `cancel_all`)."""
        self._seed = seed
        self._episode += 1
        self._rng = random.Random(seed)
        self._guard = self._new_guard()
        self._budget_logged = False
        self._window = WindowAccumulator()
        if self._lag is not None:
            self._lag.drain()

    async def cancel_all(self, reason: str) -> list[RequestRecord]:
        """Cancel everything not yet terminal; returns every terminal record no report has carried."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for handle, arrival in self._handles.values():
            handle.cancel()
            rec = _record_for(arrival, prompt_tokens=arrival.prompt_tokens)
            self._terminal_unowned(rec, "cancelled", f"{reason} before it arrived", arrival.arrival_s)
        self._handles.clear()
        for entry in self._waiting:
            self._finish(entry, "cancelled", f"{reason} while queued", now)
        self._waiting.clear()
        tasks = [e.task for e in self._running if e.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        flushed = self._window.take().finished
        if self.recorder is not None:
            self.recorder.flush()
        return flushed

    # ----------------------------------------------------------------- one window

    async def run_window(self, action: ServeAction, arrivals: list[Arrival], prompts: dict[int, str],
                         t0: float, dt: float, wall_s: float | None = None) -> WindowReport:
        """Serve one window: release `arrivals` over the next `wall_s` (default `dt`) seconds, then report."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        self._set_action(action)
        cap = self.config.max_requests_per_step
        for i, arrival in enumerate(arrivals):
            release_t = start + (arrival.arrival_s - t0)
            prompt = prompts[arrival.request_id]
            over_cap = i >= cap
            handle = loop.call_at(release_t, self._release, arrival, prompt, release_t, over_cap)
            self._handles[arrival.request_id] = (handle, arrival)
        end = start + (dt if wall_s is None else wall_s)
        await asyncio.sleep(max(0.0, end - loop.time()))
        return self._report(action, t0, dt, loop.time())

    # ----------------------------------------------------------------- admission

    def _set_action(self, action: ServeAction) -> None:
        old = self._action
        self._action = action
        self._lanes = Lanes.for_action(action, self.config.max_inflight_tokens)
        if old is None or old.priority_routing != action.priority_routing:
            for e in self._waiting:
                e.sort_key = self._key(e)
            self._waiting.sort(key=lambda e: e.sort_key)
        # Lanes may have changed: re-tag running requests and rebuild the lane counters.
        self._lane_running = [0, 0]
        self._lane_tokens = [0, 0]
        for e in self._running:
            e.lane = self._lane_of(e)
            self._lane_running[e.lane] += 1
            self._lane_tokens[e.lane] += e.tokens
        self._pump()

    def _key(self, e: Entry) -> tuple:
        r = e.record
        routing = self._action.priority_routing if self._action is not None else False
        return waiting_key(r.priority, r.arrival_s, r.request_id, routing)

    def _lane_of(self, e: Entry) -> int:
        if self._lanes is not None and self._lanes.split and e.record.prompt_tokens >= self.config.prefill_lane_tokens:
            return PREFILL_LANE
        return DECODE_LANE

    def _release(self, arrival: Arrival, prompt: str, release_t: float, over_cap: bool) -> None:
        self._handles.pop(arrival.request_id, None)
        c = self.config
        prompt_n = min(arrival.prompt_tokens, c.max_prompt_tokens)
        entry = Entry(record=_record_for(arrival, prompt_tokens=prompt_n), prompt=prompt,
                      max_tokens=min(arrival.output_tokens, c.max_completion_tokens), release_t=release_t)
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
        entry.sort_key = self._key(entry)
        bisect.insort(self._waiting, entry, key=lambda e: e.sort_key)
        self._pump()

    def _pump(self) -> None:
        """Admit waiting requests, in order, while their lane has room."""
        lanes = self._lanes
        if lanes is None or not self._waiting:
            return
        blocked = [False] * len(lanes.limits)
        admitted: list[Entry] = []
        for e in self._waiting:
            lane = self._lane_of(e)
            if blocked[lane]:
                continue
            limits = lanes.limits[lane]
            running, used = self._lane_running[lane], self._lane_tokens[lane]
            if limits.admits(running, used, e.tokens):
                e.lane = lane
                self._lane_running[lane] += 1
                self._lane_tokens[lane] += e.tokens
                admitted.append(e)
            else:
                blocked[lane] = True
                if all(blocked):
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
                    try:
                        reservation = self._guard.reserve(e.tokens, e.price.cost(e.record.prompt_tokens, e.max_tokens))
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
                        outcome = await self.client.stream(request, on_chunk)
                    except AttemptError as err:
                        billed = self._settle(e, reservation, err.outcome)
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
                    billed = self._settle(e, reservation, outcome)
                    e.attempt_log.append(AttemptLog(e.ep(outcome.dispatch_t), e.ep(loop.time()), "ok", outcome.status_code))
                    e.usage_prompt_tokens = outcome.usage_prompt_tokens
                    e.completion_id = outcome.completion_id
                    e.finish_reason = outcome.finish_reason
                    self._finish(e, "ok", None, loop.time(), output_tokens=billed)
                    return
        except TimeoutError:
            self._finish(e, "timeout", f"request exceeded LLMSERVE_REAL_REQUEST_TIMEOUT_S={c.request_timeout_s:g}",
                         loop.time())
        except asyncio.CancelledError:
            self._finish(e, "cancelled", "cancelled in flight (reset or close)", loop.time())
            raise

    def _backoff(self, attempt_no: int) -> float:
        """Full-jitter exponential back-off: uniform in [0, min(cap, base * 2**(n-1))]."""
        c = self.config
        return self._rng.uniform(0.0, min(c.backoff_cap_s, c.backoff_base_s * 2 ** (attempt_no - 1)))

    def _settle(self, e: Entry, reservation: Reservation, outcome: AttemptOutcome) -> int | None:
        """Charge an attempt what it used: nothing unless the server accepted it (HTTP 200). Returns the
        output tokens billed (usage first, else a tiktoken count of the text), None when not accepted."""
        assert e.price is not None
        if outcome.status_code != 200:
            self._guard.settle(reservation, 0, 0.0)
            return None
        prompt = outcome.usage_prompt_tokens or e.record.prompt_tokens
        out = outcome.usage_completion_tokens
        if out is None:
            out = self._count_tokens(outcome.text) if outcome.text_parts else 0
        cost = e.price.cost(prompt, out)
        self._guard.settle(reservation, prompt + out, cost)
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
            self._lane_running[e.lane] -= 1
            self._lane_tokens[e.lane] -= e.tokens
            self._window.set_running(len(self._running), now)
        self._emit(rec, e)
        if self._lanes is not None:
            # Admission runs after the finishing task returns control; never from inside cancel_all.
            asyncio.get_running_loop().call_soon(self._pump)

    def _terminal_unowned(self, rec: RequestRecord, status: str, error: str, t: float) -> None:
        rec.status, rec.finish_s, rec.error = status, t, error
        self._emit(rec, None)

    def _emit(self, rec: RequestRecord, e: Entry | None) -> None:
        self._window.finished.append(rec)
        if self.recorder is not None:
            self.recorder.write(rec, {
                "mode": "real",
                "episode": self._episode,
                "seed": self._seed,
                "model": e.price.model if e is not None and e.price is not None else None,
                "tier": e.tier if e is not None else None,
                "max_tokens": e.max_tokens if e is not None else None,
                "usage_prompt_tokens": e.usage_prompt_tokens if e is not None else None,
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
        in_use = sum(self._lane_tokens)
        pending = [_snapshot(e.record) for e in self._waiting] + [_snapshot(e.record) for e in self._running]
        pending.sort(key=lambda r: r.request_id)
        price = self.tiers.for_tier(action.quantization_tier)
        lag = lag_summary_ms(self._lag.drain()) if self._lag is not None else {}
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
            "lanes": 2 if lanes.split else 1,
            **lag,
            "client_bottleneck": bottleneck,
            "spend_requests": self._guard.requests,
            "spend_tokens": self._guard.tokens,
            "spend_usd": round(self._guard.usd, 6),
        }
        if self._guard.exhausted is not None:
            notes["budget_exhausted"] = f"spend limit reached: {self._guard.exhausted} per episode"
        return WindowReport(
            t0=t0,
            dt=dt,
            finished=got.finished,
            pending=pending,
            first_tokens=got.first_tokens,
            itl_samples=got.itl_samples,
            samples=[ResourceSample(t_s=t0 + dt, running=len(self._running), queued=len(self._waiting),
                                    kv_blocks_used=blocks_for(in_use), kv_blocks_total=blocks_for(lanes.budget_total),
                                    gpu_memory_used_gb=0.0)],
            output_tokens=got.output_tokens,
            prompt_tokens=got.prompt_tokens,
            busy_s=busy,
            gpu_memory_used_gb=0.0,
            kv_occupancy=min(1.0, in_use / lanes.budget_total),
            cost_usd=got.cost_usd,
            quality=price.quality,
            applied={
                "batch_cap": True,
                "kv_budget_fraction": True,
                "priority_routing": True,
                "prefill_decode_split": lanes.split or not action.prefill_decode_split,
                "quantization_tier": self.tiers.distinct_models,
                "speculation_depth": False,
            },
            notes=notes,
        )


def _record_for(a: Arrival, prompt_tokens: int) -> RequestRecord:
    return RequestRecord(request_id=a.request_id, tenant=a.tenant, priority=a.priority, arrival_s=a.arrival_s,
                         prompt_tokens=prompt_tokens, target_output_tokens=a.output_tokens)


def _snapshot(rec: RequestRecord) -> RequestRecord:
    return replace(rec, chunk_times_s=list(rec.chunk_times_s))

