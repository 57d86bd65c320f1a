"""GatewayBackend end to end against the offline stand-in on 127.0.0.1: windows, reset, close, faults, secrecy."""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass

import httpx
import pytest
from llmserve_env.gateway.backend import GatewayBackend, GatewayStepTimeout
from llmserve_env.gateway.config import GatewayConfig, GatewayConfigError, Secret
from llmserve_env.gateway.pricing import TierPrice, TierTable
from llmserve_env.gateway.recorder import read_records
from llmserve_env.shared.backend import TERMINAL_STATUSES, Arrival, Backend, RequestRecord, WindowReport
from llmserve_env.shared.models import ServeAction
from llmserve_env.sim.standin.app import StandinConfig
from llmserve_env.tools.launch import ServerProcess
from llmserve_env.tools.standin_harness import BackgroundStandin

PROFILE = "h100-llama3.1-8b"
CANARY = "sk-canary-backend-9d8c7b6a5f4e3d2c1b0a"
DT = 0.25
TIERS = TierTable({t: TierPrice(f"{PROFILE}-{t.lower()}", 0.15, 0.60, q) for t, q in
                   (("FP16", 1.0), ("INT8", 0.97), ("INT4", 0.89))}, "test")


def act(**kw) -> ServeAction:
    base = dict(batch_cap=32, kv_budget_fraction=0.5, speculation_depth=2, quantization_tier="FP16",
                prefill_decode_split=False, priority_routing=True)
    base.update(kw)
    return ServeAction(**base)


@dataclass
class StandinProcess:
    base_url: str


@pytest.fixture(scope="module")
def standin():
    """The stand-in as its own process, through its command line: in a thread of this process it
    would share the GIL with the gateway's loop, and the timings would show it."""
    argv = [sys.executable, "-m", "llmserve_env.tools.standin", "--port", "{port}", "--profile", PROFILE,
            "--log-level", "warning"]
    with ServerProcess(argv, health_path="/v1/models", start_timeout_s=60) as proc:
        yield StandinProcess(proc.url + "/v1")


def backend(standin, client: str = "raw", **cfg) -> GatewayBackend:
    config = GatewayConfig(api_key=Secret(CANARY), base_url=standin.base_url, client=client, **cfg)
    return GatewayBackend(config, tiers=TIERS)


def play(b: GatewayBackend, arrivals: list[Arrival], windows: int, action: ServeAction) -> list[WindowReport]:
    out = []
    for k in range(windows):
        window = [a for a in arrivals if k * DT <= a.arrival_s < (k + 1) * DT]
        out.append(b.run_window(action, window, k * DT, DT))
    return out


def once_each(reports: list[WindowReport], extra: list[RequestRecord] = ()) -> dict[int, RequestRecord]:
    seen: dict[int, RequestRecord] = {}
    for r in [r for rep in reports for r in rep.finished] + list(extra):
        assert r.request_id not in seen and r.status in TERMINAL_STATUSES
        seen[r.request_id] = r
    return seen


def test_multi_window_episode_measures_every_request(standin, tmp_path):
    record = tmp_path / "real.jsonl"
    b = backend(standin, record_path=str(record))
    assert isinstance(b, Backend) and b.name == "real"
    arrivals = [Arrival(i, 0.03 * i, 64 + 8 * i, 6, tenant="chat" if i % 2 else "batch", priority=i % 2)
                for i in range(20)]
    b.reset(3)
    started = time.monotonic()
    reports = play(b, arrivals, 6, act())
    elapsed = time.monotonic() - started
    b.close()
    assert 6 * DT <= elapsed < 6 * DT + 1.0  # each window lasts dt of wall clock
    recs = once_each(reports, b.last_flush)
    assert sorted(recs) == list(range(20)) and {r.status for r in recs.values()} == {"ok"}
    for r in recs.values():
        assert r.arrival_s <= r.dispatch_s < r.first_token_s <= r.finish_s
        assert r.output_tokens == 6 and len(r.chunk_times_s) == 6 and r.attempts == 1
        assert r.chunk_times_s == sorted(r.chunk_times_s) and r.chunk_times_s[-1] <= r.finish_s
        assert r.cost_usd > 0
    ttfts = [t for rep in reports for _, _, t in rep.first_tokens]
    assert len(ttfts) == 20 and all(0 < t < 1.0 for t in ttfts)
    assert sum(rep.output_tokens for rep in reports) == 120
    assert sum(len(rep.itl_samples) for rep in reports) == 100
    assert sum(rep.prompt_tokens for rep in reports) == sum(a.prompt_tokens for a in arrivals)
    first = reports[0]
    assert first.applied == {"batch_cap": True, "kv_budget_fraction": True, "priority_routing": True,
                             "prefill_decode_split": True, "quantization_tier": True, "speculation_depth": False}
    assert 0.0 <= first.kv_occupancy <= 1.0 and first.gpu_memory_used_gb == 0.0
    assert {"loop_lag_p99_ms", "client_bottleneck", "retries", "in_flight"} <= set(first.notes)
    rows = read_records(record)
    assert sorted(r["request_id"] for r in rows) == list(range(20))
    assert all(r["model"] == f"{PROFILE}-fp16" and r["attempt_log"][0]["outcome"] == "ok" for r in rows)


