"""Every route answers as documented, and every bad input gets a clear 4xx (never a 500)."""

from __future__ import annotations

import json

import pytest
from conftest import STEADY_ACTION
from fastapi.testclient import TestClient
from llmserve_env.server.app import build_app
from llmserve_env.server.config import ServerSettings


def reset(client, task_id="static_workload", seed=7) -> dict:
    r = client.post("/reset", json={"task_id": task_id, "seed": seed})
    assert r.status_code == 200, r.text
    return r.json()


def play(client, episode_id: str, action=STEADY_ACTION) -> list[dict]:
    out = []
    while True:
        r = client.post("/step", json={"action": action, "episode_id": episode_id})
        assert r.status_code == 200, r.text
        out.append(r.json())
        if r.json()["done"]:
            return out


@pytest.mark.presubmit
def test_info_routes(client):
    assert client.get("/health").json()["status"] == "healthy"
    meta = client.get("/metadata").json()
    assert meta["name"] == "LLMServeEnv" and meta["description"]
    schema = client.get("/schema").json()
    assert set(schema["action"]["properties"]) >= {"batch_cap", "kv_budget_fraction", "speculation_depth",
                                                   "quantization_tier", "prefill_decode_split",
                                                   "priority_routing"}
    assert "p99_ttft_ms" in schema["observation"]["properties"]
    assert "action_history" in schema["state"]["properties"]
    root = client.get("/").json()
    assert root["web"] == "/web" and root["tasks"] == "/tasks"


@pytest.mark.presubmit
def test_tasks_route_lists_every_task_with_slos(client):
    body = client.get("/tasks").json()
    ids = {t["task_id"] for t in body["tasks"]}
    assert {"static_workload", "bursty_workload", "adversarial_multitenant"} <= ids
    for t in body["tasks"]:
        assert t["horizon"] > 0 and t["difficulty"] and t["description"]
        assert all("ttft_ms" in tenant["slo"] for tenant in t["tenants"])
    assert body["action_schema"]["properties"]["batch_cap"]["maximum"] == 512


@pytest.mark.presubmit
def test_demo_redirects_to_web_and_web_serves(client):
    r = client.get("/demo", follow_redirects=False)
    assert r.status_code in (302, 307) and r.headers["location"] == "/web"
    r = client.get("/web", follow_redirects=True)
    assert r.status_code == 200 and "<html" in r.text.lower()


@pytest.mark.presubmit
def test_reset_returns_episode_id_and_initial_observation(client):
    body = reset(client)
    obs = body["observation"]
    assert obs["episode_id"] and obs["task_id"] == "static_workload" and obs["step_index"] == 0
    assert body["done"] is False


@pytest.mark.presubmit
def test_full_episode_state_and_grade(client):
    body = reset(client, seed=3)
    eid = body["observation"]["episode_id"]
    steps = play(client, eid)
    horizon = client.get("/state", params={"episode_id": eid}).json()["horizon"]
    assert len(steps) == horizon
    assert [s["observation"]["step_index"] for s in steps] == list(range(1, horizon + 1))
    state = client.get("/state", params={"episode_id": eid}).json()
    assert state["done"] is True and state["step_count"] == horizon
    assert len(state["action_history"]) == horizon
    assert state["cumulative_reward"] == pytest.approx(sum(s["reward"] for s in steps))
    grade = client.post("/grader", json={"episode_id": eid}).json()
    assert 0.0 <= grade["score"] <= 1.0
    # Stepping a finished episode is a conflict, not a silent no-op.
    r = client.post("/step", json={"action": STEADY_ACTION, "episode_id": eid})
    assert r.status_code == 409 and "done" in r.json()["detail"]


def test_grader_accepts_an_explicit_episode_log(client, app):
    eid = reset(client, seed=5)["observation"]["episode_id"]
    play(client, eid)
    by_id = client.post("/grader", json={"episode_id": eid}).json()
    log = app.state.episode_store.get(eid).episode_log().model_dump(mode="json")
    by_log = client.post("/grader", json={"episode_log": log}).json()
    assert by_log["score"] == by_id["score"]


