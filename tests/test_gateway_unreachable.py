"""Issue 29 item 2: real mode never returns a made-up window.

A stand-in is killed under a running episode: the step that could reach nothing answers 503 naming the
endpoint (the episode kept at its step), /health says so at once, and once the endpoint is back the
same step is served whole. Against the offline stand-in on 127.0.0.1; nothing here asserts timings.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from llmserve_env.gateway.backend import GatewayBackend
from llmserve_env.gateway.config import GatewayConfig, Secret
from llmserve_env.gateway.pricing import TierPrice, TierTable
from llmserve_env.gateway.recorder import read_records
from llmserve_env.shared.backend import Arrival, BackendUnavailableError
from llmserve_env.shared.models import ServeAction
from llmserve_env.sim.calibration.record_fit import read_rows
from llmserve_env.sim.standin.app import StandinConfig
from llmserve_env.tools.standin_harness import BackgroundStandin

PROFILE = "h100-llama3.1-8b"
TIERS = TierTable({t: TierPrice(f"{PROFILE}-{t.lower()}", 0.0, 0.0, 1.0) for t in ("FP16", "INT8", "INT4")}, "test")
DT = 0.4
ACTION = dict(batch_cap=8, kv_budget_fraction=1.0, speculation_depth=0, quantization_tier="FP16",
              prefill_decode_split=False, priority_routing=False)


def arrivals(k: int, n: int = 3) -> list[Arrival]:
    return [Arrival(10 * k + i, k * DT + 0.02 * i, 16, 2) for i in range(n)]


def test_a_window_that_reached_nothing_is_refused_and_served_again_once_the_endpoint_is_back(tmp_path):
    record = tmp_path / "rec.jsonl"
    s = BackgroundStandin(StandinConfig(profile=PROFILE)).__enter__()
    b = GatewayBackend(GatewayConfig(api_key=Secret("k"), base_url=s.base_url, record_path=str(record),
                                     backoff_base_s=0.05, backoff_cap_s=0.1), tiers=TIERS)
    try:
        b.reset(0, episode_id="ep")
        first = b.run_window(ServeAction(**ACTION), arrivals(0), 0.0, DT)
        assert first.notes["errors"] == 0
        s.__exit__()  # the engine dies between two steps
        with pytest.raises(BackendUnavailableError) as ei:
            b.run_window(ServeAction(**ACTION), arrivals(1), DT, DT)
        assert ei.value.endpoint == s.base_url
        assert "failed to connect" in ei.value.reason and "none reached it" in ei.value.reason
        s = BackgroundStandin(StandinConfig(profile=PROFILE), port=s.port).__enter__()  # back where it was
        again = b.run_window(ServeAction(**ACTION), arrivals(1), DT, DT)
        late = b.run_window(ServeAction(**ACTION), [], 2 * DT, DT)
    finally:
        b.close()
        s.__exit__()
    done = [r for rep in (again, late) for r in rep.finished]
    # the retried window is reported once, whole, every request served; the failed tries are in no report
    assert sorted(r.request_id for r in done) == [10, 11, 12]
    assert {r.status for r in done} == {"ok"}
    assert again.notes["errors"] == late.notes["errors"] == 0
    # the record file keeps the failed tries; a request's last row is its outcome
    rows = read_records(record)
    assert {r["status"] for r in rows if r["request_id"] == 10} >= {"ok"} and len(rows) > 6
    assert sorted((r["request_id"], r["status"]) for r in read_rows(record)) == [
        (0, "ok"), (1, "ok"), (2, "ok"), (10, "ok"), (11, "ok"), (12, "ok")]


def test_a_window_with_some_failures_says_so_in_the_observation(monkeypatch):
    """Failures beside successes are a served window (200), with the count at the observation's top level."""
    from fastapi.testclient import TestClient
    from llmserve_env.server.app import build_app
    from llmserve_env.server.config import ServerSettings

    with BackgroundStandin(StandinConfig(profile=PROFILE)) as s:
        for k, v in {"OPENAI_BASE_URL": s.base_url, "LLMSERVE_REAL_MODEL": PROFILE,
                     "LLMSERVE_REAL_MAX_ATTEMPTS": "1"}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        with TestClient(build_app(ServerSettings(mode="real"))) as client:
            eid = client.post("/reset", json={"task_id": "static_workload", "seed": 0}).json()[
                "observation"]["episode_id"]
            s.app.state.standin.config.faults.rate_500 = 0.5
            obs = None
            for _ in range(3):
                r = client.post("/step", json={"action": ACTION, "episode_id": eid})
                assert r.status_code == 200
                obs = r.json()["observation"]
                if obs["metadata"]["failed_requests"]:
                    break
    assert obs is not None and obs["metadata"]["failed_requests"] >= 1
    assert "500" in obs["metadata"]["failure"]
    assert obs["metadata"]["failed_requests"] == obs["metadata"]["backend_notes"]["errors"] + \
        obs["metadata"]["backend_notes"]["timeouts"]