def test_sdk_client_runs_the_same_episode(standin):
    b = backend(standin, client="sdk")
    b.reset(0)
    reports = play(b, [Arrival(i, 0.05 * i, 32, 4) for i in range(4)], 3, act(quantization_tier="INT4"))
    b.close()
    recs = once_each(reports, b.last_flush)
    assert {r.status for r in recs.values()} == {"ok"} and all(r.output_tokens == 4 for r in recs.values())
    assert reports[0].quality == 0.89


def test_reset_and_close_cancel_what_is_in_flight(standin):
    b = backend(standin)
    b.reset(0)
    long = [Arrival(i, 0.01 * i, 32, 400) for i in range(3)]  # 400 decode steps: seconds
    [rep] = play(b, long, 1, act(batch_cap=2))
    assert rep.finished == [] and {p.status for p in rep.pending} == {"running", "queued"}
    b.reset(1)
    cancelled = b.last_flush
    assert sorted(r.request_id for r in cancelled) == [0, 1, 2]
    assert {r.status for r in cancelled} == {"cancelled"}
    assert sum(r.dispatch_s is not None for r in cancelled) == 2
    # the new episode starts clean, and close cancels again
    [rep] = play(b, [Arrival(0, 0.0, 32, 400)], 1, act())
    assert rep.finished == [] and [p.request_id for p in rep.pending] == [0]
    b.close()
    assert [(r.request_id, r.status) for r in b.last_flush] == [(0, "cancelled")]
    b.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        b.run_window(act(), [], 0.0, DT)


def test_retries_and_faults_through_the_stand_in(standin):
    httpx.post(standin.base_url + "/standin/faults",
               json={"script": ["429", "ok", "500", "drop", "stall"], "retry_after_s": 0.2, "drop_after": 2,
                     "stall_s": 1.5}).raise_for_status()
    b = backend(standin, stall_timeout_s=0.4, max_attempts=2, backoff_base_s=0.05)
    b.reset(0)
    # one at a time, so the script's faults land on known requests
    arrivals = [Arrival(0, 0.0, 16, 4), Arrival(1, 0.01, 16, 4), Arrival(2, 0.02, 16, 4), Arrival(3, 0.03, 16, 4)]
    reports = play(b, arrivals, 10, act(batch_cap=1))
    b.close()
    recs = once_each(reports, b.last_flush)
    assert recs[0].status == "ok" and recs[0].attempts == 2  # 429, waited Retry-After, then ok
    assert recs[0].dispatch_s == pytest.approx(0.0, abs=0.05)
    assert recs[0].first_token_s - recs[0].dispatch_s >= 0.2
    # 500, back-off, then a stream cut after 2 chunks: an error, never retried (no double answer)
    assert recs[1].status == "error" and recs[1].attempts == 2 and "after 2 chunks" in recs[1].error
    assert recs[1].output_tokens == 2
    # silence longer than the stall timeout after the first chunk
    assert recs[2].status == "timeout" and len(recs[2].chunk_times_s) == 1
    assert recs[3].status == "ok" and recs[3].attempts == 1
    assert sum(rep.notes["retries"] for rep in reports) == 2


