"""Real mode's process-wide service: one loop for every episode, shutdown, start-up checks, /health.

Against the offline stand-in on 127.0.0.1 (in a thread: nothing here asserts timings) and respx.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import respx
from llmserve_env.gateway import service as gateway_service
from llmserve_env.gateway.backend import GatewayBackend
from llmserve_env.gateway.config import GatewayConfig, GatewayConfigError, Secret
from llmserve_env.gateway.pricing import TierPrice, TierTable
from llmserve_env.gateway.recorder import read_records
from llmserve_env.gateway.service import GatewayClosedError, GatewayService
from llmserve_env.gateway.startup import check_real_mode
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import ServeAction
from llmserve_env.sim.standin.app import StandinConfig
from llmserve_env.tools.standin_harness import BackgroundStandin

PROFILE = "h100-llama3.1-8b"
CANARY = "sk-canary-service-77aa66bb55cc"
TIERS = TierTable({t: TierPrice(f"{PROFILE}-{t.lower()}", 0.0, 0.0, 1.0) for t in ("FP16", "INT8", "INT4")}, "test")
DT = 0.25


def act(**kw) -> ServeAction:
    base = dict(batch_cap=8, kv_budget_fraction=1.0, speculation_depth=0, quantization_tier="FP16",
                prefill_decode_split=False, priority_routing=False)
    base.update(kw)
    return ServeAction(**base)


@pytest.fixture(scope="module")
def standin():
    with BackgroundStandin(StandinConfig(profile=PROFILE)) as s:
        yield s


def config(base_url: str, **kw) -> GatewayConfig:
    return GatewayConfig(api_key=Secret(CANARY), base_url=base_url, **kw)


def test_idle_episodes_hold_no_thread_and_no_timer_work(standin):
    """Issue 20 item 2: 200 idle real-mode episodes = one gateway thread, and the lag monitor is off."""
    service = GatewayService()
    before = threading.active_count()
    backends = [GatewayBackend(config(standin.base_url), tiers=TIERS, service=service) for _ in range(200)]
    try:
        for b in backends:
            b.reset(0)
        backends[0].run_window(act(), [Arrival(0, 0.0, 16, 2)], 0.0, DT)
        assert threading.active_count() == before + 1  # the one loop thread, whatever the count
        assert len(service.dispatchers) == 200
        deadline = time.monotonic() + 5
        while service.lag.running and time.monotonic() < deadline:  # the one request finishes, then idle
            time.sleep(0.05)
        assert not service.lag.running
        assert len(service._clients) == 1  # one connection pool for all of them
    finally:
        for b in backends:
            b.close()
        service.shutdown()
    assert threading.active_count() == before and not service.dispatchers


def test_shutdown_cancels_records_and_flushes_every_request(standin, tmp_path):
    """Issue 20 item 5: on shutdown every queued and in-flight request of every episode ends `cancelled`
    and is in the record file, once."""
    service = GatewayService()
    record = tmp_path / "rec.jsonl"
    backends = [GatewayBackend(config(standin.base_url, record_path=str(record)), tiers=TIERS, service=service)
                for _ in range(3)]
    for i, b in enumerate(backends):
        b.reset(i)
        # 400 decode steps each: seconds; batch_cap 2 leaves some queued
        b.run_window(act(batch_cap=2), [Arrival(j, 0.01 * j, 32, 400) for j in range(4)], 0.0, DT)
    assert service.shutdown() == 12
    rows = read_records(record)
    assert len(rows) == 12 and {r["status"] for r in rows} == {"cancelled"}
    assert all("server shutting down" in r["error"] for r in rows)
    by_episode = {}
    for r in rows:
        by_episode.setdefault(r["episode_id"], []).append(r["request_id"])
    assert sorted(by_episode) == sorted(b.episode_id for b in backends)
    assert all(sorted(ids) == [0, 1, 2, 3] for ids in by_episode.values())
    with pytest.raises(GatewayClosedError):
        backends[0].run_window(act(), [], DT, DT)
    for b in backends:
        b.close()  # after shutdown: nothing left to do, no error


def test_two_episodes_in_one_record_file_stay_apart(standin, tmp_path):
    """Issue 16 item 5: records carry the episode id and the step each request arrived in."""
    record = tmp_path / "two.jsonl"
    ids = []
    for seed in (0, 0):  # the same seed twice: only the id tells them apart
        b = GatewayBackend(config(standin.base_url, record_path=str(record)), tiers=TIERS)
        b.reset(seed)
        ids.append(b.episode_id)
        for k in range(2):
            b.run_window(act(), [Arrival(k, k * DT + 0.01, 16, 2)], k * DT, DT)
        b.run_window(act(), [], 2 * DT, DT)
        b.close()
    rows = read_records(record)
    assert ids[0] != ids[1] and len(rows) == 4
    assert sorted((r["episode_id"], r["step"], r["request_id"]) for r in rows) == sorted(
        (i, k, k) for i in ids for k in (0, 1))
    assert all(r["served_model"] == f"{PROFILE}-fp16" for r in rows)
    given = GatewayBackend(config(standin.base_url), tiers=TIERS)
    given.reset(0, episode_id="ep-from-the-server")
    assert given.episode_id == "ep-from-the-server"
    given.close()


def prompts_sent(reuse: bool, seed: int) -> list[str]:
    bodies: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        data = (b'data: {"id":"c","model":"%s","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}'
                b"\n\ndata: [DONE]\n\n" % body["model"].encode())
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=data)

    base = "http://fake.test/v1"
    with respx.mock(base_url=base, assert_all_called=False) as router:
        router.post("/chat/completions").mock(side_effect=answer)
        b = GatewayBackend(config(base, client="sdk", reuse_prompts=reuse), tiers=TIERS,
                           http_client=httpx.AsyncClient())
        b.reset(seed)
        b.run_window(act(), [Arrival(i, 0.0, 40, 1) for i in range(3)], 0.0, DT)
        b.close()
    return [body["messages"][0]["content"] for body in sorted(bodies, key=lambda x: x["messages"][0]["content"])]


def test_prompts_differ_per_run_unless_prefix_reuse_is_asked_for():
    """Issue 16 item 4: the same seed twice must not send byte-identical prompts (a server's prefix cache
    would make the second run fast for no reason of the policy's); LLMSERVE_REAL_REUSE_PROMPTS=1 does."""
    first, second = prompts_sent(False, 5), prompts_sent(False, 5)
    assert len(first) == 3 and not set(first) & set(second)
    assert prompts_sent(True, 5) == prompts_sent(True, 5)
    assert GatewayConfig.from_env({"OPENAI_API_KEY": CANARY, "LLMSERVE_REAL_REUSE_PROMPTS": "1"}).reuse_prompts


def test_start_up_probe_refuses_a_dead_endpoint_a_refused_key_and_unserved_models(standin):
    """Issue 16 item 8: a dead endpoint fails at start-up, with what to fix."""
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "LLMSERVE_REAL_PROBE_TIMEOUT_S": "2"}
    with pytest.raises(GatewayConfigError, match="unreachable.*LLMSERVE_REAL_PROBE=0"):
        check_real_mode([1.0], env, service=GatewayService())
    assert check_real_mode([1.0], env | {"LLMSERVE_REAL_PROBE": "0"}).probe is False
    with BackgroundStandin(StandinConfig(profile=PROFILE, api_key="the-right-key")) as guarded:
        with pytest.raises(GatewayConfigError, match="refused the key") as ei:
            check_real_mode([1.0], {"OPENAI_BASE_URL": guarded.base_url, "OPENAI_API_KEY": CANARY},
                            service=GatewayService())
        assert CANARY not in str(ei.value)
    # the default tier table names gpt-4.1 models the stand-in does not serve
    with pytest.raises(GatewayConfigError, match="does not serve gpt-4.1.*LLMSERVE_REAL_MODEL"):
        check_real_mode([1.0], {"OPENAI_BASE_URL": standin.base_url}, service=GatewayService())
    ok = check_real_mode([1.0], {"OPENAI_BASE_URL": standin.base_url, "LLMSERVE_REAL_MODEL": PROFILE},
                         service=GatewayService())
    assert ok.model == PROFILE
    # issue 16 item 7: a step timeout that does not fit the longest window
    with pytest.raises(GatewayConfigError, match="LLMSERVE_REAL_STEP_TIMEOUT_S=0.2 must exceed the window length"):
        check_real_mode([1.0, 2.0], {"OPENAI_BASE_URL": standin.base_url, "LLMSERVE_REAL_MODEL": PROFILE,
                                     "LLMSERVE_REAL_STEP_TIMEOUT_S": "0.2"})


