"""Issue 30, items 3 and 5: silent WebSocket sockets cannot lock the session pool, one client
address cannot take all of it, and no frame, however malformed, ends a session (server/frames.py)."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack

import pytest
from conftest import STEADY_ACTION
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmserve_env.server.app import build_app
from llmserve_env.server.config import ServerSettings
from llmserve_env.tools.launch import ThreadServer
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect


def ws_url(server: ThreadServer) -> str:
    return server.url.replace("http://", "ws://") + "/ws"


def try_reset(server: ThreadServer, seed: int = 0) -> dict:
    """A new session's reset: its reply, or the refusal the server sent before closing."""
    with connect(ws_url(server), open_timeout=10) as ws:
        try:
            ws.send(json.dumps({"type": "reset", "data": {"task_id": "static_workload", "seed": seed}}))
        except ConnectionClosed:
            pass  # refused at once: the error frame is already here
        return json.loads(ws.recv(timeout=10))


def test_silent_sockets_do_not_lock_new_sessions_out():
    """The issue's reproduction, scaled down (a pool of 4, a 1 s idle timeout): sockets that never
    send a frame held every session slot, and a new client's reset was refused for as long as they
    stayed open (past 150 s at the defaults). Now they are closed, and the slots freed."""
    config = ServerSettings(mode="sim", max_sessions=4, ws_idle_timeout_s=1.0)
    with ThreadServer(build_app(config)) as server, ExitStack() as sockets:
        silent = [sockets.enter_context(connect(ws_url(server), open_timeout=10)) for _ in range(4)]
        time.sleep(0.3)
        assert try_reset(server)["data"]["code"] == "CAPACITY_REACHED"  # the pool is full now
        time.sleep(1.5)
        reply = try_reset(server, seed=1)
        assert reply["type"] == "observation", reply
        # Each silent socket was told why before it was closed.
        told = json.loads(silent[0].recv(timeout=5))
        assert told["data"]["code"] == "IDLE_TIMEOUT" and "no frame for 1 s" in told["data"]["message"]


def test_a_session_that_plays_is_not_idle_and_one_that_stops_is_closed():
    config = ServerSettings(mode="sim", max_sessions=2, ws_idle_timeout_s=1.0)
    with ThreadServer(build_app(config)) as server, connect(ws_url(server)) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 3}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        for k in range(1, 5):  # a frame every 0.6 s: 2.4 s in all, more than the idle timeout
            time.sleep(0.6)
            ws.send(json.dumps({"type": "step", "data": STEADY_ACTION}))
            assert json.loads(ws.recv(timeout=10))["data"]["observation"]["step_index"] == k
        assert json.loads(ws.recv(timeout=5))["data"]["code"] == "IDLE_TIMEOUT"


def test_one_client_address_cannot_take_the_whole_pool():
    config = ServerSettings(mode="sim", max_sessions=8, ws_max_per_client=2)
    with ThreadServer(build_app(config)) as server, connect(ws_url(server)), connect(ws_url(server)) as b:
        refused = try_reset(server)
        assert refused["data"]["code"] == "CAPACITY_REACHED"
        assert "LLMSERVE_WS_MAX_PER_CLIENT" in refused["data"]["message"]
        b.close()
        time.sleep(0.2)
        assert try_reset(server)["type"] == "observation"  # a closed socket frees its place


DEEP = '{"type": "step", "data": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}"
MALFORMED = [
    # The two: a lone surrogate in a field killed the session when OpenEnv's error reply
    # failed to serialise it, and a 100k-deep frame hit the recursion limit.
    '{"type": "step", "data": {"batch_cap": 64, "kv_budget_fraction": 0.9, "speculation_depth": 0, '
    '"quantization_tier": "\\ud800", "prefill_decode_split": false, "priority_routing": false}}',
    DEEP,
    '{"type": "step", "data": {"batch_cap": NaN}}',
    '{"type": "step", "data": {"batch_cap": 64, "metadata": {"x": 1e999}}}',
    '{"type": "reset", "data": {"seed": ' + "9" * 5000 + "}}",
    '{"type": "\\udfff"}',
    '{"type": "step", "data": [1, 2]}',
    '{"type": ["step"]}',
    '{"type": "reset", "data": {"seed": -1}}',
    '{"type": "step"}',
    "{",
    "[" * 50 + "]" * 50,
]


@pytest.mark.parametrize("frame", MALFORMED, ids=range(len(MALFORMED)))
def test_any_malformed_frame_gets_an_error_frame_and_the_session_goes_on(frame):
    with TestClient(build_app(ServerSettings(mode="sim", max_sessions=2))) as client, \
            client.websocket_connect("/ws") as ws:
        ws.send_text(json.dumps({"type": "reset", "data": {"seed": 7}}))
        assert ws.receive_json()["data"]["observation"]["step_index"] == 0
        ws.send_text(frame)
        reply = ws.receive_json()
        assert reply["type"] == "error", reply
        assert len(json.dumps(reply)) < 20_000
        ws.send_text(json.dumps({"type": "step", "data": STEADY_ACTION}))
        assert ws.receive_json()["data"]["observation"]["step_index"] == 1


@pytest.mark.parametrize("frame", ["[1, 2]", DEEP, '{"jsonrpc": "2.0", "method": "\\ud800", "id": 1}', "7"],
                         ids=["list", "deep", "surrogate", "number"])
def test_the_mcp_websocket_answers_malformed_frames_with_a_jsonrpc_error_and_goes_on(frame):
    hello = {"jsonrpc": "2.0", "method": "tools/list", "id": 1}
    with TestClient(build_app(ServerSettings(mode="sim", max_sessions=2))) as client, \
            client.websocket_connect("/mcp") as ws:
        ws.send_json(hello)
        first = ws.receive_json()
        ws.send_text(frame)
        reply = ws.receive_json()
        assert reply["jsonrpc"] == "2.0" and reply["error"]["code"] in (-32600, -32700), reply
        ws.send_json(hello)
        assert ws.receive_json() == first


# Text with lone surrogates too (json.dumps writes them as \\udXXX escapes, as a hostile client would).
TEXT = st.text(st.characters(exclude_categories=()), max_size=20)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | TEXT | st.sampled_from(["\ud800", "FP16", "static_workload"]),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=12)
FRAMES = st.fixed_dictionaries({"type": st.sampled_from(["reset", "step", "state", "mcp", "nope", 1, None, []]),
                                "data": JSON | st.fixed_dictionaries({}, optional={
                                    "seed": JSON, "task_id": JSON, "episode_id": JSON, "batch_cap": JSON,
                                    "quantization_tier": JSON, "metadata": JSON})})


@pytest.mark.timeout(120)  # a session that died leaves the receive waiting: fail, do not hang
def test_random_frames_never_end_a_session():
    """Any frame but {"type": "close"} gets a reply, and the session goes on (issue 30, item 5)."""
    with TestClient(build_app(ServerSettings(mode="sim", max_sessions=2))) as client, \
            client.websocket_connect("/ws") as ws:

        @settings(max_examples=150, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
        @given(FRAMES)
        def one(frame: dict) -> None:
            ws.send_text(json.dumps(frame))
            assert ws.receive_json()["type"] in ("error", "observation", "state", "mcp")

        one()
        ws.send_text(json.dumps({"type": "reset", "data": {"seed": 1}}))
        assert ws.receive_json()["data"]["observation"]["step_index"] == 0
