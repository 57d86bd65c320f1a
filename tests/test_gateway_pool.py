"""Real mode's `replicas` over a pool of endpoints (LLMSERVE_REAL_ENDPOINTS), against two loopback
stand-ins: requests spread over the first k by least outstanding work, k beyond the pool is a 422
naming the range, and the metadata says what was applied (routing yes, cold start no)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from llmserve_env.gateway.backend import GatewayBackend
from llmserve_env.gateway.config import GatewayConfig, GatewayConfigError, GatewaySettings, Secret
from llmserve_env.gateway.pricing import TierPrice, TierTable
from llmserve_env.gateway.recorder import read_records
from llmserve_env.shared.backend import Arrival
from llmserve_env.shared.models import ServeAction
from llmserve_env.shared.routing import (
    least_outstanding,
    outstanding_work,
    outstanding_work_by_segment,
    total_outstanding_work,
)
from llmserve_env.sim.standin.app import StandinConfig
from llmserve_env.tools.standin_harness import BackgroundStandin

PROFILE = "h100-llama3.1-8b"
DT = 0.25
TIERS = TierTable({t: TierPrice(PROFILE, 0.0, 0.0, 1.0) for t in ("FP16", "INT8", "INT4")}, "test")


@pytest.fixture(scope="module")
def pool():
    with BackgroundStandin(StandinConfig(profile=PROFILE)) as a, BackgroundStandin(StandinConfig(profile=PROFILE)) as b:
        yield (a.base_url, b.base_url)


@pytest.fixture(scope="module")
def service():
    """The module's own gateway loop, shut down at its end: one left running at exit would log to
    pytest's closed capture stream after the summary line."""
    from llmserve_env.gateway.service import GatewayService

    svc = GatewayService()
    yield svc
    svc.shutdown()


def act(replicas: int | None) -> ServeAction:
    return ServeAction(batch_cap=8, kv_budget_fraction=0.5, speculation_depth=0, quantization_tier="FP16",
                       prefill_decode_split=False, priority_routing=False, replicas=replicas)


def play(pool, service, replicas: int | None, tmp_path, windows: int = 3) -> tuple[list, list[dict]]:
    record = tmp_path / f"pool{replicas}.jsonl"
    b = GatewayBackend(GatewayConfig(api_key=Secret("EMPTY"), base_url=pool[0], endpoints=pool,
                                     record_path=str(record)), tiers=TIERS, service=service)
    arrivals = [Arrival(i, 0.04 * i, 48, 24) for i in range(16)]
    try:
        b.begin(0, f"pool-{replicas}", DT, arrivals)
        reports = [b.run_window(act(replicas), [a for a in arrivals if k * DT <= a.arrival_s < (k + 1) * DT],
                                k * DT, DT) for k in range(windows)]
    finally:
        b.close()
    return reports, read_records(record)


def test_requests_spread_over_the_first_k_endpoints(pool, service, tmp_path):
    reports, records = play(pool, service, 2, tmp_path)
    served = Counter(r["endpoint"] for r in records if r["status"] == "ok")
    assert set(served) == set(pool) and min(served.values()) >= 4, served
    assert reports[0].applied["replicas"] is True
    cluster = reports[0].notes["cluster"]
    assert cluster["target"] == cluster["ready"] == 2 and cluster["endpoints"] == 2
    assert cluster["starting"] == 0 and cluster["cold_start_applied"] is False


def test_one_replica_keeps_every_request_on_the_first_endpoint(pool, service, tmp_path):
    _, records = play(pool, service, 1, tmp_path)
    assert {r["endpoint"] for r in records} == {pool[0]}


def test_the_router_is_the_simulators_rule():
    # the prompt counts until the first token; ties go to the lowest index
    assert outstanding_work(100, 20, 0, started=False) == 120
    assert outstanding_work(100, 20, 5, started=True) == 15
    assert least_outstanding([30.0, 10.0, 10.0]) == 1


