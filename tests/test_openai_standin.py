"""The offline OpenAI-compatible stand-in, driven by the OpenAI SDK's own (default) client."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from llmserve_env.gateway.tokens import count_tokens
from llmserve_env.sim.standin.app import StandinConfig, tier_table
from llmserve_env.sim.step_time import step_model
from llmserve_env.tools.standin import config_from_args, parse_args
from llmserve_env.tools.standin_harness import BackgroundStandin

PROFILE = "h100-llama3.1-8b"


@pytest.fixture(scope="module")
def standin():
    with BackgroundStandin(StandinConfig(profile=PROFILE)) as s:
        yield s


def sdk(s: BackgroundStandin) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="anything", base_url=s.base_url, max_retries=0)


async def stream_once(client: openai.AsyncOpenAI, model: str, prompt: str, max_tokens: int):
    t0 = time.monotonic()
    times, usage, finish = [], None, None
    chunks = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                  max_tokens=max_tokens, stream=True,
                                                  stream_options={"include_usage": True})
    async for ch in chunks:
        if ch.choices and ch.choices[0].delta.content:
            times.append(time.monotonic() - t0)
        if ch.choices and ch.choices[0].finish_reason:
            finish = ch.choices[0].finish_reason
        if ch.usage:
            usage = ch.usage
    return times, usage, finish


def set_faults(s: BackgroundStandin, **body) -> None:
    httpx.post(s.base_url + "/standin/faults", json=body).raise_for_status()


def test_models_lists_the_profile_and_its_tiers(standin):
    async def ids():
        async with sdk(standin) as client:
            return [m.id async for m in client.models.list()]

    ids = asyncio.run(ids())
    assert ids == [PROFILE, f"{PROFILE}-fp16", f"{PROFILE}-int8", f"{PROFILE}-int4"]


def test_stream_timings_come_from_the_step_time_model(standin):
    prompt = "the quick brown fox " * 100
    n = count_tokens(prompt)  # the stand-in counts with the same tokenizer (o200k_base)
    async def one():
        async with sdk(standin) as client:
            return await stream_once(client, PROFILE, prompt, 12)

    times, usage, finish = asyncio.run(one())
    assert len(times) == 12 and finish == "length"
    assert usage.prompt_tokens == n and usage.completion_tokens == 12
    model = step_model(PROFILE, "FP16")
    prefill = model.iteration_s(0, 0.0, 0, [(n, 0)], n, 1)
    # the server really waits each iteration; HTTP on loopback adds a little, never removes any
    assert prefill <= times[0] < prefill + 0.25
    # the batcher keeps its schedule on a busy host (sim/standin/batching.py: a late iteration is caught
    # up, so single gaps may be short), never runs ahead of it: the last token comes when the priced
    # prefill and 11 decode steps are over, a little later for HTTP, never sooner
    steps = prefill + sum(model.iteration_s(1, n + k, 0, [], 0, 0) for k in range(1, 12))
    assert steps <= times[-1] < steps + 0.25


def test_concurrent_requests_are_batched(standin):
    assert standin.app.state.standin.batchers.get("INT4") is None

    async def many():
        async with sdk(standin) as client:
            return await asyncio.gather(*[stream_once(client, f"{PROFILE}-int4", "hello there", 20)
                                          for _ in range(8)])

    results = asyncio.run(many())
    assert all(len(t) == 20 for t, _, _ in results)
    batcher = standin.app.state.standin.batchers["INT4"]
    # 8 sequences x 20 tokens in far fewer than 160 iterations: they shared batches
    assert batcher.iterations < 80 and batcher.running == [] and batcher.blocks_used == 0


def test_non_streaming_completion(standin):
    r = httpx.post(standin.base_url + "/chat/completions",
                   json={"model": PROFILE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
    body = r.json()
    assert r.status_code == 200 and body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["message"]["content"].count(" ") == 5


def test_fault_injection_429_500_drop_stall(standin):
    set_faults(standin, script=["429", "500", "drop", "stall"], retry_after_s=1.5, drop_after=2, stall_s=0.6)
    async def go():
        async with sdk(standin) as client:
            return await faults(client)

    async def faults(client):
        out = []
        with pytest.raises(openai.RateLimitError) as e429:
            await stream_once(client, PROFILE, "x", 5)
        out.append(e429.value.response.headers)
        with pytest.raises(openai.InternalServerError):
            await stream_once(client, PROFILE, "x", 5)
        try:
            times, _, finish = await stream_once(client, PROFILE, "x", 5)
            out.append(("no error", times, finish))
        except (openai.APIError, httpx.HTTPError, httpx.TransportError) as exc:
            out.append(type(exc).__name__)
        out.append(await stream_once(client, PROFILE, "x", 5))
        return out

    headers, dropped, (stall_times, _, _) = asyncio.run(go())
    assert headers["retry-after"] == "1.5" and headers["retry-after-ms"] == "1500"
    assert dropped != "no error" and not (isinstance(dropped, tuple) and dropped[2] == "length")
    gaps = [b - a for a, b in zip(stall_times, stall_times[1:], strict=False)]
    # the stall (0.6 s) is the one long gap; the client stamps a chunk when it reads it, so a late read of the chunk
    # before the stall shortens that gap a little (0.598 s seen on a loaded 2-core machine)
    assert gaps[0] >= 0.5 and max(gaps[1:]) < 0.3


def test_api_key_check_echoes_the_wrong_key():
    with BackgroundStandin(StandinConfig(api_key="right-key")) as s:
        r = httpx.post(s.base_url + "/chat/completions", headers={"Authorization": "Bearer wrong-key"},
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
        assert r.status_code == 401 and "wrong-key" in r.json()["error"]["message"]


def test_tier_table_for_the_gateway(tmp_path):
    from llmserve_env.gateway.pricing import load_tier_table

    path = tmp_path / "tiers.json"
    path.write_text(json.dumps(tier_table(PROFILE)))
    table = load_tier_table(str(path))
    assert table.for_tier("INT4").model == f"{PROFILE}-int4" and table.distinct_models
    assert table.for_tier("FP16").quality == 1.0 and table.for_tier("INT4").cost(1000, 1000) == 0.0


def test_command_line():
    cfg = config_from_args(parse_args(["--profile", PROFILE, "--tier", "INT8", "--fail-429", "0.2",
                                       "--retry-after", "3", "--fixed-ttft-ms", "50", "--fixed-itl-ms", "20"]))
    assert cfg.tier == "INT8" and cfg.faults.rate_429 == 0.2 and cfg.faults.retry_after_s == 3.0
    assert cfg.fixed_ttft_s == 0.05 and cfg.fixed_itl_s == 0.02
    draws = [cfg.faults.next() for _ in range(2000)]
    assert 0.15 < draws.count("429") / 2000 < 0.25 and set(draws) == {"ok", "429"}
