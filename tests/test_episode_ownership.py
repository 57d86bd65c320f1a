"""Issue 30, item 2: an evicted client-named episode id is never handed to another client while its
owner may come back (server/episodes.py's tombstones)."""

from __future__ import annotations

import pytest
from conftest import STEADY_ACTION
from fastapi.testclient import TestClient
from llmserve_env.core.episode import Episode
from llmserve_env.server.app import build_app
from llmserve_env.server.config import ServerSettings
from llmserve_env.server.episodes import EpisodeIdRetiredError, EpisodeStore, NamedIdsFullError
from llmserve_env.shared.workloads import resolve_task

STEP = {"action": STEADY_ACTION}


def test_an_evicted_id_is_not_handed_to_the_client_who_flooded_the_store():
    """The issue's reproduction at LLMSERVE_MAX_EPISODES=16: before, the stranger's reset got 200
    and the victim's next step drove the stranger's bursty_workload episode (200, step_index 1)."""
    with TestClient(build_app(ServerSettings(mode="sim", max_episodes=16, max_sessions=2))) as client:
        r = client.post("/reset", json={"task_id": "static_workload", "seed": 1, "episode_id": "victim-evict"})
        assert r.status_code == 200
        assert client.post("/step", json=STEP | {"episode_id": "victim-evict"}).status_code == 200
        for seed in range(20):  # another client's anonymous resets push the victim's episode out
            assert client.post("/reset", json={"seed": seed}).status_code == 200
        r = client.post("/step", json=STEP | {"episode_id": "victim-evict"})
        assert r.status_code == 404 and "unknown or expired" in r.json()["detail"]  # as documented
        r = client.post("/reset", json={"task_id": "bursty_workload", "seed": 666, "episode_id": "victim-evict"})
        assert r.status_code == 409, r.text
        assert "dropped" in r.json()["detail"] and "Leave episode_id out" in r.json()["detail"]
        r = client.post("/step", json=STEP | {"episode_id": "victim-evict"})
        assert r.status_code == 404  # the victim never drives anyone else's episode
        # The same over the WebSocket: a session cannot claim the id either.
        with client.websocket_connect("/ws") as ws:
            ws.send_json({"type": "reset", "data": {"episode_id": "victim-evict", "seed": 666}})
            reply = ws.receive_json()
            assert reply["type"] == "error" and "dropped" in reply["data"]["message"]


def test_a_tombstone_lasts_the_idle_timeout_then_the_id_is_free(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("llmserve_env.server.episodes.time.monotonic", lambda: clock[0])
    store = EpisodeStore(max_episodes=1, idle_timeout_s=60.0)
    task = resolve_task("static_workload")
    store.put(Episode.start(task, 0, "sim", episode_id="mine"), named=True)
    store.put(Episode.start(task, 1, "sim"))  # evicts "mine" (count limit)
    clock[0] += 59
    with pytest.raises(EpisodeIdRetiredError):
        store.check_free("mine")
    clock[0] += 2
    store.check_free("mine")  # past the idle timeout: the owner could not have come back either
    store.put(Episode.start(task, 2, "sim", episode_id="mine"), named=True)


def test_an_idle_expired_named_id_is_retired_too(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("llmserve_env.server.episodes.time.monotonic", lambda: clock[0])
    store = EpisodeStore(max_episodes=4, idle_timeout_s=60.0)
    task = resolve_task("static_workload")
    store.put(Episode.start(task, 0, "sim", episode_id="sleepy"), named=True)
    clock[0] += 61
    with pytest.raises(Exception, match="unknown or expired"):
        store.get("sleepy")
    with pytest.raises(EpisodeIdRetiredError):
        store.put(Episode.start(task, 1, "sim", episode_id="sleepy"), named=True)


def test_minted_ids_leave_no_tombstone_and_tombstones_are_bounded(monkeypatch):
    store = EpisodeStore(max_episodes=1, idle_timeout_s=600.0)
    task = resolve_task("static_workload")
    for seed in range(5):
        store.put(Episode.start(task, seed, "sim"))
    assert not store._tombstones  # noqa: SLF001 (the store's contents)
    # Named ids flooding the store fill the tombstones up to their bound; then a new named id is
    # refused (503: omit episode_id) instead of a tombstone being dropped, and minted ids still work.
    for k in range(store.max_tombstones + 1):
        store.put(Episode.start(task, 0, "sim", episode_id=f"flood-{k}"), named=True)
    assert len(store._tombstones) == store.max_tombstones  # noqa: SLF001
    with pytest.raises(NamedIdsFullError):
        store.put(Episode.start(task, 0, "sim", episode_id="one-more"), named=True)
    with pytest.raises(EpisodeIdRetiredError):
        store.check_free("flood-0")
    store.put(Episode.start(task, 0, "sim"))
