"""Issue 29 item 3: the stand-in answers what clients use the way vLLM's OpenAI server does.

Checked against vLLM's own code (vllm/entrypoints/openai): GET /health is 200 with an empty body; an
unknown model is a 404 whose body is ErrorResponse {"error": {"message": "The model `x` does not
exist.", "type": "NotFoundError", "param": "model", "code": 404}}; a malformed request is a JSON 400
BadRequestError; max_tokens < 1 is refused ("max_tokens must be at least 1, got 0."); an absent
max_tokens means the rest of the context (max_model_len - prompt tokens). Driven through the OpenAI
SDK, as a benchmarking client drives it (guidellm is not installed here: see the README).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from llmserve_env.sim.standin.app import StandinConfig
from llmserve_env.sim.step_time import step_model
from llmserve_env.tools.standin_harness import BackgroundStandin

PROFILE = "h100-llama3.1-8b"


@pytest.fixture(scope="module")
def standin():
    # exact timings: these tests are about the protocol, not the step times
    with BackgroundStandin(StandinConfig(profile=PROFILE, fixed_ttft_s=0.002, fixed_itl_s=0.001,
                                         max_model_len=64)) as s:
        yield s


def client(s: BackgroundStandin) -> openai.OpenAI:
    return openai.OpenAI(api_key="EMPTY", base_url=s.base_url, max_retries=0)


def test_health_and_models(standin):
    r = httpx.get(standin.base_url.removesuffix("/v1") + "/health")
    assert r.status_code == 200 and r.content == b""
    models = client(standin).models.list().data
    assert [m.id for m in models] == [PROFILE, f"{PROFILE}-fp16", f"{PROFILE}-int8", f"{PROFILE}-int4"]
    assert models[0].model_extra["max_model_len"] == 64 and models[1].model_extra["root"] == PROFILE


def test_an_unknown_model_is_vllms_404(standin):
    with pytest.raises(openai.NotFoundError) as ei:
        client(standin).chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2)
    assert ei.value.status_code == 404
    assert ei.value.body == {"message": "The model `gpt-4.1` does not exist.", "type": "NotFoundError",
                             "param": "model", "code": 404}
    with pytest.raises(openai.NotFoundError):
        client(standin).completions.create(model="nope", prompt="hi", max_tokens=2)


@pytest.mark.parametrize("body, where", [
    ({"model": PROFILE, "messages": "hi", "max_tokens": 2}, "messages"),
    ({"model": PROFILE, "messages": [], "max_tokens": 2}, "messages"),
    ({"model": PROFILE, "messages": ["hi"], "max_tokens": 2}, "messages"),
    ({"model": PROFILE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "2"}, "max_tokens"),
    ({"model": PROFILE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"model": PROFILE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": "yes"},
     "stream"),
    ({"model": 3, "messages": [{"role": "user", "content": "hi"}]}, "model"),
])
def test_malformed_chat_requests_are_json_400s(standin, body, where):
    r = httpx.post(standin.base_url + "/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400 and err["param"] == where
    assert where in err["message"]


def test_bodies_that_are_not_json_objects_are_400s(standin):
    for content in (b"{not json", b"[1, 2]", b'"text"'):
        r = httpx.post(standin.base_url + "/chat/completions", content=content,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError", content
    r = httpx.post(standin.base_url + "/completions", json={"model": PROFILE, "prompt": 7, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_max_tokens_zero_is_refused_and_absent_means_the_rest_of_the_context(standin):
    sdk = client(standin)
    with pytest.raises(openai.BadRequestError, match="max_tokens must be at least 1, got 0"):
        sdk.chat.completions.create(model=PROFILE, messages=[{"role": "user", "content": "hi"}], max_tokens=0)
    r = sdk.chat.completions.create(model=PROFILE, messages=[{"role": "user", "content": "hello there"}])
    assert r.usage.prompt_tokens == 2 and r.usage.completion_tokens == 64 - 2
    assert r.choices[0].finish_reason == "length"
    # max_completion_tokens (the newer name) is honoured too
    r = sdk.chat.completions.create(model=PROFILE, messages=[{"role": "user", "content": "hi"}],
                                    max_completion_tokens=3)
    assert r.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError, match="maximum context length is 64 tokens"):
        sdk.chat.completions.create(model=PROFILE, messages=[{"role": "user", "content": "hi"}], max_tokens=64)


def test_completions_streaming_and_not(standin):
    sdk = client(standin)
    r = sdk.completions.create(model=f"{PROFILE}-int8", prompt="the quick brown fox", max_tokens=5)
    assert r.object == "text_completion" and r.model == f"{PROFILE}-int8"
    assert r.usage.prompt_tokens == 4 and r.usage.completion_tokens == 5 and r.choices[0].text.count(" ") == 5
    chunks = list(sdk.completions.create(model=PROFILE, prompt=[1, 2, 3], max_tokens=4, stream=True,
                                         stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert len(texts) == 4 and chunks[-1].usage.prompt_tokens == 3 and chunks[-1].usage.completion_tokens == 4
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_streaming_through_the_sdk(standin):
    chunks = list(client(standin).chat.completions.create(
        model=PROFILE, messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True,
        stream_options={"include_usage": True}))
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 6
    assert chunks[-1].usage.completion_tokens == 6


@pytest.mark.slow
def test_batch_one_inter_token_latency_is_the_profiles_within_two_percent():
    """The batching loop keeps an absolute schedule: the stream's mean ITL is the step time priced."""
    n = 200
    prompt = "the quick brown fox " * 25  # 100 o200k tokens

    async def one(base_url: str) -> list[float]:
        async with openai.AsyncOpenAI(api_key="EMPTY", base_url=base_url, max_retries=0) as sdk:
            stream = await sdk.chat.completions.create(model=PROFILE, messages=[{"role": "user", "content": prompt}],
                                                       max_tokens=n, stream=True)
            return [time.monotonic() async for c in stream if c.choices and c.choices[0].delta.content]

    with BackgroundStandin(StandinConfig(profile=PROFILE)) as s:
        times = asyncio.run(one(s.base_url))
    model = step_model(PROFILE, "FP16")
    # token k+1 comes from a decode step over the prompt and the k tokens so far
    priced = sum(model.iteration_s(1, 100.0 + k, 0, [], 0, 0) for k in range(1, n)) / (n - 1)
    served = (times[-1] - times[0]) / (n - 1)
    assert len(times) == n
    assert served == pytest.approx(priced, rel=0.02), (served, priced)
