"""Issue 30, item 1: GET /baseline?use_openai=true never spends the operator's key unless the
operator turned it on, only on the models the operator listed, within a server-wide budget."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import STEADY_ACTION
from fastapi.testclient import TestClient
from llmserve_env.server.app import build_app
from llmserve_env.server.config import ConfigError, ServerSettings
from llmserve_env.shared.tasks import TASKS

TASK = "static_workload"


class CountingOpenAI:
    """Stands in for openai.OpenAI: counts the chat completions a run sends, and the models."""

    calls: list[str] = []

    def __init__(self, **kwargs):
        assert kwargs.get("max_retries") == 0  # one request per window, as the budget counts
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **kwargs):
        CountingOpenAI.calls.append(kwargs["model"])
        message = SimpleNamespace(content=json.dumps(STEADY_ACTION))
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


@pytest.fixture()
def paid(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-operator-key-never-sent")
    monkeypatch.setattr("openai.OpenAI", CountingOpenAI)
    CountingOpenAI.calls = []
    return CountingOpenAI.calls


def test_use_openai_is_off_by_default_even_with_a_key(paid):
    """The issue's reproduction: a sim-mode server with OPENAI_API_KEY set answered
    use_openai=true&model=o1-pro with 200 and 352 chat completions on the operator's key."""
    with TestClient(build_app(ServerSettings(mode="sim"))) as client:
        r = client.get("/baseline", params={"use_openai": "true", "model": "o1-pro", "task_id": TASK})
    assert r.status_code == 403, r.text[:300]
    assert "LLMSERVE_BASELINE_OPENAI_MODELS" in r.json()["detail"]
    assert paid == []


def test_only_listed_models_and_only_within_the_budget(paid):
    horizon = TASKS[TASK].horizon
    config = ServerSettings(mode="sim", baseline_openai_models="gpt-4.1-mini, gpt-4.1-nano",
                            baseline_openai_max_calls=horizon + 10)
    assert config.openai_models == ("gpt-4.1-mini", "gpt-4.1-nano")
    with TestClient(build_app(config)) as client:
        r = client.get("/baseline", params={"use_openai": "true", "model": "o1-pro", "task_id": TASK})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "model"]
        assert "gpt-4.1-mini, gpt-4.1-nano" in r.json()["detail"][0]["msg"]
        assert paid == []
        r = client.get("/baseline", params={"use_openai": "true", "task_id": TASK})
        assert r.status_code == 200, r.text[:300]
        assert r.json()["model"] == "gpt-4.1-mini"  # the operator's first model is the default
        assert paid == ["gpt-4.1-mini"] * horizon  # one request per window, as reserved
        # 10 calls left: the next run (another horizon) does not fit, and sends nothing.
        r = client.get("/baseline", params={"use_openai": "true", "model": "gpt-4.1-nano", "task_id": TASK})
        assert r.status_code == 429 and "10 of" in r.json()["detail"]
        r = client.get("/baseline", params={"use_openai": "true", "model": "gpt-4.1-nano"})  # every task
        assert r.status_code == 429
    assert len(paid) == horizon


def test_model_names_are_checked_at_start_up(monkeypatch):
    monkeypatch.setenv("LLMSERVE_BASELINE_OPENAI_MODELS", "gpt-4.1-mini,,o1")
    with pytest.raises(ConfigError, match="LLMSERVE_BASELINE_OPENAI_MODELS"):
        ServerSettings.from_env()