def test_same_seed_same_actions_same_observations_over_http(client):
    runs = []
    for _ in range(2):
        eid = reset(client, task_id="bursty_workload", seed=11)["observation"]["episode_id"]
        obs = [s["observation"] | {"episode_id": None} for s in play(client, eid)]
        runs.append(obs)
    assert runs[0] == runs[1]


def test_two_interleaved_sessions_stay_isolated(client):
    other = dict(STEADY_ACTION, batch_cap=4, quantization_tier="INT4")
    alone_a = play(client, reset(client, seed=21)["observation"]["episode_id"])
    alone_b = play(client, reset(client, seed=22)["observation"]["episode_id"], action=other)
    ea = reset(client, seed=21)["observation"]["episode_id"]
    eb = reset(client, seed=22)["observation"]["episode_id"]
    got_a, got_b = [], []
    for _ in range(len(alone_a)):
        got_a.append(client.post("/step", json={"action": STEADY_ACTION, "episode_id": ea}).json())
        got_b.append(client.post("/step", json={"action": other, "episode_id": eb}).json())

    def strip(xs):
        return [x["observation"] | {"episode_id": None} for x in xs]

    assert strip(got_a) == strip(alone_a)
    assert strip(got_b) == strip(alone_b)


# -- bad input ----------------------------------------------------------------------------------
def test_step_without_episode_id_says_how_to_get_one(client):
    r = client.post("/step", json={"action": STEADY_ACTION})
    assert r.status_code == 400
    assert "/reset" in r.json()["detail"] and "episode_id" in r.json()["detail"]


def test_unknown_episode_is_404(client):
    r = client.post("/step", json={"action": STEADY_ACTION, "episode_id": "nope"})
    assert r.status_code == 404
    assert client.get("/state", params={"episode_id": "nope"}).status_code == 404
    assert client.post("/grader", json={"episode_id": "nope"}).status_code == 404


def test_state_without_episode_id_is_400(client):
    r = client.get("/state")
    assert r.status_code == 400 and "episode_id" in r.json()["detail"]


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("batch_cap", 0, "greater than or equal to 1"),
        ("batch_cap", 513, "less than or equal to 512"),
        ("batch_cap", 32.5, "integer"),
        ("batch_cap", "32", "integer"),
        ("kv_budget_fraction", 0.05, "greater than or equal to 0.1"),
        ("kv_budget_fraction", 1.5, "less than or equal to 1"),
        ("speculation_depth", 9, "less than or equal to 8"),
        ("quantization_tier", "FP8", "'FP16', 'INT8' or 'INT4'"),
        ("prefill_decode_split", "yes", "boolean"),
        ("priority_routing", 1, "boolean"),
    ],
)
def test_bad_action_is_422_naming_field_and_range(client, field, value, needle):
    eid = reset(client)["observation"]["episode_id"]
    r = client.post("/step", json={"action": dict(STEADY_ACTION, **{field: value}), "episode_id": eid})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert any(field in e["loc"] and needle in e["msg"] for e in detail), detail
    # Nothing was applied: the episode did not advance.
    assert client.get("/state", params={"episode_id": eid}).json()["step_count"] == 0


def test_missing_and_extra_action_fields_are_422(client):
    eid = reset(client)["observation"]["episode_id"]
    partial = {k: v for k, v in STEADY_ACTION.items() if k != "batch_cap"}
    r = client.post("/step", json={"action": partial, "episode_id": eid})
    assert r.status_code == 422 and any("batch_cap" in e["loc"] for e in r.json()["detail"])
    r = client.post("/step", json={"action": dict(STEADY_ACTION, turbo=True), "episode_id": eid})
    assert r.status_code == 422 and any("turbo" in e["loc"] for e in r.json()["detail"])