class StandinProcess:
    """The stand-in as its own process, so that it can be killed (SIGKILL: its connections are cut, the
    way an engine that crashes cuts them) and brought back on the same port."""

    def __init__(self, port: int):
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.proc = subprocess.Popen([sys.executable, "-m", "llmserve_env.tools.standin", "--port", str(port),
                                      "--profile", PROFILE], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.base_url + "/models", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                raise RuntimeError("the stand-in did not start")
            time.sleep(0.1)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_a_killed_engine_gives_503_over_http_and_websocket_and_health_says_so_at_once(monkeypatch):
    from fastapi.testclient import TestClient
    from llmserve_env.server.app import build_app
    from llmserve_env.server.config import ServerSettings

    s = StandinProcess(free_port())
    for k, v in {"OPENAI_BASE_URL": s.base_url, "LLMSERVE_REAL_MODEL": PROFILE}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    try:
        with TestClient(build_app(ServerSettings(mode="real"))) as client:
            assert client.get("/health").status_code == 200
            eid = client.post("/reset", json={"task_id": "static_workload", "seed": 0}).json()[
                "observation"]["episode_id"]
            assert client.post("/step", json={"action": ACTION, "episode_id": eid}).status_code == 200
            with client.websocket_connect("/ws") as ws:
                ws.send_json({"type": "reset", "data": {"task_id": "static_workload", "seed": 1}})
                assert ws.receive_json()["type"] == "observation"
                s.kill()  # the engine is killed mid-episode, requests in flight
                r = client.post("/step", json={"action": ACTION, "episode_id": eid})
                assert r.status_code == 503, r.text[:300]
                detail = r.json()["detail"]
                assert s.base_url in detail and "unreachable" in detail and "step 1" in detail
                # at once, not after the cached probe ages: a request failed to connect since it
                health = client.get("/health")
                assert health.status_code == 503 and health.json()["real_endpoint"]["reachable"] is False
                ws.send_json({"type": "step", "data": ACTION})
                msg = ws.receive_json()
                assert msg["type"] == "error" and s.base_url in str(msg) and "unreachable" in str(msg)
                # the episode was kept: with the engine back where it was, the same step is served
                s = StandinProcess(s.port)
                r = client.post("/step", json={"action": ACTION, "episode_id": eid})
                assert r.status_code == 200 and r.json()["observation"]["step_index"] == 2
                assert r.json()["observation"]["request_arrival_rate"] > 0
                ws.send_json({"type": "step", "data": ACTION})
                msg = ws.receive_json()
                assert msg["type"] == "observation" and msg["data"]["observation"]["step_index"] == 1
            assert client.get("/health").status_code == 200
    finally:
        s.kill()


def test_health_sees_a_dead_endpoint_within_a_second_with_no_request_sent():
    from llmserve_env.gateway.service import GatewayService
    from llmserve_env.gateway.startup import check_real_mode

    service = GatewayService()
    s = BackgroundStandin(StandinConfig(profile=PROFILE)).__enter__()
    check_real_mode([1.0], {"OPENAI_BASE_URL": s.base_url, "LLMSERVE_REAL_MODEL": PROFILE}, service=service)
    up = service.endpoint_health()
    assert up is not None and up["reachable"] is True
    s.__exit__()
    time.sleep(1.05)  # the probe /health answers from is at most a second old
    down = service.endpoint_health()
    assert down is not None and down["reachable"] is False
