"""Shared fixtures: the app in process, and a live uvicorn server on a free loopback port."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from llmserve_env.server.app import build_app
from llmserve_env.server.config import ServerSettings
from llmserve_env.tools.launch import ThreadServer

STEADY_ACTION = {
    "batch_cap": 64,
    "kv_budget_fraction": 0.9,
    "speculation_depth": 0,
    "quantization_tier": "FP16",
    "prefill_decode_split": False,
    "priority_routing": False,
}


def train_extra(module: str):
    """Import a module of the `train`/`sb3` extras, or skip; CI sets LLMSERVE_REQUIRE_TORCH=1 after
    installing the extras, and then a missing module fails instead of skipping."""
    if os.environ.get("LLMSERVE_REQUIRE_TORCH") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is in the train/sb3 extras (pip install -e '.[train,sb3]')")


@pytest.fixture(scope="session")
def app():
    return build_app(ServerSettings(mode="sim", max_episodes=64, idle_timeout_s=600.0, max_sessions=32,
                                  max_body_bytes=256 * 1024))


@pytest.fixture()
def client(app) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="session")
def live_server(app) -> Iterator[ThreadServer]:
    with ThreadServer(app) as server:
        yield server
