"""The server's limits and faults: body size, episode store bounds, memory, WebSocket capacity,
a failing backend, a client that goes away mid-step, settings from the environment, secrecy.

(The basic 413 on a declared Content-Length is in test_server_api.py; the gateway's own key
secrecy in test_gateway_backend.py. Here: what the server adds around them.)
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import subprocess
import sys
import time

import httpx
import pytest
from conftest import STEADY_ACTION
from fastapi.testclient import TestClient
from llmserve_env.core.episode import Episode
from llmserve_env.server.app import build_app
from llmserve_env.server.config import ConfigError, ServerSettings
from llmserve_env.server.episodes import EpisodeStore
from llmserve_env.shared.workloads import resolve_task
from llmserve_env.tools.launch import ThreadServer
from openenv.core.generic_client import GenericEnvClient

SMALL = ServerSettings(mode="sim", max_episodes=3, idle_timeout_s=600.0, max_sessions=2, max_body_bytes=4096)


def reset(client, task_id="static_workload", seed=0) -> str:
    r = client.post("/reset", json={"task_id": task_id, "seed": seed})
    assert r.status_code == 200, r.text
    return r.json()["observation"]["episode_id"]


def observations(steps: list[dict]) -> list[dict]:
    return [s["observation"] | {"episode_id": None} for s in steps]


def play(client, episode_id: str, n: int | None = None) -> list[dict]:
    out = []
    while n is None or len(out) < n:
        r = client.post("/step", json={"action": STEADY_ACTION, "episode_id": episode_id})
        assert r.status_code == 200, r.text
        out.append(r.json())
        if out[-1]["done"]:
            break
    return out


# -- request body size ----------------------------------------------------------------------------
def chunked(total: int, prefix: bytes = b'{"episode_log": "', suffix: bytes = b'"}'):
    """A body sent without Content-Length (chunked), so the limit must count it as it arrives."""
    yield prefix
    for _ in range(total // 1000):
        yield b"x" * 1000
    yield suffix


@pytest.mark.parametrize("path", ["/grader", "/step", "/reset", "/mcp", "/web/step", "/llmserve_env/tasks"])
def test_a_streamed_body_over_the_limit_is_413_on_every_route(path):
    # FastAPI turns an error while reading a body into a 400 and OpenEnv's /mcp into a JSON-RPC
    # parse error: the limit must still answer 413, saying which setting to change.
    with TestClient(build_app(SMALL)) as client:
        r = client.post(path, content=chunked(10_000), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert "LLMSERVE_MAX_BODY_BYTES" in r.json()["detail"]


def test_an_episode_log_over_the_limit_is_413_and_one_under_it_is_read():
    with TestClient(build_app(SMALL)) as client:
        big = json.dumps({"episode_log": {"task_id": "static_workload", "steps": ["x" * 100] * 60}})
        assert len(big) > SMALL.max_body_bytes
        r = client.post("/grader", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413
        small = json.dumps({"episode_log": {"task_id": "static_workload"}})
        r = client.post("/grader", content=small, headers={"content-type": "application/json"})
        assert r.status_code == 422  # read and validated: an incomplete log, not a size problem


def test_a_streamed_body_over_the_limit_is_413_over_real_http():
    with ThreadServer(build_app(SMALL)) as server:
        r = httpx.post(server.url + "/grader", content=chunked(50_000), timeout=10,
                       headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200


# -- the episode store ----------------------------------------------------------------------------
def test_the_store_drops_the_least_recently_used_episode_past_its_size(monkeypatch):
    with TestClient(build_app(SMALL)) as client:
        ids = [reset(client, seed=s) for s in range(3)]
        client.get("/state", params={"episode_id": ids[0]})  # touch the oldest: now the second is LRU
        newest = reset(client, seed=3)
        assert client.get("/state", params={"episode_id": ids[1]}).status_code == 404
        for eid in (ids[0], ids[2], newest):
            assert client.get("/state", params={"episode_id": eid}).status_code == 200
        r = client.post("/step", json={"action": STEADY_ACTION, "episode_id": ids[1]})
        assert r.status_code == 404 and "expired" in r.json()["detail"] and "/reset" in r.json()["detail"]


def test_the_store_expires_idle_episodes(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("llmserve_env.server.episodes.time.monotonic", lambda: clock[0])
    store = EpisodeStore(max_episodes=10, idle_timeout_s=60.0)
    task = resolve_task("static_workload")
    old, fresh = Episode.start(task, 0, "sim"), Episode.start(task, 1, "sim")
    store.put(old)
    clock[0] += 50
    store.put(fresh)
    clock[0] += 20  # old: 70 s idle, fresh: 20 s
    assert store.get(fresh.episode_id) is fresh
    with pytest.raises(Exception, match="unknown or expired"):
        store.get(old.episode_id)
    assert len(store) == 1
    clock[0] += 61  # expiry also happens on put, without a get of the idle episode
    store.put(Episode.start(task, 2, "sim"))
    assert fresh.episode_id not in {e for e in store._items}  # noqa: SLF001 (the store's contents)


def test_settings_come_from_the_environment(monkeypatch):
    for name, value in {"LLMSERVE_MAX_EPISODES": "7", "LLMSERVE_EPISODE_IDLE_TIMEOUT_S": "12.5",
                        "LLMSERVE_MAX_SESSIONS": "3", "LLMSERVE_MAX_BODY_BYTES": "2048"}.items():
        monkeypatch.setenv(name, value)
    config = ServerSettings.from_env()
    assert (config.max_episodes, config.idle_timeout_s, config.max_sessions, config.max_body_bytes) == \
        (7, 12.5, 3, 2048)
    app = build_app(config)
    assert app.state.episode_store.max_episodes == 7 and app.state.episode_store.idle_timeout_s == 12.5
    for name, bad in (("LLMSERVE_MAX_SESSIONS", "0"), ("LLMSERVE_MAX_EPISODES", "many"),
                      ("LLMSERVE_MAX_BODY_BYTES", "10"), ("LLMSERVE_EPISODE_IDLE_TIMEOUT_S", "-1"),
                      ("LLMSERVE_EPISODE_IDLE_TIMEOUT_S", "inf"), ("LLMSERVE_EPISODE_IDLE_TIMEOUT_S", "nan"),
                      ("LLMSERVE_MAX_EPISODES", "1e23"), ("LLMSERVE_MAX_EPISODES", str(10**23)),
                      ("LLMSERVE_MODE", "simulated"), ("LLMSERVE_MAX_SESSIONS", " ")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ConfigError, match=name):
            ServerSettings.from_env()
        monkeypatch.delenv(name)


def test_an_empty_or_missing_trace_dir_stops_the_server_at_start_up(monkeypatch, tmp_path):
    """Issue 20, item 9: LLMSERVE_TRACE_DIR="" used to turn confinement off silently, and a folder
    that does not exist was accepted."""
    monkeypatch.setenv("LLMSERVE_TRACE_DIR", "")
    with pytest.raises(ConfigError, match="LLMSERVE_TRACE_DIR is set but empty"):
        ServerSettings.from_env()
    monkeypatch.setenv("LLMSERVE_TRACE_DIR", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="LLMSERVE_TRACE_DIR=.*not an existing folder"):
        ServerSettings.from_env()
    monkeypatch.setenv("LLMSERVE_TRACE_DIR", str(tmp_path))
    assert ServerSettings.from_env().trace_dir == str(tmp_path)
    # The same refusal stops uvicorn before it listens: no half-configured server.
    env = {k: v for k, v in os.environ.items() if k != "LLMSERVE_TRACE_DIR"}
    out = subprocess.run([sys.executable, "-c", "import llmserve_env.server.app"], capture_output=True, text=True,
                         env={**env, "LLMSERVE_TRACE_DIR": ""}, timeout=120)
    assert out.returncode != 0 and "LLMSERVE_TRACE_DIR is set but empty" in out.stderr


def test_memory_stays_flat_over_10000_resets(tmp_path):
    # A two-request trace with a one-window horizon: a reset costs ~1 ms instead of the ~9 ms a
    # built-in task spends generating arrivals, and goes through the same server code (size limit,
    # strict body, OpenEnv's handler and thread pool, environment, store).
    trace = tmp_path / "tiny.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.1,40,8\n0.5,50,8\n")
    app = build_app(ServerSettings(mode="sim", max_episodes=64, max_sessions=2))
    task_id = f"trace:{trace}?horizon=1"

    async def post_reset(seed: int) -> int:
        """POST /reset straight into the ASGI app (an HTTP client here would be most of the cost)."""
        body = json.dumps({"task_id": task_id, "seed": seed}).encode()
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        status = []

        async def receive() -> dict:
            return messages.pop() if messages else {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/reset", "raw_path": b"/reset", "root_path": "", "query_string": b"",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        await app(scope, receive, send)
        return status[0]

    async def resets(seeds: range) -> None:
        for seed in seeds:
            assert await post_reset(seed) == 200

    def measure() -> tuple[int, int, int]:
        gc.collect()
        objects = gc.get_objects()
        episodes = sum(isinstance(o, Episode) for o in objects)
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * 4096
        return len(objects), episodes, rss

    # Checkpoints every 3000 resets after a warm-up in which the store fills and caches reach their
    # size. A leak grows every interval; a one-off (a library importing a module in a background
    # thread, a dict resizing) grows one, so the smallest growth is what must stay near zero.
    asyncio.run(resets(range(1000)))
    points = [measure()]
    for start in range(1000, 10_000, 3000):
        asyncio.run(resets(range(start, start + 3000)))
        points.append(measure())
    assert len(app.state.episode_store) == 64
    # Live episodes: the store's 64, plus any that earlier tests' apps still hold, never more.
    assert max(p[1] for p in points) - points[0][1] <= 1
    object_growth = [b[0] - a[0] for a, b in zip(points, points[1:], strict=False)]
    rss_growth = [b[2] - a[2] for a, b in zip(points, points[1:], strict=False)]
    assert min(object_growth) < 1000, f"Python objects grow with resets: {object_growth}"  # leak: >= 3000
    assert min(rss_growth) < 8 * 2**20, f"resident memory grows with resets: {rss_growth}"


# -- WebSocket sessions ---------------------------------------------------------------------------
def test_websocket_sessions_beyond_the_limit_are_refused_clearly():
    server = ThreadServer(build_app(SMALL)).start()
    try:
        with GenericEnvClient(base_url=server.url).sync() as a, GenericEnvClient(base_url=server.url).sync() as b:
            a.reset(task_id="static_workload", seed=1)
            b.reset(task_id="static_workload", seed=2)
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED") as refused:
                with GenericEnvClient(base_url=server.url).sync() as c:
                    c.reset(task_id="static_workload", seed=3)
            assert "2" in str(refused.value)  # the limit is in the message
            # The two sessions are untouched, and HTTP episodes have no such bound.
            assert a.step(STEADY_ACTION).observation["step_index"] == 1
            assert b.step(STEADY_ACTION).observation["step_index"] == 1
            assert httpx.post(server.url + "/reset", json={"seed": 4}, timeout=10).status_code == 200
        # Closed sessions free their slots.
        with GenericEnvClient(base_url=server.url).sync() as d:
            assert d.reset(task_id="static_workload", seed=5).observation["step_index"] == 0
    finally:
        server.stop()


# -- faults ---------------------------------------------------------------------------------------
def test_a_backend_failure_ends_that_episode_only(client, app, caplog):
    caplog.set_level(logging.WARNING)
    alone = observations(play(client, reset(client, seed=31), n=4))
    bad, good = reset(client, seed=30), reset(client, seed=31)
    play(client, bad, n=1)
    play(client, good, n=1)

    def boom(*args, **kwargs):
        raise RuntimeError("simulated GPU fell off the bus")

    app.state.episode_store.get(bad).backend.run_window = boom
    r = client.post("/step", json={"action": STEADY_ACTION, "episode_id": bad})
    assert r.status_code == 502
    detail = r.json()["detail"]
    assert "step 1" in detail and "simulated GPU fell off the bus" in detail and "/reset" in detail
    # That episode is over (and says so), the other one carries on exactly as if alone.
    r = client.post("/step", json={"action": STEADY_ACTION, "episode_id": bad})
    assert r.status_code == 409
    assert client.post("/grader", json={"episode_id": bad}).status_code == 409
    assert observations(play(client, good, n=3)) == alone[1:]
    assert "backend failed" in caplog.text


def test_a_backend_failure_in_one_websocket_session_leaves_the_others(live_server, app):
    with GenericEnvClient(base_url=live_server.url).sync() as a, \
            GenericEnvClient(base_url=live_server.url).sync() as b:
        ea = a.reset(task_id="static_workload", seed=40).observation["episode_id"]
        b.reset(task_id="static_workload", seed=41)

        def boom(*args, **kwargs):
            raise RuntimeError("simulated backend crash")

        app.state.episode_store.get(ea).backend.run_window = boom
        with pytest.raises(RuntimeError, match="simulated backend crash"):
            a.step(STEADY_ACTION)
        for k in range(1, 4):
            assert b.step(STEADY_ACTION).observation["step_index"] == k


def test_a_client_gone_mid_step_leaves_the_episode_consistent(live_server, app):
    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        alone = observations(play(c, reset(c, seed=50), n=4))
        eid = reset(c, seed=50)
        play(c, eid, n=1)
        ep = app.state.episode_store.get(eid)
        real = ep.backend.run_window

        def slow(*args, **kwargs):
            time.sleep(0.4)  # the client gives up while this window is being served
            return real(*args, **kwargs)

        ep.backend.run_window = slow
        with pytest.raises(httpx.ReadTimeout):
            c.post("/step", json={"action": STEADY_ACTION, "episode_id": eid}, timeout=0.1)
        time.sleep(0.6)
        ep.backend.run_window = real
        # The step the client abandoned was applied once, whole; the episode goes on as if alone.
        state = c.get("/state", params={"episode_id": eid}).json()
        assert state["step_count"] == 2 and len(state["action_history"]) == 2
        assert state["last_observation"]["step_index"] == 2
        assert observations(play(c, eid, n=2)) == alone[2:4]


def test_a_websocket_client_gone_mid_step_leaves_the_episode_consistent(live_server, app):
    from websockets.sync.client import connect

    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        alone = observations(play(c, reset(c, seed=60), n=3))
    entered = []
    with connect(live_server.url.replace("http://", "ws://") + "/ws") as ws:  # OpenEnv's protocol
        ws.send(json.dumps({"type": "reset", "data": {"task_id": "static_workload", "seed": 60}}))
        eid = json.loads(ws.recv())["data"]["observation"]["episode_id"]
        ep = app.state.episode_store.get(eid)
        real = ep.backend.run_window

        def slow(*args, **kwargs):
            entered.append(True)
            time.sleep(0.4)
            return real(*args, **kwargs)

        ep.backend.run_window = slow
        ws.send(json.dumps({"type": "step", "data": STEADY_ACTION}))
    # The socket closed right after the step was sent, before its answer.
    time.sleep(0.8)
    ep.backend.run_window = real
    assert entered  # the step did start
    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        state = c.get("/state", params={"episode_id": eid}).json()
        assert state["step_count"] == 1 and len(state["action_history"]) == 1
        assert observations(play(c, eid, n=2)) == alone[1:3]


# -- secrets ---------------------------------------------------------------------------------------
CANARY = "sk-canary-server-7e6d5c4b3a29181706f5"


def test_the_api_key_appears_in_no_response_state_error_or_log(monkeypatch, tmp_path, caplog):
    """Real mode against the stand-in, which demands another key: every request fails with a 401
    that echoes (masked) what it got. The canary key must not reach any answer of the server, its
    state, its errors, its logs or the reprs of its objects."""
    from llmserve_env.sim.standin.app import StandinConfig
    from llmserve_env.tools.standin_harness import BackgroundStandin

    caplog.set_level(logging.DEBUG)
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{0.05 * i:.2f},{40 + i},4\n" for i in range(6)))
    with BackgroundStandin(StandinConfig(profile="h100-llama3.1-8b", api_key="the-right-key")) as standin:
        monkeypatch.setenv("OPENAI_BASE_URL", standin.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", CANARY)
        monkeypatch.setenv("LLMSERVE_REAL_MODEL", "h100-llama3.1-8b")
        # the start-up probe would refuse the wrong key; this test wants it sent with every request
        monkeypatch.setenv("LLMSERVE_REAL_PROBE", "0")
        app = build_app(ServerSettings(mode="real"))
        texts = [repr(app.state.config)]
        with TestClient(app) as client:
            r = client.post("/reset", json={"task_id": f"trace:{trace}?horizon=2&window_s=0.15", "seed": 0})
            texts.append(r.text)
            eid = r.json()["observation"]["episode_id"]
            done = False
            while not done:
                r = client.post("/step", json={"action": STEADY_ACTION, "episode_id": eid})
                assert r.status_code == 200, r.text
                texts.append(r.text)
                done = r.json()["done"]
            meta = r.json()["observation"]["metadata"]
            assert meta["backend_notes"]["backend"] == "real" and meta["backend_notes"]["attempts"] > 0
            assert meta["per_tenant"]["trace"]["met"] == 0  # every request was refused: wrong key
            ep = app.state.episode_store.get(eid)
            texts += [repr(ep), repr(ep.backend), str(ep.episode_log().model_dump())]
            for path in ("/metadata", "/schema", "/tasks", "/health", "/openapi.json", "/"):
                texts.append(client.get(path).text)
            texts.append(client.get("/state", params={"episode_id": eid}).text)
            texts.append(client.post("/grader", json={"episode_id": eid}).text)
            # Errors, too: a bad step, an unknown episode, a finished one.
            texts.append(client.post("/step", json={"action": {"batch_cap": 0}, "episode_id": eid}).text)
            texts.append(client.post("/step", json={"action": STEADY_ACTION, "episode_id": "nope"}).text)
            texts.append(client.post("/step", json={"action": STEADY_ACTION, "episode_id": eid}).text)
    texts.append(caplog.text)
    for text in texts:
        assert CANARY not in text
