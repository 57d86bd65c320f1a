"""Baseline runs: the deterministic suite, the OpenAI suite on a mocked API, the CLI, in process and over HTTP."""

from __future__ import annotations

import json

import httpx
import respx
from llmserve_env.runtime.inprocess import InProcessEnv
from llmserve_env.server.baseline_inference import main, run_baseline_suite, run_suite
from llmserve_env.shared.tasks import TASKS

BASE = "https://api.mock-openai.test/v1"
REPLY = {"batch_cap": 64, "kv_budget_fraction": 0.9, "speculation_depth": 0, "quantization_tier": "FP16",
         "prefill_decode_split": False, "priority_routing": True}


def completion(content: str) -> dict:
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "mock",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}


def test_deterministic_suite_covers_every_task_and_repeats_exactly():
    a = run_baseline_suite(use_openai=False)
    assert set(a["tasks"]) == set(TASKS) and a["mode"] == "deterministic" and a["model"] is None
    for entry in a["tasks"].values():
        assert 0.0 <= entry["score"] <= 1.0
        (episode,) = entry["episodes"]
        assert episode["steps"] > 0 and "score" in episode["grade"]
    b = run_baseline_suite(use_openai=False, task_id="bursty_workload")
    assert b["tasks"]["bursty_workload"]["score"] == a["tasks"]["bursty_workload"]["score"]


@respx.mock
def test_openai_suite_uses_the_model_and_counts_invalid_replies():
    replies = iter([json.dumps(REPLY), "not json"] * 1000)
    route = respx.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: httpx.Response(200, json=completion(next(replies))))
    result = run_suite(InProcessEnv(), True, "mock-model", ["static_workload"], [42], "in-process",
                       llm_options={"api_key": "sk-test", "base_url": BASE,
                                    "http_client": httpx.Client(base_url=BASE)})
    entry = result["tasks"]["static_workload"]
    steps = entry["episodes"][0]["steps"]
    assert route.call_count == steps
    assert entry["llm"]["calls"] == steps and entry["llm"]["invalid"] == steps // 2
    assert result["mode"] == "openai" and result["model"] == "mock-model"
    assert json.loads(route.calls[0].request.content)["model"] == "mock-model"


def test_cli_in_process_writes_the_output(tmp_path, capsys):
    out = tmp_path / "sub" / "baseline.json"
    assert main(["--mode", "deterministic", "--task", "static_workload", "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["runtime"] == "in-process" and list(data["tasks"]) == ["static_workload"]
    assert "static_workload" in capsys.readouterr().out


def test_cli_over_http_matches_in_process(live_server, tmp_path):
    out = tmp_path / "http.json"
    assert main(["--runtime", "http", "--base-url", live_server.url, "--task", "bursty_workload",
                 "--output", str(out)]) == 0
    over_http = json.loads(out.read_text())["tasks"]["bursty_workload"]["score"]
    in_process = run_baseline_suite(task_id="bursty_workload")["tasks"]["bursty_workload"]["score"]
    assert over_http == in_process


def test_cli_openai_mode_without_a_key_says_so(monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["--mode", "openai"]) == 2
    assert "OPENAI_API_KEY" in capsys.readouterr().err
