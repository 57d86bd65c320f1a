"""The real-mode dispatcher under virtual time (looptime) against a respx-mocked endpoint.

The OpenAI SDK client is given an `httpx.AsyncClient` (respx patches httpx, not the SDK's httpx2),
and the fake endpoint streams with `asyncio.sleep` delays, so every TTFT, ITL, dispatch and retry
time below is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import looptime
import openai
import pytest
import respx
from llmserve_env.gateway.budget import ProcessGuard
from llmserve_env.gateway.config import GatewayConfig, Secret
from llmserve_env.gateway.dispatcher import Dispatcher, same_model
from llmserve_env.gateway.pricing import TierPrice, TierTable
from llmserve_env.gateway.recorder import JsonlRecorder, read_records
from llmserve_env.gateway.streaming import SdkStreamClient
from llmserve_env.gateway.tokens import count_tokens
from llmserve_env.shared.backend import TERMINAL_STATUSES, Arrival, RequestRecord, WindowReport
from llmserve_env.shared.models import ServeAction

BASE = "http://fake.test/v1"
CANARY = "sk-canary-dispatcher-0123456789abcdef"
TIERS = TierTable({"FP16": TierPrice("m-fp16", 1.0, 2.0, 1.0), "INT8": TierPrice("m-int8", 0.5, 1.0, 0.9),
                   "INT4": TierPrice("m-int4", 0.25, 0.5, 0.8)}, "test")


def act(**kw) -> ServeAction:
    base = dict(batch_cap=64, kv_budget_fraction=1.0, speculation_depth=0, quantization_tier="FP16",
                prefill_decode_split=False, priority_routing=False)
    base.update(kw)
    return ServeAction(**base)


def run_virtual(coro):
    loop = looptime.new_event_loop(start=0.0)
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(text: str | None = None, finish: str | None = None, model: str = "m") -> bytes:
    delta = {"content": text} if text else {}
    return sse({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


class Paced(httpx.AsyncByteStream):
    """A response body whose parts arrive after virtual delays; may end in an exception."""

    def __init__(self, parts: list[tuple[float, bytes]], fail: Exception | None = None, on_close=None):
        self.parts, self.fail, self.on_close = parts, fail, on_close
        self._gen = self._run()

    def __aiter__(self):
        return self._gen  # one-shot, like a network stream (the SDK drains it after [DONE])

    async def _run(self):
        try:
            for delay, data in self.parts:
                await asyncio.sleep(delay)
                yield data
            if self.fail is not None:
                raise self.fail
        finally:
            if self.on_close:
                self.on_close()


@dataclass
class FakeEndpoint:
    """Streams `max_tokens` words: first after `ttft`, then one every `itl`. `script` overrides per call."""

    ttft: float = 0.05
    itl: float = 0.02
    served: str | None = None  # the model the server says answered; None: the one requested
    script: list[Callable[[dict], httpx.Response]] = field(default_factory=list)
    active: int = 0
    peak: int = 0
    bodies: list[dict] = field(default_factory=list)
    dispatch_times: list[float] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)

    def ok(self, body: dict, cut_after: int | None = None, stall: float = 0.0) -> httpx.Response:
        n = body["max_tokens"]
        model = self.served or body["model"]
        parts = [(self.ttft + (stall if k == 0 else 0.0) if k == 0 else self.itl, chunk(" the", model=model))
                 for k in range(n)]
        fail = None
        if cut_after is not None:
            parts, fail = parts[:cut_after], httpx.RemoteProtocolError("peer closed connection")
        else:
            parts += [(0.0, chunk(finish="length", model=model)),
                      (0.0, sse({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model,
                                 "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": n,
                                                          "total_tokens": 10 + n}})),
                      (0.0, b"data: [DONE]\n\n")]
        self.active += 1
        self.peak = max(self.peak, self.active)

        def closed():
            self.active -= 1
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=Paced(parts, fail, closed))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        self.auth.append(request.headers.get("authorization", ""))
        self.dispatch_times.append(asyncio.get_running_loop().time())
        if self.script:
            return self.script.pop(0)(body)
        return self.ok(body)


def make(endpoint: FakeEndpoint, **cfg) -> tuple[Dispatcher, respx.MockRouter]:
    config = GatewayConfig(api_key=Secret(CANARY), base_url=BASE, client="sdk", backoff_base_s=0.5,
                           **cfg)
    router = respx.mock(base_url=BASE, assert_all_called=False)
    router.post("/chat/completions").mock(side_effect=endpoint)
    sdk = openai.AsyncOpenAI(api_key=CANARY, base_url=BASE, max_retries=0, http_client=httpx.AsyncClient())
    return Dispatcher(config, SdkStreamClient(sdk, config.stall_timeout_s), TIERS, count_tokens,
                      lag_monitor=False), router


async def play(d: Dispatcher, arrivals: list[Arrival], action: ServeAction, windows: int, dt: float = 1.0,
               actions: dict[int, ServeAction] | None = None) -> list[WindowReport]:
    reports = []
    for k in range(windows):
        window = [a for a in arrivals if k * dt <= a.arrival_s < (k + 1) * dt]
        prompts = {a.request_id: f"prompt {a.request_id}" for a in window}
        a = (actions or {}).get(k, action)
        reports.append(await d.run_window(a, window, prompts, k * dt, dt))
    return reports


def finished(reports: list[WindowReport], flush: list[RequestRecord] = ()) -> dict[int, RequestRecord]:
    out: dict[int, RequestRecord] = {}
    for rec in [r for rep in reports for r in rep.finished] + list(flush):
        assert rec.request_id not in out, f"request {rec.request_id} reported twice"
        assert rec.status in TERMINAL_STATUSES
        out[rec.request_id] = rec
    return out


def test_ttft_itl_and_dispatch_are_exact():
    ep = FakeEndpoint(ttft=0.05, itl=0.02)
    d, router = make(ep)

    async def main():
        with router:
            return await play(d, [Arrival(0, 0.1, 20, 3)], act(), 1)

    [rep] = run_virtual(main())
    [rec] = rep.finished
    assert rec.status == "ok" and rec.attempts == 1
    assert rec.dispatch_s == pytest.approx(0.1, abs=1e-9)
    assert rec.first_token_s == pytest.approx(0.15, abs=1e-9)
    assert rec.chunk_times_s == pytest.approx([0.15, 0.17, 0.19], abs=1e-9)
    assert rec.output_tokens == 3 and rec.prompt_tokens == 20
    assert rep.first_tokens == [(0, "default", pytest.approx(0.05, abs=1e-9))]
    assert [g for g, _ in rep.itl_samples] == pytest.approx([0.02, 0.02], abs=1e-9)
    assert rep.output_tokens == 3 and rep.prompt_tokens == 20
    # usage said 10 prompt tokens, 3 completion tokens at $1/$2 per 1M
    assert rec.cost_usd == pytest.approx((10 * 1.0 + 3 * 2.0) / 1e6)
    assert rep.cost_usd == pytest.approx(rec.cost_usd)
    assert rep.applied["speculation_depth"] is False and rep.applied["quantization_tier"] is True
    assert rep.quality == 1.0 and rep.gpu_memory_used_gb == 0.0
    body = ep.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 3 and body["model"] == "m-fp16"
    assert ep.auth == [f"Bearer {CANARY}"]


def test_requests_stay_in_flight_across_windows():
    ep = FakeEndpoint(ttft=0.3, itl=0.5)
    d, router = make(ep)

    async def main():
        with router:
            return await play(d, [Arrival(0, 0.5, 10, 4)], act(), 3)

    r0, r1, r2 = run_virtual(main())
    # tokens at 0.8 | 1.3, 1.8 | 2.3
    assert r0.finished == [] and [p.request_id for p in r0.pending] == [0] and r0.pending[0].status == "running"
    assert r0.first_tokens == [(0, "default", pytest.approx(0.3, abs=1e-9))] and r0.output_tokens == 1
    assert r1.finished == [] and r1.first_tokens == [] and r1.output_tokens == 2
    assert [r.request_id for r in r2.finished] == [0] and r2.pending == [] and r2.output_tokens == 1
    assert r2.finished[0].finish_s == pytest.approx(2.3, abs=1e-9)
    assert r0.busy_s == pytest.approx(0.5, abs=1e-9) and r1.busy_s == pytest.approx(1.0, abs=1e-9)


def test_batch_cap_bounds_in_flight_requests():
    ep = FakeEndpoint(ttft=0.05, itl=0.05)  # each request lasts 0.05 + 0.05 = 0.1 s (2 tokens)
    d, router = make(ep)
    arrivals = [Arrival(i, 0.0, 10, 2) for i in range(5)]

    async def main():
        with router:
            return await play(d, arrivals, act(batch_cap=2), 1)

    [rep] = run_virtual(main())
    recs = finished([rep])
    assert ep.peak == 2
    assert sorted(r.dispatch_s for r in recs.values()) == pytest.approx([0, 0, 0.1, 0.1, 0.2], abs=1e-9)
    # queueing shows in TTFT from arrival
    assert max(r.first_token_s - r.arrival_s for r in recs.values()) == pytest.approx(0.25, abs=1e-9)


def test_kv_budget_is_an_in_flight_token_budget():
    ep = FakeEndpoint(ttft=0.05, itl=0.05)
    d, router = make(ep, max_inflight_tokens=1000)
    # 198 + 2 = 200 tokens each; fraction 0.5 -> budget 500 -> two at a time
    arrivals = [Arrival(i, 0.0, 198, 2) for i in range(4)] + [Arrival(9, 0.5, 700, 2)]

    async def main():
        with router:
            return await play(d, arrivals, act(kv_budget_fraction=0.5), 1)

    [rep] = run_virtual(main())
    recs = finished([rep])
    assert sorted(recs[i].dispatch_s for i in range(4)) == pytest.approx([0, 0, 0.1, 0.1], abs=1e-9)
    # bigger than the whole budget: admitted alone rather than waiting forever
    assert recs[9].status == "ok" and recs[9].dispatch_s == pytest.approx(0.5, abs=1e-9)


def test_priority_routing_orders_the_queue():
    def order(routing: bool) -> list[int]:
        ep = FakeEndpoint(ttft=0.05, itl=0.05)
        d, router = make(ep)
        arrivals = [Arrival(0, 0.0, 10, 2, priority=1), Arrival(1, 0.01, 10, 2, priority=1),
                    Arrival(2, 0.02, 10, 2, priority=0)]

        async def main():
            with router:
                return await play(d, arrivals, act(batch_cap=1, priority_routing=routing), 1)

        recs = finished(run_virtual(main()))
        return sorted(recs, key=lambda i: recs[i].dispatch_s)

    assert order(True) == [0, 2, 1]
    assert order(False) == [0, 1, 2]


def test_prefill_decode_split_runs_separate_lanes():
    ep = FakeEndpoint(ttft=0.05, itl=0.05)
    d, router = make(ep, prefill_lane_tokens=1000)
    arrivals = [Arrival(0, 0.0, 2000, 2), Arrival(1, 0.0, 2000, 2), Arrival(2, 0.0, 10, 2), Arrival(3, 0.0, 10, 2)]

    async def main():
        with router:
            return await play(d, arrivals, act(batch_cap=2, prefill_decode_split=True), 1)

    [rep] = run_virtual(main())
    recs = finished([rep])
    # one long and one short at a time: the lanes do not block each other
    assert [recs[i].dispatch_s for i in range(4)] == pytest.approx([0, 0.1, 0, 0.1], abs=1e-9)
    assert rep.applied["prefill_decode_split"] is True and rep.notes["lanes"] == 2

    d2, router2 = make(FakeEndpoint())

    async def one():
        with router2:
            return await play(d2, [], act(batch_cap=1, prefill_decode_split=True), 1)

    [rep2] = run_virtual(one())
    assert rep2.applied["prefill_decode_split"] is False  # one slot cannot be split


def test_429_retry_after_is_honoured_and_every_attempt_recorded(tmp_path):
    ep = FakeEndpoint()
    ep.script = [lambda b: httpx.Response(429, headers={"retry-after": "2"}, json={"error": {"message": "slow down"}})]
    d, router = make(ep)
    d.recorder = JsonlRecorder(tmp_path / "rec.jsonl")

    async def main():
        with router:
            return await play(d, [Arrival(0, 0.0, 10, 2)], act(), 3)

    reports = run_virtual(main())
    d.recorder.close()
    rec = finished(reports)[0]
    assert rec.status == "ok" and rec.attempts == 2
    assert ep.dispatch_times == pytest.approx([0.0, 2.0], abs=1e-9)
    assert rec.dispatch_s == 0.0 and rec.first_token_s == pytest.approx(2.05, abs=1e-9)
    assert reports[0].notes["attempts"] == 1 and sum(r.notes["retries"] for r in reports) == 1
    [row] = read_records(tmp_path / "rec.jsonl")
    assert row["request_id"] == 0 and row["status"] == "ok" and row["model"] == "m-fp16"
    log = row["attempt_log"]
    assert [a["outcome"] for a in log] == ["http", "ok"] and log[0]["status"] == 429
    assert log[0]["retry_after_s"] == 2.0 and log[1]["start_s"] == pytest.approx(2.0, abs=1e-9)


def test_5xx_is_retried_with_backoff_then_gives_up():
    ep = FakeEndpoint()
    ep.script = [lambda b: httpx.Response(500, json={"error": {"message": "boom"}})] * 3
    d, router = make(ep, max_attempts=3)

    async def main():
        with router:
            return await play(d, [Arrival(0, 0.0, 10, 2)], act(), 5)

    rec = finished(run_virtual(main()))[0]
    assert rec.status == "error" and rec.attempts == 3
    assert "HTTP 500" in rec.error and "after 3 attempts" in rec.error
    gaps = [b - a for a, b in zip(ep.dispatch_times, ep.dispatch_times[1:], strict=False)]
    assert 0 <= gaps[0] <= 0.5 and 0 <= gaps[1] <= 1.0  # full-jitter back-off caps 0.5, 1.0


def test_non_retryable_status_fails_at_once():
    ep = FakeEndpoint()
    ep.script = [lambda b: httpx.Response(400, json={"error": {"message": "bad model"}})]
    d, router = make(ep)

    async def main():
        with router:
            return await play(d, [Arrival(0, 0.0, 10, 2)], act(), 1)

    rec = finished(run_virtual(main()))[0]
    assert rec.status == "error" and rec.attempts == 1 and "HTTP 400" in rec.error


def test_stream_cut_after_first_token_is_an_error_not_a_retry():
    ep = FakeEndpoint()
    ep.script = [lambda b: ep.ok(b, cut_after=2)]
    d, router = make(ep)

    async def main():
        with router:
            return await play(d, [Arrival(0, 0.0, 10, 5)], act(), 1)

    [rep] = run_virtual(main())
    rec = rep.finished[0]
    assert rec.status == "error" and rec.attempts == 1 and "after 2 chunks" in rec.error
    assert len(rec.chunk_times_s) == 2 and rec.output_tokens == 2  # tiktoken count of " the the"
    assert rep.output_tokens == 2


def test_stream_cut_before_first_token_is_retried():
    ep = FakeEndpoint()
    ep.script = [lambda b: ep.ok(b, cut_after=0)]
    d, router = make(ep)

    async def main():
        with router:
            return await play(d, [Arrival(0, 0.0, 10, 2)], act(), 3)

    rec = finished(run_virtual(main()))[0]
    assert rec.status == "ok" and rec.attempts == 2


def test_request_timeout_and_read_timeout_end_in_timeout():
    ep = FakeEndpoint()
    def read_timeout(body):
        raise httpx.ReadTimeout("read timed out")

    ep.script = [lambda b: ep.ok(b, stall=100.0), read_timeout]
    d, router = make(ep, request_timeout_s=3.0)

    async def main():
        with router:
            return await play(d, [Arrival(0, 0.0, 10, 2), Arrival(1, 0.5, 10, 2)], act(), 5)

    recs = finished(run_virtual(main()))
    assert recs[0].status == "timeout" and recs[0].finish_s == pytest.approx(3.0, abs=1e-9)
    assert "LLMSERVE_REAL_REQUEST_TIMEOUT_S" in recs[0].error
    assert recs[1].status == "timeout" and recs[1].attempts == 1


def test_cancel_all_ends_everything_exactly_once():
    ep = FakeEndpoint(ttft=0.1, itl=1.0)
    d, router = make(ep)
    arrivals = [Arrival(i, 0.1 * i, 10, 50) for i in range(6)] + [Arrival(6, 1.5, 10, 5)]

    async def main():
        with router:
            reports = await play(d, arrivals, act(batch_cap=2), 1)
            # arrival 6 is scheduled (window 1 released it at 1.5) but the episode resets first
            window = [a for a in arrivals if a.arrival_s >= 1.0]
            task = asyncio.ensure_future(d.run_window(act(batch_cap=2), window, {6: "p"}, 1.0, 1.0))
            await asyncio.sleep(0.2)
            flush = await d.cancel_all("episode reset")
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return reports, flush

    reports, flush = run_virtual(main())
    recs = finished(reports, flush)
    assert sorted(recs) == list(range(7))
    assert {r.status for r in recs.values()} == {"cancelled"}
    assert sum(1 for r in recs.values() if r.dispatch_s is not None) == 2  # two were in flight
    assert d._running == set() and d._waiting == []


def test_per_step_cap_and_spend_guard_reject_with_clear_messages():
    ep = FakeEndpoint(ttft=0.01, itl=0.01)
    d, router = make(ep, max_requests_per_step=3, max_requests_per_episode=4)
    arrivals = [Arrival(i, 0.01 * i, 10, 2) for i in range(5)] + [Arrival(5 + i, 1.0 + 0.01 * i, 10, 2) for i in range(3)]

    async def main():
        with router:
            return await play(d, arrivals, act(), 2)

    reports = run_virtual(main())
    recs = finished(reports)
    assert [recs[i].status for i in range(5)] == ["ok", "ok", "ok", "rejected", "rejected"]
    assert "LLMSERVE_REAL_MAX_REQUESTS_PER_STEP=3" in recs[3].error
    assert [recs[i].status for i in (5, 6, 7)] == ["ok", "rejected", "rejected"]
    assert "spend limit" in recs[6].error and "4 requests" in recs[6].error
    assert "budget_exhausted" in reports[1].notes and reports[1].notes["rejected"] == 2


def test_quantization_tier_picks_the_model_at_admission():
    ep = FakeEndpoint(ttft=0.01, itl=0.01)
    d, router = make(ep)

    async def main():
        with router:
            return await play(d, [Arrival(0, 0.0, 10, 2), Arrival(1, 1.0, 10, 2)], act(), 2,
                              actions={1: act(quantization_tier="INT4")})

    reports = run_virtual(main())
    assert [b["model"] for b in ep.bodies] == ["m-fp16", "m-int4"]
    assert reports[1].quality == 0.8


def test_random_faults_every_request_in_exactly_one_terminal_state():
    rng = random.Random(7)
    ep = FakeEndpoint(ttft=0.05, itl=0.03)
    kinds = ["ok", "429", "500", "400", "cut", "cut0", "stall"]

    def pick(body):
        kind = rng.choice(kinds)
        if kind == "429":
            return httpx.Response(429, headers={"retry-after": "0.3"}, json={"error": {"message": "rl"}})
        if kind in ("500", "400"):
            return httpx.Response(int(kind), json={"error": {"message": kind}})
        if kind == "cut":
            return ep.ok(body, cut_after=1)
        if kind == "cut0":
            return ep.ok(body, cut_after=0)
        if kind == "stall":
            return ep.ok(body, stall=50.0)
        return ep.ok(body)

    ep.script = [pick] * 400
    d, router = make(ep, request_timeout_s=2.5, max_attempts=3)
    arrivals = [Arrival(i, rng.uniform(0, 4), rng.randint(5, 50), rng.randint(1, 8)) for i in range(60)]
    arrivals.sort(key=lambda a: a.arrival_s)
    arrivals = [Arrival(i, a.arrival_s, a.prompt_tokens, a.output_tokens) for i, a in enumerate(arrivals)]

    async def main():
        with router:
            reports = await play(d, arrivals, act(batch_cap=8), 16)
            return reports, await d.cancel_all("close")

    reports, flush = run_virtual(main())
    assert flush == []  # request_timeout_s bounds every request: all ended within the 16 windows
    recs = finished(reports)
    assert sorted(recs) == list(range(60))
    assert len({r.status for r in recs.values()}) >= 3
    for r in recs.values():
        assert r.finish_s is not None and r.finish_s >= r.arrival_s and 1 <= r.attempts <= 3
    # the windows' output tokens add up to the records'
    assert sum(rep.output_tokens for rep in reports) == sum(r.output_tokens for r in recs.values())
    assert CANARY not in json.dumps([r.error for r in recs.values()])


def test_an_abandoned_episode_stops_sending_at_once(tmp_path):
    """No step for LLMSERVE_REAL_ABANDON_S: the queued and in-flight requests end `cancelled` (recorded
    once each), nothing more is sent, and a client that comes back sees them in its next report."""
    ep = FakeEndpoint(ttft=0.1, itl=1.0)
    d, router = make(ep, abandon_s=5.0)
    d.recorder = JsonlRecorder(tmp_path / "rec.jsonl")
    arrivals = [Arrival(i, 0.1 * i, 10, 50) for i in range(6)]

    async def main():
        with router:
            [r0] = await play(d, arrivals, act(batch_cap=2), 1)
            sent_before = len(ep.bodies)
            await asyncio.sleep(5.5)  # the client went away after its first step
            sent_after = len(ep.bodies)
            assert ep.active == 0 and d._running == set() and d._waiting == []
            await asyncio.sleep(30.0)
            assert len(ep.bodies) == sent_after  # nothing sent while abandoned
            [r1] = await play(d, [], act(batch_cap=2), 1, dt=1.0)
            return r0, r1, sent_before, sent_after

    r0, r1, sent_before, sent_after = run_virtual(main())
    d.recorder.close()
    assert sent_before == sent_after == 2
    assert r0.finished == [] and len(r0.pending) == 6
    assert sorted(r.request_id for r in r1.finished) == list(range(6))
    assert {r.status for r in r1.finished} == {"cancelled"} and all("abandoned" in r.error for r in r1.finished)
    assert r1.notes["abandoned_cancelled"] == 6 and r1.notes["cancelled"] == 6
    rows = read_records(tmp_path / "rec.jsonl")
    assert sorted(r["request_id"] for r in rows) == list(range(6)) and {r["status"] for r in rows} == {"cancelled"}
    # the cancellation happened 5 s after the window ended (1.0), on the episode clock
    assert all(r["finish_s"] == pytest.approx(6.0, abs=1e-6) for r in rows)


def test_windows_stay_aligned_to_their_boundaries_when_steps_come_late():
    """The caller takes 11 ms between steps (issue 16 item 9 measured ~11 ms/step of drift, 690 ms by step
    63): every window still starts at k * dt on the episode clock, the late part shows as lateness."""
    ep = FakeEndpoint(ttft=0.01, itl=0.01)
    d, router = make(ep)
    steps = 64
    arrivals = [Arrival(2 * k, k * 1.0, 10, 2) for k in range(steps)] + \
        [Arrival(2 * k + 1, k * 1.0 + 0.5, 10, 2) for k in range(steps)]
    arrivals.sort(key=lambda a: a.request_id)

    async def main():
        out = []
        with router:
            for k in range(steps):
                window = [a for a in arrivals if k <= a.arrival_s < k + 1]
                prompts = {a.request_id: "p" for a in window}
                out.append(await d.run_window(act(), window, prompts, float(k), 1.0))
                await asyncio.sleep(0.011)  # the agent and the HTTP round trip
        return out

    reports = run_virtual(main())
    recs = finished(reports)
    # mid-window arrivals are sent exactly on time, step 63 included (loop time 0 = episode time 0)
    assert sorted(ep.dispatch_times)[1::2] == pytest.approx([k + 0.5 for k in range(steps)], abs=1e-9)
    for k in range(steps):
        assert recs[2 * k + 1].dispatch_s == pytest.approx(k + 0.5, abs=1e-9)
        if k:  # the arrival at the boundary waited for the late step: 11 ms, every step, not 11 ms * k
            assert recs[2 * k].dispatch_s - recs[2 * k].arrival_s == pytest.approx(0.011, abs=1e-9)
            assert reports[k].notes["window_late_ms"] == pytest.approx(11.0, abs=1e-6)


def test_a_server_that_ignores_the_model_name_is_reported():
    """Issue 16 item 6: the response's `model` is compared with the request's; on a one-model server the
    quantization tier is not reported as applied."""
    ep = FakeEndpoint(ttft=0.01, itl=0.01, served="smollm2-135m")
    d, router = make(ep)

    async def main():
        with router:
            return await play(d, [Arrival(0, 0.0, 10, 2), Arrival(1, 1.0, 10, 2)], act(), 2,
                              actions={1: act(quantization_tier="INT4")})

    r0, r1 = run_virtual(main())
    assert r0.applied["quantization_tier"] is False and r1.applied["quantization_tier"] is False
    assert r0.notes["model_mismatches"] == 1 and r0.notes["served_model"] == "smollm2-135m"
    assert r0.notes["model_mismatch"] == "requested 'm-fp16', the server answered as 'smollm2-135m'"
    assert r1.notes["model_mismatches"] == 1

    honest = FakeEndpoint(ttft=0.01, itl=0.01)
    d2, router2 = make(honest)

    async def main2():
        with router2:
            return await play(d2, [Arrival(0, 0.0, 10, 2)], act(), 1)

    [ok] = run_virtual(main2())
    assert ok.applied["quantization_tier"] is True and ok.notes["model_mismatches"] == 0
    assert "model_mismatch" not in ok.notes


def test_same_model_accepts_dated_snapshots_only():
    assert same_model("gpt-4.1", "gpt-4.1") and same_model("gpt-4.1", "gpt-4.1-2025-04-14")
    assert same_model("gpt-4.1", None)  # a server that does not say
    assert not same_model("gpt-4.1", "gpt-4.1-mini") and not same_model("gpt-4.1", "gpt-4.1-mini-2025-04-14")
    assert not same_model("m-fp16", "smollm2-135m")


def test_server_wide_inflight_cap_spans_episodes():
    """LLMSERVE_REAL_MAX_INFLIGHT_TOTAL: two episodes with batch_cap 4 each share a process cap of 3."""
    ep = FakeEndpoint(ttft=0.05, itl=0.05)
    process = ProcessGuard(max_usd=100.0, max_inflight=3)
    config = GatewayConfig(api_key=Secret(CANARY), base_url=BASE, client="sdk")
    router = respx.mock(base_url=BASE, assert_all_called=False)
    router.post("/chat/completions").mock(side_effect=ep)

    def dispatcher() -> Dispatcher:
        sdk = openai.AsyncOpenAI(api_key=CANARY, base_url=BASE, max_retries=0, http_client=httpx.AsyncClient())
        return Dispatcher(config, SdkStreamClient(sdk, 30.0), TIERS, count_tokens, lag_monitor=False, process=process)

    a, b = dispatcher(), dispatcher()

    async def main():
        with router:
            arrivals = [Arrival(i, 0.0, 10, 2) for i in range(4)]
            return await asyncio.gather(play(a, arrivals, act(batch_cap=4), 1), play(b, arrivals, act(batch_cap=4), 1))

    ra, rb = run_virtual(main())
    assert ep.peak == 3 and process.inflight == 0
    done = finished(ra)
    assert len(done) == 4 and {r.status for r in done.values()} == {"ok"}
    assert len(finished(rb)) == 4
    assert ra[0].notes.get("server_inflight_capped") or rb[0].notes.get("server_inflight_capped")


def test_server_wide_spend_cap_rejects_with_its_name():
    ep = FakeEndpoint(ttft=0.01, itl=0.01)
    # each request reserves (10 * 1.0 + 2 * 2.0) / 1e6 = 1.4e-5 $; the process allows two
    process = ProcessGuard(max_usd=3e-5, max_inflight=100)
    d, router = make(ep)
    d._process = process

    async def main():
        with router:
            return await play(d, [Arrival(i, 0.1 * i, 10, 2) for i in range(4)], act(), 1)

    [rep] = run_virtual(main())
    recs = finished([rep])
    assert [recs[i].status for i in range(4)] == ["ok", "ok", "rejected", "rejected"]
    assert "LLMSERVE_REAL_MAX_USD_TOTAL" in recs[2].error
    assert "whole server" in rep.notes["budget_exhausted"]


def test_notes_count_errors_and_timeouts_and_flag_empty_windows():
    ep = FakeEndpoint(ttft=0.05, itl=0.02)
    ep.script = [lambda b: httpx.Response(400, json={"error": {"message": "bad"}}), lambda b: ep.ok(b, stall=100.0)]
    d, router = make(ep, request_timeout_s=0.5, max_prompt_tokens=100)

    async def main():
        with router:
            return await play(d, [Arrival(0, 0.0, 10, 2), Arrival(1, 0.1, 500, 2)], act(), 2)

    r0, r1 = run_virtual(main())
    assert (r0.notes["errors"], r0.notes["timeouts"]) == (1, 1)
    assert r0.notes["ttft_samples"] == 0  # the 0.0 TTFT the metrics report for it is no measurement
    assert r0.notes["mean_prompt_tokens_sent"] == 55.0  # 10 and 500 cut to 100
    assert (r1.notes["errors"], r1.notes["timeouts"], r1.notes["ttft_samples"]) == (0, 0, 0)
    assert r1.notes["mean_prompt_tokens_sent"] is None  # nothing arrived


def test_a_request_cancelled_before_its_task_ran_is_still_recorded(tmp_path):
    """Admitted and cancelled in the same loop turn (a reset or shutdown right after a release): its task
    never starts, so its own handler never runs; cancel_all ends it (issue 20 item 5: no request unrecorded)."""
    ep = FakeEndpoint()
    d, router = make(ep)
    d.recorder = JsonlRecorder(tmp_path / "rec.jsonl")

    async def main():
        with router:
            d._set_action(act())
            d._release(Arrival(0, 0.0, 10, 2), "p", asyncio.get_running_loop().time(), False, 0)
            assert len(d._running) == 1  # admitted, its task not started
            return await d.cancel_all("episode reset")

    flush = run_virtual(main())
    d.recorder.close()
    assert [(r.request_id, r.status) for r in flush] == [(0, "cancelled")]
    assert "before it was sent" in flush[0].error and ep.bodies == []
    assert [r["status"] for r in read_records(tmp_path / "rec.jsonl")] == ["cancelled"]
    assert d._process.inflight == 0