def test_health_says_when_the_endpoint_is_unreachable():
    service = GatewayService()
    assert service.endpoint_health() is None  # not real mode
    with BackgroundStandin(StandinConfig(profile=PROFILE)) as s:
        check_real_mode([1.0], {"OPENAI_BASE_URL": s.base_url, "LLMSERVE_REAL_MODEL": PROFILE}, service=service)
        up = service.endpoint_health()
        assert up is not None and up["reachable"] is True and up["endpoint"] == s.base_url
        assert PROFILE in up["probe"]["models"]
    down = service.endpoint_health(max_age_s=0.0)
    assert down is not None and down["reachable"] is False and "ConnectError" in down["probe"]["error"]


def test_one_model_server_is_caught_end_to_end():
    """A server answering every name with its one model (llama-server): the notes say so."""
    with BackgroundStandin(StandinConfig(profile=PROFILE, served_model="smollm2-135m")) as s:
        b = GatewayBackend(config(s.base_url), tiers=TIERS)
        b.reset(0)
        [rep] = [b.run_window(act(), [Arrival(0, 0.0, 16, 2)], 0.0, DT)]
        rep2 = b.run_window(act(), [], DT, DT)
        b.close()
    notes = rep.notes if rep.notes["model_mismatches"] else rep2.notes
    assert notes["model_mismatches"] == 1 and "smollm2-135m" in notes["model_mismatch"]
    assert rep2.applied["quantization_tier"] is False


