"""Baseline runs: the deterministic suite, the OpenAI suite on a mocked API, the CLI, in process and over HTTP."""

from __future__ import annotations

import functools
import json

import httpx
import pytest
import respx
from llmserve_env.agents.llm_policy import LLMPolicy
from llmserve_env.core.inprocess import InProcessEnv
from llmserve_env.server import baseline_inference
from llmserve_env.server.baseline_inference import main, run_baseline_suite, run_suite
from llmserve_env.shared.tasks import TASKS

BASE = "https://api.mock-openai.test/v1"
REPLY = {"batch_cap": 64, "kv_budget_fraction": 0.9, "speculation_depth": 0, "quantization_tier": "FP16",
         "prefill_decode_split": False, "priority_routing": True}


def completion(content: str) -> dict:
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "mock",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}


@pytest.mark.presubmit
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
    assert entry["invalid_reply_share"] == 0.5 and result["invalid_reply_share"] == 0.5
    assert result["mode"] == "openai" and result["model"] == "mock-model"
    assert json.loads(route.calls[0].request.content)["model"] == "mock-model"


def test_cli_in_process_writes_the_output(tmp_path, capsys):
    out = tmp_path / "baseline.json"
    assert main(["--mode", "deterministic", "--task", "static_workload", "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["runtime"] == "in-process" and list(data["tasks"]) == ["static_workload"]
    assert "static_workload" in capsys.readouterr().out


@pytest.mark.presubmit
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


@respx.mock
def test_cli_openai_fails_when_the_fallback_played_most_windows(monkeypatch, tmp_path, capsys):
    """64 invalid replies out of 64: the score is SAFE_ACTION's, so the run says so and exits 1
    (it used to print the fallback's 0.97 and exit 0); the share is in the table and the JSON."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    # The SDK's own HTTP client is not httpx's: give the policy one that respx can mock.
    monkeypatch.setattr(baseline_inference, "LLMPolicy", functools.partial(
        LLMPolicy, base_url=BASE, http_client=httpx.Client(base_url=BASE)))
    respx.post(f"{BASE}/chat/completions").mock(return_value=httpx.Response(200, json=completion("no idea")))
    out = tmp_path / "openai.json"
    assert main(["--mode", "openai", "--task", "static_workload", "--output", str(out)]) == 1
    printed = capsys.readouterr()
    assert "64/64 (100.0 %)" in printed.out
    assert "FAILED" in printed.err and "static_workload: 64 invalid replies" in printed.err
    data = json.loads(out.read_text())
    assert data["invalid_reply_share"] == 1.0 and data["tasks"]["static_workload"]["fallback_share"] == 1.0
    # A looser threshold lets the same run pass (the share is still printed beside the score).
    assert main(["--mode", "openai", "--task", "static_workload", "--max-invalid-share", "1"]) == 0


@pytest.mark.parametrize(("argv", "named"), [
    (["--task", "nope"], "--task"),
    (["--episodes", "0"], "--episodes"),
    (["--seed", "-1"], "--seed"),
    (["--max-invalid-share", "1.5"], "--max-invalid-share"),
    (["--base-url", "localhost:7860"], "--base-url"),
    (["--output", "/no/such/dir/x.json"], "--output"),
])
def test_cli_refuses_bad_arguments_before_any_work(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m server.baseline_inference: error: argument " + named), err[-1]
