"""LLMSERVE_TRACE_DIR: a server that sets it replays (and grades) traces from that folder only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import STEADY_ACTION
from fastapi.testclient import TestClient
from llmserve_env.server.app import build_app
from llmserve_env.server.config import ServerSettings

TRACE = "arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(
    f"{i * 0.05:.2f},{100 + i},{20 + i % 7}\n" for i in range(200))


@pytest.fixture()
def traces(tmp_path):
    root = tmp_path / "traces"
    root.mkdir()
    (root / "ok.csv").write_text(TRACE)
    (tmp_path / "outside.csv").write_text(TRACE)
    return root


@pytest.fixture()
def client(traces):
    with TestClient(build_app(ServerSettings(trace_dir=str(traces)))) as c:
        yield c


def test_a_trace_inside_the_folder_plays_and_grades(client, traces):
    r = client.post("/reset", json={"task_id": "trace:ok.csv?horizon=3", "seed": 0})
    assert r.status_code == 200, r.text
    eid = r.json()["observation"]["episode_id"]
    for _ in range(3):
        assert client.post("/step", json={"action": STEADY_ACTION, "episode_id": eid}).status_code == 200
    state = client.get("/state", params={"episode_id": eid}).json()
    assert state["task_id"] == f"trace:{traces / 'ok.csv'}?horizon=3"
    assert 0.0 <= client.post("/grader", json={"episode_id": eid}).json()["score"] <= 1.0


@pytest.mark.parametrize("path", ["../outside.csv", "/etc/passwd", "sub/../../outside.csv"])
def test_paths_outside_the_folder_are_403_without_reading_them(client, path):
    r = client.post("/reset", json={"task_id": f"trace:{path}", "seed": 0})
    assert r.status_code == 403
    assert "LLMSERVE_TRACE_DIR" in r.json()["detail"] and "root:" not in r.text


def test_a_graded_log_cannot_name_a_file_outside_the_folder(client):
    log = {"task_id": "trace:/etc/passwd", "seed": 0, "episode_id": "x", "horizon": 1, "steps": [],
           "done": True}
    r = client.post("/grader", json={"episode_log": log})
    assert r.status_code == 403 and "LLMSERVE_TRACE_DIR" in r.json()["detail"]


def test_without_the_setting_any_readable_path_replays(tmp_path):
    (tmp_path / "t.csv").write_text(TRACE)
    with TestClient(build_app(ServerSettings())) as c:
        r = c.post("/reset", json={"task_id": f"trace:{tmp_path / 't.csv'}?horizon=2", "seed": 0})
        assert r.status_code == 200, r.text


def test_make_serve_listens_on_loopback_and_the_image_confines_traces():
    """Issue 20, item 10: `make serve` answered on every interface with no trace confinement, so any
    client could probe for files. It binds 127.0.0.1 unless HOST says otherwise; the image (and the
    Space) binds 0.0.0.0 only with LLMSERVE_TRACE_DIR set, to a folder its install line makes."""
    root = Path(__file__).resolve().parents[1]
    make = (root / "Makefile").read_text()
    assert re.search(r"^HOST \?= 127\.0\.0\.1$", make, re.M)
    serve = make.split("\nserve:", 1)[1].split("\n\n", 1)[0]
    assert "--host $(HOST)" in serve and "0.0.0.0" not in serve
    docker = (root / "Dockerfile").read_text()
    assert "--host\", \"0.0.0.0\"" in docker
    assert re.search(r"LLMSERVE_TRACE_DIR=/app/traces", docker) and re.search(r"WORKDIR /app\b", docker)
    assert re.search(r"^RUN mkdir -p traces && pip install", docker, re.M)
