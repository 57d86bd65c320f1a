"""The LLM policy's OpenAI path against a mocked API (respx patches the httpx client we inject)."""

from __future__ import annotations

import json

import httpx
import pytest
import respx
from llmserve_env.agents.llm_policy import SAFE_ACTION, LLMPolicy, parse_action
from llmserve_env.shared.models import ServeObservation

BASE = "https://api.mock-openai.test/v1"
GOOD = {"batch_cap": 48, "kv_budget_fraction": 0.8, "speculation_depth": 2, "quantization_tier": "INT8",
        "prefill_decode_split": True, "priority_routing": True}


def completion(content: str | None) -> dict:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "mock-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }


def make_policy(task: str = "bursty_workload") -> LLMPolicy:
    return LLMPolicy(task, model="mock-model", api_key="sk-test", base_url=BASE,
                     http_client=httpx.Client(base_url=BASE))


def obs(**kw) -> ServeObservation:
    return ServeObservation(queue_depth=12, p99_ttft_ms=850.0, request_arrival_rate=40.0, step_index=3,
                            task_id="bursty_workload", reward=0.1, **kw)


@respx.mock
def test_valid_reply_becomes_the_action_and_request_is_well_formed():
    route = respx.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(200, json=completion(json.dumps(GOOD))))
    policy = make_policy()
    action = policy.act(obs())
    assert action.knobs() == GOOD
    assert policy.stats.calls == 1 and policy.stats.invalid == 0 and policy.stats.api_errors == 0
    body = json.loads(route.calls.last.request.content)
    assert body["model"] == "mock-model"
    assert body["response_format"] == {"type": "json_object"}
    system, user = body["messages"]
    assert "bursty_workload" in system["content"] and "batch_cap" in system["content"]
    assert '"queue_depth":12' in user["content"] and "none yet" in user["content"]
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-test"
    # The next prompt carries the action just taken.
    policy.act(obs())
    assert '"batch_cap": 48' in json.loads(route.calls.last.request.content)["messages"][1]["content"]


@pytest.mark.parametrize("content", [
    "I would raise the batch cap.",                                   # no JSON at all
    json.dumps(GOOD | {"batch_cap": 4096}),                           # out of range: never clamped
    json.dumps({k: v for k, v in GOOD.items() if k != "priority_routing"}),  # missing field
    json.dumps(GOOD | {"quantization_tier": "FP8"}),                  # not an allowed tier
    json.dumps(GOOD | {"batch_cap": "48"}),                           # wrong type (strict)
    "[1, 2, 3]",
    None,
])
@respx.mock
def test_invalid_replies_are_counted_and_replaced_by_the_safe_action(content):
    respx.post(f"{BASE}/chat/completions").mock(return_value=httpx.Response(200, json=completion(content)))
    policy = make_policy()
    assert policy.act(obs()) == SAFE_ACTION
    assert policy.stats.invalid == 1 and policy.stats.api_errors == 0


@respx.mock
def test_api_errors_fall_back_without_raising():
    respx.post(f"{BASE}/chat/completions").mock(return_value=httpx.Response(401, json={"error": {"message": "bad key"}}))
    policy = make_policy()
    assert policy.act(obs()) == SAFE_ACTION
    assert policy.stats.api_errors == 1 and policy.stats.invalid == 0
    assert "sk-test" not in (policy.stats.last_error or "")


def test_fenced_json_is_accepted():
    text = "Here you go:\n```json\n" + json.dumps(GOOD) + "\n```"
    assert parse_action(text).knobs() == GOOD


@respx.mock
def test_json_mode_can_be_turned_off():
    route = respx.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(200, json=completion(json.dumps(GOOD))))
    policy = LLMPolicy("static_workload", model="m", api_key="k", base_url=BASE,
                       http_client=httpx.Client(base_url=BASE), json_mode=False)
    policy.act(obs())
    assert "response_format" not in json.loads(route.calls.last.request.content)