def test_the_columns_total_is_the_per_request_rule_summed():
    rng = np.random.default_rng(3)
    prompt, target = rng.integers(1, 4000, 500), rng.integers(1, 800, 500)
    produced, started = rng.integers(0, 900, 500), rng.random(500) < 0.5
    want = sum(outstanding_work(p, t, d, s) for p, t, d, s in
               zip(prompt.tolist(), target.tolist(), produced.tolist(), started.tolist(), strict=True))
    got = total_outstanding_work(prompt, target, produced, started)
    assert got == want and type(got) is int
    assert total_outstanding_work(*(np.zeros(0, dtype=np.int64),) * 3, np.zeros(0, dtype=bool)) == 0
    bounds = [0, 0, 120, 121, 400, 500]  # runs of rows (a cluster's replicas' pending requests), an empty one first
    by_run = outstanding_work_by_segment(prompt, target, produced, started, bounds)
    assert by_run == [total_outstanding_work(prompt[lo:hi], target[lo:hi], produced[lo:hi], started[lo:hi])
                      for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    assert sum(by_run) == want and all(type(w) is int for w in by_run)


def test_endpoints_variable_is_checked_at_start_up(pool):
    cfg = GatewaySettings.from_env({"LLMSERVE_REAL_ENDPOINTS": ",".join(pool)}).to_config()
    assert cfg.pool == pool and cfg.base_url == pool[0] and cfg.api_key.reveal() == "EMPTY"
    for bad, says in ((f"{pool[0]},{pool[0]}", "twice"), ("ftp://x/v1", "http(s) URL"),
                      ("http://api.example.com/v1", "OPENAI_API_KEY")):
        with pytest.raises(GatewayConfigError, match="LLMSERVE_REAL_ENDPOINTS") as exc:
            GatewaySettings.from_env({"LLMSERVE_REAL_ENDPOINTS": bad}).to_config()
        assert says in str(exc.value)
    with pytest.raises(GatewayConfigError, match="set one"):
        GatewaySettings.from_env({"LLMSERVE_REAL_ENDPOINTS": pool[0], "OPENAI_BASE_URL": pool[1]}).to_config()


def test_replicas_beyond_the_pool_is_a_422_naming_the_range(pool, monkeypatch, tmp_path):
    from fastapi.testclient import TestClient
    from llmserve_env.server.app import build_app
    from llmserve_env.server.config import ServerSettings

    monkeypatch.setenv("LLMSERVE_REAL_ENDPOINTS", ",".join(pool))
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("LLMSERVE_REAL_MODEL", PROFILE)
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{0.1 * i:.2f},{40 + i},8\n" for i in range(12)))
    task = f"trace:{trace}?horizon=3&window_s=0.5&replicas=8&initial_replicas=2"
    action = act(2).model_dump(exclude={"metadata"})
    with TestClient(build_app(ServerSettings(mode="real"))) as client:
        episode = client.post("/reset", json={"task_id": task, "seed": 0}).json()["observation"]["episode_id"]
        refused = client.post("/step", json={"action": {**action, "replicas": 3}, "episode_id": episode})
        assert refused.status_code == 422
        assert "replicas must be 1..2" in refused.text and "LLMSERVE_REAL_ENDPOINTS" in refused.text
        step = client.post("/step", json={"action": action, "episode_id": episode}).json()
    meta = step["observation"]["metadata"]
    assert meta["applied"]["replicas"] is True
    assert meta["cluster"]["ready"] == 2 and meta["cluster"]["cold_start_applied"] is False


def test_start_up_probes_every_endpoint_of_the_pool(pool):
    from llmserve_env.gateway.service import GatewayService
    from llmserve_env.gateway.startup import check_real_mode

    env = {"LLMSERVE_REAL_MODEL": PROFILE, "LLMSERVE_REAL_PROBE_TIMEOUT_S": "0.5"}
    assert check_real_mode([0.5], {**env, "LLMSERVE_REAL_ENDPOINTS": ",".join(pool)}, GatewayService()).pool == pool
    dead = "http://127.0.0.1:9/v1"  # the discard port: nothing listens
    with pytest.raises(GatewayConfigError, match=f"LLMSERVE_REAL_ENDPOINTS endpoint {dead} is unreachable"):
        check_real_mode([0.5], {**env, "LLMSERVE_REAL_ENDPOINTS": f"{pool[0]},{dead}"}, GatewayService())


def test_a_task_starting_with_more_replicas_than_endpoints_is_refused(pool, service):
    b = GatewayBackend(GatewayConfig(api_key=Secret("EMPTY"), base_url=pool[0], endpoints=pool), tiers=TIERS,
                       service=service)
    try:
        with pytest.raises(GatewayConfigError, match="starts with 3 replicas and real mode has 2 endpoints"):
            b.begin(0, "too-many", DT, [], initial_replicas=3)
    finally:
        b.close()