def test_the_server_wires_health_shutdown_and_what_was_sent(monkeypatch, tmp_path):
    """Through the HTTP app: /health names the endpoint and answers 503 once it is gone; the observation's
    mean_prompt_length is the capped length that was sent; the app's shutdown records what was in flight."""
    from fastapi.testclient import TestClient
    from llmserve_env.server.app import build_app
    from llmserve_env.server.config import ServerSettings

    record = tmp_path / "rec.jsonl"
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{0.05 * i:.2f},{40 + 4 * i},{300}\n" for i in range(10)))
    action = {"batch_cap": 4, "kv_budget_fraction": 0.5, "speculation_depth": 0, "quantization_tier": "FP16",
              "prefill_decode_split": False, "priority_routing": False}
    with BackgroundStandin(StandinConfig(profile=PROFILE)) as s:
        for k, v in {"OPENAI_BASE_URL": s.base_url, "LLMSERVE_REAL_MODEL": PROFILE,
                     "LLMSERVE_REAL_MAX_PROMPT_TOKENS": "50", "LLMSERVE_REAL_RECORD": str(record)}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        with TestClient(build_app(ServerSettings(mode="real"))) as client:
            health = client.get("/health")
            assert health.status_code == 200 and health.json()["real_endpoint"]["reachable"] is True
            reset = client.post("/reset", json={"task_id": f"trace:{trace}?horizon=3&window_s=0.5", "seed": 0}).json()
            obs = client.post("/step", json={"action": action, "episode_id": reset["observation"]["episode_id"]}
                              ).json()["observation"]
            # prompts 40, 44, ..., 76 tokens, cut to 50: (40 + 44 + 48 + 7 * 50) / 10
            assert obs["mean_prompt_length"] == pytest.approx(48.2)
            assert obs["metadata"]["backend_notes"]["mean_prompt_tokens_sent"] == pytest.approx(48.2)
            s.__exit__()  # the endpoint goes away
            monkeypatch.setattr(gateway_service, "PROBE_MAX_AGE_S", 0.0)  # no cached probe
            gone = client.get("/health")
            assert gone.status_code == 503 and gone.json()["status"] == "unhealthy"
    rows = read_records(record)  # the app's shutdown cancelled and recorded the 300-token requests in flight
    assert sorted(r["request_id"] for r in rows) == list(range(10))
    assert {r["episode_id"] for r in rows} == {reset["observation"]["episode_id"]}


def test_sigterm_records_every_request_in_flight(tmp_path):
    """Issue 20 item 5, as an operator sees it: `uvicorn` in real mode gets SIGTERM while requests are in
    flight; every released request is in the record file, the in-flight ones `cancelled`."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    record = tmp_path / "rec.jsonl"
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{0.02 * i:.2f},{40 + i},{2000}\n" for i in range(12)))
    with BackgroundStandin(StandinConfig(profile=PROFILE)) as s:
        env = {**os.environ, "LLMSERVE_MODE": "real", "OPENAI_BASE_URL": s.base_url, "LLMSERVE_REAL_MODEL": PROFILE,
               "LLMSERVE_REAL_RECORD": str(record), "LLMSERVE_REAL_MAX_COMPLETION_TOKENS": "2000"}
        env.pop("OPENAI_API_KEY", None)
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "llmserve_env.server.app:app", "--port", str(port),
                                 "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(base + "/health", timeout=1.0).raise_for_status()
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
                    time.sleep(0.2)
            # generous timeouts: the trace parses in a child process, slow on a loaded 2-core machine
            ep = httpx.post(base + "/reset", json={"task_id": f"trace:{trace}?horizon=2&window_s=0.5"},
                            timeout=60).json()["observation"]["episode_id"]
            obs = httpx.post(base + "/step", timeout=60, json={"episode_id": ep, "action": {
                "batch_cap": 8, "kv_budget_fraction": 1.0, "speculation_depth": 0, "quantization_tier": "FP16",
                "prefill_decode_split": False, "priority_routing": False}}).json()["observation"]
            assert obs["active_requests"] + obs["queue_depth"] == 12  # 2000-token answers: all still there
            proc.send_signal(signal.SIGTERM)
            # uvicorn shuts down gracefully, then re-raises the signal it caught (exit status -15)
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    rows = read_records(record)
    assert sorted(r["request_id"] for r in rows) == list(range(12))
    # every request once, in a terminal state: the ones still running or queued at SIGTERM cancelled (on
    # a quiet machine a request may finish before the signal lands: then it is 'ok', never missing)
    statuses = {r["status"] for r in rows}
    assert "cancelled" in statuses and statuses <= {"cancelled", "ok"}, statuses
    assert {r["episode_id"] for r in rows} == {ep}
    assert sum(r["dispatch_s"] is not None for r in rows) >= 8  # batch_cap 8 were in flight at once