def test_unknown_task_is_404_listing_valid_ids(client):
    for r in (client.post("/reset", json={"task_id": "nope"}),
              client.get("/baseline", params={"task_id": "nope"})):
        assert r.status_code == 404
        assert "static_workload" in r.text and "nope" in r.text


def test_malformed_json_is_422(client):
    r = client.post("/step", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = client.post("/reset", content=b"[1,2", headers={"content-type": "application/json"})
    assert r.status_code == 422


def test_bad_seed_is_4xx(client):
    for seed in (-1, "abc", 1.5):
        r = client.post("/reset", json={"task_id": "static_workload", "seed": seed})
        assert 400 <= r.status_code < 500, (seed, r.text)


def test_grader_body_errors(client):
    assert client.post("/grader", json={}).status_code == 422
    assert client.post("/grader", json={"episode_log": {"task_id": "static_workload"}}).status_code == 422
    eid = reset(client)["observation"]["episode_id"]
    r = client.post("/grader", json={"episode_id": eid})
    assert r.status_code == 409 and "not finished" in r.json()["detail"]


def test_oversized_body_is_413(client):
    big = json.dumps({"episode_log": {"steps": ["x" * 1000] * 400}})
    r = client.post("/grader", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["detail"]


def test_baseline_openai_without_key_is_503_as_documented(monkeypatch):
    # The README promises 503 when the operator allowed models but set no key: the request is
    # well-formed, the server is not configured to serve it (off altogether: 403).
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with TestClient(build_app(ServerSettings(mode="sim", baseline_openai_models="gpt-4.1-mini"))) as client:
        r = client.get("/baseline", params={"use_openai": "true"})
    assert r.status_code == 503 and "OPENAI_API_KEY" in r.json()["detail"]


# -- strict bodies, OpenEnv's task API, the documented schema -------------------------------------
@pytest.mark.parametrize("seed", [True, False, "7", 7.5, None, 7.0, -3])
def test_reset_takes_the_seed_strictly(client, seed):
    # OpenEnv's ResetRequest would turn true into 1 and "7" into 7; null means "the default seed";
    # 7.0 is the integer 7 as JSON Schema's `integer` has it (issue 30), 7.5 is not.
    r = client.post("/reset", json={"task_id": "static_workload", "seed": seed})
    if seed is None or seed == 7.0:
        assert r.status_code == 200 and r.json()["observation"]["metadata"]["seed"] == (seed or 0)
    else:
        assert r.status_code == 422
        assert any(e["loc"] == ["body", "seed"] for e in r.json()["detail"]), r.json()


def test_reset_and_step_reject_unknown_fields_by_name(client):
    r = client.post("/reset", json={"task_id": "static_workload", "turbo": 1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "turbo"]
    eid = reset(client)["observation"]["episode_id"]
    r = client.post("/step", json={"action": STEADY_ACTION, "episode_id": eid, "turbo": 1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "turbo"]
    # OpenEnv's own StepRequest fields are accepted (and do not change the window).
    r = client.post("/step", json={"action": STEADY_ACTION, "episode_id": eid, "timeout_s": 5.0,
                                   "request_id": "abc"})
    assert r.status_code == 200 and r.json()["observation"]["step_index"] == 1


def test_a_bad_trace_is_422_on_the_task_id(client, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    r = client.post("/reset", json={"task_id": f"trace:{bad}"})
    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "task_id"] and "header" in error["msg"]


def test_web_step_with_a_bad_action_is_422_not_500(client):
    client.post("/web/reset", json={"task_id": "static_workload", "seed": 1})
    r = client.post("/web/step", json={"action": {"batch_cap": 0}})
    assert r.status_code == 422 and any("batch_cap" in e["loc"] for e in r.json()["detail"])
    r = client.post("/web/step", json={"action": STEADY_ACTION})
    assert r.status_code == 200 and r.json()["observation"]["step_index"] == 1


def test_openenv_task_api_lists_the_tasks(client):
    assert client.get("/list_environments").json() == ["llmserve_env"]
    assert client.get("/llmserve_env/splits").json() == [{"name": "test", "type": "test"}]
    tasks = client.post("/llmserve_env/tasks", json={"split": "test"}).json()["tasks"]
    ids = [t["task_id"] for t in tasks]
    assert {"static_workload", "bursty_workload", "adversarial_multitenant"} <= set(ids)
    assert client.post("/llmserve_env/num_tasks", json={"split": "test"}).json() == {"num_tasks": len(ids)}
    assert client.post("/llmserve_env/task", json={"split": "test", "index": 1}).json()["task"]["task_id"] == ids[1]
    r = client.post("/llmserve_env/task_range", json={"split": "test", "start": 1, "stop": 3})
    assert [t["task_id"] for t in r.json()["tasks"]] == ids[1:3]
    # A listed task_id is what reset takes.
    assert reset(client, task_id=ids[-1])["observation"]["task_id"] == ids[-1]
    assert client.post("/llmserve_env/task", json={"split": "test", "index": 99}).status_code == 400
    r = client.post("/llmserve_env/tasks", json={"split": "train"})
    assert r.status_code == 404 and "'test'" in r.json()["detail"]


def test_openapi_documents_the_real_bodies_and_errors(client):
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    step = spec["paths"]["/step"]["post"]
    assert step["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ServeStepRequest")
    assert set(schemas["ServeStepRequest"]["required"]) == {"action", "episode_id"}
    assert schemas["ServeAction"]["properties"]["batch_cap"]["maximum"] == 512
    assert {"400", "404", "409", "413", "422"} <= set(step["responses"]) and "500" not in step["responses"]
    reset_body = spec["paths"]["/reset"]["post"]["requestBody"]
    assert reset_body["required"] is False
    assert schemas["ServeResetRequest"]["properties"]["seed"]["anyOf"][0] == {
        "type": "integer", "minimum": 0, "exclusiveMaximum": 2**63}
    [param] = spec["paths"]["/state"]["get"]["parameters"]
    assert param["name"] == "episode_id" and param["required"] is True
    # OpenEnv's route serves /reset; /step is ours (one parse, server/routes.py): nothing registered twice.
    routes = []
    for r in client.app.routes:
        inner = getattr(r, "original_router", None)  # an included router (FastAPI keeps it whole)
        routes += [(x.path, tuple(sorted(x.methods))) for x in (inner.routes if inner else [r])
                   if getattr(x, "methods", None)]
    assert routes.count(("/reset", ("POST",))) == 1 and routes.count(("/step", ("POST",))) == 1


def test_dashboard_does_not_phone_home_unless_asked():
    """Building the app (and its Gradio dashboard) starts no version check against api.gradio.app."""
    import os
    import subprocess
    import sys

    code = (
        "import gradio.analytics as ga\n"
        "calls = []\n"
        "ga.version_check = lambda: calls.append(1)\n"
        "import llmserve_env.server.app as m\n"
        "m.app.get()  # builds the app and its Blocks (on first use since issue 25)\n"
        "import os, time\n"
        "time.sleep(0.2)\n"
        "print(os.environ['GRADIO_ANALYTICS_ENABLED'], len(calls))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRADIO_ANALYTICS_ENABLED"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "0"]
    # An operator who wants Gradio's analytics keeps them.
    env["GRADIO_ANALYTICS_ENABLED"] = "True"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "True" and int(out.stdout.split()[1]) >= 1


# -- issue 30, item 6 --------------------------------------------------------------------------------
def test_a_sim_server_refuses_a_made_up_real_log_unless_its_operator_allows_it():
    """Before: a sim-mode server graded a made-up log labelled "mode": "real" at 1.0 (verified: false)."""
    from test_integrity import forged_from, played_log

    body = {"episode_log": json.loads(forged_from(played_log("static_workload", mode="real")).model_dump_json())}
    with TestClient(build_app(ServerSettings(mode="sim"))) as client:
        r = client.post("/grader", json=body)
    assert r.status_code == 422 and "LLMSERVE_GRADE_REAL_LOGS" in r.json()["detail"][0]["msg"]
    with TestClient(build_app(ServerSettings(mode="sim", grade_real_logs=True))) as client:
        r = client.post("/grader", json=body)
    assert r.status_code == 200 and r.json()["verified"] is False


@pytest.mark.parametrize("value", [b"NaN", b"1e999", b"-Infinity", b'"\\ud800"', b'{"k": "\\udfff"}'])
def test_step_checks_the_actions_metadata_like_every_body(client, value):
    """Before: NaN and 1e999 inside action.metadata were taken (200) though every body is checked."""
    eid = reset(client)["observation"]["episode_id"]
    action = json.dumps({**STEADY_ACTION, "metadata": {"note": "x"}}).encode().replace(b'"x"', value)
    body = b'{"action": %s, "episode_id": "%s"}' % (action, eid.encode())
    r = client.post("/step", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    first = r.json()["detail"][0]
    # NaN and 1e999 parse, and the metadata check names them; a lone surrogate is the parser's 422.
    assert "metadata" in first["msg"] or first["type"] == "json_invalid", first
    # The episode is untouched: the next valid step is its first.
    r = client.post("/step", json={"action": STEADY_ACTION, "episode_id": eid})
    assert r.json()["observation"]["step_index"] == 1


def test_integers_written_as_whole_floats_are_the_integers_on_every_transport():
    """JSON Schema's `integer` admits 52.0 (Schemathesis sent it and got 422); 52.5 is still refused."""
    with TestClient(build_app(ServerSettings(mode="sim", max_sessions=2))) as client:
        _whole_floats(client)


def _whole_floats(client: TestClient) -> None:
    eid = reset(client)["observation"]["episode_id"]
    whole = {**STEADY_ACTION, "batch_cap": 52.0, "speculation_depth": 0.0}
    r = client.post("/step", json={"action": whole, "episode_id": eid})
    assert r.status_code == 200, r.text
    r = client.post("/step", json={"action": {**STEADY_ACTION, "batch_cap": 52.5}, "episode_id": eid})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "action", "batch_cap"]
    assert r.json()["detail"][0]["input"] == 52.5  # the body as sent, not as rewritten
    state = client.get("/state", params={"episode_id": eid}).json()
    assert state["action_history"][0]["batch_cap"] == 52 and state["step_count"] == 1
    with client.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": {"seed": 2.0}})
        assert ws.receive_json()["data"]["observation"]["step_index"] == 0
        ws.send_json({"type": "step", "data": whole})
        assert ws.receive_json()["data"]["observation"]["step_index"] == 1
    r = client.post("/web/reset", json={"seed": 3.0})
    assert r.status_code == 200, r.text
    assert client.post("/web/step", json={"action": whole}).status_code == 200


def test_unknown_methods_are_405_on_the_web_routes_and_no_web_episode_is_404():
    """Before: TRACE /web/state reached the Gradio mount (404), and /web/state before /web/reset was a 400."""
    with TestClient(build_app(ServerSettings(mode="sim", max_sessions=2))) as client:
        for path in ("/web/state", "/web/step", "/web/reset", "/web/metadata", "/health", "/reset"):
            r = client.request("TRACE", path)
            assert r.status_code == 405, (path, r.status_code)
        assert client.request("TRACE", "/web/state").headers["allow"] == "GET, HEAD"
        r = client.get("/web/state")
        assert r.status_code == 404 and "/web/reset" in r.json()["detail"]
        assert client.post("/web/step", json={"action": STEADY_ACTION}).status_code == 404
        assert client.post("/web/reset", json={"seed": 1}).status_code == 200
        assert client.get("/web/state").status_code == 200
        assert client.get("/web/metadata").status_code == 200