def test_the_key_appears_nowhere(standin, caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    record = tmp_path / "rec.jsonl"
    with BackgroundStandin(StandinConfig(profile=PROFILE, api_key="the-right-key")) as guarded:
        b = backend(guarded, record_path=str(record))
        b.reset(0)
        reports = play(b, [Arrival(0, 0.0, 16, 3), Arrival(1, 0.1, 16, 3)], 2, act())
        b.close()
    recs = once_each(reports, b.last_flush)
    assert {r.status for r in recs.values()} == {"error"}
    assert all("HTTP 401" in r.error and "***" in r.error for r in recs.values())  # the server echoed it
    texts = [caplog.text, repr(b), repr(b.config), str(reports), record.read_text(),
             json.dumps([r.notes for r in reports], default=str)]
    for t in texts:
        assert CANARY not in t


def test_step_never_blocks_past_the_step_timeout(standin):
    b = backend(standin, step_timeout_s=0.5)
    b.reset(0)

    async def hog():  # the gateway loop stuck (an overloaded client machine)
        time.sleep(1.0)

    try:
        t = time.monotonic()
        b._service.submit(hog())
        with pytest.raises(GatewayStepTimeout, match="LLMSERVE_REAL_STEP_TIMEOUT_S=0.5"):
            b.run_window(act(), [Arrival(0, 0.0, 16, 3)], 0.0, 0.2)
        assert time.monotonic() - t < 0.5 + 0.1
    finally:
        time.sleep(0.6)
        b.close()


def test_a_step_timeout_below_the_window_is_refused(standin):
    """A step shorter than its window would end it early and squeeze the traffic (issue 16, item 7)."""
    b = backend(standin, step_timeout_s=0.3)
    b.reset(0)
    try:
        with pytest.raises(GatewayConfigError, match="LLMSERVE_REAL_STEP_TIMEOUT_S=0.3 must exceed the window"):
            b.run_window(act(), [Arrival(0, 0.0, 16, 3)], 0.0, 1.0)
    finally:
        b.close()
    with pytest.raises(GatewayConfigError, match="window length"):
        GatewayConfig(api_key=Secret("k"), step_timeout_s=1.0).check_window(1.0)
    GatewayConfig(api_key=Secret("k"), step_timeout_s=1.5).check_window(1.0)


def test_from_env_fails_clearly_without_an_endpoint():
    with pytest.raises(GatewayConfigError, match="OPENAI_API_KEY"):
        GatewayBackend.from_env({})


def test_from_env_against_the_stand_in(standin):
    b = GatewayBackend.from_env({"OPENAI_BASE_URL": standin.base_url, "LLMSERVE_REAL_MODEL": PROFILE})
    try:
        b.reset(0)
        reports = play(b, [Arrival(0, 0.0, 16, 3)], 2, act())
        recs = once_each(reports)
        assert recs[0].status == "ok"
        assert reports[0].applied["quantization_tier"] is False  # one pinned model for every tier
        assert reports[0].notes["price_known"] is False
    finally:
        b.close()


def test_real_mode_episode_through_the_http_api(standin, monkeypatch, tmp_path):
    from fastapi.testclient import TestClient
    from llmserve_env.server.app import build_app
    from llmserve_env.server.config import ServerSettings

    monkeypatch.setenv("OPENAI_BASE_URL", standin.base_url)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("LLMSERVE_REAL_MODEL", PROFILE)
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{0.1 * i:.2f},{40 + i},{8}\n" for i in range(20)))
    task = f"trace:{trace}?horizon=4&window_s=0.5"
    action = {"batch_cap": 16, "kv_budget_fraction": 0.5, "speculation_depth": 0, "quantization_tier": "FP16",
              "prefill_decode_split": False, "priority_routing": False}
    with TestClient(build_app(ServerSettings(mode="real"))) as client:
        reset = client.post("/reset", json={"task_id": task, "seed": 0}).json()
        episode = reset["observation"]["episode_id"]
        assert reset["observation"]["metadata"]["mode"] == "real"
        observations = []
        for _ in range(4):
            step = client.post("/step", json={"action": action, "episode_id": episode}).json()
            observations.append(step["observation"])
        assert step["done"] is True
    # every window has arrivals; the stand-in's decode step for this load is ~7-9 ms
    assert all(o["p50_ttft_ms"] > 0 and o["p50_itl_ms"] > 0 and o["throughput_tps"] > 0 for o in observations)
    notes = observations[0]["metadata"]["backend_notes"]
    assert notes["backend"] == "real" and "loop_lag_p99_ms" in notes
    assert observations[0]["metadata"]["applied"]["speculation_depth"] is False
